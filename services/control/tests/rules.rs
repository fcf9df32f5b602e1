//! The control core's rules on one server — registry, admission, teardown,
//! bounds, plane refusals — one behaviour per test, on virtual time against
//! a model plane.

mod harness;

use harness::*;
use uniplane_control::*;
use uniplane_dataplane::wire::{ReqType, Status};
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::PlaneError;

const A: SessionId = 1;
const B: SessionId = 2;

fn connected(r: Result<Reply, ControlError>) -> ConnKey {
    match r {
        Ok(Reply::Connected(k)) => k,
        other => panic!("not connected: {other:?}"),
    }
}

/// Asserts that both local ends of `key` (`ends`: its source's, then its
/// destination's) and nobody else were told it is gone with `status`.
fn both_ends_told(
    h: &mut Harness,
    ends: (uniplane_dataplane::Uid, uniplane_dataplane::Uid),
    key: ConnKey,
    status: Status,
) {
    let mut notices = h.notices();
    notices.sort_by_key(|n| n.0);
    let mut want = vec![
        (ends.0, ReqType::Notify, key, status),
        (ends.1, ReqType::Notify, key.reversed(), status),
    ];
    want.sort_by_key(|n| n.0);
    assert_eq!(notices, want);
}

#[test]
fn start_registers_the_daemon_and_devices_with_routes_between_all() {
    let h = Harness::new(config());
    let names: Vec<(u16, String)> = h
        .core
        .resources()
        .map(|r| (r.uid.device(), r.name.clone()))
        .collect();
    assert_eq!(
        names,
        vec![
            (0, "daemon".into()),
            (1, "echo".into()),
            (2, "relay".into())
        ]
    );
    assert!(h.out.iter().any(|a| matches!(
        a,
        Action::PortReady {
            usage: PortUse::Daemon,
            ..
        }
    )));
    h.check();
}

#[test]
fn a_local_connection_the_policy_allows_is_admitted_and_the_listener_told() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    let client = h.attach(B, "client");
    h.listen(A, 80);
    let key = connected(h.connect(B, server, 80));
    assert_eq!((key.src, key.dst, key.dst_port), (client, server, 80));
    assert_eq!(
        h.notices(),
        vec![(server, ReqType::Connect, key.reversed(), Status::Ok)]
    );
    assert_eq!(h.core.connections().count(), 1);
    h.check();
}

#[test]
fn a_connection_the_policy_denies_is_refused_and_installs_nothing() {
    let mut c = config();
    c.rules.push(AccessRule {
        src: UidMatch::ANY,
        dst: UidMatch {
            key: uid("10.0.0.1:1"),
            mask: u64::MAX >> 16,
        },
        types: Some(vec![ReqType::Connect]),
        allow: false,
    });
    let mut h = Harness::new(c);
    h.attach(A, "client");
    let r = h.connect(A, uid("10.0.0.1:1"), 7);
    assert!(matches!(r, Err(ControlError::Denied(_))), "{r:?}");
    assert_eq!(r.unwrap_err().kind(), "denied");
    assert_eq!(h.core.connections().count(), 0);
    h.check();
}

#[test]
fn a_connection_to_a_port_nothing_listens_on_is_refused() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    h.attach(B, "client");
    h.listen(A, 80);
    let r = h.connect(B, server, 81);
    assert_eq!(r.unwrap_err().kind(), "refused");
    let r = h.connect(B, uid("10.0.0.1:77"), 81);
    assert_eq!(r.unwrap_err().kind(), "refused");
    assert!(h.notices().is_empty());
    h.check();
}

#[test]
fn devices_accept_on_every_port_and_get_no_notice() {
    let mut h = Harness::new(config());
    h.attach(A, "client");
    connected(h.connect(A, uid("10.0.0.1:1"), 4242));
    assert!(h.notices().is_empty());
    h.check();
}

#[test]
fn a_device_hears_of_a_connection_whose_session_ended() {
    let mut h = Harness::new(config());
    h.attach(A, "client");
    let echo = uid("10.0.0.1:1");
    let conn = connected(h.connect(A, echo, 7));
    assert!(h.notices().is_empty(), "a device hears of no connect");
    // The session ends without closing in band: the device is told, as
    // a process would be, so it can forget what it kept for the caller.
    h.event(Event::ClientClosed { session: A });
    assert_eq!(
        h.notices(),
        vec![(echo, ReqType::Notify, conn.reversed(), Status::Closed)]
    );
    h.check();
}

#[test]
fn a_failed_device_closes_its_connections_and_no_other() {
    let mut h = Harness::new(config());
    let client = h.attach(A, "client");
    let server = h.attach(B, "server");
    h.listen(B, 80);
    let to_echo = connected(h.connect(A, uid("10.0.0.1:1"), 7));
    let other = connected(h.connect(A, server, 80));
    h.notices();
    h.event(Event::DeviceFailed { device: 1 });
    assert_eq!(
        h.notices(),
        vec![(client, ReqType::Notify, to_echo, Status::PeerFailed)],
        "the device's caller is told, nobody else"
    );
    assert!(h.core.connections().any(|c| c.key == other));
    assert!(!h.core.connections().any(|c| c.key == to_echo));
    h.check();
}

#[test]
fn requests_before_attach_are_answered_not_attached() {
    let mut h = Harness::new(config());
    assert_eq!(
        h.ask(A, ClientRequest::Listen { port: 1 }),
        Err(ControlError::NotAttached)
    );
    assert_eq!(
        h.connect(A, uid("10.0.0.1:1"), 1),
        Err(ControlError::NotAttached)
    );
    h.attach(A, "x");
    let again = h.ask(A, ClientRequest::Attach { name: "y".into() });
    assert_eq!(again.unwrap_err().kind(), "bad-request");
}

#[test]
fn closing_a_connection_tells_both_local_ends_and_removes_its_entries() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    let client = h.attach(B, "client");
    h.listen(A, 80);
    let key = connected(h.connect(B, server, 80));
    h.notices();
    // Either direction names it; only its ends may close it.
    assert_eq!(
        h.ask(
            A,
            ClientRequest::Close {
                conn: key.reversed()
            }
        ),
        Ok(Reply::Done)
    );
    both_ends_told(&mut h, (client, server), key, Status::Closed);
    assert_eq!(h.core.connections().count(), 0);
    let again = h.ask(A, ClientRequest::Close { conn: key });
    assert_eq!(again.unwrap_err().kind(), "not-found");
    h.check();
}

#[test]
fn only_an_end_may_close_a_connection() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    h.attach(B, "client");
    h.attach(3, "stranger");
    h.listen(A, 80);
    let key = connected(h.connect(B, server, 80));
    let r = h.ask(3, ClientRequest::Close { conn: key });
    assert_eq!(r.unwrap_err().kind(), "denied");
    assert_eq!(h.core.connections().count(), 1);
}

#[test]
fn a_client_that_goes_away_frees_its_resource_routes_and_connections() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    let client = h.attach(B, "client");
    h.listen(A, 80);
    let key = connected(h.connect(B, server, 80));
    h.notices();
    let ports_before = h.plane.ports.len();
    h.event(Event::ClientClosed { session: A });
    assert!(h.core.resource(server.device()).is_none());
    assert_eq!(h.core.connections().count(), 0);
    assert_eq!(
        h.notices(),
        vec![(client, ReqType::Notify, key, Status::Closed)]
    );
    assert_eq!(h.plane.ports.len(), ports_before - 1);
    for port in h.plane.ports.values() {
        assert!(!port.routes.contains_key(&(
            server.to_u64(),
            uid("0.0.0.0:0").to_u64() | (u64::MAX >> 16)
        )));
    }
    assert!(h.out.iter().any(|a| matches!(a, Action::PortGone { .. })));
    h.check();
}

#[test]
fn the_plane_refusing_a_route_fails_the_attach_and_rolls_it_back() {
    let mut h = Harness::new(config());
    let before: Vec<u16> = h.core.resources().map(|r| r.uid.device()).collect();
    h.plane.refuse = Some(|op| matches!(op, PlaneOp::AddRoute(..)));
    let r = h.ask(A, ClientRequest::Attach { name: "x".into() });
    assert!(
        matches!(r, Err(ControlError::Plane(PlaneError::Table(_)))),
        "{r:?}"
    );
    assert_eq!(r.unwrap_err().kind(), "engine");
    let after: Vec<u16> = h.core.resources().map(|r| r.uid.device()).collect();
    assert_eq!(before, after, "the resource is gone again");
    assert_eq!(h.plane.refused, 1);
    h.check();
    // The session may try again.
    h.attach(A, "x");
    h.check();
}

#[test]
fn the_plane_refusing_an_admission_fails_the_connect_and_rolls_it_back() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    h.attach(B, "client");
    h.listen(A, 80);
    h.plane.refuse = Some(|op| matches!(op, PlaneOp::Allow(..)));
    let r = h.connect(B, server, 80);
    assert_eq!(r.unwrap_err().kind(), "engine");
    assert_eq!(h.core.connections().count(), 0);
    assert!(h.notices().is_empty(), "the listener never heard of it");
    h.check();
}

#[test]
fn a_plane_out_of_ports_fails_the_attach_with_a_resources_error() {
    let mut h = Harness::new(config());
    h.plane.max_ports = h.plane.ports.len();
    let r = h.ask(A, ClientRequest::Attach { name: "x".into() });
    assert_eq!(r.unwrap_err().kind(), "resources");
    h.check();
}

#[test]
fn resources_connections_and_listening_ports_are_bounded() {
    let mut c = config();
    c.limits.resources = 4;
    c.limits.connections = 1;
    c.limits.listening_per_resource = 1;
    let mut h = Harness::new(c);
    let server = h.attach(A, "server");
    let r = h.ask(B, ClientRequest::Attach { name: "x".into() });
    assert_eq!(r, Err(ControlError::Limit("resources")));
    h.listen(A, 80);
    let r = h.ask(A, ClientRequest::Listen { port: 81 });
    assert_eq!(r.unwrap_err().kind(), "limit");
    connected(h.connect(A, server, 80));
    let r = h.connect(A, server, 80);
    assert_eq!(r.unwrap_err().kind(), "limit");
    h.check();
}

#[test]
fn events_wait_while_a_batch_is_in_flight_and_run_in_order() {
    let mut h = Harness::new(config());
    h.hold = true;
    let r1 = h.request(A, ClientRequest::Attach { name: "a".into() });
    let r2 = h.request(A, ClientRequest::Listen { port: 80 });
    assert!(h.answer(r1).is_none() && h.answer(r2).is_none());
    assert_eq!(h.held.len(), 1, "one batch at a time");
    assert_eq!(h.core.poll_timeout(), None);
    h.release();
    assert!(matches!(h.answer(r1), Some(Ok(Reply::Attached { .. }))));
    assert_eq!(h.answer(r2), Some(Ok(Reply::Port(80))));
    h.check();
}

#[test]
fn a_policy_is_set_through_the_plane_and_an_unknown_device_is_not_found() {
    let mut h = Harness::new(config());
    let r = h.ask(
        A,
        ClientRequest::SetPolicy {
            device: 1,
            policy: uniplane_dataplane::sched::Policy::RoundRobin,
        },
    );
    assert_eq!(r, Ok(Reply::Done));
    let r = h.ask(
        A,
        ClientRequest::SetPolicy {
            device: 99,
            policy: uniplane_dataplane::sched::Policy::RoundRobin,
        },
    );
    assert_eq!(r.unwrap_err().kind(), "not-found");
}

#[test]
fn a_refused_removal_is_retried_and_never_leaves_a_route_to_a_gone_port() {
    let mut h = Harness::new(config());
    let gone = h.attach(A, "gone");
    h.plane.refuse = Some(|op| matches!(op, PlaneOp::RemoveRoute(..)));
    h.event(Event::ClientClosed { session: A });
    assert!(h.core.resource(gone.device()).is_none());
    h.check();
}

/// Finding 4/8 of issue 16: a device number freed by a client that went
/// away is not handed to the next client at once, so nothing of the old
/// owner (a notice, an entry on its way out) can reach the new one; the
/// numbers go round.
#[test]
fn freed_device_numbers_are_not_reused_at_once() {
    let mut h = Harness::new(config());
    let mut seen = std::collections::BTreeSet::new();
    for session in 10..40 {
        let uid = h.attach(session, "app");
        assert!(
            seen.insert(uid.device()),
            "device {} handed out twice",
            uid.device()
        );
        connected(h.connect(session, uid_of(&h, "echo"), 7));
        h.event(Event::ClientClosed { session });
        h.pump();
        h.check();
    }
}

fn uid_of(h: &Harness, name: &str) -> uniplane_dataplane::Uid {
    h.core
        .resources()
        .find(|r| r.name == name)
        .map(|r| r.uid)
        .unwrap()
}

/// Finding 9 (b) of issue 16: answer types bypassed the ACL — any sender
/// could push a READ_CMPL (which carries data into memory) to anyone.
/// Now an answer passes only where its request could have gone the other
/// way.
#[test]
fn answers_pass_only_where_their_request_could_have() {
    use uniplane_dataplane::wire::{Header, MemoryParams, Params, Request};
    let mut c = config();
    c.default_action = DefaultAction::AllowLocal;
    // The peer's device 9 may write to our echo device.
    let nine = uniplane_dataplane::Uid::new(PEER, 9);
    let echo = uniplane_dataplane::Uid::new(HERE, 1);
    c.rules = vec![AccessRule {
        src: UidMatch {
            key: nine,
            mask: uniplane_dataplane::Uid::MASK,
        },
        dst: UidMatch {
            key: echo,
            mask: uniplane_dataplane::Uid::MASK,
        },
        types: Some(vec![ReqType::Write]),
        allow: true,
    }];
    let h = Harness::new(c);
    let image = h.core.picture();
    let mut acl = uniplane_overlay::acl::AccessControl::new();
    let echo_port = h.core.resources().find(|r| r.name == "echo").unwrap().port;
    for r in &image.ports[&echo_port].rules {
        acl.push_rule(*r);
    }
    let header = |kind, src, dst| {
        let p = Params::Memory(MemoryParams {
            flag: 0,
            length: 0,
            addr: 0,
        });
        Header::new(src, dst, Request::new(kind, p).unwrap())
    };
    let remote = uniplane_dataplane::Uid::new(PEER, 3);
    let local = uniplane_dataplane::Uid::new(HERE, 5);
    // Unasked completions from a remote server to a local resource.
    for kind in [ReqType::ReadCmpl, ReqType::WriteCmpl, ReqType::CopyCmpl] {
        assert!(acl.check(&header(kind, remote, local)).is_err(), "{kind}");
    }
    // The echo device answers the writes device 9 may send it; device 9
    // may not answer reads nobody let the echo device send.
    assert!(acl.check(&header(ReqType::Write, nine, echo)).is_ok());
    assert!(acl.check(&header(ReqType::WriteCmpl, echo, nine)).is_ok());
    assert!(acl.check(&header(ReqType::ReadCmpl, nine, echo)).is_err());
    // Local to local, as before.
    assert!(acl.check(&header(ReqType::WriteCmpl, local, echo)).is_ok());
}

#[test]
fn new_rules_close_the_connections_they_deny_and_refuse_new_ones() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    let client = h.attach(B, "client");
    let other = h.attach(3, "other");
    h.listen(A, 80);
    let denied = connected(h.connect(B, server, 80));
    let kept = connected(h.connect(3, server, 80));
    h.notices();
    // The operator reloads: the client may no longer reach the server.
    let rule = AccessRule {
        src: UidMatch {
            key: client,
            mask: uniplane_dataplane::Uid::MASK,
        },
        dst: UidMatch::ANY,
        types: Some(vec![ReqType::Connect]),
        allow: false,
    };
    h.event(Event::Rules {
        rules: vec![rule],
        default_action: DefaultAction::Allow,
    });
    both_ends_told(&mut h, (client, server), denied, Status::Denied);
    let left: Vec<ConnKey> = h.core.connections().map(|c| c.key).collect();
    assert_eq!(left, vec![kept], "only the denied connection went");
    assert_eq!(kept.src, other);
    let again = h.connect(B, server, 80);
    assert_eq!(again.unwrap_err().kind(), "denied");
    h.check();
}

#[test]
fn a_shutdown_closes_every_connection_and_tells_its_ends() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    let client = h.attach(B, "client");
    h.listen(A, 80);
    let key = connected(h.connect(B, server, 80));
    h.notices();
    h.event(Event::Shutdown);
    both_ends_told(&mut h, (client, server), key, Status::Closed);
    assert_eq!(h.core.connections().count(), 0);
    h.check();
}

/// The harness's configuration with a host memory device (3) that
/// processes may map.
fn with_memory() -> ControlConfig {
    let mut c = config();
    c.devices.push(DeviceSpec {
        name: "mem".into(),
        device: Some(3),
        relay: false,
        label: "memory".into(),
        mappable: true,
        next: None,
    });
    c
}

fn unmaps(h: &mut Harness) -> Vec<(SessionId, u16)> {
    let mut out = Vec::new();
    h.out.retain(|a| match a {
        Action::Unmap { session, device } => {
            out.push((*session, *device));
            false
        }
        _ => true,
    });
    out
}

fn deny(src: uniplane_dataplane::Uid, types: Vec<ReqType>) -> Event {
    Event::Rules {
        rules: vec![AccessRule {
            src: UidMatch {
                key: src,
                mask: uniplane_dataplane::Uid::MASK,
            },
            dst: UidMatch::ANY,
            types: Some(types),
            allow: false,
        }],
        default_action: DefaultAction::Allow,
    }
}

#[test]
fn only_a_host_memory_device_is_lent_and_only_as_the_rules_allow() {
    let mut h = Harness::new(with_memory());
    let map = |h: &mut Harness, s, device| h.ask(s, ClientRequest::Map { device });
    assert_eq!(map(&mut h, A, 3).unwrap_err().kind(), "not-attached");
    let app = h.attach(A, "app");
    assert_eq!(map(&mut h, A, 9).unwrap_err().kind(), "not-found");
    let echo = map(&mut h, A, 1).unwrap_err();
    assert!(
        echo.to_string().contains("no memory a process can map"),
        "{echo}"
    );
    assert_eq!(
        map(&mut h, A, 3),
        Ok(Reply::Mapped {
            device: 3,
            writable: true
        })
    );
    // Writes denied: the writable mapping is taken back; mapping again
    // gives a read-only one.
    h.event(deny(app, vec![ReqType::Write]));
    assert_eq!(unmaps(&mut h), vec![(A, 3)]);
    assert_eq!(
        map(&mut h, A, 3),
        Ok(Reply::Mapped {
            device: 3,
            writable: false
        })
    );
    // The same rules again take nothing more back.
    h.event(deny(app, vec![ReqType::Write]));
    assert_eq!(unmaps(&mut h), vec![]);
    // Reads denied: taken back, and no mapping at all.
    h.event(deny(app, vec![ReqType::Read]));
    assert_eq!(unmaps(&mut h), vec![(A, 3)]);
    assert_eq!(map(&mut h, A, 3).unwrap_err().kind(), "denied");
    h.check();
}

#[test]
fn a_session_that_ends_gives_back_what_it_mapped_and_others_keep_theirs() {
    let mut h = Harness::new(with_memory());
    h.attach(A, "one");
    h.attach(B, "two");
    for s in [A, B] {
        assert!(matches!(
            h.ask(s, ClientRequest::Map { device: 3 }),
            Ok(Reply::Mapped { .. })
        ));
    }
    h.event(Event::ClientClosed { session: A });
    assert_eq!(unmaps(&mut h), vec![(A, 3)]);
    h.event(Event::ClientClosed { session: B });
    assert_eq!(unmaps(&mut h), vec![(B, 3)]);
    h.event(Event::ClientClosed { session: B });
    assert_eq!(unmaps(&mut h), vec![]);
    h.check();
}

fn withdrawals(h: &mut Harness) -> Vec<(u16, u16)> {
    let mut out = Vec::new();
    h.out.retain(|a| match a {
        Action::Withdraw { owner, id } => {
            out.push((*owner, *id));
            false
        }
        _ => true,
    });
    out
}

fn made(h: &mut Harness) -> Vec<(u16, u16, u64)> {
    let mut out = Vec::new();
    h.out.retain(|a| match a {
        Action::MakeShared { owner, id, len } => {
            out.push((*owner, *id, *len));
            false
        }
        _ => true,
    });
    out
}

#[test]
fn shared_memory_is_made_for_its_owner_and_lent_to_peers_as_the_rules_and_owner_allow() {
    let mut c = config();
    c.limits.shared_per_resource = 2;
    c.limits.shared_mib = 1;
    let mut h = Harness::new(c);
    let share = |h: &mut Harness, s, id, len, peers_write| {
        h.ask(
            s,
            ClientRequest::Share {
                id,
                len,
                peers_write,
            },
        )
    };
    assert_eq!(
        share(&mut h, A, 0, 64, true).unwrap_err().kind(),
        "not-attached"
    );
    let owner = h.attach(A, "owner");
    let peer = h.attach(B, "peer");
    let o = owner.device();
    assert_eq!(
        share(&mut h, A, 0, 4096, true),
        Ok(Reply::Shared {
            owner: o,
            id: 0,
            len: 4096,
            writable: true
        })
    );
    assert_eq!(made(&mut h), vec![(o, 0, 4096)]);
    // Bounded: an ID once, at least a byte, so many per resource, so many
    // bytes in all; nothing is made for a refusal.
    assert_eq!(
        share(&mut h, A, 0, 64, true).unwrap_err().kind(),
        "bad-request"
    );
    assert_eq!(
        share(&mut h, A, 5, 0, true).unwrap_err().kind(),
        "bad-request"
    );
    assert_eq!(
        share(&mut h, A, 1, 1 << 20, true).unwrap_err().kind(),
        "limit"
    );
    assert!(share(&mut h, A, 1, 1024, false).is_ok());
    assert_eq!(share(&mut h, A, 2, 8, true).unwrap_err().kind(), "limit");
    assert_eq!(made(&mut h), vec![(o, 1, 1024)]);
    // Peers map it as the owner lets them: region 1 is read-only.
    let map = |h: &mut Harness, s, owner, id| h.ask(s, ClientRequest::MapShared { owner, id });
    assert_eq!(
        map(&mut h, B, o, 0),
        Ok(Reply::Shared {
            owner: o,
            id: 0,
            len: 4096,
            writable: true
        })
    );
    assert!(matches!(
        map(&mut h, B, o, 1),
        Ok(Reply::Shared {
            writable: false,
            ..
        })
    ));
    assert_eq!(map(&mut h, B, o, 7).unwrap_err().kind(), "not-found");
    assert_eq!(map(&mut h, A, o, 0).unwrap_err().kind(), "bad-request");
    // The rules deny the peer writes: the writable loan of region 0 is
    // withdrawn (from everyone: a mapping cannot be taken out of a
    // process), the read-only one of region 1 stands.
    h.event(deny(peer, vec![ReqType::Write]));
    assert_eq!(withdrawals(&mut h), vec![(o, 0)]);
    assert_eq!(map(&mut h, B, o, 0).unwrap_err().kind(), "not-found");
    // Reads denied: no mapping at all, and region 1 goes too.
    h.event(deny(peer, vec![ReqType::Read]));
    assert_eq!(withdrawals(&mut h), vec![(o, 1)]);
    assert!(
        share(&mut h, A, 1, 64, true).is_ok(),
        "its ID is free again"
    );
    made(&mut h);
    assert_eq!(map(&mut h, B, o, 1).unwrap_err().kind(), "denied");
    h.check();
}

#[test]
fn shared_memory_is_withdrawn_when_its_owner_or_a_borrower_ends_or_the_owner_unshares() {
    let mut h = Harness::new(config());
    let owner = h.attach(A, "owner");
    h.attach(B, "peer");
    h.attach(3, "other");
    let o = owner.device();
    for id in 0..3 {
        assert!(h
            .ask(
                A,
                ClientRequest::Share {
                    id,
                    len: 64,
                    peers_write: true
                }
            )
            .is_ok());
    }
    for (s, id) in [(B, 0), (3, 1)] {
        assert!(h.ask(s, ClientRequest::MapShared { owner: o, id }).is_ok());
    }
    // Only the owner unshares, and only what it shares.
    assert_eq!(
        h.ask(B, ClientRequest::Unshare { id: 2 })
            .unwrap_err()
            .kind(),
        "not-found"
    );
    assert_eq!(h.ask(A, ClientRequest::Unshare { id: 2 }), Ok(Reply::Done));
    assert_eq!(withdrawals(&mut h), vec![(o, 2)]);
    // A borrower ends: what it borrowed goes, the rest stands.
    h.event(Event::ClientClosed { session: B });
    assert_eq!(withdrawals(&mut h), vec![(o, 0)]);
    // The owner ends: everything it shared goes.
    h.event(Event::ClientClosed { session: A });
    assert_eq!(withdrawals(&mut h), vec![(o, 1)]);
    assert_eq!(
        h.ask(3, ClientRequest::MapShared { owner: o, id: 1 })
            .unwrap_err()
            .kind(),
        "not-found"
    );
    h.check();
}
