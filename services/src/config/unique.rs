//! What must not appear twice in a file: device numbers and names, peer
//! server IDs, stacks, and the addresses the daemon listens on. The second
//! place is refused and the error names the first, so a file that would
//! have a device silently renumbered, or a listener fail to bind at start,
//! is refused by `uniplaned --check`.

use std::collections::HashMap;
use std::hash::Hash;
use std::net::SocketAddr;
use std::ops::Range;

use super::{ConfigError, Source};

/// Refuses the second of two equal keys in `items` (key, where it is),
/// naming both places; `what` says what the key is.
pub(super) fn refuse_duplicates<K: Eq + Hash>(
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
pub(super) struct Listener {
    /// The field that names it.
    pub field: &'static str,
    /// The address.
    pub addr: SocketAddr,
    /// Where the file names it; `None`: the field's default.
    pub span: Option<Range<usize>>,
    /// The kernel's namespace of ports it binds in (`TCP`, `UDP`), or
    /// `None` for a stack that binds no kernel socket.
    pub transport: Option<&'static str>,
}

/// The kernel ports a stack's tunnel listener binds in.
pub(super) fn stack_transport(stack: &str) -> Option<&'static str> {
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
pub(super) fn refuse_overlapping_listeners(
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
