//! Peer-to-peer sweep: device A → device B in one transfer mode, sizes 4 B
//! to 32 MiB, data verified, latency and GB/s per point, a fit of
//! `latency + size ÷ bandwidth`, and memcpy measured in the same run.
//!
//! ```text
//! cargo run --release -p uniplane-shm --example p2p_sweep -- --mode push
//! cargo run --release -p uniplane-shm --example p2p_sweep -- --mode all --model gen3x8
//! ```
//!
//! Options: `--mode staged|staged-pipelined|push|pull|all` (default all),
//! `--model none|gen2x4|gen3x8` with `--path direct|switch|rc` (default
//! none: memory speed), `--max BYTES` (default 32 MiB), `--budget-ms N`
//! time per point (default 60).

use std::time::{Duration, Instant};

use uniplane_shm::dma::{LinkModel, PciePath};
use uniplane_shm::p2p::{P2pConfig, PeerToPeer, TransferMode};

struct Args {
    modes: Vec<TransferMode>,
    model: Option<LinkModel>,
    max: usize,
    budget: Duration,
}

fn parse() -> Result<Args, String> {
    let mut modes = TransferMode::ALL.to_vec();
    let mut model = None;
    let mut path = PciePath::Direct;
    let mut max = 32 << 20;
    let mut budget = Duration::from_millis(60);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut val = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--mode" => {
                let v = val()?;
                modes = if v == "all" {
                    TransferMode::ALL.to_vec()
                } else {
                    vec![v.parse().map_err(|e| format!("{e}"))?]
                };
            }
            "--model" => {
                model = match val()?.as_str() {
                    "none" => None,
                    "gen2x4" => Some(LinkModel::pcie_gen2_x4()),
                    "gen3x8" => Some(LinkModel::pcie_gen3_x8()),
                    other => return Err(format!("unknown model {other}")),
                }
            }
            "--path" => {
                path = match val()?.as_str() {
                    "direct" => PciePath::Direct,
                    "switch" => PciePath::Switch,
                    "rc" => PciePath::RootComplex,
                    other => return Err(format!("unknown path {other}")),
                }
            }
            "--max" => max = val()?.parse().map_err(|e| format!("--max: {e}"))?,
            "--budget-ms" => {
                budget = Duration::from_millis(val()?.parse().map_err(|e| format!("{e}"))?)
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(Args {
        modes,
        model: model.map(|m: LinkModel| m.through(path)),
        max,
        budget,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// memcpy GB/s between two device memories, the same copy the engine does.
fn memcpy_gbps(p: &PeerToPeer, size: usize, budget: Duration) -> f64 {
    let (a_off, _) = p.a.memory_window();
    let (b_off, _) = p.b.memory_window();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || start.elapsed() < budget {
        let t = Instant::now();
        p.b.memory().copy_from(b_off, p.a.memory(), a_off, size);
        times.push(t.elapsed().as_secs_f64());
        if times.len() > 100_000 {
            break;
        }
    }
    size as f64 / median(&mut times) / 1e9
}

/// Fit of time = latency + size / bandwidth by least squares on relative
/// error (weights 1/time²), so the small sizes pin the latency and the
/// large ones the bandwidth.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let (mut sw, mut sx, mut sy, mut sxx, mut sxy) = (0.0, 0.0, 0.0, 0.0, 0.0);
    for (x, y) in points {
        let w = 1.0 / (y * y);
        sw += w;
        sx += w * x;
        sy += w * y;
        sxx += w * x * x;
        sxy += w * x * y;
    }
    let slope = (sw * sxy - sx * sy) / (sw * sxx - sx * sx);
    let latency = (sy - slope * sx) / sw;
    (latency, 1.0 / slope)
}

fn main() {
    let args = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("p2p_sweep: {e}");
            std::process::exit(2);
        }
    };
    let cfg = P2pConfig {
        device_bytes: (args.max + (1 << 20)).next_multiple_of(1 << 20),
        host_bytes: (args.max.max(1 << 20)).next_multiple_of(1 << 20),
        model: args.model,
        engine_cpus: [Some(1), Some(1)],
        // Idle engines yield to each other; a long poll keeps the second
        // hop of the staged modes from waiting for a sleeping engine.
        engine_spin: Duration::from_millis(2),
        // The driver polls for completions as long, so a modelled transfer
        // is not lengthened by its wake-up.
        driver_spin: Duration::from_millis(2),
        ..P2pConfig::default()
    };
    // The driver runs on CPU 0, both engines on CPU 1 (they yield to each
    // other while idle; in staged-pipelined both are busy and share it).
    let _ = uniplane_shm::sys::pin_to_cpu(0);
    let mut p = match PeerToPeer::new(cfg) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("p2p_sweep: setting up devices: {e}");
            std::process::exit(1);
        }
    };
    let pattern: Vec<u8> = (0..args.max)
        .map(|i| (i as u32).wrapping_mul(2654435761) as u8)
        .collect();
    if !p.a.write_memory(0, &pattern) {
        eprintln!("p2p_sweep: pattern does not fit device A");
        std::process::exit(1);
    }
    let memcpy: Vec<(usize, f64)> = [64 << 10, 4 << 20, args.max]
        .into_iter()
        .filter(|s| *s <= args.max)
        .map(|s| (s, memcpy_gbps(&p, s, args.budget)))
        .collect();
    println!("# p2p sweep, model {:?}", args.model);
    for (s, g) in &memcpy {
        println!("# memcpy {:>9} B: {g:.2} GB/s", s);
    }
    let mut sizes = vec![];
    let mut s = 4usize;
    while s <= args.max {
        sizes.push(s);
        s *= 2;
    }
    let timeout = Duration::from_secs(30);
    let mut zero = vec![0u8; args.max];
    for mode in &args.modes {
        println!("\n## mode {mode}");
        println!(
            "{:>10} {:>8} {:>12} {:>10} {:>8}",
            "bytes", "iters", "median_us", "GB/s", "verified"
        );
        let mut points = vec![];
        for &size in &sizes {
            // Clear the destination once, so the verification proves a copy.
            zero.truncate(size);
            if !p.b.write_memory(0, &zero) {
                eprintln!("p2p_sweep: size {size} does not fit device B");
                std::process::exit(1);
            }
            let mut times = vec![];
            let start = Instant::now();
            while times.len() < 3 || (start.elapsed() < args.budget && times.len() < 20_000) {
                let t = Instant::now();
                if let Err(e) = p.transfer(*mode, 0, 0, size, timeout) {
                    eprintln!("p2p_sweep: {mode} {size} B: {e}");
                    std::process::exit(1);
                }
                times.push(t.elapsed().as_secs_f64());
            }
            let mut got = vec![0u8; size];
            let ok = p.b.read_memory(0, &mut got) && got[..] == pattern[..size];
            let med = median(&mut times);
            println!(
                "{:>10} {:>8} {:>12.2} {:>10.3} {:>8}",
                size,
                times.len(),
                med * 1e6,
                size as f64 / med / 1e9,
                if ok { "yes" } else { "NO" }
            );
            if !ok {
                eprintln!("p2p_sweep: {mode} {size} B: data differs");
                std::process::exit(1);
            }
            points.push((size as f64, med));
        }
        let (lat, bw) = fit(&points);
        println!(
            "fit {mode}: latency {:.2} us + size / {:.2} GB/s",
            lat * 1e6,
            bw / 1e9
        );
        if let Some((_, m)) = memcpy.iter().find(|(s, _)| *s == 4 << 20) {
            if let Some((_, t)) = points.iter().find(|(s, _)| *s == (4 << 20) as f64) {
                let g = (4 << 20) as f64 / t / 1e9;
                println!("{mode} at 4 MiB: {g:.2} GB/s = {:.2} x memcpy", g / m);
            }
        }
    }
}
