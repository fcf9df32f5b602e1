//! Client requests and sessions: attach, listen, close, a client going away.

use super::*;

impl Control {
    pub(super) fn client(&mut self, session: SessionId, request: RequestId, req: ClientRequest) {
        let device = self.sessions.get(&session).copied();
        let attached = || device.ok_or(ControlError::NotAttached);
        let result = match req {
            ClientRequest::Attach { name } => {
                if device.is_some() {
                    Err(ControlError::BadRequest("already attached".into()))
                } else if self.resources.len() >= self.config.limits.resources {
                    Err(ControlError::Limit("resources"))
                } else {
                    self.start_attach(
                        vec![PlaneOp::Attach(PortSpec::app(&name))],
                        vec![Attaching::Process {
                            session,
                            request,
                            name,
                        }],
                    );
                    return;
                }
            }
            ClientRequest::Listen { port } => attached().and_then(|d| {
                let limit = self.config.limits.listening_per_resource;
                let r = self
                    .resources
                    .get_mut(&d)
                    .ok_or(ControlError::NotAttached)?;
                if !r.listening.contains(&port) && r.listening.len() >= limit {
                    return Err(ControlError::Limit("listening ports"));
                }
                r.listening.insert(port);
                Ok(Reply::Port(port))
            }),
            ClientRequest::Unlisten { port } => attached().map(|d| {
                if let Some(r) = self.resources.get_mut(&d) {
                    r.listening.remove(&port);
                }
                Reply::Port(port)
            }),
            ClientRequest::Connect {
                src_port,
                dst,
                dst_port,
                class,
            } => match attached() {
                Err(e) => Err(e),
                Ok(d) => {
                    let src_port = if src_port == 0 {
                        self.ephemeral_port()
                    } else {
                        src_port
                    };
                    let key = ConnKey {
                        src: Uid::new(self.config.server, d),
                        src_port,
                        dst,
                        dst_port,
                    };
                    let peer = (dst.server() != self.config.server).then(|| dst.server());
                    match self
                        .class_allowed(class, peer)
                        .and_then(|()| self.connect(session, request, key, class))
                    {
                        Ok(()) => return,
                        Err(e) => Err(e),
                    }
                }
            },
            ClientRequest::Close { conn } => match attached() {
                Err(e) => Err(e),
                Ok(d) => {
                    let me = Uid::new(self.config.server, d);
                    if conn.src != me && conn.dst != me {
                        Err(ControlError::Denied("not your connection".into()))
                    } else if let Some(k) = self.canonical(conn) {
                        self.drop_connection(k, Status::Closed, true);
                        let mut then = Then::nothing();
                        then.ok.push(Action::Answer {
                            request,
                            result: Ok(Reply::Done),
                        });
                        self.sync(then);
                        return;
                    } else {
                        Err(ControlError::NotFound("no such connection".into()))
                    }
                }
            },
            ClientRequest::SetPolicy { device, policy } => match self.resources.get(&device) {
                None => Err(ControlError::NotFound(format!("no device {device}"))),
                Some(r) => {
                    let port = r.port;
                    let batch = self.batch_id();
                    self.actions.push_back(Action::Plane {
                        batch,
                        ops: vec![PlaneOp::SetPolicy(port, policy)],
                    });
                    self.job = Some(Job::Policy { batch, request });
                    return;
                }
            },
        };
        self.answer(request, result);
    }

    pub(super) fn client_closed(&mut self, session: SessionId) {
        let mut pending: Vec<ConnKey> = self
            .pending
            .iter()
            .filter(|(_, p)| p.session == Some(session))
            .map(|(k, _)| *k)
            .collect();
        pending.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        let mut entries = false;
        for key in pending {
            if let Some(p) = self.pending.remove(&key) {
                if matches!(p.stage, Stage::Verdict { .. }) {
                    // Asked (or about to be): its end here goes, and the
                    // peer lets go of its own.
                    entries = true;
                    self.actions.push_back(Action::ToPeer {
                        server: p.hop,
                        msg: PeerMsg::Close {
                            conn: key,
                            status: Status::Closed,
                        },
                    });
                }
            }
        }
        let Some(device) = self.sessions.remove(&session) else {
            if entries {
                self.sync(Then::nothing());
            }
            return;
        };
        self.unregister(device);
        self.sync(Then::nothing());
    }

    /// Removes a resource and its connections (far ends told).
    pub(super) fn unregister(&mut self, device: u16) {
        let Some(res) = self.resources.remove(&device) else {
            return;
        };
        let mut conns: Vec<ConnKey> = self
            .connections
            .keys()
            .filter(|k| k.src == res.uid || k.dst == res.uid)
            .copied()
            .collect();
        conns.sort_by_key(|k| (k.src, k.src_port, k.dst, k.dst_port));
        for c in conns {
            self.drop_connection(c, Status::Closed, true);
        }
        tracing::info!(uid = %res.uid, name = %res.name, "resource unregistered");
    }

    pub(super) fn ephemeral_port(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p == u16::MAX {
            EPHEMERAL_FIRST
        } else {
            p + 1
        };
        p
    }

    /// The connection as stored (either direction given).
    pub(super) fn canonical(&self, key: ConnKey) -> Option<ConnKey> {
        if self.connections.contains_key(&key) {
            Some(key)
        } else if self.connections.contains_key(&key.reversed()) {
            Some(key.reversed())
        } else {
            None
        }
    }
}
