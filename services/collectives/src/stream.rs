//! The streaming call form: input as chunks that arrive over time, the
//! result delivered segment by segment as soon as each is done.
//!
//! ```text
//!   input chunks (any sizes) ─► re-cut into segments of SEGMENT_BYTES
//!        │                       (the same cut on every rank: it follows
//!        ▼                        the declared length, not the chunks)
//!   segment i   ─► its own collective (own key) ─┐ up to IN_FLIGHT at once:
//!   segment i+1 ─► its own collective ───────────┤ i+1 travels while i is
//!   …                                            │ reduced
//!   length check (one tiny allreduce) ───────────┤
//!                                                ▼
//!   results in segment order ◄── a bounded channel ◄── the call's task
//! ```
//!
//! Every rank declares the total length; the segments are cut from it,
//! so ranks may chunk their input differently. A small allreduce run
//! beside the first segments checks that every rank declared the same
//! length; no result is delivered before it has. Input whose total
//! disagrees with the declared length fails the call on that rank with
//! [`Error::Argument`] (its peers fail with [`Error::Timeout`] or
//! [`Error::Protocol`], within the world's timeout).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::stream::{FuturesOrdered, Stream, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::comm::{mix, Communicator};
use crate::datatype::{Element, Op};
use crate::frame::Key;
use crate::Error;

/// Bytes of one segment of a streaming call (one eager frame).
pub const SEGMENT_BYTES: usize = 32 * 1024;
/// Segments of one streaming call in flight at once; also how many
/// results may wait for the caller to take them.
pub const IN_FLIGHT: usize = 4;

/// Tags of collectives (as in `comm`): a segment's key never meets a
/// user's.
const COLLECTIVE: u64 = 1 << 63;

/// The results of a streaming call, segment by segment in order; the
/// stream ends after the last segment or after the first error. Dropping
/// it cancels the call (on this rank; its peers then time out).
pub struct ChunkStream<T> {
    rx: mpsc::Receiver<Result<Vec<T>, Error>>,
    task: JoinHandle<()>,
}

impl<T> std::fmt::Debug for ChunkStream<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkStream").finish_non_exhaustive()
    }
}

impl<T> Stream for ChunkStream<T> {
    type Item = Result<Vec<T>, Error>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().rx.poll_recv(cx)
    }
}

impl<T> Drop for ChunkStream<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<T> ChunkStream<T> {
    /// Waits for every segment and returns them concatenated.
    pub async fn concat(mut self) -> Result<Vec<T>, Error> {
        let mut out = Vec::new();
        while let Some(seg) = self.next().await {
            out.extend(seg?);
        }
        Ok(out)
    }
}

#[derive(Clone, Copy)]
enum Role {
    Allreduce(Op),
    Bcast { root: usize },
}

type SegmentFuture<'a, T> =
    Pin<Box<dyn Future<Output = Result<Option<Vec<T>>, Error>> + Send + 'a>>;

impl Communicator {
    /// [`Communicator::allreduce`] in streaming form: `input` yields this
    /// rank's `len` elements in chunks of any sizes as they are produced
    /// (and then ends); the result comes segment by segment
    /// ([`SEGMENT_BYTES`] each, the last shorter) as soon as each segment
    /// is reduced, with up to [`IN_FLIGHT`] segments travelling at once.
    /// Every rank must declare the same `len`. The results equal those of
    /// [`Communicator::allreduce`] on the concatenated input (floats up to
    /// the order of summation, which may differ as each segment picks its
    /// algorithm by its own size).
    ///
    /// The call takes its place in the communicator's order when it is
    /// made; it runs on a task of its own, so it needs a tokio runtime.
    pub fn allreduce_stream<T, S>(&self, len: usize, input: S, op: Op) -> ChunkStream<T>
    where
        T: Element,
        S: Stream<Item = Vec<T>> + Send + 'static,
    {
        self.stream_call(len, input, Role::Allreduce(op))
    }

    /// [`Communicator::bcast`] in streaming form: the root's `input`
    /// yields its `len` elements in chunks of any sizes (and then ends);
    /// every rank gets the data segment by segment as each arrives (the
    /// root, as each has been sent on). Other ranks' `input` is not read
    /// (pass `futures_util::stream::empty()`). Every rank must declare
    /// the same `len`.
    pub fn bcast_stream<T, S>(&self, len: usize, input: S, root: usize) -> ChunkStream<T>
    where
        T: Element,
        S: Stream<Item = Vec<T>> + Send + 'static,
    {
        self.stream_call(len, input, Role::Bcast { root })
    }

    fn stream_call<T, S>(&self, len: usize, input: S, role: Role) -> ChunkStream<T>
    where
        T: Element,
        S: Stream<Item = Vec<T>> + Send + 'static,
    {
        let key = self.next_key();
        let comm = self.clone();
        let (tx, rx) = mpsc::channel(IN_FLIGHT);
        let task = tokio::spawn(async move {
            if let Err(e) = run(&comm, key, len, Box::pin(input), role, &tx).await {
                let _ = tx.send(Err(e)).await;
            }
        });
        ChunkStream { rx, task }
    }
}

/// The length check: every rank declared `len`.
async fn agree(comm: &Communicator, key: Key, len: usize) -> Result<(), Error> {
    let mine = len as u64;
    let mut v = [mine, !mine];
    comm.allreduce_with(key, &mut v, Op::Max).await?;
    let (max, min) = (v[0], !v[1]);
    if max != mine || min != mine {
        return Err(Error::Argument(format!(
            "streaming call of {mine} elements here, while ranks declared between {min} and {max}"
        )));
    }
    Ok(())
}

async fn run<T: Element>(
    comm: &Communicator,
    key: Key,
    len: usize,
    mut input: Pin<Box<dyn Stream<Item = Vec<T>> + Send>>,
    role: Role,
    tx: &mpsc::Sender<Result<Vec<T>, Error>>,
) -> Result<(), Error> {
    if let Role::Bcast { root } = role {
        if root >= comm.size() {
            return Err(Error::Argument(format!(
                "root {root} outside a communicator of {}",
                comm.size()
            )));
        }
    }
    let seg = (SEGMENT_BYTES / T::SIZE).max(1);
    let segments = len.div_ceil(seg);
    let seg_len = |i: usize| seg.min(len - i * seg);
    let context = mix(comm.id(), key.tag);
    let sub = |i: usize| Key {
        comm: context,
        tag: COLLECTIVE | i as u64,
    };
    let reads_input = match role {
        Role::Allreduce(_) => true,
        Role::Bcast { root } => comm.rank() == root,
    };

    let mut in_flight: FuturesOrdered<SegmentFuture<'_, T>> = FuturesOrdered::new();
    in_flight.push_back(Box::pin(async move {
        agree(comm, key, len).await.map(|()| None)
    }));
    // Segments cut from the input, not launched yet.
    let mut ready: VecDeque<Vec<T>> = VecDeque::new();
    let mut filling: Vec<T> = Vec::new();
    let mut filled = 0usize; // segments cut so far
    let mut received = 0usize; // elements read from the input
    let mut input_done = !reads_input;
    let mut launched = 0usize;
    loop {
        while launched < segments && in_flight.len() <= IN_FLIGHT {
            let mut buf = if reads_input {
                match ready.pop_front() {
                    Some(b) => b,
                    None => break,
                }
            } else {
                vec![T::default(); seg_len(launched)]
            };
            let k = sub(launched);
            in_flight.push_back(Box::pin(async move {
                match role {
                    Role::Allreduce(op) => comm.allreduce_with(k, &mut buf, op).await?,
                    Role::Bcast { root } => {
                        let alg = comm.choose(crate::Collective::Bcast, buf.len() * T::SIZE);
                        comm.bcast_with(k, &mut buf, root, alg).await?;
                    }
                }
                Ok(Some(buf))
            }));
            launched += 1;
        }
        if launched == segments && in_flight.is_empty() && input_done {
            return Ok(());
        }
        tokio::select! {
            Some(done) = in_flight.next(), if !in_flight.is_empty() => {
                if let Some(out) = done? {
                    if tx.send(Ok(out)).await.is_err() {
                        // The caller dropped the results: stop.
                        return Ok(());
                    }
                }
            }
            chunk = input.next(), if !input_done && ready.len() < IN_FLIGHT => match chunk {
                None => {
                    input_done = true;
                    if received != len {
                        return Err(Error::Argument(format!(
                            "the input ended after {received} of {len} elements"
                        )));
                    }
                }
                Some(chunk) => {
                    if chunk.len() > len - received {
                        return Err(Error::Argument(format!(
                            "the input holds more than the {len} elements declared ({} or more)",
                            received + chunk.len()
                        )));
                    }
                    received += chunk.len();
                    let mut rest = &chunk[..];
                    while !rest.is_empty() {
                        let want = seg_len(filled);
                        if filling.capacity() < want {
                            filling.reserve_exact(want);
                        }
                        let take = (want - filling.len()).min(rest.len());
                        filling.extend_from_slice(&rest[..take]);
                        rest = &rest[take..];
                        if filling.len() == want {
                            ready.push_back(std::mem::take(&mut filling));
                            filled += 1;
                        }
                    }
                }
            },
            else => {
                return Err(Error::Protocol("a streaming call has nothing left to wait for".into()));
            }
        }
    }
}
