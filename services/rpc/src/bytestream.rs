//! [`ByteStream`]: a uniplane connection as `AsyncRead + AsyncWrite`, so
//! byte-stream protocols (HTTP/2 through hyper, gRPC through tonic) run
//! over it unchanged.
//!
//! Writes gather in a buffer that a flush (or a full [`CHUNK`]) sends as
//! one message; reads hand out each received message's bytes in order.
//! The connection is reliable and ordered on every stack the daemon puts
//! it on, so the bytes arrive as written.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use futures_util::{Sink, Stream};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use uniplane_client::Connection;
use uniplane_dataplane::Endpoint;

use crate::wire::CHUNK;

/// A connection as a byte stream. Dropping it closes the connection.
///
/// The accepting end speaks first: [`ByteStream::accepted`] sends an
/// empty message (the hello) and [`ByteStream::connected`] writes nothing
/// before it has it. The daemon tells the accepting session of a new
/// connection apart from the data path, so bytes sent before the
/// acceptor knew the connection would be lost; after the hello they
/// cannot be.
pub struct ByteStream {
    conn: Connection,
    read: Bytes,
    write: BytesMut,
    eof: bool,
    hello: Hello,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Hello {
    /// To send, once (accepting end). The connecting end's daemon admits
    /// the connection before the accepting end hears of it, so the hello
    /// is never sent into a plane that would drop it.
    Send,
    /// To wait for before writing (connecting end).
    Await,
    Done,
}

impl ByteStream {
    /// The bytes of a connection this end accepted.
    pub fn accepted(conn: Connection) -> ByteStream {
        ByteStream::new(conn, Hello::Send)
    }

    /// The bytes of a connection this end opened.
    pub fn connected(conn: Connection) -> ByteStream {
        ByteStream::new(conn, Hello::Await)
    }

    fn new(conn: Connection, hello: Hello) -> ByteStream {
        ByteStream {
            conn,
            read: Bytes::new(),
            write: BytesMut::with_capacity(CHUNK),
            eof: false,
            hello,
        }
    }

    /// Sends the hello (accepting end) or waits for it (connecting end).
    fn poll_hello(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.hello {
            Hello::Done => Poll::Ready(Ok(())),
            Hello::Send => {
                let mut conn = Pin::new(&mut self.conn);
                match conn.as_mut().poll_ready(cx) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(broken(e))),
                    Poll::Pending => return Poll::Pending,
                }
                let m = self.conn.message(Bytes::new()).map_err(broken)?;
                Pin::new(&mut self.conn).start_send(m).map_err(broken)?;
                self.hello = Hello::Done;
                Poll::Ready(Ok(()))
            }
            Hello::Await => match Pin::new(&mut self.conn).poll_next(cx) {
                Poll::Ready(Some(Ok(m))) => {
                    self.read = m.payload().clone();
                    self.hello = Hello::Done;
                    Poll::Ready(Ok(()))
                }
                Poll::Ready(Some(Err(e))) => Poll::Ready(Err(broken(e))),
                Poll::Ready(None) => {
                    self.eof = true;
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::ConnectionRefused,
                        "closed before the hello",
                    )))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    /// The far end, as the daemon installed the connection.
    pub fn remote(&self) -> Endpoint {
        self.conn.remote()
    }

    /// This end.
    pub fn local(&self) -> Endpoint {
        self.conn.local()
    }

    /// Sends what the write buffer holds, a message of at most [`CHUNK`]
    /// bytes at a time.
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.hello != Hello::Done && !self.write.is_empty() {
            match self.poll_hello(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
        while !self.write.is_empty() {
            let mut conn = Pin::new(&mut self.conn);
            match conn.as_mut().poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(broken(e))),
                Poll::Pending => return Poll::Pending,
            }
            let n = self.write.len().min(CHUNK);
            let bytes = self.write.split_to(n).freeze();
            let m = self.conn.message(bytes).map_err(broken)?;
            Pin::new(&mut self.conn).start_send(m).map_err(broken)?;
        }
        Poll::Ready(Ok(()))
    }
}

fn broken(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::ConnectionReset, e.to_string())
}

impl AsyncRead for ByteStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.hello != Hello::Done {
            match this.poll_hello(cx) {
                Poll::Ready(Ok(())) => {}
                // The far end closed before a word: end of stream.
                Poll::Ready(Err(_)) if this.eof => return Poll::Ready(Ok(())),
                other => return other,
            }
        }
        while this.read.is_empty() {
            if this.eof {
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut this.conn).poll_next(cx) {
                Poll::Ready(Some(Ok(m))) => this.read = m.payload().clone(),
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Err(broken(e))),
                Poll::Ready(None) => this.eof = true,
                Poll::Pending => return Poll::Pending,
            }
        }
        let n = this.read.len().min(buf.remaining());
        buf.put_slice(&this.read[..n]);
        this.read.advance(n);
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for ByteStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.write.len() >= CHUNK {
            match this.poll_send(cx) {
                Poll::Ready(Ok(())) => {}
                other => return other.map_ok(|()| 0),
            }
        }
        let n = buf.len().min(CHUNK - this.write.len());
        this.write.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().poll_send(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The connection closes when the stream is dropped; no half-close.
        self.get_mut().poll_send(cx)
    }
}

impl std::fmt::Debug for ByteStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ByteStream")
            .field("local", &self.conn.local())
            .field("remote", &self.conn.remote())
            .finish()
    }
}
