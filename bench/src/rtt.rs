//! Closed-loop ping-pong: a client keeps `inflight` stamped messages
//! outstanding, an echo side answers each (source and destination
//! swapped, the payload shared, not copied), and the client records each
//! round trip into an HDR histogram. Client and echo run on separate OS
//! threads over any stack.
//!
//! On a stack that loses messages, a request unanswered for `timeout`
//! counts as lost and the window is refilled.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::wire::{Header, Request, HEADER_LEN};
use uniplane_dataplane::{BoxLink, BoxListener, LinkExt, Locator, Message, Stack};

use crate::clock::{Clock, MonotonicClock};
use crate::engine::{flow_header, join, recv_some, spawn_worker, watch, Meter, Observer, Sample};
use crate::gen::Stop;
use crate::hist::LatencyHistogram;
use crate::stacks::{open_stack, Endpoints};
use crate::stamp::Stamp;
use crate::BenchError;

/// What one ping-pong run does.
#[derive(Clone, Debug)]
pub struct RttConfig {
    /// Payload bytes.
    pub size: usize,
    /// Requests outstanding at once (1: strict ping-pong).
    pub inflight: usize,
    /// When to stop.
    pub stop: Stop,
    /// Round trips before measurement starts, excluded.
    pub warmup: Duration,
    /// Busy-poll both sides instead of parking them.
    pub busy_poll: bool,
    /// A request unanswered this long is lost.
    pub timeout: Duration,
    /// Seconds between samples.
    pub interval: Duration,
}

impl Default for RttConfig {
    fn default() -> Self {
        RttConfig {
            size: 64,
            inflight: 1,
            stop: Stop::Seconds(1.0),
            warmup: Duration::from_millis(500),
            busy_poll: false,
            timeout: Duration::from_millis(200),
            interval: Duration::from_secs(1),
        }
    }
}

/// What one ping-pong run measured (warm-up excluded).
#[derive(Clone, Debug, Default)]
pub struct RttRun {
    /// Requests sent.
    pub sent: u64,
    /// Answers received.
    pub received: u64,
    /// Requests never answered.
    pub lost: u64,
    /// Bad stamps and link errors.
    pub errors: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Round-trip times.
    pub rtt: LatencyHistogram,
    /// Per-second samples.
    pub samples: Vec<Sample>,
}

impl RttRun {
    /// Round trips per second.
    pub fn round_trips_per_s(&self) -> f64 {
        if self.seconds > 0.0 {
            self.received as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// Checks `cfg` against `stack` before anything starts.
pub fn check(stack: &dyn Stack, cfg: &RttConfig) -> Result<(), BenchError> {
    let mtu = stack.capabilities().mtu;
    if HEADER_LEN + cfg.size > mtu {
        return Err(BenchError::TooLargeForStack {
            size: cfg.size,
            encoded: HEADER_LEN + cfg.size,
            stack: stack.name().to_owned(),
            mtu,
        });
    }
    if cfg.size < Stamp::LEN {
        return Err(BenchError::Config(format!(
            "size must be at least {} bytes",
            Stamp::LEN
        )));
    }
    if cfg.inflight == 0 || cfg.inflight > 65536 {
        return Err(BenchError::Config("inflight must be 1 to 65536".into()));
    }
    match cfg.stop {
        Stop::Seconds(s) if !(s.is_finite() && s > 0.0) => Err(BenchError::Config(format!(
            "seconds must be positive, not {s}"
        ))),
        Stop::Count(0) => Err(BenchError::Config("count must be at least 1".into())),
        _ => Ok(()),
    }
}

/// How long a busy-polling UDP receive spins before it sleeps in epoll:
/// long beside a round trip on loopback (~5 us), short beside a human.
pub const UDP_SPIN: Duration = Duration::from_micros(200);

/// The stack called `name` for a round-trip run. The UDP stacks get their
/// latency configuration: no GRO (a receive with GRO on costs ~0.4 us more
/// per round trip on loopback here, for batching a ping-pong never has),
/// and with `busy_poll` they spin on their sockets
/// ([`UdpConfig::busy_poll`]), as a busy-polling peer spins on its own.
/// Other stacks as [`open_stack`] gives them (with `busy_poll` the run's
/// receive loop spins over their links).
///
/// [`UdpConfig::busy_poll`]: uniplane_stacks::udp::UdpConfig::busy_poll
pub fn open_rtt_stack(name: &str, busy_poll: bool) -> Result<Arc<dyn Stack>, BenchError> {
    use uniplane_stacks::udp::{UdpConfig, UdpStack};
    let Some((pack, uring)) = crate::stacks::udp_variant(name) else {
        return open_stack(name);
    };
    Ok(Arc::new(UdpStack::with_config(UdpConfig {
        pack,
        backend: crate::stacks::udp_backend(uring),
        gro: false,
        busy_poll: busy_poll.then_some(UDP_SPIN),
        ..UdpConfig::default()
    })))
}

/// Runs the ping-pong over `stack`: the echo side listens at `at.listen`,
/// the client connects to `at.connect`, each on its own thread; this thread
/// watches and hands `observer` a sample each second.
pub fn run_rtt(
    stack: Arc<dyn Stack>,
    at: &Endpoints,
    cfg: &RttConfig,
    observer: &mut dyn Observer,
) -> Result<RttRun, BenchError> {
    check(&*stack, cfg)?;
    let clock = MonotonicClock::new();
    let meter = Arc::new(Meter::default());
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);

    let echo = {
        let (stack, meter, cfg, listen) =
            (stack.clone(), meter.clone(), cfg.clone(), at.listen.clone());
        spawn_worker("echo", done_tx.clone(), move || async move {
            let listener = match stack.listen(&listen).await {
                Ok(l) => l,
                Err(e) => {
                    meter.abort.store(true, Ordering::Relaxed);
                    return Err(e.into());
                }
            };
            let _ = ready_tx.send(());
            let r = echo(listener, &listen, &cfg, &meter).await;
            if r.is_err() {
                meter.abort.store(true, Ordering::Relaxed);
            }
            r
        })?
    };
    let client = {
        let (meter, cfg, connect) = (meter.clone(), cfg.clone(), at.connect.clone());
        spawn_worker("client", done_tx, move || async move {
            let r = async {
                ready_rx.recv().map_err(|_| BenchError::SideGone("echo"))?;
                let link = stack.connect(&connect).await?;
                ping(link, &cfg, clock, &meter).await
            }
            .await;
            if r.is_err() {
                meter.abort.store(true, Ordering::Relaxed);
            }
            meter.sender_done.store(true, Ordering::Release);
            r
        })?
    };
    let mut samples = watch(
        &meter,
        &clock,
        &done_rx,
        cfg.interval,
        cfg.stop.plan(),
        observer,
    );
    let echoed = join("echo", echo);
    let mut run = join("client", client)?;
    echoed?;
    run.samples = std::mem::take(&mut samples);
    Ok(run)
}

async fn ping(
    mut link: BoxLink,
    cfg: &RttConfig,
    clock: MonotonicClock,
    meter: &Meter,
) -> Result<RttRun, BenchError> {
    let header = flow_header(0);
    let mut arena = BytesMut::new();
    let mut out: VecDeque<Message> = VecDeque::with_capacity(cfg.inflight);
    let mut answers: Vec<Message> = Vec::with_capacity(cfg.inflight);
    let mut run = RttRun {
        rtt: LatencyHistogram::new(),
        ..RttRun::default()
    };
    let begin = clock.now_ns();
    let warm_end = begin.saturating_add(cfg.warmup.as_nanos() as u64);
    let mut start = begin;
    let mut measuring = false;
    let mut seq = 0u64;
    let mut outstanding = 0usize;
    let mut latency_sum = 0u64;
    loop {
        let now = clock.now_ns();
        if !measuring && now >= warm_end {
            measuring = true;
            start = now;
            meter.measure_start_ns.store(now, Ordering::Release);
        }
        let stop_sending = meter.aborted()
            || (measuring
                && match cfg.stop {
                    Stop::Seconds(s) => now.saturating_sub(start) as f64 >= s * 1e9,
                    Stop::Count(n) => run.sent >= n,
                });
        if stop_sending && outstanding == 0 {
            break;
        }
        while !stop_sending && outstanding < cfg.inflight {
            if let Stop::Count(n) = cfg.stop {
                if measuring && run.sent >= n {
                    break;
                }
            }
            if arena.len() < cfg.size {
                arena = BytesMut::zeroed((cfg.size * 1024).max(1 << 16));
            }
            let mut payload = arena.split_to(cfg.size);
            Stamp {
                flow: 0,
                seq,
                tx_ns: now,
                warmup: !measuring,
            }
            .write(&mut payload)
            .map_err(|e| BenchError::Config(e.to_string()))?;
            let mut m = Message::new(header, payload.freeze())?;
            m.set_seqnum(seq as u32);
            seq += 1;
            out.push_back(m);
            outstanding += 1;
            if measuring {
                run.sent += 1;
            }
        }
        if !out.is_empty() {
            link.send_batch(&mut out).await?;
        }
        answers.clear();
        match recv_some(
            &mut link,
            &mut answers,
            cfg.inflight,
            cfg.busy_poll,
            cfg.timeout,
        )
        .await?
        {
            Some(0) => return Err(BenchError::SideGone("echo")),
            Some(_) => {
                let now = clock.now_ns();
                for m in answers.drain(..) {
                    outstanding = outstanding.saturating_sub(1);
                    match Stamp::read(m.payload()) {
                        Ok(s) if !s.warmup => {
                            let rtt = now.saturating_sub(s.tx_ns);
                            run.received += 1;
                            run.rtt.record(rtt);
                            latency_sum = latency_sum.wrapping_add(rtt);
                        }
                        Ok(_) => {}
                        Err(_) => run.errors += 1,
                    }
                }
            }
            None => {
                // Nothing came back in time: what is outstanding is lost.
                outstanding = 0;
            }
        }
        meter.tx_msgs.store(run.sent, Ordering::Relaxed);
        meter.rx_msgs.store(run.received, Ordering::Relaxed);
        meter.rx_bytes.store(
            run.received * (HEADER_LEN + cfg.size) as u64,
            Ordering::Relaxed,
        );
        meter.latency_sum_ns.store(latency_sum, Ordering::Relaxed);
        meter.errors.store(run.errors, Ordering::Relaxed);
    }
    let end = clock.now_ns();
    if !measuring {
        meter.measure_start_ns.store(end, Ordering::Release);
        start = end;
    }
    run.seconds = end.saturating_sub(start) as f64 / 1e9;
    run.lost = run.sent.saturating_sub(run.received);
    let _ = link.close().await;
    Ok(run)
}

/// The answer to `m`: source and destination swapped, ports too, the same
/// sequence number and the same payload (shared, not copied).
pub fn reflect(m: &Message) -> Result<Message, BenchError> {
    let h = m.header();
    let request = match h.request.ports() {
        Some((src, dst)) => Request::send(dst, src),
        None => h.request,
    };
    let mut reply = Header::new(h.dst, h.src, request);
    reply.seqnum = h.seqnum;
    Ok(Message::new(reply, m.payload().clone())?)
}

/// How often an idle echo side looks at the client's state.
const IDLE_CHECK: Duration = Duration::from_millis(50);
/// How long the echo side waits for the client's link.
const ACCEPT_WITHIN: Duration = Duration::from_secs(10);

async fn echo(
    mut listener: BoxListener,
    at: &Locator,
    cfg: &RttConfig,
    meter: &Meter,
) -> Result<(), BenchError> {
    let asked = Instant::now();
    let mut link = loop {
        match tokio::time::timeout(IDLE_CHECK, listener.next()).await {
            Ok(Some(Ok(link))) => break link,
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) => return Err(BenchError::ListenerClosed(at.clone())),
            Err(_) => {
                if meter.sender_done.load(Ordering::Acquire) || meter.aborted() {
                    return Ok(());
                }
                if asked.elapsed() > ACCEPT_WITHIN {
                    return Err(BenchError::AcceptTimeout(at.clone(), ACCEPT_WITHIN));
                }
            }
        }
    };
    drop(listener);
    let max = cfg.inflight.clamp(1, 256);
    let mut inbox: Vec<Message> = Vec::with_capacity(max);
    let mut outbox: VecDeque<Message> = VecDeque::with_capacity(max);
    loop {
        inbox.clear();
        let got = recv_some(&mut link, &mut inbox, max, cfg.busy_poll, IDLE_CHECK).await;
        let done = meter.sender_done.load(Ordering::Acquire) || meter.aborted();
        match got {
            Ok(Some(0)) => break,
            Ok(Some(_)) => {
                for m in inbox.drain(..) {
                    outbox.push_back(reflect(&m)?);
                }
                if let Err(e) = link.send_batch(&mut outbox).await {
                    if done {
                        break;
                    }
                    return Err(e.into());
                }
            }
            Ok(None) if done => break,
            Ok(None) => {}
            Err(_) if done => break,
            Err(e) => return Err(e.into()),
        }
    }
    let _ = link.close().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Quiet;
    use crate::stacks::{default_endpoints, open_stack};

    #[test]
    fn a_counted_ping_pong_over_mem_answers_every_request() {
        let stack = open_stack("mem").unwrap();
        let at = default_endpoints("mem").unwrap();
        let cfg = RttConfig {
            stop: Stop::Count(2_000),
            warmup: Duration::ZERO,
            inflight: 4,
            ..RttConfig::default()
        };
        let r = run_rtt(stack, &at, &cfg, &mut Quiet).unwrap();
        assert_eq!(r.sent, 2_000);
        assert_eq!(r.received, 2_000);
        assert_eq!((r.lost, r.errors), (0, 0));
        assert_eq!(r.rtt.len(), 2_000);
        assert!(r.rtt.percentiles().p50 > 0);
    }

    #[test]
    fn a_reflected_message_swaps_ends_and_shares_the_payload() {
        let h = flow_header(3);
        let m = Message::new(h, bytes::Bytes::from_static(&[1u8; 40])).unwrap();
        let r = reflect(&m).unwrap();
        assert_eq!(r.header().src, m.header().dst);
        assert_eq!(r.header().dst, m.header().src);
        let (a, b) = m.header().request.ports().unwrap();
        assert_eq!(r.header().request.ports(), Some((b, a)));
        assert_eq!(r.payload().as_ptr(), m.payload().as_ptr());
    }
}
