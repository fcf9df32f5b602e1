//! `uniplane-bench suite`: the headline rows of the performance issue in
//! one go, each through the subcommand that measures it (run as a child of
//! this same binary with `--json`, so every row is exactly what its
//! command prints), with our figure, the peer's (or the target's where a
//! row has no peer), the ratio and whether the target is met; one JSON
//! document and one SVG summary.
//!
//! A row that cannot run here (a tool that is not installed, a feature
//! this build lacks, too few cores) is reported as `skipped` with the
//! reason; a row whose command fails is `failed` with the end of its
//! error. Either way every row is in the report.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::Value;

use crate::peer::{find_tool, ProcessGroup};
use crate::BenchError;

/// How a row's target reads.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum On {
    /// The target bounds our figure.
    Ours,
    /// The target bounds ours ÷ peer.
    Ratio,
}

/// A target: `on` must be at least (`higher_is_better`) or at most `value`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Target {
    /// What the target bounds.
    pub on: On,
    /// The bound.
    pub value: f64,
    /// At least (true) or at most (false).
    pub at_least: bool,
}

/// What a row needs to run here.
#[derive(Clone, Copy, Debug)]
pub enum Need {
    /// A tool on `PATH` (and its Debian package).
    Tool(&'static str, &'static str),
    /// A feature of this build, and whether it is on.
    Feature(&'static str, bool),
    /// At least this many cores.
    Cores(usize),
    /// Root (namespaces, raw sockets).
    Root,
}

/// One headline row.
#[derive(Clone, Debug)]
pub struct Row {
    /// Short stable name (`udp-rtt`).
    pub id: &'static str,
    /// What it measures, in words.
    pub what: &'static str,
    /// The subcommand and its arguments (`{S}`: the seconds per
    /// measurement, `{N}`: a count scaled like them).
    pub args: &'static str,
    /// What it needs.
    pub needs: &'static [Need],
    /// JSON pointer of our figure in the command's report.
    pub ours: &'static str,
    /// JSON pointer of the peer's figure, and what the peer is.
    pub peer: Option<(&'static str, &'static str)>,
    /// The peer's own command of this binary (`{S}` as in `args`), where
    /// the peer is a second process rather than a figure of ours: its
    /// figure is [`PEER_PROCESS_CPU`], measured as ours is.
    pub peer_args: Option<&'static str>,
    /// Multiplier from the report's unit to `unit`.
    pub scale: f64,
    /// The unit of the figures.
    pub unit: &'static str,
    /// Whether a larger figure is better.
    pub higher_is_better: bool,
    /// The target of the table.
    pub target: Option<Target>,
}

const fn at_least(on: On, value: f64) -> Option<Target> {
    Some(Target {
        on,
        value,
        at_least: true,
    })
}

const fn at_most(on: On, value: f64) -> Option<Target> {
    Some(Target {
        on,
        value,
        at_least: false,
    })
}

/// Our figure from the process's own CPU time (`ours` pointer).
pub const PROCESS_CPU: &str = "@process_cpu_percent";
/// The peer's figure from its process's CPU time (`peer` pointer; the
/// row's `peer_args` is the peer's command).
pub const PEER_PROCESS_CPU: &str = "@peer_process_cpu_percent";

/// A row of the RTL crossbar under uniform 1500-byte traffic: its lowest
/// output beside an output-queued switch's on the same destinations.
fn rtl_uniform(id: &'static str, what: &'static str, args: &'static str) -> Row {
    Row {
        id,
        what,
        args,
        needs: &[Need::Feature("rtl", cfg!(feature = "rtl"))],
        ours: "/results/beats_per_cycle_min",
        peer: Some((
            "/results/output_queued/beats_per_cycle_min",
            "an output-queued switch, unbounded buffers, same destinations",
        )),
        peer_args: None,
        scale: 1.0,
        unit: "beats/cycle",
        higher_is_better: true,
        target: at_least(On::Ours, 0.95),
    }
}

/// The rows, in the order of the table.
pub fn rows() -> Vec<Row> {
    vec![
        Row {
            id: "fabric-cpu",
            what: "fabric 4 ports all-to-one 64 B, the engine's CPU time",
            args: "fabric --ports 4 --pattern all-to-one --size 64 --seconds {S}",
            needs: &[],
            ours: "/results/msgs_per_sec",
            peer: Some(("/results/reference_msgs_per_sec", "a bare SPSC ring, same messages")),
            peer_args: None,
            scale: 1e-6,
            unit: "M msg/s",
            higher_is_better: true,
            target: at_least(On::Ours, 20.0),
        },
        Row {
            id: "fabric-wall",
            what: "the same by wall clock, sharded engine (2 shards, replay source)",
            args: "fabric --ports 4 --pattern all-to-one --size 64 --seconds {S} --shards 2 --source replay",
            needs: &[Need::Cores(2)],
            ours: "/results/msgs_per_sec",
            peer: None,
            peer_args: None,
            scale: 1e-6,
            unit: "M msg/s",
            higher_is_better: true,
            target: at_least(On::Ours, 20.0),
        },
        Row {
            id: "fabric-8-ports-16-cores",
            what: "fabric 8 ports all-to-one 64 B on 8 shards, wall clock",
            args: "fabric --ports 8 --pattern all-to-one --size 64 --seconds {S} --shards 8 --source replay",
            needs: &[Need::Cores(16)],
            ours: "/results/msgs_per_sec",
            peer: None,
            peer_args: None,
            scale: 1e-6,
            unit: "M msg/s",
            higher_is_better: true,
            target: None,
        },
        Row {
            id: "overhead-p50",
            what: "latency the overlay adds, 64 B, p50",
            args: "overhead --size 64 --count {N}",
            needs: &[],
            ours: "/results/added_ns/p50",
            peer: None,
            peer_args: None,
            scale: 1.0,
            unit: "ns",
            higher_is_better: false,
            target: at_most(On::Ours, 200.0),
        },
        Row {
            id: "overhead-p99",
            what: "latency the overlay adds, 64 B, p99",
            args: "overhead --size 64 --count {N}",
            needs: &[],
            ours: "/results/added_ns/p99",
            peer: None,
            peer_args: None,
            scale: 1.0,
            unit: "ns",
            higher_is_better: false,
            target: at_most(On::Ours, 1000.0),
        },
        Row {
            id: "udp-rtt",
            what: "UDP round trip 64 B vs sockperf, parked",
            args: "peer --tool sockperf --stack udp-unpacked --size 64 --seconds {S} --rounds 1",
            needs: &[Need::Tool("sockperf", "sockperf")],
            ours: "/results/ours",
            peer: Some(("/results/peer", "sockperf ping-pong")),
            peer_args: None,
            scale: 1e-3,
            unit: "µs",
            higher_is_better: false,
            target: at_most(On::Ratio, 1.1),
        },
        Row {
            id: "udp-rtt-busy",
            what: "UDP round trip 64 B vs sockperf, busy-polling",
            args: "peer --tool sockperf --stack udp-unpacked --size 64 --seconds {S} --rounds 1 --busy-poll",
            needs: &[Need::Tool("sockperf", "sockperf")],
            ours: "/results/ours",
            peer: Some(("/results/peer", "sockperf ping-pong --nonblocked")),
            peer_args: None,
            scale: 1e-3,
            unit: "µs",
            higher_is_better: false,
            target: at_most(On::Ratio, 1.1),
        },
        Row {
            id: "tcp",
            what: "TCP 65000 B writes vs iperf3",
            args: "peer --tool iperf3-tcp --stack tcp --size 65000 --seconds {S} --rounds 1",
            needs: &[Need::Tool("iperf3", "iperf3")],
            ours: "/results/ours",
            peer: Some(("/results/peer", "iperf3 TCP")),
            peer_args: None,
            scale: 1.0,
            unit: "Gbit/s",
            higher_is_better: true,
            target: at_least(On::Ratio, 0.9),
        },
        Row {
            id: "pio-rtt",
            what: "PIO mailbox round trip 64 B, busy-polling",
            args: "rtt --stack shm --path pio --busy-poll --size 64 --seconds {S} --warmup 0.2",
            needs: &[],
            ours: "/results/rtt_ns/p50",
            peer: Some(("/results/peer/rtt_ns/p50", "Unix-socket ping-pong")),
            peer_args: None,
            scale: 1e-3,
            unit: "µs",
            higher_is_better: false,
            target: at_most(On::Ours, 0.5),
        },
        Row {
            id: "dpdk-tx",
            what: "DPDK TX 64 B frames on net_null vs dpdk-testpmd txonly",
            args: "peer --tool testpmd --stack dpdk --size 64 --seconds {S} --rounds 1",
            needs: &[
                Need::Feature("dpdk", cfg!(feature = "dpdk")),
                Need::Tool("dpdk-testpmd", "dpdk-dev"),
                Need::Root,
            ],
            ours: "/results/ours",
            peer: Some(("/results/peer", "dpdk-testpmd txonly")),
            peer_args: None,
            scale: 1e-6,
            unit: "Mpps",
            higher_is_better: true,
            target: at_least(On::Ratio, 1.0),
        },
        Row {
            id: "ether-tx",
            what: "raw Ethernet TX, 60 B frames (64 on the wire), on a veth vs trafgen",
            args: "peer --tool trafgen --stack ether --size 60 --seconds {S} --rounds 1",
            needs: &[Need::Tool("trafgen", "netsniff-ng"), Need::Root],
            ours: "/results/ours",
            peer: Some(("/results/peer", "trafgen")),
            peer_args: None,
            scale: 1e-6,
            unit: "Mpps",
            higher_is_better: true,
            target: at_least(On::Ratio, 1.0),
        },
        rtl_uniform(
            "rtl-uniform",
            "RTL crossbar, uniform traffic, 1500 B, lowest output",
            "hw --pattern uniform --size 1500 --ports 4 --cycles 20000",
        ),
        rtl_uniform(
            "rtl-uniform-islip",
            "RTL crossbar with iSLIP matching (two read ports per input), uniform traffic, 1500 B, lowest output",
            "hw --pattern uniform --size 1500 --ports 4 --cycles 20000 --crossbar islip",
        ),
        Row {
            id: "gen-2kpps",
            what: "gen --rate 2kpps over mem: CPU of the whole process (sender and receiver)",
            args: "gen --stack mem --rate 2kpps --seconds {S} --warmup 0",
            needs: &[],
            ours: PROCESS_CPU,
            peer: Some((
                PEER_PROCESS_CPU,
                "`wake --rate 2kpps`: a process that only wakes at the same rate",
            )),
            peer_args: Some("wake --rate 2kpps --seconds {S}"),
            scale: 1.0,
            unit: "% of a core",
            higher_is_better: false,
            target: at_most(On::Ours, 5.0),
        },
    ]
}

/// How a suite runs.
#[derive(Clone, Debug)]
pub struct SuiteConfig {
    /// Seconds per measurement (whole: the peer tools take no fractions).
    pub seconds: u64,
    /// Only these rows (all when empty).
    pub only: Vec<String>,
    /// The binary to run (this one).
    pub exe: PathBuf,
}

/// One row's outcome.
#[derive(Clone, Debug, Serialize)]
pub struct RowResult {
    /// The row's name.
    pub id: &'static str,
    /// What it measures.
    pub what: &'static str,
    /// The command that produced it.
    pub command: String,
    /// `ok`, `skipped` or `failed`.
    pub status: &'static str,
    /// Why it was skipped or failed.
    pub reason: Option<String>,
    /// Our figure in `unit`.
    pub ours: Option<f64>,
    /// The peer's figure in `unit`.
    pub peer: Option<f64>,
    /// What the peer is.
    pub peer_name: Option<&'static str>,
    /// ours ÷ peer (or ÷ the target without a peer).
    pub ratio: Option<f64>,
    /// What the ratio divides by: `peer` or `target`.
    pub ratio_of: Option<&'static str>,
    /// The unit of `ours` and `peer`.
    pub unit: &'static str,
    /// Whether a larger figure is better.
    pub higher_is_better: bool,
    /// The target.
    pub target: Option<Target>,
    /// Whether it is met.
    pub target_met: Option<bool>,
    /// Seconds the command took.
    pub seconds: f64,
}

impl RowResult {
    /// `row` with no figures: `status` (skipped or failed) and why.
    fn without_figures(row: &Row, command: String, status: &'static str, why: String) -> RowResult {
        RowResult {
            id: row.id,
            what: row.what,
            command,
            status,
            reason: Some(why),
            ours: None,
            peer: None,
            peer_name: row.peer.map(|p| p.1),
            ratio: None,
            ratio_of: None,
            unit: row.unit,
            higher_is_better: row.higher_is_better,
            target: row.target,
            target_met: None,
            seconds: 0.0,
        }
    }
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Why `row` cannot run here, if it cannot.
pub fn unmet(row: &Row) -> Option<String> {
    row.needs.iter().find_map(|n| match *n {
        Need::Tool(tool, package) => find_tool(tool)
            .is_none()
            .then(|| format!("`{tool}` is not installed (Debian package `{package}`)")),
        Need::Feature(f, on) => (!on).then(|| {
            format!("this uniplane-bench was built without the `{f}` feature (--features {f})")
        }),
        Need::Cores(n) => {
            let cores = crate::report::cores();
            (cores < n).then(|| format!("needs {n} cores, this machine has {cores}"))
        }
        Need::Root => (!is_root()).then(|| "needs root (namespaces, raw sockets)".to_owned()),
    })
}

fn command_line(args: &str, seconds: u64) -> Vec<String> {
    let n = (seconds * 10_000).to_string();
    args.split_whitespace()
        .map(|a| a.replace("{S}", &seconds.to_string()).replace("{N}", &n))
        .collect()
}

fn children_cpu() -> Duration {
    // SAFETY: getrusage writes one rusage.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_CHILDREN covers the children reaped so far.
    unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Runs one command of this binary with `--json --quiet`, bounded in time;
/// returns its report and the CPU share of a core it used.
fn run_child(exe: &Path, args: &[String], limit: Duration) -> Result<(Value, f64), String> {
    let cpu_before = children_cpu();
    let start = Instant::now();
    let g = ProcessGroup::spawn(
        "uniplane-bench",
        Command::new(exe).args(args).args(["--json", "--quiet"]),
    )
    .map_err(|e| e.to_string())?;
    let (status, out, err) = g.wait_output(limit, "finish").map_err(|e| e.to_string())?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = (children_cpu() - cpu_before).as_secs_f64();
    if !status.success() {
        let why = err.trim().lines().last().unwrap_or("").to_owned();
        return Err(format!("{status}: {why}"));
    }
    let last = out.lines().last().unwrap_or("");
    let v: Value =
        serde_json::from_str(last).map_err(|e| format!("its report is not JSON: {e}"))?;
    Ok((v, 100.0 * cpu / wall.max(1e-9)))
}

/// Fills in a row's figures from its command's report.
fn figures(
    row: &Row,
    report: &Value,
    cpu_percent: f64,
    peer_cpu_percent: Option<f64>,
    seconds: f64,
    command: String,
) -> RowResult {
    let get = |ptr: &str| -> Option<f64> {
        if ptr == PROCESS_CPU {
            Some(cpu_percent)
        } else if ptr == PEER_PROCESS_CPU {
            peer_cpu_percent
        } else {
            report.pointer(ptr)?.as_f64().map(|v| v * row.scale)
        }
    };
    let ours = get(row.ours);
    let peer = row.peer.and_then(|(p, _)| get(p));
    let (ratio, ratio_of) = match (ours, peer, row.target) {
        (Some(o), Some(p), _) if p > 0.0 => (Some(o / p), Some("peer")),
        (Some(o), None, Some(t)) if row.peer.is_none() && t.value > 0.0 => {
            (Some(o / t.value), Some("target"))
        }
        _ => (None, None),
    };
    let target_met = row.target.and_then(|t| {
        let v = match t.on {
            On::Ours => ours?,
            On::Ratio => ratio.filter(|_| ratio_of == Some("peer"))?,
        };
        Some(if t.at_least {
            v >= t.value
        } else {
            v <= t.value
        })
    });
    let missing = ours.is_none() || (row.peer.is_some() && peer.is_none());
    RowResult {
        id: row.id,
        what: row.what,
        command,
        status: if missing { "failed" } else { "ok" },
        reason: missing.then(|| "its report lacks the figure".to_owned()),
        ours,
        peer,
        peer_name: row.peer.map(|p| p.1),
        ratio,
        ratio_of,
        unit: row.unit,
        higher_is_better: row.higher_is_better,
        target: row.target,
        target_met,
        seconds,
    }
}

/// A command's report, its CPU share of a core and its seconds; or why
/// it failed.
type Outcome = Result<(Value, f64, f64), String>;

/// Runs the suite; `progress` hears of each row as it starts.
pub fn run_suite(
    cfg: &SuiteConfig,
    mut progress: impl FnMut(usize, usize, &Row),
) -> Result<Vec<RowResult>, BenchError> {
    let all = rows();
    for o in &cfg.only {
        if !all.iter().any(|r| r.id == o) {
            let known: Vec<&str> = all.iter().map(|r| r.id).collect();
            return Err(BenchError::Config(format!(
                "--only `{o}`: rows are {}",
                known.join(", ")
            )));
        }
    }
    let chosen: Vec<&Row> = all
        .iter()
        .filter(|r| cfg.only.is_empty() || cfg.only.iter().any(|o| o == r.id))
        .collect();
    let mut cache: HashMap<Vec<String>, Outcome> = HashMap::new();
    let mut out = Vec::with_capacity(chosen.len());
    for (i, row) in chosen.iter().enumerate() {
        progress(i, chosen.len(), row);
        let args = command_line(row.args, cfg.seconds);
        let command = format!("uniplane-bench {}", args.join(" "));
        if let Some(why) = unmet(row) {
            out.push(RowResult::without_figures(row, command, "skipped", why));
            continue;
        }
        let limit = Duration::from_secs(cfg.seconds * 6 + 40);
        let r = cache
            .entry(args.clone())
            .or_insert_with(|| {
                let t = Instant::now();
                run_child(&cfg.exe, &args, limit)
                    .map(|(v, cpu)| (v, cpu, t.elapsed().as_secs_f64()))
            })
            .clone();
        // A peer that is a process of its own runs after ours, alone.
        let peer = row.peer_args.map(|p| {
            let peer_args = command_line(p, cfg.seconds);
            run_child(&cfg.exe, &peer_args, limit)
                .map(|(_, cpu)| cpu)
                .map_err(|why| format!("the peer (uniplane-bench {}): {why}", peer_args.join(" ")))
        });
        out.push(match (r, peer) {
            (Err(why), _) | (Ok(_), Some(Err(why))) => {
                RowResult::without_figures(row, command, "failed", why)
            }
            (Ok((v, cpu, secs)), peer) => {
                let peer_cpu = peer.and_then(Result::ok);
                figures(row, &v, cpu, peer_cpu, secs, command)
            }
        });
    }
    Ok(out)
}

fn fig(v: Option<f64>) -> String {
    match v {
        None => "—".into(),
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) if x.abs() >= 10.0 => format!("{x:.1}"),
        Some(x) => format!("{x:.3}"),
    }
}

/// A target in words (`≥ 20 M msg/s`, `≤ 1.1× the peer`).
pub fn target_text(r: &RowResult) -> String {
    match r.target {
        None => "—".into(),
        Some(t) => {
            let cmp = if t.at_least { "≥" } else { "≤" };
            match t.on {
                On::Ours => format!("{cmp} {} {}", t.value, r.unit),
                On::Ratio => format!("{cmp} {}× the peer", t.value),
            }
        }
    }
}

/// The rows as a Markdown table (what docs/benchmarks.md shows).
pub fn markdown(rows: &[RowResult]) -> String {
    let mut s = String::from(
        "| row | command | ours | peer | ratio | target | met |\n|---|---|---|---|---|---|---|\n",
    );
    for r in rows {
        let cmd = r.command.trim_start_matches("uniplane-bench ");
        let (ours, peer, ratio, met) = match r.status {
            "ok" => (
                format!("{} {}", fig(r.ours), r.unit),
                match (r.peer, r.peer_name) {
                    (Some(p), Some(n)) => format!("{} {} ({n})", fig(Some(p)), r.unit),
                    _ => "—".into(),
                },
                match (r.ratio, r.ratio_of) {
                    (Some(x), Some("target")) => format!("{x:.2}× target"),
                    (Some(x), _) => format!("{x:.2}×"),
                    _ => "—".into(),
                },
                match r.target_met {
                    Some(true) => "yes".to_owned(),
                    Some(false) => "no".to_owned(),
                    None => "—".to_owned(),
                },
            ),
            other => (
                format!("{other}: {}", r.reason.as_deref().unwrap_or("")),
                "—".into(),
                "—".into(),
                "—".into(),
            ),
        };
        s.push_str(&format!(
            "| {} | `{cmd}` | {ours} | {peer} | {ratio} | {} | {met} |\n",
            r.id,
            target_text(r)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_names_are_unique_and_commands_fill_in_the_seconds() {
        let rows = rows();
        let mut ids: Vec<&str> = rows.iter().map(|r| r.id).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), rows.len());
        let r = rows.iter().find(|r| r.id == "udp-rtt").unwrap();
        assert!(command_line(r.args, 2).contains(&"2".to_owned()));
        assert!(!command_line(r.args, 2).iter().any(|a| a.contains('{')));
        for r in &rows {
            // A second process is the peer exactly where its figure says so.
            let by_process = r.peer.is_some_and(|p| p.0 == PEER_PROCESS_CPU);
            assert_eq!(by_process, r.peer_args.is_some(), "{}", r.id);
            if let Some(p) = r.peer_args {
                assert!(!command_line(p, 2).iter().any(|a| a.contains('{')));
            }
        }
    }

    #[test]
    fn figures_divide_by_the_peer_or_the_target_and_judge_the_target() {
        let row = rows().into_iter().find(|r| r.id == "udp-rtt").unwrap();
        let report = serde_json::json!({"results": {"ours": 11000.0, "peer": 10000.0}});
        let r = figures(&row, &report, 0.0, None, 1.0, "x".into());
        assert_eq!(r.status, "ok");
        assert!((r.ratio.unwrap() - 1.1).abs() < 1e-9);
        assert_eq!(r.ratio_of, Some("peer"));
        assert_eq!(r.target_met, Some(true));
        let row = rows().into_iter().find(|r| r.id == "overhead-p50").unwrap();
        let report = serde_json::json!({"results": {"added_ns": {"p50": 400.0}}});
        let r = figures(&row, &report, 0.0, None, 1.0, "x".into());
        assert_eq!((r.ratio, r.ratio_of), (Some(2.0), Some("target")));
        assert_eq!(r.target_met, Some(false));
        let r = figures(&row, &serde_json::json!({}), 0.0, None, 1.0, "x".into());
        assert_eq!(r.status, "failed");
        assert!(markdown(&[r]).contains("| overhead-p50 |"));
        // The paced row: ours and the waking floor, both processes' CPU.
        let row = rows().into_iter().find(|r| r.id == "gen-2kpps").unwrap();
        let r = figures(
            &row,
            &serde_json::json!({}),
            6.0,
            Some(5.0),
            1.0,
            "x".into(),
        );
        assert_eq!((r.ours, r.peer), (Some(6.0), Some(5.0)));
        assert!((r.ratio.unwrap() - 1.2).abs() < 1e-9);
        assert_eq!(r.ratio_of, Some("peer"));
        assert_eq!(r.target_met, Some(false), "the target is on ours: <= 5 %");
        let r = figures(&row, &serde_json::json!({}), 6.0, None, 1.0, "x".into());
        assert_eq!(r.status, "failed", "without the peer's figure");
    }
}
