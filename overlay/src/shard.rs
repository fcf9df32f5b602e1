//! The sharded engine: N run-to-completion threads, each owning a set of
//! ports, one crossbar between them.
//!
//! ```text
//!   shard 0 (thread)                          shard 1 (thread)
//!   port a: input ─► connector ─┬─► ring a→a ─► a's scheduler ─► a's output
//!                               └─► ring a→b ──┐
//!   port b's scheduler ◄─ ring b→b ◄─ … ◄──────┼── (b's input, on shard 1)
//!                                              └─► b's scheduler ─► b's output
//! ```
//!
//! Every (input, output) pair has its own virtual output queue, as in the
//! single engine's crossbar, but each is a single-producer single-consumer
//! ring: the shard that owns the input is its only writer, the shard that
//! owns the output its only reader. So no lock is taken on the data path,
//! and every property of the single engine holds across shards:
//!
//! - **lossless** — a message leaves its input only when its queue has
//!   room for all its segments, otherwise that input waits;
//! - **per-flow order** — a flow enters through one input and waits in one
//!   FIFO queue;
//! - **weights across shards** — each output's scheduler (round robin,
//!   weighted, strict priority) picks among the queues of *every* input,
//!   whichever shard reads it, exactly as the single engine does.
//!
//! A message costs the same work as in one engine — the connector's
//! decision on its input's shard, the scheduler's pick on its output's —
//! split across threads. The connector code is the single engine's
//! ([`Input`]), so both decide alike.
//!
//! The control plane talks to a control thread through the same batched
//! [`crate::remote`] channel as the single engine; it sends each shard its
//! part (routes and ACL to the owner of the port, translations and MTUs to
//! every shard) and waits for the shard to apply it between two passes.
//! A port moves between shards ([`ForwardingPlane::move_port`]) with its
//! queues: what waits in them stays, in order.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use uniplane_dataplane::ring::{ring, ring_link, Consumer, Producer, RingLink};
use uniplane_dataplane::sched::{Backlog, Policy, Scheduler};
use uniplane_dataplane::{Message, PortIo, Uid};

use crate::acl::{AclRule, ConnCounters, ConnKey};
use crate::crossbar::padded;
use crate::engine::{
    EngineConfig, EngineHandle, Idler, Joined, Outputs, Port, Queues, RunMode, ThreadWaker, Voqs,
};
use crate::plane::{
    ForwardingPlane, PlaneError, PlaneOp, PlaneReply, PortCounters, PortDump, PortSpec,
};
use crate::remote::PlaneInbox;
use crate::table::Route;
use crate::translator::Translator;
use crate::PortId;

/// How many shards, and where they run.
#[derive(Clone, Debug, Default)]
pub struct ShardConfig {
    /// Shard threads (at least 1).
    pub shards: usize,
    /// CPUs to pin shard `k` to (`cpus[k % len]`); empty: not pinned.
    pub cpus: Vec<usize>,
}

/// The queues of one input to every output: the producing ends.
struct Row(Vec<Option<Producer<Message>>>);

impl Voqs for Row {
    #[inline]
    fn room(&mut self, _input: PortId, output: PortId) -> usize {
        match self.0.get_mut(output as usize) {
            Some(Some(p)) => p.free(),
            _ => 0,
        }
    }
    #[inline]
    fn push(&mut self, _input: PortId, output: PortId, m: Message) -> Result<(), Message> {
        match self.0.get_mut(output as usize) {
            Some(Some(p)) => p.push(m),
            _ => Err(m),
        }
    }
}

impl Row {
    fn flush(&mut self) {
        for p in self.0.iter_mut().flatten() {
            p.flush();
        }
    }
}

/// The queues of every input to one output, and its scheduler.
struct Column {
    voq: Vec<Option<Consumer<Message>>>,
    sched: Scheduler,
    /// Messages seen readable at the last refresh, not taken since.
    backlog: usize,
}

/// The heads as last refreshed, for the scheduler.
struct Heads<'a>(&'a [Option<Consumer<Message>>]);

impl Backlog for Heads<'_> {
    #[inline]
    fn head_len(&self, q: usize) -> Option<u32> {
        self.0
            .get(q)?
            .as_ref()?
            .peek_cached()
            .map(|m| m.encoded_len() as u32)
    }
    #[inline]
    fn has_head(&self, q: usize) -> bool {
        matches!(self.0.get(q), Some(Some(c)) if c.has_cached())
    }
}

impl Column {
    fn new(ports: usize) -> Self {
        Column {
            voq: (0..ports).map(|_| None).collect(),
            sched: Scheduler::new(ports),
            backlog: 0,
        }
    }

    /// Re-reads every queue's producer position once.
    fn refresh(&mut self) -> usize {
        self.backlog = self.voq.iter_mut().flatten().map(|c| c.available()).sum();
        self.backlog
    }

    fn release(&mut self) {
        for c in self.voq.iter_mut().flatten() {
            c.release();
        }
    }
}

impl Outputs for Column {
    #[inline]
    fn backlog(&mut self, _output: PortId) -> usize {
        self.backlog
    }
    #[inline]
    fn pop(&mut self, _output: PortId) -> Option<(PortId, Message)> {
        if self.backlog == 0 {
            return None;
        }
        let input = self.sched.pick(&Heads(&self.voq))?;
        let c = self.voq[input].as_mut()?;
        let m = c.pop()?;
        c.prefetch_next();
        self.backlog -= 1;
        if c.peek_cached().is_none() {
            // Seen empty: look again, as the single engine's queues are
            // always up to date, so the scheduler does not take a queue
            // its producer refilled meanwhile for an idle one.
            self.backlog += c.available();
        }
        Some((input as PortId, m))
    }
}

/// A port with its queues to and from every other: what moves between
/// shards. Cache-line aligned: its counters and scheduler change with
/// every message, and the control thread allocates the ports of all
/// shards one after another.
#[repr(align(128))]
struct Owned {
    port: Port,
    row: Row,
    column: Column,
    /// Its input waited for room at the last pass: what wakes the shard
    /// is room in its queues, not more input.
    stalled: bool,
}

/// One end of a queue for a shard to install.
enum End {
    Producer(Producer<Message>),
    Consumer(Consumer<Message>),
}

/// What the control thread asks of a shard.
enum Cmd {
    /// A port operation on a port the shard owns, or a translation (every
    /// shard holds all of them).
    Op(PlaneOp),
    /// Take this port and run it.
    Adopt(PortId, Box<Owned>),
    /// Give this port back (to move or detach it).
    Take(PortId),
    /// The end of queue (input, output) that this shard serves.
    Install(PortId, PortId, End),
    /// Port gone: drop every queue to and from it, and translations to it.
    Forget(PortId),
    /// A port's output MTU (0: detached).
    Mtu(PortId, usize),
}

// One answer per control command: size does not matter.
#[allow(clippy::large_enum_variant)]
enum Answer {
    Plane(Result<PlaneReply, PlaneError>),
    Taken(Option<Box<Owned>>),
    Done,
}

/// One shard: a thread's worth of ports.
struct Shard {
    config: EngineConfig,
    /// Ports this shard runs, in the order it reads them.
    owned: Vec<PortId>,
    /// By port number: the ports owned here.
    ports: Vec<Option<Owned>>,
    /// Every port's output MTU; 0 for a free slot.
    mtu: Vec<usize>,
    translator: Translator,
    commands: Receiver<Vec<Cmd>>,
    answers: Sender<Vec<Answer>>,
    start: usize,
    last_expiry: Duration,
}

impl Shard {
    fn new(
        config: EngineConfig,
        commands: Receiver<Vec<Cmd>>,
        answers: Sender<Vec<Answer>>,
    ) -> Self {
        let n = config.max_ports;
        Shard {
            owned: Vec::with_capacity(n),
            ports: (0..n).map(|_| None).collect(),
            mtu: vec![0; n],
            translator: Translator::new(),
            commands,
            answers,
            start: 0,
            last_expiry: Duration::ZERO,
            config,
        }
    }

    /// Applies the control thread's batches; false when it is gone.
    fn serve(&mut self) -> bool {
        loop {
            match self.commands.try_recv() {
                Ok(batch) => {
                    let out = batch.into_iter().map(|c| self.apply(c)).collect();
                    if self.answers.send(out).is_err() {
                        return false;
                    }
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => return true,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn owned_mut(&mut self, p: PortId) -> Result<&mut Owned, PlaneError> {
        self.ports
            .get_mut(p as usize)
            .and_then(Option::as_mut)
            .ok_or(PlaneError::NoSuchPort(p))
    }

    fn apply(&mut self, cmd: Cmd) -> Answer {
        match cmd {
            Cmd::Op(op) => Answer::Plane(self.op(op)),
            Cmd::Adopt(p, owned) => {
                self.ports[p as usize] = Some(*owned);
                self.owned.push(p);
                Answer::Done
            }
            Cmd::Take(p) => {
                self.owned.retain(|&q| q != p);
                Answer::Taken(
                    self.ports
                        .get_mut(p as usize)
                        .and_then(Option::take)
                        .map(Box::new),
                )
            }
            Cmd::Install(input, output, end) => {
                match end {
                    End::Producer(q) => {
                        if let Ok(o) = self.owned_mut(input) {
                            o.row.0[output as usize] = Some(q);
                        }
                    }
                    End::Consumer(q) => {
                        if let Ok(o) = self.owned_mut(output) {
                            o.column.voq[input as usize] = Some(q);
                        }
                    }
                }
                Answer::Done
            }
            Cmd::Forget(p) => {
                for o in self.ports.iter_mut().flatten() {
                    o.row.0[p as usize] = None;
                    o.column.voq[p as usize] = None;
                }
                self.translator.retain(|_, out| out != p);
                Answer::Done
            }
            Cmd::Mtu(p, mtu) => {
                self.mtu[p as usize] = mtu;
                Answer::Done
            }
        }
    }

    /// A plane operation on a port this shard owns (or on its copy of the
    /// translations).
    fn op(&mut self, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
        let done = |r: Result<(), PlaneError>| r.map(|()| PlaneReply::Done);
        match op {
            PlaneOp::AddRoute(p, r) => done(Ok(self.owned_mut(p)?.port.table.insert(r)?)),
            PlaneOp::RemoveRoute(p, k, m) => {
                self.owned_mut(p)?.port.table.remove(k, m)?;
                Ok(PlaneReply::Done)
            }
            PlaneOp::SetDefault(p, out) => {
                self.owned_mut(p)?.port.table.set_default(out);
                Ok(PlaneReply::Done)
            }
            PlaneOp::Allow(p, c) => {
                self.owned_mut(p)?.port.acl.allow_connection(c);
                Ok(PlaneReply::Done)
            }
            PlaneOp::Revoke(p, c) => {
                self.owned_mut(p)?.port.acl.revoke_connection(c);
                Ok(PlaneReply::Done)
            }
            PlaneOp::AddRule(p, r) => {
                self.owned_mut(p)?.port.acl.push_rule(r);
                Ok(PlaneReply::Done)
            }
            PlaneOp::ClearRules(p) => {
                self.owned_mut(p)?.port.acl.clear_rules();
                Ok(PlaneReply::Done)
            }
            PlaneOp::SetPolicy(p, policy) => {
                let n = self.config.max_ports;
                let o = self.owned_mut(p)?;
                done(
                    o.column
                        .sched
                        .set_policy(padded(policy, n))
                        .map_err(Into::into),
                )
            }
            PlaneOp::Counters(p) => Ok(PlaneReply::Counters(self.owned_mut(p)?.port.counters())),
            PlaneOp::ConnCounters(p) => Ok(PlaneReply::ConnCounters(
                self.owned_mut(p)?.port.acl.connection_counters(),
            )),
            PlaneOp::Dump(p) => {
                let o = self.owned_mut(p)?;
                let counters = o.port.counters();
                let port = &o.port;
                Ok(PlaneReply::Dump(Box::new(PortDump {
                    port: p,
                    name: port.spec.name.clone(),
                    kind: Some(port.spec.kind),
                    routes: port.table.routes(),
                    default_route: port.table.default_route(),
                    connections: port.acl.connection_keys(),
                    rules: port.acl.rules().to_vec(),
                    policy: Some(o.column.sched.policy().clone()),
                    counters,
                })))
            }
            PlaneOp::AddTranslation(c, out) => {
                self.translator.insert(c, out);
                Ok(PlaneReply::Done)
            }
            PlaneOp::RemoveTranslation(c) => {
                if self.translator.remove(c) {
                    Ok(PlaneReply::Done)
                } else {
                    Err(PlaneError::NoTranslation(c))
                }
            }
            PlaneOp::Translations => Ok(PlaneReply::Translations(self.translator.entries())),
            PlaneOp::Attach(_)
            | PlaneOp::AttachIo(..)
            | PlaneOp::Detach(_)
            | PlaneOp::MovePort(..) => Err(PlaneError::Unsupported {
                plane: "engine shard",
                what: "attach, detach or move a port (the control thread does)",
            }),
        }
    }

    /// One pass over the ports this shard owns: a burst from every input
    /// into its queues, then every output from its queues.
    fn step(&mut self, now: Duration) -> usize {
        let mut work = 0;
        let n = self.owned.len();
        for k in 0..n {
            let pi = self.owned[(self.start + k) % n];
            let Some(o) = self.ports[pi as usize].as_mut() else {
                continue;
            };
            let Owned {
                port, row, stalled, ..
            } = o;
            let before = port.counters.input_stalls;
            let moved = port.read(pi, &self.translator, row, &self.mtu, self.config.burst);
            *stalled = port.counters.input_stalls != before;
            if moved > 0 {
                row.flush();
            }
            work += moved;
        }
        self.start = (self.start + 1) % n.max(1);
        for &po in &self.owned {
            let Some(o) = self.ports[po as usize].as_mut() else {
                continue;
            };
            let Owned { port, column, .. } = o;
            if column.refresh() == 0 {
                continue;
            }
            work += port.write(po, column, now);
            column.release();
        }
        if now.saturating_sub(self.last_expiry) >= Duration::from_millis(1) {
            self.last_expiry = now;
            for o in self.ports.iter_mut().flatten() {
                o.port.expire(now);
            }
        }
        work
    }

    /// Registers the shard's waker wherever it waits; true when work
    /// turned up meanwhile.
    fn arm(&mut self, cx: &mut Context<'_>) -> bool {
        let mut ready = false;
        for o in self.ports.iter_mut().flatten() {
            if !o.stalled {
                ready |= matches!(o.port.queues.poll_available(cx), Poll::Ready(true));
            }
            for c in o.column.voq.iter_mut().flatten() {
                ready |= matches!(c.poll_available(cx), Poll::Ready(true));
            }
            if o.column.refresh() > 0 {
                // Waiting for the output to make room.
                ready |= matches!(o.port.queues.poll_ready(cx), Poll::Ready(_));
            }
            for p in o.row.0.iter_mut().flatten() {
                if p.free() == 0 {
                    // An input waits for room in this queue.
                    ready |= matches!(p.poll_ready(cx), Poll::Ready(_));
                }
            }
        }
        ready
    }

    fn run(mut self, mode: RunMode, stop: &AtomicBool) {
        let epoch = Instant::now();
        // A shard that finds work announced but none to do waits on
        // another shard: it yields the core to it.
        let mut idler = Idler::new(mode, true);
        let (mut now, mut passes) = (Duration::ZERO, 0u32);
        while !stop.load(Ordering::Acquire) {
            if !self.serve() {
                return;
            }
            // The clock serves reassembly timeouts (a second by default):
            // read it every 64 passes, and after a park.
            if passes % 64 == 0 {
                now = epoch.elapsed();
            }
            passes = passes.wrapping_add(1);
            if self.step(now) > 0 {
                idler.worked();
            } else if idler.idle(|cx| self.arm(cx)) {
                passes = 0;
            }
        }
    }
}

/// The control thread's side of a shard.
struct ShardLink {
    commands: Sender<Vec<Cmd>>,
    answers: Receiver<Vec<Answer>>,
    thread: Thread,
    ports: usize,
}

impl ShardLink {
    /// Sends `cmds` and waits (on the control thread) until the shard
    /// applied them between two of its passes.
    fn call(&self, cmds: Vec<Cmd>) -> Result<Vec<Answer>, PlaneError> {
        self.commands
            .send(cmds)
            .map_err(|_| PlaneError::EngineGone)?;
        self.thread.unpark();
        self.answers.recv().map_err(|_| PlaneError::EngineGone)
    }

    fn one(&self, cmd: Cmd) -> Result<Answer, PlaneError> {
        self.call(vec![cmd])?.pop().ok_or(PlaneError::EngineGone)
    }

    fn op(&self, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
        match self.one(Cmd::Op(op))? {
            Answer::Plane(r) => r,
            _ => Err(PlaneError::EngineGone),
        }
    }
}

/// The control thread: the [`ForwardingPlane`] of a sharded engine.
struct Control {
    config: EngineConfig,
    shards: Vec<ShardLink>,
    /// By port number: the shard that runs it.
    owner: Vec<Option<usize>>,
}

impl Control {
    fn shard_of(&self, p: PortId) -> Result<&ShardLink, PlaneError> {
        self.owner
            .get(p as usize)
            .copied()
            .flatten()
            .map(|s| &self.shards[s])
            .ok_or(PlaneError::NoSuchPort(p))
    }

    fn on_owner(&self, p: PortId, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
        self.shard_of(p)?.op(op)
    }

    /// Sends each shard its batch (shards without one are skipped).
    fn send_all(&self, batches: Vec<Vec<Cmd>>) -> Result<(), PlaneError> {
        for (shard, cmds) in self.shards.iter().zip(batches) {
            if !cmds.is_empty() {
                shard.call(cmds)?;
            }
        }
        Ok(())
    }

    fn attach_queues(&mut self, spec: PortSpec, queues: Queues) -> Result<PortId, PlaneError> {
        let n = self.config.max_ports;
        let slot = self
            .owner
            .iter()
            .position(Option::is_none)
            .ok_or(PlaneError::TooManyPorts(n))?;
        let id = slot as PortId;
        // The shard running the fewest ports takes it.
        let shard = (0..self.shards.len())
            .min_by_key(|&s| self.shards[s].ports)
            .unwrap_or(0);
        let mtu = spec.mtu.clamp(1, Message::MAX_PAYLOAD);
        let mut owned = Owned {
            port: Port::new(spec, queues, &self.config),
            row: Row((0..n).map(|_| None).collect()),
            column: Column::new(n),
            stalled: false,
        };
        let mut batches: Vec<Vec<Cmd>> = self.shards.iter().map(|_| Vec::new()).collect();
        let depth = self.config.voq_depth.max(1);
        // Its own queue (answers to itself), then both ways with every
        // other port.
        let (p, c) = ring(depth);
        owned.row.0[slot] = Some(p);
        owned.column.voq[slot] = Some(c);
        for (j, s) in self.owner.iter().enumerate() {
            let Some(s) = *s else { continue };
            let (p, c) = ring(depth);
            owned.row.0[j] = Some(p);
            batches[s].push(Cmd::Install(id, j as PortId, End::Consumer(c)));
            let (p, c) = ring(depth);
            owned.column.voq[j] = Some(c);
            batches[s].push(Cmd::Install(j as PortId, id, End::Producer(p)));
        }
        batches[shard].insert(0, Cmd::Adopt(id, Box::new(owned)));
        for b in &mut batches {
            b.push(Cmd::Mtu(id, mtu));
        }
        self.send_all(batches)?;
        self.owner[slot] = Some(shard);
        self.shards[shard].ports += 1;
        Ok(id)
    }

    fn take(&mut self, p: PortId) -> Result<(usize, Box<Owned>), PlaneError> {
        let s = self
            .owner
            .get(p as usize)
            .copied()
            .flatten()
            .ok_or(PlaneError::NoSuchPort(p))?;
        match self.shards[s].one(Cmd::Take(p))? {
            Answer::Taken(Some(o)) => {
                self.owner[p as usize] = None;
                self.shards[s].ports -= 1;
                Ok((s, o))
            }
            _ => Err(PlaneError::NoSuchPort(p)),
        }
    }
}

impl ForwardingPlane for Control {
    fn kind(&self) -> &'static str {
        "engine"
    }

    fn attach(&mut self, spec: PortSpec) -> Result<(PortId, RingLink), PlaneError> {
        let (link, port) = ring_link(self.config.ring_depth);
        let id = self.attach_queues(spec, Queues::Ring(port))?;
        Ok((id, link))
    }

    fn attach_io(&mut self, spec: PortSpec, io: Box<dyn PortIo>) -> Result<PortId, PlaneError> {
        self.attach_queues(spec, Queues::Io(io))
    }

    /// As the single engine: what was queued to or from the port goes
    /// with it; translations to it are removed.
    fn detach(&mut self, p: PortId) -> Result<PortCounters, PlaneError> {
        let (_, mut owned) = self.take(p)?;
        let counters = owned.port.counters();
        let batches = self
            .shards
            .iter()
            .map(|_| vec![Cmd::Forget(p), Cmd::Mtu(p, 0)])
            .collect();
        self.send_all(batches)?;
        Ok(counters)
    }

    fn move_port(&mut self, p: PortId, shard: usize) -> Result<(), PlaneError> {
        if shard >= self.shards.len() {
            return Err(PlaneError::Unsupported {
                plane: "engine",
                what: "move a port to a shard that does not exist",
            });
        }
        if self.owner.get(p as usize).copied().flatten() == Some(shard) {
            return Ok(());
        }
        let (_, owned) = self.take(p)?;
        // The queues travel inside `owned`: nothing is lost, and the new
        // shard reads them from where the old one stopped.
        self.shards[shard].one(Cmd::Adopt(p, owned))?;
        self.owner[p as usize] = Some(shard);
        self.shards[shard].ports += 1;
        Ok(())
    }

    fn dump(&mut self, p: PortId) -> Result<PortDump, PlaneError> {
        match self.on_owner(p, PlaneOp::Dump(p))? {
            PlaneReply::Dump(d) => Ok(*d),
            _ => Err(PlaneError::EngineGone),
        }
    }

    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError> {
        match self.shards[0].op(PlaneOp::Translations)? {
            PlaneReply::Translations(t) => Ok(t),
            _ => Err(PlaneError::EngineGone),
        }
    }

    fn add_route(&mut self, p: PortId, route: Route) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::AddRoute(p, route)).map(drop)
    }

    fn remove_route(&mut self, p: PortId, key: Uid, mask: u64) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::RemoveRoute(p, key, mask))
            .map(drop)
    }

    fn set_default_route(&mut self, p: PortId, out: Option<PortId>) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::SetDefault(p, out)).map(drop)
    }

    fn allow_connection(&mut self, p: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::Allow(p, conn)).map(drop)
    }

    fn revoke_connection(&mut self, p: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::Revoke(p, conn)).map(drop)
    }

    fn add_acl_rule(&mut self, p: PortId, rule: AclRule) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::AddRule(p, rule)).map(drop)
    }

    fn clear_acl_rules(&mut self, p: PortId) -> Result<(), PlaneError> {
        self.on_owner(p, PlaneOp::ClearRules(p)).map(drop)
    }

    /// Every shard holds every translation (any input may carry the
    /// connection).
    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError> {
        self.shard_of(out)?;
        for s in &self.shards {
            s.op(PlaneOp::AddTranslation(conn, out))?;
        }
        Ok(())
    }

    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError> {
        let mut result = Ok(());
        for s in &self.shards {
            result = s.op(PlaneOp::RemoveTranslation(conn)).map(drop);
        }
        result
    }

    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError> {
        self.on_owner(output, PlaneOp::SetPolicy(output, policy))
            .map(drop)
    }

    fn counters(&mut self, p: PortId) -> Result<PortCounters, PlaneError> {
        match self.on_owner(p, PlaneOp::Counters(p))? {
            PlaneReply::Counters(c) => Ok(c),
            _ => Err(PlaneError::EngineGone),
        }
    }

    fn connection_counters(
        &mut self,
        p: PortId,
    ) -> Result<Vec<(ConnKey, ConnCounters)>, PlaneError> {
        match self.on_owner(p, PlaneOp::ConnCounters(p))? {
            PlaneReply::ConnCounters(c) => Ok(c),
            _ => Err(PlaneError::EngineGone),
        }
    }
}

/// Serves the control plane's batches until stopped.
fn control_loop(mut control: Control, mut inbox: PlaneInbox, stop: &AtomicBool) {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    while !stop.load(Ordering::Acquire) {
        inbox.serve(&mut control);
        if inbox.poll_pending(&mut cx).is_pending() {
            std::thread::park_timeout(Duration::from_millis(100));
        }
    }
}

/// Pins the calling thread to `cpu`; a refusal is logged, not fatal.
fn pin(cpu: usize) {
    // SAFETY: the set is a plain bitmask we own; sched_setaffinity reads it.
    let ok = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    };
    if !ok {
        tracing::warn!(cpu, error = %std::io::Error::last_os_error(), "cannot pin a shard");
    }
}

/// Starts an engine of `shards.shards` shard threads (and one control
/// thread, parked while nothing is asked of it), each waiting as `mode`
/// says. The handle programs it like a single engine's; ports go to the
/// shard running the fewest, and [`ForwardingPlane::move_port`] moves
/// them.
///
/// # Errors
/// When a thread cannot be started.
pub fn spawn_sharded(
    config: EngineConfig,
    shards: &ShardConfig,
    mode: RunMode,
) -> Result<EngineHandle, PlaneError> {
    let started = |e: std::io::Error| PlaneError::Unsupported {
        plane: "engine",
        what: if e.kind() == std::io::ErrorKind::OutOfMemory {
            "start a shard thread (out of memory)"
        } else {
            "start a shard thread"
        },
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut links = Vec::new();
    let mut joins = Vec::new();
    for k in 0..shards.shards.max(1) {
        let (ctx, crx) = channel();
        let (atx, arx) = channel();
        let shard = Shard::new(config.clone(), crx, atx);
        let stop = stop.clone();
        let cpu = (!shards.cpus.is_empty()).then(|| shards.cpus[k % shards.cpus.len()]);
        let join = std::thread::Builder::new()
            .name(format!("uniplane-shard{k}"))
            .spawn(move || {
                if let Some(cpu) = cpu {
                    pin(cpu);
                }
                shard.run(mode, &stop);
            })
            .map_err(started)?;
        links.push(ShardLink {
            commands: ctx,
            answers: arx,
            thread: join.thread().clone(),
            ports: 0,
        });
        joins.push(join);
    }
    let control = Control {
        owner: vec![None; config.max_ports],
        config,
        shards: links,
    };
    let mut threads: Vec<Thread> = joins.iter().map(|j| j.thread().clone()).collect();
    let (remote, inbox) = crate::remote::channel("engine", 64);
    let stop2 = stop.clone();
    let join = std::thread::Builder::new()
        .name("uniplane-ctl".into())
        .spawn(move || control_loop(control, inbox, &stop2))
        .map_err(started)?;
    threads.push(join.thread().clone());
    joins.push(join);
    Ok(EngineHandle {
        remote,
        stop,
        threads,
        join: Some(Arc::new(Joined::Many(joins))),
        inline: None,
    })
}
