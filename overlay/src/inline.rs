//! The inline fast path: a sender in the engine's process forwards what
//! it sends on its own thread.
//!
//! Through the engine's thread, a local message crosses two cores: the
//! sender's ring to the engine, the engine's ring to the receiver. With an
//! [`InlineLink`] the sender itself runs the engine's pass for its input
//! right after publishing a burst — the same connector (ACL, translator,
//! forwarding table, segmentation), crossbar, schedulers and counters as
//! [`Engine::step`], because it is the same code on the same engine — so
//! the message crosses one core boundary, into the receiver's ring.
//!
//! The engine sits in a cell ([`Inline`]) that whoever forwards takes
//! with a try-lock, never a waiting lock: the engine's thread for its
//! passes (commands, timeouts, every input), a sender for its own input.
//! A sender that finds the engine taken raises `missed` and goes on; the
//! holder looks at `missed` after letting go and runs a whole pass for it.
//! Both sides store, fence and then look at the other's flag (Dekker's
//! order), so one of them always sees the other: nothing published waits
//! for a later message. What a sender's pass cannot finish — a full
//! queue, a receiver's full ring — it hands to the engine's thread by
//! unparking it, which then waits on those rings as always.
//!
//! The engine's thread never waits on an inline input's ring, so a send
//! wakes nobody: the fast path costs no system call. This is the same
//! bargain as Linux's qdisc bypass (the sending CPU runs the queue when
//! nobody else does).
//!
//! Only a single engine has the fast path (a sharded engine's inputs
//! belong to their shards), and only senders in the engine's process (a
//! process attached over shared memory goes through the engine's thread).

use std::pin::Pin;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, TryLockError};
use std::task::{Context, Poll};
use std::thread::Thread;
use std::time::{Duration, Instant};

use futures_core::Stream;
use futures_sink::Sink;
use uniplane_dataplane::ring::{ring_link, RingLink};
use uniplane_dataplane::{Link, LinkError, Message};

use crate::engine::{Engine, EngineHandle, Queues};
use crate::plane::{PlaneError, PortSpec};
use crate::PortId;

/// Passes one sender runs in a row for others that missed the engine
/// before it leaves the rest to the engine's thread: a sender forwards
/// its own traffic, not everybody's for ever.
const MAX_ROUNDS: usize = 4;

/// A spawned single engine, shared by its thread and inline senders.
pub(crate) struct Inline {
    engine: Mutex<Engine>,
    /// A sender published messages while the engine was taken.
    missed: AtomicBool,
    epoch: Instant,
    /// The engine thread's clock, nanoseconds since `epoch`: a sender's
    /// pass stamps reassembly with it (at most one park late, far below
    /// the reassembly timeout) instead of reading the clock per send.
    now: AtomicU64,
    thread: OnceLock<Thread>,
}

impl Inline {
    pub(crate) fn new(engine: Engine) -> Self {
        Inline {
            engine: Mutex::new(engine),
            missed: AtomicBool::new(false),
            epoch: Instant::now(),
            now: AtomicU64::new(0),
            thread: OnceLock::new(),
        }
    }

    pub(crate) fn set_thread(&self, t: Thread) {
        let _ = self.thread.set(t);
    }

    pub(crate) fn epoch(&self) -> Instant {
        self.epoch
    }

    pub(crate) fn set_now(&self, now: Duration) {
        self.now.store(now.as_nanos() as u64, Ordering::Relaxed);
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.now.load(Ordering::Relaxed))
    }

    pub(crate) fn into_engine(self) -> Engine {
        self.engine
            .into_inner()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs `f` on the engine when nobody holds it (`None` when somebody
    /// does); `whole`: `f` reads every input, so it serves whoever missed
    /// the engine before. After letting go it takes `missed` into account:
    /// a whole pass for whoever published meanwhile, so no message waits.
    pub(crate) fn pass<R>(&self, whole: bool, f: impl FnOnce(&mut Engine) -> R) -> Option<R> {
        let r = {
            let mut e = self.try_take()?;
            if whole {
                self.missed.store(false, Ordering::SeqCst);
            }
            f(&mut e)
        };
        self.after_release();
        Some(r)
    }

    fn try_take(&self) -> Option<std::sync::MutexGuard<'_, Engine>> {
        match self.engine.try_lock() {
            Ok(e) => Some(e),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// Whole passes while senders keep missing the engine, then the
    /// engine's thread takes over.
    fn after_release(&self) {
        for _ in 0..MAX_ROUNDS {
            fence(Ordering::SeqCst);
            if !self.missed.load(Ordering::SeqCst) {
                return;
            }
            let Some(mut e) = self.try_take() else {
                // Its holder will look at `missed` after letting go.
                return;
            };
            self.missed.store(false, Ordering::SeqCst);
            let now = self.now();
            let (_, left) = e.step_data(now);
            drop(e);
            if left {
                self.wake_engine();
            }
        }
        self.wake_engine();
    }

    /// A sender's pass for input `pi` after it published a burst.
    fn forward(&self, pi: PortId) {
        let (mut e, whole) = match self.try_take() {
            Some(e) => (e, false),
            None => {
                self.missed.store(true, Ordering::SeqCst);
                fence(Ordering::SeqCst);
                // The holder may have let go before our flag: then it is
                // ours to do (a whole pass, as the flag asks).
                let Some(e) = self.try_take() else {
                    return;
                };
                let whole = self.missed.swap(false, Ordering::SeqCst);
                (e, whole)
            }
        };
        let now = self.now();
        let left = if whole {
            e.step_data(now).1
        } else {
            // A burst a pass: a sender that published more takes a few.
            let mut left = true;
            for _ in 0..MAX_ROUNDS {
                let (moved, l) = e.step_from(pi, now);
                left = l;
                if !left || moved == 0 {
                    break;
                }
            }
            left
        };
        drop(e);
        if left {
            self.wake_engine();
        }
        self.after_release();
    }

    fn wake_engine(&self) {
        if let Some(t) = self.thread.get() {
            t.unpark();
        }
    }
}

/// An application's link to a spawned engine whose sends are forwarded on
/// the sender's own thread (see the [module documentation](self)).
/// Receiving is the plain ring's.
pub struct InlineLink {
    link: RingLink,
    port: PortId,
    cell: Arc<Inline>,
}

impl InlineLink {
    /// The engine port this link is attached to.
    pub fn port(&self) -> PortId {
        self.port
    }

    /// Publishes what was sent and forwards it.
    fn publish(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let r = Pin::new(&mut self.link).poll_flush(cx);
        self.cell.forward(self.port);
        r
    }
}

impl EngineHandle {
    /// Attaches an application port whose sends are forwarded on the
    /// sending thread ([`crate::inline`]). Only a single spawned engine
    /// has the fast path; a sharded one answers `Unsupported`. Blocks
    /// while the engine's thread finishes a pass: call it where
    /// [`ForwardingPlane::attach`](crate::ForwardingPlane::attach) may be
    /// called, never on an async runtime's thread.
    pub fn attach_inline(&self, spec: PortSpec) -> Result<(PortId, InlineLink), PlaneError> {
        let cell = self.inline.as_ref().ok_or(PlaneError::Unsupported {
            plane: "sharded engine",
            what: "forward inline",
        })?;
        let mut engine = loop {
            if let Some(e) = cell.try_take() {
                break e;
            }
            std::thread::yield_now();
        };
        let (link, port) = ring_link(engine.config().ring_depth);
        let id = engine.attach_queues(spec, Queues::Ring(port))?;
        engine.port_mut(id)?.inline = true;
        drop(engine);
        Ok((
            id,
            InlineLink {
                link,
                port: id,
                cell: cell.clone(),
            },
        ))
    }
}

impl Stream for InlineLink {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Pin::new(&mut self.get_mut().link).poll_next(cx)
    }
}

impl Sink<Message> for InlineLink {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        match Pin::new(&mut this.link).poll_ready(cx) {
            // Full: what it holds may be ours to forward.
            Poll::Pending => {
                let _ = this.publish(cx);
                Pin::new(&mut this.link).poll_ready(cx)
            }
            ready => ready,
        }
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        Pin::new(&mut self.get_mut().link).start_send(item)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().publish(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().publish(cx)
    }
}

impl Link for InlineLink {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        self.link.poll_recv_batch(cx, out, max)
    }

    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut std::collections::VecDeque<Message>,
    ) -> Poll<Result<(), LinkError>> {
        match self.link.poll_send_batch(cx, batch) {
            Poll::Pending => {
                let _ = self.publish(cx);
                self.link.poll_send_batch(cx, batch)
            }
            ready => ready,
        }
    }
}
