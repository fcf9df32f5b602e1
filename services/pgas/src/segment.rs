//! Segments: memory an endpoint owns that peers reach by rank, segment
//! ID and offset, every access bounds- and ACL-checked at the owner.

use std::sync::{Arc, Mutex, MutexGuard};

use uniplane_client::SharedRegion;

pub use uniplane_pgas_core::access::{atomic_at, Access, Acl, AtomicOp, SegmentId, Width};

use crate::Refusal;

/// Where a segment's bytes are.
enum Backing {
    /// In this process only: peers reach them by message.
    Private(Vec<u8>),
    /// In shared memory the daemon made and lends this server's other
    /// ranks: they write and read it themselves.
    Shared(SharedRegion),
}

/// A segment's bytes and rules, shared by its owner's handle and the
/// endpoint's target side.
pub(crate) struct SegmentMemory {
    pub(crate) acl: Acl,
    len: usize,
    bytes: Mutex<Backing>,
}

/// The bytes of a segment, locked: peers' messages and local access wait.
/// Other ranks' direct puts into shared bytes do not: those and local
/// access to the same bytes race, as puts do in OpenSHMEM, unless the
/// program orders them (quiet, barrier, a counter it waits for).
pub(crate) struct Bytes<'a>(MutexGuard<'a, Backing>);

impl std::ops::Deref for Bytes<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &*self.0 {
            Backing::Private(v) => v,
            Backing::Shared(r) => {
                let m = r.memory().expect("an owner's mapping is writable");
                // SAFETY: the mapping is `m.len()` bytes and lives as long
                // as the region, which the guard keeps; this process
                // touches it only under the lock (see `Bytes`).
                unsafe { std::slice::from_raw_parts(m.as_mut_ptr(), m.len()) }
            }
        }
    }
}

impl std::ops::DerefMut for Bytes<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &mut *self.0 {
            Backing::Private(v) => v,
            Backing::Shared(r) => {
                let m = r.memory().expect("an owner's mapping is writable");
                // SAFETY: as in `deref`, and the lock makes this the only
                // reference this process holds.
                unsafe { std::slice::from_raw_parts_mut(m.as_mut_ptr(), m.len()) }
            }
        }
    }
}

impl SegmentMemory {
    pub(crate) fn new(len: usize, acl: Acl) -> SegmentMemory {
        SegmentMemory {
            acl,
            len,
            bytes: Mutex::new(Backing::Private(vec![0; len])),
        }
    }

    /// Its bytes, locked. A shared segment the daemon has withdrawn comes
    /// back to this process first: its bytes are copied out of the
    /// mapping, which stays this process's memory, so nothing a peer put
    /// before the withdrawal is lost (a put that overlapped it learns so
    /// and is sent again as a message).
    pub(crate) fn lock(&self) -> Bytes<'_> {
        let mut g = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        if let Backing::Shared(r) = &*g {
            if r.is_withdrawn() {
                let mut own = vec![0; self.len];
                if let Some(m) = r.memory() {
                    m.read(0, &mut own);
                }
                tracing::info!(
                    id = r.id(),
                    "shared segment withdrawn: its bytes are private again"
                );
                *g = Backing::Private(own);
            }
        }
        Bytes(g)
    }

    /// Moves the bytes into `region` (writable, as long as the segment),
    /// where this server's other ranks reach them.
    pub(crate) fn adopt(&self, region: SharedRegion) -> bool {
        let Some(m) = region.memory() else {
            return false;
        };
        if m.len() != self.len {
            return false;
        }
        let mut g = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        if let Backing::Private(v) = &*g {
            m.write(0, v);
            *g = Backing::Shared(region);
            return true;
        }
        false
    }

    /// Whether its bytes are in shared memory now.
    pub(crate) fn is_shared(&self) -> bool {
        matches!(&*self.lock().0, Backing::Shared(_))
    }

    /// Its size in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Runs `op` on the word at `offset` under the segment's lock: what
    /// makes atomics linearizable against each other and local access
    /// (every atomic on a segment runs here, in its owner's process).
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
        self.memory.len()
    }

    /// Whether its bytes are in shared memory now, where this server's
    /// other ranks put and get them directly ([`crate::Options::share`]).
    pub fn is_shared(&self) -> bool {
        self.memory.is_shared()
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
        self.memory.lock().to_vec()
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
