//! Figures for the IP stacks on loopback beside their peers, in one run:
//! `cargo run --release -p uniplane-stacks --example ipbench [SECTION..]`
//! with sections `udp`, `tcp`, `rtt`, `rtt-busy`, `ltl` (all by default).
//!
//! - udp: messages per second of 64-byte messages (one per datagram, and
//!   packed), epoll and io_uring, beside `iperf3 -u -b 0 -l 64`;
//! - tcp: throughput of 65 KB messages beside `iperf3`;
//! - rtt: round trip p50 of 64-byte datagrams, waiting in epoll (or
//!   io_uring), beside `sockperf ping-pong -m 64` blocking in recvfrom
//!   (sockperf's figures are half a round trip: doubled here to compare
//!   round trip with round trip);
//! - rtt-busy: the same with both sides busy polling, beside sockperf
//!   with `--nonblocked` sockets on both sides (it then spins on them);
//! - ltl: goodput of 1400-byte messages at 0 % and 1 % datagram loss, with
//!   the counters that explain it.
//!
//! Peers that are not installed are reported missing. The machine's load
//! average is printed before and after: figures on a shared two-core
//! machine move with it. The packet generator in `bench/` is the
//! reference harness; this is the measurement behind docs/stacks-ip.md.

use std::collections::VecDeque;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use std::future::Future;
use uniplane_dataplane::{LinkExt, Locator, Message, Uid};
use uniplane_stacks::datagram::fault::LossyPort;
use uniplane_stacks::ltl::{spawn_endpoint, LtlConfig, LtlStats};
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

/// Polls `next` until a message comes, or `deadline` (a timer registered
/// once for the whole run, so waiting costs no timer per message) passes.
async fn next_before(
    link: &mut uniplane_stacks::udp::UdpLink,
    deadline: &mut std::pin::Pin<&mut tokio::time::Sleep>,
) -> Option<Message> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(m) = link.poll_next_unpin(cx) {
            return Poll::Ready(m.and_then(Result::ok));
        }
        deadline.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// Round-trip p50 of 64-byte datagrams (32-byte header, 32-byte payload):
/// each side on its own thread with its own single-threaded runtime, as
/// sockperf's client and server are two single-threaded processes.
fn udp_rtt_p50(cfg: UdpConfig, rounds: usize) -> Duration {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    };
    const BYE: u32 = u32::MAX;
    let budget = Duration::from_secs(30);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let server_cfg = cfg.clone();
    let server = std::thread::spawn(move || {
        runtime().block_on(async move {
            let stack = UdpStack::with_config(server_cfg);
            let mut listener = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
            addr_tx.send(listener.local_addr()).unwrap();
            let deadline = tokio::time::sleep(budget);
            tokio::pin!(deadline);
            let mut b = tokio::select! {
                l = listener.next() => l.unwrap().unwrap(),
                () = &mut deadline => return,
            };
            while let Some(m) = next_before(&mut b, &mut deadline).await {
                if m.header().seqnum == BYE || b.send(m).await.is_err() {
                    break;
                }
            }
        })
    });
    let addr = Locator::Socket(addr_rx.recv().unwrap());
    let client = std::thread::spawn(move || {
        runtime().block_on(async move {
            let stack = UdpStack::with_config(cfg);
            let mut a = stack.connect_now(&addr).unwrap();
            let deadline = tokio::time::sleep(budget);
            tokio::pin!(deadline);
            let mut rtts = Vec::with_capacity(rounds);
            let m = msg(32);
            for i in 0..rounds + 1000 {
                let t = Instant::now();
                a.send(m.clone()).await.unwrap();
                if next_before(&mut a, &mut deadline).await.is_none() {
                    break;
                }
                // The first thousand warm up.
                if i >= 1000 {
                    rtts.push(t.elapsed());
                }
            }
            let mut bye = msg(0);
            bye.set_seqnum(BYE);
            let _ = a.send(bye).await;
            rtts
        })
    });
    let mut rtts = client.join().unwrap();
    server.join().unwrap();
    rtts.sort();
    rtts.get(rtts.len() / 2).copied().unwrap_or(Duration::MAX)
}

async fn ltl_goodput(loss: f64) -> (f64, LtlStats) {
    let udp = UdpConfig {
        pack: false,
        ..UdpConfig::default()
    };
    let lossy = |seed| {
        let port = UdpPort::bind("127.0.0.1:0".parse().unwrap(), &udp).unwrap();
        LossyPort::new(port, loss, seed).unwrap()
    };
    let cfg = LtlConfig::default();
    let server = spawn_endpoint(lossy(1), cfg.clone(), 11);
    let mut listener = server.listen();
    let client = spawn_endpoint(lossy(2), cfg, 22);
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
    let el = start.elapsed().as_secs_f64();
    (bytes as f64 * 8.0 / el / 1e9, client.stats())
}

/// The load average, as `uptime` prints it.
fn load() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// A port on loopback nothing listens at now.
fn free_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map_or(0, |a| a.port())
}

/// Runs a peer's server and client; returns the client's output, or why
/// not. The server is stopped (by its process id) whatever happens.
fn run_peer(server: &[&str], client: &[&str]) -> Result<String, String> {
    use std::process::{Command, Stdio};
    let mut srv = Command::new(server[0])
        .args(&server[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("{}: {e}", server[0]))?;
    let mut result = Err(format!("{} did not run", client[0]));
    // The server needs a moment to listen; retry a refused client a few times.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(200));
        match Command::new(client[0]).args(&client[1..]).output() {
            Ok(out) if out.status.success() => {
                result = Ok(String::from_utf8_lossy(&out.stdout).into_owned());
                break;
            }
            Ok(out) => result = Err(String::from_utf8_lossy(&out.stderr).into_owned()),
            Err(e) => {
                result = Err(format!("{}: {e}", client[0]));
                break;
            }
        }
    }
    let _ = srv.kill();
    let _ = srv.wait();
    result
}

/// iperf3's UDP datagrams per second, sent and received, from its summary.
fn iperf3_udp_pps() -> Result<(f64, f64), String> {
    let port = free_port().to_string();
    let out = run_peer(
        &["iperf3", "-s", "-1", "-p", &port],
        &[
            "iperf3",
            "-c",
            "127.0.0.1",
            "-p",
            &port,
            "-u",
            "-b",
            "0",
            "-l",
            "64",
            "-t",
            "3",
        ],
    )?;
    let mut sent = None;
    let mut received = None;
    for line in out.lines() {
        // "[  5]   0.00-3.00  sec ... 0.000 ms  0/1389283 (0%)  sender"
        let words: Vec<&str> = line.split_whitespace().collect();
        let secs = words.iter().find_map(|w| {
            w.split_once('-')
                .and_then(|(a, b)| Some(b.parse::<f64>().ok()? - a.parse::<f64>().ok()?))
        });
        let counts = words.iter().find_map(|w| {
            let (lost, total) = w.split_once('/')?;
            Some((lost.parse::<f64>().ok()?, total.parse::<f64>().ok()?))
        });
        if let (Some(secs), Some((lost, total))) = (secs, counts) {
            if line.ends_with("sender") {
                sent = Some(total / secs);
            } else if line.ends_with("receiver") {
                received = Some((total - lost) / secs);
            }
        }
    }
    sent.zip(received)
        .ok_or_else(|| "no summary in iperf3's output".into())
}

/// iperf3's TCP throughput in Gbit/s, from its sender summary.
fn iperf3_tcp_gbps() -> Result<f64, String> {
    let port = free_port().to_string();
    let out = run_peer(
        &["iperf3", "-s", "-1", "-p", &port],
        &["iperf3", "-c", "127.0.0.1", "-p", &port, "-t", "3"],
    )?;
    out.lines()
        .filter(|l| l.ends_with("sender"))
        .find_map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            let at = words.iter().position(|w| w.ends_with("bits/sec"))?;
            let v: f64 = words.get(at.checked_sub(1)?)?.parse().ok()?;
            Some(match words[at] {
                "Gbits/sec" => v,
                "Mbits/sec" => v / 1e3,
                _ => v / 1e9,
            })
        })
        .ok_or_else(|| "no summary in iperf3's output".into())
}

/// sockperf's ping-pong p50 as a round trip (it reports half of one).
/// With `busy` both sides open non-blocking sockets and spin on them.
fn sockperf_rtt_p50(busy: bool) -> Result<Duration, String> {
    let port = free_port().to_string();
    let mut server = vec!["sockperf", "server", "-i", "127.0.0.1", "-p", &port];
    let mut client = vec![
        "sockperf",
        "ping-pong",
        "-i",
        "127.0.0.1",
        "-p",
        &port,
        "-m",
        "64",
        "-t",
        "3",
    ];
    if busy {
        server.push("--nonblocked");
        client.push("--nonblocked");
    }
    let out = run_peer(&server, &client)?;
    out.lines()
        .find_map(|l| {
            let (_, v) = l.split_once("percentile 50.000 =")?;
            v.trim().parse::<f64>().ok()
        })
        .map(|half_us| Duration::from_secs_f64(2.0 * half_us / 1e6))
        .ok_or_else(|| "no p50 in sockperf's output".into())
}

fn ratio(ours: f64, peer: Result<f64, &String>) -> String {
    match peer {
        Ok(p) if p > 0.0 => format!("{:.2}x", ours / p),
        _ => "-".into(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let only: Vec<String> = std::env::args().skip(1).collect();
    let want = |s: &str| only.is_empty() || only.iter().any(|o| o == s);
    println!("load average before: {}", load());
    if want("udp") {
        let peer = iperf3_udp_pps();
        match &peer {
            Ok((sent, got)) => println!(
                "iperf3 -u -b 0 -l 64 -t 3: sent {:.0} kpps, received {:.0} kpps",
                sent / 1e3,
                got / 1e3
            ),
            Err(e) => println!("iperf3 (udp): {}", e.trim()),
        }
        let mut epoll = [0.0; 2];
        for (name, backend) in [("epoll", Backend::Epoll), ("io_uring", Backend::IoUring)] {
            for (k, pack) in [false, true].into_iter().enumerate() {
                let cfg = UdpConfig {
                    backend,
                    pack,
                    ..UdpConfig::default()
                };
                let (sent, got) = udp_pps(cfg).await;
                let vs = if backend == Backend::Epoll {
                    epoll[k] = sent;
                    if pack {
                        String::new()
                    } else {
                        format!(
                            " ({} of iperf3's sent)",
                            ratio(sent, peer.as_ref().map(|p| p.0))
                        )
                    }
                } else {
                    format!(
                        " ({} of epoll's sent)",
                        ratio(sent, Ok::<_, &String>(epoll[k]))
                    )
                };
                println!(
                    "udp {name:8} 64 B messages {}: sent {:.0} kpps, received {:.0} kpps{vs}",
                    if pack { "packed    " } else { "1/datagram" },
                    sent / 1e3,
                    got / 1e3
                );
            }
        }
    }
    if want("tcp") {
        let peer = iperf3_tcp_gbps();
        let ours = tcp_gbps().await;
        match &peer {
            Ok(g) => println!("iperf3 -t 3 (tcp): {g:.2} Gbit/s"),
            Err(e) => println!("iperf3 (tcp): {}", e.trim()),
        }
        println!(
            "tcp 65 KB messages: {ours:.2} Gbit/s ({} of iperf3)",
            ratio(ours, peer.as_ref().copied())
        );
    }
    for (section, busy) in [("rtt", false), ("rtt-busy", true)] {
        if !want(section) {
            continue;
        }
        // Like with like: sockperf blocks in recvfrom unless its sockets
        // are non-blocking, then it spins on recvfrom as ours spins.
        let peer = sockperf_rtt_p50(busy);
        let how = if busy { " --nonblocked" } else { "" };
        match &peer {
            Ok(d) => println!(
                "sockperf ping-pong -m 64 -t 3{how}: p50 {:.2} us one way = {:.2} us round trip",
                d.as_secs_f64() * 1e6 / 2.0,
                d.as_secs_f64() * 1e6
            ),
            Err(e) => println!("sockperf{how}: {}", e.trim()),
        }
        let spin = busy.then(|| Duration::from_micros(200));
        for (name, backend) in [("epoll", Backend::Epoll), ("io_uring", Backend::IoUring)] {
            // The latency configuration: GRO batches nothing in a
            // ping-pong and costs each receive ~0.2 us here.
            let cfg = UdpConfig {
                backend,
                gro: false,
                busy_poll: spin,
                ..UdpConfig::default()
            };
            let ours = udp_rtt_p50(cfg, 200_000).as_secs_f64();
            println!(
                "udp round trip p50, 64 B, {name}{}: {:.2} us ({} of sockperf's)",
                if busy { ", busy poll" } else { "" },
                ours * 1e6,
                ratio(ours, peer.as_ref().map(Duration::as_secs_f64))
            );
        }
    }
    if want("ltl") {
        // Lossless and lossy runs alternate, three each; medians are
        // printed, as two cores shared by four busy tasks make single
        // runs swing.
        let mut runs: [Vec<(f64, LtlStats)>; 2] = [Vec::new(), Vec::new()];
        for _ in 0..3 {
            for (k, loss) in [0.0, 0.01].into_iter().enumerate() {
                runs[k].push(ltl_goodput(loss).await);
            }
        }
        for r in &mut runs {
            r.sort_by(|a, b| a.0.total_cmp(&b.0));
        }
        let (g0, g1, s) = (runs[0][1].0, runs[1][1].0, runs[1][1].1);
        let all = |k: usize| {
            runs[k]
                .iter()
                .map(|r| format!("{:.2}", r.0))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!(
            "ltl goodput 1400 B, median of 3: {g0:.2} Gbit/s at 0 % loss, {g1:.2} Gbit/s at 1 % \
             ({:.2}x); runs {} / {}",
            g1 / g0,
            all(0),
            all(1)
        );
        println!(
            "  median run at 1 %: {} frames sent, {} again after a NACK, {} as probes, {} after \
             a timeout ({} timeouts), blocked on credit {:.0} ms",
            s.tx_frames,
            s.fast_retransmits,
            s.probe_retransmits,
            s.timeout_retransmits,
            s.timeouts,
            s.blocked_micros as f64 / 1e3
        );
    }
    println!("load average after: {}", load());
}
