//! Seeded fault injection: one sans-IO decider, and a link wrapper around
//! it in the spirit of smoltcp's `FaultInjector`.
//!
//! - [`FaultDecider`] decides, packet by packet, which faults happen: lost,
//!   corrupted (which bit), delayed (for how long), reordered, duplicated.
//!   It does no I/O and keeps no packets; it is the one place where these
//!   decisions are drawn, so every impairment of uniplane (this module's
//!   [`FaultInjector`] on links, `uniplane_stacks::datagram::fault` on
//!   datagram ports and simulated paths) draws them the same way and
//!   differs only in what it wraps and how it carries a decision out.
//! - [`FaultInjector`] impairs what a [`Link`](crate::Link) *receives*; sending passes
//!   through untouched. To impair both directions, wrap both ends. Given
//!   the same seed and the same sequence of arrivals, the same messages are
//!   dropped, duplicated, corrupted and delayed.

use std::time::Duration;

use crate::SplitMix64;

/// How often each fault happens (probabilities, 0.0–1.0) and how long a
/// delay lasts: what a [`FaultDecider`] draws from. Zero everywhere (the
/// default) injects nothing and draws nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct FaultRates {
    /// Probability that a packet is lost.
    pub loss: f64,
    /// Probability that one bit of a packet is flipped.
    pub corrupt: f64,
    /// Probability that a packet is delayed.
    pub delay: f64,
    /// Range of a delay, drawn uniformly (no draw when both ends are equal).
    pub delay_range: (Duration, Duration),
    /// Probability that a packet is reordered (held back behind later ones).
    pub reorder: f64,
    /// Probability that a packet arrives twice.
    pub duplicate: f64,
}

/// What happens to one packet, as a [`FaultDecider`] decided it. A lost
/// packet has no other fault.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultDecision {
    /// Drop it.
    pub lost: bool,
    /// Flip this bit of it (counted from the first byte's lowest bit).
    pub flip_bit: Option<usize>,
    /// Delay it by this long.
    pub delay: Option<Duration>,
    /// Let later packets overtake it.
    pub reorder: bool,
    /// Deliver it twice.
    pub duplicate: bool,
}

/// Decides, packet by packet, which faults to inject: seeded and sans-IO.
///
/// Each decision draws from a [`SplitMix64`] in a fixed order (loss;
/// corruption and its bit; delay and its length; reordering;
/// duplication), and a fault whose probability is zero draws nothing, so
/// the same seed and the same packets give the same decisions, and a
/// decider that only loses costs one draw per packet.
#[derive(Clone, Debug)]
pub struct FaultDecider {
    rates: FaultRates,
    rng: SplitMix64,
}

impl FaultDecider {
    /// A decider drawing from `rates` with a generator seeded with `seed`.
    pub const fn new(rates: FaultRates, seed: u64) -> Self {
        FaultDecider {
            rates,
            rng: SplitMix64::new(seed),
        }
    }

    /// What it draws from.
    pub fn rates(&self) -> &FaultRates {
        &self.rates
    }

    /// Decides the fate of a packet of `len` bytes.
    #[inline]
    pub fn decide(&mut self, len: usize) -> FaultDecision {
        let r = &self.rates;
        let rng = &mut self.rng;
        if rng.chance(r.loss) {
            return FaultDecision {
                lost: true,
                ..FaultDecision::default()
            };
        }
        let flip_bit =
            (rng.chance(r.corrupt) && len > 0).then(|| rng.below(len as u64 * 8) as usize);
        let delay = rng.chance(r.delay).then(|| {
            let (lo, hi) = r.delay_range;
            let span = hi.saturating_sub(lo).as_nanos() as u64;
            if span == 0 {
                lo
            } else {
                lo + Duration::from_nanos(rng.below(span.saturating_add(1)))
            }
        });
        FaultDecision {
            lost: false,
            flip_bit,
            delay,
            reorder: rng.chance(r.reorder),
            duplicate: rng.chance(r.duplicate),
        }
    }
}

/// Flips bit `bit` of `packet` (as [`FaultDecision::flip_bit`] names it).
pub fn flip_bit(packet: &mut [u8], bit: usize) {
    packet[bit / 8] ^= 1 << (bit % 8);
}

/// A probability outside `0.0..=1.0` (or not a number).
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[error("a loss probability must be within 0.0..=1.0, not {0}")]
pub struct BadProbability(pub f64);

/// `p` if it is a probability.
pub fn probability(p: f64) -> Result<f64, BadProbability> {
    if (0.0..=1.0).contains(&p) {
        Ok(p)
    } else {
        Err(BadProbability(p))
    }
}

/// Which faults to inject, with what probability each (0.0–1.0).
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Seed of the generator that decides every fault.
    pub seed: u64,
    /// Probability that a message is lost.
    pub loss: f64,
    /// Probability that a message is delivered twice.
    pub duplicate: f64,
    /// Probability that a message is held back and delivered after the next
    /// one (or when the link goes idle).
    pub reorder: f64,
    /// Probability that one bit of the encoded message is flipped. A flip
    /// that makes the header invalid drops the message and counts it as
    /// malformed; any other flip delivers the altered message.
    pub corrupt: f64,
    /// Probability that a message is delayed.
    pub delay: f64,
    /// Range of the added delay, drawn uniformly.
    pub delay_range: (Duration, Duration),
}

impl FaultConfig {
    /// No faults, with generator seed `seed`: set the fields to add some.
    pub const fn new(seed: u64) -> Self {
        FaultConfig {
            seed,
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: 0.0,
            delay_range: (Duration::ZERO, Duration::ZERO),
        }
    }

    /// The rates a [`FaultDecider`] draws from.
    pub fn rates(&self) -> FaultRates {
        FaultRates {
            loss: self.loss,
            corrupt: self.corrupt,
            delay: self.delay,
            delay_range: self.delay_range,
            reorder: self.reorder,
            duplicate: self.duplicate,
        }
    }
}

/// What the injector did, message by message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FaultStats {
    /// Messages received from the wrapped link.
    pub received: u64,
    /// Messages handed to the user (duplicates included).
    pub delivered: u64,
    /// Messages dropped on purpose.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Messages held back behind a later one.
    pub reordered: u64,
    /// Messages with a flipped bit.
    pub corrupted: u64,
    /// Corrupted messages whose header no longer decoded, dropped.
    pub malformed: u64,
    /// Messages delayed.
    pub delayed: u64,
}

#[cfg(feature = "tokio")]
pub use injector::FaultInjector;

/// The link wrapper: needs tokio's timer for delayed messages.
#[cfg(feature = "tokio")]
mod injector {
    use super::*;
    use std::cmp::Reverse;
    use std::collections::{BinaryHeap, VecDeque};
    use std::future::Future;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use bytes::{Bytes, BytesMut};
    use futures_core::Stream;
    use futures_sink::Sink;
    use tokio::time::{Instant, Sleep};

    use crate::link::{Link, LinkError};
    use crate::Message;

    struct Delayed {
        due: Instant,
        order: u64,
        message: Message,
    }

    impl PartialEq for Delayed {
        fn eq(&self, other: &Self) -> bool {
            (self.due, self.order) == (other.due, other.order)
        }
    }
    impl Eq for Delayed {}
    impl PartialOrd for Delayed {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Delayed {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            (self.due, self.order).cmp(&(other.due, other.order))
        }
    }

    /// A [`Link`] that impairs what `L` receives.
    pub struct FaultInjector<L> {
        inner: L,
        decider: FaultDecider,
        stats: FaultStats,
        /// Messages to deliver before reading the wrapped link again
        /// (duplicates, released held messages).
        ready: VecDeque<Message>,
        /// A message held back to be delivered after the next one.
        held: Option<Message>,
        /// Delayed messages, earliest first.
        delayed: BinaryHeap<Reverse<Delayed>>,
        delayed_order: u64,
        timer: Option<Pin<Box<Sleep>>>,
        inner_done: bool,
    }

    impl<L: Link> FaultInjector<L> {
        /// Wraps `inner`, impairing what it receives as `config` says.
        pub fn new(inner: L, config: FaultConfig) -> Self {
            FaultInjector {
                inner,
                decider: FaultDecider::new(config.rates(), config.seed),
                stats: FaultStats::default(),
                ready: VecDeque::new(),
                held: None,
                delayed: BinaryHeap::new(),
                delayed_order: 0,
                timer: None,
                inner_done: false,
            }
        }

        /// Counters of what was done so far.
        pub fn stats(&self) -> FaultStats {
            self.stats
        }

        /// The wrapped link.
        pub fn get_ref(&self) -> &L {
            &self.inner
        }

        /// The wrapped link, mutably.
        pub fn get_mut(&mut self) -> &mut L {
            &mut self.inner
        }

        /// The message with bit `bit` of its encoding flipped; `None` when
        /// the result no longer decodes.
        fn corrupt(message: &Message, bit: usize) -> Option<Message> {
            let mut buf = BytesMut::with_capacity(message.encoded_len());
            message.encode(&mut buf);
            flip_bit(&mut buf, bit);
            let bytes: Bytes = buf.freeze();
            Message::decode(&bytes).ok().map(|(m, _)| m)
        }

        fn deliver(&mut self, m: Message) -> Poll<Option<Result<Message, LinkError>>> {
            self.stats.delivered += 1;
            Poll::Ready(Some(Ok(m)))
        }

        /// Carries out the decider's faults on a freshly received message;
        /// `Some` to deliver now.
        fn impair(&mut self, mut m: Message) -> Option<Message> {
            self.stats.received += 1;
            let fate = self.decider.decide(m.encoded_len());
            if fate.lost {
                self.stats.lost += 1;
                return None;
            }
            if let Some(bit) = fate.flip_bit {
                self.stats.corrupted += 1;
                match Self::corrupt(&m, bit) {
                    Some(altered) => m = altered,
                    None => {
                        self.stats.malformed += 1;
                        return None;
                    }
                }
            }
            if fate.duplicate {
                self.stats.duplicated += 1;
                self.ready.push_back(m.clone());
            }
            if let Some(extra) = fate.delay {
                self.stats.delayed += 1;
                self.delayed_order += 1;
                self.delayed.push(Reverse(Delayed {
                    due: Instant::now() + extra,
                    order: self.delayed_order,
                    message: m,
                }));
                return None;
            }
            if fate.reorder && self.held.is_none() {
                self.stats.reordered += 1;
                self.held = Some(m);
                return None;
            }
            Some(m)
        }

        /// A delayed message whose time has come, or a registered timer.
        fn poll_delayed(&mut self, cx: &mut Context<'_>) -> Option<Message> {
            let due = self.delayed.peek()?.0.due;
            if due <= Instant::now() {
                self.timer = None;
                return self.delayed.pop().map(|Reverse(d)| d.message);
            }
            let timer = self
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
            if timer.deadline() != due {
                timer.as_mut().reset(due);
            }
            if timer.as_mut().poll(cx).is_ready() {
                self.timer = None;
                return self.delayed.pop().map(|Reverse(d)| d.message);
            }
            None
        }
    }

    impl<L: Link> Stream for FaultInjector<L> {
        type Item = Result<Message, LinkError>;

        fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
            let this = self.get_mut();
            loop {
                if let Some(m) = this.ready.pop_front() {
                    return this.deliver(m);
                }
                if let Some(m) = this.poll_delayed(cx) {
                    return this.deliver(m);
                }
                if this.inner_done {
                    if let Some(m) = this.held.take() {
                        return this.deliver(m);
                    }
                    return if this.delayed.is_empty() {
                        Poll::Ready(None)
                    } else {
                        Poll::Pending
                    };
                }
                match Pin::new(&mut this.inner).poll_next(cx) {
                    Poll::Ready(Some(Ok(m))) => {
                        if let Some(m) = this.impair(m) {
                            // A held message goes out right after this one.
                            if let Some(h) = this.held.take() {
                                this.ready.push_back(h);
                            }
                            return this.deliver(m);
                        }
                    }
                    Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                    Poll::Ready(None) => this.inner_done = true,
                    Poll::Pending => {
                        // Idle: a held message must not wait forever.
                        if let Some(m) = this.held.take() {
                            return this.deliver(m);
                        }
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    impl<L: Link> Sink<Message> for FaultInjector<L> {
        type Error = LinkError;

        fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
            Pin::new(&mut self.get_mut().inner).poll_ready(cx)
        }

        fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
            Pin::new(&mut self.get_mut().inner).start_send(item)
        }

        fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
            Pin::new(&mut self.get_mut().inner).poll_flush(cx)
        }

        fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
            Pin::new(&mut self.get_mut().inner).poll_close(cx)
        }
    }

    impl<L: Link> Link for FaultInjector<L> {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{channel, Message, Uid};
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;
    use std::time::Duration;
    use tokio::time::Instant;

    fn msg(i: u32) -> Message {
        let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
        let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
        let mut m = Message::send(a, b, Bytes::from(vec![i as u8; 16])).unwrap();
        m.set_seqnum(i);
        m
    }

    /// Sends `n` messages through an impaired link and returns what came out.
    async fn run(config: FaultConfig, n: u32) -> (Vec<u32>, FaultStats) {
        let (mut a, b) = channel::pair(n as usize + 1);
        let mut rx = FaultInjector::new(b, config);
        for i in 0..n {
            a.feed(msg(i)).await.unwrap();
        }
        a.flush().await.unwrap();
        drop(a);
        let mut got = Vec::new();
        while let Some(m) = rx.next().await {
            got.push(m.unwrap().header().seqnum);
        }
        (got, rx.stats())
    }

    #[tokio::test]
    async fn no_faults_passes_everything_in_order() {
        let (got, stats) = run(FaultConfig::new(1), 100).await;
        assert_eq!(got, (0..100).collect::<Vec<_>>());
        assert_eq!(stats.delivered, 100);
    }

    #[tokio::test]
    async fn loss_drops_about_the_configured_share() {
        let cfg = FaultConfig {
            loss: 0.2,
            ..FaultConfig::new(7)
        };
        let (got, stats) = run(cfg, 5000).await;
        assert_eq!(got.len() as u64 + stats.lost, 5000);
        assert!((800..1200).contains(&stats.lost), "{stats:?}");
        assert!(got.windows(2).all(|w| w[0] < w[1]));
    }

    #[tokio::test]
    async fn the_same_seed_gives_the_same_faults() {
        let cfg = FaultConfig {
            loss: 0.1,
            duplicate: 0.1,
            reorder: 0.1,
            corrupt: 0.05,
            ..FaultConfig::new(99)
        };
        let first = run(cfg.clone(), 1000).await;
        let second = run(cfg, 1000).await;
        assert_eq!(first, second);
        assert!(first.1.lost > 0 && first.1.duplicated > 0 && first.1.reordered > 0);
    }

    #[tokio::test]
    async fn duplication_delivers_copies() {
        let cfg = FaultConfig {
            duplicate: 1.0,
            ..FaultConfig::new(3)
        };
        let (got, _) = run(cfg, 3).await;
        assert_eq!(got, vec![0, 0, 1, 1, 2, 2]);
    }

    #[tokio::test]
    async fn reordering_swaps_neighbours_and_loses_nothing() {
        let cfg = FaultConfig {
            reorder: 0.3,
            ..FaultConfig::new(5)
        };
        let (mut got, stats) = run(cfg, 1000).await;
        assert!(stats.reordered > 0);
        assert!(got.windows(2).any(|w| w[0] > w[1]));
        got.sort_unstable();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn corruption_is_counted_and_never_panics() {
        let cfg = FaultConfig {
            corrupt: 1.0,
            ..FaultConfig::new(11)
        };
        let (got, stats) = run(cfg, 2000).await;
        assert_eq!(stats.corrupted, 2000);
        assert_eq!(got.len() as u64 + stats.malformed, 2000);
        assert!(stats.malformed > 0);
    }

    #[test]
    fn a_decider_that_only_loses_draws_once_per_packet() {
        let rates = FaultRates {
            loss: 0.3,
            ..FaultRates::default()
        };
        let mut decider = FaultDecider::new(rates, 5);
        let mut rng = SplitMix64::new(5);
        for len in 0..1000 {
            assert_eq!(decider.decide(len).lost, rng.chance(0.3));
        }
    }

    #[test]
    fn a_lost_packet_has_no_other_fault_and_a_bit_stays_inside_it() {
        let rates = FaultRates {
            loss: 0.5,
            corrupt: 1.0,
            delay: 1.0,
            delay_range: (Duration::from_millis(1), Duration::from_millis(2)),
            reorder: 1.0,
            duplicate: 1.0,
        };
        let mut decider = FaultDecider::new(rates, 9);
        for _ in 0..1000 {
            let d = decider.decide(3);
            if d.lost {
                assert_eq!(
                    d,
                    FaultDecision {
                        lost: true,
                        ..FaultDecision::default()
                    }
                );
            } else {
                assert!(d.flip_bit.is_some_and(|b| b < 24));
                assert!(d
                    .delay
                    .is_some_and(|t| t >= rates.delay_range.0 && t <= rates.delay_range.1));
                assert!(d.reorder && d.duplicate);
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn delay_holds_messages_until_their_time() {
        let cfg = FaultConfig {
            delay: 1.0,
            delay_range: (Duration::from_millis(10), Duration::from_millis(10)),
            ..FaultConfig::new(2)
        };
        let (mut a, b) = channel::pair(4);
        let mut rx = FaultInjector::new(b, cfg);
        let start = Instant::now();
        a.send(msg(1)).await.unwrap();
        let m = rx.next().await.unwrap().unwrap();
        assert_eq!(m.header().seqnum, 1);
        assert!(start.elapsed() >= Duration::from_millis(10));
        assert_eq!(rx.stats().delayed, 1);
    }
}
