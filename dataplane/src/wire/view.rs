//! Zero-copy views over encoded bytes, in the style of smoltcp's `wire`.
//!
//! [`HeaderView::new_checked`] validates a header once; the accessors then
//! read fields in place with no copy and no further checks. [`Frame`] adds
//! the payload: a header followed by `msg_length` bytes.

use super::field::{self, HEADER_LEN};
use super::header::{
    check_consistency, ConfigParams, CopyParams, Header, MemoryParams, Params, PortParams,
    ReadParams, Request,
};
use super::{DecodeError, MsgFlags, ParamForm, ReqType};
use crate::Uid;

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn be64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}

#[inline]
fn uid(b: &[u8], at: usize) -> Uid {
    Uid::from_bytes([b[at], b[at + 1], b[at + 2], b[at + 3], b[at + 4], b[at + 5]])
}

#[inline]
fn all_zero(b: &[u8]) -> bool {
    b.iter().fold(0u8, |acc, x| acc | x) == 0
}

/// A view of an encoded header (one beat, or two for READ and COPY).
#[derive(Clone, Copy, Debug)]
pub struct HeaderView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HeaderView<T> {
    /// Wraps `buffer` without checking it: accessors may panic on a short
    /// buffer and return garbage on an invalid one. Use for buffers this
    /// process encoded itself.
    pub const fn new_unchecked(buffer: T) -> Self {
        HeaderView { buffer }
    }

    /// Wraps `buffer` after checking that it starts with a valid header.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, DecodeError> {
        let view = HeaderView { buffer };
        view.check()?;
        Ok(view)
    }

    /// Checks the buffer: its length, the type, the reserved bits and the
    /// rules between fields. Everything the accessors rely on.
    pub fn check(&self) -> Result<(), DecodeError> {
        let b = self.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(DecodeError::Truncated {
                needed: HEADER_LEN,
                available: b.len(),
            });
        }
        let code = b[field::REQ_TYPE];
        let kind = ReqType::from_u8(code).ok_or(DecodeError::UnknownRequestType(code))?;
        let needed = kind.header_len();
        if b.len() < needed {
            return Err(DecodeError::Truncated {
                needed,
                available: b.len(),
            });
        }
        let reserved_clear = match kind.form() {
            ParamForm::Port => all_zero(&b[field::PORT_RESERVED]),
            ParamForm::Memory | ParamForm::Config => b[field::MEM_RESERVED.start] == 0,
            ParamForm::Flush => all_zero(&b[field::FLUSH_RESERVED]),
            ParamForm::Read => {
                all_zero(&b[field::READ_RESERVED]) && all_zero(&b[field::EXT_RESERVED])
            }
            ParamForm::Copy => {
                all_zero(&b[field::COPY_RESERVED]) && all_zero(&b[field::EXT_RESERVED])
            }
            ParamForm::Opaque => true,
        };
        if !reserved_clear {
            return Err(DecodeError::ReservedParamBits { req_type: kind });
        }
        check_consistency(kind, self.flags(), self.msg_length(), &self.params(kind))
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Source UID.
    #[inline]
    pub fn src_uid(&self) -> Uid {
        uid(self.buffer.as_ref(), field::SRC_UID.start)
    }

    /// Destination UID.
    #[inline]
    pub fn dst_uid(&self) -> Uid {
        uid(self.buffer.as_ref(), field::DST_UID.start)
    }

    /// Payload length in bytes.
    #[inline]
    pub fn msg_length(&self) -> u16 {
        be16(self.buffer.as_ref(), field::MSG_LENGTH.start)
    }

    /// Message flags.
    #[inline]
    pub fn flags(&self) -> MsgFlags {
        MsgFlags::raw(self.buffer.as_ref()[field::MSG_FLAG])
    }

    /// Sequence number.
    #[inline]
    pub fn seqnum(&self) -> u32 {
        be32(self.buffer.as_ref(), field::MSG_SEQNUM.start)
    }

    /// Request type. Only meaningful on a checked view.
    #[inline]
    pub fn req_type(&self) -> ReqType {
        let code = self.buffer.as_ref()[field::REQ_TYPE];
        ReqType::from_u8(code).unwrap_or(ReqType::User(code))
    }

    /// Header length: 32, or 64 with the second beat.
    #[inline]
    pub fn header_len(&self) -> usize {
        self.req_type().header_len()
    }

    /// The raw 12 bytes of `req_param`.
    #[inline]
    pub fn raw_params(&self) -> &[u8] {
        &self.buffer.as_ref()[field::REQ_PARAM]
    }

    fn params(&self, kind: ReqType) -> Params {
        let b = self.buffer.as_ref();
        let flag = b[field::REQ_FLAG];
        let length = be16(b, field::REQ_LENGTH.start);
        match kind.form() {
            ParamForm::Port => Params::Port(PortParams {
                flag,
                src_port: be16(b, field::SRC_PORT.start),
                dst_port: be16(b, field::DST_PORT.start),
            }),
            ParamForm::Memory => Params::Memory(MemoryParams {
                flag,
                length,
                addr: be64(b, field::MEM_ADDR.start),
            }),
            ParamForm::Config => Params::Config(ConfigParams {
                flag,
                reg: length,
                value: be64(b, field::MEM_ADDR.start),
            }),
            ParamForm::Flush => Params::Flush(flag),
            ParamForm::Read => Params::Read(ReadParams {
                flag,
                length,
                src_addr: be64(b, field::EXT_SRC_ADDR.start),
                dst_addr: be64(b, field::EXT_DST_ADDR.start),
            }),
            ParamForm::Copy => Params::Copy(CopyParams {
                flag,
                length,
                target: uid(b, field::COPY_UID.start),
                src_addr: be64(b, field::EXT_SRC_ADDR.start),
                dst_addr: be64(b, field::EXT_DST_ADDR.start),
            }),
            ParamForm::Opaque => {
                let mut raw = [0u8; 12];
                raw.copy_from_slice(&b[field::REQ_PARAM]);
                Params::Opaque(raw)
            }
        }
    }

    /// The owned header. Only meaningful on a checked view.
    #[inline]
    pub fn to_header(&self) -> Header {
        let kind = self.req_type();
        Header {
            src: self.src_uid(),
            dst: self.dst_uid(),
            length: self.msg_length(),
            flags: self.flags(),
            seqnum: self.seqnum(),
            request: match Request::new(kind, self.params(kind)) {
                Ok(r) => r,
                // params() always builds the layout of `kind`.
                Err(_) => unreachable!("params() follows kind.form()"),
            },
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HeaderView<T> {
    /// Sets the destination UID in place (as a forwarding hop rewrites it).
    #[inline]
    pub fn set_dst_uid(&mut self, uid: Uid) {
        self.buffer.as_mut()[field::DST_UID].copy_from_slice(&uid.to_bytes());
    }

    /// Sets the source UID in place.
    #[inline]
    pub fn set_src_uid(&mut self, uid: Uid) {
        self.buffer.as_mut()[field::SRC_UID].copy_from_slice(&uid.to_bytes());
    }

    /// Sets the sequence number in place.
    #[inline]
    pub fn set_seqnum(&mut self, seqnum: u32) {
        self.buffer.as_mut()[field::MSG_SEQNUM].copy_from_slice(&seqnum.to_be_bytes());
    }
}

/// A view of one whole encoded message: a header and its payload.
///
/// The buffer may hold more bytes after the message (the next message of a
/// datagram); [`Frame::total_len`] says where this one ends.
#[derive(Clone, Copy, Debug)]
pub struct Frame<T: AsRef<[u8]>> {
    header: HeaderView<T>,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` after checking the header and that the whole payload
    /// is present.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, DecodeError> {
        let header = HeaderView::new_checked(buffer)?;
        let needed = header.header_len() + header.msg_length() as usize;
        let available = header.buffer.as_ref().len();
        if available < needed {
            return Err(DecodeError::Truncated { needed, available });
        }
        Ok(Frame { header })
    }

    /// The header view.
    #[inline]
    pub fn header(&self) -> &HeaderView<T> {
        &self.header
    }

    /// Bytes this message occupies: header plus payload.
    #[inline]
    pub fn total_len(&self) -> usize {
        self.header.header_len() + self.header.msg_length() as usize
    }

    /// The payload.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let start = self.header.header_len();
        &self.header.buffer.as_ref()[start..self.total_len()]
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.header.buffer
    }
}
