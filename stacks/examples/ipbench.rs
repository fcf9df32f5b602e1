//! Quick figures for the IP stacks on loopback, one run each:
//! `cargo run --release -p uniplane-stacks --example ipbench`.
//!
//! udp pps of 64-byte messages (one per datagram, and packed), epoll and
//! io_uring; tcp throughput; udp round trip p50; ltl goodput at 0 % and
//! 1 % datagram loss. The packet generator in `bench/` is the reference
//! harness; this is a smoke measurement for docs/stacks-ip.md.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkExt, Locator, Message, SplitMix64, Uid};
use uniplane_stacks::datagram::{Datagram, DatagramPort, PortStats, TxBatch};
use uniplane_stacks::ltl::{spawn_endpoint, LtlConfig};
use uniplane_stacks::tcp::TcpStack;
use uniplane_stacks::udp::{Backend, UdpConfig, UdpPort, UdpStack};

const SECS: f64 = 2.0;

fn msg(payload: usize) -> Message {
    let a = Uid::new(std::net::Ipv4Addr::LOCALHOST, 1).port(1);
    let b = Uid::new(std::net::Ipv4Addr::LOCALHOST, 2).port(2);
    Message::send(a, b, Bytes::from(vec![7u8; payload])).unwrap()
}

async fn udp_pps(cfg: UdpConfig) -> (f64, f64) {
    let stack = UdpStack::with_config(cfg);
    let mut listener = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = Locator::Socket(listener.local_addr());
    let mut tx = stack.connect_now(&addr).unwrap();
    tx.send(msg(32)).await.unwrap();
    let mut rx = listener.next().await.unwrap().unwrap();
    let counter = tokio::spawn(async move {
        let mut n = 0u64;
        let mut out = Vec::with_capacity(1024);
        let end = Instant::now() + Duration::from_secs_f64(SECS + 0.5);
        while Instant::now() < end {
            out.clear();
            match tokio::time::timeout(Duration::from_millis(200), rx.recv_batch(&mut out, 1024))
                .await
            {
                Ok(Ok(k)) => n += k as u64,
                _ => break,
            }
        }
        n
    });
    let start = Instant::now();
    let mut sent = 0u64;
    let template = msg(32);
    let mut batch = VecDeque::with_capacity(256);
    while start.elapsed().as_secs_f64() < SECS {
        batch.extend(std::iter::repeat_n(template.clone(), 256));
        tx.send_batch(&mut batch).await.unwrap();
        sent += 256;
    }
    let el = start.elapsed().as_secs_f64();
    let got = counter.await.unwrap();
    (sent as f64 / el, got as f64 / el)
}

async fn tcp_gbps() -> f64 {
    let stack = TcpStack::new();
    let mut listener = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = Locator::Socket(listener.local_addr().unwrap());
    let mut tx = stack.connect_link(&addr).await.unwrap();
    let mut rx = listener.next().await.unwrap().unwrap();
    let counter = tokio::spawn(async move {
        let mut bytes = 0u64;
        let mut out = Vec::with_capacity(256);
        loop {
            out.clear();
            match rx.recv_batch(&mut out, 256).await {
                Ok(0) | Err(_) => break,
                Ok(_) => bytes += out.iter().map(|m| m.encoded_len() as u64).sum::<u64>(),
            }
        }
        bytes
    });
    let big = msg(65_000);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < SECS {
        for _ in 0..64 {
            tx.feed(big.clone()).await.unwrap();
        }
        tx.flush().await.unwrap();
    }
    tx.close().await.unwrap();
    drop(tx);
    let bytes = counter.await.unwrap();
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

async fn udp_rtt_p50() -> Duration {
    let stack = UdpStack::new();
    let mut listener = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = Locator::Socket(listener.local_addr());
    let mut a = stack.connect_now(&addr).unwrap();
    a.send(msg(32)).await.unwrap();
    let mut b = listener.next().await.unwrap().unwrap();
    b.next().await;
    tokio::spawn(async move {
        while let Some(Ok(m)) = b.next().await {
            if b.send(m).await.is_err() {
                break;
            }
        }
    });
    let mut rtts = Vec::new();
    for _ in 0..20_000 {
        let t = Instant::now();
        a.send(msg(32)).await.unwrap();
        match tokio::time::timeout(Duration::from_millis(100), a.next()).await {
            Ok(Some(Ok(_))) => rtts.push(t.elapsed()),
            _ => continue,
        }
    }
    rtts.sort();
    rtts[rtts.len() / 2]
}

/// A port that drops a share of what it receives: loss for LTL.
struct Lossy {
    inner: UdpPort,
    rng: SplitMix64,
    loss: f64,
}

impl DatagramPort for Lossy {
    type Addr = SocketAddr;
    fn local_addr(&self) -> SocketAddr {
        self.inner.local_addr()
    }
    fn max_datagram_size(&self) -> usize {
        self.inner.max_datagram_size()
    }
    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<SocketAddr>>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        let start = out.len();
        let r = self.inner.poll_recv(cx, out, max);
        if let Poll::Ready(Ok(_)) = r {
            let mut kept = start;
            for i in start..out.len() {
                if !self.rng.chance(self.loss) {
                    out.swap(kept, i);
                    kept += 1;
                }
            }
            out.truncate(kept);
            return Poll::Ready(Ok(kept - start));
        }
        r
    }
    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        b: &mut TxBatch<SocketAddr>,
    ) -> Poll<io::Result<()>> {
        self.inner.poll_send(cx, b)
    }
    fn stats(&self) -> PortStats {
        self.inner.stats()
    }
}

async fn ltl_goodput(loss: f64) -> f64 {
    let udp = UdpConfig {
        pack: false,
        ..UdpConfig::default()
    };
    let lossy = |seed| Lossy {
        inner: UdpPort::bind("127.0.0.1:0".parse().unwrap(), &udp).unwrap(),
        rng: SplitMix64::new(seed),
        loss,
    };
    let server = spawn_endpoint(lossy(1), LtlConfig::default(), 11);
    let mut listener = server.listen();
    let client = spawn_endpoint(lossy(2), LtlConfig::default(), 22);
    let mut tx = client.connect(server.local_addr()).await.unwrap();
    let mut rx = listener.next().await.unwrap().unwrap();
    let counter = tokio::spawn(async move {
        let mut bytes = 0u64;
        let mut out = Vec::with_capacity(256);
        loop {
            out.clear();
            match rx.recv_batch(&mut out, 256).await {
                Ok(0) | Err(_) => break,
                Ok(_) => bytes += out.iter().map(|m| m.payload().len() as u64).sum::<u64>(),
            }
        }
        bytes
    });
    let m = msg(1400);
    let start = Instant::now();
    while start.elapsed().as_secs_f64() < SECS {
        for _ in 0..64 {
            tx.feed(m.clone()).await.unwrap();
        }
        tx.flush().await.unwrap();
    }
    tx.close().await.unwrap();
    let bytes = counter.await.unwrap();
    bytes as f64 * 8.0 / start.elapsed().as_secs_f64() / 1e9
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    for (name, backend) in [("epoll", Backend::Epoll), ("io_uring", Backend::IoUring)] {
        for pack in [false, true] {
            let cfg = UdpConfig {
                backend,
                pack,
                ..UdpConfig::default()
            };
            let (sent, got) = udp_pps(cfg).await;
            println!(
                "udp {name:8} 64 B messages {}: sent {:.0} kpps, received {:.0} kpps",
                if pack { "packed    " } else { "1/datagram" },
                sent / 1e3,
                got / 1e3
            );
        }
    }
    println!("tcp 65 KB messages: {:.2} Gbit/s", tcp_gbps().await);
    println!(
        "udp round trip p50, 64 B: {:.1} us",
        udp_rtt_p50().await.as_secs_f64() * 1e6
    );
    let g0 = ltl_goodput(0.0).await;
    let g1 = ltl_goodput(0.01).await;
    println!(
        "ltl goodput 1400 B: {g0:.2} Gbit/s at 0 % loss, {g1:.2} Gbit/s at 1 % ({:.2}x)",
        g1 / g0
    );
}
