//! [`Wire`]: frames over one uniplane [`Connection`], both ways — the
//! I/O that the client's and the server's connection drivers share.
//!
//! Sending cuts a frame into messages of at most [`CHUNK`] bytes, the last
//! PUSH-marked; a small frame is one message whose payload is copied once
//! into a reused buffer, a large one sends its payload as slices of the
//! caller's `Bytes` (no copy). Receiving takes a one-message frame as it
//! is (no copy) and gathers a longer one up to its PUSH, refusing one
//! whose header announces more than the limit before gathering any of it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures_util::{Sink, Stream};
use uniplane_client::Connection;
use uniplane_dataplane::wire::MsgFlags;
use uniplane_dataplane::{Endpoint, LinkError, Message};

use crate::frame::{self, Frame, FrameError, Head, Prefix, HEADER_LEN};

/// Most payload bytes per uniplane message.
pub const CHUNK: usize = 60 * 1024;
/// Payloads up to this size are copied into the frame's first message.
const INLINE: usize = 4096;

/// What came in.
#[derive(Debug)]
pub(crate) enum Incoming {
    /// A checked frame.
    Frame(Frame),
    /// Bytes that are not a frame.
    Malformed(FrameError),
    /// A frame larger than the limit was skipped.
    Oversized {
        /// Its call.
        tag: u32,
        /// Its announced size.
        size: u64,
    },
}

/// Reassembly of a frame that spans several messages.
enum Gather {
    Idle,
    Collecting(BytesMut),
    /// An oversized or malformed frame's remaining messages, up to PUSH.
    Skipping,
}

/// Frames both ways over one connection.
pub(crate) struct Wire {
    conn: Connection,
    out: VecDeque<Message>,
    buf: BytesMut,
    gather: Gather,
    max_frame: usize,
    closed: bool,
}

impl Wire {
    /// Frames over `conn`, refusing incoming frames above `max_frame`.
    pub(crate) fn new(conn: Connection, max_frame: usize) -> Wire {
        Wire {
            conn,
            out: VecDeque::with_capacity(64),
            buf: BytesMut::with_capacity(64 * 1024),
            gather: Gather::Idle,
            max_frame,
            closed: false,
        }
    }

    /// The far end, as the daemon installed the connection.
    pub(crate) fn remote(&self) -> Endpoint {
        self.conn.remote()
    }

    /// Messages queued and not yet taken by the link.
    pub(crate) fn queued(&self) -> usize {
        self.out.len()
    }

    /// Queues one frame.
    pub(crate) fn queue(&mut self, head: &Head, method: &[u8], payload: &Bytes) {
        let first = HEADER_LEN + method.len();
        if payload.len() <= INLINE {
            if self.buf.capacity() < first + payload.len() {
                self.buf.reserve(64 * 1024);
            }
            frame::encode(head, method, payload, &mut self.buf);
            let bytes = self.buf.split().freeze();
            self.push(bytes, true);
            return;
        }
        head.encode(method, payload.len(), &mut self.buf);
        let bytes = self.buf.split().freeze();
        self.push(bytes, false);
        let mut at = 0;
        while at < payload.len() {
            let end = (at + CHUNK).min(payload.len());
            self.push(payload.slice(at..end), end == payload.len());
            at = end;
        }
    }

    fn push(&mut self, bytes: Bytes, last: bool) {
        let m = if last {
            self.conn.message_push(bytes)
        } else {
            self.conn.message(bytes)
        };
        match m {
            Ok(m) => self.out.push_back(m),
            // Only a payload above Message::MAX_PAYLOAD fails, which CHUNK
            // and INLINE rule out.
            Err(e) => tracing::error!("building a message: {e}"),
        }
    }

    /// Hands queued messages to the link until it pushes back; `Ready(Ok)`
    /// once none are left.
    pub(crate) fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), LinkError>> {
        let mut conn = Pin::new(&mut self.conn);
        while !self.out.is_empty() {
            match conn.as_mut().poll_ready(cx) {
                Poll::Ready(Ok(())) => {}
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
            if let Some(m) = self.out.pop_front() {
                conn.as_mut().start_send(m)?;
            }
        }
        Poll::Ready(Ok(()))
    }

    /// The next frame; `None` once the connection ended (closed by the far
    /// end or the daemon, or failed).
    pub(crate) fn poll_frame(&mut self, cx: &mut Context<'_>) -> Poll<Option<Incoming>> {
        loop {
            if self.closed {
                return Poll::Ready(None);
            }
            let m = match Pin::new(&mut self.conn).poll_next(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) | Poll::Ready(Some(Err(_))) => {
                    self.closed = true;
                    return Poll::Ready(None);
                }
                Poll::Ready(Some(Ok(m))) => m,
            };
            let push = m.header().flags.contains(MsgFlags::PUSH);
            let payload = m.payload().clone();
            if let Some(incoming) = self.take(payload, push) {
                return Poll::Ready(Some(incoming));
            }
        }
    }

    /// One message's payload into the frame being gathered.
    fn take(&mut self, payload: Bytes, push: bool) -> Option<Incoming> {
        match std::mem::replace(&mut self.gather, Gather::Idle) {
            Gather::Skipping => {
                if !push {
                    self.gather = Gather::Skipping;
                }
                None
            }
            Gather::Collecting(mut buf) => {
                buf.extend_from_slice(&payload);
                if buf.len() > self.max_frame + HEADER_LEN + frame::MAX_METHOD {
                    // The header lied about its size; drop the rest.
                    let tag = Prefix::peek(&buf).map(|p| p.tag).unwrap_or(0);
                    if !push {
                        self.gather = Gather::Skipping;
                    }
                    return Some(Incoming::Oversized {
                        tag,
                        size: buf.len() as u64,
                    });
                }
                if push {
                    Some(parse(buf.freeze()))
                } else {
                    self.gather = Gather::Collecting(buf);
                    None
                }
            }
            Gather::Idle => {
                match Prefix::peek(&payload) {
                    Ok(p) if p.total > (self.max_frame + HEADER_LEN + frame::MAX_METHOD) as u64 => {
                        if !push {
                            self.gather = Gather::Skipping;
                        }
                        return Some(Incoming::Oversized {
                            tag: p.tag,
                            size: p.total,
                        });
                    }
                    Err(e) if push || payload.len() >= HEADER_LEN => {
                        if !push {
                            self.gather = Gather::Skipping;
                        }
                        return Some(Incoming::Malformed(e));
                    }
                    _ => {}
                }
                if push {
                    Some(parse(payload))
                } else {
                    self.gather = Gather::Collecting(BytesMut::from(&payload[..]));
                    None
                }
            }
        }
    }
}

fn parse(bytes: Bytes) -> Incoming {
    match Frame::parse(bytes) {
        Ok(f) => Incoming::Frame(f),
        Err(e) => Incoming::Malformed(e),
    }
}
