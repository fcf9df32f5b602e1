//! The run-to-completion engine: bursts in, look up, queue, schedule,
//! bursts out.
//!
//! ```text
//!  port 0 input ring ─┐                                   ┌─► port 0 output ring
//!  port 1 input ring ─┼─► connector: ACL, translator,     │
//!        …            │   forwarding table, segmentation  ├─► port 1 output ring
//!  port N input ring ─┘          │                        │        …
//!                                ▼                        │
//!                   crossbar: VOQ per (input, output) ──► per-output scheduler
//!                                                          (RR / DRR / strict)
//!                                                          + reassembly for apps
//! ```
//!
//! Each [`Engine::step`] reads up to a burst from every input, decides
//! each message's fate at its connector (forward, answer with an error,
//! or count and drop), queues it, then fills every output ring from its
//! queues as its scheduler picks and publishes each ring once. No lock,
//! no allocation and no system call per message: rings and queues are
//! preallocated and payloads move by reference.
//!
//! Lossless: a message leaves its input ring only when its queue has room
//! for it (all of its segments); otherwise that input waits, and the ring
//! filling up reaches the sender as `poll_ready` returning `Pending`.
//!
//! The engine runs stepped by a test on a virtual clock (deterministic), or
//! on its own thread with [`Engine::spawn`], busy-polling or spinning then
//! parking so an idle engine costs no CPU. A [`EngineHandle`] programs a
//! running engine through a command ring.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use uniplane_dataplane::ring::{ring_link, RingLink, RingPort};
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{Message, PortClosed, PortIo, Uid};

use crate::acl::{AccessControl, AclRule, ConnCounters, ConnEntry, ConnKey};
use crate::crossbar::Crossbar;
use crate::inline::Inline;
use crate::plane::{
    ForwardingPlane, IoSlot, PlaneError, PlaneOp, PortCounters, PortDump, PortSpec,
};
use crate::remote::{PlaneFuture, PlaneHandle, PlaneInbox, PlaneRemote};
use crate::segment::{segment, segments_needed, Reassembler};
use crate::table::{ForwardingTable, Route};
use crate::translator::Translator;
use crate::PortId;

/// Sizes and limits of an engine.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// Most ports (the crossbar is ports × ports queues).
    pub max_ports: usize,
    /// Messages read from one input per step.
    pub burst: usize,
    /// Messages each virtual output queue holds.
    pub voq_depth: usize,
    /// Messages each port ring holds, per direction.
    pub ring_depth: usize,
    /// Entries each connector's forwarding table holds.
    pub table_capacity: usize,
    /// Payload bytes a port holds for messages under reassembly.
    pub reassembly_bytes: usize,
    /// How long a segmented message may take to arrive whole.
    pub reassembly_timeout: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            max_ports: 16,
            burst: 32,
            voq_depth: 64,
            ring_depth: 256,
            table_capacity: crate::table::DEFAULT_CAPACITY,
            reassembly_bytes: 4 << 20,
            reassembly_timeout: Duration::from_secs(1),
        }
    }
}

/// A port's two queues: the engine's own ring pair (called directly, so
/// the hot path stays statically dispatched) or any [`PortIo`] a caller
/// supplied (a shared-memory link, a device run inline).
// The ring variant is the hot one and stays inline (its two ends are
// cache-line aligned, hence the size); boxing it would add a pointer
// chase per burst.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Queues {
    Ring(RingPort),
    Io(Box<dyn PortIo>),
}

pub(crate) struct Port {
    pub(crate) spec: PortSpec,
    pub(crate) queues: Queues,
    pub(crate) table: ForwardingTable,
    pub(crate) acl: AccessControl,
    pub(crate) reassembler: Option<Reassembler>,
    /// What its input did (written by whoever reads the input).
    pub(crate) counters: PortCounters,
    /// What its output sent (written by whoever fills the output: with
    /// inline senders, another thread than the input's).
    pub(crate) tx: TxCounters,
    /// Its sender forwards what it sends on its own thread (an
    /// [`InlineLink`](crate::inline::InlineLink)): the engine's thread
    /// does not wait on this input's ring, so a send wakes nobody.
    pub(crate) inline: bool,
    /// The outputs an inline pass of this input queued to (preallocated):
    /// the input's own, so senders on two ports write no common line.
    touched: Touched,
}

impl Port {
    /// A port on `queues` with empty tables, sized by `config`.
    pub(crate) fn new(spec: PortSpec, queues: Queues, config: &EngineConfig) -> Self {
        let reassembler = spec
            .kind
            .reassembles()
            .then(|| Reassembler::new(config.reassembly_bytes, config.reassembly_timeout));
        Port {
            spec,
            queues,
            table: ForwardingTable::new(config.table_capacity),
            acl: AccessControl::new(),
            reassembler,
            counters: PortCounters::default(),
            tx: TxCounters::default(),
            inline: false,
            touched: Touched {
                seen: vec![false; config.max_ports],
                list: Vec::with_capacity(config.max_ports),
            },
        }
    }

    /// Its counters, with the reassembler's brought up to date.
    pub(crate) fn counters(&mut self) -> PortCounters {
        if let Some(r) = &self.reassembler {
            self.counters.reassembly = r.stats();
        }
        PortCounters {
            tx_msgs: self.tx.msgs,
            tx_bytes: self.tx.bytes,
            ..self.counters
        }
    }

    /// Reads up to `burst` messages from this port (number `pi`) into
    /// `voqs`, deciding each at its connector.
    #[inline]
    pub(crate) fn read<V: Voqs>(
        &mut self,
        pi: PortId,
        translator: &Translator,
        voqs: &mut V,
        mtu: &[usize],
        burst: usize,
    ) -> usize {
        let Port {
            queues,
            acl,
            table,
            counters,
            ..
        } = self;
        let mut input = Input {
            acl,
            table,
            counters,
            translator,
            crossbar: voqs,
            mtu,
            burst,
            pi,
        };
        input.read(queues)
    }

    /// Fills this port's output (number `o`) from `from` as its scheduler
    /// picks.
    #[inline]
    pub(crate) fn write<X: Outputs>(&mut self, o: PortId, from: &mut X, now: Duration) -> usize {
        let Port {
            queues,
            reassembler,
            tx,
            ..
        } = self;
        Engine::fill_output(queues, from, reassembler, tx, o, now)
    }

    /// Drops what waited too long for its other segments.
    pub(crate) fn expire(&mut self, now: Duration) {
        if let Some(r) = self.reassembler.as_mut() {
            let name = &self.spec.name;
            r.expire(now, |inc| {
                tracing::debug!(
                    port = %name,
                    src = %inc.header.src,
                    seq = inc.header.seqnum,
                    received = inc.received,
                    "reassembly timed out"
                );
            });
            self.counters.reassembly = r.stats();
        }
    }
}

/// What a port's output sent, on a cache line of its own.
#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
pub(crate) struct TxCounters {
    pub(crate) msgs: u64,
    pub(crate) bytes: u64,
}

/// Where an input's connector queues what it forwards: the crossbar of a
/// single engine, or a shard's row of rings to every output.
pub(crate) trait Voqs {
    /// Free places in the queue from `input` to `output`.
    fn room(&mut self, input: PortId, output: PortId) -> usize;
    /// Queues `m`; the caller checked the room.
    fn push(&mut self, input: PortId, output: PortId, m: Message) -> Result<(), Message>;
}

impl Voqs for Crossbar {
    #[inline]
    fn room(&mut self, input: PortId, output: PortId) -> usize {
        Crossbar::room(self, input, output)
    }
    #[inline]
    fn push(&mut self, input: PortId, output: PortId, m: Message) -> Result<(), Message> {
        Crossbar::push(self, input, output, m)
    }
}

/// Where an output's scheduler takes what it sends: the crossbar of a
/// single engine, or the rings every input has to it in a shard.
pub(crate) trait Outputs {
    /// Whether messages wait for `output`.
    fn backlog(&mut self, output: PortId) -> usize;
    /// The next message for `output` as its scheduler picks it.
    fn pop(&mut self, output: PortId) -> Option<(PortId, Message)>;
}

impl Outputs for Crossbar {
    #[inline]
    fn backlog(&mut self, output: PortId) -> usize {
        Crossbar::backlog(self, output)
    }
    #[inline]
    fn pop(&mut self, output: PortId) -> Option<(PortId, Message)> {
        Crossbar::pop(self, output)
    }
}

/// The outputs one input's burst queued to, each once.
#[derive(Default)]
struct Touched {
    seen: Vec<bool>,
    list: Vec<PortId>,
}

/// The crossbar, noting which outputs a burst queues to.
struct Touching<'a> {
    crossbar: &'a mut Crossbar,
    touched: &'a mut Touched,
}

impl Voqs for Touching<'_> {
    #[inline]
    fn room(&mut self, input: PortId, output: PortId) -> usize {
        self.crossbar.room(input, output)
    }
    #[inline]
    fn push(&mut self, input: PortId, output: PortId, m: Message) -> Result<(), Message> {
        let seen = &mut self.touched.seen[output as usize];
        if !*seen {
            *seen = true;
            self.touched.list.push(output);
        }
        self.crossbar.push(input, output, m)
    }
}

/// What a connector decided for one message.
enum Fate {
    Forward(PortId),
    Answer(Status),
}

/// Dispatches per call on the kind of queues: the engine's rings are
/// called directly (inlined), others through their vtable. One
/// instantiation of the burst loops serves both, so adding caller-supplied
/// queues does not change how the ring path is compiled; the extra branch
/// is taken the same way for every message of a burst.
macro_rules! dispatch {
    ($self:ident, $q:ident => $e:expr) => {
        match $self {
            Queues::Ring($q) => $e,
            Queues::Io($q) => $e,
        }
    };
}

impl PortIo for Queues {
    #[inline(always)]
    fn peek(&mut self) -> Option<&Message> {
        dispatch!(self, q => q.peek())
    }
    #[inline(always)]
    fn pop(&mut self) -> Option<Message> {
        dispatch!(self, q => q.pop())
    }
    #[inline(always)]
    fn available(&mut self) -> usize {
        dispatch!(self, q => q.available())
    }
    #[inline(always)]
    fn release(&mut self) {
        dispatch!(self, q => q.release())
    }
    fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        dispatch!(self, q => q.poll_available(cx))
    }
    #[inline(always)]
    fn free(&mut self) -> usize {
        dispatch!(self, q => q.free())
    }
    #[inline(always)]
    fn push(&mut self, m: Message) -> Result<(), Message> {
        dispatch!(self, q => q.push(m))
    }
    #[inline(always)]
    fn flush(&mut self) {
        dispatch!(self, q => q.flush())
    }
    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        dispatch!(self, q => q.poll_ready(cx))
    }
    fn is_closed(&mut self) -> bool {
        dispatch!(self, q => q.is_closed())
    }
}

/// What reading one input's burst needs, borrowed apart from the port's
/// queues so that the burst loop is generic over them.
struct Input<'a, V: Voqs> {
    acl: &'a AccessControl,
    pub(crate) table: &'a ForwardingTable,
    pub(crate) counters: &'a mut PortCounters,
    pub(crate) translator: &'a Translator,
    pub(crate) crossbar: &'a mut V,
    pub(crate) mtu: &'a [usize],
    pub(crate) burst: usize,
    pub(crate) pi: PortId,
}

impl<V: Voqs> Input<'_, V> {
    /// Reads up to a burst from `q`: each message is forwarded into its
    /// virtual output queue or answered, or the input waits (lossless).
    #[inline]
    fn read<Q: PortIo + ?Sized>(&mut self, q: &mut Q) -> usize {
        let pi = self.pi;
        let mut moved = 0;
        while moved < self.burst {
            let Some(head) = q.peek() else {
                break;
            };
            let len = head.payload().len();
            let (fate, conn) = Engine::decide(self.acl, self.table, self.translator, head);
            match fate {
                Fate::Forward(out) => {
                    let out_mtu = self.mtu.get(out as usize).copied().unwrap_or(0);
                    if out_mtu == 0 {
                        // A route to a detached port: answer as a miss.
                        if !self.answer(q, Status::NoRoute) {
                            break;
                        }
                    } else {
                        let need = segments_needed(len, out_mtu);
                        if self.crossbar.room(pi, out) < need {
                            self.counters.input_stalls += 1;
                            break;
                        }
                        let Some(m) = q.pop() else { break };
                        self.counters.rx_msgs += 1;
                        self.counters.rx_bytes += m.payload().len() as u64;
                        if let Some(c) = conn {
                            c.count(m.payload().len());
                        }
                        if need > 1 {
                            self.counters.segments += need as u64;
                        }
                        let crossbar = &mut *self.crossbar;
                        segment(m, out_mtu, |s| {
                            // Room for every segment was checked above.
                            let _ = crossbar.push(pi, out, s);
                        });
                    }
                }
                Fate::Answer(status) => {
                    if !self.answer(q, status) {
                        break;
                    }
                }
            }
            moved += 1;
        }
        q.release();
        moved
    }

    /// Pops the head of `q` and answers it with `status` through the
    /// port's own output queue. Returns false (and pops nothing) when that
    /// queue is full.
    fn answer<Q: PortIo + ?Sized>(&mut self, q: &mut Q, status: Status) -> bool {
        let pi = self.pi;
        if self.crossbar.room(pi, pi) == 0 {
            self.counters.input_stalls += 1;
            return false;
        }
        let Some(m) = q.pop() else {
            return false;
        };
        self.counters.rx_msgs += 1;
        self.counters.rx_bytes += m.payload().len() as u64;
        match status {
            Status::Denied => self.counters.acl_denied += 1,
            _ => self.counters.no_route += 1,
        }
        match m.error_answer(status) {
            Some(a) => {
                self.counters.error_answers += 1;
                let _ = self.crossbar.push(pi, pi, a);
            }
            None => self.counters.unanswerable += 1,
        }
        true
    }
}

/// The overlay engine. See the module documentation.
pub struct Engine {
    config: EngineConfig,
    ports: Vec<Option<Port>>,
    /// Output MTU per port; 0 for a free slot.
    mtu: Vec<usize>,
    crossbar: Crossbar,
    translator: Translator,
    /// Control batches from an [`EngineHandle`], once spawned.
    commands: Option<PlaneInbox>,
    /// Where the next step starts reading, so no input is always first.
    start: usize,
    last_expiry: Duration,
}

impl Engine {
    /// An engine with no ports.
    pub fn new(config: EngineConfig) -> Self {
        Engine {
            ports: (0..config.max_ports).map(|_| None).collect(),
            mtu: vec![0; config.max_ports],
            crossbar: Crossbar::new(config.max_ports, config.voq_depth),
            translator: Translator::new(),
            commands: None,
            start: 0,
            last_expiry: Duration::ZERO,
            config,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub(crate) fn attach_queues(
        &mut self,
        spec: PortSpec,
        queues: Queues,
    ) -> Result<PortId, PlaneError> {
        let slot = self
            .ports
            .iter()
            .position(Option::is_none)
            .ok_or(PlaneError::TooManyPorts(self.config.max_ports))?;
        self.mtu[slot] = spec.mtu.clamp(1, Message::MAX_PAYLOAD);
        self.ports[slot] = Some(Port::new(spec, queues, &self.config));
        Ok(slot as PortId)
    }

    pub(crate) fn port_mut(&mut self, id: PortId) -> Result<&mut Port, PlaneError> {
        self.ports
            .get_mut(id as usize)
            .and_then(Option::as_mut)
            .ok_or(PlaneError::NoSuchPort(id))
    }

    /// Attaches a port on caller-supplied queues (see
    /// [`ForwardingPlane::attach_io`]). The engine drives `io` from its own
    /// thread: input bursts are read and outputs filled exactly as for its
    /// own rings.
    pub fn attach_io(&mut self, spec: PortSpec, io: Box<dyn PortIo>) -> Result<PortId, PlaneError> {
        self.attach_queues(spec, Queues::Io(io))
    }

    /// Whether the far side of port `id` is gone (see [`PortIo::is_closed`]).
    pub fn port_closed(&mut self, id: PortId) -> Result<bool, PlaneError> {
        Ok(self.port_mut(id)?.queues.is_closed())
    }

    /// The name of port `id`.
    pub fn port_name(&self, id: PortId) -> Option<&str> {
        self.ports
            .get(id as usize)?
            .as_ref()
            .map(|p| p.spec.name.as_str())
    }

    /// Decides a message's fate at its input connector; with it, the
    /// counters of the connection that admitted it (if one did), where
    /// the message is counted once it is taken.
    #[inline]
    fn decide<'a>(
        acl: &'a AccessControl,
        table: &ForwardingTable,
        translator: &Translator,
        m: &Message,
    ) -> (Fate, Option<&'a ConnEntry>) {
        let h = m.header();
        let Ok(conn) = acl.admit(h) else {
            return (Fate::Answer(Status::Denied), None);
        };
        // The connection's key only where connections are steered.
        if !translator.is_empty() {
            if let Some(out) = translator.lookup(&ConnKey::of(h)) {
                return (Fate::Forward(out), conn);
            }
        }
        match table.lookup(h.dst) {
            Some(out) => (Fate::Forward(out), conn),
            None => (Fate::Answer(Status::NoRoute), None),
        }
    }

    /// One pass: commands, every input (a burst each), every output.
    /// Returns the messages moved; 0 means the engine was idle.
    pub fn step(&mut self, now: Duration) -> usize {
        self.apply_commands();
        let (work, _) = self.step_data(now);
        if now.saturating_sub(self.last_expiry) >= Duration::from_millis(1) {
            self.last_expiry = now;
            self.expire(now);
        }
        work
    }

    /// Every input (a burst each), then every output: a pass without the
    /// commands and timeouts, which stay the engine thread's. Returns the
    /// messages moved and whether any input or queue still holds some.
    pub(crate) fn step_data(&mut self, now: Duration) -> (usize, bool) {
        let mut work = 0;
        let n = self.ports.len();
        for k in 0..n {
            let pi = (self.start + k) % n;
            work += self.read_input(pi as PortId);
        }
        self.start = (self.start + 1) % n.max(1);
        let mut left = false;
        for o in 0..n {
            work += self.write_output(o as PortId, now);
            left |= self.crossbar.backlog(o as PortId) > 0;
        }
        (work, left)
    }

    /// The inline fast path's pass (see [`crate::inline`]): input `pi`'s
    /// burst, then every output with queued messages — the same connector,
    /// crossbar and schedulers as [`Engine::step`], for the one input that
    /// has news. Returns the messages moved and whether work is left that
    /// only the engine's thread can finish (input or queues still holding
    /// messages: a full queue or a receiver's full ring).
    ///
    /// Only the outputs this input's burst queued to are filled (a sender
    /// touches no other output's state); what waited for others before
    /// is the engine thread's, which was woken when it was left.
    pub(crate) fn step_from(&mut self, pi: PortId, now: Duration) -> (usize, bool) {
        let Some(port) = self.ports[pi as usize].as_mut() else {
            return (0, false);
        };
        let mut touched = std::mem::take(&mut port.touched);
        let mut voqs = Touching {
            crossbar: &mut self.crossbar,
            touched: &mut touched,
        };
        let mut work = port.read(
            pi,
            &self.translator,
            &mut voqs,
            &self.mtu,
            self.config.burst,
        );
        let mut left = port.queues.available() > 0;
        for &o in touched.list.iter() {
            touched.seen[o as usize] = false;
            work += self.write_output(o, now);
            left |= self.crossbar.backlog(o) > 0;
        }
        touched.list.clear();
        if let Some(port) = self.ports[pi as usize].as_mut() {
            port.touched = touched;
        }
        (work, left)
    }

    fn read_input(&mut self, pi: PortId) -> usize {
        let Some(port) = self.ports[pi as usize].as_mut() else {
            return 0;
        };
        let burst = self.config.burst;
        port.read(pi, &self.translator, &mut self.crossbar, &self.mtu, burst)
    }

    fn write_output(&mut self, o: PortId, now: Duration) -> usize {
        let Some(port) = self.ports[o as usize].as_mut() else {
            return 0;
        };
        port.write(o, &mut self.crossbar, now)
    }

    /// Moves what output `o`'s scheduler picks into `q` while it has room,
    /// then publishes once.
    #[inline]
    fn fill_output<Q: PortIo + ?Sized, X: Outputs>(
        q: &mut Q,
        crossbar: &mut X,
        reassembler: &mut Option<Reassembler>,
        counters: &mut TxCounters,
        o: PortId,
        now: Duration,
    ) -> usize {
        let mut moved = 0;
        while crossbar.backlog(o) > 0 && q.free() > 0 {
            let Some((_, m)) = crossbar.pop(o) else {
                break;
            };
            moved += 1;
            let m = match reassembler.as_mut() {
                Some(r) if !Reassembler::passes(&m) => match r.push(m, now) {
                    Some(whole) => whole,
                    None => continue,
                },
                _ => m,
            };
            counters.msgs += 1;
            counters.bytes += m.payload().len() as u64;
            // free() > 0 was checked: the push cannot fail.
            let _ = q.push(m);
        }
        q.flush();
        moved
    }

    fn expire(&mut self, now: Duration) {
        for port in self.ports.iter_mut().flatten() {
            port.expire(now);
        }
    }

    /// Whether any input holds a message or any output has queued ones:
    /// a parked engine must not sleep on work.
    fn has_work(&mut self) -> bool {
        let crossbar = &self.crossbar;
        self.ports.iter_mut().enumerate().any(|(i, p)| match p {
            Some(p) => p.queues.available() > 0 || crossbar.backlog(i as PortId) > 0,
            None => false,
        })
    }

    fn apply_commands(&mut self) {
        if let Some(mut inbox) = self.commands.take() {
            inbox.serve(self);
            self.commands = Some(inbox);
        }
    }

    /// Runs the engine on a thread of its own until the handle stops it.
    ///
    /// The engine sits behind the [`Inline`](crate::inline::Inline) cell:
    /// its thread takes it for each pass, and a sender holding an
    /// [`InlineLink`](crate::inline::InlineLink) takes it to forward its
    /// own messages on its own thread (see [`crate::inline`]).
    pub fn spawn(mut self, mode: RunMode) -> EngineHandle {
        let (remote, inbox) = crate::remote::channel("engine", 64);
        self.commands = Some(inbox);
        let cell = Arc::new(Inline::new(self));
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let cell2 = cell.clone();
        let join = std::thread::Builder::new()
            .name("uniplane-engine".into())
            .spawn(move || Engine::run(&cell2, mode, &stop2))
            .ok();
        let threads: Vec<Thread> = join.iter().map(|j| j.thread().clone()).collect();
        if let Some(t) = threads.first() {
            cell.set_thread(t.clone());
        }
        EngineHandle {
            remote,
            stop,
            threads,
            join: join.map(|j| Arc::new(Joined::One(j))),
            inline: Some(cell),
        }
    }

    /// The engine's thread: a pass whenever it holds the engine, then
    /// spin or park as `mode` says. A pass that finds the engine held by
    /// an inline sender counts as work: that sender moves the messages,
    /// and whatever it could not finish it leaves flagged (`missed`).
    fn run(cell: &Inline, mode: RunMode, stop: &AtomicBool) {
        let epoch = cell.epoch();
        let mut idler = Idler::new(mode, false);
        while !stop.load(Ordering::Acquire) {
            let now = epoch.elapsed();
            cell.set_now(now);
            let worked = match cell.pass(|e| e.step(now)) {
                Some(n) => n > 0,
                None => true,
            };
            if worked {
                idler.worked();
            } else {
                idler.idle(|cx| cell.pass(|e| e.arm(cx)).unwrap_or(true));
            }
        }
    }

    /// Registers the engine's waker on every ring it waits on; true when
    /// work turned up meanwhile.
    fn arm(&mut self, cx: &mut Context<'_>) -> bool {
        let mut ready = false;
        if let Some(c) = self.commands.as_ref() {
            ready |= c.poll_pending(cx).is_ready();
        }
        for (i, port) in self.ports.iter_mut().enumerate() {
            let Some(port) = port else { continue };
            let q = &mut port.queues;
            // An inline port's sender forwards for itself; has_work below
            // still sees what waits in its ring.
            if !port.inline {
                ready |= matches!(q.poll_available(cx), Poll::Ready(true));
            }
            if self.crossbar.backlog(i as PortId) > 0 {
                ready |= matches!(q.poll_ready(cx), Poll::Ready(_));
            }
        }
        ready || self.has_work()
    }
}

impl ForwardingPlane for Engine {
    fn kind(&self) -> &'static str {
        "engine"
    }

    fn attach(&mut self, spec: PortSpec) -> Result<(PortId, RingLink), PlaneError> {
        let (link, port) = ring_link(self.config.ring_depth);
        let id = self.attach_queues(spec, Queues::Ring(port))?;
        Ok((id, link))
    }

    fn attach_io(&mut self, spec: PortSpec, io: Box<dyn PortIo>) -> Result<PortId, PlaneError> {
        Engine::attach_io(self, spec, io)
    }

    /// Removes port `id`, returning its last counters. Messages queued for
    /// it (or from it) can no longer be delivered and go with it; routes
    /// that name the port answer as misses until the control plane
    /// removes them, and translations to it are removed.
    fn detach(&mut self, id: PortId) -> Result<PortCounters, PlaneError> {
        let counters = self.counters(id)?;
        self.ports[id as usize] = None;
        self.mtu[id as usize] = 0;
        self.crossbar.clear_output(id);
        self.translator.retain(|_, out| out != id);
        Ok(counters)
    }

    fn dump(&mut self, port: PortId) -> Result<PortDump, PlaneError> {
        let counters = self.counters(port)?;
        let policy = Some(self.crossbar.policy(port).clone());
        let p = self.port_mut(port)?;
        Ok(PortDump {
            port,
            name: p.spec.name.clone(),
            kind: Some(p.spec.kind),
            routes: p.table.routes(),
            default_route: p.table.default_route(),
            connections: p.acl.connection_keys(),
            rules: p.acl.rules().to_vec(),
            policy,
            counters,
        })
    }

    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError> {
        Ok(self.translator.entries())
    }

    fn add_route(&mut self, port: PortId, route: Route) -> Result<(), PlaneError> {
        Ok(self.port_mut(port)?.table.insert(route)?)
    }

    fn remove_route(&mut self, port: PortId, key: Uid, mask: u64) -> Result<(), PlaneError> {
        self.port_mut(port)?.table.remove(key, mask)?;
        Ok(())
    }

    fn set_default_route(&mut self, port: PortId, out: Option<PortId>) -> Result<(), PlaneError> {
        self.port_mut(port)?.table.set_default(out);
        Ok(())
    }

    fn allow_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.port_mut(port)?.acl.allow_connection(conn);
        Ok(())
    }

    fn revoke_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.port_mut(port)?.acl.revoke_connection(conn);
        Ok(())
    }

    fn add_acl_rule(&mut self, port: PortId, rule: AclRule) -> Result<(), PlaneError> {
        self.port_mut(port)?.acl.push_rule(rule);
        Ok(())
    }

    fn clear_acl_rules(&mut self, port: PortId) -> Result<(), PlaneError> {
        self.port_mut(port)?.acl.clear_rules();
        Ok(())
    }

    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError> {
        self.port_mut(out)?;
        self.translator.insert(conn, out);
        Ok(())
    }

    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError> {
        if self.translator.remove(conn) {
            Ok(())
        } else {
            Err(PlaneError::NoTranslation(conn))
        }
    }

    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError> {
        self.port_mut(output)?;
        Ok(self.crossbar.set_policy(output, policy)?)
    }

    fn counters(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        Ok(self.port_mut(port)?.counters())
    }

    fn connection_counters(
        &mut self,
        port: PortId,
    ) -> Result<Vec<(ConnKey, ConnCounters)>, PlaneError> {
        Ok(self.port_mut(port)?.acl.connection_counters())
    }
}

/// How a spawned engine waits when idle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunMode {
    /// Never sleep: lowest latency, one core always busy.
    BusyPoll,
    /// Spin `spins` idle passes, then park until a ring wakes the thread.
    SpinThenPark {
        /// Idle passes before parking.
        spins: u32,
    },
}

pub(crate) struct ThreadWaker(pub(crate) Thread);

/// How a plane's thread waits after a pass that moved nothing: spin for a
/// while, then register its waker wherever it waits and park (timed, so
/// timeouts still fire), as its [`RunMode`] says.
pub(crate) struct Idler {
    mode: RunMode,
    /// Idle passes in a row.
    idle: u32,
    waker: Waker,
    /// Yield the core when the wakers say work is there but the pass
    /// found none: the thread waits on another that may share its core.
    yield_when_ready: bool,
}

impl Idler {
    /// An idler for the calling thread.
    pub(crate) fn new(mode: RunMode, yield_when_ready: bool) -> Self {
        Idler {
            mode,
            idle: 0,
            waker: Waker::from(Arc::new(ThreadWaker(std::thread::current()))),
            yield_when_ready,
        }
    }

    /// A pass moved something.
    #[inline]
    pub(crate) fn worked(&mut self) {
        self.idle = 0;
    }

    /// A pass moved nothing: spins, or arms (`arm` registers the waker
    /// and says whether work turned up meanwhile) and parks. True when it
    /// parked.
    pub(crate) fn idle(&mut self, arm: impl FnOnce(&mut Context<'_>) -> bool) -> bool {
        self.idle = self.idle.saturating_add(1);
        match self.mode {
            RunMode::BusyPoll => std::hint::spin_loop(),
            RunMode::SpinThenPark { spins } => {
                if self.idle < spins {
                    std::hint::spin_loop();
                    return false;
                }
                let mut cx = Context::from_waker(&self.waker);
                if arm(&mut cx) {
                    if self.yield_when_ready {
                        std::thread::yield_now();
                    }
                    return false;
                }
                std::thread::park_timeout(Duration::from_millis(10));
                self.idle = 0;
                return true;
            }
        }
        false
    }
}

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Controls an engine running on its own thread. Cloning is cheap; every
/// clone talks to the same engine. As a [`PlaneHandle`] it submits
/// batches without blocking (what a daemon uses); as a
/// [`ForwardingPlane`] each call parks the caller until the engine
/// applied it (tests, benchmarks, tools — never on an async runtime).
#[derive(Clone)]
pub struct EngineHandle {
    pub(crate) remote: PlaneRemote,
    pub(crate) stop: Arc<AtomicBool>,
    /// Every thread of the engine, woken to see the stop.
    pub(crate) threads: Vec<Thread>,
    pub(crate) join: Option<Arc<Joined>>,
    /// A single engine's cell, which inline senders share.
    pub(crate) inline: Option<Arc<Inline>>,
}

/// The threads [`EngineHandle::stop`] waits for.
pub(crate) enum Joined {
    /// A single engine's thread (the engine stays in its cell).
    One(JoinHandle<()>),
    /// A sharded engine's shards and its control thread.
    Many(Vec<JoinHandle<()>>),
}

impl EngineHandle {
    fn op(&self, op: PlaneOp) -> Result<crate::plane::PlaneReply, PlaneError> {
        self.remote.apply_blocking(op)
    }

    /// The asynchronous, batched handle of this engine.
    pub fn remote(&self) -> PlaneRemote {
        self.remote.clone()
    }

    /// Stops the engine's threads and waits for them; returns the engine
    /// (with its counters) when this was the last handle to hold a single
    /// engine's thread. A sharded engine gives nothing back (read its
    /// counters before stopping it).
    ///
    /// An [`InlineLink`](crate::inline::InlineLink) shares the engine too:
    /// while one is alive the engine is not given back.
    pub fn stop(mut self) -> Option<Engine> {
        self.stop.store(true, Ordering::Release);
        for t in &self.threads {
            t.unpark();
        }
        match Arc::into_inner(self.join.take()?)? {
            Joined::One(j) => {
                j.join().ok()?;
                Some(Arc::into_inner(self.inline.take()?)?.into_engine())
            }
            Joined::Many(js) => {
                for j in js {
                    let _ = j.join();
                }
                None
            }
        }
    }
}

impl PlaneHandle for EngineHandle {
    fn kind(&self) -> &'static str {
        "engine"
    }

    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture {
        self.remote.submit(ops)
    }
}

impl ForwardingPlane for EngineHandle {
    fn kind(&self) -> &'static str {
        "engine"
    }
    fn attach(&mut self, spec: PortSpec) -> Result<(PortId, RingLink), PlaneError> {
        self.op(PlaneOp::Attach(spec))?
            .into_attached()
            .ok_or(PlaneError::EngineGone)
    }
    fn attach_io(&mut self, spec: PortSpec, io: Box<dyn PortIo>) -> Result<PortId, PlaneError> {
        match self.op(PlaneOp::AttachIo(spec, IoSlot::new(io)))? {
            crate::plane::PlaneReply::AttachedIo(p) => Ok(p),
            _ => Err(PlaneError::EngineGone),
        }
    }
    fn detach(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        counters(self.op(PlaneOp::Detach(port))?)
    }
    fn dump(&mut self, port: PortId) -> Result<PortDump, PlaneError> {
        match self.op(PlaneOp::Dump(port))? {
            crate::plane::PlaneReply::Dump(d) => Ok(*d),
            _ => Err(PlaneError::EngineGone),
        }
    }
    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError> {
        match self.op(PlaneOp::Translations)? {
            crate::plane::PlaneReply::Translations(t) => Ok(t),
            _ => Err(PlaneError::EngineGone),
        }
    }
    fn add_route(&mut self, port: PortId, route: Route) -> Result<(), PlaneError> {
        self.op(PlaneOp::AddRoute(port, route)).map(drop)
    }
    fn remove_route(&mut self, port: PortId, key: Uid, mask: u64) -> Result<(), PlaneError> {
        self.op(PlaneOp::RemoveRoute(port, key, mask)).map(drop)
    }
    fn set_default_route(&mut self, port: PortId, out: Option<PortId>) -> Result<(), PlaneError> {
        self.op(PlaneOp::SetDefault(port, out)).map(drop)
    }
    fn allow_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.op(PlaneOp::Allow(port, conn)).map(drop)
    }
    fn revoke_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.op(PlaneOp::Revoke(port, conn)).map(drop)
    }
    fn add_acl_rule(&mut self, port: PortId, rule: AclRule) -> Result<(), PlaneError> {
        self.op(PlaneOp::AddRule(port, rule)).map(drop)
    }
    fn clear_acl_rules(&mut self, port: PortId) -> Result<(), PlaneError> {
        self.op(PlaneOp::ClearRules(port)).map(drop)
    }
    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError> {
        self.op(PlaneOp::AddTranslation(conn, out)).map(drop)
    }
    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError> {
        self.op(PlaneOp::RemoveTranslation(conn)).map(drop)
    }
    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError> {
        self.op(PlaneOp::SetPolicy(output, policy)).map(drop)
    }
    fn move_port(&mut self, port: PortId, shard: usize) -> Result<(), PlaneError> {
        self.op(PlaneOp::MovePort(port, shard)).map(drop)
    }
    fn counters(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        counters(self.op(PlaneOp::Counters(port))?)
    }
    fn connection_counters(
        &mut self,
        port: PortId,
    ) -> Result<Vec<(ConnKey, ConnCounters)>, PlaneError> {
        match self.op(PlaneOp::ConnCounters(port))? {
            crate::plane::PlaneReply::ConnCounters(c) => Ok(c),
            _ => Err(PlaneError::EngineGone),
        }
    }
}

fn counters(reply: crate::plane::PlaneReply) -> Result<PortCounters, PlaneError> {
    match reply {
        crate::plane::PlaneReply::Counters(c) => Ok(c),
        _ => Err(PlaneError::EngineGone),
    }
}
