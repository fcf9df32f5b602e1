//! AF_PACKET rings between two namespaces joined by a veth: frames cross
//! in bursts, jumbo frames fit, and a filter keeps other sources out.
//! Needs root and iproute2: skipped without them unless
//! UNIPLANE_REQUIRE_TOOLS=1.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uniplane_frame::eth::{write_header, EthernetFrame, MacAddr, HEADER_LEN};
use uniplane_frame::packet::{src_mac_filter, PacketConfig, PacketDevice};
use uniplane_frame::{FrameDevice, RxQueue, TxQueue};
use uniplane_netns::Pair;

use uniplane_stacks::ether::ETHERTYPE;

/// Receives frames of `ETHERTYPE` until `want` arrived or 10 s passed,
/// counting them in `progress`; returns (index, length) of each.
fn receive(dev: &mut PacketDevice, want: usize, progress: &AtomicUsize) -> Vec<(u32, usize)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while got.len() < want && Instant::now() < deadline {
        let (rx, _) = dev.queues();
        if rx.refill().unwrap() == 0 {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        while let Some(v) = rx.take(|f| {
            let e = EthernetFrame::new_checked(&*f).unwrap();
            assert_eq!(uniplane_frame::eth::ethertype(&e), ETHERTYPE);
            let p = e.payload();
            (u32::from_be_bytes([p[0], p[1], p[2], p[3]]), f.len())
        }) {
            got.push(v);
        }
        progress.store(got.len(), Ordering::Release);
    }
    got
}

fn send(dev: &mut PacketDevice, dst: MacAddr, n: u32, len: impl Fn(u32) -> usize) {
    let src = dev.mac();
    let (_, tx) = dev.queues();
    let mut i = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while i < n && Instant::now() < deadline {
        let l = len(i);
        let pushed = tx.push(l, |f| {
            write_header(f, dst, src, ETHERTYPE);
            f[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&i.to_be_bytes());
        });
        if pushed.is_some() {
            i += 1;
        }
        if pushed.is_none() || i % 64 == 0 {
            tx.flush().unwrap();
            if pushed.is_none() {
                std::thread::sleep(Duration::from_micros(100));
            }
        }
    }
    while tx.unflushed() > 0 && Instant::now() < deadline {
        tx.flush().unwrap();
    }
    assert_eq!(i, n);
}

#[test]
fn frames_cross_a_veth_through_both_rings_in_order_with_jumbo_sizes() {
    if !uniplane_netns::require("frames_cross_a_veth", false) {
        return;
    }
    let pair = Pair::new().unwrap();
    for (ns, iface) in [(&pair.a, &pair.iface_a), (&pair.b, &pair.iface_b)] {
        ns.ip(&["link", "set", "dev", iface, "mtu", "9000"])
            .unwrap();
    }
    let n = 20_000u32;
    let len = |i: u32| 60 + (i as usize * 97) % (9014 - 60);
    let cfg = PacketConfig {
        protocol: ETHERTYPE,
        ..PacketConfig::default()
    };
    let (ib, cb) = (pair.iface_b.clone(), cfg.clone());
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let received = Arc::new(AtomicUsize::new(0));
    let progress = received.clone();
    let receiver = pair
        .b
        .spawn(move || {
            let mut dev = PacketDevice::open(&ib, &cb).unwrap();
            assert_eq!(dev.mtu(), 9000);
            ready_tx.send(dev.mac()).unwrap();
            let got = receive(&mut dev, n as usize, &progress);
            (got, dev.stats())
        })
        .unwrap();
    let dst = ready_rx.recv().unwrap();
    let ia = pair.iface_a.clone();
    let sent = pair
        .a
        .run(move || {
            let mut dev = PacketDevice::open(&ia, &cfg).unwrap();
            // One chunk of 1000 frames (about 4.5 MB) in flight at a time:
            // the receiver's ring holds 8 MiB, and a receiver that loses
            // the CPU for a while must not lose frames to the kernel.
            let deadline = Instant::now() + Duration::from_secs(20);
            for chunk in 0..(n / 1000) {
                while received.load(Ordering::Acquire) < (chunk * 1000) as usize
                    && Instant::now() < deadline
                {
                    std::thread::sleep(Duration::from_micros(200));
                }
                send(&mut dev, dst, 1000, |i| len(chunk * 1000 + i));
            }
            dev.stats()
        })
        .unwrap();
    let (got, rstats) = receiver.join().unwrap();
    assert_eq!(sent.tx_frames, n as u64);
    assert!(sent.tx_bursts < n as u64 / 10, "{sent:?}");
    // Indices are rewritten per chunk; lengths identify the frames.
    assert_eq!(got.len(), n as usize, "{rstats:?}");
    for (k, &(idx, l)) in got.iter().enumerate() {
        assert_eq!(idx as usize, k % 1000);
        assert_eq!(l, len(k as u32));
    }
    assert!(rstats.rx_bursts < n as u64, "{rstats:?}");
}

#[test]
fn a_source_filter_keeps_other_senders_out() {
    if !uniplane_netns::require("a_source_filter", false) {
        return;
    }
    let pair = Pair::new().unwrap();
    let ib = pair.iface_b.clone();
    let ia = pair.iface_a.clone();
    let a_mac = pair
        .a
        .run(move || {
            PacketDevice::open(&ia, &PacketConfig::default())
                .unwrap()
                .mac()
        })
        .unwrap();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = pair
        .b
        .spawn(move || {
            let cfg = PacketConfig {
                protocol: ETHERTYPE,
                filter: Some(src_mac_filter(MacAddr::local(99))),
                ..PacketConfig::default()
            };
            let mut dev = PacketDevice::open(&ib, &cfg).unwrap();
            let cfg_all = PacketConfig {
                protocol: ETHERTYPE,
                ..PacketConfig::default()
            };
            let mut all = PacketDevice::open(&ib, &cfg_all).unwrap();
            ready_tx.send(dev.mac()).unwrap();
            let seen = receive(&mut all, 10, &AtomicUsize::new(0));
            let (rx, _) = dev.queues();
            (seen.len(), rx.refill().unwrap())
        })
        .unwrap();
    let dst = ready_rx.recv().unwrap();
    let ia = pair.iface_a.clone();
    pair.a
        .run(move || {
            let mut dev = PacketDevice::open(&ia, &PacketConfig::default()).unwrap();
            assert_eq!(dev.mac(), a_mac);
            send(&mut dev, dst, 10, |_| 60);
        })
        .unwrap();
    let (seen, filtered) = receiver.join().unwrap();
    assert_eq!(seen, 10);
    assert_eq!(filtered, 0, "frames from another source passed the filter");
}
