//! Every rank contributes `rank + i` at index `i`; the allreduce sum must
//! be `size * i + size * (size - 1) / 2` everywhere. Run it with the
//! daemon up: `uniplane-run -n 4 target/debug/examples/allreduce`.
//! Exits non-zero (and says why) on a wrong result or a failed call.

use uniplane_collectives::{world, Op};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let comm = world::init().await?;
    let (rank, size) = (comm.rank() as i64, comm.size() as i64);
    let count = 100_000;
    let mine: Vec<i64> = (0..count).map(|i| rank + i).collect();
    let sum = comm.allreduce(&mine, Op::Sum).await?;
    for (i, v) in sum.iter().enumerate() {
        let want = size * i as i64 + size * (size - 1) / 2;
        if *v != want {
            return Err(format!("rank {rank}: sum[{i}] = {v}, want {want}").into());
        }
    }
    let ranks = comm.allgather(&[rank]).await?;
    if ranks != (0..size).collect::<Vec<_>>() {
        return Err(format!("rank {rank}: allgather gave {ranks:?}").into());
    }
    comm.finalize().await?;
    println!("rank {rank} of {size}: allreduce of {count} i64 ok");
    Ok(())
}
