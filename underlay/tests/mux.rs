//! The interface multiplexer as a specification, on virtual time: shares,
//! priorities, policy switches, shaping, backpressure and order.

use bytes::Bytes;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::{Message, SplitMix64, Uid};
use uniplane_underlay::{
    FilterRules, InterfaceMux, MuxConfig, Nanos, OfferError, Reason, ShaperConfig, TypeSet,
    UidMatch, NANOS_PER_SEC,
};

/// The source UID of queue `q`'s messages, so a dequeued message tells
/// which queue it came from.
fn source(q: usize) -> Uid {
    Uid::new([10, 0, 0, q as u8 + 1].into(), 1)
}

fn queue_of(msg: &Message) -> usize {
    usize::from(msg.header().src.server().octets()[3]) - 1
}

/// A SEND from queue `q` with sequence number `seq` and `len` payload bytes.
fn message(payload: &Bytes, q: usize, seq: u32, len: usize) -> Message {
    let dst = Uid::new([10, 0, 1, 1].into(), 2);
    let mut m = Message::send(source(q).port(7), dst.port(9), payload.slice(..len))
        .expect("a valid message");
    m.set_seqnum(seq);
    m
}

/// Feeds every queue until it pushes back, with sizes from `sizes(q)`,
/// numbering each queue's messages from `next[q]`.
struct Feeder {
    payload: Bytes,
    next: Vec<u32>,
    rng: SplitMix64,
    /// Payload sizes per queue: (smallest, largest).
    sizes: Vec<(usize, usize)>,
    /// A message given back by a full queue, offered again first.
    held: Vec<Option<Message>>,
}

impl Feeder {
    fn new(sizes: Vec<(usize, usize)>) -> Self {
        Feeder {
            payload: Bytes::from(vec![0xa5u8; 9000]),
            next: vec![0; sizes.len()],
            rng: SplitMix64::new(7),
            held: vec![None; sizes.len()],
            sizes,
        }
    }

    fn make(&mut self, q: usize) -> Message {
        let (lo, hi) = self.sizes[q];
        let len = lo + self.rng.below((hi - lo + 1) as u64) as usize;
        let m = message(&self.payload, q, self.next[q], len);
        self.next[q] += 1;
        m
    }

    /// Offers to queue `q` until it is full; returns how many were taken.
    fn fill(&mut self, mux: &mut InterfaceMux, q: usize, now: Nanos) -> usize {
        let mut taken = 0;
        loop {
            let m = match self.held[q].take() {
                Some(m) => m,
                None => self.make(q),
            };
            match mux.offer(q, m, now) {
                Ok(()) => taken += 1,
                Err(OfferError::Full(m)) => {
                    self.held[q] = Some(m);
                    return taken;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
    }

    fn fill_all(&mut self, mux: &mut InterfaceMux, now: Nanos) {
        for q in 0..self.sizes.len() {
            self.fill(mux, q, now);
        }
    }
}

/// Byte shares of the queues, from the mux's own counters.
fn shares(mux: &InterfaceMux) -> Vec<f64> {
    let bytes: Vec<u64> = mux
        .queue_counters()
        .iter()
        .map(|c| c.dequeued_bytes)
        .collect();
    let total: u64 = bytes.iter().sum();
    bytes.iter().map(|&b| b as f64 / total as f64).collect()
}

fn assert_within_one_percent(got: &[f64], want: &[f64]) {
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() / w < 0.01, "got {got:?}, want {want:?}");
    }
}

/// Drives `mux` on virtual time the way an engine does: sleep until
/// `next_ready`, dequeue a burst of up to 8, refill every queue, until
/// `messages` were sent. Returns the time reached.
fn run(
    mux: &mut InterfaceMux,
    feeder: &mut Feeder,
    mut now: Nanos,
    messages: usize,
    mut each: impl FnMut(&Message, Nanos),
) -> Nanos {
    let mut sent = 0;
    feeder.fill_all(mux, now);
    while sent < messages {
        now = mux.next_ready(now).expect("backlogged");
        for _ in 0..8.min(messages - sent) {
            let Some(m) = mux.dequeue(now) else { break };
            each(&m, now);
            sent += 1;
        }
        feeder.fill_all(mux, now);
    }
    now
}

#[test]
fn weighted_byte_shares_match_the_weights_within_one_percent_with_mixed_sizes() {
    let mut mux = InterfaceMux::new(MuxConfig {
        policy: Policy::Weighted(vec![1, 2, 5]),
        ..MuxConfig::new(3, 64)
    })
    .unwrap();
    // Overlapping random sizes, a different mix per queue.
    let mut feeder = Feeder::new(vec![(0, 1500), (64, 256), (500, 9000)]);
    run(&mut mux, &mut feeder, 0, 300_000, |_, _| {});
    assert_within_one_percent(&shares(&mux), &[1.0 / 8.0, 2.0 / 8.0, 5.0 / 8.0]);
}

#[test]
fn weighted_shares_hold_while_the_shaper_sets_the_pace() {
    let mut mux = InterfaceMux::new(MuxConfig {
        policy: Policy::Weighted(vec![3, 1]),
        shaper: Some(ShaperConfig::bits_per_sec(10_000_000_000, 16 * 1024)),
        ..MuxConfig::new(2, 32)
    })
    .unwrap();
    let mut feeder = Feeder::new(vec![(0, 4000), (0, 1500)]);
    run(&mut mux, &mut feeder, 0, 200_000, |_, _| {});
    assert_within_one_percent(&shares(&mux), &[0.75, 0.25]);
}

#[test]
fn round_robin_shares_messages_equally() {
    let mut mux = InterfaceMux::new(MuxConfig::new(3, 16)).unwrap();
    let mut feeder = Feeder::new(vec![(0, 10), (1000, 2000), (100, 100)]);
    run(&mut mux, &mut feeder, 0, 30_000, |_, _| {});
    let counts: Vec<u64> = mux.queue_counters().iter().map(|c| c.dequeued).collect();
    assert!(
        counts.iter().all(|&c| c.abs_diff(10_000) <= 1),
        "{counts:?}"
    );
}

#[test]
fn strict_priority_starves_lower_classes_while_higher_ones_are_backlogged() {
    let mut mux = InterfaceMux::new(MuxConfig {
        policy: Policy::StrictPriority {
            class: vec![1, 0, 0, 2],
            weights: vec![1, 1, 3, 1],
        },
        shaper: Some(ShaperConfig::new(1_000_000_000, 4096)),
        ..MuxConfig::new(4, 32)
    })
    .unwrap();
    let mut feeder = Feeder::new(vec![(100, 100); 4]);
    let now = run(&mut mux, &mut feeder, 0, 50_000, |m, _| {
        assert!(
            queue_of(m) == 1 || queue_of(m) == 2,
            "a lower class was served"
        );
    });
    let c = mux.queue_counters();
    assert_eq!((c[0].dequeued, c[3].dequeued), (0, 0));
    let share = c[2].dequeued_bytes as f64 / (c[1].dequeued_bytes + c[2].dequeued_bytes) as f64;
    assert!(
        (share - 0.75).abs() < 0.01,
        "inside class 0 by weight: {share}"
    );

    // Once class 0 runs dry, class 1 goes before class 2.
    let mut order = Vec::new();
    let mut now = now;
    while let Some(t) = mux.next_ready(now) {
        now = t;
        while let Some(m) = mux.dequeue(now) {
            order.push(queue_of(&m));
        }
    }
    let first_low = order.iter().position(|&q| q == 0).unwrap();
    let first_lowest = order.iter().position(|&q| q == 3).unwrap();
    assert!(order[..first_low].iter().all(|&q| q == 1 || q == 2));
    assert!(order[..first_lowest].iter().all(|&q| q != 3));
    assert!(order[first_lowest..].iter().all(|&q| q == 3));
}

#[test]
fn switching_policy_mid_flight_loses_and_reorders_nothing() {
    let mut mux = InterfaceMux::new(MuxConfig {
        shaper: Some(ShaperConfig::new(500_000_000, 3000)),
        ..MuxConfig::new(3, 8)
    })
    .unwrap();
    let policies = [
        Policy::Weighted(vec![1, 2, 3]),
        Policy::StrictPriority {
            class: vec![2, 0, 1],
            weights: vec![1, 1, 1],
        },
        Policy::RoundRobin,
        Policy::StrictPriority {
            class: vec![0, 0, 1],
            weights: vec![5, 1, 1],
        },
    ];
    let mut feeder = Feeder::new(vec![(0, 1500), (0, 300), (1000, 3000)]);
    let mut next_seq = [0u32; 3];
    let mut now = 0;
    let mut switches = 0;
    for round in 0..20_000 {
        if round % 97 == 0 {
            // Often while the shaper holds a picked message.
            mux.set_policy(policies[switches % policies.len()].clone())
                .unwrap();
            switches += 1;
        }
        // Offer only some rounds, so queues run dry and fill up again.
        if round % 5 != 0 {
            feeder.fill_all(&mut mux, now);
        }
        now = match mux.next_ready(now) {
            Some(t) => t,
            None => now + 1000,
        };
        if let Some(m) = mux.dequeue(now) {
            let q = queue_of(&m);
            assert_eq!(m.header().seqnum, next_seq[q], "queue {q} out of order");
            next_seq[q] += 1;
        }
    }
    // Drain: everything that was taken comes out, in order.
    while let Some(t) = mux.next_ready(now) {
        now = t;
        while let Some(m) = mux.dequeue(now) {
            let q = queue_of(&m);
            assert_eq!(m.header().seqnum, next_seq[q], "queue {q} out of order");
            next_seq[q] += 1;
        }
    }
    for (q, c) in mux.queue_counters().iter().enumerate() {
        assert_eq!(c.enqueued, c.dequeued, "queue {q} lost messages");
        assert_eq!(u64::from(next_seq[q]), c.enqueued);
    }
    assert!(switches > 100);
}

const GBIT: u64 = 1_000_000_000 / 8;

#[test]
fn the_shaper_holds_the_rate_within_one_percent_over_a_long_run() {
    let rate = 10 * GBIT;
    let mut mux = InterfaceMux::new(MuxConfig {
        shaper: Some(ShaperConfig::new(rate, 16 * 1024).with_overhead(24)),
        ..MuxConfig::new(2, 64)
    })
    .unwrap();
    let mut feeder = Feeder::new(vec![(0, 1500), (0, 9000)]);
    // Skip the initial burst, then measure over a long stretch.
    let t0 = run(&mut mux, &mut feeder, 0, 1000, |_, _| {});
    let b0 = mux.wire_counters().shaped_bytes;
    let t1 = run(&mut mux, &mut feeder, t0, 500_000, |_, _| {});
    let bytes = mux.wire_counters().shaped_bytes - b0;
    let measured = bytes as f64 * NANOS_PER_SEC as f64 / (t1 - t0) as f64;
    assert!(
        (measured / rate as f64 - 1.0).abs() < 0.01,
        "{measured} B/s against {rate}"
    );
    // Charged bytes include the per-frame overhead.
    let w = mux.wire_counters();
    assert_eq!(w.shaped_bytes, w.bytes + 24 * w.messages);
}

#[test]
fn the_shaper_honours_the_burst_and_never_runs_ahead_of_the_rate() {
    let (rate, burst) = (GBIT, 10_000);
    let mut mux = InterfaceMux::new(MuxConfig {
        shaper: Some(ShaperConfig::new(rate, burst)),
        ..MuxConfig::new(1, 256)
    })
    .unwrap();
    let mut feeder = Feeder::new(vec![(0, 1400)]);
    feeder.fill_all(&mut mux, 0);

    // A full bucket: at one instant, at most the burst leaves.
    let mut at_once = 0;
    while let Some(m) = mux.dequeue(0) {
        at_once += m.encoded_len() as u64;
    }
    assert!(at_once <= burst && at_once > burst - 1432, "{at_once}");

    // From then on the bytes sent by any time t never exceed
    // burst + rate * t (plus under a nanosecond of rounding).
    let mut sent = at_once;
    run(&mut mux, &mut feeder, 0, 100_000, |m, now| {
        sent += m.encoded_len() as u64;
        let allowed = burst as u128 + (rate as u128 * now as u128).div_ceil(NANOS_PER_SEC as u128);
        assert!(
            u128::from(sent) <= allowed + 1,
            "{sent} > {allowed} at {now}"
        );
    });

    // An idle spell refills only up to the burst.
    let mut mux = InterfaceMux::new(MuxConfig {
        shaper: Some(ShaperConfig::new(rate, burst)),
        ..MuxConfig::new(1, 256)
    })
    .unwrap();
    let later = 10 * NANOS_PER_SEC;
    feeder.fill_all(&mut mux, later);
    let mut after_idle = 0;
    while let Some(m) = mux.dequeue(later) {
        after_idle += m.encoded_len() as u64;
    }
    assert!(after_idle <= burst, "{after_idle}");
}

#[test]
fn a_backlogged_shaped_interface_stays_above_95_percent_utilization_on_a_coarse_timer() {
    let rate = 25 * GBIT;
    let mut mux = InterfaceMux::new(MuxConfig {
        policy: Policy::Weighted(vec![1, 1, 1]),
        shaper: Some(ShaperConfig::new(rate, 64 * 1024)),
        ..MuxConfig::new(3, 128)
    })
    .unwrap();
    let mut feeder = Feeder::new(vec![(0, 64), (0, 1500), (0, 9000)]);
    // The driver's timer fires on whole microseconds only, late by up to
    // one, and moves bursts of at most 32 messages.
    let (mut now, mut burst_buf) = (0, Vec::with_capacity(32));
    let end = NANOS_PER_SEC / 10;
    feeder.fill_all(&mut mux, now);
    while now < end {
        if let Some(t) = mux.next_ready(now) {
            now = t.div_ceil(1000) * 1000;
        }
        burst_buf.clear();
        mux.dequeue_burst(now, &mut burst_buf, 32);
        feeder.fill_all(&mut mux, now);
    }
    let w = mux.wire_counters();
    let utilization = w.shaped_bytes as f64 / (rate as f64 * now as f64 / NANOS_PER_SEC as f64);
    assert!(utilization >= 0.95, "{utilization}");
    assert!(utilization <= 1.01, "{utilization}");
    assert!(w.throttled_ns > 0 && w.throttled_ns <= now, "{w:?}");
}

#[test]
fn an_unshaped_interface_is_ready_whenever_it_has_a_message() {
    let mut mux = InterfaceMux::new(MuxConfig::new(2, 4)).unwrap();
    assert_eq!(mux.next_ready(5), None);
    let mut feeder = Feeder::new(vec![(1, 1), (1, 1)]);
    feeder.fill(&mut mux, 1, 5);
    assert_eq!(mux.next_ready(5), Some(5));
    assert_eq!(mux.wire_counters().throttled_ns, 0);
}

#[test]
fn a_full_queue_gives_the_message_back_untouched() {
    let mut mux = InterfaceMux::new(MuxConfig::new(2, 4)).unwrap();
    let payload = Bytes::from_static(b"0123456789");
    for seq in 0..4 {
        mux.offer(0, message(&payload, 0, seq, 10), 0).unwrap();
    }
    let extra = message(&payload, 0, 4, 10);
    let Err(OfferError::Full(back)) = mux.offer(0, extra.clone(), 0) else {
        panic!("a full queue must push back");
    };
    assert_eq!(back, extra);
    // The payload is the same buffer, not a copy.
    assert_eq!(back.payload().as_ptr(), payload.as_ptr());
    assert_eq!(mux.queue_counters()[0].backpressured, 1);
    assert_eq!(mux.free(0), 0);
    // The other queue is not affected, and one dequeue makes room.
    mux.offer(1, message(&payload, 1, 0, 1), 0).unwrap();
    assert!(mux.dequeue(0).is_some());
    mux.offer(0, back, 0).unwrap();
}

#[test]
fn a_queue_bounded_in_bytes_pushes_back_on_bytes() {
    let mut mux = InterfaceMux::new(MuxConfig {
        queue_max_bytes: 1000,
        ..MuxConfig::new(1, 100)
    })
    .unwrap();
    let payload = Bytes::from(vec![0u8; 2000]);
    // An empty queue takes a message larger than the bound.
    mux.offer(0, message(&payload, 0, 0, 1500), 0).unwrap();
    assert!(matches!(
        mux.offer(0, message(&payload, 0, 1, 0), 0),
        Err(OfferError::Full(_))
    ));
    mux.dequeue(0).unwrap();
    for seq in 1..=31 {
        mux.offer(0, message(&payload, 0, seq, 0), 0).unwrap();
    }
    assert_eq!(mux.queue_bytes(0), 31 * 32);
    assert!(mux.offer(0, message(&payload, 0, 32, 9), 0).is_err());
}

#[test]
fn under_congestion_nothing_is_dropped_and_every_queue_stays_in_order() {
    let mut mux = InterfaceMux::new(MuxConfig {
        policy: Policy::Weighted(vec![1, 4, 2, 1]),
        shaper: Some(ShaperConfig::new(GBIT, 4096)),
        ..MuxConfig::new(4, 3)
    })
    .unwrap();
    let payload = Bytes::from(vec![7u8; 1500]);
    let mut rng = SplitMix64::new(99);
    let mut made = [0u32; 4];
    let mut got = [0u32; 4];
    let mut held: Vec<Option<Message>> = vec![None; 4];
    let mut now = 0;
    // Stacks offer in random bursts far faster than the interface drains.
    for _ in 0..100_000 {
        let q = rng.below(4) as usize;
        let m = held[q].take().unwrap_or_else(|| {
            made[q] += 1;
            message(&payload, q, made[q] - 1, rng.below(1500) as usize)
        });
        match mux.offer(q, m, now) {
            Ok(()) => {}
            Err(OfferError::Full(m)) => held[q] = Some(m),
            Err(e) => panic!("{e}"),
        }
        now += 300;
        while let Some(m) = mux.dequeue(now) {
            let q = queue_of(&m);
            assert_eq!(m.header().seqnum, got[q]);
            got[q] += 1;
        }
    }
    while let Some(t) = mux.next_ready(now) {
        now = t;
        let m = mux.dequeue(now).unwrap();
        let q = queue_of(&m);
        assert_eq!(m.header().seqnum, got[q]);
        got[q] += 1;
    }
    for q in 0..4 {
        let pending = u32::from(held[q].is_some());
        assert_eq!(got[q] + pending, made[q], "queue {q}");
        let c = mux.queue_counters()[q];
        assert!(c.backpressured > 0);
        assert_eq!(c.denied, 0);
    }
}

#[test]
fn the_filter_drops_before_queueing_and_reports_the_queue() {
    let mut mux = InterfaceMux::new(MuxConfig {
        rules: FilterRules {
            sources: vec![UidMatch::exact(source(0))],
            ..FilterRules::allow_all()
        },
        event_capacity: 1,
        ..MuxConfig::new(2, 4)
    })
    .unwrap();
    let payload = Bytes::from_static(b"x");
    mux.offer(0, message(&payload, 0, 0, 1), 10).unwrap();
    for _ in 0..3 {
        let err = mux.offer(1, message(&payload, 1, 0, 1), 20).unwrap_err();
        assert!(matches!(err, OfferError::Denied(v) if v.reason() == Reason::SourceDenied));
        assert!(err.into_message().is_none());
    }
    assert_eq!(mux.queue_len(1), 0);
    assert_eq!(mux.queue_counters()[1].denied, 3);
    assert_eq!(mux.filter_counters().source_denied, 3);
    assert_eq!(mux.filter_counters().lost_events, 2);
    let event = mux.pop_event().unwrap();
    assert_eq!((event.input, event.at, event.src), (1, 20, source(1)));
    assert_eq!(mux.drain_events().count(), 0);

    // New rules apply from the next offer.
    mux.set_rules(FilterRules {
        types: TypeSet::EMPTY,
        ..FilterRules::allow_all()
    });
    assert!(matches!(
        mux.offer(0, message(&payload, 0, 1, 1), 30),
        Err(OfferError::Denied(v)) if v.reason() == Reason::TypeDenied
    ));
    assert_eq!(mux.queue_len(0), 1, "already queued messages stay");
}

#[test]
fn an_offer_to_a_missing_queue_gives_the_message_back() {
    let mut mux = InterfaceMux::new(MuxConfig::new(1, 1)).unwrap();
    let m = message(&Bytes::from_static(b"x"), 0, 0, 1);
    let err = mux.offer(5, m.clone(), 0).unwrap_err();
    assert_eq!(err.into_message(), Some(m));
    assert_eq!(mux.free(5), 0);
}

#[test]
fn the_shaper_can_be_changed_and_removed_at_run_time() {
    let mut mux = InterfaceMux::new(MuxConfig::new(1, 64)).unwrap();
    let mut feeder = Feeder::new(vec![(1000, 1000)]);
    feeder.fill_all(&mut mux, 0);
    mux.set_shaper(Some(ShaperConfig::new(GBIT, 0)), 0).unwrap();
    assert!(mux.dequeue(0).is_some());
    let t = mux.next_ready(0).unwrap();
    assert_eq!(t, 1032 * 8, "1032 bytes at 1 Gb/s");
    mux.set_shaper(Some(ShaperConfig::new(2 * GBIT, 0)), 0)
        .unwrap();
    assert_eq!(mux.next_ready(0).unwrap(), 1032 * 4);
    mux.set_shaper(None, 0).unwrap();
    assert_eq!(mux.next_ready(0), Some(0));
    assert!(mux.dequeue(0).is_some());
    let w = mux.wire_counters();
    assert_eq!((w.messages, w.shaped_bytes), (2, 1032));
    assert!(mux.set_shaper(Some(ShaperConfig::new(0, 1)), 0).is_err());
}

#[test]
fn bad_configurations_are_refused() {
    assert!(InterfaceMux::new(MuxConfig::new(0, 1)).is_err());
    assert!(InterfaceMux::new(MuxConfig::new(1, 0)).is_err());
    assert!(InterfaceMux::new(MuxConfig {
        policy: Policy::Weighted(vec![1]),
        ..MuxConfig::new(2, 1)
    })
    .is_err());
    assert!(InterfaceMux::new(MuxConfig {
        shaper: Some(ShaperConfig::new(0, 0)),
        ..MuxConfig::new(2, 1)
    })
    .is_err());
}
