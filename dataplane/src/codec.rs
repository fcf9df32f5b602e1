//! Framing of messages on byte streams (TCP, Unix sockets, pipes), as a
//! tokio-util [`Decoder`] and [`Encoder`].
//!
//! A message on a stream is its encoding: header (32 or 64 bytes) then
//! `msg_length` payload bytes. Nothing else is needed to find the next one.
//! A stream cannot resynchronise after garbage, so a malformed header is an
//! error that ends the stream.

use bytes::{Buf, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::wire::{field, Header, ReqType, HEADER_LEN};
use crate::{LinkError, Message};

/// Encoder and decoder of [`Message`]s on a byte stream.
#[derive(Debug, Default, Clone, Copy)]
pub struct MessageCodec {
    _private: (),
}

impl MessageCodec {
    /// A codec with no state.
    pub const fn new() -> Self {
        MessageCodec { _private: () }
    }
}

impl Decoder for MessageCodec {
    type Item = Message;
    type Error = LinkError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Message>, LinkError> {
        if src.len() < HEADER_LEN {
            src.reserve(HEADER_LEN - src.len());
            return Ok(None);
        }
        let code = src[field::REQ_TYPE];
        let header_len = ReqType::from_u8(code)
            .ok_or(crate::wire::DecodeError::UnknownRequestType(code))?
            .header_len();
        if src.len() < header_len {
            src.reserve(header_len - src.len());
            return Ok(None);
        }
        let header = Header::decode(&src[..header_len])?;
        let total = header_len + header.length as usize;
        if src.len() < total {
            src.reserve(total - src.len());
            return Ok(None);
        }
        src.advance(header_len);
        let payload = src.split_to(header.length as usize).freeze();
        Ok(Some(Message::new(header, payload)?))
    }
}

impl Encoder<Message> for MessageCodec {
    type Error = LinkError;

    fn encode(&mut self, item: Message, dst: &mut BytesMut) -> Result<(), LinkError> {
        item.encode(dst);
        Ok(())
    }
}

impl Encoder<&Message> for MessageCodec {
    type Error = LinkError;

    fn encode(&mut self, item: &Message, dst: &mut BytesMut) -> Result<(), LinkError> {
        item.encode(dst);
        Ok(())
    }
}

/// A byte stream (TCP, Unix socket) carrying messages, as a [`Link`](crate::Link).
pub struct FramedLink<T> {
    inner: tokio_util::codec::Framed<T, MessageCodec>,
}

impl<T> FramedLink<T>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite,
{
    /// Frames messages on `io`.
    pub fn new(io: T) -> Self {
        FramedLink {
            inner: tokio_util::codec::Framed::new(io, MessageCodec::new()),
        }
    }

    /// The byte stream.
    pub fn get_ref(&self) -> &T {
        self.inner.get_ref()
    }
}

impl<T> futures_core::Stream for FramedLink<T>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    type Item = Result<Message, LinkError>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_next(cx)
    }
}

impl<T> futures_sink::Sink<Message> for FramedLink<T>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    type Error = LinkError;

    fn poll_ready(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), LinkError>> {
        futures_sink::Sink::<Message>::poll_ready(std::pin::Pin::new(&mut self.get_mut().inner), cx)
    }

    fn start_send(self: std::pin::Pin<&mut Self>, item: Message) -> Result<(), LinkError> {
        futures_sink::Sink::<Message>::start_send(
            std::pin::Pin::new(&mut self.get_mut().inner),
            item,
        )
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), LinkError>> {
        futures_sink::Sink::<Message>::poll_flush(std::pin::Pin::new(&mut self.get_mut().inner), cx)
    }

    fn poll_close(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), LinkError>> {
        futures_sink::Sink::<Message>::poll_close(std::pin::Pin::new(&mut self.get_mut().inner), cx)
    }
}

impl<T> crate::Link for FramedLink<T> where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin
{
}
