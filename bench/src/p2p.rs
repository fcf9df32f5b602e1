//! Peer-to-peer transfers between two emulated devices
//! (`uniplane_shm::p2p`): device A → device B in one or more transfer
//! modes over a sweep of sizes, the median time and GB/s per point, a fit
//! of `latency + size ÷ bandwidth` per mode, and memcpy between the same
//! two device memories at the same sizes in the same run (the peer: the
//! copy the engines themselves do, without descriptors or doorbells).
//!
//! The driver runs on the calling thread (pinned to CPU 0 on a machine
//! with two CPUs or more), both engines on CPU 1: idle, they yield to each
//! other; in `staged-pipelined` both are busy and share it.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uniplane_shm::dma::{LinkModel, PciePath};
use uniplane_shm::p2p::{P2pConfig, PeerToPeer, TransferMode};

use crate::engine::{Observer, Progress};
use crate::BenchError;

/// The largest transfer a run takes (both devices hold it).
pub const MAX_P2P_SIZE: usize = 256 << 20;

/// What a `p2p` run measures.
#[derive(Clone, Debug)]
pub struct P2pBench {
    /// Transfer modes, in the order run.
    pub modes: Vec<TransferMode>,
    /// Bytes per transfer.
    pub sizes: Vec<usize>,
    /// Time spent on each point (at least 3 transfers, at most 20,000).
    pub budget: Duration,
    /// Compare B's bytes with A's after each point (B cleared first).
    pub verify: bool,
    /// A PCIe link model for both engines, or none (memory speed).
    pub model: Option<LinkModel>,
}

/// A mode by the name the command line takes: `push`, `pull`, `staged`,
/// `pipelined` (or `staged-pipelined`).
pub fn parse_mode(name: &str) -> Result<TransferMode, BenchError> {
    match name {
        "pipelined" => Ok(TransferMode::StagedPipelined),
        other => other.parse().map_err(|_| {
            BenchError::Config(format!("--mode `{other}`: push, pull, staged or pipelined"))
        }),
    }
}

/// A link model by name (`none`, `gen2x4`, `gen3x8`) through a path
/// (`direct`, `switch`, `rc`).
pub fn parse_model(model: &str, path: &str) -> Result<Option<LinkModel>, BenchError> {
    let path = match path {
        "direct" => PciePath::Direct,
        "switch" => PciePath::Switch,
        "rc" => PciePath::RootComplex,
        other => {
            return Err(BenchError::Config(format!(
                "--link-path `{other}`: direct, switch or rc"
            )))
        }
    };
    Ok(match model {
        "none" => None,
        "gen2x4" => Some(LinkModel::pcie_gen2_x4().through(path)),
        "gen3x8" => Some(LinkModel::pcie_gen3_x8().through(path)),
        other => {
            return Err(BenchError::Config(format!(
                "--model `{other}`: none, gen2x4 or gen3x8"
            )))
        }
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Least-squares fit of time = latency + size / bandwidth on relative
/// error (weights 1/time²), so the small sizes pin the latency and the
/// large ones the bandwidth. Returns (latency s, bytes/s); `None` with
/// fewer than two distinct sizes.
pub fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for &(x, y) in points.iter().filter(|p| p.1 > 0.0) {
        let w = 1.0 / (y * y);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    let det = sw * sxx - sx * sx;
    if det.abs() < f64::EPSILON * sw * sxx || det == 0.0 {
        return None;
    }
    let slope = (sw * sxy - sx * sy) / det;
    let latency = (sy - slope * sx) / sw;
    (slope > 0.0).then_some((latency, 1.0 / slope))
}

/// memcpy GB/s between the two device memories: the median of timed
/// copies of `size` bytes within `budget` (at least 5).
fn memcpy_gbps(p: &PeerToPeer, size: usize, budget: Duration) -> f64 {
    let (a_off, _) = p.a.memory_window();
    let (b_off, _) = p.b.memory_window();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed() < budget && times.len() < 100_000) {
        let t = Instant::now();
        p.b.memory().copy_from(b_off, p.a.memory(), a_off, size);
        times.push(t.elapsed().as_secs_f64());
    }
    size as f64 / median(&mut times).max(1e-12) / 1e9
}

/// The byte at offset `i` of A's pattern.
fn pattern_byte(i: usize) -> u8 {
    (i as u32).wrapping_mul(2_654_435_761) as u8
}

/// Runs the sweep; `observer` gets progress (points done of all points).
/// The results: `sizes`, `memcpy_gbytes_per_sec` (one per size),
/// `modes` (per mode its `points` and `fit`), `verified`.
pub fn run_p2p(cfg: &P2pBench, observer: &mut dyn Observer) -> Result<Value, BenchError> {
    let max = cfg.sizes.iter().copied().max().unwrap_or(0);
    if cfg.sizes.is_empty() || cfg.modes.is_empty() {
        return Err(BenchError::Config("p2p needs a size and a mode".into()));
    }
    if max > MAX_P2P_SIZE || cfg.sizes.contains(&0) {
        return Err(BenchError::Config(format!(
            "--sizes: each from 1 byte to {} MiB",
            MAX_P2P_SIZE >> 20
        )));
    }
    let two_cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) >= 2;
    let p2p_cfg = P2pConfig {
        device_bytes: (max + (1 << 20)).next_multiple_of(1 << 20),
        host_bytes: max.max(1 << 20).next_multiple_of(1 << 20),
        model: cfg.model,
        engine_cpus: if two_cpus {
            [Some(1), Some(1)]
        } else {
            [None, None]
        },
        // Idle engines yield to each other; a long poll keeps the second
        // hop of the staged modes from waiting for a sleeping engine, and
        // the driver polls as long so a modelled transfer is not
        // lengthened by its wake-up.
        engine_spin: Duration::from_millis(2),
        driver_spin: Duration::from_millis(2),
        ..P2pConfig::default()
    };
    if two_cpus {
        // Best effort: an unpinned driver only adds noise.
        let _ = uniplane_shm::sys::pin_to_cpu(0);
    }
    let mut p = PeerToPeer::new(p2p_cfg)
        .map_err(|e| BenchError::Config(format!("setting up the two devices: {e}")))?;
    let pattern: Vec<u8> = (0..max).map(pattern_byte).collect();
    if !p.a.write_memory(0, &pattern) {
        return Err(BenchError::Config(
            "the pattern does not fit device A".into(),
        ));
    }
    let total = (cfg.sizes.len() * (cfg.modes.len() + 1)) as u64;
    let started = Instant::now();
    let mut done = 0u64;
    let tick = |done: u64, observer: &mut dyn Observer| {
        observer.progress(&Progress {
            elapsed_s: started.elapsed().as_secs_f64(),
            planned_s: None,
            sent: done,
            planned_count: Some(total),
            warming_up: false,
        })
    };
    let mut memcpy = Vec::with_capacity(cfg.sizes.len());
    for &size in &cfg.sizes {
        memcpy.push(memcpy_gbps(&p, size, cfg.budget));
        done += 1;
        tick(done, observer);
    }
    let timeout = Duration::from_secs(30);
    let zero = vec![0u8; max];
    let mut got = Vec::with_capacity(max);
    let mut all_verified = true;
    let mut modes = Vec::with_capacity(cfg.modes.len());
    for &mode in &cfg.modes {
        let mut points = Vec::with_capacity(cfg.sizes.len());
        let mut fit_points = Vec::with_capacity(cfg.sizes.len());
        for (i, &size) in cfg.sizes.iter().enumerate() {
            // Clear the destination once, so the check proves a copy.
            if cfg.verify && !p.b.write_memory(0, &zero[..size]) {
                return Err(BenchError::Config(format!("{size} B do not fit device B")));
            }
            let mut times = Vec::new();
            let start = Instant::now();
            while times.len() < 3 || (start.elapsed() < cfg.budget && times.len() < 20_000) {
                let t = Instant::now();
                p.transfer(mode, 0, 0, size, timeout)
                    .map_err(|e| BenchError::Config(format!("{mode} of {size} B: {e}")))?;
                times.push(t.elapsed().as_secs_f64());
            }
            let verified = if cfg.verify {
                got.resize(size, 0);
                let ok = p.b.read_memory(0, &mut got) && got[..] == pattern[..size];
                all_verified &= ok;
                Some(ok)
            } else {
                None
            };
            let iterations = times.len();
            let med = median(&mut times).max(1e-12);
            let gbps = size as f64 / med / 1e9;
            fit_points.push((size as f64, med));
            points.push(json!({
                "size": size,
                "iterations": iterations,
                "median_us": med * 1e6,
                "gbytes_per_sec": gbps,
                "vs_memcpy": if memcpy[i] > 0.0 { gbps / memcpy[i] } else { 0.0 },
                "verified": verified,
            }));
            done += 1;
            tick(done, observer);
        }
        let fit = fit(&fit_points)
            .map(|(lat, bw)| json!({ "latency_us": lat * 1e6, "gbytes_per_sec": bw / 1e9 }));
        modes.push(json!({ "mode": mode.name(), "points": points, "fit": fit }));
    }
    Ok(json!({
        "sizes": cfg.sizes,
        "memcpy_gbytes_per_sec": memcpy,
        "modes": modes,
        "verified": cfg.verify.then_some(all_verified),
        "seconds": started.elapsed().as_secs_f64(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_latency_and_bandwidth() {
        // 2 µs + size / 4 GB/s.
        let pts: Vec<(f64, f64)> = [64.0, 4096.0, 1e6, 1e7]
            .iter()
            .map(|&s| (s, 2e-6 + s / 4e9))
            .collect();
        let (lat, bw) = fit(&pts).unwrap();
        assert!((lat - 2e-6).abs() < 1e-9, "{lat}");
        assert!((bw - 4e9).abs() / 4e9 < 1e-6, "{bw}");
        assert!(fit(&[(64.0, 1e-6)]).is_none());
    }

    #[test]
    fn modes_and_models_by_name() {
        assert_eq!(
            parse_mode("pipelined").unwrap(),
            TransferMode::StagedPipelined
        );
        assert_eq!(parse_mode("push").unwrap(), TransferMode::Push);
        assert!(parse_mode("teleport").is_err());
        assert!(parse_model("none", "direct").unwrap().is_none());
        assert!(parse_model("gen3x8", "switch").unwrap().is_some());
        assert!(parse_model("gen9", "direct").is_err());
        assert!(parse_model("gen3x8", "moon").is_err());
    }
}
