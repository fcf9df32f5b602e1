//! [`ShmPort`]: the listener side of a shared-memory link as a
//! [`PortIo`] that the engine thread drives directly.
//!
//! ```text
//!  application process                 daemon process
//!  ┌───────────┐  ring 0 (app → engine)  ┌──────────────────────────────┐
//!  │  ShmLink  │ ══════════════════════► │ ShmPort ◄── engine thread    │
//!  │ (client)  │ ◄══════════════════════ │   (decode / encode in place) │
//!  └───────────┘  ring 1 (engine → app)  │                              │
//!     │ rings the listener's doorbells   │ ShmPortBell (a future on the │
//!     └────── only when it saw the ─────►│ daemon's runtime): eventfd → │
//!             engine's waiting flag up   │ the engine's waker; EOF →    │
//!                                        │ "peer gone"                  │
//!                                        └──────────────────────────────┘
//! ```
//!
//! No task and no relay sits between the application's rings and the
//! engine: the engine's input burst decodes records straight out of ring 0
//! (one copy out of shared memory, into a buffer the messages share, as
//! [`ShmLink`] does) and its output burst encodes messages straight into
//! ring 1, publishing once per flush. A doorbell is rung only to a side
//! that said it parked, so when the application and the engine both
//! busy-poll no system call happens per message.
//!
//! A parked engine registers its waker through
//! [`PortIo::poll_available`] / [`PortIo::poll_ready`] (which raise the
//! ring's waiting flag); the application then rings the listener's
//! eventfds, and [`ShmPortBell`], polled on the daemon's runtime, turns
//! that into a wake-up of the engine thread. The same future watches the
//! Unix socket: its end of file means the application died, which it
//! reports to the engine ([`PortIo::is_closed`]) and to the daemon (the
//! future completes with [`ShmPortEnd::PeerGone`]) so the daemon detaches
//! the port.
//!
//! The handshake is [`ShmLink::serve`]'s, so the unchanged client-side
//! [`ShmLink::join`] connects to it.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::task::AtomicWaker;
use tokio::io::unix::AsyncFd;
use tokio::net::UnixStream;
use uniplane_dataplane::{Message, PortClosed, PortIo};

use crate::link::{encode_into, poll_bell, Parts, RecvBuf};
use crate::ring::{RingConsumer, RingError, RingProducer};
use crate::sys::{register_bell, EventFd, SharedMemory};
use crate::{ShmConfig, ShmError, ShmLink, ShmLinkStats};

/// Messages decoded per refill of the engine's input.
const INPUT_BATCH: usize = 64;

/// What the port and its bell share.
#[derive(Debug, Default)]
struct BellShared {
    /// The engine's waker, registered when it parks on this port.
    waker: AtomicWaker,
    /// The application's socket reached end of file.
    peer_gone: AtomicBool,
    /// The port was dropped (detached from the engine).
    detached: AtomicBool,
}

/// The listener side of a shared-memory link, driven by the engine thread
/// as a [`PortIo`]. See the module documentation.
pub struct ShmPort {
    mem: SharedMemory,
    tx: RingProducer,
    rx: RingConsumer,
    rbuf: RecvBuf,
    /// Decoded input not yet taken by the engine.
    inbox: VecDeque<Message>,
    /// An output message accepted while ring 1 was full; it goes first.
    stalled: Option<Message>,
    /// Rung to wake the application when it parked on data.
    peer_data_bell: EventFd,
    /// Rung to wake the application when it parked on space.
    peer_space_bell: EventFd,
    /// A second descriptor of our own data doorbell: rung at drop so the
    /// bell future notices the detach.
    own_bell: EventFd,
    shared: Arc<BellShared>,
    /// The shared memory broke the ring protocol; the port is dead.
    failed: Option<RingError>,
    /// Messages pushed after the application was gone (nobody reads them).
    discarded: u64,
    stats: ShmLinkStats,
}

impl std::fmt::Debug for ShmPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPort")
            .field("region_bytes", &self.mem.len())
            .field("stats", &self.stats)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

/// Why a [`ShmPortBell`] finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmPortEnd {
    /// The application's end of the socket closed (it exited or died):
    /// detach the port.
    PeerGone,
    /// The port was dropped (detached) first.
    Detached,
}

/// Wakes a parked engine when the application rings the port's doorbells,
/// and reports the application's death. A future to spawn on the daemon's
/// runtime next to attaching the [`ShmPort`]; it completes once the
/// application is gone or the port was dropped.
pub struct ShmPortBell {
    data_bell: AsyncFd<EventFd>,
    space_bell: AsyncFd<EventFd>,
    sock: UnixStream,
    shared: Arc<BellShared>,
}

impl std::fmt::Debug for ShmPortBell {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmPortBell")
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl ShmPort {
    /// The listener's half of the handshake on an accepted Unix socket
    /// (the same as [`ShmLink::serve`], so a client's [`ShmLink::join`]
    /// connects to it): returns the port for the engine to drive and the
    /// bell future for the caller's runtime. Must be called inside a tokio
    /// runtime (the doorbells are registered with its reactor).
    pub fn serve(sock: UnixStream, cfg: &ShmConfig) -> Result<(ShmPort, ShmPortBell), ShmError> {
        let p = Parts::serve(sock.as_fd(), cfg)?;
        let own_bell = EventFd::from_fd(p.data_bell.as_fd().try_clone_to_owned()?)?;
        let shared = Arc::new(BellShared::default());
        let bell = ShmPortBell {
            data_bell: register_bell(p.data_bell)?,
            space_bell: register_bell(p.space_bell)?,
            sock,
            shared: shared.clone(),
        };
        let port = ShmPort {
            tx: RingProducer::new(p.tx),
            rx: RingConsumer::new(p.rx),
            mem: p.mem,
            rbuf: RecvBuf::new(cfg),
            inbox: VecDeque::with_capacity(INPUT_BATCH),
            stalled: None,
            peer_data_bell: p.peer_data_bell,
            peer_space_bell: p.peer_space_bell,
            own_bell,
            shared,
            failed: None,
            discarded: 0,
            stats: ShmLinkStats::default(),
        };
        Ok((port, bell))
    }

    /// A port and a client-side link connected to it in this process
    /// (tests, benchmarks): the same handshake over a socket pair.
    /// `client` configures the link's end (its wait mode).
    pub async fn pair(
        cfg: &ShmConfig,
        client: &ShmConfig,
    ) -> Result<(ShmLink, ShmPort, ShmPortBell), ShmError> {
        let (a, b) = UnixStream::pair()?;
        let (port, bell) = Self::serve(a, cfg)?;
        let link = ShmLink::join(b, client).await?;
        Ok((link, port, bell))
    }

    /// Counters of this end.
    pub fn stats(&self) -> ShmLinkStats {
        self.stats
    }

    /// Messages pushed after the application was gone, and so discarded.
    pub fn discarded(&self) -> u64 {
        self.discarded
    }

    /// Why the port failed, when the application broke the ring protocol.
    pub fn failure(&self) -> Option<RingError> {
        self.failed
    }

    fn peer_gone(&self) -> bool {
        self.shared.peer_gone.load(Ordering::Acquire)
    }

    /// Decodes up to a batch of published records into the inbox.
    fn refill(&mut self) {
        if self.failed.is_some() {
            return;
        }
        if self.stalled.is_some() && self.unstall() {
            self.publish();
        }
        let inbox = &mut self.inbox;
        let drained = self.rbuf.drain(
            &mut self.rx,
            &self.mem,
            &self.peer_space_bell,
            &mut self.stats,
            INPUT_BATCH,
            |m| inbox.push_back(m),
        );
        if let Err(e) = drained {
            self.failed = Some(e);
        }
    }

    /// Moves the stalled message into ring 1; true when nothing is stalled.
    fn unstall(&mut self) -> bool {
        let Some(m) = self.stalled.take() else {
            return true;
        };
        match encode_into(&mut self.tx, &self.mem, &m) {
            Ok(true) => {
                self.stats.sent += 1;
                true
            }
            Ok(false) => {
                self.stalled = Some(m);
                false
            }
            Err(_) => {
                // The message cannot be encoded or the ring is corrupt:
                // either way it cannot go out.
                self.discarded += 1;
                true
            }
        }
    }

    /// Retries the output message held back while ring 1 was full. The
    /// engine counted it as sent and queues nothing more for this port, so
    /// it never polls this port's output again on its own: the retry runs
    /// from [`PortIo::poll_available`], which the engine polls on every
    /// port before it parks. When ring 1 is still full, the producer's
    /// waiting flag goes up, so the application's release rings the space
    /// bell, which wakes the engine (the waker is registered first).
    fn retry_stalled(&mut self) {
        while let Some(len) = self.stalled.as_ref().map(Message::encoded_len) {
            if self.unstall() {
                self.publish();
                return;
            }
            if self.output_dead() {
                self.stalled = None;
                self.discarded += 1;
                return;
            }
            match self.tx.park(&self.mem, len) {
                // Room appeared meanwhile: the flag is down again; retry.
                Ok(true) => continue,
                Ok(false) => return,
                Err(e) => {
                    self.failed = Some(e);
                    return;
                }
            }
        }
    }

    fn publish(&mut self) {
        if self.tx.publish(&self.mem) {
            self.peer_data_bell.ring();
            self.stats.doorbells += 1;
        }
    }

    /// Whether nothing pushed will be read any more: discard instead of
    /// holding the engine's queues.
    fn output_dead(&self) -> bool {
        self.failed.is_some() || self.peer_gone() || self.tx.consumer_closed(&self.mem)
    }
}

impl PortIo for ShmPort {
    #[inline]
    fn peek(&mut self) -> Option<&Message> {
        if self.inbox.is_empty() {
            self.refill();
        }
        self.inbox.front()
    }

    #[inline]
    fn pop(&mut self) -> Option<Message> {
        if self.inbox.is_empty() {
            self.refill();
        }
        self.inbox.pop_front()
    }

    #[inline]
    fn available(&mut self) -> usize {
        if self.inbox.is_empty() {
            self.refill();
        }
        self.inbox.len()
    }

    /// Ring space goes back as records are copied out; nothing to do.
    #[inline]
    fn release(&mut self) {}

    fn poll_available(&mut self, cx: &mut Context<'_>) -> Poll<bool> {
        if self.available() > 0 {
            return Poll::Ready(true);
        }
        if self.failed.is_some() || self.peer_gone() {
            return Poll::Ready(false);
        }
        self.shared.waker.register(cx.waker());
        self.retry_stalled();
        match self.rx.park(&self.mem) {
            Ok(true) => return Poll::Ready(true),
            Ok(false) => {}
            Err(e) => {
                self.failed = Some(e);
                return Poll::Ready(false);
            }
        }
        self.stats.parks += 1;
        if self.rx.producer_closed(&self.mem) || self.peer_gone() {
            return Poll::Ready(self.available() > 0);
        }
        Poll::Pending
    }

    #[inline]
    fn free(&mut self) -> usize {
        if self.stalled.is_some() && !self.unstall() {
            return if self.output_dead() { 1 } else { 0 };
        }
        1
    }

    #[inline]
    fn push(&mut self, m: Message) -> Result<(), Message> {
        if self.stalled.is_some() && !self.unstall() {
            if !self.output_dead() {
                return Err(m);
            }
            self.stalled = None;
            self.discarded += 1;
        }
        match encode_into(&mut self.tx, &self.mem, &m) {
            Ok(true) => self.stats.sent += 1,
            Ok(false) if self.output_dead() => self.discarded += 1,
            Ok(false) => self.stalled = Some(m),
            Err(_) => self.discarded += 1,
        }
        Ok(())
    }

    #[inline]
    fn flush(&mut self) {
        self.publish();
    }

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), PortClosed>> {
        if self.output_dead() {
            return Poll::Ready(Err(PortClosed));
        }
        if self.free() > 0 {
            return Poll::Ready(Ok(()));
        }
        self.publish();
        self.shared.waker.register(cx.waker());
        let len = self.stalled.as_ref().map_or(0, Message::encoded_len);
        match self.tx.park(&self.mem, len) {
            Ok(true) if self.unstall() => return Poll::Ready(Ok(())),
            Ok(_) => {}
            Err(e) => {
                self.failed = Some(e);
                return Poll::Ready(Err(PortClosed));
            }
        }
        self.stats.parks += 1;
        if self.output_dead() {
            return Poll::Ready(Err(PortClosed));
        }
        Poll::Pending
    }

    fn is_closed(&mut self) -> bool {
        self.output_dead()
    }
}

impl Drop for ShmPort {
    fn drop(&mut self) {
        self.tx.close(&self.mem);
        self.rx.close(&self.mem);
        self.peer_data_bell.ring();
        self.peer_space_bell.ring();
        self.shared.detached.store(true, Ordering::Release);
        self.own_bell.ring();
    }
}

impl ShmPortBell {
    /// Whether the application's socket reached end of file; registers the
    /// task for that event otherwise.
    fn poll_eof(&mut self, cx: &mut Context<'_>) -> bool {
        let mut scratch = [0u8; 64];
        loop {
            match self.sock.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => match self.sock.try_read(&mut scratch) {
                    Ok(0) => return true,
                    // Nothing is sent after the handshake; ignore bytes.
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                    Err(_) => return true,
                },
                Poll::Ready(Err(_)) => return true,
                Poll::Pending => return false,
            }
        }
    }
}

impl Future for ShmPortBell {
    type Output = ShmPortEnd;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<ShmPortEnd> {
        let this = self.get_mut();
        // A broken eventfd cannot wake anyone any more; treat it as rung
        // and let the socket decide whether the peer lives.
        let data = poll_bell(&this.data_bell, cx).unwrap_or(true);
        let space = poll_bell(&this.space_bell, cx).unwrap_or(true);
        if this.shared.detached.load(Ordering::Acquire) {
            return Poll::Ready(ShmPortEnd::Detached);
        }
        if data || space {
            this.shared.waker.wake();
        }
        if this.poll_eof(cx) {
            this.shared.peer_gone.store(true, Ordering::Release);
            this.shared.waker.wake();
            return Poll::Ready(ShmPortEnd::PeerGone);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MIN_RING_BYTES;
    use bytes::Bytes;
    use futures_util::{SinkExt, StreamExt};
    use std::net::Ipv4Addr;
    use std::sync::atomic::AtomicUsize;
    use std::task::Wake;
    use std::time::Duration;
    use uniplane_dataplane::Uid;

    fn msg(i: u32, len: usize) -> Message {
        let u = Uid::new(Ipv4Addr::LOCALHOST, 1);
        let mut m = Message::send(u.port(1), u.port(2), Bytes::from(vec![7u8; len])).unwrap();
        m.set_seqnum(i);
        m
    }

    fn small() -> ShmConfig {
        ShmConfig {
            ring_bytes: MIN_RING_BYTES,
            ..ShmConfig::default()
        }
    }

    /// Counts its wake-ups: the engine thread's waker, in a test.
    #[derive(Default)]
    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    async fn until(what: &str, mut f: impl FnMut() -> bool) {
        for _ in 0..2000 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[tokio::test]
    async fn what_the_client_sends_the_port_reads_and_what_the_port_writes_the_client_receives() {
        let (mut link, mut port, _bell) = ShmPort::pair(&small(), &ShmConfig::default())
            .await
            .unwrap();
        link.send(msg(1, 10)).await.unwrap();
        assert_eq!(port.available(), 1);
        assert_eq!(port.peek().map(|m| m.header().seqnum), Some(1));
        let m = port.pop().unwrap();
        port.release();
        assert_eq!(m, msg(1, 10));
        assert!(port.free() > 0);
        port.push(msg(2, 1000)).unwrap();
        port.flush();
        assert_eq!(link.next().await.unwrap().unwrap(), msg(2, 1000));
        assert_eq!((port.stats().received, port.stats().sent), (1, 1));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_slow_reader_holds_the_port_back_and_loses_nothing() {
        let (mut link, mut port, _bell) = ShmPort::pair(&small(), &ShmConfig::default())
            .await
            .unwrap();
        const N: u32 = 2000;
        let writer = std::thread::spawn(move || {
            let (mut next, mut full) = (0, 0u32);
            while next < N {
                if port.free() == 0 {
                    full += 1;
                    port.flush();
                    std::thread::sleep(Duration::from_micros(50));
                    continue;
                }
                port.push(msg(next, 4000)).unwrap();
                next += 1;
            }
            // Keep publishing until the last (possibly held back) message
            // is in the ring.
            while port.free() == 0 {
                port.flush();
                std::thread::sleep(Duration::from_micros(50));
            }
            port.flush();
            (port, full)
        });
        for i in 0..N {
            if i % 100 == 0 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, i);
        }
        let (port, full) = writer.join().unwrap();
        assert!(full > 0, "a 256 KiB ring filled up under the slow reader");
        assert_eq!(port.discarded(), 0);
    }

    #[tokio::test]
    async fn a_malformed_record_is_counted_and_skipped() {
        let (mut link, mut port, _bell) = ShmPort::pair(&small(), &ShmConfig::default())
            .await
            .unwrap();
        assert!(link.push_raw(b"definitely not a message"));
        link.send(msg(9, 9)).await.unwrap();
        assert_eq!(port.pop(), Some(msg(9, 9)));
        assert_eq!(port.stats().malformed, 1);
        assert!(!port.is_closed());
    }

    #[tokio::test]
    async fn a_parked_engine_is_woken_by_the_client_through_the_bell() {
        let (mut link, mut port, bell) = ShmPort::pair(&small(), &ShmConfig::default())
            .await
            .unwrap();
        let bell = tokio::spawn(bell);
        let counter = Arc::new(Counter::default());
        let waker = std::task::Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(port.poll_available(&mut cx).is_pending());
        link.send(msg(3, 3)).await.unwrap();
        until("the wake-up", || counter.0.load(Ordering::SeqCst) > 0).await;
        assert_eq!(port.poll_available(&mut cx), Poll::Ready(true));
        assert_eq!(port.pop(), Some(msg(3, 3)));
        assert_eq!(link.stats().doorbells, 1, "rung once: the port had parked");
        drop(port);
        assert_eq!(bell.await.unwrap(), ShmPortEnd::Detached);
        assert!(link.next().await.is_none(), "the client sees the port go");
    }

    /// The engine counts a message the full ring held back as sent and
    /// has nothing more for the port: parking on the port's input must
    /// still get it out once the client makes room.
    #[tokio::test]
    async fn a_message_held_back_by_a_full_ring_goes_out_after_the_engine_parks() {
        let (mut link, mut port, bell) = ShmPort::pair(&small(), &ShmConfig::default())
            .await
            .unwrap();
        let _bell = tokio::spawn(bell);
        let mut n = 0u32;
        while port.free() > 0 {
            port.push(msg(n, 4000)).unwrap();
            n += 1;
        }
        port.flush();
        let counter = Arc::new(Counter::default());
        let waker = std::task::Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(port.poll_available(&mut cx).is_pending(), "no input: park");
        for i in 0..n - 1 {
            assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, i);
        }
        until("the space bell's wake-up", || {
            counter.0.load(Ordering::SeqCst) > 0
        })
        .await;
        assert!(port.poll_available(&mut cx).is_pending());
        let last = tokio::time::timeout(Duration::from_secs(2), link.next())
            .await
            .expect("the held-back message arrives")
            .unwrap()
            .unwrap();
        assert_eq!(last.header().seqnum, n - 1);
        assert_eq!(port.discarded(), 0);
    }

    #[tokio::test]
    async fn a_busy_client_and_a_busy_port_ring_no_doorbell() {
        let busy = ShmConfig {
            busy_poll: true,
            ..ShmConfig::default()
        };
        let (mut link, mut port, _bell) = ShmPort::pair(&small(), &busy).await.unwrap();
        for i in 0..100 {
            link.send(msg(i, 64)).await.unwrap();
            let m = loop {
                if let Some(m) = port.pop() {
                    break m;
                }
                tokio::task::yield_now().await;
            };
            port.push(m).unwrap();
            port.flush();
            assert_eq!(link.next().await.unwrap().unwrap().header().seqnum, i);
        }
        assert_eq!(link.stats().doorbells + port.stats().doorbells, 0);
    }

    #[tokio::test]
    async fn the_death_of_the_client_is_reported_to_the_engine_and_the_daemon() {
        let (link, mut port, bell) = ShmPort::pair(&small(), &ShmConfig::default())
            .await
            .unwrap();
        let bell = tokio::spawn(bell);
        let counter = Arc::new(Counter::default());
        let waker = std::task::Waker::from(counter.clone());
        let mut cx = Context::from_waker(&waker);
        assert!(port.poll_available(&mut cx).is_pending());
        assert!(!port.is_closed());
        // A process that dies leaves its rings open; only the socket tells.
        link.shutdown_socket();
        assert_eq!(bell.await.unwrap(), ShmPortEnd::PeerGone);
        assert!(
            counter.0.load(Ordering::SeqCst) > 0,
            "the parked engine was woken"
        );
        assert!(port.is_closed());
        assert_eq!(port.poll_available(&mut cx), Poll::Ready(false));
        // What the engine still pushes is taken, never held: once the
        // ring is full it is discarded.
        for i in 0..10 {
            assert!(port.free() > 0);
            port.push(msg(i, 60_000)).unwrap();
        }
        assert!(port.discarded() > 0);
        drop(link);
    }
}
