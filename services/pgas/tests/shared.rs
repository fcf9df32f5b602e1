//! Ranks of one server reaching each other's segments through shared
//! memory (`Options::share`): the same results as by message, the same
//! refusals, and ordering with requests still travelling.

mod common;

use common::{group, group_with, within};
use uniplane_pgas::{Acl, Call, Completion, DirectStats, Options, PgasError, Refusal, Shape};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

fn refused<T: std::fmt::Debug>(r: Result<T, PgasError>) -> Refusal {
    match r {
        Err(PgasError::Refused { refusal, .. }) => refusal,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn puts_and_gets_between_ranks_of_one_server_copy_through_shared_segments() {
    let s = group("direct", 2, |ep| {
        ep.register_segment(1 << 20, Acl::ReadWrite);
        ep.register_segment(4096, Acl::ReadOnly);
        ep.register_segment(4096, Acl::Ranks([0, 1].into()));
    })
    .await;
    let (a, b) = (&s.eps[0], &s.eps[1]);
    let seg = b.segment(0).unwrap();
    assert!(seg.is_shared() && b.segment(1).unwrap().is_shared());
    assert!(
        !b.segment(2).unwrap().is_shared(),
        "a rank list stays private"
    );

    let mut total = 0u64;
    for (i, (offset, len)) in [(0usize, 8usize), (777, 70_000), (100_000, 900_000)]
        .into_iter()
        .enumerate()
    {
        let data = pattern(len, i as u8);
        within(
            "put",
            a.long(
                1,
                0,
                offset as u64,
                &data,
                Call::counter(1),
                Completion::Reply,
            ),
        )
        .await
        .unwrap();
        total += len as u64;
        within("mem", b.wait_mem(total)).await;
        within("counter", b.wait_counter(i as u64 + 1)).await;
        assert!(seg.read(offset, len).unwrap() == data, "put {i} differs");
        let back = within("get", a.get(1, 0, offset as u64, len))
            .await
            .unwrap();
        assert!(back == data, "get {i} differs");
        let mut into = vec![0u8; len];
        within("get_into", a.get_into(1, 0, offset as u64, &mut into))
            .await
            .unwrap();
        assert!(into == data, "get_into {i} differs");
    }
    within("replies", a.wait_replies(3)).await.unwrap();
    let direct = a.direct_stats();
    assert_eq!((direct.puts, direct.gets), (3, 6), "{direct:?}");
    assert_eq!(direct.bytes, 3 * total);
    let st = b.stats();
    assert_eq!(
        st.out_of_bounds + st.denied + st.no_handler + st.malformed,
        0
    );

    // Refusals are the message path's: counted at the target, nothing
    // written, nothing moved directly.
    within(
        "oob",
        a.long(1, 0, (1 << 20) - 4, b"12345", Call::NONE, Completion::Async),
    )
    .await
    .unwrap();
    assert_eq!(
        refused(within("quiet", a.quiet()).await),
        Refusal::OutOfBounds
    );
    within("ro", a.long(1, 1, 0, b"no", Call::NONE, Completion::Reply))
        .await
        .unwrap();
    within(
        "handler",
        a.long(1, 0, 0, b"no", Call::handler(999, 0), Completion::Reply),
    )
    .await
    .unwrap();
    // Quiet: both were processed (and refused) at the target.
    let r = within("quiet", a.quiet()).await;
    assert!(r.is_err(), "{r:?}");
    let stats = b.stats();
    assert_eq!(
        (stats.out_of_bounds, stats.denied, stats.no_handler),
        (1, 1, 1)
    );
    assert_eq!(&seg.read((1 << 20) - 4, 4).unwrap(), &[0, 0, 0, 0]);
    assert_eq!(seg.read(0, 2).unwrap(), pattern(8, 0)[..2]);
    assert!(b.segment(1).unwrap().to_vec().iter().all(|&x| x == 0));
    assert_eq!(a.direct_stats().puts, 3);
    let oob = within("oob get", a.get(1, 0, 1 << 20, 1)).await;
    assert_eq!(refused(oob), Refusal::OutOfBounds);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_direct_put_never_overtakes_a_put_still_travelling() {
    const LEN: usize = 200_000;
    let s = group("order", 2, |ep| {
        ep.register_segment(LEN, Acl::ReadWrite);
    })
    .await;
    let (a, b) = (&s.eps[0], &s.eps[1]);
    let seg = b.segment(0).unwrap();
    for round in 0..20u8 {
        // The first goes as frames (a strided shape), the second could go
        // directly: it must land after the first.
        let first = pattern(LEN, round);
        let second = pattern(LEN, round.wrapping_add(100));
        let strided = Shape::Strided {
            offset: 0,
            block: 1000,
            stride: 1000,
            count: (LEN / 1000) as u32,
        };
        within(
            "strided",
            a.long_shaped(1, 0, strided, &first, Call::NONE, Completion::Async),
        )
        .await
        .unwrap();
        within(
            "contiguous",
            a.long(1, 0, 0, &second, Call::NONE, Completion::Async),
        )
        .await
        .unwrap();
        within("quiet", a.quiet()).await.unwrap();
        assert!(
            seg.read(0, LEN).unwrap() == second,
            "round {round}: the later put was overwritten by the earlier"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_sharing_the_same_puts_go_by_message() {
    let options = Options {
        share: false,
        ..Options::default()
    };
    let s = group_with("private", 2, options, |ep| {
        ep.register_segment(1 << 20, Acl::ReadWrite);
    })
    .await;
    let (a, b) = (&s.eps[0], &s.eps[1]);
    assert!(!b.segment(0).unwrap().is_shared());
    let data = pattern(1 << 20, 3);
    within(
        "put",
        a.long(1, 0, 0, &data, Call::counter(1), Completion::Reply),
    )
    .await
    .unwrap();
    within("replies", a.wait_replies(1)).await.unwrap();
    assert!(within("get", a.get(1, 0, 0, 1 << 20)).await.unwrap() == data);
    let mut into = vec![0u8; 1000];
    within("get_into", a.get_into(1, 0, 5, &mut into))
        .await
        .unwrap();
    assert!(into == data[5..1005]);
    assert_eq!(a.direct_stats(), DirectStats::default());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rank_that_leaves_takes_its_segments_out_of_reach() {
    let s = group("leave", 2, |ep| {
        ep.register_segment(4096, Acl::ReadWrite);
    })
    .await;
    let (a, b) = (&s.eps[0], &s.eps[1]);
    within(
        "put",
        b.long(0, 0, 0, b"kept", Call::NONE, Completion::Reply),
    )
    .await
    .unwrap();
    within("replies", b.wait_replies(1)).await.unwrap();
    assert_eq!(b.direct_stats().puts, 1);
    within("close", a.close()).await.unwrap();
    // Rank 0's bytes are its own again, with what rank 1 put.
    let mine = a.segment(0).unwrap();
    assert!(!mine.is_shared());
    assert_eq!(mine.read(0, 4).unwrap(), b"kept");
    // Rank 1 reaches it no more: not directly, and a get by message
    // gets no answer from a rank that left.
    let get = within("late get", b.get(0, 0, 0, 4)).await;
    assert!(matches!(get, Err(PgasError::Closed(0))), "{get:?}");
    assert_eq!(b.direct_stats().gets, 0);
}
