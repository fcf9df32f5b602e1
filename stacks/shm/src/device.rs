//! An emulated PCIe device: one shared region holding its register window
//! (BAR), its DMA descriptor rings and completion words, and its memory.
//!
//! ```text
//!  offset 0        BAR: registers, 4 KiB (one 128-byte line per writer)
//!         4096     read ring:  depth × 64-byte descriptors
//!                  write ring: depth × 64-byte descriptors
//!                  read completions:  depth × u64 status words
//!                  write completions: depth × u64 status words
//!  (4 KiB aligned) device memory
//! ```
//!
//! The region is a sealed memfd; whoever plays the device (the
//! [engine](crate::dma::DmaEngine)) and whoever drives it (the
//! [driver](crate::dma::DmaDriver)) may live in different processes, which
//! receive it with [`DeviceRegion::send`] / [`DeviceRegion::receive`].
//! Opening a region checks its header against its size, so a region whose
//! header lies is refused before anything indexes with it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use crate::sys::{memfd_name, recv_with_fds, send_with_fds, SharedMemory};

/// Descriptors per ring by default (the Avalon-MM DMA's 128).
pub const DEFAULT_RING_DEPTH: usize = 128;
/// Bytes of one descriptor (one cache line).
pub const DESCRIPTOR_BYTES: usize = 64;
/// Bytes of the register window.
pub const BAR_BYTES: usize = 4096;
/// Most descriptors per ring.
pub const MAX_RING_DEPTH: usize = 4096;

const MAGIC: u64 = u64::from_be_bytes(*b"UNIPDEV1");
const VERSION: u64 = 1;

/// Register offsets in the BAR. Registers written by different sides sit in
/// different 128-byte lines.
pub mod reg {
    /// `UNIPDEV1`.
    pub const MAGIC: usize = 0x000;
    /// Layout version.
    pub const VERSION: usize = 0x008;
    /// Descriptors per ring.
    pub const RING_DEPTH: usize = 0x010;
    /// Bytes of device memory.
    pub const MEMORY_BYTES: usize = 0x018;
    /// Offset of device memory in the region.
    pub const MEMORY_OFFSET: usize = 0x020;
    /// Last pointer of the read ring: descriptors posted so far (driver).
    pub const READ_LAST: usize = 0x080;
    /// Last pointer of the write ring: descriptors posted so far (driver).
    pub const WRITE_LAST: usize = 0x100;
    /// Futex word: 1 while the engine sleeps (engine sets, driver clears).
    pub const ENGINE_SLEEP: usize = 0x180;
    /// Completions published so far, a futex word the driver waits on (engine).
    pub const COMPLETIONS: usize = 0x200;
    /// 1 while the driver sleeps on `COMPLETIONS` (driver sets, engine clears).
    pub const DRIVER_SLEEP: usize = 0x280;
    /// Non-zero asks the engine to stop (driver).
    pub const SHUTDOWN: usize = 0x300;
    /// Descriptors the engine refused, and impossible last pointers (engine).
    pub const ENGINE_ERRORS: usize = 0x380;
}

/// One of the two descriptor rings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The read ring (the device reads from the bus into its memory, or
    /// pulls from a peer).
    Read = 0,
    /// The write ring (the device writes its memory out: posted writes,
    /// pushes to a peer).
    Write = 1,
}

impl Direction {
    /// Both rings.
    pub const ALL: [Direction; 2] = [Direction::Read, Direction::Write];

    /// The register holding this ring's last pointer.
    pub const fn last_register(self) -> usize {
        match self {
            Direction::Read => reg::READ_LAST,
            Direction::Write => reg::WRITE_LAST,
        }
    }
}

/// How large a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceConfig {
    /// Name shown for the memfd (`/proc/PID/fd`).
    pub name: String,
    /// Bytes of device memory.
    pub memory_bytes: usize,
    /// Descriptors per ring: a power of two up to [`MAX_RING_DEPTH`].
    pub ring_depth: usize,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: "device".into(),
            memory_bytes: 64 << 20,
            ring_depth: DEFAULT_RING_DEPTH,
        }
    }
}

/// Why a device region is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// An operating-system error.
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The region's header or size is not a valid device.
    #[error("invalid device region: {0}")]
    Invalid(&'static str),
}

/// Offsets of a device's parts, derived from depth and memory size only.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLayout {
    /// Descriptors per ring.
    pub depth: usize,
    /// Offset of the read ring's descriptors (the write ring follows).
    pub rings: usize,
    /// Offset of the read ring's status words (the write ring's follow).
    pub completions: usize,
    /// Offset of device memory.
    pub memory: usize,
    /// Bytes of device memory.
    pub memory_bytes: usize,
    /// Bytes of the whole region.
    pub total: usize,
}

impl DeviceLayout {
    /// The layout of a device of `depth` descriptors per ring and
    /// `memory_bytes` of memory; `None` when the numbers are out of range.
    pub fn new(depth: usize, memory_bytes: usize) -> Option<DeviceLayout> {
        if !depth.is_power_of_two() || depth > MAX_RING_DEPTH || memory_bytes == 0 {
            return None;
        }
        let rings = BAR_BYTES;
        let completions = rings + 2 * depth * DESCRIPTOR_BYTES;
        let memory = (completions + 2 * depth * 8).next_multiple_of(4096);
        let total = memory.checked_add(memory_bytes)?;
        Some(DeviceLayout {
            depth,
            rings,
            completions,
            memory,
            memory_bytes,
            total,
        })
    }

    /// Offset of descriptor `slot` of ring `dir`.
    pub fn descriptor(&self, dir: Direction, slot: usize) -> usize {
        self.rings + ((dir as usize) * self.depth + (slot & (self.depth - 1))) * DESCRIPTOR_BYTES
    }

    /// Offset of the status word of `slot` of ring `dir`.
    pub fn status(&self, dir: Direction, slot: usize) -> usize {
        self.completions + ((dir as usize) * self.depth + (slot & (self.depth - 1))) * 8
    }
}

/// A device's shared region. Clones share the mapping.
#[derive(Clone, Debug)]
pub struct DeviceRegion {
    mem: Arc<SharedMemory>,
    layout: DeviceLayout,
}

impl DeviceRegion {
    /// Creates a device: zeroed rings and memory, header written.
    pub fn create(cfg: &DeviceConfig) -> Result<DeviceRegion, DeviceError> {
        let layout = DeviceLayout::new(cfg.ring_depth, cfg.memory_bytes).ok_or(
            DeviceError::Invalid("ring depth or memory size out of range"),
        )?;
        let mem = SharedMemory::create(&memfd_name(&cfg.name), layout.total)?;
        let put = |off: usize, v: u64| {
            if let Some(a) = mem.atomic_u64(off) {
                a.store(v, std::sync::atomic::Ordering::Relaxed);
            }
        };
        put(reg::MAGIC, MAGIC);
        put(reg::VERSION, VERSION);
        put(reg::RING_DEPTH, layout.depth as u64);
        put(reg::MEMORY_BYTES, layout.memory_bytes as u64);
        put(reg::MEMORY_OFFSET, layout.memory as u64);
        Ok(DeviceRegion {
            mem: Arc::new(mem),
            layout,
        })
    }

    /// Opens a device region received from another process, checking that
    /// its header describes exactly its size.
    pub fn open(fd: OwnedFd) -> Result<DeviceRegion, DeviceError> {
        let size = crate::sys::file_size(fd.as_fd())? as usize;
        if size < BAR_BYTES {
            return Err(DeviceError::Invalid("region smaller than a BAR"));
        }
        let mem = SharedMemory::open(fd, size)?;
        let get = |off: usize| {
            mem.atomic_u64(off)
                .map_or(0, |a| a.load(std::sync::atomic::Ordering::Acquire))
        };
        if get(reg::MAGIC) != MAGIC || get(reg::VERSION) != VERSION {
            return Err(DeviceError::Invalid("not a uniplane device"));
        }
        let depth = usize::try_from(get(reg::RING_DEPTH)).unwrap_or(0);
        let memory_bytes = usize::try_from(get(reg::MEMORY_BYTES)).unwrap_or(0);
        let layout = DeviceLayout::new(depth, memory_bytes).ok_or(DeviceError::Invalid(
            "ring depth or memory size out of range",
        ))?;
        if layout.total != size || get(reg::MEMORY_OFFSET) != layout.memory as u64 {
            return Err(DeviceError::Invalid(
                "header does not match the region size",
            ));
        }
        Ok(DeviceRegion {
            mem: Arc::new(mem),
            layout,
        })
    }

    /// Sends the regions `devices` over a connected Unix socket.
    pub fn send(sock: BorrowedFd<'_>, devices: &[&DeviceRegion]) -> io::Result<()> {
        let fds: Vec<BorrowedFd<'_>> = devices.iter().map(|d| d.mem.fd()).collect();
        send_with_fds(sock, &[devices.len() as u8], &fds).map(drop)
    }

    /// Receives regions sent with [`DeviceRegion::send`] (blocking socket).
    pub fn receive(sock: BorrowedFd<'_>) -> Result<Vec<DeviceRegion>, DeviceError> {
        let mut buf = [0u8; 1];
        let mut fds = Vec::new();
        let n = recv_with_fds(sock, &mut buf, &mut fds)?;
        if n != 1 || buf[0] as usize != fds.len() {
            return Err(DeviceError::Invalid("device hand-over message"));
        }
        fds.into_iter().map(DeviceRegion::open).collect()
    }

    /// The region's layout.
    pub fn layout(&self) -> &DeviceLayout {
        &self.layout
    }

    /// The shared mapping.
    pub fn memory(&self) -> &Arc<SharedMemory> {
        &self.mem
    }

    /// Offset of device memory in the mapping, and its length.
    pub fn memory_window(&self) -> (usize, usize) {
        (self.layout.memory, self.layout.memory_bytes)
    }

    /// Copies `src` into device memory at `addr` (what a CPU store through
    /// the BAR does); `false` when out of range.
    pub fn write_memory(&self, addr: usize, src: &[u8]) -> bool {
        addr.checked_add(src.len())
            .is_some_and(|end| end <= self.layout.memory_bytes)
            && self.mem.write(self.layout.memory + addr, src)
    }

    /// Copies device memory at `addr` into `dst`; `false` when out of range.
    pub fn read_memory(&self, addr: usize, dst: &mut [u8]) -> bool {
        addr.checked_add(dst.len())
            .is_some_and(|end| end <= self.layout.memory_bytes)
            && self.mem.read(self.layout.memory + addr, dst)
    }

    /// The 64-bit register at `offset` of the BAR.
    pub fn register(&self, offset: usize) -> &std::sync::atomic::AtomicU64 {
        debug_assert!(offset < BAR_BYTES);
        self.mem
            .atomic_u64(offset)
            .unwrap_or_else(|| unreachable!("BAR registers are inside every region"))
    }

    /// The 32-bit futex word at `offset` of the BAR.
    pub fn futex_word(&self, offset: usize) -> &std::sync::atomic::AtomicU32 {
        debug_assert!(offset < BAR_BYTES);
        self.mem
            .atomic_u32(offset)
            .unwrap_or_else(|| unreachable!("BAR registers are inside every region"))
    }

    /// The status word of `slot` of ring `dir`.
    pub fn status_word(&self, dir: Direction, slot: usize) -> &std::sync::atomic::AtomicU64 {
        self.mem
            .atomic_u64(self.layout.status(dir, slot))
            .unwrap_or_else(|| unreachable!("status words are inside the region"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> DeviceConfig {
        DeviceConfig {
            name: "t".into(),
            memory_bytes: 1 << 20,
            ring_depth: 16,
        }
    }

    #[test]
    fn a_region_opens_in_another_mapping_with_the_same_layout() {
        let d = DeviceRegion::create(&small()).unwrap();
        let fd = d.memory().fd().try_clone_to_owned().unwrap();
        let e = DeviceRegion::open(fd).unwrap();
        assert_eq!(d.layout(), e.layout());
        assert!(d.write_memory(100, b"abc"));
        let mut b = [0u8; 3];
        assert!(e.read_memory(100, &mut b));
        assert_eq!(&b, b"abc");
    }

    #[test]
    fn memory_access_outside_the_device_is_refused() {
        let d = DeviceRegion::create(&small()).unwrap();
        assert!(!d.write_memory((1 << 20) - 2, b"abc"));
        assert!(!d.write_memory(usize::MAX, b"a"));
    }

    #[test]
    fn a_region_whose_header_lies_is_refused() {
        let d = DeviceRegion::create(&small()).unwrap();
        d.register(reg::RING_DEPTH)
            .store(1 << 20, std::sync::atomic::Ordering::SeqCst);
        let fd = d.memory().fd().try_clone_to_owned().unwrap();
        assert!(matches!(
            DeviceRegion::open(fd),
            Err(DeviceError::Invalid(_))
        ));
    }

    #[test]
    fn regions_cross_a_unix_socket() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let d1 = DeviceRegion::create(&small()).unwrap();
        let d2 = DeviceRegion::create(&small()).unwrap();
        DeviceRegion::send(a.as_fd(), &[&d1, &d2]).unwrap();
        let got = DeviceRegion::receive(b.as_fd()).unwrap();
        assert_eq!(got.len(), 2);
        assert!(d2.write_memory(0, b"x"));
        let mut c = [0u8; 1];
        assert!(got[1].read_memory(0, &mut c));
        assert_eq!(&c, b"x");
    }
}
