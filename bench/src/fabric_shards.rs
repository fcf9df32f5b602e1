//! `fabric --shards N`: the sharded engine's throughput by wall clock.
//!
//! Two sources of traffic:
//!
//! - `replay`: every port is a replay device run inside its own shard
//!   (attached with `attach_io`): its input hands out pre-built messages
//!   whose payloads are one static buffer (so handing one out and dropping
//!   it at the output touch no shared reference count, as a per-shard
//!   buffer pool would not), and its output counts and drops what it gets.
//!   No generator thread competes with the shards, so the figure is the
//!   engine's.
//! - `threads`: every port is an application on the engine's ring link,
//!   with a thread that keeps its ring full and drains what arrives —
//!   what applications see, on cores the shards share.
//!
//! The shards busy-poll; the report says how many cores the machine has
//! and which shards were pinned.

use std::net::Ipv4Addr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::task::noop_waker;
use futures_util::{Sink, Stream};
use serde_json::{json, Value};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::{Message, PortClosed, PortIo, Uid};
use uniplane_overlay::acl::AclRule;
use uniplane_overlay::table::Route;
use uniplane_overlay::{
    spawn_sharded, EngineConfig, ForwardingPlane, PortId, PortSpec, RunMode, ShardConfig,
};

use crate::fabric::Matrix;
use crate::BenchError;

/// Where the traffic comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// Replay devices inside the shards.
    Replay,
    /// One application thread per port.
    Threads,
}

impl std::str::FromStr for Source {
    type Err = BenchError;
    fn from_str(s: &str) -> Result<Self, BenchError> {
        match s {
            "replay" => Ok(Source::Replay),
            "threads" => Ok(Source::Threads),
            other => Err(BenchError::Config(format!(
                "--source `{other}`: replay or threads"
            ))),
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ShardedFabric {
    /// Sending ports.
    pub senders: usize,
    /// Traffic matrix.
    pub matrix: Matrix,
    /// Payload bytes.
    pub size: usize,
    /// Measured seconds (after a warm-up of 200 ms).
    pub seconds: f64,
    /// Shard threads.
    pub shards: usize,
    /// CPUs to pin shards to (empty: not pinned).
    pub cpus: Vec<usize>,
    /// Where traffic comes from.
    pub source: Source,
    /// Messages a shard reads from one input per pass.
    pub burst: usize,
    /// Messages each virtual output queue holds.
    pub voq_depth: usize,
}

fn uid(device: u16) -> Uid {
    Uid::new(Ipv4Addr::LOCALHOST, device)
}

/// A port that replays pre-built messages and counts what it is given.
/// On a cache line of its own: it changes with every message, and the
/// ports of different shards are allocated one after another.
#[repr(align(128))]
struct Replay {
    /// Messages it sends, in turn (empty: it only receives).
    script: Vec<Message>,
    next: usize,
    /// Messages received since the last flush.
    pending: u64,
    delivered: Arc<Count>,
}

/// A port's count of delivered messages, on a cache line of its own.
#[repr(align(128))]
#[derive(Default)]
struct Count(AtomicU64);

/// Messages a replay input offers at once (it never runs dry).
const OFFER: usize = 1 << 20;

impl PortIo for Replay {
    #[inline]
    fn peek(&mut self) -> Option<&Message> {
        self.script.get(self.next)
    }
    #[inline]
    fn pop(&mut self) -> Option<Message> {
        let m = self.script.get(self.next)?.clone();
        self.next += 1;
        if self.next == self.script.len() {
            self.next = 0;
        }
        Some(m)
    }
    fn available(&mut self) -> usize {
        if self.script.is_empty() {
            0
        } else {
            OFFER
        }
    }
    fn release(&mut self) {}
    fn poll_available(&mut self, _cx: &mut Context<'_>) -> Poll<bool> {
        Poll::Ready(!self.script.is_empty())
    }
    fn free(&mut self) -> usize {
        OFFER
    }
    #[inline]
    fn push(&mut self, m: Message) -> Result<(), Message> {
        drop(m);
        self.pending += 1;
        Ok(())
    }
    fn flush(&mut self) {
        if self.pending > 0 {
            self.delivered.0.fetch_add(self.pending, Ordering::Relaxed);
            self.pending = 0;
        }
    }
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        Poll::Ready(Ok(()))
    }
    fn is_closed(&mut self) -> bool {
        false
    }
}

/// The destinations port `s` of `ports` sends to.
fn destinations(matrix: Matrix, s: usize, senders: usize, ports: usize) -> Vec<usize> {
    match matrix {
        Matrix::AllToOne if s < senders => vec![senders],
        Matrix::AllToOne => Vec::new(),
        Matrix::Uniform => (1..ports).map(|k| (s + k) % ports).collect(),
    }
}

/// The payload every replayed message refers to.
static PAYLOAD: [u8; Message::MAX_PAYLOAD] = [0x5a; Message::MAX_PAYLOAD];

/// Messages from port `s` to each of `dsts`, `size` bytes each. With
/// `shared`, every payload is a view of [`PAYLOAD`] (cloning one touches
/// no reference count); else each has its own buffer.
fn script(s: usize, dsts: &[usize], size: usize, shared: bool) -> Result<Vec<Message>, BenchError> {
    dsts.iter()
        .map(|&d| {
            let payload = if shared {
                Bytes::from_static(&PAYLOAD[..size])
            } else {
                Bytes::from(vec![s as u8; size])
            };
            Message::send(
                uid(s as u16 + 1).port(1),
                uid(d as u16 + 1).port(2),
                payload,
            )
            .map_err(|e| BenchError::Config(e.to_string()))
        })
        .collect()
}

fn plane_err(e: uniplane_overlay::PlaneError) -> BenchError {
    BenchError::Config(e.to_string())
}

/// Runs the sharded fabric; see the module documentation.
pub fn run_sharded(cfg: &ShardedFabric) -> Result<Value, BenchError> {
    if !(1..=Message::MAX_PAYLOAD).contains(&cfg.size) {
        return Err(BenchError::Config(format!(
            "size must be 1..={}",
            Message::MAX_PAYLOAD
        )));
    }
    let ports = match cfg.matrix {
        Matrix::AllToOne => cfg.senders + 1,
        Matrix::Uniform => cfg.senders.max(2),
    };
    let config = EngineConfig {
        max_ports: ports.max(2),
        burst: cfg.burst.max(1),
        voq_depth: cfg.voq_depth.max(1),
        ring_depth: 1024,
        ..EngineConfig::default()
    };
    let mut e = spawn_sharded(
        config,
        &ShardConfig {
            shards: cfg.shards.max(1),
            cpus: cfg.cpus.clone(),
        },
        RunMode::BusyPoll,
    )
    .map_err(plane_err)?;
    let counts: Vec<Arc<Count>> = (0..ports).map(|_| Arc::default()).collect();
    let delivered = || {
        counts
            .iter()
            .map(|c| c.0.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut apps = Vec::new();
    for (s, count) in counts.iter().enumerate() {
        let dsts = destinations(cfg.matrix, s, cfg.senders, ports);
        let script = script(s, &dsts, cfg.size, cfg.source == Source::Replay)?;
        let spec = PortSpec::app(&format!("p{s}"));
        match cfg.source {
            Source::Replay => {
                let io = Replay {
                    script,
                    next: 0,
                    pending: 0,
                    delivered: count.clone(),
                };
                e.attach_io(spec, Box::new(io)).map_err(plane_err)?;
            }
            Source::Threads => {
                let (_, link) = e.attach(spec).map_err(plane_err)?;
                apps.push((link, script, count.clone()));
            }
        }
    }
    for p in 0..ports as PortId {
        e.add_acl_rule(p, AclRule::ALLOW_ALL).map_err(plane_err)?;
        for d in 0..ports as PortId {
            e.add_route(p, Route::exact(uid(d + 1), d))
                .map_err(plane_err)?;
        }
    }
    let threads: Vec<_> = apps
        .into_iter()
        .map(|(link, script, count)| {
            let stop = stop.clone();
            std::thread::spawn(move || app(link, &script, &count, &stop))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let (n0, t0) = (delivered(), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(cfg.seconds));
    let (n1, wall) = (delivered(), t0.elapsed());
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    let mut per_port = Vec::new();
    for p in 0..ports as PortId {
        let c = e.counters(p).map_err(plane_err)?;
        per_port.push(
            json!({ "rx_msgs": c.rx_msgs, "tx_msgs": c.tx_msgs, "input_stalls": c.input_stalls }),
        );
    }
    e.stop();
    let msgs = (n1 - n0) as f64 / wall.as_secs_f64();
    Ok(json!({
        "msgs_per_sec": msgs,
        "gbytes_per_sec": msgs * cfg.size as f64 / 1e9,
        "delivered": n1 - n0,
        "seconds": wall.as_secs_f64(),
        "shards": cfg.shards.max(1),
        "cores": crate::report::cores(),
        "cpus": cfg.cpus,
        "ports": ports,
        "source": match cfg.source { Source::Replay => "replay", Source::Threads => "threads" },
        "burst": cfg.burst,
        "voq_depth": cfg.voq_depth,
        "per_port": per_port,
    }))
}

/// An application thread: keeps its ring full of `script` (in turn) and
/// counts what arrives, until `stop`.
fn app(mut link: RingLink, script: &[Message], delivered: &Count, stop: &AtomicBool) -> RingLink {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    let mut next = 0;
    let mut inbox = Vec::with_capacity(1024);
    while !stop.load(Ordering::Relaxed) {
        if !script.is_empty() {
            while let Poll::Ready(Ok(())) = Pin::new(&mut link).poll_ready(&mut cx) {
                if Pin::new(&mut link)
                    .start_send(script[next].clone())
                    .is_err()
                {
                    break;
                }
                next = (next + 1) % script.len();
            }
            let _ = Pin::new(&mut link).poll_flush(&mut cx);
        }
        inbox.clear();
        let mut got = 0;
        while let Poll::Ready(Some(Ok(m))) = Pin::new(&mut link).poll_next(&mut cx) {
            inbox.push(m);
            got += 1;
            if got == 1024 {
                break;
            }
        }
        if got > 0 {
            delivered.0.fetch_add(got, Ordering::Relaxed);
        } else {
            std::thread::yield_now();
        }
    }
    link
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_through_two_shards_delivers_and_counts_every_port() {
        for source in [Source::Replay, Source::Threads] {
            let r = run_sharded(&ShardedFabric {
                senders: 3,
                matrix: Matrix::Uniform,
                size: 64,
                seconds: 0.2,
                shards: 2,
                cpus: Vec::new(),
                source,
                burst: 64,
                voq_depth: 256,
            })
            .unwrap();
            assert!(r["delivered"].as_u64().unwrap() > 0, "{r}");
            let ports = r["per_port"].as_array().unwrap();
            assert_eq!(ports.len(), 3);
            assert!(
                ports.iter().all(|p| p["tx_msgs"].as_u64().unwrap() > 0),
                "{r}"
            );
        }
    }
}
