//! The sans-IO core of uniplane's PGAS active messages, shared by both
//! kinds of endpoint:
//!
//! ```text
//!  software endpoint (uniplane-pgas)       hardware endpoint (pgas-target kernel)
//!  Endpoint ─ frames ─► Inbound ─► SoftTarget      Inbound ─► its own memory
//!                       └──────── this crate: wire, access, Inbound, Target ───┘
//! ```
//!
//! [`wire`] is the frame format, [`access`] the rules of an access (ACL,
//! atomics), [`target`] the target state machine ([`Inbound`]) and the
//! seam to what executes it ([`Target`]). [`stats`] is the layout of the
//! read-only statistics segment a hardware endpoint offers, since it has
//! no process to ask. Nothing here does I/O or needs a runtime, so the
//! kernel crate links it as well as the client-side endpoint.

#![deny(missing_docs)]

pub mod access;
pub mod stats;
pub mod target;
pub mod wire;

pub use access::{atomic_at, Access, Acl, AtomicOp, SegmentId, Width};
pub use stats::{HardwareStats, STATS_BYTES, STATS_SEGMENT};
pub use target::{
    AmCall, HandlerId, Inbound, Refusal, Reply, Target, TargetCounters, TargetStats,
    FIRST_USER_HANDLER, HANDLER_COUNTER, HANDLER_NONE, MAX_GET,
};
pub use wire::Shape;
