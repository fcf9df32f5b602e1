//! The sans-IO LTL endpoint on a virtual clock, over seeded impaired
//! paths: exactly-once in-order delivery under loss, duplication,
//! reordering and corruption; loss repair without the retransmission timer
//! (NACKs, repeated NACKs, tail-loss probes) and the goodput it keeps;
//! credit that stops a sender instead of losing; failure detection; setup
//! and teardown. Deterministic and fast: no sockets, no sleeping.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{ltl_frame as frame, msg};
use uniplane_stacks::datagram::fault::{DatagramFaults, FaultyPath};
use uniplane_stacks::ltl::wire::{Frame, Kind, SACK_LEN};
use uniplane_stacks::ltl::{ConnError, ConnId, Event, LtlConfig, LtlEndpoint, Recv, SendError};

/// Two endpoints (addresses 1 and 2) joined by two impaired paths.
struct Sim {
    a: LtlEndpoint<u8>,
    b: LtlEndpoint<u8>,
    ab: FaultyPath,
    ba: FaultyPath,
    now: Instant,
    start: Instant,
    buf: BytesMut,
    /// When false, B neither receives nor sends: it is dead.
    b_alive: bool,
    /// The endpoints run only at multiples of this (zero: at every
    /// event), as drivers that wake up and take whole bursts.
    tick: Duration,
    /// With a bottleneck on A→B: A only sends while the bottleneck's
    /// backlog is at most this, so the sender's own pace is the limit
    /// (none: A pushes everything at once).
    nic_queue: Option<Duration>,
    /// Datagrams A→B (then B→A) for which this says true are lost.
    drop_ab: Option<Filter>,
    drop_ba: Option<Filter>,
}

/// Picks datagrams to lose by what they are.
type Filter = Box<dyn FnMut(&Frame<&[u8]>) -> bool>;

fn dropped(filter: &mut Option<Filter>, datagram: &[u8]) -> bool {
    let frame = Frame::new_checked(datagram).expect("endpoints send valid frames");
    filter.as_mut().is_some_and(|f| f(&frame))
}

impl Sim {
    fn new(config: LtlConfig, faults: DatagramFaults) -> Sim {
        let back = DatagramFaults {
            seed: faults.seed.wrapping_mul(31).wrapping_add(7),
            ..faults.clone()
        };
        Sim::with_paths(config, faults, back)
    }

    /// A→B impaired as `faults`, B→A as `back`.
    fn with_paths(config: LtlConfig, faults: DatagramFaults, back: DatagramFaults) -> Sim {
        let seed = faults.seed;
        let mut b = LtlEndpoint::new(config.clone(), seed ^ 0xb);
        b.set_listening(true);
        let now = Instant::now();
        Sim {
            a: LtlEndpoint::new(config, seed ^ 0xa),
            b,
            ab: FaultyPath::new(faults),
            ba: FaultyPath::new(back),
            now,
            start: now,
            buf: BytesMut::new(),
            b_alive: true,
            tick: Duration::ZERO,
            nic_queue: None,
            drop_ab: None,
            drop_ba: None,
        }
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Moves every datagram due now; returns whether anything moved.
    fn exchange(&mut self) -> bool {
        let mut moved = false;
        loop {
            if self
                .nic_queue
                .is_some_and(|q| self.ab.queueing_delay(self.now) > q)
            {
                break;
            }
            self.buf.clear();
            let Some(to) = self.a.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            assert_eq!(to, 2);
            moved = true;
            if dropped(&mut self.drop_ab, &self.buf) {
                continue;
            }
            self.ab.push(self.buf.split().freeze(), self.now);
        }
        while self.b_alive {
            self.buf.clear();
            let Some(to) = self.b.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            assert_eq!(to, 1);
            moved = true;
            if dropped(&mut self.drop_ba, &self.buf) {
                continue;
            }
            self.ba.push(self.buf.split().freeze(), self.now);
        }
        while let Some(d) = self.ab.pop_due(self.now) {
            if self.b_alive {
                // B takes its datagrams as Bytes (payloads kept as slices),
                // A as byte slices (payloads copied): both paths are run.
                self.b.handle_datagram_bytes(1, &d, self.now);
            }
            moved = true;
        }
        while let Some(d) = self.ba.pop_due(self.now) {
            self.a.handle_datagram(2, &d, self.now);
            moved = true;
        }
        moved
    }

    /// Exchanges until quiet, then jumps the clock to the next deadline.
    /// Returns false when nothing is left to happen.
    fn step(&mut self) -> bool {
        if self.exchange() {
            return true;
        }
        let nic = self
            .nic_queue
            .filter(|&q| self.ab.queueing_delay(self.now) > q)
            .map(|q| self.now + self.ab.queueing_delay(self.now) - q);
        let mut next = [
            self.a.poll_timeout(),
            self.ab.next_due(),
            self.ba.next_due(),
            nic,
        ]
        .into_iter()
        .flatten()
        .min();
        if self.b_alive {
            next = [next, self.b.poll_timeout()].into_iter().flatten().min();
        }
        let Some(at) = next else {
            return false;
        };
        self.now = self.now.max(at);
        if !self.tick.is_zero() {
            let since = (self.now - self.start).as_nanos();
            let tick = self.tick.as_nanos();
            let up = since.div_ceil(tick) * tick;
            self.now = self.start + Duration::from_nanos(up as u64);
        }
        self.a.handle_timeout(self.now);
        if self.b_alive {
            self.b.handle_timeout(self.now);
        }
        true
    }

    /// Connects A to B; returns (A's id, B's id).
    fn connect(&mut self) -> (ConnId, ConnId) {
        let ca = self.a.connect(2, self.now).unwrap();
        for _ in 0..100_000 {
            if self.a.is_established(ca) {
                if let Some(cb) = self.b.accept() {
                    return (ca, cb);
                }
            }
            if !self.step() {
                let mut evs = Vec::new();
                while let Some(e) = self.a.poll_event() {
                    evs.push(e);
                }
                panic!(
                    "stalled while connecting: {evs:?} a {:?} b {:?} {:?} {:?}",
                    self.a.stats(),
                    self.b.stats(),
                    self.ab.stats(),
                    self.ba.stats()
                );
            }
        }
        panic!(
            "no connection at {:?}: a {:?} b {:?} ab {:?} ba {:?}",
            self.elapsed(),
            self.a.stats(),
            self.b.stats(),
            self.ab.stats(),
            self.ba.stats()
        );
    }
}

fn lossy_config() -> LtlConfig {
    LtlConfig {
        window: 16,
        send_buffer: 8 << 10,
        max_timeouts: 40,
        ..LtlConfig::default()
    }
}

/// Sends `n` messages A→B with B reading as it goes; returns what B read.
fn transfer(
    sim: &mut Sim,
    ca: ConnId,
    cb: ConnId,
    n: u32,
    size_of: impl Fn(u32) -> usize,
) -> Vec<u32> {
    let mut next = 0;
    let mut got = Vec::new();
    let mut closed = false;
    for _ in 0..2_000_000 {
        while next < n {
            match sim.a.send(ca, &msg(next, size_of(next))) {
                Ok(()) => next += 1,
                Err(SendError::Full) => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        if next == n && !closed {
            sim.a.close(ca);
            closed = true;
        }
        loop {
            match sim.b.recv(cb) {
                Recv::Message(m) => got.push(m.header().seqnum),
                Recv::Empty => break,
                Recv::End => return got,
                Recv::Failed(e) => panic!("receiver failed: {e}"),
            }
        }
        if !sim.step() {
            break;
        }
    }
    got
}

#[test]
fn every_message_arrives_exactly_once_and_in_order_across_thousands_of_faulty_seeds() {
    let seeds = 2000u64;
    for seed in 0..seeds {
        let faults = DatagramFaults {
            loss: (seed % 31) as f64 / 100.0,
            duplicate: 0.05,
            reorder: 0.1,
            corrupt: 0.02,
            ..DatagramFaults::new(seed)
        };
        let mut sim = Sim::new(lossy_config(), faults);
        let (ca, cb) = sim.connect();
        let n = 120;
        let got = transfer(&mut sim, ca, cb, n, |i| 16 + (i as usize * 37) % 500);
        assert_eq!(got, (0..n).collect::<Vec<_>>(), "seed {seed}");
    }
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let run = || {
        let faults = DatagramFaults {
            loss: 0.2,
            reorder: 0.2,
            duplicate: 0.1,
            corrupt: 0.05,
            ..DatagramFaults::new(77)
        };
        let mut sim = Sim::new(lossy_config(), faults);
        let (ca, cb) = sim.connect();
        transfer(&mut sim, ca, cb, 300, |_| 100);
        (sim.a.stats(), sim.b.stats(), sim.elapsed())
    };
    assert_eq!(run(), run());
}

#[test]
fn corruption_is_detected_counted_and_repaired() {
    let faults = DatagramFaults {
        corrupt: 0.3,
        ..DatagramFaults::new(5)
    };
    let mut sim = Sim::new(lossy_config(), faults);
    let (ca, cb) = sim.connect();
    let got = transfer(&mut sim, ca, cb, 400, |_| 200);
    assert_eq!(got, (0..400).collect::<Vec<_>>());
    assert!(sim.b.stats().bad_frames > 0 && sim.a.stats().bad_frames > 0);
}

#[test]
fn a_gap_is_repaired_by_nack_before_any_timeout() {
    let faults = DatagramFaults {
        loss: 0.02,
        ..DatagramFaults::new(3)
    };
    let config = LtlConfig {
        window: 64,
        send_buffer: 64 << 10,
        ..LtlConfig::default()
    };
    let mut sim = Sim::new(config, faults);
    let (ca, cb) = sim.connect();
    let got = transfer(&mut sim, ca, cb, 5000, |_| 200);
    assert_eq!(got.len(), 5000);
    let s = sim.a.stats();
    assert!(s.fast_retransmits > 0, "{s:?}");
    assert!(s.fast_retransmits > s.timeout_retransmits, "{s:?}");
}

#[test]
fn garbage_datagrams_are_counted_and_dropped() {
    let mut e: LtlEndpoint<u8> = LtlEndpoint::new(LtlConfig::default(), 1);
    let now = Instant::now();
    e.handle_datagram(9, b"hello", now);
    e.handle_datagram(9, &[0u8; 32], now);
    e.handle_datagram(9, &[], now);
    assert_eq!(e.stats().bad_frames, 3);
    assert_eq!(e.connection_count(), 0);
    let mut out = BytesMut::new();
    assert_eq!(e.poll_transmit(now, &mut out), None);
}

#[test]
fn a_stalled_reader_stops_the_sender_with_bounded_memory_and_loses_nothing() {
    let config = LtlConfig {
        window: 32,
        send_buffer: 16 << 10,
        ..LtlConfig::default()
    };
    let mut sim = Sim::new(config.clone(), DatagramFaults::new(8));
    let (ca, cb) = sim.connect();
    let mut next = 0u32;
    // B does not read for ten virtual seconds.
    while sim.elapsed() < Duration::from_secs(10) {
        while sim.a.send(ca, &msg(next, 300)).is_ok() {
            next += 1;
        }
        let (unsent, inflight) = sim.a.backlog(ca);
        assert!(unsent <= config.send_buffer + 400 && inflight <= 32);
        assert!(sim.step());
    }
    assert!(!sim.a.can_send(ca), "the sender must be blocked");
    assert!(matches!(
        sim.a.send(ca, &msg(next, 300)),
        Err(SendError::Full)
    ));
    // No failure: keepalives and acknowledgements kept the link up.
    while let Some(ev) = sim.a.poll_event() {
        assert!(!matches!(ev, Event::Failed(..)), "{ev:?}");
    }
    sim.a.close(ca);
    let mut got = Vec::new();
    for _ in 0..1_000_000 {
        match sim.b.recv(cb) {
            Recv::Message(m) => got.push(m.header().seqnum),
            Recv::End => break,
            Recv::Empty => assert!(sim.step()),
            Recv::Failed(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, (0..next).collect::<Vec<_>>());
}

#[test]
fn a_dead_peer_fails_a_busy_connection_within_the_backoff_budget() {
    let config = LtlConfig::default();
    let mut sim = Sim::new(config.clone(), DatagramFaults::new(2));
    let (ca, _cb) = sim.connect();
    sim.b_alive = false;
    let killed_at = sim.elapsed();
    sim.a.send(ca, &msg(1, 100)).unwrap();
    let budget = config.max_rto * (config.max_timeouts + 2);
    let mut failed = None;
    while failed.is_none() && sim.elapsed() - killed_at < budget * 2 {
        assert!(sim.step());
        while let Some(ev) = sim.a.poll_event() {
            if let Event::Failed(id, e) = ev {
                assert_eq!(id, ca);
                failed = Some(e);
            }
        }
    }
    assert_eq!(failed, Some(ConnError::TimedOut(config.max_timeouts + 1)));
    assert!(sim.elapsed() - killed_at <= budget, "{:?}", sim.elapsed());
    assert_eq!(sim.a.recv(ca), Recv::Failed(ConnError::TimedOut(9)));
    assert!(matches!(
        sim.a.send(ca, &msg(2, 10)),
        Err(SendError::Failed(_))
    ));
    sim.a.release(ca);
    assert_eq!(sim.a.connection_count(), 0);
}

#[test]
fn a_dead_peer_fails_an_idle_connection_through_keepalives() {
    let config = LtlConfig::default();
    let mut sim = Sim::new(config.clone(), DatagramFaults::new(4));
    let (ca, _cb) = sim.connect();
    // Alive and idle for a while: keepalives are answered.
    let quiet = sim.elapsed() + config.keepalive_interval * 20;
    while sim.elapsed() < quiet {
        assert!(sim.step());
    }
    assert!(sim.a.is_established(ca));
    sim.b_alive = false;
    let killed_at = sim.elapsed();
    let budget = config.keepalive_interval * (config.max_timeouts + 2);
    loop {
        assert!(sim.step());
        if matches!(sim.a.recv(ca), Recv::Failed(_)) {
            break;
        }
        assert!(sim.elapsed() - killed_at <= budget, "not detected in time");
    }
}

#[test]
fn connecting_to_nobody_fails_and_a_full_table_refuses() {
    let mut sim = Sim::new(LtlConfig::default(), DatagramFaults::new(6));
    sim.b = LtlEndpoint::new(
        LtlConfig {
            max_connections: 1,
            ..LtlConfig::default()
        },
        66,
    );
    sim.b.set_listening(true);
    sim.connect();
    let second = sim.a.connect(2, sim.now).unwrap();
    let mut refused = false;
    for _ in 0..10_000 {
        if matches!(sim.a.recv(second), Recv::Failed(ConnError::Reset)) {
            refused = true;
            break;
        }
        assert!(sim.step());
    }
    assert!(refused);
    assert_eq!(sim.b.stats().refused, 1);
}

#[test]
fn closing_both_ways_empties_both_tables() {
    let mut sim = Sim::new(LtlConfig::default(), DatagramFaults::new(10));
    let (ca, cb) = sim.connect();
    let got = transfer(&mut sim, ca, cb, 50, |_| 64);
    assert_eq!(got.len(), 50);
    sim.b.close(cb);
    for _ in 0..100_000 {
        if sim.a.connection_count() == 0 && sim.b.connection_count() == 0 {
            break;
        }
        if !sim.step() {
            break;
        }
    }
    assert_eq!(sim.a.recv(ca), Recv::End);
    assert_eq!((sim.a.connection_count(), sim.b.connection_count()), (0, 0));
}

#[test]
fn thousands_of_connections_fit_the_default_table() {
    let mut sim = Sim::new(LtlConfig::default(), DatagramFaults::new(12));
    let ids: Vec<_> = (0..2000)
        .map(|_| sim.a.connect(2, sim.now).unwrap())
        .collect();
    let mut accepted = 0;
    for _ in 0..100_000 {
        while sim.b.accept().is_some() {
            accepted += 1;
        }
        if accepted == ids.len() && ids.iter().all(|&id| sim.a.is_established(id)) {
            break;
        }
        assert!(sim.step());
    }
    assert!(ids.iter().all(|&id| sim.a.is_established(id)));
    assert_eq!(sim.b.connection_count(), 2000);
}

/// Sends `n` messages of `size` bytes A→B without closing and steps
/// until B has read them all; returns what B read.
fn deliver(sim: &mut Sim, ca: ConnId, cb: ConnId, n: u32, size: usize) -> Vec<u32> {
    let mut next = 0;
    let mut got = Vec::new();
    for _ in 0..1_000_000 {
        while next < n && sim.a.send(ca, &msg(next, size)).is_ok() {
            next += 1;
        }
        loop {
            match sim.b.recv(cb) {
                Recv::Message(m) => got.push(m.header().seqnum),
                Recv::Empty => break,
                other => panic!("{other:?}"),
            }
        }
        if got.len() == n as usize || !sim.step() {
            break;
        }
    }
    got
}

/// A filter that loses the first `times` transmissions of the DATA frames
/// whose place among A's data frames (0-based, in sequence order) is in
/// `which`.
fn lose_data(which: &'static [u32], times: u32) -> Filter {
    let mut first_seq = None;
    let mut seen = std::collections::HashMap::<u32, u32>::new();
    Box::new(move |f| {
        if f.kind() != Kind::Data {
            return false;
        }
        let base = *first_seq.get_or_insert(f.seq());
        let index = f.seq().wrapping_sub(base);
        let sent = seen.entry(index).or_insert(0);
        *sent += 1;
        which.contains(&index) && *sent <= times
    })
}

#[test]
fn a_lost_tail_is_recovered_by_a_probe_before_any_timeout() {
    let config = LtlConfig::default();
    let mut sim = Sim::new(config.clone(), DatagramFaults::new(20));
    let (ca, cb) = sim.connect();
    // The last two frames of the burst are lost: no later frame arrives to
    // reveal the gap, so only a probe (or the timer) can.
    sim.drop_ab = Some(lose_data(&[18, 19], 1));
    let start = sim.elapsed();
    let got = deliver(&mut sim, ca, cb, 20, 1000);
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    let s = sim.a.stats();
    assert_eq!(s.timeouts, 0, "{s:?}");
    assert!(s.probe_retransmits >= 1, "{s:?}");
    assert!(
        sim.elapsed() - start < config.min_rto,
        "{:?}",
        sim.elapsed()
    );
}

#[test]
fn a_lost_retransmission_is_sent_again_before_any_timeout() {
    let config = LtlConfig::default();
    let mut sim = Sim::new(config.clone(), DatagramFaults::new(21));
    let (ca, cb) = sim.connect();
    // Frame 5 is lost, and so is its first retransmission; nothing is sent
    // after that, so no later frame can show the second loss.
    sim.drop_ab = Some(lose_data(&[5], 2));
    let start = sim.elapsed();
    let got = deliver(&mut sim, ca, cb, 20, 1000);
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    let s = sim.a.stats();
    assert_eq!(s.timeouts, 0, "{s:?}");
    assert!(s.fast_retransmits >= 1 && s.probe_retransmits >= 1, "{s:?}");
    assert!(
        sim.elapsed() - start < config.min_rto,
        "{:?}",
        sim.elapsed()
    );
}

#[test]
fn a_gap_is_resent_on_the_first_nack_even_when_the_rtt_estimate_is_stale() {
    // The handshake took 50 ms, so the smoothed RTT says 50 ms; the path
    // is fast now. The NACK must not wait for the estimate.
    let mut a: LtlEndpoint<u8> = LtlEndpoint::new(LtlConfig::default(), 1);
    let t0 = Instant::now();
    let ca = a.connect(2, t0).unwrap();
    let mut out = BytesMut::new();
    assert_eq!(a.poll_transmit(t0, &mut out), Some(2));
    let syn = Frame::new_checked(&out[..]).unwrap();
    let (a_id, a_isn) = (syn.src_conn(), syn.seq());
    let t1 = t0 + Duration::from_millis(50);
    let (b_id, b_isn) = (9, 5000);
    let synack = frame(Kind::SynAck, b_id, a_id, b_isn, a_isn, a_isn + 64, &[]);
    a.handle_datagram(2, &synack, t1);
    assert!(a.is_established(ca));
    for i in 0..10 {
        a.send(ca, &msg(i, 1000)).unwrap();
    }
    let mut sent = Vec::new();
    loop {
        out.clear();
        if a.poll_transmit(t1, &mut out).is_none() {
            break;
        }
        let f = Frame::new_checked(&out[..]).unwrap();
        if f.kind() == Kind::Data {
            sent.push(f.seq());
        }
    }
    assert_eq!(sent.len(), 10);
    // 100 µs later: frame 0 is missing, 1..=9 arrived.
    let bitmap = sack_bitmap(0..9);
    let t2 = t1 + Duration::from_micros(100);
    let nack = frame(
        Kind::Nack,
        b_id,
        a_id,
        b_isn,
        sent[0],
        sent[0] + 64,
        &bitmap,
    );
    a.handle_datagram(2, &nack, t2);
    out.clear();
    assert_eq!(a.poll_transmit(t2, &mut out), Some(2));
    let again = Frame::new_checked(&out[..]).unwrap();
    assert_eq!((again.kind(), again.seq()), (Kind::Data, sent[0]));
    assert_eq!(a.stats().fast_retransmits, 1);
}

#[test]
fn a_gap_that_stays_open_is_nacked_again_once_per_round_trip() {
    let config = LtlConfig::default();
    let mut b: LtlEndpoint<u8> = LtlEndpoint::new(config.clone(), 2);
    b.set_listening(true);
    let t0 = Instant::now();
    let (a_id, a_isn) = (7, 1000);
    b.handle_datagram(1, &frame(Kind::Syn, a_id, 0, a_isn, 0, 64, &[]), t0);
    let mut out = BytesMut::new();
    assert_eq!(b.poll_transmit(t0, &mut out), Some(1));
    let synack = Frame::new_checked(&out[..]).unwrap();
    assert_eq!(synack.kind(), Kind::SynAck);
    let (b_id, b_isn) = (synack.src_conn(), synack.seq());
    let mut now = t0 + Duration::from_millis(1);
    let ack = frame(Kind::Ack, a_id, b_id, a_isn, b_isn, b_isn + 64, &[]);
    b.handle_datagram(1, &ack, now);
    let cb = b.accept().unwrap();
    // The listener's side of a handshake is not timed (its SYN_ACK left no
    // record): the receiver's estimate, 1 ms, comes from a frame of its
    // own and the answer to it.
    let rtt = Duration::from_millis(1);
    b.send(cb, &msg(0, 10)).unwrap();
    out.clear();
    assert_eq!(b.poll_transmit(now, &mut out), Some(1));
    assert_eq!(Frame::new_checked(&out[..]).unwrap().kind(), Kind::Data);
    now += rtt;
    let acked = frame(Kind::Ack, a_id, b_id, a_isn, b_isn + 1, b_isn + 65, &[]);
    b.handle_datagram(1, &acked, now);
    assert_eq!(b.timing(cb).unwrap().0, Some(rtt));
    let data = |seq: u32| frame(Kind::Data, a_id, b_id, seq, b_isn + 1, b_isn + 65, b"x");
    // Frame 1 of 0..4 is lost.
    for seq in [a_isn, a_isn + 2, a_isn + 3] {
        b.handle_datagram(1, &data(seq), now);
    }
    let nacks = |b: &mut LtlEndpoint<u8>, now: Instant| {
        let mut seen = Vec::new();
        let mut out = BytesMut::new();
        while b.poll_transmit(now, &mut out).is_some() {
            let f = Frame::new_checked(&out[..]).unwrap();
            seen.push((f.kind(), f.ack(), f.payload().to_vec()));
            out.clear();
        }
        seen
    };
    let expect = (Kind::Nack, a_isn + 1, sack_bitmap(0..2).to_vec());
    assert_eq!(nacks(&mut b, now), vec![expect.clone()]);
    // Nothing arrives; the NACK goes again one round trip later, and again.
    let sent_at = now;
    for round in 1..=2u32 {
        let due = b.poll_timeout().unwrap();
        assert_eq!(due, sent_at + rtt * round);
        now = due - Duration::from_micros(1);
        b.handle_timeout(now);
        assert!(nacks(&mut b, now).is_empty());
        now = due;
        b.handle_timeout(now);
        assert_eq!(nacks(&mut b, now), vec![expect.clone()]);
    }
    assert_eq!(b.stats().nack_repeats, 2);
    // The gap closes: an ACK for all four, and no more NACKs.
    b.handle_datagram(1, &data(a_isn + 1), now);
    assert_eq!(nacks(&mut b, now), vec![(Kind::Ack, a_isn + 4, Vec::new())]);
    while b.recv(cb) != Recv::Empty {}
    now += rtt * 10;
    b.handle_timeout(now);
    assert!(nacks(&mut b, now).iter().all(|(k, ..)| *k != Kind::Nack));
    assert_eq!(b.stats().nack_repeats, 2);
}

#[test]
fn retransmissions_do_not_inflate_the_rtt_estimate() {
    // 10 µs each way: a 20 µs round trip. Frames sent twice, and frames
    // that waited behind a gap, would time the path at the repair delay.
    let faults = DatagramFaults {
        loss: 0.05,
        ..DatagramFaults::new(30)
    };
    let config = LtlConfig::default();
    let mut sim = Sim::new(config.clone(), faults);
    let (ca, cb) = sim.connect();
    let got = deliver(&mut sim, ca, cb, 5000, 500);
    assert_eq!(got.len(), 5000);
    let s = sim.a.stats();
    assert!(s.fast_retransmits > 100, "{s:?}");
    let (srtt, rto) = sim.a.timing(ca).unwrap();
    let srtt = srtt.unwrap();
    assert!(srtt <= Duration::from_micros(40), "{srtt:?}");
    // Any backoff ended with the next sample.
    assert_eq!(rto, config.min_rto, "{s:?}");
}

#[test]
fn frames_a_nack_reported_leave_the_flight_so_the_sender_goes_past_a_gap() {
    let config = LtlConfig {
        window: 64,
        max_in_flight: 8,
        ..LtlConfig::default()
    };
    let mut sim = Sim::new(config, DatagramFaults::new(31));
    let (ca, cb) = sim.connect();
    // The first frame is lost twice: the gap stays open a while.
    sim.drop_ab = Some(lose_data(&[0], 2));
    let mut next = 0;
    let mut most_unacked = 0;
    let mut got = Vec::new();
    for _ in 0..100_000 {
        while next < 60 && sim.a.send(ca, &msg(next, 1000)).is_ok() {
            next += 1;
        }
        most_unacked = most_unacked.max(sim.a.backlog(ca).1);
        while let Recv::Message(m) = sim.b.recv(cb) {
            got.push(m.header().seqnum);
        }
        if got.len() == 60 || !sim.step() {
            break;
        }
    }
    assert_eq!(got, (0..60).collect::<Vec<_>>());
    assert!(most_unacked > 8 && most_unacked <= 64, "{most_unacked}");
}

/// A one-block NACK bitmap with the given bits set (bit `i`: frame
/// `ack + 1 + i` arrived).
fn sack_bitmap(bits: std::ops::Range<usize>) -> [u8; SACK_LEN] {
    let mut b = [0u8; SACK_LEN];
    for bit in bits {
        b[bit / 8] |= 0x80 >> (bit % 8);
    }
    b
}

/// Goodput A→B in payload bytes per virtual second, for `run` of virtual
/// time after setup, with `loss` each way. The path is shaped like the
/// loaded two-core loopback the benchmark runs on: a sender that can put
/// out a 1400-byte frame every 4.5 µs (≈ 2.5 Gbit/s), a round trip of
/// about a millisecond (as long as 256 frames take to send), endpoints
/// that wake every 50 µs and take whole bursts, and now and then a
/// millisecond when the receiving side is not scheduled. The sender
/// always has data; the reader reads at once.
fn goodput(config: LtlConfig, loss: f64, run: Duration) -> (f64, Sim) {
    let per_frame = Duration::from_nanos(4500);
    let one_way = Duration::from_micros(400);
    let ab = DatagramFaults {
        loss,
        per_datagram: per_frame,
        latency: one_way,
        stall: 0.001,
        stall_time: Duration::from_millis(1),
        ..DatagramFaults::new(1)
    };
    let ba = DatagramFaults {
        loss,
        latency: one_way,
        // Acknowledgements are ~60 times fewer: a similar stall rate in time.
        stall: 0.02,
        stall_time: Duration::from_millis(1),
        ..DatagramFaults::new(38)
    };
    let mut sim = Sim::with_paths(config, ab, ba);
    let (ca, cb) = sim.connect();
    sim.tick = Duration::from_micros(50);
    sim.nic_queue = Some(per_frame * 64);
    let start = sim.now;
    let mut bytes = 0u64;
    let mut next = 0u32;
    let mut expect = 0u32;
    for _ in 0..10_000_000 {
        if sim.now - start >= run {
            break;
        }
        while sim.a.send(ca, &msg(next, 1400)).is_ok() {
            next += 1;
        }
        loop {
            match sim.b.recv(cb) {
                Recv::Message(m) => {
                    assert_eq!(m.header().seqnum, expect);
                    expect += 1;
                    bytes += m.payload().len() as u64;
                }
                Recv::Empty => break,
                other => panic!("{other:?}"),
            }
        }
        assert!(sim.step());
    }
    let secs = (sim.now - start).as_secs_f64();
    (bytes as f64 / secs, sim)
}

#[test]
fn goodput_at_one_percent_loss_stays_above_four_fifths_of_lossless() {
    let run = Duration::from_millis(300);
    let (lossless, _) = goodput(LtlConfig::default(), 0.0, run);
    let (lossy, sim) = goodput(LtlConfig::default(), 0.01, run);
    let ratio = lossy / lossless;
    let s = sim.a.stats();
    eprintln!(
        "virtual clock: {:.2} Gbit/s lossless, {:.2} Gbit/s at 1 % loss ({ratio:.2}x); {s:?}",
        lossless * 8e-9,
        lossy * 8e-9
    );
    assert!(ratio >= 0.8, "{ratio:.2}: {s:?}");
    // Gaps were repaired by NACKs, not by the timer.
    assert!(
        s.fast_retransmits > 10 * s.timeout_retransmits.max(1),
        "{s:?}"
    );
}
