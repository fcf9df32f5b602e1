//! The `udp` stack on loopback: packing, bursts, both backends, and what
//! happens to garbage.

mod common;

use std::collections::VecDeque;
use std::net::UdpSocket;

use common::{msg, tools_required, within};
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, LinkExt, Locator};
use uniplane_stacks::udp::{uring, Backend, UdpConfig, UdpStack};

fn loopback() -> Locator {
    "127.0.0.1:0".parse().unwrap()
}

async fn exchange(stack: UdpStack, n: u32) {
    let mut listener = stack.listen_now(&loopback()).unwrap();
    let server_addr = Locator::Socket(listener.local_addr());
    let mut client = stack.connect_now(&server_addr).unwrap();
    let mut batch: VecDeque<_> = (0..n).map(|i| msg(i, 40)).collect();
    client.send_batch(&mut batch).await.unwrap();
    let mut server = within(5, listener.next()).await.unwrap().unwrap();
    let mut got = Vec::new();
    while got.len() < n as usize {
        let mut out = Vec::new();
        within(5, server.recv_batch(&mut out, 256)).await.unwrap();
        got.extend(out.into_iter().map(|m| m.header().seqnum));
    }
    assert_eq!(got, (0..n).collect::<Vec<_>>());
    // And back, over the server's own connected socket.
    server.send(msg(7, 10)).await.unwrap();
    let back = within(5, client.next()).await.unwrap().unwrap();
    assert_eq!(back.header().seqnum, 7);
}

#[tokio::test]
async fn a_listener_yields_a_link_per_peer_and_both_directions_work() {
    exchange(UdpStack::new(), 300).await;
}

#[tokio::test]
async fn many_small_messages_share_a_datagram() {
    let stack = UdpStack::new();
    exchange(stack.clone(), 300).await;
    let s = stack.stats();
    assert_eq!(s.tx_messages, 301);
    // 72-byte messages, 20 to a 1472-byte datagram.
    assert!(s.tx_datagrams <= 20, "{s:?}");
    assert_eq!(s.rx_messages, 301);
    assert_eq!(s.malformed, 0);
}

#[tokio::test]
async fn without_packing_every_message_is_a_datagram() {
    let stack = UdpStack::with_config(UdpConfig {
        pack: false,
        ..UdpConfig::default()
    });
    exchange(stack.clone(), 50).await;
    assert_eq!(stack.stats().tx_datagrams, 51);
}

#[tokio::test]
async fn without_offloads_the_same_messages_arrive() {
    let stack = UdpStack::with_config(UdpConfig {
        gso: false,
        gro: false,
        ..UdpConfig::default()
    });
    exchange(stack, 200).await;
}

#[tokio::test]
async fn the_io_uring_backend_carries_the_same_traffic() {
    if !uring::available() {
        assert!(!tools_required(), "io_uring is refused by this kernel");
        eprintln!("io_uring refused by this kernel: skipping");
        return;
    }
    let stack = UdpStack::with_config(UdpConfig {
        backend: Backend::IoUring,
        ..UdpConfig::default()
    });
    exchange(stack, 500).await;
}

#[tokio::test]
async fn garbage_from_a_new_peer_is_counted_and_opens_no_link() {
    let stack = UdpStack::new();
    let mut listener = stack.listen_now(&loopback()).unwrap();
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.send_to(b"definitely not a message", listener.local_addr())
        .unwrap();
    raw.send_to(&[], listener.local_addr()).unwrap();
    // A valid message afterwards proves the garbage was read first.
    let mut good = bytes::BytesMut::new();
    msg(1, 8).encode(&mut good);
    raw.send_to(&good, listener.local_addr()).unwrap();
    let mut link = within(5, listener.next()).await.unwrap().unwrap();
    assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, 1);
    assert_eq!(stack.stats().malformed, 2);
}

#[tokio::test]
async fn a_datagram_with_trailing_garbage_is_dropped_whole() {
    let stack = UdpStack::new();
    let mut listener = stack.listen_now(&loopback()).unwrap();
    let raw = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut first = bytes::BytesMut::new();
    msg(1, 8).encode(&mut first);
    raw.send_to(&first, listener.local_addr()).unwrap();
    let mut link = within(5, listener.next()).await.unwrap().unwrap();
    assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, 1);

    let mut bad = bytes::BytesMut::new();
    msg(2, 8).encode(&mut bad);
    bad.extend_from_slice(&[0xff; 5]);
    raw.send_to(&bad, listener.local_addr()).unwrap();
    let mut good = bytes::BytesMut::new();
    msg(3, 8).encode(&mut good);
    raw.send_to(&good, listener.local_addr()).unwrap();
    assert_eq!(
        within(5, link.next())
            .await
            .unwrap()
            .unwrap()
            .header()
            .seqnum,
        3
    );
    assert_eq!(stack.stats().malformed, 1);
}

#[tokio::test]
async fn a_message_larger_than_a_datagram_is_refused() {
    let stack = UdpStack::new();
    let mut link = stack.connect_now(&"127.0.0.1:9".parse().unwrap()).unwrap();
    let err = link.send(msg(0, 2000)).await.unwrap_err();
    assert!(
        matches!(err, LinkError::TooLarge { limit: 1472, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn udp_by_name_is_unreliable_and_unordered() {
    let stack = uniplane_stacks::by_name("udp").unwrap();
    let caps = stack.capabilities();
    assert!(!caps.reliable && !caps.ordered);
    assert_eq!(caps.mtu, 1472);
    let err = stack
        .connect(&Locator::Name("x".into()))
        .await
        .err()
        .unwrap();
    assert!(matches!(
        err,
        uniplane_dataplane::StackError::UnsupportedLocator { .. }
    ));
}

#[tokio::test]
async fn busy_polling_links_carry_the_same_traffic_on_both_backends() {
    let mut backends = vec![Backend::Epoll];
    if uring::available() {
        backends.push(Backend::IoUring);
    } else {
        assert!(!tools_required(), "io_uring is refused by this kernel");
    }
    for backend in backends {
        let stack = UdpStack::with_config(UdpConfig {
            backend,
            busy_poll: Some(std::time::Duration::from_micros(50)),
            ..UdpConfig::default()
        });
        exchange(stack, 300).await;
    }
}

/// One message in flight at a time, one per datagram: every send is a
/// single datagram (`sendto`) and every busy probe asks for one
/// (`recvfrom`), on the clients' connected sockets and on the listener's
/// unconnected one, where the sender's address is what tells two peers
/// apart.
#[tokio::test]
async fn a_ping_pong_of_single_datagrams_keeps_each_peer_apart() {
    for busy in [None, Some(std::time::Duration::from_micros(200))] {
        let stack = UdpStack::with_config(UdpConfig {
            pack: false,
            gro: false,
            busy_poll: busy,
            ..UdpConfig::default()
        });
        let mut listener = stack.listen_now(&loopback()).unwrap();
        let at = Locator::Socket(listener.local_addr());
        let mut clients = [
            stack.connect_now(&at).unwrap(),
            stack.connect_now(&at).unwrap(),
        ];
        let mut servers = Vec::new();
        for (c, client) in clients.iter_mut().enumerate() {
            client.send(msg(1000 * c as u32, 64)).await.unwrap();
            let mut server = within(5, listener.next()).await.unwrap().unwrap();
            let first = within(5, server.next()).await.unwrap().unwrap();
            assert_eq!(first.header().seqnum, 1000 * c as u32);
            servers.push(server);
        }
        for round in 1..=50u32 {
            for c in 0..2 {
                let seq = 1000 * c as u32 + round;
                clients[c].send(msg(seq, 64)).await.unwrap();
                let got = within(5, servers[c].next()).await.unwrap().unwrap();
                assert_eq!(
                    got.header().seqnum,
                    seq,
                    "server {c} got another peer's message"
                );
                assert_eq!(got.payload(), msg(seq, 64).payload());
                servers[c].send(got).await.unwrap();
                let back = within(5, clients[c].next()).await.unwrap().unwrap();
                assert_eq!(back.header().seqnum, seq);
            }
        }
        let s = stack.stats();
        assert_eq!(s.tx_datagrams, s.tx_messages, "{s:?}");
        assert_eq!(s.rx_messages, s.tx_messages, "{s:?}");
        assert_eq!(s.tx_messages, 2 + 2 * 50 * 2);
        assert_eq!(s.malformed, 0);
    }
}

#[tokio::test]
async fn a_busy_polling_link_idle_past_its_budget_still_wakes_for_a_datagram() {
    let stack = UdpStack::with_config(UdpConfig {
        busy_poll: Some(std::time::Duration::from_micros(100)),
        ..UdpConfig::default()
    });
    let mut listener = stack.listen_now(&loopback()).unwrap();
    let mut client = stack
        .connect_now(&Locator::Socket(listener.local_addr()))
        .unwrap();
    client.send(msg(1, 8)).await.unwrap();
    let mut server = within(5, listener.next()).await.unwrap().unwrap();
    assert_eq!(server.next().await.unwrap().unwrap().header().seqnum, 1);
    // Nothing comes for far longer than the budget: the link stops
    // spinning and waits in epoll.
    let idle = tokio::time::timeout(std::time::Duration::from_millis(20), server.next()).await;
    assert!(idle.is_err(), "nothing was sent");
    client.send(msg(2, 8)).await.unwrap();
    let got = within(5, server.next()).await.unwrap().unwrap();
    assert_eq!(got.header().seqnum, 2);
}

#[tokio::test]
async fn an_io_uring_burst_larger_than_its_send_chunks_goes_out_whole() {
    if !uring::available() {
        assert!(!tools_required(), "io_uring is refused by this kernel");
        return;
    }
    let stack = UdpStack::with_config(UdpConfig {
        backend: Backend::IoUring,
        pack: false,
        ..UdpConfig::default()
    });
    // Nobody needs to listen: UDP sends regardless. 5000 datagrams of
    // 1.4 kB are 7 MB, far more than the port's send chunks hold at once.
    let listener = stack.listen_now(&loopback()).unwrap();
    let mut link = stack
        .connect_now(&Locator::Socket(listener.local_addr()))
        .unwrap();
    let mut batch: VecDeque<_> = (0..5000).map(|i| msg(i, 1400)).collect();
    within(10, link.send_batch(&mut batch)).await.unwrap();
    within(10, link.flush()).await.unwrap();
    assert_eq!(stack.stats().tx_datagrams, 5000);
}
