//! A SYN flood against the `ltl` stack over real UDP sockets on loopback:
//! the listener answers every SYN with a cookie and keeps nothing, so its
//! table stays empty and the process does not grow, and a real client
//! still connects and exchanges messages afterwards. Alone in its test
//! binary, so the memory it measures is its own.

mod common;

use std::collections::VecDeque;
use std::io::ErrorKind;
use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::{ltl_frame, msg, within};
use futures_util::StreamExt;
use uniplane_dataplane::{LinkExt, Locator};
use uniplane_stacks::ltl::wire::{Frame, Kind};
use uniplane_stacks::ltl::LtlStack;

/// SYNs the flood sends.
const SYNS: u32 = 200_000;
/// SYNs sent before the flood waits for the listener to take them: few
/// enough for the smallest default socket buffer, so the kernel drops none.
const CHUNK: u32 = 256;
/// How much the process may grow while the listener takes the flood. It
/// grows about 0.6 MiB here; a listener that made a connection per SYN
/// grew 21 MiB (its table full at 4096, and the client refused).
const RSS_BOUND: u64 = 8 << 20;

/// The process's resident memory in bytes.
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .expect("resident pages");
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(4096)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1 << 20)
}

#[test]
fn ltl_syn_flood_keeps_memory_bounded() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let stack = LtlStack::new();
    let (addr, mut listener) = rt
        .block_on(async { stack.listen_now(&"127.0.0.1:0".parse().unwrap()) })
        .unwrap();
    let flood = UdpSocket::bind("127.0.0.1:0").unwrap();
    flood.set_nonblocking(true).unwrap();
    let rss_before = rss();

    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut sent, mut most_connections, mut synacks) = (0u32, 0usize, 0u32);
    let mut reply = [0u8; 64];
    while sent < SYNS {
        let chunk_end = (sent + CHUNK).min(SYNS);
        while sent < chunk_end {
            // A connection id and initial sequence number of its own each.
            let isn = sent.wrapping_mul(2_654_435_761);
            let syn = ltl_frame(Kind::Syn, sent + 1, 0, isn, 0, 1024, &[]);
            loop {
                match flood.send_to(&syn, addr) {
                    Ok(_) => break,
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        assert!(Instant::now() < deadline, "the flood could not send");
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("send: {e}"),
                }
            }
            sent += 1;
        }
        // The listener takes the chunk before the next goes.
        while listener.stats().rx_frames < u64::from(sent) {
            assert!(
                Instant::now() < deadline,
                "the listener took {} of {sent} SYNs",
                listener.stats().rx_frames
            );
            std::thread::sleep(Duration::from_micros(200));
        }
        most_connections = most_connections.max(listener.connection_count());
        // Its answers are SYN_ACKs to the forged connections (those the
        // socket buffer had room for).
        loop {
            match flood.recv_from(&mut reply) {
                Ok((n, _)) => {
                    let f = Frame::new_checked(&reply[..n]).expect("a valid frame");
                    assert_eq!(f.kind(), Kind::SynAck);
                    assert!((1..=sent).contains(&f.dst_conn()));
                    synacks += 1;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => panic!("receive: {e}"),
            }
        }
    }
    let rss_flooded = rss();
    let s = listener.stats();
    eprintln!(
        "{SYNS} SYNs: {} answered with cookies, {synacks} SYN_ACKs read back, \
         at most {most_connections} connections; RSS {:.1} MiB before, {:.1} MiB after ({:+.1} MiB)",
        s.syn_cookies,
        mib(rss_before),
        mib(rss_flooded),
        mib(rss_flooded) - mib(rss_before)
    );
    assert_eq!(most_connections, 0);
    assert_eq!(listener.accept_queue_len(), 0);
    assert_eq!(
        s.syn_cookies + s.replies_dropped,
        u64::from(SYNS),
        "every SYN answered or its answer counted: {s:?}"
    );
    assert!(synacks > 0, "no SYN_ACK came back");
    assert_eq!(
        (s.bad_cookies, s.backlog_full, s.refused),
        (0, 0, 0),
        "{s:?}"
    );
    assert!(
        rss_flooded.saturating_sub(rss_before) < RSS_BOUND,
        "the process grew {:.1} MiB",
        mib(rss_flooded.saturating_sub(rss_before))
    );

    // A well-behaved client connects and messages go both ways.
    rt.block_on(async {
        let client_stack = LtlStack::new();
        let mut client = within(10, client_stack.connect_link(&Locator::Socket(addr)))
            .await
            .unwrap();
        let mut server = within(10, listener.next()).await.unwrap().unwrap();
        let n = 200u32;
        let mut batch: VecDeque<_> = (0..n).map(|i| msg(i, 100)).collect();
        within(10, client.send_batch(&mut batch)).await.unwrap();
        let mut got = Vec::new();
        let mut out = Vec::new();
        while got.len() < n as usize {
            out.clear();
            within(10, server.recv_batch(&mut out, 64)).await.unwrap();
            got.extend(out.iter().map(|m| m.header().seqnum));
        }
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        let mut back: VecDeque<_> = (0..n).map(|i| msg(i, 100)).collect();
        within(10, server.send_batch(&mut back)).await.unwrap();
        let mut got = Vec::new();
        while got.len() < n as usize {
            out.clear();
            within(10, client.recv_batch(&mut out, 64)).await.unwrap();
            got.extend(out.iter().map(|m| m.header().seqnum));
        }
        assert_eq!(got, (0..n).collect::<Vec<_>>());
        assert_eq!(listener.connection_count(), 1);
    });
    eprintln!(
        "after the client's exchange: RSS {:.1} MiB, {} connection(s)",
        mib(rss()),
        listener.connection_count()
    );
}
