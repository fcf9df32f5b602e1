//! The range of every number the configuration file holds.
//!
//! A number outside its range is refused when the file is read (so
//! `uniplaned --check` refuses it too), never clamped: a value the daemon
//! would change silently, or one that would make it abort when it sizes
//! its queues and memories at start, is an error with the file, line,
//! column, field, value and range.
//!
//! | field | range | why the maximum |
//! |---|---|---|
//! | `engine.max_ports` | 2..=256 | the crossbar holds max_ports² queues |
//! | `engine.ring_depth` | 2..=16384 | two rings of this many messages per port |
//! | `engine.voq_depth` | 1..=4096 | and max_ports² × voq_depth ≤ 4194304 |
//! | `engine.table_capacity` | 1..=1048576 | entries per port's forwarding table |
//! | `devices.device` | 1..=65535 | a 16-bit device number; 0 is the daemon |
//! | `devices.memory` | 0..=1073741824 | 1 GiB per device |
//! | `devices.pio_threshold` | 0..=4096 | one mailbox slot carries a PIO message |
//! | `devices.tokens` | 1..=256 | each token is a 64 KiB frame of the Connect window |
//! | `devices.stall_timeout_ms` | 10..=60000 | 1 minute |
//! | `failure.heartbeat_ms` | 1..=60000 | 1 minute |
//! | `stacks.mtu` | 256..=65507 | the largest UDP datagram |
//! | `failure.misses` | 1..=1000 | |
//!
//! The `[limits]` table's ranges are in [`super::limits::LIMIT_FIELDS`].

use std::fmt;

/// The values one number in the file may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    /// Smallest value accepted.
    pub min: u64,
    /// Largest value accepted.
    pub max: u64,
    /// The largest value in words (`1 GiB`), where that reads better.
    pub note: Option<&'static str>,
}

impl Bounds {
    /// `min..=max`.
    pub const fn new(min: u64, max: u64) -> Bounds {
        Bounds {
            min,
            max,
            note: None,
        }
    }

    /// The same range, its maximum also said in words.
    pub const fn note(self, note: &'static str) -> Bounds {
        Bounds {
            note: Some(note),
            ..self
        }
    }

    /// Whether `value` is in the range.
    pub fn contains(&self, value: i64) -> bool {
        u64::try_from(value).is_ok_and(|v| (self.min..=self.max).contains(&v))
    }
}

impl fmt::Display for Bounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..={}", self.min, self.max)?;
        if let Some(note) = self.note {
            write!(f, " ({note})")?;
        }
        Ok(())
    }
}

/// `engine.max_ports`: ports of the engine, the daemon's own included.
pub const MAX_PORTS: Bounds = Bounds::new(2, 256);
/// `runtime.metrics_connections`: connections exported per scrape.
pub const METRICS_CONNECTIONS: Bounds = Bounds::new(0, 100_000);
/// `engine.ring_depth`: messages per port ring and direction (rounded up
/// to a power of two).
pub const RING_DEPTH: Bounds = Bounds::new(2, 16384);
/// `engine.shards`: engine threads, each running a share of the ports.
pub const SHARDS: Bounds = Bounds::new(1, 64);
/// `engine.cpus`: a CPU number to pin a shard to.
pub const CPU: Bounds = Bounds::new(0, 1023);
/// `engine.voq_depth`: messages per virtual output queue.
pub const VOQ_DEPTH: Bounds = Bounds::new(1, 4096);
/// Most queue slots the crossbar may hold in all: `max_ports² ×
/// voq_depth`, allocated when the engine starts. 256 ports at the default
/// depth of 64 fit exactly.
pub const VOQ_SLOTS: u64 = 1 << 22;
/// `engine.table_capacity`: entries per port's forwarding table.
pub const TABLE_CAPACITY: Bounds = Bounds::new(1, 1 << 20);
/// `devices.device`: a device number; 0 is the daemon's.
pub const DEVICE: Bounds = Bounds::new(1, u16::MAX as u64);
/// `devices.memory`: bytes of memory one device serves.
pub const DEVICE_MEMORY: Bounds = Bounds::new(0, 1 << 30).note("1 GiB");
/// `devices.gpu`: a CUDA device ordinal.
pub const GPU: Bounds = Bounds::new(0, 63);
/// `devices.direct_from`: payload bytes from which `transfer = "auto"`
/// copies direct (0: always; above the largest payload: never).
pub const DIRECT_FROM: Bounds = Bounds::new(0, 1 << 20).note("1 MiB");
/// `devices.pio_threshold`: largest payload a kernel device's messages
/// carry through the PIO mailbox (one slot holds one message).
pub const PIO_THRESHOLD: Bounds = Bounds::new(0, 4096);
/// `devices.tokens`: FPGA Connect tokens of a kernel device; its receive
/// windows hold that many largest frames.
pub const KERNEL_TOKENS: Bounds = Bounds::new(1, 256);
/// `devices.dma_pull_from`, `dma_staged_from`, `dma_pipelined_from`:
/// transfer bytes from which a kernel device's one-sided requests take
/// that DMA mode (0: always; above the largest payload: never).
pub const DMA_FROM: Bounds = Bounds::new(0, 1 << 16).note("64 KiB: never");
/// `devices.stall_timeout_ms`: how long a kernel device's requests may go
/// unanswered before it is marked down.
pub const STALL_TIMEOUT_MS: Bounds = Bounds::new(10, 60_000).note("1 minute");
/// `failure.heartbeat_ms`: milliseconds between heartbeats.
pub const HEARTBEAT_MS: Bounds = Bounds::new(1, 60_000).note("1 minute");
/// `failure.misses`: silent heartbeat intervals that declare a peer failed.
pub const MISSES: Bounds = Bounds::new(1, 1000);

/// `stacks.mtu`: the largest datagram (`udp`, `ltl`) or frame (`ether`).
pub const STACK_MTU: Bounds = Bounds::new(256, 65_507);
