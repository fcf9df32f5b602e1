//! `share` (DUA Fig. 11(b)): three applications share one shaped
//! interface; the policy switches from fair to weights mid-run.
//!
//! App 1 writes 4 KiB blocks to host memory from phase 0, app 2 also from
//! phase 1, app 3 sends 1 KiB messages to another device from phase 2; in
//! phase 3 the interface's policy changes from fair (byte-fair deficit
//! round-robin) to the given weights. The underlay's interface mux
//! (filter, queues, scheduler, token-bucket shaper) runs on the real clock;
//! every application keeps its queue full, so only the mux decides.

use std::net::Ipv4Addr;

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::{Message, Uid};
use uniplane_underlay::{InterfaceMux, MuxConfig, ShaperConfig};

use crate::clock::{Clock, MonotonicClock};
use crate::BenchError;

/// Parameters of `share`.
#[derive(Clone, Debug)]
pub struct ShareOptions {
    /// Weights of apps 1–3 in the last phase.
    pub weights: Vec<u32>,
    /// Length of each of the four phases.
    pub phase_ms: u64,
    /// Shaped interface rate, bits per second.
    pub rate_bps: u64,
    /// Sampling interval.
    pub interval_ms: u64,
}

/// Per-phase figures and the per-interval series.
pub struct ShareResult {
    /// The JSON results.
    pub results: Value,
    /// (interval start in s, Gbit/s of each app).
    pub series: Vec<(f64, [f64; 3])>,
}

fn host(device: u16) -> Uid {
    Uid::new(Ipv4Addr::LOCALHOST, device)
}

/// Runs the experiment.
pub fn run_share(opts: &ShareOptions) -> Result<ShareResult, BenchError> {
    if opts.weights.len() != 3 || opts.weights.contains(&0) {
        return Err(BenchError::Config(
            "--weights takes three non-zero weights, like 1:1:2".into(),
        ));
    }
    let clock = MonotonicClock::new();
    let rate_bytes = opts.rate_bps / 8;
    let mut cfg = MuxConfig::new(3, 64);
    cfg.policy = Policy::Weighted(vec![1, 1, 1]);
    // A burst of 5 ms of traffic (at least 256 KiB): the driver thread may
    // lose the CPU for a few ms on a busy machine, and the interface must
    // not lose that time's credit.
    let burst = (rate_bytes / 200).max(256 * 1024);
    cfg.shaper = Some(ShaperConfig::new(rate_bytes, burst));
    let mut mux =
        InterfaceMux::new_at(cfg, clock.now_ns()).map_err(|e| BenchError::Config(e.to_string()))?;
    let block = Bytes::from(vec![0xa5u8; 4096]);
    let small = Bytes::from(vec![0x5au8; 1024]);
    let proto = [
        Message::write(host(1), host(100).at(0), block.clone()),
        Message::write(host(2), host(100).at(1 << 20), block),
        Message::send(host(3).port(1), host(200).port(1), small),
    ];
    let proto: Vec<Message> = proto
        .into_iter()
        .collect::<Result<_, _>>()
        .map_err(|e| BenchError::Config(e.to_string()))?;

    let phase_ns = opts.phase_ms * 1_000_000;
    let interval_ns = opts.interval_ms.max(1) * 1_000_000;
    let start = clock.now_ns();
    let end = start + 4 * phase_ns;
    let intervals = (4 * phase_ns / interval_ns) as usize;
    let mut bytes = vec![[0u64; 3]; intervals + 1];
    let mut switched = false;
    let mut out = Vec::with_capacity(64);
    loop {
        let now = clock.now_ns();
        if now >= end {
            break;
        }
        let t = now - start;
        let phase = (t / phase_ns) as usize;
        if phase >= 3 && !switched {
            mux.set_policy(Policy::Weighted(opts.weights.clone()))
                .map_err(|e| BenchError::Config(e.to_string()))?;
            switched = true;
        }
        // Apps active by now keep their queues full.
        for (app, m) in proto.iter().enumerate().take(phase.min(2) + 1) {
            while mux.free(app) > 0 {
                if mux.offer(app, m.clone(), now).is_err() {
                    break;
                }
            }
        }
        out.clear();
        mux.dequeue_burst(now, &mut out, 64);
        let slot = ((t / interval_ns) as usize).min(intervals);
        for m in &out {
            let app = (m.header().src.device() as usize).saturating_sub(1).min(2);
            bytes[slot][app] += m.encoded_len() as u64;
        }
        if out.is_empty() {
            std::hint::spin_loop();
        }
    }
    bytes.truncate(intervals);

    let secs = interval_ns as f64 / 1e9;
    let series: Vec<(f64, [f64; 3])> = bytes
        .iter()
        .enumerate()
        .map(|(i, b)| (i as f64 * secs, b.map(|x| x as f64 * 8.0 / secs / 1e9)))
        .collect();
    let w: Vec<f64> = opts.weights.iter().map(|&x| f64::from(x)).collect();
    let wsum: f64 = w.iter().sum();
    let targets = [
        [1.0, 0.0, 0.0],
        [0.5, 0.5, 0.0],
        [1.0 / 3.0, 1.0 / 3.0, 1.0 / 3.0],
        [w[0] / wsum, w[1] / wsum, w[2] / wsum],
    ];
    let per_phase = (phase_ns / interval_ns) as usize;
    let mut phases = Vec::new();
    let (mut max_err, mut jain_min, mut util_min, mut settle_max) =
        (0.0f64, 1.0f64, f64::MAX, 0.0f64);
    for (p, target) in targets.iter().enumerate() {
        let slots = &bytes[p * per_phase..((p + 1) * per_phase).min(bytes.len())];
        let share_of = |b: &[u64; 3]| {
            let total: u64 = b.iter().sum();
            b.map(|x| {
                if total == 0 {
                    0.0
                } else {
                    x as f64 / total as f64
                }
            })
        };
        // Settled: from the first interval after which every interval's
        // shares are within 0.02 of the target. An interval that carried
        // less than a tenth of the shaped rate (the driver thread lost the
        // CPU) has no meaningful shares and is not held against it.
        let min_bytes = (rate_bytes as f64 * secs / 10.0) as u64;
        let ok = |b: &[u64; 3]| {
            b.iter().sum::<u64>() < min_bytes
                || share_of(b)
                    .iter()
                    .zip(target)
                    .all(|(a, t)| (a - t).abs() <= 0.02)
        };
        let settled_at = (0..slots.len())
            .find(|&i| slots[i..].iter().all(ok))
            .unwrap_or(slots.len());
        let steady = &slots[settled_at.min(slots.len().saturating_sub(1))..];
        let mut sum = [0u64; 3];
        for b in steady {
            for k in 0..3 {
                sum[k] += b[k];
            }
        }
        let achieved = share_of(&sum);
        let err = achieved
            .iter()
            .zip(target)
            .map(|(a, t)| (a - t).abs())
            .fold(0.0, f64::max);
        max_err = max_err.max(err);
        let active: Vec<f64> = achieved
            .iter()
            .zip(target)
            .filter(|(_, t)| **t > 0.0)
            .map(|(a, _)| *a)
            .collect();
        let jain = active.iter().sum::<f64>().powi(2)
            / (active.len() as f64 * active.iter().map(|x| x * x).sum::<f64>());
        if p < 3 {
            jain_min = jain_min.min(jain);
        }
        // Utilization over the whole phase: credit the shaper kept while the
        // driver was descheduled is spent right after, so shorter windows
        // swing both ways.
        let total_bytes: u64 = slots.iter().flat_map(|b| b.iter()).sum();
        let util = total_bytes as f64 / (slots.len() as f64 * secs) / rate_bytes as f64;
        util_min = util_min.min(util);
        let settle_ms = settled_at as f64 * opts.interval_ms as f64;
        settle_max = settle_max.max(settle_ms);
        phases.push(json!({
            "phase": p, "target": target, "achieved": achieved, "share_error": err,
            "jain": jain, "utilization": util, "settle_ms": settle_ms,
        }));
    }
    Ok(ShareResult {
        results: json!({
            "phases": phases,
            "max_share_error": max_err,
            "jain_min": jain_min,
            "utilization_min": util_min,
            "settle_ms_max": settle_max,
            "shaped_gbps": opts.rate_bps as f64 / 1e9,
            "intervals": series.iter().map(|(t, g)| json!({ "t": t, "gbps": g })).collect::<Vec<_>>(),
        }),
        series,
    })
}

/// Draws each application's throughput over time.
pub fn plot(path: &std::path::Path, series: &[(f64, [f64; 3])]) -> Result<(), BenchError> {
    let lines: Vec<(&str, Vec<(f64, f64)>)> = ["app 1 (WRTE)", "app 2 (WRTE)", "app 3 (SEND)"]
        .into_iter()
        .enumerate()
        .map(|(k, name)| (name, series.iter().map(|(t, g)| (*t, g[k])).collect()))
        .collect();
    crate::plot::draw(
        path,
        &crate::plot::Chart::Lines {
            title: "Three applications on one shaped interface",
            y_label: "Gbit/s",
            lines: &lines,
        },
    )?;
    Ok(())
}
