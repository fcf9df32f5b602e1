//! [`Message`]: a validated header and its payload.

use bytes::{BufMut, Bytes, BytesMut};

use crate::wire::{
    ConfigParams, DecodeError, Frame, Header, MemoryParams, MsgFlags, ParamForm, Params,
    PortParams, ReqType, Request, Status, EXTENDED_HEADER_LEN,
};
use crate::{Endpoint, MemoryAddress, Uid};

/// One overlay message: a header and its payload.
///
/// The header's `length` always equals the payload's, and the header always
/// passes [`Header::validate`]: a `Message` is encodable as it is. Payloads are
/// [`Bytes`], so messages move through queues by reference count.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    header: Header,
    payload: Bytes,
}

impl Message {
    /// The largest payload one message carries (`msg_length` is 16 bits).
    pub const MAX_PAYLOAD: usize = u16::MAX as usize;

    /// A message of `header` and `payload`; the header's `length` (and for
    /// data-carrying memory requests, `req_length`) is set from the payload.
    pub fn new(mut header: Header, payload: Bytes) -> Result<Message, DecodeError> {
        let length =
            u16::try_from(payload.len()).map_err(|_| DecodeError::PayloadTooLong(payload.len()))?;
        header.length = length;
        if header.request.kind().carries_payload() {
            if let Params::Memory(p) = *header.request.params() {
                header.request = Request::new(
                    header.request.kind(),
                    Params::Memory(MemoryParams { length, ..p }),
                )?;
            }
        }
        header.validate()?;
        Ok(Message { header, payload })
    }

    /// A SEND of `payload` from `src` to `dst`.
    pub fn send(src: Endpoint, dst: Endpoint, payload: Bytes) -> Result<Message, DecodeError> {
        let request = Request::send(src.port, dst.port);
        Message::new(Header::new(src.uid, dst.uid, request), payload)
    }

    /// A one-sided WRTE of `payload` at `dst`.
    pub fn write(src: Uid, dst: MemoryAddress, payload: Bytes) -> Result<Message, DecodeError> {
        let request = Request::write(dst.addr, 0);
        Message::new(Header::new(src, dst.uid, request), payload)
    }

    /// A one-sided READ of `length` bytes at `from`, to land at `into`
    /// (the requester's memory).
    pub fn read(
        into: MemoryAddress,
        from: MemoryAddress,
        length: u16,
    ) -> Result<Message, DecodeError> {
        let request = Request::read(from.addr, into.addr, length);
        Message::new(Header::new(into.uid, from.uid, request), Bytes::new())
    }

    /// The answer that reports `status` to this message's sender: the
    /// matching completion (SEND → SEND_CMPL, WRTE → WRTE_CMPL, CONNECT →
    /// ACCEPT, …) from the destination back to the source, with the ERROR
    /// flag, the status in `req_flag`, the same sequence number and no
    /// payload. `None` for messages that are answers themselves: nobody
    /// answers an answer, so errors cannot loop.
    pub fn error_answer(&self, status: Status) -> Option<Message> {
        let h = &self.header;
        let kind = h.request.kind().answer()?;
        let flag = status.to_u8();
        let params = match (*h.request.params(), kind.form()) {
            (Params::Port(p), ParamForm::Port) => Params::Port(PortParams {
                flag,
                src_port: p.dst_port,
                dst_port: p.src_port,
            }),
            (Params::Memory(p), ParamForm::Memory) => Params::Memory(MemoryParams {
                flag,
                length: 0,
                addr: p.addr,
            }),
            (Params::Read(p), ParamForm::Memory) => Params::Memory(MemoryParams {
                flag,
                length: 0,
                addr: p.dst_addr,
            }),
            (Params::Copy(p), ParamForm::Memory) => Params::Memory(MemoryParams {
                flag,
                length: 0,
                addr: p.dst_addr,
            }),
            (Params::Config(p), ParamForm::Config) => Params::Config(ConfigParams {
                flag,
                reg: p.reg,
                value: 0,
            }),
            (Params::Flush(_), ParamForm::Flush) => Params::Flush(flag),
            (_, ParamForm::Port) => Params::Port(PortParams {
                flag,
                ..PortParams::default()
            }),
            (_, ParamForm::Memory) => Params::Memory(MemoryParams {
                flag,
                ..MemoryParams::default()
            }),
            (_, ParamForm::Config) => Params::Config(ConfigParams {
                flag,
                ..ConfigParams::default()
            }),
            _ => return None,
        };
        let mut header = Header::new(h.dst, h.src, Request::new(kind, params).ok()?);
        header.seqnum = h.seqnum;
        if status != Status::Ok {
            header.flags = header.flags.with(MsgFlags::ERROR);
        }
        Message::new(header, Bytes::new()).ok()
    }

    /// The header.
    #[inline]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The payload.
    #[inline]
    pub fn payload(&self) -> &Bytes {
        &self.payload
    }

    /// The request type.
    #[inline]
    pub fn kind(&self) -> ReqType {
        self.header.request.kind()
    }

    /// Header and payload.
    pub fn into_parts(self) -> (Header, Bytes) {
        (self.header, self.payload)
    }

    /// Sets the source UID (as a connector stamps its own).
    #[inline]
    pub fn set_src(&mut self, uid: Uid) {
        self.header.src = uid;
    }

    /// Sets the destination UID (as a forwarding hop rewrites it).
    #[inline]
    pub fn set_dst(&mut self, uid: Uid) {
        self.header.dst = uid;
    }

    /// Sets the sequence number.
    #[inline]
    pub fn set_seqnum(&mut self, seqnum: u32) {
        self.header.seqnum = seqnum;
    }

    /// Sets FIRST, LAST and PUSH; ERROR is kept as it is, since it depends
    /// on the request type.
    #[inline]
    pub fn set_segment_flags(&mut self, flags: MsgFlags) {
        let keep = self.header.flags.bits() & MsgFlags::ERROR.bits();
        let set = flags.bits() & (MsgFlags::FIRST | MsgFlags::LAST | MsgFlags::PUSH).bits();
        self.header.flags = MsgFlags::from_bits(keep | set).unwrap_or(MsgFlags::EMPTY);
    }

    /// Encoded size: header and payload.
    #[inline]
    pub fn encoded_len(&self) -> usize {
        self.header.len() + self.payload.len()
    }

    /// Appends the encoded message to `dst`.
    #[inline]
    pub fn encode(&self, dst: &mut BytesMut) {
        let mut beat = [0u8; EXTENDED_HEADER_LEN];
        let len = match self.header.encode(&mut beat) {
            Ok(len) => len,
            Err(_) => unreachable!("the scratch beat fits every header"),
        };
        dst.reserve(len + self.payload.len());
        dst.put_slice(&beat[..len]);
        dst.put_slice(&self.payload);
    }

    /// Decodes the message at the start of `buf`, returning it and the bytes
    /// it occupied. The payload shares `buf`'s memory (no copy).
    #[inline]
    pub fn decode(buf: &Bytes) -> Result<(Message, usize), DecodeError> {
        let (header, frame) = Frame::decode(buf.as_ref())?;
        let payload = buf.slice(frame.header_len()..frame.total_len());
        Ok((Message { header, payload }, frame.total_len()))
    }
}
