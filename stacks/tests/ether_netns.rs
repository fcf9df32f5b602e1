//! The `ether` stack between network namespaces: raw frames on a veth,
//! loss from an nftables `netdev` ingress rule (the `inet` hooks never see
//! EtherType 0x88B5), and duplication, reordering and delay from a
//! frame-level relay in a middle namespace; with LTL every message
//! arrives once, in order. Malformed frames are counted and dropped.
//! Needs root, iproute2 and nftables: skipped without them unless
//! UNIPLANE_REQUIRE_TOOLS=1.

mod common;

use std::collections::HashSet;
use std::sync::mpsc;
use std::time::Duration;

use common::msg;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{Locator, Stack};
use uniplane_frame::eth::{write_header, MacAddr};
use uniplane_frame::packet::{PacketConfig, PacketDevice};
use uniplane_frame::{FrameDevice, TxQueue};
use uniplane_netns::frame_relay::FrameRelay;
use uniplane_netns::relay::Impairment;
use uniplane_netns::{Line, Namespace, Pair};
use uniplane_stacks::ether::{EtherConfig, EtherStack, ETHERTYPE, LTL_ETHERTYPE};
use uniplane_stacks::ltl::LtlConfig;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn reliable(iface: &str) -> EtherConfig {
    EtherConfig {
        interface: Some(iface.to_owned()),
        reliable: true,
        ltl: LtlConfig {
            keepalive_interval: Duration::from_millis(50),
            max_rto: Duration::from_millis(100),
            ..LtlConfig::default()
        },
        ..EtherConfig::default()
    }
}

/// Runs a listener on `iface` in `ns` that expects `n` messages in order
/// (or, unordered, counts what arrives until 1 s of silence) and answers
/// once. Returns its MAC and the thread, which yields the seqnums seen and
/// the stack's malformed count.
fn server(
    ns: &Namespace,
    iface: &str,
    cfg: EtherConfig,
    n: u32,
    ordered: bool,
) -> (MacAddr, std::thread::JoinHandle<(Vec<u32>, u64)>) {
    let (tx, rx) = mpsc::channel();
    let iface = iface.to_owned();
    let t = ns
        .spawn(move || {
            runtime().block_on(async move {
                let stack = EtherStack::with_config(cfg);
                tx.send(stack.local_mac(&iface).unwrap()).unwrap();
                let mut l = stack.listen(&Locator::Name(iface)).await.unwrap();
                let accept = tokio::time::timeout(Duration::from_secs(20), l.next());
                let mut link = accept.await.expect("no link").unwrap().unwrap();
                let mut seen = Vec::new();
                let wait = if ordered { 20 } else { 1 };
                while seen.len() < n as usize {
                    let next = tokio::time::timeout(Duration::from_secs(wait), link.next());
                    match next.await {
                        Ok(Some(Ok(m))) => {
                            let s = m.header().seqnum;
                            if ordered {
                                assert_eq!(s, seen.len() as u32, "out of order");
                            }
                            seen.push(s);
                        }
                        Ok(other) => panic!("link ended: {other:?}"),
                        Err(_) if !ordered => break,
                        Err(_) => panic!("stalled after {} messages", seen.len()),
                    }
                }
                link.send(msg(u32::MAX, 8)).await.unwrap();
                // Stay until the client saw the answer (or gave up).
                let _ = tokio::time::timeout(Duration::from_secs(3), link.next()).await;
                (seen, stack.stats().malformed)
            })
        })
        .unwrap();
    (rx.recv_timeout(Duration::from_secs(10)).unwrap(), t)
}

/// Sends `n` messages from `iface` in `ns` to `peer`, paced so no ring
/// overflows, then waits for the answer.
fn client(ns: &Namespace, iface: &str, cfg: EtherConfig, peer: MacAddr, n: u32) {
    let iface = iface.to_owned();
    ns.run(move || {
        runtime().block_on(async move {
            let cfg = EtherConfig {
                interface: Some(iface),
                ..cfg
            };
            let stack = EtherStack::with_config(cfg);
            let connect = stack.connect(&Locator::Mac(peer.0));
            let mut link = tokio::time::timeout(Duration::from_secs(20), connect)
                .await
                .expect("connect timed out")
                .unwrap();
            for i in 0..n {
                link.feed(msg(i, 200)).await.unwrap();
                if i % 256 == 255 {
                    link.flush().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
            link.flush().await.unwrap();
            let answer = tokio::time::timeout(Duration::from_secs(30), link.next());
            let m = answer.await.expect("no answer").unwrap().unwrap();
            assert_eq!(m.header().seqnum, u32::MAX);
            link.send(msg(0, 8)).await.unwrap();
        })
    })
    .unwrap();
}

#[test]
fn ether_loses_exactly_what_the_netdev_rule_drops() {
    if !uniplane_netns::require("ether_loses_exactly_what_the_netdev_rule_drops", true) {
        return;
    }
    let pair = Pair::new().unwrap();
    pair.b
        .drop_ether_percent(&pair.iface_b, ETHERTYPE, 10)
        .unwrap();
    let n = 5000;
    let cfg = EtherConfig {
        pack: false,
        ..EtherConfig::default()
    };
    let (mac, srv) = server(&pair.b, &pair.iface_b, cfg.clone(), n, false);
    // Unreliable: the client sends and does not wait for an answer.
    let iface = pair.iface_a.clone();
    let sender = pair
        .a
        .spawn(move || {
            runtime().block_on(async move {
                let stack = EtherStack::with_config(EtherConfig {
                    interface: Some(iface),
                    ..cfg
                });
                let mut link = stack.connect(&Locator::Mac(mac.0)).await.unwrap();
                for i in 0..n {
                    link.feed(msg(i, 100)).await.unwrap();
                    if i % 256 == 255 {
                        link.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                link.flush().await.unwrap();
                stack.stats().tx_frames
            })
        })
        .unwrap();
    let sent = sender.join().unwrap();
    let (seen, malformed) = srv.join().unwrap();
    let dropped = pair.b.ether_dropped(&pair.iface_b).unwrap();
    assert_eq!(sent, n as u64);
    assert_eq!(malformed, 0);
    let unique: HashSet<u32> = seen.iter().copied().collect();
    assert_eq!(unique.len(), seen.len(), "no duplicates on a plain veth");
    assert!(
        (n as usize * 80 / 100..n as usize * 97 / 100).contains(&seen.len()),
        "{} of {n} arrived",
        seen.len()
    );
    assert_eq!(
        seen.len() as u64 + dropped,
        n as u64,
        "every loss is the rule's"
    );
}

#[test]
fn ether_with_ltl_delivers_everything_in_order_through_ten_percent_loss_each_way() {
    if !uniplane_netns::require("ether_with_ltl_under_loss", true) {
        return;
    }
    let pair = Pair::new().unwrap();
    pair.a
        .drop_ether_percent(&pair.iface_a, LTL_ETHERTYPE, 10)
        .unwrap();
    pair.b
        .drop_ether_percent(&pair.iface_b, LTL_ETHERTYPE, 10)
        .unwrap();
    let n = 3000;
    let (mac, srv) = server(&pair.b, &pair.iface_b, reliable(&pair.iface_b), n, true);
    client(&pair.a, &pair.iface_a, reliable(&pair.iface_a), mac, n);
    let (seen, _) = srv.join().unwrap();
    assert_eq!(seen.len(), n as usize);
    // The data way (3000 frames and more) certainly lost some. The way
    // back carries only ACKs and NACKs, which LTL sends sparingly: with a
    // few dozen of them a 10 % random rule misses them all in some runs
    // (0.9^30 ≈ 4 %), so that way only shows its rule is in place.
    assert!(pair.b.ether_dropped(&pair.iface_b).unwrap() > 0);
    pair.a.ether_dropped(&pair.iface_a).unwrap();
}

fn impaired(seed: u64) -> Impairment {
    Impairment {
        loss: 0.02,
        duplicate: 0.05,
        reorder: 0.1,
        delay_chance: 0.05,
        delay: Duration::from_millis(2),
        ..Impairment::none(seed)
    }
}

#[test]
fn ether_with_ltl_survives_a_frame_relay_that_drops_duplicates_reorders_and_delays() {
    if !uniplane_netns::require("ether_with_ltl_through_a_frame_relay", true) {
        return;
    }
    let line = Line::new().unwrap();
    let relay = FrameRelay::start(
        &line.m,
        &line.iface_ma,
        &line.iface_mb,
        impaired(7),
        Duration::from_secs(60),
    )
    .unwrap();
    let n = 3000;
    let (mac, srv) = server(&line.b, &line.iface_b, reliable(&line.iface_b), n, true);
    client(&line.a, &line.iface_a, reliable(&line.iface_a), mac, n);
    let (seen, _) = srv.join().unwrap();
    assert_eq!(seen.len(), n as usize);
    let st = relay.stats();
    let dropped = st.dropped.load(std::sync::atomic::Ordering::Relaxed);
    let received = st.received.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        dropped > 0 && received > n as u64 / 10,
        "{received} {dropped}"
    );
    relay.stop().unwrap();
}

#[test]
fn plain_ether_through_the_frame_relay_shows_its_duplicates() {
    if !uniplane_netns::require("plain_ether_through_a_frame_relay", true) {
        return;
    }
    let line = Line::new().unwrap();
    let imp = Impairment {
        duplicate: 0.1,
        ..Impairment::none(3)
    };
    let relay = FrameRelay::start(
        &line.m,
        &line.iface_ma,
        &line.iface_mb,
        imp,
        Duration::from_secs(60),
    )
    .unwrap();
    let n = 2000;
    let cfg = EtherConfig {
        pack: false,
        ..EtherConfig::default()
    };
    let (mac, srv) = server(&line.b, &line.iface_b, cfg.clone(), n * 2, false);
    let iface = line.iface_a.clone();
    line.a
        .run(move || {
            runtime().block_on(async move {
                let stack = EtherStack::with_config(EtherConfig {
                    interface: Some(iface),
                    ..cfg
                });
                let mut link = stack.connect(&Locator::Mac(mac.0)).await.unwrap();
                for i in 0..n {
                    link.feed(msg(i, 100)).await.unwrap();
                    if i % 64 == 63 {
                        link.flush().await.unwrap();
                        tokio::time::sleep(Duration::from_millis(1)).await;
                    }
                }
                link.flush().await.unwrap();
            })
        })
        .unwrap();
    let (seen, _) = srv.join().unwrap();
    let unique: HashSet<u32> = seen.iter().copied().collect();
    assert_eq!(unique.len(), n as usize, "the relay loses nothing here");
    assert!(
        seen.len() > n as usize + n as usize / 20,
        "{} messages for {n} sent: duplicates expected",
        seen.len()
    );
    relay.stop().unwrap();
}

#[test]
fn malformed_frames_are_counted_and_dropped() {
    if !uniplane_netns::require("malformed_ether_frames", false) {
        return;
    }
    let pair = Pair::new().unwrap();
    let (mac, srv) = server(&pair.b, &pair.iface_b, EtherConfig::default(), 1, true);
    let ia = pair.iface_a.clone();
    pair.a
        .run(move || {
            let mut dev = PacketDevice::open(&ia, &PacketConfig::default()).unwrap();
            let src = dev.mac();
            let valid = {
                let mut b = bytes::BytesMut::new();
                msg(0, 20).encode(&mut b);
                b.to_vec()
            };
            let mut trailing = valid.clone();
            trailing.extend_from_slice(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
            let bad: Vec<Vec<u8>> = vec![
                vec![0xff; 100],      // not a message
                valid[..40].to_vec(), // truncated
                trailing,             // trailing garbage
                vec![],               // nothing after the header
            ];
            let (_, tx) = dev.queues();
            for payload in bad.iter().chain(std::iter::once(&valid)) {
                tx.push(14 + payload.len(), |f| {
                    write_header(f, mac, src, ETHERTYPE);
                    f[14..].copy_from_slice(payload);
                })
                .unwrap();
            }
            assert_eq!(tx.flush().unwrap(), 5);
        })
        .unwrap();
    let (seen, malformed) = srv.join().unwrap();
    assert_eq!(seen, vec![0]);
    assert_eq!(malformed, 4);
}
