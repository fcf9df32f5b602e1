//! The JSON every benchmark prints with `--json`, as one document on the
//! last line of stdout:
//!
//! ```text
//! {"bench": NAME, "params": {...}, "machine": {...}, "results": {...}}
//! ```
//!
//! The field names of this module are the schema: scripts read them, so
//! they stay stable. New fields may be added; none is renamed or removed.

use serde::Serialize;
use uniplane_stacks::ltl::LtlStats;

use crate::engine::Sample;
use crate::gen::GenRun;
use crate::hist::{Percentiles, Summary};

/// The machine a run happened on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Machine {
    /// CPU model name.
    pub cpu_model: String,
    /// Logical cores this process may use.
    pub cores: usize,
    /// Kernel release.
    pub kernel: String,
    /// Host name.
    pub hostname: String,
    /// Operating system and architecture.
    pub os: String,
    /// The compiler that built this binary.
    pub rustc: String,
    /// uniplane's version.
    pub uniplane: String,
    /// `release` or `debug`: figures from a debug build are not figures.
    pub build: String,
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned())
}

static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

/// The cores this process may use, as first counted: call it before any
/// thread pins itself (the binary does, first thing). Counted later, on a
/// thread pinned to one CPU, `available_parallelism` says 1 (it counts the
/// caller's affinity), and a benchmark that had pinned its pinger reported
/// a one-core machine.
pub fn cores() -> usize {
    *CORES.get_or_init(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    })
}

/// Describes this machine (Linux `/proc` where it exists, `unknown`
/// elsewhere).
pub fn machine() -> Machine {
    let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    Machine {
        cpu_model,
        cores: cores(),
        kernel: read_trimmed("/proc/sys/kernel/osrelease"),
        hostname: read_trimmed("/proc/sys/kernel/hostname"),
        os: format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH),
        rustc: env!("UNIPLANE_BENCH_RUSTC").to_owned(),
        uniplane: env!("CARGO_PKG_VERSION").to_owned(),
        build: if cfg!(debug_assertions) {
            "debug"
        } else {
            "release"
        }
        .to_owned(),
    }
}

/// One benchmark's report.
#[derive(Clone, Debug, Serialize)]
pub struct Report<P, R> {
    /// The benchmark's name (`gen`, `rtt`, `peer`, …).
    pub bench: String,
    /// What was asked for.
    pub params: P,
    /// Where it ran.
    pub machine: Machine,
    /// What was measured.
    pub results: R,
}

impl<P: Serialize, R: Serialize> Report<P, R> {
    /// A report of `bench` on this machine.
    pub fn new(bench: &str, params: P, results: R) -> Self {
        Report {
            bench: bench.to_owned(),
            params,
            machine: machine(),
            results,
        }
    }

    /// The report as one line of JSON.
    pub fn to_json_line(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }
}

/// Mean ± standard deviation over the per-second samples, and the samples.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PerSecond {
    /// Received messages (or round trips) per second.
    pub pps: Summary,
    /// Received Mbit/s at L2.
    pub mbps_l2: Summary,
    /// Received Mbit/s at L1.
    pub mbps_l1: Summary,
    /// Mean latency per interval, ns.
    pub latency_ns: Summary,
    /// The samples themselves.
    pub samples: Vec<Sample>,
}

impl PerSecond {
    /// The summary of `samples`.
    pub fn of(samples: &[Sample]) -> Self {
        PerSecond {
            pps: Summary::of(samples.iter().map(|s| s.rx_pps)),
            mbps_l2: Summary::of(samples.iter().map(|s| s.mbps_l2)),
            mbps_l1: Summary::of(samples.iter().map(|s| s.mbps_l1)),
            latency_ns: Summary::of(samples.iter().map(|s| s.mean_latency_ns)),
            samples: samples.to_vec(),
        }
    }
}

/// `gen`'s parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenParams {
    /// Stack name.
    pub stack: String,
    /// Where the receiver listened.
    pub listen: String,
    /// Where the sender connected.
    pub connect: String,
    /// `fixed`, `sweep` or `imix`.
    pub size_mode: String,
    /// Payload sizes (one per sweep point; the cycle for IMIX).
    pub sizes: Vec<usize>,
    /// What a size counts.
    pub size_counts: &'static str,
    /// Rate as given (`max`, `1000000pps`, `10000000000bps`).
    pub rate: String,
    /// Pacing pattern.
    pub pattern: String,
    /// Flows.
    pub flows: u32,
    /// Measured seconds per run, when timed.
    pub seconds: Option<f64>,
    /// Measured messages per run, when counted.
    pub count: Option<u64>,
    /// Warm-up seconds per run, excluded.
    pub warmup_s: f64,
    /// Messages per send/receive call.
    pub batch: usize,
    /// Seed of Poisson gaps.
    pub seed: u64,
    /// Whether the receiver busy-polls.
    pub busy_poll: bool,
    /// How the sides run.
    pub threads: &'static str,
    /// Where the receiver ran: `split` (its own thread) or `shared` (the
    /// sender's).
    pub threading: &'static str,
    /// What `--threads` asked: `auto`, `split` or `shared`.
    pub threading_asked: &'static str,
    /// Bytes added per message for L1 figures.
    pub l1_overhead_bytes: u64,
    /// `--loss`: percent of the datagrams each LTL endpoint received that
    /// it dropped in the lossy phase (absent without `--loss`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
}

/// What a payload size counts, as reports state it.
pub const SIZE_COUNTS: &str =
    "overlay payload bytes; L2 adds the 32-byte overlay header; L1 adds 38 bytes of Ethernet framing";

/// One point of a size sweep.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SweepPoint {
    /// Payload size, or `imix`.
    pub size: String,
    /// Received messages per second.
    pub pps: f64,
    /// Sent messages per second.
    pub tx_pps: f64,
    /// Received Mbit/s at L2.
    pub mbps_l2: f64,
    /// Received Mbit/s at L1.
    pub mbps_l1: f64,
    /// Sent but not received.
    pub lost: u64,
    /// One-way latency.
    pub latency_ns: Percentiles,
}

/// `gen`'s results. For a sweep, the top-level figures are over the whole
/// sweep (all messages over all measured time, one merged histogram) and
/// `sweep` holds each size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GenResults {
    /// Received messages per second.
    pub pps: f64,
    /// Sent messages per second.
    pub tx_pps: f64,
    /// Received Mbit/s of encoded messages (L2).
    pub mbps_l2: f64,
    /// Received Mbit/s with Ethernet framing (L1).
    pub mbps_l1: f64,
    /// Sent Mbit/s at L2.
    pub tx_mbps_l2: f64,
    /// Messages sent (measured).
    pub sent: u64,
    /// Messages received (measured).
    pub received: u64,
    /// Sent but never received.
    pub lost: u64,
    /// Received out of order.
    pub reordered: u64,
    /// Payloads without a valid stamp.
    pub bad_stamps: u64,
    /// Link errors.
    pub errors: u64,
    /// Measured seconds at the receiver.
    pub seconds: f64,
    /// One-way latency, sender stamp to receiver.
    pub latency_ns: Percentiles,
    /// Per-second figures.
    pub per_second: PerSecond,
    /// Each size of a sweep.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sweep: Option<Vec<SweepPoint>>,
    /// `--loss`: overlay payload Gbit/s received in the lossy phase, which
    /// the other figures describe.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput_gbps: Option<f64>,
    /// `--loss`: overlay payload Gbit/s received in the lossless phase of
    /// the same invocation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lossless_goodput_gbps: Option<f64>,
    /// `--loss`: received messages per second in the lossless phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lossless_pps: Option<f64>,
    /// `--loss`: `goodput_gbps` ÷ `lossless_goodput_gbps` (absent if the
    /// lossless phase received nothing).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub goodput_vs_lossless: Option<f64>,
    /// `--loss`: the sending LTL endpoint's counters in each phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ltl_sender: Option<LtlSenderPhases>,
}

/// Counters of the sending LTL endpoint over one phase of `gen --loss`:
/// what the goodput paid for repairs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LtlSenderCounters {
    /// Frames sent: data, retransmissions and control.
    pub tx_frames: u64,
    /// Frames received: acknowledgements and NACKs.
    pub rx_frames: u64,
    /// Frames sent again, for any reason (the sum of the next three).
    pub retransmits: u64,
    /// Sent again because an ACK or NACK showed a gap.
    pub fast_retransmits: u64,
    /// Sent again as tail-loss probes.
    pub probe_retransmits: u64,
    /// Sent again after a retransmission timeout.
    pub timeout_retransmits: u64,
    /// Retransmission timer expiries.
    pub timeouts: u64,
    /// Microseconds the connection had data queued but no credit or
    /// window to send it (waiting for repairs and acknowledgements).
    pub blocked_micros: u64,
}

impl std::ops::AddAssign for LtlSenderCounters {
    fn add_assign(&mut self, o: Self) {
        self.tx_frames += o.tx_frames;
        self.rx_frames += o.rx_frames;
        self.retransmits += o.retransmits;
        self.fast_retransmits += o.fast_retransmits;
        self.probe_retransmits += o.probe_retransmits;
        self.timeout_retransmits += o.timeout_retransmits;
        self.timeouts += o.timeouts;
        self.blocked_micros += o.blocked_micros;
    }
}

impl From<LtlStats> for LtlSenderCounters {
    fn from(s: LtlStats) -> Self {
        LtlSenderCounters {
            tx_frames: s.tx_frames,
            rx_frames: s.rx_frames,
            retransmits: s.fast_retransmits + s.probe_retransmits + s.timeout_retransmits,
            fast_retransmits: s.fast_retransmits,
            probe_retransmits: s.probe_retransmits,
            timeout_retransmits: s.timeout_retransmits,
            timeouts: s.timeouts,
            blocked_micros: s.blocked_micros,
        }
    }
}

/// The sending LTL endpoint's counters in both phases of `gen --loss`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct LtlSenderPhases {
    /// Without loss.
    pub lossless: LtlSenderCounters,
    /// With loss.
    pub lossy: LtlSenderCounters,
}

impl GenResults {
    /// Results of runs labelled by size; more than one run is a sweep.
    pub fn from_runs(runs: &[(String, GenRun)]) -> Self {
        let mut total = GenRun::default();
        for (_, r) in runs {
            total.absorb(r);
        }
        let (latency, samples) = (&total.latency, &total.samples);
        let sweep = (runs.len() > 1).then(|| {
            runs.iter()
                .map(|(label, r)| SweepPoint {
                    size: label.clone(),
                    pps: r.pps(),
                    tx_pps: r.tx_pps(),
                    mbps_l2: r.mbps_l2(),
                    mbps_l1: r.mbps_l1(),
                    lost: r.lost,
                    latency_ns: r.latency.percentiles(),
                })
                .collect()
        });
        GenResults {
            pps: total.pps(),
            tx_pps: total.tx_pps(),
            mbps_l2: total.mbps_l2(),
            mbps_l1: total.mbps_l1(),
            tx_mbps_l2: total.tx_mbps_l2(),
            sent: total.sent,
            received: total.received,
            lost: total.lost,
            reordered: total.reordered,
            bad_stamps: total.bad_stamps,
            errors: total.errors,
            seconds: total.rx_seconds,
            latency_ns: latency.percentiles(),
            per_second: PerSecond::of(samples),
            sweep,
            goodput_gbps: None,
            lossless_goodput_gbps: None,
            lossless_pps: None,
            goodput_vs_lossless: None,
            ltl_sender: None,
        }
    }

    /// Results of `gen --loss`: the figures of the `lossy` run, with its
    /// goodput beside that of the `lossless` run of the same invocation.
    pub fn of_loss_comparison(
        lossless: &GenRun,
        lossy: &(String, GenRun),
        ltl_sender: Option<LtlSenderPhases>,
    ) -> Self {
        let (with, without) = (lossy.1.goodput_gbps(), lossless.goodput_gbps());
        GenResults {
            goodput_gbps: Some(with),
            lossless_goodput_gbps: Some(without),
            lossless_pps: Some(lossless.pps()),
            goodput_vs_lossless: (without > 0.0).then(|| with / without),
            ltl_sender,
            ..GenResults::from_runs(std::slice::from_ref(lossy))
        }
    }
}

/// `rtt`'s parameters.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RttParams {
    /// Stack name.
    pub stack: String,
    /// Where the echo side listened.
    pub listen: String,
    /// Where the client connected.
    pub connect: String,
    /// Payload bytes.
    pub size: usize,
    /// Messages in flight at once.
    pub inflight: usize,
    /// Measured seconds, when timed.
    pub seconds: Option<f64>,
    /// Measured round trips, when counted.
    pub count: Option<u64>,
    /// Warm-up seconds, excluded.
    pub warmup_s: f64,
    /// Whether both sides busy-poll.
    pub busy_poll: bool,
    /// How the sides run.
    pub threads: &'static str,
}

/// `rtt`'s results.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RttResults {
    /// Round-trip time, client send to client receive.
    pub rtt_ns: Percentiles,
    /// Round trips completed per second.
    pub round_trips_per_s: f64,
    /// Requests sent (measured).
    pub sent: u64,
    /// Answers received (measured).
    pub received: u64,
    /// Requests never answered.
    pub lost: u64,
    /// Bad stamps and link errors.
    pub errors: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Per-second figures.
    pub per_second: PerSecond,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machine_is_described_without_failing() {
        let m = machine();
        assert!(m.cores >= 1);
        assert!(!m.rustc.is_empty());
        assert_eq!(m.uniplane, env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn a_report_is_one_line_with_the_four_keys() {
        let r = Report::new(
            "x",
            serde_json::json!({"a": 1}),
            serde_json::json!({"b": 2}),
        );
        let line = r.to_json_line().unwrap();
        assert!(!line.contains('\n'));
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        for k in ["bench", "params", "machine", "results"] {
            assert!(v.get(k).is_some(), "{k}");
        }
    }

    #[test]
    fn a_sweep_has_one_point_per_size_and_totals_on_top() {
        let run = |n: u64| GenRun {
            sent: n,
            received: n,
            rx_bytes: n * 96,
            tx_bytes: n * 96,
            rx_seconds: 1.0,
            tx_seconds: 1.0,
            ..GenRun::default()
        };
        let r = GenResults::from_runs(&[("64".into(), run(100)), ("128".into(), run(300))]);
        let sweep = r.sweep.as_ref().unwrap();
        assert_eq!(sweep.len(), 2);
        assert_eq!(sweep[1].pps, 300.0);
        assert_eq!(r.received, 400);
        assert_eq!(r.pps, 200.0);
        assert!(GenResults::from_runs(&[("64".into(), run(1))])
            .sweep
            .is_none());
    }

    fn payload_run(received: u64, payload: u64) -> GenRun {
        GenRun {
            sent: received,
            received,
            rx_bytes: received * (32 + payload),
            tx_bytes: received * (32 + payload),
            rx_seconds: 1.0,
            tx_seconds: 1.0,
            ..GenRun::default()
        }
    }

    #[test]
    fn goodput_counts_payload_bytes_only() {
        // 1000 messages of 1000 payload bytes in one second: 8 Mbit/s.
        assert_eq!(payload_run(1000, 1000).goodput_gbps(), 0.008);
    }

    #[test]
    fn a_loss_comparison_divides_lossy_by_lossless_goodput() {
        let r = GenResults::of_loss_comparison(
            &payload_run(1000, 1000),
            &("1000".into(), payload_run(900, 1000)),
            None,
        );
        assert_eq!(r.received, 900);
        assert!((r.goodput_vs_lossless.unwrap() - 0.9).abs() < 1e-12);
        assert_eq!(r.lossless_pps, Some(1000.0));
        let v = serde_json::to_value(&r).unwrap();
        assert!(v["goodput_vs_lossless"].is_number());
        assert!(v.get("ltl_sender").is_none());
        let nothing = GenResults::of_loss_comparison(
            &payload_run(0, 1000),
            &("1000".into(), payload_run(900, 1000)),
            None,
        );
        assert_eq!(nothing.goodput_vs_lossless, None);
    }

    #[test]
    fn runs_without_loss_report_none_of_its_keys() {
        let v = serde_json::to_value(GenResults::from_runs(&[("64".into(), payload_run(1, 64))]))
            .unwrap();
        for k in [
            "goodput_gbps",
            "lossless_goodput_gbps",
            "lossless_pps",
            "goodput_vs_lossless",
            "ltl_sender",
        ] {
            assert!(v.get(k).is_none(), "{k}");
        }
    }
}
