//! `share --through daemons` (DUA Fig. 11(b) through the real data path):
//! two `uniplaned` processes peered over one tunnel stack, the sending
//! daemon's underlay shaped to a rate; three applications on A each send
//! to one of three on B in their own traffic class (0, 1, 2) as fast as
//! the daemon takes them. The classes start with equal weights; halfway
//! the weights change live (`uniplane class set`, one request per class)
//! and the receivers' byte counts show the shares move.
//!
//! Every application keeps its class queue full, so only the underlay's
//! scheduler and shaper decide. Shares are counted at the receivers per
//! interval; "settled" is the first interval within 2 % of the target
//! from which on the summed shares are too (later intervals that stray,
//! from a receiver's batch straddling an interval's end or a descheduled
//! thread, are counted and reported); utilization is the bytes (header
//! and payload, as the shaper counts them) that arrived from then on over
//! what the rate allows.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_client::protocol::Request;
use uniplane_client::Client;
use uniplane_dataplane::{LinkExt, Message};

use crate::path::{client_err, runtime, session, sibling_binary, WaitMode};
use crate::tunnel::{DaemonPair, TunnelStack};
use crate::BenchError;

/// Applications (and classes) sharing the tunnel.
const APPS: usize = 3;
/// Messages per send and receive call.
const BATCH: usize = 64;
/// Header bytes the shaper counts on top of the payload.
const HEADER: u64 = 32;
/// A send that moves nothing for this long is a stall.
const STALL: Duration = Duration::from_secs(5);
/// How long connecting may take.
const CONNECT_WITHIN: Duration = Duration::from_secs(10);

/// Parameters of `share --through daemons`.
#[derive(Clone, Debug)]
pub struct DaemonShareOptions {
    /// Weights of classes 0–2 after the change.
    pub weights: Vec<u32>,
    /// Length of each of the two phases (equal weights, then `weights`).
    pub phase_ms: u64,
    /// Shaped rate of the peer's tunnels, bits per second.
    pub rate_bps: u64,
    /// Sampling interval.
    pub interval_ms: u64,
    /// Payload bytes per message.
    pub size: usize,
    /// The tunnel's stack.
    pub stack: TunnelStack,
    /// The daemon binary; next to this program when `None`.
    pub uniplaned: Option<PathBuf>,
}

/// The figures and the per-interval series.
pub struct DaemonShareResult {
    /// The JSON results.
    pub results: Value,
    /// (interval start in s, Gbit/s of each class).
    pub series: Vec<(f64, [f64; 3])>,
}

/// The tables both daemons add: three classes of weight 1, and on A the
/// shaper.
fn underlay_tables(rate_bps: u64) -> String {
    let mbit = rate_bps.div_ceil(1_000_000).max(1);
    let mut t = format!(
        "\n[underlay]\nscheduling = \"weighted\"\nrate_mbit = {mbit}\nburst_kib = 64\nqueue_depth = 256\n"
    );
    for id in 0..APPS {
        t.push_str(&format!("\n[[classes]]\nid = {id}\nweight = 1\n"));
    }
    t
}

/// Runs the experiment.
pub fn run_share_through_daemons(
    opts: &DaemonShareOptions,
) -> Result<DaemonShareResult, BenchError> {
    if opts.weights.len() != APPS || opts.weights.contains(&0) {
        return Err(BenchError::Config(
            "--weights takes three non-zero weights, like 1:1:2".into(),
        ));
    }
    if opts.rate_bps < 1_000_000 || !opts.rate_bps.is_multiple_of(1_000_000) {
        return Err(BenchError::Config(
            "through the daemons the rate is a whole number of Mbit/s (--gbps 0.2 = 200 Mbit/s)"
                .into(),
        ));
    }
    let binary = match &opts.uniplaned {
        Some(p) => p.clone(),
        None => sibling_binary("uniplaned").ok_or_else(|| {
            BenchError::Config(
                "no uniplaned next to this program: cargo build --release -p uniplane-services --bin uniplaned (or pass --uniplaned PATH)".into(),
            )
        })?,
    };
    let mut pair = DaemonPair::start_with(&binary, opts.stack, &underlay_tables(opts.rate_bps))?;
    let r = runtime()?.block_on(measure(&pair, opts));
    match (r, pair.exited()) {
        (Err(e), Some(why)) => Err(BenchError::Config(format!("{e}; {why}"))),
        (r, _) => r,
    }
}

/// Bytes each class delivered per interval, and when the weights changed.
struct Counts {
    bytes: Vec<[u64; APPS]>,
    changed_at: Duration,
    change_took: Duration,
}

async fn measure(
    pair: &DaemonPair,
    opts: &DaemonShareOptions,
) -> Result<DaemonShareResult, BenchError> {
    let (a_dir, b_dir) = (pair.a.runtime_dir(), pair.b.runtime_dir());
    let interval = Duration::from_millis(opts.interval_ms.max(1));
    let phase = Duration::from_millis(opts.phase_ms);
    let slots = (2 * phase.as_nanos() / interval.as_nanos()) as usize;
    // Receivers on B, senders on A, one per class.
    let mut sinks = Vec::new();
    let mut listeners = Vec::new();
    for k in 0..APPS {
        let s = session(b_dir, &format!("share-sink-{k}"), WaitMode::Park).await?;
        listeners.push(s.listen(10 + k as u16).await.map_err(client_err)?);
        sinks.push(s);
    }
    let mut conns = Vec::new();
    let mut sources = Vec::new();
    for (k, sink) in sinks.iter().enumerate() {
        let s = session(a_dir, &format!("share-source-{k}"), WaitMode::Park).await?;
        let conn = tokio::time::timeout(
            CONNECT_WITHIN,
            s.connect_class(sink.uid().port(10 + k as u16), k as u8),
        )
        .await
        .map_err(|_| BenchError::Config(format!("class {k}: connecting took too long")))?
        .map_err(client_err)?;
        conns.push(conn);
        sources.push(s);
    }
    let mut accepted = Vec::new();
    for l in &mut listeners {
        let c = tokio::time::timeout(CONNECT_WITHIN, l.accept())
            .await
            .ok()
            .flatten()
            .ok_or(BenchError::SideGone("sender"))?;
        accepted.push(c);
    }

    let start = Instant::now();
    let end = start + 2 * phase;
    let payload = Bytes::from(vec![0xa5; opts.size]);
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let payload = payload.clone();
        tasks.spawn(async move {
            let mut batch: VecDeque<Message> = VecDeque::with_capacity(BATCH);
            while Instant::now() < end {
                for _ in 0..BATCH {
                    batch.push_back(conn.message(payload.clone())?);
                }
                tokio::time::timeout(STALL, conn.send_batch(&mut batch))
                    .await
                    .map_err(|_| BenchError::Config(format!("sending stalled for {STALL:?}")))??;
            }
            Ok::<_, BenchError>(Vec::new())
        });
    }
    for (k, mut conn) in accepted.into_iter().enumerate() {
        tasks.spawn(async move {
            let mut bytes = vec![0u64; slots + 1];
            let mut buf = Vec::with_capacity(BATCH);
            while Instant::now() < end {
                let got = tokio::time::timeout(
                    Duration::from_millis(50),
                    conn.recv_batch(&mut buf, BATCH),
                );
                match got.await {
                    Ok(Ok(0)) => break,
                    Ok(Ok(_)) => {
                        let slot = ((start.elapsed().as_nanos() / interval.as_nanos()) as usize)
                            .min(slots);
                        bytes[slot] += buf
                            .drain(..)
                            .map(|m| m.payload().len() as u64 + HEADER)
                            .sum::<u64>();
                    }
                    Ok(Err(e)) => return Err(BenchError::Link(e)),
                    Err(_) => continue,
                }
            }
            Ok(vec![(k, bytes)])
        });
    }
    // Halfway, the new weights, one class at a time, as an operator would.
    let client = Client::connect(a_dir).await.map_err(client_err)?;
    tokio::time::sleep_until((start + phase).into()).await;
    let changed_at = start.elapsed();
    for (id, w) in opts.weights.iter().enumerate() {
        client
            .request(&Request::Class {
                id: Some(id as u8),
                weight: Some(*w),
                priority: None,
            })
            .await
            .map_err(client_err)?;
    }
    let change_took = start.elapsed() - changed_at;
    let mut per_class = vec![Vec::new(); APPS];
    while let Some(r) = tasks.join_next().await {
        let r = r.map_err(|_| BenchError::Panicked("share application"))?;
        for (k, b) in r? {
            per_class[k] = b;
        }
    }
    drop((sources, sinks));
    let bytes: Vec<[u64; APPS]> = (0..slots)
        .map(|i| [0, 1, 2].map(|k| per_class[k].get(i).copied().unwrap_or(0)))
        .collect();
    Ok(analyse(
        opts,
        &Counts {
            bytes,
            changed_at,
            change_took,
        },
    ))
}

/// Shares, errors, utilization and settling of each phase.
fn analyse(opts: &DaemonShareOptions, c: &Counts) -> DaemonShareResult {
    let interval_ns = opts.interval_ms.max(1) * 1_000_000;
    let secs = interval_ns as f64 / 1e9;
    let rate_bytes = opts.rate_bps as f64 / 8.0;
    let per_phase = (opts.phase_ms * 1_000_000 / interval_ns) as usize;
    let w: Vec<f64> = opts.weights.iter().map(|&x| f64::from(x)).collect();
    let wsum: f64 = w.iter().sum();
    let targets = [[1.0 / 3.0; 3], [w[0] / wsum, w[1] / wsum, w[2] / wsum]];
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
    let sum_of = |slots: &[[u64; 3]]| {
        let mut sum = [0u64; 3];
        for b in slots {
            for k in 0..3 {
                sum[k] += b[k];
            }
        }
        sum
    };
    let mut phases = Vec::new();
    let (mut max_err, mut util_min, mut settle_after_change) = (0.0f64, f64::MAX, 0.0f64);
    for (p, target) in targets.iter().enumerate() {
        let slots =
            &c.bytes[(p * per_phase).min(c.bytes.len())..((p + 1) * per_phase).min(c.bytes.len())];
        let ok = |b: &[u64; 3]| {
            share_of(b)
                .iter()
                .zip(target)
                .all(|(a, t)| (a - t).abs() <= 0.02)
        };
        // Settled: the first interval that is within 2 % of the target
        // and from which on the shares summed are too. Single intervals
        // after it may still stray (a receiver's batch straddling an
        // interval's end, a thread descheduled on a busy machine); they
        // are counted, not hidden.
        let settled_at = (0..slots.len())
            .find(|&i| ok(&slots[i]) && ok(&sum_of(&slots[i..])))
            .unwrap_or(slots.len());
        let straying = slots[settled_at.min(slots.len())..]
            .iter()
            .filter(|b| !ok(b))
            .count();
        let steady = &slots[settled_at.min(slots.len().saturating_sub(1))..];
        let sum = sum_of(steady);
        let achieved = share_of(&sum);
        let err = achieved
            .iter()
            .zip(target)
            .map(|(a, t)| (a - t).abs())
            .fold(0.0, f64::max);
        max_err = max_err.max(err);
        let util = sum.iter().sum::<u64>() as f64 / (steady.len() as f64 * secs) / rate_bytes;
        util_min = util_min.min(util);
        let settle_ms = settled_at as f64 * opts.interval_ms as f64;
        if p == 1 {
            // From the change (not the phase boundary) to the first
            // settled interval's start.
            let phase_start = opts.phase_ms as f64;
            let changed = c.changed_at.as_secs_f64() * 1e3;
            settle_after_change = (phase_start + settle_ms - changed).max(0.0);
        }
        phases.push(json!({
            "phase": p, "target": target, "achieved": achieved, "share_error": err,
            "utilization": util, "settle_ms": settle_ms,
            "intervals_after": steady.len(), "intervals_straying": straying,
        }));
    }
    let series: Vec<(f64, [f64; 3])> = c
        .bytes
        .iter()
        .enumerate()
        .map(|(i, b)| (i as f64 * secs, b.map(|x| x as f64 * 8.0 / secs / 1e9)))
        .collect();
    DaemonShareResult {
        results: json!({
            "through": "daemons",
            "tunnel": opts.stack.name(),
            "phases": phases,
            "max_share_error": max_err,
            "utilization": util_min,
            "settle_ms": settle_after_change,
            "change_took_ms": c.change_took.as_secs_f64() * 1e3,
            "shaped_gbps": opts.rate_bps as f64 / 1e9,
            "intervals": series.iter().map(|(t, g)| json!({ "t": t, "gbps": g })).collect::<Vec<_>>(),
        }),
        series,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> DaemonShareOptions {
        DaemonShareOptions {
            weights: vec![1, 1, 2],
            phase_ms: 100,
            rate_bps: 8_000_000,
            interval_ms: 10,
            size: 968,
            stack: TunnelStack::Tcp,
            uniplaned: None,
        }
    }

    /// Shares that follow the targets give no error and full use; a
    /// phase that needs three intervals to turn settles after them.
    #[test]
    fn shares_settling_and_utilization_follow_from_the_counts() {
        let o = opts();
        // 1 MB/s at 10 ms intervals: 10,000 bytes per interval.
        let mut bytes = vec![[3334, 3333, 3333]; 10];
        bytes.extend(vec![[3333, 3333, 3334]; 3]);
        bytes.extend(vec![[2500, 2500, 5000]; 7]);
        let r = analyse(
            &o,
            &Counts {
                bytes,
                changed_at: Duration::from_millis(100),
                change_took: Duration::from_millis(1),
            },
        );
        let v = &r.results;
        assert!(v["max_share_error"].as_f64().unwrap() < 0.001, "{v}");
        assert!(
            (v["utilization"].as_f64().unwrap() - 1.0).abs() < 0.001,
            "{v}"
        );
        assert_eq!(v["settle_ms"].as_f64().unwrap(), 30.0);
    }
}
