//! The inline fast path's pass on one thread: what a sender spends to
//! forward a 64-byte message through the engine (ACL, forwarding table,
//! counters, crossbar, scheduler, the receiver's ring), against the same
//! message over a bare ring pair. No second thread touches the engine, so
//! the figure is the pass's own work, free of the cache-line transfers a
//! round trip between two cores adds (`uniplane-bench overhead` measures
//! those).
//!
//! Run: `cargo bench -p uniplane-overlay --bench inline`
//!
//! For an instruction count that a loaded machine does not disturb, run
//! the bench binary under callgrind and read the `forward` function's
//! inclusive count per call:
//! `valgrind --tool=callgrind --toggle-collect='*forward_through_engine*'
//! <bench binary> --bench --profile-time 1 inline/engine`

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use futures_util::task::noop_waker;
use uniplane_dataplane::ring::{ring_link, RingLink};
use uniplane_dataplane::{Link, Message, Uid};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{Engine, EngineConfig, ForwardingPlane, InlineLink, PortSpec, RunMode};

fn uid(device: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), device)
}

/// A 64-byte send from UID 1 to UID 2; its payload is static, so cloning
/// it touches no reference count.
fn message() -> Message {
    static PAYLOAD: [u8; 64] = [7; 64];
    Message::send(uid(1).port(1), uid(2).port(2), Bytes::from_static(&PAYLOAD))
        .expect("a 64-byte send is valid")
}

/// Sends `m` on `link` and flushes it.
#[inline(always)]
fn send<L: Link>(link: &mut L, cx: &mut Context<'_>, m: Message) {
    let mut link = Pin::new(link);
    assert!(matches!(link.as_mut().poll_ready(cx), Poll::Ready(Ok(()))));
    link.as_mut().start_send(m).expect("ready");
    let _ = link.as_mut().poll_flush(cx);
}

/// A send on an inline link: the flush runs the engine's pass on this
/// thread.
#[inline(never)]
fn forward_through_engine(link: &mut InlineLink, cx: &mut Context<'_>, m: Message) {
    send(link, cx, m)
}

/// The same send over a bare ring pair, for comparison.
#[inline(never)]
fn forward_over_ring(link: &mut RingLink, cx: &mut Context<'_>, m: Message) {
    send(link, cx, m)
}

/// Takes the one message forwarded to `link`. It is there at once unless
/// the engine's thread held the engine (its timed pass): then that thread
/// forwards it as it lets go.
fn take<L: Link>(link: &mut L, cx: &mut Context<'_>, inbox: &mut Vec<Message>) {
    inbox.clear();
    let mut deadline = None;
    loop {
        if let Poll::Ready(Ok(1)) = link.poll_recv_batch(cx, inbox, 32) {
            return;
        }
        let d = *deadline.get_or_insert_with(|| Instant::now() + Duration::from_secs(5));
        assert!(Instant::now() < d, "the message did not arrive");
        std::hint::spin_loop();
    }
}

fn inline(c: &mut Criterion) {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let m = message();
    let mut inbox = Vec::with_capacity(32);
    let mut group = c.benchmark_group("inline");
    group.throughput(Throughput::Elements(1));

    let (mut tx, mut port) = ring_link(EngineConfig::default().ring_depth);
    group.bench_function("ring", |bench| {
        bench.iter(|| {
            forward_over_ring(&mut tx, &mut cx, black_box(m.clone()));
            inbox.clear();
            port.input.pop_into(&mut inbox, 32);
            port.input.release();
            black_box(&inbox);
        })
    });

    // The engine's thread parks: only this thread forwards.
    let mut h = Engine::new(EngineConfig::default()).spawn(RunMode::SpinThenPark { spins: 1 });
    let (a, mut from) = h.attach_inline(PortSpec::app("from")).unwrap();
    let (b, mut to) = h.attach_inline(PortSpec::app("to")).unwrap();
    for p in [a, b] {
        h.add_acl_rule(p, AclRule::ALLOW_ALL).unwrap();
    }
    h.add_route(a, Route::exact(uid(2), b)).unwrap();
    group.bench_function("engine", |bench| {
        bench.iter(|| {
            forward_through_engine(&mut from, &mut cx, black_box(m.clone()));
            take(&mut to, &mut cx, &mut inbox);
            black_box(&inbox);
        })
    });
    group.finish();
    drop((from, to));
    let _ = h.stop();
}

criterion_group!(benches, inline);
criterion_main!(benches);
