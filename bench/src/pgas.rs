//! `pgas`: uniplane-pgas operations between two endpoints, next to the
//! same operations in OpenSHMEM, on the same sizes, in one run.
//!
//! ```text
//!  uniplane side                                   peer: OpenSHMEM (oshrun -n 2)
//!  ┌ rank 0 thread ┐  shm   ┌──────────┐  shm   ┌ rank 1 thread ┐    ┌ PE 0 ┐ symmetric heap ┌ PE 1 ┐
//!  │ Endpoint      ├───────►│uniplaned ├───────►│ Endpoint      │    │      ├───────────────►│      │
//!  └───────────────┘◄───────┴──────────┴◄───────└───────────────┘    └──────┘◄───────────────└──────┘
//! ```
//!
//! Operations (`--op`), each timed at rank 0, median over the rounds:
//!
//! - `short`: a short active message and its reply (round trip).
//! - `put`: put-with-signal round trip: rank 0 puts `size` bytes into
//!   rank 1's segment with a signal; rank 1 waits for the signal and puts
//!   the same back. OpenSHMEM 1.4 has no put-with-signal, so its side is
//!   put, fence, atomic set of a flag, and `wait_until` on the flag.
//! - `get`: a get of `size` bytes (`shmem_getmem`).
//! - `atomic`: a 64-bit fetch-add at rank 1 (`shmem_long_atomic_fetch_add`).
//! - `put-quiet`: a long message and its completion (`shmem_putmem` +
//!   `shmem_quiet`).
//! - `window`: the same bytes written with the client library's one-sided
//!   WRITEs into a memory window of rank 1 (64 KiB − 1 per WRITE, 4 in
//!   flight), each completed: the alternative to long messages, measured
//!   to choose between them (against `shmem_putmem` + `shmem_quiet`).
//!
//! With `--target hardware` rank 1 is a hardware endpoint: a
//! `pgas-target` kernel device of the daemon (segments in the kernel's own
//! memory, the counter and atomics built in), which rank 0 reaches over
//! one data connection. A kernel does not initiate, so only the
//! operations that rank 1 answers run there: `short`, `get`, `atomic` and
//! `put-quiet`.
//!
//! The daemon is a `uniplaned` process started here (the one next to this
//! program); each rank runs on its own OS thread with a current-thread
//! tokio runtime. With `--stack tcp|ltl|udp` rank 1 (software or
//! hardware) is on a second `uniplaned`, the two peered over a tunnel of
//! that stack on loopback (as `tunnel` starts them): the placement across
//! servers. The OpenSHMEM program is compiled here with `oshcc` and
//! run with `oshrun --mca osc ^rdma --oversubscribe -n 2` (without the
//! `osc` exclusion every program segfaults in `shmem_finalize`); where
//! either tool is missing, its column is null.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};
use tokio::sync::oneshot;
use uniplane_client::{Client, DataPathOptions, Wait};
use uniplane_dataplane::Uid;
use uniplane_pgas::{
    Acl, AtomicOp, Call, Completion, DirectStats, Endpoint, Group, Options, Width,
};

use crate::hist::LatencyHistogram;
use crate::path::{runtime, scratch_dir, sibling_binary, DaemonProcess, PlaneKind, WaitMode};
use crate::tunnel::{DaemonPair, TunnelStack, SERVER_B};
use crate::BenchError;

/// The operation measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgasOp {
    /// Short active message round trip.
    Short,
    /// Put-with-signal round trip.
    Put,
    /// Get.
    Get,
    /// 64-bit fetch-add.
    Atomic,
    /// Long message and its completion.
    PutQuiet,
    /// One-sided WRITEs into a window, completed.
    Window,
}

impl PgasOp {
    /// Its name on the command line and in the OpenSHMEM program.
    pub fn name(self) -> &'static str {
        match self {
            PgasOp::Short => "short",
            PgasOp::Put => "put",
            PgasOp::Get => "get",
            PgasOp::Atomic => "atomic",
            PgasOp::PutQuiet => "put-quiet",
            PgasOp::Window => "window",
        }
    }

    /// Whether the payload size matters.
    fn sized(self) -> bool {
        !matches!(self, PgasOp::Short | PgasOp::Atomic)
    }

    /// Whether a hardware rank 1 can take part: it answers, it never
    /// sends on its own, and it has no client-library window.
    fn answered(self) -> bool {
        !matches!(self, PgasOp::Put | PgasOp::Window)
    }
}

/// What rank 1 is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PgasTarget {
    /// An endpoint of a client session, like rank 0.
    Software,
    /// A `pgas-target` kernel device of the daemon.
    Hardware,
}

impl PgasTarget {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            PgasTarget::Software => "software",
            PgasTarget::Hardware => "hardware",
        }
    }
}

/// `UCX_TLS` of the OpenSHMEM side when uniplane's ranks talk through a
/// tunnel: TCP between the PEs, as the issue's "OpenSHMEM over TCP".
const OPENSHMEM_TCP: &str = "tcp,self";

/// The device number of the hardware rank's kernel.
const KERNEL_DEVICE: u16 = 2;

/// The daemons a run starts, kept until it ends.
enum Daemons {
    /// Both ranks on one daemon (`--stack shm`).
    One(DaemonProcess),
    /// Rank 0 on the first, rank 1 on the second, peered over a tunnel.
    Pair(DaemonPair),
}

impl Daemons {
    /// Rank 0's daemon's runtime directory, rank 1's, and the UID a
    /// hardware rank 1 has.
    fn places(&self) -> (&Path, &Path, Uid) {
        match self {
            Daemons::One(d) => (
                d.runtime_dir(),
                d.runtime_dir(),
                Uid::new(Ipv4Addr::LOCALHOST, KERNEL_DEVICE),
            ),
            Daemons::Pair(p) => (
                p.a.runtime_dir(),
                p.b.runtime_dir(),
                Uid::new(SERVER_B, KERNEL_DEVICE),
            ),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct PgasConfig {
    /// The operation.
    pub op: PgasOp,
    /// Payload sizes (ignored by `short` and `atomic`, which run once).
    pub sizes: Vec<usize>,
    /// How the daemon and the sessions wait.
    pub wait: WaitMode,
    /// The daemon binary; next to this program when `None`.
    pub uniplaned: Option<PathBuf>,
    /// Run the OpenSHMEM side.
    pub openshmem: bool,
    /// Share the segments between ranks of one server
    /// (`uniplane_pgas::Options::share`).
    pub share: bool,
    /// What rank 1 is.
    pub target: PgasTarget,
    /// `None`: both ranks on one daemon, over shared memory; else rank 1
    /// on a second daemon, its peer over a tunnel of this stack.
    pub tunnel: Option<TunnelStack>,
}

/// The largest size `--sizes` takes.
pub const MAX_PGAS_SIZE: usize = 16 << 20;

/// The sizes of `--sizes` (up to [`MAX_PGAS_SIZE`]): see
/// [`crate::sizes::parse_byte_sizes`].
pub fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    crate::sizes::parse_byte_sizes(text, MAX_PGAS_SIZE)
}

/// Rounds measured at `size` (after a few warm-up rounds); the same
/// count on both sides.
fn rounds(size: usize) -> usize {
    match size {
        s if s >= 1 << 20 => 50,
        s if s >= 64 << 10 => 200,
        _ => 2000,
    }
}

const WARMUP: usize = 10;

/// Each rank's credit at the other (`Options::credit_bytes`).
const CREDIT_BYTES: u32 = 512 << 10;

fn err(what: impl std::fmt::Display) -> BenchError {
    BenchError::Config(format!("pgas: {what}"))
}

/// Runs `cfg`: `{ points: [{size, uniplane_us, openshmem_us}], rtt_ns }`.
pub fn run_pgas(cfg: &PgasConfig) -> Result<Value, BenchError> {
    let sizes: Vec<usize> = if cfg.op.sized() {
        cfg.sizes.clone()
    } else {
        vec![8]
    };
    let max = sizes.iter().copied().max().unwrap_or(8).max(8);
    let binary = match &cfg.uniplaned {
        Some(p) => p.clone(),
        None => {
            sibling_binary("uniplaned").ok_or_else(|| err("no uniplaned next to this program"))?
        }
    };
    let hardware = cfg.target == PgasTarget::Hardware;
    if hardware && !cfg.op.answered() {
        return Err(err(format!(
            "--op {} needs rank 1 to send or to have a window: a hardware rank (a kernel) only answers; use short, get, atomic or put-quiet",
            cfg.op.name()
        )));
    }
    let kernel = if hardware {
        kernel_device(cfg.wait, max)
    } else {
        String::new()
    };
    // Before any daemon runs: nothing else on the machine then.
    let memcpy: Vec<f64> = sizes.iter().map(|&s| memcpy_us(s, max)).collect();
    let daemons = match cfg.tunnel {
        None if hardware => Daemons::One(hardware_daemon(&binary, cfg.wait, &kernel)?),
        None => Daemons::One(DaemonProcess::start(&binary, PlaneKind::Engine, cfg.wait)?),
        Some(stack) => Daemons::Pair(DaemonPair::start_with(&binary, stack, &kernel)?),
    };
    let (uniplane, rtt, direct) = measure_uniplane(cfg, daemons.places(), &sizes, max)?;
    // The daemons stop before the OpenSHMEM side runs.
    drop(daemons);
    let shmem = if cfg.openshmem {
        match measure_openshmem(cfg.op, &sizes, cfg.tunnel.is_some()) {
            Ok(v) => Some(v),
            Err(e) => {
                eprintln!("OpenSHMEM side not run: {e}");
                None
            }
        }
    } else {
        None
    };
    let points: Vec<Value> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            json!({
                "size": size,
                "uniplane_us": uniplane[i],
                "openshmem_us": shmem.as_ref().and_then(|s| s.get(i).copied()),
                "memcpy_us": memcpy[i],
                // The bandwidth of ours as a share of one memcpy's.
                "vs_memcpy": memcpy[i] / uniplane[i].max(1e-9),
            })
        })
        .collect();
    let stack = cfg.tunnel.map_or("shm", TunnelStack::name);
    let openshmem_transport = if cfg.tunnel.is_some() {
        format!("UCX_TLS={OPENSHMEM_TCP}")
    } else {
        "UCX's default (shared memory between the two PEs)".into()
    };
    let mut out = json!({
        "op": cfg.op.name(),
        "target": cfg.target.name(),
        "stack": stack,
        "openshmem_transport": openshmem_transport,
        "points": points,
        // What the ranks moved themselves through each other's shared
        // segments.
        "direct": {
            "puts": direct.puts,
            "gets": direct.gets,
            "bytes": direct.bytes,
        },
    });
    if cfg.op == PgasOp::Short {
        out["rtt_ns"] = json!({
            "p50": rtt.quantile(0.5),
            "p90": rtt.quantile(0.9),
            "p99": rtt.quantile(0.99),
        });
    }
    Ok(out)
}

/// Median µs of one `memcpy` of `size` bytes between two buffers of
/// `max` (touched first), over as many rounds as the sides measure: the
/// yardstick of a long message on one server.
fn memcpy_us(size: usize, max: usize) -> f64 {
    let src = vec![0xa5u8; max];
    // Written once, so no round pays for the pages' first touch.
    let mut dst = vec![1u8; max];
    let mut times: Vec<f64> = (0..WARMUP + rounds(size))
        .map(|_| {
            let t0 = Instant::now();
            dst[..size].copy_from_slice(std::hint::black_box(&src[..size]));
            std::hint::black_box(&mut dst);
            t0.elapsed().as_secs_f64() * 1e6
        })
        .skip(WARMUP)
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// The `pgas-target` kernel of a hardware rank 1: device
/// [`KERNEL_DEVICE`], one segment of `max` bytes, its thread waiting as
/// the sessions do.
fn kernel_device(wait: WaitMode, max: usize) -> String {
    let kernel_wait = match wait {
        WaitMode::Busy => "busy",
        WaitMode::Park => "park",
    };
    format!(
        "\n[[devices]]\nname = \"pgas-rank1\"\nkind = \"kernel\"\ndevice = {KERNEL_DEVICE}\n\
         backend = \"emulated\"\nfunction = \"pgas-target\"\nwait = \"{kernel_wait}\"\n\
         params = {{ segments = 1, segment_bytes = {max} }}\n"
    )
}

/// One daemon with `kernel` (a `[[devices]]` table) among its devices.
fn hardware_daemon(
    binary: &Path,
    wait: WaitMode,
    kernel: &str,
) -> Result<DaemonProcess, BenchError> {
    let dir = scratch_dir("pgas")?;
    let mode = match wait {
        WaitMode::Busy => "busy-poll",
        WaitMode::Park => "spin-then-park",
    };
    let text = format!(
        "[server]\nid = \"127.0.0.1\"\nname = \"bench\"\npeer_listen = \"127.0.0.1:0\"\n\n\
         [runtime]\ndir = \"{}\"\n\n\
         [engine]\nmax_ports = 8\nring_depth = 1024\nmode = \"{mode}\"\n\n\
         [policy]\ndefault = \"allow-local\"\n{kernel}",
        dir.display()
    );
    DaemonProcess::spawn(binary, dir, &text, &[])
}

async fn endpoint(
    dir: &Path,
    name: &str,
    wait: WaitMode,
    max: usize,
    share: bool,
) -> Result<Endpoint, String> {
    let wait = match wait {
        WaitMode::Busy => Wait::Busy,
        // Spinning needs a core per poller: the two ranks and the
        // engine on 2 cores starve each other (see docs/benchmarks.md).
        WaitMode::Park => Wait::Park {
            spin: Duration::ZERO,
        },
    };
    let session = Client::connect(dir)
        .await
        .map_err(|e| e.to_string())?
        .attach_with(name, DataPathOptions { wait })
        .await
        .map_err(|e| e.to_string())?;
    // Two ranks: each may fill half of the other's 1 MiB ring.
    let options = Options {
        credit_bytes: CREDIT_BYTES,
        get_window: 8,
        share,
        ..Options::default()
    };
    let ep = Endpoint::bind(session, options)
        .await
        .map_err(|e| e.to_string())?;
    ep.register_segment(max, Acl::ReadWrite);
    Ok(ep)
}

/// Medians in µs per size, and the histogram of the last size (ns).
fn measure_uniplane(
    cfg: &PgasConfig,
    (dir, dir1, kernel): (&Path, &Path, Uid),
    sizes: &[usize],
    max: usize,
) -> Result<(Vec<f64>, LatencyHistogram, DirectStats), BenchError> {
    let (uid_tx, uid_rx) = std_mpsc::channel();
    let (group_tx, group_rx) = std_mpsc::channel::<Group>();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let op = cfg.op;
    let wait = cfg.wait;
    let share = cfg.share;
    let dir1 = dir1.to_owned();
    let sizes1 = sizes.to_vec();
    let hardware = cfg.target == PgasTarget::Hardware;
    if hardware {
        // The kernel is rank 1: no second session.
        uid_tx.send(kernel).map_err(err)?;
    }
    let responder = (!hardware).then(|| {
        std::thread::spawn(move || -> Result<DirectStats, String> {
            let rt = runtime().map_err(|e| e.to_string())?;
            rt.block_on(async move {
                let ep = endpoint(&dir1, "pgas-rank1", wait, max, share).await?;
                // The first window of a session starts at address 0.
                let _window = ep.session().register_window(max);
                uid_tx.send(ep.uid()).map_err(|e| e.to_string())?;
                let group = tokio::task::spawn_blocking(move || group_rx.recv())
                    .await
                    .map_err(|e| e.to_string())?
                    .map_err(|e| e.to_string())?;
                ep.join(group).await.map_err(|e| e.to_string())?;
                if op == PgasOp::Put {
                    let data = vec![0x5a; max];
                    let mut seq = 0u64;
                    for &size in &sizes1 {
                        for _ in 0..WARMUP + rounds(size) {
                            seq += 1;
                            ep.wait_counter_from(0, seq).await;
                            ep.long(0, 0, 0, &data[..size], Call::counter(1), Completion::Async)
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                    }
                }
                let _ = stop_rx.await;
                Ok(ep.direct_stats())
            })
        })
    });
    let rt = runtime()?;
    let result =
        rt.block_on(async {
            let ep = endpoint(dir, "pgas-rank0", wait, max, share)
                .await
                .map_err(err)?;
            let other =
                tokio::task::spawn_blocking(move || uid_rx.recv_timeout(Duration::from_secs(20)))
                    .await
                    .map_err(err)?
                    .map_err(|_| err("rank 1 did not start"))?;
            let mut group = Group::new(vec![ep.uid(), other]);
            if hardware {
                group = group.with_hardware([1]);
            } else {
                group_tx.send(group.clone()).map_err(err)?;
            }
            ep.join(group).await.map_err(err)?;
            let data = vec![0xa5; max];
            // Where gets land, as OpenSHMEM's `getmem` fills a buffer.
            let mut sink = vec![0u8; max];
            let mut medians = Vec::new();
            let mut hist = LatencyHistogram::new();
            let mut seq = 0u64;
            let mut replies = 0u64;
            for &size in sizes {
                hist = LatencyHistogram::new();
                let mut times = Vec::with_capacity(rounds(size));
                for round in 0..WARMUP + rounds(size) {
                    let t0 = Instant::now();
                    match op {
                        PgasOp::Short => {
                            ep.short(1, Call::NONE, Completion::Reply)
                                .await
                                .map_err(err)?;
                            replies += 1;
                            ep.wait_replies(replies).await.map_err(err)?;
                        }
                        PgasOp::Put => {
                            seq += 1;
                            ep.long(1, 0, 0, &data[..size], Call::counter(1), Completion::Async)
                                .await
                                .map_err(err)?;
                            ep.wait_counter_from(1, seq).await;
                        }
                        PgasOp::Get => {
                            ep.get_into(1, 0, 0, &mut sink[..size]).await.map_err(err)?;
                        }
                        PgasOp::Atomic => {
                            ep.atomic(1, 0, 0, Width::W64, AtomicOp::FetchAdd(1))
                                .await
                                .map_err(err)?;
                        }
                        PgasOp::PutQuiet => {
                            ep.long(1, 0, 0, &data[..size], Call::NONE, Completion::Async)
                                .await
                                .map_err(err)?;
                            ep.quiet().await.map_err(err)?;
                        }
                        PgasOp::Window => {
                            let session = ep.session();
                            let writes = data[..size].chunks(u16::MAX as usize).enumerate().map(
                                |(i, chunk)| {
                                    let at = other.at((i * u16::MAX as usize) as u64);
                                    session.write(at, bytes::Bytes::copy_from_slice(chunk))
                                },
                            );
                            futures_util::stream::iter(writes)
                                .buffered(4)
                                .try_collect::<Vec<()>>()
                                .await
                                .map_err(err)?;
                        }
                    }
                    if round >= WARMUP {
                        let ns = t0.elapsed().as_nanos() as u64;
                        times.push(ns);
                        hist.record(ns);
                    }
                }
                times.sort_unstable();
                medians.push(times[times.len() / 2] as f64 / 1000.0);
            }
            ep.quiet().await.map_err(err)?;
            Ok::<_, BenchError>((medians, hist, ep.direct_stats()))
        });
    let _ = stop_tx.send(());
    let joined = match responder {
        Some(r) => r.join().map_err(|_| err("rank 1 panicked"))?,
        None => Ok(DirectStats::default()),
    };
    let (medians, hist, mut direct) = result?;
    let theirs = joined.map_err(err)?;
    direct.puts += theirs.puts;
    direct.gets += theirs.gets;
    direct.bytes += theirs.bytes;
    Ok((medians, hist, direct))
}

/// The OpenSHMEM program: `prog OP SIZE…` prints `size median_us` lines
/// at PE 0, with the same rounds as the uniplane side.
const SHMEM_C: &str = r#"
#include <shmem.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int rounds(size_t size) {
    if (size >= (1u << 20)) return 50;
    if (size >= (64u << 10)) return 200;
    return 2000;
}

int main(int argc, char **argv) {
    shmem_init();
    int me = shmem_my_pe();
    const char *op = argv[1];
    size_t max = 8;
    for (int a = 2; a < argc; a++) {
        size_t s = strtoull(argv[a], 0, 10);
        if (s > max) max = s;
    }
    char *buf = shmem_malloc(max);
    char *src = malloc(max);
    memset(src, 0xa5, max);
    long *flag = shmem_malloc(sizeof(long));
    long *ctr = shmem_malloc(sizeof(long));
    *flag = 0;
    *ctr = 0;
    shmem_barrier_all();
    long seq = 0;
    for (int a = 2; a < argc; a++) {
        size_t size = strtoull(argv[a], 0, 10);
        int n = rounds(size), warm = 10;
        double *t = malloc(sizeof(double) * n);
        for (int i = 0; i < warm + n; i++) {
            double t0 = now_us();
            if (!strcmp(op, "put")) {
                seq++;
                if (me == 0) {
                    shmem_putmem(buf, src, size, 1);
                    shmem_fence();
                    shmem_long_atomic_set(flag, seq, 1);
                    shmem_long_wait_until(flag, SHMEM_CMP_EQ, seq);
                } else {
                    shmem_long_wait_until(flag, SHMEM_CMP_EQ, seq);
                    shmem_putmem(buf, src, size, 0);
                    shmem_fence();
                    shmem_long_atomic_set(flag, seq, 0);
                }
            } else if (me == 0) {
                if (!strcmp(op, "get")) shmem_getmem(src, buf, size, 1);
                else if (!strcmp(op, "atomic")) shmem_long_atomic_fetch_add(ctr, 1, 1);
                else {
                    /* put-quiet, window: put and completion */
                    shmem_putmem(buf, src, size, 1);
                    shmem_quiet();
                }
            }
            if (i >= warm) t[i - warm] = now_us() - t0;
        }
        qsort(t, n, sizeof(double), cmp);
        if (me == 0) printf("%zu %.3f\n", size, t[n / 2]);
        free(t);
        shmem_barrier_all();
    }
    fflush(stdout);
    shmem_finalize();
    return 0;
}
"#;

/// Medians in µs per size from the OpenSHMEM program.
fn measure_openshmem(op: PgasOp, sizes: &[usize], over_tcp: bool) -> Result<Vec<f64>, String> {
    if op == PgasOp::Short {
        return Err("OpenSHMEM has no active messages".into());
    }
    let dir = scratch_dir("oshmem").map_err(|e| e.to_string())?;
    let result = (|| {
        let src = dir.join("pgas_peer.c");
        let prog = dir.join("pgas_peer");
        std::fs::write(&src, SHMEM_C).map_err(|e| e.to_string())?;
        let cc = Command::new("oshcc")
            .arg("-O2")
            .arg("-o")
            .arg(&prog)
            .arg(&src)
            .output()
            .map_err(|e| format!("oshcc: {e} (install openmpi-bin and libopenmpi-dev)"))?;
        if !cc.status.success() {
            return Err(format!(
                "oshcc failed: {}",
                String::from_utf8_lossy(&cc.stderr)
            ));
        }
        let mut run = Command::new("oshrun");
        run.args(["--mca", "osc", "^rdma", "--oversubscribe", "-n", "2"])
            .arg(&prog)
            .arg(op.name())
            .args(sizes.iter().map(|s| s.to_string()))
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        if over_tcp {
            // OpenSHMEM's UCX layer over TCP sockets only: the peer of a
            // run whose ranks talk through a tunnel.
            run.env("UCX_TLS", OPENSHMEM_TCP);
        }
        let out = run.output().map_err(|e| format!("oshrun: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "oshrun failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let mut medians = Vec::new();
        for line in text.lines() {
            let mut w = line.split_whitespace();
            if let (Some(_), Some(us), None) = (w.next(), w.next(), w.next()) {
                if let Ok(us) = us.parse::<f64>() {
                    medians.push(us);
                }
            }
        }
        if medians.len() != sizes.len() {
            return Err(format!("unexpected OpenSHMEM output: {text}"));
        }
        Ok(medians)
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
