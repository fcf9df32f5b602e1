//! `deep-crossing`: runs inferences of the deep crossing model through a
//! uniplane daemon's entry kernel device and prints one digest line of
//! all outputs, and the latency figures.
//!
//! ```text
//! deep-crossing --socket RUNTIME_DIR --entry 127.0.0.1:2 --count 1000 --seed 7 [--pipeline 8]
//! ```
//!
//! Which devices compute which layers, on which servers and over which
//! path, is the daemons' configuration alone: this program is the same
//! for every placement.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use deep_crossing::{run, Model, RunConfig, DEFAULT_NNZ};
use uniplane_client::{Client, CONTROL_SOCKET};
use uniplane_dataplane::Uid;

/// Deep crossing inferences through a uniplane kernel device.
#[derive(Parser)]
#[command(name = "deep-crossing", version)]
struct Args {
    /// The daemon: its runtime directory or its control socket (default:
    /// the one `uniplane` finds).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The entry kernel device (SERVER:DEVICE): the one holding layer 0.
    #[arg(long)]
    entry: Uid,
    /// The port to connect to on the entry device.
    #[arg(long, default_value_t = 7)]
    port: u16,
    /// Inferences (inputs 0..count).
    #[arg(long, default_value_t = 1000)]
    count: u64,
    /// The model's seed: the kernels' `seed` parameter; the inputs and
    /// the host's embeddings derive from it too.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Inferences in flight at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=256))]
    pipeline: u64,
    /// The dense widths: the kernels' `dims` parameter.
    #[arg(long, default_value = uniplane_kernel::dense::DEFAULT_DIMS)]
    dims: String,
    /// Nonzero trigrams per text field of an input.
    #[arg(long, default_value_t = DEFAULT_NNZ)]
    nnz: usize,
    /// Compare every output with the model computed in this process.
    #[arg(long)]
    verify: bool,
    /// How long one answer may take, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// One JSON document on the last line.
    #[arg(long)]
    json: bool,
}

/// The runtime directory `socket` names.
fn runtime_dir(socket: &Path) -> PathBuf {
    if socket.file_name().is_some_and(|n| n == CONTROL_SOCKET) {
        socket.parent().map(Path::to_owned).unwrap_or_default()
    } else {
        socket.to_owned()
    }
}

async fn main_async(args: Args) -> Result<(), String> {
    let model = Model::new(&args.dims, args.seed, args.nnz)?;
    let client = match &args.socket {
        Some(s) => Client::connect(&runtime_dir(s)).await,
        None => Client::connect_default().await,
    }
    .map_err(|e| format!("the daemon: {e}"))?;
    let session = client
        .attach("deep-crossing")
        .await
        .map_err(|e| format!("attaching: {e}"))?;
    let entry = args.entry.port(args.port);
    let mut conn = session
        .connect(entry)
        .await
        .map_err(|e| format!("connecting to {entry}: {e}"))?;
    let cfg = RunConfig {
        count: args.count,
        pipeline: args.pipeline as usize,
        verify: args.verify,
        timeout: Duration::from_millis(args.timeout_ms),
    };
    let out = run(&mut conn, &model, &cfg)
        .await
        .map_err(|e| e.to_string())?;
    let _ = session.close(conn).await;
    println!(
        "deep-crossing: {} inferences through {entry}, {} in flight: latency p50 {:.1} us, p99 {:.1} us; {:.0} inferences/s",
        args.count,
        cfg.pipeline,
        out.latency_us(0.5),
        out.latency_us(0.99),
        out.per_sec()
    );
    match out.verified {
        Some(true) => println!("verified: every output equals the reference's, bit for bit"),
        Some(false) => return Err("an output differs from the reference's".into()),
        None => {}
    }
    println!("digest {} ({} outputs)", out.digest.hex(), args.count);
    if args.json {
        let v = serde_json::json!({
            "entry": entry.to_string(),
            "count": args.count,
            "pipeline": cfg.pipeline,
            "dims": model.dims(),
            "seed": args.seed,
            "nnz": args.nnz,
            "digest": out.digest.hex(),
            "verified": out.verified,
            "latency_us": { "p50": out.latency_us(0.5), "p99": out.latency_us(0.99) },
            "per_sec": out.per_sec(),
        });
        println!("{v}");
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("deep-crossing: a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(main_async(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("deep-crossing: {e}");
            ExitCode::FAILURE
        }
    }
}
