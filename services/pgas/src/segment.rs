//! Segments: memory an endpoint owns that peers reach by rank, segment
//! ID and offset, every access bounds- and ACL-checked at the owner.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard};

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
    /// Its code on the wire.
    pub(crate) fn code(&self) -> u8 {
        match self {
            AtomicOp::FetchAdd(_) => 1,
            AtomicOp::CompareSwap { .. } => 2,
            AtomicOp::Swap(_) => 3,
        }
    }

    /// The operation of wire code `op` with operand `arg` and `compare`.
    pub(crate) fn decode(op: u8, arg: u64, compare: u64) -> Option<AtomicOp> {
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
    pub(crate) fn operands(&self) -> (u64, u64) {
        match *self {
            AtomicOp::FetchAdd(v) | AtomicOp::Swap(v) => (v, 0),
            AtomicOp::CompareSwap { expected, new } => (new, expected),
        }
    }

    /// Applies it to `word` (of `width` bytes); the old value.
    pub(crate) fn apply(&self, word: &mut [u8], width: Width) -> u64 {
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

    pub(crate) fn from_bytes(n: u32) -> Option<Width> {
        match n {
            4 => Some(Width::W32),
            8 => Some(Width::W64),
            _ => None,
        }
    }
}

/// A segment's bytes and rules, shared by its owner's handle and the
/// endpoint's target side.
pub(crate) struct SegmentMemory {
    pub(crate) acl: Acl,
    bytes: Mutex<Vec<u8>>,
}

impl SegmentMemory {
    pub(crate) fn new(len: usize, acl: Acl) -> SegmentMemory {
        SegmentMemory {
            acl,
            bytes: Mutex::new(vec![0; len]),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        self.bytes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Runs `op` on the word at `offset` under the segment's lock: what
    /// makes atomics linearizable against each other and local access.
    pub(crate) fn atomic(&self, offset: u64, width: Width, op: AtomicOp) -> Result<u64, Refusal> {
        if !offset.is_multiple_of(width.bytes() as u64) {
            return Err(Refusal::Misaligned);
        }
        let mut bytes = self.lock();
        let start = usize::try_from(offset).map_err(|_| Refusal::OutOfBounds)?;
        let word = start
            .checked_add(width.bytes())
            .and_then(|end| bytes.get_mut(start..end))
            .ok_or(Refusal::OutOfBounds)?;
        Ok(op.apply(word, width))
    }
}

/// A registered segment, as its owner sees it: local reads, writes and
/// atomics (atomics here and from peers are linearizable together). It
/// stays registered while the endpoint lives.
#[derive(Clone)]
pub struct Segment {
    pub(crate) id: SegmentId,
    pub(crate) memory: Arc<SegmentMemory>,
}

impl Segment {
    /// Its ID, for peers' accesses.
    pub fn id(&self) -> SegmentId {
        self.id
    }

    /// Its size in bytes.
    pub fn len(&self) -> usize {
        self.memory.lock().len()
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of `len` bytes at `offset`, or `None` past the end.
    pub fn read(&self, offset: usize, len: usize) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)?;
        self.memory.lock().get(offset..end).map(<[u8]>::to_vec)
    }

    /// Writes `data` at `offset`; false (nothing written) past the end.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        let Some(end) = offset.checked_add(data.len()) else {
            return false;
        };
        match self.memory.lock().get_mut(offset..end) {
            Some(dst) => {
                dst.copy_from_slice(data);
                true
            }
            None => false,
        }
    }

    /// A copy of the whole segment.
    pub fn to_vec(&self) -> Vec<u8> {
        self.memory.lock().clone()
    }

    /// Runs `f` on the segment's bytes; peers' accesses wait meanwhile.
    pub fn with<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> R {
        f(&mut self.memory.lock())
    }

    /// An atomic on the word at `offset`, as a peer's would run.
    pub fn atomic(&self, offset: u64, width: Width, op: AtomicOp) -> Result<u64, Refusal> {
        self.memory.atomic(offset, width, op)
    }
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("id", &self.id)
            .field("len", &self.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomics_work_on_32_and_64_bit_little_endian_words() {
        let s = SegmentMemory::new(16, Acl::ReadWrite);
        assert_eq!(s.atomic(8, Width::W64, AtomicOp::FetchAdd(5)), Ok(0));
        assert_eq!(s.atomic(8, Width::W64, AtomicOp::Swap(9)), Ok(5));
        let cas = AtomicOp::CompareSwap {
            expected: 1,
            new: 2,
        };
        assert_eq!(s.atomic(8, Width::W64, cas), Ok(9), "no swap: 9 != 1");
        assert_eq!(
            s.atomic(4, Width::W32, AtomicOp::FetchAdd(u64::from(u32::MAX))),
            Ok(0)
        );
        assert_eq!(
            s.atomic(4, Width::W32, AtomicOp::FetchAdd(2)),
            Ok(u64::from(u32::MAX))
        );
        assert_eq!(
            s.atomic(4, Width::W32, AtomicOp::Swap(0)),
            Ok(1),
            "wrapped at 32 bits"
        );
        assert_eq!(&s.lock()[8..16], &9u64.to_le_bytes());
    }

    #[test]
    fn misaligned_or_out_of_bounds_atomics_are_refused() {
        let s = SegmentMemory::new(16, Acl::ReadWrite);
        assert_eq!(
            s.atomic(4, Width::W64, AtomicOp::Swap(1)),
            Err(Refusal::Misaligned)
        );
        assert_eq!(
            s.atomic(16, Width::W32, AtomicOp::Swap(1)),
            Err(Refusal::OutOfBounds)
        );
        assert_eq!(*s.lock(), vec![0; 16]);
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
