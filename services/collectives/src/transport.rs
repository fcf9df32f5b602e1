//! Point-to-point transfers between ranks: one uniplane connection per
//! pair of ranks, eager and rendezvous protocols, credit-based flow
//! control.
//!
//! ```text
//!   send(key, bytes)                                   recv(key)
//!        │ ≤ eager threshold: take credits, segments     ▲ per-peer inbox,
//!        │ > threshold: RTS ─► ◄─ CTS(window) ─ WRTE… ─► FIN   one FIFO per key
//!        ▼                                               │
//!   out queue ──► pump task ══ Connection ══ pump task ──┘
//!                  (one per peer: sends batches, receives, returns credits)
//! ```
//!
//! Every frame that lands in an inbox costs its data length plus
//! [`OVERHEAD`] of the receiver's window; the sender takes that much
//! credit before sending and the receiver returns it (in batches of a
//! quarter window) once the application has taken the frame out. A slow
//! receiver therefore pushes back on its senders instead of growing a
//! queue, and an eager message is never larger than half the window, so a
//! sender waiting for credit always gets it once the receiver catches up.
//! A rendezvous transfer occupies the window only with its RTS and FIN:
//! the data goes by one-sided writes into a memory window the receiver
//! registers for it.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, Notify, Semaphore};
use tokio::time::Instant;
use uniplane_client::{Connection, Session};
use uniplane_dataplane::{MemoryAddress, Message, Uid};

use crate::frame::{self, Frame, Key, Kind};
use crate::Error;

/// Window bytes every inbox entry costs on top of its data.
pub const OVERHEAD: u64 = 64;
/// Bytes of one one-sided write of a rendezvous transfer.
const WRITE_CHUNK: usize = 63 * 1024;
/// One-sided writes of one rendezvous transfer in flight at once: bounded
/// so a transfer never bursts more than about half a megabyte into the
/// receiver's ring.
const WRITES_IN_FLIGHT: usize = 8;

/// Counters of a rank's transport.
#[derive(Debug, Default)]
pub struct Stats {
    /// Frames refused as malformed (and dropped).
    pub malformed: AtomicU64,
    /// Eager messages sent.
    pub eager_sent: AtomicU64,
    /// Rendezvous transfers sent.
    pub rendezvous_sent: AtomicU64,
}

/// What an inbox holds for a key.
#[derive(Debug)]
pub(crate) enum Item {
    /// A whole eager message.
    Eager(Bytes),
    /// A rendezvous offer of this many bytes.
    Rts(u64),
    /// The end of a rendezvous transfer of this many bytes.
    Fin(u64),
}

#[derive(Default)]
pub(crate) struct InboxState {
    pub(crate) data: HashMap<Key, VecDeque<(Item, u64)>>,
    cts: HashMap<Key, VecDeque<(u64, u64)>>,
    /// Why the peer is gone, once it is.
    closed: Option<String>,
}

/// What one peer sent us, by key, in arrival order.
#[derive(Default)]
pub(crate) struct Inbox {
    state: Mutex<InboxState>,
    notify: Notify,
}

impl Inbox {
    fn lock(&self) -> MutexGuard<'_, InboxState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn push(&self, key: Key, item: Item, cost: u64) {
        self.lock()
            .data
            .entry(key)
            .or_default()
            .push_back((item, cost));
        self.notify.notify_waiters();
    }

    fn push_cts(&self, key: Key, addr: u64, cost: u64) {
        self.lock()
            .cts
            .entry(key)
            .or_default()
            .push_back((addr, cost));
        self.notify.notify_waiters();
    }

    pub(crate) fn close(&self, reason: String) {
        self.lock().closed.get_or_insert(reason);
        self.notify.notify_waiters();
    }

    /// Waits until `take` finds something, the peer is gone or `deadline`.
    pub(crate) async fn wait<R>(
        &self,
        peer: usize,
        deadline: Instant,
        mut take: impl FnMut(&mut InboxState) -> Option<R>,
    ) -> Result<R, Error> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some(r) = take(&mut s) {
                    return Ok(r);
                }
                if let Some(reason) = &s.closed {
                    return Err(Error::PeerGone {
                        peer,
                        reason: reason.clone(),
                    });
                }
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Err(Error::Timeout {
                    peer,
                    what: "a message",
                });
            }
        }
    }
}

pub(crate) fn pop<V>(map: &mut HashMap<Key, VecDeque<V>>, key: Key) -> Option<V> {
    let q = map.get_mut(&key)?;
    let v = q.pop_front();
    if q.is_empty() {
        map.remove(&key);
    }
    v
}

/// The sending side of a connection to a peer.
struct Link {
    uid: Uid,
    /// Bytes of the peer's window we may still fill.
    credits: Arc<Semaphore>,
    out: mpsc::Sender<Vec<Bytes>>,
    /// Bytes of our window consumed and not yet returned to the peer.
    to_return: Arc<AtomicU64>,
    return_now: Arc<Notify>,
    pump: tokio::task::JoinHandle<()>,
}

/// One peer of a rank (or the rank itself, which has no link).
pub(crate) struct Peer {
    rank: usize,
    inbox: Arc<Inbox>,
    link: Option<Link>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        if let Some(l) = &self.link {
            l.pump.abort();
        }
    }
}

/// Tunables of the transport.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// Receive window per peer, in bytes.
    pub window: u64,
    /// How long any one wait may take.
    pub timeout: Duration,
}

impl Peer {
    /// The rank's own mailbox: sends to itself land here directly.
    pub(crate) fn own(rank: usize) -> Peer {
        Peer {
            rank,
            inbox: Arc::default(),
            link: None,
        }
    }

    /// A peer reached over `conn` (set up and greeted already).
    pub(crate) fn over(rank: usize, conn: Connection, limits: Limits, stats: Arc<Stats>) -> Peer {
        let inbox: Arc<Inbox> = Arc::default();
        let credits = Arc::new(Semaphore::new(limits.window as usize));
        let (out, out_rx) = mpsc::channel(256);
        let to_return = Arc::new(AtomicU64::new(0));
        let return_now = Arc::new(Notify::new());
        let uid = conn.remote().uid;
        let pump = tokio::spawn(pump(Pump {
            conn,
            inbox: inbox.clone(),
            credits: credits.clone(),
            out: out_rx,
            to_return: to_return.clone(),
            return_now: return_now.clone(),
            stats,
            limits,
            partial: None,
        }));
        Peer {
            rank,
            inbox,
            link: Some(Link {
                uid,
                credits,
                out,
                to_return,
                return_now,
                pump,
            }),
        }
    }

    /// The peer's world rank.
    pub(crate) fn rank(&self) -> usize {
        self.rank
    }

    /// Its inbox, for a peer reached over a connection.
    pub(crate) fn linked_inbox(&self) -> Option<Arc<Inbox>> {
        self.link.as_ref().map(|_| self.inbox.clone())
    }

    /// The peer's UID, for a peer reached over a connection.
    pub(crate) fn uid(&self) -> Option<Uid> {
        self.link.as_ref().map(|l| l.uid)
    }

    /// Takes `cost` bytes of the peer's window, for data that reaches it
    /// another way (through the compression pair).
    pub(crate) async fn take_credit(&self, cost: u64, deadline: Instant) -> Result<(), Error> {
        let Some(l) = &self.link else {
            return Err(Error::Protocol("credit from oneself".into()));
        };
        let credits = u32::try_from(cost).map_err(|_| Error::Protocol("frame too large".into()))?;
        let permit = tokio::time::timeout_at(deadline, l.credits.acquire_many(credits))
            .await
            .map_err(|_| Error::Timeout {
                peer: self.rank,
                what: "send credit",
            })?
            .map_err(|_| Error::PeerGone {
                peer: self.rank,
                reason: "connection closed".into(),
            })?;
        permit.forget();
        Ok(())
    }

    /// Gives `cost` bytes of our window back to the peer (batched).
    fn consumed(&self, cost: u64, limits: &Limits) {
        if let Some(l) = &self.link {
            let pending = l.to_return.fetch_add(cost, Ordering::AcqRel) + cost;
            if pending >= limits.window / 4 {
                l.return_now.notify_one();
            }
        }
    }

    async fn enqueue(&self, frames: Vec<Bytes>, cost: u64, deadline: Instant) -> Result<(), Error> {
        let Some(l) = &self.link else {
            return Err(Error::Protocol("a control frame to oneself".into()));
        };
        let gone = |_| Error::PeerGone {
            peer: self.rank,
            reason: "connection closed".into(),
        };
        let credits = u32::try_from(cost).map_err(|_| Error::Protocol("frame too large".into()))?;
        let permit = tokio::time::timeout_at(deadline, l.credits.acquire_many(credits))
            .await
            .map_err(|_| Error::Timeout {
                peer: self.rank,
                what: "send credit",
            })?
            .map_err(gone)?;
        permit.forget();
        tokio::time::timeout_at(deadline, l.out.send(frames))
            .await
            .map_err(|_| Error::Timeout {
                peer: self.rank,
                what: "room in the send queue",
            })?
            .map_err(|_| Error::PeerGone {
                peer: self.rank,
                reason: "connection closed".into(),
            })
    }

    /// Sends `data` under `key` in one eager message.
    pub(crate) async fn send_eager(
        &self,
        key: Key,
        data: &[u8],
        deadline: Instant,
        stats: &Stats,
    ) -> Result<(), Error> {
        if self.link.is_none() {
            self.inbox
                .push(key, Item::Eager(Bytes::copy_from_slice(data)), 0);
            return Ok(());
        }
        let total = data.len() as u64;
        let mut frames = Vec::with_capacity(data.len() / frame::SEGMENT + 1);
        let mut offset = 0usize;
        loop {
            let end = (offset + frame::SEGMENT).min(data.len());
            let flags = if end == data.len() {
                frame::FLAG_LAST
            } else {
                0
            };
            let mut b = BytesMut::with_capacity(frame::HEADER + end - offset);
            frame::encode(
                &mut b,
                Kind::Data,
                flags,
                key,
                total,
                offset as u32,
                &data[offset..end],
            );
            frames.push(b.freeze());
            offset = end;
            if offset == data.len() {
                break;
            }
        }
        stats.eager_sent.fetch_add(1, Ordering::Relaxed);
        self.enqueue(frames, total + OVERHEAD, deadline).await
    }

    async fn send_control(
        &self,
        kind: Kind,
        key: Key,
        value: u64,
        deadline: Instant,
    ) -> Result<(), Error> {
        self.enqueue(vec![frame::control(kind, key, value)], OVERHEAD, deadline)
            .await
    }

    /// Sends `data` under `key` by rendezvous: offer, wait for the
    /// receiver's window, write it one-sided, then say so.
    pub(crate) async fn send_rendezvous(
        &self,
        session: &Session,
        key: Key,
        data: &[u8],
        deadline: Instant,
        limits: &Limits,
        stats: &Stats,
    ) -> Result<(), Error> {
        let Some(link) = &self.link else {
            return self.send_eager(key, data, deadline, stats).await;
        };
        stats.rendezvous_sent.fetch_add(1, Ordering::Relaxed);
        self.send_control(Kind::Rts, key, data.len() as u64, deadline)
            .await?;
        let (addr, cost) = self
            .inbox
            .wait(self.rank, deadline, |s| pop(&mut s.cts, key))
            .await?;
        self.consumed(cost, limits);
        let uid = link.uid;
        let peer = self.rank;
        let mut in_flight = FuturesUnordered::new();
        let mut chunks = data.chunks(WRITE_CHUNK).enumerate();
        loop {
            while in_flight.len() < WRITES_IN_FLIGHT {
                let Some((i, chunk)) = chunks.next() else {
                    break;
                };
                let at = uid.at(addr + (i * WRITE_CHUNK) as u64);
                let bytes = Bytes::copy_from_slice(chunk);
                in_flight.push(write_chunk(session, at, bytes, deadline, peer));
            }
            match in_flight.next().await {
                None => break,
                Some(r) => r?,
            }
        }
        self.send_control(Kind::Fin, key, data.len() as u64, deadline)
            .await
    }

    /// The next message under `key`, however it was sent; `limit` bounds
    /// its length.
    pub(crate) async fn recv(
        &self,
        session: &Session,
        key: Key,
        limit: u64,
        deadline: Instant,
        limits: &Limits,
    ) -> Result<Bytes, Error> {
        let (item, cost) = self
            .inbox
            .wait(self.rank, deadline, |s| pop(&mut s.data, key))
            .await?;
        self.consumed(cost, limits);
        match item {
            Item::Eager(b) if b.len() as u64 <= limit => Ok(b),
            Item::Rts(len) if len <= limit && len > 0 => {
                let window = session.register_window(len as usize);
                self.send_control(Kind::Cts, key, window.address().addr, deadline)
                    .await?;
                let (fin, cost) = self
                    .inbox
                    .wait(self.rank, deadline, |s| pop(&mut s.data, key))
                    .await?;
                self.consumed(cost, limits);
                match fin {
                    Item::Fin(n) if n == len => Ok(Bytes::from(window.to_vec())),
                    other => Err(Error::Protocol(format!(
                        "rank {}: expected the end of a {len}-byte transfer, got {other:?}",
                        self.rank
                    ))),
                }
            }
            other => Err(Error::Protocol(format!(
                "rank {}: unexpected {other:?} (limit {limit} bytes)",
                self.rank
            ))),
        }
    }
}

/// One one-sided write of a rendezvous transfer, under its deadline.
async fn write_chunk(
    session: &Session,
    at: MemoryAddress,
    bytes: Bytes,
    deadline: Instant,
    peer: usize,
) -> Result<(), Error> {
    match tokio::time::timeout_at(deadline, session.write(at, bytes)).await {
        Ok(r) => r.map_err(Error::from),
        Err(_) => Err(Error::Timeout {
            peer,
            what: "a one-sided write",
        }),
    }
}

/// A DATA message being reassembled.
struct Partial {
    key: Key,
    total: u64,
    buf: BytesMut,
}

struct Pump {
    conn: Connection,
    inbox: Arc<Inbox>,
    credits: Arc<Semaphore>,
    out: mpsc::Receiver<Vec<Bytes>>,
    to_return: Arc<AtomicU64>,
    return_now: Arc<Notify>,
    stats: Arc<Stats>,
    limits: Limits,
    partial: Option<Partial>,
}

/// Moves one connection's frames both ways until it closes or the rank
/// drops it.
async fn pump(mut p: Pump) {
    let reason = loop {
        tokio::select! {
            biased;
            m = p.conn.recv() => match m {
                None => break "the connection closed".to_string(),
                Some(Err(e)) => break e.to_string(),
                Some(Ok(m)) => p.handle(m),
            },
            batch = p.out.recv() => match batch {
                None => break "the communicator was dropped".to_string(),
                Some(frames) => {
                    if let Err(e) = p.send(frames).await {
                        break e;
                    }
                }
            },
            () = p.return_now.notified() => {
                let n = p.to_return.swap(0, Ordering::AcqRel);
                if n > 0 {
                    let f = frame::control(Kind::Credit, Key { comm: 0, tag: 0 }, n);
                    if let Err(e) = p.send(vec![f]).await {
                        break e;
                    }
                }
            }
        }
    };
    tracing::debug!(peer = %p.conn.remote(), %reason, "collective link ended");
    p.inbox.close(reason);
    p.credits.close();
}

impl Pump {
    async fn send(&mut self, frames: Vec<Bytes>) -> Result<(), String> {
        for f in frames {
            let m: Message = self.conn.message(f).map_err(|e| e.to_string())?;
            self.conn.feed(m).await.map_err(|e| e.to_string())?;
        }
        self.conn.flush().await.map_err(|e| e.to_string())
    }

    fn malformed(&mut self, why: impl std::fmt::Display) {
        self.stats.malformed.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(peer = %self.conn.remote(), "dropped a malformed collective frame: {why}");
    }

    fn handle(&mut self, m: Message) {
        let f = match Frame::parse(m.payload()) {
            Ok(f) => f,
            Err(e) => return self.malformed(e),
        };
        match f.kind {
            Kind::Data => self.data(f),
            Kind::Rts => self.inbox.push(f.key, Item::Rts(f.value), OVERHEAD),
            Kind::Fin => self.inbox.push(f.key, Item::Fin(f.value), OVERHEAD),
            Kind::Cts => self.inbox.push_cts(f.key, f.value, OVERHEAD),
            Kind::Credit => {
                let have = self.credits.available_permits() as u64;
                if f.value == 0 || have + f.value > self.limits.window {
                    return self.malformed(format!("credit of {} bytes", f.value));
                }
                self.credits.add_permits(f.value as usize);
            }
            Kind::Welcome => {}
        }
    }

    fn data(&mut self, f: Frame) {
        if f.offset == 0 {
            if let Some(old) = self.partial.take() {
                self.malformed(format!(
                    "{:?} cut off after {} bytes",
                    old.key,
                    old.buf.len()
                ));
            }
            if f.value > self.limits.window / 2 {
                return self.malformed(format!("eager message of {} bytes", f.value));
            }
            self.partial = Some(Partial {
                key: f.key,
                total: f.value,
                buf: BytesMut::with_capacity(f.value as usize),
            });
        }
        let Some(mut part) = self.partial.take() else {
            return self.malformed("a segment without its first");
        };
        let fits = part.key == f.key
            && part.total == f.value
            && f.offset as usize == part.buf.len()
            && (part.buf.len() + f.data.len()) as u64 <= part.total;
        if !fits {
            return self.malformed(format!("segment at {} of {:?}", f.offset, f.key));
        }
        part.buf.extend_from_slice(&f.data);
        if f.flags & frame::FLAG_LAST == 0 {
            self.partial = Some(part);
        } else if part.buf.len() as u64 != part.total {
            self.malformed(format!("{:?} ended short", part.key));
        } else {
            let cost = part.total + OVERHEAD;
            self.inbox
                .push(part.key, Item::Eager(part.buf.freeze()), cost);
        }
    }
}
