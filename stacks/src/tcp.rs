//! The `tcp` stack: overlay messages framed on TCP streams.
//!
//! Reliable and ordered, as TCP is. Messages are framed by their own header
//! ([`MessageCodec`]); Nagle is off (`TCP_NODELAY`) since the link does its
//! own coalescing: messages accepted by `start_send` collect in a write
//! queue (small ones copied into one buffer, large payloads kept by
//! reference) and leave in one vectored `writev` per burst, on
//! `poll_flush` or when the queue passes [`TcpConfig::coalesce_bytes`]. A
//! queue at that size makes `poll_ready` return `Pending` until the kernel
//! takes bytes, so a slow receiver pushes back on the sender through TCP's
//! own window. Received messages are slices of one large read buffer.
//!
//! A stream cannot skip garbage: a malformed header fails the link with
//! [`LinkError::Malformed`].

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures_core::Stream;
use futures_sink::Sink;
use tokio::net::{TcpListener as TokioListener, TcpStream};
use tokio_util::codec::Decoder;
use uniplane_dataplane::codec::MessageCodec;
use uniplane_dataplane::wire::EXTENDED_HEADER_LEN;
use uniplane_dataplane::{
    BoxLink, BoxListener, Capabilities, Link, LinkError, Locator, Message, Stack, StackError,
    StackFuture,
};

/// Payloads at least this long are written from their own memory instead
/// of being copied into the coalescing buffer.
const ZERO_COPY_PAYLOAD: usize = 2048;
/// Most buffers one `writev` takes.
const MAX_IOVECS: usize = 64;

/// How the `tcp` stack sets up its connections.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpConfig {
    /// Bytes queued before `poll_ready` writes without waiting for a flush
    /// (and returns `Pending` while the kernel takes none).
    pub coalesce_bytes: usize,
    /// Bytes read per `read` system call at most.
    pub read_chunk: usize,
    /// Most connections a listener keeps open; further ones are closed.
    pub max_connections: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            coalesce_bytes: 256 << 10,
            read_chunk: 256 << 10,
            max_connections: 4096,
        }
    }
}

/// One end of a `tcp` link.
pub struct TcpLink {
    stream: TcpStream,
    codec: MessageCodec,
    rbuf: BytesMut,
    read_chunk: usize,
    eof: bool,
    /// Small messages, encoded back to back.
    wbuf: BytesMut,
    /// Buffers waiting for the kernel, in order.
    segments: VecDeque<Bytes>,
    queued: usize,
    coalesce_bytes: usize,
    _slot: Option<ConnectionSlot>,
}

impl std::fmt::Debug for TcpLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpLink")
            .field("local", &self.stream.local_addr().ok())
            .field("peer", &self.stream.peer_addr().ok())
            .field("queued", &self.queued)
            .finish()
    }
}

/// Holds one place of a listener's connection limit until dropped.
struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl TcpLink {
    fn new(stream: TcpStream, cfg: &TcpConfig, slot: Option<ConnectionSlot>) -> io::Result<Self> {
        stream.set_nodelay(true)?;
        Ok(TcpLink {
            stream,
            codec: MessageCodec::new(),
            rbuf: BytesMut::with_capacity(cfg.read_chunk),
            read_chunk: cfg
                .read_chunk
                .max(EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD),
            eof: false,
            wbuf: BytesMut::with_capacity(cfg.coalesce_bytes.min(1 << 20)),
            segments: VecDeque::with_capacity(MAX_IOVECS),
            queued: 0,
            coalesce_bytes: cfg.coalesce_bytes.max(1),
            _slot: slot,
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// This end's address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// Bytes accepted and not yet taken by the kernel.
    pub fn queued_bytes(&self) -> usize {
        self.queued
    }

    /// Writes queued bytes until none is left (`Ready`) or the kernel takes
    /// no more (`Pending`).
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        if !self.wbuf.is_empty() {
            self.segments.push_back(self.wbuf.split().freeze());
        }
        while !self.segments.is_empty() {
            let mut slices = [IoSlice::new(&[]); MAX_IOVECS];
            let mut n = 0;
            for (slot, seg) in slices.iter_mut().zip(self.segments.iter()) {
                *slot = IoSlice::new(seg);
                n += 1;
            }
            let written = match self.stream.try_write_vectored(&slices[..n]) {
                Ok(0) => return Poll::Ready(Err(LinkError::Closed)),
                Ok(w) => w,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.stream.poll_write_ready(cx))?;
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Poll::Ready(Err(e.into())),
            };
            self.queued -= written;
            let mut left = written;
            while left > 0 {
                let Some(front) = self.segments.front_mut() else {
                    break;
                };
                if front.len() <= left {
                    left -= front.len();
                    self.segments.pop_front();
                } else {
                    front.advance(left);
                    left = 0;
                }
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Reads once into the buffer; `Ready(Ok(()))` after bytes or EOF.
    fn poll_read_more(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        loop {
            if self.rbuf.capacity() - self.rbuf.len() < EXTENDED_HEADER_LEN {
                self.rbuf.reserve(self.read_chunk);
            }
            match self.stream.try_read_buf(&mut self.rbuf) {
                Ok(0) => {
                    self.eof = true;
                    return Poll::Ready(Ok(()));
                }
                Ok(_) => return Poll::Ready(Ok(())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ready!(self.stream.poll_read_ready(cx))?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Poll::Ready(Err(e.into())),
            }
        }
    }

    /// The next message: `Ready(Ok(None))` at a clean end of stream.
    fn poll_message(&mut self, cx: &mut Context<'_>) -> Poll<Result<Option<Message>, LinkError>> {
        loop {
            if let Some(m) = self.codec.decode(&mut self.rbuf)? {
                return Poll::Ready(Ok(Some(m)));
            }
            if self.eof {
                return Poll::Ready(if self.rbuf.is_empty() {
                    Ok(None)
                } else {
                    Err(io::Error::from(io::ErrorKind::UnexpectedEof).into())
                });
            }
            ready!(self.poll_read_more(cx))?;
        }
    }
}

impl Stream for TcpLink {
    type Item = Result<Message, LinkError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_message(cx).map(Result::transpose)
    }
}

impl Sink<Message> for TcpLink {
    type Error = LinkError;

    fn poll_ready(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        if this.queued >= this.coalesce_bytes {
            if let Poll::Ready(Err(e)) = this.poll_write_out(cx) {
                return Poll::Ready(Err(e));
            }
            if this.queued >= this.coalesce_bytes {
                return Poll::Pending;
            }
        }
        Poll::Ready(Ok(()))
    }

    fn start_send(self: Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        let this = self.get_mut();
        this.queued += item.encoded_len();
        if item.payload().len() < ZERO_COPY_PAYLOAD {
            item.encode(&mut this.wbuf);
            return Ok(());
        }
        let mut beat = [0u8; EXTENDED_HEADER_LEN];
        let len = item.header().encode(&mut beat)?;
        this.wbuf.extend_from_slice(&beat[..len]);
        this.segments.push_back(this.wbuf.split().freeze());
        this.segments.push_back(item.payload().clone());
        Ok(())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        self.get_mut().poll_write_out(cx)
    }

    fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let this = self.get_mut();
        ready!(this.poll_write_out(cx))?;
        match socket2::SockRef::from(&this.stream).shutdown(Shutdown::Write) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
            Err(e) => Poll::Ready(Err(e.into())),
        }
    }
}

impl Link for TcpLink {
    fn poll_recv_batch(
        &mut self,
        cx: &mut Context<'_>,
        out: &mut Vec<Message>,
        max: usize,
    ) -> Poll<Result<usize, LinkError>> {
        let mut n = 0;
        while n < max {
            // Decode what is buffered; read again only when nothing was.
            if let Some(m) = self.codec.decode(&mut self.rbuf)? {
                out.push(m);
                n += 1;
                continue;
            }
            if n > 0 {
                break;
            }
            match ready!(self.poll_message(cx))? {
                Some(m) => {
                    out.push(m);
                    n += 1;
                }
                None => break,
            }
        }
        Poll::Ready(Ok(n))
    }
}

/// Links accepted at a listening socket.
pub struct TcpListener {
    listener: TokioListener,
    config: TcpConfig,
    live: Arc<AtomicUsize>,
}

impl std::fmt::Debug for TcpListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpListener")
            .field("local", &self.listener.local_addr().ok())
            .finish()
    }
}

impl TcpListener {
    /// The address it listens at (with the port the kernel chose for 0).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }
}

impl Stream for TcpListener {
    type Item = Result<TcpLink, StackError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let (stream, _) = match ready!(this.listener.poll_accept(cx)) {
                Ok(s) => s,
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            };
            if this.live.fetch_add(1, Ordering::AcqRel) >= this.config.max_connections {
                this.live.fetch_sub(1, Ordering::AcqRel);
                drop(stream);
                continue;
            }
            let slot = ConnectionSlot(this.live.clone());
            return Poll::Ready(Some(
                TcpLink::new(stream, &this.config, Some(slot)).map_err(StackError::from),
            ));
        }
    }
}

/// The `tcp` stack.
#[derive(Clone, Debug, Default)]
pub struct TcpStack {
    config: TcpConfig,
}

impl TcpStack {
    /// A stack with the default configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// A stack configured by `config`.
    pub fn with_config(config: TcpConfig) -> Self {
        TcpStack { config }
    }

    fn socket_addr(locator: &Locator) -> Result<SocketAddr, StackError> {
        match locator {
            Locator::Socket(s) => Ok(*s),
            other => Err(StackError::UnsupportedLocator {
                stack: "tcp",
                locator: other.clone(),
            }),
        }
    }

    /// Opens a link to the listener at `peer`.
    pub async fn connect_link(&self, peer: &Locator) -> Result<TcpLink, StackError> {
        let addr = Self::socket_addr(peer)?;
        let stream = TcpStream::connect(addr).await.map_err(|e| match e.kind() {
            io::ErrorKind::ConnectionRefused => StackError::Refused(peer.clone()),
            _ => StackError::Io(e),
        })?;
        Ok(TcpLink::new(stream, &self.config, None)?)
    }

    /// Listens at `local` now; must be called inside a tokio runtime.
    pub fn listen_now(&self, local: &Locator) -> Result<TcpListener, StackError> {
        let addr = Self::socket_addr(local)?;
        let std = std::net::TcpListener::bind(addr).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => StackError::AddrInUse(local.clone()),
            _ => StackError::Io(e),
        })?;
        std.set_nonblocking(true)?;
        Ok(TcpListener {
            listener: TokioListener::from_std(std)?,
            config: self.config.clone(),
            live: Arc::default(),
        })
    }
}

impl Stack for TcpStack {
    fn name(&self) -> &'static str {
        "tcp"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            reliable: true,
            ordered: true,
            mtu: EXTENDED_HEADER_LEN + Message::MAX_PAYLOAD,
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
            let listener = self.listen_now(&local)?;
            Ok(Box::pin(futures_util::StreamExt::map(listener, |r| {
                r.map(|l| Box::new(l) as BoxLink)
            })) as BoxListener)
        })
    }
}
