//! `uniplane-run -n N [--runtime DIR[,DIR…]] [--netns NS[,NS…]] [--job ID]
//! PROGRAM [ARGS…]`: starts N copies of PROGRAM as the ranks of one
//! world, like `mpirun`.
//!
//! Each copy gets `UNIPLANE_COLL_RANK`, `UNIPLANE_COLL_SIZE` and
//! `UNIPLANE_COLL_JOB` (a fresh job id unless `--job` names one), and
//! `UNIPLANE_RUNTIME_DIR` when `--runtime` is given: with several
//! directories, rank r attaches to the daemon of the (r mod k)-th — ranks
//! spread over servers, which meet through the cluster's directory
//! (`[registry] kind = "etcd"`). With `--netns`, rank r runs inside the
//! (r mod k)-th network namespace (`ip netns exec`, as root). The launcher waits for all of them; the first
//! that fails (non-zero exit or a signal) ends the others, and its status
//! becomes the launcher's exit code (128 + signal for a signal, as a
//! shell reports it). Ctrl-C ends every rank.

use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};

use tokio::process::{Child, Command};
use uniplane_collectives::world::env;

const USAGE: &str =
    "usage: uniplane-run -n N [--runtime DIR[,DIR...]] [--netns NS[,NS...]] [--job ID] PROGRAM [ARGS...]";

struct Args {
    n: usize,
    runtime: Vec<String>,
    netns: Vec<String>,
    job: Option<String>,
    program: String,
    args: Vec<String>,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let (mut n, mut runtime, mut netns, mut job) = (None, Vec::new(), Vec::new(), None);
    let list = |v: String, what: &str| -> Result<Vec<String>, String> {
        let items: Vec<String> = v.split(',').map(str::to_owned).collect();
        if items.iter().any(String::is_empty) {
            return Err(format!("{what} {v}: an empty item"));
        }
        Ok(items)
    };
    loop {
        let Some(a) = it.next() else {
            return Err("no PROGRAM given".into());
        };
        match a.as_str() {
            "-n" | "-np" | "--np" => {
                let v = it.next().ok_or("-n needs a number")?;
                let v: usize = v.parse().map_err(|_| format!("-n {v}: not a number"))?;
                if v == 0 {
                    return Err("-n must be at least 1".into());
                }
                n = Some(v);
            }
            "--runtime" => {
                runtime = list(it.next().ok_or("--runtime needs a directory")?, "--runtime")?
            }
            "--netns" => netns = list(it.next().ok_or("--netns needs a namespace")?, "--netns")?,
            "--job" => job = Some(it.next().ok_or("--job needs an id")?),
            "-h" | "--help" => return Err(String::new()),
            "--" => {
                let program = it.next().ok_or("no PROGRAM given")?;
                return Ok(Args {
                    n: n.ok_or("-n N is required")?,
                    runtime,
                    netns,
                    job,
                    program,
                    args: it.collect(),
                });
            }
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            _ => {
                return Ok(Args {
                    n: n.ok_or("-n N is required")?,
                    runtime,
                    netns,
                    job,
                    program: a,
                    args: it.collect(),
                })
            }
        }
    }
}

/// The exit code a shell would report for `status`.
fn code_of(status: std::process::ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => u8::try_from(c & 0xff).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + (sig & 0x7f)).unwrap_or(1),
        (None, None) => 1,
    }
}

async fn run(args: Args) -> Result<u8, String> {
    let job = args.job.unwrap_or_else(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        format!("{}x{nanos:x}", std::process::id())
    });
    let mut children: Vec<Child> = Vec::with_capacity(args.n);
    for rank in 0..args.n {
        let mut cmd = if args.netns.is_empty() {
            Command::new(&args.program)
        } else {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &args.netns[rank % args.netns.len()]])
                .arg(&args.program);
            c
        };
        cmd.args(&args.args)
            .env(env::RANK, rank.to_string())
            .env(env::SIZE, args.n.to_string())
            .env(env::JOB, &job)
            .kill_on_drop(true);
        if !args.runtime.is_empty() {
            cmd.env(
                "UNIPLANE_RUNTIME_DIR",
                &args.runtime[rank % args.runtime.len()],
            );
        }
        match cmd.spawn() {
            Ok(c) => children.push(c),
            Err(e) => {
                for c in &mut children {
                    let _ = c.kill().await;
                }
                return Err(format!("cannot start {}: {e}", args.program));
            }
        }
    }
    let mut waits: futures_util::stream::FuturesUnordered<_> = children
        .iter_mut()
        .enumerate()
        .map(|(rank, c)| async move { (rank, c.wait().await) })
        .collect();
    use futures_util::StreamExt;
    let mut failure: Option<(usize, u8)> = None;
    loop {
        tokio::select! {
            next = waits.next() => match next {
                None => break,
                Some((rank, Ok(status))) if !status.success() => {
                    failure = Some((rank, code_of(status)));
                    break;
                }
                Some((_, Ok(_))) => {}
                Some((rank, Err(e))) => {
                    eprintln!("uniplane-run: waiting for rank {rank}: {e}");
                    failure = Some((rank, 1));
                    break;
                }
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("uniplane-run: interrupted, ending every rank");
                failure = Some((usize::MAX, 130));
                break;
            }
        }
    }
    drop(waits);
    let Some((rank, code)) = failure else {
        return Ok(0);
    };
    if rank != usize::MAX {
        eprintln!("uniplane-run: rank {rank} failed (exit code {code}); ending the others");
    }
    for c in &mut children {
        // Only our own children, by their handle: kill and reap.
        let _ = c.kill().await;
    }
    Ok(code)
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("uniplane-run: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("uniplane-run: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(run(args)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("uniplane-run: {e}");
            ExitCode::from(1)
        }
    }
}
