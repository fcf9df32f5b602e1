//! Payloads that come from a stream (Shoal's payload from a kernel's
//! stream instead of its memory): a medium and a long message whose
//! bytes arrive in uneven chunks, over many frames, land byte for byte;
//! a stream that ends short is an error and its message is cut at the
//! target (no handler, refused `Malformed`); one that yields more than
//! declared sends only what was declared. Every wait has a deadline.

mod common;

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::{group, within};
use futures_util::stream;
use uniplane_pgas::{Acl, Call, Completion, PgasError, Shape};

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(37).wrapping_add(seed))
        .collect()
}

/// `data` cut into chunks of 1 B to about 100 KiB (uneven, so frames and
/// chunks never line up).
fn chunks(data: &[u8]) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut k = 1usize;
    while at < data.len() {
        let n = (k * k * 97 % 100_003 + 1).min(data.len() - at);
        out.push(Bytes::copy_from_slice(&data[at..at + n]));
        at += n;
        k += 1;
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_long_message_from_a_stream_lands_byte_for_byte_in_its_shape() {
    let s = group("stream-long", 2, |ep| {
        ep.register_segment(4 << 20, Acl::ReadWrite);
    })
    .await;
    let data = pattern(3 << 20, 3);
    let parts = chunks(&data);
    assert!(parts.len() > 20);
    within(
        "long from a stream",
        s.eps[0].long_from_stream(
            1,
            0,
            Shape::Contiguous { offset: 4096 },
            data.len() as u64,
            stream::iter(parts),
            Call::counter(1),
            Completion::Reply,
        ),
    )
    .await
    .unwrap();
    within("counter", s.eps[1].wait_counter(1)).await;
    within("replies", s.eps[0].wait_replies(1)).await.unwrap();
    let seg = s.eps[1].segment(0).unwrap();
    assert!(
        seg.read(4096, data.len()).unwrap() == data,
        "landed bytes differ"
    );
    assert_eq!(
        seg.read(0, 4096).unwrap(),
        vec![0; 4096],
        "nothing before it"
    );
    // Strided: 100 blocks of 1000 B, 3000 B apart.
    let blocks = pattern(100_000, 8);
    within(
        "strided from a stream",
        s.eps[0].long_from_stream(
            1,
            0,
            Shape::Strided {
                offset: 0,
                block: 1000,
                stride: 3000,
                count: 100,
            },
            blocks.len() as u64,
            stream::iter(chunks(&blocks)),
            Call::counter(1),
            Completion::Reply,
        ),
    )
    .await
    .unwrap();
    within("counter", s.eps[1].wait_counter(2)).await;
    for b in 0..100 {
        assert_eq!(
            seg.read(b * 3000, 1000).unwrap(),
            &blocks[b * 1000..(b + 1) * 1000],
            "block {b}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_medium_message_from_a_stream_reaches_its_handler_whole() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let s = group("stream-medium", 2, |ep| {
        let got = got.clone();
        ep.register_handler(30, move |call| {
            got.lock().unwrap().push(call.payload.to_vec());
            Bytes::new()
        })
        .unwrap();
    })
    .await;
    let data = pattern(1 << 20, 1);
    within(
        "medium from a stream",
        s.eps[0].medium_from_stream(
            1,
            Call::handler(30, 0),
            data.len() as u64,
            stream::iter(chunks(&data)),
            Completion::Reply,
        ),
    )
    .await
    .unwrap();
    within("replies", s.eps[0].wait_replies(1)).await.unwrap();
    let got = got.lock().unwrap();
    assert_eq!(got.len(), 1);
    assert!(got[0] == data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_that_ends_short_is_an_error_and_its_message_is_cut() {
    let got = Arc::new(Mutex::new(Vec::new()));
    let s = group("stream-short", 2, |ep| {
        let got = got.clone();
        ep.register_handler(30, move |call| {
            got.lock().unwrap().push(call.payload.len());
            Bytes::new()
        })
        .unwrap();
    })
    .await;
    let data = pattern(200_000, 2);
    let e = within(
        "short stream",
        s.eps[0].medium_from_stream(
            1,
            Call::handler(30, 0),
            300_000,
            stream::iter(chunks(&data)),
            Completion::Reply,
        ),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, PgasError::Invalid(m) if m.contains("200000 of the 300000")),
        "{e}"
    );
    // The next request cuts it at the target: refused, no handler ran;
    // the request after it is served.
    within(
        "next",
        s.eps[0].medium(1, Call::handler(30, 0), b"after", Completion::Reply),
    )
    .await
    .unwrap();
    within("quiet", s.eps[0].quiet()).await.ok();
    assert_eq!(*got.lock().unwrap(), vec![5], "only the whole message ran");
    assert_eq!(s.eps[1].stats().malformed, 1, "{:?}", s.eps[1].stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stream_longer_than_declared_sends_only_what_was_declared() {
    let s = group("stream-long-over", 2, |ep| {
        ep.register_segment(1 << 20, Acl::ReadWrite);
    })
    .await;
    let data = pattern(100_000, 4);
    let e = within(
        "over-long stream",
        s.eps[0].long_from_stream(
            1,
            0,
            Shape::Contiguous { offset: 0 },
            60_000,
            stream::iter(vec![Bytes::copy_from_slice(&data)]),
            Call::counter(1),
            Completion::Reply,
        ),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&e, PgasError::Invalid(m) if m.contains("more than the 60000")),
        "{e}"
    );
    within("counter", s.eps[1].wait_counter(1)).await;
    let seg = s.eps[1].segment(0).unwrap();
    assert!(seg.read(0, 60_000).unwrap() == data[..60_000]);
    assert_eq!(seg.read(60_000, 40_000).unwrap(), vec![0; 40_000]);
}
