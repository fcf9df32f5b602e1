//! The LTL handshake on the sans-IO core, on a virtual clock: a listener
//! answers SYNs with cookies and keeps nothing until a valid echo comes
//! back, so a flood of forged SYNs leaves it empty; wrong and expired
//! cookies create nothing; complete handshakes wait in a bounded backlog.

mod common;

use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::{ltl_frame as frame, msg};
use uniplane_stacks::ltl::wire::{Frame, Kind};
use uniplane_stacks::ltl::{ConnId, LtlConfig, LtlEndpoint, Recv, COOKIE_EPOCH};

const CLIENT: u32 = 1;
const LISTENER: u32 = 2;

/// A client endpoint and a listener on a perfect path; what the listener
/// sends anywhere else (to forged addresses) is lost.
struct Pair {
    a: LtlEndpoint<u32>,
    b: LtlEndpoint<u32>,
    now: Instant,
    buf: BytesMut,
}

impl Pair {
    fn new(config: LtlConfig) -> Pair {
        let mut b = LtlEndpoint::new(config.clone(), 2);
        b.set_listening(true);
        Pair {
            a: LtlEndpoint::new(config, 1),
            b,
            now: Instant::now(),
            buf: BytesMut::new(),
        }
    }

    /// Moves every datagram there is; returns whether any moved.
    fn exchange(&mut self) -> bool {
        let mut moved = false;
        loop {
            self.buf.clear();
            let Some(to) = self.a.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            assert_eq!(to, LISTENER);
            self.b.handle_datagram(CLIENT, &self.buf, self.now);
            moved = true;
        }
        loop {
            self.buf.clear();
            let Some(to) = self.b.poll_transmit(self.now, &mut self.buf) else {
                break;
            };
            if to == CLIENT {
                self.a.handle_datagram(LISTENER, &self.buf, self.now);
            }
            moved = true;
        }
        moved
    }

    /// Exchanges, or else moves the clock to the next deadline; false when
    /// nothing is left to happen.
    fn step(&mut self) -> bool {
        if self.exchange() {
            return true;
        }
        let next = [self.a.poll_timeout(), self.b.poll_timeout()]
            .into_iter()
            .flatten()
            .min();
        let Some(at) = next else {
            return false;
        };
        self.now = self.now.max(at);
        self.a.handle_timeout(self.now);
        self.b.handle_timeout(self.now);
        true
    }

    /// Steps until `done` says so; false if it never does.
    fn until(&mut self, mut done: impl FnMut(&mut Pair) -> bool) -> bool {
        for _ in 0..100_000 {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        false
    }

    /// Steps through `time` of virtual time.
    fn run_for(&mut self, time: Duration) {
        let end = self.now + time;
        while self.now < end && self.step() {}
    }

    /// Connects the client; returns (client's id, listener's id).
    fn connect(&mut self) -> (ConnId, ConnId) {
        let ca = self.a.connect(LISTENER, self.now).unwrap();
        let mut cb = None;
        let connected = self.until(|p| {
            cb = cb.or_else(|| p.b.accept());
            cb.is_some() && p.a.is_established(ca)
        });
        assert!(connected, "a {:?} b {:?}", self.a.stats(), self.b.stats());
        (ca, cb.unwrap())
    }
}

/// Sends `n` messages client to listener (or back) on the connection
/// `ca`–`cb`; returns what arrived, in order.
fn round_trip(p: &mut Pair, client_to_listener: bool, ca: ConnId, cb: ConnId, n: u32) -> Vec<u32> {
    let mut got = Vec::new();
    for i in 0..n {
        let sent = if client_to_listener {
            p.a.send(ca, &msg(i, 100))
        } else {
            p.b.send(cb, &msg(i, 100))
        };
        sent.unwrap();
    }
    p.until(|p| {
        let (e, id) = if client_to_listener {
            (&mut p.b, cb)
        } else {
            (&mut p.a, ca)
        };
        while let Recv::Message(m) = e.recv(id) {
            got.push(m.header().seqnum);
        }
        got.len() == n as usize
    });
    got
}

fn listener() -> LtlEndpoint<u32> {
    let mut b = LtlEndpoint::new(LtlConfig::default(), 2);
    b.set_listening(true);
    b
}

/// Hands `b` a SYN from `peer` (connection `src`, initial sequence number
/// `isn`) and returns its answer's cookie: (id, initial sequence number).
fn cookie_for(b: &mut LtlEndpoint<u32>, peer: u32, src: u32, isn: u32, now: Instant) -> (u32, u32) {
    b.handle_datagram(peer, &frame(Kind::Syn, src, 0, isn, 0, 64, &[]), now);
    let mut out = BytesMut::new();
    assert_eq!(b.poll_transmit(now, &mut out), Some(peer));
    let f = Frame::new_checked(&out[..]).unwrap();
    assert_eq!(
        (f.kind(), f.dst_conn(), f.ack()),
        (Kind::SynAck, src, isn),
        "the SYN_ACK answers the SYN"
    );
    (f.src_conn(), f.seq())
}

/// The one frame `b` sends next, if any: (destination, kind, ack).
fn next_frame(b: &mut LtlEndpoint<u32>, now: Instant) -> Option<(u32, Kind, u32)> {
    let mut out = BytesMut::new();
    let to = b.poll_transmit(now, &mut out)?;
    let f = Frame::new_checked(&out[..]).unwrap();
    Some((to, f.kind(), f.ack()))
}

#[test]
fn a_flood_of_forged_syns_leaves_no_state_and_a_real_client_still_connects() {
    let mut p = Pair::new(LtlConfig::default());
    let mut out = BytesMut::new();
    let mut answered = 0u32;
    for i in 0..100_000u32 {
        // Each from its own address and connection, as forged ones are.
        let forged = 1_000 + i;
        let isn = i.wrapping_mul(2_654_435_761);
        let syn = frame(Kind::Syn, i + 1, 0, isn, 0, 1024, &[]);
        p.b.handle_datagram(forged, &syn, p.now);
        loop {
            out.clear();
            let Some(to) = p.b.poll_transmit(p.now, &mut out) else {
                break;
            };
            assert_eq!(to, forged);
            assert_eq!(Frame::new_checked(&out[..]).unwrap().kind(), Kind::SynAck);
            answered += 1;
        }
        if i % 10_000 == 0 {
            assert_eq!((p.b.connection_count(), p.b.accept_queue_len()), (0, 0));
        }
        p.now += Duration::from_micros(1);
    }
    assert_eq!((p.b.connection_count(), p.b.accept_queue_len()), (0, 0));
    assert_eq!(p.b.poll_timeout(), None, "no timer, so no connection");
    let s = p.b.stats();
    assert_eq!((s.syn_cookies, answered), (100_000, 100_000));
    assert_eq!((s.refused, s.backlog_full, s.replies_dropped), (0, 0, 0));

    let (ca, cb) = p.connect();
    assert_eq!(
        round_trip(&mut p, true, ca, cb, 50),
        (0..50).collect::<Vec<_>>()
    );
    assert_eq!(
        round_trip(&mut p, false, ca, cb, 50),
        (0..50).collect::<Vec<_>>()
    );
    assert_eq!(p.b.connection_count(), 1);
    assert_eq!(p.b.stats().syn_cookies, 100_001);
}

#[test]
fn an_echo_with_a_wrong_cookie_creates_nothing_and_is_reset() {
    let mut b = listener();
    let now = Instant::now();
    let (id, isn) = cookie_for(&mut b, CLIENT, 7, 1000, now);
    let forgeries = [
        // Another connection id, of the same epoch.
        (
            CLIENT,
            frame(Kind::Ack, 7, id ^ 2, 1000, isn, isn + 64, &[]),
        ),
        // Another initial sequence number echoed.
        (
            CLIENT,
            frame(Kind::Ack, 7, id, 1000, isn ^ 1, isn + 64, &[]),
        ),
        // Another connection of the same peer.
        (CLIENT, frame(Kind::Data, 8, id, 1000, isn, isn + 64, b"x")),
        // Another peer.
        (9, frame(Kind::Keepalive, 7, id, 1000, isn, isn + 64, &[])),
    ];
    for (n, (from, forged)) in forgeries.iter().enumerate() {
        b.handle_datagram(*from, forged, now);
        assert_eq!(b.connection_count(), 0, "forgery {n}");
        assert_eq!(b.stats().bad_cookies, n as u64 + 1);
        assert_eq!(
            next_frame(&mut b, now).map(|(to, k, _)| (to, k)),
            Some((*from, Kind::Rst))
        );
    }
    assert_eq!(b.accept(), None);
    // The true echo opens the connection.
    b.handle_datagram(
        CLIENT,
        &frame(Kind::Ack, 7, id, 1000, isn, isn + 64, &[]),
        now,
    );
    assert_eq!(b.connection_count(), 1);
    assert!(b.accept().is_some());
    assert_eq!(b.stats().bad_cookies, 4);
}

#[test]
fn a_cookie_is_good_in_the_next_epoch_and_refused_after_it() {
    let mut b = listener();
    let t0 = Instant::now();
    let (id7, isn7) = cookie_for(&mut b, CLIENT, 7, 1000, t0);
    let (id8, isn8) = cookie_for(&mut b, CLIENT, 8, 2000, t0);
    // The key rotated once: the previous one still checks.
    let next = t0 + COOKIE_EPOCH + Duration::from_secs(1);
    b.handle_datagram(
        CLIENT,
        &frame(Kind::Ack, 7, id7, 1000, isn7, isn7 + 64, &[]),
        next,
    );
    assert_eq!((b.connection_count(), b.stats().bad_cookies), (1, 0));
    // Rotated twice: the key that made it is gone.
    let after = t0 + COOKIE_EPOCH * 2 + Duration::from_secs(1);
    b.handle_datagram(
        CLIENT,
        &frame(Kind::Ack, 8, id8, 2000, isn8, isn8 + 64, &[]),
        after,
    );
    assert_eq!((b.connection_count(), b.stats().bad_cookies), (1, 1));
    assert_eq!(next_frame(&mut b, after), Some((CLIENT, Kind::Rst, 0)));
    // A SYN now gets a cookie of the current key, which checks.
    let (id, isn) = cookie_for(&mut b, CLIENT, 8, 2000, after);
    b.handle_datagram(
        CLIENT,
        &frame(Kind::Ack, 8, id, 2000, isn, isn + 64, &[]),
        after,
    );
    assert_eq!(b.connection_count(), 2);
}

#[test]
fn an_echo_that_is_not_the_openers_first_frame_opens_the_connection_where_its_stream_starts() {
    let mut b = listener();
    let now = Instant::now();
    let (id, isn) = cookie_for(&mut b, CLIENT, 7, 1000, now);
    // The opener's ACK and first two DATA frames were lost; its third
    // arrives, with its credit: 8 frames.
    b.handle_datagram(
        CLIENT,
        &frame(Kind::Data, 7, id, 1002, isn, isn + 8, b"x"),
        now,
    );
    assert_eq!(b.connection_count(), 1);
    let cb = b.accept().unwrap();
    // The stream starts at the SYN's sequence number: two frames missing.
    assert_eq!(next_frame(&mut b, now), Some((CLIENT, Kind::Nack, 1000)));
    // The credit came with the echo: 8 frames of 20 go.
    for i in 0..20 {
        b.send(cb, &msg(i, 1000)).unwrap();
    }
    let mut data = 0;
    while let Some((to, kind, _)) = next_frame(&mut b, now) {
        assert_eq!(to, CLIENT);
        data += usize::from(kind == Kind::Data);
    }
    assert_eq!(data, 8);
}

#[test]
fn handshakes_beyond_the_accept_backlog_wait_until_the_application_accepts() {
    let config = LtlConfig {
        accept_backlog: 4,
        ..LtlConfig::default()
    };
    let mut p = Pair::new(config);
    let mut ids: Vec<_> = (0..10)
        .map(|_| p.a.connect(LISTENER, p.now).unwrap())
        .collect();
    // Nobody accepts: four complete handshakes wait, the other echoes are
    // dropped, and a SYN that comes now is not answered.
    p.run_for(Duration::from_millis(100));
    ids.push(p.a.connect(LISTENER, p.now).unwrap());
    p.run_for(Duration::from_millis(10));
    assert_eq!((p.b.accept_queue_len(), p.b.connection_count()), (4, 4));
    let s = p.b.stats();
    assert!(s.backlog_full >= 7, "{s:?}");
    assert_eq!(s.syn_cookies, 10, "{s:?}");
    // The application accepts: the others get in as they try again.
    let mut accepted = 0;
    let all_in = p.until(|p| {
        while p.b.accept().is_some() {
            accepted += 1;
        }
        accepted == ids.len() && ids.iter().all(|&id| p.a.is_established(id))
    });
    assert!(all_in, "{accepted} accepted; {:?}", p.b.stats());
    assert_eq!(p.b.connection_count(), 11);
}
