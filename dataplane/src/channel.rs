//! The channel link: two bounded lock-free queues between two tasks or
//! threads of one process. Used by tests everywhere and by the in-process
//! stack (`uniplane_stacks::inproc`, named `mem` in configurations).
//!
//! Each direction is a fixed-capacity queue allocated once; sending and
//! receiving take no lock and allocate nothing. Wake-ups are batched: the
//! sender wakes the receiver when it flushes or finds the queue full, and
//! the receiver wakes a waiting sender when it has drained the queue or
//! freed half of it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use crossbeam_queue::ArrayQueue;
use futures_core::Stream;
use futures_sink::Sink;

use crate::link::{Link, LinkError};
use crate::Message;

/// One direction: a bounded queue and the two parties' wakers.
struct Channel {
    queue: ArrayQueue<Message>,
    /// The receiver waits here for messages.
    rx_waker: AtomicWaker,
    /// The sender waits here for room.
    tx_waker: AtomicWaker,
    /// The sending side is gone.
    tx_closed: AtomicBool,
    /// The receiving side is gone.
    rx_closed: AtomicBool,
}

impl Channel {
    fn new(capacity: usize) -> Arc<Self> {
        Arc::new(Channel {
            queue: ArrayQueue::new(capacity.max(1)),
            rx_waker: AtomicWaker::new(),
            tx_waker: AtomicWaker::new(),
            tx_closed: AtomicBool::new(false),
            rx_closed: AtomicBool::new(false),
        })
    }
}

/// One end of a channel link.
pub struct ChannelLink {
    tx: Arc<Channel>,
    rx: Arc<Channel>,
    /// Messages received since the sender was last woken.
    freed: usize,
    /// Messages sent since the receiver was last woken.
    unflushed: usize,
}

/// Two connected channel links, each direction holding at most
/// `capacity` messages.
pub fn pair(capacity: usize) -> (ChannelLink, ChannelLink) {
    let a_to_b = Channel::new(capacity);
    let b_to_a = Channel::new(capacity);
    (
        ChannelLink::new(a_to_b.clone(), b_to_a.clone()),
        ChannelLink::new(b_to_a, a_to_b),
    )
}

impl ChannelLink {
    fn new(tx: Arc<Channel>, rx: Arc<Channel>) -> Self {
        ChannelLink {
            tx,
            rx,
            freed: 0,
            unflushed: 0,
        }
    }

    /// Most messages each direction holds.
    pub fn capacity(&self) -> usize {
        self.tx.queue.capacity()
    }

    /// Messages sent by this end and not yet received by the other.
    pub fn in_flight(&self) -> usize {
        self.tx.queue.len()
    }

    fn wake_sender_if_due(&mut self, drained: bool) {
        if self.freed > 0 && (drained || self.freed >= self.rx.queue.capacity() / 2) {
            self.freed = 0;
            self.rx.tx_waker.wake();
        }
    }

    fn wake_receiver(&mut self) {
        if self.unflushed > 0 {
            self.unflushed = 0;
            self.tx.rx_waker.wake();
        }
    }

    fn poll_pop(&mut self, cx: &mut Context<'_>) -> Poll<Option<Message>> {
        if let Some(m) = self.rx.queue.pop() {
            self.freed += 1;
            self.wake_sender_if_due(false);
            return Poll::Ready(Some(m));
        }
        self.wake_sender_if_due(true);
        self.rx.rx_waker.register(cx.waker());
        // Re-check after registering, so a message pushed in between is seen.
        if let Some(m) = self.rx.queue.pop() {
            self.freed += 1;
            return Poll::Ready(Some(m));
        }
        if self.rx.tx_closed.load(Ordering::Acquire) {
            // The sender closed; a last message may have landed before the flag.
            return Poll::Ready(self.rx.queue.pop());
        }
        Poll::Pending
    }
}

impl Stream for ChannelLink {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_pop(cx).map(|m| m.map(Ok))
    }
}

impl Sink<Message> for ChannelLink {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        if this.tx.rx_closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(LinkError::Closed));
        }
        if !this.tx.queue.is_full() {
            return Poll::Ready(Ok(()));
        }
        // Full: make sure the receiver is draining, then wait for room.
        this.wake_receiver();
        this.tx.rx_waker.wake();
        this.tx.tx_waker.register(cx.waker());
        if !this.tx.queue.is_full() {
            return Poll::Ready(Ok(()));
        }
        if this.tx.rx_closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(LinkError::Closed));
        }
        Poll::Pending
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        let this = self.get_mut();
        if this.tx.rx_closed.load(Ordering::Acquire) {
            return Err(LinkError::Closed);
        }
        // Only this end pushes, so the room poll_ready saw is still there.
        // A caller that skipped poll_ready gets an error, never a silent drop.
        this.tx.queue.push(item).map_err(|_| LinkError::TooLarge {
            size: this.tx.queue.capacity() + 1,
            limit: this.tx.queue.capacity(),
        })?;
        this.unflushed += 1;
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().wake_receiver();
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        this.wake_receiver();
        this.tx.tx_closed.store(true, Ordering::Release);
        this.tx.rx_waker.wake();
        Poll::Ready(Ok(()))
    }
}

impl Link for ChannelLink {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        let mut n = 0;
        while n < max {
            match self.rx.queue.pop() {
                Some(m) => {
                    out.push(m);
                    n += 1;
                }
                None => break,
            }
        }
        self.freed += n;
        if n > 0 {
            self.wake_sender_if_due(self.rx.queue.is_empty());
            return Poll::Ready(Ok(n));
        }
        match self.poll_pop(cx) {
            Poll::Ready(Some(m)) => {
                out.push(m);
                Poll::Ready(Ok(1))
            }
            Poll::Ready(None) => Poll::Ready(Ok(0)),
            Poll::Pending => Poll::Pending,
        }
    }

    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut VecDeque<Message>,
    ) -> Poll<Result<(), LinkError>> {
        loop {
            if self.tx.rx_closed.load(Ordering::Acquire) {
                return Poll::Ready(Err(LinkError::Closed));
            }
            while let Some(m) = batch.pop_front() {
                if let Err(m) = self.tx.queue.push(m) {
                    batch.push_front(m);
                    break;
                }
                self.unflushed += 1;
            }
            if batch.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut *self).poll_ready(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl Drop for ChannelLink {
    fn drop(&mut self) {
        self.tx.tx_closed.store(true, Ordering::Release);
        self.tx.rx_waker.wake();
        self.rx.rx_closed.store(true, Ordering::Release);
        self.rx.tx_waker.wake();
    }
}

impl std::fmt::Debug for ChannelLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelLink")
            .field("capacity", &self.capacity())
            .field("in_flight", &self.in_flight())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, Uid};
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;

    fn msg(i: u32) -> Message {
        let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
        let b: Endpoint = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
        let mut m = Message::send(a, b, Bytes::copy_from_slice(&i.to_be_bytes())).unwrap();
        m.set_seqnum(i);
        m
    }

    #[tokio::test]
    async fn messages_arrive_in_order() {
        let (mut a, mut b) = pair(4);
        for i in 0..3 {
            a.feed(msg(i)).await.unwrap();
        }
        a.flush().await.unwrap();
        for i in 0..3 {
            assert_eq!(b.next().await.unwrap().unwrap().header().seqnum, i);
        }
    }

    #[test]
    fn a_full_link_is_pending_and_keeps_every_message() {
        let (mut a, mut b) = pair(2);
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for i in 0..2 {
            assert!(Pin::new(&mut a).poll_ready(&mut cx).is_ready());
            Pin::new(&mut a).start_send(msg(i)).unwrap();
        }
        assert!(Pin::new(&mut a).poll_ready(&mut cx).is_pending());
        assert_eq!(a.in_flight(), 2);
        let mut out = Vec::new();
        assert!(matches!(
            b.poll_recv_batch(&mut cx, &mut out, 8),
            Poll::Ready(Ok(2))
        ));
        assert!(Pin::new(&mut a).poll_ready(&mut cx).is_ready());
    }

    #[test]
    fn start_send_without_room_is_an_error_not_a_drop() {
        let (mut a, _b) = pair(1);
        Pin::new(&mut a).start_send(msg(0)).unwrap();
        assert!(Pin::new(&mut a).start_send(msg(1)).is_err());
        assert_eq!(a.in_flight(), 1);
    }

    #[tokio::test]
    async fn dropping_one_end_ends_the_others_stream_after_draining() {
        let (mut a, mut b) = pair(4);
        a.send(msg(7)).await.unwrap();
        drop(a);
        assert_eq!(b.next().await.unwrap().unwrap().header().seqnum, 7);
        assert!(b.next().await.is_none());
        assert!(matches!(b.send(msg(1)).await, Err(LinkError::Closed)));
    }

    #[tokio::test]
    async fn a_blocked_sender_is_woken_when_the_receiver_drains() {
        let (mut a, mut b) = pair(8);
        let sender = tokio::spawn(async move {
            let mut batch: VecDeque<Message> = (0..1000).map(msg).collect();
            crate::LinkExt::send_batch(&mut a, &mut batch)
                .await
                .unwrap();
            a
        });
        let mut got = Vec::new();
        let mut out = Vec::new();
        while got.len() < 1000 {
            out.clear();
            let n = crate::LinkExt::recv_batch(&mut b, &mut out, 64)
                .await
                .unwrap();
            assert!(n > 0);
            got.extend(out.drain(..).map(|m| m.header().seqnum));
        }
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
        sender.await.unwrap();
    }
}
