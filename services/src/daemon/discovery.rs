//! Peers from the naming service's directory (`[registry] discover`):
//! the servers' records are watched, [`Roster`] decides who joins and who
//! leaves, and the driver makes them peers of the core and dials them.
//!
//! A discovered peer is reached over the first of this daemon's stacks
//! (in `[[stacks]]` order) whose tunnel listener the record lists, with
//! the default ingress rules (its own resources as sources); it must
//! prove the cluster secret like any peer.

use std::sync::Arc;
use std::time::Duration;

use crate::config::{IngressRules, PeerConfig, RegistryConfig};
use crate::naming::roster::{Roster, RosterAction, ServerRecord};

use super::{Input, Shared};

/// Starts watching the directory when the configuration asks for it.
pub(super) fn start(shared: &Arc<Shared>) {
    let (Some(naming), RegistryConfig::Etcd(etcd)) = (&shared.naming, &shared.config.registry)
    else {
        return;
    };
    if !etcd.discover {
        return;
    }
    // A record gone for two leases and the failure timeout is a server
    // gone; one back sooner lost its lease for a moment.
    let grace = etcd.lease_ttl * 2 + shared.config.heartbeat * shared.config.misses;
    let roster = Roster::new(shared.server, grace, shared.config.limits.peers);
    let events = naming.watch_servers();
    tokio::spawn(run(shared.clone(), roster, events));
}

async fn run(
    shared: Arc<Shared>,
    mut roster: Roster,
    mut events: tokio::sync::mpsc::Receiver<crate::naming::roster::RosterEvent>,
) {
    let started = tokio::time::Instant::now();
    loop {
        let wake = roster
            .poll_timeout()
            .map_or(started + Duration::from_secs(86_400), |t| started + t);
        tokio::select! {
            event = events.recv() => {
                let Some(event) = event else { return };
                roster.handle(event, started.elapsed());
            }
            _ = tokio::time::sleep_until(wake) => roster.handle_timeout(started.elapsed()),
        }
        while let Some(action) = roster.poll_action() {
            let input = match action {
                RosterAction::Join(server, record) => match peer_config(&shared, server, &record) {
                    Some(peer) => Input::PeerFound { peer },
                    None => {
                        tracing::warn!(%server, "directory: no stack of ours reaches this server's tunnels");
                        continue;
                    }
                },
                RosterAction::Leave(server) => Input::PeerLost { server },
            };
            shared.input(input).await;
        }
    }
}

/// How to reach a server its record describes.
fn peer_config(
    shared: &Shared,
    server: std::net::Ipv4Addr,
    record: &ServerRecord,
) -> Option<PeerConfig> {
    let (stack, tunnel) = shared
        .config
        .stacks
        .iter()
        .find_map(|s| Some((s.name.clone(), *record.tunnels.get(&s.name)?)))?;
    Some(PeerConfig {
        server,
        address: record.peer_listen,
        stack,
        tunnel,
        mac: None,
        pins: Vec::new(),
        ingress: IngressRules::default_for(server, &shared.config.underlay),
    })
}
