//! The rules of an access to a segment: who may ([`Acl`]), what it does
//! ([`Access`]), and the atomics ([`AtomicOp`] on a [`Width`] word), the
//! same at a software and a hardware endpoint.

use std::collections::BTreeSet;

use crate::Refusal;

/// A segment's number within its endpoint.
pub type SegmentId = u16;

/// Who may reach a segment from other endpoints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Acl {
    /// Every rank of the group may read and write.
    ReadWrite,
    /// Every rank may read (get, fetch); nobody may write or run atomics.
    ReadOnly,
    /// Only these ranks may read and write.
    Ranks(BTreeSet<usize>),
}

impl Acl {
    /// Whether `rank` may make this access.
    pub fn allows(&self, rank: usize, access: Access) -> bool {
        match self {
            Acl::ReadWrite => true,
            Acl::ReadOnly => access == Access::Read,
            Acl::Ranks(r) => r.contains(&rank),
        }
    }
}

/// What an access does to a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Get forms.
    Read,
    /// Long messages and atomics.
    Write,
}

/// An atomic operation on a 32- or 64-bit little-endian word of a
/// segment; each returns the word's value before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicOp {
    /// Adds (wrapping).
    FetchAdd(u64),
    /// Stores `new` when the word equals `expected`.
    CompareSwap {
        /// The value the word must hold.
        expected: u64,
        /// The value stored when it does.
        new: u64,
    },
    /// Stores the value.
    Swap(u64),
}

impl AtomicOp {
    /// Its code on the wire (the frame header's `op`).
    pub fn code(&self) -> u8 {
        match self {
            AtomicOp::FetchAdd(_) => 1,
            AtomicOp::CompareSwap { .. } => 2,
            AtomicOp::Swap(_) => 3,
        }
    }

    /// The operation of wire code `op` with operand `arg` and `compare`.
    pub fn decode(op: u8, arg: u64, compare: u64) -> Option<AtomicOp> {
        match op {
            1 => Some(AtomicOp::FetchAdd(arg)),
            2 => Some(AtomicOp::CompareSwap {
                expected: compare,
                new: arg,
            }),
            3 => Some(AtomicOp::Swap(arg)),
            _ => None,
        }
    }

    /// Its operand and compare value on the wire.
    pub fn operands(&self) -> (u64, u64) {
        match *self {
            AtomicOp::FetchAdd(v) | AtomicOp::Swap(v) => (v, 0),
            AtomicOp::CompareSwap { expected, new } => (new, expected),
        }
    }

    /// Applies it to `word` (of `width` bytes); the old value.
    pub fn apply(&self, word: &mut [u8], width: Width) -> u64 {
        let old = match width {
            Width::W32 => u64::from(u32::from_le_bytes(word[..4].try_into().unwrap_or([0; 4]))),
            Width::W64 => u64::from_le_bytes(word[..8].try_into().unwrap_or([0; 8])),
        };
        let mask = width.mask();
        let new = match *self {
            AtomicOp::FetchAdd(v) => old.wrapping_add(v) & mask,
            AtomicOp::CompareSwap { expected, new } if old == expected & mask => new & mask,
            AtomicOp::CompareSwap { .. } => old,
            AtomicOp::Swap(v) => v & mask,
        };
        match width {
            Width::W32 => word[..4].copy_from_slice(&(new as u32).to_le_bytes()),
            Width::W64 => word[..8].copy_from_slice(&new.to_le_bytes()),
        }
        old
    }
}

/// The width of an atomic's word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Width {
    /// 32 bits, at a multiple of 4.
    W32,
    /// 64 bits, at a multiple of 8.
    W64,
}

impl Width {
    /// Bytes.
    pub fn bytes(self) -> usize {
        match self {
            Width::W32 => 4,
            Width::W64 => 8,
        }
    }

    fn mask(self) -> u64 {
        match self {
            Width::W32 => u64::from(u32::MAX),
            Width::W64 => u64::MAX,
        }
    }

    /// The width of a `count` field (4 or 8 bytes).
    pub fn from_bytes(n: u32) -> Option<Width> {
        match n {
            4 => Some(Width::W32),
            8 => Some(Width::W64),
            _ => None,
        }
    }
}

/// Runs `op` on the `width` word at `offset` of `bytes`: the old value,
/// or why not (misaligned, out of bounds), nothing changed then. The
/// caller makes it atomic (a software segment holds its lock; a
/// hardware endpoint runs one request at a time).
pub fn atomic_at(
    bytes: &mut [u8],
    offset: u64,
    width: Width,
    op: AtomicOp,
) -> Result<u64, Refusal> {
    if !offset.is_multiple_of(width.bytes() as u64) {
        return Err(Refusal::Misaligned);
    }
    let start = usize::try_from(offset).map_err(|_| Refusal::OutOfBounds)?;
    let word = start
        .checked_add(width.bytes())
        .and_then(|end| bytes.get_mut(start..end))
        .ok_or(Refusal::OutOfBounds)?;
    Ok(op.apply(word, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomics_work_on_32_and_64_bit_little_endian_words() {
        let mut s = vec![0u8; 16];
        assert_eq!(
            atomic_at(&mut s, 8, Width::W64, AtomicOp::FetchAdd(5)),
            Ok(0)
        );
        assert_eq!(atomic_at(&mut s, 8, Width::W64, AtomicOp::Swap(9)), Ok(5));
        let cas = AtomicOp::CompareSwap {
            expected: 1,
            new: 2,
        };
        assert_eq!(
            atomic_at(&mut s, 8, Width::W64, cas),
            Ok(9),
            "no swap: 9 != 1"
        );
        assert_eq!(
            atomic_at(
                &mut s,
                4,
                Width::W32,
                AtomicOp::FetchAdd(u64::from(u32::MAX))
            ),
            Ok(0)
        );
        assert_eq!(
            atomic_at(&mut s, 4, Width::W32, AtomicOp::FetchAdd(2)),
            Ok(u64::from(u32::MAX))
        );
        assert_eq!(
            atomic_at(&mut s, 4, Width::W32, AtomicOp::Swap(0)),
            Ok(1),
            "wrapped at 32 bits"
        );
        assert_eq!(&s[8..16], &9u64.to_le_bytes());
    }

    #[test]
    fn misaligned_or_out_of_bounds_atomics_are_refused() {
        let mut s = vec![0u8; 16];
        assert_eq!(
            atomic_at(&mut s, 4, Width::W64, AtomicOp::Swap(1)),
            Err(Refusal::Misaligned)
        );
        assert_eq!(
            atomic_at(&mut s, 16, Width::W32, AtomicOp::Swap(1)),
            Err(Refusal::OutOfBounds)
        );
        assert_eq!(s, vec![0; 16]);
    }

    #[test]
    fn acls_say_who_may_do_what() {
        assert!(Acl::ReadOnly.allows(3, Access::Read));
        assert!(!Acl::ReadOnly.allows(3, Access::Write));
        let only = Acl::Ranks([1].into());
        assert!(only.allows(1, Access::Write));
        assert!(!only.allows(2, Access::Read));
    }
}
