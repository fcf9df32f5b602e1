//! `peer --tool iperf3-tcp --stack smoltcp`: TCP throughput over a veth
//! between two network namespaces (made for the run, root only). Ours:
//! the user-space TCP/IP stack (`uniplane-smoltcp`) on the `AF_PACKET`
//! rings of one end sends messages to a plain kernel socket on the other
//! end, which counts what arrives; the peer: the kernel's TCP on both
//! ends (iperf3), on the same veth, alternately in one invocation.
//! `--mtu` sets the veth's MTU (9000: jumbo frames) for both.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt;
use serde_json::{json, Value};
use uniplane_dataplane::{Message, Uid};
use uniplane_frame::eth::MacAddr;
use uniplane_frame::packet::{PacketConfig, PacketDevice, ETH_P_ALL};
use uniplane_netns::Pair;
use uniplane_smoltcp::{Host, HostConfig};

use crate::peer::{iperf3_tcp, locate, Metric, Peer, PeerError, PeerFigure, Workload};
use crate::BenchError;

/// The port the counting sink and iperf3 listen on, in the second
/// namespace (nothing else runs there).
const PORT: u16 = 7200;

/// A veth between two fresh namespaces, removed when dropped.
pub struct VethTcp {
    pair: Pair,
    mtu: u32,
}

impl VethTcp {
    /// Makes the namespaces and the veth (root only), at `mtu`.
    pub fn new(mtu: u32) -> Result<VethTcp, BenchError> {
        if !(576..=9000).contains(&mtu) {
            return Err(BenchError::Config(format!("--mtu {mtu}: 576..=9000")));
        }
        let pair = Pair::new().map_err(|e| {
            BenchError::Config(format!(
                "a veth between two network namespaces (needs root): {e}"
            ))
        })?;
        let mtu_s = mtu.to_string();
        for (ns, iface) in [(&pair.a, &pair.iface_a), (&pair.b, &pair.iface_b)] {
            ns.ip(&["link", "set", "dev", iface, "mtu", &mtu_s])
                .map_err(|e| BenchError::Config(format!("setting the MTU of {iface}: {e}")))?;
        }
        Ok(VethTcp { pair, mtu })
    }

    /// The veth's MTU.
    pub fn mtu(&self) -> u32 {
        self.mtu
    }

    /// Ours: smoltcp on the first end sends `size`-byte messages for
    /// `secs` to a kernel socket on the second, which counts the bytes
    /// from the first to the last; returns (Gbit/s received, detail).
    pub fn smoltcp(&self, size: usize, secs: f64) -> Result<(f64, Value), BenchError> {
        let server = SocketAddr::from((self.pair.addr_b, PORT));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let fail = |what: &str, e: &dyn std::fmt::Display| {
            BenchError::Config(format!("smoltcp over the veth: {what}: {e}"))
        };
        let sink = self
            .pair
            .b
            .spawn(move || -> Result<(u64, f64), String> {
                let l = TcpListener::bind(server).map_err(|e| format!("bind {server}: {e}"))?;
                let _ = ready_tx.send(());
                let (mut s, _) = l.accept().map_err(|e| format!("accept: {e}"))?;
                // Bounded: the sender stops after `secs`, then closes.
                s.set_read_timeout(Some(Duration::from_secs(10)))
                    .map_err(|e| e.to_string())?;
                let mut buf = vec![0u8; 1 << 20];
                let (mut total, mut first, mut last) = (0u64, None, None);
                loop {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            let now = Instant::now();
                            first.get_or_insert(now);
                            last = Some(now);
                            total += n as u64;
                        }
                    }
                }
                let secs = match (first, last) {
                    (Some(f), Some(l)) if l > f => (l - f).as_secs_f64(),
                    _ => return Err("nothing arrived".into()),
                };
                Ok((total, secs))
            })
            .map_err(|e| fail("the sink's namespace", &e))?;
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .map_err(|e| fail("the sink did not start", &e))?;
        let me = Ipv4Addr::from(u32::from(self.pair.addr_a) + 2);
        let iface = self.pair.iface_a.clone();
        let sent = self
            .pair
            .a
            .run(move || -> Result<(u64, String), String> {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                rt.block_on(async move {
                    let cfg = PacketConfig {
                        protocol: ETH_P_ALL,
                        ..PacketConfig::default()
                    };
                    let dev = PacketDevice::open(&iface, &cfg)
                        .map_err(|e| format!("AF_PACKET on {iface}: {e}"))?;
                    let host = Host::spawn(
                        dev,
                        HostConfig {
                            mac: Some(MacAddr::local(0xbe7c)),
                            addr: me,
                            tcp_tx_buffer: 4 << 20,
                            tcp_rx_buffer: 1 << 20,
                            ..HostConfig::default()
                        },
                    )
                    .map_err(|e| format!("smoltcp host: {e}"))?;
                    let mut link =
                        tokio::time::timeout(Duration::from_secs(5), host.connect_tcp(server))
                            .await
                            .map_err(|_| "connect timed out".to_owned())?
                            .map_err(|e| format!("connect: {e}"))?;
                    let uid = Uid::new(me, 1).port(1);
                    let m = Message::send(uid, uid, Bytes::from(vec![0x5a; size]))
                        .map_err(|e| e.to_string())?;
                    let mut messages = 0u64;
                    let start = Instant::now();
                    while start.elapsed().as_secs_f64() < secs {
                        for _ in 0..16 {
                            link.feed(m.clone()).await.map_err(|e| e.to_string())?;
                        }
                        link.flush().await.map_err(|e| e.to_string())?;
                        messages += 16;
                    }
                    link.close().await.map_err(|e| e.to_string())?;
                    // Let the FIN go out before the host stops.
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    Ok((messages, format!("{:?}", host.stats())))
                })
            })
            .map_err(|e| fail("the sender's namespace", &e))?
            .map_err(|e| fail("sending", &e))?;
        let (bytes, secs) = sink
            .join()
            .map_err(|_| fail("the sink", &"panicked"))?
            .map_err(|e| fail("the sink", &e))?;
        let gbps = bytes as f64 * 8.0 / secs / 1e9;
        Ok((
            gbps,
            json!({ "gbps": gbps, "bytes": bytes, "messages": sent.0, "mtu": self.mtu, "host": sent.1 }),
        ))
    }

    /// The peer: iperf3 between the two ends of the same veth.
    pub fn iperf3(&self) -> Iperf3Veth<'_> {
        Iperf3Veth { veth: self }
    }
}

/// iperf3's TCP between the two namespaces of a [`VethTcp`].
pub struct Iperf3Veth<'a> {
    veth: &'a VethTcp,
}

impl Peer for Iperf3Veth<'_> {
    fn tool(&self) -> &'static str {
        "iperf3"
    }

    fn package(&self) -> &'static str {
        "iperf3"
    }

    fn metric(&self) -> Metric {
        Metric::Gbps
    }

    fn transport(&self) -> &'static str {
        "kernel TCP on both ends of a veth between two namespaces"
    }

    fn commands(&self, w: &Workload) -> Vec<String> {
        let b = self.veth.pair.addr_b;
        vec![
            format!("ip netns exec NS_B iperf3 -s -1 -B {b} -p {PORT}"),
            format!(
                "ip netns exec NS_A iperf3 -c {b} -p {PORT} -l {} -t {} --json",
                w.size,
                w.seconds.max(1)
            ),
        ]
    }

    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError> {
        let bin = locate(&None, "iperf3", "iperf3")?;
        let bin = bin.to_string_lossy();
        let pair = &self.veth.pair;
        let gbps = iperf3_tcp(
            &mut pair.b.command(&bin),
            &mut pair.a.command(&bin),
            &pair.addr_b.to_string(),
            PORT,
            w,
        )?;
        Ok(PeerFigure {
            value: gbps,
            detail: json!({ "gbps": gbps, "mtu": self.veth.mtu }),
        })
    }
}
