//! Seeded impairments of datagram paths, one layer below
//! `uniplane_dataplane::fault`, on whole datagrams. Which datagram is lost,
//! corrupted, stalled, reordered or duplicated is decided by the same
//! sans-IO [`FaultDecider`] that impairs links; these types only carry the
//! decisions out on datagrams:
//!
//! - [`FaultyPath`]: a simulated path that loses, duplicates, reorders,
//!   corrupts and delays datagrams on a clock the caller drives, for
//!   deterministic tests of datagram protocols;
//! - [`LossyPort`]: a wrapper around any real [`DatagramPort`] that drops a
//!   seeded share of the datagrams it receives, for measuring a protocol
//!   over real sockets with loss (`uniplane-bench gen --loss`).
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
use std::io;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::fault::{flip_bit, probability, FaultDecider, FaultRates};

pub use uniplane_dataplane::fault::BadProbability;

use super::{Datagram, DatagramPort, PortStats, TxBatch};

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

    /// The rates a [`FaultDecider`] draws from: a stall is its delay, of
    /// `stall_time` exactly.
    pub fn rates(&self) -> FaultRates {
        FaultRates {
            loss: self.loss,
            corrupt: self.corrupt,
            delay: self.stall,
            delay_range: (self.stall_time, self.stall_time),
            reorder: self.reorder,
            duplicate: self.duplicate,
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
    decider: FaultDecider,
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
            decider: FaultDecider::new(config.rates(), config.seed),
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
        let fate = self.decider.decide(data.len());
        if fate.lost {
            self.stats.lost += 1;
            return;
        }
        let mut data = data;
        if let Some(bit) = fate.flip_bit {
            self.stats.corrupted += 1;
            let mut copy = BytesMut::from(&data[..]);
            flip_bit(&mut copy, bit);
            data = copy.freeze();
        }
        let mut due = now + self.config.latency;
        if let Some(stall) = fate.delay {
            self.stats.stalls += 1;
            self.stalled_until = Some(due + stall);
        }
        if let Some(until) = self.stalled_until {
            due = due.max(until);
        }
        if fate.reorder {
            self.stats.reordered += 1;
            due += self.config.reorder_delay;
        }
        if fate.duplicate {
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

/// A [`DatagramPort`] that drops a seeded share of the datagrams the
/// wrapped port receives, as a lossy network would, and sends untouched.
/// To impair both directions, wrap the ports at both ends.
///
/// Each received datagram is dropped with probability `loss`, decided by a
/// [`FaultDecider`] seeded with `seed`: the same seed and the same arrivals
/// drop the same datagrams. What is kept stays in order. Drops are counted
/// ([`LossyPort::dropped`], and `rx_dropped` in [`DatagramPort::stats`]).
/// A burst costs one random draw per datagram and no allocation; with
/// `loss` 0 nothing is drawn.
///
/// ```
/// use uniplane_stacks::datagram::fault::LossyPort;
/// use uniplane_stacks::udp::{UdpConfig, UdpPort};
///
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
/// # let _in_runtime = rt.enter();
/// let port = UdpPort::bind("127.0.0.1:0".parse()?, &UdpConfig::default())?;
/// // Loses 1 % of what it receives; seed 7 picks which.
/// let lossy = LossyPort::new(port, 0.01, 7)?;
/// assert_eq!(lossy.dropped(), 0);
/// assert!(LossyPort::new(lossy.into_inner(), 1.5, 7).is_err());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct LossyPort<P> {
    inner: P,
    decider: FaultDecider,
    dropped: u64,
}

/// Receives a lossy port makes in one poll before it yields when every
/// datagram received was dropped (so that a flood at loss 1.0 cannot hold
/// the task).
const ALL_DROPPED_RETRIES: usize = 8;

impl<P: DatagramPort> LossyPort<P> {
    /// Wraps `inner`, dropping each received datagram with probability
    /// `loss` (0.0 to 1.0) as decided by a generator seeded with `seed`.
    pub fn new(inner: P, loss: f64, seed: u64) -> Result<Self, BadProbability> {
        let rates = FaultRates {
            loss: probability(loss)?,
            ..FaultRates::default()
        };
        Ok(LossyPort {
            inner,
            decider: FaultDecider::new(rates, seed),
            dropped: 0,
        })
    }

    /// The probability with which a received datagram is dropped.
    pub fn loss(&self) -> f64 {
        self.decider.rates().loss
    }

    /// Datagrams dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The wrapped port.
    pub fn get_ref(&self) -> &P {
        &self.inner
    }

    /// The wrapped port, unwrapped.
    pub fn into_inner(self) -> P {
        self.inner
    }

    /// Drops a share of `out[start..]` in place, keeping the order of the
    /// rest; returns how many are kept.
    fn thin(&mut self, out: &mut Vec<Datagram<P::Addr>>, start: usize) -> usize {
        let mut kept = start;
        for i in start..out.len() {
            if self.decider.decide(out[i].data.len()).lost {
                self.dropped += 1;
            } else {
                out.swap(kept, i);
                kept += 1;
            }
        }
        out.truncate(kept);
        kept - start
    }
}

impl<P: DatagramPort> DatagramPort for LossyPort<P> {
    type Addr = P::Addr;

    fn local_addr(&self) -> P::Addr {
        self.inner.local_addr()
    }

    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<P::Addr>>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        let start = out.len();
        for _ in 0..ALL_DROPPED_RETRIES {
            match self.inner.poll_recv(cx, out, max) {
                Poll::Ready(Ok(_)) => {
                    let kept = self.thin(out, start);
                    if kept > 0 {
                        return Poll::Ready(Ok(kept));
                    }
                    // All dropped: `Ready` must carry datagrams, so look
                    // again (a `Pending` from the port registers the wake).
                }
                other => return other,
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut TxBatch<P::Addr>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_send(cx, batch)
    }

    fn stats(&self) -> PortStats {
        let inner = self.inner.stats();
        PortStats {
            rx_dropped: inner.rx_dropped + self.dropped,
            ..inner
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

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

    /// An in-memory port whose inbox the test fills.
    #[derive(Debug)]
    struct QueuePort {
        inbox: VecDeque<Datagram<u8>>,
        received: u64,
    }

    impl QueuePort {
        fn with(n: u32) -> Self {
            QueuePort {
                inbox: (0..n)
                    .map(|i| Datagram {
                        peer: 1,
                        data: Bytes::copy_from_slice(&i.to_be_bytes()),
                    })
                    .collect(),
                received: 0,
            }
        }
    }

    impl DatagramPort for QueuePort {
        type Addr = u8;

        fn local_addr(&self) -> u8 {
            0
        }

        fn max_datagram_size(&self) -> usize {
            1500
        }

        fn poll_recv(
            &mut self,
            _: &mut Context<'_>,
            out: &mut Vec<Datagram<u8>>,
            max: usize,
        ) -> Poll<io::Result<usize>> {
            let n = self.inbox.len().min(max);
            if n == 0 {
                return Poll::Pending;
            }
            out.extend(self.inbox.drain(..n));
            self.received += n as u64;
            Poll::Ready(Ok(n))
        }

        fn poll_send(&mut self, _: &mut Context<'_>, b: &mut TxBatch<u8>) -> Poll<io::Result<()>> {
            b.clear();
            Poll::Ready(Ok(()))
        }

        fn stats(&self) -> PortStats {
            PortStats {
                rx_datagrams: self.received,
                ..PortStats::default()
            }
        }
    }

    fn index(d: &Datagram<impl Sized>) -> u32 {
        u32::from_be_bytes(d.data[..4].try_into().unwrap())
    }

    /// Receives everything `n` queued datagrams leave after `loss`.
    fn drain_lossy(n: u32, loss: f64, seed: u64) -> (Vec<u32>, LossyPort<QueuePort>) {
        let mut port = LossyPort::new(QueuePort::with(n), loss, seed).unwrap();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut kept = Vec::new();
        let mut burst = Vec::with_capacity(64);
        while !port.get_ref().inbox.is_empty() {
            burst.clear();
            match port.poll_recv(&mut cx, &mut burst, 64) {
                Poll::Ready(Ok(got)) => {
                    assert!(got > 0, "a ready burst carries datagrams");
                    assert_eq!(got, burst.len());
                    kept.extend(burst.iter().map(index));
                }
                Poll::Ready(Err(e)) => panic!("{e}"),
                Poll::Pending => assert!(burst.is_empty()),
            }
        }
        (kept, port)
    }

    #[test]
    fn a_lossy_port_drops_about_its_share_and_counts_every_drop() {
        let n = 100_000;
        let (kept, port) = drain_lossy(n, 0.1, 5);
        assert_eq!(kept.len() as u64 + port.dropped(), n as u64);
        let share = port.dropped() as f64 / n as f64;
        assert!((0.09..0.11).contains(&share), "{share}");
        let stats = port.stats();
        assert_eq!(stats.rx_dropped, port.dropped());
        assert_eq!(stats.rx_datagrams, n as u64);
    }

    #[test]
    fn a_lossy_port_keeps_the_order_of_what_it_keeps() {
        let (kept, _) = drain_lossy(10_000, 0.3, 8);
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_same_seed_drops_the_same_datagrams() {
        let (a, _) = drain_lossy(5_000, 0.2, 11);
        let (b, _) = drain_lossy(5_000, 0.2, 11);
        let (c, _) = drain_lossy(5_000, 0.2, 12);
        assert_eq!(a, b);
        assert_ne!(a, c);
    }

    #[test]
    fn no_loss_keeps_everything_and_full_loss_keeps_nothing() {
        let (kept, port) = drain_lossy(1_000, 0.0, 1);
        assert_eq!((kept.len(), port.dropped()), (1_000, 0));
        // At 1.0 every poll that finds datagrams drops them all and is
        // `Pending`, never an empty `Ready`.
        let (kept, port) = drain_lossy(1_000, 1.0, 1);
        assert_eq!((kept.len(), port.dropped()), (0, 1_000));
    }

    #[test]
    fn a_probability_outside_zero_to_one_is_refused() {
        for p in [-0.01, 1.01, f64::NAN, f64::INFINITY] {
            let err = LossyPort::new(QueuePort::with(0), p, 1).unwrap_err();
            assert!(err.to_string().contains("0.0..=1.0"), "{err}");
        }
        for p in [0.0, 0.5, 1.0] {
            assert!(LossyPort::new(QueuePort::with(0), p, 1).is_ok());
        }
    }

    #[tokio::test]
    async fn over_loopback_udp_every_datagram_is_received_or_dropped() {
        use crate::udp::{UdpConfig, UdpPort};
        use std::future::poll_fn;

        let cfg = UdpConfig::default();
        let mut tx = UdpPort::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let rx = UdpPort::bind("127.0.0.1:0".parse().unwrap(), &cfg).unwrap();
        let to = rx.local_addr();
        let mut rx = LossyPort::new(rx, 0.25, 3).unwrap();
        let (bursts, per_burst) = (32u32, 32u32);
        let mut batch = TxBatch::with_capacity(4096, per_burst as usize);
        let mut kept = Vec::new();
        let mut got = Vec::with_capacity(64);
        for b in 0..bursts {
            for i in 0..per_burst {
                batch.push_datagram(to, &(b * per_burst + i).to_be_bytes());
            }
            poll_fn(|cx| tx.poll_send(cx, &mut batch)).await.unwrap();
            // Take this burst in before sending the next, so that the
            // socket's buffer never overflows.
            let sent = ((b + 1) * per_burst) as u64;
            while kept.len() as u64 + rx.dropped() < sent {
                got.clear();
                let recv = poll_fn(|cx| rx.poll_recv(cx, &mut got, 64));
                tokio::time::timeout(Duration::from_secs(5), recv)
                    .await
                    .expect("datagrams arrive")
                    .unwrap();
                kept.extend(got.iter().map(index));
            }
        }
        let n = (bursts * per_burst) as u64;
        assert_eq!(kept.len() as u64 + rx.dropped(), n);
        assert!(rx.dropped() > 0 && !kept.is_empty());
        assert!(kept.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(rx.stats().rx_dropped, rx.dropped());
    }
}
