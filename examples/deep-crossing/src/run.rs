//! Inferences through a connection to the entry device: up to
//! `pipeline` in flight, each answer checked for length and added to the
//! digest in order, its latency (host products, request, answer)
//! recorded.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use uniplane_client::Connection;
use uniplane_dataplane::LinkError;

use crate::{Digest, Model};

/// How a run goes.
#[derive(Clone, Debug)]
pub struct RunConfig {
    /// Inferences (inputs `0..count`).
    pub count: u64,
    /// Inferences in flight at once (1: one after the other).
    pub pipeline: usize,
    /// Compares every output with the reference afterwards.
    pub verify: bool,
    /// How long an answer may take.
    pub timeout: Duration,
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct Outcome {
    /// The digest of every output, in input order.
    pub digest: Digest,
    /// Each inference's latency in nanoseconds, ascending.
    pub latencies_ns: Vec<u64>,
    /// From the first request to the last answer.
    pub elapsed: Duration,
    /// Whether every output matched the reference bit for bit (`None`
    /// when not checked).
    pub verified: Option<bool>,
}

impl Outcome {
    /// The `q`-quantile of the latencies in microseconds (nearest rank).
    pub fn latency_us(&self, q: f64) -> f64 {
        let n = self.latencies_ns.len();
        if n == 0 {
            return 0.0;
        }
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        self.latencies_ns[rank - 1] as f64 / 1e3
    }

    /// Inferences per second over the run.
    pub fn per_sec(&self) -> f64 {
        self.latencies_ns.len() as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Why a run stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// A stage refused an inference (its error answer).
    #[error("inference {index}: a stage answered an error: {status}")]
    Stage {
        /// The inference.
        index: u64,
        /// The error the caller received.
        status: String,
    },
    /// An answer of the wrong size.
    #[error("inference {index}: an answer of {len} bytes, expected {want}")]
    Answer {
        /// The inference.
        index: u64,
        /// Its length.
        len: usize,
        /// The model's answer length.
        want: usize,
    },
    /// No answer in time.
    #[error("inference {index}: no answer in {timeout:?}")]
    Timeout {
        /// The inference.
        index: u64,
        /// How long it waited.
        timeout: Duration,
    },
    /// The connection failed or closed.
    #[error("the connection: {0}")]
    Link(String),
}

impl From<LinkError> for RunError {
    fn from(e: LinkError) -> RunError {
        RunError::Link(e.to_string())
    }
}

/// Runs `cfg.count` inferences of `model` through `conn` (a connection to
/// the entry device).
pub async fn run(
    conn: &mut Connection,
    model: &Model,
    cfg: &RunConfig,
) -> Result<Outcome, RunError> {
    let pipeline = cfg.pipeline.max(1);
    let want = model.answer_bytes();
    let mut embedded = vec![0.0f32; model.dims()[0]];
    let mut request = Vec::with_capacity(model.request_bytes());
    let mut in_flight: VecDeque<Instant> = VecDeque::with_capacity(pipeline);
    let mut latencies = Vec::with_capacity(cfg.count as usize);
    let mut outputs = Vec::with_capacity(if cfg.verify {
        cfg.count as usize * want
    } else {
        0
    });
    let mut digest = Digest::default();
    let (mut next, mut done) = (0u64, 0u64);
    let started = Instant::now();
    while done < cfg.count {
        while next < cfg.count && in_flight.len() < pipeline {
            let t0 = Instant::now();
            let input = model.input(next);
            model.request(&input, &mut embedded, &mut request);
            conn.send_bytes(Bytes::copy_from_slice(&request)).await?;
            in_flight.push_back(t0);
            next += 1;
        }
        let answer = match tokio::time::timeout(cfg.timeout, conn.recv()).await {
            Err(_) => {
                return Err(RunError::Timeout {
                    index: done,
                    timeout: cfg.timeout,
                })
            }
            Ok(None) => return Err(RunError::Link("closed by the daemon".into())),
            Ok(Some(Err(LinkError::PeerFailed(status)))) => {
                return Err(RunError::Stage {
                    index: done,
                    status: status.to_string(),
                })
            }
            Ok(Some(Err(e))) => return Err(e.into()),
            Ok(Some(Ok(m))) => m,
        };
        let t0 = in_flight.pop_front().unwrap_or(started);
        latencies.push(t0.elapsed().as_nanos() as u64);
        let payload = answer.payload();
        if payload.len() != want {
            return Err(RunError::Answer {
                index: done,
                len: payload.len(),
                want,
            });
        }
        digest.update(payload);
        if cfg.verify {
            outputs.extend_from_slice(payload);
        }
        done += 1;
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    let verified = cfg.verify.then(|| {
        outputs.chunks_exact(want).enumerate().all(|(i, got)| {
            let r = model.reference(&model.input(i as u64));
            r.iter()
                .flat_map(|v| v.to_le_bytes())
                .eq(got.iter().copied())
        })
    });
    Ok(Outcome {
        digest,
        latencies_ns: latencies,
        elapsed,
        verified,
    })
}
