//! The RTL as a running forwarding plane: rings in and out, control
//! through the same `PlaneOp`s as the engine, tables read back.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{FutureExt, SinkExt, StreamExt};
use uniplane_dataplane::ring::RingLink;
use uniplane_dataplane::sched::Policy;
use uniplane_dataplane::wire::{MsgFlags, ReqType, Status};
use uniplane_dataplane::{Message, Uid};
use uniplane_hw_sim::{Model, RtlPlane, RtlPlaneConfig};
use uniplane_overlay::acl::{AclRule, ConnKey, TypeSet};
use uniplane_overlay::remote::block_on;
use uniplane_overlay::table::Route;
use uniplane_overlay::{
    Engine, EngineConfig, ForwardingPlane, PlaneError, PlaneOp, PlaneReply, PortCounters, PortId,
    PortSpec, RunMode,
};

fn uid(d: u16) -> Uid {
    Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 1), d)
}

fn conn(a: u16, b: u16) -> ConnKey {
    ConnKey {
        src: uid(a),
        src_port: 10 + a,
        dst: uid(b),
        dst_port: 20 + b,
    }
}

fn send_msg(from: u16, to: u16, seq: u32, len: usize) -> Message {
    let mut m = Message::send(
        uid(from).port(10 + from),
        uid(to).port(20 + to),
        Bytes::from(vec![seq as u8; len]),
    )
    .unwrap();
    m.set_seqnum(seq);
    m
}

/// The next message on `link`, waiting up to `within`.
fn recv(link: &mut RingLink, within: Duration) -> Option<Message> {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if let Some(Some(Ok(m))) = link.next().now_or_never() {
            return Some(m);
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    None
}

fn spawn(model: Model, ring_depth: usize) -> uniplane_hw_sim::RtlPlaneHandle {
    RtlPlane::new(RtlPlaneConfig {
        model,
        ring_depth,
        ..RtlPlaneConfig::default()
    })
    .spawn(RunMode::SpinThenPark { spins: 64 })
}

#[test]
fn a_ping_crosses_the_running_rtl_plane_and_an_answer_comes_back() {
    let mut plane = spawn(Model::N4, 64);
    assert_eq!(uniplane_overlay::PlaneHandle::kind(&plane), "rtl");
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (b, mut lb) = plane.attach(PortSpec::app("b")).unwrap();
    plane.add_route(a, Route::exact(uid(2), b)).unwrap();
    plane.add_route(b, Route::exact(uid(1), a)).unwrap();
    plane.allow_connection(a, conn(1, 2)).unwrap();
    plane.allow_connection(b, conn(2, 1)).unwrap();

    let ping = send_msg(1, 2, 7, 100);
    block_on(la.send(ping.clone())).unwrap();
    let got = recv(&mut lb, Duration::from_secs(10)).expect("ping delivered");
    assert_eq!(got.header(), ping.header());
    assert_eq!(got.payload(), ping.payload());

    let pong = send_msg(2, 1, 8, 40);
    block_on(lb.send(pong.clone())).unwrap();
    let got = recv(&mut la, Duration::from_secs(10)).expect("pong delivered");
    assert_eq!(got.payload(), pong.payload());

    // Not admitted: the RTL answers DENIED, as the engine does.
    block_on(la.send(send_msg(1, 3, 9, 0))).unwrap();
    let answer = recv(&mut la, Duration::from_secs(10)).expect("error answer");
    assert!(answer.header().flags.contains(MsgFlags::ERROR));
    assert_eq!(answer.header().status(), Status::Denied);

    let c = plane.counters(a).unwrap();
    assert_eq!((c.rx_msgs, c.tx_msgs, c.acl_denied), (2, 2, 1));
    assert!(plane.stop().is_some());
}

#[test]
fn a_slow_reader_loses_nothing_the_output_is_held_instead() {
    let mut plane = spawn(Model::N4, 8);
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (b, mut lb) = plane.attach(PortSpec::app("b")).unwrap();
    plane.add_route(a, Route::exact(uid(2), b)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    const N: u32 = 400;
    let sender = std::thread::spawn(move || {
        for seq in 0..N {
            block_on(la.send(send_msg(1, 2, seq, (seq as usize * 7) % 300))).unwrap();
        }
        la
    });
    let mut next = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while next < N && Instant::now() < deadline {
        if let Some(Some(Ok(m))) = lb.next().now_or_never() {
            assert_eq!(m.header().seqnum, next, "in order, none missing");
            assert_eq!(m.payload().len(), (next as usize * 7) % 300);
            next += 1;
            if next % 25 == 0 {
                // A slow reader: the ring of 8 fills while it sleeps.
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(next, N, "every message arrived");
    let _la = sender.join().unwrap();
    let c = plane.counters(b).unwrap();
    assert_eq!(c.tx_msgs, u64::from(N));
    assert!(
        plane.counters(a).unwrap().input_stalls > 0,
        "the held output pushed back into the RTL"
    );
    assert!(plane.stop().is_some());
}

#[test]
fn attaching_beyond_the_rtl_ports_is_refused_and_detach_frees_one() {
    let mut plane = RtlPlane::new(RtlPlaneConfig {
        model: Model::N4,
        ..RtlPlaneConfig::default()
    });
    let mut links = Vec::new();
    for i in 0..4 {
        let (p, l) = plane.attach(PortSpec::app(&format!("p{i}"))).unwrap();
        assert_eq!(p, i);
        links.push(l);
    }
    assert_eq!(
        plane.attach(PortSpec::app("one too many")).err(),
        Some(PlaneError::TooManyPorts(4))
    );
    plane.add_route(2, Route::exact(uid(1), 0)).unwrap();
    plane.add_acl_rule(2, AclRule::ALLOW_ALL).unwrap();
    plane.detach(2).unwrap();
    assert_eq!(
        plane.add_route(2, Route::exact(uid(1), 0)),
        Err(PlaneError::NoSuchPort(2))
    );
    let (p, _l) = plane.attach(PortSpec::app("again")).unwrap();
    assert_eq!(p, 2);
    let d = plane.dump(2).unwrap();
    assert!(d.routes.is_empty() && d.rules.is_empty(), "{d:?}");
    assert_eq!(d.name, "again");
}

#[test]
fn a_segment_that_cannot_be_put_back_together_is_counted_not_delivered() {
    let mut plane = RtlPlane::new(RtlPlaneConfig {
        model: Model::N4,
        reassembly_timeout: Duration::from_millis(20),
        ..RtlPlaneConfig::default()
    });
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (b, mut lb) = plane.attach(PortSpec::app("b")).unwrap();
    plane.add_route(a, Route::exact(uid(2), b)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    // A middle segment with no message open for it, and a first segment
    // whose others never come.
    let mut seg = send_msg(1, 2, 1, 32);
    seg.set_segment_flags(MsgFlags::EMPTY);
    block_on(la.send(seg)).unwrap();
    let mut first = send_msg(1, 2, 3, 32);
    first.set_segment_flags(MsgFlags::FIRST);
    block_on(la.send(first)).unwrap();
    block_on(la.send(send_msg(1, 2, 2, 32))).unwrap();
    let mut got = Vec::new();
    for _ in 0..200 {
        plane.step();
        while let Some(Some(Ok(m))) = lb.next().now_or_never() {
            got.push(m.header().seqnum);
        }
    }
    assert_eq!(got, vec![2]);
    std::thread::sleep(Duration::from_millis(30));
    plane.step();
    let r = plane.counters(b).unwrap().reassembly;
    assert_eq!((r.orphans, r.incomplete, r.completed), (1, 1, 0), "{r:?}");
    assert!(lb.next().now_or_never().is_none(), "nothing handed over");
}

/// What one trace gives on a plane: an app `a`, a tunnel `t` of MTU 1000
/// and an app `b`. A 4000-byte message goes from `a` out through `t`; the
/// segments of another 4000-byte message come in by `t` for `b`. Returns
/// what left through `t`, what reached `b`, and the counters of `t` and
/// `b`.
fn cut_and_join<P: ForwardingPlane>(
    plane: &mut P,
) -> (Vec<Message>, Vec<Message>, PortCounters, PortCounters) {
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (t, mut lt) = plane.attach(PortSpec::tunnel("t", 0, 1000)).unwrap();
    let (b, mut lb) = plane.attach(PortSpec::app("b")).unwrap();
    plane.add_route(a, Route::exact(uid(3), t)).unwrap();
    plane.add_route(t, Route::exact(uid(2), b)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    plane.add_acl_rule(t, AclRule::ALLOW_ALL).unwrap();

    let payload: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    let mut out = Message::send(uid(1).port(11), uid(3).port(23), Bytes::from(payload)).unwrap();
    out.set_seqnum(5);
    block_on(la.send(out)).unwrap();
    let mut left = Vec::new();
    while let Some(m) = recv(&mut lt, Duration::from_secs(2)) {
        let last = m.header().flags.contains(MsgFlags::LAST);
        left.push(m);
        if last {
            break;
        }
    }

    let payload: Vec<u8> = (0..4000u32).map(|i| (i * 13) as u8).collect();
    let mut into = Message::send(uid(4).port(14), uid(2).port(22), Bytes::from(payload)).unwrap();
    into.set_seqnum(9);
    let mut segments = Vec::new();
    uniplane_overlay::segment::segment(into, 1000, |s| segments.push(s));
    for s in segments {
        block_on(lt.send(s)).unwrap();
    }
    let mut reached = Vec::new();
    if let Some(m) = recv(&mut lb, Duration::from_secs(2)) {
        reached.push(m);
    }
    // Nothing else follows.
    reached.extend(recv(&mut lb, Duration::from_millis(50)));
    left.extend(recv(&mut lt, Duration::from_millis(50)));
    let ct = plane.counters(t).unwrap();
    let cb = plane.counters(b).unwrap();
    (left, reached, ct, cb)
}

#[test]
fn a_message_above_a_tunnel_mtu_leaves_as_segments_and_segments_reach_an_app_whole() {
    let mut plane = spawn(Model::N4, 64);
    let (left, reached, ct, cb) = cut_and_join(&mut plane);
    assert!(left.len() >= 4, "{} segments", left.len());
    assert!(left.iter().all(|m| m.payload().len() <= 1000));
    assert!(left[0].header().flags.contains(MsgFlags::FIRST));
    assert!(left.last().unwrap().header().flags.contains(MsgFlags::LAST));
    assert!(left.iter().all(|m| m.header().seqnum == 5));
    let joined: Vec<u8> = left.iter().flat_map(|m| m.payload().to_vec()).collect();
    let want: Vec<u8> = (0..4000u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(joined, want);
    assert_eq!(ct.segments, left.len() as u64);

    assert_eq!(reached.len(), 1, "one whole message");
    let m = &reached[0];
    assert!(m.header().flags.contains(MsgFlags::WHOLE));
    assert_eq!(m.header().seqnum, 9);
    let want: Vec<u8> = (0..4000u32).map(|i| (i * 13) as u8).collect();
    assert_eq!(m.payload().as_ref(), &want[..]);
    assert_eq!(cb.reassembly.completed, 1);
    assert_eq!(cb.reassembly.orphans + cb.reassembly.incomplete, 0);
    assert!(plane.stop().is_some());
}

#[test]
fn a_slow_tunnel_reader_loses_no_segment_the_output_is_held_instead() {
    let mut plane = spawn(Model::N4, 8);
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (t, mut lt) = plane.attach(PortSpec::tunnel("t", 0, 100)).unwrap();
    plane.add_route(a, Route::exact(uid(2), t)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    const N: u32 = 40;
    let sender = std::thread::spawn(move || {
        for seq in 0..N {
            block_on(la.send(send_msg(1, 2, seq, 1000))).unwrap();
        }
        la
    });
    // Each message leaves as 10 segments, in order.
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < (N * 10) as usize && Instant::now() < deadline {
        if let Some(Some(Ok(m))) = lt.next().now_or_never() {
            got.push((m.header().seqnum, m.payload().len(), m.header().flags));
            if got.len() % 25 == 0 {
                // A slow reader: the ring of 8 fills while it sleeps.
                std::thread::sleep(Duration::from_millis(20));
            }
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    assert_eq!(got.len(), (N * 10) as usize, "every segment arrived");
    for (i, (seq, len, flags)) in got.iter().enumerate() {
        assert_eq!(*seq, (i / 10) as u32, "in order, none missing");
        assert_eq!(*len, 100);
        assert_eq!(flags.contains(MsgFlags::FIRST), i % 10 == 0);
        assert_eq!(flags.contains(MsgFlags::LAST), i % 10 == 9);
    }
    let _la = sender.join().unwrap();
    assert_eq!(plane.counters(t).unwrap().segments, u64::from(N * 10));
    assert!(plane.stop().is_some());
}

#[test]
fn the_engine_and_the_rtl_cut_and_join_alike() {
    let mut engine = Engine::new(EngineConfig {
        max_ports: 4,
        ..EngineConfig::default()
    })
    .spawn(RunMode::SpinThenPark { spins: 64 });
    let mut rtl = spawn(Model::N4, 64);
    let (e_left, e_reached, e_t, e_b) = cut_and_join(&mut engine);
    let (r_left, r_reached, r_t, r_b) = cut_and_join(&mut rtl);
    let view = |ms: &[Message]| -> Vec<_> {
        ms.iter()
            .map(|m| (*m.header(), m.payload().clone()))
            .collect()
    };
    assert_eq!(view(&r_left), view(&e_left), "through the tunnel");
    assert_eq!(view(&r_reached), view(&e_reached), "to the app");
    assert_eq!(r_b.reassembly, e_b.reassembly);
    // The engine counts segments on the port the message came in by; the
    // RTL bridge on the port they leave through.
    assert_eq!(r_t.segments, e_left.len() as u64);
    assert_eq!(e_t.segments + r_b.segments, 0);
    assert!(engine.stop().is_some());
    assert!(rtl.stop().is_some());
}

#[test]
fn a_detached_port_makes_routes_to_it_answer_no_route() {
    let mut plane = RtlPlane::new(RtlPlaneConfig {
        model: Model::N4,
        ..RtlPlaneConfig::default()
    });
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (b, _lb) = plane.attach(PortSpec::app("b")).unwrap();
    plane.add_route(a, Route::exact(uid(2), b)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    plane.detach(b).unwrap();
    block_on(la.send(send_msg(1, 2, 5, 10))).unwrap();
    let mut answer = None;
    for _ in 0..200 {
        plane.step();
        if let Some(Some(Ok(m))) = la.next().now_or_never() {
            answer = Some(m);
            break;
        }
    }
    let answer = answer.expect("answered");
    assert_eq!(answer.header().status(), Status::NoRoute);
    // The route stays (as in the engine) and names the port asked for.
    assert_eq!(plane.dump(a).unwrap().routes, vec![Route::exact(uid(2), b)]);
}

/// A sequence of control operations touching every table.
fn ops() -> Vec<PlaneOp> {
    let server = Uid::new(std::net::Ipv4Addr::new(10, 0, 0, 9), 0);
    let deny_writes = AclRule {
        src: uid(3),
        src_mask: Uid::MASK,
        dst: server,
        dst_mask: 0xffff_ffff_0000,
        types: TypeSet::of(&[ReqType::Write, ReqType::Read]),
        allow: false,
    };
    vec![
        PlaneOp::Attach(PortSpec::app("a")),
        PlaneOp::Attach(PortSpec::app("b")),
        PlaneOp::Attach(PortSpec::app("c")),
        PlaneOp::AddRoute(0, Route::exact(uid(2), 1)),
        PlaneOp::AddRoute(0, Route::exact(uid(3), 2)),
        PlaneOp::AddRoute(
            0,
            Route {
                key: server,
                mask: 0xffff_ffff_0000,
                priority: 5,
                port: 2,
            },
        ),
        PlaneOp::AddRoute(0, Route::exact(uid(4), 1)),
        PlaneOp::RemoveRoute(0, uid(4), Uid::MASK),
        PlaneOp::RemoveRoute(0, uid(4), Uid::MASK),
        PlaneOp::AddRoute(1, Route::exact(uid(1), 0)),
        PlaneOp::AddRoute(9, Route::exact(uid(1), 0)),
        PlaneOp::SetDefault(1, Some(2)),
        PlaneOp::SetDefault(2, Some(0)),
        PlaneOp::SetDefault(2, None),
        PlaneOp::Allow(0, conn(1, 2)),
        PlaneOp::Allow(0, conn(1, 3)),
        PlaneOp::Allow(1, conn(2, 1)),
        PlaneOp::Revoke(0, conn(1, 3)),
        PlaneOp::AddRule(2, deny_writes),
        PlaneOp::AddRule(2, AclRule::ALLOW_ALL),
        PlaneOp::AddRule(1, AclRule::ALLOW_ALL),
        PlaneOp::ClearRules(1),
        PlaneOp::AddTranslation(conn(1, 2), 1),
        PlaneOp::AddTranslation(conn(3, 1), 0),
        PlaneOp::AddTranslation(conn(3, 2), 5),
        PlaneOp::RemoveTranslation(conn(3, 1)),
        PlaneOp::RemoveTranslation(conn(3, 1)),
        PlaneOp::SetPolicy(1, Policy::Weighted(vec![3, 1, 2])),
        PlaneOp::SetPolicy(2, Policy::Weighted(vec![1, 0])),
    ]
}

fn outcome(r: &Result<PlaneReply, PlaneError>) -> String {
    match r {
        Ok(PlaneReply::Attached(p, _)) => format!("attached {p}"),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("error {e}"),
    }
}

#[test]
fn dump_after_the_same_ops_reads_back_what_the_engine_holds() {
    let mut engine = Engine::new(EngineConfig {
        max_ports: 8,
        ..EngineConfig::default()
    });
    let rtl = RtlPlane::new(RtlPlaneConfig {
        model: Model::N8,
        ..RtlPlaneConfig::default()
    });
    // The RTL through its running thread and the batched handle, as the
    // daemon drives it.
    let rtl = rtl.spawn(RunMode::SpinThenPark { spins: 64 });
    let want: Vec<_> = ops().into_iter().map(|op| engine.apply(op)).collect();
    let got = rtl.remote().submit_blocking(ops()).unwrap();
    let want_s: Vec<String> = want.iter().map(outcome).collect();
    let got_s: Vec<String> = got.iter().map(outcome).collect();
    assert_eq!(got_s, want_s, "every operation succeeds or fails alike");
    let mut rtl_plane = rtl.clone();
    for p in 0..3 as PortId {
        let e = engine.dump(p).unwrap();
        let r = rtl_plane.dump(p).unwrap();
        assert_eq!(r.name, e.name);
        assert_eq!(r.kind, e.kind);
        assert_eq!(r.routes, e.routes, "port {p} routes");
        assert_eq!(r.default_route, e.default_route, "port {p} default");
        assert_eq!(r.connections, e.connections, "port {p} connections");
        assert_eq!(r.rules, e.rules, "port {p} rules");
        assert_eq!(r.policy, e.policy, "port {p} policy");
    }
    assert_eq!(rtl_plane.translations(), engine.translations());
    drop(rtl_plane);
    assert!(rtl.stop().is_some());
}

#[test]
fn the_largest_message_crosses_whole() {
    let mut plane = RtlPlane::new(RtlPlaneConfig {
        model: Model::N4,
        ..RtlPlaneConfig::default()
    });
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let (b, mut lb) = plane.attach(PortSpec::app("b")).unwrap();
    plane.add_route(a, Route::exact(uid(2), b)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    let payload: Vec<u8> = (0..Message::MAX_PAYLOAD).map(|i| i as u8).collect();
    let m = Message::send(uid(1).port(1), uid(2).port(2), Bytes::from(payload)).unwrap();
    block_on(la.send(m.clone())).unwrap();
    let mut got = None;
    for _ in 0..2000 {
        plane.step();
        if let Some(Some(Ok(d))) = lb.next().now_or_never() {
            got = Some(d);
            break;
        }
    }
    let got = got.expect("delivered");
    assert_eq!(got.header(), m.header());
    assert_eq!(got.payload(), m.payload());
}

/// On the kernel model, the kernels' ports are kept: ordinary attaches
/// take the host's ports 0 to 5 only, and the device port named in
/// `reserve` lands on its kernel's port, whose kernel then answers what
/// the crossbar sends it (the daemon's `backend = "rtl"` kernel device).
#[test]
fn a_reserved_kernel_port_goes_to_its_device_and_its_kernel_answers() {
    let mut plane = RtlPlane::new(RtlPlaneConfig {
        model: Model::N8Kernels,
        ..RtlPlaneConfig::default()
    });
    plane.reserve(Model::SUM32_PORT as PortId, "sum").unwrap();
    let (a, mut la) = plane.attach(PortSpec::app("a")).unwrap();
    let mut kernel = PortSpec::app("sum");
    kernel.kind = uniplane_overlay::PortKind::Device;
    let (k, _kernel_link) = plane.attach(kernel).unwrap();
    // An application of the same name is not the device.
    let (b, _lb) = plane.attach(PortSpec::app("sum")).unwrap();
    assert_eq!((a, k, b), (0, Model::SUM32_PORT as PortId, 1));
    let more: Vec<_> = (2..6)
        .map(|i| plane.attach(PortSpec::app(&format!("c{i}"))).unwrap())
        .collect();
    assert_eq!(
        more.iter().map(|(p, _)| *p).collect::<Vec<_>>(),
        [2, 3, 4, 5]
    );
    assert_eq!(
        plane.attach(PortSpec::app("d")).map(|(p, _)| p),
        Err(PlaneError::TooManyPorts(8))
    );
    plane.add_route(a, Route::exact(uid(3), k)).unwrap();
    plane.add_route(k, Route::exact(uid(1), a)).unwrap();
    plane.add_acl_rule(a, AclRule::ALLOW_ALL).unwrap();
    plane.add_acl_rule(k, AclRule::ALLOW_ALL).unwrap();
    let mut m = Message::send(
        uid(1).port(7),
        uid(3).port(9),
        Bytes::from(
            [1u32, 2, 3]
                .iter()
                .flat_map(|w| w.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
    )
    .unwrap();
    m.set_seqnum(5);
    block_on(la.send(m)).unwrap();
    let mut answer = None;
    for _ in 0..200 {
        plane.step();
        if let Some(Some(Ok(m))) = la.next().now_or_never() {
            answer = Some(m);
            break;
        }
    }
    let answer = answer.expect("no answer from the sum32 kernel");
    assert_eq!(answer.payload().as_ref(), 6u32.to_le_bytes());
    assert_eq!(
        (
            answer.header().src,
            answer.header().dst,
            answer.header().seqnum
        ),
        (uid(3), uid(1), 5)
    );
    let c = plane.counters(k).unwrap();
    assert_eq!((c.tx_msgs, c.rx_msgs), (1, 1), "{c:?}");
}
