//! smoltcp's TCP throughput over a veth between two namespaces, beside the
//! kernel's TCP (iperf3) on the same veth in the same run. smoltcp runs on
//! the `AF_PACKET` rings of one end and sends 64 KiB messages to a plain
//! kernel socket on the other end, which counts what arrives.
//!
//! Run as root: `cargo run --release -p uniplane-smoltcp --example
//! smoltcpbench [-- --jumbo]` (`--jumbo`: MTU 9000 on the veth).

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt;
use uniplane_dataplane::{Message, Uid};
use uniplane_frame::eth::MacAddr;
use uniplane_frame::packet::{PacketConfig, PacketDevice, ETH_P_ALL};
use uniplane_netns::Pair;
use uniplane_smoltcp::{Host, HostConfig};

const SECS: f64 = 3.0;

fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Gbit/s smoltcp sends to a kernel socket for `SECS`, as the kernel
/// counted it.
fn smoltcp(pair: &Pair) -> f64 {
    let server = SocketAddr::from((pair.addr_b, 7200));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sink = pair
        .b
        .spawn(move || {
            let l = TcpListener::bind(server).expect("bind");
            ready_tx.send(()).ok();
            let (mut s, _) = l.accept().expect("accept");
            let mut buf = vec![0u8; 1 << 20];
            let mut total = 0u64;
            let mut first = None;
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        first.get_or_insert_with(Instant::now);
                        total += n as u64;
                    }
                }
            }
            let secs = first.map_or(1.0, |f: Instant| f.elapsed().as_secs_f64());
            total as f64 * 8.0 / secs / 1e9
        })
        .expect("namespace");
    ready_rx.recv().expect("sink up");
    let me = Ipv4Addr::from(u32::from(pair.addr_a) + 2);
    let ia = pair.iface_a.clone();
    pair.a
        .run(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            rt.block_on(async move {
                let cfg = PacketConfig {
                    protocol: ETH_P_ALL,
                    ..PacketConfig::default()
                };
                let dev = PacketDevice::open(&ia, &cfg).expect("packet socket");
                let host = Host::spawn(
                    dev,
                    HostConfig {
                        mac: Some(MacAddr::local(0xbe7c)),
                        addr: me,
                        tcp_tx_buffer: 4 << 20,
                        tcp_rx_buffer: 1 << 20,
                        ..HostConfig::default()
                    },
                )
                .expect("host");
                let mut link = host.connect_tcp(server).await.expect("connect");
                let uid = Uid::new(me, 1).port(1);
                let m = Message::send(uid, uid, Bytes::from(vec![0x5a; 65_000])).expect("msg");
                let start = Instant::now();
                while start.elapsed().as_secs_f64() < SECS {
                    for _ in 0..16 {
                        link.feed(m.clone()).await.expect("send");
                    }
                    link.flush().await.expect("flush");
                }
                link.close().await.expect("close");
                // Let the FIN go out before the host stops.
                tokio::time::sleep(Duration::from_millis(500)).await;
                eprintln!("smoltcp host: {:?}", host.stats());
            })
        })
        .expect("namespace");
    sink.join().expect("sink")
}

/// iperf3's receiver rate over the same veth, in Gbit/s.
fn iperf3(pair: &Pair) -> Option<f64> {
    let port = "5211";
    let addr = pair.addr_b.to_string();
    let mut server = pair
        .b
        .command("iperf3")
        .args(["-s", "-1", "-p", port, "-B", &addr])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    std::thread::sleep(Duration::from_millis(500));
    let out = pair
        .a
        .command("iperf3")
        .args(["-c", &addr, "-p", port, "-t", &format!("{SECS}"), "-f", "g"])
        .output();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.ok()?.stdout).into_owned();
    let line = text.lines().find(|l| l.contains("receiver"))?;
    let words: Vec<&str> = line.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "Gbits/sec")?;
    words.get(at - 1)?.parse().ok()
}

fn main() {
    let jumbo = std::env::args().any(|a| a == "--jumbo");
    let before = load();
    let pair = Pair::new().expect("namespaces (run as root)");
    if jumbo {
        pair.a
            .ip(&["link", "set", "dev", &pair.iface_a, "mtu", "9000"])
            .expect("mtu");
        pair.b
            .ip(&["link", "set", "dev", &pair.iface_b, "mtu", "9000"])
            .expect("mtu");
    }
    let ours = smoltcp(&pair);
    let theirs = iperf3(&pair);
    let _ = Command::new("true").status();
    let after = load();
    let mtu = if jumbo { 9000 } else { 1500 };
    println!("TCP over a veth, MTU {mtu}, {SECS} s each (load before {before}, after {after})");
    println!(
        "{:<44} {:>8.2} Gbit/s",
        "smoltcp on AF_PACKET -> kernel TCP", ours
    );
    match theirs {
        Some(t) => {
            println!(
                "{:<44} {:>8.2} Gbit/s",
                "kernel TCP -> kernel TCP (iperf3)", t
            );
            println!("{:<44} {:>8.2}", "ratio smoltcp / kernel", ours / t);
        }
        None => println!("{:<44} {:>8}", "iperf3", "not run (install iperf3)"),
    }
}
