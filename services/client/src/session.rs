//! [`Session`]: an attached application — its routes, its connections'
//! inboxes, its one-sided calls — and the dispatch of what its data path
//! ([`crate::datapath`]) receives.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::Poll;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use uniplane_dataplane::ring;
use uniplane_dataplane::wire::{
    Header, MsgFlags, ParamForm, Params, PortParams, ReqType, Request as WireRequest, Status,
};
use uniplane_dataplane::{Endpoint, Link, LinkError, MemoryAddress, Message, Uid};

use crate::control::ControlChannel;
use crate::datapath::{self, PathCell, Until};
use crate::protocol::{ConnSpec, Request};
use crate::window::{self, Window, Windows};
use crate::{Client, ClientError, Connection, Listener};

/// How long a one-sided request waits for its completion.
const ONE_SIDED_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a closing end waits for the far end to acknowledge its
/// in-band CLOSE before asking the daemon to close anyway.
const CLOSE_ACK_TIMEOUT: Duration = Duration::from_secs(5);

use crate::protocol::{CLOSE_ACK as FIN_ACK, CLOSE_FIN as FIN};

/// A connection as this end's dispatcher keys it: (local port, remote
/// UID, remote port).
pub(crate) type ConnKey = (u16, Uid, u16);

/// The connections closed here lately (at most [`Recent::CAP`]): data
/// still in flight for one of them is dropped, never taken for a new
/// connection.
#[derive(Default)]
pub(crate) struct Recent {
    set: HashMap<ConnKey, u64>,
    order: VecDeque<(ConnKey, u64)>,
    next: u64,
}

impl Recent {
    const CAP: usize = 1024;

    fn insert(&mut self, key: ConnKey) {
        self.next += 1;
        self.set.insert(key, self.next);
        self.order.push_back((key, self.next));
        while self.order.len() > Self::CAP {
            if let Some((old, generation)) = self.order.pop_front() {
                if self.set.get(&old) == Some(&generation) {
                    self.set.remove(&old);
                }
            }
        }
    }

    fn contains(&self, key: &ConnKey) -> bool {
        self.set.contains_key(key)
    }

    pub(crate) fn remove(&mut self, key: &ConnKey) {
        self.set.remove(key);
    }

    /// Removes `key`; whether it was there.
    fn take(&mut self, key: &ConnKey) -> bool {
        self.set.remove(key).is_some()
    }
}

/// The in-band CLOSE of `key` (a connection of `me`) with `flag`.
fn close_message(me: Uid, key: ConnKey, flag: u8) -> Option<Message> {
    let params = Params::Port(PortParams {
        flag,
        src_port: key.0,
        dst_port: key.2,
    });
    let request = WireRequest::new(ReqType::Close, params).ok()?;
    Message::new(Header::new(me, key.1, request), Bytes::new()).ok()
}

/// A connection's inbox, tagged with the connection it belongs to so a
/// dropped connection removes its own entry and no newer one.
pub(crate) struct Inbox {
    pub(crate) id: u64,
    /// The writing end of the connection's inbox ring; written by the
    /// data path's holder under the routes' lock, published per message
    /// (the consumer is woken only when it waits).
    pub(crate) tx: ring::Producer<Result<Message, LinkError>>,
}

/// Messages a connection's inbox holds before the data path waits for
/// its task to take some (backpressure, not loss).
pub(crate) const INBOX_DEPTH: usize = 256;

impl Inbox {
    /// Puts `item` in the inbox: `Ok(true)` when it went in, `Ok(false)`
    /// when the connection's end is gone, `Err(item)` when it is full.
    fn push(
        &mut self,
        item: Result<Message, LinkError>,
    ) -> Result<bool, Result<Message, LinkError>> {
        if self.tx.is_closed() {
            return Ok(false);
        }
        self.tx.push(item)?;
        self.tx.flush();
        Ok(true)
    }
}

/// Where received messages go.
#[derive(Default)]
pub(crate) struct Routes {
    /// (local port, remote UID, remote port) → connection inbox.
    pub(crate) conns: HashMap<ConnKey, Inbox>,
    /// Connections this end is closing in band → who waits for the far
    /// end's acknowledgment.
    closing: HashMap<ConnKey, oneshot::Sender<()>>,
    /// Connections closed lately.
    pub(crate) closed: Recent,
    /// Connections accepted on their first data whose notice from the
    /// daemon has not come yet (at most [`Recent::CAP`]): the notice,
    /// however late — after the connection was used and closed — is its
    /// own, not a new connection's.
    early: Recent,
    /// Listening port → accept queue.
    listeners: HashMap<u16, mpsc::Sender<Connection>>,
    /// (answering UID, sequence number) → waiter for a one-sided answer.
    pending: HashMap<(Uid, u32), Waiter>,
    /// Memory windows peers write to and read from.
    pub(crate) windows: Windows,
}

/// Who waits for a one-sided answer.
pub(crate) enum Waiter {
    /// A single request ([`Session::write`], [`Session::read`]).
    One(oneshot::Sender<Message>),
    /// Request `index` of batch `batch` ([`Session::one_sided_batch`]):
    /// its answers share one queue, so a burst of them wakes the batch
    /// once.
    Batch {
        batch: u64,
        index: usize,
        answers: mpsc::Sender<(usize, Message)>,
    },
}

impl Waiter {
    fn deliver(self, m: Message) {
        match self {
            Waiter::One(tx) => {
                let _ = tx.send(m);
            }
            // Never full: the queue holds the batch's window.
            Waiter::Batch { index, answers, .. } => {
                let _ = answers.try_send((index, m));
            }
        }
    }
}

/// How long a batch of one-sided requests may go without any answer
/// before it fails: [`ONE_SIDED_TIMEOUT`], rechecked at most this often
/// (so the timer is not re-armed per answer).
const BATCH_TIMER_SLACK: Duration = Duration::from_millis(500);

/// What the session's handles and its data path share.
pub(crate) struct Shared {
    /// The session's UID.
    pub(crate) uid: Uid,
    /// The daemon's UID, source of notices.
    daemon: Uid,
    routes: Mutex<Routes>,
    /// The data path: run by whichever task finds it free
    /// ([`crate::datapath`]).
    pub(crate) path: PathCell,
    /// Where a message goes that could not go straight into the data
    /// path: the path's holder sends it in order.
    pub(crate) out: mpsc::Sender<Message>,
    /// Whether a task waiting for a message spins on the data path
    /// ([`crate::Wait::Busy`]) instead of waiting to be woken.
    busy: bool,
    /// Connections dropped while open, to close in band and then
    /// through the daemon.
    closes: mpsc::UnboundedSender<Closing>,
    next_conn: AtomicU64,
    next_seq: AtomicU32,
}

/// How long a busy-polling task waiting for a message runs the data path
/// in its own poll before it yields to the other tasks of its runtime.
const BUSY_SPIN: Duration = Duration::from_micros(20);

impl Shared {
    /// Starts the session's data path on `link`, and its background task;
    /// the receiver yields the connections dropped while open. `busy`:
    /// tasks waiting for messages spin on the path ([`crate::Wait::Busy`]).
    pub(crate) fn spawn<L: Link + 'static>(
        uid: Uid,
        daemon: Uid,
        link: L,
        busy: bool,
    ) -> (Arc<Shared>, mpsc::UnboundedReceiver<Closing>) {
        let (out, out_rx) = mpsc::channel::<Message>(1024);
        let (closes, closes_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            uid,
            daemon,
            routes: Mutex::new(Routes::default()),
            path: PathCell::new(Box::new(link), out_rx),
            out,
            busy,
            closes,
            next_conn: AtomicU64::new(1),
            next_seq: AtomicU32::new(1),
        });
        tokio::spawn(datapath::background(shared.clone()));
        (shared, closes_rx)
    }

    /// Sends `m` straight into the data path when it is free and nothing
    /// queued before is waiting; hands it back otherwise.
    pub(crate) fn send_direct(&self, m: Message) -> Result<(), Message> {
        match self.path.try_hold() {
            Some(mut held) => held.send_direct(m),
            None => Err(m),
        }
    }

    /// Sends `m`: straight into the data path when it can, else through
    /// the queue (waiting while it is full).
    pub(crate) async fn send(&self, m: Message) -> Result<(), LinkError> {
        match self.send_direct(m) {
            Ok(()) => Ok(()),
            Err(m) => self.out.send(m).await.map_err(|_| LinkError::Closed),
        }
    }

    /// Polls what `poll` waits for, running the data path on this task
    /// meanwhile so that a message the task waits for reaches it without
    /// another task's turn. `poll(cx, false)` looks at the queue a pass
    /// fills; `poll(cx, true)` looks and registers the task with it, which
    /// is done last, before waiting (a pass of this task's own then wakes
    /// nobody). Busy sessions ([`crate::Wait::Busy`]) spin for
    /// [`BUSY_SPIN`] at most, and stop as soon as a pass hands messages to
    /// other tasks, then yield; parking sessions only wait to be woken.
    pub(crate) fn poll_driving<T>(
        self: &Arc<Self>,
        cx: &mut std::task::Context<'_>,
        mut poll: impl FnMut(&mut std::task::Context<'_>, bool) -> Poll<T>,
    ) -> Poll<T> {
        if !self.busy {
            // Parked, a wait is an operating-system wake-up either way:
            // the background task, woken by the doorbell, moves the
            // message. (Running the pass here too cost the RPC round trip
            // 40 → 55 us in park mode, for no gain elsewhere.)
            return poll(cx, true);
        }
        if let Poll::Ready(t) = poll(cx, false) {
            return Poll::Ready(t);
        }
        let mut until = None;
        loop {
            let delivered = match self.path.try_hold() {
                Some(mut held) => held.pass(self, Until::Delivered).1,
                None => 0,
            };
            if let Poll::Ready(t) = poll(cx, false) {
                return Poll::Ready(t);
            }
            let spent = delivered > 0 || {
                let now = std::time::Instant::now();
                now >= *until.get_or_insert(now + BUSY_SPIN)
            };
            if spent {
                if let Poll::Ready(t) = poll(cx, true) {
                    return Poll::Ready(t);
                }
                // Others have messages, or the spin is spent: their
                // turn, then this task's again.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
            std::hint::spin_loop();
        }
    }

    /// The data path is gone: every connection ends, every call fails,
    /// nobody will acknowledge a close.
    pub(crate) fn end_routes(&self) {
        let mut r = self.routes();
        r.conns.clear();
        r.closing.clear();
        r.listeners.clear();
        r.pending.clear();
    }

    pub(crate) fn routes(&self) -> MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A fresh connection id.
    pub(crate) fn conn_id(&self) -> u64 {
        self.next_conn.fetch_add(1, Ordering::Relaxed)
    }

    /// Forgets the route of connection `id`; true when it was still there
    /// (nobody had closed the connection yet).
    pub(crate) fn unroute(&self, key: ConnKey, id: u64) -> bool {
        let mut routes = self.routes();
        match routes.conns.get(&key) {
            Some(inbox) if inbox.id == id => {
                routes.conns.remove(&key);
                routes.closed.insert(key);
                true
            }
            _ => false,
        }
    }

    /// Forgets the route of connection `id` and starts closing it in
    /// band; `None` when somebody had closed it already.
    pub(crate) fn unroute_closing(&self, key: ConnKey, id: u64) -> Option<Closing> {
        let mut routes = self.routes();
        match routes.conns.get(&key) {
            Some(inbox) if inbox.id == id => {
                routes.conns.remove(&key);
                routes.closed.insert(key);
                let (tx, acked) = oneshot::channel();
                routes.closing.insert(key, tx);
                Some(Closing { key, acked })
            }
            _ => None,
        }
    }

    /// Closes, in the background, a connection that was dropped while
    /// open: in band, then through the daemon.
    pub(crate) fn close_later(&self, closing: Closing) {
        let _ = self.closes.send(closing);
    }

    /// The graceful end of a connection this end closes: a CLOSE behind
    /// everything the connection sent, then a wait (bounded) for the far
    /// end's acknowledgment. Once it came, everything sent before is
    /// through the engine, and the daemon may remove the connection
    /// without losing any of it.
    pub(crate) async fn close_in_band(&self, closing: Closing) {
        let Closing { key, acked } = closing;
        if let Some(fin) = close_message(self.uid, key, FIN) {
            if self.send(fin).await.is_ok() {
                let _ = tokio::time::timeout(CLOSE_ACK_TIMEOUT, acked).await;
            }
        }
        self.routes().closing.remove(&key);
    }

    /// Sends a one-sided request and waits for the completion from its
    /// destination with the same sequence number.
    async fn one_sided(self: &Arc<Self>, mut m: Message) -> Result<Message, ClientError> {
        let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
        m.set_seqnum(seq);
        let key = (m.header().dst, seq);
        let (tx, mut rx) = oneshot::channel();
        self.routes().pending.insert(key, Waiter::One(tx));
        if self.send(m).await.is_err() {
            self.routes().pending.remove(&key);
            return Err(ClientError::Link(LinkError::Closed));
        }
        let answered = std::future::poll_fn(|cx| {
            self.poll_driving(cx, |cx, register| {
                if register {
                    return Pin::new(&mut rx).poll(cx).map(|r| r.ok());
                }
                match rx.try_recv() {
                    Err(oneshot::error::TryRecvError::Empty) => Poll::Pending,
                    Ok(m) => Poll::Ready(Some(m)),
                    Err(oneshot::error::TryRecvError::Closed) => Poll::Ready(None),
                }
            })
        });
        let answer = tokio::time::timeout(ONE_SIDED_TIMEOUT, answered).await;
        self.routes().pending.remove(&key);
        let answer = answer
            .map_err(|_| ClientError::Timeout)?
            .ok_or(ClientError::Link(LinkError::Closed))?;
        match answer.header().status() {
            Status::Ok => Ok(answer),
            s => Err(ClientError::Status(s)),
        }
    }

    pub(crate) async fn write(
        self: &Arc<Self>,
        dst: MemoryAddress,
        data: Bytes,
    ) -> Result<(), ClientError> {
        let m = Message::write(self.uid, dst, data)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        self.one_sided(m).await.map(drop)
    }

    pub(crate) async fn read(
        self: &Arc<Self>,
        src: MemoryAddress,
        len: u16,
    ) -> Result<Bytes, ClientError> {
        let m = Message::read(self.uid.at(0), src, len)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let answer = self.one_sided(m).await?;
        Ok(answer.payload().clone())
    }

    /// See [`Session::one_sided_batch`].
    async fn one_sided_batch<I, F>(
        self: &Arc<Self>,
        requests: I,
        window: usize,
        mut answer: F,
    ) -> Result<usize, ClientError>
    where
        I: IntoIterator<Item = Message>,
        F: FnMut(usize, Message) -> Result<(), ClientError>,
    {
        let window = window.max(1);
        let batch = self.conn_id();
        let (tx, mut rx) = mpsc::channel(window);
        let mut requests = requests.into_iter().enumerate().peekable();
        let mut answers = Vec::with_capacity(window);
        let mut in_flight = 0;
        let mut done = 0;
        let mut timer = std::pin::pin!(tokio::time::sleep(ONE_SIDED_TIMEOUT));
        let mut heard = tokio::time::Instant::now();
        let mut burst = Vec::with_capacity(window);
        let result = loop {
            // Fill the window, registering the whole burst under one lock.
            while in_flight + burst.len() < window {
                let Some((index, mut m)) = requests.next() else {
                    break;
                };
                let seq = self.next_seq.fetch_add(1, Ordering::Relaxed);
                m.set_seqnum(seq);
                burst.push((index, m));
            }
            if !burst.is_empty() {
                let mut routes = self.routes();
                for (index, m) in &burst {
                    let key = (m.header().dst, m.header().seqnum);
                    let answers = tx.clone();
                    let index = *index;
                    routes.pending.insert(
                        key,
                        Waiter::Batch {
                            batch,
                            index,
                            answers,
                        },
                    );
                }
            }
            in_flight += burst.len();
            let mut closed = false;
            for (_, m) in burst.drain(..) {
                if self.send(m).await.is_err() {
                    closed = true;
                    break;
                }
            }
            if closed {
                break Err(ClientError::Link(LinkError::Closed));
            }
            if in_flight == 0 {
                break Ok(done);
            }
            answers.clear();
            let heard_any = std::future::poll_fn(|cx| {
                let got = self.poll_driving(cx, |cx, register| {
                    if register {
                        return rx.poll_recv_many(cx, &mut answers, window);
                    }
                    while answers.len() < window {
                        match rx.try_recv() {
                            Ok(a) => answers.push(a),
                            Err(_) => break,
                        }
                    }
                    if answers.is_empty() {
                        Poll::Pending
                    } else {
                        Poll::Ready(answers.len())
                    }
                });
                if let Poll::Ready(n) = got {
                    return Poll::Ready(Some(n));
                }
                timer.as_mut().poll(cx).map(|()| None)
            })
            .await;
            match heard_any {
                Some(0) => break Err(ClientError::Link(LinkError::Closed)),
                Some(_) => {}
                None => {
                    // Re-armed lazily: the deadline counts from the last
                    // answer (within the slack).
                    let deadline = heard + ONE_SIDED_TIMEOUT;
                    if tokio::time::Instant::now() >= deadline {
                        break Err(ClientError::Timeout);
                    }
                    timer.as_mut().reset(deadline);
                    continue;
                }
            }
            let now = tokio::time::Instant::now();
            if now.duration_since(heard) > BATCH_TIMER_SLACK {
                heard = now;
            }
            in_flight -= answers.len();
            done += answers.len();
            let failed = answers.drain(..).find_map(|(index, m)| {
                let result = match m.header().status() {
                    Status::Ok => answer(index, m),
                    s => Err(ClientError::Status(s)),
                };
                result.err()
            });
            if let Some(e) = failed {
                break Err(e);
            }
            if requests.peek().is_none() && in_flight == 0 {
                break Ok(done);
            }
        };
        if in_flight > 0 {
            self.routes()
                .pending
                .retain(|_, w| !matches!(w, Waiter::Batch { batch: b, .. } if *b == batch));
        }
        result
    }
}

/// A connection this end is closing: its key, and the far end's
/// acknowledgment to wait for.
pub(crate) struct Closing {
    key: ConnKey,
    acked: oneshot::Receiver<()>,
}

impl Closing {
    /// The connection as the control protocol names it.
    fn spec(&self, me: Uid) -> ConnSpec {
        ConnSpec {
            src: me,
            src_port: self.key.0,
            dst: self.key.1,
            dst_port: self.key.2,
        }
    }
}

/// Closes the connections dropped while open: in band, then through the
/// daemon, each in its own task so a far end slow to acknowledge holds up
/// no other. Holds the session and the control socket only weakly: the
/// session's end closes the socket, and the daemon then closes every
/// connection left.
async fn close_dropped(
    control: Weak<ControlChannel>,
    shared: Weak<Shared>,
    mut dropped: mpsc::UnboundedReceiver<Closing>,
) {
    while let Some(closing) = dropped.recv().await {
        let (control, shared) = (control.clone(), shared.clone());
        tokio::spawn(async move {
            let Some(me) = shared.upgrade() else {
                return;
            };
            let conn = closing.spec(me.uid);
            me.close_in_band(closing).await;
            drop(me);
            let Some(control) = control.upgrade() else {
                return;
            };
            if let Err(e) = control.request(&Request::Close { conn }).await {
                tracing::debug!(?conn, "closing a dropped connection: {e}");
            }
        });
    }
}

/// A received message waiting for room in a full inbox.
pub(crate) struct Stalled {
    key: ConnKey,
    id: u64,
    message: Option<Result<Message, LinkError>>,
}

impl Stalled {
    /// Hands the message over once its inbox has room: `Ready(true)` when
    /// it went in, `Ready(false)` when the connection is gone (the message
    /// has nowhere to go). Waiting, the inbox wakes `cx` when its task
    /// took messages.
    pub(crate) fn poll_deliver(
        &mut self,
        d: &Shared,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<bool> {
        let mut routes = d.routes();
        let Some(inbox) = routes.conns.get_mut(&self.key).filter(|i| i.id == self.id) else {
            return Poll::Ready(false);
        };
        match inbox.tx.poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(())) => return Poll::Ready(false),
            Poll::Pending => return Poll::Pending,
        }
        let Some(item) = self.message.take() else {
            return Poll::Ready(false);
        };
        match inbox.push(item) {
            Ok(went) => Poll::Ready(went),
            // Room was there a moment ago and only this holder writes.
            Err(item) => {
                self.message = Some(item);
                Poll::Pending
            }
        }
    }
}

/// What [`dispatch`] did with a message.
pub(crate) enum Dispatched {
    /// It went to a connection's inbox or a call's waiter.
    Delivered,
    /// It was handled otherwise (a notice, a window's request) or dropped.
    Handled,
    /// Its connection's inbox is full: it waits.
    Full(Stalled),
}

impl From<bool> for Dispatched {
    fn from(delivered: bool) -> Self {
        if delivered {
            Dispatched::Delivered
        } else {
            Dispatched::Handled
        }
    }
}

/// Puts `item` in the inbox of connection `key`; hands it back when
/// there is no such connection here.
fn deliver(
    d: &Shared,
    key: ConnKey,
    item: Result<Message, LinkError>,
) -> Result<Dispatched, Result<Message, LinkError>> {
    let mut routes = d.routes();
    let Some(inbox) = routes.conns.get_mut(&key) else {
        return Err(item);
    };
    Ok(match inbox.push(item) {
        Ok(went) => went.into(),
        Err(item) => Dispatched::Full(Stalled {
            key,
            id: inbox.id,
            message: Some(item),
        }),
    })
}

/// Delivers one received message, queueing any answer it needs in
/// `replies`.
pub(crate) fn dispatch(d: &Arc<Shared>, m: Message, replies: &mut VecDeque<Message>) -> Dispatched {
    let h = *m.header();
    let kind = h.request.kind();
    // Notices from the daemon: a connection arrived, or one is gone.
    if h.src == d.daemon && matches!(kind, ReqType::Connect | ReqType::Close | ReqType::Notify) {
        handle_notice(d, m);
        return Dispatched::Handled;
    }
    if kind.form() == ParamForm::Port {
        let Some((src_port, dst_port)) = h.request.ports() else {
            return Dispatched::Handled;
        };
        let key = (dst_port, h.src, src_port);
        if kind == ReqType::Close {
            close_from_peer(d, key, h.request.params().flag(), replies);
            return Dispatched::Handled;
        }
        let error = h.flags.contains(MsgFlags::ERROR);
        if kind.is_answer() && !error {
            return Dispatched::Handled;
        }
        let item = if error {
            Err(LinkError::PeerFailed(format!("{:?}", h.status())))
        } else {
            Ok(m)
        };
        let item = match deliver(d, key, item) {
            Ok(done) => return done,
            Err(_) if kind.is_answer() || error => return Dispatched::Handled,
            Err(item) => item,
        };
        if !accept_early(d, key) {
            return Dispatched::Handled;
        }
        return deliver(d, key, item).unwrap_or(Dispatched::Handled);
    }
    if kind.is_answer() {
        // Only the resource asked may answer: (source, seq), not seq alone.
        let waiter = d.routes().pending.remove(&(h.src, h.seqnum));
        if let Some(w) = waiter {
            w.deliver(m);
            return Dispatched::Delivered;
        }
    } else if h.dst != d.uid {
        tracing::debug!(dst = %h.dst, "one-sided request for another resource");
        replies.extend(m.error_answer(Status::NoRoute));
    } else {
        replies.extend(window::serve(&m, |addr, len| {
            d.routes().windows.find(addr, len)
        }));
    }
    Dispatched::Handled
}

/// An in-band CLOSE from the far end of `key`: a FIN ends the
/// connection's stream after everything that came before it (the far end
/// sent them first, on the same path) and is acknowledged; a FIN_ACK (or
/// the far end's FIN crossing ours) completes this end's close.
fn close_from_peer(d: &Arc<Shared>, key: ConnKey, flag: u8, replies: &mut VecDeque<Message>) {
    let mut routes = d.routes();
    if let Some(waiter) = routes.closing.remove(&key) {
        let _ = waiter.send(());
    }
    if flag == FIN {
        if routes.conns.remove(&key).is_some() {
            routes.closed.insert(key);
        }
        drop(routes);
        // Acknowledged even when unknown here: the far end waits for it.
        replies.extend(close_message(d.uid, key, FIN_ACK));
    }
}

/// Data for a connection this end has not heard of yet, at a port it
/// listens on: the daemon's notice of the connection travels from another
/// engine input and may come after the first data. The engine only
/// carries it because the daemon admitted the connection, so it is
/// accepted now (the notice, when it comes, finds it known). Data for a
/// connection closed here lately is dropped instead. Returns whether the
/// connection was accepted (its route is then there).
fn accept_early(d: &Arc<Shared>, key: ConnKey) -> bool {
    let listener = {
        let routes = d.routes();
        if routes.closed.contains(&key) || routes.closing.contains_key(&key) {
            return false;
        }
        match routes.listeners.get(&key.0) {
            Some(l) => l.clone(),
            None => return false,
        }
    };
    let conn = Connection::register(d, key.0, key.1, key.2);
    d.routes().early.insert(key);
    // Refused when nobody accepts any more: dropping it closes it.
    listener.try_send(conn).is_ok()
}

fn handle_notice(d: &Arc<Shared>, m: Message) {
    let h = *m.header();
    let p = m.payload();
    let parsed = (p.len() >= 10).then(|| {
        let local = u16::from_be_bytes([p[0], p[1]]);
        let remote = Uid::from_bytes([p[2], p[3], p[4], p[5], p[6], p[7]]);
        let rport = u16::from_be_bytes([p[8], p[9]]);
        (local, remote, rport)
    });
    match h.request.kind() {
        ReqType::Connect => {
            let Some((local, remote, rport)) = parsed else {
                return;
            };
            let key = (local, remote, rport);
            let listener = {
                let mut routes = d.routes();
                // Known already: its first data came before this notice
                // (the connection may since have been used and closed),
                // or it is being closed. Any other connection closed here
                // before does not count: the daemon speaks of a new one
                // with the same ends.
                let known = routes.early.take(&key)
                    || routes.conns.contains_key(&key)
                    || routes.closing.contains_key(&key);
                (!known)
                    .then(|| routes.listeners.get(&local).cloned())
                    .flatten()
            };
            if let Some(l) = listener {
                // Refused when nobody accepts any more: dropping it closes it.
                let conn = Connection::register(d, local, remote, rport);
                let _ = l.try_send(conn);
            }
        }
        ReqType::Close | ReqType::Notify => {
            // Only a notice that names its connection: the port alone
            // may be shared by many (every connection a listener accepted).
            let Some(k) = parsed else {
                tracing::debug!("a daemon notice without its connection, dropped");
                return;
            };
            let mut routes = d.routes();
            // The far end is gone: nobody will acknowledge a close.
            if let Some(waiter) = routes.closing.remove(&k) {
                let _ = waiter.send(());
            }
            if let Some(mut inbox) = routes.conns.remove(&k) {
                routes.closed.insert(k);
                if h.status() != Status::Ok && h.status() != Status::Closed {
                    let _ = inbox.push(Err(LinkError::PeerFailed(format!("{:?}", h.status()))));
                }
            }
        }
        _ => {}
    }
}

/// An attached application: its UID, its connections, its memory windows
/// and one-sided operations. Dropping it detaches: the daemon closes every
/// connection it had.
pub struct Session {
    client: Client,
    shared: Arc<Shared>,
    next_port: AtomicU16,
}

impl Session {
    /// A session of `uid` over its data path `link`; `busy` as
    /// [`Shared::spawn`] says.
    pub(crate) fn open<L: Link + 'static>(
        client: Client,
        uid: Uid,
        daemon: Uid,
        link: L,
        busy: bool,
    ) -> Session {
        let (shared, dropped) = Shared::spawn(uid, daemon, link, busy);
        tokio::spawn(close_dropped(
            Arc::downgrade(&client.control),
            Arc::downgrade(&shared),
            dropped,
        ));
        Session {
            client,
            shared,
            next_port: AtomicU16::new(49152),
        }
    }

    /// This resource's UID.
    pub fn uid(&self) -> Uid {
        self.shared.uid
    }

    /// The control connection (for status and other requests).
    pub fn client(&self) -> &Client {
        &self.client
    }

    fn port(&self) -> u16 {
        let p = self.next_port.fetch_add(1, Ordering::Relaxed);
        if p == 0 {
            self.next_port.store(49152, Ordering::Relaxed);
            49152
        } else {
            p
        }
    }

    /// Maps the memory of `device`, a host memory device of this daemon,
    /// into this process: one-sided writes and reads then are this
    /// process's own copies ([`crate::MappedMemory`]). Granted as the
    /// daemon's access rules allow this resource READ (and WRTE, for a
    /// writable mapping) on the device; taken back when they no longer do
    /// or the session ends. Memory on another server, and devices whose
    /// memory is not host memory, are refused: use [`Session::write`].
    pub async fn map(&self, device: Uid) -> Result<crate::MappedMemory, ClientError> {
        if device.server() != self.uid().server() {
            return Err(ClientError::Daemon {
                kind: "bad-request".into(),
                message: format!(
                    "{device} is on another server: only this server's memory can be mapped"
                ),
            });
        }
        crate::MappedMemory::open(&self.client.control, device).await
    }

    /// Makes `len` zeroed bytes of shared memory, this process's region
    /// `id`, and maps it writable here: processes on this server map it
    /// with [`Session::map_shared`] as the daemon's access rules allow
    /// them READ (and WRTE, when `peers_write`) on this process. The
    /// daemon bounds the regions of a process and their bytes
    /// (`[limits] shared_per_resource`, `shared_mib`).
    pub async fn share(
        &self,
        id: u16,
        len: usize,
        peers_write: bool,
    ) -> Result<crate::SharedRegion, ClientError> {
        let req = Request::Share {
            id,
            len: len as u64,
            peers_write,
        };
        crate::SharedRegion::open(&self.client.control, self.uid(), id, &req).await
    }

    /// Withdraws region `id` that this process shares from every process
    /// that mapped it: their accesses report `Revoked` from then on. This
    /// process's own mapping stays its memory.
    pub async fn unshare(&self, id: u16) -> Result<(), ClientError> {
        self.client
            .request(&Request::Unshare { id })
            .await
            .map(drop)
    }

    /// Maps region `id` that process `owner` of this server shares
    /// ([`Session::share`]); read-only unless the rules and the owner let
    /// this process write it.
    pub async fn map_shared(
        &self,
        owner: Uid,
        id: u16,
    ) -> Result<crate::SharedRegion, ClientError> {
        if owner.server() != self.uid().server() {
            return Err(ClientError::Daemon {
                kind: "bad-request".into(),
                message: format!(
                    "{owner} is on another server: only this server's memory can be mapped"
                ),
            });
        }
        let req = Request::MapShared { owner, id };
        crate::SharedRegion::open(&self.client.control, owner, id, &req).await
    }

    /// Claims `name` for this resource in the cluster's directory, so
    /// that any process on any server finds it with [`Client::resolve`];
    /// held until the session ends. Fails when another resource holds
    /// the name or the directory cannot be reached.
    pub async fn register(&self, name: &str) -> Result<(), ClientError> {
        self.client
            .request(&Request::Register { name: name.into() })
            .await
            .map(|_| ())
    }

    /// Accepts connections to `port`.
    pub async fn listen(&self, port: u16) -> Result<Listener, ClientError> {
        let (tx, rx) = mpsc::channel(64);
        self.shared.routes().listeners.insert(port, tx);
        if let Err(e) = self.client.request(&Request::Listen { port }).await {
            self.shared.routes().listeners.remove(&port);
            return Err(e);
        }
        Ok(Listener::new(port, rx))
    }

    /// Opens a connection to `dst` (traffic class 0).
    pub async fn connect(&self, dst: Endpoint) -> Result<Connection, ClientError> {
        self.connect_class(dst, 0).await
    }

    /// Opens a connection to `dst` in traffic class `class`.
    pub async fn connect_class(&self, dst: Endpoint, class: u8) -> Result<Connection, ClientError> {
        let local = self.port();
        // Registered before asking, so nothing the far end sends is lost.
        let conn = Connection::register(&self.shared, local, dst.uid, dst.port);
        let req = Request::Connect {
            src_port: local,
            dst: dst.uid,
            dst_port: dst.port,
            class,
        };
        match self.client.request(&req).await {
            Ok(_) => Ok(conn),
            Err(e) => {
                conn.forget();
                Err(e)
            }
        }
    }

    /// Closes a connection and waits for the daemon: it removes the
    /// connection's entries and tells the far end. Dropping a connection
    /// does the same without waiting.
    pub async fn close(&self, conn: Connection) -> Result<(), ClientError> {
        let spec = conn.spec();
        if let Some(closing) = conn.start_close() {
            self.shared.close_in_band(closing).await;
        }
        self.client
            .request(&Request::Close { conn: spec })
            .await
            .map(drop)
    }

    /// Writes `data` at `dst` and waits for the completion.
    pub async fn write(&self, dst: MemoryAddress, data: Bytes) -> Result<(), ClientError> {
        self.shared.write(dst, data).await
    }

    /// Reads `len` bytes at `src`.
    pub async fn read(&self, src: MemoryAddress, len: u16) -> Result<Bytes, ClientError> {
        self.shared.read(src, len).await
    }

    /// Sends one-sided `requests` (WRTE, READ, ...; their sequence
    /// numbers are set here) with at most `window` unanswered at once, and
    /// hands each answer with the request's index to `answer`, in the
    /// order the answers arrive. The first error ends the batch: an answer
    /// whose status is not `Ok`, an error of `answer` itself, no answer at
    /// all for the one-sided timeout, or the data path closing. Returns
    /// how many requests were answered.
    ///
    /// Unlike as many [`Session::write`]s, a batch allocates nothing and
    /// arms no timer per request, registers a window's requests under one
    /// lock, and is woken once per burst of answers.
    pub async fn one_sided_batch<I, F>(
        &self,
        requests: I,
        window: usize,
        answer: F,
    ) -> Result<usize, ClientError>
    where
        I: IntoIterator<Item = Message>,
        F: FnMut(usize, Message) -> Result<(), ClientError>,
    {
        self.shared.one_sided_batch(requests, window, answer).await
    }

    /// Registers a zeroed memory window of `len` bytes that peers may
    /// WRITE to and READ from (as far as the daemon's access rules allow
    /// them) at `uid@address`; see [`Window::at`]. The first window of a
    /// session starts at address 0.
    pub fn register_window(&self, len: usize) -> Window {
        Window::register(&self.shared, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::{SinkExt, StreamExt};
    use uniplane_dataplane::mem::MemLink;
    use uniplane_dataplane::wire::{Header, MemoryParams, Params, Request as WireRequest};

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    const ME: &str = "10.0.0.1:5";
    const DAEMON: &str = "10.0.0.1:0";

    /// A session's data path whose far end (the "engine") is the returned
    /// link.
    fn session() -> (Arc<Shared>, mpsc::UnboundedReceiver<Closing>, MemLink) {
        let (ours, engine) = uniplane_dataplane::mem::pair(64);
        let (shared, dropped) = Shared::spawn(uid(ME), uid(DAEMON), ours, false);
        (shared, dropped, engine)
    }

    async fn next(engine: &mut MemLink) -> Message {
        tokio::time::timeout(Duration::from_secs(2), engine.next())
            .await
            .expect("a message in time")
            .expect("link open")
            .expect("a valid message")
    }

    fn write_cmpl(from: Uid, to: Uid, seq: u32, status: Status) -> Message {
        let params = Params::Memory(MemoryParams {
            flag: status.to_u8(),
            length: 0,
            addr: 0,
        });
        let mut h = Header::new(
            from,
            to,
            WireRequest::new(ReqType::WriteCmpl, params).unwrap(),
        );
        h.seqnum = seq;
        if status != Status::Ok {
            h.flags = h.flags.with(MsgFlags::ERROR);
        }
        Message::new(h, Bytes::new()).unwrap()
    }

    #[tokio::test]
    async fn a_completion_from_another_source_with_the_same_seq_does_not_resolve_a_call() {
        let (shared, _dropped, mut engine) = session();
        let (a, b) = (uid("10.0.0.2:1"), uid("10.0.0.3:1"));
        let call = tokio::spawn({
            let shared = shared.clone();
            async move { shared.write(a.at(0), Bytes::from("x")).await }
        });
        let request = next(&mut engine).await;
        assert_eq!(request.header().dst, a);
        let seq = request.header().seqnum;
        // B answers first with A's sequence number, and a failure.
        engine
            .send(write_cmpl(b, uid(ME), seq, Status::Denied))
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!call.is_finished(), "B's answer resolved A's call");
        engine
            .send(write_cmpl(a, uid(ME), seq, Status::Ok))
            .await
            .unwrap();
        let result = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .unwrap()
            .unwrap();
        assert!(result.is_ok(), "{result:?}");
    }

    /// Three writes to `a` as one batch with a window of two.
    fn batch_of_three(
        shared: &Arc<Shared>,
        a: Uid,
    ) -> tokio::task::JoinHandle<(Result<usize, ClientError>, Vec<usize>)> {
        let shared = shared.clone();
        tokio::spawn(async move {
            let requests = (0..3)
                .map(move |i| Message::write(uid(ME), a.at(i * 8), Bytes::from("x")).unwrap());
            let mut order = Vec::new();
            let r = shared
                .one_sided_batch(requests, 2, |index, _| {
                    order.push(index);
                    Ok(())
                })
                .await;
            (r, order)
        })
    }

    #[tokio::test]
    async fn a_batch_keeps_its_window_and_hands_each_answer_its_requests_index() {
        let (shared, _dropped, mut engine) = session();
        let a = uid("10.0.0.2:1");
        let call = batch_of_three(&shared, a);
        let (first, second) = (next(&mut engine).await, next(&mut engine).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!call.is_finished(), "two in flight, the third waits");
        // Answered out of order: the second first.
        for m in [&second, &first] {
            let seq = m.header().seqnum;
            engine
                .send(write_cmpl(a, uid(ME), seq, Status::Ok))
                .await
                .unwrap();
        }
        let third = next(&mut engine).await;
        let Params::Memory(p) = *third.header().request.params() else {
            panic!("not a write");
        };
        assert_eq!(p.addr, 16);
        let seq = third.header().seqnum;
        engine
            .send(write_cmpl(a, uid(ME), seq, Status::Ok))
            .await
            .unwrap();
        let (result, order) = call.await.unwrap();
        assert_eq!(result.unwrap(), 3);
        assert_eq!(order, [1, 0, 2]);
        assert!(shared.routes().pending.is_empty());
    }

    #[tokio::test]
    async fn a_failed_answer_ends_the_batch_with_its_status_and_leaves_no_waiter() {
        let (shared, _dropped, mut engine) = session();
        let a = uid("10.0.0.2:1");
        let call = batch_of_three(&shared, a);
        let first = next(&mut engine).await;
        let _second = next(&mut engine).await;
        let seq = first.header().seqnum;
        engine
            .send(write_cmpl(a, uid(ME), seq, Status::OutOfRange))
            .await
            .unwrap();
        let (result, order) = call.await.unwrap();
        assert!(matches!(
            result,
            Err(ClientError::Status(Status::OutOfRange))
        ));
        assert!(order.is_empty());
        assert!(
            shared.routes().pending.is_empty(),
            "the second's waiter is gone"
        );
    }

    #[tokio::test]
    async fn two_peers_answering_with_equal_seqs_each_resolve_their_own_call() {
        let (shared, _dropped, mut engine) = session();
        let (a, b) = (uid("10.0.0.2:1"), uid("10.0.0.3:1"));
        let to_a = tokio::spawn({
            let shared = shared.clone();
            async move { shared.write(a.at(0), Bytes::from("a")).await }
        });
        let first = next(&mut engine).await;
        let to_b = tokio::spawn({
            let shared = shared.clone();
            async move { shared.write(b.at(0), Bytes::from("b")).await }
        });
        let second = next(&mut engine).await;
        // Both peers answer with the same sequence number: A's (the
        // first), and B's own answer under that number must not count.
        let seq = first.header().seqnum;
        engine
            .send(write_cmpl(b, uid(ME), seq, Status::OutOfRange))
            .await
            .unwrap();
        engine
            .send(write_cmpl(a, uid(ME), seq, Status::Ok))
            .await
            .unwrap();
        engine
            .send(write_cmpl(
                b,
                uid(ME),
                second.header().seqnum,
                Status::Denied,
            ))
            .await
            .unwrap();
        assert!(to_a.await.unwrap().is_ok());
        assert!(matches!(
            to_b.await.unwrap(),
            Err(ClientError::Status(Status::Denied))
        ));
    }

    #[tokio::test]
    async fn peers_write_and_read_a_window_and_out_of_range_changes_nothing() {
        let (shared, _dropped, mut engine) = session();
        let window = Window::register(&shared, 8);
        let peer = uid("10.0.0.2:1");
        engine
            .send(Message::write(peer, window.at(2), Bytes::from("hey")).unwrap())
            .await
            .unwrap();
        let done = next(&mut engine).await;
        assert_eq!(done.kind(), ReqType::WriteCmpl);
        assert_eq!(done.header().status(), Status::Ok);
        assert_eq!(window.to_vec(), b"\0\0hey\0\0\0");

        engine
            .send(Message::write(peer, window.at(6), Bytes::from("hey")).unwrap())
            .await
            .unwrap();
        let refused = next(&mut engine).await;
        assert_eq!(refused.kind(), ReqType::WriteCmpl);
        assert_eq!(refused.header().status(), Status::OutOfRange);
        assert_eq!(window.to_vec(), b"\0\0hey\0\0\0");

        engine
            .send(Message::read(peer.at(0), window.at(2), 3).unwrap())
            .await
            .unwrap();
        let data = next(&mut engine).await;
        assert_eq!(data.kind(), ReqType::ReadCmpl);
        assert_eq!(data.payload().as_ref(), b"hey");
    }

    #[tokio::test]
    async fn a_dropped_window_is_no_longer_served() {
        let (shared, _dropped, mut engine) = session();
        let window = Window::register(&shared, 8);
        let at = window.at(0);
        drop(window);
        engine
            .send(Message::write(uid("10.0.0.2:1"), at, Bytes::from("x")).unwrap())
            .await
            .unwrap();
        assert_eq!(
            next(&mut engine).await.header().status(),
            Status::OutOfRange
        );
    }

    fn send(from: Endpoint, to: Endpoint, payload: &'static str, push: bool) -> Message {
        let mut m = Message::send(from, to, Bytes::from(payload)).unwrap();
        if push {
            m.set_segment_flags(MsgFlags::WHOLE.with(MsgFlags::PUSH));
        }
        m
    }

    #[tokio::test]
    async fn recv_until_push_returns_everything_up_to_the_push_marked_message() {
        let (shared, _dropped, mut engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = Connection::register(&shared, 80, peer.uid, peer.port);
        let me = conn.local();
        for (payload, push) in [("a", false), ("b", false), ("c", true), ("d", true)] {
            engine.send(send(peer, me, payload, push)).await.unwrap();
        }
        let unit = conn.recv_until_push().await.unwrap().unwrap();
        assert_eq!(unit.as_ref(), b"abc");
        let unit = conn.recv_until_push().await.unwrap().unwrap();
        assert_eq!(unit.as_ref(), b"d");
    }

    #[tokio::test]
    async fn messages_without_push_are_delivered_one_by_one() {
        let (shared, _dropped, mut engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = Connection::register(&shared, 80, peer.uid, peer.port);
        let me = conn.local();
        engine.send(send(peer, me, "a", false)).await.unwrap();
        engine.send(send(peer, me, "b", true)).await.unwrap();
        let first = conn.recv().await.unwrap().unwrap();
        assert_eq!(first.payload().as_ref(), b"a");
        assert!(!first.header().flags.contains(MsgFlags::PUSH));
        let second = conn.recv().await.unwrap().unwrap();
        assert!(second.header().flags.contains(MsgFlags::PUSH));
    }

    #[tokio::test]
    async fn send_push_marks_the_message_with_push() {
        let (shared, _dropped, mut engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = Connection::register(&shared, 80, peer.uid, peer.port);
        conn.send_bytes(Bytes::from("a")).await.unwrap();
        conn.send_push(Bytes::from("b")).await.unwrap();
        let a = next(&mut engine).await;
        let b = next(&mut engine).await;
        assert!(!a.header().flags.contains(MsgFlags::PUSH));
        assert!(b.header().flags.contains(MsgFlags::PUSH));
        assert_eq!(b.header().seqnum, a.header().seqnum.wrapping_add(1));
    }

    #[tokio::test]
    async fn dropping_an_open_connection_asks_the_daemon_to_close_it() {
        let (shared, mut dropped, _engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let conn = Connection::register(&shared, 80, peer.uid, peer.port);
        drop(conn);
        let closing = dropped.recv().await.unwrap();
        assert_eq!(
            closing.spec(uid(ME)),
            ConnSpec {
                src: uid(ME),
                src_port: 80,
                dst: peer.uid,
                dst_port: peer.port
            }
        );
        assert!(shared.routes().conns.is_empty());
    }

    #[tokio::test]
    async fn a_connection_the_far_end_closed_is_not_closed_again_on_drop() {
        let (shared, mut dropped, mut engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = Connection::register(&shared, 80, peer.uid, peer.port);
        // Another connection on the same local port (a listener's).
        let other = uid("10.0.0.3:1").port(9);
        let mut kept = Connection::register(&shared, 80, other.uid, other.port);
        engine.send(notice(80, peer, Status::Closed)).await.unwrap();
        assert!(conn.recv().await.is_none(), "the far end closed it");
        drop(conn);
        assert!(dropped.try_recv().is_err(), "nothing left to close");
        // Only the connection the notice names ended.
        engine
            .send(Message::send(other, uid(ME).port(80), Bytes::from("still")).unwrap())
            .await
            .unwrap();
        let m = tokio::time::timeout(Duration::from_secs(2), kept.recv())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(m.payload().as_ref(), b"still");
    }

    /// The daemon's NOTIFY of `peer`'s connection at local `port`.
    fn notice(port: u16, peer: Endpoint, status: Status) -> Message {
        notice_of(ReqType::Notify, port, peer, status)
    }

    fn notice_of(kind: ReqType, port: u16, peer: Endpoint, status: Status) -> Message {
        let mut payload = Vec::new();
        payload.extend_from_slice(&port.to_be_bytes());
        payload.extend_from_slice(&peer.uid.to_bytes());
        payload.extend_from_slice(&peer.port.to_be_bytes());
        let params = Params::Port(PortParams {
            flag: status.to_u8(),
            src_port: 0,
            dst_port: port,
        });
        let mut h = Header::new(
            uid(DAEMON),
            uid(ME),
            WireRequest::new(kind, params).unwrap(),
        );
        if status != Status::Ok {
            h.flags = h.flags.with(MsgFlags::ERROR);
        }
        Message::new(h, Bytes::from(payload)).unwrap()
    }

    fn is_close(m: &Message, flag: u8) -> bool {
        m.header().request.kind() == ReqType::Close && m.header().request.params().flag() == flag
    }

    #[tokio::test]
    async fn a_dropped_connection_sends_its_close_behind_its_data_and_waits_for_the_ack() {
        let (shared, mut dropped, mut engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = Connection::register(&shared, 80, peer.uid, peer.port);
        conn.send_bytes(Bytes::from("last words")).await.unwrap();
        drop(conn);
        let closing = dropped.recv().await.unwrap();
        let closer = tokio::spawn({
            let shared = shared.clone();
            async move { shared.close_in_band(closing).await }
        });
        let data = next(&mut engine).await;
        assert_eq!(data.payload().as_ref(), b"last words");
        let fin = next(&mut engine).await;
        assert!(is_close(&fin, FIN), "{:?}", fin.header());
        assert_eq!((fin.header().src, fin.header().dst), (uid(ME), peer.uid));
        assert_eq!(fin.header().request.ports(), Some((80, 7)));
        assert!(!closer.is_finished(), "waits for the far end");
        // Data the far end still sends is not taken for a new connection.
        let _listener = shared_listen(&shared, 80);
        engine
            .send(Message::send(peer, uid(ME).port(80), Bytes::from("late")).unwrap())
            .await
            .unwrap();
        let ack = close_message(peer.uid, (7, uid(ME), 80), FIN_ACK).unwrap();
        engine.send(ack).await.unwrap();
        tokio::time::timeout(Duration::from_secs(2), closer)
            .await
            .expect("the ack ends the wait")
            .unwrap();
        assert!(shared.routes().conns.is_empty(), "late data opened nothing");
        assert!(shared.routes().closing.is_empty());
    }

    /// A listener's accept queue registered directly (no daemon here).
    fn shared_listen(shared: &Arc<Shared>, port: u16) -> Listener {
        let (tx, rx) = mpsc::channel(4);
        shared.routes().listeners.insert(port, tx);
        Listener::new(port, rx)
    }

    #[tokio::test]
    async fn the_far_ends_close_ends_the_stream_after_its_data_and_is_acknowledged() {
        let (shared, mut dropped, mut engine) = session();
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = Connection::register(&shared, 80, peer.uid, peer.port);
        let data = Message::send(peer, uid(ME).port(80), Bytes::from("before")).unwrap();
        engine.send(data).await.unwrap();
        let fin = close_message(peer.uid, (7, uid(ME), 80), FIN).unwrap();
        engine.send(fin).await.unwrap();
        let m = conn.recv().await.unwrap().unwrap();
        assert_eq!(m.payload().as_ref(), b"before");
        assert!(conn.recv().await.is_none(), "the stream ends");
        let ack = next(&mut engine).await;
        assert!(is_close(&ack, FIN_ACK), "{:?}", ack.header());
        assert_eq!(ack.header().dst, peer.uid);
        assert_eq!(ack.header().request.ports(), Some((80, 7)));
        drop(conn);
        assert!(dropped.try_recv().is_err(), "the far end closes it");
    }

    #[tokio::test]
    async fn a_new_connection_with_the_ends_of_one_closed_before_is_accepted() {
        let (shared, mut dropped, mut engine) = session();
        let mut listener = shared_listen(&shared, 80);
        let peer = uid("10.0.0.2:1").port(7);
        engine
            .send(notice_of(ReqType::Connect, 80, peer, Status::Ok))
            .await
            .unwrap();
        let first = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .unwrap()
            .unwrap();
        drop(first);
        let closing = dropped.recv().await.unwrap();
        let ack = close_message(peer.uid, (7, uid(ME), 80), FIN_ACK).unwrap();
        engine.send(ack).await.unwrap();
        shared.close_in_band(closing).await;
        // The same ends again, announced by the daemon: a new connection.
        engine
            .send(notice_of(ReqType::Connect, 80, peer, Status::Ok))
            .await
            .unwrap();
        let again = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .expect("the new connection is accepted")
            .unwrap();
        assert_eq!(again.remote(), peer);
    }

    /// Data from `peer` to port 80 before any notice: the connection it
    /// opens, accepted, its first message (the data) read.
    async fn opened_by_early_data(
        engine: &mut MemLink,
        listener: &mut Listener,
        peer: Endpoint,
    ) -> Connection {
        engine
            .send(Message::send(peer, uid(ME).port(80), Bytes::from("early")).unwrap())
            .await
            .unwrap();
        let mut conn = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(conn.remote(), peer);
        let m = conn.recv().await.unwrap().unwrap();
        assert_eq!(m.payload().as_ref(), b"early");
        conn
    }

    #[tokio::test]
    async fn data_before_the_daemons_notice_opens_the_connection_once() {
        let (shared, _dropped, mut engine) = session();
        let mut listener = shared_listen(&shared, 80);
        let peer = uid("10.0.0.2:1").port(7);
        let mut conn = opened_by_early_data(&mut engine, &mut listener, peer).await;
        // The notice comes after: no second connection.
        let connect = notice_of(ReqType::Connect, 80, peer, Status::Ok);
        engine.send(connect).await.unwrap();
        engine
            .send(Message::send(peer, uid(ME).port(80), Bytes::from("next")).unwrap())
            .await
            .unwrap();
        let m = conn.recv().await.unwrap().unwrap();
        assert_eq!(m.payload().as_ref(), b"next");
        assert!(listener.try_accept().is_none(), "one connection only");
    }

    /// The daemon's notice may come after the connection its data opened
    /// was used and closed at both ends: it opens no second connection
    /// (the next accept would have handed out one that ends at once).
    #[tokio::test]
    async fn a_notice_after_an_early_connection_closed_opens_nothing() {
        let (shared, mut dropped, mut engine) = session();
        let mut listener = shared_listen(&shared, 80);
        let peer = uid("10.0.0.2:1").port(7);
        let conn = opened_by_early_data(&mut engine, &mut listener, peer).await;
        drop(conn);
        let closing = dropped.recv().await.unwrap();
        let ack = close_message(peer.uid, (7, uid(ME), 80), FIN_ACK).unwrap();
        engine.send(ack).await.unwrap();
        shared.close_in_band(closing).await;
        assert!(shared.routes().closing.is_empty());
        // Now the notice of that connection.
        engine
            .send(notice_of(ReqType::Connect, 80, peer, Status::Ok))
            .await
            .unwrap();
        // Then the next connection's: it is the one accepted.
        let other = uid("10.0.0.2:1").port(8);
        engine
            .send(notice_of(ReqType::Connect, 80, other, Status::Ok))
            .await
            .unwrap();
        let next = tokio::time::timeout(Duration::from_secs(2), listener.accept())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(next.remote(), other, "the late notice opened a connection");
        assert!(shared.routes().early.set.is_empty());
    }
}
