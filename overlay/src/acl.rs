//! Access control of a connector: what may enter the overlay through it.
//!
//! Two kinds of permission, both installed by the control plane:
//! - **connections**: a (source, destination) pair of endpoints. A message
//!   of the port layout passes when its (src UID, src port, dst UID, dst
//!   port) is an installed connection; one-sided memory requests match a
//!   connection with ports 0. Installing a connection admits both
//!   directions, so answers flow back.
//! - **connectionless rules**: source and destination UID patterns and a
//!   set of request types, allow or deny, first match wins.
//!
//! Everything else is denied; the caller counts it and answers the sender.
//!
//! Each installed direction of a connection keeps its own counters
//! (messages and payload bytes that entered the overlay through this
//! connector on it): the lookup that admits a message returns its entry,
//! and the caller adds the message once it really takes it — a plain
//! increment in the entry the lookup touched, no lock and no allocation.
//! The counters live exactly as long as the connection is installed.

use std::cell::Cell;

use rustc_hash::FxHashMap;
use uniplane_dataplane::wire::{Header, ReqType};
use uniplane_dataplane::Uid;

/// Both ends of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnKey {
    /// Sending resource.
    pub src: Uid,
    /// Sending port (0 for one-sided memory traffic).
    pub src_port: u16,
    /// Receiving resource.
    pub dst: Uid,
    /// Receiving port (0 for one-sided memory traffic).
    pub dst_port: u16,
}

impl ConnKey {
    /// The connection a message belongs to.
    #[inline]
    pub fn of(header: &Header) -> ConnKey {
        let (src_port, dst_port) = header.request.ports().unwrap_or((0, 0));
        ConnKey {
            src: header.src,
            src_port,
            dst: header.dst,
            dst_port,
        }
    }

    /// The same connection seen from the other end.
    pub fn reversed(self) -> ConnKey {
        ConnKey {
            src: self.dst,
            src_port: self.dst_port,
            dst: self.src,
            dst_port: self.src_port,
        }
    }
}

/// A set of request types (all 256 codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct TypeSet([u64; 4]);

impl TypeSet {
    /// No type.
    pub const EMPTY: TypeSet = TypeSet([0; 4]);
    /// Every type.
    pub const ALL: TypeSet = TypeSet([u64::MAX; 4]);

    /// The set of `types`.
    pub fn of(types: &[ReqType]) -> TypeSet {
        let mut s = TypeSet::EMPTY;
        for &t in types {
            s = s.with(t);
        }
        s
    }

    /// This set and `t`.
    pub const fn with(mut self, t: ReqType) -> TypeSet {
        let c = t.to_u8() as usize;
        self.0[c / 64] |= 1 << (c % 64);
        self
    }

    /// Whether `t` is in the set.
    #[inline]
    pub const fn contains(&self, t: ReqType) -> bool {
        let c = t.to_u8() as usize;
        self.0[c / 64] & (1 << (c % 64)) != 0
    }

    /// This set and the raw type code `code` (assigned to a type or not):
    /// for planes that hold the set as one bit per code.
    pub const fn with_code(mut self, code: u8) -> TypeSet {
        let c = code as usize;
        self.0[c / 64] |= 1 << (c % 64);
        self
    }

    /// Whether the raw type code `code` is in the set.
    #[inline]
    pub const fn contains_code(&self, code: u8) -> bool {
        let c = code as usize;
        self.0[c / 64] & (1 << (c % 64)) != 0
    }
}

/// A connectionless rule: traffic from `src` to `dst` (key/mask patterns)
/// of the request types in `types` is allowed or denied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AclRule {
    /// Source pattern.
    pub src: Uid,
    /// Source mask (`0` matches every source).
    pub src_mask: u64,
    /// Destination pattern.
    pub dst: Uid,
    /// Destination mask.
    pub dst_mask: u64,
    /// Request types the rule covers.
    pub types: TypeSet,
    /// Allow (true) or deny (false).
    pub allow: bool,
}

impl AclRule {
    /// Allows every type between any two UIDs: for tests and trusted
    /// single-host setups.
    pub const ALLOW_ALL: AclRule = AclRule {
        src: Uid::from_bytes([0; 6]),
        src_mask: 0,
        dst: Uid::from_bytes([0; 6]),
        dst_mask: 0,
        types: TypeSet::ALL,
        allow: true,
    };

    #[inline]
    fn matches(&self, h: &Header) -> bool {
        (h.src.to_u64() ^ self.src.to_u64()) & self.src_mask == 0
            && (h.dst.to_u64() ^ self.dst.to_u64()) & self.dst_mask == 0
            && self.types.contains(h.request.kind())
    }
}

/// Why access was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denial {
    /// A rule said no.
    Rule(usize),
    /// No connection and no rule covered it.
    NotAllowed,
}

/// What one direction of an admitted connection carried through a
/// connector: read back by the control plane.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnCounters {
    /// Messages taken in on this direction.
    pub msgs: u64,
    /// Their payload bytes.
    pub bytes: u64,
}

/// The counters of one installed direction, counted through the shared
/// reference the admitting lookup returned (only the connector's own
/// thread reads its input, so plain cells suffice).
#[derive(Clone, Debug, Default)]
pub struct ConnEntry {
    msgs: Cell<u64>,
    bytes: Cell<u64>,
}

impl ConnEntry {
    /// Counts one message of `bytes` payload bytes.
    #[inline]
    pub fn count(&self, bytes: usize) {
        self.msgs.set(self.msgs.get().wrapping_add(1));
        self.bytes.set(self.bytes.get().wrapping_add(bytes as u64));
    }

    /// What was counted so far.
    pub fn get(&self) -> ConnCounters {
        ConnCounters {
            msgs: self.msgs.get(),
            bytes: self.bytes.get(),
        }
    }
}

/// A connector's access control.
#[derive(Clone, Debug, Default)]
pub struct AccessControl {
    /// Each direction of each admitted connection, with its counters.
    connections: FxHashMap<ConnKey, ConnEntry>,
    rules: Vec<AclRule>,
}

impl AccessControl {
    /// Denies everything until told otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits the connection in both directions.
    /// Admitting one that is admitted already keeps its counters.
    pub fn allow_connection(&mut self, conn: ConnKey) {
        self.connections.entry(conn).or_default();
        self.connections.entry(conn.reversed()).or_default();
    }

    /// Withdraws the connection in both directions; whether it was there.
    pub fn revoke_connection(&mut self, conn: ConnKey) -> bool {
        let a = self.connections.remove(&conn).is_some();
        let b = self.connections.remove(&conn.reversed()).is_some();
        a || b
    }

    /// Connections admitted (each direction counted once).
    pub fn connections(&self) -> usize {
        self.connections.len()
    }

    /// The admitted connections, one direction of each (the one with the
    /// smaller source), sorted.
    pub fn connection_keys(&self) -> Vec<ConnKey> {
        let mut out: Vec<ConnKey> = self
            .connections
            .keys()
            .copied()
            .filter(|c| {
                let r = c.reversed();
                (c.src.to_u64(), c.src_port) <= (r.src.to_u64(), r.src_port)
                    || !self.connections.contains_key(&r)
            })
            .collect();
        out.sort_by_key(|c| (c.src.to_u64(), c.src_port, c.dst.to_u64(), c.dst_port));
        out
    }

    /// Every admitted direction with what it carried through this
    /// connector (a connection appears twice, once per direction),
    /// sorted.
    pub fn connection_counters(&self) -> Vec<(ConnKey, ConnCounters)> {
        let mut out: Vec<(ConnKey, ConnCounters)> = self
            .connections
            .iter()
            .map(|(k, e)| (*k, e.get()))
            .collect();
        out.sort_by_key(|(c, _)| (c.src.to_u64(), c.src_port, c.dst.to_u64(), c.dst_port));
        out
    }

    /// The connectionless rules in the order they are checked.
    pub fn rules(&self) -> &[AclRule] {
        &self.rules
    }

    /// Appends a connectionless rule (checked after earlier ones).
    pub fn push_rule(&mut self, rule: AclRule) {
        self.rules.push(rule);
    }

    /// Removes every connectionless rule.
    pub fn clear_rules(&mut self) {
        self.rules.clear();
    }

    /// Whether `header` may pass.
    #[inline]
    pub fn check(&self, header: &Header) -> Result<(), Denial> {
        self.admit(header).map(drop)
    }

    /// Whether `header` may pass, and if an installed connection admitted
    /// it, that direction's counters: the caller counts the message there
    /// once it takes it (a message left waiting is looked up again).
    #[inline]
    pub fn admit(&self, header: &Header) -> Result<Option<&ConnEntry>, Denial> {
        if !self.connections.is_empty() {
            if let Some(entry) = self.connections.get(&ConnKey::of(header)) {
                return Ok(Some(entry));
            }
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.matches(header) {
                return if rule.allow {
                    Ok(None)
                } else {
                    Err(Denial::Rule(i))
                };
            }
        }
        Err(Denial::NotAllowed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use uniplane_dataplane::Message;

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    fn send(from: &str, sp: u16, to: &str, dp: u16) -> Header {
        *Message::send(uid(from).port(sp), uid(to).port(dp), Bytes::new())
            .unwrap()
            .header()
    }

    #[test]
    fn nothing_passes_by_default() {
        let acl = AccessControl::new();
        assert_eq!(
            acl.check(&send("1.1.1.1:1", 1, "1.1.1.1:2", 2)),
            Err(Denial::NotAllowed)
        );
    }

    #[test]
    fn an_installed_connection_passes_both_ways_and_only_it() {
        let mut acl = AccessControl::new();
        let h = send("1.1.1.1:1", 10, "1.1.1.1:2", 20);
        acl.allow_connection(ConnKey::of(&h));
        assert!(acl.check(&h).is_ok());
        assert!(acl.check(&send("1.1.1.1:2", 20, "1.1.1.1:1", 10)).is_ok());
        assert!(acl.check(&send("1.1.1.1:1", 11, "1.1.1.1:2", 20)).is_err());
        assert!(acl.revoke_connection(ConnKey::of(&h)));
        assert!(acl.check(&h).is_err());
    }

    #[test]
    fn each_direction_of_a_connection_counts_what_it_admitted_until_revoked() {
        let mut acl = AccessControl::new();
        let there = send("1.1.1.1:1", 10, "1.1.1.1:2", 20);
        let back = send("1.1.1.1:2", 20, "1.1.1.1:1", 10);
        let key = ConnKey::of(&there);
        acl.allow_connection(key);
        for len in [1, 100, 1000] {
            acl.admit(&there).unwrap().unwrap().count(len);
        }
        acl.admit(&back).unwrap().unwrap().count(7);
        // Admitted again (a reinstalled picture): the counts stay.
        acl.allow_connection(key.reversed());
        let counted = acl.connection_counters();
        assert_eq!(
            counted,
            vec![
                (
                    key,
                    ConnCounters {
                        msgs: 3,
                        bytes: 1101
                    }
                ),
                (key.reversed(), ConnCounters { msgs: 1, bytes: 7 }),
            ]
        );
        // A rule admits without a connection entry: nothing to count.
        acl.push_rule(AclRule::ALLOW_ALL);
        assert!(acl
            .admit(&send("1.1.1.1:3", 1, "1.1.1.1:4", 1))
            .unwrap()
            .is_none());
        assert!(acl.revoke_connection(key));
        assert!(acl.connection_counters().is_empty());
    }

    #[test]
    fn memory_requests_match_a_connection_without_ports() {
        let mut acl = AccessControl::new();
        acl.allow_connection(ConnKey {
            src: uid("1.1.1.1:1"),
            src_port: 0,
            dst: uid("1.1.1.1:5"),
            dst_port: 0,
        });
        let w = Message::write(
            uid("1.1.1.1:1"),
            uid("1.1.1.1:5").at(0x100),
            Bytes::from_static(b"x"),
        )
        .unwrap();
        assert!(acl.check(w.header()).is_ok());
    }

    #[test]
    fn rules_match_patterns_and_types_first_match_wins() {
        let mut acl = AccessControl::new();
        acl.push_rule(AclRule {
            src: uid("1.1.1.1:0"),
            src_mask: Uid::MASK & !0xffff,
            dst: uid("2.2.2.2:0"),
            dst_mask: Uid::MASK & !0xffff,
            types: TypeSet::of(&[ReqType::Write]),
            allow: false,
        });
        acl.push_rule(AclRule::ALLOW_ALL);
        let w = Message::write(
            uid("1.1.1.1:9"),
            uid("2.2.2.2:3").at(0),
            Bytes::from_static(b"x"),
        )
        .unwrap();
        assert_eq!(acl.check(w.header()), Err(Denial::Rule(0)));
        assert!(acl.check(&send("1.1.1.1:9", 1, "2.2.2.2:3", 1)).is_ok());
    }
}
