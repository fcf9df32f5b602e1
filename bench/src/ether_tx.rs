//! `peer --tool trafgen --stack ether`: raw Ethernet transmit on one end
//! of a veth pair between two network namespaces (made for the run, root
//! only), ours through the frame layer's `AF_PACKET` transmit ring, the
//! peer netsniff-ng's `trafgen` on the same interface, the same frames.
//!
//! Both run on CPU 0: our sender is pinned there, and `trafgen --cpus 1`
//! runs its one worker there. Ours counts frames the ring accepted and
//! the kernel sent, per wall-clock second; trafgen's figure is its own
//! count over its worker's own time ("N sec, M usec on CPU0 (K
//! packets)"), which leaves out its start-up.

use std::cell::Cell;
use std::process::Command;
use std::time::{Duration, Instant};

use uniplane_frame::eth::{write_header, MacAddr};
use uniplane_frame::packet::{PacketConfig, PacketDevice};
use uniplane_frame::{FrameDevice, TxQueue};
use uniplane_netns::Pair;

use crate::peer::{find_tool, Metric, Peer, PeerError, PeerFigure, ProcessGroup, Workload};
use crate::BenchError;

/// The EtherType of the frames both sides send (local experimental).
const ETHERTYPE: u16 = 0x88b5;

/// The frame length both sides write for a workload: `size` bytes
/// without the FCS, from 60 (64 on the wire) to 1514.
pub fn frame_len(size: usize) -> usize {
    size.clamp(60, 1514)
}

fn pin_cpu0() {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2 {
        // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(0, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

/// A veth pair between two fresh namespaces, removed when dropped.
pub struct Veth {
    pair: Pair,
}

impl Veth {
    /// Makes the namespaces and the veth (root only).
    pub fn new() -> Result<Veth, BenchError> {
        let pair = Pair::new().map_err(|e| {
            BenchError::Config(format!(
                "a veth between two network namespaces (needs root): {e}"
            ))
        })?;
        Ok(Veth { pair })
    }

    /// Our side: `len`-byte broadcast frames through the `AF_PACKET`
    /// transmit ring of the first end for `secs`, in bursts of 256;
    /// returns (frames per second, frames).
    pub fn raw_tx(&self, len: usize, secs: f64) -> Result<(f64, u64), BenchError> {
        let iface = self.pair.iface_a.clone();
        self.pair
            .a
            .run(move || -> Result<(f64, u64), BenchError> {
                pin_cpu0();
                // Ring sizes of 256 to 4096 slots and bursts of 64 to 256
                // land within the noise of each other: the kernel's
                // per-frame work (skb, veth transmit) is the cost.
                let cfg = PacketConfig {
                    protocol: ETHERTYPE,
                    tx_frames: 512,
                    rx_blocks: 2,
                    ..PacketConfig::default()
                };
                let io =
                    |e: std::io::Error| BenchError::Config(format!("AF_PACKET on {iface}: {e}"));
                let mut dev = PacketDevice::open(&iface, &cfg).map_err(io)?;
                let src = dev.mac();
                let (_, tx) = dev.queues();
                let start = Instant::now();
                let mut sent = 0u64;
                while start.elapsed().as_secs_f64() < secs {
                    for _ in 0..256 {
                        let pushed = tx.push(len, |f| {
                            write_header(f, MacAddr::BROADCAST, src, ETHERTYPE);
                            f[14..].fill(0);
                        });
                        if pushed.is_none() {
                            break;
                        }
                    }
                    sent += tx.flush().map_err(io)? as u64;
                }
                while tx.unflushed() > 0 {
                    sent += tx.flush().map_err(io)? as u64;
                }
                Ok((sent as f64 / start.elapsed().as_secs_f64(), sent))
            })
            .map_err(|e| BenchError::Config(format!("entering the namespace: {e}")))?
    }
}

/// netsniff-ng's `trafgen --cpus 1 -n COUNT` on our veth, the same frames:
/// COUNT is the frames its previous run sent per second (a million at
/// first) times the workload's seconds, so a run lasts about that long.
pub struct Trafgen<'a> {
    veth: &'a Veth,
    last_pps: Cell<f64>,
}

impl<'a> Trafgen<'a> {
    /// trafgen on `veth`'s first end.
    pub fn new(veth: &'a Veth) -> Self {
        Trafgen {
            veth,
            last_pps: Cell::new(1e6),
        }
    }

    fn config(len: usize) -> String {
        format!(
            "{{ fill(0xff, 6), 0x02, 0x75, 0x00, 0x00, 0x00, 0x01, 0x{:02x}, 0x{:02x}, fill(0x00, {}) }}\n",
            ETHERTYPE >> 8,
            ETHERTYPE & 0xff,
            len - 14
        )
    }
}

/// trafgen's rate from its summary line ("3 sec, 964899 usec on CPU0
/// (3000000 packets)"), summed over its CPUs: (packets per second,
/// packets).
pub fn parse_trafgen(out: &str) -> Result<(f64, u64), PeerError> {
    let bad = |why: &str| PeerError::BadOutput {
        tool: "trafgen",
        why: why.to_owned(),
    };
    let mut packets = 0u64;
    let mut longest = 0.0f64;
    for line in out.lines().filter(|l| l.contains("usec on CPU")) {
        let mut w = line.split_whitespace();
        let sec: f64 = w
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(line))?;
        w.next();
        let usec: f64 = w
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(line))?;
        let n: u64 = line
            .split('(')
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| bad(line))?;
        packets += n;
        longest = longest.max(sec + usec / 1e6);
    }
    if longest <= 0.0 {
        return Err(bad("no `N sec, M usec on CPUx (K packets)` line"));
    }
    Ok((packets as f64 / longest, packets))
}

impl Peer for Trafgen<'_> {
    fn tool(&self) -> &'static str {
        "trafgen"
    }

    fn package(&self) -> &'static str {
        "netsniff-ng"
    }

    fn metric(&self) -> Metric {
        Metric::Pps
    }

    fn transport(&self) -> &'static str {
        "AF_PACKET on one end of a veth between two namespaces (trafgen's own TX ring), one CPU"
    }

    fn commands(&self, w: &Workload) -> Vec<String> {
        vec![format!(
            "ip netns exec NS trafgen --dev VETH --cpus 1 -n COUNT --conf FILE  # FILE: {}",
            Self::config(frame_len(w.size)).trim()
        )]
    }

    fn run(&self, w: &Workload) -> Result<PeerFigure, PeerError> {
        if find_tool("trafgen").is_none() {
            return Err(PeerError::Missing {
                tool: "trafgen",
                package: "netsniff-ng",
            });
        }
        let len = frame_len(w.size);
        let count = ((self.last_pps.get() * w.seconds as f64) as u64).max(1000);
        let conf =
            std::env::temp_dir().join(format!("uniplane-bench-trafgen-{}.cfg", std::process::id()));
        std::fs::write(&conf, Self::config(len)).map_err(|source| PeerError::Spawn {
            tool: "trafgen",
            source,
        })?;
        let mut cmd: Command = self.veth.pair.a.command("trafgen");
        cmd.args(["--dev", &self.veth.pair.iface_a, "--cpus", "1", "-n"])
            .arg(count.to_string())
            .arg("--conf")
            .arg(&conf);
        // trafgen forks a worker that outlives a signal to its parent:
        // the group goes as a whole on time-out.
        let g = ProcessGroup::spawn("trafgen", &mut cmd)?;
        let limit = Duration::from_secs(w.seconds * 4) + Duration::from_secs(20);
        let done = g.wait_output(limit, "finish");
        let _ = std::fs::remove_file(&conf);
        let (status, out, err) = done?;
        let (pps, packets) = parse_trafgen(&out).map_err(|e| match status.success() {
            true => e,
            false => PeerError::Failed {
                tool: "trafgen",
                status: status.to_string(),
                stderr: err
                    .trim()
                    .chars()
                    .rev()
                    .take(400)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect(),
            },
        })?;
        self.last_pps.set(pps);
        Ok(PeerFigure {
            value: pps,
            detail: serde_json::json!({ "tx_pps": pps, "packets": packets, "count": count }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trafgen_summaries_give_packets_over_its_time() {
        let out = "\n      3 sec, 500000 usec on CPU0 (3500000 packets)\n";
        let (pps, n) = parse_trafgen(out).unwrap();
        assert_eq!(n, 3_500_000);
        assert!((pps - 1e6).abs() < 1e-6);
        assert!(parse_trafgen("nothing").is_err());
        assert!(parse_trafgen("x sec, y usec on CPU0 (z packets)").is_err());
    }

    #[test]
    fn frames_are_60_to_1514_bytes_and_the_config_fills_them() {
        assert_eq!(frame_len(10), 60);
        assert_eq!(frame_len(64), 64);
        assert_eq!(frame_len(9000), 1514);
        assert!(Trafgen::config(60).contains("fill(0x00, 46)"));
        assert!(Trafgen::config(60).contains("0x88, 0xb5"));
    }
}
