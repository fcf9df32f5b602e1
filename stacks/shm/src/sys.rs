//! The operating-system and raw-memory layer: every `unsafe` of the crate
//! that is not an atomic in shared memory lives here.
//!
//! - [`SharedMemory`]: a sealed memfd, created or received, and its shared
//!   mapping, with bounds-checked accessors (atomics, copies in and out).
//!   Nothing outside this module holds a pointer into the mapping.
//! - [`EventFd`]: a non-blocking eventfd used as a doorbell.
//! - [`send_with_fds`] / [`recv_with_fds`]: a datagram of bytes and file
//!   descriptors over a Unix socket (`SCM_RIGHTS`).
//! - [`futex_wait`] / [`futex_wake`]: shared (not process-private) futexes on
//!   a word of a mapping.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::time::Duration;

/// Returns `Err(last_os_error)` when a libc call returned -1.
fn check(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// A shared memory object (memfd) mapped read-write into this process.
///
/// The creator seals the file against shrinking, so a peer cannot make our
/// mapping fault (`SIGBUS`) by truncating it; a receiver checks that seal
/// before mapping. Every accessor checks its range against the mapping's
/// length, so offsets read from the shared memory itself are safe to pass.
pub struct SharedMemory {
    fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; every access goes through
// atomics or raw copies, which are sound from any thread.
unsafe impl Send for SharedMemory {}
// SAFETY: as above; no method hands out a Rust reference to non-atomic bytes.
unsafe impl Sync for SharedMemory {}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory")
            .field("fd", &self.fd.as_raw_fd())
            .field("len", &self.len)
            .finish()
    }
}

impl SharedMemory {
    /// Creates a zeroed memfd of `len` bytes named `name` (the name shows in
    /// `/proc/PID/fd`), seals its size and maps it.
    pub fn create(name: &CStr, len: usize) -> io::Result<SharedMemory> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty region"));
        }
        // SAFETY: `name` is a valid C string; the flags are valid.
        let raw = check(unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        })?;
        // SAFETY: memfd_create returned a fresh descriptor we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "region too large"))?;
        // SAFETY: plain syscalls on a descriptor we own.
        check(unsafe { libc::ftruncate(fd.as_raw_fd(), size) })?;
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) })?;
        Self::map(fd, len)
    }

    /// Maps a memfd received from another process, after checking that it
    /// is sealed against shrinking and exactly `len` bytes long.
    pub fn open(fd: OwnedFd, len: usize) -> io::Result<SharedMemory> {
        check_received(&fd, len)?;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> io::Result<SharedMemory> {
        let ptr = map_shared(&fd, len, libc::PROT_READ | libc::PROT_WRITE)?;
        Ok(SharedMemory { fd, ptr, len })
    }

    /// The first byte of the mapping, for a caller that keeps its own
    /// discipline over who touches which bytes when (the methods here
    /// never hand out references to non-atomic bytes; whoever turns this
    /// into one answers for it).
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes mapped.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: regions are created non-empty.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd, to hand to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Whether `[offset, offset + len)` lies inside the mapping.
    #[inline]
    pub fn contains(&self, offset: usize, len: usize) -> bool {
        offset.checked_add(len).is_some_and(|end| end <= self.len)
    }

    /// The 64-bit atomic at `offset`; `None` when out of bounds or not
    /// 8-byte aligned.
    #[inline]
    pub fn atomic_u64(&self, offset: usize) -> Option<&AtomicU64> {
        if !offset.is_multiple_of(8) || !self.contains(offset, 8) {
            return None;
        }
        // SAFETY: in bounds and aligned (the mapping is page-aligned); the
        // memory lives as long as `self`; AtomicU64 has u64's layout and
        // any bit pattern is a valid value.
        Some(unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() })
    }

    /// The 32-bit atomic at `offset`; `None` when out of bounds or not
    /// 4-byte aligned.
    #[inline]
    pub fn atomic_u32(&self, offset: usize) -> Option<&AtomicU32> {
        if !offset.is_multiple_of(4) || !self.contains(offset, 4) {
            return None;
        }
        // SAFETY: as in `atomic_u64`.
        Some(unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU32>() })
    }

    /// Copies `src` into the mapping at `offset`; `false` (and nothing
    /// written) when the range is out of bounds.
    #[inline]
    pub fn write(&self, offset: usize, src: &[u8]) -> bool {
        if !self.contains(offset, src.len()) {
            return false;
        }
        // SAFETY: the destination range is inside the mapping; `src` is a
        // private buffer, so the ranges cannot overlap. Another process may
        // touch the same bytes; only the bytes, never our memory safety,
        // depend on it.
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.as_ptr().add(offset), src.len())
        };
        true
    }

    /// Copies bytes at `offset` of the mapping into `dst`; `false` (and
    /// nothing read) when the range is out of bounds.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        if !self.contains(offset, dst.len()) {
            return false;
        }
        // SAFETY: the source range is inside the mapping; `dst` is private.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        true
    }

    /// Appends `len` bytes at `offset` of the mapping to `dst`; `false`
    /// (and nothing appended) when the range is out of bounds.
    #[inline]
    pub fn read_into(&self, offset: usize, len: usize, dst: &mut bytes::BytesMut) -> bool {
        if !self.contains(offset, len) {
            return false;
        }
        dst.reserve(len);
        let spare = dst.spare_capacity_mut();
        // SAFETY: the source range is inside the mapping; `spare` holds at
        // least `len` bytes after `reserve`, and after the copy they are
        // initialised, so growing the length by `len` is sound.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                spare.as_mut_ptr().cast::<u8>(),
                len,
            );
            dst.set_len(dst.len() + len);
        }
        true
    }

    /// Copies `len` bytes from `src_offset` of `src` to `dst_offset` of this
    /// mapping (the two may be the same mapping; overlapping ranges are
    /// copied as by `memmove`). `false` (and nothing copied) when either
    /// range is out of bounds.
    #[inline]
    pub fn copy_from(
        &self,
        dst_offset: usize,
        src: &SharedMemory,
        src_offset: usize,
        len: usize,
    ) -> bool {
        if !self.contains(dst_offset, len) || !src.contains(src_offset, len) {
            return false;
        }
        // SAFETY: both ranges are inside their mappings; `copy` allows overlap.
        unsafe {
            std::ptr::copy(
                src.ptr.as_ptr().add(src_offset),
                self.ptr.as_ptr().add(dst_offset),
                len,
            )
        };
        true
    }

    /// A new descriptor of the same memfd opened read-only, to hand to a
    /// process that may read the memory but not write it: a shared
    /// writable mapping of it fails (`EACCES`), whatever the process does.
    pub fn reopen_read_only(&self) -> io::Result<OwnedFd> {
        let path = std::ffi::CString::new(format!("/proc/self/fd/{}", self.fd.as_raw_fd()))
            .map_err(|_| io::Error::other("descriptor path"))?;
        // SAFETY: a valid C string and valid flags.
        let raw = check(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
        // SAFETY: open returned a fresh descriptor we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(raw) })
    }

    /// Sets `len` bytes at `offset` to `byte`; `false` when out of bounds.
    pub fn fill(&self, offset: usize, len: usize, byte: u8) -> bool {
        if !self.contains(offset, len) {
            return false;
        }
        // SAFETY: the range is inside the mapping.
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr().add(offset), byte, len) };
        true
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`; no reference
        // into it outlives `self` (accessors borrow `self`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Size of the file behind `fd`.
pub fn file_size(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::zeroed();
    // SAFETY: fstat writes a whole `stat` into the buffer on success.
    check(unsafe { libc::fstat(fd.as_raw_fd(), st.as_mut_ptr()) })?;
    // SAFETY: fstat succeeded, so the struct is initialised.
    let st = unsafe { st.assume_init() };
    u64::try_from(st.st_size).map_err(|_| io::Error::other("negative file size"))
}

/// Checks a memfd received from another process: sealed against
/// shrinking (so a mapping of it cannot fault) and exactly `len` bytes.
fn check_received(fd: &OwnedFd, len: usize) -> io::Result<()> {
    // SAFETY: plain syscall on a descriptor we own.
    let seals = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) })?;
    if seals & libc::F_SEAL_SHRINK == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "shared memory is not sealed against shrinking",
        ));
    }
    let size = file_size(fd.as_fd())?;
    if size != len as u64 || len == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("shared memory is {size} bytes, {len} expected"),
        ));
    }
    Ok(())
}

/// A shared mapping of the first `len` bytes of `fd` with protection
/// `prot`, at an address the kernel chooses.
fn map_shared(fd: &OwnedFd, len: usize, prot: libc::c_int) -> io::Result<NonNull<u8>> {
    // SAFETY: a fresh shared mapping of a file at least `len` long (its
    // size is checked or set by the caller and sealed).
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            prot,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned a null mapping"))
}

/// A shared memory object (memfd) mapped read-only into this process:
/// what a process reads that another owns (a lent memory region, the word
/// that says whether the loan still stands).
pub struct ReadOnlyMemory {
    _fd: OwnedFd,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: as for `SharedMemory`: reads go through raw copies and atomics.
unsafe impl Send for ReadOnlyMemory {}
// SAFETY: as above; no method hands out a reference to non-atomic bytes.
unsafe impl Sync for ReadOnlyMemory {}

impl std::fmt::Debug for ReadOnlyMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadOnlyMemory")
            .field("len", &self.len)
            .finish()
    }
}

impl ReadOnlyMemory {
    /// Maps a received memfd read-only, after checking that it is sealed
    /// against shrinking and exactly `len` bytes long.
    pub fn open(fd: OwnedFd, len: usize) -> io::Result<ReadOnlyMemory> {
        check_received(&fd, len)?;
        let ptr = map_shared(&fd, len, libc::PROT_READ)?;
        Ok(ReadOnlyMemory { _fd: fd, ptr, len })
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: an empty region is refused by `open`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The 64-bit word at `offset`, read with acquire ordering; `None`
    /// when out of bounds or not 8-byte aligned.
    #[inline]
    pub fn load_u64(&self, offset: usize) -> Option<u64> {
        if !offset.is_multiple_of(8) || offset.checked_add(8).is_none_or(|e| e > self.len) {
            return None;
        }
        // SAFETY: in bounds and aligned; an atomic load only reads, which a
        // read-only mapping allows; the memory lives as long as `self`.
        let word = unsafe { &*self.ptr.as_ptr().add(offset).cast::<AtomicU64>() };
        Some(word.load(std::sync::atomic::Ordering::Acquire))
    }

    /// Copies bytes at `offset` into `dst`; `false` (and nothing read)
    /// when the range is out of bounds.
    #[inline]
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> bool {
        if offset.checked_add(dst.len()).is_none_or(|e| e > self.len) {
            return false;
        }
        // SAFETY: the source range is inside the mapping; `dst` is private.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                dst.as_mut_ptr(),
                dst.len(),
            )
        };
        true
    }
}

impl Drop for ReadOnlyMemory {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `open` mapped.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// A non-blocking eventfd: a doorbell another process can ring.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd with a zero counter.
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: plain syscall.
        let raw = check(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: a fresh descriptor we own.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(raw) }))
    }

    /// Wraps a received descriptor, checking that it is an eventfd and
    /// making it non-blocking.
    pub fn from_fd(fd: OwnedFd) -> io::Result<EventFd> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if link.as_os_str() != "anon_inode:[eventfd]" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "descriptor is not an eventfd",
            ));
        }
        // SAFETY: plain syscalls on a descriptor we own.
        let flags = check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) })?;
        // SAFETY: as above.
        check(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK) })?;
        Ok(EventFd(fd))
    }

    /// Rings the doorbell: adds one to the counter. A full counter (the
    /// other side never drains) is ignored: the bell is already ringing.
    #[inline]
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes every ring so far; `Ok(true)` if there was any, `Ok(false)` if
    /// the counter was zero.
    #[inline]
    pub fn drain(&self) -> io::Result<bool> {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64.
        let n = unsafe { libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
        if n == 8 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            Ok(false)
        } else {
            Err(e)
        }
    }

    /// Blocks until the doorbell rings or `timeout` passes; `Ok(true)` when
    /// it rang (and takes the rings).
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        if self.drain()? {
            return Ok(true);
        }
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as libc::c_int);
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            return if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            };
        }
        self.drain()
    }
}

/// Registers `bell` with the current tokio runtime's reactor for read
/// readiness. Must be called inside a runtime.
pub fn register_bell(bell: EventFd) -> io::Result<tokio::io::unix::AsyncFd<EventFd>> {
    // SAFETY: the descriptor is owned by `bell`, which the AsyncFd owns and
    // never swaps out; it stays open and the same until the AsyncFd drops.
    let fd = unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(bell, tokio::io::Interest::READABLE)
    };
    fd.map_err(io::Error::from)
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 8;

/// Sends `data` and the descriptors `fds` as one message on the Unix
/// socket `sock` (`SCM_RIGHTS`). Non-blocking sockets may return
/// `WouldBlock`.
pub fn send_with_fds(
    sock: BorrowedFd<'_>,
    data: &[u8],
    fds: &[BorrowedFd<'_>],
) -> io::Result<usize> {
    if fds.len() > MAX_FDS || data.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad fd message",
        ));
    }
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let fd_bytes = std::mem::size_of_val(raw.as_slice());
    // SAFETY: CMSG_SPACE is a pure computation.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds CMSG_SPACE(fd_bytes) bytes, so
        // the first header and its data fit.
        unsafe {
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr().cast::<u8>(),
                libc::CMSG_DATA(cmsg),
                fd_bytes,
            );
        }
    }
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// Receives one message into `data` and up to [`MAX_FDS`] descriptors into
/// `fds` (marked close-on-exec). Returns the bytes received; `Ok(0)` is the
/// end of the stream. A message whose descriptors did not fit is an error
/// (and the descriptors that did arrive are closed).
pub fn recv_with_fds(
    sock: BorrowedFd<'_>,
    data: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<usize> {
    // SAFETY: pure computation.
    let space =
        unsafe { libc::CMSG_SPACE((MAX_FDS * std::mem::size_of::<RawFd>()) as u32) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    let mut iov = libc::iovec {
        iov_base: data.as_mut_ptr().cast(),
        iov_len: data.len(),
    };
    // SAFETY: zeroed msghdr is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: `msg` points at live buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let before = fds.len();
    // SAFETY: walks the control messages the kernel wrote, within
    // `msg_controllen`; each SCM_RIGHTS payload holds whole descriptors.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let header = libc::CMSG_LEN(0) as usize;
                let bytes = ((*cmsg).cmsg_len as usize).saturating_sub(header);
                let count = bytes / std::mem::size_of::<RawFd>();
                let base = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for i in 0..count {
                    let fd = std::ptr::read_unaligned(base.add(i));
                    if fd >= 0 {
                        fds.push(OwnedFd::from_raw_fd(fd));
                    }
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        fds.truncate(before);
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "too many descriptors in one message",
        ));
    }
    Ok(n as usize)
}

/// Sleeps while the shared word at `word` equals `expected`, at most
/// `timeout`. Returns on a wake, a changed value, a signal or the timeout;
/// callers re-check their condition.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: FUTEX_WAIT (shared) on a live, aligned 32-bit word; the
    // kernel only reads it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            ts_ptr,
        )
    };
}

/// Wakes up to `count` waiters sleeping on the shared word at `word`, in
/// any process that maps it.
pub fn futex_wake(word: &AtomicU32, count: i32) {
    // SAFETY: FUTEX_WAKE (shared) on a live, aligned 32-bit word.
    unsafe { libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, count) };
}

/// Pins the calling thread to `cpu`; errors are returned, not fatal.
pub fn pin_to_cpu(cpu: usize) -> io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET stays in bounds
    // for cpu < CPU_SETSIZE, which is checked.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "no such cpu"));
        }
        libc::CPU_SET(cpu, &mut set);
        check(libc::sched_setaffinity(
            0,
            std::mem::size_of::<libc::cpu_set_t>(),
            &set,
        ))?;
    }
    Ok(())
}

/// A name for a memfd: `uniplane-` and `what`, cut at interior NULs.
pub fn memfd_name(what: &str) -> std::ffi::CString {
    let clean: String = what.chars().filter(|c| *c != '\0').take(200).collect();
    std::ffi::CString::new(format!("uniplane-{clean}")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accessors_refuse_out_of_bounds_ranges() {
        let m = SharedMemory::create(&memfd_name("t"), 4096).unwrap();
        assert!(m.write(4090, &[1; 6]));
        assert!(!m.write(4091, &[1; 6]));
        assert!(!m.write(usize::MAX, &[1]));
        let mut b = [0u8; 6];
        assert!(m.read(4090, &mut b));
        assert_eq!(b, [1; 6]);
        assert!(m.atomic_u64(4088).is_some());
        assert!(m.atomic_u64(4092).is_none(), "out of bounds");
        assert!(m.atomic_u64(4).is_none(), "misaligned");
    }

    #[test]
    fn a_received_region_must_be_sealed_and_of_the_announced_size() {
        let m = SharedMemory::create(&memfd_name("t"), 8192).unwrap();
        let dup = m.fd().try_clone_to_owned().unwrap();
        assert!(SharedMemory::open(dup, 4096).is_err());
        let dup = m.fd().try_clone_to_owned().unwrap();
        let other = SharedMemory::open(dup, 8192).unwrap();
        assert!(m.write(100, b"hi"));
        let mut b = [0u8; 2];
        assert!(other.read(100, &mut b));
        assert_eq!(&b, b"hi");
    }

    #[test]
    fn an_eventfd_doorbell_is_taken_once() {
        let e = EventFd::new().unwrap();
        assert!(!e.drain().unwrap());
        e.ring();
        e.ring();
        assert!(e.drain().unwrap());
        assert!(!e.drain().unwrap());
    }

    #[test]
    fn descriptors_cross_a_unix_socket() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let e = EventFd::new().unwrap();
        send_with_fds(a.as_fd(), b"x", &[e.as_fd()]).unwrap();
        let mut buf = [0u8; 4];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(b.as_fd(), &mut buf, &mut fds).unwrap(), 1);
        let got = EventFd::from_fd(fds.pop().unwrap()).unwrap();
        e.ring();
        assert!(got.drain().unwrap());
    }

    #[test]
    fn a_non_eventfd_descriptor_is_refused() {
        let m = SharedMemory::create(&memfd_name("t"), 4096).unwrap();
        let dup = m.fd().try_clone_to_owned().unwrap();
        assert!(EventFd::from_fd(dup).is_err());
    }
}
