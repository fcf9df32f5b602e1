//! [`Connection`] and [`Listener`]: connected messaging between two
//! resources, with PUSH boundaries.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Sink, SinkExt, Stream};
use tokio::sync::mpsc;
use tokio_util::sync::PollSender;
use uniplane_dataplane::ring;
use uniplane_dataplane::wire::MsgFlags;
use uniplane_dataplane::{Endpoint, Link, LinkError, Message, Uid};

use crate::protocol::ConnSpec;
use crate::session::{Inbox, Shared, INBOX_DEPTH};

/// Messages a connection takes from its inbox before it gives their
/// slots back to the data path.
const RELEASE_EVERY: usize = 32;

/// Connections arriving at a listening port.
pub struct Listener {
    port: u16,
    rx: mpsc::Receiver<Connection>,
}

impl Listener {
    pub(crate) fn new(port: u16, rx: mpsc::Receiver<Connection>) -> Listener {
        Listener { port, rx }
    }

    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The next connection, or `None` when the session ended.
    pub async fn accept(&mut self) -> Option<Connection> {
        self.rx.recv().await
    }

    /// A connection already waiting, without waiting for one.
    #[cfg(test)]
    pub(crate) fn try_accept(&mut self) -> Option<Connection> {
        self.rx.try_recv().ok()
    }
}

/// One connection: a [`Link`] whose stream yields the far end's messages
/// and whose sink sends messages built with [`Connection::message`].
///
/// Messages may carry a PUSH boundary ([`Connection::send_push`]);
/// [`Connection::recv_until_push`] gathers everything up to and including
/// the next one as one unit, while [`Connection::recv`] and the stream
/// yield messages one by one, as sent.
///
/// Dropping an open connection closes it: the session's background task
/// tells the daemon, which tells the far end (as [`crate::Session::close`]
/// does, without waiting).
pub struct Connection {
    shared: Arc<Shared>,
    /// Tells this connection's route from a newer one with the same ends.
    id: u64,
    local: Endpoint,
    remote: Endpoint,
    /// Boxed: a ring end sits on a cache line of its own, which would
    /// make every `Connection` (and what holds one) 128-byte aligned.
    inbox: Box<ring::Consumer<Result<Message, LinkError>>>,
    /// Messages taken from the inbox since its slots were last given back.
    taken: usize,
    /// The session's queue, for a message that could not go straight
    /// into its data path and found the queue full.
    out: PollSender<Message>,
    /// That message, until the queue has room.
    held_back: Option<Message>,
    seq: u32,
    /// What `recv_until_push` has gathered of the current unit.
    unit: BytesMut,
    /// Closed through the session (or never opened): nothing to do on drop.
    closed: bool,
}

impl Connection {
    /// A connection of the session to `remote:remote_port` from
    /// `local_port`, its inbox routed.
    pub(crate) fn register(
        shared: &Arc<Shared>,
        local_port: u16,
        remote: Uid,
        remote_port: u16,
    ) -> Connection {
        let (tx, rx) = ring::ring(INBOX_DEPTH);
        let id = shared.conn_id();
        let key = (local_port, remote, remote_port);
        let mut routes = shared.routes();
        routes.closed.remove(&key);
        routes.conns.insert(key, Inbox { id, tx });
        drop(routes);
        Connection {
            shared: shared.clone(),
            id,
            local: shared.uid.port(local_port),
            remote: remote.port(remote_port),
            inbox: Box::new(rx),
            taken: 0,
            out: PollSender::new(shared.out.clone()),
            held_back: None,
            seq: 0,
            unit: BytesMut::new(),
            closed: false,
        }
    }

    fn route(&self) -> (u16, Uid, u16) {
        (self.local.port, self.remote.uid, self.remote.port)
    }

    /// The connection as the control protocol names it (this end first).
    pub(crate) fn spec(&self) -> ConnSpec {
        ConnSpec {
            src: self.local.uid,
            src_port: self.local.port,
            dst: self.remote.uid,
            dst_port: self.remote.port,
        }
    }

    /// Starts closing the connection in band ([`Shared::close_in_band`]);
    /// `None` when the far end or the session closed it already.
    pub(crate) fn start_close(mut self) -> Option<crate::session::Closing> {
        self.closed = true;
        self.shared.unroute_closing(self.route(), self.id)
    }

    /// Drops the connection without telling anyone (it was never opened).
    pub(crate) fn forget(mut self) {
        self.shared.unroute(self.route(), self.id);
        self.closed = true;
    }

    /// This end.
    pub fn local(&self) -> Endpoint {
        self.local
    }

    /// The far end.
    pub fn remote(&self) -> Endpoint {
        self.remote
    }

    /// A SEND of `payload` on this connection, numbered in order.
    pub fn message(&mut self, payload: Bytes) -> Result<Message, LinkError> {
        let mut m = Message::send(self.local, self.remote, payload)?;
        m.set_seqnum(self.seq);
        self.seq = self.seq.wrapping_add(1);
        Ok(m)
    }

    /// A SEND of `payload` that ends a unit: it carries the PUSH flag.
    pub fn message_push(&mut self, payload: Bytes) -> Result<Message, LinkError> {
        let mut m = self.message(payload)?;
        m.set_segment_flags(m.header().flags.with(MsgFlags::PUSH));
        Ok(m)
    }

    /// Sends `payload` and flushes.
    pub async fn send_bytes(&mut self, payload: Bytes) -> Result<(), LinkError> {
        let m = self.message(payload)?;
        self.send(m).await
    }

    /// Sends `payload` as the end of a unit (PUSH) and flushes.
    pub async fn send_push(&mut self, payload: Bytes) -> Result<(), LinkError> {
        let m = self.message_push(payload)?;
        self.send(m).await
    }

    /// The next message from the far end; `None` once the connection closed.
    pub async fn recv(&mut self) -> Option<Result<Message, LinkError>> {
        std::future::poll_fn(|cx| self.poll_inbox(cx)).await
    }

    /// The next message of the inbox, running the session's data path on
    /// this task while there is none ([`Shared::poll_driving`]).
    fn poll_inbox(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Message, LinkError>>> {
        let (inbox, taken) = (&mut self.inbox, &mut self.taken);
        self.shared.poll_driving(cx, |cx, register| {
            if let Some(m) = inbox.pop() {
                // Slots go back in batches: one store for many messages.
                *taken += 1;
                if *taken >= RELEASE_EVERY {
                    *taken = 0;
                    inbox.release();
                }
                return Poll::Ready(Some(m));
            }
            if !register {
                return if inbox.is_closed() && inbox.available() == 0 {
                    Poll::Ready(None)
                } else {
                    Poll::Pending
                };
            }
            *taken = 0;
            match inbox.poll_available(cx) {
                Poll::Ready(true) => Poll::Ready(inbox.pop()),
                Poll::Ready(false) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            }
        })
    }

    /// The payloads of every message up to and including the next
    /// PUSH-marked one, as one unit. When the connection closes in the
    /// middle of a unit, what arrived of it comes as a last unit (closing
    /// pushes), then `None`; an error drops the unit gathered so far.
    /// Cancel-safe: a unit interrupted here continues on the next call.
    pub async fn recv_until_push(&mut self) -> Option<Result<Bytes, LinkError>> {
        loop {
            match self.recv().await {
                Some(Ok(m)) => {
                    let push = m.header().flags.contains(MsgFlags::PUSH);
                    if push && self.unit.is_empty() {
                        return Some(Ok(m.payload().clone()));
                    }
                    self.unit.extend_from_slice(m.payload());
                    if push {
                        return Some(Ok(self.unit.split().freeze()));
                    }
                }
                Some(Err(e)) => {
                    self.unit.clear();
                    return Some(Err(e));
                }
                None if self.unit.is_empty() => return None,
                None => return Some(Ok(self.unit.split().freeze())),
            }
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        // Still routed means nobody closed it yet: the far end's close or
        // the session's end removes the route first.
        if self.closed {
            return;
        }
        if let Some(closing) = self.shared.unroute_closing(self.route(), self.id) {
            self.shared.close_later(closing);
        }
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("local", &self.local)
            .field("remote", &self.remote)
            .finish()
    }
}

impl Stream for Connection {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_inbox(cx)
    }
}

impl Connection {
    /// Moves the message `start_send` could place nowhere (the queue was
    /// full) into the queue once it has room: `Ready(Ok(()))` once
    /// nothing is held back.
    fn poll_held_back(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if self.held_back.is_none() {
            return Poll::Ready(Ok(()));
        }
        ready!(self.out.poll_reserve(cx)).map_err(|_| LinkError::Closed)?;
        if let Some(m) = self.held_back.take() {
            self.out.send_item(m).map_err(|_| LinkError::Closed)?;
        }
        Poll::Ready(Ok(()))
    }
}

impl Sink<Message> for Connection {
    type Error = LinkError;

    /// Ready unless a message is still held back (backpressure: the
    /// session's queue was full).
    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().poll_held_back(cx)
    }

    /// Straight into the session's data path when it is free, else into
    /// its queue; a full queue holds the message here until `poll_ready`
    /// or `poll_flush` can place it (nothing is dropped, nothing
    /// overtakes it).
    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        let this = self.get_mut();
        if this.held_back.is_some() {
            return Err(LinkError::Io(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "start_send without a ready poll_ready",
            )));
        }
        let Err(item) = this.shared.send_direct(item) else {
            return Ok(());
        };
        match this.shared.out.try_send(item) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Full(item)) => {
                this.held_back = Some(item);
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(LinkError::Closed),
        }
    }

    /// Done once nothing is held back here: the session's data path
    /// publishes what it took by the time this task waits on the session
    /// or yields.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().poll_held_back(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        ready!(this.poll_held_back(cx))?;
        this.out.close();
        Poll::Ready(Ok(()))
    }
}

impl Link for Connection {}
