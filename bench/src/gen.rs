//! The packet generator: a sender paced by a [`Pacer`] and a receiver that
//! reads each message's [`Stamp`] for one-way latency, loss and
//! reordering, over any [`Stack`]: on two OS threads, or, for a slow
//! paced flow, as two tasks of one thread ([`Threads`]).
//!
//! Why one thread for a slow flow: at 2,000 messages a second the
//! process's CPU is its wake-ups, and two threads cost two a message (the
//! sender's timer and the receiver's link). On one thread the receiver
//! is a task beside the sender's on its current-thread runtime: the
//! sender yields after each send, the receiver takes what arrived in the
//! same wake-up (the mem link woke its task; a socket's readiness comes
//! from the runtime's poll of its reactor, which a yield makes without
//! sleeping), and the thread sleeps once until the next departure. The
//! receiver reads the clock as soon as the sender yields, so a message's
//! latency is still from its intended departure to its arrival, without
//! the receiver thread's wake-up in it.
//!
//! The hot loops neither allocate nor lock per message. The sender takes
//! payloads from one large preallocated buffer (`split_to`, a reference
//! count per message; a new buffer every few thousand messages), writes the
//! stamp, and sends in batches from a `VecDeque` it reuses; it reads the
//! clock once per batch. The receiver takes batches into a `Vec` it reuses,
//! reads the clock once per batch and records into an HDR histogram whose
//! storage is allocated up front. Counters reach the watcher as plain
//! stores once per batch.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use uniplane_dataplane::wire::{Header, HEADER_LEN};
use uniplane_dataplane::{BoxLink, BoxListener, LinkExt, Locator, Message, Stack};

use crate::args::{Pattern, Rate};
use crate::clock::{Clock, MonotonicClock};
use crate::engine::{
    flow_header, join, recv_some, spawn_worker, watch, Meter, Observer, Sample, L1_OVERHEAD,
    MAX_FLOWS,
};
use crate::hist::LatencyHistogram;
use crate::pacer::{Pacer, Sleeper};
use crate::sizes::SizeMix;
use crate::stacks::Endpoints;
use crate::stamp::Stamp;
use crate::BenchError;

/// When a run stops (warm-up not included).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Stop {
    /// After this many seconds of measurement.
    Seconds(f64),
    /// After this many measured messages.
    Count(u64),
}

impl Stop {
    /// The two halves of this stop, in order (a count's odd message goes
    /// to the second): for a run measured in two parts.
    pub fn halves(&self) -> [Stop; 2] {
        match *self {
            Stop::Seconds(s) => [Stop::Seconds(s / 2.0), Stop::Seconds(s / 2.0)],
            Stop::Count(n) => [Stop::Count(n / 2), Stop::Count(n - n / 2)],
        }
    }

    /// (planned seconds, planned count), for progress indicators.
    pub fn plan(&self) -> (Option<f64>, Option<u64>) {
        match *self {
            Stop::Seconds(s) => (Some(s), None),
            Stop::Count(n) => (None, Some(n)),
        }
    }
}

/// Below this many messages a second a paced run puts its receiver on the
/// sender's thread ([`Threads::Auto`]). At that rate the gap (50 us) is
/// still longer than the sender's spin before a departure and its timer's
/// lateness together, so the sender sleeps before most departures (on the
/// 2-vCPU development VM 0.9 sleeps a message at 10 kpps, 0.7 at 20 kpps,
/// none at 50 kpps) and a receiver thread adds a wake-up to each. Above,
/// the one thread would be a third of a core busy or more: a second core
/// keeps the receiver's batches off the sender's departures, and the
/// figures of fast runs stay those of two threads. `--threads shared`
/// asks for one thread at any rate.
pub const SHARED_BELOW_PPS: f64 = 20_000.0;

/// Where the receiver runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Threads {
    /// Chosen by the rule of [`Threads::resolve`].
    #[default]
    Auto,
    /// Sender and receiver each on its own OS thread with its own
    /// current-thread runtime.
    Split,
    /// Both on one OS thread, two tasks of one current-thread runtime: the
    /// sender yields after each send and the receiver takes the arrivals
    /// in the same wake-up.
    Shared,
}

impl Threads {
    /// The mode a run at `pps` messages a second (`None`: unpaced) takes:
    /// `Auto` is `Shared` for a paced rate below [`SHARED_BELOW_PPS`]
    /// without busy polling, `Split` otherwise; an explicit mode is kept.
    /// A busy-polling receiver needs its own thread (it would spin on the
    /// sender's): `Shared` with `busy_poll` is refused.
    pub fn resolve(self, pps: Option<f64>, busy_poll: bool) -> Result<Threads, BenchError> {
        match self {
            Threads::Auto => Ok(match pps {
                Some(p) if p < SHARED_BELOW_PPS && !busy_poll => Threads::Shared,
                _ => Threads::Split,
            }),
            Threads::Shared if busy_poll => Err(BenchError::Config(
                "a busy-polling receiver needs its own thread: --busy-poll does not go with --threads shared".into(),
            )),
            mode => Ok(mode),
        }
    }

    /// The name reports give the mode (`auto`, `split`, `shared`).
    pub fn name(self) -> &'static str {
        match self {
            Threads::Auto => "auto",
            Threads::Split => "split",
            Threads::Shared => "shared",
        }
    }

    /// How the sides run in this mode, as reports state it.
    pub fn describe(self) -> &'static str {
        match self {
            Threads::Shared => "sender and receiver on one OS thread, two tasks of one current-thread tokio runtime (the receiver takes arrivals in the sender's wake-up)",
            _ => crate::engine::THREADING,
        }
    }
}

/// What one generator run sends.
#[derive(Clone, Debug)]
pub struct GenConfig {
    /// Payload sizes.
    pub sizes: SizeMix,
    /// Mean rate.
    pub rate: Rate,
    /// How departures are spaced.
    pub pattern: Pattern,
    /// Flows (source port/UID) sent round-robin.
    pub flows: u32,
    /// When to stop.
    pub stop: Stop,
    /// Traffic before measurement starts, excluded from every figure.
    pub warmup: Duration,
    /// Most messages per send and per receive call.
    pub batch: usize,
    /// Seed of the Poisson gaps.
    pub seed: u64,
    /// Busy-poll the receiver instead of parking it.
    pub busy_poll: bool,
    /// How long the receiver waits for stragglers after the sender stops.
    pub drain: Duration,
    /// Seconds between samples.
    pub interval: Duration,
    /// Where the receiver runs.
    pub threads: Threads,
}

impl GenConfig {
    /// The messages a second this configuration paces at (`None`:
    /// unpaced), by the mean encoded size of its mix.
    pub fn pps(&self) -> Option<f64> {
        self.rate.pps(HEADER_LEN as f64 + self.sizes.mean())
    }

    /// Where this run's receiver runs: [`Threads::resolve`] of its mode
    /// at its rate.
    pub fn resolved_threads(&self) -> Result<Threads, BenchError> {
        self.threads.resolve(self.pps(), self.busy_poll)
    }
}

impl Default for GenConfig {
    fn default() -> Self {
        GenConfig {
            sizes: SizeMix::fixed(64),
            rate: Rate::Max,
            pattern: Pattern::Constant,
            flows: 1,
            stop: Stop::Seconds(1.0),
            warmup: Duration::from_millis(500),
            batch: 64,
            seed: 1,
            busy_poll: false,
            drain: Duration::from_millis(200),
            interval: Duration::from_secs(1),
            threads: Threads::Auto,
        }
    }
}

/// What one generator run measured. Warm-up traffic is in no figure.
#[derive(Clone, Debug, Default)]
pub struct GenRun {
    /// Messages sent.
    pub sent: u64,
    /// Messages received.
    pub received: u64,
    /// Sent but never received.
    pub lost: u64,
    /// Received after a later message of the same flow.
    pub reordered: u64,
    /// Payloads without a valid stamp.
    pub bad_stamps: u64,
    /// Link errors.
    pub errors: u64,
    /// Encoded bytes sent.
    pub tx_bytes: u64,
    /// Encoded bytes received.
    pub rx_bytes: u64,
    /// Seconds from measurement start to the last send.
    pub tx_seconds: f64,
    /// Seconds from measurement start to the last measured receive.
    pub rx_seconds: f64,
    /// Warm-up messages sent.
    pub warmup_sent: u64,
    /// One-way latency of every measured message.
    pub latency: LatencyHistogram,
    /// Per-second samples.
    pub samples: Vec<Sample>,
    /// Where the receiver ran (`Split` or `Shared`; `Auto` only in a
    /// default value).
    pub threads: Threads,
}

fn per_s(n: f64, s: f64) -> f64 {
    if s > 0.0 {
        n / s
    } else {
        0.0
    }
}

impl GenRun {
    /// Adds the counts, times, latencies and samples of `other`, measured
    /// after this run, as one run over both.
    pub fn absorb(&mut self, other: &GenRun) {
        self.sent += other.sent;
        self.received += other.received;
        self.lost += other.lost;
        self.reordered += other.reordered;
        self.bad_stamps += other.bad_stamps;
        self.errors += other.errors;
        self.tx_bytes += other.tx_bytes;
        self.rx_bytes += other.rx_bytes;
        self.tx_seconds += other.tx_seconds;
        self.rx_seconds += other.rx_seconds;
        self.warmup_sent += other.warmup_sent;
        if self.threads == Threads::Auto {
            self.threads = other.threads;
        }
        self.latency.merge(&other.latency);
        self.samples.extend(other.samples.iter().cloned());
    }

    /// Messages received per second.
    pub fn pps(&self) -> f64 {
        per_s(self.received as f64, self.rx_seconds)
    }

    /// Messages sent per second.
    pub fn tx_pps(&self) -> f64 {
        per_s(self.sent as f64, self.tx_seconds)
    }

    /// Received Mbit/s of encoded messages (L2).
    pub fn mbps_l2(&self) -> f64 {
        per_s(self.rx_bytes as f64 * 8.0 / 1e6, self.rx_seconds)
    }

    /// Received Mbit/s with Ethernet framing per message (L1).
    pub fn mbps_l1(&self) -> f64 {
        per_s(
            (self.rx_bytes + self.received * L1_OVERHEAD) as f64 * 8.0 / 1e6,
            self.rx_seconds,
        )
    }

    /// Sent Mbit/s of encoded messages (L2).
    pub fn tx_mbps_l2(&self) -> f64 {
        per_s(self.tx_bytes as f64 * 8.0 / 1e6, self.tx_seconds)
    }

    /// Goodput: overlay payload bytes received per second (the overlay
    /// headers left out), in Gbit/s.
    pub fn goodput_gbps(&self) -> f64 {
        let payload = self
            .rx_bytes
            .saturating_sub(self.received * HEADER_LEN as u64);
        per_s(payload as f64 * 8.0 / 1e9, self.rx_seconds)
    }
}

/// The stack `gen --loss` injects loss into.
pub const LOSS_STACK: &str = "ltl";

/// The drop probability (0.0–1.0) of `gen --loss PERCENT` over stack
/// `stack`, or why the combination is refused: loss is injected by the
/// ltl stack's own ports, so no other stack takes it, and a percentage
/// lies within 0 to 100.
pub fn loss_probability(stack: &str, percent: f64) -> Result<f64, BenchError> {
    if stack != LOSS_STACK {
        return Err(BenchError::Config(format!(
            "--loss works only with --stack {LOSS_STACK} (it injects loss into LTL's ports), not with --stack {stack}"
        )));
    }
    if !(0.0..=100.0).contains(&percent) {
        return Err(BenchError::Config(format!(
            "--loss is a percentage from 0 to 100, not {percent}"
        )));
    }
    Ok(percent / 100.0)
}

/// Checks `cfg` against `stack` before anything starts.
pub fn check(stack: &dyn Stack, cfg: &GenConfig) -> Result<(), BenchError> {
    let mtu = stack.capabilities().mtu;
    let size = cfg.sizes.max();
    if HEADER_LEN + size > mtu {
        return Err(BenchError::TooLargeForStack {
            size,
            encoded: HEADER_LEN + size,
            stack: stack.name().to_owned(),
            mtu,
        });
    }
    if cfg.flows == 0 || cfg.flows > MAX_FLOWS {
        return Err(BenchError::Config(format!(
            "flows must be 1 to {MAX_FLOWS}, not {}",
            cfg.flows
        )));
    }
    if cfg.batch == 0 {
        return Err(BenchError::Config("batch must be at least 1".into()));
    }
    match cfg.stop {
        Stop::Seconds(s) if !(s.is_finite() && s > 0.0) => Err(BenchError::Config(format!(
            "seconds must be positive, not {s}"
        ))),
        Stop::Count(0) => Err(BenchError::Config("count must be at least 1".into())),
        _ => cfg.resolved_threads().map(|_| ()),
    }
}

/// Runs the generator over `stack`: a receiver listening at `at.listen`, a
/// sender connecting to `at.connect`, each on its own thread or both on
/// one ([`GenConfig::resolved_threads`]); this thread watches and hands
/// `observer` a sample each second.
pub fn run_gen(
    stack: Arc<dyn Stack>,
    at: &Endpoints,
    cfg: &GenConfig,
    observer: &mut dyn Observer,
) -> Result<GenRun, BenchError> {
    check(&*stack, cfg)?;
    let threads = cfg.resolved_threads()?;
    let reliable = stack.capabilities().reliable;
    let clock = MonotonicClock::new();
    let meter = Arc::new(Meter::default());
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let (listen, connect) = (at.listen.clone(), at.connect.clone());

    let workers = if threads == Threads::Shared {
        let (meter, cfg) = (meter.clone(), cfg.clone());
        Workers::Shared(spawn_worker(
            "sender+receiver",
            done_tx,
            move || async move {
                let local = tokio::task::LocalSet::new();
                let both = one_thread(stack, listen, connect, cfg, reliable, clock, meter);
                Ok(local.run_until(both).await)
            },
        )?)
    } else {
        let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
        let rx = {
            let (stack, meter, cfg) = (stack.clone(), meter.clone(), cfg.clone());
            spawn_worker("receiver", done_tx.clone(), move || async move {
                let listener = match stack.listen(&listen).await {
                    Ok(l) => l,
                    Err(e) => {
                        meter.abort.store(true, Ordering::Relaxed);
                        return Err(e.into());
                    }
                };
                let _ = ready_tx.send(());
                let r = receive(listener, &listen, &cfg, clock, &meter).await;
                if r.is_err() {
                    meter.abort.store(true, Ordering::Relaxed);
                }
                r
            })?
        };
        let tx = {
            let (meter, cfg) = (meter.clone(), cfg.clone());
            spawn_worker("sender", done_tx, move || async move {
                let r = async {
                    ready_rx
                        .recv()
                        .map_err(|_| BenchError::SideGone("receiver"))?;
                    let link = stack.connect(&connect).await?;
                    send(link, &cfg, reliable, false, clock, &meter).await
                }
                .await;
                if r.is_err() {
                    meter.abort.store(true, Ordering::Relaxed);
                }
                meter.sender_done.store(true, Ordering::Release);
                r
            })?
        };
        Workers::Split { rx, tx }
    };
    let samples = watch(
        &meter,
        &clock,
        &done_rx,
        cfg.interval,
        cfg.stop.plan(),
        observer,
    );
    let (received, sent) = match workers {
        Workers::Split { rx, tx } => (join("receiver", rx), join("sender", tx)),
        Workers::Shared(both) => join("sender+receiver", both)?,
    };
    // The receiver's error explains a sender's `SideGone` or `Closed`.
    let r = received?;
    let s = sent?;
    let end_rx = r.last_rx_ns.max(s.start_ns);
    Ok(GenRun {
        sent: s.sent,
        received: r.received,
        lost: s.sent.saturating_sub(r.received),
        reordered: r.reordered,
        bad_stamps: r.bad_stamps,
        errors: r.errors,
        tx_bytes: s.bytes,
        rx_bytes: r.bytes,
        tx_seconds: s.end_ns.saturating_sub(s.start_ns) as f64 / 1e9,
        rx_seconds: end_rx.saturating_sub(s.start_ns) as f64 / 1e9,
        warmup_sent: s.warmup_sent,
        latency: r.latency,
        samples,
        threads,
    })
}

/// Both sides on this thread (inside a `LocalSet`): the receiver a task
/// beside the sender's, which runs whenever the sender yields.
async fn one_thread(
    stack: Arc<dyn Stack>,
    listen: Locator,
    connect: Locator,
    cfg: GenConfig,
    reliable: bool,
    clock: MonotonicClock,
    meter: Arc<Meter>,
) -> Sides {
    let listener = match stack.listen(&listen).await {
        Ok(l) => l,
        Err(e) => {
            meter.abort.store(true, Ordering::Relaxed);
            return (Err(e.into()), Err(BenchError::SideGone("receiver")));
        }
    };
    let rx = tokio::task::spawn_local({
        let (meter, cfg) = (meter.clone(), cfg.clone());
        async move {
            let r = receive(listener, &listen, &cfg, clock, &meter).await;
            if r.is_err() {
                meter.abort.store(true, Ordering::Relaxed);
            }
            r
        }
    });
    let s = async {
        let link = stack.connect(&connect).await?;
        send(link, &cfg, reliable, true, clock, &meter).await
    }
    .await;
    if s.is_err() {
        meter.abort.store(true, Ordering::Relaxed);
    }
    meter.sender_done.store(true, Ordering::Release);
    let r = rx.await.unwrap_or(Err(BenchError::Panicked("receiver")));
    (r, s)
}

/// What each side returns.
type Sides = (Result<Received, BenchError>, Result<Sent, BenchError>);

/// The threads of one run.
enum Workers {
    /// Receiver and sender on their own threads.
    Split {
        rx: JoinHandle<Result<Received, BenchError>>,
        tx: JoinHandle<Result<Sent, BenchError>>,
    },
    /// Both on one.
    Shared(JoinHandle<Result<Sides, BenchError>>),
}

struct Sent {
    sent: u64,
    bytes: u64,
    warmup_sent: u64,
    start_ns: u64,
    end_ns: u64,
}

/// Hands out payload buffers carved from one large allocation.
struct PayloadArena {
    chunk: BytesMut,
    chunk_len: usize,
}

impl PayloadArena {
    fn new(chunk_len: usize) -> Self {
        PayloadArena {
            chunk: BytesMut::new(),
            chunk_len,
        }
    }

    /// A zeroed buffer of `len` bytes: a reference-counted slice of the
    /// current chunk, or of a fresh chunk when this one is used up.
    #[inline]
    fn take(&mut self, len: usize) -> BytesMut {
        if self.chunk.len() < len {
            self.chunk = BytesMut::zeroed(self.chunk_len.max(len));
        }
        self.chunk.split_to(len)
    }
}

/// Longest a paced sender sleeps before it looks again (for an abort).
const MAX_WAIT_NS: u64 = 50_000_000;

/// Longest a sender over a reliable stack stays after its last message
/// for the receiver to get everything.
const RELIABLE_LINGER: Duration = Duration::from_secs(2);

/// The sender's loop. `shared`: the receiver is a task on this thread's
/// runtime, and the sender yields to it after each send, so it reads
/// what arrived at once (and, unpaced, is not starved).
async fn send(
    mut link: BoxLink,
    cfg: &GenConfig,
    reliable: bool,
    shared: bool,
    clock: MonotonicClock,
    meter: &Meter,
) -> Result<Sent, BenchError> {
    let mut sizes = cfg.sizes.clone();
    let pps = cfg.pps();
    let mut pacer = Pacer::new(clock, pps, cfg.pattern, cfg.seed);
    let mut sleeper = Sleeper::new()?;
    let headers: Vec<Header> = (0..cfg.flows).map(flow_header).collect();
    let mut seqs = vec![0u64; headers.len()];
    let mut flow = 0usize;
    let mut arena = PayloadArena::new(1 << 20);
    let mut batch: VecDeque<Message> = VecDeque::with_capacity(cfg.batch);
    let mut departures = vec![0u64; cfg.batch.max(1)];

    let begin = clock.now_ns();
    let warm_end = begin.saturating_add(cfg.warmup.as_nanos() as u64);
    let mut measuring = false;
    let mut out = Sent {
        sent: 0,
        bytes: 0,
        warmup_sent: 0,
        start_ns: begin,
        end_ns: begin,
    };
    loop {
        let now = clock.now_ns();
        if !measuring && now >= warm_end {
            measuring = true;
            out.start_ns = now;
            meter.measure_start_ns.store(now, Ordering::Release);
        }
        let mut room = cfg.batch;
        if measuring {
            match cfg.stop {
                Stop::Seconds(s) if now.saturating_sub(out.start_ns) as f64 >= s * 1e9 => break,
                Stop::Count(n) if out.sent >= n => break,
                Stop::Count(n) => room = room.min((n - out.sent) as usize),
                Stop::Seconds(_) => {}
            }
        }
        if meter.aborted() {
            break;
        }
        let n = pacer.departures_at(now, room, &mut departures);
        if n == 0 {
            if let Some(due) = pacer.next_due_ns() {
                // Wake for the next departure, or for the end of the
                // warm-up or of the run when that comes first (bounded,
                // so an abort is seen at low rates too).
                let mut wake = due.min(now + MAX_WAIT_NS);
                if !measuring {
                    wake = wake.min(warm_end);
                } else if let Stop::Seconds(s) = cfg.stop {
                    wake = wake.min(out.start_ns + (s * 1e9) as u64);
                }
                sleeper.wait_until(&clock, wake).await?;
            }
            continue;
        }
        let mut bytes = 0u64;
        for &departure in &departures[..n] {
            let mut payload = arena.take(sizes.next_size());
            let seq = seqs[flow];
            // Stamped with when it was due, not when it left: a sender
            // held back (by the link's backpressure or the scheduler)
            // counts the delay in the latency (no coordinated omission).
            Stamp {
                flow: flow as u32,
                seq,
                tx_ns: departure,
                warmup: !measuring,
            }
            .write(&mut payload)
            .map_err(|e| BenchError::Config(e.to_string()))?;
            seqs[flow] = seq + 1;
            let mut m = Message::new(headers[flow], payload.freeze())?;
            m.set_seqnum(seq as u32);
            bytes += m.encoded_len() as u64;
            batch.push_back(m);
            flow += 1;
            if flow == headers.len() {
                flow = 0;
            }
        }
        link.send_batch(&mut batch).await?;
        if measuring {
            out.sent += n as u64;
            out.bytes += bytes;
            meter.tx_msgs.store(out.sent, Ordering::Relaxed);
            meter.tx_bytes.store(out.bytes, Ordering::Relaxed);
        } else {
            out.warmup_sent += n as u64;
        }
        if shared {
            // The receiver's turn: it takes what just arrived in this
            // wake-up (a socket's readiness comes with the runtime's
            // poll of its reactor between the yield and our next turn).
            tokio::task::yield_now().await;
        }
    }
    out.end_ns = clock.now_ns();
    if !measuring {
        // Stopped (aborted) during warm-up: an empty measurement.
        out.start_ns = out.end_ns;
        meter.measure_start_ns.store(out.end_ns, Ordering::Release);
    }
    meter.tx_msgs.store(out.sent, Ordering::Relaxed);
    // Closing tells a reliable stack's receiver that the stream ended; an
    // error here changes no figure.
    let _ = link.close().await;
    if reliable {
        // A reliable stack may still owe the receiver repairs of what was
        // lost, from an endpoint on this thread's runtime: stay until the
        // receiver has every measured message (or gives up), or losses at
        // the tail would count as lost.
        let until = Instant::now() + RELIABLE_LINGER;
        while meter.rx_msgs.load(Ordering::Relaxed) < out.sent
            && !meter.aborted()
            && Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    Ok(out)
}

struct Received {
    received: u64,
    bytes: u64,
    reordered: u64,
    bad_stamps: u64,
    errors: u64,
    last_rx_ns: u64,
    latency: LatencyHistogram,
}

/// How long the receiver waits for the first link.
const ACCEPT_WITHIN: Duration = Duration::from_secs(10);
/// How often an idle receiver looks at the sender's state.
const IDLE_CHECK: Duration = Duration::from_millis(50);

async fn receive(
    mut listener: BoxListener,
    at: &Locator,
    cfg: &GenConfig,
    clock: MonotonicClock,
    meter: &Meter,
) -> Result<Received, BenchError> {
    let mut out = Received {
        received: 0,
        bytes: 0,
        reordered: 0,
        bad_stamps: 0,
        errors: 0,
        last_rx_ns: 0,
        latency: LatencyHistogram::new(),
    };
    let asked = Instant::now();
    let mut link = loop {
        match tokio::time::timeout(IDLE_CHECK, listener.next()).await {
            Ok(Some(Ok(link))) => break link,
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(None) => return Err(BenchError::ListenerClosed(at.clone())),
            Err(_) => {
                if meter.sender_done.load(Ordering::Acquire) || meter.aborted() {
                    // The sender stopped without ever reaching us.
                    return Ok(out);
                }
                if asked.elapsed() > ACCEPT_WITHIN {
                    return Err(BenchError::AcceptTimeout(at.clone(), ACCEPT_WITHIN));
                }
            }
        }
    };
    drop(listener);

    let flows = cfg.flows as usize;
    let mut expected = vec![0u64; flows];
    let mut gaps = 0u64;
    let mut latency_sum = 0u64;
    let mut batch: Vec<Message> = Vec::with_capacity(cfg.batch);
    let mut idle_since: Option<Instant> = None;
    loop {
        batch.clear();
        let got = recv_some(&mut link, &mut batch, cfg.batch, cfg.busy_poll, IDLE_CHECK).await;
        let done = meter.sender_done.load(Ordering::Acquire);
        match got {
            Ok(Some(0)) => break,
            Ok(Some(_)) => {
                idle_since = None;
                let now = clock.now_ns();
                let before = out.received;
                for m in batch.drain(..) {
                    let s = match Stamp::read(m.payload()) {
                        Ok(s) if (s.flow as usize) < flows => s,
                        _ => {
                            out.bad_stamps += 1;
                            continue;
                        }
                    };
                    let next = &mut expected[s.flow as usize];
                    if s.seq == *next {
                        *next += 1;
                    } else if s.seq > *next {
                        gaps += s.seq - *next;
                        *next = s.seq + 1;
                    } else {
                        out.reordered += 1;
                        gaps = gaps.saturating_sub(1);
                    }
                    if s.warmup {
                        continue;
                    }
                    out.received += 1;
                    out.bytes += m.encoded_len() as u64;
                    let lat = now.saturating_sub(s.tx_ns);
                    latency_sum = latency_sum.wrapping_add(lat);
                    out.latency.record(lat);
                }
                if out.received > before {
                    out.last_rx_ns = now;
                }
                meter.rx_msgs.store(out.received, Ordering::Relaxed);
                meter.rx_bytes.store(out.bytes, Ordering::Relaxed);
                meter.latency_sum_ns.store(latency_sum, Ordering::Relaxed);
                meter.drops.store(gaps, Ordering::Relaxed);
                meter
                    .errors
                    .store(out.bad_stamps + out.errors, Ordering::Relaxed);
            }
            Ok(None) => {
                if done || meter.aborted() {
                    let since = *idle_since.get_or_insert_with(Instant::now);
                    if meter.aborted() || since.elapsed() >= cfg.drain {
                        break;
                    }
                }
            }
            Err(e) => {
                if done {
                    // The sender's side went away after it finished.
                    break;
                }
                out.errors += 1;
                return Err(e.into());
            }
        }
        if done && out.received >= meter.tx_msgs.load(Ordering::Relaxed) {
            // Everything measured has arrived; warm-up stragglers don't matter.
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Quiet;
    use crate::stacks::{default_endpoints, open_stack};

    #[test]
    fn halves_of_a_stop_add_up_to_it() {
        assert_eq!(
            Stop::Seconds(3.0).halves(),
            [Stop::Seconds(1.5), Stop::Seconds(1.5)]
        );
        assert_eq!(Stop::Count(5).halves(), [Stop::Count(2), Stop::Count(3)]);
        assert_eq!(Stop::Count(0).halves(), [Stop::Count(0), Stop::Count(0)]);
    }

    #[test]
    fn two_absorbed_runs_are_one_run_over_both() {
        let mut a = GenRun {
            sent: 10,
            received: 8,
            rx_bytes: 800,
            rx_seconds: 1.0,
            ..GenRun::default()
        };
        a.latency.record(1_000);
        let mut b = GenRun {
            sent: 30,
            received: 24,
            rx_bytes: 2_400,
            rx_seconds: 3.0,
            ..GenRun::default()
        };
        b.latency.record(9_000);
        a.absorb(&b);
        assert_eq!((a.sent, a.received, a.rx_bytes), (40, 32, 3_200));
        // 32 messages over 4 s, not the mean of two rates.
        assert_eq!(a.pps(), 8.0);
        assert_eq!(a.latency.len(), 2);
    }

    fn run(cfg: GenConfig) -> GenRun {
        let stack = open_stack("mem").unwrap();
        let at = default_endpoints("mem").unwrap();
        run_gen(stack, &at, &cfg, &mut Quiet).unwrap()
    }

    #[test]
    fn a_counted_run_over_mem_delivers_every_message_in_order() {
        let r = run(GenConfig {
            stop: Stop::Count(10_000),
            warmup: Duration::ZERO,
            flows: 7,
            ..GenConfig::default()
        });
        assert_eq!(r.sent, 10_000);
        assert_eq!(r.received, 10_000);
        assert_eq!((r.lost, r.reordered, r.bad_stamps, r.errors), (0, 0, 0, 0));
        assert_eq!(r.latency.len(), 10_000);
        assert_eq!(r.rx_bytes, 10_000 * (32 + 64));
    }

    #[test]
    fn warm_up_traffic_is_in_no_figure() {
        let r = run(GenConfig {
            stop: Stop::Count(500),
            warmup: Duration::from_millis(20),
            rate: Rate::Pps(50_000.0),
            ..GenConfig::default()
        });
        assert!(r.warmup_sent > 0);
        assert_eq!(r.sent, 500);
        assert_eq!(r.received, 500);
        assert_eq!(r.latency.len(), 500);
    }

    #[test]
    fn an_imix_run_carries_the_mix() {
        let r = run(GenConfig {
            sizes: SizeMix::imix(),
            stop: Stop::Count(1200),
            warmup: Duration::ZERO,
            ..GenConfig::default()
        });
        assert_eq!(r.received, 1200);
        assert_eq!(r.rx_bytes, 100 * (4342 + 12 * 32));
    }

    #[test]
    fn a_size_too_large_for_the_stack_is_refused_before_starting() {
        let stack = open_stack("udp").unwrap();
        let cfg = GenConfig {
            sizes: SizeMix::fixed(9000),
            ..GenConfig::default()
        };
        assert!(matches!(
            check(&*stack, &cfg),
            Err(BenchError::TooLargeForStack { .. })
        ));
    }

    #[test]
    fn auto_puts_only_a_slow_paced_receiver_on_the_senders_thread() {
        let auto = Threads::Auto;
        assert_eq!(auto.resolve(Some(2_000.0), false).unwrap(), Threads::Shared);
        assert_eq!(
            auto.resolve(Some(SHARED_BELOW_PPS - 1.0), false).unwrap(),
            Threads::Shared
        );
        assert_eq!(
            auto.resolve(Some(SHARED_BELOW_PPS), false).unwrap(),
            Threads::Split
        );
        assert_eq!(auto.resolve(None, false).unwrap(), Threads::Split);
        // A busy-polling receiver keeps its own thread.
        assert_eq!(auto.resolve(Some(2_000.0), true).unwrap(), Threads::Split);
        // An explicit mode is kept, whatever the rate.
        assert_eq!(
            Threads::Split.resolve(Some(2_000.0), false).unwrap(),
            Threads::Split
        );
        assert_eq!(
            Threads::Shared.resolve(None, false).unwrap(),
            Threads::Shared
        );
        assert!(matches!(
            Threads::Shared.resolve(Some(2_000.0), true),
            Err(BenchError::Config(_))
        ));
    }

    #[test]
    fn a_bit_rate_is_judged_by_its_messages_a_second() {
        // 10 Mbit/s of 96-byte messages is 13,021 messages a second: shared.
        let cfg = GenConfig {
            rate: Rate::Bps(10e6),
            ..GenConfig::default()
        };
        assert_eq!(cfg.resolved_threads().unwrap(), Threads::Shared);
        let faster = GenConfig {
            rate: Rate::Bps(100e6),
            ..cfg
        };
        assert_eq!(faster.resolved_threads().unwrap(), Threads::Split);
    }

    #[test]
    fn a_slow_paced_run_shares_a_thread_and_counts_every_message() {
        let r = run(GenConfig {
            rate: Rate::Pps(5_000.0),
            stop: Stop::Count(500),
            warmup: Duration::from_millis(10),
            flows: 3,
            ..GenConfig::default()
        });
        assert_eq!(r.threads, Threads::Shared);
        assert!(r.warmup_sent > 0);
        assert_eq!((r.sent, r.received), (500, 500));
        assert_eq!((r.lost, r.reordered, r.bad_stamps, r.errors), (0, 0, 0, 0));
        assert_eq!(r.latency.len(), 500);
        assert!(!r.samples.is_empty(), "the watcher sampled the run");
    }

    #[test]
    fn a_shared_run_over_udp_counts_every_datagram() {
        let stack = open_stack("udp").unwrap();
        let at = default_endpoints("udp").unwrap();
        let cfg = GenConfig {
            rate: Rate::Pps(5_000.0),
            stop: Stop::Count(300),
            warmup: Duration::ZERO,
            ..GenConfig::default()
        };
        let r = run_gen(stack, &at, &cfg, &mut Quiet).unwrap();
        assert_eq!(r.threads, Threads::Shared);
        assert_eq!((r.sent, r.received, r.lost), (300, 300, 0));
        assert_eq!(r.latency.len(), 300);
    }

    #[test]
    fn an_unpaced_shared_run_does_not_starve_its_receiver() {
        // The sender yields after each batch: the receiver keeps up even
        // with no gaps between departures.
        let r = run(GenConfig {
            threads: Threads::Shared,
            stop: Stop::Count(20_000),
            warmup: Duration::ZERO,
            ..GenConfig::default()
        });
        assert_eq!(r.threads, Threads::Shared);
        assert_eq!((r.sent, r.received, r.lost), (20_000, 20_000, 0));
    }

    #[test]
    fn a_fast_or_unpaced_run_keeps_two_threads() {
        let r = run(GenConfig {
            stop: Stop::Count(1_000),
            warmup: Duration::ZERO,
            ..GenConfig::default()
        });
        assert_eq!(r.threads, Threads::Split);
        assert_eq!(r.received, 1_000);
    }

    #[test]
    fn arena_buffers_are_zeroed_and_independent() {
        let mut arena = PayloadArena::new(100);
        let mut a = arena.take(60);
        let b = arena.take(60); // needs a fresh chunk
        a[0] = 1;
        assert_eq!(b[0], 0);
        assert_eq!((a.len(), b.len()), (60, 60));
    }
}
