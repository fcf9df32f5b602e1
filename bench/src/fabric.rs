//! `fabric` (DUA Table 2) and `overhead` (DUA Fig. 11(a)): the overlay
//! engine's throughput and the latency it adds.

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use futures_util::task::noop_waker;
use futures_util::Sink;
use serde_json::{json, Value};
use uniplane_dataplane::ring::{ring, ring_link, RingLink};
use uniplane_dataplane::{Link, Message, Uid};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{Engine, EngineConfig, ForwardingPlane, PortId, PortSpec, RunMode};

use crate::clock::{Clock, MonotonicClock};
use crate::hist::LatencyHistogram as Latency;
use crate::stamp::Stamp;
use crate::BenchError;

const STAMP_LEN: usize = Stamp::LEN;

/// Traffic matrix of `fabric`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matrix {
    /// Every sender to one port.
    AllToOne,
    /// Every port to every other, in turn.
    Uniform,
}

fn uid(device: u16) -> Uid {
    Uid::new(Ipv4Addr::LOCALHOST, device)
}

/// An engine of `ports` app ports (UIDs 1..=ports), every port routing
/// every UID and admitting everything.
fn engine(ports: usize, config: EngineConfig) -> Result<(Engine, Vec<RingLink>), BenchError> {
    let plane = |e: uniplane_overlay::PlaneError| BenchError::Config(e.to_string());
    let mut e = Engine::new(EngineConfig {
        max_ports: ports.max(2),
        table_capacity: config.table_capacity.max(ports),
        ..config
    });
    let mut links = Vec::new();
    for i in 0..ports {
        links.push(e.attach(PortSpec::app(&format!("p{i}"))).map_err(plane)?.1);
    }
    for p in 0..ports as PortId {
        e.add_acl_rule(p, AclRule::ALLOW_ALL).map_err(plane)?;
        for d in 0..ports as PortId {
            e.add_route(p, Route::exact(uid(d + 1), d)).map_err(plane)?;
        }
    }
    Ok((e, links))
}

/// A copy of `template` whose payload (`size` bytes) starts with a fresh
/// timestamp.
fn stamped(
    template: &Message,
    size: usize,
    seq: u64,
    now: u64,
    arena: &mut BytesMut,
) -> Result<Message, BenchError> {
    if arena.capacity() < size {
        *arena = BytesMut::with_capacity((1 << 20).max(size));
    }
    let mut head = [0u8; STAMP_LEN];
    Stamp {
        flow: 0,
        seq,
        tx_ns: now,
        warmup: false,
    }
    .write(&mut head)
    .map_err(|e| BenchError::Config(e.to_string()))?;
    arena.put_slice(&head);
    arena.put_bytes(0, size - STAMP_LEN);
    Message::new(*template.header(), arena.split().freeze())
        .map_err(|e| BenchError::Config(e.to_string()))
}

/// Pushes into a ring link without waiting; gives the message back when full.
fn offer<L: Link>(link: &mut L, cx: &mut Context<'_>, m: Message) -> Result<(), Message> {
    match Pin::new(&mut *link).poll_ready(cx) {
        Poll::Ready(Ok(())) => Pin::new(&mut *link)
            .start_send(m)
            .map_err(|_| unreachable!("room was checked")),
        _ => Err(m),
    }
}

/// Runs `fabric`: `senders` ports send `size`-byte messages by `matrix`
/// for `seconds`; the engine is stepped on this thread and only the CPU
/// time of its steps counts toward `msgs_per_sec` (one engine core; filling
/// and draining the rings is not engine work). Also measures, in
/// the same run, a bare SPSC ring moving the same messages and memcpy.
pub fn run_fabric(
    senders: usize,
    matrix: Matrix,
    size: usize,
    seconds: f64,
) -> Result<Value, BenchError> {
    if !(STAMP_LEN..=Message::MAX_PAYLOAD).contains(&size) {
        return Err(BenchError::Config(format!(
            "size must be {STAMP_LEN}..={}",
            Message::MAX_PAYLOAD
        )));
    }
    let ports = match matrix {
        Matrix::AllToOne => senders + 1,
        Matrix::Uniform => senders.max(2),
    };
    let (mut e, mut links) = engine(
        ports,
        EngineConfig {
            burst: 64,
            voq_depth: 256,
            ring_depth: 1024,
            ..EngineConfig::default()
        },
    )?;
    let template = |s: usize, d: usize| {
        Message::send(
            uid(s as u16 + 1).port(1),
            uid(d as u16 + 1).port(2),
            Bytes::from(vec![0u8; size]),
        )
        .map_err(|e| BenchError::Config(e.to_string()))
    };
    let mut scripts: Vec<Vec<Message>> = vec![Vec::new(); ports];
    let sinks: Vec<usize> = match matrix {
        Matrix::AllToOne => {
            for (s, script) in scripts.iter_mut().enumerate().take(senders) {
                script.push(template(s, senders)?);
            }
            vec![senders]
        }
        Matrix::Uniform => {
            for (s, script) in scripts.iter_mut().enumerate() {
                for k in 1..ports {
                    script.push(template(s, (s + k) % ports)?);
                }
            }
            (0..ports).collect()
        }
    };
    let mut results = drive(&mut e, &mut links, &scripts, &sinks, size, seconds)?;
    results["ports"] = json!(ports);
    Ok(results)
}

/// Steps `e` on this thread for `seconds` (after 100 ms of warm-up):
/// each port `s` sends `scripts[s]` in turn, as fast as its ring takes
/// them, and every port in `sinks` is drained. Only the CPU time of the
/// engine's steps counts toward `msgs_per_sec` (one engine core; filling
/// and draining the rings is not engine work). Also measures, in the same
/// run, a bare SPSC ring moving the same messages and memcpy.
pub(crate) fn drive(
    e: &mut Engine,
    links: &mut [RingLink],
    scripts: &[Vec<Message>],
    sinks: &[usize],
    size: usize,
    seconds: f64,
) -> Result<Value, BenchError> {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let clock = MonotonicClock::new();
    let sources: Vec<usize> = (0..scripts.len())
        .filter(|&s| !scripts[s].is_empty())
        .collect();
    let mut arena = BytesMut::with_capacity(1 << 20);
    let mut latency = Latency::new();
    let mut inbox = Vec::with_capacity(1024);
    let (mut delivered, mut seq, mut engine_ns) = (0u64, 0u64, 0u64);
    let mut next = vec![0usize; scripts.len()];
    let start = Instant::now();
    let run = Duration::from_secs_f64(seconds);
    let warm = Duration::from_millis(100);
    let mut measuring = false;
    while start.elapsed() < run + warm {
        if !measuring && start.elapsed() >= warm {
            measuring = true;
            delivered = 0;
            engine_ns = 0;
            latency = Latency::new();
        }
        // Fill every source's ring (not timed): one message in 64 carries
        // a fresh timestamp, the rest share a payload by reference.
        for &s in &sources {
            loop {
                let t = &scripts[s][next[s] % scripts[s].len()];
                let m = if seq % 64 == 0 {
                    stamped(t, size, seq, clock.now_ns(), &mut arena)?
                } else {
                    t.clone()
                };
                if offer(&mut links[s], &mut cx, m).is_err() {
                    break;
                }
                seq += 1;
                next[s] += 1;
            }
            let _ = Pin::new(&mut links[s]).poll_flush(&mut cx);
        }
        // The engine's own CPU time: a descheduled thread (this machine is
        // shared) does not count as engine work.
        let t0 = thread_cpu_ns();
        e.step(Duration::from_nanos(clock.now_ns()));
        engine_ns += thread_cpu_ns().saturating_sub(t0);
        // Drain every sink (not timed).
        for &k in sinks {
            loop {
                inbox.clear();
                match links[k].poll_recv_batch(&mut cx, &mut inbox, 1024) {
                    Poll::Ready(Ok(n)) if n > 0 => {
                        let now = clock.now_ns();
                        delivered += n as u64;
                        for m in &inbox {
                            if let Ok(s) = Stamp::read(m.payload()) {
                                latency.record(now.saturating_sub(s.tx_ns));
                            }
                        }
                    }
                    _ => break,
                }
            }
        }
    }
    let wall = (start.elapsed() - warm).as_secs_f64();
    let engine_s = engine_ns as f64 / 1e9;
    let msgs = delivered as f64 / engine_s.max(1e-9);
    let (reference, memcpy) = (reference_ring(size, 0.3), memcpy_gbytes(size, 0.3));
    Ok(json!({
        "msgs_per_sec": msgs,
        "gbytes_per_sec": msgs * size as f64 / 1e9,
        "e2e_msgs_per_sec": delivered as f64 / wall,
        "delivered": delivered,
        "engine_seconds": engine_s,
        "latency_ns": latency.percentiles(),
        "reference_msgs_per_sec": reference,
        "memcpy_gbytes_per_sec": memcpy,
    }))
}

/// CPU time this thread has run, in ns.
pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we own; the clock id is valid.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A bare SPSC ring moving the same messages (push and pop on one
/// thread): the software limit the engine is compared with.
pub fn reference_ring(size: usize, seconds: f64) -> f64 {
    let (mut p, mut c) = ring::<Message>(1024);
    let m = Message::send(uid(1).port(1), uid(2).port(2), Bytes::from(vec![0u8; size]))
        .unwrap_or_else(|_| unreachable!());
    let mut out = Vec::with_capacity(64);
    let mut moved = 0u64;
    let start = Instant::now();
    let cpu0 = thread_cpu_ns();
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..64 {
            let _ = p.push(m.clone());
        }
        p.flush();
        out.clear();
        moved += c.pop_into(&mut out, 64) as u64;
        black_box(&out);
    }
    // CPU time, as for the engine: preemption is not the ring's cost.
    moved as f64 / ((thread_cpu_ns() - cpu0) as f64 / 1e9).max(1e-9)
}

/// memcpy bandwidth of `size`-byte copies, GB/s: what a switch that
/// copies payloads would move. Each copy takes the next block of a 4 MiB
/// source pool into the next block of a 4 MiB destination pool — the
/// working set of about a thousand in-flight messages — rather than one
/// cache-hot buffer again and again.
pub fn memcpy_gbytes(size: usize, seconds: f64) -> f64 {
    const POOL: usize = 4 << 20;
    let size = size.clamp(1, POOL);
    let blocks = POOL / size;
    let src = vec![7u8; blocks * size];
    let mut dst = vec![0u8; blocks * size];
    let mut bytes = 0u64;
    let mut i = 0;
    let start = Instant::now();
    let cpu0 = thread_cpu_ns();
    while start.elapsed().as_secs_f64() < seconds {
        for _ in 0..64 {
            let at = i * size;
            dst[at..at + size].copy_from_slice(black_box(&src[at..at + size]));
            black_box(&mut dst);
            bytes += size as u64;
            i = (i + 1) % blocks;
        }
    }
    bytes as f64 / ((thread_cpu_ns() - cpu0) as f64 / 1e9).max(1e-9) / 1e9
}

/// Sends request `i` of a round-trip run: a stamped message from uid 1 to
/// uid 2.
fn ask<L: Link>(
    app: &mut L,
    cx: &mut Context<'_>,
    clock: &MonotonicClock,
    size: usize,
    i: u64,
    arena: &mut BytesMut,
) -> Result<(), BenchError> {
    let to = Message::send(uid(1).port(1), uid(2).port(2), Bytes::new())
        .map_err(|e| BenchError::Config(e.to_string()))?;
    let m = stamped(&to, size, i, clock.now_ns(), arena)?;
    offer(app, cx, m).map_err(|_| BenchError::Config("ring full".into()))?;
    let _ = Pin::new(&mut *app).poll_flush(cx);
    Ok(())
}

/// Spins until the answer comes back on `app` and records its round trip.
fn await_answer<L: Link>(
    app: &mut L,
    cx: &mut Context<'_>,
    clock: &MonotonicClock,
    rtt: &mut Latency,
) {
    loop {
        if let Poll::Ready(Some(Ok(m))) = Pin::new(&mut *app).poll_next(cx) {
            if let Ok(s) = Stamp::read(m.payload()) {
                rtt.record(clock.now_ns() - s.tx_ns);
            }
            return;
        }
        std::hint::spin_loop();
    }
}

/// How a round trip of `overhead` crosses the overlay.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Path {
    /// No overlay: a ring pair to an echo thread.
    Direct,
    /// Through an engine busy-polling on its own thread, the echo port
    /// served by the asking thread.
    EngineThread,
    /// Through inline links to a parked engine: each side forwards on its
    /// own thread, the echo on a thread of its own.
    Inline,
}

/// Echoes what reaches `port` back to UID 1 until `stop`, on a thread of
/// its own.
fn echo_thread<L: Link + 'static>(
    mut port: L,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let waker = noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut inbox = Vec::with_capacity(8);
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            inbox.clear();
            if let Poll::Ready(Ok(n)) = port.poll_recv_batch(&mut cx, &mut inbox, 8) {
                if n > 0 {
                    echo_back(&mut port, &mut cx, &mut inbox);
                    continue;
                }
            }
            std::hint::spin_loop();
        }
    })
}

/// Sends each message of `inbox` back whence it came and flushes once.
fn echo_back<L: Link>(port: &mut L, cx: &mut Context<'_>, inbox: &mut Vec<Message>) {
    for m in inbox.drain(..) {
        let (h, payload) = m.into_parts();
        if let Ok(back) = Message::send(h.dst.port(2), h.src.port(1), payload) {
            let _ = offer(port, cx, back);
        }
    }
    let _ = Pin::new(&mut *port).poll_flush(cx);
}

/// Round trips of `size`-byte messages from this thread to an echo and
/// back along `path`.
fn round_trips(path: Path, size: usize, count: u64) -> Result<Latency, BenchError> {
    let clock = MonotonicClock::new();
    let mut rtt = Latency::new();
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut arena = BytesMut::with_capacity(1 << 20);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let plane = |e: uniplane_overlay::PlaneError| BenchError::Config(e.to_string());
    match path {
        Path::Direct => {
            let (mut app, port) = ring_link(64);
            // The engine's end of a ring pair, echoed as the inline path's
            // echo does on its link: a receive that finds nothing arms the
            // waker (as `poll_recv_batch` does), and each answer is a new
            // message back to its sender, so the two paths differ by the
            // engine alone.
            struct Ends(uniplane_dataplane::ring::RingPort);
            let echo = {
                let stop = stop.clone();
                let mut port = Ends(port);
                std::thread::spawn(move || {
                    let waker = noop_waker();
                    let mut cx = Context::from_waker(&waker);
                    let mut buf = Vec::with_capacity(8);
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        buf.clear();
                        if port.0.input.pop_into(&mut buf, 8) == 0 {
                            match port.0.input.poll_available(&mut cx) {
                                Poll::Ready(true) => {
                                    port.0.input.pop_into(&mut buf, 8);
                                }
                                _ => {
                                    std::hint::spin_loop();
                                    continue;
                                }
                            }
                        }
                        for m in buf.drain(..) {
                            let (h, payload) = m.into_parts();
                            if let Ok(back) = Message::send(h.dst.port(2), h.src.port(1), payload) {
                                let _ = port.0.output.push(back);
                            }
                        }
                        port.0.output.flush();
                    }
                })
            };
            for i in 0..count {
                ask(&mut app, &mut cx, &clock, size, i, &mut arena)?;
                await_answer(&mut app, &mut cx, &clock, &mut rtt);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = echo.join();
        }
        Path::Inline => {
            let mut h =
                Engine::new(EngineConfig::default()).spawn(RunMode::SpinThenPark { spins: 64 });
            let (a, mut app) = h.attach_inline(PortSpec::app("app")).map_err(plane)?;
            let (b, echo) = h.attach_inline(PortSpec::app("echo")).map_err(plane)?;
            wire_echo(&mut h, a, b)?;
            let echo = echo_thread(echo, stop.clone());
            for i in 0..count {
                ask(&mut app, &mut cx, &clock, size, i, &mut arena)?;
                await_answer(&mut app, &mut cx, &clock, &mut rtt);
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let _ = echo.join();
            drop(h.stop());
        }
        Path::EngineThread => {
            let mut h = Engine::new(EngineConfig::default()).spawn(RunMode::BusyPoll);
            let (a, mut app) = h.attach(PortSpec::app("app")).map_err(plane)?;
            let (b, mut echo) = h.attach(PortSpec::app("echo")).map_err(plane)?;
            wire_echo(&mut h, a, b)?;
            let mut inbox = Vec::with_capacity(4);
            for i in 0..count {
                ask(&mut app, &mut cx, &clock, size, i, &mut arena)?;
                // Echo: what reaches port b goes back to uid 1.
                loop {
                    inbox.clear();
                    if let Poll::Ready(Ok(n)) = echo.poll_recv_batch(&mut cx, &mut inbox, 4) {
                        if n > 0 {
                            echo_back(&mut echo, &mut cx, &mut inbox);
                            break;
                        }
                    }
                    std::hint::spin_loop();
                }
                await_answer(&mut app, &mut cx, &clock, &mut rtt);
            }
            drop(h.stop());
        }
    }
    Ok(rtt)
}

/// Port `a` is UID 1, port `b` UID 2, each admitting everything.
fn wire_echo(h: &mut dyn ForwardingPlane, a: PortId, b: PortId) -> Result<(), BenchError> {
    let plane = |e: uniplane_overlay::PlaneError| BenchError::Config(e.to_string());
    for p in [a, b] {
        h.add_acl_rule(p, AclRule::ALLOW_ALL).map_err(plane)?;
    }
    h.add_route(a, Route::exact(uid(2), b)).map_err(plane)?;
    h.add_route(b, Route::exact(uid(1), a)).map_err(plane)?;
    Ok(())
}

/// Runs `overhead`: the latency the overlay adds to one traversal,
/// `(rtt_with − rtt_without) / 2` at p50 and p99, engine busy-polling.
pub fn run_overhead(size: usize, count: u64) -> Result<Value, BenchError> {
    if !(STAMP_LEN..=Message::MAX_PAYLOAD).contains(&size) {
        return Err(BenchError::Config(format!(
            "size must be {STAMP_LEN}..={}",
            Message::MAX_PAYLOAD
        )));
    }
    // Alternate to share the machine's state fairly: A B C A B C.
    let mut without = Latency::new();
    let mut inline = Latency::new();
    let mut thread = Latency::new();
    for _ in 0..2 {
        without.merge(&round_trips(Path::Direct, size, count / 2)?);
        inline.merge(&round_trips(Path::Inline, size, count / 2)?);
        thread.merge(&round_trips(Path::EngineThread, size, count / 2)?);
    }
    let added =
        |with: &Latency, q: f64| (with.quantile(q) as f64 - without.quantile(q) as f64) / 2.0;
    Ok(json!({
        "added_ns": { "p50": added(&inline, 0.5), "p99": added(&inline, 0.99) },
        "added_through_engine_thread_ns": { "p50": added(&thread, 0.5), "p99": added(&thread, 0.99) },
        "rtt_without_ns": without.percentiles(),
        "rtt_inline_ns": inline.percentiles(),
        "rtt_through_engine_thread_ns": thread.percentiles(),
        "note": "without: app and echo threads over one ring pair (2 cross-core hand-offs per round trip), the echo receiving and answering as the inline path's does; inline: the same two threads on inline links, each forwarding through the engine on its own thread (2 hand-offs, 2 engine passes; added per traversal = one pass); through the engine thread: app and echo on one thread, the engine busy-polling on another core (4 hand-offs; added = one hand-off plus the engine's work)",
    }))
}
