//! A reduction operator endpoint on a real embedded daemon: its own
//! session (UID, name) that ranks send allreduce and reduce through. The
//! results must equal the ranks' own algorithms' for every datatype and
//! operation, and the operator's counters must show the data went
//! through it.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::{data, on_all, options, world, Gen};
use uniplane_client::Client;
use uniplane_collectives::stream::SEGMENT_BYTES;
use uniplane_collectives::{Communicator, Datatype, Error, Op, Options, ReductionOperator};

/// One rank's results of every case: allreduce and reduce (root: the
/// last rank) of each datatype and operation, as bytes.
async fn run_cases(comm: Communicator, seed: u64, len: usize) -> Result<Vec<Vec<u8>>, Error> {
    async fn one<T: Gen>(
        comm: &Communicator,
        seed: u64,
        len: usize,
        out: &mut Vec<Vec<u8>>,
    ) -> Result<(), Error> {
        let root = comm.size() - 1;
        for (k, op) in Op::ALL.into_iter().enumerate() {
            let mine: Vec<T> = data(seed + k as u64, comm.rank(), len);
            let all = comm.allreduce(&mine, op).await?;
            let mut bytes = Vec::new();
            T::encode(&all, &mut bytes);
            out.push(bytes);
            let at_root = comm.reduce(&mine, op, root).await?;
            assert_eq!(at_root.is_some(), comm.rank() == root);
            let mut bytes = Vec::new();
            T::encode(&at_root.unwrap_or_default(), &mut bytes);
            out.push(bytes);
        }
        Ok(())
    }
    let mut out = Vec::new();
    one::<i8>(&comm, seed, len, &mut out).await?;
    one::<i16>(&comm, seed, len, &mut out).await?;
    one::<i32>(&comm, seed, len, &mut out).await?;
    one::<i64>(&comm, seed, len, &mut out).await?;
    one::<u8>(&comm, seed, len, &mut out).await?;
    one::<u16>(&comm, seed, len, &mut out).await?;
    one::<u32>(&comm, seed, len, &mut out).await?;
    one::<u64>(&comm, seed, len, &mut out).await?;
    one::<f32>(&comm, seed, len, &mut out).await?;
    one::<f64>(&comm, seed, len, &mut out).await?;
    Ok(out)
}

/// Segments the operator combines for one call of `len` elements of
/// every datatype (each datatype: 4 operations × allreduce and reduce).
fn segments_per_round(len: usize) -> u64 {
    Datatype::ALL
        .iter()
        .map(|d| 8 * len.div_ceil(SEGMENT_BYTES / d.size()) as u64)
        .sum()
}

async fn through_the_operator(n: usize, name: &str) {
    let w = world(name, n, options()).await;
    let op_name = format!("coll-op-reduce-{name}");
    let operator = ReductionOperator::start(Client::connect(&w.dir).await.unwrap(), &op_name)
        .await
        .unwrap();
    assert_ne!(
        operator.uid(),
        w.comms[0].session().uid(),
        "its own resource"
    );
    // One segment, several, and an odd length.
    for (seed, len) in [(1u64, 5usize), (2, 3 * SEGMENT_BYTES / 4 + 3), (3, 70_001)] {
        let plain = on_all(&w.comms, move |c| run_cases(c, seed, len)).await;
        let before = operator.stats().segments.load(Ordering::Relaxed);
        let op_name2 = op_name.clone();
        let via = on_all(&w.comms, move |c| {
            let op_name = op_name2.clone();
            async move {
                c.use_reduction_operator(Some(&op_name)).await?;
                let r = run_cases(c.clone(), seed, len).await;
                c.use_reduction_operator(None).await?;
                r
            }
        })
        .await;
        for (r, (p, v)) in plain.into_iter().zip(via).enumerate() {
            let p = p.unwrap_or_else(|e| panic!("plain, rank {r}: {e}"));
            let v = v.unwrap_or_else(|e| panic!("through the operator, rank {r}: {e}"));
            assert_eq!(p.len(), v.len());
            for (case, (a, b)) in p.iter().zip(&v).enumerate() {
                assert!(a == b, "len {len} rank {r} case {case}: results differ");
            }
        }
        let segments = operator.stats().segments.load(Ordering::Relaxed) - before;
        assert_eq!(segments, segments_per_round(len), "len {len}");
    }
    let s = operator.stats();
    assert_eq!(
        s.operands.load(Ordering::Relaxed),
        n as u64 * s.segments.load(Ordering::Relaxed)
    );
    assert!(s.operand_bytes.load(Ordering::Relaxed) > 0);
    assert_eq!(s.malformed.load(Ordering::Relaxed), 0);
    assert_eq!(s.connections.load(Ordering::Relaxed), 3 * n as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allreduce_and_reduce_through_the_operator_equal_the_plain_path() {
    through_the_operator(3, "opr3").await;
    through_the_operator(4, "opr4").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_allreduce_goes_through_the_operator_too() {
    let w = world("oprs", 2, options()).await;
    let operator = ReductionOperator::start(Client::connect(&w.dir).await.unwrap(), "coll-op-s")
        .await
        .unwrap();
    let len = 3 * SEGMENT_BYTES / 4 + 10;
    let got = on_all(&w.comms, move |c| async move {
        c.use_reduction_operator(Some("coll-op-s")).await?;
        let mine: Vec<u32> = data(9, c.rank(), len);
        let input =
            futures_util::stream::iter(mine.chunks(1000).map(<[u32]>::to_vec).collect::<Vec<_>>());
        c.allreduce_stream(len, input, Op::Sum).concat().await
    })
    .await;
    let (a, b) = (data::<u32>(9, 0, len), data::<u32>(9, 1, len));
    let want: Vec<u32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    for g in got {
        assert!(g.unwrap() == want);
    }
    // Four segments and the length check, each from both ranks.
    assert_eq!(operator.stats().segments.load(Ordering::Relaxed), 5);
    assert_eq!(operator.stats().operands.load(Ordering::Relaxed), 10);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disagreeing_operands_are_refused_and_no_rank_hangs() {
    let opts = Options {
        timeout: Duration::from_secs(2),
        ..options()
    };
    let w = world("oprbad", 3, opts).await;
    let operator = ReductionOperator::start(Client::connect(&w.dir).await.unwrap(), "coll-op-bad")
        .await
        .unwrap();
    let got = on_all(&w.comms, |c| async move {
        c.use_reduction_operator(Some("coll-op-bad")).await?;
        let len = if c.rank() == 1 { 10 } else { 12 };
        let r = c.allreduce(&vec![1i64; len], Op::Sum).await;
        c.use_reduction_operator(None).await?;
        r
    })
    .await;
    for (r, g) in got.iter().enumerate() {
        assert!(g.is_err(), "rank {r}: {g:?}");
    }
    assert!(
        got.iter()
            .any(|g| matches!(g, Err(Error::Protocol(m)) if m.contains("refused"))),
        "{got:?}"
    );
    assert!(operator.stats().malformed.load(Ordering::Relaxed) >= 1);
    // The ranks left: the segment that can never finish is dropped.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while operator.stats().pending.load(Ordering::Relaxed) != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a stale segment stays"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_world_option_names_the_operator() {
    let (daemon, dir) = common::daemon("oprw").await;
    let operator = ReductionOperator::start(Client::connect(&dir).await.unwrap(), "coll-op-w")
        .await
        .unwrap();
    let joins = (0..3).map(|rank| {
        let dir = dir.clone();
        tokio::spawn(async move {
            let client = Client::connect(&dir).await?;
            let spec = uniplane_collectives::WorldSpec {
                job: "oprw".into(),
                rank,
                size: 3,
            };
            let options = Options {
                reduction_operator: Some("coll-op-w".into()),
                ..options()
            };
            let comm = uniplane_collectives::join(client, &spec, options).await?;
            comm.allreduce(&[rank as i32 + 1, 10], Op::Sum).await
        })
    });
    let got = tokio::time::timeout(common::STEP, futures_util::future::join_all(joins))
        .await
        .expect("every rank finishes in time");
    for g in got {
        assert_eq!(g.expect("rank task").expect("allreduce"), vec![6, 30]);
    }
    assert_eq!(operator.stats().connections.load(Ordering::Relaxed), 3);
    assert_eq!(operator.stats().segments.load(Ordering::Relaxed), 1);
    daemon.shutdown();
    let _ = std::fs::remove_dir_all(&dir);
}
