//! DPDK without hardware: the EAL starts on virtual devices (`--no-huge
//! --no-pci`, a file prefix of its own), frames go out of a `net_ring`
//! port and come back in, `net_null` swallows a burst, and the `ether`
//! stack's frames would fit the same device. One test: DPDK initialises
//! once per process.
#![cfg(feature = "dpdk")]

use uniplane_dpdk::{DpdkConfig, DpdkDevice, Eal};
use uniplane_frame::eth::{write_header, EthernetFrame, MacAddr, HEADER_LEN};
use uniplane_frame::{FrameDevice, RxQueue, TxQueue};

fn eal() -> &'static Eal {
    let prefix = format!("--file-prefix=uniplane-test-{}", std::process::id());
    Eal::init(&[
        "--no-huge",
        "-m",
        "1024",
        "--no-pci",
        &prefix,
        "-l",
        "0",
        "--no-shconf",
        "--no-telemetry",
        "--log-level=lib.eal:error",
        "--vdev=net_ring0",
        "--vdev=net_null0",
    ])
    .expect("EAL did not start")
}

fn small() -> DpdkConfig {
    DpdkConfig {
        pool_mbufs: 2047,
        rx_descriptors: 512,
        tx_descriptors: 512,
        ..DpdkConfig::default()
    }
}

#[test]
fn the_eal_starts_on_vdevs_and_frames_loop_through_net_ring_and_vanish_in_net_null() {
    let eal = eal();
    assert!(eal.port_count() >= 2);

    // net_ring: what goes out comes back in, in order, byte for byte.
    let mut ring = DpdkDevice::open(eal, "net_ring0", &small()).unwrap();
    let me = ring.mac();
    let n = 5000u32;
    let mut sent = 0u32;
    let mut got = Vec::new();
    let mut rounds = 0;
    while got.len() < n as usize && rounds < 100_000 {
        rounds += 1;
        let (rx, tx) = ring.queues();
        while sent < n {
            let len = 60 + (sent as usize * 13) % 1400;
            let pushed = tx.push(len, |f| {
                write_header(f, MacAddr::BROADCAST, me, 0x88b5);
                f[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&sent.to_be_bytes());
            });
            if pushed.is_none() {
                break;
            }
            sent += 1;
        }
        tx.flush().unwrap();
        // Receive only now and then: the ring fills, bursts go out in part,
        // and the frames left behind must keep their order.
        if rounds % 64 != 0 && sent < n {
            continue;
        }
        rx.refill().unwrap();
        while let Some((i, len)) = rx.take(|f| {
            let e = EthernetFrame::new_checked(&*f).unwrap();
            assert_eq!(uniplane_frame::eth::ethertype(&e), 0x88b5);
            assert_eq!(uniplane_frame::eth::src(&e), me);
            let p = e.payload();
            (u32::from_be_bytes([p[0], p[1], p[2], p[3]]), f.len())
        }) {
            assert_eq!(i as usize, got.len(), "out of order");
            assert_eq!(len, 60 + (i as usize * 13) % 1400);
            got.push(i);
        }
    }
    assert_eq!(got.len(), n as usize);
    let st = ring.stats();
    assert_eq!((st.tx_frames, st.rx_frames), (n as u64, n as u64));

    // The same by bursts, each mbuf reset as its frame is written: the
    // mbufs come back from receive (their data offset, flags and lengths
    // left by the ring), and a burst the writer stops early leaves its
    // reset but unwritten mbufs for the next one.
    let mut next = 0u32;
    let mut seen = 0u32;
    for round in 0..400u32 {
        let (rx, tx) = ring.queues();
        let stop_at = round % 7;
        let pushed = tx.push_burst(32, |k, f| {
            if k as u32 == stop_at + 20 {
                return 0;
            }
            let len = 60 + ((next as usize) * 29) % 1400;
            write_header(f, MacAddr::BROADCAST, me, 0x88b5);
            f[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&next.to_be_bytes());
            f[len - 1] = next as u8;
            next += 1;
            len
        });
        assert!(pushed <= (stop_at + 20) as usize, "{pushed}");
        tx.flush().unwrap();
        rx.refill().unwrap();
        while let Some((i, len, last)) = rx.take(|f| {
            let e = EthernetFrame::new_checked(&*f).unwrap();
            assert_eq!(uniplane_frame::eth::src(&e), me);
            let p = e.payload();
            (
                u32::from_be_bytes([p[0], p[1], p[2], p[3]]),
                f.len(),
                f[f.len() - 1],
            )
        }) {
            assert_eq!(i, seen, "out of order");
            assert_eq!(len, 60 + (i as usize * 29) % 1400);
            assert_eq!(last, i as u8);
            seen += 1;
        }
    }
    assert!(next > 400 * 20, "{next}");
    let (rx, _) = ring.queues();
    rx.refill().unwrap();
    while let Some(i) =
        rx.take(|f| u32::from_be_bytes(f[HEADER_LEN..HEADER_LEN + 4].try_into().unwrap()))
    {
        assert_eq!(i, seen);
        seen += 1;
    }
    assert_eq!(seen, next);
    drop(ring);

    // net_null: takes every burst and frees the mbufs (no leak: the pool
    // is far smaller than the frames sent).
    let mut null = DpdkDevice::open(eal, "net_null0", &small()).unwrap();
    let (_, tx) = null.queues();
    let mut sent = 0u64;
    for _ in 0..2000 {
        while tx
            .push(64, |f| f[..6].copy_from_slice(&[0xff; 6]))
            .is_some()
        {}
        sent += tx.flush().unwrap() as u64;
    }
    assert!(sent > 2047 * 10, "{sent}");
    let (_, opackets, _, _) = null.port_stats();
    assert_eq!(opackets, sent);

    // An unknown port is an error, not a crash.
    assert!(DpdkDevice::open(eal, "net_nothing9", &small()).is_err());
    // --no-shconf leaves only the empty runtime directory behind.
    let _ = std::fs::remove_dir(format!(
        "/var/run/dpdk/uniplane-test-{}",
        std::process::id()
    ));
}
