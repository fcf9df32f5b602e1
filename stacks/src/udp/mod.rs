//! The `udp` stack: overlay messages in UDP datagrams.
//!
//! - **Unreliable, unordered.** A datagram lost, duplicated or reordered by
//!   the network stays so; use `ltl` on top of the same sockets for
//!   reliability.
//! - **Packing.** A link packs as many messages as fit into one datagram of
//!   at most [`UdpConfig::max_datagram`] bytes (1472 by default: an Ethernet
//!   MTU less the IPv4 and UDP headers); the receiver decodes every message
//!   of every datagram. A datagram that does not decode to the last byte
//!   (a malformed message, trailing garbage, an empty datagram) is counted
//!   in [`UdpStats::malformed`] and dropped whole, never a panic.
//! - **Bursts.** Datagrams move with `recvmmsg`/`sendmmsg`, with UDP GSO
//!   and GRO when the kernel offers them (probed on every socket at run
//!   time, turned off silently where refused), or through io_uring
//!   ([`Backend::IoUring`]). Received messages are `Bytes` slices of one
//!   large receive buffer: no allocation, lock or system call per message.
//!
//! ## What connect and listen mean without connections
//!
//! UDP has no handshake, so both are local operations:
//!
//! - `connect(peer)` binds an ephemeral socket and `connect(2)`s it to the
//!   peer. It succeeds whether or not anything listens; the link's stream
//!   never ends on its own.
//! - `listen(local)` binds a socket with `SO_REUSEPORT`. The first valid
//!   datagram from a new source address yields a new link: a socket bound
//!   to the same local address and connected to that source, so from then
//!   on the kernel delivers that peer's datagrams straight to the link's
//!   own socket (Linux prefers a connected socket in a reuse-port group).
//!   Datagrams that raced in on the listening socket meanwhile are handed
//!   to the link; a malformed first datagram creates no link. Dropping a
//!   link forgets the peer: its next datagram yields a new link.
//!
//! Every link therefore owns one socket and shares nothing with the others.

mod socket;
pub mod uring;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use atomic_waker::AtomicWaker;
use bytes::Bytes;
use futures_core::Stream;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use uniplane_dataplane::batched::{BatchedLink, LinkIo};
use uniplane_dataplane::wire::DecodeError;
use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, LinkError, Locator, Message, Stack, StackError, StackFuture,
};

use crate::datagram::{Datagram, DatagramPort, PortStats, TxBatch};
pub use socket::{EpollPort, Offloads};
pub use uring::UringPort;

/// Datagrams a link collects before `poll_ready` sends them without
/// waiting for `poll_flush`.
const FLUSH_AT: usize = socket::MAX_BATCH;

/// Which kernel interface moves the datagrams.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// Readiness through epoll (tokio's reactor), `recvmmsg`/`sendmmsg`.
    #[default]
    Epoll,
    /// Completion through an io_uring ring per socket. Opening a socket
    /// fails with [`StackError::Io`] when the kernel refuses io_uring.
    IoUring,
    /// io_uring when the kernel allows it, epoll otherwise.
    Auto,
}

/// How the `udp` stack sets up its sockets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UdpConfig {
    /// Which kernel interface moves datagrams.
    pub backend: Backend,
    /// Largest datagram sent, and so the largest encoded message.
    pub max_datagram: usize,
    /// Whether to pack many messages into one datagram.
    pub pack: bool,
    /// Use UDP segmentation offload on send where the kernel has it.
    pub gso: bool,
    /// Use generic receive offload where the kernel has it. It pays for
    /// bulk receives; a latency-bound link (one datagram at a time, as in
    /// a ping-pong) does better without: each receive with GRO on costs
    /// ~0.2 us more on loopback here (GRO-sized slots and their control
    /// message).
    pub gro: bool,
    /// `SO_RCVBUF` to ask for (the kernel may cap it).
    pub recv_buffer: Option<usize>,
    /// `SO_SNDBUF` to ask for (the kernel may cap it).
    pub send_buffer: Option<usize>,
    /// Most peers one listener serves at once; datagrams from further new
    /// peers are dropped and counted.
    pub max_connections: usize,
    /// Busy polling: when nothing has arrived, a receive keeps asking the
    /// kernel (epoll backend: a non-blocking `recvmmsg` at a time; io_uring:
    /// the completion ring, no system call) for up to this long before it
    /// waits for a wake-up. It saves the reactor's wake-up and task switch
    /// on every datagram at the price of a busy core: for latency-bound
    /// links (best with `gro` off). Listening sockets never spin. `None`
    /// (the default) waits at once. Measured on loopback here, it takes the
    /// epoll backend's round trip from ~75 to ~4.6 us; io_uring's stays
    /// near its sleeping figure (its completions come as task work).
    pub busy_poll: Option<std::time::Duration>,
}

impl Default for UdpConfig {
    fn default() -> Self {
        UdpConfig {
            backend: Backend::Epoll,
            max_datagram: 1472,
            pack: true,
            gso: true,
            gro: true,
            recv_buffer: Some(4 << 20),
            send_buffer: Some(4 << 20),
            max_connections: 4096,
            busy_poll: None,
        }
    }
}

/// Counters of one socket, updated once per burst by the task that owns
/// it, on cache lines of their own. One set shared by every socket of a
/// stack made each burst a write to a line the peer's core wrote last: on a
/// ping-pong over loopback two such misses a hop, ~0.1 us of a 4 us round
/// trip.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Counters {
    rx_datagrams: AtomicU64,
    rx_messages: AtomicU64,
    tx_datagrams: AtomicU64,
    tx_messages: AtomicU64,
    malformed: AtomicU64,
    refused_peers: AtomicU64,
}

/// What a `udp` stack has moved so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UdpStats {
    /// Datagrams received.
    pub rx_datagrams: u64,
    /// Messages decoded from them.
    pub rx_messages: u64,
    /// Datagrams sent.
    pub tx_datagrams: u64,
    /// Messages sent.
    pub tx_messages: u64,
    /// Datagrams dropped because they did not decode.
    pub malformed: u64,
    /// Datagrams from new peers dropped at the connection limit.
    pub refused_peers: u64,
}

impl Counters {
    /// Adds these counters to `to`.
    fn add_to(&self, to: &mut UdpStats) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        to.rx_datagrams += get(&self.rx_datagrams);
        to.rx_messages += get(&self.rx_messages);
        to.tx_datagrams += get(&self.tx_datagrams);
        to.tx_messages += get(&self.tx_messages);
        to.malformed += get(&self.malformed);
        to.refused_peers += get(&self.refused_peers);
    }

    /// Adds `from` to these counters.
    fn absorb(&self, from: &Counters) {
        let mut s = UdpStats::default();
        from.add_to(&mut s);
        let add = |c: &AtomicU64, v: u64| c.fetch_add(v, Ordering::Relaxed);
        add(&self.rx_datagrams, s.rx_datagrams);
        add(&self.rx_messages, s.rx_messages);
        add(&self.tx_datagrams, s.tx_datagrams);
        add(&self.tx_messages, s.tx_messages);
        add(&self.malformed, s.malformed);
        add(&self.refused_peers, s.refused_peers);
    }
}

/// The counters of a stack's sockets: those open, and the sum of those
/// closed. The lock is taken when a socket opens or closes and when the
/// stack is asked for its figures, never per burst.
#[derive(Debug, Default)]
struct CounterSet {
    open: Mutex<Vec<Arc<Counters>>>,
    closed: Counters,
}

impl CounterSet {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Counters>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counters for a new socket, counted in this set until it closes.
    fn socket(self: &Arc<Self>) -> SocketCounters {
        let own = Arc::new(Counters::default());
        self.lock().push(own.clone());
        SocketCounters {
            own,
            set: self.clone(),
        }
    }

    fn snapshot(&self) -> UdpStats {
        let open = self.lock();
        let mut s = UdpStats::default();
        self.closed.add_to(&mut s);
        for c in open.iter() {
            c.add_to(&mut s);
        }
        s
    }
}

/// One socket's counters; what they counted moves to the stack's closed
/// sum when the socket closes.
#[derive(Debug)]
struct SocketCounters {
    own: Arc<Counters>,
    set: Arc<CounterSet>,
}

impl std::ops::Deref for SocketCounters {
    type Target = Counters;
    fn deref(&self) -> &Counters {
        &self.own
    }
}

impl Drop for SocketCounters {
    fn drop(&mut self) {
        let mut open = self.set.lock();
        if let Some(i) = open.iter().position(|c| Arc::ptr_eq(c, &self.own)) {
            open.swap_remove(i);
        }
        // Under the lock, so a snapshot sees these counts once, either here
        // or in the closed sum.
        self.set.closed.absorb(&self.own);
    }
}

/// A UDP socket behind either backend.
#[derive(Debug)]
pub enum UdpPort {
    /// epoll readiness with `recvmmsg`/`sendmmsg`.
    Epoll(Box<EpollPort>),
    /// io_uring completions.
    IoUring(Box<UringPort>),
}

impl UdpPort {
    /// Opens a port on `socket` with the configured backend.
    fn open(socket: Socket, connected: Option<SocketAddr>, cfg: &UdpConfig) -> io::Result<Self> {
        let want = Offloads {
            gso: cfg.gso,
            gro: cfg.gro,
        };
        let spin = cfg.busy_poll;
        let uring =
            cfg.backend == Backend::IoUring || (cfg.backend == Backend::Auto && uring::available());
        if uring {
            UringPort::new(socket, connected, cfg.max_datagram, want, spin)
                .map(|p| Self::IoUring(Box::new(p)))
        } else {
            EpollPort::new(socket, connected, cfg.max_datagram, want, spin)
                .map(|p| Self::Epoll(Box::new(p)))
        }
    }

    /// Binds a UDP socket at `local` as `cfg` says.
    pub fn bind(local: SocketAddr, cfg: &UdpConfig) -> io::Result<Self> {
        Self::open(bind_socket(local, cfg, false)?, None, cfg)
    }

    /// The backend in use.
    pub fn backend(&self) -> Backend {
        match self {
            UdpPort::Epoll(_) => Backend::Epoll,
            UdpPort::IoUring(_) => Backend::IoUring,
        }
    }
}

impl DatagramPort for UdpPort {
    type Addr = SocketAddr;

    fn local_addr(&self) -> SocketAddr {
        match self {
            UdpPort::Epoll(p) => p.local_addr(),
            UdpPort::IoUring(p) => p.local_addr(),
        }
    }

    fn max_datagram_size(&self) -> usize {
        match self {
            UdpPort::Epoll(p) => p.max_datagram_size(),
            UdpPort::IoUring(p) => p.max_datagram_size(),
        }
    }

    fn poll_recv(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Datagram<SocketAddr>>,
        max: usize,
    ) -> Poll<io::Result<usize>> {
        match self {
            UdpPort::Epoll(p) => p.poll_recv(cx, out, max),
            UdpPort::IoUring(p) => p.poll_recv(cx, out, max),
        }
    }

    fn poll_send(
        &mut self,
        cx: &mut Context<'_>,
        batch: &mut TxBatch<SocketAddr>,
    ) -> Poll<io::Result<()>> {
        match self {
            UdpPort::Epoll(p) => p.poll_send(cx, batch),
            UdpPort::IoUring(p) => p.poll_send(cx, batch),
        }
    }

    fn stats(&self) -> PortStats {
        match self {
            UdpPort::Epoll(p) => p.stats(),
            UdpPort::IoUring(p) => p.stats(),
        }
    }
}

/// A non-blocking UDP socket bound at `local`.
pub(crate) fn bind_socket(
    local: SocketAddr,
    cfg: &UdpConfig,
    reuse_port: bool,
) -> io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(local), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_nonblocking(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    // Buffer sizes are wishes: the kernel caps them at its limits.
    if let Some(n) = cfg.recv_buffer {
        let _ = socket.set_recv_buffer_size(n);
    }
    if let Some(n) = cfg.send_buffer {
        let _ = socket.set_send_buffer_size(n);
    }
    socket.bind(&SockAddr::from(local))?;
    Ok(socket)
}

fn unspecified_like(peer: &SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(_) => SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
        SocketAddr::V6(_) => SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0),
    }
}

/// Decodes every message of `data` onto `out`, all or nothing: on an
/// error `out` is as it was.
pub(crate) fn decode_datagram(
    data: &Bytes,
    out: &mut VecDeque<Message>,
) -> Result<usize, DecodeError> {
    if data.is_empty() {
        return Err(DecodeError::Truncated {
            needed: uniplane_dataplane::wire::HEADER_LEN,
            available: 0,
        });
    }
    let before = out.len();
    let mut at = 0;
    while at < data.len() {
        match Message::decode(&data.slice(at..)) {
            Ok((m, used)) => {
                out.push_back(m);
                at += used;
            }
            Err(e) => {
                out.truncate(before);
                return Err(e);
            }
        }
    }
    Ok(out.len() - before)
}

/// Datagrams that reached the listening socket for a peer that already has
/// a link (they raced the link's own socket); the link drains them first.
#[derive(Debug, Default)]
struct Stragglers {
    queue: Mutex<VecDeque<Bytes>>,
    any: AtomicBool,
    waker: AtomicWaker,
}

impl Stragglers {
    fn push(&self, data: Bytes) {
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(data);
        self.any.store(true, Ordering::Release);
        self.waker.wake();
    }

    fn take(&self) -> VecDeque<Bytes> {
        self.any.store(false, Ordering::Release);
        std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// One end of a `udp` link: a socket connected to one peer, as a
/// [`BatchedLink`] over [`UdpSocketIo`].
pub type UdpLink = BatchedLink<UdpSocketIo>;

/// The I/O of a [`UdpLink`]: its own connected socket, and the datagrams
/// being packed for it.
///
/// Busy polling ([`UdpConfig::busy_poll`]) lives in the socket's port, below
/// this: the link's plumbing is the same with it or without.
pub struct UdpSocketIo {
    port: UdpPort,
    peer: SocketAddr,
    max_datagram: usize,
    pack: bool,
    rx: Vec<Datagram<SocketAddr>>,
    tx: TxBatch<SocketAddr>,
    /// Messages accepted since the counters were last updated.
    tx_messages: u64,
    counters: SocketCounters,
    stragglers: Option<Arc<Stragglers>>,
}

impl std::fmt::Debug for UdpSocketIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpLink")
            .field("local", &self.port.local_addr())
            .field("peer", &self.peer)
            .field("backend", &self.port.backend())
            .finish()
    }
}

impl UdpSocketIo {
    fn new(port: UdpPort, peer: SocketAddr, cfg: &UdpConfig, counters: SocketCounters) -> Self {
        let max_datagram = port.max_datagram_size();
        UdpSocketIo {
            port,
            peer,
            max_datagram,
            pack: cfg.pack,
            rx: Vec::with_capacity(socket::MAX_BATCH),
            tx: TxBatch::with_capacity(FLUSH_AT * max_datagram, FLUSH_AT * 2),
            tx_messages: 0,
            counters,
            stragglers: None,
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// This end's address.
    pub fn local_addr(&self) -> SocketAddr {
        self.port.local_addr()
    }

    /// The socket's port, with its backend and counters.
    pub fn port(&self) -> &UdpPort {
        &self.port
    }

    /// Decodes received datagrams onto `pending`, counting the bad.
    fn absorb<'a>(
        counters: &Counters,
        pending: &mut VecDeque<Message>,
        datagrams: impl Iterator<Item = &'a Bytes>,
    ) {
        let (mut n, mut msgs, mut bad) = (0u64, 0u64, 0u64);
        for data in datagrams {
            n += 1;
            match decode_datagram(data, pending) {
                Ok(k) => msgs += k as u64,
                Err(_) => bad += 1,
            }
        }
        counters.rx_datagrams.fetch_add(n, Ordering::Relaxed);
        counters.rx_messages.fetch_add(msgs, Ordering::Relaxed);
        if bad > 0 {
            counters.malformed.fetch_add(bad, Ordering::Relaxed);
        }
    }
}

impl LinkIo for UdpSocketIo {
    fn max_message(&self) -> usize {
        self.max_datagram
    }

    /// Packs the message into the last datagram when it fits there.
    fn queue(&mut self, message: Message, size: usize) {
        let fits =
            self.pack && matches!(self.tx.last_len(), Some(l) if l + size <= self.max_datagram);
        if !fits {
            self.tx.push(self.peer);
        }
        message.encode(self.tx.buffer_mut());
        self.tx_messages += 1;
    }

    fn is_full(&self) -> bool {
        self.tx.pending() >= FLUSH_AT
    }

    /// Takes stragglers from the listener first, then a burst of datagrams.
    fn poll_receive(
        &mut self,
        cx: &mut Context<'_>,
        pending: &mut VecDeque<Message>,
    ) -> Poll<Result<bool, LinkError>> {
        loop {
            if let Some(s) = &self.stragglers {
                if s.any.load(Ordering::Acquire) {
                    let late = s.take();
                    Self::absorb(&self.counters, pending, late.iter());
                }
            }
            if !pending.is_empty() {
                return Poll::Ready(Ok(true));
            }
            self.rx.clear();
            match self.port.poll_recv(cx, &mut self.rx, socket::MAX_BATCH) {
                Poll::Ready(Ok(_)) => {
                    Self::absorb(&self.counters, pending, self.rx.iter().map(|d| &d.data));
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e.into())),
                Poll::Pending => {
                    let Some(s) = &self.stragglers else {
                        return Poll::Pending;
                    };
                    s.waker.register(cx.waker());
                    if !s.any.load(Ordering::Acquire) {
                        return Poll::Pending;
                    }
                }
            }
        }
    }

    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let before = self.tx.pending();
        let r = self.port.poll_send(cx, &mut self.tx);
        let sent = before - self.tx.pending();
        if sent > 0 {
            self.counters
                .tx_datagrams
                .fetch_add(sent as u64, Ordering::Relaxed);
        }
        if self.tx_messages > 0 && self.tx.is_empty() {
            self.counters
                .tx_messages
                .fetch_add(self.tx_messages, Ordering::Relaxed);
            self.tx_messages = 0;
        }
        r.map_err(LinkError::from)
    }
}

fn new_link(io: UdpSocketIo, first: VecDeque<Message>) -> UdpLink {
    BatchedLink::with_received(io, first)
}

/// Links from new peers of one listening socket.
pub struct UdpListener {
    port: UdpPort,
    config: UdpConfig,
    counters: SocketCounters,
    set: Arc<CounterSet>,
    peers: HashMap<SocketAddr, Weak<Stragglers>>,
    rx: Vec<Datagram<SocketAddr>>,
    ready: VecDeque<UdpLink>,
}

impl std::fmt::Debug for UdpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpListener")
            .field("local", &self.port.local_addr())
            .field("peers", &self.peers.len())
            .finish()
    }
}

impl UdpListener {
    /// The address it listens at (with the port the kernel chose for 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.port.local_addr()
    }

    /// A link for a new peer whose first datagram is `data`.
    fn accept(&mut self, peer: SocketAddr, data: &Bytes) -> io::Result<Option<UdpLink>> {
        let mut first = VecDeque::new();
        if decode_datagram(data, &mut first).is_err() {
            self.counters.malformed.fetch_add(1, Ordering::Relaxed);
            return Ok(None);
        }
        self.counters.rx_datagrams.fetch_add(1, Ordering::Relaxed);
        if self.peers.len() >= self.config.max_connections {
            self.peers.retain(|_, s| s.strong_count() > 0);
            if self.peers.len() >= self.config.max_connections {
                self.counters.refused_peers.fetch_add(1, Ordering::Relaxed);
                return Ok(None);
            }
        }
        self.counters
            .rx_messages
            .fetch_add(first.len() as u64, Ordering::Relaxed);
        let socket = bind_socket(self.local_addr(), &self.config, true)?;
        socket.connect(&SockAddr::from(peer))?;
        let port = UdpPort::open(socket, Some(peer), &self.config)?;
        let mut io = UdpSocketIo::new(port, peer, &self.config, self.set.socket());
        let stragglers = Arc::new(Stragglers::default());
        self.peers.insert(peer, Arc::downgrade(&stragglers));
        io.stragglers = Some(stragglers);
        Ok(Some(new_link(io, first)))
    }
}

impl Stream for UdpListener {
    type Item = Result<UdpLink, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(link) = this.ready.pop_front() {
                return Poll::Ready(Some(Ok(link)));
            }
            this.rx.clear();
            match this.port.poll_recv(cx, &mut this.rx, socket::MAX_BATCH) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Pending => return Poll::Pending,
            }
            let rx = std::mem::take(&mut this.rx);
            for d in &rx {
                if let Some(s) = this.peers.get(&d.peer).and_then(Weak::upgrade) {
                    s.push(d.data.clone());
                    continue;
                }
                match this.accept(d.peer, &d.data) {
                    Ok(Some(link)) => this.ready.push_back(link),
                    Ok(None) => {}
                    Err(e) => {
                        this.rx = rx;
                        return Poll::Ready(Some(Err(e.into())));
                    }
                }
            }
            this.rx = rx;
        }
    }
}

/// The `udp` stack.
#[derive(Clone, Debug, Default)]
pub struct UdpStack {
    config: UdpConfig,
    counters: Arc<CounterSet>,
}

impl UdpStack {
    /// A stack with the default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stack configured by `config`.
    pub fn with_config(config: UdpConfig) -> Self {
        UdpStack {
            config,
            counters: Arc::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &UdpConfig {
        &self.config
    }

    /// Counters of every socket of this stack.
    pub fn stats(&self) -> UdpStats {
        self.counters.snapshot()
    }

    fn socket_addr(locator: &Locator) -> Result<SocketAddr, StackError> {
        match locator {
            Locator::Socket(s) => Ok(*s),
            other => Err(StackError::UnsupportedLocator {
                stack: "udp",
                locator: other.clone(),
            }),
        }
    }

    /// Opens a link to `peer` now; must be called inside a tokio runtime.
    pub fn connect_now(&self, peer: &Locator) -> Result<UdpLink, StackError> {
        let addr = Self::socket_addr(peer)?;
        let socket = bind_socket(unspecified_like(&addr), &self.config, false)?;
        socket.connect(&SockAddr::from(addr))?;
        let port = UdpPort::open(socket, Some(addr), &self.config)?;
        let io = UdpSocketIo::new(port, addr, &self.config, self.counters.socket());
        Ok(new_link(io, VecDeque::with_capacity(1024)))
    }

    /// Listens at `local` now; must be called inside a tokio runtime.
    pub fn listen_now(&self, local: &Locator) -> Result<UdpListener, StackError> {
        let addr = Self::socket_addr(local)?;
        let socket = bind_socket(addr, &self.config, true).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => StackError::AddrInUse(local.clone()),
            _ => StackError::Io(e),
        })?;
        // A listener only sees first datagrams: it never spins.
        let quiet = UdpConfig {
            busy_poll: None,
            ..self.config.clone()
        };
        let port = UdpPort::open(socket, None, &quiet)?;
        Ok(UdpListener {
            port,
            config: self.config.clone(),
            counters: self.counters.socket(),
            set: self.counters.clone(),
            peers: HashMap::new(),
            rx: Vec::with_capacity(socket::MAX_BATCH),
            ready: VecDeque::new(),
        })
    }
}

impl Stack for UdpStack {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: false,
            ordered: false,
            mtu: self.config.max_datagram.min(socket::MAX_UDP_PAYLOAD),
            one_sided: false,
            max_connections: self.config.max_connections,
        }
    }

    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink> {
        let peer = peer.clone();
        Box::pin(async move { self.connect_now(&peer).map(|l| Box::new(l) as BoxLink) })
    }

    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener> {
        let local = local.clone();
        Box::pin(async move {
            let listener = self.listen_now(&local)?;
            Ok(Box::pin(futures_util::StreamExt::map(listener, |r| {
                r.map(|l| Box::new(l) as BoxLink)
            })) as BoxListener)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stacks_figures_sum_its_open_sockets_and_keep_those_of_closed_ones() {
        let set = Arc::new(CounterSet::default());
        let a = set.socket();
        let b = set.socket();
        a.rx_datagrams.fetch_add(3, Ordering::Relaxed);
        b.rx_datagrams.fetch_add(4, Ordering::Relaxed);
        b.tx_messages.fetch_add(5, Ordering::Relaxed);
        assert_eq!(set.snapshot().rx_datagrams, 7);
        drop(b);
        let s = set.snapshot();
        assert_eq!((s.rx_datagrams, s.tx_messages), (7, 5));
        assert_eq!(set.lock().len(), 1, "the closed socket left the open list");
        a.malformed.fetch_add(1, Ordering::Relaxed);
        drop(a);
        let s = set.snapshot();
        assert_eq!((s.rx_datagrams, s.tx_messages, s.malformed), (7, 5, 1));
        assert!(set.lock().is_empty());
        // Each socket's counters on lines of their own.
        assert_eq!(std::mem::align_of::<Counters>(), 128);
    }
}
