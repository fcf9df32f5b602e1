//! Peers: channels, heartbeats, failures, and the tunnels to them.

use super::*;

impl Control {
    /// A server the directory lists becomes a peer.
    pub(super) fn add_peer(&mut self, spec: PeerSpec) {
        let server = spec.server;
        if server == self.config.server || self.peers.contains_key(&server) {
            return;
        }
        if self.peers.len() >= self.config.limits.peers {
            tracing::warn!(%server, limit = self.config.limits.peers, "peer not added: too many peers");
            return;
        }
        tracing::info!(%server, stack = %spec.stack, "peer added");
        let mut peer = Peer::new(spec, self.now);
        peer.discovered = true;
        self.peers.insert(server, peer);
    }

    /// A server the directory no longer lists stops being a peer: taken
    /// down as a failure would, then forgotten, with its inbound tunnels.
    pub(super) fn remove_peer(&mut self, server: Ipv4Addr) {
        if !self.peers.get(&server).is_some_and(|p| p.discovered) {
            return;
        }
        tracing::info!(%server, "peer removed");
        self.take_peer_down(server, Status::PeerFailed);
        self.actions.push_back(Action::ClosePeerChannel { server });
        self.peers.remove(&server);
        let inbound: Vec<TunnelId> = self
            .inbound
            .iter()
            .filter(|(_, t)| t.from == server)
            .map(|(id, _)| *id)
            .collect();
        for tunnel in inbound {
            self.inbound.remove(&tunnel);
            self.actions.push_back(Action::DropTunnel { tunnel });
        }
        self.sync(Then::nothing());
    }

    pub(super) fn peer_channel_up(&mut self, server: Ipv4Addr) {
        if self.peers.get(&server).is_some_and(|p| p.channel) {
            // A new channel replaces one we did not hear end.
            self.take_peer_down(server, Status::PeerFailed);
            self.sync(Then::nothing());
        }
        let now = self.now;
        let Some(p) = self.peers.get_mut(&server) else {
            return;
        };
        p.channel = true;
        p.last_seen = now;
        p.next_beat = Some(now);
        if let std::collections::btree_map::Entry::Vacant(e) = p.tunnels.entry(0) {
            e.insert(Tunnel::Opening);
            self.actions
                .push_back(Action::OpenTunnel { server, class: 0 });
        }
    }

    pub(super) fn peer_message(&mut self, server: Ipv4Addr, msg: PeerMsg, request: RequestId) {
        let now = self.now;
        let Some(p) = self.peers.get_mut(&server) else {
            if matches!(msg, PeerMsg::Connect { .. }) {
                self.answer(
                    request,
                    Err(ControlError::Refused(format!("unknown peer {server}"))),
                );
            }
            return;
        };
        p.last_seen = now;
        match msg {
            PeerMsg::Heartbeat => {}
            PeerMsg::Close { conn, status } => {
                let status = if status == Status::Ok {
                    Status::Closed
                } else {
                    status
                };
                if self.pending.get(&conn).and_then(|p| p.from) == Some(server) {
                    // The neighbour that asked us to carry it on gave up.
                    self.give_up_carrying(conn);
                    self.sync(Then::nothing());
                    return;
                }
                if let Some(k) = self.canonical(conn) {
                    let hops = self.connections.get(&k).map(|c| (c.peer, c.transit));
                    if let Some((peer, transit)) = hops {
                        if peer != Some(server) && transit != Some(server) {
                            return;
                        }
                        // Carried on here: the other neighbour is told.
                        if let (Some(p), Some(t)) = (peer, transit) {
                            let other = if p == server { t } else { p };
                            self.actions.push_back(Action::ToPeer {
                                server: other,
                                msg: PeerMsg::Close { conn: k, status },
                            });
                        }
                        self.drop_connection(k, status, false);
                        self.sync(Then::nothing());
                    }
                }
            }
            PeerMsg::Connect { conn, class } => {
                let admitted = self
                    .class_allowed(class, Some(server))
                    .and_then(|()| self.admit_from_peer(server, conn, class, request));
                if let Err(e) = admitted {
                    self.answer(request, Err(e));
                }
            }
        }
    }

    /// A peer asks to connect one of its resources to one of ours.
    pub(super) fn admit_from_peer(
        &mut self,
        from: Ipv4Addr,
        key: ConnKey,
        class: u8,
        request: RequestId,
    ) -> Result<(), ControlError> {
        if key.dst.server() != self.config.server {
            return self.carry_on(from, key, class, request);
        }
        if self.hop_to(key.src.server()) != Some(from) {
            return Err(ControlError::Refused(
                "connection does not join the two servers".into(),
            ));
        }
        if !self.peers.get(&from).is_some_and(Peer::alive) {
            // Its traffic could not come back, nor would its end be torn
            // down with the peer.
            return Err(ControlError::PeerDown(format!(
                "no channel from here to {from} yet"
            )));
        }
        if !self.config.allows(key.src, key.dst, ReqType::Connect) {
            return Err(ControlError::Refused(format!(
                "policy denies {} → {}",
                key.src, key.dst
            )));
        }
        if self.connections.contains_key(&key) {
            // Asked again (its answer was lost): admitted already.
            self.answer(request, Ok(Reply::Done));
            return Ok(());
        }
        if self.canonical(key).is_some() {
            return Err(ControlError::Exists);
        }
        if self.connections.len() + self.pending.len() >= self.config.limits.connections {
            return Err(ControlError::Limit("connections"));
        }
        let from_peer = self
            .connections
            .values()
            .filter(|c| c.peer == Some(from) && c.key.dst.server() == self.config.server)
            .count();
        if from_peer >= self.config.limits.connections_per_peer {
            return Err(ControlError::Limit("connections from one peer"));
        }
        let dst = self
            .resources
            .get(&key.dst.device())
            .ok_or_else(|| ControlError::Refused(format!("no resource {}", key.dst)))?;
        if !dst.accepts(key.dst_port) {
            return Err(ControlError::Refused(format!(
                "nothing listens at {}/{}",
                key.dst, key.dst_port
            )));
        }
        let notify = dst.kind == ResourceKind::Process;
        self.connections.insert(
            key,
            Connection {
                key,
                class,
                peer: Some(from),
                transit: None,
                since: self.now,
            },
        );
        let mut then = Then {
            undo: Undo::Connection(key),
            fail: Some(request),
            ..Then::nothing()
        };
        if notify {
            then.ok.push(Action::Notice {
                to: key.dst,
                kind: ReqType::Connect,
                conn: key.reversed(),
                status: Status::Ok,
            });
        }
        then.ok.push(Action::Answer {
            request,
            result: Ok(Reply::Done),
        });
        self.sync(then);
        Ok(())
    }

    /// Takes a peer down in the state: its tunnels go, every connection
    /// through it is closed with `status` and its owner told, and
    /// connections waiting for it fail. The caller syncs.
    pub(super) fn take_peer_down(&mut self, server: Ipv4Addr, status: Status) {
        let Some(p) = self.peers.get_mut(&server) else {
            return;
        };
        if p.alive() || p.tunnel(0).is_some() {
            p.failures += 1;
            tracing::warn!(%server, "peer down");
        }
        p.channel = false;
        p.next_beat = None;
        p.tunnels.clear();
        let mut affected: Vec<(ConnKey, Option<Ipv4Addr>)> = self
            .connections
            .values()
            .filter(|c| c.peer == Some(server) || c.transit == Some(server))
            .map(|c| {
                // Carried on here: the neighbour on the other side.
                let other = match (c.peer, c.transit) {
                    (Some(p), Some(t)) => Some(if p == server { t } else { p }),
                    _ => None,
                };
                (c.key, other)
            })
            .collect();
        // The map has no order: in key order, the same inputs give the
        // same actions in every process.
        affected.sort_by_key(|(k, _)| (k.src, k.src_port, k.dst, k.dst_port));
        for (c, other) in affected {
            if let Some(other) = other {
                self.actions.push_back(Action::ToPeer {
                    server: other,
                    msg: PeerMsg::Close { conn: c, status },
                });
            }
            self.drop_connection(c, status, false);
        }
        self.fail_pending(server, None);
        let mut carried: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.from == Some(server))
            .map(|(k, _)| *k)
            .collect();
        carried.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        for key in carried {
            self.give_up_carrying(key);
        }
    }

    /// Fails connections to `server` waiting for a verdict or a tunnel
    /// (only those of `class` when given).
    pub(super) fn fail_pending(&mut self, server: Ipv4Addr, class: Option<u8>) {
        let mut failed: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.hop == server && class.is_none_or(|c| c == p.class))
            .map(|(k, _)| *k)
            .collect();
        failed.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        for key in failed {
            if let Some(p) = self.pending.remove(&key) {
                self.answer(
                    p.request,
                    Err(ControlError::PeerDown(format!(
                        "tunnel of class {} to {server} is down",
                        p.class
                    ))),
                );
            }
        }
    }

    pub(super) fn tunnel_opened(&mut self, server: Ipv4Addr, class: u8) {
        let wanted = self
            .peers
            .get(&server)
            .is_some_and(|p| p.channel && p.tunnels.get(&class) == Some(&Tunnel::Opening));
        if !wanted {
            self.actions
                .push_back(Action::CloseTunnel { server, class });
            return;
        }
        let mtu = self.peers[&server].spec.tunnel_mtu;
        let spec = PortSpec::tunnel(&format!("tunnel-{server}-class{class}"), class, mtu);
        self.start_attach(
            vec![PlaneOp::Attach(spec)],
            vec![Attaching::TunnelOut { server, class }],
        );
    }

    pub(super) fn tunnel_failed(&mut self, server: Ipv4Addr, class: u8) {
        let Some(p) = self.peers.get_mut(&server) else {
            return;
        };
        if p.tunnels.remove(&class).is_none() {
            return;
        }
        if class == 0 {
            p.tunnels.insert(0, Tunnel::Opening);
            self.take_peer_down(server, Status::PeerFailed);
            self.actions.push_back(Action::ClosePeerChannel { server });
        } else {
            let mut affected: Vec<ConnKey> = self
                .connections
                .values()
                .filter(|c| c.peer == Some(server) && c.class == class)
                .map(|c| c.key)
                .collect();
            affected.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
            for c in affected {
                self.drop_connection(c, Status::PeerFailed, true);
            }
            self.fail_pending(server, Some(class));
        }
        self.sync(Then::nothing());
    }

    /// Connections waiting for the tunnel of `class` to `server` ask the
    /// peer now (once their end is installed: see `ask_peer`).
    pub(super) fn tunnel_ready(&mut self, server: Ipv4Addr, class: u8) {
        // Chains waiting for a server may reach it now: try at once.
        self.chains_due();
        let deadline = self.now + self.config.verdict_timeout;
        let mut ready = Vec::new();
        for (key, p) in self.pending.iter_mut() {
            if p.hop == server && p.class == class && matches!(p.stage, Stage::Tunnel { .. }) {
                p.stage = Stage::Verdict { deadline };
                ready.push(*key);
            }
        }
        // In the order they were asked for (the map has none).
        ready.sort_by_key(|k| (self.pending[k].started, self.pending[k].request));
        self.ask_peer(ready);
    }
}
