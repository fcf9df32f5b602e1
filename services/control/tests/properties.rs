//! No sequence of events leaves a connection half set up or a plane entry
//! without an owner: random clients, peers, tunnels, plane refusals and
//! time, with the model plane checked against the core after every step.

mod harness;

use std::time::Duration;

use harness::*;
use proptest::prelude::*;
use uniplane_control::*;
use uniplane_dataplane::wire::Status;
use uniplane_overlay::acl::ConnKey;

#[derive(Clone, Debug)]
enum Step {
    Attach(u8),
    Listen(u8, u16),
    Unlisten(u8, u16),
    ConnectLocal(u8, u8, u16),
    ConnectRemote(u8, u8, u8),
    Close(u8, usize),
    ClientGone(u8),
    PeerUp,
    PeerDown,
    Heartbeat,
    Verdict(usize, bool),
    PeerConnect(u8, u16),
    PeerClose(usize),
    TunnelOpened(u8),
    TunnelFailed(u8),
    Inbound(u8, u8),
    InboundEnded(u8),
    Refuse(u8),
    Advance(u16),
    Hold,
    Release,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..4u8).prop_map(Step::Attach),
        2 => (0..4u8, 80..83u16).prop_map(|(s, p)| Step::Listen(s, p)),
        1 => (0..4u8, 80..83u16).prop_map(|(s, p)| Step::Unlisten(s, p)),
        3 => (0..4u8, 0..8u8, 80..83u16).prop_map(|(s, d, p)| Step::ConnectLocal(s, d, p)),
        3 => (0..4u8, 0..4u8, 0..3u8).prop_map(|(s, d, c)| Step::ConnectRemote(s, d, c)),
        2 => (0..4u8, 0..8usize).prop_map(|(s, i)| Step::Close(s, i)),
        1 => (0..4u8).prop_map(Step::ClientGone),
        2 => Just(Step::PeerUp),
        1 => Just(Step::PeerDown),
        2 => Just(Step::Heartbeat),
        3 => (0..8usize, any::<bool>()).prop_map(|(i, ok)| Step::Verdict(i, ok)),
        2 => (0..8u8, 80..83u16).prop_map(|(d, p)| Step::PeerConnect(d, p)),
        1 => (0..8usize).prop_map(Step::PeerClose),
        2 => (0..3u8).prop_map(Step::TunnelOpened),
        1 => (0..3u8).prop_map(Step::TunnelFailed),
        1 => (0..3u8, 0..2u8).prop_map(|(t, c)| Step::Inbound(t, c)),
        1 => (0..3u8).prop_map(Step::InboundEnded),
        1 => (0..6u8).prop_map(Step::Refuse),
        2 => (1..400u16).prop_map(Step::Advance),
        1 => Just(Step::Hold),
        1 => Just(Step::Release),
    ]
}

fn run(h: &mut Harness, s: Step) {
    let session = |s: u8| SessionId::from(s) + 1;
    match s {
        Step::Attach(s) => {
            h.request(
                session(s),
                ClientRequest::Attach {
                    name: format!("p{s}"),
                },
            );
        }
        Step::Listen(s, port) => {
            h.request(session(s), ClientRequest::Listen { port });
        }
        Step::Unlisten(s, port) => {
            h.request(session(s), ClientRequest::Unlisten { port });
        }
        Step::ConnectLocal(s, d, port) => {
            h.request(
                session(s),
                ClientRequest::Connect {
                    src_port: 0,
                    dst: uniplane_dataplane::Uid::new(HERE, u16::from(d)),
                    dst_port: port,
                    class: 0,
                },
            );
        }
        Step::ConnectRemote(s, d, class) => {
            h.request(
                session(s),
                ClientRequest::Connect {
                    src_port: 0,
                    dst: uniplane_dataplane::Uid::new(PEER, u16::from(d)),
                    dst_port: 9,
                    class,
                },
            );
        }
        Step::Close(s, i) => {
            let conns: Vec<ConnKey> = h.core.connections().map(|c| c.key).collect();
            if let Some(k) = conns.get(i % conns.len().max(1)) {
                h.request(session(s), ClientRequest::Close { conn: *k });
            }
        }
        Step::ClientGone(s) => h.event(Event::ClientClosed {
            session: session(s),
        }),
        Step::PeerUp => h.event(Event::PeerChannelUp { server: PEER }),
        Step::PeerDown => h.event(Event::PeerChannelDown { server: PEER }),
        Step::Heartbeat => h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Heartbeat,
            request: 0,
        }),
        Step::Verdict(i, ok) => {
            let asked: Vec<ConnKey> = h
                .sent_to_peer()
                .into_iter()
                .filter_map(|(_, m)| match m {
                    PeerMsg::Connect { conn, .. } => Some(conn),
                    _ => None,
                })
                .collect();
            let pending: Vec<ConnKey> = h.core.pending_connections().copied().collect();
            let all: Vec<ConnKey> = asked.into_iter().chain(pending).collect();
            if let Some(conn) = all.get(i % all.len().max(1)) {
                h.event(Event::PeerVerdict {
                    server: PEER,
                    conn: *conn,
                    verdict: if ok { Ok(()) } else { Err("no".into()) },
                });
            }
        }
        Step::PeerConnect(d, port) => h.event(Event::PeerMessage {
            server: PEER,
            msg: PeerMsg::Connect {
                conn: ConnKey {
                    src: uniplane_dataplane::Uid::new(PEER, 4),
                    src_port: 6000 + port,
                    dst: uniplane_dataplane::Uid::new(HERE, u16::from(d)),
                    dst_port: port,
                },
                class: 0,
            },
            request: 1_000_000,
        }),
        Step::PeerClose(i) => {
            let conns: Vec<ConnKey> = h
                .core
                .connections()
                .filter(|c| c.peer.is_some())
                .map(|c| c.key)
                .collect();
            if let Some(k) = conns.get(i % conns.len().max(1)) {
                h.event(Event::PeerMessage {
                    server: PEER,
                    msg: PeerMsg::Close {
                        conn: *k,
                        status: Status::Closed,
                    },
                    request: 0,
                });
            }
        }
        Step::TunnelOpened(class) => h.event(Event::TunnelOpened {
            server: PEER,
            class,
        }),
        Step::TunnelFailed(class) => h.event(Event::TunnelFailed {
            server: PEER,
            class,
        }),
        Step::Inbound(t, class) => h.event(Event::InboundTunnel {
            tunnel: TunnelId::from(t),
            from: PEER,
            class,
            mtu: 1400,
        }),
        Step::InboundEnded(t) => h.event(Event::InboundTunnelEnded {
            tunnel: TunnelId::from(t),
        }),
        Step::Refuse(kind) => {
            h.plane.refuse = Some(match kind {
                0 => |op| matches!(op, PlaneOp::AddRoute(..)),
                1 => |op| matches!(op, PlaneOp::Allow(..)),
                2 => |op| matches!(op, PlaneOp::AddRule(..)),
                3 => |op| matches!(op, PlaneOp::AddTranslation(..)),
                4 => |op| matches!(op, PlaneOp::Attach(..)),
                _ => |op| matches!(op, PlaneOp::Revoke(..) | PlaneOp::RemoveRoute(..)),
            })
        }
        Step::Advance(ms) => h.advance(Duration::from_millis(u64::from(ms))),
        Step::Hold => h.hold = true,
        Step::Release => h.release(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn no_sequence_leaves_a_half_connection_or_an_ownerless_entry(
        steps in proptest::collection::vec(step(), 1..60)
    ) {
        let mut h = Harness::new(config());
        for s in steps {
            run(&mut h, s);
            h.check();
        }
        h.release();
        h.plane.refuse = None;
        h.check();
        // Everyone leaves: only the daemon, the devices and the peer's
        // tunnels remain, and nothing of any connection.
        for s in 0..4u8 {
            h.event(Event::ClientClosed { session: SessionId::from(s) + 1 });
        }
        h.event(Event::PeerChannelDown { server: PEER });
        for t in 0..3u8 {
            h.event(Event::InboundTunnelEnded { tunnel: TunnelId::from(t) });
        }
        h.check();
        prop_assert_eq!(h.core.connections().count(), 0);
        prop_assert_eq!(h.plane.ports.len(), 3);
        prop_assert!(h.plane.translations.is_empty());
        for port in h.plane.ports.values() {
            prop_assert!(port.allows.is_empty());
        }
    }
}
