//! `collectives`: OSU-style latency of one collective through
//! uniplane-collectives, beside OpenMPI and MPICH on the same sizes and
//! rank counts, in one run.
//!
//! ```text
//!  uniplane side                                   reference side (one mpirun each)
//!  ┌ rank threads (one runtime each) ┐  shm  ┌─────────┐   osu.c built here with mpicc.openmpi
//!  │ 0 … N-1, each a session         ├──────►│uniplaned│   and mpicc.mpich, int32 elements,
//!  └─────────────────────────────────┘       └─────────┘   the same sizes and iterations
//! ```
//!
//! Per size: a warm-up, a barrier, then `iterations` timed calls. `avg`
//! is the mean over ranks of each rank's mean latency (as OSU reports),
//! `p50` rank 0's median; CPU per operation is the CPU time of every
//! rank per call (the daemon's is not counted on the uniplane side).
//! Reductions are int32 sums. The size is bytes per rank's buffer (per
//! block for allgather and alltoall, as OSU counts them).
//!
//! Both MPI libraries busy-poll; the uniplane side busy-polls too with
//! `--wait busy` (sessions and engine), or parks with `--wait park`.
//! `--stack shm` runs one daemon; `tcp` and `ltl` run two, peered over
//! that tunnel on loopback, with the ranks alternating between them
//! (OpenMPI then uses its TCP transport, `--mca btl tcp,self`).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use uniplane_client::{Client, Wait};
use uniplane_collectives::{Communicator, Op, Options, WorldSpec};

use crate::path::{scratch_dir, sibling_binary, DaemonProcess, PlaneKind, WaitMode};
use crate::BenchError;

/// The reference program, compiled at run time.
const OSU_C: &str = include_str!("collectives/osu.c");

/// Which collective to time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollOp {
    /// Allreduce, int32 sum.
    Allreduce,
    /// Broadcast from rank 0.
    Bcast,
    /// Reduce to rank 0, int32 sum.
    Reduce,
    /// Allgather.
    Allgather,
    /// All-to-all.
    Alltoall,
    /// Barrier (sizes ignored: one row of size 0).
    Barrier,
}

impl CollOp {
    /// The name on the command line and in osu.c.
    pub fn name(self) -> &'static str {
        match self {
            CollOp::Allreduce => "allreduce",
            CollOp::Bcast => "bcast",
            CollOp::Reduce => "reduce",
            CollOp::Allgather => "allgather",
            CollOp::Alltoall => "alltoall",
            CollOp::Barrier => "barrier",
        }
    }

    /// From its name.
    pub fn parse(s: &str) -> Option<CollOp> {
        [
            CollOp::Allreduce,
            CollOp::Bcast,
            CollOp::Reduce,
            CollOp::Allgather,
            CollOp::Alltoall,
            CollOp::Barrier,
        ]
        .into_iter()
        .find(|o| o.name() == s)
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct CollConfig {
    /// The collective.
    pub op: CollOp,
    /// Ranks.
    pub ranks: usize,
    /// Bytes per rank (per block for allgather/alltoall).
    pub sizes: Vec<usize>,
    /// Timed calls per size (0: 1000 up to 8 KiB, 200 up to 256 KiB,
    /// 40 above).
    pub iterations: usize,
    /// Waiting of the uniplane side.
    pub wait: WaitMode,
    /// The daemon binary; next to this program when `None`.
    pub uniplaned: Option<PathBuf>,
    /// Also run OpenMPI and MPICH (when installed).
    pub mpi: bool,
    /// Eager threshold of the uniplane side (None: the default).
    pub eager_threshold: Option<usize>,
    /// `shm`: one daemon; `tcp` or `ltl`: two daemons peered over that
    /// tunnel on loopback, ranks alternating between them (and OpenMPI
    /// over its TCP transport, MPICH not run).
    pub stack: String,
    /// Also run the uniplane side with allreduce and reduce through a
    /// reduction operator endpoint (its own session of the first daemon),
    /// in the same invocation as the plain path.
    pub operator: bool,
}

/// The operator endpoint's name in the benchmark.
const OPERATOR: &str = "coll-op-bench";

/// The sizes of `--sizes` (up to 64 MiB): see
/// [`crate::sizes::parse_byte_sizes`].
pub fn parse_sizes(text: &str) -> Result<Vec<usize>, String> {
    crate::sizes::parse_byte_sizes(text, 64 << 20)
}

fn iterations(cfg: &CollConfig, size: usize) -> usize {
    match (cfg.iterations, size) {
        (0, s) if s <= 8 * 1024 => 1000,
        (0, s) if s <= 256 * 1024 => 200,
        (0, _) => 40,
        (n, _) => n,
    }
}

/// One size's figures.
#[derive(Clone, Copy, Debug, Default)]
struct Point {
    avg_us: f64,
    p50_us: f64,
    cpu_us: f64,
}

fn find_tool(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}

/// Runs the uniplane side; the figures per size, in order.
fn run_uniplane(
    cfg: &CollConfig,
    sizes: &[usize],
    operator: bool,
) -> Result<Vec<Point>, BenchError> {
    let binary = cfg
        .uniplaned
        .clone()
        .or_else(|| sibling_binary("uniplaned"))
        .ok_or_else(|| {
            BenchError::Config(
                "no uniplaned next to this program: build it, or pass --uniplaned".into(),
            )
        })?;
    let daemons = start_daemons(&binary, cfg)?;
    let dirs: Vec<PathBuf> = daemons.iter().map(|d| d.runtime_dir().to_owned()).collect();
    // The operator endpoint runs on a thread of its own until `stop` drops.
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    if operator {
        let dir = dirs[0].clone();
        let (ready_tx, ready) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("operator".into())
            .spawn(move || {
                let started = crate::path::runtime().map_err(|e| e.to_string()).map(|rt| {
                    let op = rt.block_on(async {
                        let client = Client::connect(&dir).await.map_err(|e| e.to_string())?;
                        uniplane_collectives::ReductionOperator::start(client, OPERATOR)
                            .await
                            .map_err(|e| e.to_string())
                    });
                    (rt, op)
                });
                match started {
                    Ok((rt, Ok(op))) => {
                        let _ = ready_tx.send(Ok(()));
                        // Serve until the benchmark drops `stop`.
                        rt.block_on(async {
                            let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
                        });
                        drop(op);
                    }
                    Ok((_, Err(e))) | Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|source| BenchError::Thread {
                what: "operator",
                source,
            })?;
        ready
            .recv()
            .map_err(|_| BenchError::Config("the operator thread ended".into()))?
            .map_err(|e| BenchError::Config(format!("operator endpoint: {e}")))?;
    }
    let wait = match cfg.wait {
        WaitMode::Busy => Wait::Busy,
        // Parking at once: a spin happens inside the session task's poll
        // and would hold up every other task of the rank's runtime.
        WaitMode::Park => Wait::Park {
            spin: Duration::ZERO,
        },
    };
    let threads: Vec<_> = (0..cfg.ranks)
        .map(|rank| {
            let dir = dirs[rank % dirs.len()].clone();
            let also_ask: Vec<PathBuf> = dirs.iter().filter(|d| **d != dir).cloned().collect();
            let cfg = cfg.clone();
            let sizes = sizes.to_vec();
            std::thread::Builder::new()
                .name(format!("rank{rank}"))
                .spawn(move || -> Result<Vec<(f64, Vec<f64>, f64)>, String> {
                    let rt = crate::path::runtime().map_err(|e| e.to_string())?;
                    rt.block_on(async move {
                        let client = Client::connect(&dir).await.map_err(|e| e.to_string())?;
                        let spec = WorldSpec {
                            job: "bench".into(),
                            rank,
                            size: cfg.ranks,
                        };
                        let options = Options {
                            wait,
                            timeout: Duration::from_secs(60),
                            also_ask,
                            ..Options::default()
                        };
                        let comm = uniplane_collectives::join(client, &spec, options)
                            .await
                            .map_err(|e| e.to_string())?;
                        if let Some(t) = cfg.eager_threshold {
                            comm.set_eager_threshold(t);
                        }
                        if operator {
                            comm.use_reduction_operator(Some(OPERATOR))
                                .await
                                .map_err(|e| e.to_string())?;
                        }
                        let mut out = Vec::new();
                        for &size in &sizes {
                            out.push(
                                time_one(&comm, cfg.op, size, iterations(&cfg, size))
                                    .await
                                    .map_err(|e| format!("{} B: {e}", size))?,
                            );
                        }
                        comm.finalize().await.map_err(|e| e.to_string())?;
                        Ok(out)
                    })
                })
                .map_err(|source| BenchError::Thread {
                    what: "rank",
                    source,
                })
        })
        .collect::<Result<_, _>>()?;
    let mut per_rank = Vec::new();
    for t in threads {
        let r = t
            .join()
            .map_err(|_| BenchError::Config("a rank thread panicked".into()))?
            .map_err(|e| BenchError::Config(format!("uniplane side: {e}")))?;
        per_rank.push(r);
    }
    drop(stop);
    drop(daemons);
    Ok((0..sizes.len())
        .map(|i| {
            let mut lat = per_rank[0][i].1.clone();
            lat.sort_by(f64::total_cmp);
            Point {
                avg_us: per_rank.iter().map(|r| r[i].0).sum::<f64>() / cfg.ranks as f64,
                p50_us: lat.get(lat.len() / 2).copied().unwrap_or(0.0),
                cpu_us: per_rank.iter().map(|r| r[i].2).sum(),
            }
        })
        .collect())
}

/// One daemon for `shm`; for `tcp`/`ltl` two, peered over that tunnel
/// on loopback with a fresh cluster secret, once each sees the other.
fn start_daemons(binary: &Path, cfg: &CollConfig) -> Result<Vec<DaemonProcess>, BenchError> {
    if cfg.stack == "shm" {
        return Ok(vec![DaemonProcess::start(
            binary,
            PlaneKind::Engine,
            cfg.wait,
        )?]);
    }
    let mode = match cfg.wait {
        WaitMode::Busy => "busy-poll",
        WaitMode::Park => "spin-then-park",
    };
    let free = || crate::stacks::free_port().map(|a| a.port());
    let ends = [
        ("10.20.0.1", free()?, free()?),
        ("10.20.0.2", free()?, free()?),
    ];
    let base = scratch_dir("collectives-key")?;
    let secret = base.join("cluster.key");
    uniplane_services::auth::Key::generate(&secret)
        .map_err(|e| BenchError::Config(format!("cluster secret: {e}")))?;
    let mut out = Vec::new();
    for (i, (me, peer, tunnel)) in ends.iter().enumerate() {
        let (other, opeer, otunnel) = ends[1 - i];
        let dir = scratch_dir("collectives")?;
        let text = format!(
            "[server]\nid = \"{me}\"\npeer_listen = \"127.0.0.1:{peer}\"\n\n\
             [runtime]\ndir = \"{}\"\n\n\
             [engine]\nmax_ports = 8\nring_depth = 1024\nmode = \"{mode}\"\n\n\
             [[stacks]]\nname = \"{stack}\"\nlisten = \"127.0.0.1:{tunnel}\"\n\n\
             [[peers]]\nserver = \"{other}\"\naddress = \"127.0.0.1:{opeer}\"\ntunnel = \"127.0.0.1:{otunnel}\"\nstack = \"{stack}\"\n\n\
             [policy]\ndefault = \"allow\"\n\n[cluster]\nsecret = \"{}\"\n",
            dir.display(),
            secret.display(),
            stack = cfg.stack,
        );
        out.push(DaemonProcess::spawn(binary, dir, &text, &[])?);
    }
    let rt = crate::path::runtime()?;
    let dirs: Vec<PathBuf> = out.iter().map(|d| d.runtime_dir().to_owned()).collect();
    let peered = rt.block_on(async {
        let start = Instant::now();
        for dir in &dirs {
            let c = Client::connect(dir).await.map_err(|e| e.to_string())?;
            loop {
                let status = c
                    .request(&uniplane_client::protocol::Request::Status)
                    .await
                    .map_err(|e| e.to_string())?;
                let alive = status["peers"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty() && p.iter().all(|x| x["alive"] == true));
                if alive {
                    break;
                }
                if start.elapsed() > Duration::from_secs(20) {
                    return Err("the daemons did not become peers within 20 s".to_string());
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    });
    let _ = std::fs::remove_dir_all(&base);
    peered.map_err(BenchError::Config)?;
    Ok(out)
}

fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// (mean µs, every latency in µs, CPU µs per call) of one size on this rank.
async fn time_one(
    comm: &Communicator,
    op: CollOp,
    size: usize,
    iters: usize,
) -> Result<(f64, Vec<f64>, f64), uniplane_collectives::Error> {
    let count = (size / 4).max(1);
    let n = comm.size();
    let mine = vec![1i32; count];
    let blocks = vec![1i32; count * n];
    let mut buf = vec![1i32; count];
    let warmup = iters / 10 + 2;
    let mut lat = Vec::with_capacity(iters);
    let mut cpu0 = Duration::ZERO;
    for i in 0..warmup + iters {
        if i == warmup {
            comm.barrier().await?;
            cpu0 = thread_cpu();
        }
        let t0 = Instant::now();
        match op {
            CollOp::Allreduce => {
                comm.allreduce(&mine, Op::Sum).await?;
            }
            CollOp::Bcast => comm.bcast(&mut buf, 0).await?,
            CollOp::Reduce => {
                comm.reduce(&mine, Op::Sum, 0).await?;
            }
            CollOp::Allgather => {
                comm.allgather(&mine).await?;
            }
            CollOp::Alltoall => {
                comm.alltoall(&blocks).await?;
            }
            CollOp::Barrier => comm.barrier().await?,
        }
        if i >= warmup {
            lat.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    let cpu = (thread_cpu() - cpu0).as_secs_f64() * 1e6 / iters as f64;
    let mean = lat.iter().sum::<f64>() / iters as f64;
    Ok((mean, lat, cpu))
}

/// Builds osu.c with `mpicc` and runs it under `mpirun`; `None` with a
/// reason when the library is missing, fails or overruns.
fn run_mpi(
    mpicc: &str,
    mpirun: &str,
    extra: &[&str],
    cfg: &CollConfig,
    sizes: &[usize],
    dir: &Path,
) -> Result<Vec<Point>, String> {
    let (Some(cc), Some(run)) = (find_tool(mpicc), find_tool(mpirun)) else {
        return Err(format!("{mpicc}/{mpirun} not installed"));
    };
    let src = dir.join("osu.c");
    std::fs::write(&src, OSU_C).map_err(|e| e.to_string())?;
    let exe = dir.join(format!("osu-{mpicc}"));
    let built = Command::new(cc)
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .map_err(|e| e.to_string())?;
    if !built.success() {
        return Err(format!("{mpicc} failed"));
    }
    let mut child = Command::new(run)
        .args(extra)
        .args(["-n", &cfg.ranks.to_string()])
        .arg(&exe)
        .arg(cfg.op.name())
        .args(sizes.iter().map(|&s| format!("{s}:{}", iterations(cfg, s))))
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    // Bounded: MPICH with more ranks than cores may spin for ever.
    let limit = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(s) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if Instant::now() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    let mut points = Vec::new();
    for l in text.lines() {
        let f: Vec<f64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if let [_, avg, p50, cpu] = f[..] {
            points.push(Point {
                avg_us: avg,
                p50_us: p50,
                cpu_us: cpu,
            });
        }
    }
    match status {
        // MPICH may hang in MPI_Finalize after printing every size.
        _ if points.len() == sizes.len() => Ok(points),
        None => Err(format!("{mpirun} overran its time limit")),
        Some(s) => Err(format!(
            "{mpirun} ended {s} after {} of {} sizes",
            points.len(),
            sizes.len()
        )),
    }
}

/// Runs the benchmark: `results` with one point per size.
pub fn run_collectives(cfg: &CollConfig) -> Result<Value, BenchError> {
    let sizes: Vec<usize> = if cfg.op == CollOp::Barrier {
        vec![0]
    } else {
        cfg.sizes.clone()
    };
    let ours = run_uniplane(cfg, &sizes, false)?;
    let via_operator = if cfg.operator && matches!(cfg.op, CollOp::Allreduce | CollOp::Reduce) {
        Some(run_uniplane(cfg, &sizes, true)?)
    } else {
        None
    };
    let dir = scratch_dir("collectives")?;
    let (openmpi, mpich) = if !cfg.mpi {
        (Err("not run".into()), Err("not run".into()))
    } else if cfg.stack != "shm" {
        (
            run_mpi(
                "mpicc.openmpi",
                "mpirun.openmpi",
                &["--oversubscribe", "--mca", "btl", "tcp,self"],
                cfg,
                &sizes,
                &dir,
            ),
            Err("not run over tcp (MPICH here has no TCP-only switch in use)".to_string()),
        )
    } else {
        (
            run_mpi(
                "mpicc.openmpi",
                "mpirun.openmpi",
                &["--oversubscribe"],
                cfg,
                &sizes,
                &dir,
            ),
            run_mpi("mpicc.mpich", "mpirun.mpich", &[], cfg, &sizes, &dir),
        )
    };
    let _ = std::fs::remove_dir_all(&dir);
    let side = |r: &Result<Vec<Point>, String>, i: usize, f: fn(&Point) -> f64| {
        r.as_ref().ok().map(|p| f(&p[i]))
    };
    let points: Vec<Value> = sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            json!({
                "size": size,
                "uniplane_us": ours[i].avg_us,
                "uniplane_operator_us": via_operator.as_ref().map(|p| p[i].avg_us),
                "openmpi_us": side(&openmpi, i, |p| p.avg_us),
                "mpich_us": side(&mpich, i, |p| p.avg_us),
                "p50_us": {
                    "uniplane": ours[i].p50_us,
                    "openmpi": side(&openmpi, i, |p| p.p50_us),
                    "mpich": side(&mpich, i, |p| p.p50_us),
                },
                "cpu_us_per_op": {
                    "uniplane": ours[i].cpu_us,
                    "uniplane_operator": via_operator.as_ref().map(|p| p[i].cpu_us),
                    "openmpi": side(&openmpi, i, |p| p.cpu_us),
                    "mpich": side(&mpich, i, |p| p.cpu_us),
                },
                "iterations": iterations(cfg, size),
            })
        })
        .collect();
    Ok(json!({
        "points": points,
        "openmpi": openmpi.as_ref().err(),
        "mpich": mpich.as_ref().err(),
    }))
}

#[cfg(test)]
mod tests {
    use super::parse_sizes;

    #[test]
    fn sizes_double_through_a_range_and_keep_its_end() {
        assert_eq!(parse_sizes("8..64").unwrap(), [8, 16, 32, 64]);
        assert_eq!(
            parse_sizes("1K..3K,1M").unwrap(),
            [1024, 2048, 3072, 1 << 20]
        );
        assert!(parse_sizes("8..4").is_err());
        assert!(parse_sizes("x").is_err());
    }
}
