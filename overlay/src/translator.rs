//! Stack translators: many overlay connections over one stack tunnel.
//!
//! Overlay messages carry their UIDs and ports, so many connections share
//! one tunnel (one per traffic class and peer) with no extra header: the
//! sending side steers each active connection's messages into its tunnel,
//! and the receiving side steers them out of it to the connection's local
//! port. An entry exists only while its connection is active; the control
//! plane installs it at setup and removes it at close, so a message of a
//! closed connection finds none and falls back to the forwarding table and
//! access control, which refuse it.

use rustc_hash::FxHashMap;

use crate::acl::ConnKey;
use crate::PortId;

/// Connection → output port entries, both directions of each connection.
#[derive(Clone, Debug, Default)]
pub struct Translator {
    entries: FxHashMap<ConnKey, PortId>,
}

impl Translator {
    /// No entries.
    pub fn new() -> Self {
        Self::default()
    }

    /// Steers `conn` to `out`. The reverse direction is not implied: on
    /// one server the two directions leave through different ports.
    pub fn insert(&mut self, conn: ConnKey, out: PortId) {
        self.entries.insert(conn, out);
    }

    /// Every entry, sorted by connection.
    pub fn entries(&self) -> Vec<(ConnKey, PortId)> {
        let mut out: Vec<(ConnKey, PortId)> = self.entries.iter().map(|(c, p)| (*c, *p)).collect();
        out.sort_by_key(|(c, _)| (c.src.to_u64(), c.src_port, c.dst.to_u64(), c.dst_port));
        out
    }

    /// Removes `conn`'s entry; whether there was one.
    pub fn remove(&mut self, conn: ConnKey) -> bool {
        self.entries.remove(&conn).is_some()
    }

    /// Keeps only the entries `keep` approves.
    pub fn retain(&mut self, mut keep: impl FnMut(&ConnKey, PortId) -> bool) {
        self.entries.retain(|k, v| keep(k, *v));
    }

    /// Active connections steered.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no connection is steered.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The port `conn`'s messages leave through, if it is active.
    #[inline]
    pub fn lookup(&self, conn: &ConnKey) -> Option<PortId> {
        if self.entries.is_empty() {
            return None;
        }
        self.entries.get(conn).copied()
    }
}
