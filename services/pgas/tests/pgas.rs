//! Endpoints of one embedded daemon exchanging every kind of message.
//! Every wait has a deadline.

mod common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{group, group_with, within};
use proptest::prelude::*;
use proptest::test_runner::{Config as PropConfig, TestRunner};
use uniplane_pgas::{Acl, AtomicOp, Call, Completion, Options, PgasError, Refusal, Shape, Width};

const SEG: usize = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_short_message_runs_its_handler_and_the_reply_is_counted() {
    let seen = Arc::new(AtomicU64::new(0));
    let s = group("short", 2, |ep| {
        let seen = seen.clone();
        ep.register_handler(20, move |call| {
            seen.fetch_add(call.arg + 1000 * call.source as u64, Ordering::SeqCst);
            Bytes::new()
        })
        .unwrap();
    })
    .await;
    let a = &s.eps[0];
    within("short", a.short(1, Call::handler(20, 7), Completion::Reply))
        .await
        .unwrap();
    within("short", a.short(1, Call::counter(3), Completion::Reply))
        .await
        .unwrap();
    within("replies", a.wait_replies(2)).await.unwrap();
    assert_eq!(seen.load(Ordering::SeqCst), 7, "arg 7 from rank 0");
    assert_eq!(s.eps[1].counter(), 3);
    assert_eq!(a.replies(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_4_mib_long_message_lands_byte_for_byte_and_counts_in_wait_mem() {
    let s = group("long4m", 2, |ep| {
        ep.register_segment(4 << 20, Acl::ReadWrite);
    })
    .await;
    let data = pattern(4 << 20, 5);
    within(
        "long",
        s.eps[0].long(1, 0, 0, &data, Call::counter(1), Completion::Reply),
    )
    .await
    .unwrap();
    within("mem", s.eps[1].wait_mem(4 << 20)).await;
    within("counter", s.eps[1].wait_counter(1)).await;
    within("replies", s.eps[0].wait_replies(1)).await.unwrap();
    let back = within("get", s.eps[0].get(1, 0, 0, 4 << 20)).await.unwrap();
    assert!(back == data, "the 4 MiB read back differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_4_mib_medium_message_reaches_its_handler_whole() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let s = group("medium4m", 2, |ep| {
        let got = got.clone();
        ep.register_handler(30, move |call| {
            got.lock().unwrap().push(call.payload.to_vec());
            Bytes::new()
        })
        .unwrap();
    })
    .await;
    let data = pattern(4 << 20, 9);
    within(
        "medium",
        s.eps[0].medium(1, Call::handler(30, 0), &data, Completion::Reply),
    )
    .await
    .unwrap();
    within("replies", s.eps[0].wait_replies(1)).await.unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    assert!(got[0] == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn get_medium_returns_the_handlers_answer() {
    let s = group("getmedium", 2, |ep| {
        ep.register_handler(40, |call| {
            let mut v = call.payload.to_vec();
            v.reverse();
            Bytes::from(v)
        })
        .unwrap();
    })
    .await;
    let answer = within(
        "get-medium",
        s.eps[0].get_medium(1, Call::handler(40, 0), b"abc"),
    )
    .await
    .unwrap();
    assert_eq!(&answer[..], b"cba");
}

/// Every message type, byte for byte, on random shapes: contiguous,
/// strided and vectored puts land exactly where their shape says and
/// nowhere else; gets read back what is there.
#[test]
fn every_message_type_lands_byte_for_byte_on_random_shapes() {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let s = rt.block_on(group("shapes", 2, |ep| {
        ep.register_segment(SEG, Acl::ReadWrite);
    }));
    let a = &s.eps[0];
    let target = s.eps[1].segment(0).unwrap();
    let shape = prop_oneof![
        (0u64..SEG as u64, 0usize..300_000).prop_map(|(o, n)| (
            Shape::Contiguous {
                offset: o.min((SEG - n) as u64)
            },
            n
        )),
        (0u64..4096, 1u32..3000, 0u64..2000, 0u32..200).prop_map(|(o, block, gap, count)| {
            let stride = u64::from(block) + gap;
            (
                Shape::Strided {
                    offset: o,
                    stride,
                    block,
                    count,
                },
                block as usize * count as usize,
            )
        }),
        proptest::collection::vec((0u64..(SEG as u64 - 70_000), 0u32..70_000), 0..40).prop_map(
            |v| {
                let n = v.iter().map(|(_, l)| *l as usize).sum();
                (Shape::Vectored(v), n)
            }
        ),
    ];
    let mut runner = TestRunner::new(PropConfig {
        cases: 40,
        ..PropConfig::default()
    });
    runner
        .run(&(shape, any::<u8>()), |((shape, n), seed)| {
            let data = pattern(n, seed);
            // What the segment should hold afterwards.
            let mut expect = target.to_vec();
            let mut at = 0usize;
            for i in 0..shape.pieces(n as u64) {
                let (off, len) = shape.piece(i, n as u64);
                expect[off as usize..(off + len) as usize]
                    .copy_from_slice(&data[at..at + len as usize]);
                at += len as usize;
            }
            rt.block_on(async {
                within(
                    "put",
                    a.long_shaped(1, 0, shape.clone(), &data, Call::NONE, Completion::Reply),
                )
                .await
                .unwrap();
                within("quiet", a.quiet()).await.unwrap();
            });
            prop_assert!(
                target.to_vec() == expect,
                "segment differs after {:?}",
                shape
            );
            // Gets read it back, from any offset.
            let (off, len) = match &shape {
                Shape::Contiguous { offset } => (*offset, n),
                _ => (0, 200_000),
            };
            let back = rt.block_on(within("get", a.get(1, 0, off, len))).unwrap();
            prop_assert!(back[..] == expect[off as usize..off as usize + len]);
            Ok(())
        })
        .unwrap();
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_counter_hammered_with_fetch_add_by_every_endpoint_ends_exact() {
    const N: usize = 4;
    const EACH: u64 = 200;
    let s = group("hammer", N, |ep| {
        ep.register_segment(64, Acl::ReadWrite);
    })
    .await;
    let olds = futures_util::future::join_all(s.eps.iter().map(|ep| async move {
        let mut olds = Vec::new();
        for _ in 0..EACH {
            olds.push(
                ep.atomic(0, 0, 8, Width::W64, AtomicOp::FetchAdd(1))
                    .await
                    .unwrap(),
            );
            ep.atomic(0, 0, 4, Width::W32, AtomicOp::FetchAdd(1))
                .await
                .unwrap();
        }
        olds
    }));
    let mut olds: Vec<u64> = within("hammer", olds).await.into_iter().flatten().collect();
    olds.sort_unstable();
    // Linearizable: every old value seen exactly once.
    assert_eq!(olds, (0..N as u64 * EACH).collect::<Vec<_>>());
    let seg = s.eps[0].segment(0).unwrap();
    assert_eq!(seg.read(8, 8).unwrap(), (N as u64 * EACH).to_le_bytes());
    assert_eq!(
        seg.read(4, 4).unwrap(),
        (N as u32 * EACH as u32).to_le_bytes()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn compare_swap_and_swap_return_the_old_value() {
    let s = group("cas", 2, |ep| {
        ep.register_segment(64, Acl::ReadWrite);
    })
    .await;
    let a = &s.eps[0];
    let cas = |expected, new| AtomicOp::CompareSwap { expected, new };
    assert_eq!(
        within("cas", a.atomic(1, 0, 0, Width::W64, cas(0, 5)))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        within("cas", a.atomic(1, 0, 0, Width::W64, cas(0, 9)))
            .await
            .unwrap(),
        5,
        "no swap"
    );
    assert_eq!(
        within("swap", a.atomic(1, 0, 0, Width::W64, AtomicOp::Swap(11)))
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        within("cas32", a.atomic(1, 0, 12, Width::W32, cas(0, 3)))
            .await
            .unwrap(),
        0
    );
    let seg = s.eps[1].segment(0).unwrap();
    assert_eq!(seg.read(0, 8).unwrap(), 11u64.to_le_bytes());
    assert_eq!(seg.read(12, 4).unwrap(), 3u32.to_le_bytes());
}

fn refused(r: Result<impl std::fmt::Debug, PgasError>) -> Refusal {
    match r {
        Err(PgasError::Refused { rank: 1, refusal }) => refusal,
        other => panic!("expected a refusal from rank 1, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_accesses_are_refused_at_the_sender_counted_at_the_target_and_never_written() {
    let s = group("refuse", 3, |ep| {
        ep.register_segment(1024, Acl::ReadWrite);
        ep.register_segment(64, Acl::Ranks([2].into()));
        ep.register_segment(64, Acl::ReadOnly);
    })
    .await;
    let a = &s.eps[0];
    let big = vec![1u8; 200_000];
    // Out of bounds: a long that starts inside and ends outside, in many frames.
    let r = within(
        "oob",
        a.long(1, 0, 1000, &big, Call::NONE, Completion::Reply),
    )
    .await;
    r.unwrap();
    assert_eq!(
        refused(within("replies", a.wait_replies(1)).await),
        Refusal::OutOfBounds
    );
    // Unregistered segment, async: quiet reports it.
    within(
        "noseg",
        a.long(1, 9, 0, b"x", Call::NONE, Completion::Async),
    )
    .await
    .unwrap();
    assert_eq!(
        refused(within("quiet", a.quiet()).await),
        Refusal::NoSegment
    );
    // Unknown handler: nothing lands either.
    within(
        "nohandler",
        a.long(1, 0, 0, b"yy", Call::handler(999, 0), Completion::Reply),
    )
    .await
    .unwrap();
    assert_eq!(
        refused(within("replies", a.wait_replies(3)).await),
        Refusal::NoHandler
    );
    assert_eq!(
        refused(within("short", a.get_medium(1, Call::handler(998, 0), b"")).await),
        Refusal::NoHandler
    );
    // The ACL: segment 1 is rank 2's alone, segment 2 is read-only.
    assert_eq!(
        refused(within("acl", a.atomic(1, 1, 0, Width::W64, AtomicOp::Swap(1))).await),
        Refusal::Denied
    );
    assert_eq!(
        refused(within("ro", a.atomic(1, 2, 0, Width::W64, AtomicOp::Swap(1))).await),
        Refusal::Denied
    );
    assert!(
        within("ro get", a.get(1, 2, 0, 64)).await.is_ok(),
        "read-only may be read"
    );
    within(
        "rank2",
        s.eps[2].atomic(1, 1, 0, Width::W64, AtomicOp::Swap(1)),
    )
    .await
    .unwrap();
    assert_eq!(
        refused(
            within(
                "misaligned",
                a.atomic(1, 0, 3, Width::W32, AtomicOp::Swap(1))
            )
            .await
        ),
        Refusal::Misaligned
    );
    assert_eq!(
        refused(within("oob get", a.get(1, 0, 1000, 25)).await),
        Refusal::OutOfBounds
    );

    let stats = s.eps[1].stats();
    assert_eq!(stats.out_of_bounds, 2);
    assert_eq!(stats.no_segment, 1);
    assert_eq!(stats.no_handler, 2);
    assert_eq!(stats.denied, 2);
    assert_eq!(stats.misaligned, 1);
    assert_eq!(stats.malformed, 0);
    let seg = s.eps[1].segment(0).unwrap();
    assert_eq!(seg.to_vec(), vec![0; 1024], "nothing written");
    assert_eq!(s.eps[1].mem(), 0);
    // The connection is still good after all that.
    within(
        "after",
        a.long(1, 0, 0, b"ok", Call::NONE, Completion::Reply),
    )
    .await
    .unwrap();
    within("quiet", a.quiet()).await.unwrap();
    assert_eq!(seg.read(0, 2).unwrap(), b"ok");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn close_delivers_what_was_sent_and_ends_the_endpoints_sending() {
    let s = group("close", 2, |ep| {
        ep.register_segment(200_000, Acl::ReadWrite);
    })
    .await;
    let (a, b) = (&s.eps[0], &s.eps[1]);
    let data = pattern(200_000, 7);
    a.long(1, 0, 0, &data, Call::counter(1), Completion::Async)
        .await
        .unwrap();
    // Close returns once rank 1 holds all of it (and the counter ran).
    within("close", a.close()).await.unwrap();
    assert_eq!(b.counter(), 1);
    assert!(b.segment(0).unwrap().read(0, 200_000).unwrap() == data);
    // Rank 0 has left: it sends nothing more, and a call to it fails
    // rather than waiting for a reply that cannot come.
    let after = a.short(1, Call::NONE, Completion::Reply).await;
    assert!(matches!(after, Err(PgasError::Closed(1))), "{after:?}");
    let get = within("get", b.get(0, 0, 0, 8)).await;
    assert!(matches!(get, Err(PgasError::Closed(0))), "{get:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_barrier_completes_every_put_before_it_everywhere() {
    const N: usize = 4;
    let s = group("barrier", N, |ep| {
        ep.register_segment(N * 100_000, Acl::ReadWrite);
    })
    .await;
    for round in 0..3u8 {
        let work = s.eps.iter().enumerate().map(|(r, ep)| async move {
            for dst in 0..N {
                let data = pattern(100_000, round.wrapping_add(r as u8));
                ep.long(
                    dst,
                    0,
                    (r * 100_000) as u64,
                    &data,
                    Call::NONE,
                    Completion::Async,
                )
                .await
                .unwrap();
            }
            ep.barrier().await.unwrap();
        });
        within("round", futures_util::future::join_all(work)).await;
        for ep in &s.eps {
            let seg = ep.segment(0).unwrap();
            for r in 0..N {
                assert!(
                    seg.read(r * 100_000, 100_000).unwrap()
                        == pattern(100_000, round.wrapping_add(r as u8))
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_target_that_stops_processing_pushes_back_on_its_sender() {
    // Closed until the test opens it: the handler blocks the target.
    let gate = Arc::new(Gate::default());
    // Opened when the test ends, also by a failed assertion: a handler
    // still blocked would keep the runtime from shutting down.
    let _open_at_end = OpenOnDrop(gate.clone());
    let options = Options::default();
    let credit = options.credit_bytes as u64;
    let s = group_with("pushback", 2, options, |ep| {
        let gate = gate.clone();
        ep.register_handler(50, move |_| {
            // Off the runtime's worker: tasks queued on it keep running.
            tokio::task::block_in_place(|| gate.wait());
            Bytes::new()
        })
        .unwrap();
    })
    .await;
    let sent = Arc::new(AtomicU64::new(0));
    let sender = {
        let sent = sent.clone();
        let ep = s.eps[0].clone();
        tokio::spawn(async move {
            for _ in 0..2000 {
                ep.short(1, Call::handler(50, 0), Completion::Async)
                    .await
                    .unwrap();
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Each frame costs at least 512 bytes of credit: the sender gets that
    // many out, then waits.
    let window = credit / 512;
    within("fill", async {
        while s.eps[0].credit(1).unwrap() > 0 || sent.load(Ordering::SeqCst) < window {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(sent.load(Ordering::SeqCst), window);
    assert!(!sender.is_finished());
    gate.open();
    within("drain", sender).await.unwrap();
    within("quiet", s.eps[0].quiet()).await.unwrap();
    assert_eq!(
        s.eps[1].stats().frames,
        2000 + 1,
        "every short and the quiet's flush"
    );
}

/// A gate handlers wait at until the test opens it.
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Gate {
    fn wait(&self) {
        let guard = self.open.lock().unwrap_or_else(|e| e.into_inner());
        drop(self.cv.wait_while(guard, |o| !*o));
    }

    fn open(&self) {
        *self.open.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.cv.notify_all();
    }
}

struct OpenOnDrop(Arc<Gate>);

impl Drop for OpenOnDrop {
    fn drop(&mut self) {
        self.0.open();
    }
}
