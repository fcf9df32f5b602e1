//! uniplane's shared-memory stack: transports between processes of one
//! server, over memory they share, and the software form of PCIe
//! peer-to-peer between devices.
//!
//! - [`ShmLink`] / [`ShmListener`]: a [`Link`](uniplane_dataplane::Link)
//!   between two processes: two single-producer single-consumer byte rings
//!   of encoded messages in a sealed memfd handed over a Unix socket, with
//!   eventfd doorbells rung only when the other side parked. The host
//!   daemon gives each application its data path through it.
//! - [`ShmPort`] / [`ShmPortBell`]: the listener side of the same link as
//!   a [`PortIo`](uniplane_dataplane::PortIo) that the engine thread
//!   drives directly (no task, no relay), and the future that wakes a
//!   parked engine and reports the application's death.
//! - [`ShmStack`]: the same as a [`Stack`](uniplane_dataplane::Stack)
//!   named `shm`, whose locators are Unix socket paths.
//! - [`device`]: an emulated PCIe device — register window, read and write
//!   descriptor rings, completion words, device memory — in one region.
//! - [`dma`]: the DMA engine that plays the device (Avalon-MM style:
//!   last-pointer doorbells, done bits, out-of-order completion, a PCIe
//!   link model) and its driver.
//! - [`p2p`]: transfers between two devices in the `staged`,
//!   `staged-pipelined`, `push` and `pull` modes; PIO or DMA by size.
//! - [`hybrid`]: one ordered message stream between two devices, small
//!   messages through the mailbox and large ones through the DMA ring.
//! - [`connect`]: FPGA Connect's SEND/RECV through one receive window per
//!   device with token flow control.
//! - [`mailbox`]: the programmed-I/O mailbox: cache-line slots, busy-poll
//!   or spin-then-park.
//! - [`memory`]: one-sided WRTE/READ to a memory window by UID, bounds
//!   checked.
//! - [`ring`]: the shared byte ring, checked against a buggy or hostile
//!   peer; [`sys`]: memfd, mmap, eventfd, `SCM_RIGHTS` and futex — all of
//!   the crate's `unsafe`, behind bounds-checked accessors.
//!
//! `docs/shm.md` has the diagrams, the design and the measurements.

#![deny(missing_docs)]

pub mod connect;
pub mod device;
pub mod dma;
pub mod grant;
pub mod hybrid;
mod link;
pub mod mailbox;
pub mod memory;
pub mod p2p;
mod port;
pub mod ring;
mod stack;
pub mod sys;

pub use link::{
    ShmConfig, ShmError, ShmLink, ShmLinkStats, ShmListener, DEFAULT_RING_BYTES, MAX_RING_BYTES,
    MIN_RING_BYTES,
};
pub use port::{ShmPort, ShmPortBell, ShmPortEnd};
pub use stack::ShmStack;
