//! The thin async driver around the sans-IO [`LtlEndpoint`]: one task per
//! datagram port receives bursts, feeds them in, runs the timers, sends
//! what the endpoint has to send in bursts, and wakes the links whose
//! connections changed. Links move messages to and from the endpoint in
//! batches, taking its lock once per batch, never per message.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use atomic_waker::AtomicWaker;
use futures_core::Stream;
use uniplane_dataplane::batched::{BatchedLink, LinkIo};
use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, LinkError, Locator, Message, Stack, StackError, StackFuture,
};

use super::core::{ConnError, ConnId, Event, LtlConfig, LtlEndpoint, LtlStats, Recv, SendError};
use crate::datagram::fault::{BadProbability, LossyPort};
use crate::datagram::{Datagram, DatagramPort, TxBatch};
use crate::udp::{UdpConfig, UdpPort};
use uniplane_dataplane::SplitMix64;

/// What a peer address must be for the driver: a port's address type.
pub trait Addr:
    Copy + Eq + std::hash::Hash + std::fmt::Debug + Send + Sync + Unpin + 'static
{
}

impl<T: Copy + Eq + std::hash::Hash + std::fmt::Debug + Send + Sync + Unpin + 'static> Addr for T {}

/// Messages a link hands to the endpoint per lock.
const LINK_BATCH: usize = 64;
/// Datagrams per receive or send burst.
const BURST: usize = 64;

#[derive(Default)]
struct ConnWakers {
    rx: Option<Waker>,
    tx: Option<Waker>,
}

struct Inner<A> {
    endpoint: LtlEndpoint<A>,
    wakers: HashMap<ConnId, ConnWakers>,
    accept: Option<Waker>,
    /// Handles (stack, listener, links) still alive.
    handles: usize,
}

struct Shared<A> {
    inner: Mutex<Inner<A>>,
    driver: AtomicWaker,
    /// Cleared when the driver task ends or its runtime drops it: nothing
    /// moves on this endpoint any more.
    driver_alive: AtomicBool,
    max_message: usize,
}

impl<A> Shared<A> {
    fn lock(&self) -> MutexGuard<'_, Inner<A>> {
        // Every critical section leaves the endpoint consistent.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// An endpoint running on a port: opens connections and accepts them.
pub struct LtlHandle<A: Addr> {
    shared: Arc<Shared<A>>,
    local: A,
}

impl<A: Addr> LtlHandle<A> {
    /// The port's address.
    pub fn local_addr(&self) -> A {
        self.local
    }

    /// The endpoint's counters.
    pub fn stats(&self) -> LtlStats {
        self.shared.lock().endpoint.stats()
    }

    /// Connections in the endpoint's table; handshakes in progress at a
    /// listener are not among them (they are SYN cookies).
    pub fn connection_count(&self) -> usize {
        self.shared.lock().endpoint.connection_count()
    }

    fn new_ref(&self) -> Arc<Shared<A>> {
        self.shared.lock().handles += 1;
        self.shared.clone()
    }

    /// Opens a connection to `peer` and waits until it is established.
    pub async fn connect(&self, peer: A) -> Result<LtlLink<A>, StackError> {
        let id = {
            let mut g = self.shared.lock();
            let now = Instant::now();
            g.endpoint.connect(peer, now).map_err(|e| match e {
                SendError::Failed(_) => {
                    StackError::TooManyConnections(g.endpoint.config().max_connections)
                }
                _ => StackError::Shutdown,
            })?
        };
        self.shared.driver.wake();
        let link = new_link(self.new_ref(), id);
        std::future::poll_fn(|cx| {
            let mut g = link.shared.lock();
            if g.endpoint.is_established(id) {
                return Poll::Ready(Ok(()));
            }
            if !link.shared.driver_alive.load(Ordering::Acquire) {
                return Poll::Ready(Err(StackError::Shutdown));
            }
            if let Recv::Failed(e) = g.endpoint.recv(id) {
                return Poll::Ready(Err(match e {
                    ConnError::Reset => StackError::Refused(Locator::Name(format!("{peer:?}"))),
                    ConnError::TimedOut(_) => StackError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no answer from {peer:?}"),
                    )),
                }));
            }
            g.wakers.entry(id).or_default().tx = Some(cx.waker().clone());
            Poll::Pending
        })
        .await?;
        Ok(link)
    }

    /// Accepts connections from peers from now on.
    pub fn listen(&self) -> LtlListener<A> {
        self.shared.lock().endpoint.set_listening(true);
        LtlListener {
            shared: self.new_ref(),
        }
    }
}

impl<A: Addr> Drop for LtlHandle<A> {
    fn drop(&mut self) {
        release_handle(&self.shared);
    }
}

fn release_handle<A>(shared: &Shared<A>) {
    shared.lock().handles -= 1;
    shared.driver.wake();
}

/// Runs an LTL endpoint on `port` in a new tokio task. The task ends once
/// every handle, listener and link is gone and the connections closed.
pub fn spawn_endpoint<P: DatagramPort>(
    port: P,
    config: LtlConfig,
    seed: u64,
) -> LtlHandle<P::Addr> {
    let local = port.local_addr();
    let shared = Arc::new(Shared {
        max_message: config.max_message(),
        inner: Mutex::new(Inner {
            endpoint: LtlEndpoint::new(config, seed),
            wakers: HashMap::new(),
            accept: None,
            handles: 1,
        }),
        driver: AtomicWaker::new(),
        driver_alive: AtomicBool::new(true),
    });
    let driver = Driver {
        port,
        shared: shared.clone(),
        rx: Vec::with_capacity(BURST),
        tx: TxBatch::with_capacity(BURST * 1500, BURST),
        wake: Vec::new(),
        timer: Box::pin(tokio::time::sleep(std::time::Duration::from_secs(3600))),
    };
    tokio::spawn(driver);
    LtlHandle { shared, local }
}

struct Driver<P: DatagramPort> {
    port: P,
    shared: Arc<Shared<P::Addr>>,
    rx: Vec<Datagram<P::Addr>>,
    tx: TxBatch<P::Addr>,
    wake: Vec<Waker>,
    timer: Pin<Box<tokio::time::Sleep>>,
}

impl<P: DatagramPort> Driver<P> {
    /// Feeds received bursts, runs timers, gathers transmissions and the
    /// wakers to wake. Returns whether anything happened.
    fn turn(&mut self, cx: &mut Context<'_>) -> (bool, bool) {
        let mut busy = false;
        let mut io_error = false;
        for _ in 0..4 {
            self.rx.clear();
            match self.port.poll_recv(cx, &mut self.rx, BURST) {
                Poll::Ready(Ok(_)) => {
                    busy = true;
                    let now = Instant::now();
                    let mut g = self.shared.lock();
                    for d in &self.rx {
                        g.endpoint.handle_datagram_bytes(d.peer, &d.data, now);
                    }
                }
                Poll::Ready(Err(_)) => {
                    io_error = true;
                    break;
                }
                Poll::Pending => break,
            }
        }
        let now = Instant::now();
        let mut g = self.shared.lock();
        if g.endpoint.poll_timeout().is_some_and(|t| t <= now) {
            g.endpoint.handle_timeout(now);
        }
        while self.tx.pending() < BURST {
            let endpoint = &mut g.endpoint;
            if !self.tx.push_with(|buf| endpoint.poll_transmit(now, buf)) {
                break;
            }
            busy = true;
        }
        let inner = &mut *g;
        while let Some(ev) = inner.endpoint.poll_event() {
            let wake = &mut self.wake;
            let mut take = |id: ConnId, rx: bool, tx: bool| {
                if let Some(w) = inner.wakers.get_mut(&id) {
                    if rx {
                        wake.extend(w.rx.take());
                    }
                    if tx {
                        wake.extend(w.tx.take());
                    }
                }
            };
            match ev {
                Event::Connected(id) | Event::Writable(id) => take(id, false, true),
                Event::Readable(id) => take(id, true, false),
                Event::Failed(id, _) => take(id, true, true),
                Event::Incoming => wake.extend(inner.accept.take()),
                Event::Removed(id) => {
                    if let Some(w) = inner.wakers.remove(&id) {
                        wake.extend(w.rx);
                        wake.extend(w.tx);
                    }
                }
            }
        }
        let deadline = inner.endpoint.poll_timeout();
        drop(g);
        for w in self.wake.drain(..) {
            w.wake();
        }
        if let Some(at) = deadline {
            let at = tokio::time::Instant::from_std(at);
            if self.timer.deadline() != at {
                self.timer.as_mut().reset(at);
            }
        }
        if !self.tx.is_empty() {
            match self.port.poll_send(cx, &mut self.tx) {
                Poll::Ready(Ok(())) => {}
                // A datagram the kernel refuses (an unreachable peer) is
                // lost like any other; LTL repairs it or fails the peer.
                Poll::Ready(Err(_)) => self.tx.clear(),
                Poll::Pending => {}
            }
        }
        (busy, io_error)
    }
}

impl<P: DatagramPort> Future for Driver<P> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        this.shared.driver.register(cx.waker());
        for _ in 0..16 {
            let (busy, io_error) = this.turn(cx);
            if io_error {
                return Poll::Ready(());
            }
            {
                let g = this.shared.lock();
                if g.handles == 0 && g.endpoint.connection_count() == 0 && this.tx.is_empty() {
                    return Poll::Ready(());
                }
            }
            let timer_fired = this.timer.as_mut().poll(cx).is_ready();
            if !busy && !timer_fired {
                return Poll::Pending;
            }
            if timer_fired {
                let far = tokio::time::Instant::now() + std::time::Duration::from_secs(3600);
                this.timer.as_mut().reset(far);
            }
        }
        // Still busy: let other tasks run, then go on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

impl<P: DatagramPort> Drop for Driver<P> {
    fn drop(&mut self) {
        self.shared.driver_alive.store(false, Ordering::Release);
        // Whoever waits for this endpoint (a connect in progress) looks
        // again and finds it gone.
        let mut g = self.shared.lock();
        let inner = &mut *g;
        let mut wake: Vec<Waker> = inner.accept.take().into_iter().collect();
        for w in inner.wakers.values_mut() {
            wake.extend(w.rx.take());
            wake.extend(w.tx.take());
        }
        drop(g);
        wake.into_iter().for_each(Waker::wake);
    }
}

/// One LTL connection as a [`Link`](uniplane_dataplane::Link): a
/// [`BatchedLink`] over the connection's slot in the endpoint.
pub type LtlLink<A> = BatchedLink<LtlConnection<A>>;

/// The I/O of an [`LtlLink`]: one connection of a shared endpoint, reached
/// under its lock once per batch of messages.
pub struct LtlConnection<A: Addr> {
    shared: Arc<Shared<A>>,
    id: ConnId,
    tx: VecDeque<Message>,
}

fn new_link<A: Addr>(shared: Arc<Shared<A>>, id: ConnId) -> LtlLink<A> {
    let io = LtlConnection {
        shared,
        id,
        tx: VecDeque::with_capacity(LINK_BATCH),
    };
    BatchedLink::new(io, LINK_BATCH * 4)
}

fn peer_failed(e: ConnError) -> LinkError {
    LinkError::PeerFailed(e.to_string())
}

impl<A: Addr> LtlConnection<A> {
    /// The connection's id at this endpoint.
    pub fn id(&self) -> ConnId {
        self.id
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Option<A> {
        self.shared.lock().endpoint.peer(self.id)
    }

    /// The smoothed round-trip time and the retransmission timeout.
    pub fn timing(&self) -> Option<(Option<std::time::Duration>, std::time::Duration)> {
        self.shared.lock().endpoint.timing(self.id)
    }
}

impl<A: Addr> LinkIo for LtlConnection<A> {
    fn max_message(&self) -> usize {
        self.shared.max_message
    }

    fn queue(&mut self, message: Message, _encoded_len: usize) {
        self.tx.push_back(message);
    }

    fn is_full(&self) -> bool {
        self.tx.len() >= LINK_BATCH
    }

    /// Takes what the endpoint has for this connection, up to a few
    /// batches, under one lock.
    fn poll_receive(
        &mut self,
        cx: &mut Context<'_>,
        rx: &mut VecDeque<Message>,
    ) -> Poll<Result<bool, LinkError>> {
        let mut g = self.shared.lock();
        let mut open = true;
        for _ in 0..LINK_BATCH * 4 {
            match g.endpoint.recv(self.id) {
                Recv::Message(m) => rx.push_back(m),
                Recv::Empty => break,
                Recv::End => {
                    open = false;
                    break;
                }
                Recv::Failed(e) => {
                    if rx.is_empty() {
                        return Poll::Ready(Err(peer_failed(e)));
                    }
                    break;
                }
            }
        }
        if !rx.is_empty() {
            drop(g);
            // Reading freed credit: the driver may owe the peer an update.
            self.shared.driver.wake();
            return Poll::Ready(Ok(open));
        }
        if !open {
            return Poll::Ready(Ok(false));
        }
        g.wakers.entry(self.id).or_default().rx = Some(cx.waker().clone());
        Poll::Pending
    }

    /// Hands queued messages to the endpoint; `Pending` while it is full.
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if self.tx.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let mut g = self.shared.lock();
        let mut moved = false;
        while let Some(m) = self.tx.front() {
            match g.endpoint.send(self.id, m) {
                Ok(()) => {
                    self.tx.pop_front();
                    moved = true;
                }
                Err(SendError::Full) => break,
                Err(SendError::Failed(e)) => return Poll::Ready(Err(peer_failed(e))),
                Err(SendError::TooLarge(size)) => {
                    self.tx.pop_front();
                    return Poll::Ready(Err(LinkError::TooLarge {
                        size,
                        limit: self.shared.max_message,
                    }));
                }
                Err(SendError::Closed | SendError::Unknown) => {
                    return Poll::Ready(Err(LinkError::Closed))
                }
            }
        }
        if !self.tx.is_empty() {
            g.wakers.entry(self.id).or_default().tx = Some(cx.waker().clone());
        }
        drop(g);
        if moved {
            self.shared.driver.wake();
        }
        if self.tx.is_empty() {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn close(&mut self) {
        self.shared.lock().endpoint.close(self.id);
        self.shared.driver.wake();
    }
}

impl<A: Addr> Drop for LtlConnection<A> {
    fn drop(&mut self) {
        {
            let mut g = self.shared.lock();
            // Whatever was accepted still goes out; then the connection
            // closes (or, if it failed, leaves the table now).
            while let Some(m) = self.tx.pop_front() {
                if g.endpoint.send(self.id, &m).is_err() {
                    break;
                }
            }
            g.endpoint.close(self.id);
            g.endpoint.release(self.id);
            g.wakers.remove(&self.id);
            g.handles -= 1;
        }
        self.shared.driver.wake();
    }
}

/// Connections peers open to an endpoint.
pub struct LtlListener<A: Addr> {
    shared: Arc<Shared<A>>,
}

impl<A: Addr> LtlListener<A> {
    /// The endpoint's counters.
    pub fn stats(&self) -> LtlStats {
        self.shared.lock().endpoint.stats()
    }

    /// Connections in the endpoint's table; handshakes in progress are not
    /// among them (they are SYN cookies).
    pub fn connection_count(&self) -> usize {
        self.shared.lock().endpoint.connection_count()
    }

    /// Complete handshakes waiting to be accepted (at most
    /// [`LtlConfig::accept_backlog`]).
    pub fn accept_queue_len(&self) -> usize {
        self.shared.lock().endpoint.accept_queue_len()
    }
}

impl<A: Addr> Stream for LtlListener<A> {
    type Item = Result<LtlLink<A>, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let mut g = self.shared.lock();
        if let Some(id) = g.endpoint.accept() {
            g.handles += 1;
            drop(g);
            return Poll::Ready(Some(Ok(new_link(self.shared.clone(), id))));
        }
        g.accept = Some(cx.waker().clone());
        Poll::Pending
    }
}

impl<A: Addr> Drop for LtlListener<A> {
    fn drop(&mut self) {
        {
            let mut g = self.shared.lock();
            g.endpoint.listening_off();
            g.handles -= 1;
        }
        self.shared.driver.wake();
    }
}

/// The `ltl` stack over UDP: connections share one socket per local
/// address; `listen` binds the address given, `connect` uses one ephemeral
/// socket for every outgoing connection of the stack.
pub struct LtlStack {
    config: LtlConfig,
    udp: UdpConfig,
    client: Mutex<Option<LtlHandle<SocketAddr>>>,
    receive_loss: Option<ReceiveLoss>,
}

/// Loss the stack injects where its endpoints receive.
struct ReceiveLoss {
    probability: f64,
    /// Hands each bound port the seed of its own drop decisions.
    seeds: Mutex<SplitMix64>,
}

impl Default for LtlStack {
    fn default() -> Self {
        Self::new()
    }
}

impl LtlStack {
    /// A stack with the default configurations.
    pub fn new() -> Self {
        Self::with_config(LtlConfig::default(), UdpConfig::default())
    }

    /// A stack configured by `config`, over UDP sockets configured by
    /// `udp` (whose `max_datagram` becomes the frame size).
    pub fn with_config(mut config: LtlConfig, udp: UdpConfig) -> Self {
        config.max_frame = udp.max_datagram;
        let udp = UdpConfig { pack: false, ..udp };
        LtlStack {
            config,
            udp,
            client: Mutex::new(None),
            receive_loss: None,
        }
    }

    /// The same stack with every endpoint it binds from now on (the client
    /// endpoint and each listening one) dropping each datagram it receives
    /// with probability `loss` (0.0 to 1.0), through a
    /// [`LossyPort`]. An impairment for measurements and tests: it shows
    /// what loss costs LTL over real sockets. The ports' drop decisions
    /// come from generators seeded from `seed`, one per port in the order
    /// they are bound. Without it (or with `loss` 0, which draws nothing)
    /// endpoints run on the plain port.
    ///
    /// ```
    /// use uniplane_stacks::ltl::LtlStack;
    ///
    /// let lossy = LtlStack::new().with_receive_loss(0.01, 7)?; // 1 %
    /// assert_eq!(lossy.receive_loss(), 0.01);
    /// assert!(LtlStack::new().with_receive_loss(1.5, 7).is_err());
    /// # Ok::<(), uniplane_stacks::datagram::fault::BadProbability>(())
    /// ```
    pub fn with_receive_loss(self, loss: f64, seed: u64) -> Result<Self, BadProbability> {
        if !(0.0..=1.0).contains(&loss) {
            return Err(BadProbability(loss));
        }
        Ok(LtlStack {
            receive_loss: (loss > 0.0).then(|| ReceiveLoss {
                probability: loss,
                seeds: Mutex::new(SplitMix64::new(seed)),
            }),
            ..self
        })
    }

    /// The probability with which the stack's endpoints drop what they
    /// receive (0 unless set by [`LtlStack::with_receive_loss`]).
    pub fn receive_loss(&self) -> f64 {
        self.receive_loss.as_ref().map_or(0.0, |l| l.probability)
    }

    fn socket_addr(locator: &Locator) -> Result<SocketAddr, StackError> {
        match locator {
            Locator::Socket(s) => Ok(*s),
            other => Err(StackError::UnsupportedLocator {
                stack: "ltl",
                locator: other.clone(),
            }),
        }
    }

    fn seed() -> u64 {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        t ^ (std::process::id() as u64) << 32
    }

    /// Binds `local` and runs an endpoint there; must be called inside a
    /// tokio runtime.
    pub fn bind(&self, local: SocketAddr) -> Result<LtlHandle<SocketAddr>, StackError> {
        let port = UdpPort::bind(local, &self.udp).map_err(|e| match e.kind() {
            std::io::ErrorKind::AddrInUse => StackError::AddrInUse(Locator::Socket(local)),
            _ => StackError::Io(e),
        })?;
        let config = self.config.clone();
        Ok(match &self.receive_loss {
            // The plain port: the normal path has no impairment in it.
            None => spawn_endpoint(port, config, Self::seed()),
            Some(loss) => {
                let seed = loss
                    .seeds
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .next_u64();
                let port = LossyPort::new(port, loss.probability, seed).map_err(|e| {
                    StackError::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
                })?;
                spawn_endpoint(port, config, Self::seed())
            }
        })
    }

    /// Opens a connection from the stack's client endpoint (bound at the
    /// first connect, and again when the runtime that ran it has ended).
    pub async fn connect_link(&self, peer: &Locator) -> Result<LtlLink<SocketAddr>, StackError> {
        let addr = Self::socket_addr(peer)?;
        let handle = {
            let mut client = self.client.lock().unwrap_or_else(|e| e.into_inner());
            // The client endpoint runs on the runtime that first connected;
            // once that runtime is gone, a new one serves this runtime.
            let gone = client
                .as_ref()
                .is_some_and(|h| !h.shared.driver_alive.load(Ordering::Acquire));
            if client.is_none() || gone {
                let any = match addr {
                    SocketAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                    SocketAddr::V6(_) => IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED),
                };
                *client = Some(self.bind(SocketAddr::new(any, 0))?);
            }
            match client.as_ref() {
                Some(h) => LtlHandle {
                    shared: h.new_ref(),
                    local: h.local,
                },
                None => return Err(StackError::Shutdown),
            }
        };
        handle.connect(addr).await
    }

    /// Listens at `local`; must be called inside a tokio runtime.
    pub fn listen_now(
        &self,
        local: &Locator,
    ) -> Result<(SocketAddr, LtlListener<SocketAddr>), StackError> {
        let handle = self.bind(Self::socket_addr(local)?)?;
        Ok((handle.local_addr(), handle.listen()))
    }

    /// Counters of the client endpoint (connections this stack opened).
    pub fn client_stats(&self) -> Option<LtlStats> {
        let client = self.client.lock().unwrap_or_else(|e| e.into_inner());
        client.as_ref().map(LtlHandle::stats)
    }
}

impl Stack for LtlStack {
    fn name(&self) -> &'static str {
        "ltl"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: true,
            ordered: true,
            mtu: self.config.max_message(),
            one_sided: true,
            max_connections: self.config.max_connections,
        }
    }

    fn connect(&self, peer: &Locator) -> StackFuture<'_, BoxLink> {
        let peer = peer.clone();
        Box::pin(async move {
            self.connect_link(&peer)
                .await
                .map(|l| Box::new(l) as BoxLink)
        })
    }

    fn listen(&self, local: &Locator) -> StackFuture<'_, BoxListener> {
        let local = local.clone();
        Box::pin(async move {
            let (_, listener) = self.listen_now(&local)?;
            Ok(Box::pin(futures_util::StreamExt::map(listener, |r| {
                r.map(|l| Box::new(l) as BoxLink)
            })) as BoxListener)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use bytes::Bytes;
    use futures_util::StreamExt;
    use uniplane_dataplane::{LinkExt, Uid};

    use super::*;

    fn msg(i: u32) -> Message {
        let a = Uid::new(Ipv4Addr::LOCALHOST, 1).port(1);
        let b = Uid::new(Ipv4Addr::LOCALHOST, 2).port(2);
        let mut m = Message::send(a, b, Bytes::copy_from_slice(&[7u8; 200])).unwrap();
        m.set_seqnum(i);
        m
    }

    #[test]
    fn a_receive_loss_outside_zero_to_one_is_refused() {
        for p in [-0.5, 1.5, f64::NAN] {
            assert!(LtlStack::new().with_receive_loss(p, 1).is_err(), "{p}");
        }
        let none = LtlStack::new().with_receive_loss(0.0, 1).unwrap();
        assert_eq!(none.receive_loss(), 0.0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn under_receive_loss_every_message_arrives_once_and_in_order() {
        let stack = LtlStack::new().with_receive_loss(0.05, 9).unwrap();
        let (addr, mut listener) = stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
        let within = |f| tokio::time::timeout(Duration::from_secs(20), f);
        let mut client = within(stack.connect_link(&Locator::Socket(addr)))
            .await
            .unwrap()
            .unwrap();
        let mut server = tokio::time::timeout(Duration::from_secs(5), listener.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let n = 5_000u32;
        let sender = tokio::spawn(async move {
            let mut batch: VecDeque<_> = (0..n).map(msg).collect();
            client.send_batch(&mut batch).await.unwrap();
            client
        });
        let (mut next, mut out) = (0, Vec::new());
        while next < n {
            out.clear();
            tokio::time::timeout(Duration::from_secs(20), server.recv_batch(&mut out, 256))
                .await
                .unwrap()
                .unwrap();
            for m in &out {
                assert_eq!(m.header().seqnum, next);
                next += 1;
            }
        }
        let _client = sender.await.unwrap();
        let s = stack.client_stats().unwrap();
        let repaired = s.fast_retransmits + s.probe_retransmits + s.timeout_retransmits;
        assert!(repaired > 0, "5 % loss and nothing sent again: {s:?}");
    }

    #[test]
    fn a_stack_connects_again_from_a_new_runtime_after_the_first_ended() {
        let stack = LtlStack::new();
        let round = |stack: &LtlStack| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let (addr, mut listener) =
                    stack.listen_now(&"127.0.0.1:0".parse().unwrap()).unwrap();
                let peer = Locator::Socket(addr);
                let connect = stack.connect_link(&peer);
                let mut client = tokio::time::timeout(Duration::from_secs(5), connect)
                    .await
                    .expect("connects")
                    .unwrap();
                let mut server = listener.next().await.unwrap().unwrap();
                futures_util::SinkExt::send(&mut client, msg(1))
                    .await
                    .unwrap();
                let got = tokio::time::timeout(Duration::from_secs(5), server.next()).await;
                assert_eq!(got.unwrap().unwrap().unwrap().header().seqnum, 1);
            });
        };
        round(&stack);
        // The first runtime and the client endpoint's driver on it are gone.
        round(&stack);
    }
}
