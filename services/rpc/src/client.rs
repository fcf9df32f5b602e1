//! [`Client`]: calls over one uniplane connection, as a tower
//! [`Service`], and [`Connector`], which opens such clients by UID.
//!
//! ```text
//!  Client (clone per task) ─┐ commands (open, message,   ┌─ driver task ──────────┐
//!  Client ──────────────────┼─ credit, cancel) ─────────►│ tag → call             │◄─► Connection
//!  ResponseFuture ◄─ oneshot┘  Streaming ◄─ mpsc ◄────── │ frames out / frames in │
//!                                                        └────────────────────────┘
//! ```
//!
//! One driver task per connection owns it: it numbers nothing (callers
//! take tags from a shared counter), writes every frame, reads every
//! frame and hands each to its call by tag. `poll_ready` takes one of the
//! connection's call slots ([`ClientOptions::max_in_flight`]): a slot is
//! held until the call's answer is read, so when the link or the server
//! falls behind, answers stop coming, the slots run out and `poll_ready`
//! returns `Pending` — the link's backpressure reaches the caller.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use rustc_hash::FxHashMap;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::PollSemaphore;
use tower::Service;
use uniplane_client::{ClientError, Connection, Session};
use uniplane_dataplane::{Endpoint, Uid};

use crate::frame::{Flags, Head, Kind};
use crate::status::{Code, Status};
use crate::stream::{Command, Commands, Credit, Reply, Sender, Streaming, WINDOW};
use crate::wire::{Incoming, Wire};

/// Limits of a client.
#[derive(Clone, Copy, Debug)]
pub struct ClientOptions {
    /// Calls in flight on the connection at most.
    pub max_in_flight: usize,
    /// Largest message sent or received.
    pub max_message: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            max_in_flight: 1024,
            max_message: 4 << 20,
        }
    }
}

/// One unary call: the method, the request message, and how long the
/// caller will wait (carried to the server, which stops working on the
/// call when it passes).
#[derive(Clone, Debug)]
pub struct Call {
    /// The method, such as `/echo.Echo/Unary`.
    pub method: Bytes,
    /// The request message.
    pub message: Bytes,
    /// The call's deadline, from when it is sent.
    pub timeout: Option<Duration>,
}

impl Call {
    /// A call of `method` with `message` and no deadline.
    pub fn new(method: &'static str, message: Bytes) -> Call {
        Call {
            method: Bytes::from_static(method.as_bytes()),
            message,
            timeout: None,
        }
    }

    /// The same call with a deadline `timeout` from when it is sent.
    pub fn timeout(mut self, timeout: Duration) -> Call {
        self.timeout = Some(timeout);
        self
    }
}

struct Shared {
    commands: Commands,
    next_tag: AtomicU32,
    in_flight: AtomicUsize,
    /// Set by the driver when the connection ended (the driver holds
    /// this flag, not `Shared`, so that dropping every handle closes the
    /// commands channel and ends the driver).
    closed: Arc<AtomicBool>,
    options: ClientOptions,
    remote: Endpoint,
}

impl Shared {
    fn tag(&self) -> u32 {
        loop {
            let t = self.next_tag.fetch_add(1, Ordering::Relaxed);
            if t != 0 {
                return t;
            }
        }
    }
}

/// A call's place among the client's calls in flight; freed on drop.
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    shared: Arc<Shared>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Calls over one uniplane connection. Clone it for each task that calls;
/// every clone shares the connection. The connection closes when the
/// last clone and the last call are gone.
pub struct Client {
    shared: Arc<Shared>,
    slots: PollSemaphore,
    slot: Option<OwnedSemaphorePermit>,
}

impl Clone for Client {
    fn clone(&self) -> Self {
        Client {
            shared: self.shared.clone(),
            slots: self.slots.clone(),
            slot: None,
        }
    }
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("remote", &self.shared.remote)
            .finish()
    }
}

impl Client {
    /// A client over `conn`, its driver spawned on the current tokio
    /// runtime.
    pub fn new(conn: Connection, options: ClientOptions) -> Client {
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            commands: tx,
            next_tag: AtomicU32::new(1),
            in_flight: AtomicUsize::new(0),
            closed: Arc::new(AtomicBool::new(false)),
            options,
            remote: conn.remote(),
        });
        let wire = Wire::new(conn, options.max_message);
        tokio::spawn(drive(wire, rx, shared.closed.clone()));
        Client {
            shared,
            slots: PollSemaphore::new(Arc::new(Semaphore::new(options.max_in_flight))),
            slot: None,
        }
    }

    /// The server's end of the connection.
    pub fn remote(&self) -> Endpoint {
        self.shared.remote
    }

    /// Calls in flight now (the [`tower::load::Load`] of this client).
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    async fn ready_slot(&mut self) -> Result<Slot, Status> {
        std::future::poll_fn(|cx| self.poll_ready(cx)).await?;
        self.take_slot()
    }

    fn take_slot(&mut self) -> Result<Slot, Status> {
        let permit = self
            .slot
            .take()
            .ok_or_else(|| Status::internal("call without poll_ready"))?;
        self.shared.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Slot {
            _permit: permit,
            shared: self.shared.clone(),
        })
    }

    fn check_size(&self, message: &Bytes) -> Result<(), Status> {
        let max = self.shared.options.max_message;
        if message.len() > max {
            return Err(Status::resource_exhausted(format!(
                "message of {} bytes above the limit of {max}",
                message.len()
            )));
        }
        Ok(())
    }

    fn open(
        &self,
        method: Bytes,
        message: Option<Bytes>,
        end: bool,
        timeout: Option<Duration>,
        reply: Reply,
        credit: Option<Arc<Credit>>,
    ) -> Result<(u32, Option<Instant>), Status> {
        let tag = self.shared.tag();
        let deadline_us = timeout.map_or(0, |t| t.as_micros().clamp(1, u32::MAX as u128) as u32);
        self.shared
            .commands
            .send(Command::Open {
                tag,
                method,
                message,
                end,
                deadline_us,
                reply,
                credit,
            })
            .map_err(|_| Status::unavailable("connection closed"))?;
        Ok((tag, timeout.map(|t| Instant::now() + t)))
    }

    /// A call answered by a stream of messages.
    pub async fn server_streaming(&mut self, call: Call) -> Result<Streaming, Status> {
        self.check_size(&call.message)?;
        let slot = self.ready_slot().await?;
        let (tx, rx) = mpsc::channel(WINDOW as usize + 1);
        let (tag, deadline) = self.open(
            call.method,
            Some(call.message),
            true,
            call.timeout,
            Reply::Stream(tx),
            None,
        )?;
        Ok(Streaming::new(tag, rx, self.shared.commands.clone(), true)
            .with_deadline(deadline)
            .with_slot(slot))
    }

    /// A call that sends a stream of messages and gets one answer.
    pub async fn client_streaming(
        &mut self,
        method: &'static str,
        timeout: Option<Duration>,
    ) -> Result<(Sender, ResponseFuture), Status> {
        let slot = self.ready_slot().await?;
        let (tx, rx) = oneshot::channel();
        let credit = Credit::new();
        let (tag, deadline) = self.open(
            Bytes::from_static(method.as_bytes()),
            None,
            false,
            timeout,
            Reply::Unary(tx),
            Some(credit.clone()),
        )?;
        let sender = Sender::new(
            tag,
            self.shared.commands.clone(),
            credit,
            self.shared.options.max_message,
        );
        Ok((sender, ResponseFuture::new(tag, rx, slot, deadline)))
    }

    /// A call that streams both ways.
    pub async fn bidi(
        &mut self,
        method: &'static str,
        timeout: Option<Duration>,
    ) -> Result<(Sender, Streaming), Status> {
        let slot = self.ready_slot().await?;
        let (tx, rx) = mpsc::channel(WINDOW as usize + 1);
        let credit = Credit::new();
        let (tag, deadline) = self.open(
            Bytes::from_static(method.as_bytes()),
            None,
            false,
            timeout,
            Reply::Stream(tx),
            Some(credit.clone()),
        )?;
        let sender = Sender::new(
            tag,
            self.shared.commands.clone(),
            credit,
            self.shared.options.max_message,
        );
        let stream = Streaming::new(tag, rx, self.shared.commands.clone(), true)
            .with_deadline(deadline)
            .with_slot(slot);
        Ok((sender, stream))
    }
}

impl Service<Call> for Client {
    type Response = Bytes;
    type Error = Status;
    type Future = ResponseFuture;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        if self.shared.closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(Status::unavailable("connection closed")));
        }
        if self.slot.is_some() {
            return Poll::Ready(Ok(()));
        }
        match self.slots.poll_acquire(cx) {
            Poll::Ready(Some(p)) => {
                self.slot = Some(p);
                Poll::Ready(Ok(()))
            }
            Poll::Ready(None) => Poll::Ready(Err(Status::unavailable("client closed"))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn call(&mut self, call: Call) -> ResponseFuture {
        let slot = match self
            .check_size(&call.message)
            .and_then(|()| self.take_slot())
        {
            Ok(slot) => slot,
            Err(s) => return ResponseFuture::failed(s),
        };
        let (tx, rx) = oneshot::channel();
        match self.open(
            call.method,
            Some(call.message),
            true,
            call.timeout,
            Reply::Unary(tx),
            None,
        ) {
            Ok((tag, deadline)) => ResponseFuture::new(tag, rx, slot, deadline),
            Err(s) => ResponseFuture::failed(s),
        }
    }
}

impl tower::load::Load for Client {
    type Metric = usize;

    fn load(&self) -> usize {
        self.in_flight()
    }
}

/// The answer to one call; dropping it before the answer cancels the
/// call at the server.
pub struct ResponseFuture {
    tag: u32,
    rx: Option<oneshot::Receiver<Result<Bytes, Status>>>,
    slot: Option<Slot>,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    failed: Option<Status>,
}

impl ResponseFuture {
    fn new(
        tag: u32,
        rx: oneshot::Receiver<Result<Bytes, Status>>,
        slot: Slot,
        deadline: Option<Instant>,
    ) -> ResponseFuture {
        ResponseFuture {
            tag,
            rx: Some(rx),
            slot: Some(slot),
            deadline: deadline.map(|at| Box::pin(tokio::time::sleep_until(at))),
            failed: None,
        }
    }

    fn failed(status: Status) -> ResponseFuture {
        ResponseFuture {
            tag: 0,
            rx: None,
            slot: None,
            deadline: None,
            failed: Some(status),
        }
    }

    fn cancel(&mut self) {
        if self.rx.take().is_some() {
            if let Some(slot) = self.slot.take() {
                let _ = slot.shared.commands.send(Command::Cancel { tag: self.tag });
            }
        }
    }
}

impl Future for ResponseFuture {
    type Output = Result<Bytes, Status>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let Some(s) = this.failed.take() {
            return Poll::Ready(Err(s));
        }
        let Some(rx) = this.rx.as_mut() else {
            return Poll::Ready(Err(Status::internal("polled after completion")));
        };
        if let Poll::Ready(r) = Pin::new(rx).poll(cx) {
            this.rx = None;
            this.slot = None;
            return Poll::Ready(
                r.unwrap_or_else(|_| Err(Status::unavailable("connection closed"))),
            );
        }
        if let Some(d) = this.deadline.as_mut() {
            if d.as_mut().poll(cx).is_ready() {
                this.cancel();
                return Poll::Ready(Err(Status::deadline_exceeded()));
            }
        }
        Poll::Pending
    }
}

impl Drop for ResponseFuture {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// A call as the driver keeps it.
struct Pending {
    reply: Reply,
    credit: Option<Arc<Credit>>,
}

impl Pending {
    fn finish(self, result: Result<Option<Bytes>, Status>) {
        if let Some(c) = &self.credit {
            c.close();
        }
        match (self.reply, result) {
            (Reply::Unary(tx), r) => {
                let _ = tx.send(r.map(Option::unwrap_or_default));
            }
            (Reply::Stream(tx), Ok(Some(m))) => {
                let _ = tx.try_send(Ok(m));
            }
            (Reply::Stream(_), Ok(None)) => {}
            (Reply::Stream(tx), Err(s)) => {
                let _ = tx.try_send(Err(s));
            }
        }
    }
}

/// How long a new connection waits for the server's hello.
const HELLO_TIMEOUT: Duration = Duration::from_secs(10);

/// The client's connection driver: see the module's picture.
async fn drive(
    mut wire: Wire,
    mut commands: mpsc::UnboundedReceiver<Command>,
    closed: Arc<AtomicBool>,
) {
    let mut calls: FxHashMap<u32, Pending> = FxHashMap::default();
    let mut batch = Vec::with_capacity(64);
    let mut open = true;
    // Nothing is sent before the server's hello (see the server's driver),
    // and a server that never says it is given up.
    let mut greeted = false;
    let mut hello_by = Box::pin(tokio::time::sleep(HELLO_TIMEOUT));
    let end = std::future::poll_fn(|cx| loop {
        let mut progress = false;
        if !greeted && hello_by.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Status::unavailable("no hello from the server"));
        }
        if open && greeted && wire.queued() < 256 {
            match commands.poll_recv_many(cx, &mut batch, 64) {
                Poll::Ready(0) => open = false,
                Poll::Ready(_) => {
                    progress = true;
                    for c in batch.drain(..) {
                        command(&mut wire, &mut calls, c);
                    }
                }
                Poll::Pending => {}
            }
        }
        if let Poll::Ready(Err(_)) = wire.poll_send(cx) {
            return Poll::Ready(Status::unavailable("connection failed"));
        }
        loop {
            match wire.poll_frame(cx) {
                Poll::Ready(Some(incoming)) => {
                    progress = true;
                    match frame_in(&mut wire, &mut calls, incoming) {
                        Some(fatal) if fatal.code() == Code::Ok => greeted = true,
                        Some(fatal) => return Poll::Ready(fatal),
                        None => {}
                    }
                }
                Poll::Ready(None) => {
                    return Poll::Ready(Status::unavailable("connection closed by the server"))
                }
                Poll::Pending => break,
            }
        }
        if !open && calls.is_empty() && wire.queued() == 0 {
            return Poll::Ready(Status::unavailable("client closed"));
        }
        if !progress {
            return Poll::Pending;
        }
    })
    .await;
    closed.store(true, Ordering::Release);
    for (_, call) in calls.drain() {
        call.finish(Err(end.clone()));
    }
    // Calls opened after the end fail too.
    commands.close();
    while let Ok(c) = commands.try_recv() {
        if let Command::Open { reply, credit, .. } = c {
            Pending { reply, credit }.finish(Err(end.clone()));
        }
    }
}

fn command(wire: &mut Wire, calls: &mut FxHashMap<u32, Pending>, c: Command) {
    match c {
        Command::Open {
            tag,
            method,
            message,
            end,
            deadline_us,
            reply,
            credit,
        } => {
            let mut flags = if end { Flags::END } else { 0 };
            if message.is_some() {
                flags |= Flags::MESSAGE;
            }
            let head = Head {
                flags,
                deadline_us,
                ..Head::new(Kind::Request, tag)
            };
            wire.queue(&head, &method, &message.unwrap_or_default());
            calls.insert(tag, Pending { reply, credit });
        }
        Command::Message { tag, message, end } => {
            if calls.contains_key(&tag) {
                let mut flags = if end { Flags::END } else { 0 };
                if message.is_some() {
                    flags |= Flags::MESSAGE;
                }
                let head = Head {
                    flags,
                    ..Head::new(Kind::Message, tag)
                };
                wire.queue(&head, b"", &message.unwrap_or_default());
            }
        }
        Command::Credit { tag, n } => {
            if calls.contains_key(&tag) {
                let head = Head {
                    credit: n,
                    ..Head::new(Kind::Credit, tag)
                };
                wire.queue(&head, b"", &Bytes::new());
            }
        }
        Command::Cancel { tag } => {
            if let Some(call) = calls.remove(&tag) {
                wire.queue(&Head::new(Kind::Cancel, tag), b"", &Bytes::new());
                call.finish(Err(Status::cancelled()));
            }
        }
        Command::StreamStart { .. } | Command::Status { .. } => {}
    }
}

/// Handles one incoming frame; `Some` is the connection's status: the
/// server's hello (`Ok`) or its end.
fn frame_in(
    wire: &mut Wire,
    calls: &mut FxHashMap<u32, Pending>,
    incoming: Incoming,
) -> Option<Status> {
    let f = match incoming {
        Incoming::Frame(f) => f,
        Incoming::Oversized { tag, size } => {
            fail(
                wire,
                calls,
                tag,
                Status::resource_exhausted(format!("response of {size} bytes above the limit")),
            );
            return None;
        }
        Incoming::Malformed(e) => {
            let status = Status::internal(format!("malformed frame from the server: {e}"));
            return match e.tag() {
                Some(tag) if calls.contains_key(&tag) => {
                    fail(wire, calls, tag, status);
                    None
                }
                _ => Some(status),
            };
        }
    };
    let tag = f.tag();
    match f.kind() {
        Kind::Status if tag == 0 => {
            let text = String::from_utf8_lossy(&f.payload()).into_owned();
            return Some(Status::new(f.status(), text));
        }
        Kind::Status => {
            if let Some(call) = calls.remove(&tag) {
                let result = match f.status() {
                    Code::Ok => Ok(f.has_message().then(|| f.payload())),
                    code => Err(Status::new(
                        code,
                        String::from_utf8_lossy(&f.payload()).into_owned(),
                    )),
                };
                call.finish(result);
            }
        }
        Kind::Message => {
            let violation = match calls.get(&tag) {
                Some(Pending {
                    reply: Reply::Stream(tx),
                    ..
                }) if f.has_message() => {
                    // One slot stays free for the final status.
                    if tx.capacity() <= 1 {
                        Some(Status::resource_exhausted("the server exceeded its credit"))
                    } else {
                        let _ = tx.try_send(Ok(f.payload()));
                        None
                    }
                }
                Some(Pending {
                    reply: Reply::Unary(_),
                    ..
                }) => Some(Status::internal("a stream answered a unary call")),
                _ => None,
            };
            if let Some(s) = violation {
                fail(wire, calls, tag, s);
            }
        }
        Kind::Credit => {
            if let Some(c) = calls.get(&tag).and_then(|c| c.credit.as_ref()) {
                c.add(f.credit());
            }
        }
        Kind::Request | Kind::Cancel => {
            tracing::debug!(tag, kind = ?f.kind(), "a server sent a client's frame");
        }
    }
    None
}

/// Ends call `tag` here with `status` and tells the server to drop it.
fn fail(wire: &mut Wire, calls: &mut FxHashMap<u32, Pending>, tag: u32, status: Status) {
    if let Some(call) = calls.remove(&tag) {
        wire.queue(&Head::new(Kind::Cancel, tag), b"", &Bytes::new());
        call.finish(Err(status));
    }
}

/// Opens [`Client`]s by UID: a `Service<Uid>` (to a fixed port) and a
/// `Service<Endpoint>`, so tower's `reconnect` and `balance` compose.
#[derive(Clone)]
pub struct Connector {
    session: Arc<Session>,
    port: u16,
    options: ClientOptions,
}

impl Connector {
    /// Opens connections from `session`; a `Uid` target means port
    /// `port` of that resource.
    pub fn new(session: Arc<Session>, port: u16, options: ClientOptions) -> Connector {
        Connector {
            session,
            port,
            options,
        }
    }
}

type ConnectFuture = Pin<Box<dyn Future<Output = Result<Client, Status>> + Send>>;

/// Why a connection could not be opened, as a status: the daemon's ACL
/// refusing it is `PermissionDenied`, anything else `Unavailable`.
fn connect_error(to: Endpoint, e: ClientError) -> Status {
    let code = match &e {
        ClientError::Daemon { kind, .. } if kind == "denied" => Code::PermissionDenied,
        _ => Code::Unavailable,
    };
    Status::new(code, format!("connecting to {to}: {e}"))
}

impl Service<Endpoint> for Connector {
    type Response = Client;
    type Error = Status;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, to: Endpoint) -> ConnectFuture {
        let session = self.session.clone();
        let options = self.options;
        Box::pin(async move {
            let conn = session
                .connect(to)
                .await
                .map_err(|e| connect_error(to, e))?;
            Ok(Client::new(conn, options))
        })
    }
}

impl Service<Uid> for Connector {
    type Response = Client;
    type Error = Status;
    type Future = ConnectFuture;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, to: Uid) -> ConnectFuture {
        let port = self.port;
        Service::<Endpoint>::call(self, to.port(port))
    }
}
