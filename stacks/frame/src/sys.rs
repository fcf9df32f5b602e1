//! Thin wrappers over the system calls the backends share.

use std::ffi::CString;
use std::io;
use std::mem::size_of;
use std::os::fd::RawFd;

use crate::MacAddr;

/// `-1` as an error, anything else as a value.
pub(crate) fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// Sets a socket option whose value is `T`.
pub(crate) fn setsockopt<T>(fd: RawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: the pointer and length describe a live `T`.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// The index of interface `name`.
pub(crate) fn ifindex(name: &str) -> io::Result<i32> {
    let c = CString::new(name).map_err(|_| io::Error::other("interface name with a NUL"))?;
    // SAFETY: a valid C string.
    let i = unsafe { libc::if_nametoindex(c.as_ptr()) };
    if i == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no interface {name}: {}", io::Error::last_os_error()),
        ));
    }
    Ok(i as i32)
}

fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: all-zero is a valid ifreq.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    let bytes = name.as_bytes();
    if bytes.len() >= req.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("interface name {name} is too long"),
        ));
    }
    for (d, s) in req.ifr_name.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok(req)
}

/// Runs an interface ioctl on a throwaway datagram socket.
fn if_ioctl(name: &str, request: libc::c_ulong) -> io::Result<libc::ifreq> {
    let mut req = ifreq(name)?;
    // SAFETY: plain socket creation.
    let fd = cvt(unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: `req` is a valid ifreq for these requests.
    let rc = unsafe { libc::ioctl(fd, request as _, &mut req) };
    let err = io::Error::last_os_error();
    // SAFETY: closing the descriptor opened above.
    unsafe { libc::close(fd) };
    if rc < 0 {
        return Err(err);
    }
    Ok(req)
}

/// The hardware address of interface `name`.
pub(crate) fn if_mac(name: &str) -> io::Result<MacAddr> {
    let req = if_ioctl(name, libc::SIOCGIFHWADDR)?;
    // SAFETY: SIOCGIFHWADDR fills the sockaddr member of the union.
    let sa = unsafe { req.ifr_ifru.ifru_hwaddr };
    let mut m = [0u8; 6];
    for (d, s) in m.iter_mut().zip(sa.sa_data.iter()) {
        *d = *s as u8;
    }
    Ok(MacAddr(m))
}

/// The MTU of interface `name`.
pub(crate) fn if_mtu(name: &str) -> io::Result<usize> {
    let req = if_ioctl(name, libc::SIOCGIFMTU)?;
    // SAFETY: SIOCGIFMTU fills the mtu member of the union.
    Ok(unsafe { req.ifr_ifru.ifru_mtu } as usize)
}

/// Whether `e` only says "try again later".
pub(crate) fn would_block(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EAGAIN) | Some(libc::EINTR) | Some(libc::ENOBUFS)
    )
}

/// An eventfd, for backends without a descriptor of their own.
pub(crate) fn eventfd() -> io::Result<RawFd> {
    // SAFETY: plain eventfd creation.
    cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })
}

/// Adds one to an eventfd's counter (waking its readers).
pub(crate) fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a live u64.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Resets an eventfd's counter.
pub(crate) fn eventfd_drain(fd: RawFd) {
    let mut v: u64 = 0;
    // SAFETY: reading 8 bytes into a live u64.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}
