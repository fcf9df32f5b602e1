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

use rustc_hash::FxHashSet;
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

/// A connector's access control.
#[derive(Clone, Debug, Default)]
pub struct AccessControl {
    connections: FxHashSet<ConnKey>,
    rules: Vec<AclRule>,
}

impl AccessControl {
    /// Denies everything until told otherwise.
    pub fn new() -> Self {
        Self::default()
    }

    /// Admits the connection in both directions.
    pub fn allow_connection(&mut self, conn: ConnKey) {
        self.connections.insert(conn);
        self.connections.insert(conn.reversed());
    }

    /// Withdraws the connection in both directions; whether it was there.
    pub fn revoke_connection(&mut self, conn: ConnKey) -> bool {
        let a = self.connections.remove(&conn);
        let b = self.connections.remove(&conn.reversed());
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
            .iter()
            .copied()
            .filter(|c| {
                let r = c.reversed();
                (c.src.to_u64(), c.src_port) <= (r.src.to_u64(), r.src_port)
                    || !self.connections.contains(&r)
            })
            .collect();
        out.sort_by_key(|c| (c.src.to_u64(), c.src_port, c.dst.to_u64(), c.dst_port));
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
        if !self.connections.is_empty() && self.connections.contains(&ConnKey::of(header)) {
            return Ok(());
        }
        for (i, rule) in self.rules.iter().enumerate() {
            if rule.matches(header) {
                return if rule.allow {
                    Ok(())
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
