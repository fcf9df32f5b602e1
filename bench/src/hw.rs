//! The RTL crossbar's saturation throughput in co-simulation
//! (`uniplane-bench hw`, built with the `rtl` feature): every sending
//! input kept backlogged with messages of one size, to one output
//! (`all-to-one`: inputs 1..N to port 0) or to outputs drawn uniformly at
//! random (`uniform`: every input), and the beats each output moved per
//! clock cycle over a window. A beat is 32 bytes; one beat per cycle is
//! an output's line rate (64 Gbit/s per port at 250 MHz).
//!
//! Beside it, the reference each figure is judged against: the line rate
//! (1 beat/cycle) for `all-to-one`, and for `uniform` the saturation
//! throughput of an input-queued switch with one FIFO per input, whose
//! head-of-line blocking caps it at 0.655 (N = 4) and 0.618 (N = 8) of
//! the line rate (Karol, Hluchyj and Morgan, 1987): what virtual output
//! queues exist to beat.
//!
//! Two crossbars: the default reads every input's buffer through a port
//! per output and needs no matching; `Model::N4Islip` reads it through
//! two ports and matches inputs to outputs (iSLIP-style) a message at a
//! time, and reports how close that comes.

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_dataplane::{Message, SplitMix64, Uid};
use uniplane_hw_sim::{Model, RtlDevice, Stream};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{ForwardingPlane, PortId};

use crate::engine::{Observer, Progress};
use crate::BenchError;

/// Where the traffic goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HwPattern {
    /// Inputs 1..N, all to output 0.
    AllToOne,
    /// Every input, each message to an output drawn uniformly.
    Uniform,
}

/// What a `hw` run measures.
#[derive(Clone, Debug)]
pub struct HwBench {
    /// 4 or 8 ports, and the crossbar (a read port per output, or one
    /// per input with iSLIP matching).
    pub model: Model,
    /// Where the traffic goes.
    pub pattern: HwPattern,
    /// Payload bytes of every message.
    pub size: usize,
    /// Measured cycles (after 2,000 of warm-up).
    pub cycles: u64,
    /// Seed of the uniform destinations.
    pub seed: u64,
}

/// The largest payload a run sends.
pub const MAX_HW_SIZE: usize = 9000;

/// Beats per cycle of a FIFO input-queued switch with `n` ports under
/// uniform traffic (Karol et al., 1987, Table I), `None` beyond 8.
pub fn hol_bound(n: usize) -> Option<f64> {
    [1.0, 0.75, 0.6825, 0.6553, 0.6399, 0.6302, 0.6234, 0.6184]
        .get(n.checked_sub(1)?)
        .copied()
}

fn uid(d: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), d)
}

/// A device whose port p owns UID p+1, every port admitting everything.
fn device(model: Model) -> Result<RtlDevice, BenchError> {
    let mut dev = RtlDevice::new(model);
    let n = dev.ports() as PortId;
    let bad = |e: &dyn std::fmt::Display| BenchError::Config(format!("programming the RTL: {e}"));
    for p in 0..n {
        dev.add_acl_rule(p, AclRule::ALLOW_ALL)
            .map_err(|e| bad(&e))?;
        for d in 0..n {
            dev.add_route(p, Route::exact(uid(d + 1), d))
                .map_err(|e| bad(&e))?;
        }
    }
    Ok(dev)
}

/// The output of a sender's next message.
fn destination(pattern: HwPattern, rng: &mut SplitMix64, n: usize) -> usize {
    match pattern {
        HwPattern::AllToOne => 0,
        HwPattern::Uniform => rng.below(n as u64) as usize,
    }
}

/// Mean and lowest of the per-output figures of the outputs the pattern
/// sends to (port 0 alone for all-to-one).
fn receiving(pattern: HwPattern, per_output: &[f64]) -> (f64, f64) {
    let receiving = match pattern {
        HwPattern::AllToOne => &per_output[..1],
        HwPattern::Uniform => per_output,
    };
    let mean = receiving.iter().sum::<f64>() / receiving.len().max(1) as f64;
    let min = receiving.iter().copied().fold(f64::INFINITY, f64::min);
    (mean, min)
}

/// Runs the measurement; `observer` gets progress in cycles.
pub fn run_hw(cfg: &HwBench, observer: &mut dyn Observer) -> Result<Value, BenchError> {
    if cfg.size > MAX_HW_SIZE {
        return Err(BenchError::Config(format!(
            "--size {}: at most {MAX_HW_SIZE} bytes",
            cfg.size
        )));
    }
    if cfg.cycles < 100 {
        return Err(BenchError::Config("--cycles: at least 100".into()));
    }
    let mut dev = device(cfg.model)?;
    let n = dev.ports();
    let senders: Vec<usize> = match cfg.pattern {
        HwPattern::AllToOne => (1..n).collect(),
        HwPattern::Uniform => (0..n).collect(),
    };
    let mut rng = SplitMix64::new(cfg.seed);
    let payload = Bytes::from(vec![0u8; cfg.size]);
    let mut seq = vec![0u32; n];
    let mut sent = vec![0u64; n];
    // Each input's destinations in the order drawn, for the output-queued
    // reference.
    let mut drawn: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut top_up = |dev: &mut RtlDevice| -> Result<(), BenchError> {
        for &i in &senders {
            while dev.queued_beats(Stream::Port, i) < 64 {
                let to = destination(cfg.pattern, &mut rng, n);
                let mut m = Message::send(
                    uid(i as u16 + 1).port(1),
                    uid(to as u16 + 1).port(1),
                    payload.clone(),
                )
                .map_err(|e| BenchError::Config(format!("a {}-byte message: {e}", cfg.size)))?;
                m.set_seqnum(seq[i]);
                seq[i] = seq[i].wrapping_add(1);
                sent[i] += 1;
                drawn[i].push(to);
                dev.send(Stream::Port, i, &m);
            }
        }
        Ok(())
    };
    const STEP: u64 = 10;
    const WARMUP: u64 = 2_000;
    for _ in 0..WARMUP / STEP {
        top_up(&mut dev)?;
        dev.run(STEP);
    }
    let start: Vec<u64> = (0..n).map(|o| dev.beats_out(Stream::Port, o)).collect();
    let delivered_before = dev.delivered_total();
    let started = std::time::Instant::now();
    let steps = cfg.cycles.div_ceil(STEP);
    for k in 0..steps {
        top_up(&mut dev)?;
        dev.run(STEP);
        if k % 500 == 0 {
            observer.progress(&Progress {
                elapsed_s: started.elapsed().as_secs_f64(),
                planned_s: None,
                sent: k * STEP,
                planned_count: Some(steps * STEP),
                warming_up: false,
            });
        }
    }
    let window = steps * STEP;
    let per_output: Vec<f64> = (0..n)
        .map(|o| (dev.beats_out(Stream::Port, o) - start[o]) as f64 / window as f64)
        .collect();
    let (mean, min) = receiving(cfg.pattern, &per_output);
    // The same destinations through an ideal output-queued switch: each
    // input's draws as far as the RTL took them, then further draws from
    // the same generator, sent at the line rate from cycle 0.
    let beats = (32 + cfg.size).div_ceil(32) as u64;
    let need = (WARMUP + window).div_ceil(beats) as usize + 1;
    for &i in &senders {
        while drawn[i].len() < need {
            drawn[i].push(destination(cfg.pattern, &mut rng, n));
        }
    }
    let oq = output_queued(n, &drawn, beats, WARMUP, window);
    let (oq_mean, oq_min) = receiving(cfg.pattern, &oq);
    let (reference, reference_name) = match cfg.pattern {
        HwPattern::AllToOne => (1.0, "line rate: one beat per cycle".to_owned()),
        HwPattern::Uniform => (
            hol_bound(n).unwrap_or(0.5858),
            format!("a FIFO input-queued switch, N = {n}, uniform traffic (head-of-line blocking; Karol et al. 1987)"),
        ),
    };
    Ok(json!({
        "ports": n,
        "crossbar": match cfg.model.match_iterations() {
            None => json!({ "matching": "none", "read_ports_per_input": n }),
            Some(iterations) => json!({
                "matching": "islip",
                "iterations": iterations,
                "read_ports_per_input": cfg.model.read_ports(),
            }),
        },
        "cycles": window,
        "warmup_cycles": WARMUP,
        "beats_per_message": (32 + cfg.size).div_ceil(32),
        "beats_per_cycle": per_output,
        "beats_per_cycle_mean": mean,
        "beats_per_cycle_min": min,
        "messages_delivered": dev.delivered_total() - delivered_before,
        "messages_sent": sent.iter().sum::<u64>(),
        "reference": { "name": reference_name, "beats_per_cycle": reference },
        "ratio": mean / reference,
        "output_queued": {
            "name": "an output-queued switch with unbounded buffers, fed the same destinations at the line rate",
            "beats_per_cycle": oq,
            "beats_per_cycle_mean": oq_mean,
            "beats_per_cycle_min": oq_min,
        },
        "simulated_cycles_per_sec": window as f64 / started.elapsed().as_secs_f64().max(1e-9),
    }))
}

/// Beats per cycle of each of `n` outputs of an output-queued switch with
/// unbounded buffers, counted over the `window` cycles after `warmup`:
/// input i sends the messages `dests[i]` (their outputs), each `beats`
/// long, back to back from cycle 0 at one beat per cycle (an input whose
/// list runs out goes idle), and each output sends one queued beat per
/// cycle. No crossbar can keep an output busier in the long run on the
/// same traffic; over one window it is the yardstick for how much of an
/// output's idling the traffic itself causes.
pub fn output_queued(
    n: usize,
    dests: &[Vec<usize>],
    beats: u64,
    warmup: u64,
    window: u64,
) -> Vec<f64> {
    let beats = beats.max(1);
    let mut queued = vec![0u64; n];
    let mut served = vec![0u64; n];
    for t in 0..warmup + window {
        let k = (t / beats) as usize;
        for d in dests {
            if let Some(&o) = d.get(k) {
                if o < n {
                    queued[o] += 1;
                }
            }
        }
        for o in 0..n {
            if queued[o] > 0 {
                queued[o] -= 1;
                if t >= warmup {
                    served[o] += 1;
                }
            }
        }
    }
    served
        .iter()
        .map(|&b| b as f64 / window.max(1) as f64)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_output_queued_switch_serves_what_its_outputs_are_sent() {
        // Three inputs all to output 0: it is busy every cycle, the others idle.
        let all_to_0 = vec![vec![0; 100]; 3];
        assert_eq!(
            output_queued(4, &all_to_0, 2, 10, 100),
            vec![1.0, 0.0, 0.0, 0.0]
        );
        // One input alternating two outputs with 2-beat messages: each
        // output gets 2 beats every 4 cycles.
        let alternating = vec![(0..100).map(|k| k % 2).collect::<Vec<_>>()];
        assert_eq!(output_queued(2, &alternating, 2, 8, 100), vec![0.5, 0.5]);
        // An input that runs out of messages stops: 10 messages of 3 beats
        // into a 100-cycle window after no warm-up is 30 beats.
        let short = vec![vec![1; 10]];
        assert_eq!(output_queued(2, &short, 3, 0, 100), vec![0.0, 0.3]);
        // Two inputs to one output overload it: it stays busy, and the
        // backlog is served after the inputs stop.
        let two = vec![vec![0; 5], vec![0; 5]];
        assert_eq!(output_queued(1, &two, 4, 0, 40), vec![1.0]);
    }

    #[test]
    fn the_hol_bound_falls_with_ports() {
        assert_eq!(hol_bound(1), Some(1.0));
        assert_eq!(hol_bound(4), Some(0.6553));
        assert!(hol_bound(8).unwrap() < hol_bound(4).unwrap());
        assert_eq!(hol_bound(9), None);
        assert_eq!(hol_bound(0), None);
    }
}
