//! A host memory device's bytes, in a memfd the daemon can lend to local
//! processes by mapping ([`HostRegion::lend`]) and take back
//! ([`HostRegion::take_back`]) — the grant protocol of
//! [`uniplane_shm::grant`].
//!
//! The engine serves the device's one-sided WRTE/READ through a
//! [`RegionView`], under a grant word of its own, like any borrower: when
//! the region moves, its pending access sees the revocation and follows
//! the region to its new memfd. A take-back is rare (the access rules
//! changed, a borrowing session ended); it costs one copy of the region.

use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use bytes::{Bytes, BytesMut};
use uniplane_dataplane::wire::Status;
use uniplane_shm::grant::{read_under, write_under, Access, Grant, GrantWord};
use uniplane_shm::sys::{memfd_name, SharedMemory};

use super::MemoryStore;

/// Most grants lent out of one region before it is taken back (a
/// session's mapping is one; mapping again after a take-back is another).
pub const MAX_GRANTS: usize = 64;

/// Why a region could not be lent.
#[derive(Debug, thiserror::Error)]
pub enum LendError {
    /// The operating system refused a memfd or a descriptor.
    #[error("lending the memory: {0}")]
    Io(#[from] std::io::Error),
    /// Too many grants stand on the region.
    #[error("{MAX_GRANTS} mappings of this memory stand already")]
    TooMany,
}

/// What a borrower gets: the region's descriptor (read-only unless the
/// grant is writable), its grant word's (read-only) and the length.
#[derive(Debug)]
pub struct Loan {
    /// The region's memfd.
    pub region: OwnedFd,
    /// The grant word's memfd.
    pub grant: OwnedFd,
    /// Bytes of the region.
    pub len: usize,
}

#[derive(Debug)]
struct Current {
    mem: Arc<SharedMemory>,
    /// The engine's own grant word on `mem`.
    engine: Arc<GrantWord>,
    /// Grants lent out on `mem`.
    lent: Vec<GrantWord>,
    /// Engine ports waiting for the region to come back.
    waiting: Vec<Waker>,
}

/// A host memory device's bytes.
#[derive(Debug)]
pub struct HostRegion {
    name: String,
    len: usize,
    current: Mutex<Current>,
    /// Bumped each time the region moves.
    generation: AtomicU64,
    moves: AtomicU64,
}

impl HostRegion {
    /// `len` zeroed bytes for device `name`.
    pub fn create(name: &str, len: usize) -> std::io::Result<Arc<HostRegion>> {
        let mem = SharedMemory::create(&memfd_name(&format!("memory-{name}")), len)?;
        Ok(Arc::new(HostRegion {
            name: name.to_owned(),
            len,
            current: Mutex::new(Current {
                mem: Arc::new(mem),
                engine: Arc::new(GrantWord::new(name)?),
                lent: Vec::new(),
                waiting: Vec::new(),
            }),
            generation: AtomicU64::new(0),
            moves: AtomicU64::new(0),
        }))
    }

    fn current(&self) -> MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Bytes of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region has at least one byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Grants standing now.
    pub fn grants(&self) -> usize {
        self.current().lent.len()
    }

    /// Times the region was taken back (and moved).
    pub fn moves(&self) -> u64 {
        self.moves.load(Ordering::Relaxed)
    }

    /// Lends the region: its memfd (opened read-only unless `writable`)
    /// and a fresh grant word.
    pub fn lend(&self, writable: bool) -> Result<Loan, LendError> {
        let mut cur = self.current();
        if cur.lent.len() >= MAX_GRANTS {
            return Err(LendError::TooMany);
        }
        let word = GrantWord::new(&self.name)?;
        let grant = word.read_only_fd()?;
        let region = if writable {
            cur.mem.fd().try_clone_to_owned()?
        } else {
            cur.mem.reopen_read_only()?
        };
        cur.lent.push(word);
        Ok(Loan {
            region,
            grant,
            len: self.len,
        })
    }

    /// Takes back every grant lent on the region: each is marked revoked,
    /// the bytes are copied into a fresh memfd, and that is the device's
    /// memory from now on; the old memfd stays with whoever mapped it,
    /// connected to nothing. Without grants standing, nothing happens.
    /// Blocks for the copy: call it off the runtime's threads.
    pub fn take_back(&self) -> std::io::Result<bool> {
        let mut cur = self.current();
        if cur.lent.is_empty() {
            return Ok(false);
        }
        let fresh = SharedMemory::create(&memfd_name(&format!("memory-{}", self.name)), self.len)?;
        let engine = Arc::new(GrantWord::new(&self.name)?);
        for word in &cur.lent {
            word.revoke();
        }
        cur.engine.revoke();
        fresh.copy_from(0, &cur.mem, 0, self.len);
        cur.mem = Arc::new(fresh);
        cur.engine = engine;
        cur.lent.clear();
        self.generation.fetch_add(1, Ordering::Release);
        self.moves.fetch_add(1, Ordering::Relaxed);
        for w in cur.waiting.drain(..) {
            w.wake();
        }
        tracing::info!(device = %self.name, bytes = self.len, "memory taken back from its borrowers");
        Ok(true)
    }

    /// Revokes every grant lent on the region, and the engine's, without
    /// moving it: for a region nobody is to reach through the daemon any
    /// more (a process's shared memory, withdrawn). Borrowers keep their
    /// mappings of bytes that are connected to nothing.
    pub fn withdraw(&self) {
        let mut cur = self.current();
        for word in &cur.lent {
            word.revoke();
        }
        cur.engine.revoke();
        cur.lent.clear();
        for w in cur.waiting.drain(..) {
            w.wake();
        }
        tracing::info!(region = %self.name, "shared memory withdrawn from its borrowers");
    }

    /// The engine's access to the region.
    pub fn view(self: &Arc<Self>) -> RegionView {
        let cur = self.current();
        RegionView {
            region: self.clone(),
            mem: cur.mem.clone(),
            word: cur.engine.clone(),
            generation: self.generation.load(Ordering::Acquire),
        }
    }
}

/// The engine's (or a device task's) access to a [`HostRegion`]: bounds
/// checked, under the engine's grant word, following the region when it
/// moves.
#[derive(Debug)]
pub struct RegionView {
    region: Arc<HostRegion>,
    mem: Arc<SharedMemory>,
    word: Arc<GrantWord>,
    generation: u64,
}

impl RegionView {
    /// Picks up the region's new memfd once it moved; false while the move
    /// is still under way (the caller holds its message back).
    fn follow(&mut self) -> bool {
        if self.region.generation.load(Ordering::Acquire) == self.generation {
            return false;
        }
        let cur = self.region.current();
        self.mem = cur.mem.clone();
        self.word = cur.engine.clone();
        self.generation = self.region.generation.load(Ordering::Acquire);
        true
    }

    /// Whether an access can go now; when the region is moving, `waker`
    /// (if any) is woken once it has moved.
    fn can_go(&mut self, waker: Option<&Waker>) -> bool {
        if !self.word.is_revoked() || self.follow() {
            return true;
        }
        let mut cur = self.region.current();
        if self.region.generation.load(Ordering::Acquire) != self.generation {
            drop(cur);
            return self.follow();
        }
        if let Some(w) = waker {
            if !cur.waiting.iter().any(|x| x.will_wake(w)) {
                cur.waiting.push(w.clone());
            }
        }
        false
    }

    /// Waits for the region's move to finish (the copy another thread is
    /// making): the rare access that was under way when it began.
    fn wait_for_move(&mut self) {
        loop {
            // The move holds the lock for its copy: taking it waits.
            drop(self.region.current());
            if self.follow() {
                return;
            }
            std::thread::yield_now();
        }
    }

    fn offset(addr: u64) -> Result<usize, Status> {
        usize::try_from(addr).map_err(|_| Status::OutOfRange)
    }
}

impl MemoryStore for RegionView {
    fn store(&mut self, addr: u64, data: &[u8]) -> Result<(), Status> {
        let off = Self::offset(addr)?;
        loop {
            match write_under(&*self.word, &self.mem, off, data) {
                Access::Done => return Ok(()),
                Access::OutOfRange => return Err(Status::OutOfRange),
                Access::Revoked => self.wait_for_move(),
            }
        }
    }

    fn load(&mut self, addr: u64, len: usize) -> Result<Bytes, Status> {
        let off = Self::offset(addr)?;
        let mut buf = BytesMut::zeroed(len);
        loop {
            match read_under(&*self.word, &*self.mem, off, &mut buf) {
                Access::Done => return Ok(buf.freeze()),
                Access::OutOfRange => return Err(Status::OutOfRange),
                Access::Revoked => self.wait_for_move(),
            }
        }
    }

    fn ready(&mut self, waker: Option<&Waker>) -> bool {
        self.can_go(waker)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_shm::grant::GrantView;
    use uniplane_shm::sys::ReadOnlyMemory;

    #[test]
    fn a_borrower_writes_what_the_engine_reads_until_the_region_is_taken_back() {
        let region = HostRegion::create("t", 4096).unwrap();
        let mut engine = region.view();
        let loan = region.lend(true).unwrap();
        let mem = SharedMemory::open(loan.region, loan.len).unwrap();
        let grant = GrantView::open(loan.grant).unwrap();
        assert_eq!(write_under(&grant, &mem, 100, b"lent"), Access::Done);
        assert_eq!(engine.load(100, 4).unwrap().as_ref(), b"lent");
        engine.store(200, b"back").unwrap();
        let mut seen = [0u8; 4];
        assert_eq!(read_under(&grant, &mem, 200, &mut seen), Access::Done);
        assert_eq!(&seen, b"back");

        assert!(region.take_back().unwrap());
        assert_eq!((region.moves(), region.grants()), (1, 0));
        // The borrower is told, and what it writes now reaches nothing.
        assert_eq!(write_under(&grant, &mem, 100, b"late"), Access::Revoked);
        mem.write(100, b"evil");
        assert!(engine.ready(None));
        assert_eq!(engine.load(100, 4).unwrap().as_ref(), b"lent");
        assert_eq!(engine.load(200, 4).unwrap().as_ref(), b"back");
        assert_eq!(engine.load(4094, 4), Err(Status::OutOfRange));
        assert_eq!(engine.store(u64::MAX, b"x"), Err(Status::OutOfRange));
        // Nothing lent: nothing to take back, no copy.
        assert!(!region.take_back().unwrap());
    }

    #[test]
    fn a_read_only_loan_cannot_be_mapped_writable() {
        let region = HostRegion::create("ro", 4096).unwrap();
        region.view().store(0, b"data").unwrap();
        let loan = region.lend(false).unwrap();
        let copy = loan.region.try_clone().unwrap();
        let err = SharedMemory::open(copy, loan.len).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES));
        let ro = ReadOnlyMemory::open(loan.region, loan.len).unwrap();
        let mut b = [0u8; 4];
        assert!(ro.read(0, &mut b));
        assert_eq!(&b, b"data");
    }

    #[test]
    fn grants_are_bounded() {
        let region = HostRegion::create("many", 4096).unwrap();
        for _ in 0..MAX_GRANTS {
            region.lend(false).unwrap();
        }
        assert!(matches!(region.lend(true), Err(LendError::TooMany)));
        region.take_back().unwrap();
        region.lend(true).unwrap();
    }

    #[test]
    fn an_engine_port_waiting_for_the_move_is_woken() {
        use std::task::Wake;
        struct Flag(std::sync::atomic::AtomicBool);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let region = HostRegion::create("w", 4096).unwrap();
        let mut engine = region.view();
        region.lend(true).unwrap();
        // Mark as the move does, without finishing it: the engine must
        // hold back and be woken when the move completes.
        region.current().engine.revoke();
        let flag = Arc::new(Flag(false.into()));
        let waker = Waker::from(flag.clone());
        assert!(!engine.ready(Some(&waker)));
        region.take_back().unwrap();
        assert!(flag.0.load(Ordering::SeqCst));
        assert!(engine.ready(None));
    }
}
