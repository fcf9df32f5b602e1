//! The io_uring backend of the UDP port.
//!
//! Each port owns a small ring. Receives are always posted: a fixed set of
//! `RECVMSG` operations, one per slot of a preallocated buffer, re-posted as
//! they complete, so datagrams land while the task is busy elsewhere; the
//! task learns of completions through the ring's file descriptor in tokio's
//! reactor (or, busy polling, by watching the completion ring, which costs
//! no system call).
//!
//! Sends never wait for their completions. A burst is copied into send
//! chunks the port owns (so the caller's batch is free at once), as few
//! `SENDMSG` operations as UDP segmentation offload allows (a run of
//! equal-sized datagrams to one peer is one operation, as on the epoll
//! backend), linked so they leave in order, and submitted with one
//! `io_uring_enter`. Their completions are reaped later, with the
//! receives', and free the chunks; an error one reports is returned by the
//! next send. Only when every chunk is in flight does a send wait, for the
//! oldest to complete.
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
use std::time::{Duration, Instant};

use bytes::BytesMut;
use io_uring::{opcode, squeue, types, IoUring};
use socket2::{SockAddr, Socket};
use tokio::io::unix::AsyncFd;

use super::socket::{
    busy_poll, gro_segment_size, gso_run, probe_offloads, register, set_gso_segment,
    socket_addr_from, CmsgBuf, Offloads, GRO_SLOT, MAX_BATCH, MAX_UDP_PAYLOAD,
};
use crate::datagram::{Datagram, DatagramPort, PortStats, TxBatch};

/// Receives kept posted at all times (at most; fewer, larger ones with
/// GRO).
const RECV_SLOTS: usize = 64;
/// Receives kept posted with GRO, each a 64 KiB slot.
const GRO_RECV_SLOTS: usize = 8;
/// Send chunks: the memory of sends in flight.
const SEND_CHUNKS: usize = 8;
/// Bytes of a send chunk: the largest GSO send fits one.
const CHUNK_BYTES: usize = 64 << 10;
/// `SENDMSG` operations in flight at most.
const SEND_OPS: usize = 128;
/// Ring size: posted receives, sends in flight and cancellations fit.
const RING_ENTRIES: u32 = 256;
/// user_data of a send: this bit and the operation's index; receives carry
/// their slot index.
const SEND_TAG: u64 = 1 << 40;
/// user_data of a cancellation.
const CANCEL_TAG: u64 = 1 << 41;
/// Waits for a send completion one send makes at most when every chunk
/// is in flight (each returns as soon as one completes).
const MAX_SEND_WAITS: usize = 10_000;
/// Bytes the receive chunk grows by at least, so small bursts share one
/// allocation.
const RX_CHUNK: usize = 256 << 10;

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

/// # Safety
/// All-zero must be a valid `T` (a plain C struct).
unsafe fn zeroed_slice<T>(count: usize) -> Box<[T]> {
    // SAFETY: the caller's promise.
    (0..count).map(|_| unsafe { zeroed() }).collect()
}

/// Receive slots: buffer memory and the kernel-visible headers pointing into
/// it. Boxed slices, never resized, so the pointers stay valid.
struct Slots {
    size: usize,
    count: usize,
    gro: bool,
    buf: Box<[u8]>,
    iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    cmsgs: Box<[CmsgBuf]>,
    hdrs: Box<[libc::msghdr]>,
    posted: Box<[bool]>,
}

impl Slots {
    fn new(size: usize, count: usize, gro: bool) -> Box<Self> {
        let mut s = Box::new(Slots {
            size,
            count,
            gro,
            buf: vec![0u8; size * count].into_boxed_slice(),
            // SAFETY: plain C structs, valid all-zero.
            iovs: unsafe { zeroed_slice(count) },
            names: unsafe { zeroed_slice(count) },
            cmsgs: vec![[0; 4]; count].into_boxed_slice(),
            hdrs: unsafe { zeroed_slice(count) },
            posted: vec![false; count].into_boxed_slice(),
        });
        let base = s.buf.as_mut_ptr();
        for i in 0..count {
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
        if self.gro {
            h.msg_control = self.cmsgs[i].as_mut_ptr().cast();
            h.msg_controllen = size_of::<CmsgBuf>() as _;
        } else {
            h.msg_control = std::ptr::null_mut();
            h.msg_controllen = 0;
        }
        h.msg_flags = 0;
        h
    }
}

/// Sends in flight: chunks of copied datagrams and one header per
/// `SENDMSG`. Boxed slices, never resized, so the pointers stay valid.
struct SendSlots {
    buf: Box<[u8]>,
    /// Bytes of each chunk filled by the burst that owns it.
    used: [usize; SEND_CHUNKS],
    /// Operations in flight on each chunk; a chunk is free at zero.
    refs: [u32; SEND_CHUNKS],
    iovs: Box<[libc::iovec]>,
    names: Box<[libc::sockaddr_storage]>,
    cmsgs: Box<[CmsgBuf]>,
    hdrs: Box<[libc::msghdr]>,
    /// The chunk each operation's bytes lie in.
    chunk_of: Box<[u8]>,
    /// Operations not in flight.
    free_ops: Vec<u16>,
}

impl SendSlots {
    fn new() -> Box<Self> {
        Box::new(SendSlots {
            buf: vec![0u8; SEND_CHUNKS * CHUNK_BYTES].into_boxed_slice(),
            used: [0; SEND_CHUNKS],
            refs: [0; SEND_CHUNKS],
            // SAFETY: plain C structs, valid all-zero.
            iovs: unsafe { zeroed_slice(SEND_OPS) },
            names: unsafe { zeroed_slice(SEND_OPS) },
            cmsgs: vec![[0; 4]; SEND_OPS].into_boxed_slice(),
            hdrs: unsafe { zeroed_slice(SEND_OPS) },
            chunk_of: vec![0; SEND_OPS].into_boxed_slice(),
            free_ops: (0..SEND_OPS as u16).rev().collect(),
        })
    }

    fn in_flight(&self) -> usize {
        SEND_OPS - self.free_ops.len()
    }

    /// A chunk no operation uses, emptied.
    fn take_chunk(&mut self, not: Option<usize>) -> Option<usize> {
        let c = (0..SEND_CHUNKS).find(|&c| self.refs[c] == 0 && Some(c) != not)?;
        self.used[c] = 0;
        Some(c)
    }

    /// Copies `bytes` into `chunk` and sets up operation `op` to send them
    /// to `dst` (none on a connected socket), as GSO segments of
    /// `segment` bytes when `segments` > 1.
    fn prepare(
        &mut self,
        op: usize,
        chunk: usize,
        bytes: &[u8],
        dst: Option<SocketAddr>,
        segments: usize,
        segment: usize,
    ) -> *const libc::msghdr {
        let at = chunk * CHUNK_BYTES + self.used[chunk];
        self.buf[at..at + bytes.len()].copy_from_slice(bytes);
        self.used[chunk] += bytes.len();
        self.refs[chunk] += 1;
        self.chunk_of[op] = chunk as u8;
        self.iovs[op] = libc::iovec {
            iov_base: self.buf[at..].as_mut_ptr().cast(),
            iov_len: bytes.len(),
        };
        // SAFETY: all-zero is a valid msghdr.
        let mut h: libc::msghdr = unsafe { zeroed() };
        h.msg_iov = &mut self.iovs[op];
        h.msg_iovlen = 1;
        if let Some(dst) = dst {
            let name = SockAddr::from(dst);
            let len = name.len() as usize;
            // SAFETY: a SockAddr's storage holds `len` initialised bytes,
            // no more than a sockaddr_storage.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    name.as_ptr().cast::<u8>(),
                    (&mut self.names[op] as *mut libc::sockaddr_storage).cast::<u8>(),
                    len,
                );
            }
            h.msg_name = (&mut self.names[op] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen = name.len();
        }
        if segments > 1 {
            set_gso_segment(&mut h, &mut self.cmsgs[op], segment);
        }
        self.hdrs[op] = h;
        &self.hdrs[op]
    }

    /// Operation `op` completed: its chunk has one user fewer.
    fn complete(&mut self, op: usize) {
        let c = self.chunk_of[op] as usize;
        self.refs[c] = self.refs[c].saturating_sub(1);
        self.free_ops.push(op as u16);
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
    offloads: Offloads,
    slots: Box<Slots>,
    sends: Box<SendSlots>,
    /// An error a send completion reported, for the next send to return.
    send_error: Option<io::Error>,
    /// Completed receives not handed out yet: slot and result.
    done: VecDeque<(usize, i32)>,
    /// Where received datagrams are copied, back to back.
    rx_out: BytesMut,
    stats: PortStats,
    /// How long a receive watches the completion ring before it waits.
    busy_poll: Option<Duration>,
    idle_since: Option<Instant>,
    /// The task waiting for receives.
    rx_waker: Option<std::task::Waker>,
}

// SAFETY: the raw pointers in the slot headers point into memory the port
// owns; the port is only used through `&mut self`.
unsafe impl Send for UringPort {}

impl std::fmt::Debug for UringPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringPort")
            .field("local", &self.local)
            .field("connected", &self.connected)
            .field("offloads", &self.offloads)
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
        want: Offloads,
        busy_poll: Option<Duration>,
    ) -> io::Result<Self> {
        let ring = IoUring::new(RING_ENTRIES)?;
        let local = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| io::Error::other("socket has no IP address"))?;
        let max_datagram = max_datagram.min(MAX_UDP_PAYLOAD);
        let offloads = probe_offloads(&socket, want);
        let ring_fd = register(RingFd(ring.as_raw_fd()), tokio::io::Interest::READABLE)?;
        let mut port = UringPort {
            ring,
            ring_fd,
            socket: register(socket, tokio::io::Interest::WRITABLE)?,
            local,
            connected,
            max_datagram,
            offloads,
            slots: if offloads.gro {
                Slots::new(GRO_SLOT, GRO_RECV_SLOTS, true)
            } else {
                Slots::new(max_datagram, RECV_SLOTS, false)
            },
            sends: SendSlots::new(),
            send_error: None,
            done: VecDeque::with_capacity(RECV_SLOTS),
            rx_out: BytesMut::new(),
            stats: PortStats::default(),
            busy_poll: busy_poll.filter(|d| !d.is_zero()),
            idle_since: None,
            rx_waker: None,
        };
        port.post_receives()?;
        Ok(port)
    }

    /// The offloads in use.
    pub fn offloads(&self) -> Offloads {
        self.offloads
    }

    /// Posts a receive on every idle slot (submitted with the next
    /// `io_uring_enter`, or now when `submit`).
    fn post_receives(&mut self) -> io::Result<()> {
        let fd = types::Fd(self.socket.get_ref().as_raw_fd());
        let mut pushed = false;
        for i in 0..self.slots.count {
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

    /// Moves completions off the ring: receives into `done`, sends free
    /// their chunk and keep the first error.
    fn reap(&mut self) {
        for cqe in self.ring.completion() {
            let tag = cqe.user_data();
            let res = cqe.result();
            if tag & SEND_TAG != 0 {
                let op = (tag & 0xffff) as usize;
                if op < SEND_OPS {
                    self.sends.complete(op);
                }
                if res >= 0 || res == -libc::ECANCELED {
                    // Sent, or dropped behind a failed one (counted there).
                } else if res == -libc::EIO && self.offloads.gso {
                    // A device without checksum offload refuses GSO: go on
                    // without. These datagrams are lost, as UDP may lose.
                    self.offloads.gso = false;
                } else if self.send_error.is_none() {
                    self.send_error = Some(io::Error::from_raw_os_error(-res));
                }
            } else if tag & CANCEL_TAG != 0 {
                // A cancellation's own completion.
            } else if let Some(i) = usize::try_from(tag).ok().filter(|&i| i < self.slots.count) {
                self.done.push_back((i, res));
            }
        }
    }

    /// Hands out completed receives: copies them into one chunk (amortised:
    /// no allocation per burst) and re-posts their slots.
    fn harvest(&mut self, out: &mut Vec<Datagram<SocketAddr>>, max: usize) -> io::Result<usize> {
        let take = self.done.len().min(max.max(1));
        let total: usize = self
            .done
            .iter()
            .take(take)
            .map(|&(_, r)| r.max(0) as usize)
            .sum();
        self.rx_out.clear();
        if self.rx_out.capacity() < total {
            self.rx_out.reserve(total.max(RX_CHUNK));
        }
        let mut spans = [(0usize, 0usize, 0usize, None::<SocketAddr>); RECV_SLOTS];
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
            let start = self.rx_out.len();
            self.rx_out
                .extend_from_slice(&self.slots.buf[i * self.slots.size..][..len]);
            let peer = socket_addr_from(&self.slots.names[i], self.slots.hdrs[i].msg_namelen);
            let seg = if self.slots.gro {
                gro_segment_size(&self.slots.hdrs[i]).unwrap_or(len)
            } else {
                len
            };
            spans[n] = (start, len, seg, peer.or(self.connected));
            n += 1;
        }
        let chunk = self.rx_out.split().freeze();
        let mut appended = 0;
        for &(start, len, seg, peer) in &spans[..n] {
            let Some(peer) = peer else {
                continue;
            };
            // A GRO receive holds many datagrams of `seg` bytes.
            let seg = if seg == 0 { len } else { seg };
            let mut at = start;
            for _ in 0..len.div_ceil(seg.max(1)).max(1) {
                let end = (at + seg).min(start + len);
                out.push(Datagram {
                    peer,
                    data: chunk.slice(at..end),
                });
                appended += 1;
                at = end;
                if at >= start + len {
                    break;
                }
            }
        }
        self.post_receives()?;
        self.stats.rx_calls += 1;
        self.stats.rx_datagrams += appended as u64;
        Ok(appended)
    }

    /// Receives what has completed, without waiting.
    fn try_recv(&mut self, out: &mut Vec<Datagram<SocketAddr>>, max: usize) -> io::Result<usize> {
        self.reap();
        if self.done.is_empty() {
            return Ok(0);
        }
        self.harvest(out, max)
    }

    /// Queues sends for as much of the front of `batch` as chunks and
    /// operations allow, linked in order, and submits them without
    /// waiting; returns how many datagrams were queued.
    fn queue_sends(&mut self, batch: &TxBatch<SocketAddr>) -> io::Result<usize> {
        let fd = types::Fd(self.socket.get_ref().as_raw_fd());
        let connected = self.connected.is_some();
        let mut entries: [Option<squeue::Entry>; MAX_BATCH] = std::array::from_fn(|_| None);
        let mut n = 0;
        let mut next = 0;
        let mut chunk: Option<usize> = None;
        while n < MAX_BATCH {
            let Some(run) = gso_run(batch, next, self.offloads.gso) else {
                break;
            };
            let fits = chunk.is_some_and(|c| self.sends.used[c] + run.bytes.len() <= CHUNK_BYTES);
            if !fits {
                match self.sends.take_chunk(chunk) {
                    Some(c) => chunk = Some(c),
                    None => break,
                }
            }
            let (Some(c), Some(op)) = (chunk, self.sends.free_ops.pop()) else {
                break;
            };
            let op = op as usize;
            let hdr = self.sends.prepare(
                op,
                c,
                run.bytes,
                (!connected).then_some(run.dst),
                run.segments,
                run.segment_size,
            );
            entries[n] = Some(
                opcode::SendMsg::new(fd, hdr)
                    .build()
                    .user_data(SEND_TAG | op as u64),
            );
            n += 1;
            next += run.segments;
        }
        if n == 0 {
            return Ok(0);
        }
        for (i, entry) in entries.iter_mut().take(n).enumerate() {
            let Some(mut e) = entry.take() else {
                continue;
            };
            if i + 1 < n {
                // In order: a later send starts once the earlier is done.
                e = e.flags(squeue::Flags::IO_LINK);
            }
            // SAFETY: the header and bytes live in `self.sends` until the
            // completion is reaped (the port's drop waits for them). The
            // ring has room: sends in flight and posted receives are
            // bounded below its size.
            if unsafe { self.ring.submission().push(&e) }.is_err() {
                self.ring.submit()?;
                // SAFETY: as above.
                let _ = unsafe { self.ring.submission().push(&e) };
            }
        }
        self.ring.submit()?;

        self.stats.tx_calls += 1;
        self.stats.tx_datagrams += next as u64;
        Ok(next)
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
        if let Some(budget) = self.busy_poll {
            // Posted receives complete into the mapped ring: watching it
            // costs no system call.
            let mut idle = self.idle_since;
            let empty = self.done.is_empty() && self.ring.completion().is_empty();
            let r = busy_poll(&mut idle, budget, empty, cx, || {
                // Entering the kernel (GETEVENTS) runs the task work that
                // completes receives whose data arrived.
                // SAFETY: no argument is passed.
                unsafe {
                    self.ring.submitter().enter::<libc::sigset_t>(
                        0,
                        0,
                        io_uring::EnterFlags::GETEVENTS.bits(),
                        None,
                    )?;
                }
                self.try_recv(out, max)
            });
            self.idle_since = idle;
            match r {
                Poll::Ready(Some(r)) => return Poll::Ready(r),
                Poll::Ready(None) => {}
                Poll::Pending => return Poll::Pending,
            }
        }
        for _ in 0..RECV_SLOTS * 4 {
            let n = self.try_recv(out, max)?;
            if n > 0 {
                self.idle_since = None;
                return Poll::Ready(Ok(n));
            }
            if !self.done.is_empty() {
                // Only failed receives: their slots are posted again.
                continue;
            }
            // A send may reap this task's receives: it wakes the task then.
            if !self
                .rx_waker
                .as_ref()
                .is_some_and(|w| w.will_wake(cx.waker()))
            {
                self.rx_waker = Some(cx.waker().clone());
            }
            // Completions since the reap above make the ring readable again.
            let mut guard = ready!(self.ring_fd.poll_read_ready(cx))?;
            if self.ring.completion().is_empty() {
                guard.clear_ready();
            }
        }
        // Failed receives only, many times: let other tasks run first.
        cx.waker().wake_by_ref();
        Poll::Pending
    }

    fn poll_send(
        &mut self,
        _cx: &mut Context<'_>,
        batch: &mut TxBatch<SocketAddr>,
    ) -> Poll<io::Result<()>> {
        self.reap();
        if let Some(e) = self.send_error.take() {
            return Poll::Ready(Err(e));
        }
        for _ in 0..MAX_SEND_WAITS {
            if batch.is_empty() {
                break;
            }
            let queued = self.queue_sends(batch)?;
            batch.mark_sent(queued);
            if batch.is_empty() {
                break;
            }
            // Every chunk is in flight: wait for the oldest sends (they
            // complete as soon as the kernel took them, without the peer).
            if self.sends.in_flight() > 0 {
                self.ring.submit_and_wait(1)?;
            }
            self.reap();
        }
        if !self.done.is_empty() {
            // Receives completed while sending, and their completions are
            // off the ring now: the ring will not wake the receiving task.
            if let Some(w) = self.rx_waker.take() {
                w.wake();
            }
        }
        Poll::Ready(Ok(()))
    }

    fn stats(&self) -> PortStats {
        self.stats
    }
}

impl Drop for UringPort {
    fn drop(&mut self) {
        // The kernel may still write into posted slots and read send
        // chunks: cancel the receives and wait for every completion before
        // the memory goes.
        let posted: Vec<usize> = (0..self.slots.count)
            .filter(|&i| self.slots.posted[i])
            .collect();
        for &i in &posted {
            let entry = opcode::AsyncCancel::new(i as u64)
                .build()
                .user_data(CANCEL_TAG);
            // SAFETY: a cancellation refers to no memory.
            let _ = unsafe { self.ring.submission().push(&entry) };
        }
        let mut receives = posted.len();
        for _ in 0..1000 {
            if receives == 0 && self.sends.in_flight() == 0 {
                break;
            }
            if self.ring.submit_and_wait(1).is_err() {
                break;
            }
            for cqe in self.ring.completion() {
                let tag = cqe.user_data();
                if tag & SEND_TAG != 0 {
                    let op = (tag & 0xffff) as usize;
                    if op < SEND_OPS {
                        self.sends.complete(op);
                    }
                } else if tag & CANCEL_TAG == 0 && (tag as usize) < self.slots.count {
                    receives -= 1;
                }
            }
        }
        if receives > 0 || self.sends.in_flight() > 0 {
            // Never free memory the kernel may still use.
            std::mem::forget(std::mem::replace(&mut self.slots, Slots::new(0, 0, false)));
            std::mem::forget(std::mem::replace(&mut self.sends, SendSlots::new()));
        }
    }
}
