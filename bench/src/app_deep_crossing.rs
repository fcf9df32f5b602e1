//! `uniplane-bench app deep-crossing`: DUA's deep crossing (NSDI'19 §8.2,
//! Fig. 12) through daemons started in this process, per placement of
//! its dense layers, the single endpoint beside the splits in one run.
//!
//! ```text
//!  this process: application (the deep-crossing library) ─ring─▶ daemon A
//!    single           A: device 2 = layers 0..n
//!    split connect    A: device 2 = 0..cut ─next (FPGA Connect)─▶ A: device 3 = cut..n
//!    split ltl | tcp  A: device 2 = 0..cut ─next (tunnel)──────▶ B: device 3 = cut..n
//! ```
//!
//! Each placement is measured twice over inputs `0..count`: one
//! inference in flight (latency p50/p99, host products included) and
//! `pipeline` in flight (inferences per second). Every output goes into
//! a digest that must equal the model computed in this process: a
//! placement that computes anything else fails the run.

use std::net::Ipv4Addr;
use std::path::{Path as FsPath, PathBuf};
use std::time::{Duration, Instant};

use clap::Args;
use deep_crossing::placement::{render, Path, Placement, Servers};
use deep_crossing::{reference_digest, run, Model, Outcome, RunConfig, DEFAULT_NNZ};
use serde_json::{json, Value};
use uniplane_client::Client;

use crate::path::{client_err, scratch_dir};
use crate::BenchError;

/// What `app deep-crossing` takes.
#[derive(Args, Clone, Debug)]
pub struct DeepCrossingArgs {
    /// Inferences per measurement (inputs 0..count).
    #[arg(long, default_value_t = 2000)]
    pub count: u64,
    /// Inferences in flight for the throughput figure.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub pipeline: u64,
    /// The model's seed (weights, embeddings, inputs).
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// The dense widths (the first is three embeddings).
    #[arg(long, default_value = uniplane_kernel::dense::DEFAULT_DIMS)]
    pub dims: String,
    /// Nonzero trigrams per text field of an input.
    #[arg(long, default_value_t = DEFAULT_NNZ)]
    pub nnz: usize,
    /// The first layer of the second endpoint (default: half the layers).
    #[arg(long)]
    pub cut: Option<usize>,
    /// Rounds (each placement once per round, interleaved); each figure
    /// is the median of its rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,
    /// The paths between the two halves: connect (one server), ltl, tcp
    /// (two servers).
    #[arg(long, value_delimiter = ',', default_value = "connect,ltl")]
    pub paths: Vec<String>,
}

/// Runs the benchmark; the `results` of its report.
pub fn run_deep_crossing(a: &DeepCrossingArgs) -> Result<Value, BenchError> {
    let model = Model::new(&a.dims, a.seed, a.nnz).map_err(BenchError::Config)?;
    if a.count == 0 {
        return Err(BenchError::Config("--count must be above 0".into()));
    }
    let layers = model.dims().len() - 1;
    let cut = a.cut.unwrap_or(layers.div_ceil(2));
    if cut == 0 || cut >= layers {
        return Err(BenchError::Config(format!(
            "--cut: a split at layer {cut}: each half needs a layer of the model's {layers} (1..{layers})"
        )));
    }
    let paths = a
        .paths
        .iter()
        .map(|p| Path::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| BenchError::Config(format!("--paths: {e}")))?;
    let reference = reference_digest(&model, a.count).hex();
    let in_process = in_process(&model, a.count);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|source| BenchError::Thread {
            what: "daemon",
            source,
        })?;
    let mut placements = vec![Placement::Single];
    placements.extend(paths.into_iter().map(|path| Placement::Split { cut, path }));
    let mut single = Value::Null;
    let mut split = serde_json::Map::new();
    let mut verified = true;
    // Rounds interleave the placements, so a change of the machine's
    // load falls on all of them; each figure is the median of its rounds.
    let mut rounds: Vec<Vec<Value>> = vec![Vec::new(); placements.len()];
    for _ in 0..a.rounds {
        for (placement, runs) in placements.iter().zip(&mut rounds) {
            runs.push(runtime.block_on(measure(&model, *placement, a, &reference))?);
        }
    }
    for (placement, runs) in placements.into_iter().zip(rounds) {
        let r = median_of(runs);
        verified &= r["verified"] == true;
        match placement {
            Placement::Single => single = r,
            Placement::Split { path, .. } => {
                split.insert(path.name().to_string(), r);
            }
        }
    }
    let ratio: serde_json::Map<String, Value> = split
        .iter()
        .map(|(path, r)| {
            let f = |v: &Value, k: &str| v.pointer(k).and_then(Value::as_f64).unwrap_or(0.0);
            let p50 = f(&single, "/latency_us/p50");
            let rate = f(&single, "/per_sec");
            (
                path.clone(),
                json!({
                    "latency_p50": if p50 > 0.0 { f(r, "/latency_us/p50") / p50 } else { 0.0 },
                    "per_sec": if rate > 0.0 { f(r, "/per_sec") / rate } else { 0.0 },
                }),
            )
        })
        .collect();
    Ok(json!({
        "model": {
            "dims": model.dims(),
            "seed": a.seed,
            "nnz": a.nnz,
            "fields": deep_crossing::FIELDS,
            "field_dim": deep_crossing::FIELD_DIM,
        },
        "count": a.count,
        "pipeline": a.pipeline,
        "rounds": a.rounds,
        "cut": cut,
        "reference_digest": reference,
        "in_process_us": in_process,
        "verified": verified,
        "single": single,
        "split": split,
        "ratio_to_single": ratio,
    }))
}

/// The figures of a placement's rounds, each the median of its rounds
/// (the rest as the first round has it).
fn median_of(runs: Vec<Value>) -> Value {
    let mut out = runs.first().cloned().unwrap_or(Value::Null);
    for key in [
        "/latency_us/p50",
        "/latency_us/p99",
        "/per_sec",
        "/one_in_flight_per_sec",
        "/pipelined_latency_us/p50",
        "/pipelined_latency_us/p99",
    ] {
        let mut v: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.pointer(key).and_then(Value::as_f64))
            .collect();
        v.sort_by(f64::total_cmp);
        if let (Some(m), Some(slot)) = (v.get(v.len() / 2).copied(), out.pointer_mut(key)) {
            *slot = json!(m);
        }
    }
    out["verified"] = json!(runs.iter().all(|r| r["verified"] == true));
    out
}

/// The floor: one inference in this thread, no uniplane — the host's
/// sparse products and every dense layer (`uniplane_kernel::dense::Dense`,
/// as a kernel device runs it) — p50 and p99 in microseconds.
fn in_process(model: &Model, count: u64) -> Value {
    use uniplane_kernel::dense::{Dense, Stage};
    let n = model.dims().len() - 1;
    let mut dense = Dense::new(&Stage {
        dims: model.dims().to_vec(),
        layers: 0..n,
        seed: model.seed(),
    });
    let mut embedded = vec![0.0f32; model.dims()[0]];
    let mut request = Vec::with_capacity(model.request_bytes());
    let mut times: Vec<f64> = (0..count)
        .map(|i| {
            let t0 = Instant::now();
            model.request(&model.input(i), &mut embedded, &mut request);
            let _ = std::hint::black_box(dense.compute(&request));
            t0.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((q * times.len() as f64).ceil() as usize).clamp(1, times.len()) - 1];
    json!({ "p50": at(0.5), "p99": at(0.99) })
}

/// A placement's daemons started here and ready; its figures.
async fn measure(
    model: &Model,
    placement: Placement,
    a: &DeepCrossingArgs,
    reference: &str,
) -> Result<Value, BenchError> {
    let base = scratch_dir("app-deep-crossing")?;
    let result = measure_in(model, placement, a, reference, &base).await;
    let _ = std::fs::remove_dir_all(&base);
    result
}

async fn measure_in(
    model: &Model,
    placement: Placement,
    a: &DeepCrossingArgs,
    reference: &str,
    base: &FsPath,
) -> Result<Value, BenchError> {
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret)
        .map_err(|e| BenchError::Config(format!("cluster secret: {e}")))?;
    let port = || crate::stacks::free_port().map(|a| a.port());
    let servers = Servers {
        ids: [Ipv4Addr::new(10, 20, 0, 1), Ipv4Addr::new(10, 20, 0, 2)],
        peer_ports: [port()?, port()?],
        tunnel_ports: [port()?, port()?],
        secret,
    };
    let rendered = render(model, placement, Some(&servers)).map_err(BenchError::Config)?;
    let mut daemons = Vec::new();
    let mut dirs: Vec<PathBuf> = Vec::new();
    for (i, text) in rendered.configs.iter().enumerate() {
        let dir = base.join(format!("server{i}"));
        let config = uniplane_services::Config::parse(text, "deep-crossing")
            .map_err(|e| BenchError::Config(format!("a placement's configuration: {e}")))?;
        let (daemon, _) = uniplane_services::client::embedded(config, &dir)
            .await
            .map_err(|e| BenchError::Config(format!("a daemon: {e}")))?;
        daemons.push(daemon);
        dirs.push(dir);
    }
    if dirs.len() > 1 {
        for dir in &dirs {
            until(dir, "the daemons' peering", |s| {
                s["peers"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true))
            })
            .await?;
        }
    }
    if let Placement::Split { .. } = placement {
        until(&dirs[0], "the chain to the second endpoint", |s| {
            s["devices"]
                .as_array()
                .is_some_and(|d| d.iter().any(|d| d["chain"]["up"] == true))
        })
        .await?;
    }
    let session = Client::connect(&dirs[0])
        .await
        .map_err(client_err)?
        .attach("deep-crossing-bench")
        .await
        .map_err(client_err)?;
    let entry: uniplane_dataplane::Uid = rendered
        .entry
        .parse()
        .map_err(|e| BenchError::Config(format!("{}: {e}", rendered.entry)))?;
    let mut conn = session.connect(entry.port(7)).await.map_err(client_err)?;
    let go = |count: u64, pipeline: u64| RunConfig {
        count,
        pipeline: pipeline as usize,
        verify: false,
        timeout: Duration::from_secs(10),
    };
    let fail = |e: deep_crossing::RunError| BenchError::Config(format!("{placement:?}: {e}"));
    run(&mut conn, model, &go(a.count.min(50), 1))
        .await
        .map_err(fail)?;
    let one = run(&mut conn, model, &go(a.count, 1)).await.map_err(fail)?;
    let many = run(&mut conn, model, &go(a.count, a.pipeline))
        .await
        .map_err(fail)?;
    let _ = session.close(conn).await;
    drop(daemons);
    let digest = one.digest.hex();
    let verified = digest == reference && many.digest.hex() == reference;
    if !verified {
        return Err(BenchError::Config(format!(
            "{placement:?}: outputs differ from the reference (digest {digest} and {}, reference {reference})",
            many.digest.hex()
        )));
    }
    let n = model.dims().len() - 1;
    let layers = match placement {
        Placement::Single => vec![format!("0..{n}")],
        Placement::Split { cut, .. } => vec![format!("0..{cut}"), format!("{cut}..{n}")],
    };
    let figures = |o: &Outcome| json!({ "p50": o.latency_us(0.5), "p99": o.latency_us(0.99) });
    Ok(json!({
        "layers": layers,
        "servers": dirs.len(),
        "latency_us": figures(&one),
        "per_sec": many.per_sec(),
        "one_in_flight_per_sec": one.per_sec(),
        "pipelined_latency_us": figures(&many),
        "digest": digest,
        "verified": verified,
    }))
}

/// Waits (20 s at most) until the daemon in `dir` says `ready` of its
/// status.
async fn until(dir: &FsPath, what: &str, ready: impl Fn(&Value) -> bool) -> Result<(), BenchError> {
    let client = Client::connect(dir).await.map_err(client_err)?;
    let start = Instant::now();
    loop {
        let status = client
            .request(&uniplane_client::protocol::Request::Status)
            .await
            .map_err(client_err)?;
        if ready(&status) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(BenchError::Config(format!(
                "{what} did not come up within 20 s"
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Prints the table of a run's `results`.
pub fn print(r: &Value) {
    let f = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.1}"));
    let dims: Vec<String> = r["model"]["dims"]
        .as_array()
        .map(|d| d.iter().map(Value::to_string).collect())
        .unwrap_or_default();
    println!(
        "app deep-crossing: dims {}, {} inferences per figure, median of {} rounds; latency \
         with 1 in flight, throughput with {} (host sparse products included)",
        dims.join(","),
        r["count"],
        r["rounds"],
        r["pipeline"]
    );
    println!(
        "  {:<16} {:<14} {:>9} {:>9} {:>11} {:>11}",
        "placement", "layers", "p50 us", "p99 us", "inf/s (1)", "inf/s (K)"
    );
    let row = |name: &str, v: &Value| {
        let layers: Vec<&str> = v["layers"]
            .as_array()
            .map(|l| l.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        println!(
            "  {:<16} {:<14} {:>9} {:>9} {:>11} {:>11}",
            name,
            layers.join(" | "),
            f(&v["latency_us"]["p50"]),
            f(&v["latency_us"]["p99"]),
            f(&v["one_in_flight_per_sec"]),
            f(&v["per_sec"]),
        );
    };
    println!(
        "  {:<16} {:<14} {:>9} {:>9}",
        "in process",
        "(no uniplane)",
        f(&r["in_process_us"]["p50"]),
        f(&r["in_process_us"]["p99"])
    );
    row("single", &r["single"]);
    if let Some(split) = r["split"].as_object() {
        for (path, v) in split {
            row(&format!("split {path}"), v);
        }
    }
    println!(
        "  outputs: digest {} in every placement, equal to the reference: {}",
        r["reference_digest"].as_str().unwrap_or("?"),
        r["verified"]
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_the_median_of_its_rounds_and_verified_needs_every_round() {
        let run = |p50: f64, rate: f64, ok: bool| {
            json!({
                "latency_us": { "p50": p50, "p99": p50 * 2.0 },
                "per_sec": rate,
                "one_in_flight_per_sec": rate / 2.0,
                "pipelined_latency_us": { "p50": 1.0, "p99": 2.0 },
                "layers": ["0..4"],
                "verified": ok,
            })
        };
        let m = median_of(vec![
            run(300.0, 10.0, true),
            run(100.0, 30.0, true),
            run(200.0, 20.0, true),
        ]);
        assert_eq!(m["latency_us"]["p50"], 200.0);
        assert_eq!(m["latency_us"]["p99"], 400.0);
        assert_eq!(m["per_sec"], 20.0);
        assert_eq!(m["one_in_flight_per_sec"], 10.0);
        assert_eq!(m["layers"], json!(["0..4"]));
        assert_eq!(m["verified"], true);
        let m = median_of(vec![run(1.0, 1.0, true), run(1.0, 1.0, false)]);
        assert_eq!(m["verified"], false);
    }
}
