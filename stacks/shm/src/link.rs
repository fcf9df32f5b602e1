//! [`ShmLink`]: a [`Link`] between two processes over shared memory.
//!
//! ```text
//!  connector process                           listener process
//!  ┌───────────┐   ring 0: connector → listener  ┌───────────┐
//!  │  ShmLink  │ ═══════════════════════════════▶│  ShmLink  │
//!  │           │◀═══════════════════════════════ │           │
//!  └───────────┘   ring 1: listener → connector  └───────────┘
//!        ▲  eventfd doorbells (4), rung only to a parked side  ▲
//!        └──────── Unix socket: handshake (SCM_RIGHTS), liveness ┘
//! ```
//!
//! The listener creates a sealed memfd holding a region header and two
//! [rings](crate::ring) of variable-size records (one encoded [`Message`]
//! each), plus four eventfds, and hands them to the connector over the Unix
//! socket in one `SCM_RIGHTS` message. After that the socket carries
//! nothing; it stays open so that either side notices the other's death
//! (end of file) even when it exits without closing.
//!
//! Sending encodes straight into the ring (no allocation, no system call)
//! and publishes the batch at `poll_flush` with one store; the peer's
//! doorbell is rung only if it said it parked. Receiving copies every
//! published record (up to a batch limit) into one buffer, releases the
//! space at once, and decodes messages that share that buffer. A record
//! that does not decode is counted ([`ShmLinkStats::malformed`]) and
//! skipped; an impossible index or record header in shared memory fails
//! the link, since the stream cannot be resynchronised.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use futures_core::Stream;
use futures_sink::Sink;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::net::{UnixListener, UnixStream};
use uniplane_dataplane::wire::EXTENDED_HEADER_LEN;
use uniplane_dataplane::{Link, LinkError, Message};

use crate::ring::{RingConsumer, RingError, RingLayout, RingProducer, CONTROL_BYTES};
use crate::sys::{memfd_name, recv_with_fds, register_bell, send_with_fds, EventFd, SharedMemory};

/// Data bytes of each ring by default (1 MiB per direction).
pub const DEFAULT_RING_BYTES: usize = 1 << 20;
/// Smallest ring: two of the largest records.
pub const MIN_RING_BYTES: usize = 256 << 10;
/// Largest ring.
pub const MAX_RING_BYTES: usize = 1 << 30;

const MAGIC: u64 = u64::from_be_bytes(*b"UNIPSHM1");
const VERSION: u32 = 1;
/// Bytes before the first data area: region header and the two control blocks.
const PREFIX_BYTES: usize = 4096;
const HELLO_BYTES: usize = 32;
/// Messages moved per receive pass when the caller sets no limit.
const RECV_BATCH: usize = 64;
/// A busy-polling end looks at the socket for the peer's death once in
/// this many empty polls.
const BUSY_LIVENESS_EVERY: u32 = 64;

/// How a link is set up; the listener's configuration decides the sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShmConfig {
    /// Data bytes of each ring: a power of two from [`MIN_RING_BYTES`] to
    /// [`MAX_RING_BYTES`].
    pub ring_bytes: usize,
    /// How long a receiver or a sender spins on the ring before it parks on
    /// its doorbell. Zero parks at once (lowest CPU use); a few microseconds
    /// save the wake-up on busy links at the price of a spinning core.
    pub spin: Duration,
    /// Bytes copied out of the ring per receive pass at most.
    pub max_batch_bytes: usize,
    /// Never park: a receiver finding the ring empty (or a sender finding
    /// it full) yields to its runtime and looks again at the next poll,
    /// without raising its waiting flag, so the peer never rings a
    /// doorbell and no system call happens per message. Costs a core;
    /// `spin` is ignored.
    pub busy_poll: bool,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            ring_bytes: DEFAULT_RING_BYTES,
            spin: Duration::ZERO,
            max_batch_bytes: 256 << 10,
            busy_poll: false,
        }
    }
}

impl ShmConfig {
    fn check(&self) -> Result<(), ShmError> {
        if !self.ring_bytes.is_power_of_two()
            || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&self.ring_bytes)
        {
            return Err(ShmError::Config(format!(
                "ring_bytes {} is not a power of two from {MIN_RING_BYTES} to {MAX_RING_BYTES}",
                self.ring_bytes
            )));
        }
        Ok(())
    }
}

/// Why a shared-memory link could not be set up.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ShmError {
    /// An operating-system error (socket, memfd, mmap, eventfd).
    #[error("i/o error: {0}")]
    Io(#[from] io::Error),
    /// The other side sent something that is not a valid handshake.
    #[error("bad handshake: {0}")]
    Handshake(&'static str),
    /// The configuration is not usable.
    #[error("bad configuration: {0}")]
    Config(String),
}

/// Counters of one link end.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ShmLinkStats {
    /// Messages sent.
    pub sent: u64,
    /// Messages received.
    pub received: u64,
    /// Records that did not decode as a message; skipped.
    pub malformed: u64,
    /// Doorbells this end rang (the peer had parked).
    pub doorbells: u64,
    /// Times this end parked on a doorbell.
    pub parks: u64,
}

/// One end of a shared-memory link between two processes.
///
/// Reliable and ordered; carries every message type, one-sided ones
/// included, up to [`Message::MAX_PAYLOAD`]. Must be created and used
/// inside a tokio runtime (the doorbells are registered with its reactor).
pub struct ShmLink {
    mem: SharedMemory,
    tx: RingProducer,
    rx: RingConsumer,
    /// Rung by the peer when it published records for us.
    data_bell: AsyncFd<EventFd>,
    /// Rung by the peer when it released space in our sending ring.
    space_bell: AsyncFd<EventFd>,
    peer_data_bell: EventFd,
    peer_space_bell: EventFd,
    sock: UnixStream,
    /// A message accepted while the ring was full; it goes first.
    stalled: Option<Message>,
    rbuf: RecvBuf,
    inbox: VecDeque<Message>,
    spin: Duration,
    busy_poll: bool,
    peer_gone: bool,
    /// Empty (or full) polls of a busy-polling end; the socket is looked
    /// at every [`BUSY_LIVENESS_EVERY`] of them, not at each.
    busy_polls: u32,
    /// The link failed or its failure was reported; the stream is over.
    finished: bool,
    closed: bool,
    stats: ShmLinkStats,
}

impl std::fmt::Debug for ShmLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmLink")
            .field("region_bytes", &self.mem.len())
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// The handshake message: what the listener tells the connector.
struct Hello {
    ring_bytes: u32,
    region_len: u64,
}

impl Hello {
    fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[0..8].copy_from_slice(&MAGIC.to_le_bytes());
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.ring_bytes.to_le_bytes());
        b[16..24].copy_from_slice(&self.region_len.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Result<Hello, ShmError> {
        let b: &[u8; HELLO_BYTES] = b
            .try_into()
            .map_err(|_| ShmError::Handshake("hello of the wrong size"))?;
        let word = |r: std::ops::Range<usize>| {
            let mut v = [0u8; 8];
            v[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(v)
        };
        if word(0..8) != MAGIC {
            return Err(ShmError::Handshake("not a uniplane shm listener"));
        }
        if word(8..12) != VERSION as u64 {
            return Err(ShmError::Handshake("unsupported version"));
        }
        let ring_bytes = word(12..16) as u32;
        let region_len = word(16..24);
        let rb = ring_bytes as usize;
        if !rb.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&rb) {
            return Err(ShmError::Handshake("ring size out of range"));
        }
        if region_len != region_len_for(rb) as u64 {
            return Err(ShmError::Handshake("region size does not match the rings"));
        }
        Ok(Hello {
            ring_bytes,
            region_len,
        })
    }
}

fn region_len_for(ring_bytes: usize) -> usize {
    PREFIX_BYTES + 2 * ring_bytes
}

/// The two rings: 0 carries connector → listener, 1 listener → connector.
fn layouts(ring_bytes: usize) -> [RingLayout; 2] {
    [
        RingLayout {
            control: 1024,
            data: PREFIX_BYTES,
            size: ring_bytes,
        },
        RingLayout {
            control: 1024 + CONTROL_BYTES,
            data: PREFIX_BYTES + ring_bytes,
            size: ring_bytes,
        },
    ]
}

fn corrupt(e: RingError) -> LinkError {
    LinkError::PeerFailed(e.to_string())
}

/// The pieces of one end, before the runtime registration.
pub(crate) struct Parts {
    pub(crate) mem: SharedMemory,
    pub(crate) tx: RingLayout,
    pub(crate) rx: RingLayout,
    pub(crate) data_bell: EventFd,
    pub(crate) space_bell: EventFd,
    pub(crate) peer_data_bell: EventFd,
    pub(crate) peer_space_bell: EventFd,
}

impl Parts {
    fn check(&self) -> Result<(), ShmError> {
        if !self.tx.fits(&self.mem) || !self.rx.fits(&self.mem) {
            return Err(ShmError::Handshake("rings do not fit the region"));
        }
        Ok(())
    }

    /// The listener's half of the handshake on `sock`: creates the region
    /// and the doorbells and sends them. What [`ShmLink::serve`] and
    /// [`ShmPort::serve`](crate::ShmPort::serve) share.
    pub(crate) fn serve(sock: BorrowedFd<'_>, cfg: &ShmConfig) -> Result<Parts, ShmError> {
        cfg.check()?;
        let region_len = region_len_for(cfg.ring_bytes);
        let mem = SharedMemory::create(&memfd_name("link"), region_len)?;
        mem.write(0, &MAGIC.to_le_bytes());
        mem.write(8, &VERSION.to_le_bytes());
        mem.write(12, &(cfg.ring_bytes as u32).to_le_bytes());
        let [from_connector, to_connector] = layouts(cfg.ring_bytes);
        let data_bell = EventFd::new()?;
        let space_bell = EventFd::new()?;
        let peer_data_bell = EventFd::new()?;
        let peer_space_bell = EventFd::new()?;
        let hello = Hello {
            ring_bytes: cfg.ring_bytes as u32,
            region_len: region_len as u64,
        };
        // A fresh socket's buffer takes 32 bytes at once.
        send_with_fds(
            sock,
            &hello.encode(),
            &[
                mem.fd(),
                data_bell.as_fd(),
                space_bell.as_fd(),
                peer_data_bell.as_fd(),
                peer_space_bell.as_fd(),
            ],
        )?;
        let parts = Parts {
            mem,
            tx: to_connector,
            rx: from_connector,
            data_bell,
            space_bell,
            peer_data_bell,
            peer_space_bell,
        };
        parts.check()?;
        Ok(parts)
    }
}

/// Takes every pending doorbell of `bell` and leaves the task registered
/// for the next one; `Ok(true)` if it had rung.
pub(crate) fn poll_bell(bell: &AsyncFd<EventFd>, cx: &mut Context<'_>) -> io::Result<bool> {
    let mut rang = false;
    loop {
        match bell.poll_read_ready(cx) {
            Poll::Ready(Ok(mut guard)) => {
                rang |= guard.get_inner().drain()?;
                // The counter is zero now; a later ring is a new event.
                guard.clear_ready();
            }
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok(rang),
        }
    }
}

/// Encodes `m` straight into `tx` as one record; `Ok(false)` when it does
/// not fit now.
#[inline]
pub(crate) fn encode_into(
    tx: &mut RingProducer,
    mem: &SharedMemory,
    m: &Message,
) -> Result<bool, LinkError> {
    let mut beat = [0u8; EXTENDED_HEADER_LEN];
    let hl = m.header().encode(&mut beat)?;
    let parts = [&beat[..hl], m.payload().as_ref()];
    tx.try_push(mem, &parts).map_err(corrupt)
}

/// The receiving side's buffer: published records are copied out of the
/// ring into it in batches (the one copy out of shared memory), their
/// space released at once, and messages decoded that share it.
pub(crate) struct RecvBuf {
    buf: BytesMut,
    /// Bytes one receive pass may need: the batch limit and one record.
    capacity: usize,
    lens: Vec<usize>,
    max_batch_bytes: usize,
}

impl RecvBuf {
    pub(crate) fn new(cfg: &ShmConfig) -> RecvBuf {
        let max_batch_bytes = cfg.max_batch_bytes.max(1);
        // A pass stops once it holds `max_batch_bytes`, so it may overrun
        // by one record less one byte.
        let capacity = max_batch_bytes + EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD;
        RecvBuf {
            buf: BytesMut::with_capacity(capacity),
            capacity,
            lens: Vec::with_capacity(RECV_BATCH),
            max_batch_bytes,
        }
    }

    /// Copies up to `max` published records out of `rx`, releases their
    /// space (ringing `peer_space_bell` when the producer parked) and
    /// decodes them, handing each message to `push`. Returns how many
    /// messages were delivered; malformed records are counted in `stats`,
    /// not delivered.
    pub(crate) fn drain(
        &mut self,
        rx: &mut RingConsumer,
        mem: &SharedMemory,
        peer_space_bell: &EventFd,
        stats: &mut ShmLinkStats,
        max: usize,
        mut push: impl FnMut(Message),
    ) -> Result<usize, RingError> {
        let mut delivered = 0;
        while delivered < max {
            self.lens.clear();
            // Take the whole buffer back when the messages of earlier
            // batches are gone (no allocation, no fresh pages to fault in).
            self.buf.reserve(self.capacity);
            let mut bytes = 0;
            while self.lens.len() < max - delivered && bytes < self.max_batch_bytes {
                match rx.next_record(mem)? {
                    Some(r) => {
                        mem.read_into(r.offset, r.len, &mut self.buf);
                        self.lens.push(r.len);
                        bytes += r.len;
                    }
                    None => break,
                }
            }
            if self.lens.is_empty() {
                break;
            }
            if rx.release(mem) {
                peer_space_bell.ring();
                stats.doorbells += 1;
            }
            let chunk = self.buf.split().freeze();
            let mut at = 0;
            for &len in &self.lens {
                let record = chunk.slice(at..at + len);
                at += len;
                match Message::decode(&record) {
                    Ok((m, used)) if used == len => {
                        push(m);
                        delivered += 1;
                    }
                    _ => stats.malformed += 1,
                }
            }
        }
        stats.received += delivered as u64;
        Ok(delivered)
    }
}

impl ShmLink {
    fn from_parts(p: Parts, sock: UnixStream, cfg: &ShmConfig) -> Result<ShmLink, ShmError> {
        p.check()?;
        Ok(ShmLink {
            tx: RingProducer::new(p.tx),
            rx: RingConsumer::new(p.rx),
            mem: p.mem,
            data_bell: register_bell(p.data_bell)?,
            space_bell: register_bell(p.space_bell)?,
            peer_data_bell: p.peer_data_bell,
            peer_space_bell: p.peer_space_bell,
            sock,
            stalled: None,
            rbuf: RecvBuf::new(cfg),
            inbox: VecDeque::with_capacity(RECV_BATCH),
            spin: cfg.spin,
            busy_poll: cfg.busy_poll,
            peer_gone: false,
            busy_polls: 0,
            finished: false,
            closed: false,
            stats: ShmLinkStats::default(),
        })
    }

    /// Connects to the [`ShmListener`] bound at `path`.
    pub async fn connect(path: impl AsRef<Path>) -> Result<ShmLink, ShmError> {
        Self::connect_with(path, &ShmConfig::default()).await
    }

    /// Connects to the listener at `path`; `cfg.spin` and
    /// `cfg.max_batch_bytes` apply to this end (the ring size is the
    /// listener's).
    pub async fn connect_with(
        path: impl AsRef<Path>,
        cfg: &ShmConfig,
    ) -> Result<ShmLink, ShmError> {
        let sock = UnixStream::connect(path).await?;
        Self::join(sock, cfg).await
    }

    /// The connector's half of the handshake on an already connected Unix
    /// socket (for a daemon that hands links over a socket of its own):
    /// receives the region and the doorbells and maps them.
    pub async fn join(sock: UnixStream, cfg: &ShmConfig) -> Result<ShmLink, ShmError> {
        let mut buf = [0u8; HELLO_BYTES + 1];
        let mut fds: Vec<OwnedFd> = Vec::new();
        let n = sock
            .async_io(Interest::READABLE, || {
                fds.clear();
                recv_with_fds(sock.as_fd(), &mut buf, &mut fds)
            })
            .await?;
        if n == 0 {
            return Err(ShmError::Handshake("listener closed the socket"));
        }
        let hello = Hello::decode(&buf[..n])?;
        if fds.len() != 5 {
            return Err(ShmError::Handshake("expected five descriptors"));
        }
        let mut fds = fds.into_iter();
        let mut next = || {
            fds.next()
                .ok_or(ShmError::Handshake("expected five descriptors"))
        };
        let mem = SharedMemory::open(next()?, hello.region_len as usize)?;
        let listener_data = EventFd::from_fd(next()?)?;
        let listener_space = EventFd::from_fd(next()?)?;
        let data_bell = EventFd::from_fd(next()?)?;
        let space_bell = EventFd::from_fd(next()?)?;
        let mut head = [0u8; 8];
        mem.read(0, &mut head);
        if u64::from_le_bytes(head) != MAGIC {
            return Err(ShmError::Handshake("region header has no magic"));
        }
        let [to_listener, to_connector] = layouts(hello.ring_bytes as usize);
        let parts = Parts {
            mem,
            tx: to_listener,
            rx: to_connector,
            data_bell,
            space_bell,
            peer_data_bell: listener_data,
            peer_space_bell: listener_space,
        };
        Self::from_parts(parts, sock, cfg)
    }

    /// The listener's half of the handshake on an accepted Unix socket:
    /// creates the region and the doorbells and sends them.
    pub fn serve(sock: UnixStream, cfg: &ShmConfig) -> Result<ShmLink, ShmError> {
        let parts = Parts::serve(sock.as_fd(), cfg)?;
        Self::from_parts(parts, sock, cfg)
    }

    /// Two connected ends in this process (tests, benchmarks): the same
    /// handshake over a socket pair.
    pub async fn pair(cfg: &ShmConfig) -> Result<(ShmLink, ShmLink), ShmError> {
        let (a, b) = UnixStream::pair()?;
        let server = Self::serve(a, cfg)?;
        let client = Self::join(b, cfg).await?;
        Ok((client, server))
    }

    /// Writes `record` into the sending ring as it is, unpublished (tests
    /// of the receiving end's checks).
    #[cfg(test)]
    pub(crate) fn push_raw(&mut self, record: &[u8]) -> bool {
        self.tx.try_push(&self.mem, &[record]).unwrap_or(false)
    }

    /// Shuts the Unix socket down as a dying process would, leaving the
    /// rings open (tests of peer-death detection).
    #[cfg(test)]
    pub(crate) fn shutdown_socket(&self) {
        use std::os::fd::AsRawFd;
        // SAFETY: plain syscall on a descriptor this link owns.
        unsafe { libc::shutdown(self.sock.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Counters of this end.
    pub fn stats(&self) -> ShmLinkStats {
        self.stats
    }

    /// Largest encoded message (header and payload) this link carries.
    pub fn mtu(&self) -> usize {
        EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD
    }

    // ---- receiving ----

    /// Copies up to `max` published records out and decodes them, handing
    /// each message to `push`; see [`RecvBuf::drain`].
    fn drain_ring(&mut self, max: usize, push: impl FnMut(Message)) -> Result<usize, LinkError> {
        self.rbuf
            .drain(
                &mut self.rx,
                &self.mem,
                &self.peer_space_bell,
                &mut self.stats,
                max,
                push,
            )
            .map_err(corrupt)
    }

    /// Whether the peer process is gone (its socket end closed); registers
    /// the task for that event otherwise.
    fn poll_peer_gone(&mut self, cx: &mut Context<'_>) -> bool {
        if self.peer_gone {
            return true;
        }
        let mut scratch = [0u8; 64];
        loop {
            match self.sock.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => match self.sock.try_read(&mut scratch) {
                    Ok(0) => break,
                    // Nothing is sent after the handshake; ignore bytes.
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => break,
                },
                Poll::Ready(Err(_)) => break,
                Poll::Pending => return false,
            }
        }
        self.peer_gone = true;
        // Wake a task of ours parked on the other doorbell.
        self.data_bell.get_ref().ring();
        self.space_bell.get_ref().ring();
        true
    }

    /// [`ShmLink::poll_peer_gone`] for a busy-polling end, which would
    /// otherwise ask the socket at every empty poll.
    fn busy_peer_gone(&mut self, cx: &mut Context<'_>) -> bool {
        self.busy_polls = self.busy_polls.wrapping_add(1);
        self.peer_gone
            || (self.busy_polls.is_multiple_of(BUSY_LIVENESS_EVERY) && self.poll_peer_gone(cx))
    }

    /// `Ready(Ok(true))` when records are published, `Ready(Ok(false))` when
    /// none will come any more (peer closed or gone, ring drained).
    fn poll_data(&mut self, cx: &mut Context<'_>) -> Poll<Result<bool, LinkError>> {
        if self.rx.has_data(&self.mem).map_err(corrupt)? {
            return Poll::Ready(Ok(true));
        }
        if self.busy_poll {
            if self.rx.producer_closed(&self.mem) || self.busy_peer_gone(cx) {
                let more = self.rx.has_data(&self.mem).map_err(corrupt)?;
                return Poll::Ready(Ok(more));
            }
            // Look again at the next poll; the flag stays down, so the
            // peer never rings.
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if !self.spin.is_zero() {
            let start = Instant::now();
            loop {
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
                if self.rx.has_data(&self.mem).map_err(corrupt)? {
                    return Poll::Ready(Ok(true));
                }
                if start.elapsed() >= self.spin {
                    break;
                }
            }
        }
        loop {
            let rang = poll_bell(&self.data_bell, cx)?;
            if rang && self.rx.has_data(&self.mem).map_err(corrupt)? {
                return Poll::Ready(Ok(true));
            }
            self.stats.parks += 1;
            if self.rx.park(&self.mem).map_err(corrupt)? {
                return Poll::Ready(Ok(true));
            }
            if self.rx.producer_closed(&self.mem) || self.poll_peer_gone(cx) {
                // The producer publishes before it closes.
                let more = self.rx.has_data(&self.mem).map_err(corrupt)?;
                return Poll::Ready(Ok(more));
            }
            if !rang {
                return Poll::Pending;
            }
        }
    }

    /// What the stream says once no data will come: `None` after a clean
    /// close, one `PeerFailed` error when the peer vanished without one.
    fn end_of_stream(&mut self) -> Option<LinkError> {
        if self.finished {
            return None;
        }
        self.finished = true;
        if self.rx.producer_closed(&self.mem) {
            None
        } else {
            Some(LinkError::PeerFailed(
                "peer process went away without closing the link".into(),
            ))
        }
    }

    // ---- sending ----

    #[inline]
    fn push(&mut self, m: &Message) -> Result<bool, LinkError> {
        let pushed = encode_into(&mut self.tx, &self.mem, m)?;
        if pushed {
            self.stats.sent += 1;
        }
        Ok(pushed)
    }

    #[inline]
    fn publish(&mut self) {
        if self.tx.publish(&self.mem) {
            self.peer_data_bell.ring();
            self.stats.doorbells += 1;
        }
    }

    fn check_sendable(&mut self) -> Result<(), LinkError> {
        if self.closed || self.finished || self.peer_gone || self.tx.consumer_closed(&self.mem) {
            return Err(LinkError::Closed);
        }
        Ok(())
    }

    /// Moves the stalled message into the ring, parking until there is
    /// room. `Ready(Ok(()))` once nothing is stalled.
    fn poll_unstall(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let spin_until =
            (!self.spin.is_zero() && !self.busy_poll).then(|| Instant::now() + self.spin);
        loop {
            let Some(m) = self.stalled.take() else {
                return Poll::Ready(Ok(()));
            };
            if self.push(&m)? {
                continue;
            }
            let len = m.encoded_len();
            self.stalled = Some(m);
            // Let the consumer see what is already there.
            self.publish();
            self.check_sendable()?;
            if spin_until.is_some_and(|t| Instant::now() < t) {
                std::hint::spin_loop();
                continue;
            }
            if self.busy_poll {
                if self.busy_peer_gone(cx) {
                    return Poll::Ready(Err(LinkError::Closed));
                }
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            let rang = poll_bell(&self.space_bell, cx)?;
            if rang {
                continue;
            }
            self.stats.parks += 1;
            if self.tx.park(&self.mem, len).map_err(corrupt)? {
                continue;
            }
            if self.poll_peer_gone(cx) {
                return Poll::Ready(Err(LinkError::Closed));
            }
            return Poll::Pending;
        }
    }
}

impl Drop for ShmLink {
    fn drop(&mut self) {
        self.tx.close(&self.mem);
        self.rx.close(&self.mem);
        self.peer_data_bell.ring();
        self.peer_space_bell.ring();
    }
}

impl Stream for ShmLink {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(m) = this.inbox.pop_front() {
                return Poll::Ready(Some(Ok(m)));
            }
            if this.finished {
                return Poll::Ready(None);
            }
            let mut inbox = std::mem::take(&mut this.inbox);
            let drained = this.drain_ring(RECV_BATCH, |m| inbox.push_back(m));
            this.inbox = inbox;
            match drained {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => {
                    this.finished = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
            match ready!(this.poll_data(cx)) {
                Ok(true) => continue,
                Ok(false) => return Poll::Ready(this.end_of_stream().map(Err)),
                Err(e) => {
                    this.finished = true;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }
}

impl Sink<Message> for ShmLink {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        this.check_sendable()?;
        this.poll_unstall(cx)
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        let this = self.get_mut();
        this.check_sendable()?;
        if this.stalled.is_some() {
            return Err(LinkError::Io(io::Error::new(
                io::ErrorKind::WouldBlock,
                "start_send without a ready poll_ready",
            )));
        }
        if !this.push(&item)? {
            this.stalled = Some(item);
        }
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        ready!(this.poll_unstall(cx))?;
        this.publish();
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        if this.closed {
            return Poll::Ready(Ok(()));
        }
        ready!(this.poll_unstall(cx))?;
        this.tx.close(&this.mem);
        this.peer_data_bell.ring();
        this.closed = true;
        Poll::Ready(Ok(()))
    }
}

impl Link for ShmLink {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        let mut n = 0;
        while n < max {
            match self.inbox.pop_front() {
                Some(m) => {
                    out.push(m);
                    n += 1;
                }
                None => break,
            }
        }
        loop {
            if self.finished {
                return Poll::Ready(Ok(n));
            }
            if n < max {
                match self.drain_ring(max - n, |m| out.push(m)) {
                    Ok(k) => n += k,
                    Err(e) => {
                        self.finished = true;
                        return Poll::Ready(Err(e));
                    }
                }
            }
            if n > 0 {
                return Poll::Ready(Ok(n));
            }
            match ready!(self.poll_data(cx)) {
                Ok(true) => continue,
                Ok(false) => {
                    return Poll::Ready(match self.end_of_stream() {
                        Some(e) => Err(e),
                        None => Ok(0),
                    })
                }
                Err(e) => {
                    self.finished = true;
                    return Poll::Ready(Err(e));
                }
            }
        }
    }

    fn poll_send_batch(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut VecDeque<Message>,
    ) -> Poll<Result<(), LinkError>> {
        loop {
            self.check_sendable()?;
            ready!(self.poll_unstall(cx))?;
            while let Some(m) = batch.front() {
                if !self.push(m)? {
                    break;
                }
                batch.pop_front();
            }
            match batch.pop_front() {
                None => return Poll::Ready(Ok(())),
                Some(m) => self.stalled = Some(m),
            }
        }
    }
}

/// Accepts shared-memory links on a Unix socket path.
///
/// Each accepted connection gets its own region and doorbells, sized by
/// the listener's [`ShmConfig`]. Dropping the listener removes the socket
/// file; links already accepted live on.
pub struct ShmListener {
    listener: UnixListener,
    path: PathBuf,
    cfg: ShmConfig,
}

impl std::fmt::Debug for ShmListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmListener")
            .field("path", &self.path)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl ShmListener {
    /// Binds `path` with the default configuration. Fails if the path
    /// exists. Must be called inside a tokio runtime.
    pub fn bind(path: impl AsRef<Path>) -> Result<ShmListener, ShmError> {
        Self::bind_with(path, ShmConfig::default())
    }

    /// Binds `path`; links accepted use `cfg`.
    pub fn bind_with(path: impl AsRef<Path>, cfg: ShmConfig) -> Result<ShmListener, ShmError> {
        cfg.check()?;
        let path = path.as_ref().to_path_buf();
        let listener = UnixListener::bind(&path)?;
        Ok(ShmListener {
            listener,
            path,
            cfg,
        })
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits for the next connection and sets up its link.
    pub async fn accept(&self) -> Result<ShmLink, ShmError> {
        std::future::poll_fn(|cx| self.poll_accept(cx)).await
    }

    /// Polls for the next connection and sets up its link.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<Result<ShmLink, ShmError>> {
        let (sock, _) = ready!(self.listener.poll_accept(cx))?;
        Poll::Ready(ShmLink::serve(sock, &self.cfg))
    }
}

impl Stream for ShmListener {
    type Item = Result<ShmLink, ShmError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.poll_accept(cx).map(Some)
    }
}

impl Drop for ShmListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;
    use uniplane_dataplane::{LinkExt, Uid};

    fn msg(i: u32, len: usize) -> Message {
        let u = Uid::new(Ipv4Addr::LOCALHOST, 1);
        let mut payload = vec![(i % 251) as u8; len.max(4)];
        payload[..4].copy_from_slice(&i.to_be_bytes());
        let mut m = Message::send(u.port(1), u.port(2), Bytes::from(payload)).unwrap();
        m.set_seqnum(i);
        m
    }

    fn small() -> ShmConfig {
        ShmConfig {
            ring_bytes: MIN_RING_BYTES,
            ..ShmConfig::default()
        }
    }

    #[tokio::test]
    async fn a_message_crosses_in_each_direction() {
        let (mut a, mut b) = ShmLink::pair(&ShmConfig::default()).await.unwrap();
        a.send(msg(1, 10)).await.unwrap();
        assert_eq!(b.next().await.unwrap().unwrap(), msg(1, 10));
        b.send(msg(2, 1000)).await.unwrap();
        assert_eq!(a.next().await.unwrap().unwrap(), msg(2, 1000));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_messages_of_every_size_arrive_in_order_through_a_small_ring() {
        let (mut a, mut b) = ShmLink::pair(&small()).await.unwrap();
        const N: u32 = 3000;
        let sizes = [0usize, 1, 63, 64, 1500, 9000, 65535];
        let sender = tokio::spawn(async move {
            for i in 0..N {
                a.feed(msg(i, sizes[i as usize % sizes.len()]))
                    .await
                    .unwrap();
                if i % 7 == 0 {
                    a.flush().await.unwrap();
                }
            }
            a.close().await.unwrap();
            a
        });
        let mut got = 0u32;
        while let Some(m) = b.next().await {
            assert_eq!(m.unwrap(), msg(got, sizes[got as usize % sizes.len()]));
            got += 1;
        }
        assert_eq!(got, N);
        let a = sender.await.unwrap();
        assert!(a.stats().parks > 0, "the small ring made the sender wait");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn batches_move_through_the_batch_methods() {
        let (mut a, mut b) = ShmLink::pair(&small()).await.unwrap();
        let sender = tokio::spawn(async move {
            let mut batch: VecDeque<Message> = (0..10_000).map(|i| msg(i, 100)).collect();
            a.send_batch(&mut batch).await.unwrap();
            a.close().await.unwrap();
        });
        let mut out = Vec::new();
        loop {
            let n = b.recv_batch(&mut out, 256).await.unwrap();
            if n == 0 {
                break;
            }
        }
        assert_eq!(out.len(), 10_000);
        assert!(out
            .iter()
            .enumerate()
            .all(|(i, m)| m.header().seqnum == i as u32));
        sender.await.unwrap();
    }

    #[tokio::test]
    async fn a_full_ring_makes_poll_ready_pending_and_never_drops() {
        let (mut a, mut b) = ShmLink::pair(&small()).await.unwrap();
        let waker = futures_util::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let mut accepted = 0u32;
        loop {
            match Pin::new(&mut a).poll_ready(&mut cx) {
                Poll::Ready(Ok(())) => {
                    Pin::new(&mut a).start_send(msg(accepted, 60_000)).unwrap();
                    accepted += 1;
                }
                Poll::Pending => break,
                Poll::Ready(Err(e)) => panic!("{e}"),
            }
        }
        assert!(accepted >= 4, "a 256 KiB ring holds four 60 kB messages");
        let reader = tokio::spawn(async move {
            for i in 0..accepted {
                assert_eq!(b.next().await.unwrap().unwrap().header().seqnum, i);
            }
        });
        a.flush().await.unwrap();
        reader.await.unwrap();
    }

    #[tokio::test]
    async fn the_stream_ends_after_the_peer_closes_and_everything_arrived() {
        let (mut a, mut b) = ShmLink::pair(&ShmConfig::default()).await.unwrap();
        a.feed(msg(1, 1)).await.unwrap();
        a.feed(msg(2, 1)).await.unwrap();
        drop(a);
        assert_eq!(b.next().await.unwrap().unwrap().header().seqnum, 1);
        assert_eq!(b.next().await.unwrap().unwrap().header().seqnum, 2);
        assert!(b.next().await.is_none());
        assert!(matches!(b.send(msg(3, 1)).await, Err(LinkError::Closed)));
    }

    #[tokio::test]
    async fn a_garbage_record_is_counted_and_skipped() {
        let (mut a, mut b) = ShmLink::pair(&ShmConfig::default()).await.unwrap();
        assert!(a
            .tx
            .try_push(&a.mem, &[b"definitely not a message"])
            .unwrap());
        a.send(msg(9, 9)).await.unwrap();
        assert_eq!(b.next().await.unwrap().unwrap(), msg(9, 9));
        assert_eq!(b.stats().malformed, 1);
    }

    #[tokio::test]
    async fn a_corrupt_tail_fails_the_link_without_reading_out_of_bounds() {
        let (a, mut b) = ShmLink::pair(&ShmConfig::default()).await.unwrap();
        let tail = a.mem.atomic_u64(1024).unwrap();
        tail.store(u64::MAX / 2, std::sync::atomic::Ordering::SeqCst);
        // Ring 0 is read by the listener end, `b`.
        assert!(matches!(
            b.next().await,
            Some(Err(LinkError::PeerFailed(_)))
        ));
        assert!(b.next().await.is_none());
    }

    #[tokio::test]
    async fn a_listener_on_a_path_hands_out_links() {
        let dir = std::env::temp_dir().join(format!("uniplane-shm-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("l.sock");
        let _ = std::fs::remove_file(&path);
        let listener = ShmListener::bind(&path).unwrap();
        let client = tokio::spawn({
            let path = path.clone();
            async move {
                let mut c = ShmLink::connect(&path).await.unwrap();
                c.send(msg(5, 5)).await.unwrap();
                c.next().await.unwrap().unwrap()
            }
        });
        let mut s = listener.accept().await.unwrap();
        let m = s.next().await.unwrap().unwrap();
        s.send(m).await.unwrap();
        assert_eq!(client.await.unwrap(), msg(5, 5));
        drop(listener);
        assert!(!path.exists(), "the socket file goes with the listener");
    }

    #[tokio::test]
    async fn connecting_to_a_non_shm_socket_is_a_handshake_error() {
        let (a, b) = UnixStream::pair().unwrap();
        let writer = tokio::spawn(async move {
            a.writable().await.unwrap();
            a.try_write(b"hello, I am not a listener.....!").unwrap();
            a
        });
        let err = ShmLink::join(b, &ShmConfig::default()).await.unwrap_err();
        assert!(matches!(err, ShmError::Handshake(_)), "{err}");
        drop(writer.await.unwrap());
    }

    #[test]
    fn a_ring_size_that_is_not_a_power_of_two_is_refused() {
        let cfg = ShmConfig {
            ring_bytes: 300_000,
            ..ShmConfig::default()
        };
        assert!(matches!(cfg.check(), Err(ShmError::Config(_))));
    }
}
