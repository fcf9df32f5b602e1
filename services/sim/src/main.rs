//! `uniplane-sim`: runs the fabric simulation from the command line.
//!
//! ```text
//! uniplane-sim --servers 16 --seed 7 --seeds 100 --faults crash,partition,loss,reorder
//! uniplane-sim --servers 1000 --connections 100 --no-engine --json
//! ```

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use uniplane_sim::{Bug, Fault, Report, SimConfig, Workload};

/// A deterministic simulation of a whole uniplane fabric: real control
/// cores and overlay engines on simulated links, on virtual time.
#[derive(Parser, Debug)]
#[command(name = "uniplane-sim", version)]
struct Args {
    /// Servers in the fabric.
    #[arg(long, default_value_t = 16)]
    servers: usize,
    /// The seed (the first, with --seeds).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Runs this many seeds, from --seed on.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Connections each client sets up (churn), or rounds (collective).
    #[arg(long, default_value_t = 8)]
    connections: usize,
    /// What the clients do.
    #[arg(long, value_enum, default_value_t = Workload::Churn)]
    workload: Workload,
    /// Faults to inject, comma separated.
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<Fault>,
    /// Crashes (with --faults crash).
    #[arg(long, default_value_t = 1)]
    crashes: usize,
    /// Partitions (with --faults partition).
    #[arg(long, default_value_t = 1)]
    partitions: usize,
    /// Loss probability per packet (with --faults loss).
    #[arg(long, default_value_t = 0.01)]
    loss: f64,
    /// Largest extra delay per packet in µs (with --faults reorder).
    #[arg(long, default_value_t = 30)]
    jitter_us: u64,
    /// Neighbours of each server.
    #[arg(long, default_value_t = 8)]
    degree: usize,
    /// Messages each connection carries.
    #[arg(long, default_value_t = 4)]
    messages: u32,
    /// Connections a client has in flight at once.
    #[arg(long, default_value_t = 4)]
    window: usize,
    /// Longest time in µs a client keeps a connection once its messages
    /// are delivered.
    #[arg(long, default_value_t = 20_000)]
    hold_us: u64,
    /// One-way link latency in µs.
    #[arg(long, default_value_t = 20)]
    latency_us: u64,
    /// Heartbeat interval in ms.
    #[arg(long, default_value_t = 10)]
    heartbeat_ms: u64,
    /// Heartbeats missed before a peer is declared failed.
    #[arg(long, default_value_t = 4)]
    misses: u32,
    /// Check a server's plane against its core after every n-th batch.
    #[arg(long, default_value_t = 1)]
    check_every: u32,
    /// Decide messages with the engine's connectors alone instead of a
    /// whole engine per server (for large fabrics).
    #[arg(long)]
    no_engine: bool,
    /// Plant a defect in the tunnels (to see the checker catch it).
    #[arg(long, value_enum)]
    bug: Option<Bug>,
    /// Print one JSON line instead of text.
    #[arg(long)]
    json: bool,
}

/// Prints a line; a reader that went away (`| head`) ends nothing badly.
macro_rules! say {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($t)*);
    }};
}

fn config(a: &Args, seed: u64) -> SimConfig {
    let mut c = SimConfig::new(a.servers, seed);
    c.connections = a.connections;
    c.workload = a.workload;
    c.faults = a.faults.clone();
    c.crashes = a.crashes;
    c.partitions = a.partitions;
    c.loss = a.loss;
    c.jitter = Duration::from_micros(a.jitter_us);
    c.degree = a.degree;
    c.messages = a.messages;
    c.window = a.window.max(1);
    c.hold = Duration::from_micros(a.hold_us);
    c.latency = Duration::from_micros(a.latency_us.max(1));
    c.heartbeat = Duration::from_millis(a.heartbeat_ms.max(1));
    c.misses = a.misses.max(1);
    c.check_every = a.check_every.max(1);
    c.engine = !a.no_engine;
    c.bug = a.bug;
    c
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.servers < 2 {
        eprintln!("uniplane-sim: --servers must be at least 2");
        return ExitCode::from(2);
    }
    let mut reports: Vec<Report> = Vec::new();
    for k in 0..args.seeds.max(1) {
        let r = uniplane_sim::run(config(&args, args.seed + k));
        if let Some(v) = &r.violation {
            eprintln!(
                "violation at {:.3} ms of seed {}: {}\nreplay: {}",
                v.at_ms, r.seed, v.what, r.replay
            );
        } else if !args.json {
            say!(
                "seed {}: {} events in {:.3} s ({:.0} events/s), {:.1} ms simulated, {} connections, {} delivered, trace {}",
                r.seed, r.events, r.wall_s, r.events_per_sec, r.sim_ms, r.connected, r.delivered, r.trace_hash
            );
        }
        reports.push(r);
    }
    let violations = reports.iter().filter(|r| r.violation.is_some()).count();
    let events: u64 = reports.iter().map(|r| r.events).sum();
    let wall: f64 = reports.iter().map(|r| r.wall_s).sum();
    let setups: u64 = reports.iter().map(|r| r.remote_setups).sum();
    let setup_msgs: u64 = reports.iter().map(|r| r.setup_msgs).sum();
    let close_msgs: u64 = reports.iter().map(|r| r.close_msgs).sum();
    let convergence: Vec<f64> = reports.iter().flat_map(|r| r.convergence.clone()).collect();
    let max_conv = convergence.iter().copied().reduce(f64::max);
    let mean_conv = (!convergence.is_empty())
        .then(|| convergence.iter().sum::<f64>() / convergence.len() as f64);
    let per_setup = if setups > 0 {
        setup_msgs as f64 / setups as f64
    } else {
        0.0
    };
    let per_conn = if setups > 0 {
        (setup_msgs + close_msgs) as f64 / setups as f64
    } else {
        0.0
    };
    let eps = if wall > 0.0 {
        events as f64 / wall
    } else {
        0.0
    };
    if args.json {
        let last = reports.last();
        let out = serde_json::json!({
            "servers": args.servers,
            "seed": args.seed,
            "seeds": reports.len(),
            "engine": !args.no_engine,
            "results": {
                "events": events,
                "wall_s": wall,
                "events_per_sec": eps,
                "violations": violations,
                "convergence_ms": max_conv,
                "convergence_mean_ms": mean_conv,
                "failures_measured": convergence.len(),
                "remote_setups": setups,
                "control_msgs_per_setup": per_setup,
                "control_msgs_per_connection": per_conn,
                "trace_hash": last.map(|r| r.trace_hash.clone()),
            },
            "runs": if reports.len() == 1 { serde_json::to_value(&reports[0]).ok() } else { None },
        });
        say!("{out}");
    } else {
        say!(
            "{} seeds, {} violations; {:.0} events/s; {} remote setups at {:.2} setup messages each ({:.2} with closes); convergence after a crash: max {}, mean {}",
            reports.len(),
            violations,
            eps,
            setups,
            per_setup,
            per_conn,
            max_conv.map_or("-".into(), |v| format!("{v:.2} ms")),
            mean_conv.map_or("-".into(), |v| format!("{v:.2} ms")),
        );
    }
    if violations > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
