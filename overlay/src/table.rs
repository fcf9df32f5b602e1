//! The forwarding table of a connector: destination UID → output port.
//!
//! Entries are key/mask pairs on the 48-bit UID with a priority; the
//! highest-priority matching entry wins, and a default entry catches the
//! rest. A miss is the caller's to count and answer.
//!
//! Lookups are a hash probe per distinct mask, highest priority first, with
//! an early exit (tuple-space search): exact-UID entries — the common case —
//! cost one probe however many there are, so the table scales to tens of
//! thousands of entries without slowing it. Capacity is 32 by default, as in
//! DUA's hardware table, and configurable.

use rustc_hash::FxHashMap;
use uniplane_dataplane::Uid;

use crate::PortId;

/// Entries a table holds unless configured otherwise (as DUA's RTL).
pub const DEFAULT_CAPACITY: usize = 32;

/// One forwarding entry: UIDs with `uid & mask == key & mask` go to `port`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The UID pattern.
    pub key: Uid,
    /// Which of the 48 bits must match (`Uid::MASK` for one UID).
    pub mask: u64,
    /// Higher wins among matching entries.
    pub priority: u32,
    /// Output port.
    pub port: PortId,
}

impl Route {
    /// An entry for exactly `uid`.
    pub const fn exact(uid: Uid, port: PortId) -> Route {
        Route {
            key: uid,
            mask: Uid::MASK,
            priority: 0,
            port,
        }
    }

    /// An entry for every device of `server` (mask on the 32 server bits).
    pub fn server(server: std::net::Ipv4Addr, port: PortId) -> Route {
        Route {
            key: Uid::new(server, 0),
            mask: Uid::MASK & !0xffff,
            priority: 0,
            port,
        }
    }
}

/// Why a table refused a change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TableError {
    /// The table holds its capacity already.
    #[error("forwarding table full ({0} entries)")]
    Full(usize),
    /// No entry has that key and mask.
    #[error("no entry {key} mask {mask:#014x}")]
    NotFound {
        /// The key asked for.
        key: Uid,
        /// The mask asked for.
        mask: u64,
    },
    /// A mask with bits above the 48 of a UID.
    #[error("mask {0:#x} has bits above the 48 of a UID")]
    BadMask(u64),
}

#[derive(Clone, Debug)]
struct MaskGroup {
    mask: u64,
    max_priority: u32,
    entries: FxHashMap<u64, (u32, PortId)>,
}

/// A connector's forwarding table.
#[derive(Clone, Debug)]
pub struct ForwardingTable {
    capacity: usize,
    len: usize,
    /// One group per distinct mask, highest `max_priority` first.
    groups: Vec<MaskGroup>,
    default: Option<PortId>,
}

impl Default for ForwardingTable {
    fn default() -> Self {
        Self::new(DEFAULT_CAPACITY)
    }
}

impl ForwardingTable {
    /// An empty table of at most `capacity` entries.
    pub fn new(capacity: usize) -> Self {
        ForwardingTable {
            capacity,
            len: 0,
            groups: Vec::new(),
            default: None,
        }
    }

    /// Every entry (the default entry not included), highest priority
    /// first, then longer masks, then by key: the table as it forwards.
    pub fn routes(&self) -> Vec<Route> {
        let mut out: Vec<Route> = self
            .groups
            .iter()
            .flat_map(|g| {
                // Keys are stored masked to at most 48 bits: always a UID.
                g.entries.iter().filter_map(move |(key, (priority, port))| {
                    Some(Route {
                        key: Uid::from_u64(*key)?,
                        mask: g.mask,
                        priority: *priority,
                        port: *port,
                    })
                })
            })
            .collect();
        out.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(b.mask.count_ones().cmp(&a.mask.count_ones()))
                .then(a.key.to_u64().cmp(&b.key.to_u64()))
        });
        out
    }

    /// Where what no entry matches goes.
    pub fn default_route(&self) -> Option<PortId> {
        self.default
    }

    /// Entries held (the default entry not counted).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most entries held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Sets the port of UIDs no entry matches (`None`: they miss).
    pub fn set_default(&mut self, port: Option<PortId>) {
        self.default = port;
    }

    /// Adds `route`, replacing an entry with the same key and mask.
    pub fn insert(&mut self, route: Route) -> Result<(), TableError> {
        if route.mask & !Uid::MASK != 0 {
            return Err(TableError::BadMask(route.mask));
        }
        let key = route.key.to_u64() & route.mask;
        let gi = match self.groups.iter().position(|g| g.mask == route.mask) {
            Some(i) => i,
            None => {
                self.groups.push(MaskGroup {
                    mask: route.mask,
                    max_priority: 0,
                    entries: FxHashMap::default(),
                });
                self.groups.len() - 1
            }
        };
        let group = &mut self.groups[gi];
        if !group.entries.contains_key(&key) {
            if self.len == self.capacity {
                if group.entries.is_empty() {
                    self.groups.remove(gi);
                }
                return Err(TableError::Full(self.capacity));
            }
            self.len += 1;
        }
        group.entries.insert(key, (route.priority, route.port));
        group.max_priority = group.max_priority.max(route.priority);
        self.sort_groups();
        Ok(())
    }

    /// Removes the entry with `key` and `mask`.
    pub fn remove(&mut self, key: Uid, mask: u64) -> Result<Route, TableError> {
        let not_found = TableError::NotFound { key, mask };
        let gi = self
            .groups
            .iter()
            .position(|g| g.mask == mask)
            .ok_or(not_found.clone())?;
        let group = &mut self.groups[gi];
        let (priority, port) = group
            .entries
            .remove(&(key.to_u64() & mask))
            .ok_or(not_found)?;
        self.len -= 1;
        if group.entries.is_empty() {
            self.groups.remove(gi);
        } else {
            group.max_priority = group.entries.values().map(|e| e.0).max().unwrap_or(0);
            self.sort_groups();
        }
        Ok(Route {
            key,
            mask,
            priority,
            port,
        })
    }

    fn sort_groups(&mut self) {
        // Highest priority first; among equals, the more specific mask.
        self.groups.sort_by(|a, b| {
            b.max_priority
                .cmp(&a.max_priority)
                .then(b.mask.count_ones().cmp(&a.mask.count_ones()))
        });
    }

    /// The output port for `dst`: the best matching entry, else the
    /// default, else `None` (a miss).
    #[inline]
    pub fn lookup(&self, dst: Uid) -> Option<PortId> {
        let uid = dst.to_u64();
        let mut best: Option<(u32, PortId)> = None;
        for g in &self.groups {
            if let Some((p, _)) = best {
                if p >= g.max_priority {
                    break;
                }
            }
            if let Some(&(p, port)) = g.entries.get(&(uid & g.mask)) {
                if best.is_none_or(|(bp, _)| p > bp) {
                    best = Some((p, port));
                }
            }
        }
        best.map(|(_, port)| port).or(self.default)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    #[test]
    fn exact_entries_match_only_their_uid() {
        let mut t = ForwardingTable::default();
        t.insert(Route::exact(uid("10.0.0.1:1"), 3)).unwrap();
        assert_eq!(t.lookup(uid("10.0.0.1:1")), Some(3));
        assert_eq!(t.lookup(uid("10.0.0.1:2")), None);
    }

    #[test]
    fn masks_match_whole_servers_and_the_default_catches_the_rest() {
        let mut t = ForwardingTable::default();
        t.insert(Route::server(Ipv4Addr::new(10, 0, 0, 2), 5))
            .unwrap();
        t.set_default(Some(9));
        assert_eq!(t.lookup(uid("10.0.0.2:77")), Some(5));
        assert_eq!(t.lookup(uid("10.0.0.3:1")), Some(9));
    }

    #[test]
    fn the_highest_priority_match_wins() {
        let mut t = ForwardingTable::default();
        t.insert(Route {
            priority: 10,
            ..Route::server(Ipv4Addr::new(10, 0, 0, 2), 1)
        })
        .unwrap();
        t.insert(Route::exact(uid("10.0.0.2:5"), 2)).unwrap();
        assert_eq!(
            t.lookup(uid("10.0.0.2:5")),
            Some(1),
            "priority beats specificity"
        );
        t.insert(Route {
            priority: 20,
            ..Route::exact(uid("10.0.0.2:5"), 2)
        })
        .unwrap();
        assert_eq!(t.lookup(uid("10.0.0.2:5")), Some(2));
        assert_eq!(t.len(), 2, "same key and mask replaces");
    }

    #[test]
    fn capacity_is_enforced_and_removal_frees_room() {
        let mut t = ForwardingTable::new(2);
        t.insert(Route::exact(uid("1.1.1.1:1"), 1)).unwrap();
        t.insert(Route::exact(uid("1.1.1.1:2"), 1)).unwrap();
        assert_eq!(
            t.insert(Route::exact(uid("1.1.1.1:3"), 1)),
            Err(TableError::Full(2))
        );
        t.remove(uid("1.1.1.1:1"), Uid::MASK).unwrap();
        t.insert(Route::exact(uid("1.1.1.1:3"), 1)).unwrap();
        assert_eq!(t.lookup(uid("1.1.1.1:1")), None);
        assert!(matches!(
            t.remove(uid("9.9.9.9:9"), Uid::MASK),
            Err(TableError::NotFound { .. })
        ));
    }

    #[test]
    fn fifty_thousand_exact_entries_all_resolve() {
        let mut t = ForwardingTable::new(100_000);
        for i in 0..50_000u64 {
            t.insert(Route::exact(
                Uid::from_u64(i << 8).unwrap(),
                (i % 7) as PortId,
            ))
            .unwrap();
        }
        for i in (0..50_000u64).step_by(97) {
            assert_eq!(
                t.lookup(Uid::from_u64(i << 8).unwrap()),
                Some((i % 7) as PortId)
            );
        }
        assert_eq!(t.lookup(Uid::from_u64(1).unwrap()), None);
    }

    #[test]
    fn masks_above_48_bits_are_refused() {
        let mut t = ForwardingTable::default();
        let r = Route {
            mask: 1 << 50,
            ..Route::exact(uid("1.1.1.1:1"), 0)
        };
        assert_eq!(t.insert(r), Err(TableError::BadMask(1 << 50)));
    }
}
