//! Peer-to-peer transfers between two emulated devices of one server, in
//! the four modes compared for FPGA–GPU transfers, and the choice between
//! the PIO mailbox and the DMA ring by message size.
//!
//! ```text
//!  push:              A ──write ring of A──────────────▶ B      (posted writes)
//!  pull:              A ◀──read ring of B───────────────  B      (reads)
//!  staged:            A ──write ring of A──▶ host ──read ring of B──▶ B
//!  staged-pipelined:  the same in chunks, chunk i+1 leaving A while chunk i
//!                     enters B, through a ring of bounce slots
//! ```
//!
//! On the bus, window 0 is host memory (the bounce buffers), window 1 is
//! device A's memory and window 2 device B's.

use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::device::{DeviceConfig, DeviceError, DeviceRegion, Direction};
use crate::dma::{
    bus_addr, Bus, Completion, Descriptor, DmaDriver, DmaEngine, DmaError, DmaLimits, EngineHandle,
    LinkModel,
};
use crate::sys::{memfd_name, SharedMemory};

/// Bus window of host memory.
pub const HOST_WINDOW: u16 = 0;
/// Bus window of device A.
pub const DEVICE_A_WINDOW: u16 = 1;
/// Bus window of device B.
pub const DEVICE_B_WINDOW: u16 = 2;

/// How bytes go from device A to device B.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TransferMode {
    /// Through a host bounce buffer: all of it out of A, then all into B.
    Staged,
    /// Through host bounce slots in chunks, the two hops overlapped.
    StagedPipelined,
    /// A's engine writes straight into B's memory (posted writes).
    Push,
    /// B's engine reads straight from A's memory.
    Pull,
}

impl TransferMode {
    /// Every mode, in the order the sweep reports them.
    pub const ALL: [TransferMode; 4] = [
        TransferMode::Staged,
        TransferMode::StagedPipelined,
        TransferMode::Push,
        TransferMode::Pull,
    ];

    /// The name used on command lines and in configuration.
    pub const fn name(self) -> &'static str {
        match self {
            TransferMode::Staged => "staged",
            TransferMode::StagedPipelined => "staged-pipelined",
            TransferMode::Push => "push",
            TransferMode::Pull => "pull",
        }
    }
}

impl Default for TransferMode {
    /// Posted writes, the fastest mode on most topologies.
    fn default() -> Self {
        TransferMode::Push
    }
}

impl std::fmt::Display for TransferMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Text that names no transfer mode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown transfer mode `{0}` (staged, staged-pipelined, push, pull)")]
pub struct UnknownMode(pub String);

impl FromStr for TransferMode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TransferMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| UnknownMode(s.to_owned()))
    }
}

/// Which path a message of a given size takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PathKind {
    /// The PIO mailbox.
    Pio,
    /// The DMA ring.
    Dma,
}

/// Small messages take the mailbox, large ones the DMA ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PathPolicy {
    /// Largest message sent by PIO.
    pub pio_max_bytes: usize,
}

impl Default for PathPolicy {
    /// The crossover measured on the development machine (`docs/shm.md`):
    /// with 128-byte slots the mailbox's round trip is shorter up to 256
    /// bytes, the DMA ring's from 512.
    fn default() -> Self {
        PathPolicy { pio_max_bytes: 256 }
    }
}

impl PathPolicy {
    /// The path for a message of `len` bytes.
    pub fn choose(&self, len: usize) -> PathKind {
        if len <= self.pio_max_bytes {
            PathKind::Pio
        } else {
            PathKind::Dma
        }
    }
}

/// Sizes and behaviour of a [`PeerToPeer`] setup.
#[derive(Clone, Debug)]
pub struct P2pConfig {
    /// Memory of each device.
    pub device_bytes: usize,
    /// Host memory for bounce buffers.
    pub host_bytes: usize,
    /// Descriptors per ring.
    pub ring_depth: usize,
    /// Bytes per chunk in `staged-pipelined`.
    pub chunk_bytes: usize,
    /// Bounce slots in flight in `staged-pipelined`.
    pub bounce_slots: usize,
    /// Link model of both engines, or none (memory speed).
    pub model: Option<LinkModel>,
    /// Descriptor rules.
    pub limits: DmaLimits,
    /// CPUs to pin the engines of A and B to (none: unpinned).
    pub engine_cpus: [Option<usize>; 2],
    /// How long the drivers spin for completions before they sleep.
    pub driver_spin: Duration,
    /// How long an idle engine polls its rings before it sleeps.
    pub engine_spin: Duration,
}

impl Default for P2pConfig {
    fn default() -> Self {
        P2pConfig {
            device_bytes: 64 << 20,
            host_bytes: 32 << 20,
            ring_depth: crate::device::DEFAULT_RING_DEPTH,
            chunk_bytes: 256 << 10,
            bounce_slots: 8,
            model: None,
            limits: DmaLimits::default(),
            engine_cpus: [None, None],
            driver_spin: Duration::from_micros(50),
            engine_spin: Duration::from_micros(50),
        }
    }
}

/// Two devices, host memory, an engine per device and a driver per
/// device, wired on one bus.
#[derive(Debug)]
pub struct PeerToPeer {
    /// Device A (the source of transfers).
    pub a: DeviceRegion,
    /// Device B (the destination).
    pub b: DeviceRegion,
    /// Host memory (bounce buffers).
    pub host: Arc<SharedMemory>,
    drv_a: DmaDriver,
    drv_b: DmaDriver,
    cfg: P2pConfig,
    _engines: [EngineHandle; 2],
}

impl PeerToPeer {
    /// Creates both devices and host memory and starts both engines.
    pub fn new(cfg: P2pConfig) -> Result<PeerToPeer, DeviceError> {
        let dev = |name: &str| {
            DeviceRegion::create(&DeviceConfig {
                name: name.into(),
                memory_bytes: cfg.device_bytes,
                ring_depth: cfg.ring_depth,
            })
        };
        let a = dev("device-a")?;
        let b = dev("device-b")?;
        let host = Arc::new(SharedMemory::create(&memfd_name("host"), cfg.host_bytes)?);
        let mut bus = Bus::new();
        bus.map(HOST_WINDOW, host.clone(), 0, cfg.host_bytes);
        bus.map_device(DEVICE_A_WINDOW, &a);
        bus.map_device(DEVICE_B_WINDOW, &b);
        let engine = |d: &DeviceRegion, cpu: Option<usize>| {
            let e = DmaEngine::new(d.clone(), bus.clone())
                .with_limits(cfg.limits)
                .with_spin(cfg.engine_spin)
                .with_cpu(cpu);
            match cfg.model {
                Some(m) => e.with_model(m),
                None => e,
            }
            .spawn()
        };
        let engines = [
            engine(&a, cfg.engine_cpus[0]),
            engine(&b, cfg.engine_cpus[1]),
        ];
        Ok(PeerToPeer {
            drv_a: DmaDriver::new(a.clone())
                .with_limits(cfg.limits)
                .with_spin(cfg.driver_spin),
            drv_b: DmaDriver::new(b.clone())
                .with_limits(cfg.limits)
                .with_spin(cfg.driver_spin),
            a,
            b,
            host,
            cfg,
            _engines: engines,
        })
    }

    /// Moves `len` bytes from `src` in A's memory to `dst` in B's memory.
    pub fn transfer(
        &mut self,
        mode: TransferMode,
        src: u64,
        dst: u64,
        len: usize,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        let from = bus_addr(DEVICE_A_WINDOW, src);
        let to = bus_addr(DEVICE_B_WINDOW, dst);
        match mode {
            TransferMode::Push => self
                .drv_a
                .transfer(Direction::Write, from, to, len, timeout),
            TransferMode::Pull => self.drv_b.transfer(Direction::Read, from, to, len, timeout),
            TransferMode::Staged => {
                let bounce = bus_addr(HOST_WINDOW, 0);
                let step = self.cfg.host_bytes;
                let mut at = 0;
                while at < len {
                    let n = (len - at).min(step);
                    let off = at as u64;
                    self.drv_a
                        .transfer(Direction::Write, from + off, bounce, n, timeout)?;
                    self.drv_b
                        .transfer(Direction::Read, bounce, to + off, n, timeout)?;
                    at += n;
                }
                Ok(())
            }
            TransferMode::StagedPipelined => self.pipelined(from, to, len, timeout),
        }
    }

    fn pipelined(
        &mut self,
        from: u64,
        to: u64,
        len: usize,
        timeout: Duration,
    ) -> Result<(), DmaError> {
        let chunk = self
            .cfg
            .chunk_bytes
            .min(self.cfg.limits.max_bytes)
            .max(self.cfg.limits.align);
        let slots = self
            .cfg
            .bounce_slots
            .min(self.cfg.host_bytes / chunk)
            .max(1);
        let chunks = len.div_ceil(chunk);
        let size = |i: usize| (len - i * chunk).min(chunk);
        let slot_addr = |i: usize| bus_addr(HOST_WINDOW, ((i % slots) * chunk) as u64);
        // Per chunk: the id of its first hop and whether that hop is done.
        let mut first_hop: Vec<(u32, bool)> = Vec::with_capacity(chunks);
        let mut second_hop: Vec<u32> = Vec::with_capacity(chunks);
        let mut done = 0usize;
        let mut out: Vec<Completion> = Vec::with_capacity(64);
        let deadline = Instant::now() + timeout;
        let mut failure = None;
        while done < chunks {
            // First hop: A → bounce slot, while a slot is free.
            let mut posted = false;
            while first_hop.len() < chunks && first_hop.len() < done + slots {
                let i = first_hop.len();
                let d = Descriptor {
                    src: from + (i * chunk) as u64,
                    dst: slot_addr(i),
                    len_words: (size(i) / self.cfg.limits.word_bytes) as u32,
                    ..Descriptor::default()
                };
                match self.drv_a.try_post(Direction::Write, d) {
                    Some(id) => first_hop.push((id, false)),
                    None => break,
                }
                posted = true;
            }
            if posted {
                self.drv_a.ring_doorbell(Direction::Write);
            }
            out.clear();
            self.drv_a.poll_completions(&mut out);
            for c in &out {
                if let Some(h) = first_hop.iter_mut().rev().find(|h| h.0 == c.id) {
                    h.1 = true;
                }
                if c.status != crate::dma::DmaStatus::Ok {
                    failure.get_or_insert(DmaError::Failed {
                        id: c.id,
                        status: c.status,
                    });
                }
            }
            // Second hop: bounce slot → B, in order, once the first hop landed.
            let mut posted = false;
            while second_hop.len() < first_hop.len() && first_hop[second_hop.len()].1 {
                let i = second_hop.len();
                let d = Descriptor {
                    src: slot_addr(i),
                    dst: to + (i * chunk) as u64,
                    len_words: (size(i) / self.cfg.limits.word_bytes) as u32,
                    ..Descriptor::default()
                };
                match self.drv_b.try_post(Direction::Read, d) {
                    Some(id) => second_hop.push(id),
                    None => break,
                }
                posted = true;
            }
            if posted {
                self.drv_b.ring_doorbell(Direction::Read);
            }
            out.clear();
            let n = self.drv_b.poll_completions(&mut out);
            for c in &out {
                if c.status != crate::dma::DmaStatus::Ok {
                    failure.get_or_insert(DmaError::Failed {
                        id: c.id,
                        status: c.status,
                    });
                }
            }
            done += n;
            if failure.is_some() && self.drv_a.outstanding() + self.drv_b.outstanding() == 0 {
                break;
            }
            if Instant::now() >= deadline {
                return Err(DmaError::Timeout);
            }
            if n == 0 {
                // Let an engine that shares this core run.
                std::thread::yield_now();
            }
        }
        failure.map_or(Ok(()), Err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> PeerToPeer {
        PeerToPeer::new(P2pConfig {
            device_bytes: 8 << 20,
            host_bytes: 2 << 20,
            ring_depth: 8,
            chunk_bytes: 64 << 10,
            bounce_slots: 4,
            ..P2pConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn every_mode_moves_the_bytes_intact() {
        let mut p = setup();
        let len = (3 << 20) + 4096 + 12;
        for (k, mode) in TransferMode::ALL.into_iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|i| (i * 7 + k) as u8).collect();
            assert!(p.a.write_memory(0, &data));
            p.transfer(mode, 0, 4096, len, Duration::from_secs(20))
                .unwrap_or_else(|e| panic!("{mode}: {e}"));
            let mut got = vec![0u8; len];
            assert!(p.b.read_memory(4096, &mut got));
            assert!(got == data, "{mode}: data differs");
        }
    }

    #[test]
    fn a_transfer_off_the_end_of_b_fails_in_every_mode() {
        let mut p = setup();
        for mode in TransferMode::ALL {
            let err = p
                .transfer(mode, 0, (8 << 20) - 4096, 64 << 10, Duration::from_secs(10))
                .unwrap_err();
            assert!(matches!(err, DmaError::Failed { .. }), "{mode}: {err}");
        }
    }

    #[test]
    fn modes_parse_from_their_names() {
        for m in TransferMode::ALL {
            assert_eq!(m.name().parse::<TransferMode>(), Ok(m));
        }
        assert!("teleport".parse::<TransferMode>().is_err());
        assert_eq!(TransferMode::default(), TransferMode::Push);
    }

    #[test]
    fn the_path_policy_splits_at_its_threshold() {
        let p = PathPolicy { pio_max_bytes: 256 };
        assert_eq!(p.choose(256), PathKind::Pio);
        assert_eq!(p.choose(257), PathKind::Dma);
    }
}
