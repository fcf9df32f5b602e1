//! [`serve`]: accepts connections on a uniplane [`Listener`] and drives a
//! tower [`Service`] per connection.
//!
//! ```text
//!  Listener ─► connection driver (one task per connection)
//!               frames in ─► REQUEST: ServerCall ─► service.call ─► call task ─┐
//!                            MESSAGE/CREDIT/CANCEL ─► the call by tag         │
//!               frames out ◄── commands (status, messages, credit) ◄──────────┘
//! ```
//!
//! A connection's calls run as futures inside its driver task (no task
//! spawned per call), at most [`ServerOptions::max_concurrent_calls`] at
//! once; requests beyond wait in a queue of the same length, and beyond
//! that are refused with `ResourceExhausted`. Each call future is dropped
//! when its caller cancels, when its deadline passes (the caller is told
//! `DeadlineExceeded`) or when the connection ends. On shutdown, new
//! requests are refused with `Unavailable` and the calls in flight finish
//! before the connection closes.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use futures_util::stream::FuturesUnordered;
use futures_util::StreamExt;
use rustc_hash::FxHashMap;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::Service;
use uniplane_client::Listener;
use uniplane_dataplane::Endpoint;

use crate::frame::{Flags, Frame, Head, Kind};
use crate::status::{Code, Status};
use crate::stream::{Command, Commands, Credit, Streaming, WINDOW};
use crate::wire::{Incoming, Wire};

/// Limits of a server, per connection.
#[derive(Clone, Copy, Debug)]
pub struct ServerOptions {
    /// Calls running at once on one connection.
    pub max_concurrent_calls: usize,
    /// Largest request message.
    pub max_message: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            max_concurrent_calls: 256,
            max_message: 4 << 20,
        }
    }
}

/// A call as the server's service sees it: method, deadline, the
/// caller's UID and its request message(s).
pub struct ServerCall {
    method: Bytes,
    deadline: Option<Instant>,
    peer: Endpoint,
    body: Body,
}

enum Body {
    One(Option<Bytes>),
    Stream(Streaming),
}

impl ServerCall {
    /// The method called.
    pub fn method(&self) -> &str {
        std::str::from_utf8(&self.method).unwrap_or_default()
    }

    /// When the caller stops waiting (the server drops the call then).
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The caller's end of the connection: its overlay source UID and
    /// port, as the daemon installed the connection — authenticated by
    /// the daemon, so a service may authorize by it.
    pub fn peer(&self) -> Endpoint {
        self.peer
    }

    /// The next request message; `None` after the last.
    pub async fn message(&mut self) -> Option<Result<Bytes, Status>> {
        match &mut self.body {
            Body::One(m) => m.take().map(Ok),
            Body::Stream(s) => s.message().await,
        }
    }

    /// The one request message of a unary call.
    pub async fn into_message(mut self) -> Result<Bytes, Status> {
        match self.message().await {
            Some(r) => r,
            None => Err(Status::new(Code::InvalidArgument, "no request message")),
        }
    }

    /// The request messages as a stream.
    pub fn into_stream(self) -> impl Stream<Item = Result<Bytes, Status>> + Send {
        futures_util::stream::unfold(self, |mut call| async move {
            call.message().await.map(|m| (m, call))
        })
    }
}

/// A service's answer: one message, or a stream of them (which may end
/// with an error).
pub enum Reply {
    /// One response message.
    Unary(Bytes),
    /// Response messages, sent as the caller's credit allows.
    Stream(Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>),
}

impl Reply {
    /// A streamed reply.
    pub fn stream(s: impl Stream<Item = Result<Bytes, Status>> + Send + 'static) -> Reply {
        Reply::Stream(Box::pin(s))
    }
}

/// A running server: [`Server::shutdown`] stops it gracefully.
pub struct Server {
    shutdown: CancellationToken,
    done: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops accepting connections and calls, lets the calls in flight
    /// finish (at most `grace`, then drops them) and waits for the end.
    pub async fn shutdown(self, grace: Duration) {
        self.shutdown.cancel();
        let abort = self.done.abort_handle();
        if tokio::time::timeout(grace, self.done).await.is_err() {
            abort.abort();
        }
    }

    /// A token that shuts the server down when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// Serves `listener` in a spawned task: each accepted connection gets
/// the service `make_service` makes for its caller.
pub fn spawn<M, S>(listener: Listener, make_service: M, options: ServerOptions) -> Server
where
    M: FnMut(Endpoint) -> S + Send + 'static,
    S: Service<ServerCall, Response = Reply> + Send + 'static,
    S::Error: Into<Status> + Send + 'static,
    S::Future: Send + 'static,
{
    let shutdown = CancellationToken::new();
    let done = tokio::spawn(serve(listener, make_service, options, shutdown.clone()));
    Server { shutdown, done }
}

/// Serves `listener` until it ends or `shutdown` is cancelled; then lets
/// every connection finish its calls in flight and returns.
pub async fn serve<M, S>(
    mut listener: Listener,
    mut make_service: M,
    options: ServerOptions,
    shutdown: CancellationToken,
) where
    M: FnMut(Endpoint) -> S,
    S: Service<ServerCall, Response = Reply> + Send + 'static,
    S::Error: Into<Status> + Send + 'static,
    S::Future: Send + 'static,
{
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            conn = listener.accept() => match conn {
                Some(conn) => {
                    let svc = make_service(conn.remote());
                    let wire = Wire::new(conn, options.max_message);
                    connections.spawn(drive(wire, svc, options, shutdown.clone()));
                }
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// A call as the driver keeps it.
struct Entry {
    cancel: CancellationToken,
    inbound: Option<mpsc::Sender<Result<Bytes, Status>>>,
    credit: Option<Arc<Credit>>,
}

impl Entry {
    fn end(self) {
        self.cancel.cancel();
        if let Some(c) = self.credit {
            c.close();
        }
    }
}

type Task = Pin<Box<dyn Future<Output = u32> + Send>>;

struct Conn<S> {
    svc: S,
    wire: Wire,
    peer: Endpoint,
    calls: FxHashMap<u32, Entry>,
    waiting: VecDeque<(u32, ServerCall)>,
    tasks: FuturesUnordered<Task>,
    commands: Commands,
    options: ServerOptions,
    draining: bool,
    /// A connection-level error was sent: close once it is out.
    fatal: bool,
}

async fn drive<S>(wire: Wire, svc: S, options: ServerOptions, shutdown: CancellationToken)
where
    S: Service<ServerCall, Response = Reply>,
    S::Error: Into<Status> + Send + 'static,
    S::Future: Send + 'static,
{
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut c = Conn {
        peer: wire.remote(),
        svc,
        wire,
        calls: FxHashMap::default(),
        waiting: VecDeque::new(),
        tasks: FuturesUnordered::new(),
        commands: tx,
        options,
        draining: false,
        fatal: false,
    };
    // The hello: the caller sends nothing before it, so no request can
    // reach this session before the daemon's notice of the connection
    // did (the notice travels apart from the data). It is sent once: the
    // caller's daemon admits the connection before this one hears of it,
    // across servers too.
    c.wire
        .queue(&Head::new(Kind::Status, 0), b"", &Bytes::new());
    let mut batch = Vec::with_capacity(64);
    let mut stop = std::pin::pin!(shutdown.cancelled_owned());
    let mut linger: Option<Pin<Box<tokio::time::Sleep>>> = None;
    std::future::poll_fn(|cx| loop {
        let mut progress = false;
        if let Some(l) = linger.as_mut() {
            // Closing: the last frames go out, then wait (a while) for
            // the caller to close, so the close cannot overtake them.
            if let Poll::Ready(Err(_)) = c.wire.poll_send(cx) {
                return Poll::Ready(());
            }
            loop {
                match c.wire.poll_frame(cx) {
                    Poll::Ready(Some(_)) => {}
                    Poll::Ready(None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            return l.as_mut().poll(cx);
        }
        if !c.draining && stop.as_mut().poll(cx).is_ready() {
            c.draining = true;
            progress = true;
        }
        // Calls: run them; a finished one leaves.
        while let Poll::Ready(Some(tag)) = c.tasks.poll_next_unpin(cx) {
            progress = true;
            if let Some(e) = c.calls.remove(&tag) {
                e.end();
            }
        }
        if c.start_waiting(cx) {
            progress = true;
        }
        // What calls want sent.
        if c.wire.queued() < 256 {
            if let Poll::Ready(n) = rx.poll_recv_many(cx, &mut batch, 64) {
                progress |= n > 0;
                for cmd in batch.drain(..) {
                    c.command(cmd);
                }
            }
        }
        if let Poll::Ready(Err(_)) = c.wire.poll_send(cx) {
            return Poll::Ready(());
        }
        if !c.fatal {
            loop {
                match c.wire.poll_frame(cx) {
                    Poll::Ready(Some(incoming)) => {
                        progress = true;
                        c.frame_in(incoming);
                        // A call starts as soon as it comes while there
                        // is room: the call limit counts the calls that
                        // wait for a slot, not those read in one burst.
                        if !c.waiting.is_empty() {
                            c.start_waiting(cx);
                        }
                    }
                    Poll::Ready(None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
        }
        let drained = c.draining && c.tasks.is_empty() && c.waiting.is_empty();
        if c.fatal || drained {
            if drained {
                c.status(0, &Status::unavailable("the server shut down"));
            }
            c.tasks = FuturesUnordered::new();
            for (_, e) in c.calls.drain() {
                e.end();
            }
            linger = Some(Box::pin(tokio::time::sleep(LINGER)));
            continue;
        }
        if !progress {
            return Poll::Pending;
        }
    })
    .await;
    // Whatever is left is dropped: its callers learn from the close.
    for (_, e) in c.calls.drain() {
        e.end();
    }
}

/// How long a closing connection waits for its caller to close it.
const LINGER: Duration = Duration::from_secs(2);

impl<S> Conn<S>
where
    S: Service<ServerCall, Response = Reply>,
    S::Error: Into<Status> + Send + 'static,
    S::Future: Send + 'static,
{
    fn status(&mut self, tag: u32, status: &Status) {
        let head = Head {
            status: status.code(),
            ..Head::new(Kind::Status, tag)
        };
        self.wire.queue(
            &head,
            b"",
            &Bytes::copy_from_slice(status.message().as_bytes()),
        );
    }

    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Status { tag, result } => match result {
                Ok(message) => {
                    let flags = if message.is_some() { Flags::MESSAGE } else { 0 };
                    let head = Head {
                        flags,
                        ..Head::new(Kind::Status, tag)
                    };
                    self.wire.queue(&head, b"", &message.unwrap_or_default());
                }
                Err(s) => self.status(tag, &s),
            },
            Command::Message { tag, message, end } => {
                let mut flags = if end { Flags::END } else { 0 };
                if message.is_some() {
                    flags |= Flags::MESSAGE;
                }
                let head = Head {
                    flags,
                    ..Head::new(Kind::Message, tag)
                };
                self.wire.queue(&head, b"", &message.unwrap_or_default());
            }
            Command::Credit { tag, n } => {
                if self.calls.contains_key(&tag) {
                    let head = Head {
                        credit: n,
                        ..Head::new(Kind::Credit, tag)
                    };
                    self.wire.queue(&head, b"", &Bytes::new());
                }
            }
            Command::StreamStart { tag, credit } => match self.calls.get_mut(&tag) {
                Some(e) => e.credit = Some(credit),
                None => credit.close(),
            },
            Command::Open { .. } | Command::Cancel { .. } => {}
        }
    }

    /// Starts waiting calls while there is room and the service is ready.
    fn start_waiting(&mut self, cx: &mut Context<'_>) -> bool {
        let mut started = false;
        while self.tasks.len() < self.options.max_concurrent_calls {
            let Some((tag, _)) = self.waiting.front() else {
                break;
            };
            let tag = *tag;
            match self.svc.poll_ready(cx) {
                Poll::Pending => break,
                Poll::Ready(Err(e)) => {
                    self.waiting.pop_front();
                    if let Some(e) = self.calls.remove(&tag) {
                        e.end();
                    }
                    let status = e.into();
                    self.status(tag, &status);
                    started = true;
                }
                Poll::Ready(Ok(())) => {
                    let Some((tag, call)) = self.waiting.pop_front() else {
                        break;
                    };
                    self.start(tag, call);
                    started = true;
                }
            }
        }
        started
    }

    fn start(&mut self, tag: u32, call: ServerCall) {
        let Some(entry) = self.calls.get(&tag) else {
            return;
        };
        let cancel = entry.cancel.clone();
        let deadline = call.deadline;
        let work = self.svc.call(call);
        let commands = self.commands.clone();
        self.tasks.push(Box::pin(async move {
            let run = respond(tag, work, commands.clone());
            tokio::select! {
                biased;
                _ = cancel.cancelled() => {}
                finished = maybe_until(deadline, run) => {
                    if finished.is_none() {
                        let _ = commands.send(Command::Status {
                            tag,
                            result: Err(Status::deadline_exceeded()),
                        });
                    }
                }
            }
            tag
        }));
    }

    fn frame_in(&mut self, incoming: Incoming) {
        let f = match incoming {
            Incoming::Frame(f) => f,
            Incoming::Oversized { tag, size } => {
                if let Some(e) = self.calls.remove(&tag) {
                    e.end();
                }
                let s = Status::resource_exhausted(format!(
                    "a message of {size} bytes is above the limit of {}",
                    self.options.max_message
                ));
                self.status(tag, &s);
                return;
            }
            Incoming::Malformed(e) => {
                let s = Status::internal(format!("malformed frame: {e}"));
                match e.tag() {
                    Some(tag) if tag != 0 => {
                        if let Some(e) = self.calls.remove(&tag) {
                            e.end();
                        }
                        self.status(tag, &s);
                    }
                    // No call to blame: the connection is broken.
                    _ => {
                        self.status(0, &s);
                        self.fatal = true;
                    }
                }
                return;
            }
        };
        let tag = f.tag();
        match f.kind() {
            Kind::Request => self.request(f),
            Kind::Message => {
                let violation = match self.calls.get_mut(&tag) {
                    Some(e) => {
                        let mut violation = None;
                        if let Some(tx) = &e.inbound {
                            if f.has_message() {
                                if f.payload().len() > self.options.max_message {
                                    violation = Some(Status::resource_exhausted(
                                        "a message above the limit",
                                    ));
                                } else if tx.capacity() <= 1 {
                                    violation = Some(Status::resource_exhausted(
                                        "the caller exceeded its credit",
                                    ));
                                } else {
                                    let _ = tx.try_send(Ok(f.payload()));
                                }
                            }
                        }
                        if f.is_end() {
                            e.inbound = None;
                        }
                        violation
                    }
                    None => None,
                };
                if let Some(s) = violation {
                    if let Some(e) = self.calls.remove(&tag) {
                        e.end();
                    }
                    self.status(tag, &s);
                }
            }
            Kind::Cancel => {
                if let Some(e) = self.calls.remove(&tag) {
                    e.end();
                    self.waiting.retain(|(t, _)| *t != tag);
                }
            }
            Kind::Credit => {
                if let Some(c) = self.calls.get(&tag).and_then(|e| e.credit.as_ref()) {
                    c.add(f.credit());
                }
            }
            Kind::Status => {
                tracing::debug!(tag, "a client sent a STATUS frame");
            }
        }
    }

    fn request(&mut self, f: Frame) {
        let tag = f.tag();
        if self.draining {
            self.status(tag, &Status::unavailable("the server is shutting down"));
            return;
        }
        if self.calls.contains_key(&tag) {
            self.status(tag, &Status::internal("a call with this tag is open"));
            return;
        }
        if self.waiting.len() >= self.options.max_concurrent_calls {
            self.status(
                tag,
                &Status::resource_exhausted("the server's connection is at its call limit"),
            );
            return;
        }
        if f.payload().len() > self.options.max_message {
            let s = Status::resource_exhausted(format!(
                "a message of {} bytes is above the limit of {}",
                f.payload().len(),
                self.options.max_message
            ));
            self.status(tag, &s);
            return;
        }
        let message = f.has_message().then(|| f.payload());
        let (body, inbound) = if f.is_end() {
            (Body::One(message), None)
        } else {
            let (tx, rx) = mpsc::channel(WINDOW as usize + 1);
            if let Some(m) = message {
                let _ = tx.try_send(Ok(m));
            }
            (
                Body::Stream(Streaming::new(tag, rx, self.commands.clone(), false)),
                Some(tx),
            )
        };
        let deadline = match f.deadline_us() {
            0 => None,
            us => Some(Instant::now() + Duration::from_micros(us as u64)),
        };
        self.calls.insert(
            tag,
            Entry {
                cancel: CancellationToken::new(),
                inbound,
                credit: None,
            },
        );
        let call = ServerCall {
            method: f.method_bytes(),
            deadline,
            peer: self.peer,
            body,
        };
        self.waiting.push_back((tag, call));
    }
}

/// Runs `fut`, until `deadline` if there is one; `None` when it passed.
async fn maybe_until<F: Future>(deadline: Option<Instant>, fut: F) -> Option<F::Output> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, fut).await.ok(),
        None => Some(fut.await),
    }
}

/// Awaits the service's answer and sends it: one STATUS, or MESSAGEs as
/// credit allows and then a STATUS.
async fn respond<F, E>(tag: u32, work: F, commands: Commands)
where
    F: Future<Output = Result<Reply, E>>,
    E: Into<Status>,
{
    let result = match work.await {
        Ok(Reply::Unary(m)) => Ok(Some(m)),
        Ok(Reply::Stream(mut s)) => {
            let credit = Credit::new();
            let _ = commands.send(Command::StreamStart {
                tag,
                credit: credit.clone(),
            });
            loop {
                match s.next().await {
                    Some(Ok(m)) => {
                        if std::future::poll_fn(|cx| credit.poll_take(cx))
                            .await
                            .is_err()
                        {
                            return;
                        }
                        let _ = commands.send(Command::Message {
                            tag,
                            message: Some(m),
                            end: false,
                        });
                    }
                    Some(Err(e)) => break Err(e),
                    None => break Ok(None),
                }
            }
        }
        Err(e) => Err(e.into()),
    };
    let _ = commands.send(Command::Status { tag, result });
}
