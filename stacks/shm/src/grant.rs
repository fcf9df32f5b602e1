//! Memory lent by mapping, and taken back.
//!
//! A lender (the daemon) lends a process a memory region by handing it the
//! region's memfd; beside it goes a *grant word*, a page only the lender
//! can write, that says whether the loan stands. A mapping cannot be taken
//! out of another process, so the lender takes back the *region* instead:
//! it marks the word revoked, copies the region into a fresh memfd and
//! serves that from then on; the old memfd is left to its borrowers, no
//! longer connected to anything.
//!
//! Every access under a grant, the lender's own included, follows one
//! protocol, so that nothing a borrower in good standing writes is lost
//! in that move:
//!
//! - **borrower**: check the word (revoked: stop); copy; a `SeqCst` fence;
//!   check the word again. Still live: done. Revoked: the copy may have
//!   landed after the lender's copy of the region — map again and redo.
//! - **lender**: mark every word revoked; a `SeqCst` fence; copy the
//!   region into the fresh memfd; serve that.
//!
//! With a fence on both sides, a borrower that reads "live" after its copy
//! read it before the lender's mark in the single total order of `SeqCst`
//! operations, so its bytes were in place before the lender's copy read
//! them; a borrower that reads "revoked" redoes the access on the new
//! region. A write redone is the same bytes at the same place: idempotent.

use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{fence, Ordering};

use crate::sys::{memfd_name, ReadOnlyMemory, SharedMemory};

/// Bytes of a grant word's memfd: one page.
pub const GRANT_BYTES: usize = 4096;

const LIVE: u64 = 0;
const REVOKED: u64 = 1;

/// Whether a loan still stands.
pub trait Grant {
    /// True once the lender took the region back.
    fn is_revoked(&self) -> bool;
}

/// The lender's side of a grant word: it alone writes it.
#[derive(Debug)]
pub struct GrantWord {
    mem: SharedMemory,
}

impl GrantWord {
    /// A fresh, live grant word (a page of its own, named after `what`).
    pub fn new(what: &str) -> io::Result<GrantWord> {
        let mem = SharedMemory::create(&memfd_name(&format!("grant-{what}")), GRANT_BYTES)?;
        Ok(GrantWord { mem })
    }

    /// Marks the loan revoked; every access under it that has not yet
    /// passed its second check will see it (a `SeqCst` store and fence).
    pub fn revoke(&self) {
        if let Some(w) = self.mem.atomic_u64(0) {
            w.store(REVOKED, Ordering::SeqCst);
        }
        fence(Ordering::SeqCst);
    }

    /// A read-only descriptor of the word, for the borrower.
    pub fn read_only_fd(&self) -> io::Result<OwnedFd> {
        self.mem.reopen_read_only()
    }
}

impl Grant for GrantWord {
    #[inline]
    fn is_revoked(&self) -> bool {
        self.mem
            .atomic_u64(0)
            .is_none_or(|w| w.load(Ordering::Acquire) != LIVE)
    }
}

/// The borrower's side of a grant word: mapped read-only, so only the
/// lender can change it.
#[derive(Debug)]
pub struct GrantView {
    mem: ReadOnlyMemory,
}

impl GrantView {
    /// Maps a grant word received from the lender.
    pub fn open(fd: OwnedFd) -> io::Result<GrantView> {
        Ok(GrantView {
            mem: ReadOnlyMemory::open(fd, GRANT_BYTES)?,
        })
    }
}

impl Grant for GrantView {
    #[inline]
    fn is_revoked(&self) -> bool {
        self.mem.load_u64(0).is_none_or(|w| w != LIVE)
    }
}

/// What an access under a grant came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Done, and it counts: the loan stood throughout.
    Done,
    /// The loan was taken back before or during the access: map again
    /// and redo it (a write may or may not have reached the region).
    Revoked,
    /// The range lies outside the region: nothing was touched.
    OutOfRange,
}

/// Memory an access under a grant can read.
pub trait Readable {
    /// Copies bytes at `offset` into `dst`; false (nothing read) when out
    /// of bounds.
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool;
    /// Bytes mapped.
    fn size(&self) -> usize;
}

impl Readable for SharedMemory {
    #[inline]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        self.read(offset, dst)
    }
    fn size(&self) -> usize {
        self.len()
    }
}

impl Readable for ReadOnlyMemory {
    #[inline]
    fn read_at(&self, offset: usize, dst: &mut [u8]) -> bool {
        self.read(offset, dst)
    }
    fn size(&self) -> usize {
        self.len()
    }
}

/// Writes `data` at `offset` of `mem` under `grant` (the protocol above).
#[inline]
pub fn write_under<G: Grant + ?Sized>(
    grant: &G,
    mem: &SharedMemory,
    offset: usize,
    data: &[u8],
) -> Access {
    if !mem.contains(offset, data.len()) {
        return Access::OutOfRange;
    }
    if grant.is_revoked() {
        return Access::Revoked;
    }
    mem.write(offset, data);
    fence(Ordering::SeqCst);
    if grant.is_revoked() {
        Access::Revoked
    } else {
        Access::Done
    }
}

/// Reads `dst.len()` bytes at `offset` of `mem` under `grant`: `Done`
/// means they are the region's bytes, not a copy's left behind.
#[inline]
pub fn read_under<G: Grant + ?Sized, M: Readable + ?Sized>(
    grant: &G,
    mem: &M,
    offset: usize,
    dst: &mut [u8],
) -> Access {
    if offset.checked_add(dst.len()).is_none_or(|e| e > mem.size()) {
        return Access::OutOfRange;
    }
    if grant.is_revoked() {
        return Access::Revoked;
    }
    mem.read_at(offset, dst);
    fence(Ordering::SeqCst);
    if grant.is_revoked() {
        Access::Revoked
    } else {
        Access::Done
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn a_borrower_sees_the_revocation_and_cannot_write_the_word() {
        let word = GrantWord::new("t").unwrap();
        let view = GrantView::open(word.read_only_fd().unwrap()).unwrap();
        assert!(!view.is_revoked());
        word.revoke();
        assert!(view.is_revoked() && word.is_revoked());
        // The borrower's descriptor is read-only: a writable mapping of
        // it is refused by the kernel.
        let fd = word.read_only_fd().unwrap();
        let err = SharedMemory::open(fd, GRANT_BYTES).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EACCES), "{err}");
    }

    #[test]
    fn accesses_check_bounds_before_anything_and_stop_once_revoked() {
        let mem = SharedMemory::create(&memfd_name("grant-mem"), 64).unwrap();
        let word = GrantWord::new("t").unwrap();
        assert_eq!(write_under(&word, &mem, 60, &[1; 8]), Access::OutOfRange);
        assert_eq!(
            write_under(&word, &mem, usize::MAX, &[1]),
            Access::OutOfRange
        );
        assert_eq!(write_under(&word, &mem, 8, &[7; 8]), Access::Done);
        let mut back = [0u8; 8];
        assert_eq!(read_under(&word, &mem, 8, &mut back), Access::Done);
        assert_eq!(back, [7; 8]);
        word.revoke();
        assert_eq!(write_under(&word, &mem, 0, &[9; 8]), Access::Revoked);
        let mut first = [0u8; 8];
        mem.read(0, &mut first);
        assert_eq!(first, [0; 8], "a revoked grant writes nothing");
        assert_eq!(read_under(&word, &mem, 8, &mut back), Access::Revoked);
    }

    /// A grant that is live at its first check and, right after that
    /// check, is taken back: the lender marks it and copies the region
    /// before the access's copy runs — the worst moment for a borrower.
    struct TakenBackAfterFirstCheck<'a> {
        revoked: Cell<bool>,
        take_back: Cell<Option<Box<dyn FnOnce() + 'a>>>,
    }

    impl Grant for TakenBackAfterFirstCheck<'_> {
        fn is_revoked(&self) -> bool {
            let was = self.revoked.get();
            if let Some(lender) = self.take_back.take() {
                self.revoked.set(true);
                lender();
            }
            was
        }
    }

    #[test]
    fn an_access_overtaken_by_the_take_back_is_not_reported_done() {
        let old = SharedMemory::create(&memfd_name("old"), 64).unwrap();
        let new = SharedMemory::create(&memfd_name("new"), 64).unwrap();
        let grant = TakenBackAfterFirstCheck {
            revoked: Cell::new(false),
            take_back: Cell::new(Some(Box::new(|| {
                new.copy_from(0, &old, 0, 64);
            }))),
        };
        // The write lands in the old region after the lender copied it:
        // reporting it done would lose it.
        assert_eq!(write_under(&grant, &old, 0, &[5; 8]), Access::Revoked);
        let mut copied = [0u8; 8];
        new.read(0, &mut copied);
        assert_eq!(copied, [0; 8]);

        let grant = TakenBackAfterFirstCheck {
            revoked: Cell::new(false),
            take_back: Cell::new(Some(Box::new(|| {
                new.write(0, &[6; 8]);
            }))),
        };
        // A read of the old region after the move may miss what others
        // wrote to the new one since.
        let mut back = [0u8; 8];
        assert_eq!(read_under(&grant, &old, 0, &mut back), Access::Revoked);
    }
}
