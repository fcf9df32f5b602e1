//! A seeded, impaired datagram path for deterministic tests of datagram
//! protocols, in the style of `uniplane_dataplane::fault` but one layer
//! down: it loses, duplicates, reorders, corrupts and delays whole
//! datagrams on a clock the caller drives.
//!
//! ```
//! use std::time::{Duration, Instant};
//! use bytes::Bytes;
//! use uniplane_stacks::datagram::fault::{DatagramFaults, FaultyPath};
//!
//! let mut path = FaultyPath::new(DatagramFaults { loss: 0.5, ..DatagramFaults::new(7) });
//! let t0 = Instant::now();
//! for i in 0..100u8 {
//!     path.push(Bytes::from(vec![i]), t0);
//! }
//! let mut got = 0;
//! while let Some(_) = path.pop_due(t0 + Duration::from_secs(1)) {
//!     got += 1;
//! }
//! assert_eq!(got + path.stats().lost, 100);
//! ```

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::SplitMix64;

/// Which faults to inject, with what probability each (0.0–1.0).
#[derive(Clone, Debug, PartialEq)]
pub struct DatagramFaults {
    /// Seed of the generator that decides every fault.
    pub seed: u64,
    /// Probability that a datagram is lost.
    pub loss: f64,
    /// Probability that a datagram arrives twice.
    pub duplicate: f64,
    /// Probability that a datagram is held back by `reorder_delay`, so that
    /// later ones overtake it.
    pub reorder: f64,
    /// Probability that one bit of a datagram is flipped.
    pub corrupt: f64,
    /// Latency every datagram has.
    pub latency: Duration,
    /// Extra delay of a reordered datagram.
    pub reorder_delay: Duration,
    /// Time the path is busy with each datagram: a bottleneck that serves
    /// one datagram at a time, first come first served, so a sender that
    /// pushes faster builds a queue (zero: no bottleneck).
    pub per_datagram: Duration,
    /// Probability that a datagram finds the path stalled for
    /// `stall_time`: it and everything pushed during the stall leave
    /// after it, in order, as when the receiving task is not scheduled.
    pub stall: f64,
    /// How long a stall lasts.
    pub stall_time: Duration,
}

impl DatagramFaults {
    /// No faults and a latency of 10 µs, with generator seed `seed`.
    pub const fn new(seed: u64) -> Self {
        DatagramFaults {
            seed,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            latency: Duration::from_micros(10),
            reorder_delay: Duration::from_micros(30),
            per_datagram: Duration::ZERO,
            stall: 0.0,
            stall_time: Duration::from_millis(1),
        }
    }
}

/// What the path did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathStats {
    /// Datagrams pushed into the path.
    pub pushed: u64,
    /// Datagrams popped out of it (duplicates included).
    pub delivered: u64,
    /// Datagrams dropped on purpose.
    pub lost: u64,
    /// Extra copies made.
    pub duplicated: u64,
    /// Datagrams held back.
    pub reordered: u64,
    /// Stalls begun.
    pub stalls: u64,
    /// Datagrams with a flipped bit.
    pub corrupted: u64,
}

/// One direction of an impaired path: datagrams pushed at a time come out
/// at their due time, minus losses, plus copies, with bits flipped.
#[derive(Debug)]
pub struct FaultyPath {
    config: DatagramFaults,
    rng: SplitMix64,
    in_flight: BinaryHeap<Reverse<(Instant, u64, Slot)>>,
    order: u64,
    /// When the bottleneck finishes the datagrams queued so far.
    busy_until: Option<Instant>,
    /// The end of the current stall.
    stalled_until: Option<Instant>,
    stats: PathStats,
}

/// A datagram in flight; ordered by (due, order) only.
#[derive(Debug)]
struct Slot(Bytes);

impl PartialEq for Slot {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}
impl Eq for Slot {}
impl PartialOrd for Slot {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Slot {
    fn cmp(&self, _: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

impl FaultyPath {
    /// An empty path impairing as `config` says.
    pub fn new(config: DatagramFaults) -> Self {
        FaultyPath {
            rng: SplitMix64::new(config.seed),
            config,
            in_flight: BinaryHeap::new(),
            order: 0,
            busy_until: None,
            stalled_until: None,
            stats: PathStats::default(),
        }
    }

    /// Counters so far.
    pub fn stats(&self) -> PathStats {
        self.stats
    }

    /// How long a datagram pushed at `now` waits for the bottleneck.
    pub fn queueing_delay(&self, now: Instant) -> Duration {
        self.busy_until
            .map_or(Duration::ZERO, |b| b.saturating_duration_since(now))
    }

    /// Datagrams in flight.
    pub fn len(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.in_flight.is_empty()
    }

    fn enqueue(&mut self, due: Instant, data: Bytes) {
        self.order += 1;
        self.in_flight.push(Reverse((due, self.order, Slot(data))));
    }

    /// Sends `data` into the path at `now`.
    pub fn push(&mut self, data: Bytes, now: Instant) {
        self.stats.pushed += 1;
        // The bottleneck serves every datagram, lost or not (loss happens
        // beyond it, as at a receiver that drops what it read).
        let mut now = now;
        if !self.config.per_datagram.is_zero() {
            let start = self.busy_until.map_or(now, |b| b.max(now));
            now = start + self.config.per_datagram;
            self.busy_until = Some(now);
        }
        let c = &self.config;
        let (loss, corrupt, dup, reorder) = (c.loss, c.corrupt, c.duplicate, c.reorder);
        if self.rng.chance(loss) {
            self.stats.lost += 1;
            return;
        }
        let mut data = data;
        if self.rng.chance(corrupt) && !data.is_empty() {
            self.stats.corrupted += 1;
            let mut copy = BytesMut::from(&data[..]);
            let bit = self.rng.below(copy.len() as u64 * 8) as usize;
            copy[bit / 8] ^= 1 << (bit % 8);
            data = copy.freeze();
        }
        let mut due = now + self.config.latency;
        if self.config.stall > 0.0 && self.rng.chance(self.config.stall) {
            self.stats.stalls += 1;
            self.stalled_until = Some(due + self.config.stall_time);
        }
        if let Some(until) = self.stalled_until {
            due = due.max(until);
        }
        if self.rng.chance(reorder) {
            self.stats.reordered += 1;
            due += self.config.reorder_delay;
        }
        if self.rng.chance(dup) {
            self.stats.duplicated += 1;
            let later = due + self.config.latency;
            self.enqueue(later, data.clone());
        }
        self.enqueue(due, data);
    }

    /// When the next datagram comes out.
    pub fn next_due(&self) -> Option<Instant> {
        self.in_flight.peek().map(|Reverse((due, _, _))| *due)
    }

    /// The next datagram due at or before `now`.
    pub fn pop_due(&mut self, now: Instant) -> Option<Bytes> {
        if self.next_due()? > now {
            return None;
        }
        let Reverse((_, _, Slot(data))) = self.in_flight.pop()?;
        self.stats.delivered += 1;
        Some(data)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(config: DatagramFaults, n: u8) -> (Vec<Bytes>, PathStats) {
        let mut p = FaultyPath::new(config);
        let t0 = Instant::now();
        for i in 0..n {
            p.push(
                Bytes::from(vec![i; 8]),
                t0 + Duration::from_micros(i as u64),
            );
        }
        let mut out = Vec::new();
        while let Some(d) = p.pop_due(t0 + Duration::from_secs(1)) {
            out.push(d);
        }
        (out, p.stats())
    }

    #[test]
    fn without_faults_datagrams_arrive_in_order_after_the_latency() {
        let (out, stats) = run(DatagramFaults::new(1), 50);
        assert_eq!(out.len(), 50);
        assert!(out.windows(2).all(|w| w[0][0] < w[1][0]));
        assert_eq!(stats.delivered, 50);
    }

    #[test]
    fn the_same_seed_gives_the_same_faults() {
        let cfg = DatagramFaults {
            loss: 0.2,
            duplicate: 0.2,
            reorder: 0.2,
            corrupt: 0.2,
            ..DatagramFaults::new(9)
        };
        let a = run(cfg.clone(), 200);
        let b = run(cfg, 200);
        assert_eq!(a, b);
        let s = a.1;
        assert!(s.lost > 0 && s.duplicated > 0 && s.reordered > 0 && s.corrupted > 0);
        assert_eq!(s.delivered, s.pushed - s.lost + s.duplicated);
    }

    #[test]
    fn a_bottleneck_spaces_datagrams_by_their_service_time() {
        let cfg = DatagramFaults {
            per_datagram: Duration::from_micros(5),
            ..DatagramFaults::new(2)
        };
        let mut p = FaultyPath::new(cfg);
        let t0 = Instant::now();
        for i in 0..10u8 {
            p.push(Bytes::from(vec![i]), t0);
        }
        assert_eq!(p.queueing_delay(t0), Duration::from_micros(50));
        let mut due = Vec::new();
        while let Some(at) = p.next_due() {
            due.push(at - t0);
            p.pop_due(at);
        }
        let want: Vec<_> = (1..=10)
            .map(|i| Duration::from_micros(5 * i + 10))
            .collect();
        assert_eq!(due, want);
    }

    #[test]
    fn reordered_datagrams_are_overtaken() {
        let cfg = DatagramFaults {
            reorder: 0.3,
            ..DatagramFaults::new(4)
        };
        let (out, _) = run(cfg, 100);
        assert!(out.windows(2).any(|w| w[0][0] > w[1][0]));
    }
}
