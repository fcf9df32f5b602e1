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
//! over the tunnel of the connection's class (opened on first use), and
//! only its verdict installs our end; a silent peer gets a timeout and a
//! CLOSE in case it admits late. Peers exchange heartbeats every interval;
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
    /// The remote server, for cross-server connections.
    pub peer: Option<Ipv4Addr>,
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
}

impl Peer {
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
    /// Waiting for the tunnel of its class.
    Tunnel,
    /// Asked the peer; waiting for its verdict until `deadline`.
    Verdict { deadline: Duration },
}

#[derive(Clone, Copy, Debug)]
struct Pending {
    request: RequestId,
    session: SessionId,
    class: u8,
    started: Duration,
    stage: Stage,
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
}

impl Control {
    /// A core for `config`, started at `now`: its first action attaches
    /// the daemon's port and the configured devices.
    pub fn new(config: ControlConfig, now: Duration) -> Control {
        let connectionless = connectionless_rules(&config);
        let peers = config
            .peers
            .iter()
            .map(|p| {
                (
                    p.server,
                    Peer {
                        spec: p.clone(),
                        channel: false,
                        tunnels: BTreeMap::new(),
                        last_seen: now,
                        next_beat: None,
                        failures: 0,
                    },
                )
            })
            .collect();
        let mut control = Control {
            config,
            connectionless,
            resources: BTreeMap::new(),
            sessions: HashMap::new(),
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
        if self.job.is_some() && !matches!(event, Event::PlaneDone { .. }) {
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
    }

    /// The next thing for the driver to do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// When [`Control::handle_timeout`] should next be called.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let beats = self.peers.values().filter_map(|p| p.next_beat);
        let verdicts = self.pending.values().filter_map(|p| match p.stage {
            Stage::Verdict { deadline } => Some(deadline),
            Stage::Tunnel => None,
        });
        let limit = self.config.failure_after();
        // Declaring a failure changes the plane: it waits for the batch.
        let failures = self
            .peers
            .values()
            .filter(|p| self.job.is_none() && p.alive())
            .map(|p| p.last_seen + limit);
        beats.chain(verdicts).chain(failures).min()
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
        let expired: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(_, p)| matches!(p.stage, Stage::Verdict { deadline } if deadline <= now))
            .map(|(k, _)| *k)
            .collect();
        for key in expired {
            if let Some(p) = self.pending.remove(&key) {
                let server = key.dst.server();
                self.answer(
                    p.request,
                    Err(ControlError::Timeout(format!(
                        "peer {server} did not answer"
                    ))),
                );
                // It may admit late: make sure it lets go.
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Close { conn: key },
                });
            }
        }
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
            return;
        }
        for server in &failed {
            tracing::warn!(%server, "peer silent for {limit:?}: failed");
            self.take_peer_down(*server, Status::PeerFailed);
            self.actions
                .push_back(Action::ClosePeerChannel { server: *server });
        }
        self.sync(Then::nothing());
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

    // ------------------------------------------------------------- clients

    fn client(&mut self, session: SessionId, request: RequestId, req: ClientRequest) {
        let device = self.sessions.get(&session).copied();
        let attached = || device.ok_or(ControlError::NotAttached);
        let result = match req {
            ClientRequest::Attach { name } => {
                if device.is_some() {
                    Err(ControlError::BadRequest("already attached".into()))
                } else if self.resources.len() >= self.config.limits.resources {
                    Err(ControlError::Limit("resources"))
                } else {
                    self.start_attach(
                        vec![PlaneOp::Attach(PortSpec::app(&name))],
                        vec![Attaching::Process {
                            session,
                            request,
                            name,
                        }],
                    );
                    return;
                }
            }
            ClientRequest::Listen { port } => attached().and_then(|d| {
                let limit = self.config.limits.listening_per_resource;
                let r = self
                    .resources
                    .get_mut(&d)
                    .ok_or(ControlError::NotAttached)?;
                if !r.listening.contains(&port) && r.listening.len() >= limit {
                    return Err(ControlError::Limit("listening ports"));
                }
                r.listening.insert(port);
                Ok(Reply::Port(port))
            }),
            ClientRequest::Unlisten { port } => attached().map(|d| {
                if let Some(r) = self.resources.get_mut(&d) {
                    r.listening.remove(&port);
                }
                Reply::Port(port)
            }),
            ClientRequest::Connect {
                src_port,
                dst,
                dst_port,
                class,
            } => match attached() {
                Err(e) => Err(e),
                Ok(d) => {
                    let src_port = if src_port == 0 {
                        self.ephemeral_port()
                    } else {
                        src_port
                    };
                    let key = ConnKey {
                        src: Uid::new(self.config.server, d),
                        src_port,
                        dst,
                        dst_port,
                    };
                    match self.connect(session, request, key, class) {
                        Ok(()) => return,
                        Err(e) => Err(e),
                    }
                }
            },
            ClientRequest::Close { conn } => match attached() {
                Err(e) => Err(e),
                Ok(d) => {
                    let me = Uid::new(self.config.server, d);
                    if conn.src != me && conn.dst != me {
                        Err(ControlError::Denied("not your connection".into()))
                    } else if let Some(k) = self.canonical(conn) {
                        self.drop_connection(k, Status::Closed, true);
                        let mut then = Then::nothing();
                        then.ok.push(Action::Answer {
                            request,
                            result: Ok(Reply::Done),
                        });
                        self.sync(then);
                        return;
                    } else {
                        Err(ControlError::NotFound("no such connection".into()))
                    }
                }
            },
            ClientRequest::SetPolicy { device, policy } => match self.resources.get(&device) {
                None => Err(ControlError::NotFound(format!("no device {device}"))),
                Some(r) => {
                    let port = r.port;
                    let batch = self.batch_id();
                    self.actions.push_back(Action::Plane {
                        batch,
                        ops: vec![PlaneOp::SetPolicy(port, policy)],
                    });
                    self.job = Some(Job::Policy { batch, request });
                    return;
                }
            },
        };
        self.answer(request, result);
    }

    fn client_closed(&mut self, session: SessionId) {
        let pending: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.session == session)
            .map(|(k, _)| *k)
            .collect();
        for key in pending {
            if let Some(p) = self.pending.remove(&key) {
                if matches!(p.stage, Stage::Verdict { .. }) {
                    self.actions.push_back(Action::ToPeer {
                        server: key.dst.server(),
                        msg: PeerMsg::Close { conn: key },
                    });
                }
            }
        }
        let Some(device) = self.sessions.remove(&session) else {
            return;
        };
        self.unregister(device);
        self.sync(Then::nothing());
    }

    /// Removes a resource and its connections (far ends told).
    fn unregister(&mut self, device: u16) {
        let Some(res) = self.resources.remove(&device) else {
            return;
        };
        let conns: Vec<ConnKey> = self
            .connections
            .keys()
            .filter(|k| k.src == res.uid || k.dst == res.uid)
            .copied()
            .collect();
        for c in conns {
            self.drop_connection(c, Status::Closed, true);
        }
        tracing::info!(uid = %res.uid, name = %res.name, "resource unregistered");
    }

    fn ephemeral_port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p == u16::MAX {
            EPHEMERAL_FIRST
        } else {
            p + 1
        };
        p
    }

    /// The connection as stored (either direction given).
    fn canonical(&self, key: ConnKey) -> Option<ConnKey> {
        if self.connections.contains_key(&key) {
            Some(key)
        } else if self.connections.contains_key(&key.reversed()) {
            Some(key.reversed())
        } else {
            None
        }
    }

    // --------------------------------------------------------- connections

    /// Starts a connection from a local resource; `Ok` means the answer
    /// comes later.
    fn connect(
        &mut self,
        session: SessionId,
        request: RequestId,
        key: ConnKey,
        class: u8,
    ) -> Result<(), ControlError> {
        if !self.config.allows(key.src, key.dst, ReqType::Connect) {
            return Err(ControlError::Denied(format!(
                "policy denies {} → {}",
                key.src, key.dst
            )));
        }
        if self.canonical(key).is_some() || self.pending.contains_key(&key) {
            return Err(ControlError::Exists);
        }
        if self.connections.len() + self.pending.len() >= self.config.limits.connections {
            return Err(ControlError::Limit("connections"));
        }
        if key.dst.server() != self.config.server {
            return self.connect_remote(session, request, key, class);
        }
        let dst = self
            .resources
            .get(&key.dst.device())
            .ok_or_else(|| ControlError::Refused(format!("no resource {}", key.dst)))?;
        if !dst.accepts(key.dst_port) {
            return Err(ControlError::Refused(format!(
                "nothing listens at {}/{}",
                key.dst, key.dst_port
            )));
        }
        let notify = dst.kind == ResourceKind::Process;
        self.connections.insert(
            key,
            Connection {
                key,
                class,
                peer: None,
                since: self.now,
            },
        );
        let mut then = Then {
            undo: Undo::Connection(key),
            fail: Some(request),
            ..Then::nothing()
        };
        if notify {
            then.ok.push(Action::Notice {
                to: key.dst,
                kind: ReqType::Connect,
                conn: key.reversed(),
                status: Status::Ok,
            });
        }
        then.ok.push(Action::Answer {
            request,
            result: Ok(Reply::Connected(key)),
        });
        then.ok.push(Action::Opened {
            conn: key,
            remote: false,
            setup: Duration::ZERO,
        });
        tracing::info!(src = %key.src, sport = key.src_port, dst = %key.dst, dport = key.dst_port, class, "connection open");
        self.sync(then);
        Ok(())
    }

    fn connect_remote(
        &mut self,
        session: SessionId,
        request: RequestId,
        key: ConnKey,
        class: u8,
    ) -> Result<(), ControlError> {
        let server = key.dst.server();
        let waiting = self
            .pending
            .keys()
            .filter(|k| k.dst.server() == server)
            .count();
        let peer = self
            .peers
            .get_mut(&server)
            .ok_or_else(|| ControlError::NoRoute(format!("no peer server {server}")))?;
        if !peer.alive() {
            return Err(ControlError::PeerDown(format!(
                "peer {server} is not reachable"
            )));
        }
        if waiting >= self.config.limits.pending_per_peer {
            return Err(ControlError::Limit("connections waiting for a peer"));
        }
        let stage = match peer.tunnels.get(&class) {
            Some(Tunnel::Open(_)) => {
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Connect { conn: key, class },
                });
                Stage::Verdict {
                    deadline: self.now + self.config.verdict_timeout,
                }
            }
            Some(Tunnel::Opening) => Stage::Tunnel,
            None => {
                peer.tunnels.insert(class, Tunnel::Opening);
                self.actions.push_back(Action::OpenTunnel { server, class });
                Stage::Tunnel
            }
        };
        self.pending.insert(
            key,
            Pending {
                request,
                session,
                class,
                started: self.now,
                stage,
            },
        );
        Ok(())
    }

    fn peer_verdict(&mut self, server: Ipv4Addr, key: ConnKey, verdict: Result<(), String>) {
        let asked = self.pending.get(&key).is_some_and(|p| {
            matches!(p.stage, Stage::Verdict { .. }) && key.dst.server() == server
        });
        if !asked {
            if verdict.is_ok() {
                // Too late, or never asked: the peer must not keep its end.
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Close { conn: key },
                });
            }
            return;
        }
        let Some(p) = self.pending.remove(&key) else {
            return;
        };
        if let Err(why) = verdict {
            self.answer(p.request, Err(ControlError::Refused(why)));
            return;
        }
        if !self.sessions.contains_key(&p.session)
            || !self.resources.contains_key(&key.src.device())
        {
            self.actions.push_back(Action::ToPeer {
                server,
                msg: PeerMsg::Close { conn: key },
            });
            return;
        }
        self.connections.insert(
            key,
            Connection {
                key,
                class: p.class,
                peer: Some(server),
                since: self.now,
            },
        );
        let then = Then {
            ok: vec![
                Action::Answer {
                    request: p.request,
                    result: Ok(Reply::Connected(key)),
                },
                Action::Opened {
                    conn: key,
                    remote: true,
                    setup: self.now.saturating_sub(p.started),
                },
            ],
            undo: Undo::Connection(key),
            fail: Some(p.request),
            tunnel_ready: None,
            repair: false,
        };
        tracing::info!(src = %key.src, dst = %key.dst, class = p.class, "remote connection open");
        self.sync(then);
    }

    /// Removes a connection from the state and tells its local process
    /// ends (and, when `tell_peer`, its peer) that it is gone.
    fn drop_connection(&mut self, key: ConnKey, status: Status, tell_peer: bool) {
        let Some(conn) = self.connections.remove(&key) else {
            return;
        };
        for end in [key.src, key.dst] {
            if end.server() != self.config.server {
                continue;
            }
            let Some(r) = self.resources.get(&end.device()) else {
                continue;
            };
            if r.kind == ResourceKind::Process {
                let kind = if status == Status::Closed {
                    ReqType::Close
                } else {
                    ReqType::Notify
                };
                let conn = if end == key.src { key } else { key.reversed() };
                self.actions.push_back(Action::Notice {
                    to: end,
                    kind,
                    conn,
                    status,
                });
            }
        }
        if tell_peer {
            if let Some(server) = conn.peer {
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Close { conn: key },
                });
            }
        }
        tracing::info!(src = %key.src, dst = %key.dst, ?status, "connection closed");
    }

    // --------------------------------------------------------------- peers

    fn peer_channel_up(&mut self, server: Ipv4Addr) {
        if self.peers.get(&server).is_some_and(|p| p.channel) {
            // A new channel replaces one we did not hear end.
            self.take_peer_down(server, Status::PeerFailed);
            self.sync(Then::nothing());
        }
        let now = self.now;
        let Some(p) = self.peers.get_mut(&server) else {
            return;
        };
        p.channel = true;
        p.last_seen = now;
        p.next_beat = Some(now);
        if let std::collections::btree_map::Entry::Vacant(e) = p.tunnels.entry(0) {
            e.insert(Tunnel::Opening);
            self.actions
                .push_back(Action::OpenTunnel { server, class: 0 });
        }
    }

    fn peer_message(&mut self, server: Ipv4Addr, msg: PeerMsg, request: RequestId) {
        let now = self.now;
        let Some(p) = self.peers.get_mut(&server) else {
            if matches!(msg, PeerMsg::Connect { .. }) {
                self.answer(
                    request,
                    Err(ControlError::Refused(format!("unknown peer {server}"))),
                );
            }
            return;
        };
        p.last_seen = now;
        match msg {
            PeerMsg::Heartbeat => {}
            PeerMsg::Close { conn } => {
                if let Some(k) = self.canonical(conn) {
                    if self.connections.get(&k).and_then(|c| c.peer) == Some(server) {
                        self.drop_connection(k, Status::Closed, false);
                        self.sync(Then::nothing());
                    }
                }
            }
            PeerMsg::Connect { conn, class } => {
                if let Err(e) = self.admit_from_peer(server, conn, class, request) {
                    self.answer(request, Err(e));
                }
            }
        }
    }

    /// A peer asks to connect one of its resources to one of ours.
    fn admit_from_peer(
        &mut self,
        from: Ipv4Addr,
        key: ConnKey,
        class: u8,
        request: RequestId,
    ) -> Result<(), ControlError> {
        if key.src.server() != from || key.dst.server() != self.config.server {
            return Err(ControlError::Refused(
                "connection does not join the two servers".into(),
            ));
        }
        if !self.peers.get(&from).is_some_and(Peer::alive) {
            // Its traffic could not come back, nor would its end be torn
            // down with the peer.
            return Err(ControlError::PeerDown(format!(
                "no channel from here to {from} yet"
            )));
        }
        if !self.config.allows(key.src, key.dst, ReqType::Connect) {
            return Err(ControlError::Refused(format!(
                "policy denies {} → {}",
                key.src, key.dst
            )));
        }
        if self.connections.contains_key(&key) {
            // Asked again (its answer was lost): admitted already.
            self.answer(request, Ok(Reply::Done));
            return Ok(());
        }
        if self.canonical(key).is_some() {
            return Err(ControlError::Exists);
        }
        if self.connections.len() + self.pending.len() >= self.config.limits.connections {
            return Err(ControlError::Limit("connections"));
        }
        let dst = self
            .resources
            .get(&key.dst.device())
            .ok_or_else(|| ControlError::Refused(format!("no resource {}", key.dst)))?;
        if !dst.accepts(key.dst_port) {
            return Err(ControlError::Refused(format!(
                "nothing listens at {}/{}",
                key.dst, key.dst_port
            )));
        }
        let notify = dst.kind == ResourceKind::Process;
        self.connections.insert(
            key,
            Connection {
                key,
                class,
                peer: Some(from),
                since: self.now,
            },
        );
        let mut then = Then {
            undo: Undo::Connection(key),
            fail: Some(request),
            ..Then::nothing()
        };
        if notify {
            then.ok.push(Action::Notice {
                to: key.dst,
                kind: ReqType::Connect,
                conn: key.reversed(),
                status: Status::Ok,
            });
        }
        then.ok.push(Action::Answer {
            request,
            result: Ok(Reply::Done),
        });
        self.sync(then);
        Ok(())
    }

    /// Takes a peer down in the state: its tunnels go, every connection
    /// through it is closed with `status` and its owner told, and
    /// connections waiting for it fail. The caller syncs.
    fn take_peer_down(&mut self, server: Ipv4Addr, status: Status) {
        let Some(p) = self.peers.get_mut(&server) else {
            return;
        };
        if p.alive() || p.tunnel(0).is_some() {
            p.failures += 1;
            tracing::warn!(%server, "peer down");
        }
        p.channel = false;
        p.next_beat = None;
        p.tunnels.clear();
        let affected: Vec<ConnKey> = self
            .connections
            .values()
            .filter(|c| c.peer == Some(server))
            .map(|c| c.key)
            .collect();
        for c in affected {
            self.drop_connection(c, status, false);
        }
        self.fail_pending(server, None);
    }

    /// Fails connections to `server` waiting for a verdict or a tunnel
    /// (only those of `class` when given).
    fn fail_pending(&mut self, server: Ipv4Addr, class: Option<u8>) {
        let failed: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(k, p)| k.dst.server() == server && class.is_none_or(|c| c == p.class))
            .map(|(k, _)| *k)
            .collect();
        for key in failed {
            if let Some(p) = self.pending.remove(&key) {
                self.answer(
                    p.request,
                    Err(ControlError::PeerDown(format!(
                        "tunnel of class {} to {server} is down",
                        p.class
                    ))),
                );
            }
        }
    }

    fn tunnel_opened(&mut self, server: Ipv4Addr, class: u8) {
        let wanted = self
            .peers
            .get(&server)
            .is_some_and(|p| p.channel && p.tunnels.get(&class) == Some(&Tunnel::Opening));
        if !wanted {
            self.actions
                .push_back(Action::CloseTunnel { server, class });
            return;
        }
        let mtu = self.peers[&server].spec.tunnel_mtu;
        let spec = PortSpec::tunnel(&format!("tunnel-{server}-class{class}"), class, mtu);
        self.start_attach(
            vec![PlaneOp::Attach(spec)],
            vec![Attaching::TunnelOut { server, class }],
        );
    }

    fn tunnel_failed(&mut self, server: Ipv4Addr, class: u8) {
        let Some(p) = self.peers.get_mut(&server) else {
            return;
        };
        if p.tunnels.remove(&class).is_none() {
            return;
        }
        if class == 0 {
            p.tunnels.insert(0, Tunnel::Opening);
            self.take_peer_down(server, Status::PeerFailed);
            self.actions.push_back(Action::ClosePeerChannel { server });
        } else {
            let affected: Vec<ConnKey> = self
                .connections
                .values()
                .filter(|c| c.peer == Some(server) && c.class == class)
                .map(|c| c.key)
                .collect();
            for c in affected {
                self.drop_connection(c, Status::PeerFailed, true);
            }
            self.fail_pending(server, Some(class));
        }
        self.sync(Then::nothing());
    }

    /// Connections waiting for the tunnel of `class` to `server` ask the
    /// peer now.
    fn tunnel_ready(&mut self, server: Ipv4Addr, class: u8) {
        let deadline = self.now + self.config.verdict_timeout;
        for (key, p) in self.pending.iter_mut() {
            if key.dst.server() == server && p.class == class && p.stage == Stage::Tunnel {
                p.stage = Stage::Verdict { deadline };
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Connect { conn: *key, class },
                });
            }
        }
    }

    // --------------------------------------------------------------- plane

    fn batch_id(&mut self) -> BatchId {
        let b = self.next_batch;
        self.next_batch += 1;
        b
    }

    fn answer(&mut self, request: RequestId, result: Result<Reply, ControlError>) {
        self.actions.push_back(Action::Answer { request, result });
    }

    fn start_attach(&mut self, ops: Vec<PlaneOp>, purposes: Vec<Attaching>) {
        let batch = self.batch_id();
        self.actions.push_back(Action::Plane { batch, ops });
        self.job = Some(Job::Attach { batch, purposes });
    }

    /// Submits what the state calls for and the plane lacks (or holds in
    /// excess); `then` follows its completion.
    fn sync(&mut self, then: Then) {
        if let Some(Job::Sync { then: running, .. }) = &mut self.job {
            // Only a repair can be running here (decisions wait for jobs):
            // the next sync after it covers this one.
            running.ok.extend(then.ok);
            return;
        }
        let target = self.picture();
        let ops = self.installed.diff(&target);
        if ops.is_empty() {
            self.finish(then);
            return;
        }
        let batch = self.batch_id();
        self.actions.push_back(Action::Plane {
            batch,
            ops: ops.clone(),
        });
        self.job = Some(Job::Sync { batch, ops, then });
    }

    fn finish(&mut self, then: Then) {
        self.actions.extend(then.ok);
        if let Some((server, class)) = then.tunnel_ready {
            self.tunnel_ready(server, class);
        }
    }

    fn plane_done(
        &mut self,
        batch: BatchId,
        results: Result<Vec<Result<OpResult, PlaneError>>, PlaneError>,
    ) {
        if self.job.as_ref().map(Job::batch) != Some(batch) {
            tracing::debug!(batch, "completion of an unknown batch ignored");
            return;
        }
        let Some(job) = self.job.take() else {
            return;
        };
        let n = match &job {
            Job::Attach { purposes, .. } => purposes.len(),
            Job::Sync { ops, .. } => ops.len(),
            Job::Policy { .. } => 1,
        };
        let results: Vec<Result<OpResult, PlaneError>> = match results {
            Ok(mut r) => {
                r.resize(n, Err(PlaneError::EngineGone));
                r
            }
            Err(e) => vec![Err(e); n],
        };
        match job {
            Job::Attach { purposes, .. } => self.attached(purposes, results),
            Job::Sync { ops, then, .. } => self.synced(ops, results, then),
            Job::Policy { request, .. } => {
                let result = match results.into_iter().next() {
                    Some(Ok(_)) => Ok(Reply::Done),
                    Some(Err(e)) => Err(ControlError::BadRequest(e.to_string())),
                    None => Err(ControlError::Plane(PlaneError::EngineGone)),
                };
                self.answer(request, result);
            }
        }
    }

    fn synced(
        &mut self,
        ops: Vec<PlaneOp>,
        results: Vec<Result<OpResult, PlaneError>>,
        then: Then,
    ) {
        let mut failure = None;
        for (op, r) in ops.iter().zip(results) {
            let removal = matches!(
                op,
                PlaneOp::Detach(_)
                    | PlaneOp::RemoveRoute(..)
                    | PlaneOp::Revoke(..)
                    | PlaneOp::ClearRules(_)
                    | PlaneOp::RemoveTranslation(_)
            );
            match r {
                Ok(_) => self.installed.apply(op),
                // A removal of what is not there leaves what it wanted.
                Err(e) if removal && absent(&e) => self.installed.apply(op),
                Err(e) => {
                    tracing::warn!(?op, "plane refused: {e}");
                    failure.get_or_insert(e);
                }
            }
            if let PlaneOp::Detach(port) = op {
                self.actions.push_back(Action::PortGone { port: *port });
            }
        }
        let Some(e) = failure else {
            self.finish(then);
            return;
        };
        self.undo(then.undo);
        if let Some(request) = then.fail {
            self.answer(request, Err(ControlError::Plane(e)));
        }
        if then.repair {
            // A repair the plane refused again waits for the next decision,
            // whose difference includes it: no loop against a stuck plane.
            return;
        }
        // Back to the picture of the rolled-back state.
        let target = self.picture();
        let ops = self.installed.diff(&target);
        if !ops.is_empty() {
            let batch = self.batch_id();
            self.actions.push_back(Action::Plane {
                batch,
                ops: ops.clone(),
            });
            self.job = Some(Job::Sync {
                batch,
                ops,
                then: Then {
                    repair: true,
                    ..Then::nothing()
                },
            });
        }
    }

    fn undo(&mut self, undo: Undo) {
        match undo {
            Undo::Nothing => {}
            Undo::Resource(device) => {
                self.resources.remove(&device);
                self.sessions.retain(|_, d| *d != device);
            }
            Undo::Connection(key) => {
                if let Some(c) = self.connections.remove(&key) {
                    if let (Some(server), true) = (c.peer, key.src.server() == self.config.server) {
                        // The peer admitted its end already.
                        self.actions.push_back(Action::ToPeer {
                            server,
                            msg: PeerMsg::Close { conn: key },
                        });
                    }
                }
            }
            Undo::TunnelOut { server, class } => {
                if let Some(p) = self.peers.get_mut(&server) {
                    p.tunnels.remove(&class);
                }
                self.fail_pending(server, Some(class));
                if class == 0 {
                    self.take_peer_down(server, Status::PeerFailed);
                    self.actions.push_back(Action::ClosePeerChannel { server });
                }
            }
            Undo::TunnelIn(tunnel) => {
                if self.inbound.remove(&tunnel).is_some() {
                    self.actions.push_back(Action::DropTunnel { tunnel });
                }
            }
        }
    }

    fn attached(&mut self, purposes: Vec<Attaching>, results: Vec<Result<OpResult, PlaneError>>) {
        let mut then = Then::nothing();
        let mut ready = Vec::new();
        for (purpose, r) in purposes.into_iter().zip(results) {
            let port = match r {
                Ok(OpResult::Attached(p)) => Ok(p),
                Ok(OpResult::Done) => Err(PlaneError::EngineGone),
                Err(e) => Err(e),
            };
            if let Ok(p) = port {
                self.installed.ports.insert(p, PortImage::default());
            }
            match (purpose, port) {
                (Attaching::Daemon, Ok(port)) => {
                    self.register("daemon", ResourceKind::Daemon, Some(DAEMON_DEVICE), port);
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::Daemon,
                    });
                }
                (Attaching::Device(i), Ok(port)) => {
                    let d = self.config.devices[i].clone();
                    let kind = ResourceKind::Device {
                        label: d.label.clone(),
                        relay: d.relay,
                    };
                    let uid = self.register(&d.name, kind, d.device, port);
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::Device { name: d.name, uid },
                    });
                }
                (Attaching::Daemon | Attaching::Device(_), Err(e)) => {
                    tracing::error!("attaching a port at start: {e}");
                }
                (
                    Attaching::Process {
                        session,
                        request,
                        name,
                    },
                    Ok(port),
                ) => {
                    let uid = self.register(&name, ResourceKind::Process, None, port);
                    self.sessions.insert(session, uid.device());
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::Process { session, uid },
                    });
                    then.ok.push(Action::Answer {
                        request,
                        result: Ok(Reply::Attached { uid, port }),
                    });
                    then.undo = Undo::Resource(uid.device());
                    then.fail = Some(request);
                }
                (Attaching::Process { request, .. }, Err(e)) => {
                    self.answer(request, Err(ControlError::Resources(e.to_string())));
                }
                (Attaching::TunnelOut { server, class }, Ok(port)) => {
                    let now = self.now;
                    match self.peers.get_mut(&server) {
                        Some(p) => {
                            p.tunnels.insert(class, Tunnel::Open(port));
                            if class == 0 {
                                p.last_seen = now;
                                tracing::info!(%server, tunnel = port, "peer up");
                            }
                        }
                        None => continue,
                    }
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::TunnelOut { server, class },
                    });
                    then.tunnel_ready = Some((server, class));
                    then.undo = Undo::TunnelOut { server, class };
                }
                (Attaching::TunnelOut { server, class }, Err(e)) => {
                    tracing::warn!(%server, class, "tunnel port: {e}");
                    self.actions
                        .push_back(Action::CloseTunnel { server, class });
                    self.undo(Undo::TunnelOut { server, class });
                }
                (
                    Attaching::TunnelIn {
                        tunnel,
                        from,
                        class,
                    },
                    Ok(port),
                ) => {
                    let old: Vec<TunnelId> = self
                        .inbound
                        .iter()
                        .filter(|(_, t)| t.from == from && t.class == class)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in old {
                        self.inbound.remove(&id);
                        self.actions.push_back(Action::DropTunnel { tunnel: id });
                    }
                    self.inbound.insert(tunnel, Inbound { from, class, port });
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::TunnelIn { tunnel },
                    });
                    then.undo = Undo::TunnelIn(tunnel);
                    tracing::info!(%from, class, port, "inbound tunnel up");
                }
                (Attaching::TunnelIn { tunnel, .. }, Err(e)) => {
                    tracing::warn!("inbound tunnel port: {e}");
                    self.actions.push_back(Action::DropTunnel { tunnel });
                }
            }
        }
        // The driver learns what a port is for before its entries go in.
        self.actions.extend(ready);
        self.sync(then);
    }

    /// Adds a local resource on `port` under `device` when free, else the
    /// next free device number.
    fn register(
        &mut self,
        name: &str,
        kind: ResourceKind,
        device: Option<u16>,
        port: PortId,
    ) -> Uid {
        let device = match device {
            Some(d) if !self.resources.contains_key(&d) => d,
            _ => {
                while self.resources.contains_key(&self.next_device) {
                    self.next_device = self.next_device.wrapping_add(1).max(1);
                }
                self.next_device
            }
        };
        let uid = Uid::new(self.config.server, device);
        tracing::info!(%uid, name, ?kind, port, "resource registered");
        self.resources.insert(
            device,
            Resource {
                name: name.to_owned(),
                kind,
                uid,
                port,
                listening: BTreeSet::new(),
            },
        );
        uid
    }

    // ------------------------------------------------------------- picture

    /// Everything the plane must hold for the current state.
    pub fn picture(&self) -> PlaneImage {
        let mut img = PlaneImage::default();
        let local: Vec<Route> = self
            .resources
            .values()
            .map(|r| Route::exact(r.uid, r.port))
            .collect();
        let servers: Vec<Route> = self
            .peers
            .iter()
            .filter(|(_, p)| p.alive())
            .filter_map(|(s, p)| Some(Route::server(*s, p.tunnel(0)?)))
            .collect();
        for r in self.resources.values() {
            let mut port = PortImage::default();
            for route in local.iter().chain(&servers) {
                port.route(*route);
            }
            for mh in &self.config.routes {
                let via = self.resources.values().find(|x| x.name == mh.via);
                let Some(via) = via.map(|v| v.port) else {
                    continue;
                };
                if r.port != via
                    && r.kind != ResourceKind::Daemon
                    && (mh.from == "*" || mh.from == r.name)
                {
                    port.route(Route {
                        key: mh.to.key,
                        mask: mh.to.mask,
                        priority: 10,
                        port: via,
                    });
                }
            }
            let trusted = matches!(
                r.kind,
                ResourceKind::Daemon | ResourceKind::Device { relay: true, .. }
            );
            if trusted {
                port.rules.push(AclRule::ALLOW_ALL);
            }
            port.rules.extend(self.connectionless.iter().copied());
            img.ports.insert(r.port, port);
        }
        for t in self.inbound.values() {
            let mut port = PortImage::default();
            for route in &local {
                port.route(*route);
            }
            port.rules.extend(self.connectionless.iter().copied());
            img.ports.insert(t.port, port);
        }
        for p in self.peers.values() {
            for t in p.tunnels.values() {
                if let Tunnel::Open(id) = t {
                    let mut port = PortImage::default();
                    port.rules.push(AclRule::ALLOW_ALL);
                    img.ports.insert(*id, port);
                }
            }
        }
        for c in self.connections.values() {
            for end in [c.key.src, c.key.dst] {
                if end.server() != self.config.server {
                    continue;
                }
                if let Some(r) = self.resources.get(&end.device()) {
                    if let Some(port) = img.ports.get_mut(&r.port) {
                        port.allows.insert(c.key);
                    }
                }
            }
            let Some(server) = c.peer else {
                continue;
            };
            for t in self.inbound.values().filter(|t| t.from == server) {
                if let Some(port) = img.ports.get_mut(&t.port) {
                    port.allows.insert(c.key);
                }
            }
            // A configured multi-hop route decides the path itself
            // (through its relay, then the server route); otherwise the
            // translator steers the connection into its class's tunnel.
            let ours = c.key.src.server() == self.config.server;
            if ours && !self.multi_hop_covers(c.key) {
                if let Some(t) = self.peers.get(&server).and_then(|p| p.tunnel(c.class)) {
                    img.translations.insert(c.key, t);
                }
            }
        }
        img
    }

    /// Whether a configured multi-hop route carries `key`'s traffic.
    fn multi_hop_covers(&self, key: ConnKey) -> bool {
        let src_name = self
            .resources
            .get(&key.src.device())
            .map(|r| r.name.as_str());
        self.config
            .routes
            .iter()
            .any(|r| r.to.matches(key.dst) && (r.from == "*" || src_name == Some(r.from.as_str())))
    }

    // --------------------------------------------------------------- views

    /// The configuration it runs.
    pub fn config(&self) -> &ControlConfig {
        &self.config
    }

    /// The daemon's UID (device 0).
    pub fn uid(&self) -> Uid {
        Uid::new(self.config.server, DAEMON_DEVICE)
    }

    /// Time since the core started.
    pub fn uptime(&self, now: Duration) -> Duration {
        now.saturating_sub(self.started)
    }

    /// Local resources by device number.
    pub fn resources(&self) -> impl Iterator<Item = &Resource> {
        self.resources.values()
    }

    /// The resource of `device`.
    pub fn resource(&self, device: u16) -> Option<&Resource> {
        self.resources.get(&device)
    }

    /// Open connections.
    pub fn connections(&self) -> impl Iterator<Item = &Connection> {
        self.connections.values()
    }

    /// Connections being set up (waiting for a tunnel or a verdict).
    pub fn pending_connections(&self) -> impl Iterator<Item = &ConnKey> {
        self.pending.keys()
    }

    /// Peers, by server.
    pub fn peers(&self) -> Vec<PeerView> {
        self.peers
            .iter()
            .map(|(s, p)| PeerView {
                server: *s,
                stack: p.spec.stack.clone(),
                alive: p.alive(),
                failures: p.failures,
                tunnels: p
                    .tunnels
                    .iter()
                    .filter_map(|(c, t)| match t {
                        Tunnel::Open(port) => Some((*c, *port)),
                        Tunnel::Opening => None,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Tunnels peers opened to us.
    pub fn inbound_tunnels(&self) -> Vec<InboundView> {
        self.inbound
            .iter()
            .map(|(id, t)| InboundView {
                tunnel: *id,
                from: t.from,
                class: t.class,
                port: t.port,
            })
            .collect()
    }

    /// The interconnection table: what each local resource reaches
    /// directly, through what, and the configured multi-hop routes.
    pub fn routes(&self) -> Vec<RouteRow> {
        let mut rows = Vec::new();
        for r in self.resources.values() {
            for other in self.resources.values().filter(|o| o.uid != r.uid) {
                rows.push(RouteRow {
                    from: r.uid.to_string(),
                    to: other.uid.to_string(),
                    via: "overlay".into(),
                    stack: "mem".into(),
                    hops: 1,
                });
            }
            for (server, p) in &self.peers {
                if p.alive() {
                    rows.push(RouteRow {
                        from: r.uid.to_string(),
                        to: format!("{server}:*"),
                        via: format!("tunnel port {}", p.tunnel(0).unwrap_or(0)),
                        stack: p.spec.stack.clone(),
                        hops: 1,
                    });
                }
            }
        }
        for route in &self.config.routes {
            rows.push(RouteRow {
                from: route.from.clone(),
                to: format!("{}/{:#x}", route.to.key, route.to.mask),
                via: route.via.clone(),
                stack: "relay".into(),
                hops: 2,
            });
        }
        rows
    }

    /// What the core knows the plane holds (what it submitted and the
    /// plane confirmed).
    pub fn installed(&self) -> &PlaneImage {
        &self.installed
    }

    /// Whether no batch is in flight (then [`Control::installed`] equals
    /// [`Control::picture`] unless the plane refused something).
    pub fn is_idle(&self) -> bool {
        self.job.is_none()
    }
}

/// Whether a plane error says the entry or port is not there.
fn absent(e: &PlaneError) -> bool {
    matches!(
        e,
        PlaneError::NoSuchPort(_)
            | PlaneError::NoTranslation(_)
            | PlaneError::Table(uniplane_overlay::table::TableError::NotFound { .. })
    )
}

fn device_spec(name: &str) -> PortSpec {
    PortSpec {
        kind: PortKind::Device,
        name: name.to_owned(),
        mtu: Message::MAX_PAYLOAD,
    }
}

/// Access rules every port gets: answers flow back, and one-sided
/// requests follow the configured policy.
fn connectionless_rules(config: &ControlConfig) -> Vec<AclRule> {
    let answers = ReqType::ALL.iter().copied().filter(|t| {
        t.is_answer() && !matches!(t, ReqType::Accept | ReqType::Notify | ReqType::Close)
    });
    let mut rules = vec![AclRule {
        types: TypeSet::of(&answers.collect::<Vec<_>>()),
        ..AclRule::ALLOW_ALL
    }];
    let one_sided = [
        ReqType::Write,
        ReqType::Read,
        ReqType::Flush,
        ReqType::Copy,
        ReqType::CopyWrite,
    ];
    for r in &config.rules {
        let types: Vec<ReqType> = match &r.types {
            Some(t) => t
                .iter()
                .copied()
                .filter(|t| one_sided.contains(t))
                .collect(),
            None => one_sided.to_vec(),
        };
        rules.push(AclRule {
            src: r.src.key,
            src_mask: r.src.mask,
            dst: r.dst.key,
            dst_mask: r.dst.mask,
            types: TypeSet::of(&types),
            allow: r.allow,
        });
    }
    let all_one_sided = TypeSet::of(&one_sided);
    match config.default_action {
        DefaultAction::Allow => rules.push(AclRule {
            types: all_one_sided,
            ..AclRule::ALLOW_ALL
        }),
        DefaultAction::AllowLocal => {
            let here = Uid::new(config.server, 0);
            let server_mask = Uid::MASK & !0xffff;
            rules.push(AclRule {
                src: here,
                src_mask: server_mask,
                dst: here,
                dst_mask: server_mask,
                types: all_one_sided,
                allow: true,
            });
        }
        DefaultAction::Deny => {}
    }
    rules
}
