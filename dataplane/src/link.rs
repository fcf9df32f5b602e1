//! The [`Link`] trait: a duplex message channel, the unit every stack opens
//! and every middleware wraps.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_core::Stream;
use futures_sink::Sink;

use crate::wire::DecodeError;
use crate::Message;

/// Why a link failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// The other end is gone; nothing more can be sent.
    #[error("link closed by the peer")]
    Closed,
    /// Bytes that are not a valid message arrived where a stream cannot skip
    /// them (framed byte streams). Datagram links count and drop such frames
    /// instead of reporting them.
    #[error("malformed message: {0}")]
    Malformed(#[from] DecodeError),
    /// A message is larger than the link carries.
    #[error("message of {size} bytes exceeds the link's limit of {limit}")]
    TooLarge {
        /// Encoded size of the message.
        size: usize,
        /// The link's limit.
        limit: usize,
    },
    /// The peer stopped answering (keepalives, retransmissions exhausted).
    #[error("peer failed: {0}")]
    PeerFailed(String),
    /// An operating-system error.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// A duplex message channel: a [`Stream`] of received messages and a
/// [`Sink`] of messages to send, like `tokio_util::codec::Framed`.
///
/// Contract:
/// - `poll_ready` is the backpressure signal: a full link returns `Pending`
///   and never drops a message it accepted.
/// - The stream ends (`None`) when the peer closed and every message it sent
///   has been received. An `Err` item means the link failed.
/// - Messages sent with `start_send` may wait in the link until `poll_flush`;
///   implementations use that to batch wake-ups and system calls.
///
/// The batch methods move many messages per call on hot paths; their
/// default implementations loop over the single-message methods, and links
/// that can do better override them.
pub trait Link:
    Stream<Item = Result<Message, LinkError>> + Sink<Message, Error = LinkError> + Send + Unpin
{
    /// Appends up to `max` received messages to `out`.
    ///
    /// `Ready(Ok(n))` with `n > 0` appended `n`; `Ready(Ok(0))` means the
    /// stream has ended; `Pending` means nothing is available now and the
    /// task will be woken. On `Ready(Err(_))`, messages received before the
    /// failure are already in `out`: nothing is lost.
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        let mut n = 0;
        while n < max {
            match Pin::new(&mut *self).poll_next(cx) {
                Poll::Ready(Some(Ok(m))) => {
                    out.push(m);
                    n += 1;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(e)),
                Poll::Ready(None) => return Poll::Ready(Ok(n)),
                Poll::Pending if n == 0 => return Poll::Pending,
                Poll::Pending => break,
            }
        }
        Poll::Ready(Ok(n))
    }

    /// Starts sending messages from the front of `batch` while the link
    /// accepts them, removing each one it accepted.
    ///
    /// `Ready(Ok(()))` once `batch` is empty; `Pending` while the link is
    /// full (the task will be woken). Accepted messages may wait in the link
    /// until `poll_flush`.
    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut VecDeque<Message>,
    ) -> Poll<Result<(), LinkError>> {
        while !batch.is_empty() {
            match Pin::new(&mut *self).poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            if let Some(m) = batch.pop_front() {
                Pin::new(&mut *self).start_send(m)?;
            }
        }
        Poll::Ready(Ok(()))
    }
}

/// A link of any type, as stacks return them.
pub type BoxLink = Box<dyn Link>;

impl<L: Link + ?Sized> Link for Box<L> {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        (**self).poll_recv_batch(cx, out, max)
    }

    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut VecDeque<Message>,
    ) -> Poll<Result<(), LinkError>> {
        (**self).poll_send_batch(cx, batch)
    }
}

/// Async helpers over the batch methods of any [`Link`].
pub trait LinkExt: Link {
    /// Waits for at least one message and appends up to `max` to `out`;
    /// `Ok(0)` means the stream ended.
    fn recv_batch<'a>(
        &'a mut self,
        out: &'a mut Vec<Message>,
        max: usize,
    ) -> impl std::future::Future<Output = Result<usize, LinkError>> + Send + 'a
    where
        Self: Sized,
    {
        poll_fn(move |cx| self.poll_recv_batch(cx, out, max))
    }

    /// Sends every message of `batch`, waiting while the link is full, then
    /// flushes.
    fn send_batch<'a>(
        &'a mut self,
        batch: &'a mut VecDeque<Message>,
    ) -> impl std::future::Future<Output = Result<(), LinkError>> + Send + 'a
    where
        Self: Sized,
    {
        poll_fn(move |cx| {
            std::task::ready!(self.poll_send_batch(cx, batch))?;
            Pin::new(&mut *self).poll_flush(cx)
        })
    }
}

impl<L: Link + ?Sized> LinkExt for L {}

/// Moves messages both ways between two links until either ends, in
/// batches: one task, no copies. Returns how the bridge ended: `Ok` when a
/// side's stream ended, the first error otherwise. Messages in flight when
/// one side ends are flushed to the other first.
pub async fn bridge<A: Link, B: Link>(mut a: A, mut b: B) -> Result<(), LinkError> {
    let mut ab = Pump::default();
    let mut ba = Pump::default();
    poll_fn(|cx| loop {
        let p1 = ab.poll(cx, &mut a, &mut b)?;
        let p2 = ba.poll(cx, &mut b, &mut a)?;
        if ab.ended() || ba.ended() {
            return Poll::Ready(Ok(()));
        }
        if !p1 && !p2 {
            return Poll::Pending;
        }
    })
    .await
}

/// One direction of a [`bridge`], for bridges that watch what they move
/// (a tunnel that stops taking messages, say): moves batches from one link
/// to another and tells whether anything moved and what is still owed.
#[derive(Default)]
pub struct Pump {
    buf: Vec<Message>,
    pending: VecDeque<Message>,
    ended: bool,
    /// The destination took messages and has not said they are flushed:
    /// its flush is polled again until it has, even when nothing new
    /// comes (a link may hold what it took until then).
    unflushed: bool,
}

impl Pump {
    /// Moves what it can from `from` to `to`; true when something moved.
    pub fn poll<F: Link, T: Link>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut F,
        to: &mut T,
    ) -> Result<bool, LinkError> {
        self.poll_filtered(cx, from, to, |_| true)
    }

    /// [`poll`](Self::poll), passing on only the messages `keep` accepts
    /// (a filter counts and reports the others itself).
    pub fn poll_filtered<F: Link, T: Link>(
        &mut self,
        cx: &mut Context<'_>,
        from: &mut F,
        to: &mut T,
        mut keep: impl FnMut(&Message) -> bool,
    ) -> Result<bool, LinkError> {
        let mut progress = false;
        if self.pending.is_empty() && !self.ended {
            self.buf.clear();
            match from.poll_recv_batch(cx, &mut self.buf, 64) {
                Poll::Ready(Ok(0)) => self.ended = true,
                Poll::Ready(Ok(_)) => progress = true,
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {}
            }
            self.pending.extend(self.buf.drain(..).filter(|m| keep(m)));
        }
        Ok(self.poll_deliver(cx, to)? | progress)
    }

    /// Messages waiting for the destination, for a caller that feeds the
    /// pump itself rather than from a source link.
    pub fn queue(&mut self) -> &mut VecDeque<Message> {
        &mut self.pending
    }

    /// Hands what waits to `to` and flushes it; true when something moved.
    pub fn poll_deliver<T: Link>(
        &mut self,
        cx: &mut Context<'_>,
        to: &mut T,
    ) -> Result<bool, LinkError> {
        let mut progress = false;
        if !self.pending.is_empty() {
            let before = self.pending.len();
            if let Poll::Ready(r) = to.poll_send_batch(cx, &mut self.pending) {
                r?;
            }
            let moved = self.pending.len() < before;
            progress |= moved;
            self.unflushed |= moved;
        }
        if self.unflushed {
            match Pin::new(&mut *to).poll_flush(cx) {
                Poll::Ready(Ok(())) => {
                    self.unflushed = false;
                    progress = true;
                }
                Poll::Ready(Err(e)) => return Err(e),
                Poll::Pending => {}
            }
        }
        Ok(progress)
    }

    /// Whether everything the destination took is flushed.
    pub fn flushed(&self) -> bool {
        !self.unflushed
    }

    /// Whether the source's stream ended.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// Messages read from the source that the destination has not taken.
    pub fn owed(&self) -> usize {
        self.pending.len()
    }

    /// Takes the messages still owed (when the destination failed).
    pub fn take_owed(&mut self) -> VecDeque<Message> {
        std::mem::take(&mut self.pending)
    }
}
