//! The sharded engine against the single engine: the same decisions, no
//! loss, per-flow order and weighted shares across shards, ports moved
//! under traffic. Shards run on their own threads; every wait here is
//! bounded by a deadline and ends on a condition, never on a sleep.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::{exchange, flush, msg, receive_in_order, rules, sender, try_recv, try_send};
use proptest::prelude::*;
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::{
    spawn_sharded, Engine, EngineConfig, EngineHandle, ForwardingPlane, PortId, PortSpec, RunMode,
    ShardConfig,
};

/// A hang detector, not a timing: 4 shards, 8 senders and a receiver on
/// a 2-core machine that also builds run far slower than alone (97,114
/// of 160,000 hotspot messages in 30 s at load 12).
const DEADLINE: Duration = Duration::from_secs(90);

/// Ports 0..n as apps on `plane`, wired as [`common::rules`] says.
fn wire(plane: &mut dyn ForwardingPlane, n: usize, deny: &[usize]) -> Vec<RingLink> {
    let mut links = Vec::new();
    for i in 0..n {
        let (id, link) = plane.attach(PortSpec::app(&format!("app{i}"))).unwrap();
        assert_eq!(id as usize, i);
        links.push(link);
    }
    rules(plane, n, deny);
    links
}

fn sharded(shards: usize, config: EngineConfig) -> EngineHandle {
    spawn_sharded(
        config,
        &ShardConfig {
            shards,
            cpus: Vec::new(),
        },
        RunMode::SpinThenPark { spins: 64 },
    )
    .unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// Random traffic (routed, unrouted and denied) through the single
    /// engine and through 1–4 shards: every port receives the same
    /// messages, each flow in the same order.
    #[test]
    fn shards_deliver_what_the_single_engine_delivers_in_the_same_flow_order(
        ports in 2usize..6,
        shards in 1usize..5,
        sends in proptest::collection::vec((0usize..6, 0u16..7, 1usize..300), 1..400),
        deny_first in any::<bool>(),
    ) {
        let config = EngineConfig {
            max_ports: 8,
            voq_depth: 4,
            ring_depth: 16,
            burst: 8,
            ..EngineConfig::default()
        };
        let deny: Vec<usize> = if deny_first { vec![0] } else { Vec::new() };
        let mut traffic: Vec<Vec<Message>> = vec![Vec::new(); ports];
        let mut seq = vec![0u32; ports];
        for (src, dst, len) in sends {
            let src = src % ports;
            // dst ports+1 has no route.
            let dst = dst % (ports as u16 + 1) + 1;
            traffic[src].push(msg(src as u16 + 1, dst, seq[src], len));
            seq[src] += 1;
        }
        let expect: usize = traffic.iter().map(Vec::len).sum();

        let mut one = Engine::new(config.clone());
        let mut links = wire(&mut one, ports, &deny);
        let mut t = 0u64;
        let want = exchange(&mut links, &traffic, expect, DEADLINE, || {
            one.step(Duration::from_nanos(t));
            t += 1;
        });

        let mut many = sharded(shards, config);
        let mut links = wire(&mut many, ports, &deny);
        let got = exchange(&mut links, &traffic, expect, DEADLINE, || {});
        drop(links);
        many.stop();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_hotspot_across_four_shards_with_tiny_queues_loses_nothing_and_keeps_flow_order() {
    let config = EngineConfig {
        max_ports: 9,
        voq_depth: 2,
        ring_depth: 8,
        burst: 4,
        ..EngineConfig::default()
    };
    let mut e = sharded(4, config);
    let mut links = wire(&mut e, 9, &[]);
    const PER_SOURCE: u32 = 20_000;
    let mut sink = links.pop().unwrap();
    let senders: Vec<_> = links
        .into_iter()
        .enumerate()
        .map(|(s, link)| sender(link, s as u16 + 1, 9, PER_SOURCE, 8, DEADLINE))
        .collect();
    receive_in_order(&mut sink, 8 * PER_SOURCE as u64, DEADLINE);
    let _links: Vec<RingLink> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(e.counters(8).unwrap().tx_msgs, 8 * PER_SOURCE as u64);
    let stalls: u64 = (0..8).map(|p| e.counters(p).unwrap().input_stalls).sum();
    assert!(stalls > 0, "tiny queues must have pushed back");
    e.stop();
}

#[test]
fn weights_hold_between_inputs_on_different_shards() {
    // Two shards; ports go to the shard with fewer, so 0 and 2 share
    // shard 0 and 1 and 3 shard 1: the output (3) weighs inputs that two
    // threads read. Weights are defined for backlogged queues, so every
    // input's messages are queued first (the output ring, 8 deep, takes
    // the first few in arrival order), then the output is drained while
    // every queue still holds some.
    let config = EngineConfig {
        voq_depth: 512,
        ring_depth: 8,
        ..EngineConfig::default()
    };
    for (name, e) in [
        (
            "one engine",
            Engine::new(config.clone()).spawn(RunMode::BusyPoll),
        ),
        ("two shards", sharded(2, config)),
    ] {
        weighted_shares(name, e);
    }
}

/// Queues 400 messages from each of inputs 0–2 for output 3, then checks
/// the output's byte shares follow its weights 1:2:5.
fn weighted_shares(name: &str, mut e: EngineHandle) {
    let mut links = wire(&mut e, 4, &[]);
    e.set_policy(3, Policy::Weighted(vec![1, 2, 5, 1])).unwrap();
    let sizes = [64usize, 512, 200];
    const SENT: u32 = 400;
    let start = Instant::now();
    let mut sent = [0u32; 3];
    while sent.iter().any(|&n| n < SENT) {
        assert!(start.elapsed() < DEADLINE, "sent {sent:?}");
        for s in 0..3 {
            while sent[s] < SENT
                && try_send(&mut links[s], msg(s as u16 + 1, 4, sent[s], sizes[s])).is_ok()
            {
                sent[s] += 1;
            }
            flush(&mut links[s]);
        }
        std::thread::yield_now();
    }
    while (0..3).any(|p| e.counters(p).unwrap().rx_msgs < u64::from(SENT)) {
        assert!(start.elapsed() < DEADLINE, "inputs not read");
        std::thread::yield_now();
    }
    // Weight-5 input sends ~32 messages of 200 B a round, so its 400 last
    // 12 rounds: 500 messages are about 9 rounds, every queue backlogged.
    let mut bytes = [0u64; 3];
    let mut received = 0;
    while received < 8 + 500 {
        assert!(start.elapsed() < DEADLINE, "{received} received");
        let Some(m) = try_recv(&mut links[3]) else {
            std::thread::yield_now();
            continue;
        };
        received += 1;
        if received > 8 {
            bytes[m.header().src.device() as usize - 1] += m.encoded_len() as u64;
        }
    }
    let total: u64 = bytes.iter().sum();
    for (s, want) in [(0, 1.0 / 8.0), (1, 2.0 / 8.0), (2, 5.0 / 8.0)] {
        let got = bytes[s] as f64 / total as f64;
        assert!(
            (got - want).abs() < 0.02,
            "{name}, source {s}: {got} vs {want}"
        );
    }
    e.stop();
}

#[test]
fn ports_moved_between_shards_under_traffic_lose_and_reorder_nothing() {
    let config = EngineConfig {
        voq_depth: 8,
        ring_depth: 32,
        ..EngineConfig::default()
    };
    let mut e = sharded(3, config);
    let mut links = wire(&mut e, 3, &[]);
    let sink = links.pop().unwrap();
    const PER_SOURCE: u32 = 30_000;
    let senders: Vec<_> = links
        .into_iter()
        .enumerate()
        .map(|(s, link)| sender(link, s as u16 + 1, 3, PER_SOURCE, 16, DEADLINE))
        .collect();
    let receiver = std::thread::spawn(move || {
        let mut sink = sink;
        let mut last: HashMap<Uid, u32> = HashMap::new();
        let mut received = 0u32;
        let start = Instant::now();
        while received < 2 * PER_SOURCE {
            assert!(start.elapsed() < DEADLINE, "{received} received");
            match try_recv(&mut sink) {
                Some(m) => {
                    let h = m.header();
                    let prev = last.insert(h.src, h.seqnum);
                    assert_eq!(
                        prev.map_or(0, |p| p + 1),
                        h.seqnum,
                        "flow {} reordered or lost",
                        h.src
                    );
                    received += 1;
                }
                None => std::thread::yield_now(),
            }
        }
        received
    });
    // Move every port round the shards while the traffic flows.
    let mut moves = 0;
    while !receiver.is_finished() {
        for p in 0..3 as PortId {
            e.move_port(p, (p as usize + moves) % 3).unwrap();
        }
        moves += 1;
    }
    assert_eq!(receiver.join().unwrap(), 2 * PER_SOURCE);
    assert!(moves > 1, "the ports must have moved during the run");
    let _links: Vec<RingLink> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(e.counters(2).unwrap().tx_msgs, 2 * PER_SOURCE as u64);
    e.stop();
}

#[test]
fn control_reaches_the_shard_that_owns_each_port_and_every_translation_shard() {
    let mut e = sharded(2, EngineConfig::default());
    let mut links = wire(&mut e, 3, &[]);
    // A translation steers a connection ahead of the table, on whichever
    // shard reads the input.
    let m = msg(1, 2, 7, 8);
    let conn = ConnKey::of(m.header());
    e.add_translation(conn, 2).unwrap();
    assert_eq!(e.translations().unwrap(), vec![(conn, 2)]);
    try_send(&mut links[0], m).unwrap();
    flush(&mut links[0]);
    let start = Instant::now();
    let got = loop {
        assert!(start.elapsed() < DEADLINE);
        if let Some(m) = try_recv(&mut links[2]) {
            break m;
        }
        std::thread::yield_now();
    };
    assert_eq!(got.header().seqnum, 7);
    // Dumps come from the owner, with its routes and policy.
    e.set_policy(1, Policy::Weighted(vec![2, 1])).unwrap();
    let d = e.dump(1).unwrap();
    assert_eq!(d.routes.len(), 3);
    assert!(matches!(d.policy, Some(Policy::Weighted(_))));
    e.remove_translation(conn).unwrap();
    assert!(e.translations().unwrap().is_empty());
    assert!(e.remove_translation(conn).is_err());
    // Detach frees the slot; the next attach takes it again.
    e.detach(1).unwrap();
    assert!(e.counters(1).is_err());
    let (id, _link) = e.attach(PortSpec::app("again")).unwrap();
    assert_eq!(id, 1);
    assert!(e.move_port(0, 5).is_err(), "no shard 5");
    e.stop();
}
