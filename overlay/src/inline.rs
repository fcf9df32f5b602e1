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
//! One word holds the lock and a `missed` bit: a sender that finds the
//! engine taken sets the bit and goes on; the holder, letting go, finds
//! the bit in the same word (its compare-and-swap fails) and runs a whole
//! pass for it. Both change that word with read-modify-writes, which the
//! word's order puts one after the other, so one of them always sees the
//! other: nothing published waits for a later message, with no fence and
//! no second flag to look at. What a sender's pass cannot finish — a full
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

use std::cell::UnsafeCell;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
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

/// The state word: somebody holds the engine.
const HELD: u8 = 1;
/// The state word: a sender published messages while the engine was
/// held; set only while `HELD` is.
const MISSED: u8 = 2;

/// A spawned single engine, shared by its thread and inline senders.
pub(crate) struct Inline {
    /// `HELD` and `MISSED` bits.
    state: AtomicU8,
    engine: UnsafeCell<Engine>,
    epoch: Instant,
    /// The engine thread's clock, nanoseconds since `epoch`: a sender's
    /// pass stamps reassembly with it (at most one park late, far below
    /// the reassembly timeout) instead of reading the clock per send.
    now: AtomicU64,
    thread: OnceLock<Thread>,
}

// SAFETY: the engine is reached only through a `Held`, of which the
// `HELD` bit allows one at a time (taken with Acquire, let go with
// Release), so the engine moves between threads as it would in a mutex;
// it is `Send`.
unsafe impl Sync for Inline {}

/// The engine, held: let go by [`Held::release`] (or, unwinding, by its
/// drop).
pub(crate) struct Held<'a>(&'a Inline);

impl Deref for Held<'_> {
    type Target = Engine;
    fn deref(&self) -> &Engine {
        // SAFETY: the HELD bit is ours (see `Inline`).
        unsafe { &*self.0.engine.get() }
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        // SAFETY: the HELD bit is ours (see `Inline`).
        unsafe { &mut *self.0.engine.get() }
    }
}

impl Held<'_> {
    /// Lets go of the engine. A sender that missed it meanwhile left the
    /// `MISSED` bit, so letting go fails: a whole pass for it, as it may
    /// have published after the pass read its input, then again; after a
    /// few rounds the engine's thread takes over.
    fn release(mut self) {
        let cell = self.0;
        for _ in 0..MAX_ROUNDS {
            if cell
                .state
                .compare_exchange(HELD, 0, Ordering::Release, Ordering::Relaxed)
                .is_ok()
            {
                std::mem::forget(self);
                return;
            }
            // Still ours; Acquire: the messages that sender published.
            cell.state.swap(HELD, Ordering::Acquire);
            let now = cell.now();
            let (_, left) = self.step_data(now);
            if left {
                cell.wake_engine();
            }
        }
        // Dropping lets go, and hands what was missed since to the
        // engine's thread.
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.0.state.swap(0, Ordering::AcqRel) & MISSED != 0 {
            self.0.wake_engine();
        }
    }
}

impl Inline {
    pub(crate) fn new(engine: Engine) -> Self {
        Inline {
            state: AtomicU8::new(0),
            engine: UnsafeCell::new(engine),
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
        self.engine.into_inner()
    }

    /// Runs `f` on the engine when nobody holds it (`None` when somebody
    /// does). Letting go, it runs a whole pass for whoever published
    /// meanwhile, so no message waits.
    pub(crate) fn pass<R>(&self, f: impl FnOnce(&mut Engine) -> R) -> Option<R> {
        let mut e = self.try_take()?;
        let r = f(&mut e);
        e.release();
        Some(r)
    }

    fn try_take(&self) -> Option<Held<'_>> {
        self.state
            .compare_exchange(0, HELD, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Held(self))
    }

    /// A sender's pass for input `pi` after it published a burst.
    fn forward(&self, pi: PortId) {
        let mut state = 0;
        let mut e = loop {
            let next = if state & HELD == 0 {
                HELD
            } else {
                // Taken: the holder finds the bit as it lets go. Setting
                // it again when it is set still writes the word, after
                // our messages (Release), for the holder to read.
                state | MISSED
            };
            match self
                .state
                .compare_exchange_weak(state, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) if next == HELD => break Held(self),
                Ok(_) => return,
                Err(now) => state = now,
            }
        };
        let now = self.now();
        // A burst a pass: a sender that published more takes a few.
        let mut left = true;
        for _ in 0..MAX_ROUNDS {
            let (moved, l) = e.step_from(pi, now);
            left = l;
            if !left || moved == 0 {
                break;
            }
        }
        if left {
            self.wake_engine();
        }
        e.release();
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
        let attached = engine
            .attach_queues(spec, Queues::Ring(port))
            .and_then(|id| {
                engine.port_mut(id)?.inline = true;
                Ok(id)
            });
        engine.release();
        let id = attached?;
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
