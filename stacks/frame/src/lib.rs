//! The frame layer: bursts of Ethernet frames moved through preallocated
//! buffers, with no socket semantics (as Demikernel keeps its frame layer
//! apart from `connect/push/pop`).
//!
//! A [`FrameDevice`] is a pair of queues. The [`RxQueue`] lends received
//! frames in place — a slot of an `AF_PACKET` ring, a DPDK mbuf — one at a
//! time, and gives the slot back when the next is taken; [`RxQueue::refill`]
//! asks the backend for a new burst. The [`TxQueue`] lends free transmit
//! slots to be written in place; [`TxQueue::flush`] hands every written
//! frame to the backend at once. Nothing is allocated per frame, and the
//! backends that can (rings, DPDK) make at most one system call per burst.
//!
//! Backends:
//! - [`packet`]: `AF_PACKET` with a `TPACKET_V3` receive ring and a
//!   `TPACKET_V3` transmit ring in one mapping, optional fanout and a
//!   classic-BPF filter;
//! - [`tap`]: a TAP device (one system call per frame: the tun driver has
//!   no batch interface);
//! - [`cable`]: two devices joined in memory, for tests without privileges;
//! - DPDK lives in the `uniplane-dpdk` crate behind its `dpdk` feature.
//!
//! [`AsyncDevice`] adds readiness for async tasks; [`eth`] is the checked
//! view of an Ethernet header.

#![deny(missing_docs)]

mod async_device;
pub mod cable;
pub mod eth;
pub mod packet;
mod sys;
pub mod tap;

pub use async_device::AsyncDevice;
pub use eth::{EthernetFrame, MacAddr};

use std::io;
use std::os::fd::RawFd;

/// The receive half of a device: frames lent in place, a burst at a time.
pub trait RxQueue: Send {
    /// Frames of the current burst not yet taken (an upper bound: frames
    /// a backend must drop, such as truncated ones, are skipped by
    /// [`RxQueue::take`]).
    fn ready(&self) -> usize;

    /// Gives back what was taken and, when the current burst is used up,
    /// fetches the next one from the backend. Returns the frames ready.
    /// Never blocks; `Ok(0)` means nothing arrived.
    fn refill(&mut self) -> io::Result<usize>;

    /// Lends the next frame of the current burst (Ethernet header first) to
    /// `f`; the slot goes back to the backend at the next `take` or
    /// `refill`. `None` when the burst is used up.
    fn take<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R>;
}

/// The transmit half of a device: free slots written in place, handed to
/// the backend in bursts.
pub trait TxQueue: Send {
    /// Largest frame a slot holds (Ethernet header included).
    fn frame_capacity(&self) -> usize;

    /// Whether a slot is free now (after reclaiming the ones the backend
    /// finished with, which costs no system call).
    fn has_room(&mut self) -> bool;

    /// Lends a free slot of exactly `len` bytes to `f`, which writes the
    /// frame; the frame goes out at the next [`TxQueue::flush`]. `None`
    /// (and `f` not called) when no slot is free or `len` exceeds the
    /// capacity.
    fn push<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R>;

    /// Lends up to `max` free slots one after another, each
    /// [`TxQueue::frame_capacity`] bytes long: `f(i, slot)` writes the
    /// `i`-th frame and returns its length (0 stops, leaving that slot
    /// unused). Returns how many frames were pushed. A burst-wide
    /// [`TxQueue::push`] for generators and packers: bookkeeping once per
    /// burst instead of once per frame.
    fn push_burst(&mut self, max: usize, f: impl FnMut(usize, &mut [u8]) -> usize) -> usize;

    /// Frames pushed and not yet flushed.
    fn unflushed(&self) -> usize;

    /// Hands every pushed frame to the backend (at most one system call).
    /// Returns how many left; frames the backend could not take yet stay
    /// queued for the next flush.
    fn flush(&mut self) -> io::Result<usize>;
}

/// How a task learns that a device has frames or room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wakeup {
    /// The descriptor turns readable when frames arrive (and writable when
    /// transmit slots free up, where the backend supports it).
    Fd(RawFd),
    /// Poll-mode: nothing signals; the task polls again (DPDK).
    Poll,
}

/// What a device counted. Backends update the counters per burst.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameStats {
    /// Frames lent to the upper layer.
    pub rx_frames: u64,
    /// Bursts fetched that held at least one frame.
    pub rx_bursts: u64,
    /// Frames handed to the backend.
    pub tx_frames: u64,
    /// Flushes that handed at least one frame (system calls or PMD calls).
    pub tx_bursts: u64,
    /// Frames the backend received but did not fit (truncated): dropped.
    pub rx_truncated: u64,
    /// Frames whose TCP/UDP checksum a local sender left to offload and
    /// this layer completed (`TP_STATUS_CSUMNOTREADY`).
    pub rx_csum_completed: u64,
    /// Frames the kernel or the device dropped for lack of room, as far as
    /// the backend reports them.
    pub rx_dropped: u64,
    /// Frames the backend refused to send.
    pub tx_errors: u64,
}

/// A network device seen as two queues of frames.
pub trait FrameDevice: Send + Unpin + 'static {
    /// The receive queue.
    type Rx: RxQueue;
    /// The transmit queue.
    type Tx: TxQueue;

    /// Both queues at once, so a frame can be answered while another is
    /// lent (smoltcp's token pairs need that).
    fn queues(&mut self) -> (&mut Self::Rx, &mut Self::Tx);

    /// The device's Ethernet address.
    fn mac(&self) -> MacAddr;

    /// Largest payload of a frame (the IP MTU: 1500, or 9000 with jumbo
    /// frames), Ethernet header excluded.
    fn mtu(&self) -> usize;

    /// How a task waits for it.
    fn wakeup(&self) -> Wakeup;

    /// Counters so far.
    fn stats(&self) -> FrameStats;
}

/// Opens the frame device of an interface by name: how a stack picks its
/// backend at run time (`AF_PACKET`, TAP, DPDK, memory).
pub trait DeviceOpener: Send + Sync + 'static {
    /// The device type.
    type Device: FrameDevice;

    /// Opens `iface` for frames of `ethertype` ([`packet::ETH_P_ALL`] for
    /// every one; backends that cannot filter ignore it).
    fn open(&self, iface: &str, ethertype: u16) -> io::Result<Self::Device>;
}

/// Opens `AF_PACKET` devices configured by the [`packet::PacketConfig`]
/// inside, whose `protocol` becomes the EtherType asked for.
#[derive(Clone, Debug, Default)]
pub struct PacketOpener(pub packet::PacketConfig);

impl DeviceOpener for PacketOpener {
    type Device = packet::PacketDevice;

    fn open(&self, iface: &str, ethertype: u16) -> io::Result<packet::PacketDevice> {
        let cfg = packet::PacketConfig {
            protocol: ethertype,
            ..self.0.clone()
        };
        packet::PacketDevice::open(iface, &cfg)
    }
}

/// Opens TAP devices configured by the [`tap::TapConfig`] inside.
#[derive(Clone, Debug, Default)]
pub struct TapOpener(pub tap::TapConfig);

impl DeviceOpener for TapOpener {
    type Device = tap::TapDevice;

    fn open(&self, iface: &str, _ethertype: u16) -> io::Result<tap::TapDevice> {
        tap::TapDevice::open(iface, &self.0)
    }
}
