//! A simulated server's forwarding plane: the real overlay engine (rings,
//! connectors, crossbar, schedulers), or for fabrics too large to give
//! every server an engine, the engine's connector pieces alone (the same
//! access control, forwarding table and translator, deciding each
//! message at once, with no rings or queues between).

use std::collections::HashSet;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use futures_core::Stream;
use futures_sink::Sink;
use rustc_hash::FxHashMap;
use uniplane_control::{OpResult, PlaneImage, PlaneOp};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::wire::Status;
use uniplane_dataplane::Message;
use uniplane_overlay::acl::{AccessControl, ConnKey};
use uniplane_overlay::table::ForwardingTable;
use uniplane_overlay::translator::Translator;
use uniplane_overlay::{Engine, EngineConfig, ForwardingPlane, PlaneError, PlaneReply, PortId};

/// Ports a simulated server's plane holds at most.
pub const MAX_PORTS: usize = 40;
/// Entries each connector's forwarding table holds.
pub const TABLE_CAPACITY: usize = 512;

/// One port of the connector-only plane.
pub(crate) struct LightPort {
    acl: AccessControl,
    table: ForwardingTable,
}

/// The plane of one simulated server.
pub enum SimPlane {
    /// The overlay engine, and the user ends of its ports' rings.
    Engine {
        /// The engine, stepped on virtual time.
        engine: Box<Engine>,
        /// Each port's ring link.
        links: FxHashMap<PortId, RingLink>,
        /// Messages a full input ring did not take yet, per port.
        backlog: FxHashMap<PortId, Vec<Message>>,
    },
    /// The engine's connectors without its queues.
    Light {
        /// Attached ports.
        ports: Vec<Option<LightPort>>,
        /// The stack translator.
        translator: Translator,
        /// Messages decided and not yet taken by [`SimPlane::drain`].
        out: Vec<(PortId, Message)>,
    },
}

fn port_of<T>(ports: &mut [Option<T>], p: PortId) -> Result<&mut T, PlaneError> {
    ports
        .get_mut(p as usize)
        .and_then(Option::as_mut)
        .ok_or(PlaneError::NoSuchPort(p))
}

impl SimPlane {
    /// A plane: the engine when `engine`, else connectors alone.
    pub fn new(engine: bool) -> SimPlane {
        if engine {
            let config = EngineConfig {
                max_ports: MAX_PORTS,
                burst: 16,
                voq_depth: 8,
                ring_depth: 64,
                table_capacity: TABLE_CAPACITY,
                ..EngineConfig::default()
            };
            SimPlane::Engine {
                engine: Box::new(Engine::new(config)),
                links: FxHashMap::default(),
                backlog: FxHashMap::default(),
            }
        } else {
            SimPlane::Light {
                ports: Vec::new(),
                translator: Translator::new(),
                out: Vec::new(),
            }
        }
    }

    /// Carries out one operation of a control batch.
    pub fn apply(&mut self, op: &PlaneOp) -> Result<OpResult, PlaneError> {
        match self {
            SimPlane::Engine {
                engine,
                links,
                backlog,
            } => match engine.apply(op.clone())? {
                PlaneReply::Attached(p, link) => {
                    links.insert(p, link);
                    backlog.remove(&p);
                    Ok(OpResult::Attached(p))
                }
                PlaneReply::AttachedIo(p) => Ok(OpResult::Attached(p)),
                _ => {
                    if let PlaneOp::Detach(p) = op {
                        links.remove(p);
                        backlog.remove(p);
                    }
                    Ok(OpResult::Done)
                }
            },
            SimPlane::Light {
                ports, translator, ..
            } => {
                match op {
                    PlaneOp::Attach(_) | PlaneOp::AttachIo(..) => {
                        let slot = match ports.iter().position(Option::is_none) {
                            Some(s) => s,
                            None if ports.len() < MAX_PORTS => {
                                ports.push(None);
                                ports.len() - 1
                            }
                            None => return Err(PlaneError::TooManyPorts(MAX_PORTS)),
                        };
                        ports[slot] = Some(LightPort {
                            acl: AccessControl::new(),
                            table: ForwardingTable::new(TABLE_CAPACITY),
                        });
                        return Ok(OpResult::Attached(slot as PortId));
                    }
                    PlaneOp::Detach(p) => {
                        port_of(ports, *p)?;
                        ports[*p as usize] = None;
                        translator.retain(|_, out| out != *p);
                    }
                    PlaneOp::AddRoute(p, r) => port_of(ports, *p)?.table.insert(*r)?,
                    PlaneOp::RemoveRoute(p, k, m) => {
                        port_of(ports, *p)?.table.remove(*k, *m)?;
                    }
                    PlaneOp::SetDefault(p, o) => port_of(ports, *p)?.table.set_default(*o),
                    PlaneOp::Allow(p, c) => port_of(ports, *p)?.acl.allow_connection(*c),
                    PlaneOp::Revoke(p, c) => {
                        port_of(ports, *p)?.acl.revoke_connection(*c);
                    }
                    PlaneOp::AddRule(p, r) => port_of(ports, *p)?.acl.push_rule(*r),
                    PlaneOp::ClearRules(p) => port_of(ports, *p)?.acl.clear_rules(),
                    PlaneOp::AddTranslation(c, o) => {
                        port_of(ports, *o)?;
                        translator.insert(*c, *o);
                    }
                    PlaneOp::RemoveTranslation(c) => {
                        if !translator.remove(*c) {
                            return Err(PlaneError::NoTranslation(*c));
                        }
                    }
                    PlaneOp::SetPolicy(p, _)
                    | PlaneOp::Counters(p)
                    | PlaneOp::Dump(p)
                    | PlaneOp::ConnCounters(p) => {
                        port_of(ports, *p)?;
                    }
                    PlaneOp::Translations | PlaneOp::MovePort(..) => {}
                }
                Ok(OpResult::Done)
            }
        }
    }

    /// A message sent into port `port` (by its application or from its
    /// tunnel). Returns false when the port is not attached.
    pub fn input(&mut self, port: PortId, m: Message) -> bool {
        match self {
            SimPlane::Engine { links, backlog, .. } => {
                let Some(link) = links.get_mut(&port) else {
                    return false;
                };
                let waiting = backlog.entry(port).or_default();
                waiting.push(m);
                push_all(link, waiting);
                true
            }
            SimPlane::Light {
                ports,
                translator,
                out,
            } => {
                let Some(Some(p)) = ports.get(port as usize) else {
                    return false;
                };
                let h = m.header();
                let fate = if p.acl.check(h).is_err() {
                    Err(Status::Denied)
                } else if let Some(o) = translator.lookup(&ConnKey::of(h)) {
                    Ok(o)
                } else {
                    p.table.lookup(h.dst).ok_or(Status::NoRoute)
                };
                match fate {
                    Ok(o) if ports.get(o as usize).is_some_and(Option::is_some) => {
                        out.push((o, m));
                    }
                    Ok(_) => {
                        if let Some(a) = m.error_answer(Status::NoRoute) {
                            out.push((port, a));
                        }
                    }
                    Err(status) => {
                        if let Some(a) = m.error_answer(status) {
                            out.push((port, a));
                        }
                    }
                }
                true
            }
        }
    }

    /// Runs the plane at `now` until it moves nothing more, and hands out
    /// what left through each port. Returns whether anything moved.
    pub fn drain(&mut self, now: Duration, out: &mut Vec<(PortId, Message)>) -> bool {
        match self {
            SimPlane::Engine {
                engine,
                links,
                backlog,
            } => {
                let mut moved = false;
                for _ in 0..64 {
                    let work = engine.step(now);
                    let mut got = false;
                    for (&p, link) in links.iter_mut() {
                        while let Some(m) = try_recv(link) {
                            out.push((p, m));
                            got = true;
                        }
                        if let Some(w) = backlog.get_mut(&p) {
                            push_all(link, w);
                        }
                    }
                    moved |= work > 0 || got;
                    if work == 0 && !got {
                        break;
                    }
                }
                moved
            }
            SimPlane::Light { out: decided, .. } => {
                let moved = !decided.is_empty();
                out.append(decided);
                moved
            }
        }
    }

    /// Whether messages wait in the plane (an engine's rings or queues).
    pub fn busy(&self) -> bool {
        match self {
            SimPlane::Engine { backlog, .. } => backlog.values().any(|b| !b.is_empty()),
            SimPlane::Light { out, .. } => !out.is_empty(),
        }
    }

    /// Compares what the plane holds with what the control core believes
    /// is installed: the same ports, routes, admitted connections, rules
    /// and translations. Returns the first difference.
    pub fn differs_from(&mut self, image: &PlaneImage) -> Option<String> {
        let (ports, translations) = match self {
            SimPlane::Engine { engine, links, .. } => {
                let mut ports = Vec::new();
                let attached: Vec<PortId> = links.keys().copied().collect();
                for p in attached {
                    let d = match engine.dump(p) {
                        Ok(d) => d,
                        Err(e) => return Some(format!("port {p}: {e}")),
                    };
                    let routes: Vec<_> = d
                        .routes
                        .iter()
                        .map(|r| (r.key.to_u64() & r.mask, r.mask, r.port))
                        .collect();
                    ports.push((p, routes, d.connections, d.rules));
                }
                let t = match engine.translations() {
                    Ok(t) => t,
                    Err(e) => return Some(format!("translations: {e}")),
                };
                (ports, t)
            }
            SimPlane::Light {
                ports, translator, ..
            } => {
                let mut out = Vec::new();
                for (i, p) in ports.iter().enumerate() {
                    if let Some(p) = p {
                        let routes: Vec<_> = p
                            .table
                            .routes()
                            .iter()
                            .map(|r| (r.key.to_u64() & r.mask, r.mask, r.port))
                            .collect();
                        out.push((
                            i as PortId,
                            routes,
                            p.acl.connection_keys(),
                            p.acl.rules().to_vec(),
                        ));
                    }
                }
                (out, translator.entries())
            }
        };
        let held: HashSet<PortId> = ports.iter().map(|p| p.0).collect();
        let believed: HashSet<PortId> = image.ports.keys().copied().collect();
        if held != believed {
            return Some(format!("ports: plane {held:?}, core {believed:?}"));
        }
        for (p, routes, conns, rules) in ports {
            let want = &image.ports[&p];
            let have: HashSet<(u64, u64, PortId)> = routes.into_iter().collect();
            let wanted: HashSet<(u64, u64, PortId)> = want
                .routes
                .iter()
                .map(|(k, r)| (k.0, k.1, r.port))
                .collect();
            if have != wanted {
                return Some(format!("routes at port {p}"));
            }
            let both = |ks: &mut dyn Iterator<Item = ConnKey>| -> HashSet<ConnKey> {
                ks.flat_map(|k| [k, k.reversed()]).collect()
            };
            if both(&mut conns.into_iter()) != both(&mut want.allows.iter().copied()) {
                return Some(format!("admitted connections at port {p}"));
            }
            if rules != want.rules {
                return Some(format!("rules at port {p}"));
            }
        }
        let have: FxHashMap<ConnKey, PortId> = translations.into_iter().collect();
        if have.len() != image.translations.len()
            || image
                .translations
                .iter()
                .any(|(k, p)| have.get(k) != Some(p))
        {
            return Some("translations".into());
        }
        None
    }
}

fn push_all(link: &mut RingLink, waiting: &mut Vec<Message>) {
    if waiting.is_empty() {
        return;
    }
    let mut cx = Context::from_waker(Waker::noop());
    let mut sent = 0;
    for m in waiting.iter() {
        match Pin::new(&mut *link).poll_ready(&mut cx) {
            Poll::Ready(Ok(())) => {
                if Pin::new(&mut *link).start_send(m.clone()).is_err() {
                    break;
                }
                sent += 1;
            }
            _ => break,
        }
    }
    let _ = Pin::new(&mut *link).poll_flush(&mut cx);
    waiting.drain(..sent);
}

fn try_recv(link: &mut RingLink) -> Option<Message> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(link).poll_next(&mut cx) {
        Poll::Ready(Some(Ok(m))) => Some(m),
        _ => None,
    }
}
