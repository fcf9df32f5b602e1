//! Client requests and sessions: attach, listen, close, a client going away.

use super::*;

/// Most sessions one shared region is lent to at once.
pub const MAX_BORROWERS: usize = 63;

/// A shared region as the core keeps it.
#[derive(Debug)]
pub(super) struct Share {
    /// The owner's session.
    session: SessionId,
    len: u64,
    peers_write: bool,
    /// Sessions it is lent to → writable.
    borrowers: BTreeMap<SessionId, bool>,
}

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
            ClientRequest::Map { device: target } => {
                attached().and_then(|d| self.map(session, d, target))
            }
            ClientRequest::Share {
                id,
                len,
                peers_write,
            } => attached().and_then(|d| self.share(session, d, id, len, peers_write)),
            ClientRequest::Unshare { id } => {
                attached().and_then(|d| match self.shares.get(&(d, id)) {
                    Some(s) if s.session == session => {
                        self.shares.remove(&(d, id));
                        tracing::info!(owner = d, id, "shared memory withdrawn by its owner");
                        self.actions.push_back(Action::Withdraw { owner: d, id });
                        Ok(Reply::Done)
                    }
                    _ => Err(ControlError::NotFound(format!("no shared region {id}"))),
                })
            }
            ClientRequest::MapShared { owner, id } => {
                attached().and_then(|d| self.map_shared(session, d, owner, id))
            }
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

    /// Whether `session` (resource `me`) may map device `target`'s memory,
    /// and how; a grant is recorded so the rules can take it back.
    fn map(&mut self, session: SessionId, me: u16, target: u16) -> Result<Reply, ControlError> {
        let res = self
            .resources
            .get(&target)
            .ok_or_else(|| ControlError::NotFound(format!("no device {target}")))?;
        let mappable = matches!(res.kind, ResourceKind::Device { .. })
            && self
                .config
                .devices
                .iter()
                .any(|d| d.name == res.name && d.mappable);
        if !mappable {
            return Err(ControlError::BadRequest(format!(
                "device {target} ({}) has no memory a process can map: only host memory devices have",
                res.name
            )));
        }
        let (src, dst) = (Uid::new(self.config.server, me), res.uid);
        let (read, write) = self.may_map(src, dst);
        if !read {
            return Err(ControlError::Denied(format!(
                "the access rules do not let {src} read {dst}: no mapping"
            )));
        }
        self.grants.insert((session, target), write);
        tracing::info!(%src, %dst, writable = write, "memory lent by mapping");
        Ok(Reply::Mapped {
            device: target,
            writable: write,
        })
    }

    /// Makes shared region `id` of resource `me` (bounded per resource
    /// and in bytes overall) for `session`.
    fn share(
        &mut self,
        session: SessionId,
        me: u16,
        id: u16,
        len: u64,
        peers_write: bool,
    ) -> Result<Reply, ControlError> {
        let limits = &self.config.limits;
        if len == 0 {
            return Err(ControlError::BadRequest(
                "a shared region has at least one byte".into(),
            ));
        }
        if self.shares.contains_key(&(me, id)) {
            return Err(ControlError::BadRequest(format!(
                "region {id} is shared already"
            )));
        }
        if self.shares.keys().filter(|(o, _)| *o == me).count() >= limits.shared_per_resource {
            return Err(ControlError::Limit("shared regions"));
        }
        let total: u64 = self.shares.values().map(|s| s.len).sum();
        let cap = (limits.shared_mib as u64).saturating_mul(1 << 20);
        if total.saturating_add(len) > cap {
            return Err(ControlError::Limit("shared memory"));
        }
        self.shares.insert(
            (me, id),
            Share {
                session,
                len,
                peers_write,
                borrowers: BTreeMap::new(),
            },
        );
        self.actions
            .push_back(Action::MakeShared { owner: me, id, len });
        tracing::info!(owner = me, id, len, peers_write, "shared memory made");
        Ok(Reply::Shared {
            owner: me,
            id,
            len,
            writable: true,
        })
    }

    /// Whether `session` (resource `me`) may map region `id` of `owner`,
    /// and how: as the rules allow `me` READ (and WRTE, if the owner lets
    /// peers write) on the owner.
    fn map_shared(
        &mut self,
        session: SessionId,
        me: u16,
        owner: u16,
        id: u16,
    ) -> Result<Reply, ControlError> {
        if owner == me {
            return Err(ControlError::BadRequest(
                "a resource has its own regions from sharing them".into(),
            ));
        }
        let (src, dst) = (
            Uid::new(self.config.server, me),
            Uid::new(self.config.server, owner),
        );
        let (read, write) = self.may_map(src, dst);
        let share = self
            .shares
            .get_mut(&(owner, id))
            .ok_or_else(|| ControlError::NotFound(format!("{dst} shares no region {id}")))?;
        if !read {
            return Err(ControlError::Denied(format!(
                "the access rules do not let {src} read {dst}: no mapping"
            )));
        }
        if !share.borrowers.contains_key(&session) && share.borrowers.len() >= MAX_BORROWERS {
            return Err(ControlError::Limit("mappings of a shared region"));
        }
        let writable = write && share.peers_write;
        share.borrowers.insert(session, writable);
        tracing::info!(%src, %dst, id, writable, "shared memory lent by mapping");
        Ok(Reply::Shared {
            owner,
            id,
            len: share.len,
            writable,
        })
    }

    /// Withdraws the shared regions `ended` owned or borrowed (all whose
    /// borrowers the rules no longer allow, when `ended` is none): a loan
    /// cannot be taken out of a process, so the region goes for everyone
    /// and its owner keeps the bytes to itself.
    fn revoke_shares(&mut self, ended: Option<SessionId>) {
        let server = self.config.server;
        let gone: Vec<(u16, u16)> = self
            .shares
            .iter()
            .filter(|((owner, _), share)| match ended {
                Some(s) => share.session == s || share.borrowers.contains_key(&s),
                None => share.borrowers.iter().any(|(session, writable)| {
                    let Some(me) = self.sessions.get(session).copied() else {
                        return true;
                    };
                    let (read, write) =
                        self.may_map(Uid::new(server, me), Uid::new(server, *owner));
                    !read || (*writable && !write)
                }),
            })
            .map(|(k, _)| *k)
            .collect();
        for (owner, id) in gone {
            self.shares.remove(&(owner, id));
            tracing::info!(owner, id, "shared memory withdrawn");
            self.actions.push_back(Action::Withdraw { owner, id });
        }
    }

    /// What the rules let `src` do to `dst`'s memory: (read, write). A
    /// mapping cannot be write-only, so write needs read.
    pub(super) fn may_map(&self, src: Uid, dst: Uid) -> (bool, bool) {
        let read = self.config.allows(src, dst, ReqType::Read);
        (read, read && self.config.allows(src, dst, ReqType::Write))
    }

    /// Takes back the grants the rules no longer allow (all of them when
    /// `ended` is the session that ended).
    pub(super) fn revoke_grants(&mut self, ended: Option<SessionId>) {
        self.revoke_shares(ended);
        let server = self.config.server;
        let gone: Vec<(SessionId, u16)> = self
            .grants
            .iter()
            .filter(|((session, device), writable)| {
                if ended.is_some() {
                    return ended == Some(*session);
                }
                let me = self.sessions.get(session).copied();
                let dst = self.resources.get(device).map(|r| r.uid);
                match (me, dst) {
                    (Some(me), Some(dst)) => {
                        let (read, write) = self.may_map(Uid::new(server, me), dst);
                        !read || (**writable && !write)
                    }
                    _ => true,
                }
            })
            .map(|(k, _)| *k)
            .collect();
        for (session, device) in gone {
            self.grants.remove(&(session, device));
            self.actions.push_back(Action::Unmap { session, device });
        }
    }

    pub(super) fn client_closed(&mut self, session: SessionId) {
        self.revoke_grants(Some(session));
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
