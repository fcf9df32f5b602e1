//! The uniplane overlay (DUA §7.1): the software router every message of
//! a server passes through.
//!
//! - [`table`]: forwarding tables (destination UID → output port).
//! - [`acl`]: access control (installed connections, connectionless rules).
//! - [`segment`]: segmentation to a path's MTU and reassembly.
//! - [`crossbar`]: virtual output queues and per-output schedulers.
//! - [`translator`]: many connections over one stack tunnel.
//! - [`plane`]: the `ForwardingPlane` control API.
//! - [`engine`]: the run-to-completion loop that ties them together.
//! - [`inline`]: the fast path that forwards on the sender's thread.
//! - [`shard`]: the same engine on N threads, one crossbar between them.

#![deny(missing_docs)]

pub mod acl;
pub mod crossbar;
pub mod engine;
pub mod inline;
pub mod plane;
pub mod remote;
pub mod segment;
pub mod shard;
pub mod table;
pub mod translator;

pub use engine::{Engine, EngineConfig, EngineHandle, RunMode};
pub use inline::InlineLink;
pub use plane::{
    ForwardingPlane, IoSlot, PlaneError, PlaneOp, PlaneReply, PortCounters, PortDump, PortKind,
    PortSpec,
};
pub use remote::{PlaneFuture, PlaneHandle, PlaneInbox, PlaneRemote};
pub use shard::{spawn_sharded, ShardConfig};

/// Index of a port of the engine.
pub type PortId = u16;
