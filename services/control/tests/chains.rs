//! Chained devices (`next`): the core keeps a connection open from a
//! device to its next one, reports it to the driver (`Action::Chain`),
//! and sets it up again — after a refusal, once a peer comes up, after
//! the peer failed — on virtual time against a model plane.

mod harness;

use std::time::Duration;

use harness::*;
use uniplane_control::*;
use uniplane_overlay::acl::ConnKey;

/// `config()` with a kernel device 3 chained to `next`.
fn chained(next: &str) -> ControlConfig {
    let mut c = config();
    c.devices.push(DeviceSpec {
        name: "stage".into(),
        device: Some(3),
        relay: false,
        label: "kernel".into(),
        mappable: false,
        next: Some(NextHop {
            uid: uid(next),
            class: 0,
        }),
    });
    c
}

fn key(next: &str) -> ConnKey {
    ConnKey {
        src: uid("10.0.0.1:3"),
        src_port: CHAIN_PORT,
        dst: uid(next),
        dst_port: CHAIN_PORT,
    }
}

/// The chain reports taken out of `out`, in order.
fn reports(h: &mut Harness) -> Vec<(ConnKey, bool)> {
    let mut got = Vec::new();
    h.out.retain(|a| match a {
        Action::Chain { conn, up, device } => {
            assert_eq!(*device, conn.src);
            got.push((*conn, *up));
            false
        }
        _ => true,
    });
    got
}

#[test]
fn a_chain_to_a_local_device_is_installed_at_start_and_reported_once() {
    let mut h = Harness::new(chained("10.0.0.1:1"));
    let k = key("10.0.0.1:1");
    assert_eq!(reports(&mut h), vec![(k, true)]);
    assert!(h.core.connections().any(|c| c.key == k));
    h.check();
    h.advance(Duration::from_secs(5));
    assert!(reports(&mut h).is_empty(), "nothing changed, nothing told");
}

#[test]
fn a_chain_to_a_device_not_there_is_retried_every_second_and_never_reported_up() {
    let mut h = Harness::new(chained("10.0.0.1:9"));
    assert!(reports(&mut h).is_empty());
    assert_eq!(h.core.poll_timeout(), Some(Duration::from_secs(1)));
    h.advance(Duration::from_millis(3500));
    assert!(reports(&mut h).is_empty());
    assert_eq!(h.core.connections().count(), 0);
    // Tries at 0, 1, 2, 3 s: the next is due at 4 s.
    assert_eq!(h.core.poll_timeout(), Some(Duration::from_secs(4)));
    h.check();
}

#[test]
fn a_chain_across_servers_opens_with_the_peers_verdict_and_goes_down_with_the_peer() {
    let mut h = Harness::new(chained("10.0.0.2:5"));
    let k = key("10.0.0.2:5");
    // No peer yet: refused, retried.
    assert!(reports(&mut h).is_empty());
    h.peer_up(PEER);
    let asked: Vec<_> = h
        .sent_to_peer()
        .into_iter()
        .filter_map(|(_, m)| match m {
            PeerMsg::Connect { conn, .. } => Some(conn),
            _ => None,
        })
        .collect();
    assert_eq!(asked, vec![k]);
    assert!(reports(&mut h).is_empty(), "not up before the verdict");
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: k,
        verdict: Ok(()),
    });
    assert_eq!(reports(&mut h), vec![(k, true)]);
    h.check();
    // The peer's channel goes: the chain is down, and comes back with it.
    h.event(Event::PeerChannelDown { server: PEER });
    assert_eq!(reports(&mut h), vec![(k, false)]);
    h.check();
    h.out.clear();
    h.peer_up(PEER);
    assert!(h
        .sent_to_peer()
        .iter()
        .any(|(_, m)| matches!(m, PeerMsg::Connect { conn, .. } if *conn == k)));
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: k,
        verdict: Ok(()),
    });
    assert_eq!(reports(&mut h), vec![(k, true)]);
    h.check();
}

#[test]
fn a_refused_chain_is_asked_again_and_a_shutdown_stops_the_tries() {
    let mut h = Harness::new(chained("10.0.0.2:5"));
    let k = key("10.0.0.2:5");
    h.peer_up(PEER);
    h.sent_to_peer();
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: k,
        verdict: Err("no device 5".into()),
    });
    assert!(reports(&mut h).is_empty());
    // A second later, the peer alive all along (its heartbeats come).
    for _ in 0..10 {
        h.advance(Duration::from_millis(100));
        h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Heartbeat,
            request: 0,
        });
    }
    assert!(h
        .sent_to_peer()
        .iter()
        .any(|(_, m)| matches!(m, PeerMsg::Connect { conn, .. } if *conn == k)));
    h.event(Event::PeerVerdict {
        server: PEER,
        conn: k,
        verdict: Ok(()),
    });
    assert_eq!(reports(&mut h), vec![(k, true)]);
    h.event(Event::Shutdown);
    assert_eq!(
        reports(&mut h),
        Vec::new(),
        "a shutdown reports nothing more"
    );
    h.advance(Duration::from_secs(5));
    assert!(!h
        .sent_to_peer()
        .iter()
        .any(|(_, m)| matches!(m, PeerMsg::Connect { .. })));
}
