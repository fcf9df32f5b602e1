//! What the generator and the ping-pong share: worker threads with their
//! own runtime, the counters a watcher samples once a second, receiving
//! with an idle timeout (parked or busy-polling), waiting for a departure
//! time, and per-flow message headers.

use std::future::{poll_fn, Future};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::task::Poll;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Serialize;
use uniplane_dataplane::wire::{Header, Request};
use uniplane_dataplane::{BoxLink, LinkError, LinkExt, Message, Uid};

use crate::clock::{Clock, MonotonicClock};
use crate::BenchError;

/// How the two sides run, as reports state it.
pub const THREADING: &str =
    "sender and receiver each on its own OS thread, each a current-thread tokio runtime";

/// Ethernet framing per frame at L1: header 14, FCS 4, preamble and SFD 8,
/// inter-frame gap 12 bytes (as MoonGen counts wire rate).
pub const L1_OVERHEAD: u64 = 14 + 4 + 8 + 12;

/// Counters one side writes (once per batch, a plain store by their only
/// writer) and the watcher reads once a second. Only measured traffic is
/// counted: warm-up is not.
///
/// The flags, the sender's counters and the receiver's each have cache
/// lines of their own: every side reads the flags each turn, while each
/// group of counters is written each turn by one side. Sharing a line, a
/// busy ping-pong's echo read a line the client had just written on every
/// hop (two cross-core misses a round trip).
#[derive(Debug)]
#[repr(C, align(128))]
pub struct Meter {
    /// The sender has stopped; `tx_msgs` is final.
    pub sender_done: AtomicBool,
    /// A side failed: everyone stops.
    pub abort: AtomicBool,
    _flags_apart: NewLine,
    /// Messages sent after warm-up.
    pub tx_msgs: AtomicU64,
    /// Encoded bytes of those.
    pub tx_bytes: AtomicU64,
    _tx_apart: NewLine,
    /// Messages received after warm-up (or round trips completed).
    pub rx_msgs: AtomicU64,
    /// Encoded bytes of those.
    pub rx_bytes: AtomicU64,
    /// Messages missing by sequence number so far.
    pub drops: AtomicU64,
    /// Bad stamps and link errors.
    pub errors: AtomicU64,
    /// Sum of measured latencies in ns.
    pub latency_sum_ns: AtomicU64,
    /// When measurement started (clock ns); `u64::MAX` before.
    pub measure_start_ns: AtomicU64,
}

/// Takes no room, but in a `repr(C)` struct starts the next field on a
/// fresh 128-byte line (a line and the one the pair prefetcher fetches
/// with it).
#[derive(Debug, Default)]
#[repr(align(128))]
struct NewLine;

impl Default for Meter {
    fn default() -> Self {
        Meter {
            sender_done: AtomicBool::new(false),
            abort: AtomicBool::new(false),
            _flags_apart: NewLine,
            tx_msgs: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
            _tx_apart: NewLine,
            rx_msgs: AtomicU64::new(0),
            rx_bytes: AtomicU64::new(0),
            drops: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency_sum_ns: AtomicU64::new(0),
            measure_start_ns: AtomicU64::new(u64::MAX),
        }
    }
}

impl Meter {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            tx: self.tx_msgs.load(Ordering::Relaxed),
            rx: self.rx_msgs.load(Ordering::Relaxed),
            rx_bytes: self.rx_bytes.load(Ordering::Relaxed),
            drops: self.drops.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            latency_sum: self.latency_sum_ns.load(Ordering::Relaxed),
        }
    }

    /// True once a side has failed.
    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::Relaxed)
    }
}

#[derive(Clone, Copy, Default)]
struct Snapshot {
    tx: u64,
    rx: u64,
    rx_bytes: u64,
    drops: u64,
    errors: u64,
    latency_sum: u64,
}

/// One interval's figures (normally one second).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    /// End of the interval, seconds after measurement started.
    pub t_s: f64,
    /// Length of the interval in seconds.
    pub secs: f64,
    /// Messages sent per second.
    pub tx_pps: f64,
    /// Messages received (round trips completed) per second.
    pub rx_pps: f64,
    /// Received Mbit/s of encoded messages (L2).
    pub mbps_l2: f64,
    /// Received Mbit/s with Ethernet framing (L1).
    pub mbps_l1: f64,
    /// Messages found missing in the interval.
    pub drops: u64,
    /// Errors in the interval.
    pub errors: u64,
    /// Mean latency of the interval's messages in ns.
    pub mean_latency_ns: f64,
}

/// Where a run is, for a progress indicator.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Progress {
    /// Seconds since measurement started (0 during warm-up).
    pub elapsed_s: f64,
    /// Planned measured seconds, when the run is timed.
    pub planned_s: Option<f64>,
    /// Messages sent so far (measured).
    pub sent: u64,
    /// Planned messages, when the run is counted.
    pub planned_count: Option<u64>,
    /// Still warming up.
    pub warming_up: bool,
}

/// Watches a run: gets a sample each second and progress more often.
pub trait Observer {
    /// A second (or the last, partial interval) has passed.
    fn sample(&mut self, _sample: &Sample) {}
    /// Called a few times a second.
    fn progress(&mut self, _progress: &Progress) {}
}

/// An observer that ignores everything.
#[derive(Clone, Copy, Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {}

/// The last interval counts in the summary when at least this long, or
/// when it is the only one.
const MIN_PARTIAL_S: f64 = 0.5;

/// Samples `meter` every `interval` from measurement start until every
/// holder of `done`'s sender has dropped it; returns the samples.
pub fn watch(
    meter: &Meter,
    clock: &MonotonicClock,
    done: &Receiver<()>,
    interval: Duration,
    plan: (Option<f64>, Option<u64>),
    observer: &mut dyn Observer,
) -> Vec<Sample> {
    let tick = Duration::from_millis(200).min(interval);
    let interval_ns = interval.as_nanos().max(1) as u64;
    let mut samples = Vec::new();
    let mut last = Snapshot::default();
    let mut last_ns: Option<u64> = None;
    loop {
        // Wake at the next sample boundary, or sooner for progress.
        let wait = match last_ns {
            Some(from) => {
                let due = from.saturating_add(interval_ns);
                Duration::from_nanos(due.saturating_sub(clock.now_ns())).min(tick)
            }
            None => tick,
        };
        let finished = matches!(done.recv_timeout(wait), Err(RecvTimeoutError::Disconnected));
        let now = clock.now_ns();
        let start = meter.measure_start_ns.load(Ordering::Acquire);
        let snap = meter.snapshot();
        if start != u64::MAX {
            let from = *last_ns.get_or_insert(start);
            let due = now.saturating_sub(from) >= interval_ns;
            let partial_s = now.saturating_sub(from) as f64 / 1e9;
            if due || (finished && (partial_s >= MIN_PARTIAL_S || samples.is_empty())) {
                // The last sample ends where the traffic ended, not later.
                let end = if finished { now.max(from + 1) } else { now };
                let s = make_sample(&last, &snap, from, end, start);
                observer.sample(&s);
                samples.push(s);
                last = snap;
                last_ns = Some(end);
            }
        }
        observer.progress(&Progress {
            elapsed_s: if start == u64::MAX {
                0.0
            } else {
                now.saturating_sub(start) as f64 / 1e9
            },
            planned_s: plan.0,
            sent: snap.tx,
            planned_count: plan.1,
            warming_up: start == u64::MAX,
        });
        if finished {
            return samples;
        }
    }
}

fn make_sample(a: &Snapshot, b: &Snapshot, from: u64, to: u64, start: u64) -> Sample {
    let secs = (to - from) as f64 / 1e9;
    let rx = b.rx.saturating_sub(a.rx);
    let bytes = b.rx_bytes.saturating_sub(a.rx_bytes);
    let lat = b.latency_sum.saturating_sub(a.latency_sum);
    Sample {
        t_s: to.saturating_sub(start) as f64 / 1e9,
        secs,
        tx_pps: b.tx.saturating_sub(a.tx) as f64 / secs,
        rx_pps: rx as f64 / secs,
        mbps_l2: bytes as f64 * 8.0 / secs / 1e6,
        mbps_l1: (bytes + rx * L1_OVERHEAD) as f64 * 8.0 / secs / 1e6,
        drops: b.drops.saturating_sub(a.drops),
        errors: b.errors.saturating_sub(a.errors),
        mean_latency_ns: if rx == 0 { 0.0 } else { lat as f64 / rx as f64 },
    }
}

/// Runs `work` on a new OS thread with its own current-thread tokio
/// runtime (I/O and timers enabled). The thread holds `done` until it ends.
pub fn spawn_worker<T, F, Fut>(
    what: &'static str,
    done: Sender<()>,
    work: F,
) -> Result<JoinHandle<Result<T, BenchError>>, BenchError>
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<T, BenchError>>,
{
    std::thread::Builder::new()
        .name(format!("bench-{what}"))
        .spawn(move || {
            let _done = done;
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|source| BenchError::Thread { what, source })?;
            rt.block_on(work())
        })
        .map_err(|source| BenchError::Thread { what, source })
}

/// Joins a worker, turning a panic into an error.
pub fn join<T>(what: &'static str, h: JoinHandle<Result<T, BenchError>>) -> Result<T, BenchError> {
    h.join().map_err(|_| BenchError::Panicked(what))?
}

/// Receives up to `max` messages into `out`: `Some(0)` when the stream
/// ended, `None` when nothing came for `idle`. Parks the thread while
/// waiting, or with `busy` polls without parking (lower latency, one core
/// spinning).
pub async fn recv_some(
    link: &mut BoxLink,
    out: &mut Vec<Message>,
    max: usize,
    busy: bool,
    idle: Duration,
) -> Result<Option<usize>, LinkError> {
    if busy {
        let deadline = Instant::now() + idle;
        let mut spins = 0u32;
        loop {
            let polled = poll_fn(|cx| Poll::Ready(link.poll_recv_batch(cx, out, max))).await;
            match polled {
                Poll::Ready(r) => return r.map(Some),
                Poll::Pending => {
                    if Instant::now() >= deadline {
                        return Ok(None);
                    }
                    spins = spins.saturating_add(1);
                    if spins > SPINS_BEFORE_YIELD {
                        // Long idle: let another thread (perhaps the other
                        // side) have this core, as on an oversubscribed
                        // machine spinning would starve it.
                        std::thread::yield_now();
                    }
                    tokio::task::yield_now().await;
                }
            }
        }
    } else {
        match tokio::time::timeout(idle, link.recv_batch(out, max)).await {
            Ok(r) => r.map(Some),
            Err(_) => Ok(None),
        }
    }
}

/// Empty polls a busy-polling receiver makes before it also yields its
/// core to the operating system on each further poll.
const SPINS_BEFORE_YIELD: u32 = 256;

/// The UID messages are sent to.
pub fn sink_uid() -> Uid {
    Uid::new(Ipv4Addr::LOCALHOST, 0xbe00)
}

/// The SEND header of flow `i`: flows differ in source UID and port
/// (port 1024 + i mod 64512, device 1 + i / 64512), all to one sink.
pub fn flow_header(i: u32) -> Header {
    const PORTS: u32 = 65536 - 1024;
    let device = (1 + i / PORTS) as u16;
    let port = (1024 + i % PORTS) as u16;
    let src = Uid::new(Ipv4Addr::LOCALHOST, device);
    Header::new(src, sink_uid(), Request::send(port, 9))
}

/// Most flows a run may have.
pub const MAX_FLOWS: u32 = 1 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_meters_flags_and_each_sides_counters_lie_on_separate_lines() {
        use std::mem::{align_of, offset_of};
        // 128: a line and the one its pair-prefetcher fetches with it.
        assert_eq!(align_of::<Meter>(), 128);
        let flags_end = offset_of!(Meter, abort) + 1;
        let tx = (offset_of!(Meter, tx_msgs), offset_of!(Meter, tx_bytes) + 8);
        let rx = offset_of!(Meter, rx_msgs);
        assert!(flags_end <= 128 && tx.0 == 128, "{flags_end} {tx:?}");
        assert!(tx.1 <= 256 && rx == 256, "{tx:?} {rx}");
    }

    #[test]
    fn flows_differ_in_source_port_and_uid() {
        let a = flow_header(0);
        let b = flow_header(1);
        let c = flow_header(64512);
        assert_eq!(a.src, b.src);
        assert_ne!(a.request.ports(), b.request.ports());
        assert_ne!(a.src, c.src);
        assert_eq!(a.request.ports(), c.request.ports());
    }

    #[test]
    fn a_sample_divides_by_its_own_interval() {
        let a = Snapshot::default();
        let b = Snapshot {
            tx: 1000,
            rx: 1000,
            rx_bytes: 96_000,
            latency_sum: 5_000_000,
            ..Snapshot::default()
        };
        let s = make_sample(&a, &b, 0, 500_000_000, 0);
        assert_eq!(s.rx_pps, 2000.0);
        assert_eq!(s.mbps_l2, 96_000.0 * 8.0 * 2.0 / 1e6);
        assert_eq!(s.mbps_l1, (96_000.0 + 38_000.0) * 8.0 * 2.0 / 1e6);
        assert_eq!(s.mean_latency_ns, 5000.0);
    }
}
