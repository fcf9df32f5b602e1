//! Transit: connections between two other servers that this server
//! carries on from one neighbour's tunnel to the next (a route A → B → C
//! where B only forwards).
//!
//! A server that is not a neighbour is reached through one
//! ([`crate::RemoteSpec`]). The calling side asks its next hop, as it
//! would ask the destination; a next hop that is not the destination
//! checks its own policy, installs the connection at both neighbours'
//! tunnels (before it asks on, as a caller installs its end: the
//! acceptor's first message must find its way), asks its own next hop,
//! and answers the neighbour that asked with what it was told. A close
//! from either side is passed on to the other; a neighbour that fails
//! closes what went through it and tells the other side (`PeerFailed`),
//! so the ends' owners hear of it.

use super::*;

impl Control {
    /// The neighbour through which `server` is reached: itself when it is
    /// a peer, else the configured one.
    pub(super) fn hop_to(&self, server: Ipv4Addr) -> Option<Ipv4Addr> {
        if self.peers.contains_key(&server) {
            return Some(server);
        }
        self.config
            .remotes
            .iter()
            .find(|r| r.server == server)
            .map(|r| r.via)
            .filter(|via| self.peers.contains_key(via))
    }

    /// Neighbour `from` asks us to carry `key` on towards its destination.
    pub(super) fn carry_on(
        &mut self,
        from: Ipv4Addr,
        key: ConnKey,
        class: u8,
        request: RequestId,
    ) -> Result<(), ControlError> {
        if key.src.server() == self.config.server {
            return Err(ControlError::Refused(
                "a connection from this server cannot come from a neighbour".into(),
            ));
        }
        let hop = self.hop_to(key.dst.server()).ok_or_else(|| {
            ControlError::NoRoute(format!("no route from here to {}", key.dst.server()))
        })?;
        if hop == from || self.hop_to(key.src.server()) != Some(from) {
            return Err(ControlError::Refused(format!(
                "{} is not reached through {from} here, or {} is",
                key.src.server(),
                key.dst.server()
            )));
        }
        if !self.peers.get(&from).is_some_and(Peer::alive) {
            return Err(ControlError::PeerDown(format!(
                "no channel from here to {from} yet"
            )));
        }
        if !self.config.allows(key.src, key.dst, ReqType::Connect) {
            return Err(ControlError::Refused(format!(
                "policy denies {} → {} through {}",
                key.src, key.dst, self.config.server
            )));
        }
        self.class_allowed(class, Some(hop))?;
        if let Some(c) = self.connections.get(&key) {
            if c.peer == Some(from) && c.transit == Some(hop) {
                // Asked again (its answer was lost): carried already.
                self.answer(request, Ok(Reply::Done));
                return Ok(());
            }
        }
        if self.canonical(key).is_some() || self.pending.contains_key(&key) {
            return Err(ControlError::Exists);
        }
        if self.connections.len() + self.pending.len() >= self.config.limits.connections {
            return Err(ControlError::Limit("connections"));
        }
        let through = self
            .connections
            .values()
            .filter(|c| c.peer == Some(from) && c.transit.is_some())
            .count();
        if through >= self.config.limits.connections_per_peer {
            return Err(ControlError::Limit("connections from one peer"));
        }
        tracing::debug!(src = %key.src, dst = %key.dst, %from, %hop, "carrying a connection on");
        self.ask_through(None, Some(from), request, key, class, hop)
    }

    /// The next hop admitted `key`, which neighbour `from` asked us to
    /// carry on: it is open here, and `from` is told.
    pub(super) fn carried_on(&mut self, key: ConnKey, p: Pending, from: Ipv4Addr, hop: Ipv4Addr) {
        if !self.peers.get(&from).is_some_and(Peer::alive) {
            // The side that asked went away meanwhile.
            self.actions.push_back(Action::ToPeer {
                server: hop,
                msg: PeerMsg::Close {
                    conn: key,
                    status: Status::PeerFailed,
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
                peer: Some(from),
                transit: Some(hop),
                since: self.now,
            },
        );
        tracing::info!(src = %key.src, dst = %key.dst, %from, %hop, "connection carried on");
        self.sync(Then {
            ok: vec![Action::Answer {
                request: p.request,
                result: Ok(Reply::Done),
            }],
            undo: Undo::Connection(key),
            fail: Some(p.request),
            ..Then::nothing()
        });
    }

    /// Stops waiting to carry `key` on (the neighbour that asked gave up
    /// or failed): the next hop, if asked, lets go. The caller syncs.
    pub(super) fn give_up_carrying(&mut self, key: ConnKey) {
        let Some(p) = self.pending.remove(&key) else {
            return;
        };
        if matches!(p.stage, Stage::Verdict { .. }) {
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
