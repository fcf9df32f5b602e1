//! The `ether` stack on a veth between two namespaces: TX and RX with one
//! message per frame (a bare 32-byte header, 46-byte frames) and with many
//! 32-byte messages packed per frame.
//!
//! Raw frame-layer transmit beside netsniff-ng's trafgen on the same veth
//! is `uniplane-bench peer --tool trafgen --stack ether` (root).
//!
//! Run as root: `cargo run --release -p uniplane-frame --example framebench`.
//! Prints a table; `--json` adds one JSON line.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkExt, Locator, Message, Stack, Uid};
use uniplane_netns::Pair;
use uniplane_stacks::ether::{EtherConfig, EtherStack};

const SECS: f64 = 3.0;

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

/// Messages per second (sent, received) through the ether stack, with
/// `payload` bytes each, packed or one per frame.
fn ether(pair: &Pair, pack: bool, payload: usize) -> (f64, f64, f64) {
    let cfg = EtherConfig {
        pack,
        ..EtherConfig::default()
    };
    let (mac_tx, mac_rx) = std::sync::mpsc::channel();
    let (ib, cb) = (pair.iface_b.clone(), cfg.clone());
    let receiver = pair
        .b
        .spawn(move || {
            runtime().block_on(async move {
                let stack = EtherStack::with_config(cb);
                mac_tx.send(stack.local_mac(&ib).expect("device")).ok();
                let mut l = stack.listen(&Locator::Name(ib)).await.expect("listen");
                let mut link = l.next().await.expect("link").expect("link");
                let mut buf = Vec::with_capacity(1024);
                let mut n = 0u64;
                let mut first: Option<Instant> = None;
                let mut last = Instant::now();
                loop {
                    buf.clear();
                    let got = tokio::time::timeout(
                        Duration::from_millis(500),
                        link.recv_batch(&mut buf, 1024),
                    );
                    match got.await {
                        Ok(Ok(k)) if k > 0 => {
                            first.get_or_insert_with(Instant::now);
                            n += k as u64;
                            last = Instant::now();
                        }
                        _ => break,
                    }
                }
                let span = first.map_or(1.0, |f| (last - f).as_secs_f64().max(1e-3));
                n as f64 / span
            })
        })
        .expect("namespace");
    let mac = mac_rx.recv().expect("receiver up");
    let ia = pair.iface_a.clone();
    let (sent_rate, frame_rate) = pair
        .a
        .run(move || {
            runtime().block_on(async move {
                let stack = EtherStack::with_config(EtherConfig {
                    interface: Some(ia),
                    ..cfg
                });
                let mut link = stack.connect(&Locator::Mac(mac.0)).await.expect("connect");
                let uid = Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), 1).port(1);
                let m = Message::send(uid, uid, bytes::Bytes::from(vec![7u8; payload]))
                    .expect("message");
                let start = Instant::now();
                let mut n = 0u64;
                while start.elapsed().as_secs_f64() < SECS {
                    for _ in 0..64 {
                        link.feed(m.clone()).await.expect("send");
                    }
                    n += 64;
                }
                link.flush().await.expect("flush");
                let t = start.elapsed().as_secs_f64();
                (n as f64 / t, stack.stats().tx_frames as f64 / t)
            })
        })
        .expect("namespace");
    let recv_rate = receiver.join().expect("receiver");
    (sent_rate, frame_rate, recv_rate)
}

fn main() {
    let json = std::env::args().any(|a| a == "--json");
    let load_before = uptime();
    let pair = Pair::new().expect("namespaces (run as root)");
    let (one_tx, one_frames, one_rx) = ether(&pair, false, 0);
    let (pk_tx, pk_frames, pk_rx) = ether(&pair, true, 0);
    let load_after = uptime();

    println!(
        "the ether stack on a veth, {SECS} s each (load before {load_before}, after {load_after})"
    );
    println!("{:<44} {:>12}", "measure", "rate");
    println!(
        "{:<44} {:>9.0} kpps",
        "ether TX, one 32 B message per frame",
        one_tx / 1e3
    );
    println!("{:<44} {:>9.0} kpps", "  frames sent", one_frames / 1e3);
    println!(
        "{:<44} {:>9.0} kpps",
        "ether RX, one message per frame",
        one_rx / 1e3
    );
    println!(
        "{:<44} {:>9.0} kmsg/s",
        "ether TX, 32 B messages packed",
        pk_tx / 1e3
    );
    println!("{:<44} {:>9.0} kpps", "  frames sent", pk_frames / 1e3);
    println!("{:<44} {:>9.0} kmsg/s", "ether RX, packed", pk_rx / 1e3);
    if json {
        println!(
            "{{\"ether_tx_pps\":{one_tx:.0},\"ether_rx_pps\":{one_rx:.0},\"ether_packed_tx_mps\":{pk_tx:.0},\"ether_packed_rx_mps\":{pk_rx:.0},\"load\":\"{load_before}\"}}"
        );
    }
}
