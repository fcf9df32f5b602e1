//! Plane batches: one in flight, completions, rollback and repair.

use super::*;

impl Control {
    pub(super) fn batch_id(&mut self) -> BatchId {
        let b = self.next_batch;
        self.next_batch += 1;
        b
    }

    pub(super) fn answer(&mut self, request: RequestId, result: Result<Reply, ControlError>) {
        self.actions.push_back(Action::Answer { request, result });
    }

    pub(super) fn start_attach(&mut self, ops: Vec<PlaneOp>, purposes: Vec<Attaching>) {
        let batch = self.batch_id();
        self.actions.push_back(Action::Plane { batch, ops });
        self.job = Some(Job::Attach { batch, purposes });
    }

    /// Submits what the state calls for and the plane lacks (or holds in
    /// excess); `then` follows its completion.
    pub(super) fn sync(&mut self, then: Then) {
        if let Some(Job::Sync { then: running, .. }) = &mut self.job {
            // Only a repair can be running here (decisions wait for jobs):
            // the next sync after it covers this one.
            running.ok.extend(then.ok);
            return;
        }
        let target = self.picture();
        let ops = self.installed.diff(&target);
        if ops.is_empty() {
            self.finish(then);
            return;
        }
        let batch = self.batch_id();
        self.actions.push_back(Action::Plane {
            batch,
            ops: ops.clone(),
        });
        self.job = Some(Job::Sync { batch, ops, then });
    }

    pub(super) fn finish(&mut self, then: Then) {
        self.actions.extend(then.ok);
        if let Some((server, class)) = then.tunnel_ready {
            self.tunnel_ready(server, class);
        }
    }

    pub(super) fn plane_done(
        &mut self,
        batch: BatchId,
        results: Result<Vec<Result<OpResult, PlaneError>>, PlaneError>,
    ) {
        if self.job.as_ref().map(Job::batch) != Some(batch) {
            tracing::debug!(batch, "completion of an unknown batch ignored");
            return;
        }
        let Some(job) = self.job.take() else {
            return;
        };
        let n = match &job {
            Job::Attach { purposes, .. } => purposes.len(),
            Job::Sync { ops, .. } => ops.len(),
            Job::Policy { .. } => 1,
        };
        let results: Vec<Result<OpResult, PlaneError>> = match results {
            Ok(mut r) => {
                r.resize(n, Err(PlaneError::EngineGone));
                r
            }
            Err(e) => vec![Err(e); n],
        };
        match job {
            Job::Attach { purposes, .. } => self.attached(purposes, results),
            Job::Sync { ops, then, .. } => self.synced(ops, results, then),
            Job::Policy { request, .. } => {
                let result = match results.into_iter().next() {
                    Some(Ok(_)) => Ok(Reply::Done),
                    Some(Err(e)) => Err(ControlError::BadRequest(e.to_string())),
                    None => Err(ControlError::Plane(PlaneError::EngineGone)),
                };
                self.answer(request, result);
            }
        }
    }

    pub(super) fn synced(
        &mut self,
        ops: Vec<PlaneOp>,
        results: Vec<Result<OpResult, PlaneError>>,
        then: Then,
    ) {
        let mut failure = None;
        for (op, r) in ops.iter().zip(results) {
            let removal = matches!(
                op,
                PlaneOp::Detach(_)
                    | PlaneOp::RemoveRoute(..)
                    | PlaneOp::Revoke(..)
                    | PlaneOp::ClearRules(_)
                    | PlaneOp::RemoveTranslation(_)
            );
            match r {
                Ok(_) => self.installed.apply(op),
                // A removal of what is not there leaves what it wanted.
                Err(e) if removal && absent(&e) => self.installed.apply(op),
                Err(e) => {
                    tracing::warn!(?op, "plane refused: {e}");
                    failure.get_or_insert(e);
                }
            }
            if let PlaneOp::Detach(port) = op {
                self.actions.push_back(Action::PortGone { port: *port });
            }
        }
        let Some(e) = failure else {
            self.finish(then);
            return;
        };
        self.undo(then.undo, &e);
        if let Some(request) = then.fail {
            self.answer(request, Err(ControlError::Plane(e)));
        }
        if then.repair {
            // A repair the plane refused again waits for the next decision,
            // whose difference includes it: no loop against a stuck plane.
            return;
        }
        // Back to the picture of the rolled-back state.
        let target = self.picture();
        let ops = self.installed.diff(&target);
        if !ops.is_empty() {
            let batch = self.batch_id();
            self.actions.push_back(Action::Plane {
                batch,
                ops: ops.clone(),
            });
            self.job = Some(Job::Sync {
                batch,
                ops,
                then: Then {
                    repair: true,
                    ..Then::nothing()
                },
            });
        }
    }

    /// Takes back the decision of a batch the plane refused (`why`).
    pub(super) fn undo(&mut self, undo: Undo, why: &PlaneError) {
        match undo {
            Undo::Nothing => {}
            Undo::Asking(keys) => {
                // The peer was not asked yet: only the callers are told.
                for key in keys {
                    if let Some(p) = self.pending.remove(&key) {
                        self.answer(p.request, Err(ControlError::Plane(why.clone())));
                    }
                }
            }
            Undo::Resource(device) => {
                self.resources.remove(&device);
                self.sessions.retain(|_, d| *d != device);
            }
            Undo::Connection(key) => {
                if let Some(c) = self.connections.remove(&key) {
                    if let (Some(server), true) = (c.peer, key.src.server() == self.config.server) {
                        // The peer admitted its end already.
                        self.actions.push_back(Action::ToPeer {
                            server,
                            msg: PeerMsg::Close {
                                conn: key,
                                status: Status::Closed,
                            },
                        });
                    }
                }
            }
            Undo::TunnelOut { server, class } => {
                if let Some(p) = self.peers.get_mut(&server) {
                    p.tunnels.remove(&class);
                }
                self.fail_pending(server, Some(class));
                if class == 0 {
                    self.take_peer_down(server, Status::PeerFailed);
                    self.actions.push_back(Action::ClosePeerChannel { server });
                }
            }
            Undo::TunnelIn(tunnel) => {
                if self.inbound.remove(&tunnel).is_some() {
                    self.actions.push_back(Action::DropTunnel { tunnel });
                }
            }
        }
    }

    pub(super) fn attached(
        &mut self,
        purposes: Vec<Attaching>,
        results: Vec<Result<OpResult, PlaneError>>,
    ) {
        let mut then = Then::nothing();
        let mut ready = Vec::new();
        for (purpose, r) in purposes.into_iter().zip(results) {
            let port = match r {
                Ok(OpResult::Attached(p)) => Ok(p),
                Ok(OpResult::Done) => Err(PlaneError::EngineGone),
                Err(e) => Err(e),
            };
            if let Ok(p) = port {
                self.installed.ports.insert(p, PortImage::default());
            }
            match (purpose, port) {
                (Attaching::Daemon, Ok(port)) => {
                    self.register("daemon", ResourceKind::Daemon, Some(DAEMON_DEVICE), port);
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::Daemon,
                    });
                }
                (Attaching::Device(i), Ok(port)) => {
                    let d = self.config.devices[i].clone();
                    let kind = ResourceKind::Device {
                        label: d.label.clone(),
                        relay: d.relay,
                    };
                    let uid = self.register(&d.name, kind, d.device, port);
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::Device { name: d.name, uid },
                    });
                }
                (Attaching::Daemon | Attaching::Device(_), Err(e)) => {
                    tracing::error!("attaching a port at start: {e}");
                }
                (
                    Attaching::Process {
                        session,
                        request,
                        name,
                    },
                    Ok(port),
                ) => {
                    let uid = self.register(&name, ResourceKind::Process, None, port);
                    self.sessions.insert(session, uid.device());
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::Process { session, uid },
                    });
                    then.ok.push(Action::Answer {
                        request,
                        result: Ok(Reply::Attached { uid, port }),
                    });
                    then.undo = Undo::Resource(uid.device());
                    then.fail = Some(request);
                }
                (Attaching::Process { request, .. }, Err(e)) => {
                    self.answer(request, Err(ControlError::Resources(e.to_string())));
                }
                (Attaching::TunnelOut { server, class }, Ok(port)) => {
                    let now = self.now;
                    match self.peers.get_mut(&server) {
                        Some(p) => {
                            p.tunnels.insert(class, Tunnel::Open(port));
                            if class == 0 {
                                p.last_seen = now;
                                tracing::info!(%server, tunnel = port, "peer up");
                            }
                        }
                        None => continue,
                    }
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::TunnelOut { server, class },
                    });
                    then.tunnel_ready = Some((server, class));
                    then.undo = Undo::TunnelOut { server, class };
                }
                (Attaching::TunnelOut { server, class }, Err(e)) => {
                    tracing::warn!(%server, class, "tunnel port: {e}");
                    self.actions
                        .push_back(Action::CloseTunnel { server, class });
                    self.undo(Undo::TunnelOut { server, class }, &e);
                }
                (
                    Attaching::TunnelIn {
                        tunnel,
                        from,
                        class,
                    },
                    Ok(port),
                ) => {
                    let old: Vec<TunnelId> = self
                        .inbound
                        .iter()
                        .filter(|(_, t)| t.from == from && t.class == class)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in old {
                        self.inbound.remove(&id);
                        self.actions.push_back(Action::DropTunnel { tunnel: id });
                    }
                    self.inbound.insert(tunnel, Inbound { from, class, port });
                    ready.push(Action::PortReady {
                        port,
                        usage: PortUse::TunnelIn { tunnel },
                    });
                    then.undo = Undo::TunnelIn(tunnel);
                    tracing::info!(%from, class, port, "inbound tunnel up");
                }
                (Attaching::TunnelIn { tunnel, .. }, Err(e)) => {
                    tracing::warn!("inbound tunnel port: {e}");
                    self.actions.push_back(Action::DropTunnel { tunnel });
                }
            }
        }
        // The driver learns what a port is for before its entries go in.
        self.actions.extend(ready);
        self.sync(then);
    }

    /// Whether a device number is taken, or still named by a connection.
    fn device_in_use(&self, device: u16) -> bool {
        let local = |u: Uid| u.server() == self.config.server && u.device() == device;
        device == DAEMON_DEVICE
            || self.resources.contains_key(&device)
            || self
                .connections
                .keys()
                .chain(self.pending.keys())
                .any(|k| local(k.src) || local(k.dst))
    }

    /// Adds a local resource on `port` under `device` when free, else the
    /// next free device number.
    pub(super) fn register(
        &mut self,
        name: &str,
        kind: ResourceKind,
        device: Option<u16>,
        port: PortId,
    ) -> Uid {
        let device = match device {
            Some(d) if !self.resources.contains_key(&d) => d,
            _ => {
                // Round robin, skipping numbers still named by a
                // connection: a number is not handed out again while
                // anything of its last owner may remain, so no stale
                // notice or entry can reach the next owner.
                while self.device_in_use(self.next_device) {
                    self.next_device = self.next_device.wrapping_add(1).max(1);
                }
                let d = self.next_device;
                self.next_device = d.wrapping_add(1).max(1);
                d
            }
        };
        let uid = Uid::new(self.config.server, device);
        tracing::info!(%uid, name, ?kind, port, "resource registered");
        self.resources.insert(
            device,
            Resource {
                name: name.to_owned(),
                kind,
                uid,
                port,
                listening: BTreeSet::new(),
            },
        );
        uid
    }
}

/// Whether a plane error says the entry or port is not there.
pub(super) fn absent(e: &PlaneError) -> bool {
    matches!(
        e,
        PlaneError::NoSuchPort(_)
            | PlaneError::NoTranslation(_)
            | PlaneError::Table(uniplane_overlay::table::TableError::NotFound { .. })
    )
}

pub(super) fn device_spec(name: &str) -> PortSpec {
    PortSpec {
        kind: PortKind::Device,
        name: name.to_owned(),
        mtu: Message::MAX_PAYLOAD,
    }
}
