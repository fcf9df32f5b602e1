//! What the plane must hold for the state, and the connectionless rules.

use super::*;

impl Control {
    /// Everything the plane must hold for the current state.
    pub fn picture(&self) -> PlaneImage {
        let mut img = PlaneImage::default();
        let local: Vec<Route> = self
            .resources
            .values()
            .map(|r| Route::exact(r.uid, r.port))
            .collect();
        let tunnel0 = |s: &Ipv4Addr| {
            self.peers
                .get(s)
                .filter(|p| p.alive())
                .and_then(|p| p.tunnel(0))
        };
        // Neighbours through their tunnels; servers beyond them through
        // the neighbour they are reached by.
        let servers: Vec<Route> = self
            .peers
            .keys()
            .filter_map(|s| Some(Route::server(*s, tunnel0(s)?)))
            .chain(self.config.remotes.iter().filter_map(|r| {
                (!self.peers.contains_key(&r.server))
                    .then_some(())
                    .and_then(|()| Some(Route::server(r.server, tunnel0(&r.via)?)))
            }))
            .collect();
        for r in self.resources.values() {
            let mut port = PortImage::default();
            for route in local.iter().chain(&servers) {
                port.route(*route);
            }
            for mh in &self.config.routes {
                let via = self.resources.values().find(|x| x.name == mh.via);
                let Some(via) = via.map(|v| v.port) else {
                    continue;
                };
                if r.port != via
                    && r.kind != ResourceKind::Daemon
                    && (mh.from == "*" || mh.from == r.name)
                {
                    port.route(Route {
                        key: mh.to.key,
                        mask: mh.to.mask,
                        priority: 10,
                        port: via,
                    });
                }
            }
            let trusted = matches!(
                r.kind,
                ResourceKind::Daemon | ResourceKind::Device { relay: true, .. }
            );
            if trusted {
                port.rules.push(AclRule::ALLOW_ALL);
            }
            port.rules.extend(self.connectionless.iter().copied());
            img.ports.insert(r.port, port);
        }
        for t in self.inbound.values() {
            let mut port = PortImage::default();
            // Local resources, and the servers it may carry on to (only
            // what the ACL lets in goes anywhere: connections installed
            // here, and what the policy allows connectionless).
            for route in local.iter().chain(&servers) {
                port.route(*route);
            }
            port.rules.extend(self.connectionless.iter().copied());
            img.ports.insert(t.port, port);
        }
        for p in self.peers.values() {
            for t in p.tunnels.values() {
                if let Tunnel::Open(id) = t {
                    let mut port = PortImage::default();
                    port.rules.push(AclRule::ALLOW_ALL);
                    img.ports.insert(*id, port);
                }
            }
        }
        // (connection, class, neighbour towards src or dst, neighbour
        // towards dst when carried on here).
        let open = self
            .connections
            .values()
            .map(|c| (c.key, c.class, c.peer, c.transit));
        // A connection we ask a peer to admit is admitted here before the
        // peer is asked: once the peer admits it, its end may send at
        // once, and that traffic must find its way in (see `ask_peer`).
        let asking = self
            .pending
            .iter()
            .filter(|(_, p)| matches!(p.stage, Stage::Verdict { .. }))
            .map(|(k, p)| match p.from {
                Some(from) => (*k, p.class, Some(from), Some(p.hop)),
                None => (*k, p.class, Some(p.hop), None),
            });
        for (key, class, peer, transit) in open.chain(asking) {
            for end in [key.src, key.dst] {
                if end.server() != self.config.server {
                    continue;
                }
                if let Some(r) = self.resources.get(&end.device()) {
                    if let Some(port) = img.ports.get_mut(&r.port) {
                        port.allows.insert(key);
                    }
                }
            }
            let Some(server) = peer else {
                continue;
            };
            for t in self
                .inbound
                .values()
                .filter(|t| t.from == server || Some(t.from) == transit)
            {
                if let Some(port) = img.ports.get_mut(&t.port) {
                    port.allows.insert(key);
                }
            }
            if let Some(next) = transit {
                // Carried on: steered into the next hop's tunnel of its
                // class (else it takes the server route, class 0).
                if let Some(t) = self.peers.get(&next).and_then(|p| p.tunnel(class)) {
                    img.translations.insert(key, t);
                }
                continue;
            }
            // A configured multi-hop route decides the path itself
            // (through its relay, then the server route); otherwise the
            // translator steers the connection into its class's tunnel.
            let ours = key.src.server() == self.config.server;
            if ours && !self.multi_hop_covers(key) {
                if let Some(t) = self.peers.get(&server).and_then(|p| p.tunnel(class)) {
                    img.translations.insert(key, t);
                }
            }
        }
        img
    }

    /// Whether a configured multi-hop route carries `key`'s traffic.
    pub(super) fn multi_hop_covers(&self, key: ConnKey) -> bool {
        let src_name = self
            .resources
            .get(&key.src.device())
            .map(|r| r.name.as_str());
        self.config
            .routes
            .iter()
            .any(|r| r.to.matches(key.dst) && (r.from == "*" || src_name == Some(r.from.as_str())))
    }
}

/// Access rules every port gets: one-sided requests follow the
/// configured policy, and each rule that lets S ask D lets D answer S —
/// an answer passes only where its request could have, so nobody can push
/// a completion (a READ_CMPL carries data into memory) unasked. Answers on
/// a connection pass with the connection.
pub(super) fn connectionless_rules(config: &ControlConfig) -> Vec<AclRule> {
    let one_sided = [
        ReqType::Write,
        ReqType::Read,
        ReqType::Flush,
        ReqType::Copy,
        ReqType::CopyWrite,
    ];
    let answers = |types: &[ReqType]| -> Vec<ReqType> {
        let mut a: Vec<ReqType> = types.iter().filter_map(|t| t.answer()).collect();
        a.dedup();
        a
    };
    let mut rules = Vec::new();
    let push = |rules: &mut Vec<AclRule>, rule: AclRule, types: &[ReqType]| {
        rules.push(AclRule {
            types: TypeSet::of(types),
            ..rule
        });
        rules.push(AclRule {
            src: rule.dst,
            src_mask: rule.dst_mask,
            dst: rule.src,
            dst_mask: rule.src_mask,
            types: TypeSet::of(&answers(types)),
            ..rule
        });
    };
    for r in &config.rules {
        let types: Vec<ReqType> = match &r.types {
            Some(t) => t
                .iter()
                .copied()
                .filter(|t| one_sided.contains(t))
                .collect(),
            None => one_sided.to_vec(),
        };
        let rule = AclRule {
            src: r.src.key,
            src_mask: r.src.mask,
            dst: r.dst.key,
            dst_mask: r.dst.mask,
            types: TypeSet::of(&[]),
            allow: r.allow,
        };
        push(&mut rules, rule, &types);
    }
    match config.default_action {
        DefaultAction::Allow => push(&mut rules, AclRule::ALLOW_ALL, &one_sided),
        DefaultAction::AllowLocal => {
            let here = Uid::new(config.server, 0);
            let server_mask = Uid::MASK & !0xffff;
            let rule = AclRule {
                src: here,
                src_mask: server_mask,
                dst: here,
                dst_mask: server_mask,
                types: TypeSet::of(&[]),
                allow: true,
            };
            push(&mut rules, rule, &one_sided);
        }
        DefaultAction::Deny => {}
    }
    rules
}
