//! `uniplaned`: the uniplane host daemon.
//!
//! With no arguments it runs on its embedded default configuration (one
//! server, loopback stacks, an echo device); `--config FILE` runs a real
//! deployment. `--plane engine|rtl` picks the forwarding plane (the
//! file's `plane = ` otherwise; the engine by default). Logs go to stderr
//! (`RUST_LOG` filters them).

use std::path::PathBuf;

use clap::Parser;
use uniplane_services::config::{Config, DEFAULT_CONFIG};
use uniplane_services::{open_plane, Daemon, PlaneKind};

/// The uniplane host daemon.
#[derive(Parser)]
#[command(name = "uniplaned", version, about)]
struct Args {
    /// Configuration file (TOML); without it the embedded default is used.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Forwarding plane: `engine` (software) or `rtl` (the simulated RTL,
    /// in a build with `--features rtl`); overrides the file's `plane`.
    #[arg(long, value_parser = parse_plane)]
    plane: Option<PlaneKind>,
    /// Validate the configuration and exit.
    #[arg(long)]
    check: bool,
    /// Print the embedded default configuration and exit.
    #[arg(long)]
    print_default_config: bool,
}

fn parse_plane(s: &str) -> Result<PlaneKind, String> {
    s.parse()
        .map_err(|e: uniplane_services::plane::UnknownPlane| e.to_string())
}

/// Starts the daemon on the plane of `kind`: the one place where the
/// plane meets the daemon. The engine is still built by `Daemon::start`;
/// the RTL plane opens (so a build without it, or without Verilator's
/// model, says so) but the daemon cannot take a plane from outside until
/// `Daemon::start_with_plane(config, plane)` exists, which will replace
/// this match with `Daemon::start_with_plane(config, open_plane(kind, &config)?)`.
async fn start(config: Config, kind: PlaneKind) -> Result<Daemon, String> {
    match kind {
        PlaneKind::Engine => Daemon::start(config).await.map_err(|e| e.to_string()),
        PlaneKind::Rtl => {
            let _plane = open_plane(kind, &config)?;
            Err(
                "the RTL plane opened, but this daemon cannot run on it yet \
                 (it needs Daemon::start_with_plane); use --plane engine"
                    .to_owned(),
            )
        }
    }
}

fn main() -> std::process::ExitCode {
    // Read buffers freed and allocated again must not cost page faults
    // (see uniplane_stacks::alloc).
    uniplane_stacks::alloc::retain_freed_memory();
    let args = Args::parse();
    if args.print_default_config {
        print!("{DEFAULT_CONFIG}");
        return std::process::ExitCode::SUCCESS;
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match &args.config {
        Some(path) => Config::load(path),
        None => Config::embedded(),
    };
    let mut config = match config {
        Ok(c) => c,
        Err(e) => {
            eprintln!("uniplaned: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    if let Some(plane) = args.plane {
        config.plane = plane;
    }
    if args.check {
        println!(
            "configuration is valid: server {}, {} plane, {} stacks, {} devices, {} peers",
            config.server,
            config.plane,
            config.stacks.len(),
            config.devices.len(),
            config.peers.len()
        );
        return std::process::ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uniplaned: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let kind = config.plane;
        let daemon = match start(config, kind).await {
            Ok(d) => d,
            Err(e) => {
                eprintln!("uniplaned: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        eprintln!(
            "uniplaned: server {} ready; control socket in {} (try `uniplane status` and `uniplane ping self`)",
            daemon.server(),
            daemon.runtime_dir().display()
        );
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("uniplaned: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        daemon.shutdown();
        eprintln!("uniplaned: stopped");
        std::process::ExitCode::SUCCESS
    })
}
