//! smoltcp's [`Device`] over the frame layer: tokens lend the frame
//! layer's own slots — a received frame in place in the ring, a transmit
//! slot to be written in place — so nothing is allocated or copied per
//! frame on the way between smoltcp and the device.

use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use uniplane_frame::eth::HEADER_LEN;
use uniplane_frame::{FrameDevice, RxQueue, TxQueue};

/// A frame device as smoltcp sees it, for the duration of one poll.
pub struct Phy<'a, D: FrameDevice> {
    dev: &'a mut D,
    /// Where a frame goes when smoltcp must write one and no slot is free
    /// (smoltcp's tokens cannot refuse): allocated once, then dropped.
    spill: &'a mut Vec<u8>,
    /// Frames that went to `spill`.
    pub dropped: u64,
}

impl<'a, D: FrameDevice> Phy<'a, D> {
    /// Wraps `dev`; `spill` holds a frame smoltcp writes when the transmit
    /// queue is full.
    pub fn new(dev: &'a mut D, spill: &'a mut Vec<u8>) -> Self {
        Phy {
            dev,
            spill,
            dropped: 0,
        }
    }
}

/// Lends the next received frame.
pub struct RxToken<'a, Q: RxQueue> {
    rx: &'a mut Q,
}

impl<Q: RxQueue> phy::RxToken for RxToken<'_, Q> {
    fn consume<R, F>(self, f: F) -> R
    where
        F: FnOnce(&[u8]) -> R,
    {
        let mut f = Some(f);
        let r = self.rx.take(|frame| f.take().map(|f| f(frame)));
        match (r, f) {
            (Some(Some(r)), _) => r,
            // Nothing after all (a truncated frame was skipped): smoltcp
            // ignores an empty frame.
            (_, Some(f)) => f(&[]),
            (_, None) => unreachable!("the closure ran but returned nothing"),
        }
    }
}

/// Lends a transmit slot.
pub struct TxToken<'a, Q: TxQueue> {
    tx: &'a mut Q,
    spill: &'a mut Vec<u8>,
    dropped: &'a mut u64,
}

impl<Q: TxQueue> phy::TxToken for TxToken<'_, Q> {
    fn consume<R, F>(self, len: usize, f: F) -> R
    where
        F: FnOnce(&mut [u8]) -> R,
    {
        let mut f = Some(f);
        let r = self.tx.push(len, |slot| f.take().map(|f| f(slot)));
        match (r, f) {
            (Some(Some(r)), _) => r,
            (_, Some(f)) => {
                *self.dropped += 1;
                self.spill.resize(len, 0);
                f(&mut self.spill[..len])
            }
            (_, None) => unreachable!("the closure ran but returned nothing"),
        }
    }
}

impl<D: FrameDevice> phy::Device for Phy<'_, D> {
    type RxToken<'t>
        = RxToken<'t, D::Rx>
    where
        Self: 't;
    type TxToken<'t>
        = TxToken<'t, D::Tx>
    where
        Self: 't;

    fn receive(&mut self, _now: Instant) -> Option<(Self::RxToken<'_>, Self::TxToken<'_>)> {
        let (rx, tx) = self.dev.queues();
        if rx.ready() == 0 && rx.refill().ok()? == 0 {
            return None;
        }
        if !tx.has_room() {
            // Make room for an answer; if none, the answer is dropped (and
            // the peer retransmits), the frame is still taken.
            let _ = tx.flush();
        }
        Some((
            RxToken { rx },
            TxToken {
                tx,
                spill: self.spill,
                dropped: &mut self.dropped,
            },
        ))
    }

    fn transmit(&mut self, _now: Instant) -> Option<Self::TxToken<'_>> {
        let (_, tx) = self.dev.queues();
        if !tx.has_room() {
            let _ = tx.flush();
            if !tx.has_room() {
                return None;
            }
        }
        Some(TxToken {
            tx,
            spill: self.spill,
            dropped: &mut self.dropped,
        })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = HEADER_LEN + self.dev.mtu();
        caps.max_burst_size = None;
        // Computed on send (nothing offloads it on these devices) and
        // verified on receive (the frame layer completes the checksums a
        // local kernel left to offload).
        let mut sums = ChecksumCapabilities::default();
        sums.ipv4 = Checksum::Both;
        sums.tcp = Checksum::Both;
        sums.udp = Checksum::Both;
        caps.checksum = sums;
        caps
    }
}
