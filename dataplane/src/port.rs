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

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;

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

/// Creates a port whose queues arrive after it is attached: the engine
/// gets the [`DeferredPort`] at once (so the port has its number, routes
/// and access rules before the far side shows up) and whoever sets up the
/// far side later hands the real queues over with [`PortHandoff::install`].
///
/// Until then the port reads nothing and takes nothing (its messages wait
/// in the engine's queues: backpressure, no loss); a handoff dropped
/// without installing closes the port.
pub fn deferred_port() -> (DeferredPort, PortHandoff) {
    let shared = Arc::new(Handoff {
        ready: AtomicBool::new(false),
        abandoned: AtomicBool::new(false),
        slot: Mutex::new(None),
        waker: AtomicWaker::new(),
    });
    (
        DeferredPort {
            inner: None,
            shared: shared.clone(),
        },
        PortHandoff {
            shared: Some(shared),
        },
    )
}

struct Handoff {
    /// The queues are in the slot.
    ready: AtomicBool,
    /// The handoff was dropped without installing queues.
    abandoned: AtomicBool,
    slot: Mutex<Option<Box<dyn PortIo>>>,
    /// The engine's waker, registered while it waits on the port.
    waker: AtomicWaker,
}

/// The engine's side of [`deferred_port`]: a [`PortIo`] that delegates to
/// the installed queues, and is empty and full until they arrive.
pub struct DeferredPort {
    inner: Option<Box<dyn PortIo>>,
    shared: Arc<Handoff>,
}

impl std::fmt::Debug for DeferredPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredPort")
            .field("installed", &self.inner.is_some())
            .finish_non_exhaustive()
    }
}

/// The setup side of [`deferred_port`]: hands the real queues over once.
pub struct PortHandoff {
    shared: Option<Arc<Handoff>>,
}

impl std::fmt::Debug for PortHandoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PortHandoff").finish_non_exhaustive()
    }
}

impl PortHandoff {
    /// Gives the port its queues and wakes the engine if it waits.
    pub fn install(mut self, io: Box<dyn PortIo>) {
        if let Some(shared) = self.shared.take() {
            *shared.slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(io);
            shared.ready.store(true, Ordering::Release);
            shared.waker.wake();
        }
    }
}

impl Drop for PortHandoff {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            shared.abandoned.store(true, Ordering::Release);
            shared.waker.wake();
        }
    }
}

impl DeferredPort {
    /// The installed queues, taking them from the handoff on first sight.
    #[inline]
    fn io(&mut self) -> Option<&mut (dyn PortIo + 'static)> {
        if self.inner.is_none() && self.shared.ready.load(Ordering::Acquire) {
            self.inner = self
                .shared
                .slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
        }
        self.inner.as_deref_mut()
    }

    fn abandoned(&self) -> bool {
        self.shared.abandoned.load(Ordering::Acquire)
    }
}

impl PortIo for DeferredPort {
    fn peek(&mut self) -> Option<&Message> {
        self.io()?.peek()
    }

    fn pop(&mut self) -> Option<Message> {
        self.io()?.pop()
    }

    fn available(&mut self) -> usize {
        self.io().map_or(0, |q| q.available())
    }

    fn release(&mut self) {
        if let Some(q) = self.io() {
            q.release();
        }
    }

    fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if self.io().is_none() {
            self.shared.waker.register(cx.waker());
            if self.io().is_none() {
                return if self.abandoned() {
                    Poll::Ready(false)
                } else {
                    Poll::Pending
                };
            }
        }
        match self.io() {
            Some(q) => q.poll_available(cx),
            None => Poll::Ready(false),
        }
    }

    /// 0 while waiting for the queues; once the handoff is abandoned the
    /// port takes (and drops) everything, so nothing waits for it.
    fn free(&mut self) -> usize {
        if let Some(q) = self.io() {
            return q.free();
        }
        usize::from(self.abandoned())
    }

    fn push(&mut self, m: Message) -> Result<(), Message> {
        if let Some(q) = self.io() {
            return q.push(m);
        }
        if self.abandoned() {
            Ok(())
        } else {
            Err(m)
        }
    }

    fn flush(&mut self) {
        if let Some(q) = self.io() {
            q.flush();
        }
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        if self.io().is_none() {
            self.shared.waker.register(cx.waker());
            if self.io().is_none() {
                return if self.abandoned() {
                    Poll::Ready(Err(PortClosed))
                } else {
                    Poll::Pending
                };
            }
        }
        match self.io() {
            Some(q) => q.poll_ready(cx),
            None => Poll::Ready(Err(PortClosed)),
        }
    }

    fn is_closed(&mut self) -> bool {
        match self.io() {
            Some(q) => q.is_closed(),
            None => self.abandoned(),
        }
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

    /// Counts wake-ups.
    #[derive(Default)]
    struct Counter(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[tokio::test]
    async fn a_deferred_port_holds_back_until_its_queues_arrive_then_delegates() {
        let (mut port, handoff) = deferred_port();
        let counter = Arc::new(Counter::default());
        let waker = std::task::Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(port.free(), 0, "nothing is taken before the queues arrive");
        assert_eq!(port.push(msg(1)).unwrap_err().header().seqnum, 1);
        assert!(port.poll_ready(&mut cx).is_pending());
        assert!(port.poll_available(&mut cx).is_pending());
        assert!(!port.is_closed());

        let (mut link, rings) = ring_link(4);
        handoff.install(Box::new(rings));
        assert!(
            counter.0.load(Ordering::SeqCst) > 0,
            "the waiting engine is woken"
        );
        assert!(port.free() > 0);
        port.push(msg(2)).unwrap();
        port.flush();
        let mut got = Vec::new();
        assert_eq!(link.recv_batch(&mut got, 4).await.unwrap(), 1);
        assert_eq!(got[0].header().seqnum, 2);
        link.send(msg(3)).await.unwrap();
        assert_eq!(port.pop().map(|m| m.header().seqnum), Some(3));
    }

    #[test]
    fn a_deferred_port_whose_handoff_is_dropped_is_closed_and_holds_nothing() {
        let (mut port, handoff) = deferred_port();
        drop(handoff);
        assert!(port.is_closed());
        assert!(port.free() > 0);
        assert!(
            port.push(msg(1)).is_ok(),
            "taken and dropped: nobody will read it"
        );
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        assert_eq!(port.poll_available(&mut cx), Poll::Ready(false));
    }
}
