//! The two match primitives of every rule: a UID pattern ([`UidMatch`])
//! and a set of request types ([`TypeSet`]). Both are a handful of bit
//! operations, as in a hardware key/mask table.

use std::fmt;
use std::net::Ipv4Addr;

use uniplane_dataplane::wire::ReqType;
use uniplane_dataplane::Uid;

/// A UID pattern: a UID matches when its bits under `mask` equal the key's.
///
/// The mask covers the 48 wire bits of a UID (server in the high 32,
/// device in the low 16); a zero mask matches every UID.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UidMatch {
    key: u64,
    mask: u64,
}

impl UidMatch {
    /// Matches every UID.
    pub const ANY: UidMatch = UidMatch { key: 0, mask: 0 };

    /// Matches the UIDs whose bits under `mask` equal `key`'s. Bits of
    /// `mask` above the 48 UID bits are ignored.
    pub const fn new(key: Uid, mask: u64) -> UidMatch {
        let mask = mask & Uid::MASK;
        UidMatch {
            key: key.to_u64() & mask,
            mask,
        }
    }

    /// Matches exactly `uid`.
    pub const fn exact(uid: Uid) -> UidMatch {
        UidMatch::new(uid, Uid::MASK)
    }

    /// Matches every device on `server`.
    pub const fn server(server: Ipv4Addr) -> UidMatch {
        UidMatch::new(Uid::new(server, 0), Uid::MASK & !0xffff)
    }

    /// Matches the UIDs that share the first `bits` wire bits of `uid`
    /// (most significant first; `bits` above 48 count as 48).
    pub const fn prefix(uid: Uid, bits: u32) -> UidMatch {
        let bits = if bits > Uid::BITS { Uid::BITS } else { bits };
        let mask = if bits == 0 {
            0
        } else {
            (Uid::MASK << (Uid::BITS - bits)) & Uid::MASK
        };
        UidMatch::new(uid, mask)
    }

    /// The key (only its bits under the mask).
    pub const fn key(&self) -> Uid {
        match Uid::from_u64(self.key) {
            Some(uid) => uid,
            None => unreachable!(),
        }
    }

    /// The mask over the 48 UID bits.
    pub const fn mask(&self) -> u64 {
        self.mask
    }

    /// Whether `uid` matches.
    #[inline]
    pub const fn matches(&self, uid: Uid) -> bool {
        uid.to_u64() & self.mask == self.key
    }
}

impl fmt::Debug for UidMatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UidMatch({}/{:#014x})", self.key(), self.mask)
    }
}

/// A set of request-type codes: 256 bits, one per `req_type` value.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TypeSet([u64; 4]);

impl TypeSet {
    /// No type.
    pub const EMPTY: TypeSet = TypeSet([0; 4]);
    /// Every code, assigned or not.
    pub const ALL: TypeSet = TypeSet([u64::MAX; 4]);

    /// The set of `types`.
    pub const fn of(types: &[ReqType]) -> TypeSet {
        let mut set = TypeSet::EMPTY;
        let mut i = 0;
        while i < types.len() {
            set = set.with(types[i]);
            i += 1;
        }
        set
    }

    /// This set with `kind` added.
    pub const fn with(self, kind: ReqType) -> TypeSet {
        self.with_code(kind.to_u8())
    }

    /// This set with wire code `code` added.
    pub const fn with_code(mut self, code: u8) -> TypeSet {
        self.0[(code >> 6) as usize] |= 1 << (code & 63);
        self
    }

    /// This set with `kind` removed.
    pub const fn without(mut self, kind: ReqType) -> TypeSet {
        let code = kind.to_u8();
        self.0[(code >> 6) as usize] &= !(1 << (code & 63));
        self
    }

    /// Adds `kind`.
    pub fn insert(&mut self, kind: ReqType) {
        *self = self.with(kind);
    }

    /// Removes `kind`.
    pub fn remove(&mut self, kind: ReqType) {
        *self = self.without(kind);
    }

    /// Whether `kind` is in the set.
    #[inline]
    pub const fn contains(&self, kind: ReqType) -> bool {
        self.contains_code(kind.to_u8())
    }

    /// Whether wire code `code` is in the set.
    #[inline]
    pub const fn contains_code(&self, code: u8) -> bool {
        self.0[(code >> 6) as usize] >> (code & 63) & 1 == 1
    }

    /// Whether the set holds no code.
    pub const fn is_empty(&self) -> bool {
        self.0[0] | self.0[1] | self.0[2] | self.0[3] == 0
    }

    /// The 256 bits as four words, code 0 in bit 0 of the first.
    pub const fn to_words(self) -> [u64; 4] {
        self.0
    }

    /// The set of four words, code 0 in bit 0 of the first.
    pub const fn from_words(words: [u64; 4]) -> TypeSet {
        TypeSet(words)
    }
}

impl FromIterator<ReqType> for TypeSet {
    fn from_iter<I: IntoIterator<Item = ReqType>>(iter: I) -> TypeSet {
        iter.into_iter().fold(TypeSet::EMPTY, TypeSet::with)
    }
}

impl fmt::Debug for TypeSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == TypeSet::ALL {
            return f.write_str("TypeSet(ALL)");
        }
        let mut list = f.debug_set();
        for code in 0..=255u8 {
            if self.contains_code(code) {
                match ReqType::from_u8(code) {
                    Some(kind) => list.entry(&format_args!("{kind}")),
                    None => list.entry(&format_args!("{code:#04x}")),
                };
            }
        }
        list.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    #[test]
    fn exact_matches_only_its_uid() {
        let m = UidMatch::exact(uid("10.0.0.7:3"));
        assert!(m.matches(uid("10.0.0.7:3")));
        assert!(!m.matches(uid("10.0.0.7:4")));
        assert!(!m.matches(uid("10.0.0.8:3")));
    }

    #[test]
    fn server_matches_every_device_of_that_server() {
        let m = UidMatch::server("10.0.0.7".parse().unwrap());
        assert!(m.matches(uid("10.0.0.7:0")));
        assert!(m.matches(uid("10.0.0.7:65535")));
        assert!(!m.matches(uid("10.0.0.6:1")));
    }

    #[test]
    fn prefix_matches_a_subnet_and_zero_bits_match_all() {
        let m = UidMatch::prefix(uid("10.0.1.0:0"), 24);
        assert!(m.matches(uid("10.0.1.200:9")));
        assert!(!m.matches(uid("10.0.2.1:9")));
        assert_eq!(UidMatch::prefix(uid("1.2.3.4:5"), 0), UidMatch::ANY);
        assert_eq!(
            UidMatch::prefix(uid("1.2.3.4:5"), 99),
            UidMatch::exact(uid("1.2.3.4:5"))
        );
        assert!(UidMatch::ANY.matches(uid("255.255.255.255:65535")));
    }

    #[test]
    fn key_bits_outside_the_mask_are_ignored() {
        let m = UidMatch::new(uid("10.0.0.7:3"), 0xffff_ffff_0000);
        assert_eq!(m, UidMatch::server("10.0.0.7".parse().unwrap()));
        assert_eq!(m.key(), uid("10.0.0.7:0"));
    }

    #[test]
    fn type_sets_hold_every_code() {
        let mut set = TypeSet::of(&[ReqType::Send, ReqType::User(0xff)]);
        assert!(set.contains(ReqType::Send));
        assert!(set.contains_code(0xff));
        assert!(!set.contains(ReqType::Write));
        set.insert(ReqType::Write);
        set.remove(ReqType::Send);
        assert!(set.contains(ReqType::Write) && !set.contains(ReqType::Send));
        assert!((0..=255).all(|c| TypeSet::ALL.contains_code(c)));
        assert!((0..=255).all(|c| !TypeSet::EMPTY.contains_code(c)));
        assert!(TypeSet::EMPTY.is_empty() && !set.is_empty());
        let collected: TypeSet = [ReqType::Read, ReqType::Copy].into_iter().collect();
        assert_eq!(collected, TypeSet::of(&[ReqType::Copy, ReqType::Read]));
        assert_eq!(TypeSet::from_words(collected.to_words()), collected);
    }
}
