//! What must not appear twice in a file: device numbers and names, peer
//! server IDs, stacks, and the addresses the daemon listens on. The second
//! place is refused and the error names the first, so a file that would
//! have a device silently renumbered, or a listener fail to bind at start,
//! is refused by `uniplaned --check`.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::SocketAddr;
use std::ops::Range;

use super::{Config, ConfigError, RawConfig, Source};

/// Refuses what must not appear twice in `raw` (read into `config`):
/// device numbers and names, peer server IDs (and a peer that is this
/// server), stacks, and listeners that cannot bind together.
pub(super) fn refuse_clashes(
    src: &Source<'_>,
    raw: &RawConfig,
    config: &Config,
) -> Result<(), ConfigError> {
    refuse_duplicates(
        src,
        "stacks.name",
        raw.stacks.iter().map(|s| (s.name.get_ref(), s.name.span())),
        |n| format!("stack `{n}`"),
    )?;
    refuse_duplicates(
        src,
        "devices.name",
        raw.devices
            .iter()
            .map(|d| (d.name.get_ref(), d.name.span())),
        |n| format!("device name `{n}`"),
    )?;
    refuse_duplicates(
        src,
        "devices.device",
        raw.devices
            .iter()
            .filter_map(|d| d.device.as_ref())
            .map(|n| (*n.get_ref(), n.span())),
        |n| format!("device number {n}"),
    )?;
    refuse_duplicates(
        src,
        "peers.server",
        raw.peers
            .iter()
            .zip(&config.peers)
            .map(|(r, p)| (p.server, r.server.span())),
        |s| format!("peer server {s}"),
    )?;
    if let Some((r, p)) = raw
        .peers
        .iter()
        .zip(&config.peers)
        .find(|(_, p)| p.server == config.server)
    {
        return src.invalid(
            r.server.span(),
            "peers.server",
            format!("{} is this server's own ID (`server.id`)", p.server),
        );
    }
    let mut listeners = vec![Listener {
        field: "server.peer_listen",
        addr: config.peer_listen,
        span: raw.server.peer_listen.as_ref().map(|a| a.span()),
        transport: Some("TCP"),
    }];
    if let (Some(addr), Some(text)) = (config.metrics, raw.runtime.metrics.as_ref()) {
        listeners.push(Listener {
            field: "runtime.metrics",
            addr,
            span: Some(text.span()),
            transport: Some("TCP"),
        });
    }
    for (s, raw_stack) in config.stacks.iter().zip(&raw.stacks) {
        if let (Some(addr), Some(text)) = (s.listen, raw_stack.listen.as_ref()) {
            listeners.push(Listener {
                field: "stacks.listen",
                addr,
                span: Some(text.span()),
                transport: stack_transport(&s.name),
            });
        }
    }
    refuse_overlapping_listeners(src, &listeners)
}

/// Refuses the second of two equal keys in `items` (key, where it is),
/// naming both places; `what` says what the key is.
fn refuse_duplicates<K: Eq + Hash>(
    src: &Source<'_>,
    field: &str,
    items: impl IntoIterator<Item = (K, Range<usize>)>,
    what: impl Fn(&K) -> String,
) -> Result<(), ConfigError> {
    let mut first: HashMap<K, Range<usize>> = HashMap::new();
    for (key, span) in items {
        if let Some(before) = first.get(&key) {
            return src.conflict(
                span,
                field,
                format!("{} is used twice", what(&key)),
                format!("`{field}` at {}", src.place(before.clone())),
            );
        }
        first.insert(key, span);
    }
    Ok(())
}

/// A socket the daemon binds when it starts.
struct Listener {
    /// The field that names it.
    field: &'static str,
    /// The address.
    addr: SocketAddr,
    /// Where the file names it; `None`: the field's default.
    span: Option<Range<usize>>,
    /// The kernel's namespace of ports it binds in (`TCP`, `UDP`), or
    /// `None` for a stack that binds no kernel socket.
    transport: Option<&'static str>,
}

/// The kernel ports a stack's tunnel listener binds in.
fn stack_transport(stack: &str) -> Option<&'static str> {
    match stack {
        "tcp" => Some("TCP"),
        "udp" | "ltl" => Some("UDP"),
        _ => None,
    }
}

/// Whether binding `b` fails while `a` is bound: the same transport and
/// port (0 picks a free one, so never), and the same IP or a wildcard on
/// either side (`0.0.0.0:P` holds `P` on every address).
fn overlaps(a: &Listener, b: &Listener) -> bool {
    a.transport.is_some()
        && a.transport == b.transport
        && a.addr.port() != 0
        && a.addr.port() == b.addr.port()
        && (a.addr.ip() == b.addr.ip()
            || a.addr.ip().is_unspecified()
            || b.addr.ip().is_unspecified())
}

/// Refuses two listeners that cannot both bind, naming both places.
fn refuse_overlapping_listeners(
    src: &Source<'_>,
    listeners: &[Listener],
) -> Result<(), ConfigError> {
    let describe = |l: &Listener| match &l.span {
        Some(span) => format!("`{}` ({}) at {}", l.field, l.addr, src.place(span.clone())),
        None => format!("`{}` ({}, its default)", l.field, l.addr),
    };
    for (i, later) in listeners.iter().enumerate() {
        for earlier in &listeners[..i] {
            if !overlaps(earlier, later) {
                continue;
            }
            // Report at a place the file names; only defaults lack one.
            let (here, other) = if later.span.is_some() {
                (later, earlier)
            } else {
                (earlier, later)
            };
            let span = here.span.clone().unwrap_or_default();
            return src.conflict(
                span,
                here.field,
                format!(
                    "{} listener on {} overlaps another",
                    here.transport.unwrap_or_default(),
                    here.addr
                ),
                describe(other),
            );
        }
    }
    Ok(())
}
