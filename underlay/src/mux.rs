//! One interface's output: filter → per-stack queues → scheduler → shaper.

use uniplane_dataplane::sched::{Policy, PolicyError, Scheduler};
use uniplane_dataplane::Message;

use crate::filter::{Filter, FilterCounters, FilterRules, Violation, ViolationEvent};
use crate::queue::{MessageQueue, Queues};
use crate::shaper::{ShaperConfig, ShaperError, TokenBucket};
use crate::Nanos;

/// How to build an [`InterfaceMux`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MuxConfig {
    /// Input queues, one per stack (or per traffic class of a stack).
    pub queues: usize,
    /// Messages each queue holds; the slots are allocated up front.
    pub queue_capacity: usize,
    /// Bytes (header and payload) each queue holds; an empty queue takes a
    /// message of any size.
    pub queue_max_bytes: u64,
    /// How the queues share the interface.
    pub policy: Policy,
    /// What may be sent.
    pub rules: FilterRules,
    /// Violation events kept until the control plane drains them.
    pub event_capacity: usize,
    /// The output's shape, or `None` to send as fast as the interface
    /// takes messages.
    pub shaper: Option<ShaperConfig>,
}

impl MuxConfig {
    /// `queues` queues of `queue_capacity` messages, round-robin, every
    /// message allowed, 1024 events, no shaping.
    pub fn new(queues: usize, queue_capacity: usize) -> MuxConfig {
        MuxConfig {
            queues,
            queue_capacity,
            queue_max_bytes: u64::MAX,
            policy: Policy::RoundRobin,
            rules: FilterRules::allow_all(),
            event_capacity: 1024,
            shaper: None,
        }
    }
}

/// Why an [`InterfaceMux`] cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MuxError {
    /// An interface needs at least one queue.
    #[error("an interface multiplexer needs at least one queue")]
    NoQueues,
    /// A queue of zero messages would refuse everything.
    #[error("queue capacity of zero messages")]
    ZeroCapacity,
    /// The scheduling policy does not fit the queues.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The shaper's configuration is unusable.
    #[error(transparent)]
    Shaper(#[from] ShaperError),
}

/// Why [`InterfaceMux::offer`] did not take a message.
#[derive(Debug, thiserror::Error)]
pub enum OfferError {
    /// The queue is full: the message comes back untouched. Offer it again
    /// after the interface has dequeued (backpressure, never a drop).
    #[error("queue full")]
    Full(Message),
    /// The filter refused the message and dropped it; it was counted and
    /// reported as a [`ViolationEvent`].
    #[error("dropped by the filter: {0}")]
    Denied(Violation),
    /// There is no such queue; the message comes back.
    #[error("no input queue {queue}")]
    NoSuchQueue {
        /// The queue asked for.
        queue: usize,
        /// The message.
        msg: Message,
    },
}

impl OfferError {
    /// The message given back, if it was (not when the filter dropped it).
    pub fn into_message(self) -> Option<Message> {
        match self {
            OfferError::Full(msg) | OfferError::NoSuchQueue { msg, .. } => Some(msg),
            OfferError::Denied(_) => None,
        }
    }
}

/// What one input queue has seen. Bytes are encoded lengths (header and
/// payload).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueCounters {
    /// Messages accepted.
    pub enqueued: u64,
    /// Bytes accepted.
    pub enqueued_bytes: u64,
    /// Messages sent to the interface.
    pub dequeued: u64,
    /// Bytes sent to the interface.
    pub dequeued_bytes: u64,
    /// Offers given back because the queue was full.
    pub backpressured: u64,
    /// Offers the filter refused.
    pub denied: u64,
}

/// What left through the interface.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireCounters {
    /// Messages sent.
    pub messages: u64,
    /// Bytes sent (header and payload).
    pub bytes: u64,
    /// Bytes the shaper charged (with its per-frame overhead).
    pub shaped_bytes: u64,
    /// Nanoseconds a ready message waited for the shaper's credit.
    pub throttled_ns: u64,
}

/// One interface's output multiplexer.
///
/// Stacks [`offer`](Self::offer) messages into their queue; the filter
/// drops what the rules forbid; the scheduler picks the queue to serve and
/// the shaper says when. The driver calls [`dequeue`](Self::dequeue)
/// while the interface takes messages and sleeps until
/// [`next_ready`](Self::next_ready) otherwise.
///
/// Once the scheduler has picked a queue whose head must wait for the
/// shaper, that message goes next: the choice is not revisited, as in a
/// hardware arbiter that has granted, so a strict-priority message
/// arriving meanwhile waits at most that one message.
#[derive(Debug, Clone)]
pub struct InterfaceMux {
    filter: Filter,
    queues: Queues,
    scheduler: Scheduler,
    shaper: Option<TokenBucket>,
    /// The queue picked whose head waits for the shaper.
    picked: Option<usize>,
    /// Messages in all queues.
    backlog: usize,
    counters: Vec<QueueCounters>,
    wire: WireCounters,
}

impl InterfaceMux {
    /// A multiplexer built from `config`, at virtual time zero.
    pub fn new(config: MuxConfig) -> Result<InterfaceMux, MuxError> {
        InterfaceMux::new_at(config, 0)
    }

    /// A multiplexer built from `config` at time `now` (when the shaper's
    /// bucket starts full).
    pub fn new_at(config: MuxConfig, now: Nanos) -> Result<InterfaceMux, MuxError> {
        if config.queues == 0 {
            return Err(MuxError::NoQueues);
        }
        if config.queue_capacity == 0 {
            return Err(MuxError::ZeroCapacity);
        }
        let scheduler = Scheduler::with_policy(config.queues, config.policy)?;
        let shaper = match config.shaper {
            Some(shape) => Some(TokenBucket::new(shape, now)?),
            None => None,
        };
        let queues = (0..config.queues)
            .map(|_| MessageQueue::new(config.queue_capacity, config.queue_max_bytes))
            .collect();
        Ok(InterfaceMux {
            filter: Filter::new(config.rules, config.event_capacity),
            queues: Queues(queues),
            scheduler,
            shaper,
            picked: None,
            backlog: 0,
            counters: vec![QueueCounters::default(); config.queues],
            wire: WireCounters::default(),
        })
    }

    /// Offers `msg` from `queue`'s stack at time `now`.
    ///
    /// A full queue gives the message back ([`OfferError::Full`]) before
    /// the filter sees it, so a message is filtered (and counted) once,
    /// when it is taken or dropped.
    #[inline]
    pub fn offer(&mut self, queue: usize, msg: Message, now: Nanos) -> Result<(), OfferError> {
        let (Some(q), Some(counters)) =
            (self.queues.0.get_mut(queue), self.counters.get_mut(queue))
        else {
            return Err(OfferError::NoSuchQueue { queue, msg });
        };
        let len = msg.encoded_len() as u64;
        if !q.has_room(len) {
            counters.backpressured += 1;
            return Err(OfferError::Full(msg));
        }
        if let Err(violation) = self.filter.check(queue, &msg, now) {
            counters.denied += 1;
            return Err(OfferError::Denied(violation));
        }
        if let Err(msg) = q.push(msg) {
            // has_room said yes; kept for safety, never taken.
            counters.backpressured += 1;
            return Err(OfferError::Full(msg));
        }
        counters.enqueued += 1;
        counters.enqueued_bytes += len;
        self.backlog += 1;
        Ok(())
    }

    /// The queue to serve next: the one already picked, or the scheduler's
    /// choice (which is then remembered).
    #[inline]
    fn pick(&mut self) -> Option<(usize, usize)> {
        let q = match self.picked {
            Some(q) => q,
            None => self.scheduler.pick(&self.queues)?,
        };
        match self.queues.0.get(q).and_then(MessageQueue::head_len) {
            Some(len) => {
                self.picked = Some(q);
                Some((q, len as usize))
            }
            None => {
                // Cannot happen (only dequeue pops); never stay stuck on it.
                self.picked = None;
                None
            }
        }
    }

    /// The next message for the interface at time `now`, or `None` when
    /// every queue is empty or the shaper wants the interface to wait
    /// (see [`next_ready`](Self::next_ready)).
    #[inline]
    pub fn dequeue(&mut self, now: Nanos) -> Option<Message> {
        self.dequeue_tagged(now).map(|(_, msg)| msg)
    }

    /// [`dequeue`](Self::dequeue), with the queue the message came from:
    /// for drivers whose queues lead to different links.
    #[inline]
    pub fn dequeue_tagged(&mut self, now: Nanos) -> Option<(usize, Message)> {
        let (q, len) = self.pick()?;
        if let Some(shaper) = &mut self.shaper {
            shaper.try_send(len, now).ok()?;
        }
        self.picked = None;
        let msg = self.queues.0.get_mut(q)?.pop()?;
        self.backlog -= 1;
        let bytes = len as u64;
        if let Some(c) = self.counters.get_mut(q) {
            c.dequeued += 1;
            c.dequeued_bytes += bytes;
        }
        self.wire.messages += 1;
        self.wire.bytes += bytes;
        Some((q, msg))
    }

    /// Takes every message waiting in `queue` (whose link failed, say),
    /// oldest first, past the scheduler and the shaper; returns how many.
    pub fn drain_queue(&mut self, queue: usize, out: &mut impl Extend<Message>) -> usize {
        let Some(q) = self.queues.0.get_mut(queue) else {
            return 0;
        };
        let mut n = 0;
        while let Some(msg) = q.pop() {
            out.extend(Some(msg));
            n += 1;
        }
        self.backlog -= n;
        if self.picked == Some(queue) {
            self.picked = None;
        }
        n
    }

    /// Dequeues up to `max` messages at time `now` into `out`; returns how
    /// many. Stops early when the queues are empty or the shaper says wait.
    pub fn dequeue_burst(
        &mut self,
        now: Nanos,
        out: &mut impl Extend<Message>,
        max: usize,
    ) -> usize {
        let mut n = 0;
        while n < max {
            match self.dequeue(now) {
                Some(msg) => {
                    out.extend(Some(msg));
                    n += 1;
                }
                None => break,
            }
        }
        n
    }

    /// When to call [`dequeue`](Self::dequeue) next: `Some(now)` when a
    /// message may go now, `Some(t)` with `t > now` when the shaper holds
    /// the next one until `t`, `None` when every queue is empty (wait for
    /// an offer). May commit the scheduler to the next queue.
    #[inline]
    pub fn next_ready(&mut self, now: Nanos) -> Option<Nanos> {
        if self.backlog == 0 {
            return None;
        }
        if self.shaper.is_none() {
            return Some(now);
        }
        let (_, len) = self.pick()?;
        self.shaper.as_mut().map(|s| s.ready_at(len, now))
    }

    /// Switches the scheduling policy. Queued messages stay where they are,
    /// so nothing is lost or reordered; a queue already picked is served
    /// first.
    pub fn set_policy(&mut self, policy: Policy) -> Result<(), PolicyError> {
        self.scheduler.set_policy(policy)
    }

    /// The scheduling policy in force.
    pub fn policy(&self) -> &Policy {
        self.scheduler.policy()
    }

    /// Replaces the filter rules; queued messages were checked when they
    /// were offered and stay queued.
    pub fn set_rules(&mut self, rules: FilterRules) {
        self.filter.set_rules(rules);
    }

    /// The filter rules in force.
    pub fn rules(&self) -> &FilterRules {
        self.filter.rules()
    }

    /// Changes the shaper at time `now`: a new shape keeps the credit saved
    /// so far (up to the new burst), `None` turns shaping off, and turning
    /// it on starts with a full bucket.
    pub fn set_shaper(
        &mut self,
        shape: Option<ShaperConfig>,
        now: Nanos,
    ) -> Result<(), ShaperError> {
        match (shape, &mut self.shaper) {
            (Some(shape), Some(bucket)) => bucket.set_config(shape, now),
            (Some(shape), None) => {
                self.shaper = Some(TokenBucket::new(shape, now)?);
                Ok(())
            }
            (None, _) => {
                if let Some(bucket) = self.shaper.take() {
                    self.wire.shaped_bytes += bucket.bytes();
                    self.wire.throttled_ns += bucket.throttled_ns();
                }
                Ok(())
            }
        }
    }

    /// The shape in force, if any.
    pub fn shaper(&self) -> Option<ShaperConfig> {
        self.shaper.as_ref().map(TokenBucket::config)
    }

    /// Number of input queues.
    pub fn queues(&self) -> usize {
        self.queues.0.len()
    }

    /// Messages waiting in `queue` (0 for a queue that does not exist).
    pub fn queue_len(&self, queue: usize) -> usize {
        self.queues.0.get(queue).map_or(0, MessageQueue::len)
    }

    /// Bytes waiting in `queue` (0 for a queue that does not exist).
    pub fn queue_bytes(&self, queue: usize) -> u64 {
        self.queues.0.get(queue).map_or(0, MessageQueue::bytes)
    }

    /// Free message slots in `queue` (0 for a queue that does not exist):
    /// a stack's driver offers while this is non-zero.
    pub fn free(&self, queue: usize) -> usize {
        self.queues.0.get(queue).map_or(0, MessageQueue::free)
    }

    /// Messages waiting in all queues.
    pub fn backlog(&self) -> usize {
        self.backlog
    }

    /// Counters of every input queue.
    pub fn queue_counters(&self) -> &[QueueCounters] {
        &self.counters
    }

    /// Counters of the interface side.
    pub fn wire_counters(&self) -> WireCounters {
        let mut wire = self.wire;
        if let Some(bucket) = &self.shaper {
            wire.shaped_bytes += bucket.bytes();
            wire.throttled_ns += bucket.throttled_ns();
        }
        wire
    }

    /// Counters of the filter, violations by reason and lost events.
    pub fn filter_counters(&self) -> &FilterCounters {
        self.filter.counters()
    }

    /// The oldest undrained violation event.
    pub fn pop_event(&mut self) -> Option<ViolationEvent> {
        self.filter.pop_event()
    }

    /// Takes every undrained violation event, oldest first.
    pub fn drain_events(&mut self) -> impl Iterator<Item = ViolationEvent> + '_ {
        self.filter.drain_events()
    }
}
