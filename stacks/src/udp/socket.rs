//! The epoll backend of the UDP port: a non-blocking socket registered with
//! tokio's reactor, moved in bursts with `recvmmsg`/`sendmmsg`, with UDP
//! segmentation offload (GSO) on send and generic receive offload (GRO) on
//! receive when the kernel offers them.

use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use socket2::{SockAddr, Socket};

use tokio::io::unix::AsyncFd;

use crate::datagram::{Datagram, DatagramPort, PortStats, TxBatch};

/// Most datagrams (or GSO super-datagrams) one system call moves.
pub(crate) const MAX_BATCH: usize = 64;
/// Largest UDP payload over IPv4.
pub(crate) const MAX_UDP_PAYLOAD: usize = 65_507;
/// Most segments the kernel accepts in one GSO send.
const MAX_GSO_SEGMENTS: usize = 64;
/// Receive slot size with GRO: a coalesced datagram can be this large.
const GRO_SLOT: usize = 65_536;
/// Receive slots per `recvmmsg` with GRO (each slot 64 KiB).
const GRO_BATCH: usize = 8;
/// Room for one `cmsghdr` with an `int` or `u16` value, 8-byte aligned.
type CmsgBuf = [u64; 4];

/// What the kernel offers, probed on the socket at run time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offloads {
    /// UDP_SEGMENT: one send carries many equal-sized datagrams.
    pub gso: bool,
    /// UDP_GRO: one receive returns many datagrams coalesced.
    pub gro: bool,
}

/// The socket address the kernel wrote into `storage`, if it is IP.
pub(crate) fn socket_addr_from(
    storage: &libc::sockaddr_storage,
    len: libc::socklen_t,
) -> Option<SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    match storage.ss_family as i32 {
        libc::AF_INET if len as usize >= size_of::<libc::sockaddr_in>() => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a =
                unsafe { &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(u32::from_be(a.sin_addr.s_addr));
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= size_of::<libc::sockaddr_in6>() => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a = unsafe {
                &*(storage as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>()
            };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            Some(SocketAddr::V6(SocketAddrV6::new(
                ip,
                u16::from_be(a.sin6_port),
                a.sin6_flowinfo,
                a.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// Registers `inner` with tokio's reactor.
pub(crate) fn register<T: AsRawFd>(
    inner: T,
    interest: tokio::io::Interest,
) -> io::Result<AsyncFd<T>> {
    // SAFETY: callers pass owners of their descriptor (a socket, or a ring
    // dropped only after its registration), so it stays open and the same
    // for the registration's lifetime.
    Ok(unsafe { AsyncFd::register_with_interest(inner, interest) }?)
}

/// Sets an integer socket option.
fn setsockopt_int(fd: RawFd, level: i32, name: i32, value: i32) -> io::Result<()> {
    // SAFETY: the pointer and length describe a live i32.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&value as *const i32).cast(),
            size_of::<i32>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Turns on the offloads `want` asks for that the kernel accepts.
pub(crate) fn probe_offloads(socket: &Socket, want: Offloads) -> Offloads {
    let fd = socket.as_raw_fd();
    Offloads {
        gso: want.gso && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_SEGMENT, 0).is_ok(),
        gro: want.gro && setsockopt_int(fd, libc::SOL_UDP, libc::UDP_GRO, 1).is_ok(),
    }
}

/// A UDP socket moved in bursts: the epoll backend of the UDP port.
#[derive(Debug)]
pub struct EpollPort {
    fd: AsyncFd<Socket>,
    io: Bursts,
}

/// Everything of the port but its registration, so a burst can run while
/// a readiness guard borrows the registration.
#[derive(Debug)]
struct Bursts {
    raw: RawFd,
    local: SocketAddr,
    /// The peer a connected socket talks to; sends then carry no address.
    connected: Option<SocketAddr>,
    max_datagram: usize,
    offloads: Offloads,
    /// Initialised receive memory; each burst is split off its front.
    rx_buf: BytesMut,
    stats: PortStats,
}

impl EpollPort {
    /// Wraps a bound, non-blocking socket; must be called inside a tokio
    /// runtime. `connected` is the peer of a connected socket.
    pub(crate) fn new(
        socket: Socket,
        connected: Option<SocketAddr>,
        max_datagram: usize,
        want: Offloads,
    ) -> io::Result<Self> {
        let offloads = probe_offloads(&socket, want);
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))?;
        let raw = socket.as_raw_fd();
        Ok(EpollPort {
            fd: register(
                socket,
                tokio::io::Interest::READABLE | tokio::io::Interest::WRITABLE,
            )?,
            io: Bursts {
                raw,
                local,
                connected,
                max_datagram: max_datagram.min(MAX_UDP_PAYLOAD),
                offloads,
                rx_buf: BytesMut::new(),
                stats: PortStats::default(),
            },
        })
    }

    /// The offloads in use.
    pub fn offloads(&self) -> Offloads {
        self.io.offloads
    }

    /// The socket.
    pub fn socket(&self) -> &Socket {
        self.fd.get_ref()
    }
}

impl Bursts {
    fn slot_size(&self) -> usize {
        if self.offloads.gro {
            GRO_SLOT
        } else {
            self.max_datagram
        }
    }

    /// One `recvmmsg`: fills up to `max` slots of the receive buffer and
    /// appends a datagram per slot (per segment with GRO).
    fn recv_burst(&mut self, out: &mut Vec<Datagram<SocketAddr>>, max: usize) -> io::Result<usize> {
        let slot = self.slot_size();
        let limit = if self.offloads.gro {
            GRO_BATCH
        } else {
            MAX_BATCH
        };
        let n = max.clamp(1, limit);
        if self.rx_buf.len() < n * slot {
            // A fresh zeroed chunk for many bursts; the old one lives on in
            // the Bytes handed out until they are dropped.
            self.rx_buf = BytesMut::zeroed(slot * limit * 4);
        }
        let base = self.rx_buf.as_mut_ptr();
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
        let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { zeroed() };
        let mut names: [MaybeUninit<libc::sockaddr_storage>; MAX_BATCH] =
            [MaybeUninit::zeroed(); MAX_BATCH];
        let mut cmsgs: [CmsgBuf; MAX_BATCH] = [[0; 4]; MAX_BATCH];
        for i in 0..n {
            // SAFETY: slot i lies inside rx_buf, whose length is >= n * slot.
            iovs[i].iov_base = unsafe { base.add(i * slot) }.cast();
            iovs[i].iov_len = slot;
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = names[i].as_mut_ptr().cast();
            h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            if self.offloads.gro {
                h.msg_control = cmsgs[i].as_mut_ptr().cast();
                h.msg_controllen = size_of::<CmsgBuf>() as _;
            }
        }
        let fd = self.raw;
        // SAFETY: every header points at live buffers sized as declared.
        let rc = unsafe {
            libc::recvmmsg(
                fd,
                hdrs.as_mut_ptr(),
                n as u32,
                libc::MSG_DONTWAIT,
                std::ptr::null_mut(),
            )
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        let chunk = self.rx_buf.split_to(got * slot).freeze();
        let mut appended = 0;
        for (i, hdr) in hdrs.iter().enumerate().take(got) {
            let len = (hdr.msg_len as usize).min(slot);
            // SAFETY: the kernel wrote msg_namelen bytes of a sockaddr (and
            // the family field is zero-initialised otherwise).
            let peer = socket_addr_from(
                unsafe { names[i].assume_init_ref() },
                hdr.msg_hdr.msg_namelen,
            );
            let Some(peer) = peer.or(self.connected) else {
                continue;
            };
            let data = chunk.slice(i * slot..i * slot + len);
            let seg = if self.offloads.gro {
                gro_segment_size(&hdr.msg_hdr).unwrap_or(len)
            } else {
                len
            };
            if seg == 0 || seg >= len {
                out.push(Datagram { peer, data });
                appended += 1;
            } else {
                let mut at = 0;
                while at < len {
                    let end = (at + seg).min(len);
                    out.push(Datagram {
                        peer,
                        data: data.slice(at..end),
                    });
                    appended += 1;
                    at = end;
                }
            }
        }
        self.stats.rx_calls += 1;
        self.stats.rx_datagrams += appended as u64;
        Ok(appended)
    }

    /// One `sendmmsg` of the front of `batch`; returns datagrams sent.
    fn send_burst(&mut self, batch: &TxBatch<SocketAddr>) -> io::Result<usize> {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut hdrs: [libc::mmsghdr; MAX_BATCH] = unsafe { zeroed() };
        let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { zeroed() };
        let mut names: [Option<SockAddr>; MAX_BATCH] = std::array::from_fn(|_| None);
        let mut cmsgs: [CmsgBuf; MAX_BATCH] = [[0; 4]; MAX_BATCH];
        // How many datagrams of the batch each header carries.
        let mut carried = [0usize; MAX_BATCH];
        let mut n = 0;
        let mut next = 0;
        while n < MAX_BATCH {
            let Some((dst, first)) = batch.get(next) else {
                break;
            };
            let mut segs = 1;
            let mut bytes = first.len();
            if self.offloads.gso && !first.is_empty() {
                // A run of datagrams to one peer, all as long as the first
                // but the last, travels as one GSO send.
                while segs < MAX_GSO_SEGMENTS {
                    match batch.get(next + segs) {
                        Some((d, b))
                            if d == dst
                                && b.len() <= first.len()
                                && !b.is_empty()
                                && bytes + b.len() <= MAX_UDP_PAYLOAD =>
                        {
                            bytes += b.len();
                            segs += 1;
                            if b.len() < first.len() {
                                break;
                            }
                        }
                        _ => break,
                    }
                }
            }
            iovs[n].iov_base = first.as_ptr() as *mut libc::c_void;
            iovs[n].iov_len = bytes;
            let h = &mut hdrs[n].msg_hdr;
            h.msg_iov = &mut iovs[n];
            h.msg_iovlen = 1;
            if self.connected.is_none() {
                let name = names[n].insert(SockAddr::from(dst));
                h.msg_name = name.as_ptr() as *mut libc::c_void;
                h.msg_namelen = name.len();
            }
            if segs > 1 {
                let cbuf = &mut cmsgs[n];
                h.msg_control = cbuf.as_mut_ptr().cast();
                // SAFETY: CMSG_SPACE of a u16 fits the 32-byte buffer.
                h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
                // SAFETY: the control buffer is set and large enough.
                unsafe {
                    let c = libc::CMSG_FIRSTHDR(h);
                    (*c).cmsg_level = libc::SOL_UDP;
                    (*c).cmsg_type = libc::UDP_SEGMENT;
                    (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
                    std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), first.len() as u16);
                }
            }
            carried[n] = segs;
            next += segs;
            n += 1;
        }
        if n == 0 {
            return Ok(0);
        }
        let fd = self.raw;
        // SAFETY: every header points at live buffers sized as declared.
        let rc = unsafe { libc::sendmmsg(fd, hdrs.as_mut_ptr(), n as u32, 0) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        self.stats.tx_calls += 1;
        let sent: usize = carried[..rc as usize].iter().sum();
        self.stats.tx_datagrams += sent as u64;
        Ok(sent)
    }
}

/// The segment size the kernel reports for a GRO-coalesced receive.
fn gro_segment_size(hdr: &libc::msghdr) -> Option<usize> {
    // SAFETY: walks the control messages the kernel wrote into our buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(hdr);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_UDP && (*c).cmsg_type == libc::UDP_GRO {
                let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<i32>());
                return usize::try_from(v).ok();
            }
            c = libc::CMSG_NXTHDR(hdr, c);
        }
    }
    None
}

impl DatagramPort for EpollPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        self.io.local
    }

    fn max_datagram_size(&self) -> usize {
        self.io.max_datagram
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<SocketAddr>>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        loop {
            let mut guard = ready!(self.fd.poll_read_ready(cx))?;
            match self.io.recv_burst(out, max) {
                Ok(0) => continue,
                Ok(n) => return Poll::Ready(Ok(n)),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                // An ICMP error from an earlier send; the socket goes on.
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut TxBatch<SocketAddr>,
    ) -> Poll<io::Result<()>> {
        while !batch.is_empty() {
            let mut guard = ready!(self.fd.poll_write_ready(cx))?;
            match self.io.send_burst(batch) {
                Ok(n) => batch.mark_sent(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => guard.clear_ready(),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A device without checksum offload refuses GSO: go on without.
                Err(e) if self.io.offloads.gso && e.raw_os_error() == Some(libc::EIO) => {
                    self.io.offloads.gso = false;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        Poll::Ready(Ok(()))
    }

    fn stats(&self) -> PortStats {
        self.io.stats
    }
}
