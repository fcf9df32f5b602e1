//! Connection setup (local, remote through a peer, from a peer) and teardown.

use super::*;

impl Control {
    /// Starts a connection from a local resource; `Ok` means the answer
    /// comes later.
    pub(super) fn connect(
        &mut self,
        session: SessionId,
        request: RequestId,
        key: ConnKey,
        class: u8,
    ) -> Result<(), ControlError> {
        if !self.config.allows(key.src, key.dst, ReqType::Connect) {
            return Err(ControlError::Denied(format!(
                "policy denies {} → {}",
                key.src, key.dst
            )));
        }
        if self.canonical(key).is_some() || self.pending.contains_key(&key) {
            return Err(ControlError::Exists);
        }
        if self.connections.len() + self.pending.len() >= self.config.limits.connections {
            return Err(ControlError::Limit("connections"));
        }
        if key.dst.server() != self.config.server {
            return self.connect_remote(session, request, key, class);
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
                peer: None,
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
            result: Ok(Reply::Connected(key)),
        });
        then.ok.push(Action::Opened {
            conn: key,
            remote: false,
            setup: Duration::ZERO,
        });
        tracing::info!(src = %key.src, sport = key.src_port, dst = %key.dst, dport = key.dst_port, class, "connection open");
        self.sync(then);
        Ok(())
    }

    pub(super) fn connect_remote(
        &mut self,
        session: SessionId,
        request: RequestId,
        key: ConnKey,
        class: u8,
    ) -> Result<(), ControlError> {
        let server = self
            .hop_to(key.dst.server())
            .ok_or_else(|| ControlError::NoRoute(format!("no peer server {}", key.dst.server())))?;
        self.ask_through(Some(session), None, request, key, class, server)
    }

    /// Asks neighbour `server` to admit `key` (or carry it on), once the
    /// tunnel of its class is open; `session` asked here, or the
    /// neighbour `from` asked us to carry it on.
    pub(super) fn ask_through(
        &mut self,
        session: Option<SessionId>,
        from: Option<Ipv4Addr>,
        request: RequestId,
        key: ConnKey,
        class: u8,
        server: Ipv4Addr,
    ) -> Result<(), ControlError> {
        let waiting = self.pending.values().filter(|p| p.hop == server).count();
        let peer = self
            .peers
            .get_mut(&server)
            .ok_or_else(|| ControlError::NoRoute(format!("no peer server {server}")))?;
        if !peer.alive() {
            return Err(ControlError::PeerDown(format!(
                "peer {server} is not reachable"
            )));
        }
        if waiting >= self.config.limits.pending_per_peer {
            return Err(ControlError::Limit("connections waiting for a peer"));
        }
        let deadline = self.now + self.config.verdict_timeout;
        let stage = match peer.tunnels.get(&class) {
            Some(Tunnel::Open(_)) => Stage::Verdict { deadline },
            Some(Tunnel::Opening) => Stage::Tunnel { deadline },
            None => {
                peer.tunnels.insert(class, Tunnel::Opening);
                self.actions.push_back(Action::OpenTunnel { server, class });
                Stage::Tunnel { deadline }
            }
        };
        self.pending.insert(
            key,
            Pending {
                request,
                session,
                class,
                started: self.now,
                stage,
                hop: server,
                from,
            },
        );
        if matches!(stage, Stage::Verdict { .. }) {
            self.ask_peer(vec![key]);
        }
        Ok(())
    }

    /// Installs our end of connections that wait for their peer's verdict
    /// (stage [`Stage::Verdict`]), and asks the peer once it is in.
    ///
    /// The peer tells its accepting process at once when it admits, and
    /// that process may send before the verdict is back here: were our end
    /// installed only on the verdict, that first message would meet a
    /// plane that does not admit it yet, and be dropped. So the return
    /// traffic is admitted first; a refusal, a timeout, a failed peer or
    /// the caller going away takes the entries out again (the picture
    /// holds them only while the connection waits for the verdict).
    pub(super) fn ask_peer(&mut self, keys: Vec<ConnKey>) {
        let ask = keys
            .iter()
            .filter_map(|k| {
                let p = self.pending.get(k)?;
                Some(Action::ToPeer {
                    server: p.hop,
                    msg: PeerMsg::Connect {
                        conn: *k,
                        class: p.class,
                    },
                })
            })
            .collect::<Vec<_>>();
        if ask.is_empty() {
            return;
        }
        self.sync(Then {
            ok: ask,
            undo: Undo::Asking(keys),
            ..Then::nothing()
        });
    }

    /// Answers connections whose tunnel or verdict did not come by their
    /// deadline. Those waiting for a verdict hold plane entries, so they
    /// expire only while no batch is in flight ([`Control::poll_timeout`]
    /// leaves them out meanwhile); the caller syncs when this says so.
    pub(super) fn expire_pending(&mut self, now: Duration) -> bool {
        let idle = self.job.is_none();
        let mut expired: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.stage.deadline() <= now)
            .filter(|(_, p)| idle || matches!(p.stage, Stage::Tunnel { .. }))
            .map(|(k, _)| *k)
            .collect();
        expired.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        let mut entries = false;
        for key in expired {
            let Some(p) = self.pending.remove(&key) else {
                continue;
            };
            let server = p.hop;
            if let Stage::Tunnel { .. } = p.stage {
                self.answer(
                    p.request,
                    Err(ControlError::Timeout(format!(
                        "tunnel of class {} to {server} did not open",
                        p.class
                    ))),
                );
                continue;
            }
            entries = true;
            self.answer(
                p.request,
                Err(ControlError::Timeout(format!(
                    "peer {server} did not answer"
                ))),
            );
            // It may admit late: make sure it lets go.
            self.actions.push_back(Action::ToPeer {
                server,
                msg: PeerMsg::Close {
                    conn: key,
                    status: Status::Closed,
                },
            });
        }
        entries
    }

    pub(super) fn peer_verdict(
        &mut self,
        server: Ipv4Addr,
        key: ConnKey,
        verdict: Result<(), String>,
    ) {
        let asked = self
            .pending
            .get(&key)
            .is_some_and(|p| matches!(p.stage, Stage::Verdict { .. }) && p.hop == server);
        if !asked {
            if verdict.is_ok() {
                // Too late, or never asked: the peer must not keep its end.
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Close {
                        conn: key,
                        status: Status::Closed,
                    },
                });
            }
            return;
        }
        let Some(p) = self.pending.remove(&key) else {
            return;
        };
        // Our end was installed before the peer was asked: a refusal
        // takes it out again.
        if let Err(why) = verdict {
            self.answer(p.request, Err(ControlError::Refused(why)));
            self.sync(Then::nothing());
            return;
        }
        if let Some(from) = p.from {
            self.carried_on(key, p, from, server);
            return;
        }
        // A chain's is asked by the daemon for a device, under no session.
        let asker =
            |s: SessionId| s == super::chains::CHAIN_SESSION || self.sessions.contains_key(&s);
        if !p.session.is_some_and(asker) || !self.resources.contains_key(&key.src.device()) {
            self.actions.push_back(Action::ToPeer {
                server,
                msg: PeerMsg::Close {
                    conn: key,
                    status: Status::Closed,
                },
            });
            self.sync(Then::nothing());
            return;
        }
        self.connections.insert(
            key,
            Connection {
                key,
                class: p.class,
                peer: Some(server),
                transit: None,
                since: self.now,
            },
        );
        let then = Then {
            ok: vec![
                Action::Answer {
                    request: p.request,
                    result: Ok(Reply::Connected(key)),
                },
                Action::Opened {
                    conn: key,
                    remote: true,
                    setup: self.now.saturating_sub(p.started),
                },
            ],
            undo: Undo::Connection(key),
            fail: Some(p.request),
            tunnel_ready: None,
            repair: false,
        };
        tracing::info!(src = %key.src, dst = %key.dst, class = p.class, "remote connection open");
        self.sync(then);
    }

    /// New access rules: later requests and the plane's connectionless
    /// entries follow them; open connections they would not admit close.
    pub(super) fn set_rules(
        &mut self,
        rules: Vec<crate::config::AccessRule>,
        default_action: crate::config::DefaultAction,
    ) {
        self.config.rules = rules;
        self.config.default_action = default_action;
        self.connectionless = super::picture::connectionless_rules(&self.config);
        self.revoke_grants(None);
        let mut revoked: Vec<ConnKey> = self
            .connections
            .keys()
            .filter(|k| !self.config.allows(k.src, k.dst, ReqType::Connect))
            .copied()
            .collect();
        revoked.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        for key in revoked {
            tracing::info!(?key, "connection closed: the new access rules deny it");
            self.drop_connection(key, Status::Denied, true);
        }
        self.sync(Then::nothing());
    }

    /// Closes every connection, telling local processes and peers, before
    /// the daemon stops.
    pub(super) fn shut_down(&mut self) {
        let mut all: Vec<ConnKey> = self.connections.keys().copied().collect();
        all.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        for key in all {
            self.drop_connection(key, Status::Closed, true);
        }
        self.sync(Then::nothing());
    }

    /// Removes a connection from the state and tells its local process
    /// ends (and, when `tell_peer`, its peer) that it is gone.
    /// Local device `device` failed: every connection with an end on it
    /// is closed with `PeerFailed` and its other ends told.
    pub(super) fn device_failed(&mut self, device: u16) {
        let uid = Uid::new(self.config.server, device);
        let mut gone: Vec<ConnKey> = self
            .connections
            .values()
            .map(|c| c.key)
            .filter(|k| k.src == uid || k.dst == uid)
            .collect();
        gone.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        tracing::warn!(%uid, closed = gone.len(), "a device failed");
        if gone.is_empty() {
            return;
        }
        for key in gone {
            // The failed device itself is told nothing.
            self.drop_connection_but(key, Status::PeerFailed, true, Some(uid));
        }
        self.sync(Then::nothing());
    }

    pub(super) fn drop_connection(&mut self, key: ConnKey, status: Status, tell_peer: bool) {
        self.drop_connection_but(key, status, tell_peer, None);
    }

    /// [`Self::drop_connection`], telling the end `silent` nothing.
    fn drop_connection_but(
        &mut self,
        key: ConnKey,
        status: Status,
        tell_peer: bool,
        silent: Option<Uid>,
    ) {
        let Some(conn) = self.connections.remove(&key) else {
            return;
        };
        for end in [key.src, key.dst] {
            if end.server() != self.config.server || Some(end) == silent {
                continue;
            }
            let Some(r) = self.resources.get(&end.device()) else {
                continue;
            };
            // A device that keeps state per connection (a kernel's
            // connection slots) hears of the end as a process does: its
            // peer may be gone without a CLOSE in band (a session that
            // ended). Relays keep none.
            let told = match &r.kind {
                ResourceKind::Process => true,
                ResourceKind::Device { relay, .. } => !relay,
                ResourceKind::Daemon => false,
            };
            if told {
                // NOTIFY, whatever the status: its payload names the
                // connection, so a process with many connections on one
                // port (a server) ends only this one. (CLOSE carries no
                // payload: the process could tell only the port.)
                let kind = ReqType::Notify;
                let conn = if end == key.src { key } else { key.reversed() };
                self.actions.push_back(Action::Notice {
                    to: end,
                    kind,
                    conn,
                    status,
                });
            }
        }
        if tell_peer {
            for server in conn.peer.into_iter().chain(conn.transit) {
                self.actions.push_back(Action::ToPeer {
                    server,
                    msg: PeerMsg::Close { conn: key, status },
                });
            }
        }
        tracing::info!(src = %key.src, dst = %key.dst, ?status, "connection closed");
    }
}
