//! A TAP device: the kernel sees an Ethernet interface whose wire is this
//! process. Frames move one `read`/`write` each — the tun driver has no
//! batch interface short of vhost-net — so TAP is the compatibility
//! backend; the frames still live in buffers allocated once.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::eth::{self, MacAddr};
use crate::sys::{self, cvt};
use crate::{FrameDevice, FrameStats, RxQueue, TxQueue, Wakeup};

/// How to open a TAP device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TapConfig {
    /// The address this process uses on the wire (the kernel interface has
    /// its own).
    pub mac: MacAddr,
    /// Largest frame payload.
    pub mtu: usize,
    /// Frames read per burst, and transmit slots.
    pub burst: usize,
}

impl Default for TapConfig {
    fn default() -> Self {
        TapConfig {
            mac: MacAddr::local(0x7a9),
            mtu: 1500,
            burst: 64,
        }
    }
}

/// Buffers of one size, allocated once.
struct Slots {
    buf: Vec<u8>,
    size: usize,
    lens: Vec<usize>,
}

impl Slots {
    fn new(n: usize, size: usize) -> Self {
        Slots {
            buf: vec![0; n * size],
            size,
            lens: vec![0; n],
        }
    }

    fn get(&mut self, i: usize) -> &mut [u8] {
        &mut self.buf[i * self.size..(i + 1) * self.size]
    }
}

/// Receive side of a TAP device.
pub struct TapRx {
    fd: RawFd,
    slots: Slots,
    filled: usize,
    next: usize,
    stats: FrameStats,
}

impl RxQueue for TapRx {
    fn ready(&self) -> usize {
        self.filled - self.next
    }

    fn refill(&mut self) -> io::Result<usize> {
        if self.next < self.filled {
            return Ok(self.filled - self.next);
        }
        self.filled = 0;
        self.next = 0;
        while self.filled < self.slots.lens.len() {
            let i = self.filled;
            let size = self.slots.size;
            let fd = self.fd;
            let slot = self.slots.get(i);
            // SAFETY: reading into a live buffer of `size` bytes.
            let rc = unsafe { libc::read(fd, slot.as_mut_ptr().cast(), size) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if sys::would_block(&e) {
                    break;
                }
                return Err(e);
            }
            self.slots.lens[i] = rc as usize;
            self.filled += 1;
        }
        if self.filled > 0 {
            self.stats.rx_bursts += 1;
        }
        Ok(self.filled)
    }

    fn take<R>(&mut self, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if self.next >= self.filled {
            return None;
        }
        let i = self.next;
        self.next += 1;
        let len = self.slots.lens[i];
        self.stats.rx_frames += 1;
        Some(f(&mut self.slots.get(i)[..len]))
    }
}

/// Transmit side of a TAP device.
pub struct TapTx {
    fd: RawFd,
    slots: Slots,
    /// Frames written and not yet sent: slots `sent..filled`.
    filled: usize,
    sent: usize,
    capacity: usize,
    stats: FrameStats,
}

impl TxQueue for TapTx {
    fn frame_capacity(&self) -> usize {
        self.capacity
    }

    fn has_room(&mut self) -> bool {
        if self.sent == self.filled {
            self.sent = 0;
            self.filled = 0;
        }
        self.filled < self.slots.lens.len()
    }

    fn push<R>(&mut self, len: usize, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        if len > self.capacity || !self.has_room() {
            return None;
        }
        let i = self.filled;
        self.slots.lens[i] = len;
        self.filled += 1;
        Some(f(&mut self.slots.get(i)[..len]))
    }

    fn push_burst(&mut self, max: usize, mut f: impl FnMut(usize, &mut [u8]) -> usize) -> usize {
        let mut n = 0;
        while n < max && self.has_room() {
            let i = self.filled;
            let cap = self.capacity;
            let len = f(n, &mut self.slots.get(i)[..cap]).min(cap);
            if len == 0 {
                break;
            }
            self.slots.lens[i] = len;
            self.filled += 1;
            n += 1;
        }
        n
    }

    fn unflushed(&self) -> usize {
        self.filled - self.sent
    }

    fn flush(&mut self) -> io::Result<usize> {
        let before = self.sent;
        while self.sent < self.filled {
            let i = self.sent;
            let len = self.slots.lens[i];
            let fd = self.fd;
            let slot = self.slots.get(i);
            // SAFETY: writing `len` bytes of a live buffer.
            let rc = unsafe { libc::write(fd, slot.as_ptr().cast(), len) };
            if rc < 0 {
                let e = io::Error::last_os_error();
                if sys::would_block(&e) {
                    break;
                }
                // A frame the kernel refuses is dropped and counted.
                self.stats.tx_errors += 1;
            }
            self.sent += 1;
        }
        let n = self.sent - before;
        if n > 0 {
            self.stats.tx_frames += n as u64;
            self.stats.tx_bursts += 1;
        }
        Ok(n)
    }
}

/// A TAP device; it disappears when dropped (unless made persistent
/// elsewhere).
pub struct TapDevice {
    rx: TapRx,
    tx: TapTx,
    fd: OwnedFd,
    name: String,
    mac: MacAddr,
    mtu: usize,
}

impl TapDevice {
    /// Creates (or attaches to) the TAP interface `name` in the calling
    /// thread's network namespace. Needs CAP_NET_ADMIN.
    pub fn open(name: &str, cfg: &TapConfig) -> io::Result<TapDevice> {
        // SAFETY: opening a device file with a constant path.
        let raw = cvt(unsafe {
            libc::open(
                c"/dev/net/tun".as_ptr(),
                libc::O_RDWR | libc::O_NONBLOCK | libc::O_CLOEXEC,
            )
        })?;
        // SAFETY: a descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: all-zero is a valid ifreq.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        if name.len() >= req.ifr_name.len() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "name too long"));
        }
        for (d, s) in req.ifr_name.iter_mut().zip(name.as_bytes()) {
            *d = *s as libc::c_char;
        }
        req.ifr_ifru.ifru_flags = (libc::IFF_TAP | libc::IFF_NO_PI) as libc::c_short;
        // SAFETY: TUNSETIFF reads and writes the ifreq.
        cvt(unsafe { libc::ioctl(raw, libc::TUNSETIFF as _, &mut req) })?;
        let burst = cfg.burst.max(1);
        let size = eth::HEADER_LEN + cfg.mtu;
        Ok(TapDevice {
            rx: TapRx {
                fd: raw,
                slots: Slots::new(burst, size),
                filled: 0,
                next: 0,
                stats: FrameStats::default(),
            },
            tx: TapTx {
                fd: raw,
                slots: Slots::new(burst, size),
                filled: 0,
                sent: 0,
                capacity: size,
                stats: FrameStats::default(),
            },
            fd,
            name: name.to_owned(),
            mac: cfg.mac,
            mtu: cfg.mtu,
        })
    }

    /// The interface's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl AsRawFd for TapDevice {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl FrameDevice for TapDevice {
    type Rx = TapRx;
    type Tx = TapTx;

    fn queues(&mut self) -> (&mut TapRx, &mut TapTx) {
        (&mut self.rx, &mut self.tx)
    }

    fn mac(&self) -> MacAddr {
        self.mac
    }

    fn mtu(&self) -> usize {
        self.mtu
    }

    fn wakeup(&self) -> Wakeup {
        Wakeup::Fd(self.fd.as_raw_fd())
    }

    fn stats(&self) -> FrameStats {
        let (r, t) = (&self.rx.stats, &self.tx.stats);
        FrameStats {
            rx_frames: r.rx_frames,
            rx_bursts: r.rx_bursts,
            tx_frames: t.tx_frames,
            tx_bursts: t.tx_bursts,
            tx_errors: t.tx_errors,
            ..FrameStats::default()
        }
    }
}
