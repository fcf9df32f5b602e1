//! Unreliable `ether` links: overlay messages straight in Ethernet frames,
//! many per frame, every link of one interface sharing one device.
//!
//! ```text
//!  | dst MAC | src MAC | EtherType | message | message | … | (zero padding) |
//! ```
//!
//! The device is shared under a lock taken once per burst, never per
//! frame: whichever link (or listener) finds its own queue empty pulls a
//! burst from the device and sorts the messages into the queues of their
//! senders, waking the links they belong to. A task waiting for the device
//! registers with a fan-out waker, so a frame for any link wakes them all
//! and none is left sleeping on a queue another task filled.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Wake, Waker};

use bytes::{Bytes, BytesMut};
use futures_core::Stream;
use uniplane_dataplane::batched::{BatchedLink, LinkIo};
use uniplane_dataplane::wire::HEADER_LEN;
use uniplane_dataplane::{LinkError, Message, StackError};
use uniplane_frame::eth::{self, EthernetFrame, MacAddr};
use uniplane_frame::{AsyncDevice, FrameDevice, RxQueue, TxQueue};

/// Messages a link queues before `poll_ready` pushes them to the device.
const FLUSH_AT: usize = 64;
/// Bursts one poll pulls from the device at most.
const PUMP_BURSTS: usize = 8;
/// Receive memory set aside at a time; payloads are slices of it.
const RX_CHUNK: usize = 1 << 20;
/// Messages waiting for one link before further frames from its peer are
/// dropped (the link is unreliable; a reader that stalls loses, it does
/// not grow memory without bound).
const RX_QUEUE_LIMIT: usize = 1 << 16;

/// What the `ether` stack counted, over every link of the stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EtherStats {
    /// Frames received.
    pub rx_frames: u64,
    /// Messages decoded from them.
    pub rx_messages: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Messages sent.
    pub tx_messages: u64,
    /// Frames dropped because they did not decode (wrong EtherType, a bad
    /// message, trailing bytes that are not padding).
    pub malformed: u64,
    /// Frames from a source with no link while nothing listens, or beyond
    /// the connection limit: dropped.
    pub unknown_peer: u64,
    /// Frames dropped because their link's reader fell behind.
    pub queue_full: u64,
}

/// Counters shared by the endpoints of one stack, updated per burst.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    rx_frames: AtomicU64,
    rx_messages: AtomicU64,
    tx_frames: AtomicU64,
    tx_messages: AtomicU64,
    malformed: AtomicU64,
    unknown_peer: AtomicU64,
    queue_full: AtomicU64,
}

impl Counters {
    pub(crate) fn snapshot(&self) -> EtherStats {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        EtherStats {
            rx_frames: g(&self.rx_frames),
            rx_messages: g(&self.rx_messages),
            tx_frames: g(&self.tx_frames),
            tx_messages: g(&self.tx_messages),
            malformed: g(&self.malformed),
            unknown_peer: g(&self.unknown_peer),
            queue_full: g(&self.queue_full),
        }
    }
}

/// Decodes every message of a frame's payload onto `out`, all or nothing.
/// Zero bytes after the last message are padding when the frame is no
/// longer than Ethernet's minimum.
pub(crate) fn decode_frame(
    payload: &Bytes,
    frame_len: usize,
    out: &mut VecDeque<Message>,
) -> Result<usize, ()> {
    let before = out.len();
    let mut at = 0;
    while at < payload.len() {
        match Message::decode(&payload.slice(at..)) {
            Ok((m, used)) => {
                out.push_back(m);
                at += used;
            }
            Err(_) => {
                let padding = frame_len <= eth::MIN_FRAME_LEN
                    && at > 0
                    && payload[at..].iter().all(|&b| b == 0);
                if padding {
                    break;
                }
                out.truncate(before);
                return Err(());
            }
        }
    }
    if out.len() == before {
        return Err(());
    }
    Ok(out.len() - before)
}

/// Writes `m` at the start of `buf`; returns the bytes written.
pub(crate) fn encode_into(m: &Message, buf: &mut [u8]) -> usize {
    let h = match m.header().encode(buf) {
        Ok(h) => h,
        Err(_) => unreachable!("messages are valid and the slot was sized for them"),
    };
    let p = m.payload();
    buf[h..h + p.len()].copy_from_slice(p);
    h + p.len()
}

/// Tasks waiting for the device; woken together when it turns readable.
#[derive(Default)]
struct FanOut {
    waiting: Mutex<Vec<Waker>>,
}

impl FanOut {
    fn register(&self, w: &Waker) {
        let mut g = self.waiting.lock().unwrap_or_else(|e| e.into_inner());
        if !g.iter().any(|x| x.will_wake(w)) {
            g.push(w.clone());
        }
    }
}

impl Wake for FanOut {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        let woken = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(|e| e.into_inner()));
        for w in woken {
            w.wake();
        }
    }
}

#[derive(Default)]
struct PeerQueue {
    rx: VecDeque<Message>,
    waker: Option<Waker>,
    /// A link owns this peer (otherwise it waits to be accepted).
    linked: bool,
}

struct Inner<D: FrameDevice> {
    dev: AsyncDevice<D>,
    peers: HashMap<MacAddr, PeerQueue>,
    listening: bool,
    accept: VecDeque<MacAddr>,
    accept_waker: Option<Waker>,
    rx_buf: BytesMut,
    wake: Vec<Waker>,
}

/// One interface's device, shared by the links and the listener on it.
pub(crate) struct SharedDevice<D: FrameDevice> {
    inner: Mutex<Inner<D>>,
    fanout: Arc<FanOut>,
    fanout_waker: Waker,
    local: MacAddr,
    ethertype: u16,
    mtu: usize,
    pack: bool,
    max_connections: usize,
    counters: Arc<Counters>,
}

impl<D: FrameDevice> SharedDevice<D> {
    /// Shares `dev`; must be called inside a tokio runtime.
    pub(crate) fn new(
        dev: D,
        ethertype: u16,
        pack: bool,
        max_connections: usize,
        counters: Arc<Counters>,
    ) -> std::io::Result<Arc<Self>> {
        let local = dev.mac();
        let mtu = dev.mtu();
        let fanout = Arc::new(FanOut::default());
        Ok(Arc::new(SharedDevice {
            inner: Mutex::new(Inner {
                dev: AsyncDevice::new(dev)?,
                peers: HashMap::new(),
                listening: false,
                accept: VecDeque::new(),
                accept_waker: None,
                rx_buf: BytesMut::new(),
                wake: Vec::new(),
            }),
            fanout_waker: Waker::from(fanout.clone()),
            fanout,
            local,
            ethertype,
            mtu,
            pack,
            max_connections,
            counters,
        }))
    }

    fn lock(&self) -> MutexGuard<'_, Inner<D>> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The device's address.
    pub(crate) fn local_mac(&self) -> MacAddr {
        self.local
    }

    /// Pulls bursts from the device into the peers' queues.
    fn pump(&self, g: &mut Inner<D>) -> Result<(), LinkError> {
        let mut cx = Context::from_waker(&self.fanout_waker);
        let (mut frames, mut msgs, mut bad, mut unknown, mut full) = (0u64, 0u64, 0u64, 0u64, 0u64);
        for _ in 0..PUMP_BURSTS {
            match g.dev.poll_rx(&mut cx) {
                Poll::Ready(Ok(_)) => {}
                Poll::Ready(Err(e)) => return Err(e.into()),
                Poll::Pending => break,
            }
            let Inner {
                dev,
                peers,
                listening,
                accept,
                accept_waker,
                rx_buf,
                wake,
            } = g;
            let (rx, _) = dev.get_mut().queues();
            while let Some(()) = rx.take(|f| {
                frames += 1;
                let Ok(e) = EthernetFrame::new_checked(&*f) else {
                    bad += 1;
                    return;
                };
                if eth::ethertype(&e) != self.ethertype {
                    bad += 1;
                    return;
                }
                let src = eth::src(&e);
                let known = peers.contains_key(&src);
                if !known && (!*listening || peers.len() >= self.max_connections) {
                    unknown += 1;
                    return;
                }
                if peers
                    .get(&src)
                    .is_some_and(|q| q.rx.len() >= RX_QUEUE_LIMIT)
                {
                    full += 1;
                    return;
                }
                let p = e.payload();
                if rx_buf.capacity() - rx_buf.len() < p.len() {
                    *rx_buf = BytesMut::with_capacity(RX_CHUNK.max(p.len()));
                }
                rx_buf.extend_from_slice(p);
                let payload = rx_buf.split().freeze();
                let q = peers.entry(src).or_default();
                match decode_frame(&payload, f.len(), &mut q.rx) {
                    Ok(n) => {
                        msgs += n as u64;
                        if !known {
                            accept.push_back(src);
                            wake.extend(accept_waker.take());
                        } else {
                            wake.extend(q.waker.take());
                        }
                    }
                    Err(()) => {
                        bad += 1;
                        if !known {
                            peers.remove(&src);
                        }
                    }
                }
            }) {}
        }
        let c = &self.counters;
        c.rx_frames.fetch_add(frames, Ordering::Relaxed);
        c.rx_messages.fetch_add(msgs, Ordering::Relaxed);
        if bad > 0 {
            c.malformed.fetch_add(bad, Ordering::Relaxed);
        }
        if unknown > 0 {
            c.unknown_peer.fetch_add(unknown, Ordering::Relaxed);
        }
        if full > 0 {
            c.queue_full.fetch_add(full, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Claims `peer` for a new link.
    pub(crate) fn attach(self: &Arc<Self>, peer: MacAddr) -> Result<EtherLink<D>, StackError> {
        let mut g = self.lock();
        let q = g.peers.entry(peer).or_default();
        if q.linked {
            return Err(StackError::AddrInUse(uniplane_dataplane::Locator::Mac(
                peer.0,
            )));
        }
        q.linked = true;
        drop(g);
        Ok(new_link(self.clone(), peer))
    }

    /// Starts accepting links from new sources.
    pub(crate) fn listen(self: &Arc<Self>) -> Result<EtherListener<D>, StackError> {
        let mut g = self.lock();
        if g.listening {
            return Err(StackError::AddrInUse(uniplane_dataplane::Locator::Mac(
                self.local.0,
            )));
        }
        g.listening = true;
        Ok(EtherListener { ep: self.clone() })
    }

    fn wake_collected(&self, g: &mut Inner<D>) -> Vec<Waker> {
        std::mem::take(&mut g.wake)
    }
}

/// One peer's messages as a [`Link`](uniplane_dataplane::Link): unreliable
/// and unordered as the wire is; the stream never ends on its own. A
/// [`BatchedLink`] over the peer's queue on the shared device.
pub type EtherLink<D> = BatchedLink<EtherPeer<D>>;

/// The I/O of an [`EtherLink`]: one peer's queue on a device shared with
/// the interface's other links, and the messages waiting to go to it.
pub struct EtherPeer<D: FrameDevice> {
    dev: Arc<SharedDevice<D>>,
    peer: MacAddr,
    tx: VecDeque<Message>,
}

fn new_link<D: FrameDevice>(dev: Arc<SharedDevice<D>>, peer: MacAddr) -> EtherLink<D> {
    let io = EtherPeer {
        dev,
        peer,
        tx: VecDeque::with_capacity(FLUSH_AT * 2),
    };
    BatchedLink::new(io, 1024)
}

impl<D: FrameDevice> EtherPeer<D> {
    /// The peer's address.
    pub fn peer_mac(&self) -> MacAddr {
        self.peer
    }

    /// This end's address.
    pub fn local_mac(&self) -> MacAddr {
        self.dev.local
    }
}

impl<D: FrameDevice> LinkIo for EtherPeer<D> {
    fn max_message(&self) -> usize {
        self.dev.mtu
    }

    fn queue(&mut self, message: Message, encoded_len: usize) {
        debug_assert!(encoded_len >= HEADER_LEN);
        self.tx.push_back(message);
    }

    fn is_full(&self) -> bool {
        self.tx.len() >= FLUSH_AT
    }

    /// Takes the peer's queue whole, pulling from the device first when it
    /// is empty.
    fn poll_receive(
        &mut self,
        cx: &mut Context<'_>,
        rx: &mut VecDeque<Message>,
    ) -> Poll<Result<bool, LinkError>> {
        let mut g = self.dev.lock();
        let take = |g: &mut Inner<D>, rx: &mut VecDeque<Message>| {
            if let Some(q) = g.peers.get_mut(&self.peer) {
                std::mem::swap(&mut q.rx, rx);
            }
        };
        take(&mut g, rx);
        if rx.is_empty() {
            if let Err(e) = self.dev.pump(&mut g) {
                return Poll::Ready(Err(e));
            }
            take(&mut g, rx);
        }
        if rx.is_empty() {
            if let Some(q) = g.peers.get_mut(&self.peer) {
                q.waker = Some(cx.waker().clone());
            }
            self.dev.fanout.register(cx.waker());
        }
        let wake = self.dev.wake_collected(&mut g);
        drop(g);
        for w in wake {
            w.wake();
        }
        if rx.is_empty() {
            Poll::Pending
        } else {
            Poll::Ready(Ok(true))
        }
    }

    /// Writes queued messages into the device's transmit slots and flushes
    /// them; `Pending` while the device has no room.
    fn poll_push(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if self.tx.is_empty() {
            return Poll::Ready(Ok(()));
        }
        let dev = &self.dev;
        let mut g = dev.lock();
        let src = dev.local;
        let (mut frames, mut msgs) = (0u64, 0u64);
        let result = loop {
            {
                let (_, txq) = g.dev.get_mut().queues();
                let cap = txq.frame_capacity().min(eth::HEADER_LEN + dev.mtu);
                while !self.tx.is_empty() {
                    // As many messages as fit one frame.
                    let mut len = eth::HEADER_LEN;
                    let mut count = 0;
                    for m in self.tx.iter() {
                        let l = m.encoded_len();
                        if len + l > cap || (count > 0 && !dev.pack) {
                            break;
                        }
                        len += l;
                        count += 1;
                    }
                    let tx = &mut self.tx;
                    let pushed = txq.push(len, |f| {
                        eth::write_header(f, self.peer, src, dev.ethertype);
                        let mut at = eth::HEADER_LEN;
                        for m in tx.drain(..count) {
                            at += encode_into(&m, &mut f[at..]);
                        }
                    });
                    if pushed.is_none() {
                        break;
                    }
                    frames += 1;
                    msgs += count as u64;
                }
                if let Err(e) = txq.flush() {
                    break Err(LinkError::from(e));
                }
            }
            if self.tx.is_empty() {
                break Ok(());
            }
            match g.dev.poll_tx_room(cx) {
                Poll::Ready(Ok(())) => continue,
                Poll::Ready(Err(e)) => break Err(e.into()),
                Poll::Pending => break Ok(()),
            }
        };
        drop(g);
        let c = &dev.counters;
        c.tx_frames.fetch_add(frames, Ordering::Relaxed);
        c.tx_messages.fetch_add(msgs, Ordering::Relaxed);
        match result {
            Err(e) => Poll::Ready(Err(e)),
            Ok(()) if self.tx.is_empty() => Poll::Ready(Ok(())),
            Ok(()) => Poll::Pending,
        }
    }
}

impl<D: FrameDevice> Drop for EtherPeer<D> {
    fn drop(&mut self) {
        // Forget the peer: its next frame may open a new link.
        self.dev.lock().peers.remove(&self.peer);
    }
}

/// Links from new sources on one interface.
pub struct EtherListener<D: FrameDevice> {
    ep: Arc<SharedDevice<D>>,
}

impl<D: FrameDevice> EtherListener<D> {
    /// The interface's address, which peers connect to.
    pub fn local_mac(&self) -> MacAddr {
        self.ep.local
    }
}

impl<D: FrameDevice> Stream for EtherListener<D> {
    type Item = Result<EtherLink<D>, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let ep = self.ep.clone();
        let mut g = ep.lock();
        if g.accept.is_empty() {
            if let Err(e) = ep.pump(&mut g) {
                return Poll::Ready(Some(Err(StackError::Io(std::io::Error::other(e)))));
            }
        }
        let next = g.accept.pop_front();
        if let Some(peer) = next {
            if let Some(q) = g.peers.get_mut(&peer) {
                q.linked = true;
            }
        } else {
            g.accept_waker = Some(cx.waker().clone());
            ep.fanout.register(cx.waker());
        }
        let wake = ep.wake_collected(&mut g);
        drop(g);
        for w in wake {
            w.wake();
        }
        match next {
            Some(peer) => Poll::Ready(Some(Ok(new_link(ep, peer)))),
            None => Poll::Pending,
        }
    }
}

impl<D: FrameDevice> Drop for EtherListener<D> {
    fn drop(&mut self) {
        let mut g = self.ep.lock();
        g.listening = false;
        let waiting: Vec<MacAddr> = g.accept.drain(..).collect();
        for p in waiting {
            g.peers.remove(&p);
        }
    }
}
