//! `uniplane-bench app regex`: DUA's multi-regex matching application
//! (NSDI'19 §8.2, Fig. 13) — the ModSecurity Core Rule Set's `@rx`
//! patterns in three seeded groups on three `regex-stage` kernel devices
//! of a daemon started in this process — in its three configurations,
//! one run, per input size.
//!
//! ```text
//!  through uniplane  app ─▶ chained0 ══next══▶ chained1 ══next══▶ chained2 ─▶ app   (--depth inputs in flight)
//!  through the CPU   app ─▶ relayed0 ─▶ app ─▶ relayed1 ─▶ app ─▶ relayed2 ─▶ app   (the relay: one at a time)
//!  one core          app: PCRE2, every pattern the stages match, in turn
//! ```
//!
//! For each size, `--count` random printable inputs (seeded) go through
//! each configuration: throughput is input bits over the run's wall time
//! (through uniplane with `--depth` in flight, the others as they work),
//! latency the time from sending an input to its match list with one
//! input in flight. Every input's match list must be the same in all
//! three configurations: a run where one differs reports it
//! (`mismatches`) and fails.

use std::path::{Path, PathBuf};
use std::time::Instant;

use bytes::Bytes;
use clap::Args;
use serde_json::{json, Value};
use uniplane_regex_pipeline::corpus::Corpus;
use uniplane_regex_pipeline::one_core::OneCore;
use uniplane_regex_pipeline::pipeline::{self, Answer, Stages, STAGES};
use uniplane_regex_pipeline::report::{Engine, Report};
use uniplane_regex_pipeline::{EngineKind, PatternId, RuleSet, DEBIAN_CRS_RULES};

use crate::hist::LatencyHistogram;
use crate::path::{client_err, scratch_dir};
use crate::plot::{self, Chart};
use crate::BenchError;

/// What `app regex` takes.
#[derive(Args, Clone, Debug)]
pub struct RegexArgs {
    /// The directory of the rule files (`*.conf`).
    #[arg(long, default_value = DEBIAN_CRS_RULES)]
    pub rules: PathBuf,
    /// The stages' engine: automata, or hyperscan (`--features hyperscan`).
    #[arg(long, default_value = "automata")]
    pub engine: String,
    /// Input sizes in bytes (each at most 16384, a stage's limit).
    #[arg(long, value_delimiter = ',', default_value = "64,256,1024,4096,16384")]
    pub sizes: Vec<usize>,
    /// Inputs per size and configuration.
    #[arg(long, default_value_t = 400)]
    pub count: usize,
    /// Inputs in flight through uniplane for the throughput figure.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=64))]
    pub depth: u64,
    /// The seed of the split into groups and of the inputs.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Throughput against size (Fig. 13, left), `.svg` or `.png`.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Latency against size (Fig. 13, right), `.svg` or `.png`.
    #[arg(long)]
    pub plot_latency: Option<PathBuf>,
}

/// The largest input a stage takes here.
const MAX_INPUT: usize = 16_384;

/// Runs the benchmark; the `results` of its report.
pub fn run_regex(a: &RegexArgs) -> Result<Value, BenchError> {
    let engine = EngineKind::parse(&a.engine).map_err(BenchError::Config)?;
    if a.count == 0 {
        return Err(BenchError::Config("--count must be above 0".into()));
    }
    if let Some(&s) = a.sizes.iter().find(|&&s| s == 0 || s > MAX_INPUT) {
        return Err(BenchError::Config(format!(
            "--sizes: {s} bytes; an input is 1 to {MAX_INPUT} bytes"
        )));
    }
    let set = RuleSet::load(&a.rules).map_err(|e| {
        BenchError::Config(format!("--rules: {e} (apt-get install modsecurity-crs)"))
    })?;
    let stages = Stages {
        rules: a.rules.display().to_string(),
        engine,
        seed: a.seed,
        max_input: MAX_INPUT,
        chained: 11,
        relayed: 21,
        stall_timeout_ms: 5000,
    };
    // The baseline matches what the stages match.
    let report = Report::new(&set, &[Engine::Stage(engine), Engine::Pcre2]);
    let matched = &report.engines[0].compiled;
    let one = OneCore::new(&set, |id| matched.contains(&id));
    let dir = scratch_dir("app-regex")?;
    let result = measure(a, &stages, &one, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    let points = result?;
    let f = |p: &Value, k: &str| p[k].as_f64().unwrap_or(0.0);
    let target_met = points
        .iter()
        .filter(|p| p["size"].as_u64().unwrap_or(0) >= 1024)
        .all(|p| f(p, "through_uniplane_mbps") >= 2.0 * f(p, "through_cpu_mbps"));
    let mismatches: u64 = points
        .iter()
        .map(|p| p["mismatches"].as_u64().unwrap_or(0))
        .sum();
    let r = json!({
        "engine": engine.name(),
        "rules": {
            "patterns": report.total,
            "not_loaded": report.skipped.len(),
            "compiled": report.engines[0].compiled.len(),
            "refused": report.engines[0].refused.iter()
                .map(|(id, why)| json!({"id": id.to_string(), "why": why})).collect::<Vec<_>>(),
            "pcre2_refused": report.engines[1].refused.len(),
        },
        "depth": a.depth,
        "points": points,
        "target": "through uniplane >= 2x through the CPU at every size >= 1 KiB",
        "target_met": target_met,
        "mismatches": mismatches,
    });
    if let Some(path) = &a.plot {
        draw(path, &r, "throughput", "Mbit/s")?;
    }
    if let Some(path) = &a.plot_latency {
        draw(path, &r, "latency", "p50 latency, µs")?;
    }
    if mismatches > 0 {
        print(&r);
        return Err(BenchError::Config(format!(
            "{mismatches} inputs had different match lists across the configurations"
        )));
    }
    Ok(r)
}

fn measure(
    a: &RegexArgs,
    stages: &Stages,
    one: &OneCore,
    dir: &Path,
) -> Result<Vec<Value>, BenchError> {
    let here = std::net::Ipv4Addr::LOCALHOST;
    let text = format!(
        "[server]\nid = \"{here}\"\npeer_listen = \"127.0.0.1:0\"\n{}",
        stages.devices(here)
    );
    let mut config = uniplane_services::Config::parse(&text, "app-regex")
        .map_err(|e| BenchError::Config(format!("the daemon's configuration: {e}")))?;
    config.runtime_dir = Some(dir.to_owned());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| BenchError::Thread {
            what: "daemon",
            source,
        })?;
    runtime.block_on(async {
        let (_daemon, client) = uniplane_services::client::embedded(config, dir)
            .await
            .map_err(|e| BenchError::Config(format!("the daemon: {e}")))?;
        chains_up(&client).await?;
        let session = client.attach("app-regex").await.map_err(client_err)?;
        let entry = stages.chained_uid(here, 0);
        let relayed: Vec<_> = (0..STAGES).map(|g| stages.relayed_uid(here, g)).collect();
        let mut corpus = Corpus::new(a.seed);
        let depth = a.depth as usize;
        let mut points = Vec::new();
        // Warm every path first (the chain's connection, the stages'
        // caches, the session's rings), then each size.
        let warm: Vec<Bytes> = (0..100).map(|_| Bytes::from(corpus.random(1024))).collect();
        let run = |e: pipeline::PipelineError| client_err(e);
        pipeline::through_uniplane(&session, entry, &warm, depth)
            .await
            .map_err(run)?;
        pipeline::through_cpu(&session, &relayed, &warm)
            .await
            .map_err(run)?;
        for &size in &a.sizes {
            let inputs: Vec<Bytes> = (0..a.count)
                .map(|_| Bytes::from(corpus.random(size)))
                .collect();
            let warm = &inputs[..inputs.len().min(20)];
            pipeline::through_uniplane(&session, entry, warm, depth)
                .await
                .map_err(run)?;
            pipeline::through_cpu(&session, &relayed, warm)
                .await
                .map_err(run)?;
            let t0 = Instant::now();
            let chained = pipeline::through_uniplane(&session, entry, &inputs, depth)
                .await
                .map_err(run)?;
            let chained_s = t0.elapsed().as_secs_f64();
            let chained_one = pipeline::through_uniplane(&session, entry, &inputs, 1)
                .await
                .map_err(run)?;
            let t0 = Instant::now();
            let relay = pipeline::through_cpu(&session, &relayed, &inputs)
                .await
                .map_err(run)?;
            let relay_s = t0.elapsed().as_secs_f64();
            let (baseline, one_s, one_hist) = one_core(one, &inputs)?;
            let mut mismatches = 0u64;
            let mut failed = 0u64;
            let mut matches = 0u64;
            for i in 0..inputs.len() {
                let lists = [&chained[i], &chained_one[i], &relay[i]].map(|x| x.list.as_ref().ok());
                if lists.iter().any(Option::is_none) {
                    failed += 1;
                } else if lists.iter().any(|l| l != &Some(&baseline[i])) {
                    mismatches += 1;
                }
                matches += baseline[i].len() as u64;
            }
            if failed > 0 {
                let why = [&chained, &chained_one, &relay]
                    .iter()
                    .flat_map(|r| r.iter())
                    .find_map(|x| x.list.as_ref().err().map(|e| e.to_string()))
                    .unwrap_or_default();
                return Err(BenchError::Config(format!(
                    "{size}-byte inputs: {failed} got no match list ({why})"
                )));
            }
            let bits = (size * inputs.len() * 8) as f64;
            let mbps = |s: f64| if s > 0.0 { bits / s / 1e6 } else { 0.0 };
            let (uni, cpu, core) = (mbps(chained_s), mbps(relay_s), mbps(one_s));
            points.push(json!({
                "size": size,
                "through_uniplane_mbps": uni,
                "through_cpu_mbps": cpu,
                "one_core_mbps": core,
                "uniplane_over_cpu": if cpu > 0.0 { uni / cpu } else { 0.0 },
                "latency_us": {
                    "through_uniplane": latency(&chained_one),
                    "through_cpu": latency(&relay),
                    "one_core": percentiles(&one_hist),
                },
                "matches_per_input": matches as f64 / inputs.len() as f64,
                "mismatches": mismatches,
            }));
        }
        Ok(points)
    })
}

/// Waits (bounded) until both chained stages that send on have their
/// chain up.
async fn chains_up(client: &uniplane_client::Client) -> Result<(), BenchError> {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let status = client
            .request(&uniplane_services::control::Request::Status)
            .await
            .map_err(client_err)?;
        let up = |name: &str| {
            status["devices"].as_array().is_some_and(|a| {
                a.iter()
                    .any(|d| d["name"] == name && d["chain"]["up"] == true)
            })
        };
        if up("chained0") && up("chained1") {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Config(
                "the stages' chain did not come up in 30 s".into(),
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

type OneCoreRun = (Vec<Vec<PatternId>>, f64, LatencyHistogram);

/// Every input matched by PCRE2 here: the lists, the seconds, the
/// latency of each.
fn one_core(one: &OneCore, inputs: &[Bytes]) -> Result<OneCoreRun, BenchError> {
    let mut lists = Vec::with_capacity(inputs.len());
    let mut hist = LatencyHistogram::new();
    let mut found = Vec::new();
    let t0 = Instant::now();
    for input in inputs {
        let t = Instant::now();
        one.matches(input, &mut found)
            .map_err(|e| BenchError::Config(format!("PCRE2: {e}")))?;
        hist.record(t.elapsed().as_nanos() as u64);
        lists.push(found.clone());
    }
    Ok((lists, t0.elapsed().as_secs_f64(), hist))
}

fn latency(answers: &[Answer]) -> Value {
    let mut hist = LatencyHistogram::new();
    for a in answers {
        hist.record(a.latency.as_nanos() as u64);
    }
    percentiles(&hist)
}

fn percentiles(hist: &LatencyHistogram) -> Value {
    let us = |q: f64| hist.quantile(q) as f64 / 1e3;
    json!({ "p50": us(0.5), "p99": us(0.99) })
}

/// A chart of `what` ("throughput" or "latency") against input size.
fn draw(path: &Path, r: &Value, what: &str, y_label: &str) -> Result<(), BenchError> {
    let points = r["points"].as_array().cloned().unwrap_or_default();
    let line = |key: &str| -> Vec<(f64, f64)> {
        points
            .iter()
            .map(|p| {
                let y = if what == "throughput" {
                    p[format!("{key}_mbps")].as_f64()
                } else {
                    p["latency_us"][key]["p50"].as_f64()
                };
                (
                    p["size"].as_f64().unwrap_or(1.0),
                    y.unwrap_or(0.0).max(1e-3),
                )
            })
            .collect()
    };
    let lines = [
        ("through uniplane", line("through_uniplane")),
        ("through the CPU", line("through_cpu")),
        ("one core (PCRE2)", line("one_core")),
    ];
    let title = format!(
        "multi-regex matching ({}), {what}",
        r["engine"].as_str().unwrap_or("?")
    );
    plot::draw(
        path,
        &Chart::LogLog {
            title: &title,
            x_label: "input size, bytes",
            y_label,
            lines: &lines,
        },
    )
    .map_err(|e| BenchError::Config(e.to_string()))
}

/// Prints the run as a table.
pub fn print(r: &Value) {
    println!(
        "app regex: {} of {} @rx patterns compile with {} (the rest named in --json), \
         3 stages, {} inputs in flight through uniplane",
        r["rules"]["compiled"],
        r["rules"]["patterns"],
        r["engine"].as_str().unwrap_or("?"),
        r["depth"]
    );
    println!(
        "  {:>6}  {:>12} {:>12} {:>12} {:>6}   {:>22} {:>22} {:>22}",
        "size",
        "uniplane",
        "CPU relay",
        "one core",
        "×CPU",
        "p50/p99 µs uniplane",
        "CPU relay",
        "one core"
    );
    for p in r["points"].as_array().into_iter().flatten() {
        let f = |v: &Value| v.as_f64().unwrap_or(0.0);
        let l = |k: &str| {
            format!(
                "{:.0}/{:.0}",
                f(&p["latency_us"][k]["p50"]),
                f(&p["latency_us"][k]["p99"])
            )
        };
        println!(
            "  {:>6}  {:>7.1} Mb/s {:>7.1} Mb/s {:>7.1} Mb/s {:>5.2}×   {:>22} {:>22} {:>22}",
            p["size"],
            f(&p["through_uniplane_mbps"]),
            f(&p["through_cpu_mbps"]),
            f(&p["one_core_mbps"]),
            f(&p["uniplane_over_cpu"]),
            l("through_uniplane"),
            l("through_cpu"),
            l("one_core"),
        );
    }
    println!(
        "  target (through uniplane ≥ 2× through the CPU at ≥ 1 KiB): {}; match lists identical \
         across the three: {}",
        if r["target_met"] == true {
            "met"
        } else {
            "not met"
        },
        if r["mismatches"] == 0 { "yes" } else { "NO" }
    );
}
