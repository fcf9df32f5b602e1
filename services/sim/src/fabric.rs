//! The fabric: servers, links, clients and faults on one event queue, and
//! the checks run as it goes.
//!
//! ```text
//!   client app ──ring──► engine ──► tunnel port ──pipe a→b──► tunnel port ──► engine ──► listener app
//!        ▲                 ▲                                                      ▲
//!   answers, notices   plane batches            Control ◄──channel pipe a⇄b──► Control
//! ```
//!
//! Every server is a real [`Control`] and a [`SimPlane`]; the simulation
//! is its driver, as `uniplaned` is in a deployment: it carries plane
//! batches to the plane, peer messages over channel pipes, tunnel data
//! over tunnel pipes, answers and notices to the applications, and calls
//! the core's timeout on virtual time. A pipe is a reliable, ordered
//! transport (what the tunnels' stacks give) over a wire with latency,
//! bandwidth, loss (a retransmission timeout), jitter and cuts.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rustc_hash::{FxHashMap, FxHashSet};
use uniplane_control::{
    Action, ClientRequest, Control, ControlConfig, Event, PeerMsg, PeerSpec, PortUse, Reply,
    RequestId, SessionId, TunnelId,
};
use uniplane_dataplane::wire::{ReqType, Status};
use uniplane_dataplane::Endpoint;
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::{PlaneOp, PortId};

use crate::config::{Bug, Fault, SimConfig, Workload};
use crate::plane::SimPlane;
use crate::report::{Report, Violation};
use crate::rng::Rng;

/// The port listeners accept on.
const LISTEN_PORT: u16 = 7;
/// Time a plane takes to carry out a batch.
const PLANE_LATENCY: u64 = 5_000;
/// Time an engine takes to move a message through.
const ENGINE_LATENCY: u64 = 1_000;
/// Time between a peer channel's redials.
const REDIAL: u64 = 20_000_000;
/// Time a tunnel's connect waits before it gives up.
const CONNECT_TIMEOUT: u64 = 50_000_000;
/// Bytes of a data message's payload: flow (8) and sequence (4).
const PAYLOAD: usize = 64;

type Sid = u32;
type PipeId = u32;
type FlowId = u64;

fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

fn dur(t: u64) -> Duration {
    Duration::from_nanos(t)
}

/// The server ID of server `i`.
pub fn server_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(0x0a00_0001u32 + i as u32)
}

fn index_of(ip: Ipv4Addr) -> Sid {
    u32::from(ip) - 0x0a00_0001
}

#[derive(Clone, Copy, Debug)]
enum AppOp {
    Connect,
    Send(FlowId),
    Close(FlowId),
}

#[derive(Debug)]
enum Ev {
    Timer {
        s: Sid,
        inc: u32,
        at: u64,
    },
    PlaneDone {
        s: Sid,
        inc: u32,
        batch: u64,
        ops: Vec<PlaneOp>,
    },
    Drain {
        s: Sid,
        inc: u32,
    },
    Pipe {
        id: PipeId,
    },
    Dial {
        a: Sid,
        b: Sid,
    },
    Fin {
        to: Sid,
        inc: u32,
        from: Sid,
    },
    TunnelUp {
        tid: TunnelId,
    },
    TunnelFailed {
        s: Sid,
        inc: u32,
        peer: Sid,
        class: u8,
        tid: TunnelId,
    },
    InboundEnded {
        s: Sid,
        inc: u32,
        tid: TunnelId,
    },
    Crash {
        s: Sid,
    },
    Restart {
        s: Sid,
    },
    Cut {
        a: Sid,
        b: Option<Sid>,
        until: u64,
    },
    App {
        s: Sid,
        inc: u32,
        op: AppOp,
    },
    Deadline {
        watch: usize,
    },
}

impl Ev {
    fn code(&self) -> u64 {
        match self {
            Ev::Timer { s, .. } => 1 | (*s as u64) << 8,
            Ev::PlaneDone { s, batch, .. } => 2 | (*s as u64) << 8 | batch << 32,
            Ev::Drain { s, .. } => 3 | (*s as u64) << 8,
            Ev::Pipe { id } => 4 | (*id as u64) << 8,
            Ev::Dial { a, b } => 5 | (*a as u64) << 8 | (*b as u64) << 32,
            Ev::Fin { to, .. } => 6 | (*to as u64) << 8,
            Ev::TunnelUp { tid } => 7 | tid << 8,
            Ev::TunnelFailed { s, .. } => 8 | (*s as u64) << 8,
            Ev::InboundEnded { s, .. } => 9 | (*s as u64) << 8,
            Ev::Crash { s } => 10 | (*s as u64) << 8,
            Ev::Restart { s } => 11 | (*s as u64) << 8,
            Ev::Cut { a, .. } => 12 | (*a as u64) << 8,
            Ev::App { s, .. } => 13 | (*s as u64) << 8,
            Ev::Deadline { watch } => 14 | (*watch as u64) << 8,
        }
    }
}

struct Entry {
    at: u64,
    seq: u64,
    ev: Ev,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> Ordering {
        // The earliest first: BinaryHeap is a max-heap.
        (o.at, o.seq).cmp(&(self.at, self.seq))
    }
}

#[derive(Debug)]
enum Payload {
    Hello,
    Peer(PeerMsg),
    Verdict(ConnKey, Result<(), String>),
    TunnelHello(TunnelId, u8),
    Data(Message),
}

struct Pipe {
    from: Sid,
    to: Sid,
    q: VecDeque<(u64, Payload)>,
    last: u64,
    scheduled: bool,
    open: bool,
    /// The tunnel whose data it carries, and whether towards its far end.
    tunnel: Option<(TunnelId, bool)>,
}

struct Channel {
    up: bool,
    pipes: [PipeId; 2],
}

struct Tunnel {
    a: Sid,
    b: Sid,
    class: u8,
    a_port: Option<PortId>,
    b_port: Option<PortId>,
    /// a→b and b→a.
    pipes: [PipeId; 2],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Listener,
    Client,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortRole {
    Daemon,
    App(usize),
    TunnelOut(TunnelId),
    TunnelIn(TunnelId),
}

struct App {
    role: Role,
    session: SessionId,
    uid: Option<Uid>,
    port: Option<PortId>,
    /// Open connections as the application knows them (seen from it),
    /// with the flow it sends on.
    open: FxHashMap<ConnKey, Option<FlowId>>,
    /// Connections in flight (clients).
    busy: usize,
    /// Connections still to set up (clients).
    todo: usize,
    /// The next neighbour to connect to (all-to-all).
    next_peer: usize,
    /// Messages its server's listener received (collective: each lets the
    /// client send one more step).
    received: u32,
}

#[derive(Clone, Copy, Debug)]
enum Origin {
    Attach(usize),
    Listen,
    Connect { at: u64 },
    Close,
    Peer { from: Sid, conn: ConnKey },
}

struct Server {
    ip: Ipv4Addr,
    alive: bool,
    inc: u32,
    core: Control,
    plane: SimPlane,
    timer: Option<u64>,
    drain: bool,
    ports: FxHashMap<PortId, PortRole>,
    apps: Vec<App>,
    requests: FxHashMap<RequestId, Origin>,
    next_request: RequestId,
    next_session: SessionId,
    batches: u32,
    neighbours: Vec<Sid>,
}

struct Flow {
    sender: Sid,
    inc: u32,
    app: usize,
    conn: ConnKey,
    sent: u32,
    total: u32,
    delivered: u32,
    last: Option<u32>,
    told: bool,
    closing: bool,
}

struct Watch {
    s: Sid,
    inc: u32,
    app: usize,
    conn: ConnKey,
    dead: Sid,
}

struct Convergence {
    dead: Sid,
    since: u64,
    waiting: FxHashSet<Sid>,
}

/// A fabric on virtual time.
pub struct Fabric {
    config: SimConfig,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<Entry>,
    servers: Vec<Server>,
    pipes: Vec<Pipe>,
    channels: FxHashMap<(Sid, Sid), Channel>,
    tunnels: FxHashMap<TunnelId, Tunnel>,
    out_tunnels: FxHashMap<(Sid, Sid, u8), TunnelId>,
    next_tunnel: TunnelId,
    cuts: FxHashMap<(Sid, Sid), u64>,
    isolated: FxHashMap<Sid, u64>,
    flows: Vec<Flow>,
    owners: FxHashMap<Uid, (Sid, u32, SessionId)>,
    watches: Vec<Watch>,
    converging: Vec<Convergence>,
    faults_left: usize,
    clients_left: usize,
    /// When a client last finished a connection.
    progress: u64,
    /// Whether the collective was abandoned after a failure.
    aborted: bool,
    report: Report,
    violation: Option<Violation>,
    hash: u64,
    buf: Vec<(PortId, Message)>,
}

impl Fabric {
    /// A fabric for `config`, with its servers started and its faults
    /// planned.
    pub fn new(config: SimConfig) -> Fabric {
        let n = config.servers.max(2);
        let mut rng = Rng::new(config.seed);
        let degree = config.degree.clamp(2, n - 1);
        let mut servers = Vec::with_capacity(n);
        for i in 0..n {
            let mut neighbours: Vec<Sid> = Vec::new();
            for d in 1..=degree.div_ceil(2) {
                for j in [(i + d) % n, (i + n - d) % n] {
                    if j != i && !neighbours.contains(&(j as Sid)) && neighbours.len() < degree {
                        neighbours.push(j as Sid);
                    }
                }
            }
            neighbours.sort_unstable();
            let control = Control::new(core_config(&config, i, &neighbours), Duration::ZERO);
            servers.push(Server {
                ip: server_ip(i),
                alive: true,
                inc: 0,
                core: control,
                plane: SimPlane::new(config.engine),
                timer: None,
                drain: false,
                ports: FxHashMap::default(),
                apps: Vec::new(),
                requests: FxHashMap::default(),
                next_request: 1,
                next_session: 1,
                batches: 0,
                neighbours,
            });
        }
        let todo = match config.workload {
            Workload::Churn => config.connections,
            Workload::AllToAll => servers[0].neighbours.len(),
            Workload::Collective => 1,
        };
        let mut fabric = Fabric {
            report: Report::new(&config),
            rng: Rng::new(rng.next_u64()),
            config,
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            servers,
            pipes: Vec::new(),
            channels: FxHashMap::default(),
            tunnels: FxHashMap::default(),
            out_tunnels: FxHashMap::default(),
            next_tunnel: 1,
            cuts: FxHashMap::default(),
            isolated: FxHashMap::default(),
            flows: Vec::new(),
            owners: FxHashMap::default(),
            watches: Vec::new(),
            converging: Vec::new(),
            faults_left: 0,
            clients_left: if todo == 0 { 0 } else { n },
            progress: 0,
            aborted: false,
            violation: None,
            hash: 0xcbf2_9ce4_8422_2325,
            buf: Vec::new(),
        };
        for s in 0..n as Sid {
            fabric.start_apps(s, todo);
            fabric.pump(s);
            for &b in &fabric.servers[s as usize].neighbours.clone() {
                if s < b {
                    let at = fabric.rng.below(2_000_000);
                    fabric.at(at, Ev::Dial { a: s, b });
                }
            }
        }
        fabric.plan_faults(&mut rng);
        fabric
    }

    fn plan_faults(&mut self, rng: &mut Rng) {
        let n = self.servers.len() as u64;
        let fail = ns(self.config.failure_after());
        // Faults fall while the workload runs: from the first connections
        // on, over a span that grows with the work.
        let start = 5_000_000;
        let rounds = self.config.connections.div_ceil(self.config.window.max(1)) as u64;
        let span = rounds * (ns(self.config.hold) / 2 + 2_000_000) + 2 * fail;
        if self.config.has(Fault::Crash) {
            for _ in 0..self.config.crashes {
                let s = rng.below(n) as Sid;
                self.faults_left += 2;
                self.at(start + rng.below(span), Ev::Crash { s });
            }
        }
        if self.config.has(Fault::Partition) {
            for _ in 0..self.config.partitions {
                let a = rng.below(n) as Sid;
                let nb = &self.servers[a as usize].neighbours;
                let b = (rng.below(2) == 0).then(|| nb[rng.below(nb.len() as u64) as usize]);
                let from = start + rng.below(span);
                let until = from + rng.range(fail / 2, 3 * fail);
                self.faults_left += 1;
                self.at(from, Ev::Cut { a, b, until });
            }
        }
    }

    fn at(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.queue.push(Entry {
            at: at.max(self.now),
            seq: self.seq,
            ev,
        });
    }

    fn after(&mut self, delay: u64, ev: Ev) {
        self.at(self.now + delay, ev);
    }

    fn mix(&mut self, v: u64) {
        self.hash = (self.hash ^ v).wrapping_mul(0x0100_0000_01b3);
    }

    fn mix_conn(&mut self, c: ConnKey) {
        self.mix(c.src.to_u64() << 16 | c.src_port as u64);
        self.mix(c.dst.to_u64() << 16 | c.dst_port as u64);
    }

    fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                at_ms: self.now as f64 / 1e6,
                what,
            });
        }
    }

    // ------------------------------------------------------------ running

    /// Runs to the end (the workload done and settled, a violation, or the
    /// time limit) and reports.
    pub fn run(mut self) -> Report {
        let wall = Instant::now();
        let limit = 60_000_000_000u64 + 2_000_000 * self.config.connections as u64;
        let settle = 3 * ns(self.config.notify_within()) + 10_000_000;
        // Nothing finishing for this long while work remains is a stall
        // (a message lost without a word, an answer that never comes).
        let stall = 10 * (ns(self.config.notify_within()) + ns(self.config.verdict_timeout));
        let mut end: Option<u64> = None;
        let mut events = 0u64;
        while let Some(e) = self.queue.pop() {
            if e.at > limit || end.is_some_and(|t| e.at > t) {
                break;
            }
            if end.is_none() && self.faults_left == 0 && e.at > self.progress + stall {
                break;
            }
            self.now = e.at;
            events += 1;
            self.mix(e.at);
            self.mix(e.ev.code());
            self.event(e.ev);
            if self.violation.is_some() {
                break;
            }
            if end.is_none() && self.clients_left == 0 && self.faults_left == 0 {
                end = Some(self.now + settle);
            }
        }
        if self.violation.is_none() {
            self.final_checks(end.is_some());
        }
        let elapsed = wall.elapsed().as_secs_f64();
        self.report.events = events;
        self.report.wall_s = elapsed;
        self.report.sim_ms = self.now as f64 / 1e6;
        self.report.trace_hash = format!("{:016x}", self.hash);
        self.report.violation = self.violation.take();
        self.report.finish();
        self.report
    }

    fn final_checks(&mut self, finished: bool) {
        for f in &self.flows {
            // A sender that closed before its messages arrived knows.
            if f.delivered < f.sent && !f.told && !f.closing {
                let what = format!(
                    "{:?}: {} of {} messages lost and the sender was never told",
                    f.conn,
                    f.sent - f.delivered,
                    f.sent
                );
                self.fail(what);
                return;
            }
        }
        if !finished {
            let stuck: Vec<String> = self
                .servers
                .iter()
                .enumerate()
                .filter(|(_, s)| s.alive)
                .filter_map(|(i, s)| {
                    let c = s.apps.iter().find(|a| a.role == Role::Client)?;
                    (c.busy > 0 || c.todo > 0)
                        .then(|| format!("server {i}: {} in flight, {} to do", c.busy, c.todo))
                })
                .take(3)
                .collect();
            self.fail(format!("the workload never finished: {}", stuck.join("; ")));
            return;
        }
        for i in 0..self.servers.len() {
            if self.servers[i].alive {
                self.check_state(i as Sid, true);
            }
        }
        if let Some(c) = self.converging.first() {
            let what = format!(
                "after server {} failed, {} survivors never converged",
                c.dead,
                c.waiting.len()
            );
            self.fail(what);
        }
    }

    fn event(&mut self, ev: Ev) {
        match ev {
            Ev::Timer { s, inc, at } => {
                if !self.live(s, inc) || self.servers[s as usize].timer != Some(at) {
                    return;
                }
                self.servers[s as usize].timer = None;
                let now = dur(self.now);
                self.servers[s as usize].core.handle_timeout(now);
                self.pump(s);
            }
            Ev::PlaneDone { s, inc, batch, ops } => {
                if !self.live(s, inc) {
                    return;
                }
                let server = &mut self.servers[s as usize];
                let results = ops.iter().map(|op| server.plane.apply(op)).collect();
                server.batches += 1;
                self.core_event(
                    s,
                    Event::PlaneDone {
                        batch,
                        results: Ok(results),
                    },
                );
                let every = self.config.check_every.max(1);
                if self.servers[s as usize].batches.is_multiple_of(every) {
                    self.check_state(s, false);
                }
            }
            Ev::Drain { s, inc } => {
                if self.live(s, inc) {
                    self.servers[s as usize].drain = false;
                    self.drain(s);
                }
            }
            Ev::Pipe { id } => self.pipe_head(id),
            Ev::Dial { a, b } => self.dial(a, b),
            Ev::Fin { to, inc, from } => {
                if self.live(to, inc) {
                    let server = self.servers[from as usize].ip;
                    self.core_event(to, Event::PeerChannelDown { server });
                }
            }
            Ev::TunnelUp { tid } => {
                // A tunnel closed meanwhile is gone from the map.
                let Some(t) = self.tunnels.get(&tid) else {
                    return;
                };
                let (a, b, class) = (t.a, t.b, t.class);
                let server = self.servers[b as usize].ip;
                self.core_event(a, Event::TunnelOpened { server, class });
            }
            Ev::TunnelFailed {
                s,
                inc,
                peer,
                class,
                tid,
            } => {
                let current = self.out_tunnels.get(&(s, peer, class)).copied();
                if self.live(s, inc) && (current.is_none() || current == Some(tid)) {
                    self.out_tunnels.remove(&(s, peer, class));
                    let server = self.servers[peer as usize].ip;
                    self.core_event(s, Event::TunnelFailed { server, class });
                }
            }
            Ev::InboundEnded { s, inc, tid } => {
                if self.live(s, inc) {
                    self.core_event(s, Event::InboundTunnelEnded { tunnel: tid });
                }
            }
            Ev::Crash { s } => self.crash(s),
            Ev::Restart { s } => self.restart(s),
            Ev::Cut { a, b, until } => {
                match b {
                    Some(b) => {
                        self.cuts.insert(pair(a, b), until);
                    }
                    None => {
                        self.isolated.insert(a, until);
                    }
                }
                self.faults_left -= 1;
                self.report.partitions += 1;
            }
            Ev::App { s, inc, op } => {
                if self.live(s, inc) {
                    self.app_op(s, op);
                }
            }
            Ev::Deadline { watch } => {
                let w = &self.watches[watch];
                if !self.live(w.s, w.inc) {
                    return;
                }
                let app = &self.servers[w.s as usize].apps[w.app];
                self.report.notify_checks += 1;
                if app.open.contains_key(&w.conn) {
                    let what = format!(
                        "server {} crashed and {:?} on server {} was not notified within {:?}",
                        w.dead,
                        w.conn,
                        w.s,
                        self.config.notify_within()
                    );
                    self.fail(what);
                }
            }
        }
    }

    fn live(&self, s: Sid, inc: u32) -> bool {
        let server = &self.servers[s as usize];
        server.alive && server.inc == inc
    }

    fn partitioned(&self, a: Sid, b: Sid) -> Option<u64> {
        let now = self.now;
        let cut = self.cuts.get(&pair(a, b)).copied().filter(|&u| u > now);
        let ia = self.isolated.get(&a).copied().filter(|&u| u > now);
        let ib = self.isolated.get(&b).copied().filter(|&u| u > now);
        [cut, ia, ib].into_iter().flatten().max()
    }

    // ------------------------------------------------------- driving cores

    fn core_event(&mut self, s: Sid, e: Event) {
        let now = dur(self.now);
        self.servers[s as usize].core.handle(e, now);
        self.pump(s);
    }

    fn request(&mut self, s: Sid, session: SessionId, req: ClientRequest, origin: Origin) {
        let server = &mut self.servers[s as usize];
        let request = server.next_request;
        server.next_request += 1;
        server.requests.insert(request, origin);
        self.core_event(
            s,
            Event::Client {
                session,
                request,
                req,
            },
        );
    }

    /// Carries out everything the core of `s` asks, then re-arms its timer.
    fn pump(&mut self, s: Sid) {
        let inc = self.servers[s as usize].inc;
        while let Some(a) = self.servers[s as usize].core.poll_action() {
            self.action(s, inc, a);
        }
        let server = &mut self.servers[s as usize];
        if let Some(t) = server.core.poll_timeout() {
            let at = ns(t).max(self.now + 1_000);
            if server.timer.is_none_or(|cur| at < cur) {
                server.timer = Some(at);
                self.at(at, Ev::Timer { s, inc, at });
            }
        }
        if !self.converging.is_empty() {
            self.converged(s);
        }
    }

    fn action(&mut self, s: Sid, inc: u32, a: Action) {
        match a {
            Action::Plane { batch, ops } => {
                self.mix(0x10 | batch << 8);
                self.after(PLANE_LATENCY, Ev::PlaneDone { s, inc, batch, ops });
            }
            Action::PortReady { port, usage } => {
                let role = match usage {
                    PortUse::Daemon | PortUse::Device { .. } => PortRole::Daemon,
                    PortUse::Process { session, uid } => {
                        let server = &mut self.servers[s as usize];
                        let Some(i) = server.apps.iter().position(|a| a.session == session) else {
                            return;
                        };
                        server.apps[i].port = Some(port);
                        server.apps[i].uid = Some(uid);
                        PortRole::App(i)
                    }
                    PortUse::TunnelOut { server, class } => {
                        let b = index_of(server);
                        let Some(&tid) = self.out_tunnels.get(&(s, b, class)) else {
                            return;
                        };
                        if let Some(t) = self.tunnels.get_mut(&tid) {
                            t.a_port = Some(port);
                        }
                        PortRole::TunnelOut(tid)
                    }
                    PortUse::TunnelIn { tunnel } => {
                        if let Some(t) = self.tunnels.get_mut(&tunnel) {
                            t.b_port = Some(port);
                        }
                        PortRole::TunnelIn(tunnel)
                    }
                };
                self.servers[s as usize].ports.insert(port, role);
            }
            Action::PortGone { port } => {
                let role = self.servers[s as usize].ports.remove(&port);
                match role {
                    Some(PortRole::TunnelOut(tid)) => {
                        // The driver drops the tunnel's link: its far end
                        // sees the tunnel end.
                        if let Some(t) = self.close_tunnel(tid) {
                            self.out_tunnels.remove(&(t.0, t.1, t.2));
                            let inc_b = self.servers[t.1 as usize].inc;
                            if self.partitioned(t.0, t.1).is_none() {
                                let d = ns(self.config.latency);
                                self.after(
                                    d,
                                    Ev::InboundEnded {
                                        s: t.1,
                                        inc: inc_b,
                                        tid,
                                    },
                                );
                            }
                        }
                    }
                    Some(PortRole::TunnelIn(tid)) => self.drop_inbound(tid),
                    Some(PortRole::App(i)) => self.servers[s as usize].apps[i].port = None,
                    _ => {}
                }
            }
            Action::Answer { request, result } => {
                let Some(origin) = self.servers[s as usize].requests.remove(&request) else {
                    return;
                };
                self.mix(0x20 | (result.is_ok() as u64) << 8);
                self.answer(s, origin, result);
            }
            Action::Notice {
                to,
                kind,
                conn,
                status,
            } => {
                self.mix(0x30 | (kind.to_u8() as u64) << 8);
                self.mix_conn(conn);
                self.notice(s, to, kind, conn, status);
            }
            Action::ToPeer { server, msg } => {
                let b = index_of(server);
                match &msg {
                    PeerMsg::Heartbeat => self.report.heartbeats += 1,
                    PeerMsg::Connect { .. } => self.report.setup_msgs += 1,
                    PeerMsg::Close { conn, .. } => {
                        self.report.close_msgs += 1;
                        let conn = *conn;
                        self.mix_conn(conn);
                    }
                }
                self.channel_send(s, b, Payload::Peer(msg));
            }
            Action::OpenTunnel { server, class } => {
                self.report.setup_msgs += 1;
                self.open_tunnel(s, index_of(server), class);
            }
            Action::DropTunnel { tunnel } => self.drop_inbound(tunnel),
            Action::CloseTunnel { server, class } => {
                let b = index_of(server);
                if let Some(tid) = self.out_tunnels.remove(&(s, b, class)) {
                    if self.close_tunnel(tid).is_some() && self.partitioned(s, b).is_none() {
                        let inc_b = self.servers[b as usize].inc;
                        let d = ns(self.config.latency);
                        self.after(
                            d,
                            Ev::InboundEnded {
                                s: b,
                                inc: inc_b,
                                tid,
                            },
                        );
                    }
                }
            }
            Action::ClosePeerChannel { server } => {
                let b = index_of(server);
                self.close_channel(s, b, true);
                self.after(REDIAL, Ev::Dial { a: s, b });
            }
            Action::Opened { remote, .. } => {
                if remote {
                    self.report.remote_setups += 1;
                } else {
                    self.report.local_setups += 1;
                }
            }
            // The simulated servers host no memory a process maps, and
            // no chained kernels.
            Action::Unmap { .. }
            | Action::MakeShared { .. }
            | Action::Withdraw { .. }
            | Action::Chain { .. } => {}
        }
    }

    /// Whether the plane of `s` holds what its core believes, and the
    /// core believes what its registry calls for.
    fn check_state(&mut self, s: Sid, at_end: bool) {
        let server = &mut self.servers[s as usize];
        if !server.core.is_idle() {
            if at_end {
                self.fail(format!("server {s}: its core never went idle"));
            }
            return;
        }
        self.report.state_checks += 1;
        if server.core.installed() != &server.core.picture() {
            self.fail(format!(
                "server {s}: the installed plane differs from its registry's picture"
            ));
            return;
        }
        let installed = server.core.installed().clone();
        if let Some(d) = server.plane.differs_from(&installed) {
            self.fail(format!("server {s}: plane and core disagree: {d}"));
        }
    }

    fn converged(&mut self, s: Sid) {
        let Some(i) = self.converging.iter().position(|c| c.waiting.contains(&s)) else {
            return;
        };
        let dead = self.converging[i].dead;
        let server = &self.servers[s as usize];
        let dead_ip = self.servers[dead as usize].ip;
        let done = !server.alive
            || (server.core.is_idle()
                && !server
                    .core
                    .peers()
                    .iter()
                    .any(|p| p.server == dead_ip && p.alive)
                && !server.core.connections().any(|c| c.peer == Some(dead_ip)));
        if !done {
            return;
        }
        let c = &mut self.converging[i];
        c.waiting.remove(&s);
        if c.waiting.is_empty() {
            let ms = (self.now - c.since) as f64 / 1e6;
            self.report.convergence.push(ms);
            self.converging.remove(i);
        }
    }

    // ---------------------------------------------------------- the links

    fn new_pipe(&mut self, from: Sid, to: Sid, tunnel: Option<(TunnelId, bool)>) -> PipeId {
        self.pipes.push(Pipe {
            from,
            to,
            q: VecDeque::new(),
            last: 0,
            scheduled: false,
            open: true,
            tunnel,
        });
        (self.pipes.len() - 1) as PipeId
    }

    fn close_pipe(&mut self, id: PipeId) {
        let p = &mut self.pipes[id as usize];
        p.open = false;
        p.q = VecDeque::new();
    }

    fn send(&mut self, id: PipeId, payload: Payload) {
        if !self.pipes[id as usize].open {
            return;
        }
        let bytes = match &payload {
            Payload::Data(m) => m.payload().len() as u64 + 32,
            _ => 64,
        };
        let mut delay = ns(self.config.latency) + bytes * 8 * 1_000_000_000 / self.config.bandwidth;
        if self.config.has(Fault::Reorder) {
            delay += self.rng.below(ns(self.config.jitter).max(1));
        }
        if self.config.has(Fault::Loss) && self.rng.chance(self.config.loss) {
            // Lost on the wire: the transport sends it again after a
            // retransmission timeout, and what follows waits for it.
            delay += (4 * ns(self.config.latency)).max(200_000);
            self.report.retransmissions += 1;
        }
        let data = matches!(payload, Payload::Data(_));
        let bug = if data { self.config.bug } else { None };
        let roll = bug.is_some() && self.rng.chance(0.05);
        let now = self.now;
        let p = &mut self.pipes[id as usize];
        let ready = (now + delay).max(p.last);
        p.last = ready;
        match (bug, roll, payload) {
            (Some(Bug::Drop), true, _) => {}
            (Some(Bug::Duplicate), true, Payload::Data(m)) => {
                p.q.push_back((ready, Payload::Data(m.clone())));
                p.q.push_back((ready, Payload::Data(m)));
            }
            (Some(Bug::Reorder), true, payload) if !p.q.is_empty() => {
                let at = p.q.len() - 1;
                p.q.insert(at, (ready, payload));
                let t = p.q[at + 1].0;
                p.q[at].0 = t;
            }
            (_, _, payload) => p.q.push_back((ready, payload)),
        }
        if !p.scheduled {
            if let Some(&(t, _)) = p.q.front() {
                p.scheduled = true;
                self.at(t, Ev::Pipe { id });
            }
        }
    }

    fn pipe_head(&mut self, id: PipeId) {
        let p = &mut self.pipes[id as usize];
        p.scheduled = false;
        if !p.open {
            return;
        }
        let (from, to) = (p.from, p.to);
        if let Some(until) = self.partitioned(from, to) {
            self.pipes[id as usize].scheduled = true;
            self.at(until, Ev::Pipe { id });
            return;
        }
        loop {
            let p = &mut self.pipes[id as usize];
            if !p.open {
                return;
            }
            match p.q.front() {
                Some(&(t, _)) if t <= self.now => {}
                Some(&(t, _)) => {
                    p.scheduled = true;
                    self.at(t, Ev::Pipe { id });
                    return;
                }
                None => return,
            }
            let tunnel = p.tunnel;
            let (_, payload) = p.q.pop_front().expect("a head");
            if let Some(back) = self.deliver(from, to, tunnel, payload) {
                // The receiving port is not ready: it waits at the head.
                let p = &mut self.pipes[id as usize];
                p.q.push_front((self.now, back));
                p.scheduled = true;
                self.after(20_000, Ev::Pipe { id });
                return;
            }
        }
    }

    /// Hands a payload to its receiver; gives it back when the receiving
    /// port is not attached yet.
    fn deliver(
        &mut self,
        from: Sid,
        to: Sid,
        tunnel: Option<(TunnelId, bool)>,
        payload: Payload,
    ) -> Option<Payload> {
        let server = self.servers[from as usize].ip;
        match payload {
            Payload::Hello => self.core_event(to, Event::PeerChannelUp { server }),
            Payload::Peer(msg) => {
                let origin = match &msg {
                    PeerMsg::Connect { conn, .. } => Some(Origin::Peer { from, conn: *conn }),
                    _ => None,
                };
                let t = &mut self.servers[to as usize];
                let request = match origin {
                    Some(o) => {
                        let r = t.next_request;
                        t.next_request += 1;
                        t.requests.insert(r, o);
                        r
                    }
                    None => 0,
                };
                self.core_event(
                    to,
                    Event::PeerMessage {
                        server,
                        msg,
                        request,
                    },
                );
            }
            Payload::Verdict(conn, verdict) => self.core_event(
                to,
                Event::PeerVerdict {
                    server,
                    conn,
                    verdict,
                },
            ),
            Payload::TunnelHello(tid, class) => {
                let mtu = 1400;
                self.core_event(
                    to,
                    Event::InboundTunnel {
                        tunnel: tid,
                        from: server,
                        class,
                        mtu,
                    },
                );
            }
            Payload::Data(m) => {
                let (tid, forward) = tunnel?;
                let t = self.tunnels.get(&tid)?;
                let port = if forward { t.b_port } else { t.a_port };
                let Some(port) = port else {
                    return Some(Payload::Data(m));
                };
                if self.servers[to as usize].plane.input(port, m) {
                    self.schedule_drain(to);
                }
            }
        }
        None
    }

    fn channel_send(&mut self, a: Sid, b: Sid, payload: Payload) {
        let Some(c) = self.channels.get(&pair(a, b)) else {
            return;
        };
        if !c.up {
            return;
        }
        let id = if a < b { c.pipes[0] } else { c.pipes[1] };
        self.send(id, payload);
    }

    fn dial(&mut self, a: Sid, b: Sid) {
        if !self.servers[a as usize].alive || !self.servers[b as usize].alive {
            return;
        }
        if self.channels.get(&pair(a, b)).is_some_and(|c| c.up) {
            return;
        }
        if self.partitioned(a, b).is_some() {
            self.after(REDIAL, Ev::Dial { a, b });
            return;
        }
        let (x, y) = pair(a, b);
        let pipes = [self.new_pipe(x, y, None), self.new_pipe(y, x, None)];
        self.channels.insert((x, y), Channel { up: true, pipes });
        // The connection's handshake, then each side's hello.
        self.send(pipes[0], Payload::Hello);
        self.send(pipes[1], Payload::Hello);
    }

    fn close_channel(&mut self, a: Sid, b: Sid, fin: bool) {
        let Some(c) = self.channels.get_mut(&pair(a, b)) else {
            return;
        };
        if !c.up {
            return;
        }
        c.up = false;
        let pipes = c.pipes;
        self.close_pipe(pipes[0]);
        self.close_pipe(pipes[1]);
        if fin && self.servers[b as usize].alive && self.partitioned(a, b).is_none() {
            let inc = self.servers[b as usize].inc;
            let d = ns(self.config.latency);
            self.after(
                d,
                Ev::Fin {
                    to: b,
                    inc,
                    from: a,
                },
            );
        }
    }

    fn open_tunnel(&mut self, a: Sid, b: Sid, class: u8) {
        let inc = self.servers[a as usize].inc;
        if let Some(old) = self.out_tunnels.remove(&(a, b, class)) {
            self.close_tunnel(old);
        }
        let tid = self.next_tunnel;
        self.next_tunnel += 1;
        if !self.servers[b as usize].alive || self.partitioned(a, b).is_some() {
            self.out_tunnels.insert((a, b, class), tid);
            self.after(
                CONNECT_TIMEOUT,
                Ev::TunnelFailed {
                    s: a,
                    inc,
                    peer: b,
                    class,
                    tid,
                },
            );
            return;
        }
        let pipes = [
            self.new_pipe(a, b, Some((tid, true))),
            self.new_pipe(b, a, Some((tid, false))),
        ];
        self.tunnels.insert(
            tid,
            Tunnel {
                a,
                b,
                class,
                a_port: None,
                b_port: None,
                pipes,
            },
        );
        self.out_tunnels.insert((a, b, class), tid);
        self.send(pipes[0], Payload::TunnelHello(tid, class));
        let rtt = 2 * ns(self.config.latency);
        self.after(rtt, Ev::TunnelUp { tid });
    }

    /// Closes a tunnel's pipes; returns (a, b, class) when it was still
    /// open.
    fn close_tunnel(&mut self, tid: TunnelId) -> Option<(Sid, Sid, u8)> {
        let t = self.tunnels.remove(&tid)?;
        self.close_pipe(t.pipes[0]);
        self.close_pipe(t.pipes[1]);
        Some((t.a, t.b, t.class))
    }

    /// The far end of a tunnel dropped it: its opener sees it fail.
    fn drop_inbound(&mut self, tid: TunnelId) {
        if let Some((a, b, class)) = self.close_tunnel(tid) {
            if self.servers[a as usize].alive && self.partitioned(a, b).is_none() {
                let inc = self.servers[a as usize].inc;
                let d = ns(self.config.latency);
                self.after(
                    d,
                    Ev::TunnelFailed {
                        s: a,
                        inc,
                        peer: b,
                        class,
                        tid,
                    },
                );
            }
        }
    }

    fn schedule_drain(&mut self, s: Sid) {
        let server = &mut self.servers[s as usize];
        if !server.drain {
            server.drain = true;
            let inc = server.inc;
            self.after(ENGINE_LATENCY, Ev::Drain { s, inc });
        }
    }

    fn drain(&mut self, s: Sid) {
        let mut out = std::mem::take(&mut self.buf);
        let now = dur(self.now);
        self.servers[s as usize].plane.drain(now, &mut out);
        for (port, m) in out.drain(..) {
            let role = self.servers[s as usize].ports.get(&port).copied();
            match role {
                Some(PortRole::App(i)) => self.receive(s, i, m),
                Some(PortRole::TunnelOut(tid)) => {
                    if let Some(t) = self.tunnels.get(&tid) {
                        let id = t.pipes[0];
                        self.send(id, Payload::Data(m));
                    }
                }
                Some(PortRole::TunnelIn(tid)) => {
                    if let Some(t) = self.tunnels.get(&tid) {
                        let id = t.pipes[1];
                        self.send(id, Payload::Data(m));
                    }
                }
                Some(PortRole::Daemon) | None => self.report.dropped_at_plane += 1,
            }
        }
        self.buf = out;
        if self.servers[s as usize].plane.busy() {
            self.schedule_drain(s);
        }
    }

    // ------------------------------------------------------------- faults

    fn crash(&mut self, s: Sid) {
        self.faults_left -= 1;
        if !self.servers[s as usize].alive {
            self.faults_left -= 1;
            return;
        }
        self.report.crashes += 1;
        let inc = self.servers[s as usize].inc;
        // Every survivor's connection to the dead server must hear of it
        // in time.
        let within = ns(self.config.notify_within());
        let neighbours = self.servers[s as usize].neighbours.clone();
        let mut waiting = FxHashSet::default();
        let first = self.watches.len();
        for &o in &neighbours {
            let server = &self.servers[o as usize];
            if !server.alive {
                continue;
            }
            waiting.insert(o);
            for (ai, app) in server.apps.iter().enumerate() {
                for conn in app.open.keys() {
                    if conn.dst.server() == self.servers[s as usize].ip {
                        self.watches.push(Watch {
                            s: o,
                            inc: server.inc,
                            app: ai,
                            conn: *conn,
                            dead: s,
                        });
                    }
                }
            }
        }
        for w in first..self.watches.len() {
            let t = self.now + within;
            self.at(t, Ev::Deadline { watch: w });
        }
        // A survivor that dies in turn no longer has to converge.
        let now = self.now;
        let report = &mut self.report;
        self.converging.retain_mut(|c| {
            if c.waiting.remove(&s) && c.waiting.is_empty() {
                report.convergence.push((now - c.since) as f64 / 1e6);
                return false;
            }
            true
        });
        let survivors: Vec<Sid> = waiting.iter().copied().collect();
        self.converging.push(Convergence {
            dead: s,
            since: self.now,
            waiting,
        });
        // The dead server's own flows: their sender is gone.
        for f in self.flows.iter_mut() {
            if f.sender == s && f.inc == inc {
                f.told = true;
            }
        }
        let server = &mut self.servers[s as usize];
        server.alive = false;
        for app in &server.apps {
            if let Some(uid) = app.uid {
                self.owners.remove(&uid);
            }
        }
        for &o in &neighbours {
            self.close_channel(s, o, false);
        }
        let dead: Vec<TunnelId> = self
            .tunnels
            .iter()
            .filter(|(_, t)| t.a == s || t.b == s)
            .map(|(id, _)| *id)
            .collect();
        for tid in dead {
            self.close_tunnel(tid);
        }
        self.out_tunnels.retain(|k, _| k.0 != s);
        // A survivor cut off from it already may be consistent now.
        let mut survivors = survivors;
        survivors.sort_unstable();
        for o in survivors {
            self.converged(o);
        }
        let down = 2 * ns(self.config.notify_within()) + self.rng.below(20_000_000);
        self.after(down, Ev::Restart { s });
    }

    fn restart(&mut self, s: Sid) {
        self.faults_left -= 1;
        let neighbours = self.servers[s as usize].neighbours.clone();
        let config = core_config(&self.config, s as usize, &neighbours);
        let todo = {
            let server = &mut self.servers[s as usize];
            server.inc += 1;
            server.alive = true;
            server.core = Control::new(config, dur(self.now));
            server.plane = SimPlane::new(self.config.engine);
            server.timer = None;
            server.drain = false;
            server.ports.clear();
            server.requests.clear();
            server.batches = 0;
            let client = server.apps.iter().find(|a| a.role == Role::Client);
            client.map_or(0, |c| c.todo)
        };
        if let Some(c) = self.servers[s as usize]
            .apps
            .iter()
            .find(|a| a.role == Role::Client)
        {
            if c.todo == 0 && c.busy > 0 {
                // It was mid-way: what it had in flight died with it.
                self.clients_left -= 1;
            }
        }
        self.servers[s as usize].apps.clear();
        self.start_apps(s, todo);
        self.pump(s);
        for &b in &neighbours {
            let at = self.rng.below(1_000_000);
            self.after(at, Ev::Dial { a: s, b });
        }
    }

    // ------------------------------------------------------- applications

    fn start_apps(&mut self, s: Sid, todo: usize) {
        for (role, todo) in [(Role::Listener, 0), (Role::Client, todo)] {
            let server = &mut self.servers[s as usize];
            let session = server.next_session;
            server.next_session += 1;
            server.apps.push(App {
                role,
                session,
                uid: None,
                port: None,
                open: FxHashMap::default(),
                busy: 0,
                todo,
                next_peer: 0,
                received: 0,
            });
            let i = server.apps.len() - 1;
            let name = format!("{role:?}-{session}").to_lowercase();
            self.request(
                s,
                session,
                ClientRequest::Attach { name },
                Origin::Attach(i),
            );
        }
    }

    fn answer(
        &mut self,
        s: Sid,
        origin: Origin,
        result: Result<Reply, uniplane_control::ControlError>,
    ) {
        match origin {
            Origin::Attach(i) => {
                let Ok(Reply::Attached { uid, .. }) = result else {
                    self.fail(format!("server {s}: attach refused: {result:?}"));
                    return;
                };
                let inc = self.servers[s as usize].inc;
                let session = self.servers[s as usize].apps[i].session;
                if let Some(&(o, oinc, osession)) = self.owners.get(&uid) {
                    if self.live(o, oinc) && (o, osession) != (s, session) {
                        self.fail(format!("UID {uid} owned twice: server {o} session {osession} and server {s} session {session}"));
                        return;
                    }
                }
                self.owners.insert(uid, (s, inc, session));
                self.servers[s as usize].apps[i].uid = Some(uid);
                match self.servers[s as usize].apps[i].role {
                    Role::Listener => {
                        self.request(
                            s,
                            session,
                            ClientRequest::Listen { port: LISTEN_PORT },
                            Origin::Listen,
                        );
                    }
                    Role::Client => {
                        let app = &self.servers[s as usize].apps[i];
                        let start = app.todo.min(self.config.window);
                        let inc = self.servers[s as usize].inc;
                        for _ in 0..start {
                            let d = 5_000_000 + self.rng.below(2_000_000);
                            self.after(
                                d,
                                Ev::App {
                                    s,
                                    inc,
                                    op: AppOp::Connect,
                                },
                            );
                        }
                    }
                }
            }
            Origin::Listen => {
                if let Err(e) = result {
                    self.fail(format!("server {s}: listen refused: {e}"));
                }
            }
            Origin::Connect { at } => {
                self.report.connect_latency_ns += self.now - at;
                match result {
                    Ok(Reply::Connected(conn)) => {
                        self.report.connected += 1;
                        let inc = self.servers[s as usize].inc;
                        let total = match self.config.workload {
                            Workload::Collective => {
                                2 * (self.servers.len() as u32 - 1) * self.config.connections as u32
                            }
                            _ => self.config.messages,
                        };
                        let id = self.flows.len() as FlowId;
                        self.flows.push(Flow {
                            sender: s,
                            inc,
                            app: 1,
                            conn,
                            sent: 0,
                            total,
                            delivered: 0,
                            last: None,
                            told: false,
                            closing: false,
                        });
                        self.servers[s as usize].apps[1].open.insert(conn, Some(id));
                        if total == 0 || self.aborted {
                            let d = self.rng.below(ns(self.config.hold).max(1));
                            self.after(
                                d,
                                Ev::App {
                                    s,
                                    inc,
                                    op: AppOp::Close(id),
                                },
                            );
                        } else {
                            self.after(
                                1_000,
                                Ev::App {
                                    s,
                                    inc,
                                    op: AppOp::Send(id),
                                },
                            );
                        }
                    }
                    other => {
                        self.report.refused += 1;
                        if let Err(e) = &other {
                            *self
                                .report
                                .refusals
                                .entry(e.kind().to_string())
                                .or_default() += 1;
                        }
                        self.connection_done(s);
                        self.abort_collective();
                    }
                }
            }
            Origin::Close => {}
            Origin::Peer { from, conn } => {
                let verdict = result.map(|_| ()).map_err(|e| e.to_string());
                self.report.setup_msgs += 1;
                self.channel_send(s, from, Payload::Verdict(conn, verdict));
            }
        }
    }

    fn notice(&mut self, s: Sid, to: Uid, kind: ReqType, conn: ConnKey, _status: Status) {
        let server = &mut self.servers[s as usize];
        let Some(i) = server.apps.iter().position(|a| a.uid == Some(to)) else {
            return;
        };
        let app = &mut server.apps[i];
        match kind {
            ReqType::Connect => {
                app.open.insert(conn, None);
            }
            _ => {
                let gone = app
                    .open
                    .remove(&conn)
                    .or_else(|| app.open.remove(&conn.reversed()));
                match gone {
                    Some(Some(flow)) => {
                        self.flows[flow as usize].told = true;
                        self.connection_done(s);
                        self.abort_collective();
                    }
                    Some(None) => self.abort_collective(),
                    _ => {}
                }
            }
        }
    }

    /// A collective whose member failed is abandoned, as its job launcher
    /// would: every client closes its part of the ring.
    fn abort_collective(&mut self) {
        if self.config.workload != Workload::Collective || self.aborted {
            return;
        }
        self.aborted = true;
        for s in 0..self.servers.len() as Sid {
            let server = &self.servers[s as usize];
            if !server.alive || server.apps.len() < 2 {
                continue;
            }
            let inc = server.inc;
            let flows: Vec<FlowId> = server.apps[1].open.values().flatten().copied().collect();
            for flow in flows {
                self.after(
                    1_000,
                    Ev::App {
                        s,
                        inc,
                        op: AppOp::Close(flow),
                    },
                );
            }
        }
    }

    fn connection_done(&mut self, s: Sid) {
        let inc = self.servers[s as usize].inc;
        self.progress = self.now;
        let app = &mut self.servers[s as usize].apps[1];
        if app.busy == 0 {
            return;
        }
        app.busy -= 1;
        if app.todo > 0 {
            let d = self.rng.below(500_000);
            self.after(
                d,
                Ev::App {
                    s,
                    inc,
                    op: AppOp::Connect,
                },
            );
        } else if app.busy == 0 {
            self.clients_left -= 1;
        }
    }

    fn app_op(&mut self, s: Sid, op: AppOp) {
        match op {
            AppOp::Connect => {
                let n = self.servers.len();
                let server = &mut self.servers[s as usize];
                let app = &mut server.apps[1];
                if app.todo == 0 || app.uid.is_none() {
                    return;
                }
                app.todo -= 1;
                app.busy += 1;
                let session = app.session;
                let target = match self.config.workload {
                    Workload::Churn => {
                        let k = self.rng.below(server.neighbours.len() as u64) as usize;
                        server.neighbours[k]
                    }
                    Workload::AllToAll => {
                        let k = app.next_peer % server.neighbours.len();
                        app.next_peer += 1;
                        server.neighbours[k]
                    }
                    Workload::Collective => ((s as usize + 1) % n) as Sid,
                };
                // The listener attaches first: it is device 1 everywhere.
                let dst = Uid::new(server_ip(target as usize), 1);
                let at = self.now;
                self.request(
                    s,
                    session,
                    ClientRequest::Connect {
                        src_port: 0,
                        dst,
                        dst_port: LISTEN_PORT,
                        class: 0,
                    },
                    Origin::Connect { at },
                );
            }
            AppOp::Send(id) => {
                let f = &self.flows[id as usize];
                if f.told || f.closing || f.sent >= f.total {
                    return;
                }
                let collective = self.config.workload == Workload::Collective;
                if collective && f.sent > self.servers[s as usize].apps[1].received {
                    // A ring step waits for the chunk from its predecessor.
                    return;
                }
                let (conn, seq) = (f.conn, f.sent);
                let Some(port) = self.servers[s as usize].apps[f.app].port else {
                    return;
                };
                let mut payload = vec![0u8; PAYLOAD];
                payload[..8].copy_from_slice(&id.to_le_bytes());
                payload[8..12].copy_from_slice(&seq.to_le_bytes());
                let src = Endpoint {
                    uid: conn.src,
                    port: conn.src_port,
                };
                let dst = Endpoint {
                    uid: conn.dst,
                    port: conn.dst_port,
                };
                let Ok(mut m) = Message::send(src, dst, Bytes::from(payload)) else {
                    return;
                };
                m.set_seqnum(seq);
                self.flows[id as usize].sent += 1;
                self.report.sent += 1;
                if self.servers[s as usize].plane.input(port, m) {
                    self.schedule_drain(s);
                }
                let f = &self.flows[id as usize];
                let more = !collective || f.sent <= self.servers[s as usize].apps[1].received;
                if f.sent < f.total && more {
                    let inc = f.inc;
                    self.after(
                        2_000,
                        Ev::App {
                            s,
                            inc,
                            op: AppOp::Send(id),
                        },
                    );
                }
            }
            AppOp::Close(id) => {
                let f = &mut self.flows[id as usize];
                if f.told || f.closing {
                    return;
                }
                f.closing = true;
                let conn = f.conn;
                let app = &mut self.servers[s as usize].apps[1];
                if app.open.remove(&conn).is_none() {
                    return;
                }
                let session = app.session;
                self.request(s, session, ClientRequest::Close { conn }, Origin::Close);
                self.connection_done(s);
            }
        }
    }

    /// A message reached application `i` of `s`.
    fn receive(&mut self, s: Sid, i: usize, m: Message) {
        let h = *m.header();
        if h.status() != Status::Ok {
            // An error answer: the sender is told its message was lost.
            self.report.error_answers += 1;
            let app = &self.servers[s as usize].apps[i];
            let key = ConnKey::of(&h);
            let flow = app
                .open
                .get(&key)
                .or_else(|| app.open.get(&key.reversed()))
                .copied()
                .flatten();
            if let Some(f) = flow {
                self.flows[f as usize].told = true;
            }
            return;
        }
        let p = m.payload();
        if p.len() < 12 {
            self.fail(format!(
                "server {s}: a message of {} bytes arrived",
                p.len()
            ));
            return;
        }
        let id = u64::from_le_bytes(p[..8].try_into().expect("8 bytes"));
        let seq = u32::from_le_bytes(p[8..12].try_into().expect("4 bytes"));
        let Some(f) = self.flows.get_mut(id as usize) else {
            self.fail(format!("server {s}: a message of no flow ({id}) arrived"));
            return;
        };
        let conn = f.conn;
        if f.last.is_some_and(|l| seq <= l) {
            let what = if f.last == Some(seq) {
                "delivered twice"
            } else {
                "delivered out of order"
            };
            let last = f.last;
            self.fail(format!(
                "{conn:?}: message {seq} {what} (last delivered {last:?})"
            ));
            return;
        }
        f.last = Some(seq);
        f.delivered += 1;
        self.report.delivered += 1;
        self.progress = self.now;
        let (sender, inc, delivered, total) = (f.sender, f.inc, f.delivered, f.total);
        let app = &self.servers[s as usize].apps[i];
        if !app.open.contains_key(&conn.reversed()) && !app.open.contains_key(&conn) {
            self.fail(format!(
                "{conn:?}: message {seq} delivered to server {s}, which was never told of the connection"
            ));
            return;
        }
        if !self.live(sender, inc) {
            return;
        }
        match self.config.workload {
            Workload::Collective => {
                // The next step of the ring: pass it on.
                let app = &mut self.servers[s as usize].apps[1];
                app.received += 1;
                if let Some(&Some(next)) = app.open.values().find(|f| f.is_some()) {
                    let inc = self.servers[s as usize].inc;
                    self.after(
                        1_000,
                        Ev::App {
                            s,
                            inc,
                            op: AppOp::Send(next),
                        },
                    );
                }
                if delivered == total {
                    let d = 1_000_000;
                    self.after(
                        d,
                        Ev::App {
                            s: sender,
                            inc,
                            op: AppOp::Close(id),
                        },
                    );
                }
            }
            _ => {
                if delivered == total {
                    // The receiver acknowledged everything: the client
                    // keeps the connection a while, then closes.
                    let d = self.rng.below(ns(self.config.hold).max(1));
                    self.after(
                        d,
                        Ev::App {
                            s: sender,
                            inc,
                            op: AppOp::Close(id),
                        },
                    );
                }
            }
        }
    }
}

fn pair(a: Sid, b: Sid) -> (Sid, Sid) {
    (a.min(b), a.max(b))
}

fn core_config(config: &SimConfig, i: usize, neighbours: &[Sid]) -> ControlConfig {
    let mut c = ControlConfig::new(server_ip(i));
    c.name = format!("server-{i}");
    c.peers = neighbours
        .iter()
        .map(|&j| PeerSpec {
            server: server_ip(j as usize),
            tunnel_mtu: 1400,
            stack: "sim".into(),
            classes: vec![0],
        })
        .collect();
    c.heartbeat = config.heartbeat;
    c.misses = config.misses;
    c.verdict_timeout = config.verdict_timeout;
    c.classes = vec![0];
    c
}
