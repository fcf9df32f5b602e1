//! The plane the daemon programs: one async, batched handle, whether the
//! software engine or the RTL is behind it.
//!
//! TEMPORARY: a mirror of the `PlaneHandle` the overlay is about to
//! publish, with the engine's implementation; it goes when the overlay's
//! lands, and the daemon uses that one unchanged.

use std::future::Future;
use std::pin::Pin;

use uniplane_control::PlaneOp;
use uniplane_dataplane::ring::RingLink;
use uniplane_overlay::{EngineHandle, ForwardingPlane, PlaneError, PortCounters, PortId};

/// What one plane operation returned.
pub enum PlaneReply {
    /// Done.
    Done,
    /// A port was attached: its number and the link its user holds.
    Attached(PortId, RingLink),
    /// A port's counters.
    Counters(PortCounters),
}

/// The outcome of a batch: one result per operation, or an error for all.
pub type PlaneFuture =
    Pin<Box<dyn Future<Output = Result<Vec<Result<PlaneReply, PlaneError>>, PlaneError>> + Send>>;

/// The async, batched handle the daemon holds.
pub trait PlaneHandle: Send + Sync + 'static {
    /// `engine` or `rtl`.
    fn kind(&self) -> &'static str;
    /// Applies `ops` in order.
    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture;
}

/// The software engine as a plane: a batch runs on a blocking thread,
/// never on a runtime thread.
pub struct EnginePlane(pub EngineHandle);

impl PlaneHandle for EnginePlane {
    fn kind(&self) -> &'static str {
        "engine"
    }

    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture {
        let mut engine = self.0.clone();
        let task = tokio::task::spawn_blocking(move || {
            ops.into_iter()
                .map(|op| apply(&mut engine, op))
                .collect::<Vec<_>>()
        });
        Box::pin(async move { task.await.map_err(|_| PlaneError::EngineGone) })
    }
}

fn apply(engine: &mut EngineHandle, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
    let done = |r: Result<(), PlaneError>| r.map(|()| PlaneReply::Done);
    match op {
        PlaneOp::Attach(spec) => engine
            .attach(spec)
            .map(|(port, link)| PlaneReply::Attached(port, link)),
        PlaneOp::Detach(p) => engine.detach(p).map(|_| PlaneReply::Done),
        PlaneOp::AddRoute(p, r) => done(engine.add_route(p, r)),
        PlaneOp::RemoveRoute(p, k, m) => done(engine.remove_route(p, k, m)),
        PlaneOp::SetDefault(p, d) => done(engine.set_default_route(p, d)),
        PlaneOp::Allow(p, c) => done(engine.allow_connection(p, c)),
        PlaneOp::Revoke(p, c) => done(engine.revoke_connection(p, c)),
        PlaneOp::AddRule(p, r) => done(engine.add_acl_rule(p, r)),
        PlaneOp::ClearRules(p) => done(engine.clear_acl_rules(p)),
        PlaneOp::AddTranslation(c, p) => done(engine.add_translation(c, p)),
        PlaneOp::RemoveTranslation(c) => done(engine.remove_translation(c)),
        PlaneOp::SetPolicy(p, policy) => done(engine.set_policy(p, policy)),
        PlaneOp::Counters(p) => engine.counters(p).map(PlaneReply::Counters),
        PlaneOp::Dump(p) => Err(PlaneError::NoSuchPort(p)),
    }
}
