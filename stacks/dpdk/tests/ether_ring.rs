//! The `ether` stack on a DPDK port: a `net_ring` vdev hands every frame
//! back, so a link to the port's own MAC receives what it sent — the same
//! stack code as over `AF_PACKET`, on another backend of the frame layer.
//! (A test binary of its own: DPDK initialises once per process.)
#![cfg(feature = "dpdk")]

use std::net::Ipv4Addr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{Locator, Message, Stack, Uid};
use uniplane_dpdk::{DpdkConfig, DpdkOpener};
use uniplane_stacks::ether::{EtherConfig, EtherStack};

fn msg(i: u32) -> Message {
    let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
    let mut m = Message::send(a, a, Bytes::from(vec![i as u8; 64])).unwrap();
    m.set_seqnum(i);
    m
}

#[tokio::test]
async fn ether_messages_loop_through_a_dpdk_ring_port() {
    let prefix = format!("--file-prefix=uniplane-ether-{}", std::process::id());
    let opener = DpdkOpener {
        eal_args: [
            "--no-huge",
            "-m",
            "1024",
            "--no-pci",
            "--no-shconf",
            "--no-telemetry",
            &prefix,
            "-l",
            "0",
            "--log-level=lib.eal:error",
            "--vdev=net_ring0",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        config: DpdkConfig {
            pool_mbufs: 2047,
            rx_descriptors: 512,
            tx_descriptors: 512,
            ..DpdkConfig::default()
        },
    };
    let stack = EtherStack::with_opener(
        EtherConfig {
            interface: Some("net_ring0".into()),
            ..EtherConfig::default()
        },
        opener,
    );
    let me = stack.local_mac("net_ring0").unwrap();
    let mut link = stack.connect(&Locator::Mac(me.0)).await.unwrap();
    for round in 0..20u32 {
        for i in 0..100 {
            link.feed(msg(round * 100 + i)).await.unwrap();
        }
        link.flush().await.unwrap();
        for i in 0..100 {
            let m = tokio::time::timeout(Duration::from_secs(5), link.next())
                .await
                .expect("nothing came back")
                .unwrap()
                .unwrap();
            assert_eq!(m, msg(round * 100 + i));
        }
    }
    let st = stack.stats();
    assert_eq!(st.tx_messages, 2000);
    assert_eq!(st.rx_messages, 2000);
    assert!(st.tx_frames < 200, "{st:?}");
    let _ = std::fs::remove_dir(format!(
        "/var/run/dpdk/uniplane-ether-{}",
        std::process::id()
    ));
}
