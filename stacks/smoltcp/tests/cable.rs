//! Two smoltcp hosts joined by the frame layer's memory pair (no
//! privileges): messages over TCP and UDP both ways.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{Message, Uid};
use uniplane_frame::cable;
use uniplane_frame::eth::MacAddr;
use uniplane_smoltcp::{Host, HostConfig};

fn msg(i: u32, len: usize) -> Message {
    let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
    let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
    let mut m = Message::send(a, b, Bytes::from(vec![(i % 251) as u8; len])).unwrap();
    m.set_seqnum(i);
    m
}

fn hosts() -> (Host<cable::CableDevice>, Host<cable::CableDevice>, Ipv4Addr) {
    let (a, b) = cable::pair(MacAddr::local(1), MacAddr::local(2), 1500, 256).unwrap();
    let ip_a = Ipv4Addr::new(192, 0, 2, 1);
    let ip_b = Ipv4Addr::new(192, 0, 2, 2);
    let ha = Host::spawn(
        a,
        HostConfig {
            addr: ip_a,
            seed: 1,
            ..HostConfig::default()
        },
    )
    .unwrap();
    let hb = Host::spawn(
        b,
        HostConfig {
            addr: ip_b,
            seed: 2,
            ..HostConfig::default()
        },
    )
    .unwrap();
    (ha, hb, ip_b)
}

async fn within<F: std::future::Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

#[tokio::test]
async fn tcp_links_carry_messages_both_ways_in_order() {
    let (ha, hb, ip_b) = hosts();
    let mut listener = hb.listen_tcp(7000).unwrap();
    let mut a = within(5, ha.connect_tcp(SocketAddr::from((ip_b, 7000))))
        .await
        .unwrap();
    let mut b = within(5, listener.next()).await.unwrap().unwrap();
    let n = 2000u32;
    let sender = tokio::spawn(async move {
        for i in 0..n {
            a.feed(msg(i, (i as usize * 37) % 3000)).await.unwrap();
        }
        a.flush().await.unwrap();
        a
    });
    for i in 0..n {
        let m = within(10, b.next()).await.unwrap().unwrap();
        assert_eq!(m, msg(i, (i as usize * 37) % 3000));
    }
    let mut a = sender.await.unwrap();
    b.send(msg(9, 100)).await.unwrap();
    assert_eq!(within(5, a.next()).await.unwrap().unwrap(), msg(9, 100));
    a.close().await.unwrap();
    assert!(
        within(5, b.next()).await.is_none(),
        "the stream ends at FIN"
    );
    assert_eq!(ha.stats().tx_dropped, 0);
}

#[tokio::test]
async fn udp_links_carry_messages_both_ways() {
    let (ha, hb, ip_b) = hosts();
    let mut listener = hb.listen_udp(7001).unwrap();
    let mut a = ha.connect_udp(SocketAddr::from((ip_b, 7001))).unwrap();
    // ARP first: the first datagrams wait in smoltcp for the neighbour.
    a.send(msg(0, 10)).await.unwrap();
    let mut b = within(5, listener.next()).await.unwrap().unwrap();
    assert_eq!(within(5, b.next()).await.unwrap().unwrap(), msg(0, 10));
    for i in 1..100 {
        a.feed(msg(i, 50)).await.unwrap();
    }
    a.flush().await.unwrap();
    for i in 1..100 {
        assert_eq!(within(5, b.next()).await.unwrap().unwrap(), msg(i, 50));
    }
    b.send(msg(5, 5)).await.unwrap();
    assert_eq!(within(5, a.next()).await.unwrap().unwrap(), msg(5, 5));
    assert_eq!(hb.stats().malformed, 0);
}

#[tokio::test]
async fn connecting_to_a_closed_port_is_refused() {
    let (ha, _hb, ip_b) = hosts();
    let r = within(5, ha.connect_tcp(SocketAddr::from((ip_b, 9)))).await;
    assert!(r.is_err());
}
