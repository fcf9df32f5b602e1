//! Helpers the engine's and the shards' tests share: messages between
//! app UIDs, and sending and receiving on a ring link without waiting.

// Each test binary uses its own subset.
#![allow(dead_code)]

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures_util::task::noop_waker;
use std::collections::BTreeMap;
use std::time::Instant;

use uniplane_dataplane::{Link, Message, Uid};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{ForwardingPlane, PortId};

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
pub fn try_send<L: Link>(link: &mut L, m: Message) -> Result<(), Message> {
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

pub fn flush<L: Link>(link: &mut L) {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let _ = Pin::new(link).poll_flush(&mut cx);
}

pub fn try_recv<L: Link>(link: &mut L) -> Option<Message> {
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
pub fn sender<L: Link + 'static>(
    mut link: L,
    src: u16,
    dst: u16,
    count: u32,
    len: usize,
    deadline: std::time::Duration,
) -> std::thread::JoinHandle<L> {
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

/// Ports 0..n are apps with UIDs 1..=n on `plane`: every port routes each
/// UID to its port; `deny` lists inputs with no ACL rule (everything they
/// send is answered `Denied`); UID n+1 has no route (answered `NoRoute`).
pub fn rules(plane: &mut dyn ForwardingPlane, n: usize, deny: &[usize]) {
    for p in 0..n as PortId {
        if !deny.contains(&(p as usize)) {
            plane.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
        }
        for d in 0..n as PortId {
            plane.add_route(p, Route::exact(uid(d + 1), d)).unwrap();
        }
    }
}

/// What one port received: per (source UID, status flag) the sequence
/// numbers in arrival order.
pub type Received = BTreeMap<(String, bool), Vec<u32>>;

/// Sends `traffic[i]` from port i (in order) and collects what every port
/// receives until `expect` messages arrived. `step` runs the plane once
/// when it is stepped by hand (the single engine); a spawned one runs by
/// itself.
pub fn exchange<L: Link>(
    links: &mut [L],
    traffic: &[Vec<Message>],
    expect: usize,
    deadline: std::time::Duration,
    mut step: impl FnMut(),
) -> Vec<Received> {
    let mut next = vec![0usize; links.len()];
    let mut got: Vec<Received> = vec![BTreeMap::new(); links.len()];
    let mut count = 0;
    let start = Instant::now();
    while count < expect {
        assert!(start.elapsed() < deadline, "{count} of {expect} arrived");
        for (i, link) in links.iter_mut().enumerate() {
            while next[i] < traffic[i].len() {
                if try_send(link, traffic[i][next[i]].clone()).is_err() {
                    break;
                }
                next[i] += 1;
            }
            flush(link);
        }
        step();
        for (i, link) in links.iter_mut().enumerate() {
            while let Some(m) = try_recv(link) {
                let h = m.header();
                let error = h.flags.contains(uniplane_dataplane::wire::MsgFlags::ERROR);
                got[i]
                    .entry((h.src.to_string(), error))
                    .or_default()
                    .push(h.seqnum);
                count += 1;
            }
        }
        std::thread::yield_now();
    }
    got
}

/// Checks that each source's sequence numbers arrive as 0, 1, 2, … (no
/// loss, duplicate or reordering within a flow).
#[derive(Default)]
pub struct FlowOrder(std::collections::HashMap<Uid, u32>);

impl FlowOrder {
    pub fn check(&mut self, m: &Message) {
        let h = m.header();
        let prev = self.0.insert(h.src, h.seqnum);
        assert_eq!(
            prev.map_or(0, |p| p + 1),
            h.seqnum,
            "flow {} reordered or lost",
            h.src
        );
    }
}

/// Receives `expect` messages on `sink`, each flow in order, failing past
/// `deadline`.
pub fn receive_in_order<L: Link>(sink: &mut L, expect: u64, deadline: std::time::Duration) {
    let mut order = FlowOrder::default();
    let mut received = 0u64;
    let start = Instant::now();
    while received < expect {
        assert!(start.elapsed() < deadline, "{received} received");
        match try_recv(sink) {
            Some(m) => {
                order.check(&m);
                received += 1;
            }
            None => std::thread::yield_now(),
        }
    }
}
