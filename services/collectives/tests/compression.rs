//! The compression operator pair on a real embedded daemon: a compressor
//! and a decompressor, each its own session, that ranks' data messages
//! go through. Results must equal the direct path's, for compressible
//! and incompressible data, eager and rendezvous sizes; the endpoints'
//! counters show the data went through them (and shrank when it could).

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{mix, on_all, options, world};
use uniplane_client::Client;
use uniplane_collectives::compress::Role;
use uniplane_collectives::{CompressionOperator, Error, Op};

/// Compressible: long runs of small values; incompressible: a hash.
fn input(compressible: bool, rank: usize, len: usize) -> Vec<i32> {
    (0..len)
        .map(|i| {
            if compressible {
                ((i / 64) % 5) as i32 + rank as i32
            } else {
                mix((rank * 1_000_003 + i) as u64) as i32
            }
        })
        .collect()
}

/// Every collective that moves data, on one rank: the results in order.
async fn cases(
    comm: uniplane_collectives::Communicator,
    compressible: bool,
) -> Result<Vec<Vec<i32>>, Error> {
    let (n, r) = (comm.size(), comm.rank());
    let mut out = Vec::new();
    // Eager and rendezvous sizes (1.2 MB is above the eager cap).
    for len in [1000usize, 300_000] {
        let mine = input(compressible, r, len);
        out.push(comm.allreduce(&mine, Op::Sum).await?);
        let mut b = if r == 0 { mine.clone() } else { vec![0; len] };
        comm.bcast(&mut b, 0).await?;
        out.push(b);
        out.push(comm.alltoall(&input(compressible, r, len / n * n)).await?);
        out.push(
            comm.reduce(&mine, Op::Max, n - 1)
                .await?
                .unwrap_or_default(),
        );
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_through_the_compression_pair_equals_the_direct_path() {
    let w = world("lz4", 3, options()).await;
    let d = CompressionOperator::start(
        Client::connect(&w.dir).await.unwrap(),
        "coll-lz4-d",
        Role::Decompress,
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    let c = CompressionOperator::start(
        Client::connect(&w.dir).await.unwrap(),
        "coll-lz4-c",
        Role::Compress {
            to: "coll-lz4-d".into(),
        },
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    for compressible in [true, false] {
        let direct = on_all(&w.comms, move |comm| cases(comm, compressible)).await;
        let (raw0, wire0) = (
            c.stats().raw_bytes.load(Ordering::Relaxed),
            c.stats().wire_bytes.load(Ordering::Relaxed),
        );
        let relayed = on_all(&w.comms, move |comm| async move {
            comm.use_compression(Some(("coll-lz4-c", "coll-lz4-d")))
                .await?;
            let r = cases(comm.clone(), compressible).await;
            comm.use_compression(None).await?;
            r
        })
        .await;
        for (r, (a, b)) in direct.into_iter().zip(relayed).enumerate() {
            let a = a.unwrap_or_else(|e| panic!("direct, rank {r}: {e}"));
            let b = b.unwrap_or_else(|e| panic!("relayed, rank {r}: {e}"));
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert!(
                    x == y,
                    "compressible {compressible} rank {r} case {i} differs"
                );
            }
        }
        let raw = c.stats().raw_bytes.load(Ordering::Relaxed) - raw0;
        let wire = c.stats().wire_bytes.load(Ordering::Relaxed) - wire0;
        assert!(raw > 3 * 1_200_000, "the data went through: {raw} bytes");
        if compressible {
            assert!(wire * 4 < raw, "it shrank: {wire} of {raw} bytes");
        } else {
            assert!(wire * 100 > raw * 99, "noise stays noise: {wire} of {raw}");
        }
    }
    assert_eq!(
        c.stats().segments.load(Ordering::Relaxed),
        d.stats().segments.load(Ordering::Relaxed)
    );
    assert_eq!(
        c.stats().wire_bytes.load(Ordering::Relaxed),
        d.stats().wire_bytes.load(Ordering::Relaxed)
    );
    assert_eq!(c.stats().malformed.load(Ordering::Relaxed), 0);
    assert_eq!(d.stats().malformed.load(Ordering::Relaxed), 0);
}
