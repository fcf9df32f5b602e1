//! The uniplane vocabulary: what every other crate of uniplane speaks.
//!
//! - [`Uid`], [`Endpoint`], [`MemoryAddress`]: global names of resources,
//!   ports and memory bytes (`10.0.0.7:3`, `10.0.0.7:3/80`, `10.0.0.7:5@0x1000`).
//! - [`wire`]: the 32-byte DUA header, its field table, request types and
//!   checked zero-copy views; [`Message`] = header + payload.
//! - [`codec::MessageCodec`]: framing on byte streams.
//! - [`Link`] and [`Stack`]: the traits every transport implements;
//!   [`channel`]: the in-process link over two bounded queues.
//! - [`batched::BatchedLink`]: the Stream/Sink plumbing of every stack's
//!   link, over the stack's own batched I/O ([`batched::LinkIo`]).
//! - [`fault`]: link middleware for fault injection (capture into pcap
//!   files is `uniplane_stacks::pcap`).
//! - [`ring`]: the bounded single-producer single-consumer ring between
//!   applications, stacks and the engine; [`port`]: [`PortIo`], the
//!   engine's view of a port's two queues, whatever is on the other side
//!   (a ring pair, a shared-memory link, a device run inline); [`sched`]: the output
//!   schedulers (round-robin, weighted deficit round-robin, strict priority)
//!   the overlay and the underlay share.
//!
//! ```
//! use uniplane_dataplane::{Message, Endpoint};
//! use bytes::{Bytes, BytesMut};
//!
//! let src: Endpoint = "10.0.0.7:3/80".parse()?;
//! let dst: Endpoint = "10.0.0.9:1/443".parse()?;
//! let msg = Message::send(src, dst, Bytes::from_static(b"hello"))?;
//! let mut wire = BytesMut::new();
//! msg.encode(&mut wire);
//! let (back, used) = Message::decode(&wire.freeze())?;
//! assert_eq!((back, used), (msg, 37));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]

pub mod batched;
pub mod channel;
#[cfg(feature = "tokio")]
pub mod codec;
pub mod fault;
pub mod link;

/// The old name of [`channel`], kept only while `services/` still says
/// `mem::{pair, MemLink}`; new code uses [`channel`].
pub mod mem {
    pub use crate::channel::{pair, ChannelLink as MemLink};
}
mod message;
pub mod port;
pub mod ring;
mod rng;
pub mod sched;
pub mod stack;
mod uid;
pub mod wire;

pub use link::{bridge, BoxLink, Link, LinkError, LinkExt, Pump};
pub use message::Message;
pub use port::{deferred_port, DeferredPort, PortClosed, PortHandoff, PortIo};
pub use rng::SplitMix64;
pub use stack::{BoxListener, Capabilities, Locator, Stack, StackError, StackFuture};
pub use uid::{Endpoint, MemoryAddress, ParseUidError, Target, Uid};
