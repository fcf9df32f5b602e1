//! The epoll backend of the UDP port: a non-blocking socket registered with
//! tokio's reactor, moved in bursts with `recvmmsg`/`sendmmsg`, with UDP
//! segmentation offload (GSO) on send and generic receive offload (GRO) on
//! receive when the kernel offers them.

use std::future::Future;
use std::io;
use std::mem::{size_of, zeroed, MaybeUninit};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

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
pub(crate) const GRO_SLOT: usize = 65_536;
/// Receive slots per `recvmmsg` with GRO (each slot 64 KiB).
const GRO_BATCH: usize = 8;
/// Sends one `poll_send` tries between waits for writability.
const MAX_SEND_TRIES: usize = 1024;
/// Bytes the receive chunk grows by at least, so small bursts share one
/// allocation.
const RX_CHUNK: usize = 256 << 10;
/// Room for one `cmsghdr` with an `int` or `u16` value, 8-byte aligned.
pub(crate) type CmsgBuf = [u64; 4];

/// Receive slots and the `recvmmsg` headers pointing into them, built once
/// per port: a burst only re-arms the headers the last one used. Boxed
/// slices, never resized, so the pointers stay valid when the port moves.
struct RxSlots {
    slot: usize,
    buf: Box<[u8]>,
    iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    cmsgs: Box<[CmsgBuf]>,
    hdrs: Box<[libc::mmsghdr]>,
    gro: bool,
    /// Headers the kernel wrote in the last burst.
    used: usize,
}

// SAFETY: the raw pointers in the headers point into memory the struct
// owns, used only through `&mut self`.
unsafe impl Send for RxSlots {}

impl std::fmt::Debug for RxSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RxSlots").field("slot", &self.slot).finish()
    }
}

impl RxSlots {
    fn new(slot: usize, count: usize, gro: bool) -> Box<Self> {
        /// # Safety
        /// All-zero must be a valid `T` (a plain C struct).
        unsafe fn zeroed_slice<T>(count: usize) -> Box<[T]> {
            // SAFETY: the caller's promise.
            (0..count).map(|_| unsafe { zeroed() }).collect()
        }
        let mut rx = Box::new(RxSlots {
            slot,
            buf: vec![0u8; slot * count].into_boxed_slice(),
            // SAFETY: plain C structs, valid all-zero.
            iovs: unsafe { zeroed_slice(count) },
            names: unsafe { zeroed_slice(count) },
            cmsgs: vec![[0; 4]; count].into_boxed_slice(),
            hdrs: unsafe { zeroed_slice(count) },
            gro,
            used: count,
        });
        let base = rx.buf.as_mut_ptr();
        for i in 0..count {
            // SAFETY: slot i lies inside buf.
            rx.iovs[i].iov_base = unsafe { base.add(i * slot) }.cast();
            rx.iovs[i].iov_len = slot;
            let h = &mut rx.hdrs[i].msg_hdr;
            h.msg_name = (&mut rx.names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_iov = &mut rx.iovs[i];
            h.msg_iovlen = 1;
            if gro {
                h.msg_control = rx.cmsgs[i].as_mut_ptr().cast();
            }
        }
        rx.rearm();
        rx
    }

    /// Restores the lengths the kernel overwrote in the last burst.
    fn rearm(&mut self) {
        let control = if self.gro { size_of::<CmsgBuf>() } else { 0 };
        for h in &mut self.hdrs[..self.used] {
            h.msg_hdr.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            h.msg_hdr.msg_controllen = control as _;
            h.msg_hdr.msg_flags = 0;
            h.msg_len = 0;
        }
        self.used = 0;
    }
}

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

/// Longest a busy-polling receive keeps a task's poll before it lets the
/// runtime run the other tasks of its worker.
const SPIN_SLICE: Duration = Duration::from_micros(20);
/// Receives one spin slice makes at most (the clock ends it first).
const SPIN_TRIES: usize = 1 << 16;
/// Tries between two readings of the clock (each ~30 ns here, beside an
/// empty probe's ~350 ns).
const TRIES_PER_CLOCK: usize = 4;
/// Tries between two yields of the core: every [`TRIES_PER_CLOCK`]-th
/// reading. A yield with nothing else runnable still costs a system call
/// and a pass through the scheduler (~0.3 us here); one after every try
/// made the spin loop's period, and so a busy round trip, ~0.25 us longer
/// (4.22 against 3.95 us on loopback).
const TRIES_PER_YIELD: usize = 2 * TRIES_PER_CLOCK;

/// One busy-poll turn of a receive: `recv` (a non-blocking burst) is tried
/// over and over for up to [`SPIN_SLICE`], the thread yielding its core
/// every [`TRIES_PER_YIELD`] tries. `Ready(Some)` is what it got; `Pending` means nothing yet
/// and the task is already rescheduled behind the tasks ready on its
/// worker; `Ready(None)` means `budget` has passed since receives last
/// found anything: wait for a wake-up.
///
/// Yielding the core every few tries (`sched_yield`, a no-op when nothing
/// else is runnable there) is what makes this work unpinned: the kernel
/// wakes the peer of a ping-pong onto the core that woke it, and a spin
/// that kept the core would make the peer wait for the end of the slice,
/// where a yield hands the core over within a few probes (~3 us). `empty` says the last
/// receive left the socket empty: then the core is yielded before the
/// first try, which would only find nothing while a peer on this core has
/// not run.
pub(crate) fn busy_poll<T>(
    idle_since: &mut Option<Instant>,
    budget: Duration,
    empty: bool,
    cx: &mut Context<'_>,
    mut recv: impl FnMut() -> io::Result<T>,
) -> Poll<Option<io::Result<T>>>
where
    T: Into<usize> + Copy,
{
    let start = Instant::now();
    let since = *idle_since.get_or_insert(start);
    if start.duration_since(since) >= budget {
        return Poll::Ready(None);
    }
    let until = (since + budget).min(start + SPIN_SLICE);
    if empty {
        std::thread::yield_now();
    }
    for tries in 1..=SPIN_TRIES {
        match recv() {
            Ok(n) if n.into() > 0 => {
                *idle_since = None;
                return Poll::Ready(Some(Ok(n)));
            }
            Ok(_) => {}
            Err(e) if spin_on(&e) => {}
            Err(e) => return Poll::Ready(Some(Err(e))),
        }
        if tries % TRIES_PER_CLOCK != 0 {
            std::hint::spin_loop();
            continue;
        }
        if Instant::now() >= until {
            break;
        }
        if tries % TRIES_PER_YIELD == 0 {
            std::thread::yield_now();
        }
    }
    // The runtime's own yield: behind the tasks ready now, without waking
    // the reactor the way a plain self-wake does.
    let yielding = std::pin::pin!(tokio::task::yield_now());
    if yielding.poll(cx).is_ready() {
        cx.waker().wake_by_ref();
    }
    Poll::Pending
}

/// Errors a busy-polling receive treats as "nothing yet".
fn spin_on(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted | io::ErrorKind::ConnectionRefused
    )
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
    /// The socket, registered for reading only: write interest would wake
    /// the reactor after every send, when the kernel frees its buffer.
    fd: Reactor,
    /// A duplicate of the socket's descriptor registered for writing,
    /// made the first time a send finds the socket full.
    writer: Option<Box<AsyncFd<Socket>>>,
    io: Bursts,
    /// How long receives keep polling before they wait for epoll.
    busy_poll: Option<Duration>,
    /// Since when receives have found nothing while busy polling.
    idle_since: Option<Instant>,
}

/// Where a port's socket stands with tokio's reactor. A busy-polling port
/// takes its socket out while it spins: a socket in an epoll set makes
/// every arriving datagram run epoll's callback under its lock (0.55 us of
/// a 4 us round trip on loopback here), which a receive that is spinning
/// anyway does not need. It goes back in when the spin gives up.
#[derive(Debug)]
enum Reactor {
    In(AsyncFd<Socket>),
    Out(Socket),
    /// Only while moving between the two, or after registering failed
    /// and lost the socket (never, with tokio's registration).
    Moving,
}

impl Reactor {
    fn socket(&self) -> io::Result<&Socket> {
        match self {
            Reactor::In(fd) => Ok(fd.get_ref()),
            Reactor::Out(s) => Ok(s),
            Reactor::Moving => Err(io::Error::other("udp socket lost to a failed registration")),
        }
    }

    /// Takes the socket out of the reactor (no-op when out).
    fn leave(&mut self) {
        if let Reactor::In(_) = self {
            if let Reactor::In(fd) = std::mem::replace(self, Reactor::Moving) {
                *self = Reactor::Out(fd.into_inner());
            }
        }
    }

    /// The socket's registration, registering it again if it was out.
    /// Registering reports data queued meanwhile as readiness, so nothing
    /// that came during the spin waits for a later datagram.
    fn enter(&mut self) -> io::Result<&mut AsyncFd<Socket>> {
        if let Reactor::Out(_) = self {
            if let Reactor::Out(socket) = std::mem::replace(self, Reactor::Moving) {
                // SAFETY: the port owns the socket, open for the
                // registration's lifetime.
                match unsafe {
                    AsyncFd::register_with_interest(socket, tokio::io::Interest::READABLE)
                } {
                    Ok(fd) => *self = Reactor::In(fd),
                    Err(e) => {
                        let (socket, cause) = e.into_parts();
                        *self = Reactor::Out(socket);
                        return Err(cause);
                    }
                }
            }
        }
        match self {
            Reactor::In(fd) => Ok(fd),
            _ => Err(io::Error::other("udp socket lost to a failed registration")),
        }
    }
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
    /// The slots the kernel receives into and their headers, set up once.
    rx: Box<RxSlots>,
    /// Whether the last receive left the socket empty.
    drained: bool,
    /// Where each burst's datagrams are copied, back to back, to be handed
    /// out as slices of one chunk.
    rx_out: BytesMut,
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
        busy_poll: Option<Duration>,
    ) -> io::Result<Self> {
        let offloads = probe_offloads(&socket, want);
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))?;
        let raw = socket.as_raw_fd();
        Ok(EpollPort {
            fd: Reactor::In(register(socket, tokio::io::Interest::READABLE)?),
            writer: None,
            io: Bursts {
                raw,
                local,
                connected,
                max_datagram: max_datagram.min(MAX_UDP_PAYLOAD),
                offloads,
                rx: RxSlots::new(0, 0, false),
                drained: false,
                rx_out: BytesMut::new(),
                stats: PortStats::default(),
            },
            busy_poll: busy_poll.filter(|d| !d.is_zero()),
            idle_since: None,
        })
    }

    /// The offloads in use.
    pub fn offloads(&self) -> Offloads {
        self.io.offloads
    }

    /// The socket.
    pub fn socket(&self) -> &Socket {
        match &self.fd {
            Reactor::In(fd) => fd.get_ref(),
            Reactor::Out(s) => s,
            // Unreachable: `Moving` lasts only inside `leave`/`enter`, and
            // a failed registration puts the socket back.
            Reactor::Moving => unreachable!("socket between registrations"),
        }
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
        if self.rx.slot != slot {
            // Once per port.
            self.rx = RxSlots::new(slot, limit, self.offloads.gro);
        }
        self.rx.rearm();
        let rc = if n == 1 && !self.offloads.gro {
            self.recv_one(slot)
        } else {
            // SAFETY: the headers point into `self.rx`, alive and sized as
            // declared; n <= the slots there.
            unsafe {
                libc::syscall(
                    libc::SYS_recvmmsg,
                    self.raw,
                    self.rx.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    libc::MSG_DONTWAIT,
                    std::ptr::null_mut::<libc::timespec>(),
                )
            }
        };
        if rc < 0 {
            self.drained = true;
            return Err(io::Error::last_os_error());
        }
        let got = rc as usize;
        self.rx.used = got;
        // Fewer than asked for: the queue was empty when the call ended.
        self.drained = got < n;
        let hdrs = &self.rx.hdrs;
        let names = &self.rx.names;

        // The slots are reused, so what arrived is copied out, back to back,
        // into one chunk handed out in slices: one copy of the bytes that
        // came and (amortised) no allocation, where handing out the slots
        // themselves would need fresh zeroed memory for every 64 KiB GRO
        // slot that a 64-byte datagram used.
        let total: usize = hdrs[..got]
            .iter()
            .map(|h| (h.msg_len as usize).min(slot))
            .sum();
        self.rx_out.clear();
        if self.rx_out.capacity() < total {
            self.rx_out.reserve(total.max(RX_CHUNK));
        }
        for (i, hdr) in hdrs.iter().enumerate().take(got) {
            let len = (hdr.msg_len as usize).min(slot);
            self.rx_out
                .extend_from_slice(&self.rx.buf[i * slot..i * slot + len]);
        }
        let chunk = self.rx_out.split().freeze();
        let mut at_chunk = 0;
        let mut appended = 0;
        for (i, hdr) in hdrs.iter().enumerate().take(got) {
            let len = (hdr.msg_len as usize).min(slot);
            let peer = socket_addr_from(&names[i], hdr.msg_hdr.msg_namelen);
            let data = chunk.slice(at_chunk..at_chunk + len);
            at_chunk += len;
            let Some(peer) = peer.or(self.connected) else {
                continue;
            };
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

    /// One datagram into slot 0, by `recvfrom`, its length and sender
    /// written where `recvmmsg` would have put them; returns as that call
    /// does (1, or -1 with errno set). A busy-polling receive asks for one
    /// datagram at a time, and most of its probes find none: `recvmmsg`
    /// copies in and checks a message header and an I/O vector on every
    /// probe, about a fifth of an empty probe's time on this machine's
    /// loopback, which `recvfrom` does not.
    fn recv_one(&mut self, slot: usize) -> libc::c_long {
        let mut namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        // SAFETY: slot 0 of the buffer holds `slot` bytes; the name storage
        // and its length are live and sized as declared.
        let rc = unsafe {
            libc::syscall(
                libc::SYS_recvfrom,
                self.raw,
                self.rx.buf.as_mut_ptr(),
                slot,
                libc::MSG_DONTWAIT,
                (&mut self.rx.names[0] as *mut libc::sockaddr_storage).cast::<libc::sockaddr>(),
                &mut namelen as *mut libc::socklen_t,
            )
        };
        if rc < 0 {
            return rc;
        }
        let hdr = &mut self.rx.hdrs[0];
        hdr.msg_len = rc as libc::c_uint;
        hdr.msg_hdr.msg_namelen = namelen;
        1
    }

    /// One `sendmmsg` of the front of `batch`; returns datagrams sent.
    fn send_burst(&mut self, batch: &TxBatch<SocketAddr>) -> io::Result<usize> {
        let mut hdrs = [const { MaybeUninit::<libc::mmsghdr>::uninit() }; MAX_BATCH];
        let mut iovs = [const { MaybeUninit::<libc::iovec>::uninit() }; MAX_BATCH];
        let mut names = [const { MaybeUninit::<SockAddr>::uninit() }; MAX_BATCH];
        let mut cmsgs = [const { MaybeUninit::<CmsgBuf>::uninit() }; MAX_BATCH];
        // How many datagrams of the batch each header carries.
        let mut carried = [0usize; MAX_BATCH];
        let mut n = 0;
        let mut next = 0;
        while n < MAX_BATCH {
            let Some(run) = gso_run(batch, next, self.offloads.gso) else {
                break;
            };
            let (dst, segs, seg_size) = (run.dst, run.segments, run.segment_size);
            let iov = iovs[n].write(libc::iovec {
                iov_base: run.bytes.as_ptr() as *mut libc::c_void,
                iov_len: run.bytes.len(),
            });
            // SAFETY: all-zero is a valid msghdr.
            let mut h: libc::msghdr = unsafe { zeroed() };
            h.msg_iov = iov;
            h.msg_iovlen = 1;
            if self.connected.is_none() {
                let name = names[n].write(SockAddr::from(dst));
                h.msg_name = name.as_ptr() as *mut libc::c_void;
                h.msg_namelen = name.len();
            }
            if segs > 1 {
                set_gso_segment(&mut h, cmsgs[n].write([0; 4]), seg_size);
            }
            hdrs[n].write(libc::mmsghdr {
                msg_hdr: h,
                msg_len: 0,
            });
            carried[n] = segs;
            next += segs;
            n += 1;
        }
        if n == 0 {
            return Ok(0);
        }
        let fd = self.raw;
        let rc = if n == 1 && carried[0] == 1 {
            // One datagram and no control message (a ping-pong's turn):
            // `sendto`, which copies in no message header or I/O vector.
            // SAFETY: header 0 is initialised; its one vector and its name
            // (if any) point at live memory sized as declared.
            let bytes = unsafe {
                let h = &hdrs[0].assume_init_ref().msg_hdr;
                let iov = &*h.msg_iov;
                libc::syscall(
                    libc::SYS_sendto,
                    fd,
                    iov.iov_base,
                    iov.iov_len,
                    0,
                    h.msg_name,
                    h.msg_namelen,
                )
            };
            // Bytes sent, as one datagram: one header's worth, as sendmmsg counts.
            if bytes < 0 {
                bytes
            } else {
                1
            }
        } else {
            // SAFETY: the first n headers are initialised and point at live
            // buffers sized as declared. (The raw call skips libc's
            // cancellation bookkeeping.)
            unsafe {
                libc::syscall(
                    libc::SYS_sendmmsg,
                    fd,
                    hdrs.as_mut_ptr().cast::<libc::mmsghdr>(),
                    n as libc::c_uint,
                    0,
                )
            }
        };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        self.stats.tx_calls += 1;
        let sent: usize = carried[..rc as usize].iter().sum();
        self.stats.tx_datagrams += sent as u64;
        Ok(sent)
    }
}

/// Points `h`'s control data at `cbuf` and writes one `UDP_SEGMENT`
/// message there: the kernel cuts the send into datagrams of `segment`
/// bytes (GSO). `cbuf` must stay where it is until the send is done.
pub(crate) fn set_gso_segment(h: &mut libc::msghdr, cbuf: &mut CmsgBuf, segment: usize) {
    *cbuf = [0; 4];
    h.msg_control = cbuf.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE of a u16 fits the 32-byte buffer.
    h.msg_controllen = unsafe { libc::CMSG_SPACE(size_of::<u16>() as u32) } as _;
    // SAFETY: the control buffer is set and large enough.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(h);
        (*c).cmsg_level = libc::SOL_UDP;
        (*c).cmsg_type = libc::UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<u16>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment as u16);
    }
}

/// Datagrams of a batch that leave in one send.
pub(crate) struct Run<'a> {
    /// Their destination.
    pub dst: SocketAddr,
    /// How many datagrams.
    pub segments: usize,
    /// Length of each but the last (which may be shorter).
    pub segment_size: usize,
    /// Their bytes, back to back.
    pub bytes: &'a [u8],
}

/// The datagrams from the `at`-th unsent one of `batch` that travel as
/// one send: with `gso`, a run to one peer, all as long as the first but
/// the last, within the kernel's segment and size limits; without, one.
pub(crate) fn gso_run(batch: &TxBatch<SocketAddr>, at: usize, gso: bool) -> Option<Run<'_>> {
    let (dst, first) = batch.get(at)?;
    let mut segs = 1;
    let mut bytes = first.len();
    if gso && !first.is_empty() {
        while segs < MAX_GSO_SEGMENTS {
            match batch.get(at + segs) {
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
    Some(Run {
        dst,
        segments: segs,
        segment_size: first.len(),
        bytes: batch.run(at, segs)?,
    })
}

/// The segment size the kernel reports for a GRO-coalesced receive.
pub(crate) fn gro_segment_size(hdr: &libc::msghdr) -> Option<usize> {
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
        if let Some(budget) = self
            .busy_poll
            .filter(|&b| self.idle_since.is_none_or(|t| t.elapsed() < b))
        {
            // Out of the reactor only while spinning: a port woken by it
            // receives through it first (below), then spins again.
            self.fd.leave();
            let empty = self.io.drained;
            match busy_poll(&mut self.idle_since, budget, empty, cx, || {
                // Probing an empty socket asks for one datagram: a longer
                // burst would cost every probe that finds one a second
                // look at the queue (0.2 us of a 4 us round trip here).
                // The receive after a hit asks for the full burst again.
                let n = if self.io.drained { 1 } else { max };
                self.io.recv_burst(out, n)
            }) {
                Poll::Ready(Some(r)) => return Poll::Ready(r),
                Poll::Ready(None) => {}
                Poll::Pending => return Poll::Pending,
            }
        }
        loop {
            let mut guard = ready!(self.fd.enter()?.poll_read_ready(cx))?;
            match self.io.recv_burst(out, max) {
                Ok(0) => continue,
                Ok(n) => {
                    self.idle_since = None;
                    if self.io.drained {
                        // The burst came back short: the queue was empty,
                        // and with edge-triggered epoll any later datagram
                        // is a new event. Saying so now spares the next
                        // poll a receive that would only find nothing.
                        guard.clear_ready();
                    }
                    return Poll::Ready(Ok(n));
                }
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
        // Sends are tried first: a UDP socket is nearly always writable, and
        // the port asks epoll about writability only once a send found it
        // full (see `writer`).
        for _ in 0..MAX_SEND_TRIES {
            if batch.is_empty() {
                return Poll::Ready(Ok(()));
            }
            match self.io.send_burst(batch) {
                Ok(n) => {
                    batch.mark_sent(n);
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A device without checksum offload refuses GSO: go on without.
                Err(e) if self.io.offloads.gso && e.raw_os_error() == Some(libc::EIO) => {
                    self.io.offloads.gso = false;
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
            let writer = match &mut self.writer {
                Some(w) => w,
                none => none.insert(Box::new(register(
                    self.fd.socket()?.try_clone()?,
                    tokio::io::Interest::WRITABLE,
                )?)),
            };
            // Registering reports the socket writable if it is by now;
            // the send is tried again either way, so the readiness seen
            // here is spent at once.
            let mut guard = ready!(writer.poll_write_ready(cx))?;
            guard.clear_ready();
        }
        // Sent and refused in turn many times: let other tasks run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn stats(&self) -> PortStats {
        self.io.stats
    }
}
