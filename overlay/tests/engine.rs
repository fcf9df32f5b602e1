//! The engine as a specification, stepped on a virtual clock so every run
//! is the same.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{flush, msg, try_recv, try_send, uid};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::{MsgFlags, ReqType, Status};
use uniplane_dataplane::Message;
use uniplane_overlay::acl::{AclRule, ConnCounters, ConnKey};
use uniplane_overlay::table::Route;
use uniplane_overlay::{Engine, EngineConfig, ForwardingPlane, PortId, PortSpec, RunMode};

/// An engine whose ports 0..n are apps with UIDs 1..=n, every port
/// routing each UID to its port and admitting everything.
fn engine_with_apps(n: usize, config: EngineConfig) -> (Engine, Vec<RingLink>) {
    let mut e = Engine::new(config);
    let mut links = Vec::new();
    for i in 0..n {
        let (id, link) = e.attach(PortSpec::app(&format!("app{i}"))).unwrap();
        assert_eq!(id as usize, i);
        links.push(link);
    }
    for p in 0..n as PortId {
        e.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
        for d in 0..n as PortId {
            e.add_route(p, Route::exact(uid(d + 1), d)).unwrap();
        }
    }
    (e, links)
}

#[test]
fn a_million_messages_through_a_16_to_1_hotspot_with_tiny_queues_lose_nothing_and_keep_flow_order()
{
    let config = EngineConfig {
        max_ports: 17,
        voq_depth: 2,
        ring_depth: 8,
        burst: 4,
        ..EngineConfig::default()
    };
    let (mut e, mut links) = engine_with_apps(17, config);
    const PER_SOURCE: u32 = 62_500;
    let mut next = [0u32; 16];
    let mut order = common::FlowOrder::default();
    let mut received = 0u64;
    let mut steps = 0u64;
    while received < 16 * PER_SOURCE as u64 {
        for s in 0..16 {
            while next[s] < PER_SOURCE {
                let m = msg(s as u16 + 1, 17, next[s], 8);
                if try_send(&mut links[s], m).is_err() {
                    break;
                }
                next[s] += 1;
            }
            flush(&mut links[s]);
        }
        e.step(Duration::from_nanos(steps));
        steps += 1;
        while let Some(m) = try_recv(&mut links[16]) {
            order.check(&m);
            received += 1;
        }
        assert!(steps < 10_000_000, "no progress");
    }
    let c = e.counters(16).unwrap();
    assert_eq!(c.tx_msgs, 16 * PER_SOURCE as u64);
    let stalls: u64 = (0..16).map(|p| e.counters(p).unwrap().input_stalls).sum();
    assert!(stalls > 0, "tiny queues must have pushed back");
}

#[test]
fn a_forwarding_miss_is_counted_and_answered_with_no_route() {
    let (mut e, mut links) = engine_with_apps(2, EngineConfig::default());
    try_send(&mut links[0], msg(1, 99, 5, 4)).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    let answer = try_recv(&mut links[0]).expect("an error completion");
    assert_eq!(answer.kind(), ReqType::SendCmpl);
    assert_eq!(answer.header().status(), Status::NoRoute);
    assert_eq!(answer.header().seqnum, 5);
    assert!(answer.header().flags.contains(MsgFlags::ERROR));
    assert_eq!(e.counters(0).unwrap().no_route, 1);
    assert!(try_recv(&mut links[1]).is_none());
}

#[test]
fn an_acl_denial_is_counted_and_answered_with_denied() {
    let (mut e, mut links) = engine_with_apps(2, EngineConfig::default());
    e.clear_acl_rules(0).unwrap();
    let conn = ConnKey::of(msg(1, 2, 0, 0).header());
    e.allow_connection(0, conn).unwrap();
    try_send(&mut links[0], msg(1, 2, 1, 4)).unwrap();
    // Another source port: not the installed connection.
    let mut other = Message::send(uid(1).port(9), uid(2).port(2), Bytes::new()).unwrap();
    other.set_seqnum(2);
    try_send(&mut links[0], other).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    assert_eq!(try_recv(&mut links[1]).unwrap().header().seqnum, 1);
    let answer = try_recv(&mut links[0]).unwrap();
    assert_eq!(answer.header().status(), Status::Denied);
    assert_eq!(answer.header().seqnum, 2);
    let c = e.counters(0).unwrap();
    assert_eq!((c.acl_denied, c.error_answers), (1, 1));
}

#[test]
fn each_connection_direction_counts_exactly_the_messages_and_bytes_it_carried() {
    // Tiny queues: inputs stall and look their heads up again, which must
    // not count a message twice.
    let config = EngineConfig {
        voq_depth: 2,
        ring_depth: 8,
        burst: 4,
        ..EngineConfig::default()
    };
    let (mut e, mut links) = engine_with_apps(2, config);
    let there = ConnKey::of(msg(1, 2, 0, 0).header());
    for p in 0..2 {
        e.clear_acl_rules(p).unwrap();
        e.allow_connection(p, there).unwrap();
    }
    const N: u32 = 1000;
    let back_len = |seq: u32| (seq % 7) as usize;
    let back = |seq: u32| {
        let mut m = Message::send(
            uid(2).port(2),
            uid(1).port(1),
            Bytes::from(vec![0; back_len(seq)]),
        )
        .unwrap();
        m.set_seqnum(seq);
        m
    };
    let (mut sent, mut answered, mut got) = (0u32, 0u32, [0u32; 2]);
    let mut steps = 0;
    while got != [N, N] {
        while sent < N && try_send(&mut links[0], msg(1, 2, sent, 100)).is_ok() {
            sent += 1;
        }
        while answered < N && try_send(&mut links[1], back(answered)).is_ok() {
            answered += 1;
        }
        flush(&mut links[0]);
        flush(&mut links[1]);
        e.step(Duration::from_nanos(steps));
        steps += 1;
        for (i, l) in links.iter_mut().enumerate() {
            while try_recv(l).is_some() {
                got[1 - i] += 1;
            }
        }
        assert!(steps < 1_000_000, "no progress");
    }
    assert!(
        e.counters(0).unwrap().input_stalls > 0,
        "tiny queues must push back"
    );
    let back_bytes: u64 = (0..N).map(|s| back_len(s) as u64).sum();
    // Port 0 took in the connection's forward direction, port 1 its way back.
    assert_eq!(
        e.connection_counters(0).unwrap(),
        vec![
            (
                there,
                ConnCounters {
                    msgs: N as u64,
                    bytes: 100 * N as u64
                }
            ),
            (there.reversed(), ConnCounters::default()),
        ]
    );
    assert_eq!(
        e.connection_counters(1).unwrap(),
        vec![
            (there, ConnCounters::default()),
            (
                there.reversed(),
                ConnCounters {
                    msgs: N as u64,
                    bytes: back_bytes
                }
            ),
        ]
    );
    // A denied message is no connection's: counted as a denial only.
    try_send(&mut links[0], msg(1, 3, 0, 50)).unwrap();
    flush(&mut links[0]);
    e.step(Duration::from_nanos(steps));
    assert_eq!(e.connection_counters(0).unwrap()[0].1.msgs, N as u64);
    // The counters go with the connection.
    e.revoke_connection(0, there).unwrap();
    assert!(e.connection_counters(0).unwrap().is_empty());
}

#[test]
fn a_refused_answer_is_counted_but_not_answered() {
    let (mut e, mut links) = engine_with_apps(1, EngineConfig::default());
    // A completion addressed to UID 77, which no route knows.
    let cmpl = msg(77, 42, 0, 0).error_answer(Status::Ok).unwrap();
    try_send(&mut links[0], cmpl).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    assert!(try_recv(&mut links[0]).is_none());
    let c = e.counters(0).unwrap();
    assert_eq!((c.no_route, c.unanswerable, c.error_answers), (1, 1, 0));
}

#[test]
fn messages_above_a_tunnel_mtu_cross_it_as_segments_and_arrive_whole() {
    let mut e = Engine::new(EngineConfig::default());
    let (a, mut app_a) = e.attach(PortSpec::app("a")).unwrap();
    let (t, mut tunnel) = e.attach(PortSpec::tunnel("t", 0, 100)).unwrap();
    let (b, mut app_b) = e.attach(PortSpec::app("b")).unwrap();
    for p in [a, t, b] {
        e.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
    }
    // Leaving a: through the tunnel. Coming back in from the tunnel: to b.
    e.add_route(a, Route::exact(uid(2), t)).unwrap();
    e.add_route(t, Route::exact(uid(2), b)).unwrap();

    let original = msg(1, 2, 77, 1000);
    try_send(&mut app_a, original.clone()).unwrap();
    flush(&mut app_a);
    let mut segments = 0;
    for step in 0..100 {
        e.step(Duration::from_micros(step));
        // The "wire": whatever leaves the tunnel comes back in.
        while let Some(s) = try_recv(&mut tunnel) {
            assert!(s.payload().len() <= 100);
            segments += 1;
            try_send(&mut tunnel, s).unwrap();
        }
        flush(&mut tunnel);
    }
    assert_eq!(segments, 10);
    assert_eq!(try_recv(&mut app_b).unwrap(), original);
    let c = e.counters(b).unwrap();
    assert_eq!(c.reassembly.completed, 1);
    assert_eq!(e.counters(a).unwrap().segments, 10);
}

#[test]
fn output_shares_follow_the_weights_within_one_percent() {
    // The output ring takes fewer messages per step than a queue holds, so
    // every queue stays backlogged: the condition weights are defined for.
    let config = EngineConfig {
        voq_depth: 16,
        ring_depth: 8,
        ..EngineConfig::default()
    };
    let (mut e, mut links) = engine_with_apps(4, config);
    e.set_policy(3, Policy::Weighted(vec![1, 2, 5, 1])).unwrap();
    let sizes = [64usize, 512, 200];
    let mut bytes = [0u64; 3];
    let mut seq = 0;
    for step in 0..20_000u64 {
        // Keep every source backlogged.
        for s in 0..3 {
            while try_send(&mut links[s], msg(s as u16 + 1, 4, seq, sizes[s])).is_ok() {
                seq += 1;
            }
            flush(&mut links[s]);
        }
        e.step(Duration::from_nanos(step));
        while let Some(m) = try_recv(&mut links[3]) {
            if step > 1000 {
                bytes[m.header().src.device() as usize - 1] += m.encoded_len() as u64;
            }
        }
    }
    let total: u64 = bytes.iter().sum();
    for (s, want) in [(0, 1.0 / 8.0), (1, 2.0 / 8.0), (2, 5.0 / 8.0)] {
        let got = bytes[s] as f64 / total as f64;
        assert!((got - want).abs() < 0.01, "source {s}: {got} vs {want}");
    }
}

#[test]
fn a_policy_change_mid_flight_loses_and_reorders_nothing() {
    let (mut e, mut links) = engine_with_apps(4, EngineConfig::default());
    let policies = [
        Policy::Weighted(vec![3, 1, 1, 1]),
        Policy::StrictPriority {
            class: vec![1, 0, 1, 0],
            weights: vec![1, 1, 1, 1],
        },
        Policy::RoundRobin,
    ];
    let mut next = [0u32; 3];
    let mut last = [None::<u32>; 3];
    let mut got = 0;
    let mut step = 0u64;
    while got < 30_000 {
        for s in 0..3 {
            while next[s] < 10_000
                && try_send(&mut links[s], msg(s as u16 + 1, 4, next[s], 16)).is_ok()
            {
                next[s] += 1;
            }
            flush(&mut links[s]);
        }
        if step % 50 == 49 {
            e.set_policy(3, policies[(step as usize / 50) % 3].clone())
                .unwrap();
        }
        e.step(Duration::from_nanos(step));
        step += 1;
        while let Some(m) = try_recv(&mut links[3]) {
            let s = m.header().src.device() as usize - 1;
            assert_eq!(last[s].map_or(0, |v| v + 1), m.header().seqnum);
            last[s] = Some(m.header().seqnum);
            got += 1;
        }
    }
    assert_eq!(last, [Some(9_999); 3]);
}

#[test]
fn a_translator_entry_steers_a_connection_ahead_of_the_table() {
    let (mut e, mut links) = engine_with_apps(3, EngineConfig::default());
    let m = msg(1, 2, 3, 8);
    e.add_translation(ConnKey::of(m.header()), 2).unwrap();
    try_send(&mut links[0], m.clone()).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    assert_eq!(try_recv(&mut links[2]).unwrap(), m);
    e.remove_translation(ConnKey::of(m.header())).unwrap();
    try_send(&mut links[0], m.clone()).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    assert_eq!(try_recv(&mut links[1]).unwrap(), m, "back to the table");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spawned_engine_parks_when_idle_and_serves_its_handle() {
    use futures_util::{SinkExt, StreamExt};
    let mut handle =
        Engine::new(EngineConfig::default()).spawn(RunMode::SpinThenPark { spins: 64 });
    let (a, mut app_a) = handle.attach(PortSpec::app("a")).unwrap();
    let (b, mut app_b) = handle.attach(PortSpec::app("b")).unwrap();
    for p in [a, b] {
        handle.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
    }
    handle.add_route(a, Route::exact(uid(2), b)).unwrap();
    for round in 0..200u32 {
        // Bursts with pauses: the engine parks between them and the rings
        // must wake it.
        for i in 0..10 {
            app_a.feed(msg(1, 2, round * 10 + i, 32)).await.unwrap();
        }
        app_a.flush().await.unwrap();
        for i in 0..10 {
            let m = app_b.next().await.unwrap().unwrap();
            assert_eq!(m.header().seqnum, round * 10 + i);
        }
        if round % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    assert_eq!(handle.counters(b).unwrap().tx_msgs, 2000);
    let engine = handle.stop().expect("last handle");
    assert_eq!(engine.port_name(a), Some("a"));
}

#[test]
fn a_detached_port_frees_its_slot_and_misses_are_answered() {
    let (mut e, mut links) = engine_with_apps(3, EngineConfig::default());
    try_send(&mut links[0], msg(1, 3, 1, 8)).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    e.detach(2).unwrap();
    try_send(&mut links[0], msg(1, 3, 2, 8)).unwrap();
    flush(&mut links[0]);
    e.step(Duration::ZERO);
    let answer = try_recv(&mut links[0]).unwrap();
    assert_eq!(answer.header().status(), Status::NoRoute);
    let (id, _link) = e.attach(PortSpec::app("again")).unwrap();
    assert_eq!(id, 2, "the slot is reused");
    assert!(e.counters(2).unwrap().tx_msgs == 0);
}
