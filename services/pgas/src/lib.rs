//! PGAS active messages over uniplane, after Shoal: every endpoint of a
//! group owns segments of memory that the others reach by rank, segment
//! ID and offset, with active messages, gets, atomics and barriers.
//!
//! ```text
//!  rank 0 (a Session)                                rank 1 (a Session)
//!  ┌────────────────────┐  data, class 0: requests   ┌────────────────────┐
//!  │ Endpoint           │ ─────────────────────────► │ Inbound ─► Target  │
//!  │  short/medium/long │   (credit-limited)         │  segments,handlers │
//!  │  get/atomic/quiet  │ ◄───────────────────────── │                    │
//!  └────────────────────┘  control, class 1: replies,└────────────────────┘
//!                          credit, barrier messages
//! ```
//!
//! An [`Endpoint`] is a client [`uniplane_client::Session`] listening on
//! one port. [`Endpoint::join`] connects it to every member of a
//! [`Group`] (itself included) with two connections each: requests go on
//! the data connection (traffic class 0), replies, credit and barrier
//! messages come back on the peer's control connection (class 1), so a
//! reply never waits behind bulk data. A hardware rank — a kernel device
//! running the `pgas-target` kernel ([`Group::with_hardware`]) — gets
//! the data connection only, and answers on it. A sender may have at most
//! [`Options::credit_bytes`] of requests unprocessed at each target: a
//! full target pushes back on the sender, nothing is dropped.
//!
//! Messages of any size are cut into frames of one uniplane message
//! (64 KiB) and followed in order at the target: a long message lands
//! frame by frame in place (no reassembly copy), a medium one is gathered
//! for its handler. The first frame carries the whole access, so the
//! target checks bounds and ACL once and refuses the whole message before
//! a byte is written ([`Refusal`]).
//!
//! Completion follows OpenSHMEM: each message not sent
//! [`Completion::Async`] gets a reply that counts in
//! [`Endpoint::replies`] ([`Endpoint::wait_replies`]); bytes landing in
//! an endpoint's segments count in [`Endpoint::wait_mem`];
//! [`Endpoint::fence`] orders, [`Endpoint::quiet`] completes everything
//! outstanding; [`Endpoint::barrier`] is quiet plus a group-wide sync.
//!
//! # Example
//!
//! ```no_run
//! # async fn example(a: uniplane_client::Session, b: uniplane_client::Session)
//! #     -> Result<(), uniplane_pgas::PgasError> {
//! use uniplane_pgas::{Acl, Call, Completion, Endpoint, Group, Options};
//!
//! let a = Endpoint::bind(a, Options::default()).await?;
//! let b = Endpoint::bind(b, Options::default()).await?;
//! let group = Group::new(vec![a.uid(), b.uid()]);
//! let seg = b.register_segment(1 << 20, Acl::ReadWrite);
//! let (ja, jb) = tokio::join!(a.join(group.clone()), b.join(group));
//! ja?;
//! jb?;
//! // Put 4 MiB into rank 1's segment 0 and bump its counter once landed.
//! a.long(1, seg.id(), 0, &vec![7u8; 1 << 20], Call::counter(1), Completion::Reply)
//!     .await?;
//! a.wait_replies(1).await?;
//! b.wait_counter(1).await;
//! # Ok(())
//! # }
//! ```

#![deny(missing_docs)]

use std::sync::atomic::AtomicU64;

use tokio::sync::Notify;

mod endpoint;
mod error;
mod group;
pub mod jacobi;
pub mod segment;
pub mod target;
/// The frames endpoints exchange (`uniplane-pgas-core`).
pub use uniplane_pgas_core::wire;

pub use endpoint::{Call, Completion, DirectStats, Endpoint, Options, DEFAULT_PORT};
pub use error::PgasError;
pub use group::{Group, PlacedEndpoint, Placement};
pub use segment::{Access, Acl, AtomicOp, Segment, SegmentId, Width};
pub use target::{
    AmCall, Handler, HandlerId, Refusal, SoftTarget, Target, TargetStats, FIRST_USER_HANDLER,
    HANDLER_COUNTER, HANDLER_NONE, MAX_GET,
};
pub use uniplane_pgas_core::stats::{HardwareStats, STATS_BYTES, STATS_SEGMENT};
pub use wire::Shape;

/// Completion counters of an endpoint, and what wakes their waiters.
#[derive(Default)]
pub(crate) struct Progress {
    /// Replies received to non-async messages.
    pub(crate) replies: AtomicU64,
    /// Bytes landed in this endpoint's segments by long messages.
    pub(crate) mem: AtomicU64,
    /// The built-in counter handler's total.
    pub(crate) counter: AtomicU64,
    /// The built-in counter's total by sending rank.
    pub(crate) counter_from: std::sync::Mutex<rustc_hash::FxHashMap<usize, u64>>,
    pub(crate) notify: Notify,
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_frame_is_at_most_one_uniplane_message() {
        assert_eq!(
            crate::wire::MAX_FRAME,
            uniplane_dataplane::Message::MAX_PAYLOAD
        );
    }
}
