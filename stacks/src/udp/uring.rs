//! The io_uring backend of the UDP port.
//!
//! Each port owns a small ring. Receives are always posted: a fixed set of
//! `RECVMSG` operations, one per slot of a preallocated buffer, re-posted as
//! they complete, so datagrams land while the task is busy elsewhere; the
//! task learns of completions through the ring's file descriptor in tokio's
//! reactor. A send burst is a chain of linked `SENDMSG` operations
//! submitted with one `io_uring_enter`, which also reaps completed
//! receives. Sends use `MSG_DONTWAIT`, so a full socket completes the chain
//! with `EAGAIN` at once and the port waits for writability through epoll.
//!
//! Opening a port fails with the kernel's error when io_uring is refused
//! (`ENOSYS`, or `EPERM` under `io_uring_disabled`); [`available`] probes.

use std::collections::VecDeque;
use std::io;
use std::mem::{size_of, zeroed};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::OnceLock;
use std::task::{ready, Context, Poll};

use bytes::BytesMut;
use io_uring::{opcode, squeue, types, IoUring};
use socket2::{SockAddr, Socket};
use tokio::io::unix::AsyncFd;

use super::socket::{register, socket_addr_from, MAX_BATCH, MAX_UDP_PAYLOAD};
use crate::datagram::{Datagram, DatagramPort, PortStats, TxBatch};

/// Receives kept posted at all times.
const RECV_SLOTS: usize = 64;
/// Ring size: posted receives, a send burst and cancellations fit.
const RING_ENTRIES: u32 = 256;
/// user_data tag of a send; receives carry their slot index.
const SEND_TAG: u64 = 1 << 40;

/// Whether this kernel lets this process create an io_uring ring.
pub fn available() -> bool {
    static PROBE: OnceLock<bool> = OnceLock::new();
    *PROBE.get_or_init(|| IoUring::new(4).is_ok())
}

/// The ring's file descriptor, for readiness in tokio's reactor.
struct RingFd(RawFd);

impl AsRawFd for RingFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

/// Receive slots: buffer memory and the kernel-visible headers pointing into
/// it. Boxed slices, never resized, so the pointers stay valid.
struct Slots {
    size: usize,
    buf: Box<[u8]>,
    iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    hdrs: Box<[libc::msghdr]>,
    posted: Box<[bool]>,
}

impl Slots {
    fn new(size: usize) -> Box<Self> {
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut s = Box::new(Slots {
            size,
            buf: vec![0u8; size * RECV_SLOTS].into_boxed_slice(),
            iovs: (0..RECV_SLOTS).map(|_| unsafe { zeroed() }).collect(),
            names: (0..RECV_SLOTS).map(|_| unsafe { zeroed() }).collect(),
            hdrs: (0..RECV_SLOTS).map(|_| unsafe { zeroed() }).collect(),
            posted: vec![false; RECV_SLOTS].into_boxed_slice(),
        });
        let base = s.buf.as_mut_ptr();
        for i in 0..RECV_SLOTS {
            // SAFETY: slot i lies inside buf.
            s.iovs[i].iov_base = unsafe { base.add(i * size) }.cast();
            s.iovs[i].iov_len = size;
        }
        s
    }

    fn reset(&mut self, i: usize) -> *mut libc::msghdr {
        let h = &mut self.hdrs[i];
        h.msg_name = (&mut self.names[i] as *mut libc::sockaddr_storage).cast();
        h.msg_namelen = size_of::<libc::sockaddr_storage>() as libc::socklen_t;
        h.msg_iov = &mut self.iovs[i];
        h.msg_iovlen = 1;
        h.msg_control = std::ptr::null_mut();
        h.msg_controllen = 0;
        h.msg_flags = 0;
        h
    }
}

/// A UDP socket driven through io_uring.
pub struct UringPort {
    // Deregistered before the ring (and its descriptor) goes.
    ring_fd: AsyncFd<RingFd>,
    ring: IoUring,
    socket: AsyncFd<Socket>,
    local: SocketAddr,
    connected: Option<SocketAddr>,
    max_datagram: usize,
    slots: Box<Slots>,
    /// Completed receives not handed out yet: slot and result.
    done: VecDeque<(usize, i32)>,
    stats: PortStats,
}

// SAFETY: the raw pointers in the slot headers point into memory the port
// owns; the port is only used through `&mut self`.
unsafe impl Send for UringPort {}

impl std::fmt::Debug for UringPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringPort")
            .field("local", &self.local)
            .field("connected", &self.connected)
            .finish()
    }
}

impl UringPort {
    /// Wraps a bound, non-blocking socket; fails when io_uring is refused.
    /// Must be called inside a tokio runtime.
    pub(crate) fn new(
        socket: Socket,
        connected: Option<SocketAddr>,
        max_datagram: usize,
    ) -> io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))?;
        let max_datagram = max_datagram.min(MAX_UDP_PAYLOAD);
        let ring_fd = register(RingFd(ring.as_raw_fd()), tokio::io::Interest::READABLE)?;
        let mut port = UringPort {
            ring,
            ring_fd,
            socket: register(socket, tokio::io::Interest::WRITABLE)?,
            local,
            connected,
            max_datagram,
            slots: Slots::new(max_datagram),
            done: VecDeque::with_capacity(RECV_SLOTS),
            stats: PortStats::default(),
        };
        port.post_receives()?;
        Ok(port)
    }

    /// Posts a receive on every idle slot.
    fn post_receives(&mut self) -> io::Result<()> {
        let fd = types::Fd(self.socket.get_ref().as_raw_fd());
        let mut pushed = false;
        for i in 0..RECV_SLOTS {
            if self.slots.posted[i] {
                continue;
            }
            let hdr = self.slots.reset(i);
            let entry = opcode::RecvMsg::new(fd, hdr).build().user_data(i as u64);
            // SAFETY: the header and the memory it points at live in
            // `self.slots` until the completion is reaped (or the port is
            // dropped, which cancels and waits first).
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                break;
            }
            self.slots.posted[i] = true;
            pushed = true;
        }
        if pushed {
            self.ring.submit()?;
        }
        Ok(())
    }

    /// Moves completions off the ring: receives into `done`; returns the
    /// send results seen, in order.
    fn reap(&mut self, sends: &mut Vec<i32>) {
        for cqe in self.ring.completion() {
            let tag = cqe.user_data();
            if tag >= SEND_TAG {
                sends.push(cqe.result());
            } else if let Some(i) = usize::try_from(tag).ok().filter(|&i| i < RECV_SLOTS) {
                self.done.push_back((i, cqe.result()));
            }
        }
    }

    /// Hands out completed receives: copies them into one fresh buffer (one
    /// allocation per burst) and re-posts their slots.
    fn harvest(&mut self, out: &mut Vec<Datagram<SocketAddr>>, max: usize) -> io::Result<usize> {
        let take = self.done.len().min(max.max(1));
        let total: usize = self
            .done
            .iter()
            .take(take)
            .map(|&(_, r)| r.max(0) as usize)
            .sum();
        let mut chunk = BytesMut::with_capacity(total);
        let mut spans = [(0usize, 0usize, None::<SocketAddr>); RECV_SLOTS];
        let mut n = 0;
        for _ in 0..take {
            let Some((i, res)) = self.done.pop_front() else {
                break;
            };
            self.slots.posted[i] = false;
            if res < 0 {
                continue;
            }
            let len = (res as usize).min(self.slots.size);
            let start = chunk.len();
            chunk.extend_from_slice(&self.slots.buf[i * self.slots.size..][..len]);
            let peer = socket_addr_from(&self.slots.names[i], self.slots.hdrs[i].msg_namelen);
            spans[n] = (start, len, peer.or(self.connected));
            n += 1;
        }
        let chunk = chunk.freeze();
        let mut appended = 0;
        for &(start, len, peer) in &spans[..n] {
            if let Some(peer) = peer {
                out.push(Datagram {
                    peer,
                    data: chunk.slice(start..start + len),
                });
                appended += 1;
            }
        }
        self.post_receives()?;
        self.stats.rx_calls += 1;
        self.stats.rx_datagrams += appended as u64;
        Ok(appended)
    }

    /// Submits one linked chain of sends from the front of `batch` and
    /// waits for its completions; returns how many were sent and whether
    /// the socket was full.
    fn send_burst(&mut self, batch: &TxBatch<SocketAddr>) -> io::Result<(usize, bool)> {
        let n = batch.pending().min(MAX_BATCH);
        // SAFETY: all-zero is a valid value of these plain C structs.
        let mut hdrs: [libc::msghdr; MAX_BATCH] = unsafe { zeroed() };
        let mut iovs: [libc::iovec; MAX_BATCH] = unsafe { zeroed() };
        let mut names: [Option<SockAddr>; MAX_BATCH] = std::array::from_fn(|_| None);
        let fd = types::Fd(self.socket.get_ref().as_raw_fd());
        let mut pushed = 0;
        for i in 0..n {
            let Some((dst, data)) = batch.get(i) else {
                break;
            };
            iovs[i].iov_base = data.as_ptr() as *mut libc::c_void;
            iovs[i].iov_len = data.len();
            hdrs[i].msg_iov = &mut iovs[i];
            hdrs[i].msg_iovlen = 1;
            if self.connected.is_none() {
                let name = names[i].insert(SockAddr::from(dst));
                hdrs[i].msg_name = name.as_ptr() as *mut libc::c_void;
                hdrs[i].msg_namelen = name.len();
            }
            let mut entry = opcode::SendMsg::new(fd, &hdrs[i])
                .flags(libc::MSG_DONTWAIT as u32)
                .build()
                .user_data(SEND_TAG + i as u64);
            if i + 1 < n {
                entry = entry.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: the headers and data outlive the wait below, which
            // returns only after every send of the chain completed.
            if unsafe { self.ring.submission().push(&entry) }.is_err() {
                break;
            }
            pushed += 1;
        }
        if pushed == 0 {
            return Ok((0, false));
        }
        let mut results = Vec::with_capacity(0);
        let mut seen = 0;
        let mut sent = 0;
        let mut full = false;
        let mut failure = None;
        self.stats.tx_calls += 1;
        while seen < pushed {
            self.ring.submit_and_wait(1)?;
            results.clear();
            self.reap(&mut results);
            for &r in &results {
                seen += 1;
                if r >= 0 && failure.is_none() && !full {
                    sent += 1;
                } else if r == -libc::EAGAIN || r == -libc::ECANCELED {
                    full = full || r == -libc::EAGAIN;
                } else if r < 0 && failure.is_none() {
                    failure = Some(io::Error::from_raw_os_error(-r));
                }
            }
        }
        self.stats.tx_datagrams += sent as u64;
        match failure {
            Some(e) if sent == 0 => Err(e),
            _ => Ok((sent, full)),
        }
    }
}

impl DatagramPort for UringPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        self.local
    }

    fn max_datagram_size(&self) -> usize {
        self.max_datagram
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<SocketAddr>>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        let mut sends: Vec<i32> = Vec::new();
        loop {
            self.reap(&mut sends);
            if !self.done.is_empty() {
                let n = self.harvest(out, max)?;
                if n > 0 {
                    return Poll::Ready(Ok(n));
                }
                continue;
            }
            // Completions since the reap above make the ring readable again.
            let mut guard = ready!(self.ring_fd.poll_read_ready(cx))?;
            if self.ring.completion().is_empty() {
                guard.clear_ready();
            }
        }
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut TxBatch<SocketAddr>,
    ) -> Poll<io::Result<()>> {
        while !batch.is_empty() {
            let (sent, full) = self.send_burst(batch)?;
            batch.mark_sent(sent);
            if full {
                let mut guard = ready!(self.socket.poll_write_ready(cx))?;
                guard.clear_ready();
            }
        }
        // Receives completed during the sends wait in `done`; make sure
        // the receiving task looks.
        if !self.done.is_empty() {
            cx.waker().wake_by_ref();
        }
        Poll::Ready(Ok(()))
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

impl Drop for UringPort {
    fn drop(&mut self) {
        // The kernel may still write into posted slots: cancel them and
        // wait for every completion before the memory goes.
        let posted: Vec<usize> = (0..RECV_SLOTS).filter(|&i| self.slots.posted[i]).collect();
        for &i in &posted {
            let entry = opcode::AsyncCancel::new(i as u64)
                .build()
                .user_data(SEND_TAG - 1);
            // SAFETY: a cancellation refers to no memory.
            let _ = unsafe { self.ring.submission().push(&entry) };
        }
        let mut outstanding = posted.len();
        for _ in 0..1000 {
            if outstanding == 0 {
                break;
            }
            if self.ring.submit_and_wait(1).is_err() {
                break;
            }
            for cqe in self.ring.completion() {
                if (cqe.user_data() as usize) < RECV_SLOTS {
                    outstanding -= 1;
                }
            }
        }
        if outstanding > 0 {
            // Never free memory the kernel may still write.
            let slots = std::mem::replace(&mut self.slots, Slots::new(0));
            std::mem::forget(slots);
        }
    }
}
