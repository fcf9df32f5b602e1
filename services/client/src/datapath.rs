//! The session's data path, and who moves it: whichever task finds it
//! free.
//!
//! ```text
//!   connection / call tasks                   the session's background task
//!   send: try ─┐   wait: try ─┐                 (always there, never lets go)
//!              ▼              ▼                              │
//!        ┌──────────────── PathCell ───────────────────────┐ │
//!        │ state word: HELD | MISSED                       │◄┘
//!        │ Pump: link to the engine (shm rings), queues,   │
//!        │       the background task's waker               │
//!        └─────────────────────────────────────────────────┘
//!   pass: receive a burst → dispatch to inboxes / answer windows →
//!         send what is queued → flush
//! ```
//!
//! A session's messages cross one link to the engine. Before, one task
//! moved them: an application's message went to that task through a
//! channel, and an answer came back from it through another, two task
//! hand-offs per round trip on the application's runtime (each a turn of
//! the scheduler, and with a busy-polling runtime a reactor poll). Now the
//! task that sends runs the send itself when the path is free — its
//! message goes from its own `start_send` into the ring — and, in a
//! busy-polling session, a task waiting for a message runs the receive
//! pass itself, so the answer goes from the ring into its own inbox and
//! out of its own poll. The
//! background task remains for everything nobody waits for: peers'
//! one-sided requests, notices, messages for connections whose task is
//! busy elsewhere.
//!
//! The path is taken with a try-lock, never a waiting lock: one word holds
//! `HELD` and `MISSED`. A connection that finds the path held goes the old
//! way (its message into the queue the holder drains, or it waits for its
//! inbox, which the holder fills). The background task that finds it held
//! sets `MISSED`; the holder, letting go, finds the bit in the same word
//! (its compare-and-swap fails) and wakes the background task. Both change
//! the word with read-modify-writes, so one always sees the other: nothing
//! waits for a later message.
//!
//! Whoever runs a pass registers every readiness it waits on (ring data,
//! ring space, room in a full inbox, the send queue) with the background
//! task's waker, never its own: a connection's task may stop polling once
//! it has its message, and the task that is always waiting must be the one
//! woken.
//!
//! Order: a direct send first moves everything queued before it (the send
//! queue, the replies) into the link, and goes direct only when all of it
//! went; otherwise it joins the queue. So one connection's messages leave
//! in the order they were sent, however each went.

use std::cell::UnsafeCell;
use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures_util::Sink;
use tokio::sync::mpsc;
use uniplane_dataplane::{BoxLink, LinkError, Message};

use crate::session::{dispatch, Dispatched, Shared, Stalled};

/// Answers to peers' requests queued before a pass stops taking more from
/// the link (backpressure on the peers).
const MAX_QUEUED_OUT: usize = 256;

/// Messages taken from the link, or from the send queue, per step.
const BURST: usize = 64;

/// The state word: somebody holds the path.
const HELD: u8 = 1;
/// The state word: the background task wanted the path while it was held;
/// set only while `HELD` is.
const MISSED: u8 = 2;

/// The data path and its state word (see the module's text).
pub(crate) struct PathCell {
    state: AtomicU8,
    pump: UnsafeCell<Pump>,
}

// SAFETY: the pump is reached only through a `Held`, of which the `HELD`
// bit allows one at a time (taken with Acquire, let go with Release), so
// it moves between threads as it would in a mutex; it is `Send`.
unsafe impl Sync for PathCell {}

impl PathCell {
    /// The path over `link`, sending what `out` queues.
    pub(crate) fn new(link: BoxLink, out: mpsc::Receiver<Message>) -> PathCell {
        PathCell {
            state: AtomicU8::new(0),
            pump: UnsafeCell::new(Pump {
                link,
                out,
                inbound: VecDeque::with_capacity(BURST),
                recv_buf: Vec::with_capacity(BURST),
                outbound: VecDeque::with_capacity(BURST),
                send_buf: Vec::with_capacity(BURST),
                stalled: None,
                out_open: true,
                flushing: false,
                unpublished: 0,
                publisher_woken: false,
                ended: false,
                waker: None,
                delivered: 0,
            }),
        }
    }

    /// The path, if nobody holds it.
    pub(crate) fn try_hold(&self) -> Option<Held<'_>> {
        self.state
            .compare_exchange(0, HELD, Ordering::Acquire, Ordering::Relaxed)
            .ok()
            .map(|_| Held(self))
    }

    /// The background task's way in: the path, or `None` once the holder
    /// was told (`MISSED`) to wake the task when it lets go.
    fn hold_or_miss(&self) -> Option<Held<'_>> {
        let mut s = self.state.load(Ordering::Relaxed);
        loop {
            let (new, ordering) = if s == 0 {
                (HELD, Ordering::Acquire)
            } else {
                (s | MISSED, Ordering::Relaxed)
            };
            match self
                .state
                .compare_exchange_weak(s, new, ordering, Ordering::Relaxed)
            {
                Ok(_) if s == 0 => return Some(Held(self)),
                Ok(_) => return None,
                Err(now) => s = now,
            }
        }
    }
}

/// The path, held: let go when dropped.
pub(crate) struct Held<'a>(&'a PathCell);

impl Deref for Held<'_> {
    type Target = Pump;
    fn deref(&self) -> &Pump {
        // SAFETY: the HELD bit is ours (see `PathCell`).
        unsafe { &*self.0.pump.get() }
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Pump {
        // SAFETY: the HELD bit is ours (see `PathCell`).
        unsafe { &mut *self.0.pump.get() }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let cell = self.0;
        if cell
            .state
            .compare_exchange(HELD, 0, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        // MISSED: the background task wants the path. Its waker is read
        // while the path is still ours.
        let waker = self.waker.clone();
        cell.state.store(0, Ordering::Release);
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// How long a pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    /// Until nothing moves: the background task's pass.
    Idle,
    /// Until a burst from the link went into inboxes (or nothing moves),
    /// then the rest is the background task's: a task waiting for its
    /// own message.
    Delivered,
}

/// What the data path holds: the link to the engine and everything in
/// flight between it and the session's connections.
pub(crate) struct Pump {
    link: BoxLink,
    /// Messages the session's tasks queued when they could not send
    /// directly.
    out: mpsc::Receiver<Message>,
    /// Received, not yet dispatched.
    inbound: VecDeque<Message>,
    recv_buf: Vec<Message>,
    /// To send, in order: the send queue's messages and replies.
    outbound: VecDeque<Message>,
    send_buf: Vec<Message>,
    /// A received message waiting for room in its connection's inbox.
    stalled: Option<Stalled>,
    out_open: bool,
    /// The link holds messages it has not published yet: only its
    /// `poll_flush` moves them on, so it is flushed until done even when
    /// nothing new comes to send.
    flushing: bool,
    /// Messages direct sends wrote since the last publication.
    unpublished: usize,
    /// The background task was woken to publish them, should nobody else.
    publisher_woken: bool,
    /// The link ended; every connection of the session has been ended.
    ended: bool,
    /// The background task's waker, once it first ran: every readiness a
    /// pass waits on is registered with it.
    waker: Option<Waker>,
    /// Messages handed to connections' inboxes so far.
    delivered: u64,
}

impl Pump {
    /// Runs rounds until nothing moves (`Until::Idle`, the background
    /// task) or until messages went into inboxes (`Until::Delivered`, a
    /// task waiting for its own message: one burst from the link is what
    /// it can use now, and the background task, woken, carries on);
    /// `Ready` once the link ended (every connection is then ended).
    /// Returns how many messages went into connections' inboxes, for a
    /// caller that wants to know whether it woke other tasks. Nothing runs
    /// before the background task's first turn (no waker to register yet).
    pub(crate) fn pass(&mut self, d: &Arc<Shared>, until: Until) -> (Poll<()>, u64) {
        let before = self.delivered;
        if self.ended {
            return (Poll::Ready(()), 0);
        }
        let Some(waker) = self.waker.take() else {
            return (Poll::Pending, 0);
        };
        let mut cx = Context::from_waker(&waker);
        if self.flushing && self.outbound.is_empty() {
            // What direct sends wrote goes first: the far end may be
            // waiting for it.
            let _ = self.flush(&mut cx);
        }
        let r = self.run(d, &mut cx, until);
        self.waker = Some(waker);
        if r.is_ready() {
            self.end(d);
        }
        (r, self.delivered - before)
    }

    /// Sends `m` into the link now if everything queued before it went
    /// too; hands `m` back otherwise (the caller then queues it): also
    /// once the link ended, and before the background task's first turn.
    /// Never waits.
    pub(crate) fn send_direct(&mut self, m: Message) -> Result<(), Message> {
        if self.ended {
            return Err(m);
        }
        let Some(waker) = self.waker.take() else {
            return Err(m);
        };
        let mut cx = Context::from_waker(&waker);
        let r = self.send_now(&mut cx, m);
        self.waker = Some(waker);
        r
    }

    fn send_now(&mut self, cx: &mut Context<'_>, m: Message) -> Result<(), Message> {
        // What was queued before goes first.
        if self.outbound.is_empty() && !self.out.is_empty() {
            while self.outbound.len() < BURST {
                match self.out.try_recv() {
                    Ok(q) => self.outbound.push_back(q),
                    Err(_) => break,
                }
            }
        }
        if !self.outbound.is_empty() {
            let before = self.outbound.len();
            if let Poll::Ready(Err(_)) = self.link.poll_send_batch(cx, &mut self.outbound) {
                return Err(m);
            }
            self.flushing |= self.outbound.len() < before;
            if !self.outbound.is_empty() || !self.out.is_empty() {
                return Err(m);
            }
        }
        match Pin::new(&mut self.link).poll_ready(cx) {
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) | Poll::Pending => return Err(m),
        }
        // Refused only by a link that has just closed: the message goes
        // with it, as it would have from the queue.
        if Pin::new(&mut self.link).start_send(m).is_err() {
            return Ok(());
        }
        // Published by the next pass — this task's own when it waits on
        // the session, else the background task's, woken now, which runs
        // once this task yields — or here once a burst is written: one
        // publication for a burst, and a sender that never yields still
        // feeds the engine.
        self.unpublished += 1;
        self.flushing = true;
        if self.unpublished >= BURST {
            let _ = self.flush(cx);
        } else if !self.publisher_woken {
            self.publisher_woken = true;
            cx.waker().wake_by_ref();
        }
        Ok(())
    }

    /// Publishes what the link holds; what it cannot publish yet (a full
    /// ring) stays for the next pass.
    fn flush(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let r = Pin::new(&mut self.link).poll_flush(cx);
        if let Poll::Ready(Ok(())) = r {
            self.flushing = false;
            self.unpublished = 0;
            self.publisher_woken = false;
        } else {
            self.flushing = true;
        }
        r
    }

    /// One task's worth of moving, in one place so neither direction can
    /// starve the other: receiving never waits for sending. A connection
    /// whose inbox is full holds the receive side (backpressure, not
    /// loss) until it has room.
    fn run(&mut self, d: &Arc<Shared>, cx: &mut Context<'_>, until: Until) -> Poll<()> {
        let delivered_before = self.delivered;
        loop {
            let mut progress = false;
            // A message waiting for room in its connection's inbox.
            if let Some(st) = self.stalled.as_mut() {
                match st.poll_deliver(d, cx) {
                    Poll::Ready(delivered) => {
                        self.delivered += u64::from(delivered);
                        self.stalled = None;
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }
            if self.stalled.is_none() {
                while self.outbound.len() < MAX_QUEUED_OUT {
                    let Some(m) = self.inbound.pop_front() else {
                        break;
                    };
                    progress = true;
                    match dispatch(d, m, &mut self.outbound) {
                        Dispatched::Delivered => self.delivered += 1,
                        Dispatched::Handled => {}
                        Dispatched::Full(st) => {
                            // Round once more so the permit future is
                            // polled and registers the task.
                            self.stalled = Some(st);
                            break;
                        }
                    }
                }
                if self.inbound.is_empty()
                    && self.stalled.is_none()
                    && self.outbound.len() < MAX_QUEUED_OUT
                {
                    match self.link.poll_recv_batch(cx, &mut self.recv_buf, BURST) {
                        Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
                        Poll::Ready(Ok(_)) => {
                            self.inbound.extend(self.recv_buf.drain(..));
                            progress = true;
                        }
                        Poll::Pending => {}
                    }
                }
            }
            if self.outbound.is_empty() && self.out_open {
                match self.out.poll_recv_many(cx, &mut self.send_buf, BURST) {
                    Poll::Ready(0) => self.out_open = false,
                    Poll::Ready(_) => {
                        self.outbound.extend(self.send_buf.drain(..));
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }
            if !self.outbound.is_empty() || self.flushing {
                let before = self.outbound.len();
                if !self.outbound.is_empty() {
                    if let Poll::Ready(Err(_)) = self.link.poll_send_batch(cx, &mut self.outbound) {
                        return Poll::Ready(());
                    }
                }
                let sent = self.outbound.len() < before;
                if sent || self.flushing {
                    let was = self.flushing;
                    match self.flush(cx) {
                        Poll::Ready(Err(_)) => return Poll::Ready(()),
                        Poll::Ready(Ok(())) => progress |= was,
                        Poll::Pending => {}
                    }
                }
                progress |= sent;
            }
            if !progress {
                return Poll::Pending;
            }
            if until == Until::Delivered && self.delivered != delivered_before {
                // What is left (more in the link, a flush) is the
                // background task's.
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
    }

    /// The data path is gone: every connection ends, every call fails,
    /// nobody will acknowledge a close.
    fn end(&mut self, d: &Arc<Shared>) {
        self.ended = true;
        self.stalled = None;
        // Nothing will drain the queue: a send after the end fails
        // (`Closed`) instead of waiting in it for ever.
        self.out.close();
        self.outbound.clear();
        d.end_routes();
        if let Some(w) = &self.waker {
            // The background task finds the path ended and returns.
            w.wake_by_ref();
        }
    }
}

/// The session's background task: runs the path whenever something it
/// waits on is ready and nobody else holds it, until the link ends.
pub(crate) async fn background(d: Arc<Shared>) {
    std::future::poll_fn(|cx| {
        let Some(mut held) = d.path.hold_or_miss() else {
            // The holder wakes this task when it lets go.
            return Poll::Pending;
        };
        if !held.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            held.waker = Some(cx.waker().clone());
        }
        held.pass(&d, Until::Idle).0
    })
    .await;
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use futures_util::{FutureExt, SinkExt, StreamExt};
    use std::task::Poll;
    use uniplane_dataplane::mem::MemLink;
    use uniplane_dataplane::wire::ReqType;
    use uniplane_dataplane::LinkError;
    use uniplane_dataplane::{Endpoint, Uid};

    use super::*;
    use crate::{Connection, Window};

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    /// A session whose far end (the "engine") is the returned link, its
    /// background task run once (so other tasks may run the path).
    async fn session() -> (Arc<Shared>, MemLink) {
        session_waiting(false).await
    }

    /// [`session`], busy-polling: a waiting task runs the path itself.
    async fn busy_session() -> (Arc<Shared>, MemLink) {
        session_waiting(true).await
    }

    async fn session_waiting(busy: bool) -> (Arc<Shared>, MemLink) {
        let (ours, engine) = uniplane_dataplane::mem::pair(64);
        let (shared, _dropped) = Shared::spawn(uid("10.0.0.1:5"), uid("10.0.0.1:0"), ours, busy);
        tokio::task::yield_now().await;
        (shared, engine)
    }

    fn peer() -> Endpoint {
        uid("10.0.0.2:1").port(7)
    }

    fn send(from: Endpoint, to: Endpoint, payload: &'static str) -> Message {
        Message::send(from, to, Bytes::from(payload)).unwrap()
    }

    /// The test runs on a current-thread runtime: while it does not
    /// yield, the background task does not run, so whatever moves moved
    /// in the test's own poll.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_connection_takes_its_message_from_the_link_itself() {
        let (shared, mut engine) = busy_session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        let me = conn.local();
        engine.send(send(peer(), me, "hello")).await.unwrap();
        let got = conn.recv().now_or_never();
        let m = got.expect("received in this poll").unwrap().unwrap();
        assert_eq!(m.payload().as_ref(), b"hello");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_parked_sessions_waiting_connection_leaves_the_path_to_the_background_task() {
        let (shared, mut engine) = session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        let me = conn.local();
        engine.send(send(peer(), me, "later")).await.unwrap();
        assert!(conn.recv().now_or_never().is_none(), "not in this poll");
        let m = tokio::time::timeout(std::time::Duration::from_secs(2), conn.recv())
            .await
            .expect("the background task moved it");
        assert_eq!(m.unwrap().unwrap().payload().as_ref(), b"later");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_send_goes_into_the_link_in_the_senders_own_poll() {
        let (shared, mut engine) = session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        conn.send_bytes(Bytes::from("out"))
            .now_or_never()
            .expect("sent in this poll")
            .unwrap();
        let m = engine.next().now_or_never().expect("in the link already");
        assert_eq!(m.unwrap().unwrap().payload().as_ref(), b"out");
    }

    /// Over shared memory, where what is written is seen only once
    /// published.
    #[tokio::test(flavor = "current_thread")]
    async fn a_direct_send_is_published_when_its_task_then_waits_elsewhere() {
        let cfg = uniplane_shm::ShmConfig::default();
        let (ours, mut engine) = uniplane_shm::ShmLink::pair(&cfg).await.unwrap();
        let (shared, _dropped) = Shared::spawn(uid("10.0.0.1:5"), uid("10.0.0.1:0"), ours, false);
        tokio::task::yield_now().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        conn.send_bytes(Bytes::from("late"))
            .now_or_never()
            .expect("taken in this poll")
            .unwrap();
        assert_eq!(shared.path.try_hold().map(|h| h.unpublished), Some(1));
        // This task now waits on something that is not the session.
        let m = tokio::time::timeout(std::time::Duration::from_secs(2), engine.next())
            .await
            .expect("published by the background task")
            .unwrap()
            .unwrap();
        assert_eq!(m.payload().as_ref(), b"late");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_direct_send_goes_behind_what_was_queued_while_the_path_was_held() {
        let (shared, mut engine) = session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        let held = shared.path.try_hold().expect("free");
        for payload in ["a", "b"] {
            conn.send_bytes(Bytes::from(payload)).await.unwrap();
        }
        assert!(
            engine.next().now_or_never().is_none(),
            "queued while the path was held"
        );
        drop(held);
        conn.send_bytes(Bytes::from("c"))
            .now_or_never()
            .expect("sent in this poll")
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..3 {
            let m = engine.next().now_or_never().expect("in the link").unwrap();
            got.push(m.unwrap().payload().clone());
        }
        assert_eq!(got, [&b"a"[..], b"b", b"c"]);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_background_task_that_missed_the_path_is_woken_when_it_is_let_go() {
        let (shared, mut engine) = session().await;
        let window = Window::register(&shared, 8);
        let held = shared.path.try_hold().expect("free");
        // A peer's write, which only the background task serves here.
        let write = Message::write(uid("10.0.0.2:1"), window.at(0), Bytes::from("x")).unwrap();
        engine.send(write).await.unwrap();
        // Its turn: it finds the path held and leaves MISSED.
        tokio::task::yield_now().await;
        assert_eq!(shared.path.state.load(Ordering::Relaxed), HELD | MISSED);
        assert!(engine.next().now_or_never().is_none(), "nobody served it");
        drop(held);
        let answer = tokio::time::timeout(std::time::Duration::from_secs(2), engine.next())
            .await
            .expect("the background task served it")
            .unwrap()
            .unwrap();
        assert_eq!(answer.header().request.kind(), ReqType::WriteCmpl);
        assert_eq!(window.read(0, 1).as_deref(), Some(&b"x"[..]));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_message_for_another_connection_is_handed_to_its_inbox() {
        let (shared, mut engine) = busy_session().await;
        let mut mine = Connection::register(&shared, 80, peer().uid, peer().port);
        let mut other = Connection::register(&shared, 81, peer().uid, peer().port);
        engine
            .send(send(peer(), other.local(), "theirs"))
            .await
            .unwrap();
        engine
            .send(send(peer(), mine.local(), "mine"))
            .await
            .unwrap();
        let m = mine.recv().now_or_never().expect("in this poll").unwrap();
        assert_eq!(m.unwrap().payload().as_ref(), b"mine");
        let m = other.recv().now_or_never().expect("already in its inbox");
        assert_eq!(m.unwrap().unwrap().payload().as_ref(), b"theirs");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_queue_holds_a_message_back_pushes_back_and_loses_none() {
        let (shared, mut engine) = session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        let message = |conn: &mut Connection, i: u32| {
            let m = conn.message(Bytes::from(i.to_be_bytes().to_vec()));
            m.unwrap()
        };
        // The path held: nothing goes direct; 1024 fill the queue, the
        // next waits in the connection.
        let held = shared.path.try_hold().expect("free");
        for i in 0..1025 {
            let m = message(&mut conn, i);
            conn.feed(m).await.unwrap();
        }
        let ready = std::future::poll_fn(|cx| Poll::Ready(conn.poll_ready_unpin(cx))).await;
        assert!(ready.is_pending(), "a full queue pushes back");
        drop(held);
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            while got.len() < 1026 {
                let m = engine.next().await.unwrap().unwrap();
                got.push(u32::from_be_bytes(m.payload()[..4].try_into().unwrap()));
            }
            got
        });
        let m = message(&mut conn, 1025);
        conn.send(m).await.unwrap();
        let got = tokio::time::timeout(std::time::Duration::from_secs(5), reader)
            .await
            .expect("every message through")
            .unwrap();
        assert_eq!(got, (0..1026).collect::<Vec<u32>>());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_full_inbox_holds_the_receive_side_and_loses_nothing() {
        let (shared, mut engine) = session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        let me = conn.local();
        let total = crate::session::INBOX_DEPTH as u32 + 100;
        let feeder = tokio::spawn(async move {
            for i in 0..total {
                let m = Message::send(peer(), me, Bytes::from(i.to_be_bytes().to_vec()));
                engine.send(m.unwrap()).await.unwrap();
            }
            engine
        });
        // Nobody reads until the inbox is full and the link backs up.
        let full = async {
            while shared.path.try_hold().is_some_and(|h| h.stalled.is_none()) {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), full)
            .await
            .expect("the inbox fills and holds the receive side");
        for i in 0..total {
            let m = tokio::time::timeout(std::time::Duration::from_secs(5), conn.recv())
                .await
                .expect("in time")
                .unwrap()
                .unwrap();
            assert_eq!(m.payload().as_ref(), i.to_be_bytes());
        }
        let _engine = feeder.await.unwrap();
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_links_end_ends_every_connection_whoever_ran_the_pass() {
        let (shared, engine) = busy_session().await;
        let mut conn = Connection::register(&shared, 80, peer().uid, peer().port);
        drop(engine);
        let end = conn.recv().now_or_never().expect("seen in this poll");
        assert!(end.is_none(), "{end:?}");
        assert!(shared.path.try_hold().is_some_and(|h| h.ended));
        // And what is sent after the end is refused, not queued for ever.
        let sent = conn.send_bytes(Bytes::from("late")).now_or_never();
        assert!(matches!(sent, Some(Err(LinkError::Closed))), "{sent:?}");
    }
}
