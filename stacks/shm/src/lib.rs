//! uniplane's shared-memory stack: transports between processes of one
//! server, over memory they share.
//!
//! - [`ShmLink`] / [`ShmListener`]: a [`Link`](uniplane_dataplane::Link)
//!   between two processes: two single-producer single-consumer byte rings
//!   of encoded messages in a sealed memfd handed over a Unix socket, with
//!   eventfd doorbells rung only when the other side parked. The host
//!   daemon gives each application its data path through it.
//! - [`ShmStack`]: the same as a [`Stack`](uniplane_dataplane::Stack)
//!   named `shm`, whose locators are Unix socket paths.
//! - [`ring`]: the shared ring itself, checked against a buggy or hostile
//!   peer; [`sys`]: memfd, mmap, eventfd, `SCM_RIGHTS` and futex, where the
//!   crate's `unsafe` lives.

#![deny(missing_docs)]

pub mod connect;
pub mod device;
pub mod dma;
mod link;
pub mod mailbox;
pub mod memory;
pub mod p2p;
pub mod ring;
mod stack;
pub mod sys;

pub use link::{
    ShmConfig, ShmError, ShmLink, ShmLinkStats, ShmListener, DEFAULT_RING_BYTES, MAX_RING_BYTES,
    MIN_RING_BYTES,
};
pub use stack::ShmStack;
