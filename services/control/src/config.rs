//! What the control core is told at start: who this server is, what it
//! hosts, who its peers are, the access policy, the multi-hop routes, the
//! failure detector's timing and the bounds on the state others create.

use std::net::Ipv4Addr;
use std::time::Duration;

use uniplane_dataplane::wire::ReqType;
use uniplane_dataplane::Uid;

/// A UID pattern: UIDs with `uid & mask == key & mask` match.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidMatch {
    /// The pattern's value.
    pub key: Uid,
    /// Which of the 48 bits must match (0: every UID).
    pub mask: u64,
}

impl UidMatch {
    /// Matches every UID.
    pub const ANY: UidMatch = UidMatch {
        key: Uid::from_bytes([0; 6]),
        mask: 0,
    };

    /// Whether `uid` matches.
    pub fn matches(&self, uid: Uid) -> bool {
        (uid.to_u64() ^ self.key.to_u64()) & self.mask == 0
    }
}

/// One access rule; the first that matches decides.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessRule {
    /// Who sends.
    pub src: UidMatch,
    /// Who receives.
    pub dst: UidMatch,
    /// Request types covered (`None`: all).
    pub types: Option<Vec<ReqType>>,
    /// Allow or deny.
    pub allow: bool,
}

/// What happens when no rule matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DefaultAction {
    /// Everything is allowed.
    Allow,
    /// Everything is denied.
    Deny,
    /// Traffic between resources of this server is allowed; the rest denied.
    AllowLocal,
}

/// A device the daemon hosts (its port is attached at start).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceSpec {
    /// Its name (routes name devices by it).
    pub name: String,
    /// A fixed device number, or the next free one.
    pub device: Option<u16>,
    /// A relay forwards what the overlay admitted at the sender's port and
    /// does not judge it again.
    pub relay: bool,
    /// A label for listings (`echo`, `memory`, `relay`).
    pub label: String,
    /// Whether local processes may map its memory (a host memory device).
    pub mappable: bool,
    /// A kernel device chained to another device: the core keeps a
    /// connection open from this device to `next` (ports [`CHAIN_PORT`]),
    /// reopening it while it is down, and reports it with
    /// [`crate::Action::Chain`].
    pub next: Option<NextHop>,
}

/// Where a chained device sends on what it computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextHop {
    /// The next device (on this server or a peer's).
    pub uid: Uid,
    /// The traffic class (tunnel) across servers.
    pub class: u8,
}

/// The port at both ends of a chain's connection (just below the
/// ephemeral ports, which devices never take).
pub const CHAIN_PORT: u16 = 49151;

/// A configured multi-hop route: traffic from `from` to `to` goes through
/// the relay device `via`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiHopRoute {
    /// Source resource name, or `*` for every local resource but the relay.
    pub from: String,
    /// The relay device's name.
    pub via: String,
    /// Destination pattern.
    pub to: UidMatch,
}

/// A server that is not a neighbour, reached through one (a transit
/// server: its daemon forwards from one tunnel to the next).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RemoteSpec {
    /// The far server.
    pub server: Ipv4Addr,
    /// The neighbour (a configured peer) its traffic goes through.
    pub via: Ipv4Addr,
}

/// A neighbouring server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerSpec {
    /// Its server ID.
    pub server: Ipv4Addr,
    /// Largest payload its tunnels carry (the tunnel port's MTU).
    pub tunnel_mtu: usize,
    /// The stack its tunnels use, for listings.
    pub stack: String,
    /// Traffic classes it may open connections in.
    pub classes: Vec<u8>,
}

/// Bounds on the state clients and peers can make the core keep. Past a
/// bound a request gets [`crate::ControlError::Limit`]; nothing grows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Local resources (daemon, devices and processes).
    pub resources: usize,
    /// Open connections plus connections being set up.
    pub connections: usize,
    /// Connections to one peer waiting for its verdict or a tunnel.
    pub pending_per_peer: usize,
    /// Open connections one peer has asked for: no peer can take the
    /// whole of `connections` from local applications and other peers.
    pub connections_per_peer: usize,
    /// Ports one resource listens on.
    pub listening_per_resource: usize,
    /// Peers, the configured ones and those the directory adds.
    pub peers: usize,
    /// Shared memory regions one resource lends its peers on this server
    /// ([`crate::ClientRequest::Share`]).
    pub shared_per_resource: usize,
    /// MiB of shared memory all resources together lend (the daemon
    /// makes the memfds).
    pub shared_mib: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            resources: 256,
            connections: 4096,
            pending_per_peer: 64,
            connections_per_peer: 1024,
            listening_per_resource: 1024,
            peers: 1024,
            shared_per_resource: 64,
            shared_mib: 1024,
        }
    }
}

/// Everything the control core needs to know at start.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// This server's ID.
    pub server: Ipv4Addr,
    /// A human name.
    pub name: String,
    /// Devices hosted here.
    pub devices: Vec<DeviceSpec>,
    /// Neighbours.
    pub peers: Vec<PeerSpec>,
    /// Multi-hop routes.
    pub routes: Vec<MultiHopRoute>,
    /// Access rules, first match wins.
    pub rules: Vec<AccessRule>,
    /// What happens when no rule matches.
    pub default_action: DefaultAction,
    /// Interval between heartbeats to each peer.
    pub heartbeat: Duration,
    /// Heartbeat intervals of silence that declare a peer failed.
    pub misses: u32,
    /// How long a peer has to answer a connection request.
    pub verdict_timeout: Duration,
    /// Bounds on the state others create.
    pub limits: Limits,
    /// The traffic classes connections may name (a class is a tunnel per
    /// peer, and a queue of its underlay).
    pub classes: Vec<u8>,
    /// Servers reached through a peer.
    pub remotes: Vec<RemoteSpec>,
}

impl ControlConfig {
    /// A configuration for `server` with nothing hosted, no peers, every
    /// access allowed, a 100 ms heartbeat, 5 misses and a 2 s verdict
    /// timeout.
    pub fn new(server: Ipv4Addr) -> ControlConfig {
        ControlConfig {
            server,
            name: server.to_string(),
            devices: Vec::new(),
            peers: Vec::new(),
            routes: Vec::new(),
            rules: Vec::new(),
            default_action: DefaultAction::Allow,
            heartbeat: Duration::from_millis(100),
            misses: 5,
            verdict_timeout: Duration::from_secs(2),
            limits: Limits::default(),
            classes: (0..8).collect(),
            remotes: Vec::new(),
        }
    }

    /// Whether the policy lets `src` open or use a connection to `dst`
    /// with requests of type `kind`.
    pub fn allows(&self, src: Uid, dst: Uid, kind: ReqType) -> bool {
        for r in &self.rules {
            let typed = r.types.as_ref().is_none_or(|t| t.contains(&kind));
            if r.src.matches(src) && r.dst.matches(dst) && typed {
                return r.allow;
            }
        }
        match self.default_action {
            DefaultAction::Allow => true,
            DefaultAction::Deny => false,
            DefaultAction::AllowLocal => src.server() == self.server && dst.server() == self.server,
        }
    }

    /// Silence after which a peer is declared failed.
    pub fn failure_after(&self) -> Duration {
        self.heartbeat * self.misses.max(1)
    }
}
