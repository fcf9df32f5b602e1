//! What the tests that run two peered daemons share.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;

/// The configuration of server `me` (peer channel on `peer_listen`, its
/// `stack` tunnels on `tunnel`) peered with `other` (server, peer
/// address, tunnel address) under the cluster secret in `secret`: a fast
/// heartbeat, every access allowed.
pub fn peered_config(
    stack: &str,
    me: Ipv4Addr,
    peer_listen: SocketAddr,
    tunnel: SocketAddr,
    other: (Ipv4Addr, SocketAddr, SocketAddr),
    secret: &Path,
) -> String {
    format!(
        r#"
[server]
id = "{me}"
peer_listen = "{peer_listen}"

[[stacks]]
name = "{stack}"
listen = "{tunnel}"

[[peers]]
server = "{}"
address = "{}"
tunnel = "{}"
stack = "{stack}"

[failure]
heartbeat_ms = 50
misses = 20

[policy]
default = "allow"

[cluster]
secret = "{}"
"#,
        other.0,
        other.1,
        other.2,
        secret.display()
    )
}
