//! Collectives on a real embedded daemon, against results computed here:
//! every algorithm of every collective, at sizes that take one segment,
//! many segments and the rendezvous path; communicators; failures;
//! flow control. Every wait has a deadline.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{on_all, options, world};
use uniplane_collectives::{Algorithm, Collective, Communicator, Error, Op, Options};

fn input(rank: usize, i: usize) -> i32 {
    (rank * 1000 + i % 977) as i32 - 300
}

fn inputs(rank: usize, count: usize) -> Vec<i32> {
    (0..count).map(|i| input(rank, i)).collect()
}

/// Runs collective `c` with algorithm `alg` at `count` elements per rank
/// on every rank and checks every rank's result.
async fn check(comms: &[Communicator], c: Collective, alg: Algorithm, count: usize) {
    let n = comms.len();
    for comm in comms {
        let mut t = comm.tuning();
        t.force(c, alg);
        comm.set_tuning(t);
    }
    let root = n - 1;
    let results = on_all(comms, move |comm| async move {
        let r = comm.rank();
        let mine = inputs(r, count);
        let got: Result<Vec<i32>, Error> = match c {
            Collective::Bcast => {
                let mut buf = if r == root { mine } else { vec![0; count] };
                comm.bcast(&mut buf, root).await.map(|()| buf)
            }
            Collective::Reduce => {
                let a = comm.reduce(&mine, Op::Sum, root).await;
                let mut b = mine.clone();
                let b = comm
                    .reduce_in_place(&mut b, Op::Sum, root)
                    .await
                    .map(|()| b);
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        if r == root {
                            assert_eq!(a.as_deref(), Some(&b[..]), "in place differs");
                        }
                        Ok(a.unwrap_or_default())
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Collective::Allreduce => {
                let a = comm.allreduce(&mine, Op::Max).await;
                let mut b = mine.clone();
                let b = comm.allreduce_in_place(&mut b, Op::Max).await.map(|()| b);
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "in place differs");
                        Ok(a)
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Collective::Allgather => {
                let a = comm.allgather(&mine).await;
                let mut b = vec![0; count * n];
                b[r * count..(r + 1) * count].copy_from_slice(&mine);
                let b = comm.allgather_in_place(&mut b).await.map(|()| b);
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "in place differs");
                        Ok(a)
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Collective::ReduceScatter => comm.reduce_scatter(&inputs(r, count * n), Op::Sum).await,
            Collective::Alltoall => {
                let a = comm.alltoall(&inputs(r, count * n)).await;
                let mut b = inputs(r, count * n);
                let b = comm.alltoall_in_place(&mut b).await.map(|()| b);
                match (a, b) {
                    (Ok(a), Ok(b)) => {
                        assert_eq!(a, b, "in place differs");
                        Ok(a)
                    }
                    (Err(e), _) | (_, Err(e)) => Err(e),
                }
            }
            Collective::Gather => comm
                .gather(&mine, root)
                .await
                .map(Option::unwrap_or_default),
            Collective::Scatter => {
                let data = if r == root {
                    inputs(r, count * n)
                } else {
                    vec![]
                };
                comm.scatter(&data, count, root).await
            }
            Collective::Barrier => comm.barrier().await.map(|()| vec![]),
        };
        got
    })
    .await;
    for (r, got) in results.into_iter().enumerate() {
        let got = got.unwrap_or_else(|e| panic!("{c:?}/{alg:?} count {count} rank {r}: {e}"));
        let sum = |range: std::ops::Range<usize>| -> Vec<i32> {
            range
                .map(|i| (0..n).fold(0i32, |a, k| a.wrapping_add(input(k, i))))
                .collect()
        };
        let want: Vec<i32> = match c {
            Collective::Bcast => inputs(root, count),
            Collective::Reduce if r == root => sum(0..count),
            Collective::Reduce | Collective::Barrier => vec![],
            Collective::Allreduce => (0..count)
                .map(|i| (0..n).map(|k| input(k, i)).max().unwrap())
                .collect(),
            Collective::Allgather => (0..n).flat_map(|k| inputs(k, count)).collect(),
            Collective::ReduceScatter => sum(r * count..(r + 1) * count),
            Collective::Alltoall => (0..n)
                .flat_map(|k| inputs(k, count * n)[r * count..(r + 1) * count].to_vec())
                .collect(),
            Collective::Gather if r == root => (0..n).flat_map(|k| inputs(k, count)).collect(),
            Collective::Gather => vec![],
            Collective::Scatter => inputs(root, count * n)[r * count..(r + 1) * count].to_vec(),
        };
        assert!(
            got == want,
            "{c:?}/{alg:?} count {count} rank {r}: wrong result (first differing index {:?})",
            got.iter().zip(&want).position(|(a, b)| a != b)
        );
    }
}

const ALL: [Collective; 9] = [
    Collective::Bcast,
    Collective::Reduce,
    Collective::Allreduce,
    Collective::Allgather,
    Collective::ReduceScatter,
    Collective::Alltoall,
    Collective::Gather,
    Collective::Scatter,
    Collective::Barrier,
];

/// One element, many segments (eager) and the rendezvous path.
const COUNTS: [usize; 3] = [1, 5_000, 70_000];

async fn every_algorithm(name: &str, n: usize) {
    let w = world(name, n, options()).await;
    for c in ALL {
        for &alg in Algorithm::supported(c) {
            for count in COUNTS {
                check(&w.comms, c, alg, count).await;
            }
        }
    }
    let rendezvous: u64 = w
        .comms
        .iter()
        .map(|c| c.stats().rendezvous_sent.load(Ordering::Relaxed))
        .sum();
    assert!(rendezvous > 0, "the large sizes went by rendezvous");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_of_every_collective_is_right_with_three_ranks() {
    every_algorithm("alg3", 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_algorithm_of_every_collective_is_right_with_four_ranks() {
    every_algorithm("alg4", 4).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eager_and_rendezvous_carry_the_same_bytes() {
    let w = world("proto", 2, options()).await;
    for threshold in [0usize, usize::MAX] {
        let results = on_all(&w.comms, move |comm| async move {
            comm.set_eager_threshold(threshold);
            let big: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
            if comm.rank() == 0 {
                // A send by rendezvous waits for its receiver (as MPI's
                // may): the two tags go at once.
                futures_util::future::try_join(
                    comm.send(1, 5, &big),
                    comm.send(1, 6, &[1u64, 2, 3]),
                )
                .await?;
                comm.send::<u8>(1, 5, &[]).await?;
                Ok(vec![])
            } else {
                // Tags are matched, not arrival order: 6 first.
                let small: Vec<u64> = comm.recv(0, 6, 3).await?;
                assert_eq!(small, [1, 2, 3]);
                let got: Vec<u8> = comm.recv(0, 5, big.len()).await?;
                assert_eq!(got, big);
                let empty: Vec<u8> = comm.recv(0, 5, 0).await?;
                assert!(empty.is_empty());
                Ok::<_, Error>(got)
            }
        })
        .await;
        for r in results {
            r.unwrap();
        }
        if threshold == 0 {
            let rdv = w.comms[0].stats().rendezvous_sent.load(Ordering::Relaxed);
            assert_eq!(rdv, 2, "threshold 0: every non-empty message by rendezvous");
        }
    }
    // With the huge threshold the 200 KB message went eagerly: the count
    // did not grow past what the zero threshold produced.
    let rdv = w.comms[0].stats().rendezvous_sent.load(Ordering::Relaxed);
    assert_eq!(rdv, 2, "200 KB fits half the 512 KiB window: eager");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn split_groups_by_color_ordered_by_key_and_dup_is_separate() {
    let w = world("split", 4, options()).await;
    let results = on_all(&w.comms, |comm| async move {
        let r = comm.rank();
        // Even and odd ranks, in reverse rank order; rank 3 stays out.
        let color = (r != 3).then_some((r % 2) as u32);
        let sub = comm.split(color, -(r as i64)).await?;
        let dup = comm.dup();
        // The dup's traffic does not mix with the world's.
        let d = dup.allreduce(&[r as u32], Op::Sum).await?;
        assert_eq!(d, [6]);
        let Some(sub) = sub else {
            assert_eq!(r, 3);
            return Ok::<_, Error>(None);
        };
        let members = sub.members().to_vec();
        let sum = sub.allreduce(&[r as u32], Op::Sum).await?;
        let gathered = sub.allgather(&[r as u32]).await?;
        Ok(Some((sub.rank(), members, sum[0], gathered)))
    })
    .await;
    let got: Vec<_> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(got[0], Some((1, vec![2, 0], 2, vec![2, 0])));
    assert_eq!(got[2], Some((0, vec![2, 0], 2, vec![2, 0])));
    assert_eq!(got[1], Some((0, vec![1], 1, vec![1])));
    assert_eq!(got[3], None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rank_that_is_gone_fails_the_others_calls() {
    let mut w = world(
        "gone",
        3,
        Options {
            timeout: Duration::from_secs(2),
            ..options()
        },
    )
    .await;
    // Rank 2 leaves: its session and connections close.
    drop(w.comms.pop());
    let results = on_all(&w.comms, |comm| async move {
        comm.allreduce(&[1i32; 1000], Op::Sum).await
    })
    .await;
    // The rank talking to rank 2 learns it is gone; one waiting only on
    // that rank times out instead. Nobody hangs, nobody succeeds.
    assert!(
        results
            .iter()
            .any(|r| matches!(r, Err(Error::PeerGone { peer: 2, .. }))),
        "{results:?}"
    );
    for r in results {
        assert!(
            matches!(r, Err(Error::PeerGone { .. } | Error::Timeout { .. })),
            "got {r:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rank_that_stalls_times_the_others_out() {
    let w = world(
        "stall",
        3,
        Options {
            timeout: Duration::from_millis(500),
            ..options()
        },
    )
    .await;
    // Rank 2 is alive but never calls.
    let results = on_all(&w.comms[..2], |comm| async move {
        comm.allreduce(&[1i32; 10], Op::Sum).await
    })
    .await;
    for r in results {
        assert!(matches!(r, Err(Error::Timeout { .. })), "got {r:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slow_receiver_pushes_back_on_its_sender() {
    let window = 256 * 1024;
    let w = world(
        "push",
        2,
        Options {
            window,
            ..options()
        },
    )
    .await;
    const MESSAGE: usize = 30_000;
    const MESSAGES: usize = 40;
    let sent = Arc::new(AtomicUsize::new(0));
    let sender = tokio::spawn({
        let comm = w.comms[0].clone();
        let sent = sent.clone();
        async move {
            for i in 0..MESSAGES {
                comm.send(1, 1, &vec![i as u8; MESSAGE]).await?;
                sent.fetch_add(1, Ordering::SeqCst);
            }
            Ok::<_, Error>(())
        }
    });
    // However long we wait, credit bounds what the sender gets out.
    let bound = window as usize / (MESSAGE + 64);
    let _ = tokio::time::timeout(Duration::from_millis(300), async {
        while sent.load(Ordering::SeqCst) <= bound {
            tokio::task::yield_now().await;
        }
    })
    .await;
    let early = sent.load(Ordering::SeqCst);
    assert!(
        early <= bound,
        "{early} messages of {MESSAGE} B sent into a {window} B window"
    );
    let receiver = &w.comms[1];
    for i in 0..MESSAGES {
        let m: Vec<u8> =
            tokio::time::timeout(Duration::from_secs(10), receiver.recv(0, 1, MESSAGE))
                .await
                .expect("a message in time")
                .unwrap();
        assert!(m.iter().all(|&b| b == i as u8), "message {i} in order");
    }
    tokio::time::timeout(Duration::from_secs(10), sender)
        .await
        .expect("the sender finishes")
        .unwrap()
        .unwrap();
}
