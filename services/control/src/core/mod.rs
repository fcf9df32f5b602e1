//! The control core: every decision of the host daemon, driven by events
//! in, actions out and time, with no I/O and no clock of its own.
//!
//! ```text
//!  handle(Event::Client{..}, now) ──────┐             ┌─► poll_action() -> Plane{batch, ops}
//!  handle(Event::PlaneDone{..}, now) ───┤             ├─►   Answer / Notice / ToPeer
//!  handle(Event::Peer*, Tunnel*, ..) ───┤   Control   ├─►   OpenTunnel / PortReady / PortGone
//!  handle_timeout(now) ─────────────────┘             └─► poll_timeout() -> when
//! ```
//!
//! The state is the registry (resources and the sessions that own
//! processes), the connections, the peers with their channels and tunnels,
//! and the tunnels peers opened to us. From that state alone follows what
//! the plane must hold ([`Control::picture`]): at every resource port an
//! exact route to every resource, a server route to every live peer's
//! class-0 tunnel and the configured multi-hop routes through relays; the
//! connectionless rules of the policy; each connection admitted at the
//! ports of its local ends and at the inbound tunnels from its peer; each
//! connection we opened to a peer steered into the tunnel of its class.
//! After a decision the core submits the difference between that picture
//! and what it knows is installed, as one batch.
//!
//! One batch is in flight at a time. Events that arrive meanwhile wait in
//! order (a plane completion never waits), so each decision sees the
//! outcome of the previous one and can be undone alone: when the plane
//! refuses an operation, the decision's state change is rolled back, the
//! caller gets a typed error, and the difference back to the rolled-back
//! picture is submitted. Removals count as done even when the plane says
//! the entry was gone already, so a repair never loops.
//!
//! Connection setup checks the policy, then: a local far end must listen
//! (devices accept on every port), and gets a CONNECT notice once the
//! entries are in; a remote far end is asked through its server's daemon
//! over the tunnel of the connection's class (opened on first use) once
//! our end is installed (the peer's process may send as soon as it hears
//! of the connection), and a refusal, a timeout or a failure takes our
//! end out again; a silent peer gets a timeout and a CLOSE in case it
//! admits late. Peers exchange heartbeats every interval;
//! `misses` intervals of silence declare a peer failed: its tunnels go,
//! every connection through it is closed with `PeerFailed` and its local
//! owner told. A client that goes away takes its resource and connections
//! with it.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::time::Duration;

use uniplane_dataplane::wire::{ReqType, Status};
use uniplane_dataplane::{Message, Uid};
use uniplane_overlay::acl::{AclRule, ConnKey, TypeSet};
use uniplane_overlay::table::Route;
use uniplane_overlay::{PlaneError, PortId, PortKind, PortSpec};

use crate::config::{ControlConfig, DefaultAction, PeerSpec};
use crate::image::{PlaneImage, PortImage};
use crate::types::*;
use crate::PlaneOp;

mod chains;
mod clients;
mod connections;
mod peers;
mod picture;
mod plane;
mod transit;
mod underlay;
mod views;

use self::picture::connectionless_rules;
use self::plane::device_spec;

/// Device number of the daemon itself.
pub const DAEMON_DEVICE: u16 = 0;

/// First ephemeral source port.
const EPHEMERAL_FIRST: u16 = 49152;

/// What a local resource is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    /// The daemon (device 0).
    Daemon,
    /// A process attached over the control socket.
    Process,
    /// A device the daemon hosts.
    Device {
        /// Its kind, for listings.
        label: String,
        /// Whether it relays multi-hop traffic (and so admits everything).
        relay: bool,
    },
}

/// A local resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resource {
    /// Its name.
    pub name: String,
    /// What it is.
    pub kind: ResourceKind,
    /// Its UID.
    pub uid: Uid,
    /// Its engine port.
    pub port: PortId,
    /// Ports it listens on (devices accept on every port).
    pub listening: BTreeSet<u16>,
}

impl Resource {
    fn accepts(&self, port: u16) -> bool {
        matches!(self.kind, ResourceKind::Device { .. }) || self.listening.contains(&port)
    }
}

/// An open connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Connection {
    /// Both ends, `src` the connecting one.
    pub key: ConnKey,
    /// Traffic class.
    pub class: u8,
    /// The neighbour its traffic comes and goes through, for
    /// cross-server connections (towards `src` when we are a transit
    /// server for it).
    pub peer: Option<Ipv4Addr>,
    /// When we are a transit server for it (neither end is ours): the
    /// neighbour towards `dst`.
    pub transit: Option<Ipv4Addr>,
    /// When it was set up.
    pub since: Duration,
}

/// A peer as the status listing shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerView {
    /// Its server ID.
    pub server: Ipv4Addr,
    /// The stack its tunnels use.
    pub stack: String,
    /// Whether our channel and class-0 tunnel to it are up.
    pub alive: bool,
    /// Times it was declared down after being up.
    pub failures: u64,
    /// Our open tunnels to it: (class, port).
    pub tunnels: Vec<(u8, PortId)>,
}

/// A tunnel a peer opened to us.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InboundView {
    /// The driver's name for it.
    pub tunnel: TunnelId,
    /// The peer.
    pub from: Ipv4Addr,
    /// Its traffic class.
    pub class: u8,
    /// Its port.
    pub port: PortId,
}

/// One row of the interconnection table (DUA Fig. 5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteRow {
    /// Who reaches.
    pub from: String,
    /// Whom.
    pub to: String,
    /// Through what.
    pub via: String,
    /// Over which stack.
    pub stack: String,
    /// Hops.
    pub hops: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tunnel {
    Opening,
    Open(PortId),
}

#[derive(Debug)]
struct Peer {
    spec: PeerSpec,
    channel: bool,
    tunnels: BTreeMap<u8, Tunnel>,
    last_seen: Duration,
    next_beat: Option<Duration>,
    failures: u64,
    /// Added by [`Event::PeerAdded`] (so [`Event::PeerRemoved`] may take
    /// it away again); the configuration's peers stay.
    discovered: bool,
}

impl Peer {
    fn new(spec: PeerSpec, now: Duration) -> Peer {
        Peer {
            spec,
            channel: false,
            tunnels: BTreeMap::new(),
            last_seen: now,
            next_beat: None,
            failures: 0,
            discovered: false,
        }
    }

    fn tunnel(&self, class: u8) -> Option<PortId> {
        match self.tunnels.get(&class) {
            Some(Tunnel::Open(p)) => Some(*p),
            _ => None,
        }
    }

    fn alive(&self) -> bool {
        self.channel && self.tunnel(0).is_some()
    }
}

#[derive(Clone, Copy, Debug)]
struct Inbound {
    from: Ipv4Addr,
    class: u8,
    port: PortId,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// Waiting for the tunnel of its class until `deadline`.
    Tunnel { deadline: Duration },
    /// Asked the peer; waiting for its verdict until `deadline`.
    Verdict { deadline: Duration },
}

impl Stage {
    fn deadline(self) -> Duration {
        match self {
            Stage::Tunnel { deadline } | Stage::Verdict { deadline } => deadline,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    request: RequestId,
    /// The session that asked; none when a peer asked us to carry the
    /// connection on (transit).
    session: Option<SessionId>,
    class: u8,
    started: Duration,
    stage: Stage,
    /// The neighbour asked: `dst`'s server, or the next hop towards it.
    hop: Ipv4Addr,
    /// Transit: the neighbour that asked us (whose request is answered).
    from: Option<Ipv4Addr>,
}

/// What a port being attached is for.
#[derive(Clone, Debug)]
enum Attaching {
    Daemon,
    Device(usize),
    Process {
        session: SessionId,
        request: RequestId,
        name: String,
    },
    TunnelOut {
        server: Ipv4Addr,
        class: u8,
    },
    TunnelIn {
        tunnel: TunnelId,
        from: Ipv4Addr,
        class: u8,
    },
}

/// How to take a decision back when the plane refuses it.
#[derive(Clone, Debug)]
enum Undo {
    Nothing,
    Asking(Vec<ConnKey>),
    Resource(u16),
    Connection(ConnKey),
    TunnelOut { server: Ipv4Addr, class: u8 },
    TunnelIn(TunnelId),
}

/// What follows a synchronisation batch.
#[derive(Clone, Debug)]
struct Then {
    /// Actions once it is installed.
    ok: Vec<Action>,
    /// A tunnel became usable: connections waiting for it go on.
    tunnel_ready: Option<(Ipv4Addr, u8)>,
    /// The decision to take back on failure.
    undo: Undo,
    /// The request told about a failure.
    fail: Option<RequestId>,
    /// It repairs a refused batch (and is not repaired in turn).
    repair: bool,
}

impl Then {
    fn nothing() -> Then {
        Then {
            ok: Vec::new(),
            tunnel_ready: None,
            undo: Undo::Nothing,
            fail: None,
            repair: false,
        }
    }
}

#[derive(Debug)]
enum Job {
    Attach {
        batch: BatchId,
        purposes: Vec<Attaching>,
    },
    Sync {
        batch: BatchId,
        ops: Vec<PlaneOp>,
        then: Then,
    },
    Policy {
        batch: BatchId,
        request: RequestId,
    },
}

impl Job {
    fn batch(&self) -> BatchId {
        match self {
            Job::Attach { batch, .. } | Job::Sync { batch, .. } | Job::Policy { batch, .. } => {
                *batch
            }
        }
    }
}

/// The host daemon's control plane as a state machine.
#[derive(Debug)]
pub struct Control {
    config: ControlConfig,
    connectionless: Vec<AclRule>,
    resources: BTreeMap<u16, Resource>,
    sessions: HashMap<SessionId, u16>,
    /// Mappings lent: (session, device) → writable.
    grants: BTreeMap<(SessionId, u16), bool>,
    /// Shared regions lent by local resources: (owner device, id).
    shares: BTreeMap<(u16, u16), clients::Share>,
    connections: HashMap<ConnKey, Connection>,
    pending: HashMap<ConnKey, Pending>,
    peers: BTreeMap<Ipv4Addr, Peer>,
    inbound: BTreeMap<TunnelId, Inbound>,
    next_device: u16,
    next_port: u16,
    installed: PlaneImage,
    job: Option<Job>,
    waiting: VecDeque<Event>,
    actions: VecDeque<Action>,
    next_batch: BatchId,
    started: Duration,
    now: Duration,
    /// Chained devices' state, by their index in the configuration.
    chains: BTreeMap<usize, chains::ChainState>,
    /// Shutting down: no chain is set up again.
    stopping: bool,
}

impl Control {
    /// A core for `config`, started at `now`: its first action attaches
    /// the daemon's port and the configured devices.
    pub fn new(config: ControlConfig, now: Duration) -> Control {
        let connectionless = connectionless_rules(&config);
        let peers = config
            .peers
            .iter()
            .map(|p| (p.server, Peer::new(p.clone(), now)))
            .collect();
        let mut control = Control {
            config,
            connectionless,
            resources: BTreeMap::new(),
            sessions: HashMap::new(),
            grants: BTreeMap::new(),
            shares: BTreeMap::new(),
            connections: HashMap::new(),
            pending: HashMap::new(),
            peers,
            inbound: BTreeMap::new(),
            next_device: 1,
            next_port: EPHEMERAL_FIRST,
            installed: PlaneImage::default(),
            job: None,
            waiting: VecDeque::new(),
            actions: VecDeque::new(),
            next_batch: 1,
            started: now,
            now,
            chains: BTreeMap::new(),
            stopping: false,
        };
        let mut ops = vec![PlaneOp::Attach(device_spec("daemon"))];
        let mut purposes = vec![Attaching::Daemon];
        for (i, d) in control.config.devices.iter().enumerate() {
            ops.push(PlaneOp::Attach(device_spec(&d.name)));
            purposes.push(Attaching::Device(i));
        }
        control.start_attach(ops, purposes);
        control
    }

    // ------------------------------------------------------------- driving

    /// Feeds one event. Events other than plane completions wait while a
    /// batch is in flight and are handled, in order, once it is done.
    pub fn handle(&mut self, event: Event, now: Duration) {
        self.now = self.now.max(now);
        // A sign of life changes nothing in the plane: it never waits (so
        // a stream of heartbeats cannot pile up behind a slow batch).
        let passes = matches!(
            event,
            Event::PlaneDone { .. }
                | Event::PeerMessage {
                    msg: PeerMsg::Heartbeat,
                    ..
                }
        );
        if self.job.is_some() && !passes {
            self.waiting.push_back(event);
            return;
        }
        self.process(event);
        while self.job.is_none() {
            let Some(e) = self.waiting.pop_front() else {
                break;
            };
            self.process(e);
        }
        self.chains();
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Control::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let beats = self.peers.values().filter_map(|p| p.next_beat);
        // A connection waiting for a verdict holds entries: it expires
        // only between batches.
        let verdicts = self
            .pending
            .values()
            .filter(|p| self.job.is_none() || matches!(p.stage, Stage::Tunnel { .. }))
            .map(|p| p.stage.deadline());
        let limit = self.config.failure_after();
        // Declaring a failure changes the plane: it waits for the batch.
        let failures = self
            .peers
            .values()
            .filter(|p| self.job.is_none() && p.alive())
            .map(|p| p.last_seen + limit);
        beats
            .chain(verdicts)
            .chain(failures)
            .chain(self.chain_timeout())
            .min()
    }

    /// Sends heartbeats that are due, answers connections whose peer did
    /// not answer in time, and declares silent peers failed.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.now = self.now.max(now);
        let now = self.now;
        let interval = self.config.heartbeat;
        for (server, p) in self.peers.iter_mut() {
            if p.channel && p.next_beat.is_some_and(|t| t <= now) {
                p.next_beat = Some(now + interval);
                self.actions.push_back(Action::ToPeer {
                    server: *server,
                    msg: PeerMsg::Heartbeat,
                });
            }
        }
        let expired = self.expire_pending(now);
        if self.job.is_some() {
            return;
        }
        let limit = self.config.failure_after();
        let failed: Vec<Ipv4Addr> = self
            .peers
            .iter()
            .filter(|(_, p)| p.alive() && p.last_seen + limit <= now)
            .map(|(s, _)| *s)
            .collect();
        if failed.is_empty() {
            if expired {
                self.sync(Then::nothing());
            }
            self.chains();
            return;
        }
        for server in &failed {
            tracing::warn!(%server, "peer silent for {limit:?}: failed");
            self.take_peer_down(*server, Status::PeerFailed);
            self.actions
                .push_back(Action::ClosePeerChannel { server: *server });
        }
        self.sync(Then::nothing());
        self.chains();
    }

    fn process(&mut self, event: Event) {
        match event {
            Event::Client {
                session,
                request,
                req,
            } => self.client(session, request, req),
            Event::ClientClosed { session } => self.client_closed(session),
            Event::PlaneDone { batch, results } => self.plane_done(batch, results),
            Event::PeerChannelUp { server } => self.peer_channel_up(server),
            Event::PeerChannelDown { server } => {
                if self.peers.get(&server).is_some_and(|p| p.channel) {
                    self.take_peer_down(server, Status::PeerFailed);
                    self.sync(Then::nothing());
                }
            }
            Event::PeerMessage {
                server,
                msg,
                request,
            } => self.peer_message(server, msg, request),
            Event::PeerVerdict {
                server,
                conn,
                verdict,
            } => self.peer_verdict(server, conn, verdict),
            Event::TunnelOpened { server, class } => self.tunnel_opened(server, class),
            Event::TunnelFailed { server, class } => self.tunnel_failed(server, class),
            Event::Rules {
                rules,
                default_action,
            } => self.set_rules(rules, default_action),
            Event::Shutdown => {
                self.stopping = true;
                self.shut_down()
            }
            Event::PeerAdded { spec } => self.add_peer(spec),
            Event::PeerRemoved { server } => self.remove_peer(server),
            Event::Violation {
                server,
                src,
                dst,
                ports,
            } => self.violation(server, src, dst, ports),
            Event::DeviceFailed { device } => self.device_failed(device),
            Event::InboundTunnel {
                tunnel,
                from,
                class,
                mtu,
            } => {
                if !self.peers.contains_key(&from) {
                    tracing::warn!(%from, "tunnel from an unknown peer refused");
                    self.actions.push_back(Action::DropTunnel { tunnel });
                    return;
                }
                let spec = PortSpec::tunnel(&format!("from-{from}"), class, mtu);
                self.start_attach(
                    vec![PlaneOp::Attach(spec)],
                    vec![Attaching::TunnelIn {
                        tunnel,
                        from,
                        class,
                    }],
                );
            }
            Event::InboundTunnelEnded { tunnel } => {
                if self.inbound.remove(&tunnel).is_some() {
                    self.sync(Then::nothing());
                }
            }
        }
    }
}
