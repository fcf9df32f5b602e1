//! The `ltl` stack over real UDP sockets on loopback: delivery, garbage,
//! a stalled reader and a killed peer.

mod common;

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{msg, within};
use futures_util::{Sink, SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, LinkExt, Locator};
use uniplane_stacks::ltl::{LtlConfig, LtlStack};
use uniplane_stacks::udp::UdpConfig;

fn quick_failure() -> LtlConfig {
    LtlConfig {
        keepalive_interval: Duration::from_millis(50),
        max_rto: Duration::from_millis(100),
        max_timeouts: 4,
        ..LtlConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_cross_both_ways_in_order() {
    let stack = LtlStack::new();
    let (addr, mut listener) = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let mut client = within(5, stack.connect_link(&Locator::Socket(addr)))
        .await
        .unwrap();
    let mut server = within(5, listener.next()).await.unwrap().unwrap();
    let n = 20_000u32;
    let sender = tokio::spawn(async move {
        let mut batch: VecDeque<_> = (0..n).map(|i| msg(i, 100)).collect();
        client.send_batch(&mut batch).await.unwrap();
        client
    });
    let mut next = 0;
    let mut out = Vec::new();
    while next < n {
        out.clear();
        within(10, server.recv_batch(&mut out, 256)).await.unwrap();
        for m in &out {
            assert_eq!(m.header().seqnum, next);
            next += 1;
        }
    }
    let mut client = sender.await.unwrap();
    server.send(msg(99, 10)).await.unwrap();
    assert_eq!(
        within(5, client.next())
            .await
            .unwrap()
            .unwrap()
            .header()
            .seqnum,
        99
    );
    // Closing ends the other side's stream after everything it sent.
    client.close().await.unwrap();
    assert!(within(5, server.next()).await.is_none());
}

#[tokio::test]
async fn garbage_datagrams_are_counted_and_dropped() {
    let stack = LtlStack::new();
    let (addr, listener) = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.send_to(b"garbage", addr).unwrap();
    raw.send_to(&[1u8; 32], addr).unwrap();
    let t0 = Instant::now();
    while listener.stats().bad_frames < 2 {
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "garbage never counted"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(listener.stats().bad_frames, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_blocks_the_sender_and_loses_nothing() {
    let config = LtlConfig {
        window: 32,
        send_buffer: 32 << 10,
        ..LtlConfig::default()
    };
    let stack = LtlStack::with_config(config, UdpConfig::default());
    let (addr, mut listener) = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
    let mut client = within(5, stack.connect_link(&Locator::Socket(addr)))
        .await
        .unwrap();
    let mut server = within(5, listener.next()).await.unwrap().unwrap();
    let blocked = Arc::new(AtomicBool::new(false));
    let n = 5_000u32;
    let flag = blocked.clone();
    let sender = tokio::spawn(async move {
        for i in 0..n {
            std::future::poll_fn(|cx| match Pin::new(&mut client).poll_ready(cx) {
                std::task::Poll::Pending => {
                    flag.store(true, Ordering::Release);
                    std::task::Poll::Pending
                }
                other => other,
            })
            .await
            .unwrap();
            Pin::new(&mut client).start_send(msg(i, 200)).unwrap();
        }
        client.flush().await.unwrap();
        client
    });
    // The reader has not read anything: the sender must block.
    let t0 = Instant::now();
    while !blocked.load(Ordering::Acquire) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "sender never blocked"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    for i in 0..n {
        let m = within(10, server.next()).await.unwrap().unwrap();
        assert_eq!(m.header().seqnum, i);
    }
    sender.await.unwrap();
}

#[test]
fn a_killed_peer_fails_the_link_within_bounded_time() {
    let (tx, rx) = std::sync::mpsc::channel::<SocketAddr>();
    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    // The server runs on its own runtime; dropping that runtime kills it
    // without a word to the client.
    let server = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let stack = LtlStack::with_config(quick_failure(), UdpConfig::default());
        rt.block_on(async {
            let (addr, mut listener) = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
            tx.send(addr).unwrap();
            let link = listener.next().await.unwrap().unwrap();
            tokio::task::spawn_blocking(move || stop_rx.recv())
                .await
                .ok();
            std::mem::forget(link);
        });
        drop(rt);
    });
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let addr = rx.recv().unwrap();
        let stack = LtlStack::with_config(quick_failure(), UdpConfig::default());
        let mut client = within(5, stack.connect_link(&Locator::Socket(addr)))
            .await
            .unwrap();
        client.send(msg(1, 10)).await.unwrap();
        stop_tx.send(()).unwrap();
        server.join().unwrap();
        let killed = Instant::now();
        client.send(msg(2, 10)).await.unwrap();
        let err = within(5, client.next()).await.unwrap().unwrap_err();
        assert!(matches!(err, LinkError::PeerFailed(_)), "{err}");
        // (max_timeouts + 1) retransmissions, each at most max_rto apart.
        assert!(
            killed.elapsed() < Duration::from_secs(2),
            "{:?}",
            killed.elapsed()
        );
    });
}

#[tokio::test]
async fn ltl_by_name_is_reliable_and_ordered() {
    let caps = uniplane_stacks::by_name("ltl").unwrap().capabilities();
    assert!(caps.reliable && caps.ordered);
    assert_eq!(caps.max_connections, 4096);
}
