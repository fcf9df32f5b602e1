//! `uniplaned`: DUA's CPU control agent.
//!
//! The daemon owns the overlay engine of its server and everything around
//! it: the registry of local resources (processes that attach, devices it
//! hosts), the interconnection table and routes, connection management
//! with access control, tunnels to peer servers over the configured
//! stacks, and failure detection. Applications reach it over a Unix
//! control socket; their data moves over a separate data path straight
//! into an engine port.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::SinkExt;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::mpsc;
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::{Header, MsgFlags, Params, PortParams, ReqType, Request, Status};
use uniplane_dataplane::{bridge, BoxLink, LinkExt, Locator, Message, Stack, Uid};
use uniplane_overlay::acl::{AclRule, ConnKey, TypeSet};
use uniplane_overlay::table::Route;
use uniplane_overlay::{
    Engine, EngineConfig, EngineHandle, ForwardingPlane, PortId, PortSpec, RunMode,
};

use crate::config::{Config, DefaultAction, DeviceKind, EngineMode};
use crate::control::{
    conn_key, conn_spec, read_line, write_line, Answer, Attached, PeerRequest,
    Request as CtlRequest, MAX_LINE,
};

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// A file or socket operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The engine refused a setup step.
    #[error("engine: {0}")]
    Plane(#[from] uniplane_overlay::PlaneError),
    /// A stack could not listen.
    #[error("stack {stack}: {source}")]
    Stack {
        /// The stack.
        stack: String,
        /// Why.
        source: uniplane_dataplane::StackError,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DaemonError {
    let what = what.into();
    move |source| DaemonError::Io { what, source }
}

/// The runtime directory: the configured one (`runtime.dir`), else
/// `UNIPLANE_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/uniplane`, else
/// `/tmp/uniplane-$UID`.
pub fn runtime_dir(configured: Option<&Path>) -> PathBuf {
    if let Some(dir) = configured {
        return dir.to_owned();
    }
    if let Some(dir) = std::env::var_os("UNIPLANE_RUNTIME_DIR") {
        return PathBuf::from(dir);
    }
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(dir).join("uniplane");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc_getuid() };
    PathBuf::from(format!("/tmp/uniplane-{uid}"))
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}

/// Control socket file name inside the runtime directory.
pub const CONTROL_SOCKET: &str = "control.sock";
/// Data socket file name inside the runtime directory.
pub const DATA_SOCKET: &str = "data.sock";

/// Device number of the daemon itself.
pub const DAEMON_DEVICE: u16 = 0;

/// What a local resource is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResourceKind {
    /// The daemon (device 0).
    Daemon,
    /// A process attached over the control socket.
    Process,
    /// A device the daemon hosts.
    Device(DeviceKind),
}

/// A local resource.
#[derive(Clone, Debug)]
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
    pub listening: HashSet<u16>,
}

/// A connection the daemon set up.
#[derive(Clone, Debug)]
pub struct Connection {
    /// Both ends.
    pub key: ConnKey,
    /// Traffic class.
    pub class: u8,
    /// The remote server, for cross-server connections.
    pub peer: Option<Ipv4Addr>,
    /// When it was set up.
    pub since: Instant,
}

#[derive(Debug)]
struct Peer {
    address: SocketAddr,
    stack: String,
    tunnel_addr: SocketAddr,
    /// Our outgoing tunnel's port for traffic class 0 and connectionless
    /// traffic (our traffic to the peer leaves here).
    tunnel: Option<PortId>,
    /// Tunnels of the other traffic classes, opened on first use.
    class_tunnels: BTreeMap<u8, PortId>,
    /// Requests to send on our outgoing peer channel.
    tx: Option<mpsc::Sender<PeerRequest>>,
    last_seen: Option<Instant>,
    alive: bool,
    failures: u64,
}

struct State {
    next_device: u16,
    resources: BTreeMap<u16, Resource>,
    connections: HashMap<ConnKey, Connection>,
    peers: BTreeMap<Ipv4Addr, Peer>,
    /// Tunnels accepted from peers: port per (server, class).
    inbound_tunnels: HashMap<(Ipv4Addr, u8), PortId>,
    /// Data links waiting for their process to connect: token → (device, link).
    pending_data: HashMap<u64, (u16, RingLink)>,
    /// Connection setup times, local and cross-server.
    setup: [SetupHistogram; 2],
    /// Connections waiting for a peer's verdict.
    pending_peer: HashMap<ConnKey, tokio::sync::oneshot::Sender<Result<(), String>>>,
    next_port: u16,
}

struct Shared {
    config: Config,
    server: Ipv4Addr,
    started: Instant,
    runtime: PathBuf,
    engine: EngineHandle,
    state: Mutex<State>,
    /// The daemon's own port, for notices to applications.
    notices: tokio::sync::Mutex<RingLink>,
    stacks: Vec<Arc<dyn Stack>>,
}

/// A running daemon.
#[derive(Clone)]
pub struct Daemon {
    shared: Arc<Shared>,
}

impl Daemon {
    /// Starts a daemon on the current tokio runtime: engine, devices,
    /// stacks, control and data sockets, peers and the failure monitor.
    pub async fn start(config: Config) -> Result<Daemon, DaemonError> {
        let runtime = runtime_dir(config.runtime_dir.as_deref());
        std::fs::create_dir_all(&runtime)
            .map_err(io_err(format!("creating {}", runtime.display())))?;
        let engine = Engine::new(EngineConfig {
            max_ports: config.max_ports,
            ring_depth: config.ring_depth,
            voq_depth: config.voq_depth,
            table_capacity: config.table_capacity,
            ..EngineConfig::default()
        });
        let mode = match config.mode {
            EngineMode::BusyPoll => RunMode::BusyPoll,
            EngineMode::SpinThenPark => RunMode::SpinThenPark { spins: 2048 },
        };
        let mut engine = engine.spawn(mode);
        let (daemon_port, notices) = engine.attach(PortSpec {
            kind: uniplane_overlay::PortKind::Device,
            name: "daemon".into(),
            mtu: Message::MAX_PAYLOAD,
        })?;
        // The daemon speaks for the control plane: it may send anything.
        engine.add_acl_rule(daemon_port, AclRule::ALLOW_ALL)?;

        let stacks = config
            .stacks
            .iter()
            .filter_map(|s| uniplane_stacks::by_name(&s.name))
            .collect();
        let server = config.server;
        let shared = Arc::new(Shared {
            server,
            started: Instant::now(),
            runtime: runtime.clone(),
            engine,
            state: Mutex::new(State {
                next_device: 1,
                resources: BTreeMap::new(),
                connections: HashMap::new(),
                peers: BTreeMap::new(),
                inbound_tunnels: HashMap::new(),
                pending_data: HashMap::new(),
                pending_peer: HashMap::new(),
                setup: Default::default(),
                next_port: 49152,
            }),
            notices: tokio::sync::Mutex::new(notices),
            stacks,
            config,
        });
        let daemon = Daemon { shared };
        daemon.register(
            "daemon",
            ResourceKind::Daemon,
            Some(DAEMON_DEVICE),
            daemon_port,
        )?;

        for d in daemon.shared.config.devices.clone() {
            let (port, link) = daemon.engine().attach(PortSpec {
                kind: uniplane_overlay::PortKind::Device,
                name: d.name.clone(),
                mtu: Message::MAX_PAYLOAD,
            })?;
            daemon.register(&d.name, ResourceKind::Device(d.kind), d.device, port)?;
            if d.kind == DeviceKind::Relay {
                // A relay forwards what the overlay already admitted at the
                // sender's port; it does not judge it again.
                daemon.engine().add_acl_rule(port, AclRule::ALLOW_ALL)?;
            }
            tokio::spawn(crate::devices::run(d.kind, d.memory, link));
        }
        daemon.install_multi_hop_routes()?;

        // Peers are known before any listener is up: a restarted peer that
        // reconnects at once must find itself known, not refused.
        let peers: Vec<_> = daemon
            .shared
            .config
            .peers
            .iter()
            .map(|p| (p.server, p.clone()))
            .collect();
        let servers: Vec<_> = peers.iter().map(|(server, _)| *server).collect();
        for (server, p) in peers {
            daemon.lock().peers.insert(
                server,
                Peer {
                    address: p.address,
                    stack: p.stack,
                    tunnel_addr: p.tunnel,
                    tunnel: None,
                    class_tunnels: BTreeMap::new(),
                    tx: None,
                    last_seen: None,
                    alive: false,
                    failures: 0,
                },
            );
        }
        daemon.listen_stacks().await?;
        daemon.listen_peers().await?;
        daemon.listen_control().await?;
        for server in servers {
            tokio::spawn(daemon.clone().peer_loop(server));
        }
        tokio::spawn(daemon.clone().failure_monitor());
        tokio::spawn(daemon.clone().drain_daemon_port());
        if let Some(addr) = daemon.shared.config.metrics {
            let listener = TcpListener::bind(addr)
                .await
                .map_err(io_err(format!("metrics on {addr}")))?;
            tokio::spawn(daemon.clone().serve_metrics(listener));
        }
        tracing::info!(server = %server, runtime = %runtime.display(), "uniplaned started");
        Ok(daemon)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Control-plane state; a panic while holding it leaves it usable.
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn engine(&self) -> EngineHandle {
        self.shared.engine.clone()
    }

    /// This server's ID.
    pub fn server(&self) -> Ipv4Addr {
        self.shared.server
    }

    /// The runtime directory holding the sockets.
    pub fn runtime_dir(&self) -> &Path {
        &self.shared.runtime
    }

    /// Removes the sockets so no client reaches a daemon that is stopping.
    pub fn shutdown(&self) {
        let _ = std::fs::remove_file(self.shared.runtime.join(CONTROL_SOCKET));
        let _ = std::fs::remove_file(self.shared.runtime.join(DATA_SOCKET));
    }

    /// The UID of the daemon itself.
    pub fn uid(&self) -> Uid {
        Uid::new(self.shared.server, DAEMON_DEVICE)
    }

    /// Registers a local resource on `port` and installs its routes and
    /// access rules at every port.
    fn register(
        &self,
        name: &str,
        kind: ResourceKind,
        device: Option<u16>,
        port: PortId,
    ) -> Result<Uid, DaemonError> {
        let mut engine = self.engine();
        let (uid, others) = {
            let mut st = self.lock();
            let device = match device {
                Some(d) if !st.resources.contains_key(&d) => d,
                _ => {
                    while st.resources.contains_key(&st.next_device) {
                        st.next_device = st.next_device.wrapping_add(1).max(1);
                    }
                    st.next_device
                }
            };
            let uid = Uid::new(self.shared.server, device);
            st.resources.insert(
                device,
                Resource {
                    name: name.to_owned(),
                    kind: kind.clone(),
                    uid,
                    port,
                    listening: HashSet::new(),
                },
            );
            let others: Vec<(Uid, PortId)> =
                st.resources.values().map(|r| (r.uid, r.port)).collect();
            let tunnels: Vec<(Ipv4Addr, PortId)> = st
                .peers
                .iter()
                .filter_map(|(s, p)| p.alive.then_some((*s, p.tunnel?)))
                .collect();
            let inbound: Vec<PortId> = st.inbound_tunnels.values().copied().collect();
            drop(st);
            for (s, t) in tunnels {
                engine.add_route(port, Route::server(s, t))?;
            }
            for t in inbound {
                engine.add_route(t, Route::exact(uid, port))?;
            }
            (uid, others)
        };
        for (other_uid, other_port) in others {
            engine.add_route(other_port, Route::exact(uid, port))?;
            if other_port != port {
                engine.add_route(port, Route::exact(other_uid, other_port))?;
            }
        }
        for rule in self.connectionless_rules() {
            engine.add_acl_rule(port, rule)?;
        }
        tracing::info!(%uid, name, ?kind, port, "resource registered");
        Ok(uid)
    }

    /// Access rules every port gets: answers flow back, and one-sided
    /// requests follow the configured policy.
    fn connectionless_rules(&self) -> Vec<AclRule> {
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
        for r in &self.shared.config.rules {
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
        match self.shared.config.default_action {
            DefaultAction::Allow => rules.push(AclRule {
                types: all_one_sided,
                ..AclRule::ALLOW_ALL
            }),
            DefaultAction::AllowLocal => {
                let here = Uid::new(self.shared.server, 0);
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

    /// Installs the configured multi-hop routes at every source port they
    /// name (`from = "*"`: every resource but the relay itself), or only at
    /// `only` when given (a resource that just registered).
    fn install_multi_hop_routes_at(&self, only: Option<PortId>) -> Result<(), DaemonError> {
        let mut engine = self.engine();
        for r in self.shared.config.routes.clone() {
            let (sources, via) = {
                let st = self.lock();
                let via = st
                    .resources
                    .values()
                    .find(|x| x.name == r.via)
                    .map(|x| x.port);
                let sources: Vec<PortId> = st
                    .resources
                    .values()
                    .filter(|x| (r.from == "*" || x.name == r.from) && Some(x.port) != via)
                    .filter(|x| x.kind != ResourceKind::Daemon)
                    .map(|x| x.port)
                    .filter(|p| only.is_none_or(|o| o == *p))
                    .collect();
                (sources, via)
            };
            let Some(via) = via else { continue };
            for from in sources {
                engine.add_route(
                    from,
                    Route {
                        key: r.to.key,
                        mask: r.to.mask,
                        priority: 10,
                        port: via,
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Whether a configured multi-hop route carries `key`'s traffic.
    fn multi_hop_covers(&self, key: ConnKey) -> bool {
        let st = self.lock();
        let src_name = st.resources.get(&key.src.device()).map(|r| r.name.clone());
        self.shared.config.routes.iter().any(|r| {
            r.to.matches(key.dst) && (r.from == "*" || src_name.as_deref() == Some(r.from.as_str()))
        })
    }

    fn install_multi_hop_routes(&self) -> Result<(), DaemonError> {
        self.install_multi_hop_routes_at(None)
    }

    /// Removes a resource: its routes everywhere, its connections (peers
    /// and far ends notified), and its engine port.
    async fn unregister(&self, device: u16) {
        let Some(res) = self.lock().resources.remove(&device) else {
            return;
        };
        let conns: Vec<ConnKey> = self
            .lock()
            .connections
            .keys()
            .filter(|k| k.src == res.uid || k.dst == res.uid)
            .copied()
            .collect();
        for c in conns {
            self.close_connection(c, Status::Closed, true).await;
        }
        let mut engine = self.engine();
        let ports: Vec<PortId> = {
            let st = self.lock();
            st.resources
                .values()
                .map(|r| r.port)
                .chain(st.inbound_tunnels.values().copied())
                .collect()
        };
        for p in ports {
            let _ = engine.remove_route(p, res.uid, Uid::MASK);
        }
        let _ = engine.detach(res.port);
        tracing::info!(uid = %res.uid, name = %res.name, "resource unregistered");
    }

    // ---------------------------------------------------------------- control

    async fn listen_control(&self) -> Result<(), DaemonError> {
        let control = self.shared.runtime.join(CONTROL_SOCKET);
        let data = self.shared.runtime.join(DATA_SOCKET);
        let control_l = bind_unix(&control)?;
        let data_l = bind_unix(&data)?;
        tokio::spawn(self.clone().accept_control(control_l));
        tokio::spawn(self.clone().accept_data(data_l));
        Ok(())
    }

    async fn accept_control(self, listener: UnixListener) {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    tokio::spawn(self.clone().control_session(stream));
                }
                Err(e) => {
                    tracing::warn!("control accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    async fn control_session(self, stream: UnixStream) {
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read);
        let mut session = Session::default();
        let mut line = Vec::new();
        loop {
            let Ok(n) = read_line(&mut lines, &mut line).await else {
                break;
            };
            if n == 0 {
                break;
            }
            let answer = if line.len() > MAX_LINE {
                // Skip the rest of the oversized line.
                Answer::err(
                    "bad-request",
                    format!("request longer than {MAX_LINE} bytes"),
                )
            } else {
                match serde_json::from_slice::<CtlRequest>(&line) {
                    Ok(req) => self.handle(&mut session, req).await,
                    Err(e) => Answer::err("bad-request", e.to_string()),
                }
            };
            if write_line(&mut write, &answer).await.is_err() {
                break;
            }
            if line.len() > MAX_LINE {
                break;
            }
        }
        if let Some(device) = session.device {
            self.unregister(device).await;
        }
    }

    async fn handle(&self, session: &mut Session, req: CtlRequest) -> Answer {
        match req {
            CtlRequest::Status => Answer::ok(self.status()),
            CtlRequest::Resources => Answer::ok(self.resources_json()),
            CtlRequest::Routes => Answer::ok(self.routes_json()),
            CtlRequest::Connections => Answer::ok(self.connections_json()),
            CtlRequest::Tables { device } => self.tables(device),
            CtlRequest::Stats => Answer::ok(self.stats()),
            CtlRequest::Metrics => Answer::ok(json!({ "text": self.metrics_text() })),
            CtlRequest::Policy { device, set } => self.policy(device, set),
            CtlRequest::Attach { name } => self.attach(session, name),
            CtlRequest::Listen { port } => match session.device {
                None => Answer::err("not-attached", "attach first"),
                Some(d) => {
                    if let Some(r) = self.lock().resources.get_mut(&d) {
                        r.listening.insert(port);
                    }
                    Answer::ok(json!({ "port": port }))
                }
            },
            CtlRequest::Unlisten { port } => match session.device {
                None => Answer::err("not-attached", "attach first"),
                Some(d) => {
                    if let Some(r) = self.lock().resources.get_mut(&d) {
                        r.listening.remove(&port);
                    }
                    Answer::ok(json!({ "port": port }))
                }
            },
            CtlRequest::Connect {
                src_port,
                dst,
                dst_port,
                class,
            } => {
                let Some(d) = session.device else {
                    return Answer::err("not-attached", "attach first");
                };
                let src_port = if src_port == 0 {
                    self.ephemeral_port()
                } else {
                    src_port
                };
                let key = ConnKey {
                    src: Uid::new(self.shared.server, d),
                    src_port,
                    dst,
                    dst_port,
                };
                match self.connect(key, class).await {
                    Ok(()) => Answer::ok(serde_json::to_value(conn_spec(key)).unwrap_or_default()),
                    Err((kind, msg)) => Answer::err(kind, msg),
                }
            }
            CtlRequest::Close { conn } => {
                let Some(d) = session.device else {
                    return Answer::err("not-attached", "attach first");
                };
                let key: ConnKey = conn_key(conn);
                let me = Uid::new(self.shared.server, d);
                if key.src != me && key.dst != me {
                    return Answer::err("denied", "not your connection");
                }
                let canon = self.canonical(key);
                match canon {
                    Some(k) => {
                        self.close_connection(k, Status::Closed, true).await;
                        Answer::ok(json!({}))
                    }
                    None => Answer::err("not-found", "no such connection"),
                }
            }
        }
    }

    fn ephemeral_port(&self) -> u16 {
        let mut st = self.lock();
        let p = st.next_port;
        st.next_port = if p == u16::MAX { 49152 } else { p + 1 };
        p
    }

    /// The connection as stored (either direction given).
    fn canonical(&self, key: ConnKey) -> Option<ConnKey> {
        let st = self.lock();
        if st.connections.contains_key(&key) {
            Some(key)
        } else if st.connections.contains_key(&key.reversed()) {
            Some(key.reversed())
        } else {
            None
        }
    }

    fn attach(&self, session: &mut Session, name: String) -> Answer {
        if session.device.is_some() {
            return Answer::err("bad-request", "already attached");
        }
        let (port, link) = match self.engine().attach(PortSpec::app(&name)) {
            Ok(x) => x,
            Err(e) => return Answer::err("resources", e.to_string()),
        };
        let uid = match self.register(&name, ResourceKind::Process, None, port) {
            Ok(u) => u,
            Err(e) => {
                let _ = self.engine().detach(port);
                return Answer::err("resources", e.to_string());
            }
        };
        session.device = Some(uid.device());
        if let Err(e) = self.install_multi_hop_routes_at(Some(port)) {
            tracing::warn!("multi-hop routes for {uid}: {e}");
        }
        let token = random_token();
        self.lock().pending_data.insert(token, (uid.device(), link));
        let attached = Attached {
            uid,
            daemon: self.uid(),
            data_socket: self.shared.runtime.join(DATA_SOCKET).display().to_string(),
            token,
        };
        Answer::ok(serde_json::to_value(attached).unwrap_or_default())
    }

    async fn accept_data(self, listener: UnixListener) {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let daemon = self.clone();
            tokio::spawn(async move {
                let mut token = [0u8; 8];
                let read =
                    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut token))
                        .await;
                if !matches!(read, Ok(Ok(_))) {
                    return;
                }
                let Some((device, link)) = daemon
                    .lock()
                    .pending_data
                    .remove(&u64::from_le_bytes(token))
                else {
                    tracing::warn!("data connection with an unknown token");
                    return;
                };
                if stream.write_all(&[1]).await.is_err() {
                    return;
                }
                // The process's data path: shared-memory rings (memfd and
                // eventfd doorbells handed over this socket).
                let shm =
                    match uniplane_shm::ShmLink::serve(stream, &uniplane_shm::ShmConfig::default())
                    {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::warn!(device, "data path setup: {e}");
                            return;
                        }
                    };
                if let Err(e) = bridge(shm, link).await {
                    tracing::debug!(device, "data path ended: {e}");
                }
            });
        }
    }

    // ------------------------------------------------------------ connections

    /// Sets up a connection from a local resource, after the access check.
    async fn connect(&self, key: ConnKey, class: u8) -> Result<(), (&'static str, String)> {
        if !self
            .shared
            .config
            .allows(key.src, key.dst, ReqType::Connect)
        {
            return Err(("denied", format!("policy denies {} → {}", key.src, key.dst)));
        }
        if self.lock().connections.contains_key(&key) {
            return Err(("exists", "connection already open".into()));
        }
        let started = Instant::now();
        let remote = key.dst.server() != self.shared.server;
        if remote {
            self.admit_remote(key, class).await?;
        } else {
            self.admit_local(key)?;
        }
        self.lock().setup[usize::from(remote)].record(started.elapsed());
        self.lock().connections.insert(
            key,
            Connection {
                key,
                class,
                peer: (key.dst.server() != self.shared.server).then_some(key.dst.server()),
                since: Instant::now(),
            },
        );
        tracing::info!(src = %key.src, sport = key.src_port, dst = %key.dst, dport = key.dst_port, class, "connection open");
        Ok(())
    }

    /// A connection whose far end is on this server.
    fn admit_local(&self, key: ConnKey) -> Result<(), (&'static str, String)> {
        let (src_port, dst_port, dst_kind) = {
            let st = self.lock();
            let src = st
                .resources
                .get(&key.src.device())
                .ok_or(("not-found", "source not attached".to_string()))?;
            let dst = st
                .resources
                .get(&key.dst.device())
                .ok_or(("refused", format!("no resource {}", key.dst)))?;
            let listening = matches!(dst.kind, ResourceKind::Device(_))
                || dst.listening.contains(&key.dst_port);
            if !listening {
                return Err((
                    "refused",
                    format!("nothing listens at {}/{}", key.dst, key.dst_port),
                ));
            }
            (src.port, dst.port, dst.kind.clone())
        };
        let mut engine = self.engine();
        let fail = |e: uniplane_overlay::PlaneError| ("engine", e.to_string());
        engine.allow_connection(src_port, key).map_err(fail)?;
        engine.allow_connection(dst_port, key).map_err(fail)?;
        if dst_kind == ResourceKind::Process {
            self.notify(key.dst, key.dst_port, ReqType::Connect, key, Status::Ok);
        }
        Ok(())
    }

    /// A connection to a resource of a peer server: the peer admits its
    /// end, then this end is installed and steered into the tunnel.
    async fn admit_remote(&self, key: ConnKey, class: u8) -> Result<(), (&'static str, String)> {
        let server = key.dst.server();
        let (tx, tunnel, src_port) = {
            let st = self.lock();
            let peer = st
                .peers
                .get(&server)
                .ok_or(("no-route", format!("no peer server {server}")))?;
            if !peer.alive {
                return Err(("peer-down", format!("peer {server} is not reachable")));
            }
            let src = st
                .resources
                .get(&key.src.device())
                .ok_or(("not-found", "source not attached".to_string()))?;
            (peer.tx.clone(), peer.tunnel, src.port)
        };
        let (Some(tx), Some(_)) = (tx, tunnel) else {
            return Err(("peer-down", format!("peer {server} has no channel yet")));
        };
        let tunnel = self.class_tunnel(server, class).await.map_err(|e| {
            (
                "peer-down",
                format!("tunnel of class {class} to {server}: {e}"),
            )
        })?;
        let (reply_tx, reply_rx) = tokio::sync::oneshot::channel();
        self.lock().pending_peer.insert(key, reply_tx);
        let sent = tx
            .send(PeerRequest::Connect {
                conn: conn_spec(key),
                class,
            })
            .await;
        if sent.is_err() {
            self.lock().pending_peer.remove(&key);
            return Err(("peer-down", format!("peer {server} channel closed")));
        }
        let verdict = tokio::time::timeout(Duration::from_secs(2), reply_rx).await;
        self.lock().pending_peer.remove(&key);
        match verdict {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(why))) => return Err(("refused", why)),
            _ => return Err(("timeout", format!("peer {server} did not answer"))),
        }
        let mut engine = self.engine();
        let fail = |e: uniplane_overlay::PlaneError| ("engine", e.to_string());
        engine.allow_connection(src_port, key).map_err(fail)?;
        // A configured multi-hop route decides the path itself (through its
        // relay, then the table's tunnel route); otherwise the translator
        // steers the connection into the tunnel of its class.
        if !self.multi_hop_covers(key) {
            engine.add_translation(key, tunnel).map_err(fail)?;
        }
        let inbound: Vec<PortId> = self
            .lock()
            .inbound_tunnels
            .iter()
            .filter(|((s, _), _)| *s == server)
            .map(|(_, p)| *p)
            .collect();
        for t in inbound {
            engine.allow_connection(t, key).map_err(fail)?;
        }
        Ok(())
    }

    /// A peer asks to connect one of its resources to one of ours.
    fn admit_from_peer(&self, from: Ipv4Addr, key: ConnKey, class: u8) -> Result<(), String> {
        if key.src.server() != from || key.dst.server() != self.shared.server {
            return Err("connection does not join the two servers".into());
        }
        if !self
            .shared
            .config
            .allows(key.src, key.dst, ReqType::Connect)
        {
            return Err(format!("policy denies {} → {}", key.src, key.dst));
        }
        let (dst_port, dst_kind, tunnels) = {
            let st = self.lock();
            let dst = st
                .resources
                .get(&key.dst.device())
                .ok_or(format!("no resource {}", key.dst))?;
            let listening = matches!(dst.kind, ResourceKind::Device(_))
                || dst.listening.contains(&key.dst_port);
            if !listening {
                return Err(format!("nothing listens at {}/{}", key.dst, key.dst_port));
            }
            let tunnels: Vec<PortId> = st
                .inbound_tunnels
                .iter()
                .filter(|((s, _), _)| *s == from)
                .map(|(_, p)| *p)
                .chain(st.peers.get(&from).and_then(|p| p.tunnel))
                .collect();
            (dst.port, dst.kind.clone(), tunnels)
        };
        let mut engine = self.engine();
        engine
            .allow_connection(dst_port, key)
            .map_err(|e| e.to_string())?;
        for t in tunnels {
            engine.allow_connection(t, key).map_err(|e| e.to_string())?;
        }
        self.lock().connections.insert(
            key,
            Connection {
                key,
                class,
                peer: Some(from),
                since: Instant::now(),
            },
        );
        if dst_kind == ResourceKind::Process {
            self.notify(key.dst, key.dst_port, ReqType::Connect, key, Status::Ok);
        }
        Ok(())
    }

    /// Removes a connection's entries and tells its local ends (and, when
    /// `tell_peer`, the peer daemon) that it is gone with `status`.
    async fn close_connection(&self, key: ConnKey, status: Status, tell_peer: bool) {
        let Some(conn) = self.lock().connections.remove(&key) else {
            return;
        };
        let mut engine = self.engine();
        let ports: Vec<(Uid, PortId, u16, bool)> = {
            let st = self.lock();
            [(key.src, key.src_port), (key.dst, key.dst_port)]
                .into_iter()
                .filter(|(u, _)| u.server() == self.shared.server)
                .filter_map(|(u, p)| {
                    st.resources
                        .get(&u.device())
                        .map(|r| (u, r.port, p, r.kind == ResourceKind::Process))
                })
                .collect()
        };
        let tunnels: Vec<PortId> = {
            let st = self.lock();
            st.inbound_tunnels
                .values()
                .copied()
                .chain(st.peers.values().filter_map(|p| p.tunnel))
                .chain(
                    st.peers
                        .values()
                        .flat_map(|p| p.class_tunnels.values().copied()),
                )
                .collect()
        };
        for (_, port, _, _) in &ports {
            let _ = engine.revoke_connection(*port, key);
        }
        for t in tunnels {
            let _ = engine.revoke_connection(t, key);
        }
        let _ = engine.remove_translation(key);
        let _ = engine.remove_translation(key.reversed());
        for (uid, _, local_port, is_process) in ports {
            if is_process {
                let kind = if status == Status::Closed {
                    ReqType::Close
                } else {
                    ReqType::Notify
                };
                let seen_from = if uid == key.src { key } else { key.reversed() };
                self.notify(uid, local_port, kind, seen_from, status);
            }
        }
        if tell_peer {
            if let Some(server) = conn.peer {
                let tx = self.lock().peers.get(&server).and_then(|p| p.tx.clone());
                if let Some(tx) = tx {
                    let _ = tx.try_send(PeerRequest::Close {
                        conn: conn_spec(key),
                    });
                }
            }
        }
        tracing::info!(src = %key.src, dst = %key.dst, ?status, "connection closed");
    }

    /// Sends a control notice to a local process through the overlay: a
    /// CONNECT (a connection arrived), CLOSE or NOTIFY (it is gone), from
    /// the daemon, to `uid`'s `port`. The payload names the connection as
    /// the process sees it: its own port, the remote UID and port.
    fn notify(&self, uid: Uid, port: u16, kind: ReqType, conn_seen_from: ConnKey, status: Status) {
        let (local, remote) = if conn_seen_from.src == uid {
            (
                (conn_seen_from.src, conn_seen_from.src_port),
                (conn_seen_from.dst, conn_seen_from.dst_port),
            )
        } else {
            (
                (conn_seen_from.dst, conn_seen_from.dst_port),
                (conn_seen_from.src, conn_seen_from.src_port),
            )
        };
        let Some(m) = notice(self.uid(), local.0, port, kind, local.1, remote, status) else {
            return;
        };
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let mut link = shared.notices.lock().await;
            let _ = link.send(m).await;
        });
    }

    // ------------------------------------------------------------------ peers

    async fn listen_peers(&self) -> Result<(), DaemonError> {
        let addr = self.shared.config.peer_listen;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(io_err(format!("peer listener on {addr}")))?;
        let daemon = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                tokio::spawn(daemon.clone().peer_session(stream));
            }
        });
        Ok(())
    }

    /// An incoming peer channel: the peer's requests and heartbeats.
    async fn peer_session(self, stream: TcpStream) {
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read);
        let mut line = Vec::new();
        let mut from: Option<Ipv4Addr> = None;
        loop {
            let Ok(n) = read_line(&mut lines, &mut line).await else {
                break;
            };
            if n == 0 || line.len() > MAX_LINE {
                break;
            }
            let answer = match serde_json::from_slice::<PeerRequest>(&line) {
                Err(e) => Some(Answer::err("bad-request", e.to_string())),
                Ok(PeerRequest::Hello { server, name }) => {
                    tracing::info!(%server, name, "peer channel up");
                    from = Some(server);
                    self.peer_seen(server);
                    Some(Answer::ok(json!({ "server": self.shared.server })))
                }
                Ok(_) if from.is_none() => Some(Answer::err("bad-request", "hello first")),
                Ok(PeerRequest::Heartbeat) => {
                    if let Some(s) = from {
                        self.peer_seen(s);
                    }
                    None
                }
                Ok(PeerRequest::Connect { conn, class }) => {
                    let s = from.unwrap_or(Ipv4Addr::UNSPECIFIED);
                    self.peer_seen(s);
                    Some(match self.admit_from_peer(s, conn_key(conn), class) {
                        Ok(()) => Answer::ok(serde_json::to_value(conn).unwrap_or_default()),
                        Err(why) => Answer::err("refused", why),
                    })
                }
                Ok(PeerRequest::Close { conn }) => {
                    let key: ConnKey = conn_key(conn);
                    if let Some(k) = self.canonical(key) {
                        self.close_connection(k, Status::Closed, false).await;
                    }
                    None
                }
            };
            if let Some(a) = answer {
                if write_line(&mut write, &a).await.is_err() {
                    break;
                }
            }
        }
    }

    fn peer_seen(&self, server: Ipv4Addr) {
        if let Some(p) = self.lock().peers.get_mut(&server) {
            p.last_seen = Some(Instant::now());
        }
    }

    /// Our outgoing channel and tunnel to one peer, re-established for as
    /// long as the daemon runs.
    async fn peer_loop(self, server: Ipv4Addr) {
        let interval = self.shared.config.heartbeat;
        loop {
            match self.peer_up(server).await {
                Ok(()) => {}
                Err(e) => tracing::debug!(%server, "peer connection: {e}"),
            }
            self.peer_down(server, Status::PeerFailed).await;
            tokio::time::sleep(interval.max(Duration::from_millis(50))).await;
        }
    }

    async fn peer_up(&self, server: Ipv4Addr) -> Result<(), String> {
        let address = {
            let st = self.lock();
            st.peers.get(&server).ok_or("unknown peer")?.address
        };
        let stream = tokio::time::timeout(Duration::from_secs(1), TcpStream::connect(address))
            .await
            .map_err(|_| "connect timed out".to_string())?
            .map_err(|e| e.to_string())?;
        let _ = stream.set_nodelay(true);
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read);
        let hello = PeerRequest::Hello {
            server: self.shared.server,
            name: self.shared.config.name.clone(),
        };
        write_line(&mut write, &hello)
            .await
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        lines
            .read_line(&mut line)
            .await
            .map_err(|e| e.to_string())?;
        let a: Answer = serde_json::from_str(&line).map_err(|e| e.to_string())?;
        if !a.ok {
            return Err(format!("peer refused hello: {:?}", a.error));
        }

        let (tport, tunnel_task) = self.open_tunnel(server, 0).await?;
        let mut engine = self.engine();

        let (tx, mut rx) = mpsc::channel::<PeerRequest>(64);
        {
            let mut st = self.lock();
            if let Some(p) = st.peers.get_mut(&server) {
                p.tunnel = Some(tport);
                p.tx = Some(tx);
                p.alive = true;
                p.last_seen = Some(Instant::now());
            }
        }
        // Routes: every local port reaches the peer's server through the tunnel.
        let ports: Vec<PortId> = self.lock().resources.values().map(|r| r.port).collect();
        for p in ports {
            let _ = engine.add_route(p, Route::server(server, tport));
        }
        tracing::info!(%server, tunnel = tport, "peer up");

        let interval = self.shared.config.heartbeat;
        let mut beat = tokio::time::interval(interval);
        let mut reply = String::new();
        let result = loop {
            tokio::select! {
                _ = beat.tick() => {
                    if let Err(e) = write_line(&mut write, &PeerRequest::Heartbeat).await.map_err(|e| e.to_string()) {
                        break Err(e);
                    }
                }
                req = rx.recv() => {
                    let Some(req) = req else { break Ok(()) };
                    let conn = match &req { PeerRequest::Connect { conn, .. } => Some(*conn), _ => None };
                    if let Err(e) = write_line(&mut write, &req).await.map_err(|e| e.to_string()) {
                        break Err(e);
                    }
                    if let Some(conn) = conn {
                        reply.clear();
                        let read = tokio::time::timeout(Duration::from_secs(2), lines.read_line(&mut reply)).await;
                        let verdict = match read {
                            Ok(Ok(n)) if n > 0 => match serde_json::from_str::<Answer>(&reply) {
                                Ok(a) if a.ok => Ok(()),
                                Ok(a) => Err(a.error.map(|e| e.message).unwrap_or_default()),
                                Err(e) => Err(e.to_string()),
                            },
                            _ => Err("peer did not answer".to_string()),
                        };
                        let waiter = self.lock().pending_peer.remove(&conn_key(conn));
                        if let Some(w) = waiter {
                            let _ = w.send(verdict);
                        }
                    }
                }
                _ = self.peer_failed_signal(server) => break Err("peer declared failed".into()),
            }
        };
        tunnel_task.abort();
        result
    }

    /// Opens our tunnel of traffic class `class` to `server`: a link of
    /// the peer's stack to its tunnel listener, a hello naming us and the
    /// class, and a tunnel port on our engine bridged to the link.
    async fn open_tunnel(
        &self,
        server: Ipv4Addr,
        class: u8,
    ) -> Result<
        (
            PortId,
            tokio::task::JoinHandle<Result<(), uniplane_dataplane::LinkError>>,
        ),
        String,
    > {
        let (stack_name, tunnel_addr) = {
            let st = self.lock();
            let p = st.peers.get(&server).ok_or("unknown peer")?;
            (p.stack.clone(), p.tunnel_addr)
        };
        let stack = self
            .shared
            .stacks
            .iter()
            .find(|s| s.name() == stack_name)
            .cloned()
            .ok_or(format!("stack {stack_name} not running"))?;
        let mut link = stack
            .connect(&Locator::Socket(tunnel_addr))
            .await
            .map_err(|e| e.to_string())?;
        let hello = tunnel_hello(self.uid(), Uid::new(server, DAEMON_DEVICE), class)
            .ok_or("hello message")?;
        link.send(hello).await.map_err(|e| e.to_string())?;
        let mtu = stack
            .capabilities()
            .mtu
            .saturating_sub(64)
            .clamp(256, Message::MAX_PAYLOAD);
        let (tport, tlink) = self
            .engine()
            .attach(PortSpec::tunnel(
                &format!("tunnel-{server}-class{class}"),
                class,
                mtu,
            ))
            .map_err(|e| e.to_string())?;
        let _ = self.engine().add_acl_rule(tport, AclRule::ALLOW_ALL);
        Ok((tport, tokio::spawn(bridge(link, tlink))))
    }

    /// The tunnel of `class` to `server`, opened on first use; connections
    /// of one class to one server share it.
    async fn class_tunnel(&self, server: Ipv4Addr, class: u8) -> Result<PortId, String> {
        {
            let st = self.lock();
            let p = st.peers.get(&server).ok_or("unknown peer")?;
            if class == 0 {
                return p.tunnel.ok_or_else(|| "peer has no tunnel".to_string());
            }
            if let Some(t) = p.class_tunnels.get(&class) {
                return Ok(*t);
            }
        }
        let (port, _task) = self.open_tunnel(server, class).await?;
        let mut st = self.lock();
        let p = st.peers.get_mut(&server).ok_or("unknown peer")?;
        match p.class_tunnels.get(&class) {
            // Opened twice at once: keep the first, drop ours.
            Some(t) => {
                let t = *t;
                drop(st);
                let _ = self.engine().detach(port);
                Ok(t)
            }
            None => {
                p.class_tunnels.insert(class, port);
                Ok(port)
            }
        }
    }

    /// Resolves when the failure monitor declares `server` failed.
    async fn peer_failed_signal(&self, server: Ipv4Addr) {
        loop {
            tokio::time::sleep(self.shared.config.heartbeat).await;
            let alive = self.lock().peers.get(&server).is_some_and(|p| p.alive);
            if !alive {
                return;
            }
        }
    }

    /// Takes a peer down: its routes go, its tunnel port is detached, and
    /// every connection through it is closed and its application told.
    async fn peer_down(&self, server: Ipv4Addr, status: Status) {
        let tunnel = {
            let mut st = self.lock();
            let Some(p) = st.peers.get_mut(&server) else {
                return;
            };
            let was_alive = p.alive || p.tunnel.is_some();
            p.alive = false;
            p.tx = None;
            if was_alive {
                p.failures += 1;
            }
            let classes: Vec<PortId> = std::mem::take(&mut p.class_tunnels).into_values().collect();
            (p.tunnel.take(), classes)
        };
        let (tunnel, class_tunnels) = tunnel;
        let mut engine = self.engine();
        let ports: Vec<PortId> = self.lock().resources.values().map(|r| r.port).collect();
        let key = Uid::new(server, 0);
        for p in ports {
            let _ = engine.remove_route(p, key, Uid::MASK & !0xffff);
        }
        let affected: Vec<ConnKey> = self
            .lock()
            .connections
            .values()
            .filter(|c| c.peer == Some(server))
            .map(|c| c.key)
            .collect();
        for c in affected {
            self.close_connection(c, status, false).await;
        }
        for t in class_tunnels {
            let _ = engine.detach(t);
        }
        if let Some(t) = tunnel {
            let _ = engine.detach(t);
            tracing::warn!(%server, "peer down");
        }
    }

    async fn failure_monitor(self) {
        let interval = self.shared.config.heartbeat;
        let limit = interval * self.shared.config.misses;
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let failed: Vec<Ipv4Addr> = self
                .lock()
                .peers
                .iter()
                .filter(|(_, p)| p.alive && p.last_seen.is_none_or(|t| t.elapsed() > limit))
                .map(|(s, _)| *s)
                .collect();
            for s in failed {
                tracing::warn!(server = %s, "peer silent for {limit:?}: failed");
                self.peer_down(s, Status::PeerFailed).await;
            }
        }
    }

    // ----------------------------------------------------------------- stacks

    async fn listen_stacks(&self) -> Result<(), DaemonError> {
        for sc in self.shared.config.stacks.clone() {
            let (Some(addr), Some(stack)) = (
                sc.listen,
                self.shared
                    .stacks
                    .iter()
                    .find(|s| s.name() == sc.name)
                    .cloned(),
            ) else {
                continue;
            };
            let listener = stack
                .listen(&Locator::Socket(addr))
                .await
                .map_err(|source| DaemonError::Stack {
                    stack: sc.name.clone(),
                    source,
                })?;
            let daemon = self.clone();
            let mtu = stack
                .capabilities()
                .mtu
                .saturating_sub(64)
                .clamp(256, Message::MAX_PAYLOAD);
            tokio::spawn(async move {
                let mut listener = listener;
                while let Some(accepted) = futures_util::StreamExt::next(&mut listener).await {
                    match accepted {
                        Ok(link) => {
                            tokio::spawn(daemon.clone().inbound_tunnel(link, mtu));
                        }
                        Err(e) => tracing::warn!("tunnel accept: {e}"),
                    }
                }
            });
            tracing::info!(stack = %sc.name, %addr, "tunnel listener up");
        }
        Ok(())
    }

    /// A tunnel a peer opened to us: its first message says who it is.
    async fn inbound_tunnel(self, mut link: BoxLink, mtu: usize) {
        let mut first = Vec::with_capacity(1);
        let hello =
            tokio::time::timeout(Duration::from_secs(2), link.recv_batch(&mut first, 1)).await;
        let Ok(Ok(1)) = hello else {
            return;
        };
        let m = &first[0];
        let from = m.header().src.server();
        let known = self.lock().peers.contains_key(&from);
        if m.kind() != ReqType::Connect || m.header().dst != self.uid() || !known {
            tracing::warn!(%from, "tunnel from an unknown or confused peer refused");
            return;
        }
        let class = m.header().request.ports().map_or(0, |(c, _)| c as u8);
        let Ok((port, tlink)) =
            self.engine()
                .attach(PortSpec::tunnel(&format!("from-{from}"), class, mtu))
        else {
            return;
        };
        let mut engine = self.engine();
        // Routes to our resources from the tunnel; access per connection.
        let locals: Vec<(Uid, PortId)> = self
            .lock()
            .resources
            .values()
            .map(|r| (r.uid, r.port))
            .collect();
        for (uid, p) in locals {
            let _ = engine.add_route(port, Route::exact(uid, p));
        }
        for rule in self.connectionless_rules() {
            let _ = engine.add_acl_rule(port, rule);
        }
        let existing: Vec<ConnKey> = self
            .lock()
            .connections
            .values()
            .filter(|c| c.peer == Some(from))
            .map(|c| c.key)
            .collect();
        for c in existing {
            let _ = engine.allow_connection(port, c);
        }
        if let Some(old) = self.lock().inbound_tunnels.insert((from, class), port) {
            let _ = engine.detach(old);
        }
        tracing::info!(%from, class, port, "inbound tunnel up");
        let _ = bridge(link, tlink).await;
        let mut st = self.lock();
        if st.inbound_tunnels.get(&(from, class)) == Some(&port) {
            st.inbound_tunnels.remove(&(from, class));
            drop(st);
            let _ = engine.detach(port);
        }
    }

    /// Reads what reaches the daemon's own port (answers to notices).
    async fn drain_daemon_port(self) {
        // The notices link is shared with senders; poll it briefly.
        let mut buf = Vec::with_capacity(64);
        loop {
            {
                let mut link = self.shared.notices.lock().await;
                buf.clear();
                let got =
                    tokio::time::timeout(Duration::from_millis(100), link.recv_batch(&mut buf, 64))
                        .await;
                if let Ok(Ok(0)) = got {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    }

    // ----------------------------------------------------------- observation

    fn status(&self) -> serde_json::Value {
        let st = self.lock();
        json!({
            "server": self.shared.server.to_string(),
            "name": self.shared.config.name,
            "uid": self.uid().to_string(),
            "uptime_s": self.shared.started.elapsed().as_secs_f64(),
            "runtime_dir": self.shared.runtime.display().to_string(),
            "resources": st.resources.len(),
            "connections": st.connections.len(),
            "stacks": self.shared.stacks.iter().map(|s| s.name()).collect::<Vec<_>>(),
            "peers": st.peers.iter().map(|(s, p)| json!({
                "server": s.to_string(), "address": p.address.to_string(),
                "alive": p.alive, "failures": p.failures,
            })).collect::<Vec<_>>(),
        })
    }

    fn resources_json(&self) -> serde_json::Value {
        let st = self.lock();
        json!(st
            .resources
            .iter()
            .map(|(d, r)| json!({
                "device": d, "uid": r.uid.to_string(), "name": r.name,
                "kind": match &r.kind {
                    ResourceKind::Daemon => "daemon".to_string(),
                    ResourceKind::Process => "process".to_string(),
                    ResourceKind::Device(k) => format!("{k:?}").to_lowercase(),
                },
                "port": r.port,
                "listening": r.listening.iter().collect::<Vec<_>>(),
            }))
            .collect::<Vec<_>>())
    }

    /// The interconnection table (DUA Fig. 5): what each local device
    /// reaches directly, through which stack, and the routes over it.
    fn routes_json(&self) -> serde_json::Value {
        let st = self.lock();
        let mut rows = Vec::new();
        for r in st.resources.values() {
            for other in st.resources.values().filter(|o| o.uid != r.uid) {
                rows.push(json!({ "from": r.uid.to_string(), "to": other.uid.to_string(), "via": "overlay", "stack": "mem", "hops": 1 }));
            }
            for (server, p) in &st.peers {
                if p.alive {
                    rows.push(json!({ "from": r.uid.to_string(), "to": format!("{server}:*"), "via": format!("tunnel port {}", p.tunnel.unwrap_or(0)), "stack": p.stack, "hops": 1 }));
                }
            }
        }
        for route in &self.shared.config.routes {
            rows.push(json!({ "from": route.from, "to": format!("{}/{:#x}", route.to.key, route.to.mask), "via": route.via, "stack": "relay", "hops": 2 }));
        }
        json!(rows)
    }

    fn connections_json(&self) -> serde_json::Value {
        let st = self.lock();
        json!(st
            .connections
            .values()
            .map(|c| json!({
                "src": c.key.src.to_string(), "src_port": c.key.src_port,
                "dst": c.key.dst.to_string(), "dst_port": c.key.dst_port,
                "class": c.class, "peer": c.peer.map(|p| p.to_string()),
                "age_s": c.since.elapsed().as_secs_f64(),
            }))
            .collect::<Vec<_>>())
    }

    fn tables(&self, device: u16) -> Answer {
        let Some(port) = self.lock().resources.get(&device).map(|r| r.port) else {
            return Answer::err("not-found", format!("no device {device}"));
        };
        match self.engine().counters(port) {
            Ok(c) => {
                Answer::ok(json!({ "device": device, "port": port, "counters": counters_json(&c) }))
            }
            Err(e) => Answer::err("engine", e.to_string()),
        }
    }

    fn policy(&self, device: u16, set: Option<String>) -> Answer {
        let Some(port) = self.lock().resources.get(&device).map(|r| r.port) else {
            return Answer::err("not-found", format!("no device {device}"));
        };
        let Some(text) = set else {
            return Answer::ok(json!({ "device": device, "port": port }));
        };
        let policy = match parse_policy(&text) {
            Ok(p) => p,
            Err(e) => return Answer::err("bad-request", e),
        };
        match self.engine().set_policy(port, policy) {
            Ok(()) => Answer::ok(json!({ "device": device, "policy": text })),
            Err(e) => Answer::err("bad-request", e.to_string()),
        }
    }

    fn port_counters(&self) -> Vec<(String, PortId, uniplane_overlay::PortCounters)> {
        let ports: Vec<(String, PortId)> = {
            let st = self.lock();
            st.resources
                .values()
                .map(|r| (r.name.clone(), r.port))
                .chain(
                    st.peers
                        .iter()
                        .filter_map(|(s, p)| Some((format!("tunnel-{s}-class0"), p.tunnel?))),
                )
                .chain(st.peers.iter().flat_map(|(s, p)| {
                    p.class_tunnels
                        .iter()
                        .map(move |(c, t)| (format!("tunnel-{s}-class{c}"), *t))
                }))
                .chain(
                    st.inbound_tunnels
                        .iter()
                        .map(|((s, c), p)| (format!("from-{s}-class{c}"), *p)),
                )
                .collect()
        };
        let mut engine = self.engine();
        ports
            .into_iter()
            .filter_map(|(n, p)| Some((n, p, engine.counters(p).ok()?)))
            .collect()
    }

    fn stats(&self) -> serde_json::Value {
        json!(self
            .port_counters()
            .into_iter()
            .map(|(name, port, c)| json!({ "name": name, "port": port, "counters": counters_json(&c) }))
            .collect::<Vec<_>>())
    }

    /// Every counter in Prometheus text exposition format.
    pub fn metrics_text(&self) -> String {
        let mut out = String::new();
        let counters = self.port_counters();
        let families: [CounterFamily; 8] = [
            (
                "uniplane_port_rx_messages_total",
                "Messages read from the port",
                |c| c.rx_msgs,
            ),
            (
                "uniplane_port_rx_bytes_total",
                "Payload bytes read from the port",
                |c| c.rx_bytes,
            ),
            (
                "uniplane_port_tx_messages_total",
                "Messages written to the port",
                |c| c.tx_msgs,
            ),
            (
                "uniplane_port_tx_bytes_total",
                "Payload bytes written to the port",
                |c| c.tx_bytes,
            ),
            (
                "uniplane_port_acl_denied_total",
                "Messages refused by access control",
                |c| c.acl_denied,
            ),
            (
                "uniplane_port_no_route_total",
                "Messages with no route",
                |c| c.no_route,
            ),
            (
                "uniplane_port_input_stalls_total",
                "Times the input waited for a full queue",
                |c| c.input_stalls,
            ),
            (
                "uniplane_port_segments_total",
                "Segments created for the MTU",
                |c| c.segments,
            ),
        ];
        for (name, help, get) in families {
            out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} counter\n"));
            for (port_name, port, c) in &counters {
                out.push_str(&format!(
                    "{name}{{port=\"{port}\",name=\"{port_name}\"}} {}\n",
                    get(c)
                ));
            }
        }
        let st = self.lock();
        out.push_str(
            "# HELP uniplane_connections Open connections\n# TYPE uniplane_connections gauge\n",
        );
        out.push_str(&format!("uniplane_connections {}\n", st.connections.len()));
        out.push_str("# HELP uniplane_connect_seconds Time to set up a connection\n# TYPE uniplane_connect_seconds histogram\n");
        for (h, path) in st.setup.iter().zip(["local", "remote"]) {
            h.write(
                &mut out,
                "uniplane_connect_seconds",
                &format!("path=\"{path}\""),
            );
        }
        out.push_str("# HELP uniplane_peer_up Whether a peer daemon is reachable\n# TYPE uniplane_peer_up gauge\n");
        for (s, p) in &st.peers {
            out.push_str(&format!(
                "uniplane_peer_up{{server=\"{s}\"}} {}\n",
                u8::from(p.alive)
            ));
        }
        out
    }

    async fn serve_metrics(self, listener: TcpListener) {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            let body = self.metrics_text();
            tokio::spawn(async move {
                let mut req = [0u8; 1024];
                let _ = tokio::time::timeout(Duration::from_secs(1), stream.read(&mut req)).await;
                let head = format!(
                    "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n",
                    body.len()
                );
                let _ = stream.write_all(head.as_bytes()).await;
                let _ = stream.write_all(body.as_bytes()).await;
            });
        }
    }
}

/// A Prometheus histogram with fixed buckets, in seconds.
#[derive(Clone, Debug, Default)]
struct SetupHistogram {
    counts: [u64; SETUP_BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// Upper bounds of the connection-setup buckets, in seconds.
const SETUP_BUCKETS: [f64; 10] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0,
];

impl SetupHistogram {
    fn record(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, bound) in SETUP_BUCKETS.iter().enumerate() {
            if s <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += s;
    }

    fn write(&self, out: &mut String, name: &str, labels: &str) {
        for (bound, n) in SETUP_BUCKETS.iter().zip(self.counts) {
            out.push_str(&format!("{name}_bucket{{{labels},le=\"{bound}\"}} {n}\n"));
        }
        out.push_str(&format!(
            "{name}_bucket{{{labels},le=\"+Inf\"}} {}\n",
            self.count
        ));
        out.push_str(&format!(
            "{name}_sum{{{labels}}} {}\n{name}_count{{{labels}}} {}\n",
            self.sum, self.count
        ));
    }
}

/// A Prometheus counter family: name, help, and how to read it.
type CounterFamily = (
    &'static str,
    &'static str,
    fn(&uniplane_overlay::PortCounters) -> u64,
);

#[derive(Default)]
struct Session {
    device: Option<u16>,
}

fn counters_json(c: &uniplane_overlay::PortCounters) -> serde_json::Value {
    json!({
        "rx_msgs": c.rx_msgs, "rx_bytes": c.rx_bytes, "tx_msgs": c.tx_msgs, "tx_bytes": c.tx_bytes,
        "acl_denied": c.acl_denied, "no_route": c.no_route, "error_answers": c.error_answers,
        "unanswerable": c.unanswerable, "segments": c.segments, "input_stalls": c.input_stalls,
        "reassembled": c.reassembly.completed, "reassembly_incomplete": c.reassembly.incomplete,
    })
}

/// Parses `rr`, `weighted:W0:W1:…` or `strict:C0/W0,C1/W1,…`.
pub fn parse_policy(text: &str) -> Result<uniplane_dataplane::sched::Policy, String> {
    use uniplane_dataplane::sched::Policy;
    let bad = || format!("`{text}` is not a policy: rr, weighted:1:2:… or strict:0/1,1/1,…");
    if text == "rr" {
        return Ok(Policy::RoundRobin);
    }
    if let Some(w) = text.strip_prefix("weighted:") {
        let weights: Result<Vec<u32>, _> = w.split(':').map(str::parse).collect();
        return weights.map(Policy::Weighted).map_err(|_| bad());
    }
    if let Some(s) = text.strip_prefix("strict:") {
        let mut class = Vec::new();
        let mut weights = Vec::new();
        for item in s.split(',') {
            let (c, w) = item.split_once('/').ok_or_else(bad)?;
            class.push(c.parse().map_err(|_| bad())?);
            weights.push(w.parse().map_err(|_| bad())?);
        }
        return Ok(Policy::StrictPriority { class, weights });
    }
    Err(bad())
}

/// The first message on a tunnel: a CONNECT from the opening daemon to
/// the accepting one, whose source port carries the traffic class.
fn tunnel_hello(from: Uid, to: Uid, class: u8) -> Option<Message> {
    let request = Request::new(
        ReqType::Connect,
        Params::Port(PortParams {
            flag: 0,
            src_port: u16::from(class),
            dst_port: 0,
        }),
    )
    .ok()?;
    Message::new(Header::new(from, to, request), Bytes::new()).ok()
}

/// A notice from the daemon to a process: `kind` at the process's
/// `port`, payload = local port (2 bytes), remote UID (6), remote port (2).
fn notice(
    daemon: Uid,
    to: Uid,
    port: u16,
    kind: ReqType,
    local_port: u16,
    remote: (Uid, u16),
    status: Status,
) -> Option<Message> {
    let request = Request::new(
        kind,
        Params::Port(PortParams {
            flag: status.to_u8(),
            src_port: 0,
            dst_port: port,
        }),
    )
    .ok()?;
    let mut header = Header::new(daemon, to, request);
    if status != Status::Ok && kind.is_answer() {
        header.flags = header.flags.with(MsgFlags::ERROR);
    }
    let mut payload = Vec::with_capacity(10);
    payload.extend_from_slice(&local_port.to_be_bytes());
    payload.extend_from_slice(&remote.0.to_bytes());
    payload.extend_from_slice(&remote.1.to_be_bytes());
    let payload = if kind.carries_payload() {
        Bytes::from(payload)
    } else {
        Bytes::new()
    };
    Message::new(header, payload).ok()
}

fn bind_unix(path: &Path) -> Result<UnixListener, DaemonError> {
    if path.exists() {
        // A live daemon answers; a stale socket file is removed.
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(DaemonError::Io {
                what: format!("{} is served by a running daemon", path.display()),
                source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
            });
        }
        let _ = std::fs::remove_file(path);
    }
    let l = UnixListener::bind(path).map_err(io_err(format!("binding {}", path.display())))?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
        .map_err(io_err(format!("chmod {}", path.display())))?;
    Ok(l)
}

fn random_token() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}
