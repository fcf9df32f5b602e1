//! A private mirror of `uniplane_overlay::PlaneOp` until the overlay
//! publishes it; replaced by a re-export then.

use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::Uid;
use uniplane_overlay::acl::{AclRule, ConnKey};
use uniplane_overlay::table::Route;
use uniplane_overlay::{PortId, PortSpec};

/// One control operation on a forwarding plane.
#[derive(Clone, Debug)]
pub enum PlaneOp {
    /// Attaches a port.
    Attach(PortSpec),
    /// Detaches a port.
    Detach(PortId),
    /// Adds or replaces a route at a port.
    AddRoute(PortId, Route),
    /// Removes the route with that key and mask.
    RemoveRoute(PortId, Uid, u64),
    /// Sets a port's default route.
    SetDefault(PortId, Option<PortId>),
    /// Admits a connection at a port.
    Allow(PortId, ConnKey),
    /// Withdraws a connection at a port.
    Revoke(PortId, ConnKey),
    /// Appends a connectionless rule.
    AddRule(PortId, AclRule),
    /// Removes a port's connectionless rules.
    ClearRules(PortId),
    /// Steers a connection to a port.
    AddTranslation(ConnKey, PortId),
    /// Removes a connection's translation.
    RemoveTranslation(ConnKey),
    /// Sets an output's scheduling policy.
    SetPolicy(PortId, Policy),
    /// Reads a port's counters.
    Counters(PortId),
    /// Reads a port's tables back.
    Dump(PortId),
}
