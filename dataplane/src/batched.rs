//! [`BatchedLink`]: the [`Stream`]/[`Sink`]/[`Link`] plumbing that every
//! stack's link shares, written once.
//!
//! A stack's link is a receive queue, a send backlog and the I/O that
//! refills the one and drains the other in batches: an LTL connection
//! under its endpoint's lock, a UDP socket's `recvmmsg`/`sendmmsg`, an
//! Ethernet device shared by many links, a smoltcp socket. What differs
//! between stacks is only that I/O, which a stack writes as a [`LinkIo`];
//! [`BatchedLink`] turns it into a [`Link`]:
//!
//! ```text
//!   poll_next / poll_recv_batch ─► rx queue ──empty?──► LinkIo::poll_receive (one batch)
//!   start_send ─► LinkIo::queue ─► backlog ──full? / flush / close──► LinkIo::poll_push
//! ```
//!
//! - The receive side asks the I/O for more only when its queue is empty,
//!   and the I/O appends a whole batch at once: one lock, one system call
//!   or one device poll per batch, never per message.
//! - The send side keeps the backlog in whatever form the I/O sends it
//!   (messages, encoded datagrams, a byte stream); `poll_ready` pushes it
//!   only once it is full, so senders batch without flushing.
//! - `poll_close` pushes what waits, then lets the I/O tell its peer.
//!   What a link does when dropped (flushing, giving back its connection)
//!   is the I/O's own `Drop`, since the I/O owns the backlog.
//!
//! Everything is static dispatch: a `BatchedLink<I>` compiles to the code
//! a hand-written link over `I` would be.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_core::Stream;
use futures_sink::Sink;

use crate::link::{Link, LinkError};
use crate::Message;

/// The I/O behind a [`BatchedLink`]: where received messages come from in
/// batches and where sent ones go.
pub trait LinkIo: Send + Unpin {
    /// Largest encoded message `start_send` accepts; larger ones are
    /// refused with [`LinkError::TooLarge`] (`usize::MAX`: no limit).
    fn max_message(&self) -> usize;

    /// Queues one message to send, of `encoded_len` bytes (already checked
    /// against [`LinkIo::max_message`]). It may wait in the backlog until
    /// [`LinkIo::poll_push`].
    fn queue(&mut self, message: Message, encoded_len: usize);

    /// Whether the backlog is full: `poll_ready` then pushes it and waits
    /// while it stays full.
    fn is_full(&self) -> bool;

    /// Hands the backlog on. `Ready(Ok(()))` once nothing waits; `Pending`
    /// while the other side has no room, with `cx` registered to be woken.
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>>;

    /// Appends received messages to `rx`, which is empty when called.
    ///
    /// `Ready(Ok(true))`: appended at least one; `Ready(Ok(false))`: the
    /// stream has ended (`rx` may hold its last messages); `Pending`:
    /// nothing now, with `cx` registered to be woken.
    fn poll_receive(
        &mut self,
        cx: &mut Context<'_>,
        rx: &mut VecDeque<Message>,
    ) -> Poll<Result<bool, LinkError>>;

    /// Tells the peer that nothing more will be sent, after `poll_close`
    /// pushed the backlog. Nothing by default (datagram links).
    fn close(&mut self) {}
}

/// A [`Link`] over a [`LinkIo`]: the receive queue, the backpressure
/// and the end of the stream, the same for every stack.
///
/// It dereferences to its I/O, so that a stack's link type (an alias of
/// `BatchedLink<ItsIo>`) offers the I/O's accessors (`peer_addr`, …).
pub struct BatchedLink<I> {
    io: I,
    rx: VecDeque<Message>,
    /// The I/O reported the end of the stream.
    ended: bool,
}

impl<I: LinkIo> BatchedLink<I> {
    /// A link over `io` with room for `rx_capacity` received messages
    /// before its receive queue grows.
    pub fn new(io: I, rx_capacity: usize) -> Self {
        Self::with_received(io, VecDeque::with_capacity(rx_capacity))
    }

    /// A link over `io` whose first messages are `received` (a listener
    /// that read a new peer's first datagram hands it over this way).
    pub fn with_received(io: I, received: VecDeque<Message>) -> Self {
        BatchedLink {
            io,
            rx: received,
            ended: false,
        }
    }

    /// The I/O.
    pub fn get_ref(&self) -> &I {
        &self.io
    }

    /// The I/O, mutably.
    pub fn get_mut(&mut self) -> &mut I {
        &mut self.io
    }

    /// Makes sure the receive queue holds something; `Ready(Ok(false))`
    /// once the stream has ended and everything was taken.
    #[inline]
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, LinkError>> {
        if !self.rx.is_empty() {
            return Poll::Ready(Ok(true));
        }
        if self.ended {
            return Poll::Ready(Ok(false));
        }
        let open = ready!(self.io.poll_receive(cx, &mut self.rx))?;
        self.ended = !open;
        debug_assert!(!open || !self.rx.is_empty(), "Ready(Ok(true)) with nothing");
        Poll::Ready(Ok(!self.rx.is_empty()))
    }
}

impl<I> Deref for BatchedLink<I> {
    type Target = I;

    fn deref(&self) -> &I {
        &self.io
    }
}

impl<I> DerefMut for BatchedLink<I> {
    fn deref_mut(&mut self) -> &mut I {
        &mut self.io
    }
}

impl<I: std::fmt::Debug> std::fmt::Debug for BatchedLink<I> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.io.fmt(f)
    }
}

impl<I: LinkIo> Stream for BatchedLink<I> {
    type Item = Result<Message, LinkError>;

    #[inline]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match ready!(this.poll_fill(cx)) {
            Ok(true) => Poll::Ready(this.rx.pop_front().map(Ok)),
            Ok(false) => Poll::Ready(None),
            Err(e) => Poll::Ready(Some(Err(e))),
        }
    }
}

impl<I: LinkIo> Sink<Message> for BatchedLink<I> {
    type Error = LinkError;

    #[inline]
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let io = &mut self.get_mut().io;
        if io.is_full() {
            if let Poll::Ready(Err(e)) = io.poll_push(cx) {
                return Poll::Ready(Err(e));
            }
            if io.is_full() {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }

    #[inline]
    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        let io = &mut self.get_mut().io;
        let (size, limit) = (item.encoded_len(), io.max_message());
        if size > limit {
            return Err(LinkError::TooLarge { size, limit });
        }
        io.queue(item, size);
        Ok(())
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().io.poll_push(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let io = &mut self.get_mut().io;
        ready!(io.poll_push(cx))?;
        io.close();
        Poll::Ready(Ok(()))
    }
}

impl<I: LinkIo> Link for BatchedLink<I> {
    #[inline]
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        if !ready!(self.poll_fill(cx))? {
            return Poll::Ready(Ok(0));
        }
        let n = self.rx.len().min(max);
        out.extend(self.rx.drain(..n));
        Poll::Ready(Ok(n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{LinkExt, Uid};
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;

    fn msg(i: u32) -> Message {
        let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
        let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
        let mut m = Message::send(a, b, Bytes::from_static(b"hi")).unwrap();
        m.set_seqnum(i);
        m
    }

    /// A loopback: what is pushed comes back, `room` messages at a time.
    #[derive(Default)]
    struct Loop {
        backlog: VecDeque<Message>,
        wire: VecDeque<Message>,
        room: usize,
        closed: bool,
        pushes: usize,
    }

    impl LinkIo for Loop {
        fn max_message(&self) -> usize {
            64
        }
        fn queue(&mut self, m: Message, _: usize) {
            self.backlog.push_back(m);
        }
        fn is_full(&self) -> bool {
            self.backlog.len() >= 4
        }
        fn poll_push(&mut self, _: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
            self.pushes += 1;
            let n = self.backlog.len().min(self.room);
            self.wire.extend(self.backlog.drain(..n));
            if self.backlog.is_empty() {
                Poll::Ready(Ok(()))
            } else {
                Poll::Pending
            }
        }
        fn poll_receive(
            &mut self,
            _: &mut Context<'_>,
            rx: &mut VecDeque<Message>,
        ) -> Poll<Result<bool, LinkError>> {
            rx.extend(self.wire.drain(..));
            if self.closed {
                Poll::Ready(Ok(false))
            } else if rx.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(Ok(true))
            }
        }
        fn close(&mut self) {
            self.closed = true;
        }
    }

    #[tokio::test]
    async fn messages_go_out_in_batches_and_come_back_in_order() {
        let mut link = BatchedLink::new(
            Loop {
                room: 100,
                ..Loop::default()
            },
            8,
        );
        for i in 0..3 {
            link.feed(msg(i)).await.unwrap();
        }
        assert_eq!(link.pushes, 0, "nothing pushed before the backlog fills");
        link.flush().await.unwrap();
        assert_eq!(link.pushes, 1);
        let mut out = Vec::new();
        assert_eq!(link.recv_batch(&mut out, 2).await.unwrap(), 2);
        assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, 2);
        assert_eq!(out[1].header().seqnum, 1);
    }

    #[tokio::test]
    async fn a_message_over_the_limit_is_refused() {
        let mut link = BatchedLink::new(Loop::default(), 8);
        let big = Message::send(
            Uid::new(Ipv4Addr::LOCALHOST, 1).port(1),
            Uid::new(Ipv4Addr::LOCALHOST, 2).port(2),
            Bytes::from(vec![0; 100]),
        )
        .unwrap();
        assert!(matches!(
            link.feed(big).await,
            Err(LinkError::TooLarge { limit: 64, .. })
        ));
    }

    #[test]
    fn a_full_backlog_waits_for_room() {
        let mut link = BatchedLink::new(Loop::default(), 8);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for i in 0..4 {
            Pin::new(&mut link).start_send(msg(i)).unwrap();
        }
        assert!(Pin::new(&mut link).poll_ready(&mut cx).is_pending());
        link.room = 1;
        assert!(Pin::new(&mut link).poll_ready(&mut cx).is_ready());
    }

    #[tokio::test]
    async fn close_pushes_then_ends_the_stream_after_the_last_message() {
        let mut link = BatchedLink::new(
            Loop {
                room: 100,
                ..Loop::default()
            },
            8,
        );
        link.feed(msg(7)).await.unwrap();
        link.close().await.unwrap();
        assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, 7);
        assert!(link.next().await.is_none());
        assert!(link.next().await.is_none());
    }
}
