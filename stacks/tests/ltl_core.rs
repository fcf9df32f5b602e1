//! The sans-IO LTL endpoint on a virtual clock, over seeded impaired
//! paths: exactly-once in-order delivery under loss, duplication,
//! reordering and corruption; credit that stops a sender instead of losing;
//! failure detection; setup and teardown. Deterministic and fast: no
//! sockets, no sleeping.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::msg;
use uniplane_stacks::datagram::fault::{DatagramFaults, FaultyPath};
use uniplane_stacks::ltl::{ConnError, ConnId, Endpoint, Event, LtlConfig, Recv, SendError};

/// Two endpoints (addresses 1 and 2) joined by two impaired paths.
struct Sim {
    a: Endpoint<u8>,
    b: Endpoint<u8>,
    ab: FaultyPath,
    ba: FaultyPath,
    now: Instant,
    start: Instant,
    buf: BytesMut,
    /// When false, B neither receives nor sends: it is dead.
    b_alive: bool,
}

impl Sim {
    fn new(config: LtlConfig, faults: DatagramFaults) -> Sim {
        let seed = faults.seed;
        let mut b = Endpoint::new(config.clone(), seed ^ 0xb);
        b.set_listening(true);
        let back = DatagramFaults {
            seed: seed.wrapping_mul(31).wrapping_add(7),
            ..faults.clone()
        };
        let now = Instant::now();
        Sim {
            a: Endpoint::new(config, seed ^ 0xa),
            b,
            ab: FaultyPath::new(faults),
            ba: FaultyPath::new(back),
            now,
            start: now,
            buf: BytesMut::new(),
            b_alive: true,
        }
    }

    fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// Moves every datagram due now; returns whether anything moved.
    fn exchange(&mut self) -> bool {
        let mut moved = false;
        loop {
            self.buf.clear();
            let Some(to) = self.a.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            assert_eq!(to, 2);
            self.ab.push(self.buf.split().freeze(), self.now);
            moved = true;
        }
        while self.b_alive {
            self.buf.clear();
            let Some(to) = self.b.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            assert_eq!(to, 1);
            self.ba.push(self.buf.split().freeze(), self.now);
            moved = true;
        }
        while let Some(d) = self.ab.pop_due(self.now) {
            if self.b_alive {
                self.b.handle_datagram(1, &d, self.now);
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
        let mut next = [
            self.a.poll_timeout(),
            self.ab.next_due(),
            self.ba.next_due(),
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
    let mut e: Endpoint<u8> = Endpoint::new(LtlConfig::default(), 1);
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
    sim.b = Endpoint::new(
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
    for _ in 0..100_000 {
        if ids.iter().all(|&id| sim.a.is_established(id)) {
            break;
        }
        assert!(sim.step());
    }
    assert!(ids.iter().all(|&id| sim.a.is_established(id)));
    assert_eq!(sim.b.connection_count(), 2000);
}
