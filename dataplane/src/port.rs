//! [`PortIo`]: the engine's view of one port's two queues, whatever is on
//! the other side.
//!
//! ```text
//!            input: peek / pop / release        ┌─────────────────────┐
//!  engine ◄──────────────────────────────────── │ a ring pair         │
//!         ────────────────────────────────────► │ a shared-memory     │
//!            output: free / push / flush        │ link, a device run  │
//!                                               │ inline, …           │
//!                                               └─────────────────────┘
//! ```
//!
//! The engine reads a port's input in bursts (`peek` the head to decide its
//! fate, `pop` it once its queue has room, `release` once per burst) and
//! fills its output the same way (`free`, `push`, `flush` once per burst).
//! A parked engine registers its waker with `poll_available` on every input
//! and `poll_ready` on every output it has messages for; whatever the far
//! side does next must wake that waker.
//!
//! The ring pair of [`RingPort`] implements it with no cost over calling
//! the rings directly; other implementations (the shared-memory port of
//! `uniplane-shm`, devices run inside the engine thread) let the engine
//! talk to the far side with no relay in between.

use std::task::{Context, Poll};

use crate::ring::RingPort;
use crate::Message;

/// The far side of a port went away: nothing more will arrive than what
/// is already readable, and what is pushed is not read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the far side of the port is gone")]
pub struct PortClosed;

/// The engine-side view of a port's input and output queues.
///
/// Input methods read what the far side sent; output methods write what
/// the far side receives. Nothing here blocks, allocates per message or
/// must make a system call per message.
pub trait PortIo: Send {
    /// The next input message, without taking it.
    fn peek(&mut self) -> Option<&Message>;
    /// Takes the next input message. Its space may go back to the far side
    /// only at [`PortIo::release`].
    fn pop(&mut self) -> Option<Message>;
    /// Input messages readable now.
    fn available(&mut self) -> usize;
    /// Returns the space of every message taken so far to the far side
    /// (and wakes it if it waits for room).
    fn release(&mut self);
    /// `Ready(true)` when an input message is readable, `Ready(false)` when
    /// the far side is gone and nothing is left, else registers `cx`'s
    /// waker, to be woken when the far side publishes, and returns
    /// `Pending`.
    fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool>;

    /// How many more [`PortIo::push`] calls will succeed now; 0 when the
    /// output is full (or the far side is gone). A port may count a message
    /// it holds back until room appears (never more than one).
    fn free(&mut self) -> usize;
    /// Writes `m` to the output, or gives it back when the output is full.
    /// Not visible to the far side until [`PortIo::flush`].
    fn push(&mut self, m: Message) -> Result<(), Message>;
    /// Publishes everything pushed so far and wakes the far side if it
    /// waits (once per call, whatever the batch).
    fn flush(&mut self);
    /// `Ready(Ok(()))` when [`PortIo::free`] is above 0; otherwise publishes
    /// what is pending, registers `cx`'s waker, to be woken when the far
    /// side makes room, and returns `Pending`. `Ready(Err(PortClosed))`
    /// when the far side is gone.
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>>;

    /// Whether the far side is gone (its process died or it closed): the
    /// port should be detached once what it sent is read.
    fn is_closed(&mut self) -> bool;
}

impl PortIo for RingPort {
    #[inline]
    fn peek(&mut self) -> Option<&Message> {
        self.input.peek()
    }

    #[inline]
    fn pop(&mut self) -> Option<Message> {
        self.input.pop()
    }

    #[inline]
    fn available(&mut self) -> usize {
        self.input.available()
    }

    #[inline]
    fn release(&mut self) {
        self.input.release()
    }

    fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        self.input.poll_available(cx)
    }

    #[inline]
    fn free(&mut self) -> usize {
        self.output.free()
    }

    #[inline]
    fn push(&mut self, m: Message) -> Result<(), Message> {
        self.output.push(m)
    }

    #[inline]
    fn flush(&mut self) {
        self.output.flush()
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        self.output
            .poll_ready(cx)
            .map(|r| r.map_err(|()| PortClosed))
    }

    fn is_closed(&mut self) -> bool {
        self.input.is_closed() || self.output.is_closed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::ring_link;
    use crate::{LinkExt, Uid};
    use bytes::Bytes;
    use futures_util::SinkExt;

    fn msg(i: u32) -> Message {
        let u = Uid::new(std::net::Ipv4Addr::LOCALHOST, 1);
        let mut m = Message::send(u.port(1), u.port(2), Bytes::new()).unwrap();
        m.set_seqnum(i);
        m
    }

    #[tokio::test]
    async fn a_ring_port_as_port_io_reads_what_the_link_sent_and_writes_what_it_receives() {
        let (mut link, port) = ring_link(4);
        let mut io: Box<dyn PortIo> = Box::new(port);
        link.send(msg(1)).await.unwrap();
        assert_eq!(io.available(), 1);
        assert_eq!(io.peek().map(|m| m.header().seqnum), Some(1));
        let m = io.pop().unwrap();
        io.release();
        assert!(io.free() > 0);
        io.push(m).unwrap();
        io.flush();
        let mut got = Vec::new();
        assert_eq!(link.recv_batch(&mut got, 4).await.unwrap(), 1);
        assert_eq!(got[0].header().seqnum, 1);
        assert!(!io.is_closed());
        drop(link);
        assert!(io.is_closed(), "the far side's drop is reported");
    }

    #[test]
    fn a_full_ring_port_is_pending_until_the_far_side_reads() {
        let (_link, port) = ring_link(2);
        let mut io: Box<dyn PortIo> = Box::new(port);
        while io.free() > 0 {
            io.push(msg(0)).unwrap();
        }
        assert!(
            io.push(msg(0)).is_err(),
            "nothing is dropped: it comes back"
        );
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(io.poll_ready(&mut cx).is_pending());
        assert!(io.poll_available(&mut cx).is_pending());
    }
}
