//! A smoltcp interface running on a frame device: one driver task polls
//! the device and smoltcp's timers; links reach their sockets under one
//! lock taken per batch of messages, never per frame.
//!
//! ```text
//!  TcpLink / UdpLink ──lock per batch──► SocketSet ◄── Interface::poll ◄── Phy ◄── frame device
//!        ▲                                                  (driver task: device readiness + timers)
//!        └──────────── woken when their sockets change ─────────┘
//! ```

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use atomic_waker::AtomicWaker;
use bytes::{Buf, Bytes, BytesMut};
use futures_core::Stream;
use smoltcp::iface::{Config, Interface, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::{tcp, udp};
use smoltcp::time::{Duration as SmolDuration, Instant as SmolInstant};
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr, IpEndpoint};
use tokio_util::codec::Decoder;
use uniplane_dataplane::batched::{BatchedLink, LinkIo};
use uniplane_dataplane::codec::MessageCodec;
use uniplane_dataplane::{LinkError, Locator, Message, StackError};
use uniplane_frame::eth::MacAddr;
use uniplane_frame::{AsyncDevice, FrameDevice, TxQueue};

use crate::phy::Phy;

/// How a host sets itself up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostConfig {
    /// Its Ethernet address; `None` takes the device's.
    pub mac: Option<MacAddr>,
    /// Its IPv4 address.
    pub addr: Ipv4Addr,
    /// The prefix length of its subnet.
    pub prefix_len: u8,
    /// The default gateway.
    pub gateway: Option<Ipv4Addr>,
    /// Receive buffer of each TCP socket (window scaling above 64 KiB).
    pub tcp_rx_buffer: usize,
    /// Send buffer of each TCP socket.
    pub tcp_tx_buffer: usize,
    /// Datagrams each UDP socket buffers per direction.
    pub udp_packets: usize,
    /// Bytes each UDP socket buffers per direction.
    pub udp_bytes: usize,
    /// Listening sockets kept ready per TCP listener.
    pub backlog: usize,
    /// Seed of smoltcp's random numbers (initial sequence numbers, ports).
    pub seed: u64,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            mac: None,
            addr: Ipv4Addr::new(192, 0, 2, 1),
            prefix_len: 24,
            gateway: None,
            tcp_rx_buffer: 1 << 20,
            tcp_tx_buffer: 1 << 20,
            udp_packets: 1024,
            udp_bytes: 1 << 20,
            backlog: 4,
            seed: 0x5eed,
        }
    }
}

/// What a host counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// Driver turns that polled the interface.
    pub polls: u64,
    /// Frames smoltcp wrote while the device had no room: dropped (TCP
    /// retransmits them).
    pub tx_dropped: u64,
    /// UDP datagrams that did not decode to whole messages: dropped.
    pub malformed: u64,
    /// UDP datagrams from peers no link or listener takes: dropped.
    pub unknown_peer: u64,
}

#[derive(Default)]
struct Wakers {
    rx: Option<Waker>,
    tx: Option<Waker>,
}

struct TcpBacklog {
    listening: Vec<SocketHandle>,
    ready: VecDeque<SocketHandle>,
    waker: Option<Waker>,
}

/// Per-peer queues of one UDP socket.
#[derive(Default)]
struct UdpQueues {
    /// The peer of a connected link; `None` for a listener's socket.
    connected: Option<IpEndpoint>,
    listening: bool,
    peers: HashMap<IpEndpoint, VecDeque<Message>>,
    accept: VecDeque<IpEndpoint>,
    accept_waker: Option<Waker>,
}

struct Inner<D: FrameDevice> {
    iface: Interface,
    sockets: SocketSet<'static>,
    dev: AsyncDevice<D>,
    spill: Vec<u8>,
    wakers: HashMap<SocketHandle, Wakers>,
    /// Wakers of UDP links, by socket and peer.
    udp_wakers: HashMap<(SocketHandle, IpEndpoint), Waker>,
    tcp_listeners: HashMap<u16, TcpBacklog>,
    udp: HashMap<SocketHandle, UdpQueues>,
    /// Sockets whose link is gone, removed once closed.
    orphans: Vec<SocketHandle>,
    next_port: u16,
    handles: usize,
    stats: HostStats,
    rx_buf: BytesMut,
    config: HostConfig,
}

struct Shared<D: FrameDevice> {
    inner: Mutex<Inner<D>>,
    driver: AtomicWaker,
    epoch: std::time::Instant,
}

impl<D: FrameDevice> Shared<D> {
    fn lock(&self) -> MutexGuard<'_, Inner<D>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn now(&self) -> SmolInstant {
        SmolInstant::from_micros(self.epoch.elapsed().as_micros() as i64)
    }

    fn add_handle(self: &Arc<Self>) -> Arc<Self> {
        self.lock().handles += 1;
        self.clone()
    }
}

fn release<D: FrameDevice>(shared: &Shared<D>) {
    shared.lock().handles -= 1;
    shared.driver.wake();
}

/// A smoltcp interface on a frame device, driven by its own task. Dropping
/// every handle (this, links, listeners) stops the task.
pub struct Host<D: FrameDevice> {
    shared: Arc<Shared<D>>,
}

impl<D: FrameDevice> Drop for Host<D> {
    fn drop(&mut self) {
        release(&self.shared);
    }
}

const EPHEMERAL: std::ops::RangeInclusive<u16> = 49152..=65535;

impl<D: FrameDevice> Host<D> {
    /// Starts smoltcp on `dev` as `config` says, in a new tokio task; must
    /// be called inside a tokio runtime.
    pub fn spawn(dev: D, config: HostConfig) -> std::io::Result<Host<D>> {
        let mac = config.mac.unwrap_or(dev.mac());
        let mut dev = AsyncDevice::new(dev)?;
        let mut cfg = Config::new(HardwareAddress::Ethernet(EthernetAddress(mac.0)));
        cfg.random_seed = config.seed;
        let epoch = std::time::Instant::now();
        let mut spill = Vec::new();
        let mut iface = {
            let mut phy = Phy::new(dev.get_mut(), &mut spill);
            Interface::new(cfg, &mut phy, SmolInstant::from_micros(0))
        };
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(config.addr), config.prefix_len));
        });
        if let Some(gw) = config.gateway {
            iface
                .routes_mut()
                .add_default_ipv4_route(gw)
                .map_err(|_| std::io::Error::other("route table full"))?;
        }
        let first_port = *EPHEMERAL.start() + (config.seed % 16_000) as u16;
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner {
                iface,
                sockets: SocketSet::new(Vec::new()),
                dev,
                spill,
                wakers: HashMap::new(),
                udp_wakers: HashMap::new(),
                tcp_listeners: HashMap::new(),
                udp: HashMap::new(),
                orphans: Vec::new(),
                next_port: first_port,
                handles: 1,
                stats: HostStats::default(),
                rx_buf: BytesMut::new(),
                config,
            }),
            driver: AtomicWaker::new(),
            epoch,
        });
        tokio::spawn(Driver {
            shared: shared.clone(),
            timer: Box::pin(tokio::time::sleep(std::time::Duration::from_secs(3600))),
            wake: Vec::new(),
        });
        Ok(Host { shared })
    }

    /// Counters so far.
    pub fn stats(&self) -> HostStats {
        self.shared.lock().stats
    }

    /// The device's counters.
    pub fn frame_stats(&self) -> uniplane_frame::FrameStats {
        self.shared.lock().dev.get_ref().stats()
    }

    /// The host's IPv4 address.
    pub fn addr(&self) -> Ipv4Addr {
        self.shared.lock().config.addr
    }

    fn v4(peer: SocketAddr) -> Result<SocketAddrV4, StackError> {
        match peer {
            SocketAddr::V4(v4) => Ok(v4),
            SocketAddr::V6(_) => Err(StackError::UnsupportedLocator {
                stack: "smoltcp",
                locator: Locator::Socket(peer),
            }),
        }
    }

    fn tcp_socket(cfg: &HostConfig) -> tcp::Socket<'static> {
        let mut s = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; cfg.tcp_rx_buffer]),
            tcp::SocketBuffer::new(vec![0; cfg.tcp_tx_buffer]),
        );
        s.set_nagle_enabled(false);
        s.set_timeout(Some(SmolDuration::from_secs(20)));
        s
    }

    /// Opens a TCP connection to `peer` and waits until it is established.
    pub async fn connect_tcp(&self, peer: SocketAddr) -> Result<TcpLink<D>, StackError> {
        let v4 = Self::v4(peer)?;
        let handle = {
            let mut g = self.shared.lock();
            let mut s = Self::tcp_socket(&g.config);
            let port = g.ephemeral();
            let remote = IpEndpoint::new(IpAddress::Ipv4(*v4.ip()), v4.port());
            let inner = &mut *g;
            s.connect(inner.iface.context(), remote, port)
                .map_err(|e| {
                    StackError::Io(std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("smoltcp connect: {e}"),
                    ))
                })?;
            inner.sockets.add(s)
        };
        self.shared.driver.wake();
        let link = tcp_link(self.shared.add_handle(), handle);
        std::future::poll_fn(|cx| {
            let mut g = link.shared.lock();
            match g.sockets.get::<tcp::Socket>(handle).state() {
                tcp::State::SynSent | tcp::State::SynReceived => {
                    g.wakers.entry(handle).or_default().tx = Some(cx.waker().clone());
                    Poll::Pending
                }
                tcp::State::Closed | tcp::State::TimeWait => {
                    Poll::Ready(Err(StackError::Refused(Locator::Socket(peer))))
                }
                _ => Poll::Ready(Ok(())),
            }
        })
        .await?;
        Ok(link)
    }

    /// Accepts TCP connections on `port`.
    pub fn listen_tcp(&self, port: u16) -> Result<TcpListener<D>, StackError> {
        let mut g = self.shared.lock();
        if g.tcp_listeners.contains_key(&port) {
            let at = SocketAddr::from((g.config.addr, port));
            return Err(StackError::AddrInUse(Locator::Socket(at)));
        }
        let mut backlog = TcpBacklog {
            listening: Vec::new(),
            ready: VecDeque::new(),
            waker: None,
        };
        for _ in 0..g.config.backlog.max(1) {
            let h = g.new_listening(port)?;
            backlog.listening.push(h);
        }
        g.tcp_listeners.insert(port, backlog);
        drop(g);
        self.shared.driver.wake();
        Ok(TcpListener {
            shared: self.shared.add_handle(),
            port,
        })
    }

    fn udp_socket(g: &mut Inner<D>, port: u16) -> Result<SocketHandle, StackError> {
        let cfg = &g.config;
        let buf = |n: usize, bytes: usize| {
            udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; n], vec![0u8; bytes])
        };
        let mut s = udp::Socket::new(
            buf(cfg.udp_packets, cfg.udp_bytes),
            buf(cfg.udp_packets, cfg.udp_bytes),
        );
        s.bind(port).map_err(|e| {
            StackError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("smoltcp bind: {e}"),
            ))
        })?;
        Ok(g.sockets.add(s))
    }

    /// A UDP link to `peer` from an ephemeral port: messages packed into
    /// datagrams; datagrams from anyone else are dropped.
    pub fn connect_udp(&self, peer: SocketAddr) -> Result<UdpLink<D>, StackError> {
        let v4 = Self::v4(peer)?;
        let remote = IpEndpoint::new(IpAddress::Ipv4(*v4.ip()), v4.port());
        let mut g = self.shared.lock();
        let port = g.ephemeral();
        let h = Self::udp_socket(&mut g, port)?;
        let mut q = UdpQueues {
            connected: Some(remote),
            ..UdpQueues::default()
        };
        q.peers.insert(remote, VecDeque::new());
        g.udp.insert(h, q);
        let mtu = g.dev.get_ref().mtu();
        drop(g);
        Ok(udp_link(self.shared.add_handle(), h, remote, mtu, true))
    }

    /// Accepts UDP links on `port`: the first valid datagram from a new
    /// peer yields a link for that peer.
    pub fn listen_udp(&self, port: u16) -> Result<UdpListener<D>, StackError> {
        let mut g = self.shared.lock();
        let h = Self::udp_socket(&mut g, port)?;
        g.udp.insert(
            h,
            UdpQueues {
                listening: true,
                ..UdpQueues::default()
            },
        );
        drop(g);
        Ok(UdpListener {
            shared: self.shared.add_handle(),
            handle: h,
        })
    }
}

impl<D: FrameDevice> Inner<D> {
    fn ephemeral(&mut self) -> u16 {
        let p = self.next_port;
        self.next_port = if p == *EPHEMERAL.end() {
            *EPHEMERAL.start()
        } else {
            p + 1
        };
        p
    }

    fn new_listening(&mut self, port: u16) -> Result<SocketHandle, StackError> {
        let mut s = Host::<D>::tcp_socket(&self.config);
        s.listen(port).map_err(|e| {
            StackError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("smoltcp listen: {e}"),
            ))
        })?;
        Ok(self.sockets.add(s))
    }

    /// Moves connections out of listening sockets, refilling the backlog.
    fn promote(&mut self, wake: &mut Vec<Waker>) {
        let ports: Vec<u16> = self.tcp_listeners.keys().copied().collect();
        for port in ports {
            let mut i = 0;
            while let Some(b) = self.tcp_listeners.get_mut(&port) {
                let Some(&h) = b.listening.get(i) else {
                    break;
                };
                let state = self.sockets.get::<tcp::Socket>(h).state();
                match state {
                    tcp::State::Listen | tcp::State::SynReceived => i += 1,
                    tcp::State::Closed => {
                        let _ = self.sockets.get_mut::<tcp::Socket>(h).listen(port);
                        i += 1;
                    }
                    _ => {
                        b.listening.swap_remove(i);
                        b.ready.push_back(h);
                        wake.extend(b.waker.take());
                        if let Ok(n) = self.new_listening(port) {
                            if let Some(b) = self.tcp_listeners.get_mut(&port) {
                                b.listening.push(n);
                            }
                        }
                    }
                }
            }
        }
    }

    /// Drains every UDP socket into the queues of its peers.
    fn sort_udp(&mut self, wake: &mut Vec<Waker>) {
        let Inner {
            sockets,
            udp,
            udp_wakers,
            rx_buf,
            stats,
            ..
        } = self;
        for (&h, q) in udp.iter_mut() {
            let s = sockets.get_mut::<udp::Socket>(h);
            while let Ok((data, meta)) = s.recv() {
                let peer = meta.endpoint;
                let known = q.peers.contains_key(&peer);
                if !known && (!q.listening || q.connected.is_some()) {
                    stats.unknown_peer += 1;
                    continue;
                }
                if rx_buf.capacity() - rx_buf.len() < data.len() {
                    *rx_buf = BytesMut::with_capacity((1 << 20).max(data.len()));
                }
                rx_buf.extend_from_slice(data);
                let bytes = rx_buf.split().freeze();
                let out = q.peers.entry(peer).or_default();
                if decode_datagram(&bytes, out).is_err() {
                    stats.malformed += 1;
                    if !known {
                        q.peers.remove(&peer);
                    }
                    continue;
                }
                if known {
                    wake.extend(udp_wakers.remove(&(h, peer)));
                } else {
                    q.accept.push_back(peer);
                    wake.extend(q.accept_waker.take());
                }
            }
        }
    }
}

/// Decodes every message of `data`, all or nothing.
fn decode_datagram(data: &Bytes, out: &mut VecDeque<Message>) -> Result<(), ()> {
    let before = out.len();
    let mut at = 0;
    while at < data.len() {
        match Message::decode(&data.slice(at..)) {
            Ok((m, used)) => {
                out.push_back(m);
                at += used;
            }
            Err(_) => {
                out.truncate(before);
                return Err(());
            }
        }
    }
    if out.len() == before {
        return Err(());
    }
    Ok(())
}

/// Egress passes per driver turn at most (each emits up to one segment
/// per socket).
const EGRESS_PASSES: usize = 64;

struct Driver<D: FrameDevice> {
    shared: Arc<Shared<D>>,
    timer: Pin<Box<tokio::time::Sleep>>,
    wake: Vec<Waker>,
}

impl<D: FrameDevice> Future for Driver<D> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.shared.driver.register(cx.waker());
        for _ in 0..32 {
            let now = this.shared.now();
            let mut g = this.shared.lock();
            if g.handles == 0 {
                return Poll::Ready(());
            }
            let frames = matches!(g.dev.poll_rx(cx), Poll::Ready(Ok(_)));
            let inner = &mut *g;
            let changed = {
                let mut phy = Phy::new(inner.dev.get_mut(), &mut inner.spill);
                let mut r = inner.iface.poll(now, &mut phy, &mut inner.sockets);
                // smoltcp emits at most one segment per socket per egress
                // pass: go on while it emits, so one flush (one system
                // call) carries a burst instead of a segment.
                for _ in 0..EGRESS_PASSES {
                    match inner.iface.poll_egress(now, &mut phy, &mut inner.sockets) {
                        PollResult::SocketStateChanged => r = PollResult::SocketStateChanged,
                        PollResult::None => break,
                    }
                }
                inner.stats.tx_dropped += phy.dropped;
                r
            };
            let _ = inner.dev.get_mut().queues().1.flush();
            inner.stats.polls += 1;
            let wake = &mut this.wake;
            // Sending frees buffer space without a state change, so every
            // blocked link looks again (links register only when blocked).
            for w in inner.wakers.values_mut() {
                wake.extend(w.rx.take());
                wake.extend(w.tx.take());
            }
            if changed == PollResult::SocketStateChanged {
                inner.promote(wake);
            }
            inner.sort_udp(wake);
            let sockets = &mut inner.sockets;
            inner.orphans.retain(|&h| {
                let gone = matches!(
                    sockets.get::<tcp::Socket>(h).state(),
                    tcp::State::Closed | tcp::State::TimeWait
                );
                if gone {
                    sockets.remove(h);
                }
                !gone
            });
            let delay = inner.iface.poll_delay(now, &inner.sockets);
            drop(g);
            for w in this.wake.drain(..) {
                w.wake();
            }
            let at = match delay {
                Some(d) => {
                    tokio::time::Instant::now() + std::time::Duration::from_micros(d.total_micros())
                }
                None => tokio::time::Instant::now() + std::time::Duration::from_secs(3600),
            };
            if this.timer.deadline() != at {
                this.timer.as_mut().reset(at);
            }
            let fired = this.timer.as_mut().poll(cx).is_ready();
            if !frames && !fired && delay != Some(SmolDuration::ZERO) {
                return Poll::Pending;
            }
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// Bytes of encoded messages a TCP link holds before `poll_ready` waits.
const TCP_HIGH_WATER: usize = 256 << 10;

/// A TCP connection of a [`Host`] as a [`Link`](uniplane_dataplane::Link):
/// messages framed by their own header on the byte stream. A
/// [`BatchedLink`] over [`TcpSocketIo`].
pub type TcpLink<D> = BatchedLink<TcpSocketIo<D>>;

/// The I/O of a [`TcpLink`]: its smoltcp socket, reached under the host's
/// lock once per batch, and the byte streams on both sides of it.
pub struct TcpSocketIo<D: FrameDevice> {
    shared: Arc<Shared<D>>,
    handle: SocketHandle,
    read: BytesMut,
    write: BytesMut,
    codec: MessageCodec,
}

fn tcp_link<D: FrameDevice>(shared: Arc<Shared<D>>, handle: SocketHandle) -> TcpLink<D> {
    let io = TcpSocketIo {
        shared,
        handle,
        read: BytesMut::with_capacity(256 << 10),
        write: BytesMut::with_capacity(TCP_HIGH_WATER * 2),
        codec: MessageCodec::new(),
    };
    BatchedLink::new(io, 0)
}

impl<D: FrameDevice> TcpSocketIo<D> {
    /// The peer's address.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        let g = self.shared.lock();
        let ep = g
            .sockets
            .get::<tcp::Socket>(self.handle)
            .remote_endpoint()?;
        match ep.addr {
            IpAddress::Ipv4(ip) => Some(SocketAddr::from((ip, ep.port))),
        }
    }
}

impl<D: FrameDevice> LinkIo for TcpSocketIo<D> {
    fn max_message(&self) -> usize {
        usize::MAX
    }

    fn queue(&mut self, message: Message, _encoded_len: usize) {
        message.encode(&mut self.write);
    }

    fn is_full(&self) -> bool {
        self.write.len() >= TCP_HIGH_WATER
    }

    fn poll_receive(
        &mut self,
        cx: &mut Context<'_>,
        rx: &mut VecDeque<Message>,
    ) -> Poll<Result<bool, LinkError>> {
        let mut g = self.shared.lock();
        let s = g.sockets.get_mut::<tcp::Socket>(self.handle);
        let mut read_any = false;
        while s.can_recv() {
            let read = &mut self.read;
            let n = s
                .recv(|buf| {
                    read.extend_from_slice(buf);
                    (buf.len(), buf.len())
                })
                .unwrap_or(0);
            if n == 0 {
                break;
            }
            read_any = true;
        }
        let open = s.may_recv();
        while let Some(m) = self.codec.decode(&mut self.read)? {
            rx.push_back(m);
        }
        if rx.is_empty() && open {
            g.wakers.entry(self.handle).or_default().rx = Some(cx.waker().clone());
        }
        drop(g);
        if read_any {
            // Reading opened the window: the driver may owe an update.
            self.shared.driver.wake();
        }
        if !rx.is_empty() {
            return Poll::Ready(Ok(true));
        }
        if !open {
            return Poll::Ready(Ok(false));
        }
        Poll::Pending
    }

    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if self.write.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let mut g = self.shared.lock();
        let s = g.sockets.get_mut::<tcp::Socket>(self.handle);
        let n = s.send_slice(&self.write).map_err(|_| LinkError::Closed)?;
        self.write.advance(n);
        if !self.write.is_empty() {
            if !s.may_send() {
                return Poll::Ready(Err(LinkError::Closed));
            }
            g.wakers.entry(self.handle).or_default().tx = Some(cx.waker().clone());
        }
        drop(g);
        if n > 0 {
            self.shared.driver.wake();
        }
        if self.write.is_empty() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn close(&mut self) {
        self.shared
            .lock()
            .sockets
            .get_mut::<tcp::Socket>(self.handle)
            .close();
        self.shared.driver.wake();
    }
}

impl<D: FrameDevice> Drop for TcpSocketIo<D> {
    fn drop(&mut self) {
        {
            let mut g = self.shared.lock();
            let s = g.sockets.get_mut::<tcp::Socket>(self.handle);
            let _ = s.send_slice(&self.write);
            s.close();
            g.orphans.push(self.handle);
            g.wakers.remove(&self.handle);
        }
        release(&self.shared);
    }
}

/// TCP connections arriving at one port of a [`Host`].
pub struct TcpListener<D: FrameDevice> {
    shared: Arc<Shared<D>>,
    port: u16,
}

impl<D: FrameDevice> TcpListener<D> {
    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl<D: FrameDevice> Stream for TcpListener<D> {
    type Item = Result<TcpLink<D>, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut g = self.shared.lock();
        let Some(b) = g.tcp_listeners.get_mut(&self.port) else {
            return Poll::Ready(None);
        };
        match b.ready.pop_front() {
            Some(h) => {
                drop(g);
                Poll::Ready(Some(Ok(tcp_link(self.shared.add_handle(), h))))
            }
            None => {
                b.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<D: FrameDevice> Drop for TcpListener<D> {
    fn drop(&mut self) {
        {
            let mut g = self.shared.lock();
            if let Some(b) = g.tcp_listeners.remove(&self.port) {
                for h in b.listening {
                    g.sockets.remove(h);
                }
                for h in b.ready {
                    g.sockets.get_mut::<tcp::Socket>(h).abort();
                    g.orphans.push(h);
                }
            }
        }
        release(&self.shared);
    }
}

/// Messages a UDP link queues before `poll_ready` pushes them.
const UDP_FLUSH_AT: usize = 64;

/// One peer of a UDP socket of a [`Host`] as a
/// [`Link`](uniplane_dataplane::Link): unreliable, messages packed into
/// datagrams up to the MTU; the stream never ends on its own. A
/// [`BatchedLink`] over [`UdpPeerIo`].
pub type UdpLink<D> = BatchedLink<UdpPeerIo<D>>;

/// The I/O of a [`UdpLink`]: one peer's queue of a smoltcp UDP socket
/// (its own, or a listener's it shares), reached under the host's lock
/// once per batch.
pub struct UdpPeerIo<D: FrameDevice> {
    shared: Arc<Shared<D>>,
    handle: SocketHandle,
    peer: IpEndpoint,
    max_datagram: usize,
    /// The link owns its socket (it connected); a listener's links share.
    owns_socket: bool,
    tx: VecDeque<Message>,
}

fn udp_link<D: FrameDevice>(
    shared: Arc<Shared<D>>,
    handle: SocketHandle,
    peer: IpEndpoint,
    mtu: usize,
    owns_socket: bool,
) -> UdpLink<D> {
    let io = UdpPeerIo {
        shared,
        handle,
        peer,
        max_datagram: mtu - 28,
        owns_socket,
        tx: VecDeque::new(),
    };
    BatchedLink::new(io, 0)
}

impl<D: FrameDevice> LinkIo for UdpPeerIo<D> {
    fn max_message(&self) -> usize {
        self.max_datagram
    }

    fn queue(&mut self, message: Message, _encoded_len: usize) {
        self.tx.push_back(message);
    }

    fn is_full(&self) -> bool {
        self.tx.len() >= UDP_FLUSH_AT
    }

    /// Takes the peer's queue whole.
    fn poll_receive(
        &mut self,
        cx: &mut Context<'_>,
        rx: &mut VecDeque<Message>,
    ) -> Poll<Result<bool, LinkError>> {
        let mut g = self.shared.lock();
        let inner = &mut *g;
        if let Some(q) = inner
            .udp
            .get_mut(&self.handle)
            .and_then(|q| q.peers.get_mut(&self.peer))
        {
            std::mem::swap(q, rx);
        }
        if rx.is_empty() {
            inner
                .udp_wakers
                .insert((self.handle, self.peer), cx.waker().clone());
            return Poll::Pending;
        }
        Poll::Ready(Ok(true))
    }

    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if self.tx.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let mut g = self.shared.lock();
        let s = g.sockets.get_mut::<udp::Socket>(self.handle);
        while !self.tx.is_empty() {
            let mut len = 0;
            let mut count = 0;
            for m in self.tx.iter() {
                let l = m.encoded_len();
                if count > 0 && len + l > self.max_datagram {
                    break;
                }
                len += l;
                count += 1;
            }
            match s.send(len, self.peer) {
                Ok(buf) => {
                    let mut at = 0;
                    for m in self.tx.drain(..count) {
                        let h = m
                            .header()
                            .encode(&mut buf[at..])
                            .map_err(LinkError::Malformed)?;
                        buf[at + h..at + h + m.payload().len()].copy_from_slice(m.payload());
                        at += h + m.payload().len();
                    }
                }
                Err(udp::SendError::BufferFull) => break,
                Err(e) => {
                    return Poll::Ready(Err(LinkError::Io(std::io::Error::other(e.to_string()))))
                }
            }
        }
        if !self.tx.is_empty() {
            g.wakers.entry(self.handle).or_default().tx = Some(cx.waker().clone());
        }
        drop(g);
        self.shared.driver.wake();
        if self.tx.is_empty() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }
}

impl<D: FrameDevice> Drop for UdpPeerIo<D> {
    fn drop(&mut self) {
        {
            let mut g = self.shared.lock();
            g.udp_wakers.remove(&(self.handle, self.peer));
            if self.owns_socket {
                g.udp.remove(&self.handle);
                g.sockets.remove(self.handle);
            } else if let Some(q) = g.udp.get_mut(&self.handle) {
                q.peers.remove(&self.peer);
            }
        }
        release(&self.shared);
    }
}

/// UDP links from new peers at one port of a [`Host`].
pub struct UdpListener<D: FrameDevice> {
    shared: Arc<Shared<D>>,
    handle: SocketHandle,
}

impl<D: FrameDevice> Stream for UdpListener<D> {
    type Item = Result<UdpLink<D>, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut g = self.shared.lock();
        let mtu = g.dev.get_ref().mtu();
        let Some(q) = g.udp.get_mut(&self.handle) else {
            return Poll::Ready(None);
        };
        match q.accept.pop_front() {
            Some(peer) => {
                drop(g);
                let link = udp_link(self.shared.add_handle(), self.handle, peer, mtu, false);
                Poll::Ready(Some(Ok(link)))
            }
            None => {
                q.accept_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

impl<D: FrameDevice> Drop for UdpListener<D> {
    fn drop(&mut self) {
        {
            let mut g = self.shared.lock();
            if let Some(q) = g.udp.get_mut(&self.handle) {
                q.listening = false;
                let waiting: Vec<IpEndpoint> = q.accept.drain(..).collect();
                for p in waiting {
                    q.peers.remove(&p);
                }
                // The socket goes with the last link that uses it.
                if q.peers.is_empty() {
                    g.udp.remove(&self.handle);
                    g.sockets.remove(self.handle);
                }
            }
        }
        release(&self.shared);
    }
}
