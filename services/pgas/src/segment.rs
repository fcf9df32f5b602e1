//! Segments: memory an endpoint owns that peers reach by rank, segment
//! ID and offset, every access bounds- and ACL-checked at the owner.

use std::sync::{Arc, Mutex, MutexGuard};

pub use uniplane_pgas_core::access::{atomic_at, Access, Acl, AtomicOp, SegmentId, Width};

use crate::Refusal;

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
        atomic_at(&mut self.lock(), offset, width, op)
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
    fn a_segments_atomics_run_under_its_lock_and_refuse_what_does_not_fit() {
        let s = SegmentMemory::new(16, Acl::ReadWrite);
        assert_eq!(s.atomic(8, Width::W64, AtomicOp::FetchAdd(5)), Ok(0));
        assert_eq!(s.atomic(8, Width::W64, AtomicOp::Swap(9)), Ok(5));
        assert_eq!(
            s.atomic(4, Width::W64, AtomicOp::Swap(1)),
            Err(Refusal::Misaligned)
        );
        assert_eq!(
            s.atomic(16, Width::W32, AtomicOp::Swap(1)),
            Err(Refusal::OutOfBounds)
        );
        assert_eq!(&s.lock()[8..16], &9u64.to_le_bytes());
    }
}
