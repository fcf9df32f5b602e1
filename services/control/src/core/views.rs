//! Read-only views for status and listings.

use super::*;

impl Control {
    /// The configuration it runs.
    pub fn config(&self) -> &ControlConfig {
        &self.config
    }

    /// The daemon's UID (device 0).
    pub fn uid(&self) -> Uid {
        Uid::new(self.config.server, DAEMON_DEVICE)
    }

    /// Time since the core started.
    pub fn uptime(&self, now: Duration) -> Duration {
        now.saturating_sub(self.started)
    }

    /// Local resources by device number.
    pub fn resources(&self) -> impl Iterator<Item = &Resource> {
        self.resources.values()
    }

    /// The resource of `device`.
    pub fn resource(&self, device: u16) -> Option<&Resource> {
        self.resources.get(&device)
    }

    /// Open connections.
    pub fn connections(&self) -> impl Iterator<Item = &Connection> {
        self.connections.values()
    }

    /// Connections being set up (waiting for a tunnel or a verdict).
    pub fn pending_connections(&self) -> impl Iterator<Item = &ConnKey> {
        self.pending.keys()
    }

    /// Connections waiting for their peer's verdict: their end here is
    /// installed (or being installed) before the peer is asked, so the
    /// plane admits them like open ones.
    pub fn asking_connections(&self) -> impl Iterator<Item = &ConnKey> {
        self.pending
            .iter()
            .filter(|(_, p)| matches!(p.stage, Stage::Verdict { .. }))
            .map(|(k, _)| k)
    }

    /// Peers, by server.
    pub fn peers(&self) -> Vec<PeerView> {
        self.peers
            .iter()
            .map(|(s, p)| PeerView {
                server: *s,
                stack: p.spec.stack.clone(),
                alive: p.alive(),
                failures: p.failures,
                tunnels: p
                    .tunnels
                    .iter()
                    .filter_map(|(c, t)| match t {
                        Tunnel::Open(port) => Some((*c, *port)),
                        Tunnel::Opening => None,
                    })
                    .collect(),
            })
            .collect()
    }

    /// Tunnels peers opened to us.
    pub fn inbound_tunnels(&self) -> Vec<InboundView> {
        self.inbound
            .iter()
            .map(|(id, t)| InboundView {
                tunnel: *id,
                from: t.from,
                class: t.class,
                port: t.port,
            })
            .collect()
    }

    /// The interconnection table: what each local resource reaches
    /// directly, through what, and the configured multi-hop routes.
    pub fn routes(&self) -> Vec<RouteRow> {
        let mut rows = Vec::new();
        for r in self.resources.values() {
            for other in self.resources.values().filter(|o| o.uid != r.uid) {
                rows.push(RouteRow {
                    from: r.uid.to_string(),
                    to: other.uid.to_string(),
                    via: "overlay".into(),
                    stack: "mem".into(),
                    hops: 1,
                });
            }
            for (server, p) in &self.peers {
                if p.alive() {
                    rows.push(RouteRow {
                        from: r.uid.to_string(),
                        to: format!("{server}:*"),
                        via: format!("tunnel port {}", p.tunnel(0).unwrap_or(0)),
                        stack: p.spec.stack.clone(),
                        hops: 1,
                    });
                }
            }
        }
        for remote in &self.config.remotes {
            let Some(p) = self.peers.get(&remote.via).filter(|p| p.alive()) else {
                continue;
            };
            rows.push(RouteRow {
                from: "*".into(),
                to: format!("{}:*", remote.server),
                via: format!(
                    "server {} (tunnel port {})",
                    remote.via,
                    p.tunnel(0).unwrap_or(0)
                ),
                stack: p.spec.stack.clone(),
                hops: 2,
            });
        }
        for route in &self.config.routes {
            rows.push(RouteRow {
                from: route.from.clone(),
                to: format!("{}/{:#x}", route.to.key, route.to.mask),
                via: route.via.clone(),
                stack: "relay".into(),
                hops: 2,
            });
        }
        rows
    }

    /// What the core knows the plane holds (what it submitted and the
    /// plane confirmed).
    pub fn installed(&self) -> &PlaneImage {
        &self.installed
    }

    /// Whether no batch is in flight (then [`Control::installed`] equals
    /// [`Control::picture`] unless the plane refused something).
    pub fn is_idle(&self) -> bool {
        self.job.is_none()
    }
}
