//! The inline fast path against the engine's thread: the same decisions
//! (ACL, routes, answers), the same messages in the same flow order, no
//! loss when senders on many threads race each other and the engine's
//! thread for the engine. Every wait is bounded by a deadline and ends on
//! a condition, never on a sleep.

mod common;

use std::time::Duration;

use common::{exchange, msg, receive_in_order, rules, sender, try_recv};
use proptest::prelude::*;
use uniplane_dataplane::Message;
use uniplane_overlay::{
    spawn_sharded, Engine, EngineConfig, EngineHandle, ForwardingPlane, InlineLink, PlaneError,
    PortSpec, RunMode, ShardConfig,
};

/// A hang detector, not a timing (see the shard tests: a loaded 2-core
/// machine runs these far slower than alone).
const DEADLINE: Duration = Duration::from_secs(90);

fn inline_ports(e: &mut EngineHandle, n: usize, deny: &[usize]) -> Vec<InlineLink> {
    let mut links = Vec::new();
    for i in 0..n {
        let (id, link) = e.attach_inline(PortSpec::app(&format!("app{i}"))).unwrap();
        assert_eq!(id as usize, i);
        assert_eq!(link.port(), id);
        links.push(link);
    }
    rules(e, n, deny);
    links
}

fn mode(busy: bool) -> RunMode {
    if busy {
        // The engine's thread takes the engine as often as it can: the
        // senders miss it and hand their messages over.
        RunMode::BusyPoll
    } else {
        RunMode::SpinThenPark { spins: 16 }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    /// Random traffic (routed, unrouted and denied) through the engine
    /// stepped by hand and through inline links to a spawned engine:
    /// every port receives the same messages, each flow in the same order.
    #[test]
    fn inline_senders_deliver_what_the_engine_delivers_in_the_same_flow_order(
        ports in 2usize..6,
        sends in proptest::collection::vec((0usize..6, 0u16..7, 1usize..300), 1..400),
        deny_first in any::<bool>(),
        busy in any::<bool>(),
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
        let mut links = Vec::new();
        for i in 0..ports {
            links.push(one.attach(PortSpec::app(&format!("app{i}"))).unwrap().1);
        }
        rules(&mut one, ports, &deny);
        let mut t = 0u64;
        let want = exchange(&mut links, &traffic, expect, DEADLINE, || {
            one.step(Duration::from_nanos(t));
            t += 1;
        });

        let mut spawned = Engine::new(config).spawn(mode(busy));
        let mut links = inline_ports(&mut spawned, ports, &deny);
        let got = exchange(&mut links, &traffic, expect, DEADLINE, || {});
        // The counters are the engine's own, whoever forwarded.
        let answered: u64 = (0..ports as u16)
            .map(|p| {
                let c = spawned.counters(p).unwrap();
                c.acl_denied + c.no_route
            })
            .sum();
        let errors: usize = want
            .iter()
            .flat_map(|r| r.iter())
            .filter(|((_, error), _)| *error)
            .map(|(_, seqs)| seqs.len())
            .sum();
        drop(links);
        spawned.stop();
        prop_assert_eq!(got, want);
        prop_assert_eq!(answered as usize, errors);
    }
}

/// Eight inline senders on their own threads into one inline receiver,
/// queues two deep: senders race each other and the engine's thread for
/// the engine, and what one cannot forward another or the engine's thread
/// does — nothing lost, every flow in order, every message counted once.
fn hotspot(busy: bool) {
    let config = EngineConfig {
        max_ports: 9,
        voq_depth: 2,
        ring_depth: 8,
        burst: 4,
        ..EngineConfig::default()
    };
    let mut e = Engine::new(config).spawn(mode(busy));
    let mut links = inline_ports(&mut e, 9, &[]);
    const PER_SOURCE: u32 = 5_000;
    let mut sink = links.pop().unwrap();
    let senders: Vec<_> = links
        .into_iter()
        .enumerate()
        .map(|(s, link)| sender(link, s as u16 + 1, 9, PER_SOURCE, 8, DEADLINE))
        .collect();
    receive_in_order(&mut sink, 8 * PER_SOURCE as u64, DEADLINE);
    assert!(try_recv(&mut sink).is_none(), "nothing delivered twice");
    let _links: Vec<InlineLink> = senders.into_iter().map(|t| t.join().unwrap()).collect();
    assert_eq!(e.counters(8).unwrap().tx_msgs, 8 * PER_SOURCE as u64);
    for p in 0..8 {
        assert_eq!(e.counters(p).unwrap().rx_msgs, PER_SOURCE as u64);
    }
    let stalls: u64 = (0..8).map(|p| e.counters(p).unwrap().input_stalls).sum();
    assert!(stalls > 0, "tiny queues must have pushed back");
    drop(sink);
    drop(_links);
    assert!(
        e.stop().is_some(),
        "the engine comes back once no link holds it"
    );
}

#[test]
fn a_hotspot_of_inline_senders_loses_nothing_and_keeps_flow_order() {
    hotspot(false);
}

#[test]
fn inline_senders_racing_a_busy_engine_thread_lose_nothing() {
    hotspot(true);
}

#[test]
fn a_sharded_engine_refuses_inline_ports() {
    let e = spawn_sharded(
        EngineConfig::default(),
        &ShardConfig {
            shards: 2,
            cpus: Vec::new(),
        },
        RunMode::SpinThenPark { spins: 16 },
    )
    .unwrap();
    let err = e.attach_inline(PortSpec::app("a")).err().expect("refused");
    assert!(
        matches!(err, PlaneError::Unsupported { .. }),
        "unexpected {err}"
    );
    e.stop();
}
