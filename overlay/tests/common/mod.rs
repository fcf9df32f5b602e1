//! Helpers the engine's and the shards' tests share: messages between
//! app UIDs, and sending and receiving on a ring link without waiting.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::noop_waker;
use futures_util::{Sink, Stream};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::{Message, Uid};

pub fn uid(device: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), device)
}

pub fn msg(src: u16, dst: u16, seq: u32, len: usize) -> Message {
    let mut m = Message::send(
        uid(src).port(1),
        uid(dst).port(2),
        Bytes::from(vec![seq as u8; len]),
    )
    .unwrap();
    m.set_seqnum(seq);
    m
}

/// Sends without waiting: the message back when the link is full.
pub fn try_send(link: &mut RingLink, m: Message) -> Result<(), Message> {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    match Pin::new(&mut *link).poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => {
            Pin::new(&mut *link).start_send(m).unwrap();
            Ok(())
        }
        _ => Err(m),
    }
}

pub fn flush(link: &mut RingLink) {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let _ = Pin::new(link).poll_flush(&mut cx);
}

pub fn try_recv(link: &mut RingLink) -> Option<Message> {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    match Pin::new(link).poll_next(&mut cx) {
        Poll::Ready(Some(Ok(m))) => Some(m),
        _ => None,
    }
}

/// A thread that sends `count` messages of `len` bytes from UID `src` to
/// UID `dst` on `link` (sequence numbers 0, 1, …), as fast as the link
/// takes them, and gives the link back; it fails past `deadline`.
pub fn sender(
    mut link: RingLink,
    src: u16,
    dst: u16,
    count: u32,
    len: usize,
    deadline: std::time::Duration,
) -> std::thread::JoinHandle<RingLink> {
    std::thread::spawn(move || {
        let start = std::time::Instant::now();
        let mut next = 0;
        while next < count {
            assert!(start.elapsed() < deadline, "sender {src} stuck at {next}");
            while next < count && try_send(&mut link, msg(src, dst, next, len)).is_ok() {
                next += 1;
            }
            flush(&mut link);
            std::thread::yield_now();
        }
        link
    })
}
