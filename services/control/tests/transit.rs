//! Transit: a server carrying a connection between two others on from
//! one neighbour's tunnel to the next, and the two ends that reach each
//! other through it — one behaviour per test, on virtual time against a
//! model plane.

mod harness;

use std::net::Ipv4Addr;

use harness::*;
use uniplane_control::*;
use uniplane_dataplane::wire::Status;
use uniplane_overlay::acl::ConnKey;

/// A third server, the peer's neighbour (or ours).
const FAR: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 3);

/// Here is B between PEER (A) and FAR (C); every access allowed.
fn middle() -> Harness {
    let mut c = config();
    let mut far = c.peers[0].clone();
    far.server = FAR;
    c.peers.push(far);
    let mut h = Harness::new(c);
    h.peer_up(PEER);
    h.peer_up(FAR);
    for (tunnel, from) in [(1, PEER), (2, FAR)] {
        h.event(Event::InboundTunnel {
            tunnel,
            from,
            class: 0,
            mtu: 1400,
        });
    }
    h.sent_to_peer();
    h
}

fn a_to_c() -> ConnKey {
    ConnKey {
        src: uid("10.0.0.2:5"),
        src_port: 49152,
        dst: uid("10.0.0.3:1"),
        dst_port: 9,
    }
}

/// The inbound tunnel ports admitting `key`.
fn admitted_at(h: &Harness, key: ConnKey) -> Vec<Ipv4Addr> {
    let mut v: Vec<Ipv4Addr> = h
        .core
        .inbound_tunnels()
        .iter()
        .filter(|t| h.plane.ports[&t.port].allows.contains(&key))
        .map(|t| t.from)
        .collect();
    v.sort();
    v
}

fn ask(h: &mut Harness, from: Ipv4Addr, key: ConnKey, request: RequestId) {
    h.event(Event::PeerMessage {
        server: from,
        msg: PeerMsg::Connect {
            conn: key,
            class: 0,
        },
        request,
    });
}

#[test]
fn a_connection_between_two_neighbours_is_installed_asked_on_and_answered() {
    let mut h = middle();
    let key = a_to_c();
    ask(&mut h, PEER, key, 900);
    assert!(h.answer(900).is_none(), "waits for the next hop");
    assert_eq!(
        h.sent_to_peer(),
        vec![(
            FAR,
            PeerMsg::Connect {
                conn: key,
                class: 0
            }
        )]
    );
    // Installed at both neighbours' tunnels before the next hop answers:
    // the acceptor's first message must pass.
    assert_eq!(admitted_at(&h, key), vec![PEER, FAR]);
    h.check();
    h.event(Event::PeerVerdict {
        server: FAR,
        conn: key,
        verdict: Ok(()),
    });
    assert_eq!(h.answer(900), Some(Ok(Reply::Done)));
    let c = h
        .core
        .connections()
        .find(|c| c.key == key)
        .cloned()
        .unwrap();
    assert_eq!((c.peer, c.transit), (Some(PEER), Some(FAR)));
    assert_eq!(admitted_at(&h, key), vec![PEER, FAR]);
    // Steered into the next hop's tunnel of its class.
    let to_far = h
        .core
        .peers()
        .iter()
        .find(|p| p.server == FAR)
        .unwrap()
        .tunnels[0]
        .1;
    assert_eq!(h.plane.translations.get(&key), Some(&to_far));
    h.check();
}

#[test]
fn a_close_from_either_side_is_passed_on_to_the_other() {
    for (closer, other) in [(PEER, FAR), (FAR, PEER)] {
        let mut h = middle();
        let key = a_to_c();
        ask(&mut h, PEER, key, 900);
        h.event(Event::PeerVerdict {
            server: FAR,
            conn: key,
            verdict: Ok(()),
        });
        h.sent_to_peer();
        h.event(Event::PeerMessage {
            server: closer,
            msg: PeerMsg::Close {
                conn: key,
                status: Status::Denied,
            },
            request: 0,
        });
        assert_eq!(
            h.sent_to_peer(),
            vec![(
                other,
                PeerMsg::Close {
                    conn: key,
                    status: Status::Denied
                }
            )]
        );
        assert!(h.core.connections().next().is_none());
        assert!(admitted_at(&h, key).is_empty());
        h.check();
    }
}

#[test]
fn a_failed_next_hop_closes_what_went_through_it_and_tells_the_other_side() {
    let mut h = middle();
    let key = a_to_c();
    ask(&mut h, PEER, key, 900);
    h.event(Event::PeerVerdict {
        server: FAR,
        conn: key,
        verdict: Ok(()),
    });
    h.sent_to_peer();
    h.event(Event::TunnelFailed {
        server: FAR,
        class: 0,
    });
    assert!(h.sent_to_peer().contains(&(
        PEER,
        PeerMsg::Close {
            conn: key,
            status: Status::PeerFailed
        }
    )));
    assert!(h.core.connections().next().is_none());
    h.check();
}

#[test]
fn a_refusal_further_on_is_the_refusal_of_the_one_that_asked_and_leaves_nothing() {
    let mut h = middle();
    let key = a_to_c();
    ask(&mut h, PEER, key, 900);
    h.sent_to_peer();
    h.event(Event::PeerVerdict {
        server: FAR,
        conn: key,
        verdict: Err("nothing listens".into()),
    });
    match h.answer(900) {
        Some(Err(ControlError::Refused(why))) => assert!(why.contains("nothing listens")),
        other => panic!("{other:?}"),
    }
    assert!(admitted_at(&h, key).is_empty());
    assert!(h.plane.translations.is_empty());
    h.check();
}

#[test]
fn the_asking_side_giving_up_lets_the_next_hop_go() {
    let mut h = middle();
    let key = a_to_c();
    ask(&mut h, PEER, key, 900);
    h.sent_to_peer();
    h.event(Event::PeerMessage {
        server: PEER,
        msg: PeerMsg::Close {
            conn: key,
            status: Status::Closed,
        },
        request: 0,
    });
    assert_eq!(
        h.sent_to_peer(),
        vec![(
            FAR,
            PeerMsg::Close {
                conn: key,
                status: Status::Closed
            }
        )]
    );
    assert!(admitted_at(&h, key).is_empty());
    // Its verdict, late, is not taken: the next hop is told to let go.
    h.event(Event::PeerVerdict {
        server: FAR,
        conn: key,
        verdict: Ok(()),
    });
    assert!(h.core.connections().next().is_none());
    assert_eq!(
        h.sent_to_peer(),
        vec![(
            FAR,
            PeerMsg::Close {
                conn: key,
                status: Status::Closed
            }
        )]
    );
    h.check();
}

#[test]
fn what_is_not_routed_through_here_is_refused() {
    let mut h = middle();
    // To a server no route reaches.
    let mut lost = a_to_c();
    lost.dst = uid("10.0.0.9:1");
    ask(&mut h, PEER, lost, 901);
    assert!(matches!(h.answer(901), Some(Err(ControlError::NoRoute(_)))));
    // From a server the asking neighbour does not lead to.
    let mut forged = a_to_c();
    forged.src = uid("10.0.0.9:5");
    ask(&mut h, PEER, forged, 902);
    assert!(matches!(h.answer(902), Some(Err(ControlError::Refused(_)))));
    // Back where it came from.
    let mut back = a_to_c();
    back.dst = uid("10.0.0.2:1");
    ask(&mut h, PEER, back, 903);
    assert!(matches!(h.answer(903), Some(Err(ControlError::Refused(_)))));
    assert!(h.sent_to_peer().is_empty());
    h.check();
}

#[test]
fn the_policy_here_decides_what_is_carried() {
    let mut c = config();
    let mut far = c.peers[0].clone();
    far.server = FAR;
    c.peers.push(far);
    c.default_action = DefaultAction::AllowLocal;
    let mut h = Harness::new(c);
    h.peer_up(PEER);
    h.peer_up(FAR);
    h.sent_to_peer();
    ask(&mut h, PEER, a_to_c(), 900);
    match h.answer(900) {
        Some(Err(ControlError::Refused(why))) => assert!(why.contains("through"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert!(h.sent_to_peer().is_empty());
}

#[test]
fn an_end_reaches_a_server_beyond_its_neighbour_through_it() {
    // Here is A; FAR (C) is reached through PEER (B).
    let mut c = config();
    c.remotes = vec![RemoteSpec {
        server: FAR,
        via: PEER,
    }];
    let mut h = Harness::new(c);
    h.peer_up(PEER);
    h.sent_to_peer();
    let client = h.attach(1, "client");
    let req = h.request(
        1,
        ClientRequest::Connect {
            src_port: 0,
            dst: uid("10.0.0.3:1"),
            dst_port: 9,
            class: 0,
        },
    );
    let key = match h.sent_to_peer().as_slice() {
        [(s, PeerMsg::Connect { conn, class: 0 })] if *s == PEER => *conn,
        other => panic!("{other:?}"),
    };
    assert_eq!((key.src, key.dst), (client, uid("10.0.0.3:1")));
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: key,
        verdict: Ok(()),
    });
    assert!(matches!(h.answer(req), Some(Ok(Reply::Connected(_)))));
    let tunnel = h.core.peers()[0].tunnels[0].1;
    assert_eq!(h.plane.translations.get(&key), Some(&tunnel));
    // And a route to C's servers through B's tunnel for what C sends.
    let r = h.core.resource(client.device()).unwrap();
    assert!(h.plane.ports[&r.port].routes.values().any(|p| *p == tunnel));
    h.check();
}

#[test]
fn an_end_admits_a_connection_from_beyond_its_neighbour_only_when_routed_through_it() {
    // Here is C; the caller is on A, behind PEER (B).
    for routed in [true, false] {
        let mut c = config();
        if routed {
            c.remotes = vec![RemoteSpec {
                server: Ipv4Addr::new(10, 0, 0, 4),
                via: PEER,
            }];
        }
        let mut h = Harness::new(c);
        h.peer_up(PEER);
        h.sent_to_peer();
        let key = ConnKey {
            src: uid("10.0.0.4:5"),
            src_port: 49152,
            dst: uid("10.0.0.1:1"),
            dst_port: 9,
        };
        ask(&mut h, PEER, key, 900);
        let answer = h.answer(900);
        if routed {
            assert_eq!(answer, Some(Ok(Reply::Done)));
            let c = h
                .core
                .connections()
                .find(|c| c.key == key)
                .cloned()
                .unwrap();
            assert_eq!((c.peer, c.transit), (Some(PEER), None));
        } else {
            assert!(
                matches!(answer, Some(Err(ControlError::Refused(_)))),
                "{answer:?}"
            );
        }
        h.check();
    }
}
