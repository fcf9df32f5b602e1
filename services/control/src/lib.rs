//! `uniplane-control`: the host daemon's control plane as a sans-IO state
//! machine (see [`Control`] for the inputs, outputs and the algorithm).
//!
//! The daemon (`uniplaned`) feeds it client requests, peer messages,
//! tunnel and plane completions and time, and carries out what it asks:
//! plane batches, answers, notices, peer messages, tunnels to open. It
//! reads no clock and touches no socket, so every rule is tested here on
//! virtual time, against a model plane.

#![deny(missing_docs)]

pub mod config;
mod core;
pub mod image;
mod types;

pub use crate::config::{
    AccessRule, ControlConfig, DefaultAction, DeviceSpec, Limits, MultiHopRoute, NextHop, PeerSpec,
    RemoteSpec, UidMatch, CHAIN_PORT,
};
pub use crate::core::{
    Connection, Control, InboundView, PeerView, Resource, ResourceKind, RouteRow, DAEMON_DEVICE,
};
pub use crate::image::{PlaneImage, PortImage};
pub use crate::types::*;
/// The plane operations the core emits, as the overlay defines them.
pub use uniplane_overlay::PlaneOp;
