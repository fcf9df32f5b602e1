//! LTL between two network namespaces joined by veth, through nftables
//! loss and the impairment relay (duplication, reordering, delay): every
//! message arrives once, in order; stopping the relay (the peer vanishes)
//! fails the link within a bounded time. Needs root, iproute2 and
//! nftables: skipped without them unless UNIPLANE_REQUIRE_TOOLS=1.

mod common;

use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::msg;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, Locator};
use uniplane_netns::relay::{Impairment, Relay};
use uniplane_netns::Pair;
use uniplane_stacks::ltl::{LtlConfig, LtlStack};
use uniplane_stacks::udp::UdpConfig;

fn config() -> LtlConfig {
    LtlConfig {
        keepalive_interval: Duration::from_millis(50),
        max_rto: Duration::from_millis(100),
        max_timeouts: 6,
        ..LtlConfig::default()
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn ltl_between_namespaces_survives_loss_duplication_and_reordering_and_detects_a_dead_peer() {
    if !uniplane_netns::require("ltl_between_namespaces", true) {
        return;
    }
    let pair = Pair::new().unwrap();
    pair.a.drop_udp_percent(&pair.iface_a, 10).unwrap();
    pair.b.drop_udp_percent(&pair.iface_b, 10).unwrap();
    let n = 3000u32;

    // B: the LTL server on its loopback, and the relay on the veth address.
    let (server_tx, server_rx) = mpsc::channel::<SocketAddr>();
    let server = pair
        .b
        .spawn(move || {
            runtime().block_on(async move {
                let stack = LtlStack::with_config(config(), UdpConfig::default());
                let (addr, mut listener) =
                    stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
                server_tx.send(addr).unwrap();
                let accept = tokio::time::timeout(Duration::from_secs(20), listener.next());
                let mut link = accept.await.expect("no connection").unwrap().unwrap();
                for i in 0..n {
                    let next = tokio::time::timeout(Duration::from_secs(20), link.next());
                    let m = next.await.expect("stalled").unwrap().unwrap();
                    assert_eq!(m.header().seqnum, i);
                }
                link.send(msg(n, 8)).await.unwrap();
                // Stay up until the client saw the answer.
                let _ = tokio::time::timeout(Duration::from_secs(20), link.next()).await;
            })
        })
        .unwrap();
    let server_addr = server_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    let relay_listen = SocketAddr::new(pair.addr_b.into(), 7000);
    let impairment = Impairment {
        duplicate: 0.05,
        reorder: 0.1,
        delay_chance: 0.05,
        delay: Duration::from_millis(2),
        ..Impairment::none(42)
    };
    let (relay_tx, relay_rx) = mpsc::channel();
    pair.b
        .run(move || {
            let relay = Relay::start(
                relay_listen,
                server_addr,
                impairment,
                Duration::from_secs(30),
            );
            relay_tx.send(relay.unwrap()).unwrap();
        })
        .unwrap();
    let relay = relay_rx.recv().unwrap();

    // A: the client, through the relay.
    let (answered_tx, answered_rx) = mpsc::channel();
    let (stopped_tx, stopped_rx) = mpsc::channel::<()>();
    let client = pair
        .a
        .spawn(move || {
            runtime().block_on(async move {
                let stack = LtlStack::with_config(config(), UdpConfig::default());
                let mut link = tokio::time::timeout(
                    Duration::from_secs(20),
                    stack.connect_link(&Locator::Socket(relay_listen)),
                )
                .await
                .expect("connect timed out")
                .unwrap();
                for i in 0..n {
                    link.feed(msg(i, 200)).await.unwrap();
                }
                link.flush().await.unwrap();
                let answer = tokio::time::timeout(Duration::from_secs(30), link.next());
                let m = answer.await.expect("no answer").unwrap().unwrap();
                assert_eq!(m.header().seqnum, n);
                answered_tx.send(()).unwrap();
                // The relay goes away: the peer is unreachable from now on.
                tokio::task::spawn_blocking(move || {
                    stopped_rx.recv_timeout(Duration::from_secs(20))
                })
                .await
                .unwrap()
                .unwrap();
                let gone = Instant::now();
                link.send(msg(n + 1, 8)).await.unwrap();
                let err = tokio::time::timeout(Duration::from_secs(10), link.next())
                    .await
                    .expect("dead peer not detected")
                    .unwrap()
                    .unwrap_err();
                assert!(matches!(err, LinkError::PeerFailed(_)), "{err}");
                gone.elapsed()
            })
        })
        .unwrap();
    answered_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        relay
            .stats()
            .dropped
            .load(std::sync::atomic::Ordering::Relaxed)
            == 0
    );
    assert!(
        relay
            .stats()
            .received
            .load(std::sync::atomic::Ordering::Relaxed)
            > n as u64 / 20
    );
    relay.stop().unwrap();
    stopped_tx.send(()).unwrap();
    let detected_after = client.join().unwrap();
    // 7 timeouts of at most 100 ms each, plus scheduling slack.
    assert!(
        detected_after < Duration::from_secs(3),
        "{detected_after:?}"
    );
    server.join().unwrap();
}
