//! Zero-copy views over encoded bytes, in the style of smoltcp's `wire`.
//!
//! [`HeaderView::new_checked`] validates a header once (with
//! [`Header::decode`], the one validating decoder); the accessors then read
//! fields in place with no copy and no further checks. [`Frame`] adds the
//! payload: a header followed by `msg_length` bytes.

use super::field;
use super::{DecodeError, Header, MsgFlags, ReqType};
use crate::Uid;

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
fn uid(b: &[u8], at: usize) -> Uid {
    Uid::from_bytes([b[at], b[at + 1], b[at + 2], b[at + 3], b[at + 4], b[at + 5]])
}

/// A view of an encoded header (one beat, or two for READ and COPY).
#[derive(Clone, Copy, Debug)]
pub struct HeaderView<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HeaderView<T> {
    /// Wraps `buffer` without checking it: accessors may panic on a buffer
    /// shorter than a header and return garbage on an invalid one. Use for
    /// buffers this process encoded itself.
    pub const fn new_unchecked(buffer: T) -> Self {
        HeaderView { buffer }
    }

    /// Wraps `buffer` after checking that it starts with a valid header.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, DecodeError> {
        super::header::validate(buffer.as_ref())?;
        Ok(HeaderView { buffer })
    }

    /// Checks the buffer: its length, the type, the reserved bits and the
    /// rules between fields. Everything the accessors rely on.
    pub fn check(&self) -> Result<(), DecodeError> {
        super::header::validate(self.buffer.as_ref()).map(drop)
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
        let b = self.buffer.as_ref();
        let at = field::MSG_SEQNUM.start;
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }

    /// Request type. On an unchecked view, an unassigned code reads as a
    /// user type.
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

    /// The owned header (decoded again; cheap).
    #[inline]
    pub fn to_header(&self) -> Result<Header, DecodeError> {
        Header::decode(self.buffer.as_ref())
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
    buffer: T,
    header_len: usize,
    total_len: usize,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` after checking the header and that the whole payload
    /// is present.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, DecodeError> {
        let (_, frame) = Self::decode(buffer)?;
        Ok(frame)
    }

    /// Checks `buffer` like [`Frame::new_checked`] and returns the decoded
    /// header with the view.
    #[inline]
    pub fn decode(buffer: T) -> Result<(Header, Self), DecodeError> {
        let header = Header::decode(buffer.as_ref())?;
        let header_len = header.len();
        let total_len = header_len + header.length as usize;
        let available = buffer.as_ref().len();
        if available < total_len {
            return Err(DecodeError::Truncated {
                needed: total_len,
                available,
            });
        }
        Ok((
            header,
            Frame {
                buffer,
                header_len,
                total_len,
            },
        ))
    }

    /// The header view.
    #[inline]
    pub fn header(&self) -> HeaderView<&[u8]> {
        HeaderView::new_unchecked(&self.buffer.as_ref()[..self.header_len])
    }

    /// Bytes of the header: 32 or 64.
    #[inline]
    pub fn header_len(&self) -> usize {
        self.header_len
    }

    /// Bytes this message occupies: header plus payload.
    #[inline]
    pub fn total_len(&self) -> usize {
        self.total_len
    }

    /// The payload.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len..self.total_len]
    }

    /// Consumes the view, returning the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
}
