//! The `ether` stack over the frame layer's memory pair (no privileges):
//! messages both ways, packing, the size limit, the neighbour table, and
//! LTL over raw Ethernet delivering in order.

mod common;

use std::collections::HashMap;
use std::io;
use std::net::Ipv4Addr;
use std::sync::Mutex;

use common::{msg, within};
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{LinkError, Locator, Stack};
use uniplane_frame::cable::{self, CableDevice};
use uniplane_frame::eth::MacAddr;
use uniplane_stacks::ether::{DeviceOpener, EtherConfig, EtherStack};

/// Hands out memory devices by interface name, once each.
struct CableOpener(Mutex<HashMap<String, CableDevice>>);

impl DeviceOpener for CableOpener {
    type Device = CableDevice;

    fn open(&self, iface: &str, _ethertype: u16) -> io::Result<CableDevice> {
        self.0
            .lock()
            .unwrap()
            .remove(iface)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, iface.to_owned()))
    }
}

fn stacks(cfg: EtherConfig, mtu: usize) -> (EtherStack<CableOpener>, EtherStack<CableOpener>) {
    let (a, b) = cable::pair(MacAddr::local(1), MacAddr::local(2), mtu, 512).unwrap();
    let opener = |name: &str, d| CableOpener(Mutex::new(HashMap::from([(name.to_owned(), d)])));
    let ca = EtherConfig {
        interface: Some("a0".into()),
        ..cfg.clone()
    };
    let cb = EtherConfig {
        interface: Some("b0".into()),
        ..cfg
    };
    (
        EtherStack::with_opener(ca, opener("a0", a)),
        EtherStack::with_opener(cb, opener("b0", b)),
    )
}

#[tokio::test]
async fn messages_cross_both_ways_packed_into_frames() {
    let (sa, sb) = stacks(EtherConfig::default(), 1500);
    let mut listener = sb.listen(&Locator::Name("b0".into())).await.unwrap();
    let mut a = sa
        .connect(&Locator::Mac(MacAddr::local(2).0))
        .await
        .unwrap();
    let n = 2000u32;
    for i in 0..n {
        a.feed(msg(i, 40)).await.unwrap();
    }
    a.flush().await.unwrap();
    let mut b = within(5, listener.next()).await.unwrap().unwrap();
    for i in 0..n {
        let m = within(5, b.next()).await.unwrap().unwrap();
        assert_eq!(m.header().seqnum, i);
    }
    b.send(msg(7, 100)).await.unwrap();
    assert_eq!(within(5, a.next()).await.unwrap().unwrap(), msg(7, 100));
    let st = sa.stats();
    assert_eq!(st.tx_messages, n as u64);
    // 72-byte messages, 20 to a 1500-byte frame, pushed 64 at a time:
    // four frames per 64 messages.
    assert!(st.tx_frames <= (n as u64).div_ceil(64) * 4, "{st:?}");
    assert_eq!(sb.stats().malformed, 0);
}

#[tokio::test]
async fn jumbo_frames_carry_large_messages_and_larger_ones_are_refused() {
    let (sa, sb) = stacks(EtherConfig::default(), 9000);
    let mut listener = sb.listen(&Locator::Name("b0".into())).await.unwrap();
    let mut a = sa
        .connect(&Locator::Mac(MacAddr::local(2).0))
        .await
        .unwrap();
    a.send(msg(1, 8000)).await.unwrap();
    let mut b = within(5, listener.next()).await.unwrap().unwrap();
    assert_eq!(within(5, b.next()).await.unwrap().unwrap(), msg(1, 8000));
    let err = a.send(msg(2, 9000)).await.unwrap_err();
    assert!(
        matches!(err, LinkError::TooLarge { limit: 9000, .. }),
        "{err}"
    );
}

#[tokio::test]
async fn the_neighbour_table_turns_a_server_address_into_a_mac() {
    let (sa, sb) = stacks(EtherConfig::default(), 1500);
    let mut listener = sb.listen(&Locator::Name("b0".into())).await.unwrap();
    let server = Ipv4Addr::new(10, 0, 0, 9);
    let to = Locator::Socket((server, 0).into());
    assert!(sa.connect(&to).await.is_err(), "no entry yet");
    sa.add_neighbour(server, MacAddr::local(2));
    let mut a = sa.connect(&to).await.unwrap();
    a.send(msg(3, 10)).await.unwrap();
    let mut b = within(5, listener.next()).await.unwrap().unwrap();
    assert_eq!(within(5, b.next()).await.unwrap().unwrap(), msg(3, 10));
}

#[tokio::test]
async fn ltl_over_raw_ethernet_delivers_in_order_both_ways() {
    let cfg = EtherConfig {
        reliable: true,
        ..EtherConfig::default()
    };
    let (sa, sb) = stacks(cfg, 1500);
    assert!(sa.capabilities().reliable);
    let mut listener = sb.listen(&Locator::Name("b0".into())).await.unwrap();
    let mut a = within(5, sa.connect(&Locator::Mac(MacAddr::local(2).0)))
        .await
        .unwrap();
    let n = 3000u32;
    let sender = tokio::spawn(async move {
        for i in 0..n {
            a.feed(msg(i, 300)).await.unwrap();
        }
        a.flush().await.unwrap();
        a
    });
    let mut b = within(5, listener.next()).await.unwrap().unwrap();
    for i in 0..n {
        let m = within(10, b.next()).await.unwrap().unwrap();
        assert_eq!(m.header().seqnum, i);
    }
    let mut a = sender.await.unwrap();
    b.send(msg(n, 8)).await.unwrap();
    assert_eq!(
        within(5, a.next()).await.unwrap().unwrap().header().seqnum,
        n
    );
}
