//! Helpers the stack tests share.
#![allow(dead_code)]

use std::future::Future;
use std::net::Ipv4Addr;
use std::time::Duration;

use bytes::Bytes;
use uniplane_dataplane::{Message, Uid};

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
