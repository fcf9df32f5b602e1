//! Random scenarios shared by the equivalence tests and the measurements:
//! table contents, access control, translations, policies and message
//! traces, all from one seed, applied to any `ForwardingPlane`.

#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::task::noop_waker;
use futures_util::{Sink, Stream as _};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::{ReqType, Status};
use uniplane_dataplane::{Message, SplitMix64, Uid};
use uniplane_overlay::acl::{AclRule, ConnKey, TypeSet};
use uniplane_overlay::table::Route;
use uniplane_overlay::{Engine, EngineConfig, ForwardingPlane, PortCounters, PortId, PortSpec};

/// One control-plane operation.
#[derive(Clone, Debug)]
pub enum Op {
    Route(PortId, Route),
    Unroute(PortId, Uid, u64),
    Default(PortId, Option<PortId>),
    Allow(PortId, ConnKey),
    Rule(PortId, AclRule),
    Translate(ConnKey, PortId),
    Policy(PortId, Policy),
}

/// Everything one seed decides.
#[derive(Clone, Debug)]
pub struct Scenario {
    pub ports: usize,
    pub ops: Vec<Op>,
    /// Messages each input sends, in order. Sequence numbers are
    /// `input << 16 | k`, so every output message names its input.
    pub messages: Vec<Vec<Message>>,
}

pub fn uid(server: u8, device: u16) -> Uid {
    Uid::new(Ipv4Addr::new(10, 0, 0, server), device)
}

fn pick<T: Clone>(rng: &mut SplitMix64, v: &[T]) -> T {
    v[rng.below(v.len() as u64) as usize].clone()
}

/// The UIDs traffic uses: two servers, four devices each.
pub fn pool() -> Vec<Uid> {
    (1..=2u8)
        .flat_map(|s| (1..=4u16).map(move |d| uid(s, d)))
        .collect()
}

impl Scenario {
    /// A random scenario for `ports` ports. `beats_per_input` bounds the
    /// beats each input sends (so every queue can hold its whole trace).
    pub fn random(seed: u64, ports: usize, msgs_per_input: usize, beats_per_input: usize) -> Self {
        let mut rng = SplitMix64::new(seed);
        let pool = pool();
        let np = ports as u64;
        let mut ops = Vec::new();
        let port = |rng: &mut SplitMix64| -> PortId {
            // Now and then a route to a port that does not exist: a miss.
            if rng.chance(0.05) {
                ports as PortId + 3
            } else {
                rng.below(np) as PortId
            }
        };
        let mut conns = Vec::new();
        for _ in 0..6 {
            conns.push(ConnKey {
                src: pick(&mut rng, &pool),
                src_port: 1 + rng.below(2) as u16,
                dst: pick(&mut rng, &pool),
                dst_port: 1 + rng.below(2) as u16,
            });
        }
        for p in 0..ports as PortId {
            // Routes: exact UIDs, whole servers, priorities that compete.
            let mut installed = Vec::new();
            for _ in 0..rng.below(10) {
                let route = if rng.chance(0.7) {
                    Route {
                        priority: rng.below(3) as u32,
                        ..Route::exact(pick(&mut rng, &pool), port(&mut rng))
                    }
                } else {
                    Route {
                        priority: rng.below(3) as u32,
                        ..Route::server(
                            Ipv4Addr::new(10, 0, 0, 1 + rng.below(2) as u8),
                            port(&mut rng),
                        )
                    }
                };
                installed.push(route);
                ops.push(Op::Route(p, route));
            }
            if !installed.is_empty() && rng.chance(0.3) {
                let r = pick(&mut rng, &installed);
                ops.push(Op::Unroute(p, r.key, r.mask));
            }
            if rng.chance(0.5) {
                ops.push(Op::Default(p, Some(port(&mut rng))));
            }
            // Access control.
            let mode = rng.below(20);
            if mode < 12 {
                if rng.chance(0.5) {
                    let denied = pick(&mut rng, &[ReqType::Write, ReqType::Read, ReqType::Push]);
                    ops.push(Op::Rule(
                        p,
                        AclRule {
                            src: pick(&mut rng, &pool),
                            src_mask: if rng.chance(0.5) {
                                Uid::MASK
                            } else {
                                Uid::MASK & !0xffff
                            },
                            dst: Uid::from_bytes([0; 6]),
                            dst_mask: 0,
                            types: TypeSet::of(&[denied]),
                            allow: false,
                        },
                    ));
                }
                ops.push(Op::Rule(p, AclRule::ALLOW_ALL));
            } else if mode < 18 {
                for _ in 0..1 + rng.below(3) {
                    ops.push(Op::Allow(p, pick(&mut rng, &conns)));
                }
                if rng.chance(0.5) {
                    ops.push(Op::Rule(
                        p,
                        AclRule {
                            types: TypeSet::of(&[ReqType::Write, ReqType::Read, ReqType::SendCmpl]),
                            ..AclRule::ALLOW_ALL
                        },
                    ));
                }
            }
            // mode 18, 19: nothing is allowed at this port.
        }
        for _ in 0..rng.below(3) {
            ops.push(Op::Translate(
                pick(&mut rng, &conns),
                rng.below(np) as PortId,
            ));
        }
        for o in 0..ports as PortId {
            let weights = |rng: &mut SplitMix64| {
                (0..ports)
                    .map(|_| 1 + rng.below(3) as u32)
                    .collect::<Vec<_>>()
            };
            let policy = match rng.below(10) {
                0..=3 => Policy::RoundRobin,
                4..=7 => Policy::Weighted(weights(&mut rng)),
                _ => Policy::StrictPriority {
                    class: (0..ports).map(|_| rng.below(3) as u8 * 2).collect(),
                    weights: weights(&mut rng),
                },
            };
            ops.push(Op::Policy(o, policy));
        }

        let mut messages = Vec::new();
        for i in 0..ports {
            let mut list = Vec::new();
            let mut beats = 0;
            for k in 0..msgs_per_input {
                let seq = (i as u32) << 16 | k as u32;
                let big = k == 0 && rng.chance(0.08);
                let len = if big {
                    1600 + rng.below(200) as usize
                } else {
                    rng.below(200) as usize
                };
                let src = pick(&mut rng, &pool);
                let dst = pick(&mut rng, &pool);
                let payload = Bytes::from(
                    (0..len)
                        .map(|b| (b as u32 ^ seq) as u8)
                        .collect::<Vec<u8>>(),
                );
                let sp = 1 + rng.below(2) as u16;
                let dp = 1 + rng.below(2) as u16;
                let mut m = match rng.below(20) {
                    0..=11 => Message::send(src.port(sp), dst.port(dp), payload).unwrap(),
                    12..=14 => {
                        Message::write(src, dst.at(0x1000 + rng.below(64) * 8), payload).unwrap()
                    }
                    15..=16 => Message::read(
                        src.at(0x2000),
                        dst.at(0x40 * rng.below(16)),
                        1 + rng.below(512) as u16,
                    )
                    .unwrap(),
                    17 => {
                        let mut m =
                            Message::send(src.port(sp), dst.port(dp), Bytes::new()).unwrap();
                        m.set_seqnum(seq);
                        m.error_answer(Status::Ok).unwrap()
                    }
                    _ => {
                        let mut m = Message::send(src.port(sp), dst.port(dp), payload).unwrap();
                        // A PUSH: same layout as SEND.
                        let (mut h, p) = m.clone().into_parts();
                        h.request = uniplane_dataplane::wire::Request::port(ReqType::Push, sp, dp);
                        m = Message::new(h, p).unwrap();
                        m
                    }
                };
                m.set_seqnum(seq);
                let b = m.encoded_len().div_ceil(32);
                if beats + b > beats_per_input {
                    break;
                }
                beats += b;
                list.push(m);
                if big {
                    break;
                }
            }
            messages.push(list);
        }
        Scenario {
            ports,
            ops,
            messages,
        }
    }

    /// Applies the control operations to `plane`; each must succeed or
    /// fail alike on every plane, so the outcomes are returned.
    pub fn program<P: ForwardingPlane>(&self, plane: &mut P) -> Vec<bool> {
        self.ops
            .iter()
            .map(|op| {
                match op.clone() {
                    Op::Route(p, r) => plane.add_route(p, r),
                    Op::Unroute(p, k, m) => plane.remove_route(p, k, m),
                    Op::Default(p, o) => plane.set_default_route(p, o),
                    Op::Allow(p, c) => plane.allow_connection(p, c),
                    Op::Rule(p, r) => plane.add_acl_rule(p, r),
                    Op::Translate(c, o) => plane.add_translation(c, o),
                    Op::Policy(o, pol) => plane.set_policy(o, pol),
                }
                .is_ok()
            })
            .collect()
    }
}

fn try_send(link: &mut RingLink, m: Message) {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    match Pin::new(&mut *link).poll_ready(&mut cx) {
        Poll::Ready(Ok(())) => Pin::new(&mut *link).start_send(m).unwrap(),
        _ => panic!("ring full"),
    }
    let _ = Pin::new(&mut *link).poll_flush(&mut cx);
}

fn try_recv(link: &mut RingLink) -> Option<Message> {
    let waker = noop_waker();
    let mut cx = Context::from_waker(&waker);
    match Pin::new(link).poll_next(&mut cx) {
        Poll::Ready(Some(Ok(m))) => Some(m),
        _ => None,
    }
}

/// What a plane did with a scenario: the messages each output sent, in
/// order, and each port's counters.
pub struct Outcome {
    pub outputs: Vec<Vec<Message>>,
    pub counters: Vec<PortCounters>,
    pub programmed: Vec<bool>,
}

/// Runs `sc` through the software engine. With `preload`, every message
/// sits in the virtual output queues before any output is served (one
/// step with queues and bursts larger than the trace): only the
/// schedulers decide the interleaving.
pub fn run_engine(sc: &Scenario, preload: bool) -> Outcome {
    let config = if preload {
        EngineConfig {
            max_ports: sc.ports,
            burst: 4096,
            voq_depth: 4096,
            ring_depth: 4096,
            table_capacity: 32,
            ..EngineConfig::default()
        }
    } else {
        EngineConfig {
            max_ports: sc.ports,
            burst: 2,
            voq_depth: 3,
            ring_depth: 4096,
            table_capacity: 32,
            ..EngineConfig::default()
        }
    };
    let mut e = Engine::new(config);
    let mut links = Vec::new();
    for i in 0..sc.ports {
        let (id, link) = e.attach(PortSpec::app(&format!("p{i}"))).unwrap();
        assert_eq!(id as usize, i);
        links.push(link);
    }
    let programmed = sc.program(&mut e);
    for (i, msgs) in sc.messages.iter().enumerate() {
        for m in msgs {
            try_send(&mut links[i], m.clone());
        }
    }
    let mut outputs = vec![Vec::new(); sc.ports];
    for step in 0..10_000u64 {
        let work = e.step(Duration::from_nanos(step));
        for (o, link) in links.iter_mut().enumerate() {
            while let Some(m) = try_recv(link) {
                outputs[o].push(m);
            }
        }
        if work == 0 && step > 2 {
            break;
        }
    }
    let counters = (0..sc.ports as PortId)
        .map(|p| e.counters(p).unwrap())
        .collect();
    Outcome {
        outputs,
        counters,
        programmed,
    }
}
