//! The underlay of the tunnels to one peer server (DUA §7.3), in the data
//! path: one task per peer carries every tunnel to it.
//!
//! ```text
//!  engine port of class 0 ─┐                                  ┌─► tunnel link, class 0
//!  engine port of class 1 ─┼─► queue per class ─► scheduler ─► shaper ─┼─► tunnel link, class 1
//!                          …                                  …
//!  tunnel links ─► filter (sources, types, length, windows) ─► their engine ports
//!                    └─ violation: dropped, counted, reported to the control core
//! ```
//!
//! Egress: what the engine sends into a tunnel waits in its class's
//! queue of the peer's [`InterfaceMux`]; the scheduler (weighted by class,
//! or strict priority) picks the next message and the token bucket says
//! when it may leave, so the classes share the peer's rate as configured,
//! and the weights change live. A full queue stops reading the engine's
//! port (the engine holds the rest: nothing is dropped).
//!
//! Ingress: every message from a tunnel passes the peer's
//! [`FilterRules`] or is dropped, counted by reason, and reported; the
//! control core closes the connection it claimed to belong to.
//!
//! Each tunnel is watched as a lone bridge was: one that owes messages and
//! takes none for the failure timeout has failed; what it owed, and what
//! waited for it in its queue, is answered `PeerFailed` to the senders.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::{BoxLink, Link, Message, Pump, Uid};
use uniplane_overlay::PortId;
use uniplane_underlay::{
    AddressWindow, FilterRules, InterfaceMux, MuxConfig, Reason, ShaperConfig, TypeSet, UidMatch,
    Violation,
};

use crate::config::{IngressRules, Scheduling, UnderlayConfig, MAX_CLASSES};

/// Queues of a peer's multiplexer: one per class for the tunnels we
/// opened, then one per class for the tunnels it opened.
const SLOTS: usize = 2 * MAX_CLASSES;
/// Messages dequeued for one tunnel and not yet taken by its link.
const OUT_BATCH: usize = 64;
/// Rounds of work before the task lets others run.
const ROUNDS: usize = 32;

/// What the driver asks of a peer's underlay.
pub(super) enum Command {
    /// Carry a tunnel: `link` to the peer, `ring` its engine port.
    Add {
        port: PortId,
        class: u8,
        /// The peer opened it (else we did).
        inbound: bool,
        link: BoxLink,
        ring: RingLink,
    },
    /// Stop carrying the tunnel at `port` (the core dropped it).
    Remove { port: PortId },
    /// New weights, priorities or rate.
    Shape(Shape),
}

/// What a peer's underlay tells the driver.
#[derive(Debug)]
pub(super) enum Report {
    /// A message broke the filter's rules and was dropped.
    Violation {
        src: Uid,
        dst: Uid,
        ports: Option<(u16, u16)>,
        violation: Violation,
    },
    /// The tunnel at `port` ended (`error`: it failed; `answered`
    /// requests were answered `PeerFailed`).
    Ended {
        port: PortId,
        error: Option<String>,
        answered: usize,
    },
}

/// How the classes share the peer's tunnels.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Shape {
    pub policy: Policy,
    pub shaper: Option<ShaperConfig>,
}

impl Shape {
    /// The shape `config` describes. A class not configured keeps weight
    /// 1 (no connection can name it, so its queue stays empty).
    pub fn of(config: &UnderlayConfig) -> Shape {
        let class_of = |slot: usize| config.class((slot % MAX_CLASSES) as u8);
        let weights: Vec<u32> = (0..SLOTS)
            .map(|s| class_of(s).map_or(1, |c| c.weight))
            .collect();
        let policy = match config.scheduling {
            Scheduling::Weighted => Policy::Weighted(weights),
            Scheduling::Priority => Policy::StrictPriority {
                class: (0..SLOTS)
                    .map(|s| class_of(s).map_or(u8::MAX, |c| c.priority))
                    .collect(),
                weights,
            },
        };
        Shape {
            policy,
            shaper: config
                .rate
                .map(|rate| ShaperConfig::new(rate, config.burst)),
        }
    }
}

/// A peer's underlay counters, updated once per batch.
#[derive(Default, Debug)]
pub(super) struct Counters {
    /// Messages and bytes that left through the multiplexer.
    pub sent: AtomicU64,
    pub sent_bytes: AtomicU64,
    /// Messages that passed the filter.
    pub passed: AtomicU64,
    /// Messages the filter dropped, by [`Reason::ALL`]'s order.
    pub dropped: [AtomicU64; 4],
    /// Violations not reported because the driver's queue was full.
    pub lost_reports: AtomicU64,
    /// Tunnels carried now.
    pub tunnels: AtomicU64,
    /// Messages waiting in the class queues now.
    pub backlog: AtomicU64,
}

impl Counters {
    /// Messages the filter dropped.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().map(|c| c.load(Relaxed)).sum()
    }
}

/// The filter rules of `ingress`.
pub(super) fn filter_rules(ingress: &IngressRules) -> FilterRules {
    let types = match &ingress.types {
        None => TypeSet::ALL,
        Some(list) => list.iter().fold(TypeSet::EMPTY, |set, t| set.with(*t)),
    };
    FilterRules {
        sources: ingress
            .sources
            .iter()
            .map(|p| UidMatch::new(p.key, p.mask))
            .collect(),
        max_len: ingress.max_message,
        types,
        windows: vec![AddressWindow::everything(UidMatch::ANY)],
    }
}

/// The handle the driver keeps for a peer's underlay.
pub(super) struct Handle {
    pub commands: mpsc::Sender<Command>,
    pub counters: Arc<Counters>,
}

/// Starts the underlay of one peer. `stall`: how long a tunnel that owes
/// messages may take none before it has failed.
pub(super) fn spawn(
    rules: FilterRules,
    shape: Shape,
    queue_depth: usize,
    stall: Duration,
    reports: mpsc::Sender<Report>,
) -> Result<Handle, String> {
    let (commands, rx) = mpsc::channel(256);
    let counters = Arc::new(Counters::default());
    let mut underlay = Underlay::new(rules, shape, queue_depth, stall, reports, counters.clone())?;
    tokio::spawn(async move {
        let mut rx = rx;
        poll_fn(|cx| underlay.poll(cx, &mut rx)).await;
        underlay.close().await;
    });
    Ok(Handle { commands, counters })
}

struct Tunnel {
    port: PortId,
    slot: usize,
    link: BoxLink,
    ring: RingLink,
    /// Link → engine port, through the filter.
    inn: Pump,
    /// Multiplexer → link.
    out: Pump,
    /// Read from the engine port, not yet in its queue.
    held: Vec<Message>,
    /// Set while it owes messages and takes none.
    stalled: Option<Pin<Box<Sleep>>>,
}

struct Underlay {
    mux: InterfaceMux,
    rules: FilterRules,
    tunnels: Vec<Tunnel>,
    reports: mpsc::Sender<Report>,
    counters: Arc<Counters>,
    origin: Instant,
    /// Wakes the task when the shaper lets the next message go.
    shaper_wake: Option<Pin<Box<Sleep>>>,
    stall: Duration,
    scratch: Vec<Message>,
    /// Counts not yet published.
    passed: u64,
    dropped: [u64; 4],
    sent: u64,
    sent_bytes: u64,
}

impl Underlay {
    fn new(
        rules: FilterRules,
        shape: Shape,
        queue_depth: usize,
        stall: Duration,
        reports: mpsc::Sender<Report>,
        counters: Arc<Counters>,
    ) -> Result<Underlay, String> {
        let mux = InterfaceMux::new(MuxConfig {
            policy: shape.policy,
            shaper: shape.shaper,
            ..MuxConfig::new(SLOTS, queue_depth)
        })
        .map_err(|e| e.to_string())?;
        Ok(Underlay {
            mux,
            rules,
            tunnels: Vec::new(),
            reports,
            counters,
            origin: Instant::now(),
            shaper_wake: None,
            stall,
            scratch: Vec::with_capacity(OUT_BATCH),
            passed: 0,
            dropped: [0; 4],
            sent: 0,
            sent_bytes: 0,
        })
    }

    fn now(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    /// Runs until the driver drops its handle.
    fn poll(&mut self, cx: &mut Context<'_>, rx: &mut mpsc::Receiver<Command>) -> Poll<()> {
        for _ in 0..ROUNDS {
            loop {
                match rx.poll_recv(cx) {
                    Poll::Ready(Some(c)) => self.command(c),
                    Poll::Ready(None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            let progress = self.round(cx);
            self.publish();
            if !progress {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn command(&mut self, c: Command) {
        match c {
            Command::Add {
                port,
                class,
                inbound,
                link,
                ring,
            } => {
                let slot = usize::from(class) % MAX_CLASSES + if inbound { MAX_CLASSES } else { 0 };
                if let Some(i) = self.tunnels.iter().position(|t| t.slot == slot) {
                    // A tunnel of the same class and side again: the old
                    // one is stale.
                    self.fail(i, Some("replaced by a new tunnel".into()));
                }
                self.tunnels.push(Tunnel {
                    port,
                    slot,
                    link,
                    ring,
                    inn: Pump::default(),
                    out: Pump::default(),
                    held: Vec::new(),
                    stalled: None,
                });
            }
            Command::Remove { port } => {
                if let Some(i) = self.tunnels.iter().position(|t| t.port == port) {
                    let t = self.tunnels.swap_remove(i);
                    self.answer_owed(t, None, false);
                }
            }
            Command::Shape(shape) => {
                let now = self.now();
                if let Err(e) = self.mux.set_policy(shape.policy) {
                    tracing::warn!("underlay: {e}");
                }
                if let Err(e) = self.mux.set_shaper(shape.shaper, now) {
                    tracing::warn!("underlay: {e}");
                }
                self.shaper_wake = None;
            }
        }
    }

    /// One pass over every tunnel; true when anything moved.
    fn round(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progress = false;
        let now = self.now();
        let mut i = 0;
        while i < self.tunnels.len() {
            match self.serve(cx, i, now) {
                Ok(moved) => {
                    progress |= moved;
                    i += 1;
                }
                Err(error) => {
                    self.fail(i, error);
                    progress = true;
                }
            }
        }
        progress |= self.dequeue(now);
        let mut i = 0;
        while i < self.tunnels.len() {
            match self.deliver(cx, i) {
                Ok(moved) => {
                    progress |= moved;
                    i += 1;
                }
                Err(e) => {
                    self.fail(i, Some(e));
                    progress = true;
                }
            }
        }
        if self.wait_for_shaper(cx, now) {
            progress = true;
        }
        progress
    }

    /// Ingress through the filter, and the engine's egress into the
    /// tunnel's queue. `Err`: the tunnel ended (with the error, if any).
    fn serve(&mut self, cx: &mut Context<'_>, i: usize, now: u64) -> Result<bool, Option<String>> {
        let Underlay {
            mux,
            rules,
            tunnels,
            reports,
            counters,
            scratch,
            passed,
            dropped,
            ..
        } = self;
        let t = &mut tunnels[i];
        let keep = |m: &Message| match rules.check(m) {
            Ok(()) => {
                *passed += 1;
                true
            }
            Err(violation) => {
                let reason = violation.reason();
                if let Some(k) = Reason::ALL.iter().position(|r| *r == reason) {
                    dropped[k] += 1;
                }
                let h = m.header();
                let report = Report::Violation {
                    src: h.src,
                    dst: h.dst,
                    ports: h.request.ports(),
                    violation,
                };
                if reports.try_send(report).is_err() {
                    counters.lost_reports.fetch_add(1, Relaxed);
                }
                false
            }
        };
        let mut moved = t
            .inn
            .poll_filtered(cx, &mut t.link, &mut t.ring, keep)
            .map_err(|e| Some(e.to_string()))?;
        if t.inn.ended() {
            return Err(None);
        }
        // The engine's egress: as much as the class's queue has room for.
        loop {
            while let Some(m) = t.held.pop() {
                if let Err(e) = mux.offer(t.slot, m, now) {
                    match e.into_message() {
                        Some(m) => t.held.push(m),
                        None => continue,
                    }
                    return Ok(moved);
                }
                moved = true;
            }
            let room = mux.free(t.slot).min(OUT_BATCH);
            if room == 0 {
                return Ok(moved);
            }
            scratch.clear();
            match t.ring.poll_recv_batch(cx, scratch, room) {
                Poll::Ready(Ok(0)) => return Err(None),
                Poll::Ready(Ok(_)) => {
                    // Offered in order: `held` is a stack.
                    t.held.extend(scratch.drain(..).rev());
                }
                Poll::Ready(Err(e)) => return Err(Some(e.to_string())),
                Poll::Pending => return Ok(moved),
            }
        }
    }

    /// Takes from the multiplexer what the scheduler and the shaper let
    /// go, into the tunnels' outgoing batches.
    fn dequeue(&mut self, now: u64) -> bool {
        // Until one tunnel's batch is full: its link must take it first.
        if self.tunnels.iter().any(|t| t.out.owed() >= OUT_BATCH) {
            return false;
        }
        let mut by_slot = [usize::MAX; SLOTS];
        for (i, t) in self.tunnels.iter().enumerate() {
            by_slot[t.slot] = i;
        }
        let mut moved = false;
        while let Some((slot, m)) = self.mux.dequeue_tagged(now) {
            moved = true;
            self.sent += 1;
            self.sent_bytes += m.encoded_len() as u64;
            // Only a tunnel's own messages are in its queue, and its queue
            // is emptied when it goes.
            let Some(t) = self.tunnels.get_mut(by_slot[slot]) else {
                tracing::error!(slot, "underlay: a message for no tunnel");
                continue;
            };
            t.out.queue().push_back(m);
            if t.out.owed() >= OUT_BATCH {
                break;
            }
        }
        moved
    }

    /// Hands a tunnel's batch to its link, watching for a stall.
    fn deliver(&mut self, cx: &mut Context<'_>, i: usize) -> Result<bool, String> {
        let stall = self.stall;
        let t = &mut self.tunnels[i];
        let moved = t
            .out
            .poll_deliver(cx, &mut t.link)
            .map_err(|e| e.to_string())?;
        if moved || (t.out.owed() == 0 && t.out.flushed()) {
            t.stalled = None;
        } else {
            let timer = t
                .stalled
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(stall)));
            if timer.as_mut().poll(cx).is_ready() {
                return Err(format!(
                    "the tunnel took nothing for {stall:?} with {} messages owed",
                    t.out.owed()
                ));
            }
        }
        Ok(moved)
    }

    /// Arms the shaper's timer when it holds the next message back; true
    /// when it has already expired.
    fn wait_for_shaper(&mut self, cx: &mut Context<'_>, now: u64) -> bool {
        match self.mux.next_ready(now) {
            Some(at) if at > now => {
                let deadline = self.origin + Duration::from_nanos(at);
                let timer = self
                    .shaper_wake
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.deadline() != deadline {
                    timer.as_mut().reset(deadline);
                }
                if timer.as_mut().poll(cx).is_ready() {
                    self.shaper_wake = None;
                    return true;
                }
                false
            }
            _ => {
                self.shaper_wake = None;
                false
            }
        }
    }

    /// The tunnel at `i` ended: what it owed is answered, and the driver
    /// told.
    fn fail(&mut self, i: usize, error: Option<String>) {
        let t = self.tunnels.swap_remove(i);
        match &error {
            Some(e) => tracing::warn!(port = t.port, "tunnel failed: {e}"),
            None => tracing::debug!(port = t.port, "tunnel ended"),
        }
        self.answer_owed(t, error, true);
    }

    /// Answers `PeerFailed` to every request the tunnel owed or held in
    /// its queue, off this task (the engine may be slow to take them).
    fn answer_owed(&mut self, mut t: Tunnel, error: Option<String>, report: bool) {
        let mut owed: Vec<Message> = t.out.take_owed().into_iter().collect();
        self.mux.drain_queue(t.slot, &mut owed);
        owed.extend(t.held.drain(..).rev());
        self.publish();
        let reports = self.reports.clone();
        let port = t.port;
        tokio::spawn(async move {
            let answered = if owed.is_empty() {
                0
            } else {
                super::watch::drain(owed, &mut t.ring).await
            };
            drop(t.link);
            if report {
                let _ = reports
                    .send(Report::Ended {
                        port,
                        error,
                        answered,
                    })
                    .await;
            }
        });
    }

    /// Publishes the counts of the last round.
    fn publish(&mut self) {
        let c = &self.counters;
        if self.sent > 0 {
            c.sent.fetch_add(std::mem::take(&mut self.sent), Relaxed);
            c.sent_bytes
                .fetch_add(std::mem::take(&mut self.sent_bytes), Relaxed);
        }
        if self.passed > 0 {
            c.passed
                .fetch_add(std::mem::take(&mut self.passed), Relaxed);
        }
        for (k, n) in self.dropped.iter_mut().enumerate() {
            if *n > 0 {
                c.dropped[k].fetch_add(std::mem::take(n), Relaxed);
            }
        }
        c.tunnels.store(self.tunnels.len() as u64, Relaxed);
        c.backlog.store(self.mux.backlog() as u64, Relaxed);
    }

    /// The driver is gone: every tunnel ends.
    async fn close(mut self) {
        while !self.tunnels.is_empty() {
            let t = self.tunnels.swap_remove(0);
            self.answer_owed(t, None, false);
        }
    }
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("port", &self.port)
            .field("slot", &self.slot)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use uniplane_dataplane::channel::{pair, ChannelLink};
    use uniplane_dataplane::ring::{ring_link, RingPort};
    use uniplane_dataplane::wire::Status;
    use uniplane_dataplane::Endpoint;

    const US: &str = "10.0.0.1";
    const PEER: &str = "10.0.0.2";

    fn msg(from: &str, to: &str, port: u16, len: usize) -> Message {
        Message::send(
            Endpoint {
                uid: format!("{from}:5").parse().unwrap(),
                port,
            },
            Endpoint {
                uid: format!("{to}:1").parse().unwrap(),
                port: 7,
            },
            Bytes::from(vec![7; len]),
        )
        .unwrap()
    }

    fn rules() -> FilterRules {
        FilterRules {
            sources: vec![UidMatch::server(PEER.parse().unwrap())],
            max_len: 1024,
            ..FilterRules::allow_all()
        }
    }

    fn shape(weights: [u32; 2], rate: Option<u64>) -> Shape {
        let mut w = vec![1; SLOTS];
        w[..2].copy_from_slice(&weights);
        Shape {
            policy: Policy::Weighted(w),
            shaper: rate.map(|r| ShaperConfig::new(r, 64 * 1024)),
        }
    }

    /// A tunnel of `class` we opened: (its far end, the engine's side).
    async fn tunnel(h: &Handle, port: PortId, class: u8, cap: usize) -> (ChannelLink, RingPort) {
        let (link, far) = pair(cap);
        let (ring, engine) = ring_link(2048);
        h.commands
            .send(Command::Add {
                port,
                class,
                inbound: false,
                link: Box::new(link),
                ring,
            })
            .await
            .unwrap();
        (far, engine)
    }

    /// What waits at `link` now.
    async fn take(link: &mut ChannelLink) -> Vec<Message> {
        let mut got = Vec::new();
        loop {
            let before = got.len();
            let _ = poll_fn(|cx| match link.poll_recv_batch(cx, &mut got, 1024) {
                Poll::Pending => Poll::Ready(Ok(0)),
                other => other,
            })
            .await;
            if got.len() == before {
                return got;
            }
        }
    }

    fn bytes(msgs: &[Message]) -> u64 {
        msgs.iter().map(|m| m.encoded_len() as u64).sum()
    }

    /// Two classes, weights 1 and 3, both backlogged behind a 1 MB/s
    /// shaper (on paused time): the bytes that leave split 1:3 and total
    /// the rate; a live change to 1:1 splits the next interval evenly.
    #[tokio::test(start_paused = true)]
    async fn classes_share_a_shaped_peer_by_their_weights_and_the_weights_change_live() {
        let (reports, _rx) = mpsc::channel(64);
        let rate = 1_000_000;
        let h = spawn(
            rules(),
            shape([1, 3], Some(rate)),
            2048,
            Duration::from_secs(5),
            reports,
        )
        .unwrap();
        let (mut far0, mut e0) = tunnel(&h, 1, 0, 4096).await;
        let (mut far1, mut e1) = tunnel(&h, 2, 1, 4096).await;
        for _ in 0..1500 {
            e0.output.push(msg(US, PEER, 1, 968)).unwrap();
            e1.output.push(msg(US, PEER, 2, 968)).unwrap();
        }
        e0.output.flush();
        e1.output.flush();
        // The first burst leaves at once; measure after it.
        tokio::time::sleep(Duration::from_millis(10)).await;
        take(&mut far0).await;
        take(&mut far1).await;
        let interval = Duration::from_millis(500);
        tokio::time::sleep(interval).await;
        let (a, b) = (bytes(&take(&mut far0).await), bytes(&take(&mut far1).await));
        let share = b as f64 / (a + b) as f64;
        assert!(
            (share - 0.75).abs() < 0.02,
            "class 1 got {share:.3} of {}",
            a + b
        );
        let want = rate as f64 * interval.as_secs_f64();
        let total = (a + b) as f64;
        assert!(
            (total - want).abs() / want < 0.02,
            "{total} bytes in {interval:?}, want {want}"
        );

        h.commands
            .send(Command::Shape(shape([1, 1], Some(rate))))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(10)).await;
        take(&mut far0).await;
        take(&mut far1).await;
        tokio::time::sleep(interval).await;
        let (a, b) = (bytes(&take(&mut far0).await), bytes(&take(&mut far1).await));
        let share = b as f64 / (a + b) as f64;
        assert!(
            (share - 0.5).abs() < 0.02,
            "after the change class 1 got {share:.3}"
        );
        assert!(
            h.counters.backlog.load(Relaxed) > 0,
            "both classes stayed backlogged"
        );
    }

    /// A message that breaks the rules (too long; from a server the peer
    /// may not carry) is dropped, counted by reason and reported with the
    /// connection it claimed; the others reach the engine.
    #[tokio::test]
    async fn a_message_that_breaks_the_rules_is_dropped_counted_and_reported() {
        let (reports, mut rx) = mpsc::channel(64);
        let h = spawn(
            rules(),
            shape([1, 1], None),
            256,
            Duration::from_secs(5),
            reports,
        )
        .unwrap();
        let (mut far, mut engine) = tunnel(&h, 1, 0, 64).await;
        use futures_util::SinkExt;
        far.send(msg(PEER, US, 40, 10)).await.unwrap();
        far.send(msg(PEER, US, 41, 2000)).await.unwrap();
        far.send(msg("10.0.0.9", US, 42, 10)).await.unwrap();
        far.send(msg(PEER, US, 43, 10)).await.unwrap();
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while got.len() < 2 {
            assert!(
                Instant::now() < deadline,
                "the good messages did not arrive"
            );
            engine.input.pop_into(&mut got, 8);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let ports: Vec<_> = got
            .iter()
            .map(|m| m.header().request.ports().unwrap().0)
            .collect();
        assert_eq!(ports, [40, 43]);
        let mut seen = Vec::new();
        for _ in 0..2 {
            match tokio::time::timeout(Duration::from_secs(10), rx.recv())
                .await
                .unwrap()
                .unwrap()
            {
                Report::Violation {
                    ports,
                    violation,
                    src,
                    ..
                } => seen.push((src.server().to_string(), ports, violation.reason())),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(
            seen,
            [
                (PEER.to_string(), Some((41, 7)), Reason::TooLong),
                ("10.0.0.9".to_string(), Some((42, 7)), Reason::SourceDenied),
            ]
        );
        assert_eq!(h.counters.dropped_total(), 2);
        assert_eq!(h.counters.passed.load(Relaxed), 2);
    }

    /// A tunnel that stops taking messages fails after the stall time (on
    /// paused time); every request it owed is answered PeerFailed to its
    /// sender, and the driver is told.
    #[tokio::test(start_paused = true)]
    async fn a_stalled_tunnel_fails_and_answers_what_it_owed() {
        let (reports, mut rx) = mpsc::channel(64);
        let h = spawn(
            rules(),
            shape([1, 1], None),
            256,
            Duration::from_millis(300),
            reports,
        )
        .unwrap();
        // The tunnel: a channel of capacity 4 nobody reads.
        let (_far, mut engine) = tunnel(&h, 9, 0, 4).await;
        for _ in 0..20 {
            engine.output.push(msg(US, PEER, 1, 8)).unwrap();
        }
        engine.output.flush();
        match rx.recv().await.unwrap() {
            Report::Ended {
                port,
                error,
                answered,
            } => {
                assert_eq!(port, 9);
                assert!(error.unwrap().contains("took nothing"));
                // 4 went into the tunnel; 16 come back as errors.
                assert_eq!(answered, 16);
            }
            other => panic!("{other:?}"),
        }
        let mut back = Vec::new();
        engine.input.pop_into(&mut back, 64);
        assert_eq!(back.len(), 16);
        for m in &back {
            assert!(m.kind().is_answer());
            assert_eq!(m.header().status(), Status::PeerFailed);
            assert_eq!(m.header().dst.to_string(), format!("{US}:5"));
        }
    }

    /// A strict-priority class goes before the others whatever the
    /// weights.
    #[tokio::test(start_paused = true)]
    async fn a_higher_priority_class_goes_first() {
        let mut config = UnderlayConfig {
            scheduling: Scheduling::Priority,
            rate: Some(1_000_000),
            ..UnderlayConfig::default()
        };
        config.classes[1].priority = 0;
        for c in &mut config.classes[..1] {
            c.priority = 1;
            c.weight = 100;
        }
        let (reports, _rx) = mpsc::channel(64);
        let h = spawn(
            rules(),
            Shape::of(&config),
            2048,
            Duration::from_secs(5),
            reports,
        )
        .unwrap();
        let (mut far0, mut e0) = tunnel(&h, 1, 0, 4096).await;
        let (mut far1, mut e1) = tunnel(&h, 2, 1, 4096).await;
        for _ in 0..1000 {
            e0.output.push(msg(US, PEER, 1, 968)).unwrap();
            e1.output.push(msg(US, PEER, 2, 968)).unwrap();
        }
        e0.output.flush();
        e1.output.flush();
        tokio::time::sleep(Duration::from_millis(10)).await;
        take(&mut far0).await;
        take(&mut far1).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (a, b) = (take(&mut far0).await.len(), take(&mut far1).await.len());
        assert!(b > 250 && a <= 1, "class 0 sent {a}, class 1 (first) {b}");
    }
}
