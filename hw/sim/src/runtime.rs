//! The RTL as a running forwarding plane: what the host daemon holds when
//! it runs with `--plane rtl`.
//!
//! ```text
//!  user ── RingLink ──► input ring ──► RtlDevice input stream p ──┐
//!                                                                 │ uniplane_top
//!  user ◄── RingLink ◄── output ring ◄── staged ◄── output p ◄───┘ (Verilated)
//!                          (full: hold output p)
//!  daemon ── PlaneHandle::submit ──► PlaneInbox ──► register map (AXI-Lite)
//! ```
//!
//! [`RtlPlane`] owns a simulated [`RtlDevice`] and bridges each attached
//! port to a pair of rings: one pass ([`RtlPlane::step`]) serves the
//! control inbox, moves messages from every input ring into the device's
//! input stream of that RTL port (while fewer than [`FEED_BEATS`] beats
//! wait there; the rest stay in the ring, so a backed-up RTL input pushes
//! back on the sender), runs the clock for a batch of cycles while
//! anything moves, and hands the messages each output delivered to that
//! port's output ring. Nothing is dropped for congestion: when an output
//! ring is full, what the output delivered waits in a small staging queue
//! and the RTL output is held (ready low) until the ring has room, so the
//! backpressure reaches the RTL's queues and, through them, its inputs.
//!
//! [`RtlPlane::spawn`] runs it on a thread of its own, as
//! `Engine::spawn` runs the engine: busy-polling, or spinning then parking
//! with its waker on every ring and the inbox, so an idle plane costs no
//! CPU. The [`RtlPlaneHandle`] it returns is a `PlaneHandle` (async,
//! batched: the daemon's) and a blocking `ForwardingPlane` (tests, tools).
//!
//! Segmentation and reassembly are the bridge's, in software, as a NIC
//! driver would do them; the RTL carries every message as it came, whole
//! or segment, up to `Message::MAX_PAYLOAD` bytes of payload (the 16-bit
//! `msg_length`; the datapath counts lengths in 17 bits):
//!
//! - **Segmentation.** A message the RTL delivers to a port that does not
//!   reassemble (a tunnel) whose payload is above that port's MTU is cut
//!   with the overlay's [`segment`] before it enters the output ring, as
//!   the engine cuts it before its output queue. Segments pass through as
//!   they are. They count in that port's `segments` (the engine counts
//!   them on the port the message came in by, which the RTL's output does
//!   not tell).
//! - **Reassembly.** What the RTL delivers to an application or device
//!   port goes through a [`Reassembler`] (bounded bytes, timeout) before
//!   the output ring, as in the engine: whole messages and self-describing
//!   memory requests pass, segments wait for their message; what cannot
//!   be put back together is counted in the port's `reassembly` counters
//!   and never handed over as if whole.
//! - **The underlay** streams of `uniplane_top` are not bridged; this
//!   plane serves the overlay ports.
//!
//! The port counters' `tx_*` are the RTL's: what its output delivered,
//! before the bridge cut or joined it.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use uniplane_dataplane::ring::{ring_link, Consumer, Producer, RingLink};
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::{AclRule, ConnKey};
use uniplane_overlay::remote::{channel, PlaneFuture, PlaneHandle, PlaneInbox, PlaneRemote};
use uniplane_overlay::segment::{segment, Reassembler};
use uniplane_overlay::table::Route;
use uniplane_overlay::{
    EngineConfig, ForwardingPlane, PlaneError, PlaneOp, PlaneReply, PortCounters, PortDump, PortId,
    PortKind, PortSpec, RunMode,
};

use crate::device::RtlDevice;
use crate::sim::{Model, Stream};

/// Beats a port's RTL input stream may hold queued before the bridge
/// stops taking messages from its ring (one message is always taken
/// whole, so a long one may exceed it once).
pub const FEED_BEATS: usize = 64;

/// Cycles the clock keeps running after the last beat moved, so that
/// messages inside the pipeline (at most a few cycles from an output that
/// is not held) come out before the plane goes idle.
const QUIET_CYCLES: u64 = 256;

/// Sizes of a running RTL plane.
#[derive(Clone, Copy, Debug)]
pub struct RtlPlaneConfig {
    /// Which `uniplane_top` to simulate.
    pub model: Model,
    /// Messages each port ring holds, per direction.
    pub ring_depth: usize,
    /// Clock cycles one pass runs while anything moves.
    pub cycles_per_pass: u64,
    /// Payload bytes an application or device port holds for messages
    /// under reassembly.
    pub reassembly_bytes: usize,
    /// How long a segmented message may take to arrive whole.
    pub reassembly_timeout: Duration,
}

impl Default for RtlPlaneConfig {
    fn default() -> Self {
        RtlPlaneConfig {
            model: Model::N8,
            ring_depth: 256,
            cycles_per_pass: 64,
            reassembly_bytes: EngineConfig::default().reassembly_bytes,
            reassembly_timeout: EngineConfig::default().reassembly_timeout,
        }
    }
}

/// One attached port.
struct Attached {
    spec: PortSpec,
    input: Consumer<Message>,
    output: Producer<Message>,
    /// Largest payload a message leaving through the port carries.
    mtu: usize,
    /// Delivered by the RTL (cut or put back together), not yet in the
    /// output ring.
    staged: VecDeque<Message>,
    /// The RTL's counters when the port was attached (they are not reset
    /// in hardware; a port's counters start from here).
    base: PortCounters,
    /// Puts segments back together (application and device ports).
    reassembler: Option<Reassembler>,
    /// Segments cut for messages above `mtu`.
    segments: u64,
}

/// The RTL forwarding plane: a simulated `uniplane_top` with its overlay
/// ports bridged to rings. See the module documentation.
pub struct RtlPlane {
    dev: RtlDevice,
    config: RtlPlaneConfig,
    ports: Vec<Option<Attached>>,
    /// Ports an ordinary attach does not take: `Some(name)` is kept for
    /// the device port of that name (a kernel's), `Some("")` for nobody.
    reserved: Vec<Option<String>>,
    held: Vec<bool>,
    /// Control batches, once spawned.
    commands: Option<PlaneInbox>,
    /// Beats in and out of every port when the last pass ended.
    last_beats: u64,
    /// Cycles run since a beat last moved.
    quiet: u64,
    /// Time zero of the reassemblers' clocks.
    epoch: Instant,
}

impl RtlPlane {
    /// A plane on a fresh device of `config.model`, no port attached.
    pub fn new(config: RtlPlaneConfig) -> RtlPlane {
        let dev = RtlDevice::new(config.model);
        let n = dev.ports();
        let mut plane = RtlPlane {
            dev,
            config,
            ports: (0..n).map(|_| None).collect(),
            reserved: vec![None; n],
            held: vec![false; n],
            commands: None,
            last_beats: 0,
            quiet: QUIET_CYCLES,
            epoch: Instant::now(),
        };
        // No port is attached: routes to any of them miss, as in an
        // engine with no ports.
        for p in 0..n as PortId {
            let _ = plane.dev.set_port_live(p, false);
        }
        // The kernels' ports carry nothing on the host side: no ordinary
        // attach lands there.
        if let Some((echo, sum32)) = config.model.kernel_ports() {
            for p in [echo, sum32] {
                plane.reserved[p] = Some(String::new());
            }
        }
        plane
    }

    /// Keeps RTL port `port` for the device port named `name`: the
    /// attach of a [`PortKind::Device`] spec of that name lands there, and
    /// no other attach does. This is how a kernel of the RTL
    /// ([`Model::N8Kernels`]) becomes a device of the daemon: its port is
    /// attached under the device's name, and what the crossbar sends it
    /// is answered by the kernel itself.
    pub fn reserve(&mut self, port: PortId, name: &str) -> Result<(), PlaneError> {
        let slot = self
            .reserved
            .get_mut(port as usize)
            .ok_or(PlaneError::NoSuchPort(port))?;
        *slot = Some(name.to_owned());
        Ok(())
    }

    /// The simulated device (its registers, cycle count, counters).
    pub fn device(&mut self) -> &mut RtlDevice {
        &mut self.dev
    }

    /// RTL ports, attached or not.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    fn attached(&mut self, p: PortId) -> Result<&mut Attached, PlaneError> {
        self.ports
            .get_mut(p as usize)
            .and_then(Option::as_mut)
            .ok_or(PlaneError::NoSuchPort(p))
    }

    fn beats_moved(&self) -> u64 {
        (0..self.ports.len())
            .map(|p| self.dev.beats_in(Stream::Port, p) + self.dev.beats_out(Stream::Port, p))
            .sum()
    }

    /// One pass: control batches, inputs fed, the clock run while
    /// anything moves, outputs delivered. Returns the work done (messages
    /// moved, plus one while the RTL is still busy); 0 means idle.
    pub fn step(&mut self) -> usize {
        self.apply_commands();
        let mut fed = 0;
        for p in 0..self.ports.len() {
            let dev = &mut self.dev;
            let Some(a) = self.ports[p].as_mut() else {
                continue;
            };
            while dev.queued_beats(Stream::Port, p) < FEED_BEATS {
                let Some(m) = a.input.pop() else { break };
                dev.send(Stream::Port, p, &m);
                fed += 1;
            }
            a.input.release();
        }
        let mut work = fed;
        // The clock runs while beats move. When none moved for a while,
        // whatever is still inside waits for a held output, whose ring
        // wakes the plane when it has room.
        if fed > 0 || self.quiet < QUIET_CYCLES {
            self.dev.run(self.config.cycles_per_pass);
            work += 1;
        }
        let beats = self.beats_moved();
        if beats != self.last_beats {
            self.last_beats = beats;
            self.quiet = 0;
        } else {
            self.quiet = self.quiet.saturating_add(self.config.cycles_per_pass);
        }
        self.expire();
        work + self.deliver()
    }

    /// Abandons messages under reassembly whose segments stopped coming.
    fn expire(&mut self) {
        let now = self.epoch.elapsed();
        for a in self.ports.iter_mut().flatten() {
            let Some(r) = a.reassembler.as_mut().filter(|r| r.open() > 0) else {
                continue;
            };
            r.expire(now, |inc| {
                tracing::debug!(
                    port = %a.spec.name,
                    src = %inc.header.src,
                    seq = inc.header.seqnum,
                    received = inc.received,
                    "reassembly timed out"
                );
            });
        }
    }

    /// Moves what every output delivered into its ring; holds an output
    /// whose ring is full, releases it when the ring has room.
    fn deliver(&mut self) -> usize {
        let now = self.epoch.elapsed();
        let mut moved = 0;
        for p in 0..self.ports.len() {
            let delivered = self.dev.take_delivered(Stream::Port, p);
            let hold = match self.ports[p].as_mut() {
                // A detached port's leftovers have nowhere to go.
                None => false,
                Some(a) => {
                    for d in delivered {
                        a.take(d.message, now);
                    }
                    if a.output.is_closed() {
                        // Its user is gone: keep the RTL moving.
                        a.staged.clear();
                    }
                    while let Some(m) = a.staged.pop_front() {
                        if let Err(m) = a.output.push(m) {
                            a.staged.push_front(m);
                            break;
                        }
                        moved += 1;
                    }
                    a.output.flush();
                    !a.staged.is_empty()
                }
            };
            if hold != self.held[p] {
                self.held[p] = hold;
                self.dev.hold_output(Stream::Port, p, hold);
                if !hold {
                    // What waited behind the hold must come out now.
                    self.quiet = 0;
                }
            }
        }
        moved
    }

    fn apply_commands(&mut self) {
        if let Some(mut inbox) = self.commands.take() {
            inbox.serve(self);
            self.commands = Some(inbox);
        }
    }

    /// Whether a parked plane would sleep on work.
    fn has_work(&mut self) -> bool {
        if self.quiet < QUIET_CYCLES {
            return true;
        }
        for (p, a) in self.ports.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            if self.dev.queued_beats(Stream::Port, p) < FEED_BEATS && a.input.available() > 0 {
                return true;
            }
            if !a.staged.is_empty() && a.output.free() > 0 {
                return true;
            }
        }
        false
    }

    /// Registers the plane's waker on every ring it waits on and on the
    /// inbox; true when work turned up meanwhile.
    fn arm(&mut self, cx: &mut Context<'_>) -> bool {
        let mut ready = false;
        if let Some(c) = self.commands.as_ref() {
            ready |= c.poll_pending(cx).is_ready();
        }
        for (p, a) in self.ports.iter_mut().enumerate() {
            let Some(a) = a else { continue };
            // An input whose RTL stream is backed up waits for an output
            // to drain, not for its ring.
            if self.dev.queued_beats(Stream::Port, p) < FEED_BEATS {
                ready |= matches!(a.input.poll_available(cx), Poll::Ready(true));
            }
            if !a.staged.is_empty() {
                ready |= matches!(a.output.poll_ready(cx), Poll::Ready(Ok(())));
            }
        }
        ready || self.has_work()
    }

    /// Runs the plane on a thread of its own until the handle stops it.
    pub fn spawn(mut self, mode: RunMode) -> RtlPlaneHandle {
        let (remote, inbox) = channel("rtl", 64);
        self.commands = Some(inbox);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let join = std::thread::Builder::new()
            .name("uniplane-rtl".into())
            .spawn(move || self.run(mode, &stop2))
            .ok()
            .map(Arc::new);
        let thread = join.as_ref().map(|j| j.thread().clone());
        RtlPlaneHandle {
            remote,
            stop,
            thread,
            join,
        }
    }

    fn run(mut self, mode: RunMode, stop: &AtomicBool) -> RtlPlane {
        let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
        let mut cx = Context::from_waker(&waker);
        let mut idle = 0u32;
        while !stop.load(Ordering::Acquire) {
            if self.step() > 0 {
                idle = 0;
                continue;
            }
            idle = idle.saturating_add(1);
            match mode {
                RunMode::BusyPoll => std::hint::spin_loop(),
                RunMode::SpinThenPark { spins } => {
                    if idle < spins {
                        std::hint::spin_loop();
                        continue;
                    }
                    if self.arm(&mut cx) {
                        continue;
                    }
                    // Timed, as a guard; every ring and the inbox wake it.
                    std::thread::park_timeout(Duration::from_millis(100));
                    idle = 0;
                }
            }
        }
        // Whoever waits on a batch hears that the plane stopped.
        self.commands = None;
        self
    }

    /// Runs the clock until output `p` delivered nothing for
    /// `QUIET_CYCLES` cycles (at most 64 Ki cycles), discarding it.
    fn drain_output(&mut self, p: usize) {
        self.dev.hold_output(Stream::Port, p, false);
        self.held[p] = false;
        let mut last = self.dev.beats_out(Stream::Port, p);
        let mut still = 0;
        for _ in 0..(64 * 1024 / self.config.cycles_per_pass.max(1)) {
            self.dev.run(self.config.cycles_per_pass);
            let now = self.dev.beats_out(Stream::Port, p);
            if now == last {
                still += self.config.cycles_per_pass;
                if still >= QUIET_CYCLES {
                    break;
                }
            } else {
                still = 0;
                last = now;
            }
        }
        self.dev.take_delivered(Stream::Port, p);
    }
}

impl Attached {
    /// Takes one message the RTL delivered to this port into `staged`:
    /// put back together for a port that reassembles, cut to the MTU for
    /// one that does not.
    fn take(&mut self, m: Message, now: Duration) {
        if let Some(r) = self.reassembler.as_mut() {
            if let Some(whole) = r.push(m, now) {
                self.staged.push_back(whole);
            }
            return;
        }
        let staged = &mut self.staged;
        let n = segment(m, self.mtu, |s| staged.push_back(s));
        if n > 1 {
            self.segments += n as u64;
        }
    }
}

/// `now - base`, field by field.
fn since(now: PortCounters, base: PortCounters) -> PortCounters {
    PortCounters {
        rx_msgs: now.rx_msgs.saturating_sub(base.rx_msgs),
        rx_bytes: now.rx_bytes.saturating_sub(base.rx_bytes),
        tx_msgs: now.tx_msgs.saturating_sub(base.tx_msgs),
        tx_bytes: now.tx_bytes.saturating_sub(base.tx_bytes),
        acl_denied: now.acl_denied.saturating_sub(base.acl_denied),
        no_route: now.no_route.saturating_sub(base.no_route),
        error_answers: now.error_answers.saturating_sub(base.error_answers),
        unanswerable: now.unanswerable.saturating_sub(base.unanswerable),
        segments: 0,
        input_stalls: now.input_stalls.saturating_sub(base.input_stalls),
        reassembly: Default::default(),
    }
}

impl ForwardingPlane for RtlPlane {
    fn kind(&self) -> &'static str {
        "rtl"
    }

    /// Attaches `spec` to the lowest free RTL port that is not reserved,
    /// or, for a device port, to the free port reserved for its name
    /// ([`RtlPlane::reserve`]). Messages leaving through it are cut to its
    /// MTU (a tunnel) or put back together (an application or device) by
    /// the bridge.
    fn attach(&mut self, spec: PortSpec) -> Result<(PortId, RingLink), PlaneError> {
        let kept = |p: usize| {
            spec.kind == PortKind::Device && self.reserved[p].as_deref() == Some(spec.name.as_str())
        };
        let free = |p: &usize| self.ports[*p].is_none();
        let slot = (0..self.ports.len())
            .filter(free)
            .find(|&p| kept(p))
            .or_else(|| {
                (0..self.ports.len())
                    .filter(free)
                    .find(|&p| self.reserved[p].is_none())
            })
            .ok_or(PlaneError::TooManyPorts(self.ports.len()))?;
        let p = slot as PortId;
        let base = self.dev.counters(p)?;
        self.dev.set_port_live(p, true)?;
        let (link, rings) = ring_link(self.config.ring_depth);
        let reassembler = spec.kind.reassembles().then(|| {
            Reassembler::new(self.config.reassembly_bytes, self.config.reassembly_timeout)
        });
        self.ports[slot] = Some(Attached {
            mtu: spec.mtu.clamp(1, Message::MAX_PAYLOAD),
            spec,
            input: rings.input,
            output: rings.output,
            staged: VecDeque::new(),
            base,
            reassembler,
            segments: 0,
        });
        Ok((p, link))
    }

    /// Detaches `port`: what its user had not yet sent is dropped, its
    /// tables, rules, connections, translator entries and policy are
    /// cleared in the RTL, routes naming it elsewhere answer NO_ROUTE
    /// until removed, and what was queued for it is run out and
    /// discarded, so the next port attached there starts clean.
    fn detach(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        let counters = self.counters(port)?;
        let p = port as usize;
        self.ports[p] = None;
        self.dev.discard_queued(Stream::Port, p);
        self.dev.set_port_live(port, false)?;
        self.dev.clear_port(port)?;
        self.drain_output(p);
        self.quiet = 0;
        Ok(counters)
    }

    /// The port's tables read back from the RTL (see `RtlDevice`'s
    /// `dump` for what comes from the driver's shadow); name and kind are
    /// the runtime's record of the attach, counters count from the attach.
    fn dump(&mut self, port: PortId) -> Result<PortDump, PlaneError> {
        let counters = self.counters(port)?;
        let a = self.attached(port)?;
        let (name, kind) = (a.spec.name.clone(), a.spec.kind);
        let mut d = self.dev.dump(port)?;
        d.name = name;
        d.kind = Some(kind);
        d.counters = counters;
        Ok(d)
    }

    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError> {
        self.dev.translations()
    }

    fn add_route(&mut self, port: PortId, route: Route) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.add_route(port, route)
    }

    fn remove_route(&mut self, port: PortId, key: Uid, mask: u64) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.remove_route(port, key, mask)
    }

    fn set_default_route(&mut self, port: PortId, out: Option<PortId>) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.set_default_route(port, out)
    }

    fn allow_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.allow_connection(port, conn)
    }

    fn revoke_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.revoke_connection(port, conn)
    }

    fn add_acl_rule(&mut self, port: PortId, rule: AclRule) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.add_acl_rule(port, rule)
    }

    fn clear_acl_rules(&mut self, port: PortId) -> Result<(), PlaneError> {
        self.attached(port)?;
        self.dev.clear_acl_rules(port)
    }

    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError> {
        self.attached(out)?;
        self.dev.add_translation(conn, out)
    }

    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError> {
        self.dev.remove_translation(conn)
    }

    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError> {
        self.attached(output)?;
        self.dev.set_policy(output, policy)
    }

    fn counters(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        let a = self.attached(port)?;
        let base = a.base;
        let segments = a.segments;
        let reassembly = a.reassembler.as_ref().map(Reassembler::stats);
        let mut c = since(self.dev.counters(port)?, base);
        c.segments = segments;
        c.reassembly = reassembly.unwrap_or_default();
        Ok(c)
    }
}

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

/// Controls an [`RtlPlane`] running on its own thread. Cloning is cheap;
/// every clone talks to the same plane. As a [`PlaneHandle`] (kind `rtl`)
/// it submits batches without blocking (what a daemon uses); as a
/// [`ForwardingPlane`] each call parks the caller until the plane applied
/// it (tests, tools — never on an async runtime).
#[derive(Clone)]
pub struct RtlPlaneHandle {
    remote: PlaneRemote,
    stop: Arc<AtomicBool>,
    thread: Option<Thread>,
    join: Option<Arc<JoinHandle<RtlPlane>>>,
}

impl RtlPlaneHandle {
    fn op(&self, op: PlaneOp) -> Result<PlaneReply, PlaneError> {
        self.remote.apply_blocking(op)
    }

    /// The asynchronous, batched handle of this plane.
    pub fn remote(&self) -> PlaneRemote {
        self.remote.clone()
    }

    /// Stops the plane's thread and waits for it; returns the plane (its
    /// device, with its counters) when this was the last handle holding
    /// the thread.
    pub fn stop(mut self) -> Option<RtlPlane> {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = &self.thread {
            t.unpark();
        }
        let join = Arc::into_inner(self.join.take()?)?;
        join.join().ok()
    }
}

impl PlaneHandle for RtlPlaneHandle {
    fn kind(&self) -> &'static str {
        "rtl"
    }

    fn submit(&self, ops: Vec<PlaneOp>) -> PlaneFuture {
        self.remote.submit(ops)
    }
}

fn done(r: PlaneReply) -> Result<(), PlaneError> {
    match r {
        PlaneReply::Done => Ok(()),
        _ => Err(PlaneError::EngineGone),
    }
}

fn counters(r: PlaneReply) -> Result<PortCounters, PlaneError> {
    match r {
        PlaneReply::Counters(c) => Ok(c),
        _ => Err(PlaneError::EngineGone),
    }
}

impl ForwardingPlane for RtlPlaneHandle {
    fn kind(&self) -> &'static str {
        "rtl"
    }
    fn attach(&mut self, spec: PortSpec) -> Result<(PortId, RingLink), PlaneError> {
        self.op(PlaneOp::Attach(spec))?
            .into_attached()
            .ok_or(PlaneError::EngineGone)
    }
    fn detach(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        counters(self.op(PlaneOp::Detach(port))?)
    }
    fn dump(&mut self, port: PortId) -> Result<PortDump, PlaneError> {
        match self.op(PlaneOp::Dump(port))? {
            PlaneReply::Dump(d) => Ok(*d),
            _ => Err(PlaneError::EngineGone),
        }
    }
    fn translations(&mut self) -> Result<Vec<(ConnKey, PortId)>, PlaneError> {
        match self.op(PlaneOp::Translations)? {
            PlaneReply::Translations(t) => Ok(t),
            _ => Err(PlaneError::EngineGone),
        }
    }
    fn add_route(&mut self, port: PortId, route: Route) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::AddRoute(port, route))?)
    }
    fn remove_route(&mut self, port: PortId, key: Uid, mask: u64) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::RemoveRoute(port, key, mask))?)
    }
    fn set_default_route(&mut self, port: PortId, out: Option<PortId>) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::SetDefault(port, out))?)
    }
    fn allow_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::Allow(port, conn))?)
    }
    fn revoke_connection(&mut self, port: PortId, conn: ConnKey) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::Revoke(port, conn))?)
    }
    fn add_acl_rule(&mut self, port: PortId, rule: AclRule) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::AddRule(port, rule))?)
    }
    fn clear_acl_rules(&mut self, port: PortId) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::ClearRules(port))?)
    }
    fn add_translation(&mut self, conn: ConnKey, out: PortId) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::AddTranslation(conn, out))?)
    }
    fn remove_translation(&mut self, conn: ConnKey) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::RemoveTranslation(conn))?)
    }
    fn set_policy(&mut self, output: PortId, policy: Policy) -> Result<(), PlaneError> {
        done(self.op(PlaneOp::SetPolicy(output, policy))?)
    }
    fn counters(&mut self, port: PortId) -> Result<PortCounters, PlaneError> {
        counters(self.op(PlaneOp::Counters(port))?)
    }
}
