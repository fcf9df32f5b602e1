//! The control core's rules between servers — verdicts, timeouts,
//! heartbeats, failures, tunnels — one behaviour per test, on virtual time
//! against a model plane.

mod harness;

use std::time::Duration;

use harness::*;
use uniplane_control::*;
use uniplane_dataplane::wire::{ReqType, Status};
use uniplane_overlay::acl::ConnKey;
use uniplane_overlay::table::Route;

const A: SessionId = 1;

fn connected(r: Result<Reply, ControlError>) -> ConnKey {
    match r {
        Ok(Reply::Connected(k)) => k,
        other => panic!("not connected: {other:?}"),
    }
}

#[test]
fn a_remote_connection_opens_only_with_the_peers_verdict() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    let client = h.attach(A, "client");
    let dst = uid("10.0.0.2:5");
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst,
            dst_port: 9,
            class: 0,
        },
    );
    assert!(h.answer(req).is_none(), "waits for the peer");
    let asked = h.sent_to_peer();
    let key = match asked.as_slice() {
        [(s, PeerMsg::Connect { conn, class: 0 })] if *s == PEER => *conn,
        other => panic!("{other:?}"),
    };
    assert_eq!(key.src, client);
    h.check();
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: key,
        verdict: Ok(()),
    });
    assert_eq!(connected(h.answer(req).expect("answered")), key);
    let tunnel = h.core.peers()[0].tunnels[0].1;
    assert_eq!(h.plane.translations.get(&key), Some(&tunnel));
    h.check();
}

#[test]
fn a_peers_refusal_is_the_callers_refusal() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    h.attach(A, "client");
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class: 0,
        },
    );
    let PeerMsg::Connect { conn, .. } = h.sent_to_peer().remove(0).1 else {
        panic!()
    };
    h.event(Event::PeerVerdict {
        server: PEER,
        conn,
        verdict: Err("nothing listens".into()),
    });
    assert_eq!(
        h.answer(req),
        Some(Err(ControlError::Refused("nothing listens".into())))
    );
    h.check();
}

#[test]
fn a_peer_that_does_not_answer_in_time_times_out_and_is_told_to_let_go() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    h.attach(A, "client");
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class: 0,
        },
    );
    let PeerMsg::Connect { conn, .. } = h.sent_to_peer().remove(0).1 else {
        panic!()
    };
    // Keep the peer alive while we wait.
    for _ in 0..50 {
        h.advance(Duration::from_millis(45));
        h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Heartbeat,
            request: 0,
        });
        if h.answer(req).is_some() {
            panic!("answered early");
        }
        if h.now >= h.core.config().verdict_timeout - Duration::from_millis(50) {
            break;
        }
    }
    h.advance(Duration::from_millis(100));
    let a = h.answer(req).expect("timed out");
    assert_eq!(a.unwrap_err().kind(), "timeout");
    assert!(h.sent_to_peer().contains(&(
        PEER,
        PeerMsg::Close {
            conn,
            status: Status::Closed,
        }
    )));
    // A verdict after the timeout is told to let go too.
    h.event(Event::PeerVerdict {
        server: PEER,
        conn,
        verdict: Ok(()),
    });
    assert_eq!(
        h.sent_to_peer(),
        vec![(
            PEER,
            PeerMsg::Close {
                conn,
                status: Status::Closed,
            }
        )]
    );
    assert_eq!(h.core.connections().count(), 0);
    h.check();
}

#[test]
fn a_connection_to_a_peer_that_is_down_or_unknown_fails_at_once() {
    let mut h = Harness::new(config());
    h.attach(A, "client");
    let r = h.connect(A, uid("10.0.0.2:5"), 9);
    assert_eq!(r.unwrap_err().kind(), "peer-down");
    let r = h.connect(A, uid("10.0.0.9:5"), 9);
    assert_eq!(r.unwrap_err().kind(), "no-route");
}

#[test]
fn heartbeats_go_to_each_live_channel_every_interval() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    for _ in 0..20 {
        h.advance(Duration::from_millis(10));
        h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Heartbeat,
            request: 0,
        });
    }
    let beats = h
        .sent_to_peer()
        .iter()
        .filter(|(s, m)| *s == PEER && *m == PeerMsg::Heartbeat)
        .count();
    // At 0, 50, 100, 150 and 200 ms.
    assert_eq!(beats, 5);
}

#[test]
fn a_silent_peer_is_declared_failed_within_misses_heartbeats_and_owners_told() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    let client = h.attach(A, "client");
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class: 0,
        },
    );
    let PeerMsg::Connect { conn, .. } = h.sent_to_peer().remove(0).1 else {
        panic!()
    };
    h.event(Event::PeerVerdict {
        server: PEER,
        conn,
        verdict: Ok(()),
    });
    connected(h.answer(req).unwrap());
    let last_heard = h.now;
    let limit = h.core.config().failure_after();
    h.advance(limit - Duration::from_millis(1));
    assert!(h.core.peers()[0].alive, "not before the limit");
    h.advance(Duration::from_millis(1));
    assert!(
        !h.core.peers()[0].alive,
        "failed at {:?}",
        h.now - last_heard
    );
    assert_eq!(h.core.peers()[0].failures, 1);
    assert_eq!(
        h.notices(),
        vec![(client, ReqType::Notify, conn, Status::PeerFailed)]
    );
    assert!(h
        .out
        .iter()
        .any(|a| matches!(a, Action::ClosePeerChannel { server } if *server == PEER)));
    assert_eq!(h.core.connections().count(), 0);
    h.check();
}

#[test]
fn routes_to_a_peer_come_with_it_and_go_with_it() {
    let mut h = Harness::new(config());
    let server_route = |h: &Harness| {
        let r = Route::server(PEER, 0);
        h.plane
            .ports
            .values()
            .filter(|p| p.routes.contains_key(&(r.key.to_u64(), r.mask)))
            .count()
    };
    assert_eq!(server_route(&h), 0);
    h.peer_up(PEER);
    assert_eq!(server_route(&h), 3, "at every resource port");
    h.check();
    h.attach(A, "late");
    assert_eq!(server_route(&h), 4, "and at a resource registered later");
    h.event(Event::PeerChannelDown { server: PEER });
    assert_eq!(server_route(&h), 0);
    assert!(h.core.peers()[0].tunnels.is_empty());
    h.check();
    // It comes back.
    h.peer_up(PEER);
    assert_eq!(server_route(&h), 4);
    h.check();
}

#[test]
fn a_class_tunnel_opens_on_first_use_and_is_shared() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    h.out.clear();
    h.attach(A, "client");
    let ask = |h: &mut Harness, port| {
        h.request(
            A,
            ClientRequest::Connect {
                src_port: port,
                dst: uid("10.0.0.2:5"),
                dst_port: 9,
                class: 3,
            },
        )
    };
    let r1 = ask(&mut h, 1000);
    let r2 = ask(&mut h, 1001);
    let opens = h
        .out
        .iter()
        .filter(|a| matches!(a, Action::OpenTunnel { class: 3, .. }))
        .count();
    assert_eq!(opens, 1);
    assert!(
        h.sent_to_peer().is_empty(),
        "the peer is asked once the tunnel is up"
    );
    h.event(Event::TunnelOpened {
        server: PEER,
        class: 3,
    });
    let asked = h.sent_to_peer();
    assert_eq!(asked.len(), 2);
    for (_, m) in asked {
        let PeerMsg::Connect { conn, class: 3 } = m else {
            panic!()
        };
        h.event(Event::PeerVerdict {
            server: PEER,
            conn,
            verdict: Ok(()),
        });
    }
    let k1 = connected(h.answer(r1).unwrap());
    let k2 = connected(h.answer(r2).unwrap());
    assert_eq!(h.plane.translations[&k1], h.plane.translations[&k2]);
    h.check();
    // The class tunnel fails: its connections end, class 0 stays.
    h.event(Event::TunnelFailed {
        server: PEER,
        class: 3,
    });
    assert_eq!(h.core.connections().count(), 0);
    assert!(h.core.peers()[0].alive);
    h.check();
}

#[test]
fn waiting_for_a_peer_is_bounded() {
    let mut c = config();
    c.limits.pending_per_peer = 2;
    let mut h = Harness::new(c);
    h.peer_up(PEER);
    h.attach(A, "client");
    for p in 1..=2 {
        h.request(
            A,
            ClientRequest::Connect {
                src_port: p,
                dst: uid("10.0.0.2:5"),
                dst_port: 9,
                class: 0,
            },
        );
    }
    let r = h.ask(
        A,
        ClientRequest::Connect {
            src_port: 3,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class: 0,
        },
    );
    assert_eq!(
        r,
        Err(ControlError::Limit("connections waiting for a peer"))
    );
}

#[test]
fn a_peer_may_connect_to_a_listening_resource_and_is_refused_otherwise() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    let server = h.attach(A, "server");
    h.listen(A, 80);
    let key = ConnKey {
        src: uid("10.0.0.2:4"),
        src_port: 5000,
        dst: server,
        dst_port: 80,
    };
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Connect {
            conn: key,
            class: 0,
        },
        request: 900,
    });
    assert_eq!(h.answer(900), Some(Ok(Reply::Done)));
    assert_eq!(
        h.notices(),
        vec![(server, ReqType::Connect, key.reversed(), Status::Ok)]
    );
    h.check();
    let mut wrong = key;
    wrong.dst_port = 81;
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Connect {
            conn: wrong,
            class: 0,
        },
        request: 901,
    });
    assert_eq!(h.answer(901).unwrap().unwrap_err().kind(), "refused");
    // A connection that does not start at the asking peer is refused.
    let mut forged = key;
    forged.src = uid("10.0.0.3:4");
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Connect {
            conn: forged,
            class: 0,
        },
        request: 902,
    });
    assert_eq!(h.answer(902).unwrap().unwrap_err().kind(), "refused");
    // The peer closes its connection: our end is told.
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Close {
            conn: key,
            status: Status::Closed,
        },
        request: 0,
    });
    assert_eq!(
        h.notices(),
        vec![(server, ReqType::Notify, key.reversed(), Status::Closed)]
    );
    assert!(h
        .sent_to_peer()
        .iter()
        .all(|(_, m)| !matches!(m, PeerMsg::Close { .. })));
    h.check();
}

#[test]
fn an_inbound_tunnel_from_a_known_peer_gets_routes_and_its_connections() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    let server = h.attach(A, "server");
    h.listen(A, 80);
    let key = ConnKey {
        src: uid("10.0.0.2:4"),
        src_port: 5000,
        dst: server,
        dst_port: 80,
    };
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Connect {
            conn: key,
            class: 0,
        },
        request: 900,
    });
    h.event(Event::InboundTunnel {
        tunnel: 7,
        from: PEER,
        class: 0,
        mtu: 1400,
    });
    let t = h.core.inbound_tunnels()[0];
    assert_eq!((t.tunnel, t.from), (7, PEER));
    assert!(h.plane.ports[&t.port].allows.contains(&key));
    h.check();
    h.event(Event::InboundTunnel {
        tunnel: 8,
        from: uid("10.0.0.9:0").server(),
        class: 0,
        mtu: 1400,
    });
    assert!(h
        .out
        .iter()
        .any(|a| matches!(a, Action::DropTunnel { tunnel: 8 })));
    // A second tunnel of the same class replaces the first.
    h.event(Event::InboundTunnel {
        tunnel: 9,
        from: PEER,
        class: 0,
        mtu: 1400,
    });
    assert_eq!(h.core.inbound_tunnels().len(), 1);
    assert!(h
        .out
        .iter()
        .any(|a| matches!(a, Action::DropTunnel { tunnel: 7 })));
    h.check();
    h.event(Event::InboundTunnelEnded { tunnel: 9 });
    assert!(h.core.inbound_tunnels().is_empty());
    h.check();
}

#[test]
fn multi_hop_routes_point_every_source_but_the_relay_at_it_and_skip_translation() {
    let mut c = config();
    c.routes.push(MultiHopRoute {
        from: "*".into(),
        via: "relay".into(),
        to: UidMatch {
            key: uid("10.0.0.2:0"),
            mask: u64::MAX >> 16 & !0xffff,
        },
    });
    let mut h = Harness::new(c);
    h.peer_up(PEER);
    let client = h.attach(A, "client");
    let relay_port = h.core.resource(2).unwrap().port;
    let key = (uid("10.0.0.2:0").to_u64(), u64::MAX >> 16 & !0xffff);
    for r in h.core.resources() {
        let via = h.plane.ports[&r.port].routes.get(&key).copied();
        match r.kind {
            ResourceKind::Daemon => assert_ne!(via, Some(relay_port)),
            _ if r.port == relay_port => assert_ne!(via, Some(relay_port)),
            _ => assert_eq!(via, Some(relay_port), "{}", r.name),
        }
    }
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class: 0,
        },
    );
    let PeerMsg::Connect { conn, .. } = h.sent_to_peer().remove(0).1 else {
        panic!()
    };
    h.event(Event::PeerVerdict {
        server: PEER,
        conn,
        verdict: Ok(()),
    });
    assert_eq!(connected(h.answer(req).unwrap()).src, client);
    assert!(h.plane.translations.is_empty(), "the relay route decides");
    h.check();
}

#[test]
fn a_peer_is_not_admitted_before_our_channel_to_it_is_up() {
    let mut h = Harness::new(config());
    let server = h.attach(A, "server");
    h.listen(A, 80);
    let key = ConnKey {
        src: uid("10.0.0.2:4"),
        src_port: 5000,
        dst: server,
        dst_port: 80,
    };
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Connect {
            conn: key,
            class: 0,
        },
        request: 900,
    });
    assert_eq!(h.answer(900).unwrap().unwrap_err().kind(), "peer-down");
    assert_eq!(h.core.connections().count(), 0);
    h.check();
}

#[test]
fn a_class_tunnel_that_never_opens_times_the_connect_out() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    h.attach(A, "client");
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class: 4,
        },
    );
    let timeout = h.core.config().verdict_timeout;
    for _ in 0..100 {
        h.advance(Duration::from_millis(40));
        h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Heartbeat,
            request: 0,
        });
        if h.now > timeout {
            break;
        }
    }
    let a = h.answer(req).expect("answered");
    assert_eq!(a.unwrap_err().kind(), "timeout");
    assert!(h.core.pending_connections().next().is_none());
    h.check();
}

/// Whether any port of the plane admits `key` (either direction), or a
/// translator steers it.
fn anywhere(h: &Harness, key: ConnKey) -> bool {
    h.plane.translations.contains_key(&key)
        || h.plane
            .ports
            .values()
            .any(|p| p.allows.contains(&key) || p.allows.contains(&key.reversed()))
}

/// A peer that is up and has opened its class-0 tunnel to us (the way
/// its processes' traffic comes in): its port.
fn peer_with_inbound_tunnel(h: &mut Harness) -> u16 {
    h.peer_up(PEER);
    h.event(Event::InboundTunnel {
        tunnel: 7,
        from: PEER,
        class: 0,
        mtu: 1400,
    });
    h.core.inbound_tunnels()[0].port
}

/// Asks for a connection to the peer's 10.0.0.2:5 port 9 (class 0).
fn ask_remote(h: &mut Harness, class: u8) -> RequestId {
    h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.2:5"),
            dst_port: 9,
            class,
        },
    )
}

fn asked(h: &mut Harness) -> Vec<ConnKey> {
    h.sent_to_peer()
        .into_iter()
        .filter_map(|(_, m)| match m {
            PeerMsg::Connect { conn, .. } => Some(conn),
            _ => None,
        })
        .collect()
}

#[test]
fn the_callers_end_admits_the_peers_first_message_before_the_peer_is_asked() {
    let mut h = Harness::new(config());
    let inbound = peer_with_inbound_tunnel(&mut h);
    let client = h.attach(A, "client");
    let client_port = h.core.resource(client.device()).unwrap().port;
    h.hold = true;
    let req = ask_remote(&mut h, 0);
    assert!(
        asked(&mut h).is_empty(),
        "the peer is not asked while our end is being installed"
    );
    assert_eq!(h.held.len(), 1, "one batch installs our end");
    h.release();
    let key = match asked(&mut h).as_slice() {
        [k] => *k,
        other => panic!("{other:?}"),
    };
    // The moment the peer is asked, what its acceptor sends back (it may
    // send as soon as its daemon tells it) gets in: through the tunnel it
    // arrives on, to the caller's port; and the caller's own traffic is
    // steered into the tunnel.
    let back = key.reversed();
    assert!(h.plane.ports[&inbound].allows.contains(&back));
    assert!(h.plane.ports[&client_port].allows.contains(&back));
    let tunnel = h.core.peers()[0].tunnels[0].1;
    assert_eq!(h.plane.translations.get(&key), Some(&tunnel));
    assert!(h.answer(req).is_none(), "the caller waits for the verdict");
    h.check();
    // The verdict changes nothing in the plane; it answers the caller.
    let before = h.plane.ports[&inbound].allows.clone();
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: key,
        verdict: Ok(()),
    });
    assert_eq!(connected(h.answer(req).expect("answered")), key);
    assert_eq!(h.plane.ports[&inbound].allows, before);
    h.check();
}

#[test]
fn a_connection_waiting_for_its_tunnel_is_installed_before_the_peer_is_asked() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    let req = ask_remote(&mut h, 3);
    let waiting: Vec<ConnKey> = h.core.pending_connections().copied().collect();
    assert_eq!(waiting.len(), 1);
    assert!(!anywhere(&h, waiting[0]), "nothing before its tunnel opens");
    h.check();
    h.hold = true;
    h.event(Event::TunnelOpened {
        server: PEER,
        class: 3,
    });
    // The tunnel's port and entries, then our end: the peer is asked
    // after all of them, one batch at a time.
    let got = loop {
        let got = asked(&mut h);
        if !got.is_empty() {
            break got;
        }
        assert_eq!(h.held.len(), 1, "one batch at a time, and not stuck");
        let (batch, ops) = h.held.remove(0);
        let results: Vec<_> = ops.iter().map(|op| h.plane.apply(op)).collect();
        h.core.handle(
            Event::PlaneDone {
                batch,
                results: Ok(results),
            },
            h.now,
        );
        h.pump();
    };
    assert_eq!(got, waiting);
    assert!(anywhere(&h, waiting[0]), "admitted when the peer is asked");
    h.hold = false;
    h.check();
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: waiting[0],
        verdict: Ok(()),
    });
    assert_eq!(connected(h.answer(req).unwrap()), waiting[0]);
    h.check();
}

#[test]
fn a_refused_connection_leaves_no_entries_behind() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    let req = ask_remote(&mut h, 0);
    let key = asked(&mut h)[0];
    assert!(anywhere(&h, key));
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: key,
        verdict: Err("nothing listens".into()),
    });
    assert_eq!(h.answer(req).unwrap().unwrap_err().kind(), "refused");
    assert!(!anywhere(&h, key));
    h.check();
}

#[test]
fn a_timed_out_connection_leaves_no_entries_behind() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    let req = ask_remote(&mut h, 0);
    let key = asked(&mut h)[0];
    let timeout = h.core.config().verdict_timeout;
    while h.answer(req).is_none() {
        assert!(h.now <= timeout, "no timeout");
        assert!(anywhere(&h, key), "admitted while it waits");
        h.advance(Duration::from_millis(40));
        h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Heartbeat,
            request: 0,
        });
    }
    assert!(!anywhere(&h, key));
    assert!(h.sent_to_peer().contains(&(
        PEER,
        PeerMsg::Close {
            conn: key,
            status: Status::Closed,
        }
    )));
    h.check();
}

#[test]
fn a_verdict_deadline_that_passes_during_a_batch_expires_after_it() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    let req = ask_remote(&mut h, 0);
    let key = asked(&mut h)[0];
    // Another client attaches; its batch is held past the deadline.
    h.hold = true;
    h.request(
        2,
        ClientRequest::Attach {
            name: "late".into(),
        },
    );
    let timeout = h.core.config().verdict_timeout;
    h.advance(timeout + Duration::from_millis(10));
    assert!(h.answer(req).is_none(), "not while a batch is in flight");
    h.release();
    h.advance(Duration::from_millis(1));
    assert_eq!(h.answer(req).unwrap().unwrap_err().kind(), "timeout");
    assert!(!anywhere(&h, key));
    h.check();
}

#[test]
fn a_caller_that_goes_away_while_asking_takes_its_end_out_and_the_peer_lets_go() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    ask_remote(&mut h, 0);
    let key = asked(&mut h)[0];
    h.event(Event::ClientClosed { session: A });
    assert!(!anywhere(&h, key));
    assert!(h.sent_to_peer().contains(&(
        PEER,
        PeerMsg::Close {
            conn: key,
            status: Status::Closed,
        }
    )));
    h.check();
}

#[test]
fn a_peer_that_fails_while_asked_takes_the_callers_end_out() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    let req = ask_remote(&mut h, 0);
    let key = asked(&mut h)[0];
    h.event(Event::PeerChannelDown { server: PEER });
    assert_eq!(h.answer(req).unwrap().unwrap_err().kind(), "peer-down");
    assert!(!anywhere(&h, key));
    h.check();
}

#[test]
fn a_plane_that_refuses_the_callers_end_fails_the_connect_and_the_peer_is_never_asked() {
    let mut h = Harness::new(config());
    peer_with_inbound_tunnel(&mut h);
    h.attach(A, "client");
    h.sent_to_peer();
    h.plane.refuse = Some(|op| matches!(op, PlaneOp::AddTranslation(..)));
    let req = ask_remote(&mut h, 0);
    assert_eq!(h.answer(req).unwrap().unwrap_err().kind(), "engine");
    assert!(h.sent_to_peer().is_empty(), "{:?}", h.out);
    assert!(h.core.pending_connections().next().is_none());
    for p in h.plane.ports.values() {
        assert!(p.allows.is_empty());
    }
    assert!(h.plane.translations.is_empty());
    h.check();
}

/// A server the directory lists, as the daemon describes it.
fn discovered(server: std::net::Ipv4Addr) -> PeerSpec {
    PeerSpec {
        server,
        stack: "tcp".into(),
        classes: vec![0, 1],
        tunnel_mtu: 8000,
    }
}

#[test]
fn a_server_the_directory_adds_is_a_peer_and_one_it_removes_goes_with_its_connections() {
    let mut h = Harness::new(config());
    let other = std::net::Ipv4Addr::new(10, 0, 0, 9);
    h.event(Event::PeerAdded {
        spec: discovered(other),
    });
    assert!(h.core.peers().iter().any(|p| p.server == other && !p.alive));
    h.peer_up(other);
    let client = h.attach(A, "client");
    let req = h.request(
        A,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.9:5"),
            dst_port: 9,
            class: 0,
        },
    );
    let (to, PeerMsg::Connect { conn, .. }) = h.sent_to_peer().remove(0) else {
        panic!()
    };
    assert_eq!(to, other);
    h.event(Event::PeerVerdict {
        server: other,
        conn,
        verdict: Ok(()),
    });
    connected(h.answer(req).unwrap());
    let server_route = |h: &Harness| {
        let r = Route::server(other, 0);
        h.plane
            .ports
            .values()
            .filter(|p| p.routes.contains_key(&(r.key.to_u64(), r.mask)))
            .count()
    };
    assert!(server_route(&h) > 0);
    h.check();

    h.event(Event::PeerRemoved { server: other });
    assert!(h.core.peers().iter().all(|p| p.server != other));
    assert_eq!(
        h.notices(),
        vec![(client, ReqType::Notify, conn, Status::PeerFailed)]
    );
    assert!(h
        .out
        .iter()
        .any(|a| matches!(a, Action::ClosePeerChannel { server } if *server == other)));
    assert_eq!(server_route(&h), 0);
    assert_eq!(h.core.connections().count(), 0);
    h.check();
}

#[test]
fn the_directory_never_replaces_a_configured_peer_nor_removes_one_nor_adds_this_server() {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    let mut spec = discovered(PEER);
    spec.stack = "udp".into();
    h.event(Event::PeerAdded { spec });
    h.event(Event::PeerAdded {
        spec: discovered(HERE),
    });
    h.event(Event::PeerRemoved { server: PEER });
    let peers = h.core.peers();
    assert_eq!(peers.len(), 1);
    assert!(peers[0].alive);
    assert_ne!(peers[0].stack, "udp");
    h.check();
}

#[test]
fn peers_the_directory_adds_are_bounded() {
    let mut c = config();
    c.limits.peers = 3;
    let mut h = Harness::new(c);
    for i in 10..20 {
        h.event(Event::PeerAdded {
            spec: discovered(std::net::Ipv4Addr::new(10, 0, 0, i)),
        });
    }
    assert_eq!(h.core.peers().len(), 3);
}

/// Twelve connections through PEER, then PEER silent until it fails:
/// the notices the core gives, in order.
fn notices_when_a_peer_with_many_connections_fails() -> Vec<ConnKey> {
    let mut h = Harness::new(config());
    h.peer_up(PEER);
    h.attach(A, "client");
    for i in 0..12u16 {
        let req = h.request(
            A,
            ClientRequest::Connect {
                src_port: 0,
                dst: uid("10.0.0.2:5"),
                dst_port: 100 + i,
                class: 0,
            },
        );
        let PeerMsg::Connect { conn, .. } = h.sent_to_peer().remove(0).1 else {
            panic!()
        };
        h.event(Event::PeerVerdict {
            server: PEER,
            conn,
            verdict: Ok(()),
        });
        connected(h.answer(req).unwrap());
    }
    h.advance(h.core.config().failure_after());
    h.notices()
        .into_iter()
        .map(|(_, _, conn, _)| conn)
        .collect()
}

#[test]
fn a_peer_failure_tells_its_connections_in_the_same_order_in_every_process() {
    // Two cores fed the same events must act the same, in the same order,
    // whatever their maps' hash seeds: a run is replayable from its inputs.
    let first = notices_when_a_peer_with_many_connections_fails();
    let second = notices_when_a_peer_with_many_connections_fails();
    assert_eq!(first.len(), 12);
    assert_eq!(first, second);
    let mut sorted = first.clone();
    sorted.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
    assert_eq!(first, sorted, "in the order of the connections' keys");
}
