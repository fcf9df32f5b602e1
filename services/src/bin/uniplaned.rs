//! `uniplaned`: the uniplane host daemon.
//!
//! With no arguments it runs on its embedded default configuration (one
//! server, loopback stacks, an echo device); `--config FILE` runs a real
//! deployment, and `--cluster FILE` its server's part of a cluster file
//! (the server named by `--server-id`, else the first whose ID is an
//! address of this host). `--plane engine|rtl` picks the forwarding plane (the
//! file's `plane = ` otherwise; the engine by default). Logs go to stderr
//! (`RUST_LOG` filters them; colour only on a terminal; `--log-format
//! json` for log collectors).
//!
//! Under systemd (`Type=notify`, the unit in `packaging/`) it says
//! `READY=1` once its sockets answer; SIGHUP re-reads its file and
//! applies the access rules live (anything else that changed is refused
//! and named in the log); SIGTERM or Ctrl-C closes every connection with
//! a notice to its processes and peers, then exits.

use std::io::IsTerminal;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use uniplane_services::cluster::Cluster;
use uniplane_services::config::{Config, DEFAULT_CONFIG};
use uniplane_services::{Daemon, PlaneKind};

/// The uniplane host daemon.
#[derive(Parser)]
#[command(name = "uniplaned", version)]
struct Args {
    /// Configuration file (TOML); without it the embedded default is used.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Cluster file (TOML) every server of the cluster reads: this
    /// daemon runs its server's part.
    #[arg(long, conflicts_with = "config", value_name = "FILE")]
    cluster: Option<PathBuf>,
    /// Which server of `--cluster` this is; default: the first whose ID
    /// is an address of this host.
    #[arg(long, requires = "cluster", value_name = "IP")]
    server_id: Option<Ipv4Addr>,
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
    /// Log lines as `text` (coloured only on a terminal) or `json` (one
    /// object per line, for log collectors).
    #[arg(long, value_enum, default_value = "text")]
    log_format: LogFormat,
    /// Write the manual page and shell completions into DIR and exit
    /// (for packaging).
    #[arg(long, hide = true, value_name = "DIR")]
    generate_manual: Option<PathBuf>,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// How long a stopping daemon waits for its close notices to leave.
const STOP_WITHIN: Duration = Duration::from_secs(2);

/// Tells the service manager (systemd's `NOTIFY_SOCKET`), when there is
/// one, how the daemon stands; nothing otherwise.
fn notify(state: &[sd_notify::NotifyState]) {
    if let Err(e) = sd_notify::notify(false, state) {
        tracing::warn!("telling the service manager: {e}");
    }
}

fn parse_plane(s: &str) -> Result<PlaneKind, String> {
    s.parse()
        .map_err(|e: uniplane_services::plane::UnknownPlane| e.to_string())
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
    if let Some(dir) = &args.generate_manual {
        use clap::CommandFactory;
        return match uniplane_services::manual::write(Args::command(), "8", dir) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("uniplaned: writing the manual into {}: {e}", dir.display());
                std::process::ExitCode::FAILURE
            }
        };
    }
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        LogFormat::Json => logs.json().init(),
    }
    let mut config = match load(&args) {
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
        if let Err(e) = uniplane_services::plane::check_kernels(&config, config.plane) {
            eprintln!("uniplaned: {e}");
            return std::process::ExitCode::from(2);
        }
        let of_cluster = match &args.cluster {
            Some(path) => format!(" ({} of {})", config.name, path.display()),
            None => String::new(),
        };
        println!(
            "configuration is valid: server {}{of_cluster}, {} plane, {} stacks, {} devices, {} peers",
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
        let daemon = match Daemon::start(config).await {
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
        use tokio::signal::unix::{signal, SignalKind};
        let (mut term, mut hup) = match (signal(SignalKind::terminate()), signal(SignalKind::hangup())) {
            (Ok(t), Ok(h)) => (t, h),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("uniplaned: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        notify(&[sd_notify::NotifyState::Ready]);
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = hup.recv() => {
                    notify(&[sd_notify::NotifyState::Reloading]);
                    reload(&daemon, &args).await;
                    notify(&[sd_notify::NotifyState::Ready]);
                }
            }
        }
        notify(&[sd_notify::NotifyState::Stopping]);
        daemon.stop(STOP_WITHIN).await;
        eprintln!("uniplaned: stopped");
        std::process::ExitCode::SUCCESS
    })
}

/// The configuration the arguments name: `--config`'s file, this
/// server's part of `--cluster`'s, or the embedded default.
fn load(args: &Args) -> Result<Config, String> {
    if let Some(path) = &args.cluster {
        return cluster_part(path, args.server_id);
    }
    match &args.config {
        Some(path) => Config::load(path),
        None => Config::embedded(),
    }
    .map_err(|e| e.to_string())
}

/// Server `server_id`'s part of the cluster file at `path` (without
/// `server_id`, the first server whose ID is an address of this host).
fn cluster_part(path: &Path, server_id: Option<Ipv4Addr>) -> Result<Config, String> {
    let cluster = Cluster::load(path).map_err(|e| e.to_string())?;
    let id = match server_id.or_else(|| cluster.server_here()) {
        Some(id) => id,
        None => {
            let ids: Vec<String> = cluster
                .servers
                .iter()
                .map(|s| s.config.server.to_string())
                .collect();
            return Err(format!(
                "{}: no server of cluster `{}` has an address of this host (its servers: {}); \
                 name this one with --server-id",
                path.display(),
                cluster.name,
                ids.join(", ")
            ));
        }
    };
    cluster
        .config_for(id)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Re-reads the configuration file and applies what may change live; a
/// file that does not parse, or that changes more, leaves all as it was.
async fn reload(daemon: &Daemon, args: &Args) {
    let Some(path) = args.cluster.as_deref().or(args.config.as_deref()) else {
        tracing::warn!("reload: running on the embedded default, no file to re-read");
        return;
    };
    // The same server as at start, even where `--server-id` was not
    // given.
    let reread = match &args.cluster {
        Some(_) => cluster_part(path, Some(daemon.server())),
        None => Config::load(path).map_err(|e| e.to_string()),
    };
    let mut new = match reread {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("reload refused, nothing changed: {e}");
            return;
        }
    };
    // `--plane` on the command line still holds.
    if let Some(plane) = args.plane {
        new.plane = plane;
    }
    match daemon.reload(&new).await {
        Ok(()) => tracing::info!(
            rules = new.rules.len(),
            file = %path.display(),
            "reloaded: access rules applied"
        ),
        Err(e) => tracing::error!(file = %path.display(), "reload refused: {e}"),
    }
}
