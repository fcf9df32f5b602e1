//! Messages between two devices that take the PIO mailbox when small and
//! the DMA ring when large, by a [`PathPolicy`]; one ordered stream either
//! way.
//!
//! ```text
//!  sender                                         receiver
//!  ≤ threshold: mailbox [0 | bytes…] ───────────▶ copies the bytes out
//!  > threshold: DMA own memory → window slot k,
//!               wait for the completion, then
//!               mailbox [1 | k | length] ────────▶ checks k and length,
//!                                                  copies slot k out
//! ```
//!
//! The notice goes through the mailbox after the DMA completed, so the
//! receiver sees messages in the order sent whatever path each took. The
//! window has four slots, used in turn: a slot is written again only after
//! the notice three DMA messages later was sent, which the mailbox allows
//! only once the receiver took the notice of the slot's previous message —
//! and it copies a slot out before it asks for the next message.

use std::time::Duration;

use crate::device::{DeviceRegion, Direction};
use crate::dma::{DmaDriver, DmaError};
use crate::mailbox::{MailboxError, MailboxReceiver, MailboxSender};
use crate::p2p::{PathKind, PathPolicy};

/// Slots of the receive window.
pub const WINDOW_SLOTS: usize = 4;
const TAG_INLINE: u8 = 0;
const TAG_DMA: u8 = 1;

/// Why a hybrid send or receive failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HybridError {
    /// The mailbox failed.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    /// The DMA transfer failed.
    #[error(transparent)]
    Dma(#[from] DmaError),
    /// A message longer than a window slot.
    #[error("message of {0} bytes exceeds the window slot")]
    TooLarge(usize),
    /// A notice that names no slot or more bytes than a slot holds.
    #[error("malformed notice from the sender")]
    BadNotice,
}

/// Where the large messages go: a window of [`WINDOW_SLOTS`] slots.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Bus address of the window's first slot, as the sender's engine sees
    /// it (4 KiB aligned).
    pub bus_addr: u64,
    /// Offset of the window in the receiver's device memory.
    pub offset: usize,
    /// Bytes per slot: a multiple of 4096.
    pub slot_bytes: usize,
}

/// The sending end: a mailbox, the sender device's DMA driver and a
/// staging area in the sender device's memory.
#[derive(Debug)]
pub struct HybridSender {
    mailbox: MailboxSender,
    dma: DmaDriver,
    policy: PathPolicy,
    /// Offset of the staging area in the sender device's memory, and its
    /// bus address.
    staging: (usize, u64),
    window: Window,
    next_slot: usize,
    scratch: Vec<u8>,
    timeout: Duration,
}

impl HybridSender {
    /// A sender that stages large messages at `staging` (offset in the
    /// device memory of `dma`'s device, and its bus address) and moves
    /// them into `window`.
    pub fn new(
        mailbox: MailboxSender,
        dma: DmaDriver,
        policy: PathPolicy,
        staging: (usize, u64),
        window: Window,
    ) -> HybridSender {
        HybridSender {
            mailbox,
            dma,
            policy,
            staging,
            window,
            next_slot: 0,
            scratch: Vec::with_capacity(policy.pio_max_bytes + 1),
            timeout: Duration::from_secs(10),
        }
    }

    /// Sends `msg` and returns the path it took.
    pub fn send(&mut self, msg: &[u8]) -> Result<PathKind, HybridError> {
        match self.policy.choose(msg.len()) {
            PathKind::Pio => {
                self.scratch.clear();
                self.scratch.push(TAG_INLINE);
                self.scratch.extend_from_slice(msg);
                self.mailbox.send(&self.scratch)?;
                Ok(PathKind::Pio)
            }
            PathKind::Dma => {
                if msg.len() > self.window.slot_bytes {
                    return Err(HybridError::TooLarge(msg.len()));
                }
                let dev: &DeviceRegion = self.dma.device();
                if !dev.write_memory(self.staging.0, msg) {
                    return Err(HybridError::TooLarge(msg.len()));
                }
                let slot = self.next_slot;
                self.next_slot = (slot + 1) % WINDOW_SLOTS;
                let words = msg.len().next_multiple_of(4);
                let dst = self.window.bus_addr + (slot * self.window.slot_bytes) as u64;
                self.dma
                    .transfer(Direction::Write, self.staging.1, dst, words, self.timeout)?;
                let mut notice = [0u8; 6];
                notice[0] = TAG_DMA;
                notice[1] = slot as u8;
                notice[2..6].copy_from_slice(&(msg.len() as u32).to_le_bytes());
                self.mailbox.send(&notice)?;
                Ok(PathKind::Dma)
            }
        }
    }
}

/// The receiving end: a mailbox and the window in the receiver device's
/// memory.
#[derive(Debug)]
pub struct HybridReceiver {
    mailbox: MailboxReceiver,
    device: DeviceRegion,
    window: Window,
}

impl HybridReceiver {
    /// A receiver reading notices from `mailbox` and large messages from
    /// `window` of `device`.
    pub fn new(mailbox: MailboxReceiver, device: DeviceRegion, window: Window) -> HybridReceiver {
        HybridReceiver {
            mailbox,
            device,
            window,
        }
    }

    /// Receives the next message into `out` (replaced); returns the path
    /// it came by.
    pub fn recv(&mut self, out: &mut Vec<u8>) -> Result<PathKind, HybridError> {
        self.mailbox.recv(out)?;
        match out.first() {
            Some(&TAG_INLINE) => {
                out.remove(0);
                Ok(PathKind::Pio)
            }
            Some(&TAG_DMA) if out.len() == 6 => {
                let slot = out[1] as usize;
                let len = u32::from_le_bytes([out[2], out[3], out[4], out[5]]) as usize;
                if slot >= WINDOW_SLOTS || len > self.window.slot_bytes {
                    return Err(HybridError::BadNotice);
                }
                out.resize(len, 0);
                let at = self.window.offset + slot * self.window.slot_bytes;
                if !self.device.read_memory(at, out) {
                    return Err(HybridError::BadNotice);
                }
                Ok(PathKind::Dma)
            }
            _ => Err(HybridError::BadNotice),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceConfig;
    use crate::dma::{bus_addr, Bus, DmaEngine};
    use crate::mailbox::{MailboxRegion, Side, WaitPolicy};
    use std::time::Instant;

    #[test]
    fn small_and_large_messages_arrive_in_order_each_by_its_path() {
        let dev = |n: &str| {
            DeviceRegion::create(&DeviceConfig {
                name: n.into(),
                memory_bytes: 4 << 20,
                ring_depth: 16,
            })
            .unwrap()
        };
        let (a, b) = (dev("hybrid-a"), dev("hybrid-b"));
        let mut bus = Bus::new();
        bus.map_device(1, &a);
        bus.map_device(2, &b);
        let _engine = DmaEngine::new(a.clone(), bus).spawn();
        let region = MailboxRegion::create(1, 128).unwrap();
        let (tx, _) = region.endpoint(0, Side::A, WaitPolicy::default()).unwrap();
        let (_, rx) = region.endpoint(0, Side::B, WaitPolicy::default()).unwrap();
        let window = Window {
            bus_addr: bus_addr(2, 1 << 20),
            offset: 1 << 20,
            slot_bytes: 64 << 10,
        };
        let mut sender = HybridSender::new(
            tx,
            DmaDriver::new(a.clone()),
            PathPolicy::default(),
            (0, bus_addr(1, 0)),
            window,
        );
        let mut receiver = HybridReceiver::new(rx, b.clone(), window);
        let sizes = [0usize, 1, 100, 256, 257, 4096, 9600, 65536, 3];
        let msg = move |i: usize| -> Vec<u8> {
            (0..sizes[i % sizes.len()])
                .map(|k| (k * 7 + i) as u8)
                .collect()
        };
        let t = std::thread::spawn(move || {
            let mut paths = Vec::new();
            for i in 0..200 {
                paths.push(sender.send(&msg(i)).unwrap());
            }
            paths
        });
        let mut out = Vec::new();
        let start = Instant::now();
        let mut got = Vec::new();
        for i in 0..200 {
            got.push(receiver.recv(&mut out).unwrap());
            assert_eq!(out, msg(i), "message {i}");
            assert!(start.elapsed() < Duration::from_secs(20));
        }
        let sent = t.join().unwrap();
        assert_eq!(sent, got);
        let dma = got.iter().filter(|p| **p == PathKind::Dma).count();
        let want = (0..200).filter(|i| sizes[i % sizes.len()] > 256).count();
        assert_eq!(dma, want, "257 B and up went by DMA");
    }

    #[test]
    fn a_notice_naming_no_slot_is_refused() {
        let d = DeviceRegion::create(&DeviceConfig {
            name: "hybrid-bad".into(),
            memory_bytes: 1 << 20,
            ring_depth: 4,
        })
        .unwrap();
        let region = MailboxRegion::create(1, 128).unwrap();
        let (mut tx, _) = region.endpoint(0, Side::A, WaitPolicy::BusyPoll).unwrap();
        let (_, rx) = region.endpoint(0, Side::B, WaitPolicy::BusyPoll).unwrap();
        let window = Window {
            bus_addr: 0,
            offset: 0,
            slot_bytes: 4096,
        };
        let mut r = HybridReceiver::new(rx, d, window);
        let mut out = Vec::new();
        // Slot 9 of 4; 64 KiB in a 4 KiB slot; an unknown tag.
        for notice in [
            &[TAG_DMA, 9, 0, 0, 0, 0][..],
            &[TAG_DMA, 0, 0, 0, 1, 0],
            &[7],
        ] {
            tx.send(notice).unwrap();
            assert!(matches!(r.recv(&mut out), Err(HybridError::BadNotice)));
        }
    }
}
