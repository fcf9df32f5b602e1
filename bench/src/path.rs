//! `path`: the whole data path of a server, as an application sees it.
//!
//! ```text
//!  this process                        uniplaned (started here, own runtime dir)
//!  ┌──────────────┐  control: Unix socket  ┌─────────────────────────────┐
//!  │ session A ───┼── data: shm rings ────►│ plane (engine | rtl) ─► echo │
//!  │   (rtt)  ◄───┼────────────────────────┼──────────────────────◄──┘   │
//!  │ session B ───┼── A' → B: one way ────►│ plane ─► session C           │
//!  └──────────────┘                        └─────────────────────────────┘
//!  beside it: `uniplane ping self` against the same daemon
//! ```
//!
//! The benchmark starts its own `uniplaned` (the binary built next to this
//! one, or `--uniplaned PATH`) on a configuration with no network
//! listeners, in a temporary runtime directory, so it never disturbs a
//! daemon already running. It then measures round trips to the daemon's
//! echo device (one message in flight) and one-way messages per second
//! between two sessions of this process, each side on its own OS thread
//! with a current-thread runtime, and runs the `uniplane` CLI's ping on
//! the same daemon for comparison.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use serde_json::{json, Value};
use uniplane_client::{Client, Connection, DataPathOptions, Session, Wait};
use uniplane_dataplane::Uid;

use crate::hist::LatencyHistogram;
use crate::BenchError;

/// Which forwarding plane the daemon runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlaneKind {
    /// The software engine.
    Engine,
    /// The simulated RTL (a daemon built with `--features rtl`).
    Rtl,
}

impl PlaneKind {
    /// The name `uniplaned --plane` takes.
    pub fn name(self) -> &'static str {
        match self {
            PlaneKind::Engine => "engine",
            PlaneKind::Rtl => "rtl",
        }
    }
}

/// How the application and the engine wait for data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitMode {
    /// Both poll without sleeping: lowest latency, a core each.
    Busy,
    /// Both spin briefly, then sleep until woken.
    Park,
}

impl WaitMode {
    /// The name `--wait` takes.
    pub fn name(self) -> &'static str {
        match self {
            WaitMode::Busy => "busy",
            WaitMode::Park => "park",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct PathConfig {
    /// Payload bytes per message.
    pub size: usize,
    /// Seconds of measurement, split between the round-trip and the
    /// one-way phases.
    pub seconds: f64,
    /// The daemon's plane.
    pub plane: PlaneKind,
    /// Waiting on both sides.
    pub wait: WaitMode,
    /// The daemon binary; next to this program when `None`.
    pub uniplaned: Option<PathBuf>,
    /// Round trips of the CLI ping run beside (0: none).
    pub ping_count: u64,
}

/// A daemon this benchmark started; stopped and cleaned up on drop.
pub struct DaemonProcess {
    child: Child,
    dir: PathBuf,
}

impl DaemonProcess {
    /// Starts `binary` on a configuration without network listeners in a
    /// fresh runtime directory and waits (at most 20 s) until its control
    /// socket answers.
    pub fn start(binary: &Path, plane: PlaneKind, wait: WaitMode) -> Result<Self, BenchError> {
        let dir = scratch_dir("path")?;
        let mode = match wait {
            WaitMode::Busy => "busy-poll",
            WaitMode::Park => "spin-then-park",
        };
        let text = format!(
            "[server]\nid = \"127.0.0.1\"\nname = \"bench\"\npeer_listen = \"127.0.0.1:0\"\n\n\
             [runtime]\ndir = \"{}\"\n\n\
             [engine]\nmax_ports = 8\nring_depth = 1024\nmode = \"{mode}\"\n\n\
             [[devices]]\nname = \"echo\"\nkind = \"echo\"\ndevice = 1\nmemory = 65536\n\n\
             [policy]\ndefault = \"allow-local\"\n",
            dir.display()
        );
        let args: &[&str] = match plane {
            PlaneKind::Engine => &[],
            PlaneKind::Rtl => &["--plane", "rtl"],
        };
        DaemonProcess::spawn(binary, dir, &text, args)
    }

    /// Starts `binary` with `config` (TOML, whose `[runtime] dir` should
    /// be `dir`) and `args`, its runtime directory and log in `dir`, which
    /// it owns from now on (removed on drop, also on failure); waits (at
    /// most 20 s) until its control socket answers.
    pub fn spawn(
        binary: &Path,
        dir: PathBuf,
        config: &str,
        args: &[&str],
    ) -> Result<Self, BenchError> {
        let file = dir.join("uniplaned.toml");
        let log = dir.join("uniplaned.log");
        let made = std::fs::File::create(&file)
            .and_then(|mut f| f.write_all(config.as_bytes()))
            .map_err(|e| config_err(&file, e))
            .and_then(|()| std::fs::File::create(&log).map_err(|e| config_err(&log, e)));
        let log_file = match made {
            Ok(f) => f,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        // The log goes to a file, not a pipe nobody reads: a chatty daemon
        // must never block on a full pipe.
        let child = Command::new(binary)
            .arg("--config")
            .arg(&file)
            .args(args)
            .env("UNIPLANE_RUNTIME_DIR", &dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn();
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(BenchError::Config(format!(
                    "starting {}: {e} (build it: cargo build --release -p uniplane-services --bin uniplaned)",
                    binary.display()
                )));
            }
        };
        let mut daemon = DaemonProcess { child, dir };
        daemon.wait_ready(Duration::from_secs(20))?;
        Ok(daemon)
    }

    /// The last lines the daemon logged (at most 2 KiB).
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("uniplaned.log")).unwrap_or_default();
        let text = text.trim();
        let mut from = text.len().saturating_sub(2048);
        while !text.is_char_boundary(from) {
            from += 1;
        }
        text[from..].to_owned()
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// The runtime directory holding its sockets.
    pub fn runtime_dir(&self) -> &Path {
        &self.dir
    }

    fn wait_ready(&mut self, limit: Duration) -> Result<(), BenchError> {
        let socket = self.dir.join(uniplane_client::CONTROL_SOCKET);
        let start = Instant::now();
        while start.elapsed() < limit {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BenchError::Config(format!(
                    "uniplaned exited ({status}): {}",
                    self.log_tail()
                )));
            }
            if std::os::unix::net::UnixStream::connect(&socket).is_ok() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(BenchError::Config(format!(
            "uniplaned did not open {} within {limit:?}",
            socket.display()
        )))
    }
}

impl Drop for DaemonProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config_err(path: &Path, e: std::io::Error) -> BenchError {
    BenchError::Config(format!("{}: {e}", path.display()))
}

/// A new, empty directory under the system's temporary directory, named
/// after `what`, this process and a counter.
pub fn scratch_dir(what: &str) -> Result<PathBuf, BenchError> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "uniplane-bench-{what}-{}-{}-{nanos}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).map_err(|e| config_err(&dir, e))?;
    Ok(dir)
}

/// A sibling binary of this program (`uniplaned`, `uniplane`).
pub fn sibling_binary(name: &str) -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let p = exe.parent()?.join(name);
    p.exists().then_some(p)
}

pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|source| BenchError::Thread {
            what: "application",
            source,
        })
}

pub(crate) fn client_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("client: {e}"))
}

pub(crate) async fn session(dir: &Path, name: &str, wait: WaitMode) -> Result<Session, BenchError> {
    let wait = match wait {
        WaitMode::Busy => Wait::Busy,
        WaitMode::Park => Wait::Park {
            spin: Duration::ZERO,
        },
    };
    Client::connect(dir)
        .await
        .map_err(client_err)?
        .attach_with(name, DataPathOptions { wait })
        .await
        .map_err(client_err)
}

/// Waits for the next message on `conn` by polling (busy) or sleeping.
pub(crate) async fn recv(conn: &mut Connection, wait: WaitMode) -> Result<Bytes, BenchError> {
    use futures_util::FutureExt;
    let next = match wait {
        WaitMode::Park => conn.recv().await,
        // Polls without sleeping, letting the session's data-path task
        // (on this same thread) run between polls.
        WaitMode::Busy => loop {
            if let Some(r) = conn.recv().now_or_never() {
                break r;
            }
            tokio::task::yield_now().await;
        },
    };
    match next {
        Some(Ok(m)) => Ok(m.payload().clone()),
        Some(Err(e)) => Err(BenchError::Link(e)),
        None => Err(BenchError::SideGone("daemon")),
    }
}

/// Round trips to the echo device, one message in flight.
fn measure_rtt(
    dir: &Path,
    cfg: &PathConfig,
    seconds: f64,
) -> Result<(LatencyHistogram, u64), BenchError> {
    let rt = runtime()?;
    rt.block_on(async {
        let s = session(dir, "bench-rtt", cfg.wait).await?;
        let echo = Uid::new([127, 0, 0, 1].into(), 1).port(7);
        let mut conn = s.connect(echo).await.map_err(client_err)?;
        let payload = Bytes::from(vec![0x5a; cfg.size]);
        let mut hist = LatencyHistogram::new();
        let warm = Instant::now() + Duration::from_millis(200);
        let end = warm + Duration::from_secs_f64(seconds);
        let mut timeouts = 0;
        loop {
            let t0 = Instant::now();
            if t0 >= end {
                break;
            }
            conn.send_bytes(payload.clone()).await?;
            match tokio::time::timeout(Duration::from_secs(1), recv(&mut conn, cfg.wait)).await {
                Ok(r) => {
                    r?;
                }
                Err(_) => {
                    timeouts += 1;
                    continue;
                }
            }
            if t0 >= warm {
                hist.record(t0.elapsed().as_nanos() as u64);
            }
        }
        drop(conn);
        Ok((hist, timeouts))
    })
}

/// One-way messages per second from one session to another.
fn measure_one_way(dir: &Path, cfg: &PathConfig, seconds: f64) -> Result<(u64, f64), BenchError> {
    const PORT: u16 = 9;
    let done = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<Uid, BenchError>>();
    let rx_dir = dir.to_owned();
    let wait = cfg.wait;
    let (done2, received2) = (done.clone(), received.clone());
    let receiver = std::thread::Builder::new()
        .name("path-receiver".into())
        .spawn(move || -> Result<(u64, f64), BenchError> {
            let rt = runtime()?;
            rt.block_on(async move {
                let s = match session(&rx_dir, "bench-sink", wait).await {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = ready_tx.send(Err(BenchError::SideGone("receiver")));
                        return Err(e);
                    }
                };
                let mut l = s.listen(PORT).await.map_err(client_err)?;
                let _ = ready_tx.send(Ok(s.uid()));
                let accepted = tokio::time::timeout(Duration::from_secs(10), l.accept()).await;
                let mut conn = accepted
                    .ok()
                    .flatten()
                    .ok_or(BenchError::SideGone("sender"))?;
                let mut n = 0u64;
                let mut first: Option<Instant> = None;
                let mut last = Instant::now();
                while !done2.load(Ordering::Relaxed) {
                    let got =
                        tokio::time::timeout(Duration::from_millis(200), recv(&mut conn, wait));
                    match got.await {
                        Ok(Ok(_)) => {
                            let now = Instant::now();
                            first.get_or_insert(now);
                            last = now;
                            n += 1;
                            if n.is_multiple_of(1024) {
                                received2.store(n, Ordering::Relaxed);
                            }
                        }
                        Ok(Err(BenchError::SideGone(_))) => break,
                        Ok(Err(e)) => return Err(e),
                        Err(_) => continue,
                    }
                }
                received2.store(n, Ordering::Relaxed);
                let span = first.map_or(0.0, |f| last.duration_since(f).as_secs_f64());
                Ok((n, span))
            })
        })
        .map_err(|source| BenchError::Thread {
            what: "receiver",
            source,
        })?;
    let sink = ready_rx
        .recv_timeout(Duration::from_secs(10))
        .map_err(|_| BenchError::SideGone("receiver"))??;
    let rt = runtime()?;
    let sent = rt.block_on(async {
        let s = session(dir, "bench-source", cfg.wait).await?;
        let mut conn = s.connect(sink.port(PORT)).await.map_err(client_err)?;
        let payload = Bytes::from(vec![0xa5; cfg.size]);
        let end = Instant::now() + Duration::from_secs_f64(seconds);
        let mut sent = 0u64;
        while Instant::now() < end {
            for _ in 0..256 {
                tokio::time::timeout(Duration::from_secs(5), conn.send_bytes(payload.clone()))
                    .await
                    .map_err(|_| {
                        BenchError::Config(format!(
                            "sending stalled for 5 s after {sent}, received {}",
                            received.load(Ordering::Relaxed)
                        ))
                    })??;
            }

            sent += 256;
        }
        // Keep the connection open while the receiver drains what is in
        // flight; then stop it.
        let settle = Instant::now();
        let mut last = u64::MAX;
        while settle.elapsed() < Duration::from_secs(2) {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = received.load(Ordering::Relaxed);
            if now == last || now >= sent {
                break;
            }
            last = now;
        }
        done.store(true, Ordering::Relaxed);
        Ok::<u64, BenchError>(sent)
    })?;
    let (n, span) = receiver
        .join()
        .map_err(|_| BenchError::Panicked("receiver"))??;
    let _ = sent;
    Ok((n, span))
}

/// `uniplane ping self` against the daemon; its JSON summary.
fn cli_ping(dir: &Path, count: u64, size: usize) -> Option<Value> {
    let cli = sibling_binary("uniplane")?;
    let out = Command::new(cli)
        .args(["ping", "self", "--json", "--interval-ms", "0"])
        .args(["--count", &count.to_string(), "--size", &size.to_string()])
        .env("UNIPLANE_RUNTIME_DIR", dir)
        .stdin(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.lines().last()?).ok()
}

/// Runs the benchmark; the `results` of its report.
pub fn run_path(cfg: &PathConfig) -> Result<Value, BenchError> {
    let binary = match &cfg.uniplaned {
        Some(p) => p.clone(),
        None => sibling_binary("uniplaned").ok_or_else(|| {
            BenchError::Config(
                "no uniplaned next to this program: cargo build --release -p uniplane-services --bin uniplaned (or pass --uniplaned PATH)".into(),
            )
        })?,
    };
    let daemon = DaemonProcess::start(&binary, cfg.plane, cfg.wait)?;
    let half = (cfg.seconds / 2.0).max(0.1);
    let (hist, timeouts) = measure_rtt(daemon.runtime_dir(), cfg, half)?;
    let (received, span) = measure_one_way(daemon.runtime_dir(), cfg, half)?;
    let ping = if cfg.ping_count > 0 {
        cli_ping(daemon.runtime_dir(), cfg.ping_count, cfg.size)
    } else {
        None
    };
    drop(daemon);
    let p = hist.percentiles();
    let msgs_per_sec = if span > 0.0 {
        received as f64 / span
    } else {
        0.0
    };
    let us = |k: &str| ping.as_ref().and_then(|v| v["rtt_us"][k].as_f64());
    Ok(json!({
        "rtt_ns": p,
        "round_trips": hist.len(),
        "rtt_timeouts": timeouts,
        "msgs_per_sec": msgs_per_sec,
        "one_way_received": received,
        "ping_rtt_ns": {
            "p50": us("p50").map(|v| v * 1000.0),
            "p99": us("p99").map(|v| v * 1000.0),
        },
    }))
}
