//! The underlay of DUA (§7.3): what stands between the stacks and one
//! physical interface.
//!
//! ```text
//!  stack 0 ─┐                        ┌─ queue 0 ─┐
//!  stack 1 ─┼─► Filter ─(drop+event)─┼─ queue 1 ─┼─► Scheduler ─► TokenBucket ─► interface
//!  stack N ─┘                        └─ queue N ─┘
//!
//!  interface ─► Demux ─► stack / queue chosen by header (or the default)
//! ```
//!
//! - [`Filter`] applies the control plane's [`FilterRules`]: allowed
//!   sources, maximum length, allowed request types and memory windows.
//!   A message that breaks a rule is dropped, counted by [`Reason`] and
//!   reported as a [`ViolationEvent`] in a bounded queue.
//! - [`InterfaceMux`] ties the filter, one bounded FIFO per stack, the
//!   shared [`uniplane_dataplane::sched::Scheduler`] (round-robin,
//!   weighted, strict priority) and an optional [`TokenBucket`] into one
//!   object per interface. A full queue gives the message back; nothing is
//!   dropped for congestion.
//! - [`Demux`] hands incoming messages to their stack by destination UID
//!   and request type.
//!
//! Everything here is sans-IO: plain structs driven by explicit virtual
//! time ([`Nanos`]), never the wall clock, so runs are deterministic. The
//! per-message path allocates nothing, takes no lock and makes no system
//! call; payloads are never copied.
//!
//! ```
//! use bytes::Bytes;
//! use uniplane_dataplane::{sched::Policy, Message};
//! use uniplane_underlay::{InterfaceMux, MuxConfig, ShaperConfig};
//!
//! let mut mux = InterfaceMux::new(MuxConfig {
//!     policy: Policy::Weighted(vec![1, 3]),
//!     shaper: Some(ShaperConfig::new(125_000_000, 16 * 1024)), // 1 Gb/s
//!     ..MuxConfig::new(2, 256)
//! })?;
//! let msg = Message::send("10.0.0.1:1/7".parse()?, "10.0.0.2:1/9".parse()?, Bytes::from_static(b"hi"))?;
//! mux.offer(1, msg, 0)?;
//! let now = mux.next_ready(0).expect("one message waits");
//! assert!(mux.dequeue(now).is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

mod demux;
mod filter;
mod matcher;
mod mux;
mod queue;
mod shaper;

pub use demux::{Demux, DemuxCounters, DemuxError, DemuxRule};
pub use filter::{
    AddressWindow, Filter, FilterCounters, FilterRules, Reason, Violation, ViolationEvent,
    WindowError,
};
pub use matcher::{TypeSet, UidMatch};
pub use mux::{InterfaceMux, MuxConfig, MuxError, OfferError, QueueCounters, WireCounters};
pub use shaper::{ShaperConfig, ShaperError, TokenBucket};

/// Virtual time: nanoseconds since an epoch the driver chooses.
///
/// Every time-dependent call takes `now` from its caller; nothing in this
/// crate reads a clock. A driver on real time passes
/// `start.elapsed().as_nanos() as u64`; a test passes whatever it likes.
/// Time that goes backwards is treated as no time passing.
pub type Nanos = u64;

/// Nanoseconds in one second.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;
