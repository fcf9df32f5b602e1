//! Raw Ethernet on a veth between two namespaces, beside netsniff-ng's
//! trafgen on the same veth in the same run:
//!
//! - frame layer TX: 60-byte frames (64 on the wire with the FCS) through
//!   the `AF_PACKET` transmit ring, against `trafgen --cpus 1 -n COUNT`;
//! - `ether` stack TX and RX: one message per frame (a bare 32-byte
//!   header, 46-byte frames) and many 32-byte messages packed per frame.
//!
//! Run as root: `cargo run --release -p uniplane-frame --example framebench`
//! (`apt-get install netsniff-ng` for trafgen). Prints a table; `--json`
//! adds one JSON line.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkExt, Locator, Message, Stack, Uid};
use uniplane_frame::eth::{write_header, MacAddr};
use uniplane_frame::packet::{PacketConfig, PacketDevice};
use uniplane_frame::{FrameDevice, TxQueue};
use uniplane_netns::{Namespace, Pair};
use uniplane_stacks::ether::{EtherConfig, EtherStack};

const SECS: f64 = 3.0;
const ROUNDS: usize = 7;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn uptime() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// Pins the calling thread to CPU 0, where `trafgen --cpus 1` runs its
/// worker.
fn pin_cpu0() {
    // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Frames per second the frame layer sends for `secs`.
fn raw_tx(ns: &Namespace, iface: &str, secs: f64) -> f64 {
    let iface = iface.to_owned();
    ns.run(move || {
        pin_cpu0();
        // Ring sizes of 256 to 4096 slots and bursts of 64 to 256 all land
        // within the noise of each other: the kernel's per-frame work
        // (skb, veth transmit) is the cost.
        let cfg = PacketConfig {
            protocol: 0x88b5,
            tx_frames: 512,
            rx_blocks: 2,
            ..PacketConfig::default()
        };
        let burst = 256;
        let mut dev = PacketDevice::open(&iface, &cfg).expect("packet socket");
        let src = dev.mac();
        let (_, tx) = dev.queues();
        let start = Instant::now();
        let mut sent = 0u64;
        while start.elapsed().as_secs_f64() < secs {
            for _ in 0..burst {
                let ok = tx.push(60, |f| {
                    write_header(f, MacAddr::BROADCAST, src, 0x88b5);
                    f[14..].fill(0);
                });
                if ok.is_none() {
                    break;
                }
            }
            sent += tx.flush().expect("flush") as u64;
        }
        while tx.unflushed() > 0 {
            sent += tx.flush().expect("flush") as u64;
        }
        sent as f64 / start.elapsed().as_secs_f64()
    })
    .expect("namespace")
}

/// trafgen's rate: its own count over its own CPU time.
fn trafgen(ns: &Namespace, iface: &str, count: u64) -> Option<f64> {
    let conf = std::env::temp_dir().join(format!("uniplane-trafgen-{}.cfg", std::process::id()));
    std::fs::write(
        &conf,
        "{ fill(0xff, 6), 0x02, 0x75, 0x00, 0x00, 0x00, 0x01, 0x88, 0xb5, fill(0x00, 46) }\n",
    )
    .ok()?;
    let mut child = ns
        .command("trafgen")
        .args([
            "--dev",
            iface,
            "--cpus",
            "1",
            "-n",
            &count.to_string(),
            "--conf",
        ])
        .arg(&conf)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            _ if Instant::now() > deadline => {
                // trafgen's workers outlive a signal to the parent: end the group.
                // SAFETY: signalling the process group this run started.
                unsafe { libc::kill(-(child.id() as i32), libc::SIGTERM) };
                let _ = child.wait();
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    let _ = std::fs::remove_file(&conf);
    // "      3 sec, 964899 usec on CPU0 (3000000 packets)"
    let line = out.lines().find(|l| l.contains("usec on CPU"))?;
    let mut w = line.split_whitespace();
    let sec: f64 = w.next()?.parse().ok()?;
    w.next();
    let usec: f64 = w.next()?.parse().ok()?;
    let packets: f64 = line
        .split('(')
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(packets / (sec + usec / 1e6))
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
    // Alternating one-second runs, so both see the same load (the machine
    // is shared); the medians are compared.
    let (mut ours_all, mut theirs_all) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        let o = raw_tx(&pair.a, &pair.iface_a, 1.0);
        ours_all.push(o);
        if let Some(t) = trafgen(&pair.a, &pair.iface_a, o as u64) {
            theirs_all.push(t);
        }
    }
    let ours = median(&mut ours_all);
    let theirs = (!theirs_all.is_empty()).then(|| median(&mut theirs_all));
    let (one_tx, one_frames, one_rx) = ether(&pair, false, 0);
    let (pk_tx, pk_frames, pk_rx) = ether(&pair, true, 0);
    let load_after = uptime();

    println!("raw Ethernet on a veth, median of {ROUNDS} alternating 1 s runs; ether {SECS} s (load before {load_before}, after {load_after})");
    println!("{:<44} {:>12}", "measure", "rate");
    let list = |v: &[f64]| {
        v.iter()
            .map(|x| format!("{:.0}", x / 1e3))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!(
        "{:<44} {:>9.0} kpps",
        "frame layer TX, 60 B frames (TX ring)",
        ours / 1e3
    );
    println!("  runs (1 s each, kpps): {}", list(&ours_all));
    match theirs {
        Some(t) => {
            println!(
                "{:<44} {:>9.0} kpps",
                "trafgen --cpus 1, same frames",
                t / 1e3
            );
            println!("  runs (kpps): {}", list(&theirs_all));
            println!("{:<44} {:>12.2}", "ratio frame layer / trafgen", ours / t);
        }
        None => println!("{:<44} {:>12}", "trafgen", "not run (install netsniff-ng)"),
    }
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
            "{{\"raw_tx_pps\":{ours:.0},\"trafgen_pps\":{},\"ether_tx_pps\":{one_tx:.0},\"ether_rx_pps\":{one_rx:.0},\"ether_packed_tx_mps\":{pk_tx:.0},\"ether_packed_rx_mps\":{pk_rx:.0},\"load\":\"{load_before}\"}}",
            theirs.map_or("null".into(), |t| format!("{t:.0}"))
        );
    }
}
