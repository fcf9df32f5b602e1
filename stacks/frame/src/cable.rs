//! A cable: two devices joined in memory, frame for frame, for tests that need no
//! privileges. Buffers are allocated once per pair and move between the
//! ends; each burst takes one lock and one eventfd write.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex};

use crate::eth::{self, MacAddr};
use crate::sys;
use crate::{FrameDevice, FrameStats, RxQueue, TxQueue, Wakeup};

/// One direction: frames in flight and the buffers free to carry more.
struct Lane {
    filled: Mutex<VecDeque<Vec<u8>>>,
    free: Mutex<Vec<Vec<u8>>>,
    /// Readable when `filled` has frames; owned by the receiving end.
    event: OwnedFd,
}

impl Lane {
    fn new(frames: usize, size: usize) -> io::Result<Arc<Lane>> {
        let raw = sys::eventfd()?;
        Ok(Arc::new(Lane {
            filled: Mutex::new(VecDeque::with_capacity(frames)),
            free: Mutex::new((0..frames).map(|_| Vec::with_capacity(size)).collect()),
            // SAFETY: a descriptor we just created and own.
            event: unsafe { OwnedFd::from_raw_fd(raw) },
        }))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Receive side of a memory device.
pub struct CableRx {
    lane: Arc<Lane>,
    burst: VecDeque<Vec<u8>>,
    done: Vec<Vec<u8>>,
    stats: FrameStats,
}

impl RxQueue for CableRx {
    fn ready(&self) -> usize {
        self.burst.len()
    }

    fn refill(&mut self) -> io::Result<usize> {
        if !self.done.is_empty() {
            lock(&self.lane.free).append(&mut self.done);
        }
        if !self.burst.is_empty() {
            return Ok(self.burst.len());
        }
        sys::eventfd_drain(self.lane.event.as_raw_fd());
        std::mem::swap(&mut *lock(&self.lane.filled), &mut self.burst);
        if !self.burst.is_empty() {
            self.stats.rx_bursts += 1;
        }
        Ok(self.burst.len())
    }

    fn take<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let mut b = self.burst.pop_front()?;
        let r = f(&mut b);
        self.done.push(b);
        self.stats.rx_frames += 1;
        Some(r)
    }
}

/// Transmit side of a memory device.
pub struct CableTx {
    lane: Arc<Lane>,
    spare: Vec<Vec<u8>>,
    pushed: VecDeque<Vec<u8>>,
    capacity: usize,
    stats: FrameStats,
}

impl TxQueue for CableTx {
    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn has_room(&mut self) -> bool {
        if self.spare.is_empty() {
            std::mem::swap(&mut *lock(&self.lane.free), &mut self.spare);
        }
        !self.spare.is_empty()
    }

    fn push<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if len > self.capacity || !self.has_room() {
            return None;
        }
        let mut b = self.spare.pop()?;
        b.clear();
        b.resize(len, 0);
        let r = f(&mut b);
        self.pushed.push_back(b);
        Some(r)
    }

    fn push_burst(&mut self, max: usize, mut f: impl FnMut(usize, &mut [u8]) -> usize) -> usize {
        let mut n = 0;
        while n < max && self.has_room() {
            let Some(mut b) = self.spare.pop() else {
                break;
            };
            b.clear();
            b.resize(self.capacity, 0);
            let len = f(n, &mut b).min(self.capacity);
            if len == 0 {
                self.spare.push(b);
                break;
            }
            b.truncate(len);
            self.pushed.push_back(b);
            n += 1;
        }
        n
    }

    fn unflushed(&self) -> usize {
        self.pushed.len()
    }

    fn flush(&mut self) -> io::Result<usize> {
        let n = self.pushed.len();
        if n == 0 {
            return Ok(0);
        }
        lock(&self.lane.filled).append(&mut self.pushed);
        sys::eventfd_signal(self.lane.event.as_raw_fd());
        self.stats.tx_frames += n as u64;
        self.stats.tx_bursts += 1;
        Ok(n)
    }
}

/// One end of a memory pair.
pub struct CableDevice {
    rx: CableRx,
    tx: CableTx,
    mac: MacAddr,
    mtu: usize,
}

/// Two devices with addresses `a` and `b`, each direction with `frames`
/// buffers of `mtu` bytes of payload.
pub fn pair(
    a: MacAddr,
    b: MacAddr,
    mtu: usize,
    frames: usize,
) -> io::Result<(CableDevice, CableDevice)> {
    let size = eth::HEADER_LEN + mtu;
    let ab = Lane::new(frames, size)?;
    let ba = Lane::new(frames, size)?;
    let end = |mac, rx: &Arc<Lane>, tx: &Arc<Lane>| CableDevice {
        rx: CableRx {
            lane: rx.clone(),
            burst: VecDeque::with_capacity(frames),
            done: Vec::with_capacity(frames),
            stats: FrameStats::default(),
        },
        tx: CableTx {
            lane: tx.clone(),
            spare: Vec::with_capacity(frames),
            pushed: VecDeque::with_capacity(frames),
            capacity: size,
            stats: FrameStats::default(),
        },
        mac,
        mtu,
    };
    Ok((end(a, &ba, &ab), end(b, &ab, &ba)))
}

impl FrameDevice for CableDevice {
    type Rx = CableRx;
    type Tx = CableTx;

    fn queues(&mut self) -> (&mut CableRx, &mut CableTx) {
        (&mut self.rx, &mut self.tx)
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::Fd(self.rx.lane.event.as_raw_fd() as RawFd)
    }

    fn stats(&self) -> FrameStats {
        let (r, t) = (&self.rx.stats, &self.tx.stats);
        FrameStats {
            rx_frames: r.rx_frames,
            rx_bursts: r.rx_bursts,
            tx_frames: t.tx_frames,
            tx_bursts: t.tx_bursts,
            ..FrameStats::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_cross_a_memory_pair_in_bursts_and_buffers_come_back() {
        let (mut a, mut b) = pair(MacAddr::local(1), MacAddr::local(2), 1500, 4).unwrap();
        for round in 0..3u8 {
            let (_, tx) = a.queues();
            for i in 0..4u8 {
                tx.push(60, |f| f[0] = round * 10 + i).unwrap();
            }
            assert!(tx.push(60, |_| ()).is_none(), "only four buffers");
            assert_eq!(tx.flush().unwrap(), 4);
            let (rx, _) = b.queues();
            assert_eq!(rx.refill().unwrap(), 4);
            let mut got = Vec::new();
            while let Some(v) = rx.take(|f| (f[0], f.len())) {
                got.push(v);
            }
            assert_eq!(
                got,
                (0..4).map(|i| (round * 10 + i, 60)).collect::<Vec<_>>()
            );
            assert_eq!(rx.refill().unwrap(), 0);
        }
        assert_eq!(a.stats().tx_frames, 12);
        assert_eq!(b.stats().rx_frames, 12);
    }

    #[test]
    fn a_burst_push_writes_frames_of_their_own_lengths_and_stops_at_zero() {
        let (mut a, mut b) = pair(MacAddr::local(1), MacAddr::local(2), 1500, 8).unwrap();
        let (_, tx) = a.queues();
        let n = tx.push_burst(10, |i, slot| {
            assert_eq!(slot.len(), 1514);
            slot[0] = i as u8;
            if i == 3 {
                0
            } else {
                60 + i
            }
        });
        assert_eq!(n, 3);
        assert_eq!(tx.push_burst(100, |_, _| 60), 5, "eight buffers in all");
        tx.flush().unwrap();
        let (rx, _) = b.queues();
        rx.refill().unwrap();
        let lens: Vec<usize> = std::iter::from_fn(|| rx.take(|f| f.len())).collect();
        assert_eq!(lens, vec![60, 61, 62, 60, 60, 60, 60, 60]);
    }
}
