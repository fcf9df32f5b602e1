//! A kernel device's memory and the emulated DMA engine that carries the
//! host's one-sided writes and reads into and out of it.
//!
//! ```text
//!  bus window 0: host staging (64 KiB)   ── one transfer's bytes, copied
//!                                           in (WRTE) or out (READ) by the host end
//!  bus window 2: host bounce (64 KiB)    ── the staged modes' middle stop
//!  bus window 1: kernel memory (`memory`) ── a `DeviceRegion`'s memory, which
//!                                           the kernel thread reads
//!
//!  push:              staging ──write ring──▶ kernel      (posted writes)
//!  pull:              staging ──read ring───▶ kernel      (the device reads)
//!  staged:            staging ──write ring──▶ bounce ──read ring──▶ kernel
//!  staged-pipelined:  the same in 16 KiB chunks, chunk i+1's first hop
//!                     beside chunk i's second
//!  (a READ runs the same hops from the kernel's memory to the staging)
//! ```
//!
//! The modes are those of [`uniplane_shm::p2p`], with the host's staging
//! buffer in the role of device A; which one a transfer takes depends on
//! its size ([`choose`], thresholds [`DmaThresholds`]). One DMA engine
//! (a thread of `uniplane-shm`, sleeping on its doorbell when idle)
//! performs the descriptors of both rings; the host end drives it without
//! blocking: [`DmaPath::start`] copies the bytes into the staging and
//! [`DmaPath::poll`] posts, rings and collects completions until the
//! transfer is done. One transfer at a time: the staging holds one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::Message;
use uniplane_kernel::DeviceMemory;
use uniplane_shm::device::{DeviceConfig, DeviceRegion, Direction};
use uniplane_shm::dma::{
    bus_addr, Bus, Completion, Descriptor, DmaDriver, DmaEngine, DmaLimits, DmaStatus, EngineHandle,
};
use uniplane_shm::p2p::TransferMode;
use uniplane_shm::sys::{memfd_name, SharedMemory};

use crate::config::DmaThresholds;

/// Bus window of the host's staging buffer.
const STAGING_WINDOW: u16 = 0;
/// Bus window of the kernel's memory.
const KERNEL_WINDOW: u16 = 1;
/// Bus window of the host's bounce buffer.
const BOUNCE_WINDOW: u16 = 2;
/// Bytes of the staging buffer (and of the bounce buffer): one message.
const STAGING_BYTES: usize = (Message::MAX_PAYLOAD + 1).next_power_of_two();
/// Bytes per chunk in `staged-pipelined`.
pub const CHUNK_BYTES: usize = 16 << 10;
/// Most chunks a transfer has: each has a bounce slot of its own.
const MAX_CHUNKS: usize = STAGING_BYTES / CHUNK_BYTES;
/// Descriptors per ring: a transfer's chunks fit at once.
const RING_DEPTH: usize = 16;
/// The engine moves any byte range (the emulated kernel's memory is
/// byte-addressed): one word per byte, no alignment.
const LIMITS: DmaLimits = DmaLimits {
    word_bytes: 1,
    align: 1,
    max_bytes: 1 << 20,
};

/// The mode a transfer of `len` bytes takes under `t`.
pub fn choose(t: &DmaThresholds, len: usize) -> TransferMode {
    if len >= t.pipelined_from {
        TransferMode::StagedPipelined
    } else if len >= t.staged_from {
        TransferMode::Staged
    } else if len >= t.pull_from {
        TransferMode::Pull
    } else {
        TransferMode::Push
    }
}

/// The index of `mode` in per-mode counters ([`TransferMode::ALL`]'s order).
pub fn mode_index(mode: TransferMode) -> usize {
    match mode {
        TransferMode::Staged => 0,
        TransferMode::StagedPipelined => 1,
        TransferMode::Push => 2,
        TransferMode::Pull => 3,
    }
}

/// The kernel's memory as the kernel thread reads it.
#[derive(Clone, Debug, Default)]
pub struct KernelMemory(Option<DeviceRegion>);

impl DeviceMemory for KernelMemory {
    fn size(&self) -> u64 {
        self.0
            .as_ref()
            .map_or(0, |d| d.layout().memory_bytes as u64)
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        match (&self.0, usize::try_from(addr)) {
            (Some(d), Ok(addr)) => d.read_memory(addr, buf),
            _ => buf.is_empty(),
        }
    }
}

/// Why a transfer failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DmaFailure {
    /// A descriptor completed with an error status.
    Status(DmaStatus),
    /// The engine completed nothing for the stall timeout.
    Timeout,
}

impl std::fmt::Display for DmaFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DmaFailure::Status(s) => write!(f, "a DMA descriptor failed: {s:?}"),
            DmaFailure::Timeout => f.write_str("the DMA engine completed nothing in time"),
        }
    }
}

/// One hop of one chunk: the id it was posted with and whether it is done.
#[derive(Clone, Copy, Debug, Default)]
struct Hop {
    id: u32,
    done: bool,
}

/// The transfer in flight.
#[derive(Debug)]
struct Job {
    mode: TransferMode,
    /// Host to kernel (WRTE) or kernel to host (READ).
    write: bool,
    addr: u64,
    len: usize,
    chunk: usize,
    chunks: usize,
    first: [Hop; MAX_CHUNKS],
    second: [Hop; MAX_CHUNKS],
    posted: [usize; 2],
    failed: Option<DmaStatus>,
    deadline: Instant,
}

impl Job {
    fn two_hops(&self) -> bool {
        matches!(
            self.mode,
            TransferMode::Staged | TransferMode::StagedPipelined
        )
    }

    /// The descriptor of `chunk`'s hop (`second`: the bounce → target one).
    fn descriptor(&self, chunk: usize, second: bool) -> Descriptor {
        let at = chunk * self.chunk;
        let n = (self.len - at).min(self.chunk);
        let kernel = bus_addr(KERNEL_WINDOW, self.addr + at as u64);
        let staging = bus_addr(STAGING_WINDOW, at as u64);
        let bounce = bus_addr(BOUNCE_WINDOW, at as u64);
        let (from, to) = if self.write {
            (staging, kernel)
        } else {
            (kernel, staging)
        };
        let (src, dst) = match (self.two_hops(), second) {
            (false, _) => (from, to),
            (true, false) => (from, bounce),
            (true, true) => (bounce, to),
        };
        Descriptor {
            src,
            dst,
            len_words: n as u32,
            ..Descriptor::default()
        }
    }

    /// The ring of a hop: posted writes out of the source, reads into the
    /// destination.
    fn ring(&self, second: bool) -> Direction {
        match (self.mode, second) {
            (TransferMode::Pull, _) | (_, true) => Direction::Read,
            _ => Direction::Write,
        }
    }

    fn finished(&self) -> bool {
        let last = if self.two_hops() {
            &self.second
        } else {
            &self.first
        };
        self.posted[usize::from(self.two_hops())] == self.chunks
            && last[..self.chunks].iter().all(|h| h.done)
    }
}

/// A kernel device's memory behind its DMA engine, driven by the host end.
pub struct DmaPath {
    device: DeviceRegion,
    host: Arc<SharedMemory>,
    driver: DmaDriver,
    thresholds: DmaThresholds,
    timeout: Duration,
    job: Option<Job>,
    completions: Vec<Completion>,
    _engine: EngineHandle,
}

impl std::fmt::Debug for DmaPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaPath")
            .field("memory", &self.device.layout().memory_bytes)
            .field("job", &self.job)
            .finish_non_exhaustive()
    }
}

impl DmaPath {
    /// `memory` bytes of kernel memory (above 0), the host's buffers and a
    /// running engine; a transfer that completes nothing for `timeout`
    /// fails.
    pub fn new(
        name: &str,
        memory: usize,
        thresholds: DmaThresholds,
        timeout: Duration,
    ) -> Result<DmaPath, String> {
        let device = DeviceRegion::create(&DeviceConfig {
            name: format!("kernel-{name}"),
            memory_bytes: memory,
            ring_depth: RING_DEPTH,
        })
        .map_err(|e| format!("kernel memory: {e}"))?;
        let host = SharedMemory::create(&memfd_name("kernel-staging"), 2 * STAGING_BYTES)
            .map_err(|e| format!("kernel staging: {e}"))?;
        let host = Arc::new(host);
        let mut bus = Bus::new();
        bus.map(STAGING_WINDOW, host.clone(), 0, STAGING_BYTES);
        bus.map(BOUNCE_WINDOW, host.clone(), STAGING_BYTES, STAGING_BYTES);
        bus.map_device(KERNEL_WINDOW, &device);
        let engine = DmaEngine::new(device.clone(), bus)
            .with_limits(LIMITS)
            .spawn();
        Ok(DmaPath {
            driver: DmaDriver::new(device.clone()).with_limits(LIMITS),
            device,
            host,
            thresholds,
            timeout,
            job: None,
            completions: Vec::with_capacity(2 * RING_DEPTH),
            _engine: engine,
        })
    }

    /// The memory's size in bytes.
    pub fn size(&self) -> u64 {
        self.device.layout().memory_bytes as u64
    }

    /// The kernel thread's view of the memory.
    pub fn memory(&self) -> KernelMemory {
        KernelMemory(Some(self.device.clone()))
    }

    /// Whether a transfer is in flight.
    pub fn busy(&self) -> bool {
        self.job.is_some()
    }

    /// Starts writing `data` (1 to 64 KiB - 1 bytes) at `addr` (READ:
    /// `data` is `None` and `len` bytes are read): the mode it takes.
    /// The caller checked the range; one transfer at a time.
    pub fn start(&mut self, addr: u64, len: usize, data: Option<&[u8]>) -> TransferMode {
        debug_assert!(self.job.is_none() && len > 0 && len <= STAGING_BYTES);
        let mode = choose(&self.thresholds, len);
        if let Some(data) = data {
            self.host.write(0, data);
        }
        let chunk = if mode == TransferMode::StagedPipelined {
            CHUNK_BYTES
        } else {
            STAGING_BYTES
        };
        self.job = Some(Job {
            mode,
            write: data.is_some(),
            addr,
            len,
            chunk,
            chunks: len.div_ceil(chunk),
            first: [Hop::default(); MAX_CHUNKS],
            second: [Hop::default(); MAX_CHUNKS],
            posted: [0; 2],
            failed: None,
            deadline: Instant::now() + self.timeout,
        });
        self.poll();
        mode
    }

    /// Drives the transfer in flight: `None` while it goes on, then its
    /// end (once; the path is free again).
    pub fn poll(&mut self) -> Option<Result<(), DmaFailure>> {
        let job = self.job.as_mut()?;
        // Completions first: they free second hops to post.
        self.completions.clear();
        if self.driver.poll_completions(&mut self.completions) > 0 {
            for c in &self.completions {
                let n = job.posted;
                let hop = job.first[..n[0]]
                    .iter_mut()
                    .chain(job.second[..n[1]].iter_mut())
                    .find(|h| h.id == c.id && !h.done);
                if let Some(h) = hop {
                    h.done = true;
                }
                if c.status != DmaStatus::Ok {
                    job.failed.get_or_insert(c.status);
                }
                job.deadline = Instant::now() + self.timeout;
            }
        }
        if let Some(status) = job.failed {
            if self.driver.outstanding() == 0 {
                self.job = None;
                return Some(Err(DmaFailure::Status(status)));
            }
        } else if job.finished() {
            self.job = None;
            return Some(Ok(()));
        } else {
            // First hops as the ring takes them; a chunk's second hop once
            // its first landed in the bounce buffer.
            let mut rang = [false; 2];
            for second in [false, true] {
                let s = usize::from(second);
                if second && !job.two_hops() {
                    break;
                }
                while job.posted[s] < job.chunks && (!second || job.first[job.posted[1]].done) {
                    let i = job.posted[s];
                    let ring = job.ring(second);
                    let Some(id) = self.driver.try_post(ring, job.descriptor(i, second)) else {
                        break;
                    };
                    let hops = if second {
                        &mut job.second
                    } else {
                        &mut job.first
                    };
                    hops[i] = Hop { id, done: false };
                    job.posted[s] += 1;
                    rang[ring as usize] = true;
                }
            }
            for ring in Direction::ALL {
                if rang[ring as usize] {
                    self.driver.ring_doorbell(ring);
                }
            }
        }
        if Instant::now() > job.deadline {
            self.job = None;
            return Some(Err(DmaFailure::Timeout));
        }
        None
    }

    /// The `len` bytes a READ just finished put in the staging buffer.
    pub fn read_result(&self, len: usize) -> Bytes {
        let mut out = BytesMut::with_capacity(len);
        self.host.read_into(0, len, &mut out);
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds(pull: usize, staged: usize, pipelined: usize) -> DmaThresholds {
        DmaThresholds {
            pull_from: pull,
            staged_from: staged,
            pipelined_from: pipelined,
        }
    }

    #[test]
    fn the_mode_is_chosen_by_size_the_largest_threshold_reached_winning() {
        let t = thresholds(256, 4096, 32 << 10);
        assert_eq!(choose(&t, 1), TransferMode::Push);
        assert_eq!(choose(&t, 255), TransferMode::Push);
        assert_eq!(choose(&t, 256), TransferMode::Pull);
        assert_eq!(choose(&t, 4095), TransferMode::Pull);
        assert_eq!(choose(&t, 4096), TransferMode::Staged);
        assert_eq!(choose(&t, 32 << 10), TransferMode::StagedPipelined);
        assert_eq!(choose(&t, 65_535), TransferMode::StagedPipelined);
        // Thresholds out of order: a larger one wins, a skipped mode is
        // never taken.
        let t = thresholds(8192, 1024, 65_536);
        assert_eq!(choose(&t, 2048), TransferMode::Staged);
        assert_eq!(choose(&t, 10_000), TransferMode::Staged);
        // The defaults: push at every size a message carries.
        let d = DmaThresholds::default();
        for len in [1, 4096, 65_535] {
            assert_eq!(choose(&d, len), TransferMode::Push);
        }
    }

    /// Drives `path` until its transfer ends (bounded).
    fn finish(path: &mut DmaPath) -> Result<(), DmaFailure> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(end) = path.poll() {
                return end;
            }
            assert!(Instant::now() < deadline, "the transfer never ended");
            std::thread::yield_now();
        }
    }

    #[test]
    fn every_mode_writes_and_reads_back_byte_exact_at_any_address() {
        let sizes = [1usize, 4, 100, 4096, 16_385, 65_535];
        let modes = [
            (thresholds(1 << 16, 1 << 16, 1 << 16), TransferMode::Push),
            (thresholds(0, 1 << 16, 1 << 16), TransferMode::Pull),
            (thresholds(0, 0, 1 << 16), TransferMode::Staged),
            (thresholds(0, 0, 0), TransferMode::StagedPipelined),
        ];
        for (k, (t, want)) in modes.into_iter().enumerate() {
            let mut path = DmaPath::new("t", 1 << 20, t, Duration::from_secs(5)).unwrap();
            let memory = path.memory();
            for (i, len) in sizes.into_iter().enumerate() {
                let addr = (i * 70_001 + k * 3) as u64;
                let data: Vec<u8> = (0..len).map(|b| (b * 13 + i + k) as u8).collect();
                assert_eq!(path.start(addr, len, Some(&data)), want);
                assert!(path.busy());
                finish(&mut path).unwrap_or_else(|e| panic!("{want} {len}: {e}"));
                let mut seen = vec![0u8; len];
                assert!(memory.read(addr, &mut seen));
                assert!(seen == data, "{want}: {len} bytes written differently");
                assert_eq!(path.start(addr, len, None), want);
                finish(&mut path).unwrap();
                assert!(
                    path.read_result(len) == data,
                    "{want}: {len} bytes read back"
                );
            }
        }
    }

    #[test]
    fn a_descriptor_off_the_memory_fails_the_transfer_with_its_status() {
        let t = thresholds(0, 0, 0);
        let mut path = DmaPath::new("t", 64 << 10, t, Duration::from_secs(5)).unwrap();
        // Unchecked by the caller: the last chunk runs off the end.
        path.start(30 << 10, 40 << 10, Some(&[7; 40 << 10]));
        assert_eq!(
            finish(&mut path),
            Err(DmaFailure::Status(DmaStatus::OutOfRange))
        );
        assert!(!path.busy(), "the path is free again");
    }
}
