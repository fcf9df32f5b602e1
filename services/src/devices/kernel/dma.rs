//! A kernel device's memory and the emulated DMA engine that carries the
//! host's one-sided writes and reads into and out of it.
//!
//! ```text
//!  bus window 0: host staging (8 × 64 KiB) ── a slot per transfer in flight, copied
//!                                             in (WRTE) or out (READ) by the host end
//!  bus window 2: host bounce (8 × 64 KiB)  ── the staged modes' middle stop
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
//! blocking: [`DmaPath::start`] copies the bytes into a staging slot and
//! [`DmaPath::poll`] posts, rings and collects completions, and reports
//! the transfers' ends in the order they started. Up to [`SLOTS`]
//! transfers are in flight at once, so the engine takes several per
//! wake-up.

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
/// Bytes of a staging slot (and of a bounce slot): one message.
const STAGING_BYTES: usize = (Message::MAX_PAYLOAD + 1).next_power_of_two();
/// Transfers in flight at once, each with a staging and a bounce slot.
pub const SLOTS: usize = 8;
/// Bytes per chunk in `staged-pipelined`.
pub const CHUNK_BYTES: usize = 16 << 10;
/// Most chunks a transfer has: each has a bounce slot of its own.
const MAX_CHUNKS: usize = STAGING_BYTES / CHUNK_BYTES;
/// Descriptors per ring: every chunk of every slot fits at once.
const RING_DEPTH: usize = SLOTS * MAX_CHUNKS * 2;
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
    /// Its staging and bounce slot.
    slot: usize,
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
        let base = (self.slot * STAGING_BYTES + at) as u64;
        let staging = bus_addr(STAGING_WINDOW, base);
        let bounce = bus_addr(BOUNCE_WINDOW, base);
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

    /// Whether every hop posted has completed.
    fn settled(&self) -> bool {
        self.first[..self.posted[0]].iter().all(|h| h.done)
            && self.second[..self.posted[1]].iter().all(|h| h.done)
    }

    /// Marks the hop posted with `id` done; whether it was this job's.
    fn complete(&mut self, id: u32) -> bool {
        let n = self.posted;
        let hop = self.first[..n[0]]
            .iter_mut()
            .chain(self.second[..n[1]].iter_mut())
            .find(|h| h.id == id && !h.done);
        match hop {
            Some(h) => {
                h.done = true;
                true
            }
            None => false,
        }
    }
}

/// How a transfer ended: its slot (for [`DmaPath::read_result`]) and
/// whether it failed.
pub type TransferEnd = (usize, Result<(), DmaFailure>);

/// A kernel device's memory behind its DMA engine, driven by the host end.
pub struct DmaPath {
    device: DeviceRegion,
    host: Arc<SharedMemory>,
    driver: DmaDriver,
    thresholds: DmaThresholds,
    timeout: Duration,
    /// Transfers in flight, in the order they started.
    jobs: std::collections::VecDeque<Job>,
    next_slot: usize,
    completions: Vec<Completion>,
    /// The engine's thread, stopped when the path is dropped.
    _engine: Option<EngineHandle>,
    /// The engine while a test holds it stopped.
    #[cfg(test)]
    paused: Option<DmaEngine>,
}

impl std::fmt::Debug for DmaPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaPath")
            .field("memory", &self.device.layout().memory_bytes)
            .field("jobs", &self.jobs.len())
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
        let slots = SLOTS * STAGING_BYTES;
        let host = SharedMemory::create(&memfd_name("kernel-staging"), 2 * slots)
            .map_err(|e| format!("kernel staging: {e}"))?;
        let host = Arc::new(host);
        let mut bus = Bus::new();
        bus.map(STAGING_WINDOW, host.clone(), 0, slots);
        bus.map(BOUNCE_WINDOW, host.clone(), slots, slots);
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
            jobs: std::collections::VecDeque::with_capacity(SLOTS),
            next_slot: 0,
            completions: Vec::with_capacity(2 * RING_DEPTH),
            _engine: Some(engine),
            #[cfg(test)]
            paused: None,
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
        !self.jobs.is_empty()
    }

    /// Whether another transfer can start now.
    pub fn can_start(&self) -> bool {
        self.jobs.len() < SLOTS
    }

    /// Starts writing `data` (1 to 64 KiB - 1 bytes) at `addr` (READ:
    /// `data` is `None` and `len` bytes are read): the mode it takes, or
    /// `None` when [`SLOTS`] transfers are in flight. The caller checked
    /// the range.
    pub fn start(&mut self, addr: u64, len: usize, data: Option<&[u8]>) -> Option<TransferMode> {
        if !self.can_start() || len == 0 || len > STAGING_BYTES {
            return None;
        }
        let mode = choose(&self.thresholds, len);
        let slot = self.next_slot;
        self.next_slot = (slot + 1) % SLOTS;
        if let Some(data) = data {
            self.host.write(slot * STAGING_BYTES, data);
        }
        let chunk = if mode == TransferMode::StagedPipelined {
            CHUNK_BYTES
        } else {
            STAGING_BYTES
        };
        self.jobs.push_back(Job {
            mode,
            slot,
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
        self.post();
        Some(mode)
    }

    /// Drives the transfers in flight: the end of the oldest once it
    /// ended (its slot is free again), else `None`.
    pub fn poll(&mut self) -> Option<TransferEnd> {
        self.collect();
        self.post();
        let job = self.jobs.front()?;
        let end = match job.failed {
            Some(status) if job.settled() => Err(DmaFailure::Status(status)),
            None if job.finished() => Ok(()),
            _ if Instant::now() > job.deadline => Err(DmaFailure::Timeout),
            _ => return None,
        };
        let slot = job.slot;
        self.jobs.pop_front();
        Some((slot, end))
    }

    /// Takes the completions the engine published into the jobs.
    fn collect(&mut self) {
        self.completions.clear();
        if self.driver.poll_completions(&mut self.completions) == 0 {
            return;
        }
        let now = Instant::now();
        for c in &self.completions {
            if let Some(job) = self
                .jobs
                .iter_mut()
                .find_map(|j| j.complete(c.id).then_some(j))
            {
                if c.status != DmaStatus::Ok {
                    job.failed.get_or_insert(c.status);
                }
                job.deadline = now + self.timeout;
            }
        }
    }

    /// Posts what can go: first hops as the rings take them, a chunk's
    /// second hop once its first landed in the bounce slot; then rings.
    fn post(&mut self) {
        let mut rang = [false; 2];
        for job in self.jobs.iter_mut().filter(|j| j.failed.is_none()) {
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
        }
        for ring in Direction::ALL {
            if rang[ring as usize] {
                self.driver.ring_doorbell(ring);
            }
        }
    }

    /// Stops the engine (a test holds transfers in flight).
    #[cfg(test)]
    pub fn pause(&mut self) {
        self.paused = self._engine.take().and_then(EngineHandle::stop);
    }

    /// Starts the engine stopped by [`DmaPath::pause`] again.
    #[cfg(test)]
    pub fn resume(&mut self) {
        if let Some(engine) = self.paused.take() {
            self.device
                .register(uniplane_shm::device::reg::SHUTDOWN)
                .store(0, std::sync::atomic::Ordering::SeqCst);
            self._engine = Some(engine.spawn());
        }
    }

    /// The `len` bytes a READ that just ended put in staging `slot`.
    pub fn read_result(&self, slot: usize, len: usize) -> Bytes {
        let mut out = BytesMut::with_capacity(len);
        self.host.read_into(slot * STAGING_BYTES, len, &mut out);
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
        finish_slot(path).1
    }

    /// Drives `path` until its oldest transfer ends (bounded).
    fn finish_slot(path: &mut DmaPath) -> TransferEnd {
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
                assert_eq!(path.start(addr, len, Some(&data)), Some(want));
                assert!(path.busy());
                finish(&mut path).unwrap_or_else(|e| panic!("{want} {len}: {e}"));
                let mut seen = vec![0u8; len];
                assert!(memory.read(addr, &mut seen));
                assert!(seen == data, "{want}: {len} bytes written differently");
                assert_eq!(path.start(addr, len, None), Some(want));
                let (slot, end) = finish_slot(&mut path);
                end.unwrap();
                assert!(
                    path.read_result(slot, len) == data,
                    "{want}: {len} bytes read back"
                );
            }
        }
    }

    #[test]
    fn transfers_in_flight_end_in_the_order_they_started_each_in_its_slot() {
        let t = thresholds(1000, 5000, 20_000);
        let mut path = DmaPath::new("t", 1 << 20, t, Duration::from_secs(5)).unwrap();
        path.pause();
        let sizes = [65_535usize, 4, 3000, 10_000, 30_000, 8, 65_535, 100];
        for (i, len) in sizes.into_iter().enumerate() {
            let data = vec![i as u8 + 1; len];
            assert!(path.start((i as u64) << 16, len, Some(&data)).is_some());
        }
        assert!(
            !path.can_start() && path.start(0, 4, None).is_none(),
            "slots full"
        );
        assert!(
            path.poll().is_none(),
            "nothing moves with the engine stopped"
        );
        path.resume();
        let mut ended = Vec::new();
        while ended.len() < SLOTS {
            let (slot, end) = finish_slot(&mut path);
            end.unwrap();
            ended.push(slot);
        }
        assert_eq!(ended, (0..SLOTS).collect::<Vec<_>>());
        let memory = path.memory();
        for (i, len) in sizes.into_iter().enumerate() {
            let mut seen = vec![0u8; len];
            assert!(memory.read((i as u64) << 16, &mut seen));
            assert!(seen.iter().all(|&b| b == i as u8 + 1), "transfer {i}");
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
