//! The harness makes namespaces that reach each other and removes them.

use std::time::Duration;

use uniplane_netns::relay::{Impairment, Relay};
use uniplane_netns::Pair;

fn listed(name: &str) -> bool {
    let out = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

#[test]
fn a_pair_talks_over_veth_and_vanishes_when_dropped() {
    if !uniplane_netns::require("a_pair_talks_over_veth", false) {
        return;
    }
    let pair = Pair::new().unwrap();
    let (a_name, b_name) = (pair.a.name().to_owned(), pair.b.name().to_owned());
    let to = std::net::SocketAddr::new(pair.addr_b.into(), 9999);
    let receiver = pair
        .b
        .spawn(move || {
            let s = std::net::UdpSocket::bind(to).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let mut buf = [0u8; 16];
            let (n, _) = s.recv_from(&mut buf).unwrap();
            buf[..n].to_vec()
        })
        .unwrap();
    // Resend until the receiver has bound (bounded).
    pair.a
        .run(move || {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            for _ in 0..500 {
                s.send_to(b"hi", to).unwrap();
                std::thread::sleep(Duration::from_millis(2));
                if receiver.is_finished() {
                    break;
                }
            }
            assert_eq!(receiver.join().unwrap(), b"hi");
        })
        .unwrap();
    assert!(listed(&a_name) && listed(&b_name));
    drop(pair);
    assert!(!listed(&a_name) && !listed(&b_name));
}

#[test]
fn the_relay_forwards_both_ways() {
    let target = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let relay = Relay::start(
        "127.0.0.1:0".parse().unwrap(),
        target.local_addr().unwrap(),
        Impairment::none(1),
        Duration::from_secs(5),
    )
    .unwrap();
    let client = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    client
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    target
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    client.send_to(b"ping", relay.local_addr()).unwrap();
    let mut buf = [0u8; 8];
    let (n, from) = target.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"ping");
    target.send_to(b"pong", from).unwrap();
    let (n, _) = client.recv_from(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"pong");
    relay.stop().unwrap();
}
