//! The client library: what an application links to use uniplane.
//!
//! ```text
//!  application                         uniplaned
//!  ───────────                         ─────────
//!  Client ── control socket (JSON) ──► attach, listen, connect, close, status…
//!  Session ─ data path (messages) ───► its own engine port
//!     ├─ Connection (Link) ─┐
//!     ├─ Connection (Link) ─┼─ one writer, one dispatcher by (port, peer)
//!     └─ write / read ──────┘
//! ```
//!
//! Control requests go over the daemon's Unix control socket; data never
//! does: after `attach`, the session opens the data path and every
//! connection's messages, one-sided writes and reads travel on it, into the
//! session's port of the daemon's engine. An embedded mode runs a daemon
//! inside the application ([`embedded`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::{Sink, SinkExt, Stream};
use std::collections::VecDeque;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::PollSender;
use uniplane_dataplane::wire::{ParamForm, ReqType, Status};
use uniplane_dataplane::{Endpoint, Link, LinkError, MemoryAddress, Message, Uid};

use crate::control::{Answer, Attached, ConnSpec, Request};
use crate::daemon::{runtime_dir, CONTROL_SOCKET};

/// Why a client call failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The daemon could not be reached.
    #[error("cannot reach uniplaned at {path}: {source}")]
    Unreachable {
        /// The socket tried.
        path: String,
        /// What the system said.
        source: std::io::Error,
    },
    /// The daemon answered with an error.
    #[error("{kind}: {message}")]
    Daemon {
        /// Machine-readable kind.
        kind: String,
        /// What happened.
        message: String,
    },
    /// The daemon's answer made no sense.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The data path failed.
    #[error("data path: {0}")]
    Link(#[from] LinkError),
    /// An operation got an error completion.
    #[error("request failed: {0:?}")]
    Status(Status),
    /// No answer came in time.
    #[error("timed out")]
    Timeout,
}

/// A connection to the daemon's control socket.
pub struct Client {
    reader: tokio::sync::Mutex<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>,
    runtime: PathBuf,
}

impl Client {
    /// Connects to the daemon of the default runtime directory
    /// (`UNIPLANE_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/uniplane`, else
    /// `/tmp/uniplane-$UID`).
    pub async fn connect_default() -> Result<Client, ClientError> {
        Client::connect(&runtime_dir(None)).await
    }

    /// Connects to the daemon whose sockets are in `runtime`.
    pub async fn connect(runtime: &Path) -> Result<Client, ClientError> {
        let path = runtime.join(CONTROL_SOCKET);
        let stream =
            UnixStream::connect(&path)
                .await
                .map_err(|source| ClientError::Unreachable {
                    path: path.display().to_string(),
                    source,
                })?;
        let (r, w) = stream.into_split();
        Ok(Client {
            reader: tokio::sync::Mutex::new((BufReader::new(r), w)),
            runtime: runtime.to_owned(),
        })
    }

    /// Sends one control request and returns its result.
    pub async fn request(&self, req: &Request) -> Result<serde_json::Value, ClientError> {
        let mut line = serde_json::to_vec(req).map_err(|e| ClientError::Protocol(e.to_string()))?;
        line.push(b'\n');
        let mut guard = self.reader.lock().await;
        let (reader, writer) = &mut *guard;
        writer
            .write_all(&line)
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut answer = String::new();
        let n = reader
            .read_line(&mut answer)
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        if n == 0 {
            return Err(ClientError::Protocol(
                "the daemon closed the control socket".into(),
            ));
        }
        let a: Answer =
            serde_json::from_str(&answer).map_err(|e| ClientError::Protocol(e.to_string()))?;
        match (a.ok, a.result, a.error) {
            (true, Some(r), _) => Ok(r),
            (true, None, _) => Ok(serde_json::Value::Null),
            (false, _, Some(e)) => Err(ClientError::Daemon {
                kind: e.kind,
                message: e.message,
            }),
            (false, _, None) => Err(ClientError::Protocol("error without a body".into())),
        }
    }

    /// Registers this process as a resource named `name` and opens its
    /// data path. The resource lives as long as the session.
    pub async fn attach(self, name: &str) -> Result<Session, ClientError> {
        let v = self.request(&Request::Attach { name: name.into() }).await?;
        let attached: Attached =
            serde_json::from_value(v).map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut data = UnixStream::connect(&attached.data_socket)
            .await
            .map_err(|source| ClientError::Unreachable {
                path: attached.data_socket.clone(),
                source,
            })?;
        data.write_all(&attached.token.to_le_bytes())
            .await
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let mut ok = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(5), data.read_exact(&mut ok))
            .await
            .map_err(|_| ClientError::Timeout)?
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        let link = uniplane_shm::ShmLink::join(data, &uniplane_shm::ShmConfig::default())
            .await
            .map_err(|e| ClientError::Protocol(format!("data path: {e}")))?;
        let (out_tx, out_rx) = mpsc::channel::<Message>(1024);
        let shared = Arc::new(Dispatch {
            uid: attached.uid,
            daemon: attached.daemon,
            routes: Mutex::new(Routes::default()),
            out: out_tx.clone(),
        });
        tokio::spawn(data_path(link, out_rx, shared.clone()));
        Ok(Session {
            client: self,
            shared,
            out: out_tx,
            next_port: AtomicU16::new(49152),
            next_seq: AtomicU32::new(1),
        })
    }

    /// The runtime directory of the daemon.
    pub fn runtime_dir(&self) -> &Path {
        &self.runtime
    }
}

/// Where received messages go.
#[derive(Default)]
struct Routes {
    /// (local port, remote UID, remote port) → connection inbox.
    conns: HashMap<(u16, Uid, u16), mpsc::Sender<Result<Message, LinkError>>>,
    /// Listening port → accept queue.
    listeners: HashMap<u16, mpsc::Sender<Connection>>,
    /// Sequence number → waiter for a one-sided answer.
    pending: HashMap<u32, oneshot::Sender<Message>>,
}

struct Dispatch {
    uid: Uid,
    daemon: Uid,
    routes: Mutex<Routes>,
    /// The data path's writer queue.
    out: mpsc::Sender<Message>,
}

impl Dispatch {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Moves the session's messages both ways over its data path, in one
/// task so neither direction can starve the other: receiving never waits
/// for sending. A connection whose inbox is full holds the receive side
/// (backpressure, not loss) until it has room.
async fn data_path<L: Link>(mut link: L, mut out: mpsc::Receiver<Message>, d: Arc<Dispatch>) {
    let mut inbound: VecDeque<Message> = VecDeque::with_capacity(64);
    let mut recv_buf: Vec<Message> = Vec::with_capacity(64);
    let mut outbound: VecDeque<Message> = VecDeque::with_capacity(64);
    let mut send_buf: Vec<Message> = Vec::with_capacity(64);
    let mut stalled: Option<Stalled> = None;
    let mut out_open = true;
    std::future::poll_fn(|cx| loop {
        let mut progress = false;
        // A message waiting for room in its connection's inbox.
        if let Some(st) = stalled.as_mut() {
            match st.permit.as_mut().poll(cx) {
                Poll::Ready(Ok(permit)) => {
                    if let Some(m) = st.message.take() {
                        permit.send(m);
                    }
                    stalled = None;
                    progress = true;
                }
                // The connection is gone; its message has nowhere to go.
                Poll::Ready(Err(_)) => {
                    stalled = None;
                    progress = true;
                }
                Poll::Pending => {}
            }
        }
        if stalled.is_none() {
            while let Some(m) = inbound.pop_front() {
                if let Some(st) = dispatch(&d, m) {
                    stalled = Some(st);
                    break;
                }
                progress = true;
            }
            if inbound.is_empty() && stalled.is_none() {
                match link.poll_recv_batch(cx, &mut recv_buf, 64) {
                    Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Ready(Ok(_)) => {
                        inbound.extend(recv_buf.drain(..));
                        progress = true;
                    }
                    Poll::Pending => {}
                }
            }
        }
        if outbound.is_empty() && out_open {
            match out.poll_recv_many(cx, &mut send_buf, 64) {
                Poll::Ready(0) => out_open = false,
                Poll::Ready(_) => {
                    outbound.extend(send_buf.drain(..));
                    progress = true;
                }
                Poll::Pending => {}
            }
        }
        if !outbound.is_empty() {
            let before = outbound.len();
            match link.poll_send_batch(cx, &mut outbound) {
                Poll::Ready(Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(())) | Poll::Pending => {}
            }
            if outbound.len() < before {
                progress = true;
                if let Poll::Ready(Err(_)) = Pin::new(&mut link).poll_flush(cx) {
                    return Poll::Ready(());
                }
            }
        }
        if !progress {
            return Poll::Pending;
        }
    })
    .await;
    // The data path is gone: every connection ends.
    let mut r = d.routes();
    r.conns.clear();
    r.listeners.clear();
    r.pending.clear();
}

type PermitFuture = Pin<
    Box<
        dyn std::future::Future<
                Output = Result<
                    mpsc::OwnedPermit<Result<Message, LinkError>>,
                    mpsc::error::SendError<()>,
                >,
            > + Send,
    >,
>;

/// A received message waiting for room in a full inbox.
struct Stalled {
    message: Option<Result<Message, LinkError>>,
    permit: PermitFuture,
}

/// Delivers one received message; `Some` when its inbox is full.
fn dispatch(d: &Arc<Dispatch>, m: Message) -> Option<Stalled> {
    let h = *m.header();
    // Notices from the daemon: a connection arrived, or one is gone.
    if h.src == d.daemon
        && matches!(
            h.request.kind(),
            ReqType::Connect | ReqType::Close | ReqType::Notify
        )
    {
        handle_notice(d, m);
        return None;
    }
    match h.request.kind().form() {
        ParamForm::Port => {
            let (src_port, dst_port) = h.request.ports()?;
            let inbox = d
                .routes()
                .conns
                .get(&(dst_port, h.src, src_port))
                .cloned()?;
            let item = if h.flags.contains(uniplane_dataplane::wire::MsgFlags::ERROR) {
                Err(LinkError::PeerFailed(format!("{:?}", h.status())))
            } else if h.request.kind().is_answer() {
                return None;
            } else {
                Ok(m)
            };
            match inbox.try_send(item) {
                Ok(()) => None,
                Err(mpsc::error::TrySendError::Full(item)) => Some(Stalled {
                    message: Some(item),
                    permit: Box::pin(inbox.reserve_owned()),
                }),
                Err(mpsc::error::TrySendError::Closed(_)) => None,
            }
        }
        _ => {
            let waiter = d.routes().pending.remove(&h.seqnum);
            if let Some(w) = waiter {
                let _ = w.send(m);
            }
            None
        }
    }
}

fn handle_notice(d: &Arc<Dispatch>, m: Message) {
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
            let listener = d.routes().listeners.get(&local).cloned();
            if let Some(l) = listener {
                let conn = Connection::register(d, local, remote, rport);
                let _ = l.try_send(conn);
            }
        }
        ReqType::Close | ReqType::Notify => {
            let (_, dst_port) = h.request.ports().unwrap_or((0, 0));
            let key = parsed;
            let mut routes = d.routes();
            let keys: Vec<(u16, Uid, u16)> = match key {
                Some(k) => vec![k],
                None => routes
                    .conns
                    .keys()
                    .filter(|k| k.0 == dst_port)
                    .copied()
                    .collect(),
            };
            for k in keys {
                if let Some(inbox) = routes.conns.remove(&k) {
                    if h.status() != Status::Ok && h.status() != Status::Closed {
                        let _ =
                            inbox.try_send(Err(LinkError::PeerFailed(format!("{:?}", h.status()))));
                    }
                }
            }
        }
        _ => {}
    }
}

/// An attached application: its UID, its connections and one-sided
/// operations.
pub struct Session {
    client: Client,
    shared: Arc<Dispatch>,
    out: mpsc::Sender<Message>,
    next_port: AtomicU16,
    next_seq: AtomicU32,
}

impl Session {
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

    /// Accepts connections to `port`.
    pub async fn listen(&self, port: u16) -> Result<Listener, ClientError> {
        let (tx, rx) = mpsc::channel(64);
        self.shared.routes().listeners.insert(port, tx);
        if let Err(e) = self.client.request(&Request::Listen { port }).await {
            self.shared.routes().listeners.remove(&port);
            return Err(e);
        }
        Ok(Listener { port, rx })
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
                self.shared
                    .routes()
                    .conns
                    .remove(&(local, dst.uid, dst.port));
                Err(e)
            }
        }
    }

    /// Closes a connection: the daemon removes its entries and tells the
    /// far end.
    pub async fn close(&self, conn: Connection) -> Result<(), ClientError> {
        let spec = ConnSpec {
            src: self.shared.uid,
            src_port: conn.local_port,
            dst: conn.remote.uid,
            dst_port: conn.remote.port,
        };
        self.shared
            .routes()
            .conns
            .remove(&(conn.local_port, conn.remote.uid, conn.remote.port));
        self.client
            .request(&Request::Close { conn: spec })
            .await
            .map(drop)
    }

    async fn one_sided(&self, m: Message) -> Result<Message, ClientError> {
        let seq = m.header().seqnum;
        let (tx, rx) = oneshot::channel();
        self.shared.routes().pending.insert(seq, tx);
        if self.out.send(m).await.is_err() {
            self.shared.routes().pending.remove(&seq);
            return Err(ClientError::Link(LinkError::Closed));
        }
        let answer = tokio::time::timeout(Duration::from_secs(5), rx).await;
        self.shared.routes().pending.remove(&seq);
        let answer = answer
            .map_err(|_| ClientError::Timeout)?
            .map_err(|_| ClientError::Link(LinkError::Closed))?;
        match answer.header().status() {
            Status::Ok => Ok(answer),
            s => Err(ClientError::Status(s)),
        }
    }

    /// Writes `data` at `dst` and waits for the completion.
    pub async fn write(&self, dst: MemoryAddress, data: Bytes) -> Result<(), ClientError> {
        let mut m = Message::write(self.shared.uid, dst, data)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        m.set_seqnum(self.next_seq.fetch_add(1, Ordering::Relaxed));
        self.one_sided(m).await.map(drop)
    }

    /// Reads `len` bytes at `src`.
    pub async fn read(&self, src: MemoryAddress, len: u16) -> Result<Bytes, ClientError> {
        let mut m = Message::read(self.shared.uid.at(0), src, len)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        m.set_seqnum(self.next_seq.fetch_add(1, Ordering::Relaxed));
        let answer = self.one_sided(m).await?;
        Ok(answer.payload().clone())
    }
}

/// Connections arriving at a listening port.
pub struct Listener {
    port: u16,
    rx: mpsc::Receiver<Connection>,
}

impl Listener {
    /// The port listened on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The next connection, or `None` when the session ended.
    pub async fn accept(&mut self) -> Option<Connection> {
        self.rx.recv().await
    }
}

/// One connection: a [`Link`] whose stream yields the far end's messages
/// and whose sink sends messages built with [`Connection::message`].
pub struct Connection {
    local: Endpoint,
    local_port: u16,
    remote: Endpoint,
    inbox: mpsc::Receiver<Result<Message, LinkError>>,
    out: Option<PollSender<Message>>,
    seq: u32,
}

impl Connection {
    fn register(d: &Arc<Dispatch>, local_port: u16, remote: Uid, remote_port: u16) -> Connection {
        let (tx, rx) = mpsc::channel(1024);
        d.routes()
            .conns
            .insert((local_port, remote, remote_port), tx);
        Connection {
            local: d.uid.port(local_port),
            local_port,
            remote: remote.port(remote_port),
            inbox: rx,
            out: Some(PollSender::new(d.out.clone())),
            seq: 0,
        }
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

    /// Sends `payload` and flushes.
    pub async fn send_bytes(&mut self, payload: Bytes) -> Result<(), LinkError> {
        let m = self.message(payload)?;
        self.send(m).await
    }

    /// The next message from the far end; `None` once the connection closed.
    pub async fn recv(&mut self) -> Option<Result<Message, LinkError>> {
        self.inbox.recv().await
    }
}

impl Stream for Connection {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().inbox.poll_recv(cx)
    }
}

impl Sink<Message> for Connection {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        match self.get_mut().out.as_mut() {
            Some(o) => o.poll_reserve(cx).map_err(|_| LinkError::Closed),
            None => Poll::Ready(Err(LinkError::Closed)),
        }
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        match self.get_mut().out.as_mut() {
            Some(o) => o.send_item(item).map_err(|_| LinkError::Closed),
            None => Err(LinkError::Closed),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if let Some(o) = self.get_mut().out.as_mut() {
            o.close();
        }
        Poll::Ready(Ok(()))
    }
}

impl Link for Connection {}

/// Runs a daemon inside this process (its sockets in `runtime`) and
/// returns it with a client connected to it: uniplane without a separate
/// daemon.
pub async fn embedded(
    mut config: crate::Config,
    runtime: &Path,
) -> Result<(crate::Daemon, Client), ClientError> {
    config.runtime_dir = Some(runtime.to_owned());
    let daemon = crate::Daemon::start(config)
        .await
        .map_err(|e| ClientError::Daemon {
            kind: "start".into(),
            message: e.to_string(),
        })?;
    let client = Client::connect(daemon.runtime_dir()).await?;
    Ok((daemon, client))
}
