//! One rank of the Jacobi example as a process of its own, for endpoints
//! on different servers: it attaches to the daemon of
//! `$UNIPLANE_RUNTIME_DIR`, finds the other ranks by name in the
//! cluster's directory (`[registry] kind = "etcd"`), runs its strip and
//! checks it against the single-process reference, bit for bit.
//!
//! The rank, size and job come from the launcher's variables
//! (`UNIPLANE_COLL_RANK`, `UNIPLANE_COLL_SIZE`, `UNIPLANE_COLL_JOB`, as
//! `uniplane-run` sets them):
//!
//! ```text
//! uniplane-run -n 4 --runtime /run/a,/run/b target/release/examples/jacobi_rank [N] [ITERATIONS]
//! ```
//!
//! Exits non-zero (and says why) on a wrong strip or a failed call.

use uniplane_client::Client;
use uniplane_pgas::jacobi::{reference, rows_of, run_rank, Spec};
use uniplane_pgas::{Endpoint, Options};

fn var(name: &str) -> Result<String, String> {
    std::env::var(name).map_err(|_| format!("{name} is not set: start it with uniplane-run"))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rank: usize = var("UNIPLANE_COLL_RANK")?.parse()?;
    let size: usize = var("UNIPLANE_COLL_SIZE")?.parse()?;
    let job = format!("jacobi-{}", var("UNIPLANE_COLL_JOB")?);
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: usize| -> Result<usize, String> {
        args.get(i).map_or(Ok(default), |a| {
            a.parse().map_err(|_| format!("not a number: {a}"))
        })
    };
    let spec = Spec {
        n: num(0, 64)?,
        iterations: num(1, 100)?,
    };
    let session = Client::connect_default()
        .await?
        .attach(&format!("{job}-{rank}"))
        .await?;
    let ep = Endpoint::bind(session, Options::default()).await?;
    let group = ep.group_by_name(&job, rank, size).await?;
    ep.join(group).await?;
    let strip = run_rank(&ep, spec).await?;
    // Everything sent reaches its rank before this process exits (the
    // last barrier's release to the others among it).
    ep.close().await?;
    let rows = rows_of(rank, size, spec.n);
    let want = reference(spec);
    if strip[..] != want[rows.start * spec.n..rows.end * spec.n] {
        return Err(format!("rank {rank}: the strip differs from the reference").into());
    }
    println!(
        "rank {rank} of {size}: jacobi {n}x{n}, {it} iterations, same as the reference",
        n = spec.n,
        it = spec.iterations
    );
    Ok(())
}
