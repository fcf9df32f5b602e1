//! Interoperability with a stack we did not write: smoltcp on an
//! `AF_PACKET` ring in one namespace talks TCP and UDP with the Linux
//! kernel (plain `std::net` sockets) in another, over a veth; the frames,
//! captured with tshark, decode as Ethernet/IPv4/TCP/UDP with correct
//! checksums. Also smoltcp on a TAP device against the kernel behind it.
//! Needs root, iproute2 and tshark: skipped without them unless
//! UNIPLANE_REQUIRE_TOOLS=1.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::process::{Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::{Message, Uid};
use uniplane_frame::eth::MacAddr;
use uniplane_frame::packet::{PacketConfig, PacketDevice, ETH_P_ALL};
use uniplane_frame::tap::{TapConfig, TapDevice};
use uniplane_netns::{Namespace, Pair};
use uniplane_smoltcp::{Host, HostConfig};

fn msg(i: u32, len: usize) -> Message {
    let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
    let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
    let mut m = Message::send(a, b, Bytes::from(vec![(i % 251) as u8; len])).unwrap();
    m.set_seqnum(i);
    m
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn tshark_available() -> bool {
    Command::new("tshark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The kernel's side: a TCP echo server and a UDP echo socket.
fn kernel_echo(ns: &Namespace, ip: Ipv4Addr, bytes: usize) -> std::thread::JoinHandle<usize> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let t = ns
        .spawn(move || {
            let l = TcpListener::bind((ip, 7100)).unwrap();
            let u = UdpSocket::bind((ip, 7101)).unwrap();
            ready_tx.send(()).unwrap();
            u.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = [0u8; 2048];
            let (n, from) = u.recv_from(&mut buf).unwrap();
            u.send_to(&buf[..n], from).unwrap();
            let (mut s, _) = l.accept().unwrap();
            s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
            let mut total = 0;
            let mut chunk = vec![0u8; 65536];
            while total < bytes {
                let n = s.read(&mut chunk).unwrap();
                assert!(n > 0, "smoltcp closed early");
                s.write_all(&chunk[..n]).unwrap();
                total += n;
            }
            total
        })
        .unwrap();
    ready_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    t
}

/// smoltcp's side: a UDP round trip, then `n` messages over TCP, echoed.
async fn exchange<D: uniplane_frame::FrameDevice>(host: &Host<D>, server: Ipv4Addr, n: u32) {
    let mut u = host.connect_udp(SocketAddr::from((server, 7101))).unwrap();
    u.send(msg(1, 100)).await.unwrap();
    let back = tokio::time::timeout(Duration::from_secs(10), u.next()).await;
    assert_eq!(back.expect("no UDP echo").unwrap().unwrap(), msg(1, 100));

    let connect = host.connect_tcp(SocketAddr::from((server, 7100)));
    let mut t = tokio::time::timeout(Duration::from_secs(10), connect)
        .await
        .expect("connect timed out")
        .unwrap();
    let (mut rx, mut tx) = (Vec::new(), 0u32);
    while rx.len() < n as usize {
        while tx < n && tx < rx.len() as u32 + 256 {
            t.feed(msg(tx, 1000 + tx as usize % 500)).await.unwrap();
            tx += 1;
        }
        t.flush().await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(10), t.next())
            .await
            .expect("echo stalled")
            .unwrap()
            .unwrap();
        rx.push(m);
    }
    for (i, m) in rx.iter().enumerate() {
        assert_eq!(*m, msg(i as u32, 1000 + i % 500));
    }
}

/// Waits (at most 20 s) until the capture file being written at `pcap`
/// holds `at_least` frames matching `filter` (read from a copy, so a frame
/// half written is no error).
fn captured(pcap: &std::path::Path, filter: &str, at_least: usize, what: &str) {
    let copy = pcap.with_extension("snapshot");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let count = std::fs::copy(pcap, &copy).ok().and_then(|_| {
            Command::new("tshark")
                .arg("-r")
                .arg(&copy)
                .args(["-Y", filter, "-T", "fields", "-e", "frame.number"])
                .output()
                .ok()
                .map(|o| {
                    o.stdout
                        .split(|b| *b == b'\n')
                        .filter(|l| !l.is_empty())
                        .count()
                })
        });
        if count.is_some_and(|c| c >= at_least) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the capture never held {what} ({count:?} of {at_least})"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = std::fs::remove_file(&copy);
}

fn encoded(n: u32) -> usize {
    (0..n)
        .map(|i| msg(i, 1000 + i as usize % 500).encoded_len())
        .sum()
}

#[test]
fn smoltcp_talks_tcp_and_udp_with_the_kernel_and_tshark_finds_every_checksum_good() {
    if !uniplane_netns::require("smoltcp_talks_with_the_kernel", false) {
        return;
    }
    let missing = (!tshark_available()).then_some("tshark");
    if !uniplane_netns::require_tool("smoltcp_talks_with_the_kernel", missing) {
        return;
    }
    let pair = Pair::new().unwrap();
    let n = 2000;
    let server = kernel_echo(&pair.b, pair.addr_b, encoded(n));

    // Capture on the kernel's side of the veth.
    let pcap = std::env::temp_dir().join(format!("uniplane-smoltcp-{}.pcap", std::process::id()));
    let _ = std::fs::remove_file(&pcap);
    let mut capture = pair
        .b
        .command("tshark")
        .args(["-i", &pair.iface_b, "-q", "-w"])
        .arg(&pcap)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(capture.stderr.take().unwrap());
    let mut line = String::new();
    for _ in 0..20 {
        line.clear();
        if err.read_line(&mut line).unwrap() == 0 || line.contains("Capturing on") {
            break;
        }
    }
    assert!(
        line.contains("Capturing on"),
        "tshark did not start: {line}"
    );
    // "Capturing on" comes before frames are really captured: probe the
    // link until a probe shows up in the file, so nothing of the exchange
    // (its first frames are the UDP round trip) is lost.
    let (probe_from, probe_to) = (pair.addr_b, pair.addr_a);
    let seen = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = seen.clone();
    let prober = pair
        .b
        .spawn(move || {
            let u = UdpSocket::bind((probe_from, 0)).unwrap();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let _ = u.send_to(b"probe", (probe_to, 9));
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .unwrap();
    captured(&pcap, "udp.dstport == 9", 1, "the probes");
    seen.store(true, std::sync::atomic::Ordering::Relaxed);
    prober.join().unwrap();

    // smoltcp at .3 with a MAC of its own, beside the kernel's .1.
    let me = Ipv4Addr::from(u32::from(pair.addr_a) + 2);
    let (ia, server_ip) = (pair.iface_a.clone(), pair.addr_b);
    let stats = pair
        .a
        .run(move || {
            runtime().block_on(async move {
                let dev = PacketDevice::open(
                    &ia,
                    &PacketConfig {
                        protocol: ETH_P_ALL,
                        ..PacketConfig::default()
                    },
                )
                .unwrap();
                let host = Host::spawn(
                    dev,
                    HostConfig {
                        mac: Some(MacAddr::local(0x5317)),
                        addr: me,
                        ..HostConfig::default()
                    },
                )
                .unwrap();
                exchange(&host, server_ip, n).await;
                host.frame_stats()
            })
        })
        .unwrap();
    assert_eq!(server.join().unwrap(), encoded(n));
    // Stop the capture only once a copy of what it wrote holds what the
    // assertions below count (it lags the exchange on a loaded machine,
    // and a stopped capture loses what it has not read yet).
    let from_me = format!("ip.src == {me}");
    captured(
        &pcap,
        &format!("{from_me} && tcp"),
        101,
        "smoltcp's TCP frames",
    );
    // SAFETY: signalling the capture process this test started.
    unsafe { libc::kill(capture.id() as i32, libc::SIGINT) };
    let _ = capture.wait();
    // The kernel peer offloads its checksums over veth; the frame layer
    // completed them before smoltcp verified them.
    assert!(stats.rx_csum_completed > 0, "{stats:?}");

    let show = |filter: &str, field: &str| -> String {
        let out = Command::new("tshark")
            .args(["-r"])
            .arg(&pcap)
            .args([
                "-o",
                "tcp.check_checksum:TRUE",
                "-o",
                "ip.check_checksum:TRUE",
                "-o",
                "udp.check_checksum:TRUE",
                // The payload is overlay messages, not whatever protocol
                // owns these ports (7100 is the X font server's).
                "-d",
                "tcp.port==7100,data",
                "-d",
                "udp.port==7101,data",
                "-Y",
                filter,
                "-T",
                "fields",
                "-e",
                "frame.number",
                "-e",
                field,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // Frames matching `filter`, one line each.
    let fields = |filter: &str| -> usize { show(filter, "frame.number").lines().count() };
    let tcp_good = fields(&format!("{from_me} && tcp.checksum.status == \"Good\""));
    let udp_good = fields(&format!("{from_me} && udp.checksum.status == \"Good\""));
    let ip_good = fields(&format!("{from_me} && ip.checksum.status == \"Good\""));
    let bad_filter = format!(
        "{from_me} && (ip.checksum.status == \"Bad\" || tcp.checksum.status == \"Bad\" \
         || udp.checksum.status == \"Bad\" || _ws.malformed || _ws.expert.severity == \"Error\")"
    );
    let bad = fields(&bad_filter);
    let why = show(&bad_filter, "frame.protocols") + &show(&bad_filter, "_ws.expert.message");
    if bad == 0 {
        let _ = std::fs::remove_file(&pcap);
    }
    assert!(tcp_good > 100, "{tcp_good} good TCP frames from smoltcp");
    assert!(udp_good >= 1, "{udp_good} good UDP frames from smoltcp");
    assert_eq!(ip_good, tcp_good + udp_good);
    assert_eq!(
        bad, 0,
        "frames from smoltcp with bad checksums or malformed: {why}"
    );
}

#[test]
fn smoltcp_on_a_tap_device_talks_tcp_with_the_kernel_behind_it() {
    if !uniplane_netns::require("smoltcp_on_a_tap_device", false) {
        return;
    }
    let ns = Namespace::new().unwrap();
    let tap = "uptap0".to_string();
    let kernel_ip = Ipv4Addr::new(192, 0, 2, 1);
    let me = Ipv4Addr::new(192, 0, 2, 2);
    let n = 500;
    // The device exists while smoltcp holds it open; the kernel side is
    // configured once it does.
    let (opened_tx, opened_rx) = std::sync::mpsc::channel();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let t = tap.clone();
    let smol = ns
        .spawn(move || {
            runtime().block_on(async move {
                let dev = TapDevice::open(&t, &TapConfig::default()).unwrap();
                opened_tx.send(()).unwrap();
                let host = Host::spawn(
                    dev,
                    HostConfig {
                        addr: me,
                        ..HostConfig::default()
                    },
                )
                .unwrap();
                tokio::task::spawn_blocking(move || go_rx.recv_timeout(Duration::from_secs(10)))
                    .await
                    .unwrap()
                    .unwrap();
                exchange(&host, kernel_ip, n).await;
            })
        })
        .unwrap();
    opened_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    ns.ip(&["addr", "add", &format!("{kernel_ip}/24"), "dev", &tap])
        .unwrap();
    ns.ip(&["link", "set", &tap, "up"]).unwrap();
    let server = kernel_echo(&ns, kernel_ip, encoded(n));
    go_tx.send(()).unwrap();
    smol.join().unwrap();
    assert_eq!(server.join().unwrap(), encoded(n));
}
