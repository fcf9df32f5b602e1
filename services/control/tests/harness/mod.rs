//! A control core on virtual time in front of a model plane that applies
//! what it is sent, and checks that tie the two together.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::time::Duration;

use uniplane_control::*;
use uniplane_dataplane::Uid;
use uniplane_overlay::acl::{AclRule, ConnKey};
use uniplane_overlay::table::TableError;
use uniplane_overlay::{PlaneError, PortId};

/// One port of the model plane.
#[derive(Clone, Debug, Default)]
pub struct ModelPort {
    pub routes: HashMap<(u64, u64), PortId>,
    /// Both directions, as the engine admits them.
    pub allows: HashSet<ConnKey>,
    pub rules: Vec<AclRule>,
}

/// A plane that does what it is told, within its sizes, and can be told
/// to refuse.
#[derive(Debug)]
pub struct ModelPlane {
    pub ports: BTreeMap<PortId, ModelPort>,
    pub translations: HashMap<ConnKey, PortId>,
    pub max_ports: usize,
    pub table_capacity: usize,
    /// Refuse the next operation this predicate picks.
    pub refuse: Option<fn(&PlaneOp) -> bool>,
    pub refused: usize,
}

impl ModelPlane {
    pub fn new() -> ModelPlane {
        ModelPlane {
            ports: BTreeMap::new(),
            translations: HashMap::new(),
            max_ports: 32,
            table_capacity: 4096,
            refuse: None,
            refused: 0,
        }
    }

    pub fn apply(&mut self, op: &PlaneOp) -> Result<OpResult, PlaneError> {
        if let Some(pick) = self.refuse {
            if pick(op) {
                self.refuse = None;
                self.refused += 1;
                return Err(PlaneError::Table(TableError::Full(self.table_capacity)));
            }
        }
        let port = |ports: &mut BTreeMap<PortId, ModelPort>, p: PortId| {
            ports
                .get_mut(&p)
                .map(|_| ())
                .ok_or(PlaneError::NoSuchPort(p))
        };
        match op {
            PlaneOp::Attach(_) | PlaneOp::AttachIo(..) => {
                let id = (0..self.max_ports as PortId)
                    .find(|p| !self.ports.contains_key(p))
                    .ok_or(PlaneError::TooManyPorts(self.max_ports))?;
                self.ports.insert(id, ModelPort::default());
                return Ok(OpResult::Attached(id));
            }
            PlaneOp::Detach(p) => {
                self.ports.remove(p).ok_or(PlaneError::NoSuchPort(*p))?;
            }
            PlaneOp::AddRoute(p, r) => {
                port(&mut self.ports, *p)?;
                let cap = self.table_capacity;
                let t = self.ports.get_mut(p).expect("checked");
                let k = (r.key.to_u64() & r.mask, r.mask);
                if !t.routes.contains_key(&k) && t.routes.len() >= cap {
                    return Err(PlaneError::Table(TableError::Full(cap)));
                }
                t.routes.insert(k, r.port);
            }
            PlaneOp::RemoveRoute(p, key, mask) => {
                port(&mut self.ports, *p)?;
                let t = self.ports.get_mut(p).expect("checked");
                t.routes
                    .remove(&(key.to_u64() & mask, *mask))
                    .ok_or(PlaneError::Table(TableError::NotFound {
                        key: *key,
                        mask: *mask,
                    }))?;
            }
            PlaneOp::Allow(p, c) => {
                port(&mut self.ports, *p)?;
                let t = self.ports.get_mut(p).expect("checked");
                t.allows.insert(*c);
                t.allows.insert(c.reversed());
            }
            PlaneOp::Revoke(p, c) => {
                port(&mut self.ports, *p)?;
                let t = self.ports.get_mut(p).expect("checked");
                t.allows.remove(c);
                t.allows.remove(&c.reversed());
            }
            PlaneOp::AddRule(p, r) => {
                port(&mut self.ports, *p)?;
                self.ports.get_mut(p).expect("checked").rules.push(*r);
            }
            PlaneOp::ClearRules(p) => {
                port(&mut self.ports, *p)?;
                self.ports.get_mut(p).expect("checked").rules.clear();
            }
            PlaneOp::AddTranslation(c, p) => {
                port(&mut self.ports, *p)?;
                self.translations.insert(*c, *p);
            }
            PlaneOp::RemoveTranslation(c) => {
                self.translations
                    .remove(c)
                    .ok_or(PlaneError::NoTranslation(*c))?;
            }
            PlaneOp::SetPolicy(p, _)
            | PlaneOp::Counters(p)
            | PlaneOp::Dump(p)
            | PlaneOp::ConnCounters(p) => {
                port(&mut self.ports, *p)?;
            }
            PlaneOp::SetDefault(p, _) => {
                port(&mut self.ports, *p)?;
            }
            PlaneOp::Translations | PlaneOp::MovePort(..) => {}
        }
        Ok(OpResult::Done)
    }
}

pub const HERE: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
pub const PEER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

pub fn uid(s: &str) -> Uid {
    s.parse().expect("a UID")
}

/// A configuration with an echo device (1), a relay (2) and one peer.
pub fn config() -> ControlConfig {
    let mut c = ControlConfig::new(HERE);
    c.devices = vec![
        DeviceSpec {
            name: "echo".into(),
            device: Some(1),
            relay: false,
            label: "echo".into(),
            mappable: false,
            next: None,
        },
        DeviceSpec {
            name: "relay".into(),
            device: Some(2),
            relay: true,
            label: "relay".into(),
            mappable: false,
            next: None,
        },
    ];
    c.peers = vec![PeerSpec {
        server: PEER,
        tunnel_mtu: 1400,
        stack: "tcp".into(),
        classes: (0..8).collect(),
    }];
    c.heartbeat = Duration::from_millis(50);
    c.misses = 4;
    c
}

/// The core, the plane, virtual time, and what the core said.
pub struct Harness {
    pub core: Control,
    pub plane: ModelPlane,
    pub now: Duration,
    pub out: Vec<Action>,
    next_request: RequestId,
    /// Batches held back instead of being applied (to test interleavings).
    pub hold: bool,
    pub held: Vec<(BatchId, Vec<PlaneOp>)>,
}

impl Harness {
    pub fn new(config: ControlConfig) -> Harness {
        let mut h = Harness {
            core: Control::new(config, Duration::ZERO),
            plane: ModelPlane::new(),
            now: Duration::ZERO,
            out: Vec::new(),
            next_request: 1,
            hold: false,
            held: Vec::new(),
        };
        h.pump();
        h
    }

    /// Carries out what the core asks: plane batches go to the model
    /// plane and come back as completions; the rest is kept in `out`.
    pub fn pump(&mut self) {
        while let Some(a) = self.core.poll_action() {
            match a {
                Action::Plane { batch, ops } if !self.hold => {
                    let results: Vec<_> = ops.iter().map(|op| self.plane.apply(op)).collect();
                    self.core.handle(
                        Event::PlaneDone {
                            batch,
                            results: Ok(results),
                        },
                        self.now,
                    );
                }
                Action::Plane { batch, ops } => self.held.push((batch, ops)),
                other => self.out.push(other),
            }
        }
    }

    /// Applies the batches held back, in order.
    pub fn release(&mut self) {
        self.hold = false;
        for (batch, ops) in std::mem::take(&mut self.held) {
            let results: Vec<_> = ops.iter().map(|op| self.plane.apply(op)).collect();
            self.core.handle(
                Event::PlaneDone {
                    batch,
                    results: Ok(results),
                },
                self.now,
            );
        }
        self.pump();
    }

    pub fn event(&mut self, e: Event) {
        self.core.handle(e, self.now);
        self.pump();
    }

    /// Moves virtual time to `to`, firing every timeout on the way.
    pub fn advance_to(&mut self, to: Duration) {
        while let Some(t) = self.core.poll_timeout() {
            if t > to {
                break;
            }
            self.now = self.now.max(t);
            self.core.handle_timeout(self.now);
            self.pump();
        }
        self.now = self.now.max(to);
    }

    pub fn advance(&mut self, by: Duration) {
        let to = self.now + by;
        self.advance_to(to);
    }

    pub fn request(&mut self, session: SessionId, req: ClientRequest) -> RequestId {
        let request = self.next_request;
        self.next_request += 1;
        self.event(Event::Client {
            session,
            request,
            req,
        });
        request
    }

    /// The answer to `request`, taken out of `out`.
    pub fn answer(&mut self, request: RequestId) -> Option<Result<Reply, ControlError>> {
        let i = self
            .out
            .iter()
            .position(|a| matches!(a, Action::Answer { request: r, .. } if *r == request))?;
        match self.out.remove(i) {
            Action::Answer { result, .. } => Some(result),
            _ => None,
        }
    }

    pub fn ask(&mut self, session: SessionId, req: ClientRequest) -> Result<Reply, ControlError> {
        let r = self.request(session, req);
        self.answer(r).expect("an answer")
    }

    pub fn attach(&mut self, session: SessionId, name: &str) -> Uid {
        match self.ask(session, ClientRequest::Attach { name: name.into() }) {
            Ok(Reply::Attached { uid, .. }) => uid,
            other => panic!("attach {name}: {other:?}"),
        }
    }

    pub fn listen(&mut self, session: SessionId, port: u16) {
        assert_eq!(
            self.ask(session, ClientRequest::Listen { port }),
            Ok(Reply::Port(port))
        );
    }

    pub fn connect(
        &mut self,
        session: SessionId,
        dst: Uid,
        dst_port: u16,
    ) -> Result<Reply, ControlError> {
        self.ask(
            session,
            ClientRequest::Connect {
                src_port: 0,
                dst,
                dst_port,
                class: 0,
            },
        )
    }

    /// Notices sent, taken out of `out`.
    pub fn notices(
        &mut self,
    ) -> Vec<(
        Uid,
        uniplane_dataplane::wire::ReqType,
        ConnKey,
        uniplane_dataplane::wire::Status,
    )> {
        let mut got = Vec::new();
        self.out.retain(|a| match a {
            Action::Notice {
                to,
                kind,
                conn,
                status,
            } => {
                got.push((*to, *kind, *conn, *status));
                false
            }
            _ => true,
        });
        got
    }

    /// Messages to peers, taken out of `out`.
    pub fn sent_to_peer(&mut self) -> Vec<(Ipv4Addr, PeerMsg)> {
        let mut got = Vec::new();
        self.out.retain(|a| match a {
            Action::ToPeer { server, msg } => {
                got.push((*server, msg.clone()));
                false
            }
            _ => true,
        });
        got
    }

    /// Brings the peer up: channel, class-0 tunnel.
    pub fn peer_up(&mut self, server: Ipv4Addr) {
        self.event(Event::PeerChannelUp { server });
        assert!(self
            .out
            .iter()
            .any(|a| matches!(a, Action::OpenTunnel { server: s, class: 0 } if *s == server)));
        self.event(Event::TunnelOpened { server, class: 0 });
        assert!(self
            .core
            .peers()
            .iter()
            .any(|p| p.server == server && p.alive));
    }

    /// Checks that the plane holds exactly what the core's live state
    /// owns, and that no connection is half set up.
    pub fn check(&self) {
        if !self.core.is_idle() {
            return;
        }
        let core = &self.core;
        let resources: Vec<&Resource> = core.resources().collect();
        let peers = core.peers();
        let inbound = core.inbound_tunnels();
        let mut owned: HashSet<PortId> = resources.iter().map(|r| r.port).collect();
        owned.extend(inbound.iter().map(|t| t.port));
        owned.extend(peers.iter().flat_map(|p| p.tunnels.iter().map(|(_, t)| *t)));
        let plane_ports: HashSet<PortId> = self.plane.ports.keys().copied().collect();
        assert_eq!(
            plane_ports, owned,
            "every port has an owner and every owner a port"
        );
        let conns: HashMap<ConnKey, &Connection> = core.connections().map(|c| (c.key, c)).collect();
        // A connection waiting for its peer's verdict has its end here
        // installed already: its entries are live.
        let asking: HashSet<ConnKey> = core.asking_connections().copied().collect();
        let live = |k: &ConnKey| {
            conns.contains_key(k)
                || conns.contains_key(&k.reversed())
                || asking.contains(k)
                || asking.contains(&k.reversed())
        };
        for (id, port) in &self.plane.ports {
            for target in port.routes.values() {
                assert!(
                    plane_ports.contains(target),
                    "route at {id} to detached {target}"
                );
            }
            for k in &port.allows {
                assert!(live(k), "allow at port {id} of a dead connection {k:?}");
            }
        }
        for (k, t) in &self.plane.translations {
            assert!(live(k), "translation of a dead connection {k:?}");
            assert!(plane_ports.contains(t), "translation to detached port {t}");
        }
        for c in conns.values() {
            for end in [c.key.src, c.key.dst] {
                if end.server() != HERE {
                    continue;
                }
                let r = core
                    .resource(end.device())
                    .unwrap_or_else(|| panic!("{:?} has a dead local end", c.key));
                assert!(
                    self.plane.ports[&r.port].allows.contains(&c.key),
                    "{:?} half set up: not admitted at {end}",
                    c.key
                );
            }
            if let Some(server) = c.transit {
                assert!(
                    peers.iter().any(|p| p.server == server && p.alive),
                    "{:?} carried on to a dead peer",
                    c.key
                );
            }
            if let Some(server) = c.peer {
                assert!(
                    peers.iter().any(|p| p.server == server && p.alive),
                    "{:?} through a dead peer",
                    c.key
                );
            }
        }
        for k in core.pending_connections() {
            assert!(
                !conns.contains_key(k) && !conns.contains_key(&k.reversed()),
                "{k:?} pending and open"
            );
            if asking.contains(k) && k.src.server() != HERE {
                // Carried on here (transit): no local end.
                continue;
            }
            if asking.contains(k) {
                let r = core
                    .resource(k.src.device())
                    .unwrap_or_else(|| panic!("{k:?} asked for a dead local end"));
                assert!(
                    self.plane.ports[&r.port].allows.contains(k),
                    "{k:?} asked before its end is admitted at {}",
                    k.src
                );
                continue;
            }
            for port in self.plane.ports.values() {
                assert!(
                    !port.allows.contains(k),
                    "{k:?} waits for its tunnel but admitted"
                );
            }
            assert!(
                !self.plane.translations.contains_key(k),
                "{k:?} waits for its tunnel but translated"
            );
        }
        for r in &resources {
            let port = &self.plane.ports[&r.port];
            assert_eq!(
                port.routes.get(&(r.uid.to_u64(), Uid::MASK)),
                Some(&r.port),
                "{} reaches itself",
                r.uid
            );
            for o in &resources {
                assert_eq!(
                    self.plane.ports[&o.port]
                        .routes
                        .get(&(r.uid.to_u64(), Uid::MASK)),
                    Some(&r.port),
                    "{} reaches {}",
                    o.uid,
                    r.uid
                );
            }
        }
        // The core's belief is the plane's truth.
        let installed = core.installed();
        assert_eq!(
            installed.ports.keys().copied().collect::<HashSet<_>>(),
            plane_ports
        );
        for (id, port) in &installed.ports {
            let model = &self.plane.ports[id];
            let routes: HashMap<(u64, u64), PortId> =
                port.routes.iter().map(|(k, r)| (*k, r.port)).collect();
            assert_eq!(routes, model.routes, "routes at {id}");
            assert_eq!(port.rules, model.rules, "rules at {id}");
            let both: HashSet<ConnKey> = port
                .allows
                .iter()
                .flat_map(|k| [*k, k.reversed()])
                .collect();
            assert_eq!(both, model.allows, "allows at {id}");
        }
        assert_eq!(installed.translations, self.plane.translations);
        assert_eq!(installed, &core.picture(), "nothing left to install");
    }
}
