//! A DMA engine modelled on the Avalon-MM DMA used for FPGA–GPU transfers:
//! separate read and write descriptor rings, a last-pointer doorbell per
//! ring, a status word with a done bit per descriptor, completions in any
//! order, and a link model that makes the emulated transfer take the time
//! a PCIe link would.
//!
//! ```text
//!   driver (any process)                       engine (thread playing the device)
//!   ─────────────────────                      ──────────────────────────────────
//!   write descriptor into slot (last % depth)
//!   store last pointer (Release) ──doorbell──▶ load last (Acquire), read descriptors,
//!   wake the engine if it sleeps               check them, copy on the bus, wait for
//!                                              the link model, store status (Release),
//!   scan status words (Acquire) ◀──────────── count completions, wake the driver if it
//!   reclaim the done prefix                    sleeps; optional notify word at the target
//! ```
//!
//! Descriptors are 64 bytes: source and destination bus addresses, a
//! notify address, the length in 4-byte words, an id and control bits.
//! Every field is checked by the engine (length, alignment, both ranges on
//! the bus); a bad descriptor completes with an error status and touches
//! nothing. A bus address is a window number (bits 40..) and an offset:
//! [`Bus`] maps windows to shared regions — host memory, device memories.

use std::sync::atomic::{fence, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::device::{reg, DeviceRegion, Direction, DESCRIPTOR_BYTES};
use crate::sys::{futex_wait, futex_wake, SharedMemory};

/// Bits of a bus address that are the offset inside a window.
pub const WINDOW_SHIFT: u32 = 40;
/// Most windows on a bus.
pub const MAX_WINDOWS: usize = 64;

/// Descriptor control bit: after the copy, store the id (u64, Release) at
/// the notify address, so a receiver polling its memory sees the data.
pub const CTRL_NOTIFY: u32 = 1;

const DONE: u64 = 1 << 63;

/// The bus address of `offset` in window `window`.
pub const fn bus_addr(window: u16, offset: u64) -> u64 {
    ((window as u64) << WINDOW_SHIFT) | (offset & ((1 << WINDOW_SHIFT) - 1))
}

/// What a descriptor may ask for; the engine enforces it, the driver
/// splits transfers to fit it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmaLimits {
    /// Lengths are counted in words of this many bytes.
    pub word_bytes: usize,
    /// Source and destination addresses are multiples of this.
    pub align: usize,
    /// Most bytes one descriptor moves.
    pub max_bytes: usize,
}

impl Default for DmaLimits {
    /// The Avalon-MM DMA's rules: 4-byte words, 4 KiB-aligned starts, 1 MiB
    /// per descriptor.
    fn default() -> Self {
        DmaLimits {
            word_bytes: 4,
            align: 4096,
            max_bytes: 1 << 20,
        }
    }
}

/// One descriptor as the driver writes it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Descriptor {
    /// Bus address read from.
    pub src: u64,
    /// Bus address written to.
    pub dst: u64,
    /// Bus address of the notify word (with [`CTRL_NOTIFY`]).
    pub notify: u64,
    /// Length in words.
    pub len_words: u32,
    /// The driver's id, echoed in the status word.
    pub id: u32,
    /// Control bits.
    pub ctrl: u32,
}

impl Descriptor {
    /// The 64 bytes of the descriptor.
    pub fn encode(&self) -> [u8; DESCRIPTOR_BYTES] {
        let mut b = [0u8; DESCRIPTOR_BYTES];
        b[0..8].copy_from_slice(&self.src.to_le_bytes());
        b[8..16].copy_from_slice(&self.dst.to_le_bytes());
        b[16..24].copy_from_slice(&self.notify.to_le_bytes());
        b[24..28].copy_from_slice(&self.len_words.to_le_bytes());
        b[28..32].copy_from_slice(&self.id.to_le_bytes());
        b[32..36].copy_from_slice(&self.ctrl.to_le_bytes());
        b
    }

    /// Reads a descriptor from its 64 bytes (any bytes decode; the engine
    /// checks the fields).
    pub fn decode(b: &[u8; DESCRIPTOR_BYTES]) -> Descriptor {
        let u64_at = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(w)
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Descriptor {
            src: u64_at(0),
            dst: u64_at(8),
            notify: u64_at(16),
            len_words: u32_at(24),
            id: u32_at(28),
            ctrl: u32_at(32),
        }
    }
}

/// How a descriptor completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DmaStatus {
    /// Copied.
    Ok,
    /// Zero length or more than the limit.
    BadLength,
    /// A start address is not aligned as the engine requires.
    Misaligned,
    /// A range (or the notify word) is not on the bus.
    OutOfRange,
    /// Unknown control bits.
    BadControl,
    /// The status word does not match the descriptor posted in its slot.
    Corrupt,
}

impl DmaStatus {
    const fn code(self) -> u64 {
        match self {
            DmaStatus::Ok => 0,
            DmaStatus::BadLength => 1,
            DmaStatus::Misaligned => 2,
            DmaStatus::OutOfRange => 3,
            DmaStatus::BadControl => 4,
            DmaStatus::Corrupt => 5,
        }
    }

    const fn from_code(c: u64) -> DmaStatus {
        match c {
            0 => DmaStatus::Ok,
            1 => DmaStatus::BadLength,
            2 => DmaStatus::Misaligned,
            3 => DmaStatus::OutOfRange,
            4 => DmaStatus::BadControl,
            _ => DmaStatus::Corrupt,
        }
    }
}

/// A finished descriptor, as the driver reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The ring it was posted on.
    pub dir: Direction,
    /// The id the driver gave it.
    pub id: u32,
    /// How it ended.
    pub status: DmaStatus,
}

/// Why a transfer failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// Addresses or length break the engine's rules; nothing was posted.
    #[error("transfer breaks the DMA limits (alignment {align}, word {word_bytes})")]
    Unaligned {
        /// Required start alignment.
        align: usize,
        /// Required length granularity.
        word_bytes: usize,
    },
    /// A descriptor completed with an error.
    #[error("descriptor {id} failed: {status:?}")]
    Failed {
        /// The descriptor's id.
        id: u32,
        /// Its status.
        status: DmaStatus,
    },
    /// Completions did not come in time (is an engine running?).
    #[error("DMA timed out")]
    Timeout,
}

/// Where a PCIe transfer goes between two devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PciePath {
    /// One link, nothing in between.
    Direct,
    /// Through a PCIe switch: peer-to-peer stays below the root.
    Switch,
    /// Up through the root complex and down again.
    RootComplex,
}

/// Time a transfer takes on the emulated link: `latency + bytes ÷
/// bandwidth`. The presets' bandwidths are the usable ones reported for
/// those links; the latencies are typical figures, not measurements.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkModel {
    /// Fixed cost per descriptor.
    pub latency: Duration,
    /// Bytes per second once streaming.
    pub bytes_per_sec: f64,
}

impl LinkModel {
    /// PCIe Gen2 x4 as measured for the Avalon-MM DMA: 1855 MB/s.
    pub fn pcie_gen2_x4() -> LinkModel {
        LinkModel {
            latency: Duration::from_nanos(1000),
            bytes_per_sec: 1855e6,
        }
    }

    /// PCIe Gen3 x8: about 6.6 GB/s usable.
    pub fn pcie_gen3_x8() -> LinkModel {
        LinkModel {
            latency: Duration::from_nanos(800),
            bytes_per_sec: 6.6e9,
        }
    }

    /// The same link reached through `path`: a switch adds about 150 ns, the
    /// root complex about 600 ns and, for peer-to-peer, caps the bandwidth
    /// at 80 % (root complexes forward peer traffic less well).
    pub fn through(self, path: PciePath) -> LinkModel {
        match path {
            PciePath::Direct => self,
            PciePath::Switch => LinkModel {
                latency: self.latency + Duration::from_nanos(150),
                ..self
            },
            PciePath::RootComplex => LinkModel {
                latency: self.latency + Duration::from_nanos(600),
                bytes_per_sec: self.bytes_per_sec * 0.8,
            },
        }
    }

    /// Time to move `bytes`.
    pub fn time(&self, bytes: usize) -> Duration {
        self.latency + Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec)
    }
}

/// Maps bus windows to shared regions.
#[derive(Clone, Default)]
pub struct Bus {
    windows: Vec<Option<Window>>,
}

#[derive(Clone)]
struct Window {
    mem: Arc<SharedMemory>,
    offset: usize,
    len: usize,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mapped: Vec<(usize, usize)> = self
            .windows
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.as_ref().map(|w| (i, w.len)))
            .collect();
        f.debug_struct("Bus").field("windows", &mapped).finish()
    }
}

impl Bus {
    /// An empty bus.
    pub fn new() -> Bus {
        Bus::default()
    }

    /// Maps `len` bytes at `offset` of `mem` as window `window`.
    /// Out-of-range requests are ignored (and the window stays unmapped).
    pub fn map(&mut self, window: u16, mem: Arc<SharedMemory>, offset: usize, len: usize) {
        let w = window as usize;
        if w >= MAX_WINDOWS || !mem.contains(offset, len) {
            return;
        }
        if self.windows.len() <= w {
            self.windows.resize(w + 1, None);
        }
        self.windows[w] = Some(Window { mem, offset, len });
    }

    /// Maps a device's memory as window `window`.
    pub fn map_device(&mut self, window: u16, dev: &DeviceRegion) {
        let (offset, len) = dev.memory_window();
        self.map(window, dev.memory().clone(), offset, len);
    }

    /// The mapping and offset of `[addr, addr + len)`, when the whole range
    /// lies in one window.
    pub fn resolve(&self, addr: u64, len: usize) -> Option<(&SharedMemory, usize)> {
        let w = self
            .windows
            .get((addr >> WINDOW_SHIFT) as usize)?
            .as_ref()?;
        let off = usize::try_from(addr & ((1 << WINDOW_SHIFT) - 1)).ok()?;
        if off.checked_add(len)? > w.len {
            return None;
        }
        Some((&w.mem, w.offset + off))
    }
}

/// Counters of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Descriptors completed (with any status).
    pub completed: u64,
    /// Descriptors refused with an error status.
    pub refused: u64,
    /// Bytes copied.
    pub bytes: u64,
    /// Times the engine slept on its doorbell.
    pub sleeps: u64,
}

/// A resolved bus range: the mapping and the offset in it.
type BusRange<'a> = (&'a SharedMemory, usize);

struct Pending {
    due: Instant,
    dir: Direction,
    slot: usize,
    status: u64,
    notify: Option<u64>,
}

/// The device side: takes descriptors off both rings and performs them.
pub struct DmaEngine {
    dev: DeviceRegion,
    bus: Bus,
    limits: DmaLimits,
    model: Option<LinkModel>,
    consumed: [u64; 2],
    busy_until: [Instant; 2],
    pending: Vec<Pending>,
    spin: Duration,
    cpu: Option<usize>,
    reorder: bool,
    /// Scratch for `reorder`: (length, slot) of the descriptors taken.
    order: Vec<(u32, usize)>,
    stats: EngineStats,
}

impl std::fmt::Debug for DmaEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaEngine")
            .field("bus", &self.bus)
            .field("limits", &self.limits)
            .field("model", &self.model)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl DmaEngine {
    /// An engine for `dev` that copies on `bus`, as fast as memory allows.
    pub fn new(dev: DeviceRegion, bus: Bus) -> DmaEngine {
        let now = Instant::now();
        DmaEngine {
            dev,
            bus,
            limits: DmaLimits::default(),
            model: None,
            consumed: [0; 2],
            busy_until: [now; 2],
            pending: Vec::with_capacity(64),
            spin: Duration::from_micros(50),
            cpu: None,
            reorder: false,
            order: Vec::new(),
            stats: EngineStats::default(),
        }
    }

    /// Performs the descriptors posted on a ring shortest first instead of
    /// in order, as a device with several channels per ring would finish
    /// them: completions then come out of order within a ring too.
    pub fn with_reorder(mut self, reorder: bool) -> DmaEngine {
        self.reorder = reorder;
        self.order = Vec::with_capacity(self.dev.layout().depth);
        self
    }

    /// Pins the engine's thread to `cpu` when spawned (a device has its
    /// own silicon; on a shared machine pinning keeps the emulation from
    /// queueing behind the driver).
    pub fn with_cpu(mut self, cpu: Option<usize>) -> DmaEngine {
        self.cpu = cpu;
        self
    }

    /// Completes each descriptor no earlier than the link would have.
    pub fn with_model(mut self, model: LinkModel) -> DmaEngine {
        self.model = Some(model);
        self
    }

    /// Enforces `limits` instead of the defaults.
    pub fn with_limits(mut self, limits: DmaLimits) -> DmaEngine {
        self.limits = limits;
        self
    }

    /// How long the engine polls an idle ring before it sleeps.
    pub fn with_spin(mut self, spin: Duration) -> DmaEngine {
        self.spin = spin;
        self
    }

    /// Counters so far.
    pub fn stats(&self) -> EngineStats {
        self.stats
    }

    fn check(&self, d: &Descriptor) -> Result<(usize, BusRange<'_>, BusRange<'_>), DmaStatus> {
        if d.ctrl & !CTRL_NOTIFY != 0 {
            return Err(DmaStatus::BadControl);
        }
        let len = (d.len_words as usize).saturating_mul(self.limits.word_bytes);
        if len == 0 || len > self.limits.max_bytes {
            return Err(DmaStatus::BadLength);
        }
        let align = self.limits.align as u64;
        if !d.src.is_multiple_of(align) || !d.dst.is_multiple_of(align) {
            return Err(DmaStatus::Misaligned);
        }
        let src = self.bus.resolve(d.src, len).ok_or(DmaStatus::OutOfRange)?;
        let dst = self.bus.resolve(d.dst, len).ok_or(DmaStatus::OutOfRange)?;
        if d.ctrl & CTRL_NOTIFY != 0 {
            let (m, off) = self.bus.resolve(d.notify, 8).ok_or(DmaStatus::OutOfRange)?;
            m.atomic_u64(off).ok_or(DmaStatus::OutOfRange)?;
        }
        Ok((len, src, dst))
    }

    /// Takes up to `budget` posted descriptors of each ring (alternating),
    /// performs them and publishes completions that are due. Returns
    /// whether anything happened. This is the engine's whole behaviour;
    /// [`DmaEngine::run`] calls it in a loop.
    pub fn step(&mut self, budget: usize) -> bool {
        let mut worked = false;
        let depth = self.dev.layout().depth as u64;
        let mut last = [0u64; 2];
        for dir in Direction::ALL {
            let l = self
                .dev
                .register(dir.last_register())
                .load(Ordering::Acquire);
            let c = self.consumed[dir as usize];
            if l < c || l - c > depth {
                // The driver wrote an impossible last pointer: refuse the ring.
                self.dev
                    .register(reg::ENGINE_ERRORS)
                    .fetch_add(1, Ordering::Relaxed);
                last[dir as usize] = c;
            } else {
                last[dir as usize] = l;
            }
        }
        if self.reorder {
            // Shortest first within what each ring has posted: a small
            // descriptor behind a large one completes before it.
            for dir in Direction::ALL {
                let i = dir as usize;
                let n = (last[i] - self.consumed[i]).min(budget as u64);
                self.order.clear();
                for pos in self.consumed[i]..self.consumed[i] + n {
                    let slot = pos as usize;
                    let mut w = [0u8; 4];
                    self.dev
                        .memory()
                        .read(self.dev.layout().descriptor(dir, slot) + 24, &mut w);
                    self.order.push((u32::from_le_bytes(w), slot));
                }
                self.order.sort_unstable();
                for k in 0..self.order.len() {
                    let slot = self.order[k].1;
                    self.perform(dir, slot);
                }
                self.consumed[i] += n;
                worked |= n > 0;
            }
            return worked | self.publish_due(Instant::now());
        }
        for _ in 0..budget {
            let mut any = false;
            for dir in Direction::ALL {
                let i = dir as usize;
                if self.consumed[i] < last[i] {
                    self.perform(dir, self.consumed[i] as usize);
                    self.consumed[i] += 1;
                    any = true;
                }
            }
            if !any {
                break;
            }
            worked = true;
        }
        worked | self.publish_due(Instant::now())
    }

    fn perform(&mut self, dir: Direction, slot: usize) {
        let mut raw = [0u8; DESCRIPTOR_BYTES];
        self.dev
            .memory()
            .read(self.dev.layout().descriptor(dir, slot), &mut raw);
        let d = Descriptor::decode(&raw);
        let (status, bytes) = match self.check(&d) {
            Ok((len, (sm, so), (dm, doff))) => {
                dm.copy_from(doff, sm, so, len);
                (DmaStatus::Ok, len)
            }
            Err(s) => (s, 0),
        };
        if status != DmaStatus::Ok {
            self.stats.refused += 1;
        }
        self.stats.bytes += bytes as u64;
        let now = Instant::now();
        let due = match self.model {
            Some(m) => {
                let start = now.max(self.busy_until[dir as usize]);
                let end = start + m.time(bytes);
                self.busy_until[dir as usize] = end;
                end
            }
            None => now,
        };
        self.pending.push(Pending {
            due,
            dir,
            slot,
            status: DONE | (status.code() << 32) | d.id as u64,
            notify: (status == DmaStatus::Ok && d.ctrl & CTRL_NOTIFY != 0).then_some(d.notify),
        });
    }

    fn publish_due(&mut self, now: Instant) -> bool {
        let mut published = 0u32;
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].due > now {
                i += 1;
                continue;
            }
            let p = self.pending.swap_remove(i);
            if let Some(addr) = p.notify {
                if let Some(word) = self
                    .bus
                    .resolve(addr, 8)
                    .and_then(|(m, off)| m.atomic_u64(off))
                {
                    word.store(p.status & 0xffff_ffff, Ordering::Release);
                }
            }
            self.dev
                .status_word(p.dir, p.slot)
                .store(p.status, Ordering::Release);
            published += 1;
        }
        if published == 0 {
            return false;
        }
        self.stats.completed += published as u64;
        let count = self.dev.futex_word(reg::COMPLETIONS);
        count.fetch_add(published, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let sleeping = self.dev.futex_word(reg::DRIVER_SLEEP);
        if sleeping.load(Ordering::SeqCst) != 0 && sleeping.swap(0, Ordering::SeqCst) != 0 {
            futex_wake(count, i32::MAX);
        }
        true
    }

    fn next_due(&self) -> Option<Instant> {
        self.pending.iter().map(|p| p.due).min()
    }

    fn shutdown_requested(&self) -> bool {
        self.dev.register(reg::SHUTDOWN).load(Ordering::Acquire) != 0
    }

    /// Runs until the driver writes the shutdown register: polls the rings,
    /// spins while idle for the spin time, then sleeps on the doorbell
    /// futex (or until the next modelled completion is due).
    pub fn run(&mut self) {
        let mut idle_since = Instant::now();
        loop {
            if self.step(32) {
                idle_since = Instant::now();
                continue;
            }
            if self.shutdown_requested() {
                return;
            }
            let now = Instant::now();
            if let Some(due) = self.next_due() {
                // Sleep through long waits, but wake early: a sleep ends
                // late on a busy machine, and a late completion distorts
                // the modelled link. Poll (yielding) the last stretch.
                let wait = due.saturating_duration_since(now);
                if wait > Duration::from_millis(1) {
                    std::thread::sleep(wait - Duration::from_micros(500));
                } else {
                    std::thread::yield_now();
                }
                continue;
            }
            if now.duration_since(idle_since) < self.spin {
                // Poll, but let another engine pinned to this core run.
                std::thread::yield_now();
                continue;
            }
            self.sleep();
            idle_since = Instant::now();
        }
    }

    fn sleep(&mut self) {
        let word: &AtomicU32 = self.dev.futex_word(reg::ENGINE_SLEEP);
        word.store(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let depth = self.dev.layout().depth as u64;
        let posted = Direction::ALL.iter().any(|d| {
            let l = self.dev.register(d.last_register()).load(Ordering::SeqCst);
            let c = self.consumed[*d as usize];
            l > c && l - c <= depth
        });
        if posted || self.shutdown_requested() {
            word.store(0, Ordering::SeqCst);
            return;
        }
        self.stats.sleeps += 1;
        futex_wait(word, 1, Some(Duration::from_millis(20)));
        word.store(0, Ordering::SeqCst);
    }

    /// Runs the engine on a thread of its own until the handle is dropped
    /// (or [`EngineHandle::stop`]).
    pub fn spawn(mut self) -> EngineHandle {
        let dev = self.dev.clone();
        let thread = std::thread::Builder::new()
            .name("uniplane-dma".into())
            .spawn(move || {
                if let Some(cpu) = self.cpu {
                    // Best effort: an unpinned engine still works.
                    let _ = crate::sys::pin_to_cpu(cpu);
                }
                self.run();
                self
            })
            .ok();
        EngineHandle { dev, thread }
    }
}

/// Asks an engine to stop: shutdown register, then a wake-up.
pub fn request_shutdown(dev: &DeviceRegion) {
    dev.register(reg::SHUTDOWN).store(1, Ordering::SeqCst);
    let word = dev.futex_word(reg::ENGINE_SLEEP);
    word.store(0, Ordering::SeqCst);
    futex_wake(word, i32::MAX);
}

/// A running engine thread; stopping or dropping it ends the thread.
#[derive(Debug)]
pub struct EngineHandle {
    dev: DeviceRegion,
    thread: Option<JoinHandle<DmaEngine>>,
}

impl EngineHandle {
    /// Stops the engine and returns it (with its counters), if its thread
    /// started and did not panic.
    pub fn stop(mut self) -> Option<DmaEngine> {
        request_shutdown(&self.dev);
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        if let Some(t) = self.thread.take() {
            request_shutdown(&self.dev);
            let _ = t.join();
        }
    }
}

/// The host side: posts descriptors, rings doorbells, collects completions.
#[derive(Debug)]
pub struct DmaDriver {
    dev: DeviceRegion,
    limits: DmaLimits,
    posted: [u64; 2],
    published: [u64; 2],
    reclaimed: [u64; 2],
    /// Per ring and slot: the id posted there and whether it was reported.
    slots: [Vec<(u32, bool)>; 2],
    next_id: u32,
    spin: Duration,
}

impl DmaDriver {
    /// A driver for `dev` (the only one: rings are single-producer).
    pub fn new(dev: DeviceRegion) -> DmaDriver {
        let depth = dev.layout().depth;
        DmaDriver {
            dev,
            limits: DmaLimits::default(),
            posted: [0; 2],
            published: [0; 2],
            reclaimed: [0; 2],
            slots: [vec![(0, true); depth], vec![(0, true); depth]],
            next_id: 1,
            spin: Duration::from_micros(50),
        }
    }

    /// Splits transfers by `limits` (which must match the engine's).
    pub fn with_limits(mut self, limits: DmaLimits) -> DmaDriver {
        self.limits = limits;
        self
    }

    /// How long waits spin before they sleep on the completion futex.
    pub fn with_spin(mut self, spin: Duration) -> DmaDriver {
        self.spin = spin;
        self
    }

    /// The device driven.
    pub fn device(&self) -> &DeviceRegion {
        &self.dev
    }

    /// The limits transfers are split by.
    pub fn limits(&self) -> DmaLimits {
        self.limits
    }

    /// Descriptors that can be posted on `dir` now.
    pub fn free_slots(&mut self, dir: Direction) -> usize {
        self.reclaim(dir);
        let i = dir as usize;
        self.dev.layout().depth - (self.posted[i] - self.reclaimed[i]) as usize
    }

    /// Writes `desc` (its id replaced by a fresh one) into the next slot of
    /// `dir`; `None` when the ring is full. Not seen by the engine until
    /// [`DmaDriver::ring_doorbell`].
    pub fn try_post(&mut self, dir: Direction, mut desc: Descriptor) -> Option<u32> {
        if self.free_slots(dir) == 0 {
            return None;
        }
        let i = dir as usize;
        let slot = self.posted[i] as usize & (self.dev.layout().depth - 1);
        desc.id = self.next_id;
        self.next_id = self.next_id.wrapping_add(1).max(1);
        self.dev.status_word(dir, slot).store(0, Ordering::Relaxed);
        self.dev
            .memory()
            .write(self.dev.layout().descriptor(dir, slot), &desc.encode());
        self.slots[i][slot] = (desc.id, false);
        self.posted[i] += 1;
        Some(desc.id)
    }

    /// Publishes every descriptor posted on `dir` (the last-pointer store)
    /// and wakes the engine if it sleeps.
    pub fn ring_doorbell(&mut self, dir: Direction) {
        let i = dir as usize;
        if self.posted[i] == self.published[i] {
            return;
        }
        self.published[i] = self.posted[i];
        self.dev
            .register(dir.last_register())
            .store(self.posted[i], Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let word = self.dev.futex_word(reg::ENGINE_SLEEP);
        if word.load(Ordering::SeqCst) != 0 && word.swap(0, Ordering::SeqCst) != 0 {
            futex_wake(word, 1);
        }
    }

    fn reclaim(&mut self, dir: Direction) {
        let i = dir as usize;
        let mask = self.dev.layout().depth - 1;
        while self.reclaimed[i] < self.posted[i] {
            let slot = self.reclaimed[i] as usize & mask;
            if !self.slots[i][slot].1 {
                break;
            }
            self.reclaimed[i] += 1;
        }
    }

    /// Appends every completion not yet reported, in the order found (not
    /// necessarily the order posted), and frees their slots. Returns how
    /// many.
    pub fn poll_completions(&mut self, out: &mut Vec<Completion>) -> usize {
        let mut n = 0;
        let mask = self.dev.layout().depth - 1;
        for dir in Direction::ALL {
            let i = dir as usize;
            for pos in self.reclaimed[i]..self.published[i] {
                let slot = pos as usize & mask;
                let (id, reported) = self.slots[i][slot];
                if reported {
                    continue;
                }
                let word = self.dev.status_word(dir, slot).load(Ordering::Acquire);
                if word & DONE == 0 {
                    continue;
                }
                let status = if (word & 0xffff_ffff) as u32 != id {
                    DmaStatus::Corrupt
                } else {
                    DmaStatus::from_code((word >> 32) & 0xff)
                };
                self.slots[i][slot].1 = true;
                out.push(Completion { dir, id, status });
                n += 1;
            }
            self.reclaim(dir);
        }
        n
    }

    /// Descriptors published and not yet reported complete.
    pub fn outstanding(&self) -> usize {
        let mask = self.dev.layout().depth - 1;
        (0..2)
            .map(|i| {
                (self.reclaimed[i]..self.published[i])
                    .filter(|p| !self.slots[i][*p as usize & mask].1)
                    .count()
            })
            .sum()
    }

    /// Waits until at least one completion arrives or `timeout` passes:
    /// spins for the spin time, then sleeps on the completion futex.
    pub fn wait_completions(&mut self, out: &mut Vec<Completion>, timeout: Duration) -> usize {
        let start = Instant::now();
        loop {
            let seen = self
                .dev
                .futex_word(reg::COMPLETIONS)
                .load(Ordering::Acquire);
            let n = self.poll_completions(out);
            if n > 0 || self.outstanding() == 0 {
                return n;
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return 0;
            }
            if waited < self.spin {
                std::hint::spin_loop();
                continue;
            }
            let sleeping = self.dev.futex_word(reg::DRIVER_SLEEP);
            sleeping.store(1, Ordering::SeqCst);
            fence(Ordering::SeqCst);
            let count = self.dev.futex_word(reg::COMPLETIONS);
            if count.load(Ordering::SeqCst) == seen {
                futex_wait(
                    count,
                    seen,
                    Some((timeout - waited).min(Duration::from_millis(20))),
                );
            }
            sleeping.store(0, Ordering::Relaxed);
        }
    }

    /// Moves `len` bytes from bus address `src` to `dst` on ring `dir`,
    /// split into descriptors of at most the limit, posting as the ring has
    /// room (a full ring waits, it never fails) and waiting for every
    /// completion.
    pub fn transfer(
        &mut self,
        dir: Direction,
        src: u64,
        dst: u64,
        len: usize,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        let l = self.limits;
        let unaligned = DmaError::Unaligned {
            align: l.align,
            word_bytes: l.word_bytes,
        };
        if !len.is_multiple_of(l.word_bytes)
            || !src.is_multiple_of(l.align as u64)
            || !dst.is_multiple_of(l.align as u64)
            || !l.max_bytes.is_multiple_of(l.align)
        {
            return Err(unaligned);
        }
        let deadline = Instant::now() + timeout;
        let mut done = Vec::with_capacity(self.dev.layout().depth);
        let mut at = 0usize;
        let mut failure = None;
        while at < len || self.outstanding() > 0 {
            while at < len {
                let chunk = (len - at).min(l.max_bytes);
                let d = Descriptor {
                    src: src + at as u64,
                    dst: dst + at as u64,
                    len_words: (chunk / l.word_bytes) as u32,
                    ..Descriptor::default()
                };
                if self.try_post(dir, d).is_none() {
                    break;
                }
                at += chunk;
            }
            self.ring_doorbell(dir);
            done.clear();
            let left = deadline.saturating_duration_since(Instant::now());
            if self.wait_completions(&mut done, left) == 0 && Instant::now() >= deadline {
                return Err(DmaError::Timeout);
            }
            if let Some(c) = done.iter().find(|c| c.status != DmaStatus::Ok) {
                failure.get_or_insert(DmaError::Failed {
                    id: c.id,
                    status: c.status,
                });
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::DeviceConfig;

    fn device(mem: usize, depth: usize) -> DeviceRegion {
        DeviceRegion::create(&DeviceConfig {
            name: "dma-test".into(),
            memory_bytes: mem,
            ring_depth: depth,
        })
        .unwrap()
    }

    /// Device 1 and device 2 on one bus (windows 1 and 2), engine of device 1.
    fn two_devices(depth: usize) -> (DeviceRegion, DeviceRegion, Bus) {
        let a = device(8 << 20, depth);
        let b = device(8 << 20, depth);
        let mut bus = Bus::new();
        bus.map_device(1, &a);
        bus.map_device(2, &b);
        (a, b, bus)
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn a_transfer_larger_than_a_descriptor_is_split_and_arrives_whole() {
        let (a, b, bus) = two_devices(4);
        let data = pattern(5 << 20, 7);
        assert!(a.write_memory(0, &data));
        let engine = DmaEngine::new(a.clone(), bus).spawn();
        let mut drv = DmaDriver::new(a.clone());
        drv.transfer(
            Direction::Write,
            bus_addr(1, 0),
            bus_addr(2, 4096),
            data.len(),
            Duration::from_secs(10),
        )
        .unwrap();
        let mut got = vec![0u8; data.len()];
        assert!(b.read_memory(4096, &mut got));
        assert!(got == data);
        let e = engine.stop().unwrap();
        assert_eq!(
            e.stats().completed,
            5,
            "five 1 MiB descriptors through a ring of 4"
        );
    }

    #[test]
    fn a_descriptor_outside_the_bus_completes_with_an_error_and_copies_nothing() {
        let (a, b, bus) = two_devices(8);
        let _engine = DmaEngine::new(a.clone(), bus).spawn();
        let mut drv = DmaDriver::new(a.clone());
        assert!(a.write_memory(0, &[9u8; 4096]));
        let err = drv
            .transfer(
                Direction::Write,
                bus_addr(1, 0),
                bus_addr(2, (8 << 20) - 4096),
                8192,
                Duration::from_secs(5),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            DmaError::Failed {
                status: DmaStatus::OutOfRange,
                ..
            }
        ));
        let mut tail = [1u8; 4096];
        assert!(b.read_memory((8 << 20) - 4096, &mut tail));
        assert_eq!(tail, [0u8; 4096], "nothing written");
        let err = drv
            .transfer(
                Direction::Write,
                bus_addr(1, 0),
                bus_addr(9, 0),
                4096,
                Duration::from_secs(5),
            )
            .unwrap_err();
        assert!(matches!(
            err,
            DmaError::Failed {
                status: DmaStatus::OutOfRange,
                ..
            }
        ));
    }

    #[test]
    fn the_engine_refuses_bad_lengths_alignment_and_control_bits() {
        let (a, _b, bus) = two_devices(8);
        let mut engine = DmaEngine::new(a.clone(), bus);
        let mut drv = DmaDriver::new(a.clone());
        let good = Descriptor {
            src: bus_addr(1, 0),
            dst: bus_addr(2, 0),
            len_words: 1024,
            ..Descriptor::default()
        };
        let cases = [
            (
                Descriptor {
                    len_words: 0,
                    ..good
                },
                DmaStatus::BadLength,
            ),
            (
                Descriptor {
                    len_words: (2 << 20) / 4,
                    ..good
                },
                DmaStatus::BadLength,
            ),
            (
                Descriptor {
                    src: bus_addr(1, 8),
                    ..good
                },
                DmaStatus::Misaligned,
            ),
            (Descriptor { ctrl: 0x80, ..good }, DmaStatus::BadControl),
            (good, DmaStatus::Ok),
        ];
        for (d, _) in &cases {
            drv.try_post(Direction::Read, *d).unwrap();
        }
        drv.ring_doorbell(Direction::Read);
        while engine.step(64) {}
        let mut out = Vec::new();
        drv.poll_completions(&mut out);
        let got: Vec<DmaStatus> = out.iter().map(|c| c.status).collect();
        let want: Vec<DmaStatus> = cases.iter().map(|c| c.1).collect();
        assert_eq!(got, want);
        assert_eq!(engine.stats().refused, 4);
    }

    #[test]
    fn a_full_ring_pushes_back_instead_of_failing() {
        let (a, _b, _bus) = two_devices(4);
        let mut drv = DmaDriver::new(a);
        let d = Descriptor {
            src: bus_addr(1, 0),
            dst: bus_addr(2, 0),
            len_words: 1,
            ..Descriptor::default()
        };
        for _ in 0..4 {
            assert!(drv.try_post(Direction::Write, d).is_some());
        }
        assert_eq!(drv.try_post(Direction::Write, d), None);
        assert_eq!(drv.free_slots(Direction::Write), 0);
    }

    #[test]
    fn completions_are_reported_out_of_order_across_rings() {
        let (a, _b, bus) = two_devices(8);
        let model = LinkModel {
            latency: Duration::from_micros(1),
            bytes_per_sec: 1e9,
        };
        let mut engine = DmaEngine::new(a.clone(), bus).with_model(model);
        let mut drv = DmaDriver::new(a.clone());
        let big = Descriptor {
            src: bus_addr(1, 0),
            dst: bus_addr(2, 0),
            len_words: (1 << 20) / 4,
            ..Descriptor::default()
        };
        let small = Descriptor {
            len_words: 1,
            dst: bus_addr(2, 1 << 21),
            ..big
        };
        let first = drv.try_post(Direction::Write, big).unwrap();
        drv.ring_doorbell(Direction::Write);
        engine.step(1);
        let second = drv.try_post(Direction::Read, small).unwrap();
        drv.ring_doorbell(Direction::Read);
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < 2 && Instant::now() < deadline {
            engine.step(8);
            drv.poll_completions(&mut out);
        }
        let ids: Vec<u32> = out.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![second, first], "the small read finishes first");
    }

    #[test]
    fn a_reordering_engine_completes_a_small_descriptor_before_a_large_one() {
        let (a, _b, bus) = two_devices(8);
        let model = LinkModel {
            latency: Duration::from_micros(1),
            bytes_per_sec: 1e9,
        };
        let mut engine = DmaEngine::new(a.clone(), bus)
            .with_model(model)
            .with_reorder(true);
        let mut drv = DmaDriver::new(a.clone());
        let big = Descriptor {
            src: bus_addr(1, 0),
            dst: bus_addr(2, 0),
            len_words: (1 << 20) / 4,
            ..Descriptor::default()
        };
        let small = Descriptor {
            len_words: 1,
            dst: bus_addr(2, 1 << 21),
            ..big
        };
        let first = drv.try_post(Direction::Write, big).unwrap();
        let second = drv.try_post(Direction::Write, small).unwrap();
        drv.ring_doorbell(Direction::Write);
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(5);
        while out.len() < 2 && Instant::now() < deadline {
            engine.step(8);
            drv.poll_completions(&mut out);
        }
        let ids: Vec<u32> = out.iter().map(|c| c.id).collect();
        assert_eq!(ids, vec![second, first]);
        assert_eq!(drv.free_slots(Direction::Write), 8, "both slots reclaimed");
    }

    #[test]
    fn the_link_model_makes_a_transfer_take_its_time() {
        let (a, _b, bus) = two_devices(8);
        let model = LinkModel::pcie_gen2_x4();
        let engine = DmaEngine::new(a.clone(), bus).with_model(model).spawn();
        let mut drv = DmaDriver::new(a.clone());
        let start = Instant::now();
        drv.transfer(
            Direction::Write,
            bus_addr(1, 0),
            bus_addr(2, 0),
            4 << 20,
            Duration::from_secs(10),
        )
        .unwrap();
        let took = start.elapsed();
        let expect = Duration::from_secs_f64((4 << 20) as f64 / 1855e6);
        assert!(took >= expect, "{took:?} < {expect:?}");
        drop(engine);
    }

    #[test]
    fn an_impossible_last_pointer_is_counted_not_followed() {
        let (a, _b, bus) = two_devices(8);
        let mut engine = DmaEngine::new(a.clone(), bus);
        a.register(reg::WRITE_LAST).store(1000, Ordering::SeqCst);
        assert!(!engine.step(64));
        assert!(a.register(reg::ENGINE_ERRORS).load(Ordering::SeqCst) > 0);
    }

    #[test]
    fn a_notify_word_carries_the_id_after_the_data() {
        let (a, b, bus) = two_devices(8);
        let mut engine = DmaEngine::new(a.clone(), bus);
        let mut drv = DmaDriver::new(a.clone());
        assert!(a.write_memory(0, &[5u8; 4096]));
        let id = drv
            .try_post(
                Direction::Write,
                Descriptor {
                    src: bus_addr(1, 0),
                    dst: bus_addr(2, 0),
                    notify: bus_addr(2, 8192),
                    len_words: 1024,
                    ctrl: CTRL_NOTIFY,
                    ..Descriptor::default()
                },
            )
            .unwrap();
        drv.ring_doorbell(Direction::Write);
        while engine.step(8) {}
        let mut w = [0u8; 8];
        assert!(b.read_memory(8192, &mut w));
        assert_eq!(u64::from_le_bytes(w), id as u64);
    }
}
