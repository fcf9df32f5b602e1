//! The streaming call form on a real embedded daemon: random chunkings
//! (different on every rank, arriving over time through a channel) give
//! the same results as the plain call, segment by segment; bad input is
//! an error on every rank within the world's timeout.

mod common;

use std::time::Duration;

use common::{data, mix, on_all, options, world, Gen};
use futures_util::stream::{self, Stream, StreamExt};
use uniplane_collectives::stream::SEGMENT_BYTES;
use uniplane_collectives::{Communicator, Element, Error, Op, Options};

/// `v` cut at random points (empty chunks included), fed through a
/// channel by a task that yields between chunks: the chunks arrive over
/// time.
fn chunked<T: Element>(v: Vec<T>, seed: u64) -> impl Stream<Item = Vec<T>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<T>>(2);
    tokio::spawn(async move {
        let mut at = 0;
        let mut s = seed;
        while at < v.len() {
            s = mix(s);
            let max = match s % 4 {
                0 => 3,
                1 => 1000,
                2 => 20_000,
                _ => 100_000,
            };
            let n = ((s >> 8) as usize % max).min(v.len() - at);
            if tx.send(v[at..at + n].to_vec()).await.is_err() {
                return;
            }
            at += n;
            tokio::task::yield_now().await;
        }
    });
    stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|c| (c, rx)) })
}

/// Collects a streaming call's segments, checking their sizes.
async fn segments<T: Element>(
    mut s: uniplane_collectives::ChunkStream<T>,
    len: usize,
) -> Result<Vec<T>, Error> {
    let seg = (SEGMENT_BYTES / T::SIZE).max(1);
    let mut out = Vec::new();
    let mut count = 0;
    while let Some(part) = s.next().await {
        let part = part?;
        assert_eq!(part.len(), seg.min(len - out.len()), "segment {count}");
        out.extend(part);
        count += 1;
    }
    assert_eq!(count, len.div_ceil(seg));
    Ok(out)
}

async fn allreduce_case<T: Gen>(comms: &[Communicator], len: usize, op: Op, seed: u64) {
    let results = on_all(comms, move |comm| async move {
        let r = comm.rank();
        let mine: Vec<T> = data(seed, r, len);
        let plain = comm.allreduce(&mine, op).await?;
        let streamed = comm.allreduce_stream(len, chunked(mine, seed ^ r as u64), op);
        let streamed = segments(streamed, len).await?;
        Ok::<_, Error>((plain, streamed))
    })
    .await;
    for (r, got) in results.into_iter().enumerate() {
        let what = format!("{:?} {op:?} len {len} seed {seed} rank {r}", T::DATATYPE);
        let (plain, streamed) = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(plain == streamed, "{what}: streamed result differs");
    }
}

async fn bcast_case<T: Gen>(comms: &[Communicator], len: usize, seed: u64) {
    let root = comms.len() - 1;
    let results = on_all(comms, move |comm| async move {
        let r = comm.rank();
        let theirs: Vec<T> = data(seed, root, len);
        let mut plain = if r == root {
            theirs.clone()
        } else {
            vec![T::default(); len]
        };
        comm.bcast(&mut plain, root).await?;
        let input = if r == root { theirs } else { Vec::new() };
        let streamed = comm.bcast_stream(len, chunked(input, seed ^ r as u64), root);
        let streamed = segments(streamed, len).await?;
        Ok::<_, Error>((plain, streamed))
    })
    .await;
    let want: Vec<T> = data(seed, root, len);
    for (r, got) in results.into_iter().enumerate() {
        let what = format!("{:?} len {len} rank {r}", T::DATATYPE);
        let (plain, streamed) = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(plain == want, "{what}: plain bcast differs");
        assert!(streamed == want, "{what}: streamed bcast differs");
    }
}

/// Lengths around segment boundaries of a type, and random ones.
fn lengths<T: Element>(seed: u64) -> Vec<usize> {
    let seg = SEGMENT_BYTES / T::SIZE;
    vec![
        0,
        1,
        seg - 1,
        seg,
        seg + 1,
        3 * seg + 5,
        (mix(seed) % (6 * seg as u64)) as usize,
    ]
}

async fn every_type(comms: &[Communicator], seed: u64) {
    macro_rules! each {
        ($($t:ty),*) => {$(
            for (i, len) in lengths::<$t>(seed).into_iter().enumerate() {
                let op = Op::ALL[(i + seed as usize) % 4];
                allreduce_case::<$t>(comms, len, op, seed + i as u64).await;
            }
            bcast_case::<$t>(comms, lengths::<$t>(seed)[6], seed).await;
        )*};
    }
    each!(i8, i16, i32, i64, u8, u16, u32, u64, f32, f64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_equal_plain_calls_on_three_ranks() {
    let w = world("stream3", 3, options()).await;
    every_type(&w.comms, 3).await;
    // Every operation on one type at a multi-segment size, both sides
    // of the eager threshold.
    for op in Op::ALL {
        allreduce_case::<i32>(&w.comms, 100_000, op, 11).await;
    }
    for comm in &w.comms {
        comm.set_eager_threshold(0);
    }
    allreduce_case::<u16>(&w.comms, 70_000, Op::Sum, 12).await;
    bcast_case::<f64>(&w.comms, 30_000, 13).await;
    // The communicator's order is intact: a plain call still agrees.
    let sums = on_all(
        &w.comms,
        |c| async move { c.allreduce(&[1u32], Op::Sum).await },
    )
    .await;
    for s in sums {
        assert_eq!(s.unwrap(), vec![3]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_calls_equal_plain_calls_on_four_and_two_ranks() {
    let w = world("stream4", 4, options()).await;
    every_type(&w.comms, 4).await;
    let w = world("stream2", 2, options()).await;
    every_type(&w.comms, 2).await;
}

fn short_timeout() -> Options {
    Options {
        timeout: Duration::from_secs(2),
        ..options()
    }
}

/// Runs a streaming allreduce where rank 1 declares `declared` and feeds
/// `fed` elements while every other rank declares and feeds `len`.
async fn bad_case(name: &str, len: usize, declared: usize, fed: usize) -> Vec<Result<(), Error>> {
    let w = world(name, 3, short_timeout()).await;
    on_all(&w.comms, move |comm| async move {
        let r = comm.rank();
        let (declared, fed) = if r == 1 { (declared, fed) } else { (len, len) };
        let input = chunked(data::<i32>(1, r, fed), r as u64);
        comm.allreduce_stream(declared, input, Op::Sum)
            .concat()
            .await
            .map(drop)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_lengths_fail_every_rank() {
    let seg = SEGMENT_BYTES / 4;
    for (name, len, other) in [("mis-a", 100, 200), ("mis-b", 3 * seg, 2 * seg)] {
        let results = bad_case(name, len, other, other).await;
        for (r, res) in results.iter().enumerate() {
            assert!(res.is_err(), "{name} rank {r} succeeded");
        }
        assert!(
            results
                .iter()
                .any(|r| matches!(r, Err(Error::Argument(m)) if m.contains("declared between"))),
            "{name}: {results:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_that_disagrees_with_its_length_fails() {
    let seg = SEGMENT_BYTES / 4;
    for (name, fed) in [("short", 2 * seg + 3), ("long", 2 * seg + 40)] {
        let results = bad_case(name, 2 * seg + 20, 2 * seg + 20, fed).await;
        match &results[1] {
            Err(Error::Argument(m)) => assert!(
                m.contains("ended after") || m.contains("more than"),
                "{name}: {m}"
            ),
            other => panic!("{name}: rank 1 got {other:?}"),
        }
        // Short input leaves the others without its last segment: they
        // fail within the timeout. (Excess input may be found only after
        // every declared segment went out, so the others may finish.)
        if name == "short" {
            for (r, res) in results.iter().enumerate() {
                assert!(res.is_err(), "{name} rank {r} succeeded");
            }
        }
    }
}
