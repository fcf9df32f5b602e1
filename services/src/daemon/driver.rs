//! The one task that owns the control core: it feeds the core what the I/O
//! tasks report, wakes it on its timeouts, and carries out its actions.
//! Nothing here waits on I/O: plane batches, tunnel opening and bridges
//! run as their own tasks and report back as inputs.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use uniplane_control::{
    Action, ClientRequest, Control, ControlConfig, ControlError, Event, OpResult, PeerMsg, PortUse,
    Reply, RequestId, TunnelId,
};
use uniplane_dataplane::port::{deferred_port, PortHandoff};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::{BoxLink, Message};
use uniplane_overlay::{IoSlot, PlaneOp, PortId, PortKind};

use super::observe::SetupHistogram;
use super::underlay;
use super::{ClientOutcome, DaemonError, Input, Shared, UnderlayChange};
use crate::config::{DeviceKind, MemoryBackend, UnderlayConfig};
use crate::control::{conn_spec, PeerRequest};
use crate::devices::region::HostRegion;
use uniplane_overlay::PlaneReply;

/// Watches kernel device `device` until it fails (then marks it down and
/// has the core close its connections) or the daemon stops.
async fn watch_kernel(
    shared: Arc<Shared>,
    kernel: Arc<crate::devices::kernel::KernelShared>,
    name: String,
    device: u16,
) {
    let mut watch =
        crate::devices::kernel::Watch::new(Duration::from_millis(kernel.config().stall_timeout_ms));
    let start = Instant::now();
    let reason = loop {
        tokio::time::sleep(watch.period()).await;
        if let Some(reason) = kernel.down() {
            break reason;
        }
        if kernel.stopped() {
            return;
        }
        if let Some(reason) = watch.check(start.elapsed(), &kernel) {
            kernel.mark_down(reason.clone());
            break reason;
        }
    };
    tracing::error!(device = %name, %reason, "kernel device down: closing its connections");
    shared
        .input(super::Input::Core(uniplane_control::Event::DeviceFailed {
            device,
        }))
        .await;
}

/// How an attached port reaches its user. One per attach: the ring's
/// size (its ends are cache-line aligned) does not matter here.
#[allow(clippy::large_enum_variant)]
pub(super) enum PortLink {
    /// A ring pair the daemon holds: tunnels, its own port, and every port
    /// of a plane that cannot take caller-supplied queues.
    Ring(RingLink),
    /// A process's port on the engine: its shared-memory queues go in when
    /// the process connects its data socket.
    Handoff(PortHandoff),
    /// A device running inside the engine's thread: nothing to hand over.
    Inline,
}

/// Who waits for the answer to a request.
enum Waiter {
    Client(u64, oneshot::Sender<ClientOutcome>),
    Peer(oneshot::Sender<Result<(), ControlError>>),
}

/// The core and what the driver holds for it.
pub(super) struct Driver {
    pub(super) shared: Arc<Shared>,
    pub(super) core: Control,
    origin: Instant,
    rx: mpsc::Receiver<Input>,
    next_request: RequestId,
    waiting: HashMap<RequestId, Waiter>,
    /// Links of attached ports not yet handed to their user.
    rings: HashMap<PortId, PortLink>,
    /// The links of a batch's caller-supplied ports, by op index, until
    /// the plane says which port each got.
    io_attach: HashMap<u64, Vec<Option<PortLink>>>,
    /// Tasks bridging a port to its user (tunnels, devices).
    bridges: HashMap<PortId, AbortHandle>,
    /// Our open tunnel ports, to tell a stale bridge end from a live one.
    out_ports: HashMap<(Ipv4Addr, u8), PortId>,
    in_ports: HashMap<TunnelId, PortId>,
    /// Opened tunnel links waiting for their port.
    opening: HashMap<(Ipv4Addr, u8), BoxLink>,
    inbound_links: HashMap<TunnelId, (Ipv4Addr, u8, BoxLink)>,
    next_tunnel: TunnelId,
    /// The underlay of each peer's tunnels, and which peer a tunnel port
    /// leads to.
    underlays: HashMap<Ipv4Addr, super::underlay::Handle>,
    tunnel_peer: HashMap<PortId, Ipv4Addr>,
    /// The classes' weights and the rate in force (changed live).
    pub(super) underlay: UnderlayConfig,
    peer_tx: HashMap<Ipv4Addr, mpsc::Sender<PeerRequest>>,
    notices: Option<mpsc::Sender<Message>>,
    /// Connection setup times, local and cross-server.
    pub(super) setup: [SetupHistogram; 2],
}

impl Driver {
    pub(super) fn new(
        shared: Arc<Shared>,
        config: ControlConfig,
        rx: mpsc::Receiver<Input>,
    ) -> Driver {
        let underlay = shared.config.underlay.clone();
        Driver {
            shared,
            core: Control::new(config, Duration::ZERO),
            origin: Instant::now(),
            rx,
            next_request: 1,
            waiting: HashMap::new(),
            rings: HashMap::new(),
            io_attach: HashMap::new(),
            bridges: HashMap::new(),
            out_ports: HashMap::new(),
            in_ports: HashMap::new(),
            opening: HashMap::new(),
            inbound_links: HashMap::new(),
            next_tunnel: 1,
            underlays: HashMap::new(),
            tunnel_peer: HashMap::new(),
            underlay,
            peer_tx: HashMap::new(),
            notices: None,
            setup: Default::default(),
        }
    }

    pub(super) fn now(&self) -> Duration {
        self.origin.elapsed()
    }

    /// Runs the core's start (daemon and device ports) to completion.
    pub(super) async fn settle(&mut self) -> Result<(), DaemonError> {
        loop {
            self.act();
            if self.core.is_idle() {
                break;
            }
            match self.rx.recv().await {
                Some(input) => self.input(input),
                None => return Err(uniplane_overlay::PlaneError::EngineGone.into()),
            }
        }
        if self.core.resource(super::DAEMON_DEVICE).is_none() {
            return Err(uniplane_overlay::PlaneError::EngineGone.into());
        }
        Ok(())
    }

    /// Serves inputs and timeouts for as long as the daemon runs.
    pub(super) async fn run(mut self) {
        loop {
            self.act();
            let deadline = self.core.poll_timeout().map(|t| self.origin + t);
            tokio::select! {
                input = self.rx.recv() => match input {
                    Some(input) => self.input(input),
                    None => return,
                },
                _ = sleep_until(deadline), if deadline.is_some() => {
                    let now = self.now();
                    self.core.handle_timeout(now);
                }
            }
        }
    }

    /// Whether every notice to a process and every message to a peer
    /// handed out so far has left the driver's queues.
    pub(super) fn notices_drained(&self) -> bool {
        let empty = |max: usize, now: usize| max == now;
        self.notices
            .as_ref()
            .is_none_or(|n| empty(n.max_capacity(), n.capacity()))
            && self
                .peer_tx
                .values()
                .all(|p| empty(p.max_capacity(), p.capacity()))
    }

    fn event(&mut self, e: Event) {
        let now = self.now();
        self.core.handle(e, now);
    }

    fn request_id(&mut self) -> RequestId {
        let r = self.next_request;
        self.next_request += 1;
        r
    }

    fn input(&mut self, input: Input) {
        match input {
            Input::Core(e) => self.event(e),
            Input::Client {
                session,
                req,
                reply,
            } => {
                let request = self.request_id();
                self.waiting.insert(request, Waiter::Client(session, reply));
                self.event(Event::Client {
                    session,
                    request,
                    req,
                });
            }
            Input::PeerConnect {
                server,
                conn,
                class,
                reply,
            } => {
                let request = self.request_id();
                self.waiting.insert(request, Waiter::Peer(reply));
                self.event(Event::PeerMessage {
                    server,
                    msg: PeerMsg::Connect { conn, class },
                    request,
                });
            }
            Input::PeerUp { server, tx } => {
                self.peer_tx.insert(server, tx);
                self.event(Event::PeerChannelUp { server });
            }
            Input::TunnelLink {
                server,
                class,
                link,
            } => {
                self.opening.insert((server, class), link);
                self.event(Event::TunnelOpened { server, class });
            }
            Input::InboundLink {
                from,
                class,
                mtu,
                link,
            } => {
                let tunnel = self.next_tunnel;
                self.next_tunnel += 1;
                self.inbound_links.insert(tunnel, (from, class, link));
                self.event(Event::InboundTunnel {
                    tunnel,
                    from,
                    class,
                    mtu,
                });
            }
            Input::PeerFound { peer } => {
                let server = peer.server;
                let spec = super::peer_spec(&peer, &self.shared.stacks);
                let added = {
                    let mut roster = self
                        .shared
                        .roster
                        .write()
                        .unwrap_or_else(|e| e.into_inner());
                    let fresh = !roster.contains_key(&server) && server != self.shared.server;
                    if fresh {
                        roster.insert(server, peer);
                    }
                    fresh
                };
                if added {
                    self.event(Event::PeerAdded { spec });
                    tokio::spawn(super::peers::dial_loop(self.shared.clone(), server));
                }
            }
            Input::PeerLost { server } => {
                let configured = self.shared.config.peers.iter().any(|p| p.server == server);
                if !configured {
                    self.shared
                        .roster
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .remove(&server);
                    self.event(Event::PeerRemoved { server });
                    self.underlays.remove(&server);
                }
            }
            Input::BridgeEnded { port } => {
                self.bridges.remove(&port);
                self.tunnel_peer.remove(&port);
                let out = self.out_ports.iter().find(|(_, p)| **p == port);
                if let Some((&(server, class), _)) = out {
                    self.event(Event::TunnelFailed { server, class });
                    return;
                }
                let inbound = self.in_ports.iter().find(|(_, p)| **p == port);
                if let Some((&tunnel, _)) = inbound {
                    self.event(Event::InboundTunnelEnded { tunnel });
                }
            }
            Input::PlaneDone { batch, replies } => {
                let links = self.io_attach.remove(&batch).unwrap_or_default();
                let results = self.replies(replies, links);
                self.event(Event::PlaneDone { batch, results });
            }
            Input::Inspect(f) => f(self),
            Input::Underlay { change, reply } => {
                let _ = reply.send(self.change_underlay(change));
            }
            Input::Operator(e) => self.event(e),
        }
    }

    /// Carries out everything the core asked for.
    fn act(&mut self) {
        while let Some(action) = self.core.poll_action() {
            self.action(action);
        }
    }

    fn action(&mut self, action: Action) {
        match action {
            Action::Plane { batch, ops } => {
                let (ops, links) = self.short_paths(ops);
                if links.iter().any(Option::is_some) {
                    self.io_attach.insert(batch, links);
                }
                let shared = self.shared.clone();
                let submitted = shared.plane.submit(ops);
                tokio::spawn(async move {
                    let replies = submitted.await;
                    shared.input(Input::PlaneDone { batch, replies }).await;
                });
            }
            Action::PortReady { port, usage } => self.port_ready(port, usage),
            Action::PortGone { port } => {
                self.rings.remove(&port);
                if let Some(b) = self.bridges.remove(&port) {
                    b.abort();
                }
                self.stop_carrying(port);
                self.out_ports.retain(|_, p| *p != port);
                self.in_ports.retain(|_, p| *p != port);
            }
            Action::Answer { request, result } => self.answer(request, result),
            Action::Notice {
                to,
                kind,
                conn,
                status,
            } => {
                let m = super::tunnels::notice(
                    self.shared.uid(),
                    to,
                    kind,
                    conn.src_port,
                    (conn.dst, conn.dst_port),
                    status,
                );
                if let (Some(m), Some(tx)) = (m, &self.notices) {
                    let _ = tx.try_send(m);
                }
            }
            Action::ToPeer { server, msg } => {
                let req = match msg {
                    PeerMsg::Heartbeat => PeerRequest::Heartbeat,
                    PeerMsg::Connect { conn, class } => PeerRequest::Connect {
                        conn: conn_spec(conn),
                        class,
                    },
                    PeerMsg::Close { conn, status } => PeerRequest::Close {
                        conn: conn_spec(conn),
                        status: (status != Status::Closed).then(|| status.to_u8()),
                    },
                };
                if let Some(tx) = self.peer_tx.get(&server) {
                    let _ = tx.try_send(req);
                }
            }
            Action::OpenTunnel { server, class } => {
                let shared = self.shared.clone();
                tokio::spawn(async move {
                    let input = match super::tunnels::open(&shared, server, class).await {
                        Ok(link) => Input::TunnelLink {
                            server,
                            class,
                            link,
                        },
                        Err(e) => {
                            tracing::debug!(%server, class, "tunnel: {e}");
                            Input::Core(Event::TunnelFailed { server, class })
                        }
                    };
                    shared.input(input).await;
                });
            }
            Action::CloseTunnel { server, class } => {
                self.opening.remove(&(server, class));
            }
            Action::DropTunnel { tunnel } => {
                self.inbound_links.remove(&tunnel);
                if let Some(port) = self.in_ports.remove(&tunnel) {
                    self.stop_carrying(port);
                }
            }
            Action::ClosePeerChannel { server } => {
                self.peer_tx.remove(&server);
            }
            Action::Opened { remote, setup, .. } => {
                self.setup[usize::from(remote)].record(setup);
            }
            Action::Unmap { session, device } => self.unmap(session, device),
            Action::MakeShared { owner, id, len } => self.make_shared(owner, id, len),
            Action::Withdraw { owner, id } => self.withdraw(owner, id),
            Action::Chain { device, conn, up } => {
                let name = self
                    .core
                    .resources()
                    .find(|r| r.uid == device)
                    .map(|r| r.name.clone());
                if let Some((_, kernel)) = self
                    .shared
                    .kernels
                    .iter()
                    .find(|(n, _)| Some(n) == name.as_ref())
                {
                    kernel.set_chain(up.then_some(conn));
                }
            }
        }
    }

    /// Takes back the memory of `device` that `session` may have mapped:
    /// its unclaimed mappings go, then every mapping of the region is
    /// revoked and the region moves (a copy, off the runtime's threads).
    fn unmap(&mut self, session: u64, device: u16) {
        let name = self
            .core
            .resources()
            .find(|r| r.uid.device() == device)
            .map(|r| r.name.clone());
        let Some(region) = name.and_then(|n| self.shared.host_region(&n).cloned()) else {
            return;
        };
        if let Ok(mut pending) = self.shared.pending_maps.lock() {
            pending.retain(|_, p| !(p.session == session && Arc::ptr_eq(&p.region, &region)));
        }
        tokio::task::spawn_blocking(move || {
            if let Err(e) = region.take_back() {
                tracing::error!(device, "memory could not be taken back: {e}");
            }
        });
    }

    /// Makes the memory of shared region `id` of `owner` (its answer,
    /// which follows, finds it here; without it the answer is an error).
    fn make_shared(&mut self, owner: u16, id: u16, len: u64) {
        let made = usize::try_from(len)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
            .and_then(|len| HostRegion::create(&format!("shared-{owner}-{id}"), len));
        match made {
            Ok(region) => {
                if let Ok(mut regions) = self.shared.shared_regions.lock() {
                    regions.insert((owner, id), region);
                }
            }
            Err(e) => tracing::error!(owner, id, len, "shared memory not made: {e}"),
        }
    }

    /// Withdraws shared region `id` of `owner`: its unclaimed mappings
    /// go, every loan of it is revoked, and it is forgotten (its memfds
    /// stay with their borrowers, connected to nothing).
    fn withdraw(&mut self, owner: u16, id: u16) {
        let region = self
            .shared
            .shared_regions
            .lock()
            .ok()
            .and_then(|mut r| r.remove(&(owner, id)));
        let Some(region) = region else {
            return;
        };
        if let Ok(mut pending) = self.shared.pending_maps.lock() {
            pending.retain(|_, p| !Arc::ptr_eq(&p.region, &region));
        }
        region.withdraw();
    }

    /// On the software engine, processes and devices get the short data
    /// path: a process's port reads its shared-memory rings directly (the
    /// queues arrive with its data connection), and a device runs inside
    /// the engine's thread. Other ports, and every port of a plane that
    /// cannot take caller-supplied queues, keep ring links.
    fn short_paths(&self, ops: Vec<PlaneOp>) -> (Vec<PlaneOp>, Vec<Option<PortLink>>) {
        if self.shared.plane.kind() != "engine" {
            return (ops, Vec::new());
        }
        ops.into_iter()
            .map(|op| match op {
                PlaneOp::Attach(spec) if spec.kind == PortKind::App => {
                    let (queues, handoff) = deferred_port();
                    let slot = IoSlot::new(Box::new(queues));
                    (
                        PlaneOp::AttachIo(spec, slot),
                        Some(PortLink::Handoff(handoff)),
                    )
                }
                PlaneOp::Attach(spec) if spec.kind == PortKind::Device => {
                    match self
                        .shared
                        .config
                        .devices
                        .iter()
                        .find(|d| d.name == spec.name)
                    {
                        // A GPU copy blocks: a thread of its own, on a ring.
                        Some(d) if d.backend != MemoryBackend::Host => {
                            (PlaneOp::Attach(spec), None)
                        }
                        // A kernel has a thread of its own; the engine
                        // drives the host end of its emulated path.
                        Some(d) if d.kind == DeviceKind::Kernel => {
                            let port = self
                                .shared
                                .kernel_ports
                                .lock()
                                .ok()
                                .and_then(|mut p| p.remove(&spec.name));
                            match port {
                                Some(port) => {
                                    let slot = IoSlot::new(Box::new(port));
                                    (PlaneOp::AttachIo(spec, slot), Some(PortLink::Inline))
                                }
                                None => (PlaneOp::Attach(spec), None),
                            }
                        }
                        Some(d) => {
                            let slot = IoSlot::new(crate::devices::inline_port(
                                d.kind,
                                d.memory,
                                self.shared.host_region(&d.name),
                            ));
                            (PlaneOp::AttachIo(spec, slot), Some(PortLink::Inline))
                        }
                        None => (PlaneOp::Attach(spec), None),
                    }
                }
                op => (op, None),
            })
            .unzip()
    }

    fn port_ready(&mut self, port: PortId, usage: PortUse) {
        let Some(link) = self.rings.remove(&port) else {
            tracing::warn!(port, ?usage, "a ready port without its link");
            return;
        };
        match (usage, link) {
            (PortUse::Daemon, PortLink::Ring(ring)) => {
                let (tx, rx) = mpsc::channel(1024);
                self.notices = Some(tx);
                tokio::spawn(super::tunnels::notices(ring, rx));
            }
            (PortUse::Device { name, .. }, PortLink::Ring(ring)) => {
                let Some(d) = self.shared.config.devices.iter().find(|d| d.name == name) else {
                    return;
                };
                if d.kernel_backend == crate::config::KernelBackend::Rtl {
                    // The RTL's own kernel answers on this port; its
                    // host side carries nothing.
                    return;
                }
                if d.kind == DeviceKind::Kernel {
                    // Only the software engine drives a kernel's host end.
                    if let Some((_, k)) = self.shared.kernels.iter().find(|(n, _)| *n == name) {
                        k.mark_down(format!(
                            "a kernel device needs plane = \"engine\", not {}",
                            self.shared.plane.kind()
                        ));
                    }
                }
                if d.backend != MemoryBackend::Host {
                    let memory = self
                        .shared
                        .gpu_memories
                        .lock()
                        .ok()
                        .and_then(|mut m| m.remove(&name));
                    let Some(memory) = memory else {
                        tracing::warn!(device = %name, "a gpu device attached twice");
                        return;
                    };
                    if let Err(e) = crate::devices::gpu::spawn(memory, d.kind, &name, ring) {
                        tracing::error!(device = %name, error = %e, "no thread for a gpu device");
                    }
                    return;
                }
                let region = self.shared.host_region(&name).cloned();
                let task = tokio::spawn(crate::devices::run(d.kind, d.memory, region, ring));
                self.bridges.insert(port, task.abort_handle());
            }
            // Runs inside the engine's thread; a kernel's host end does,
            // and is watched from here.
            (PortUse::Device { name, uid }, PortLink::Inline) => {
                if let Some((_, k)) = self.shared.kernels.iter().find(|(n, _)| *n == name) {
                    tokio::spawn(watch_kernel(
                        self.shared.clone(),
                        k.clone(),
                        name,
                        uid.device(),
                    ));
                }
            }
            // Handed over with the answer to its attach.
            (PortUse::Process { .. }, link) => {
                self.rings.insert(port, link);
            }
            (PortUse::TunnelOut { server, class }, PortLink::Ring(ring)) => {
                let Some(link) = self.opening.remove(&(server, class)) else {
                    return;
                };
                self.out_ports.insert((server, class), port);
                self.carry(server, port, class, false, link, ring);
            }
            (PortUse::TunnelIn { tunnel }, PortLink::Ring(ring)) => {
                let Some((from, class, link)) = self.inbound_links.remove(&tunnel) else {
                    return;
                };
                self.in_ports.insert(tunnel, port);
                self.carry(from, port, class, true, link, ring);
            }
            (usage, _) => tracing::warn!(port, ?usage, "a ready port with the wrong kind of link"),
        }
    }

    /// Hands a tunnel to the underlay of its peer, started on its first
    /// tunnel.
    fn carry(
        &mut self,
        server: Ipv4Addr,
        port: PortId,
        class: u8,
        inbound: bool,
        link: BoxLink,
        ring: RingLink,
    ) {
        if !self.underlays.contains_key(&server) {
            match self.start_underlay(server) {
                Ok(h) => {
                    self.underlays.insert(server, h);
                }
                Err(e) => {
                    tracing::error!(%server, "underlay: {e}");
                    return;
                }
            }
        }
        let add = underlay::Command::Add {
            port,
            class,
            inbound,
            link,
            ring,
        };
        let sent = self
            .underlays
            .get(&server)
            .map(|h| h.commands.try_send(add).is_ok());
        if sent == Some(true) {
            self.tunnel_peer.insert(port, server);
        } else {
            tracing::error!(%server, port, "underlay: its command queue is full");
        }
    }

    fn start_underlay(&mut self, server: Ipv4Addr) -> Result<underlay::Handle, String> {
        let peer = self.shared.peer(server).ok_or("not a peer")?;
        let (tx, mut rx) = mpsc::channel(1024);
        let handle = underlay::spawn(
            underlay::filter_rules(&peer.ingress),
            underlay::Shape::of(&self.underlay),
            self.underlay.queue_depth,
            self.core.config().failure_after(),
            tx,
        )?;
        let shared = self.shared.clone();
        tokio::spawn(async move {
            while let Some(report) = rx.recv().await {
                let input = match report {
                    underlay::Report::Violation {
                        src,
                        dst,
                        ports,
                        violation,
                    } => {
                        tracing::warn!(%server, %src, %dst, "underlay dropped a message: {violation}");
                        Input::Core(Event::Violation {
                            server,
                            src,
                            dst,
                            ports,
                        })
                    }
                    underlay::Report::Ended {
                        port,
                        error,
                        answered,
                    } => {
                        if let Some(e) = error {
                            tracing::warn!(
                                %server,
                                port,
                                answered,
                                "tunnel failed: {e}; its queued requests were answered PeerFailed"
                            );
                        }
                        Input::BridgeEnded { port }
                    }
                };
                shared.input(input).await;
            }
        });
        Ok(handle)
    }

    /// The tunnel at `port` is gone from the core: its underlay lets it go.
    fn stop_carrying(&mut self, port: PortId) {
        let Some(server) = self.tunnel_peer.remove(&port) else {
            return;
        };
        if let Some(h) = self.underlays.get(&server) {
            let _ = h.commands.try_send(underlay::Command::Remove { port });
        }
    }

    /// Applies a change to the classes' sharing to every peer's underlay.
    fn change_underlay(&mut self, change: UnderlayChange) -> Result<UnderlayConfig, String> {
        let mut next = self.underlay.clone();
        match change {
            UnderlayChange::Whole(u) => next = u,
            UnderlayChange::Class {
                id,
                weight,
                priority,
            } => {
                let class = next
                    .classes
                    .iter_mut()
                    .find(|c| c.id == id)
                    .ok_or_else(|| format!("no traffic class {id}"))?;
                if weight == Some(0) {
                    return Err("a weight of 0 would starve the class".into());
                }
                if priority.is_some_and(|p| usize::from(p) >= crate::config::MAX_CLASSES) {
                    return Err("priorities are 0 (first) to 7".into());
                }
                class.weight = weight.unwrap_or(class.weight);
                class.priority = priority.unwrap_or(class.priority);
            }
        }
        let ids = |u: &UnderlayConfig| u.classes.iter().map(|c| c.id).collect::<Vec<_>>();
        if ids(&next) != ids(&self.underlay) || next.queue_depth != self.underlay.queue_depth {
            return Err("which classes exist and the queue depth change only at a restart".into());
        }
        let shape = underlay::Shape::of(&next);
        for h in self.underlays.values() {
            let _ = h.commands.try_send(underlay::Command::Shape(shape.clone()));
        }
        self.underlay = next.clone();
        Ok(next)
    }

    /// Counters of each peer's underlay.
    pub(super) fn underlay_counters(&self) -> Vec<(Ipv4Addr, Arc<underlay::Counters>)> {
        let mut v: Vec<_> = self
            .underlays
            .iter()
            .map(|(s, h)| (*s, h.counters.clone()))
            .collect();
        v.sort_by_key(|(s, _)| *s);
        v
    }

    fn answer(&mut self, request: RequestId, result: Result<Reply, ControlError>) {
        let Some(waiter) = self.waiting.remove(&request) else {
            return;
        };
        match waiter {
            Waiter::Peer(tx) => {
                let _ = tx.send(result.map(drop));
            }
            Waiter::Client(session, tx) => {
                let mut token = None;
                if let Ok(Reply::Attached { uid, port }) = &result {
                    if let Some(link) = self.rings.remove(port) {
                        let t = random_token();
                        if let Ok(mut pending) = self.shared.pending_data.lock() {
                            pending.insert(t, (uid.device(), link));
                        }
                        token = Some(t);
                    }
                }
                // A mapping granted waits for its process under a token,
                // registered here, in order with the core's take-backs.
                if let Ok(Reply::Mapped { device, writable }) = &result {
                    let region = self
                        .core
                        .resources()
                        .find(|r| r.uid.device() == *device)
                        .and_then(|r| self.shared.host_region(&r.name).cloned());
                    token = region.and_then(|r| self.pending_map(r, *writable, session));
                }
                if let Ok(Reply::Shared {
                    owner,
                    id,
                    writable,
                    ..
                }) = &result
                {
                    let region = self.shared.shared_region(*owner, *id);
                    token = region.and_then(|r| self.pending_map(r, *writable, session));
                }
                let _ = tx.send(ClientOutcome { result, token });
            }
        }
    }

    /// Registers a granted mapping of `region` for `session`'s process to
    /// claim under the token returned.
    fn pending_map(&self, region: Arc<HostRegion>, writable: bool, session: u64) -> Option<u64> {
        let mut pending = self.shared.pending_maps.lock().ok()?;
        let t = random_token();
        pending.insert(
            t,
            super::PendingMap {
                region,
                writable,
                session,
            },
        );
        Some(t)
    }

    /// Turns a batch's replies into the core's results, keeping the links
    /// of attached ports (`links`: the batch's caller-supplied ones).
    fn replies(
        &mut self,
        replies: Result<
            Vec<Result<PlaneReply, uniplane_overlay::PlaneError>>,
            uniplane_overlay::PlaneError,
        >,
        mut links: Vec<Option<PortLink>>,
    ) -> Result<Vec<Result<OpResult, uniplane_overlay::PlaneError>>, uniplane_overlay::PlaneError>
    {
        Ok(replies?
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.map(|reply| match reply {
                    PlaneReply::Attached(port, ring) => {
                        self.rings.insert(port, PortLink::Ring(ring));
                        OpResult::Attached(port)
                    }
                    PlaneReply::AttachedIo(port) => {
                        if let Some(link) = links.get_mut(i).and_then(Option::take) {
                            self.rings.insert(port, link);
                        }
                        OpResult::Attached(port)
                    }
                    _ => OpResult::Done,
                })
            })
            .collect())
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d.into()).await,
        None => std::future::pending().await,
    }
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

/// A client request sent to the driver, and its outcome.
pub(super) async fn client(
    shared: &Shared,
    session: u64,
    req: ClientRequest,
) -> Result<ClientOutcome, ControlError> {
    let (reply, rx) = oneshot::channel();
    shared
        .input(Input::Client {
            session,
            req,
            reply,
        })
        .await;
    rx.await
        .map_err(|_| ControlError::Plane(uniplane_overlay::PlaneError::EngineGone))
}
