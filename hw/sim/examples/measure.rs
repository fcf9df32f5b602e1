//! Measures the RTL in co-simulation: zero-load latency, and how closely
//! weighted and strict-priority outputs share bytes. Prints one table per
//! figure. Saturation throughput (all-to-one and uniform, beats per cycle
//! per output, beside the line rate and the head-of-line bound) is
//! `uniplane-bench hw`, in a build with `--features rtl`.
//!
//! ```sh
//! cargo run --release -p uniplane-hw-sim --example measure
//! ```
//!
//! Cycles are clock cycles of `uniplane_top`; a beat is 32 bytes, so one
//! beat per cycle at 250 MHz is 64 Gbit/s per port.

use bytes::Bytes;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::{Message, Uid};
use uniplane_hw_sim::{Model, RtlDevice, Stream, Traffic};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{ForwardingPlane, PortId};

fn uid(d: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), d)
}

/// A device whose port p owns UID p+1, every port admitting everything.
fn device(model: Model) -> RtlDevice {
    let mut dev = RtlDevice::new(model);
    let n = dev.ports() as PortId;
    for p in 0..n {
        dev.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
        for d in 0..n {
            dev.add_route(p, Route::exact(uid(d + 1), d)).unwrap();
        }
    }
    dev
}

fn msg(from: usize, to: usize, payload: usize, seq: u32) -> Message {
    let mut m = Message::send(
        uid(from as u16 + 1).port(1),
        uid(to as u16 + 1).port(1),
        Bytes::from(vec![0u8; payload]),
    )
    .unwrap();
    m.set_seqnum(seq);
    m
}

fn beats(payload: usize) -> usize {
    (32 + payload).div_ceil(32)
}

fn latency(model: Model) {
    for payload in [0usize, 64, 1024] {
        let mut dev = device(model);
        dev.run(20);
        dev.send(Stream::Port, 0, &msg(0, 1, payload, 0));
        dev.run_until(1000, |d| !d.delivered(Stream::Port, 1).is_empty());
        let a = dev.accepted(Stream::Port, 0)[0].first_cycle;
        let d = &dev.delivered(Stream::Port, 1)[0];
        println!(
            "| {:?} | {:>5} B ({:>2} beats) | {:>3} | {:>3} |",
            model,
            payload,
            beats(payload),
            d.first_cycle - a,
            d.last_cycle - a
        );
    }
}

/// Keeps every input in `senders` backlogged with messages to `dest(i, k)`
/// and returns the beats each output moved per cycle over `window` cycles.
fn saturate(
    dev: &mut RtlDevice,
    senders: &[usize],
    payload: impl Fn(usize) -> usize,
    mut dest: impl FnMut(usize, u32) -> usize,
    window: u64,
) -> Vec<f64> {
    let n = dev.ports();
    let mut seq = vec![0u32; n];
    let mut top_up = |dev: &mut RtlDevice| {
        for &i in senders {
            while dev.queued_beats(Stream::Port, i) < 64 {
                let m = msg(i, dest(i, seq[i]), payload(i), seq[i]);
                seq[i] += 1;
                dev.send(Stream::Port, i, &m);
            }
        }
    };
    for _ in 0..200 {
        top_up(dev);
        dev.run(10);
    }
    let start: Vec<u64> = (0..n).map(|o| dev.beats_out(Stream::Port, o)).collect();
    for _ in 0..window / 10 {
        top_up(dev);
        dev.run(10);
    }
    (0..n)
        .map(|o| (dev.beats_out(Stream::Port, o) - start[o]) as f64 / window as f64)
        .collect()
}

fn shares(model: Model, policy: Policy, sizes: &[usize], want: &[f64], label: &str) {
    let mut dev = device(model);
    let n = dev.ports();
    dev.set_policy(0, policy).unwrap();
    let senders: Vec<usize> = (0..sizes.len()).collect();
    dev.set_traffic(Traffic::default());
    saturate(&mut dev, &senders, |i| sizes[i], |_, _| 0, 40_000);
    let mut bytes = vec![0u64; n];
    for d in dev.delivered(Stream::Port, 0).iter().skip(200) {
        let src = d.message.header().src.device() as usize - 1;
        bytes[src] += d.message.encoded_len() as u64;
    }
    let total: u64 = bytes.iter().sum();
    let got: Vec<f64> = senders
        .iter()
        .map(|&i| bytes[i] as f64 / total as f64)
        .collect();
    let err = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs())
        .fold(0.0, f64::max);
    println!(
        "| {label} | {:?} | {} | {} | {:.4} |",
        sizes,
        want.iter()
            .map(|w| format!("{w:.3}"))
            .collect::<Vec<_>>()
            .join(" "),
        got.iter()
            .map(|g| format!("{g:.3}"))
            .collect::<Vec<_>>()
            .join(" "),
        err
    );
}

fn main() {
    println!("## Zero-load latency (port 0 -> port 1), cycles from the first input beat\n");
    println!("| model | message | first beat out | last beat out |");
    println!("|---|---|---|---|");
    latency(Model::N4);
    latency(Model::N8);
    latency(Model::N4Islip);

    println!("\n## Byte shares of output 0, every input backlogged (40 000 cycles)\n");
    println!("| policy | payload per input | ideal | measured | max error |");
    println!("|---|---|---|---|---|");
    shares(
        Model::N4,
        Policy::Weighted(vec![1, 2, 3, 4]),
        &[64, 64, 64, 64],
        &[0.1, 0.2, 0.3, 0.4],
        "DRR 1:2:3:4",
    );
    shares(
        Model::N4,
        Policy::Weighted(vec![1, 1, 2, 4]),
        &[64, 1500, 512, 200],
        &[0.125, 0.125, 0.25, 0.5],
        "DRR 1:1:2:4, mixed sizes",
    );
    shares(
        Model::N4,
        Policy::RoundRobin,
        &[64, 1500, 64, 1500],
        &[
            96.0 / 3256.0,
            1532.0 / 3256.0,
            96.0 / 3256.0,
            1532.0 / 3256.0,
        ],
        "RR (fair by message)",
    );
    shares(
        Model::N4,
        Policy::StrictPriority {
            class: vec![1, 0, 0, 1],
            weights: vec![1, 3, 1, 1],
        },
        &[200, 200, 200, 200],
        &[0.0, 0.75, 0.25, 0.0],
        "strict: class 0 {1:w3, 2:w1} over class 1",
    );
    // The iSLIP crossbar: each output's grant is its own scheduler's.
    shares(
        Model::N4Islip,
        Policy::Weighted(vec![1, 1, 2, 4]),
        &[64, 1500, 512, 200],
        &[0.125, 0.125, 0.25, 0.5],
        "N4Islip: DRR 1:1:2:4, mixed sizes",
    );
    shares(
        Model::N4Islip,
        Policy::StrictPriority {
            class: vec![1, 0, 0, 1],
            weights: vec![1, 3, 1, 1],
        },
        &[200, 200, 200, 200],
        &[0.0, 0.75, 0.25, 0.0],
        "N4Islip: strict: class 0 {1:w3, 2:w1} over class 1",
    );
}
