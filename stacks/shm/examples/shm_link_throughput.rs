//! One-way throughput of a `ShmLink` between two threads, each with its own
//! tokio runtime (as the daemon and an application would be): messages per
//! second and payload GB/s per size, batches of 64 per flush, with the
//! doorbells and parks each side counted.
//!
//! ```text
//! cargo run --release -p uniplane-shm --example shm_link_throughput
//! ```

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use futures_util::SinkExt;
use uniplane_dataplane::{LinkExt, Message, Uid};
use uniplane_shm::sys::pin_to_cpu;
use uniplane_shm::{ShmConfig, ShmLink};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn run(size: usize, total: usize) -> (f64, uniplane_shm::ShmLinkStats, uniplane_shm::ShmLinkStats) {
    let (sa, sb) = std::os::unix::net::UnixStream::pair().expect("socketpair");
    sa.set_nonblocking(true).ok();
    sb.set_nonblocking(true).ok();
    let spin_us: u64 = std::env::var("SPIN_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let cfg = ShmConfig {
        spin: std::time::Duration::from_micros(spin_us),
        ..ShmConfig::default()
    };
    let cfg2 = cfg.clone();
    let receiver = std::thread::spawn(move || {
        let _ = pin_to_cpu(1);
        runtime().block_on(async move {
            let s = tokio::net::UnixStream::from_std(sb).expect("socket");
            let mut link = ShmLink::join(s, &cfg2).await.expect("join");
            let mut out = Vec::with_capacity(256);
            let mut got = 0;
            while got < total {
                out.clear();
                match link.recv_batch(&mut out, 256).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            (got, link.stats())
        })
    });
    let _ = pin_to_cpu(0);
    let rt = runtime();
    let (start, sender) = rt.block_on(async move {
        let s = tokio::net::UnixStream::from_std(sa).expect("socket");
        let mut link = ShmLink::serve(s, &cfg).expect("serve");
        let uid = Uid::new(std::net::Ipv4Addr::LOCALHOST, 1);
        let m =
            Message::send(uid.port(1), uid.port(2), Bytes::from(vec![7u8; size])).expect("message");
        let mut batch = VecDeque::with_capacity(64);
        let start = Instant::now();
        let mut sent = 0;
        while sent < total {
            let n = 64.min(total - sent);
            batch.extend(std::iter::repeat_n(m.clone(), n));
            link.send_batch(&mut batch).await.expect("send");
            sent += n;
        }
        link.flush().await.expect("flush");
        (start, link)
    });
    let (got, rx_stats) = receiver.join().expect("receiver");
    // The sender's link stays open until everything arrived.
    let took = start.elapsed().as_secs_f64();
    assert_eq!(got, total);
    (took, sender.stats(), rx_stats)
}

fn main() {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("# ShmLink one-way, batches of 64; loadavg {}", load.trim());
    println!(
        "{:>7} {:>9} {:>10} {:>8} {:>10} {:>10} {:>9} {:>9}",
        "bytes", "messages", "Mmsg/s", "GB/s", "tx bells", "rx bells", "tx parks", "rx parks"
    );
    for (size, total) in [
        (8, 2_000_000),
        (64, 2_000_000),
        (1536, 1_000_000),
        (9600, 300_000),
        (65535, 60_000),
    ] {
        let (took, tx, rx) = run(size, total);
        println!(
            "{:>7} {:>9} {:>10.2} {:>8.2} {:>10} {:>10} {:>9} {:>9}",
            size,
            total,
            total as f64 / took / 1e6,
            (size * total) as f64 / took / 1e9,
            tx.doorbells,
            rx.doorbells,
            tx.parks,
            rx.parks
        );
    }
}
