//! Helpers the stack tests share.
#![allow(dead_code)]

use std::future::Future;
use std::net::Ipv4Addr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::{Message, Uid};
use uniplane_stacks::ltl::wire::{payload_checksum, Kind, Repr};

/// A SEND whose sequence number and payload say `i`.
pub fn msg(i: u32, payload_len: usize) -> Message {
    let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
    let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
    let mut payload = vec![(i % 251) as u8; payload_len.max(4)];
    payload[..4].copy_from_slice(&i.to_be_bytes());
    let mut m = Message::send(a, b, Bytes::from(payload)).unwrap();
    m.set_seqnum(i);
    m
}

/// An LTL frame's bytes, through the wire encoder.
pub fn ltl_frame(
    kind: Kind,
    src: u32,
    dst: u32,
    seq: u32,
    ack: u32,
    window: u32,
    payload: &[u8],
) -> Vec<u8> {
    let mut out = BytesMut::new();
    Repr {
        kind,
        src_conn: src,
        dst_conn: dst,
        seq,
        ack,
        window,
    }
    .emit(payload, payload_checksum(payload), &mut out);
    out.to_vec()
}

/// Runs `f`, failing the test if it takes longer than `secs` seconds.
pub async fn within<F: Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

/// Whether tests that need a capability must fail instead of skipping.
pub fn tools_required() -> bool {
    std::env::var_os("UNIPLANE_REQUIRE_TOOLS").is_some_and(|v| v == "1")
}
