//! The native frame: one RPC event (a call opened, a message of its
//! stream, its final status, a cancel, flow-control credit) as bytes.
//!
//! A frame travels as one unit of a uniplane connection: the payloads of
//! one or more messages, the last one PUSH-marked. It is a fixed 24-byte
//! header, big-endian, then the method name (REQUEST only), then the
//! payload:
//!
//! ```text
//!  0        1        2        3        4                 8                 12
//! ┌────────┬────────┬────────┬────────┬─────────────────┬─────────────────┐
//! │version │ kind   │ flags  │ status │ tag             │ deadline_us     │
//! ├────────┴────────┼────────┴────────┼─────────────────┴─────────────────┤
//! │ credit (12..16) │ method_len u16 + reserved u16 (16..20) │ payload_len │
//! └─────────────────┴────────────────────────────────────────┴────────────┘
//!  24: method (method_len bytes, UTF-8), then payload (payload_len bytes)
//! ```
//!
//! [`Frame::parse`] checks everything once — version, kind, the flags and
//! fields each kind may carry, the status code, the lengths against the
//! bytes present, the method's UTF-8 — and then the accessors read fields
//! without copying (smoltcp's `new_checked` style). A bad frame is a
//! [`FrameError`], which says which call it belonged to when the header
//! got that far, and never a panic.

use bytes::{BufMut, Bytes, BytesMut};

use crate::status::Code;

/// Byte ranges of the header's fields: the one place offsets live.
mod field {
    use std::ops::Range;
    pub const VERSION: usize = 0;
    pub const KIND: usize = 1;
    pub const FLAGS: usize = 2;
    pub const STATUS: usize = 3;
    pub const TAG: Range<usize> = 4..8;
    pub const DEADLINE: Range<usize> = 8..12;
    pub const CREDIT: Range<usize> = 12..16;
    pub const METHOD_LEN: Range<usize> = 16..18;
    pub const RESERVED: Range<usize> = 18..20;
    pub const PAYLOAD_LEN: Range<usize> = 20..24;
}

/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 24;
/// The only version this crate speaks.
pub const VERSION: u8 = 1;
/// Longest method name.
pub const MAX_METHOD: usize = 1024;

/// What a frame says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client → server: opens call `tag` on `method`, maybe with its first
    /// message and its deadline.
    Request = 1,
    /// Either way: one message of the call's stream (or, without
    /// [`Flags::MESSAGE`], only the end of the sender's stream).
    Message = 2,
    /// Server → client: the call's end and its status; with
    /// [`Flags::MESSAGE`] it carries the (last) response message,
    /// otherwise the payload is the status's text.
    Status = 3,
    /// Client → server: the caller gave up; drop the call.
    Cancel = 4,
    /// Either way: the receiver takes `credit` more messages of the call.
    Credit = 5,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Request,
            2 => Kind::Message,
            3 => Kind::Status,
            4 => Kind::Cancel,
            5 => Kind::Credit,
            _ => return None,
        })
    }

    /// The flags a frame of this kind may carry.
    fn allowed_flags(self) -> u8 {
        match self {
            Kind::Request | Kind::Message => Flags::MESSAGE | Flags::END,
            Kind::Status => Flags::MESSAGE,
            Kind::Cancel | Kind::Credit => 0,
        }
    }
}

/// The flag bits.
pub struct Flags;

impl Flags {
    /// The payload is a message of the call.
    pub const MESSAGE: u8 = 0x01;
    /// The sender's stream ends with this frame.
    pub const END: u8 = 0x02;
}

/// Why bytes are not a frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than a header.
    #[error("{0} bytes, shorter than the {HEADER_LEN}-byte header")]
    Short(usize),
    /// A version this crate does not speak.
    #[error("version {0}, expected {VERSION}")]
    Version(u8),
    /// An unknown kind.
    #[error("unknown frame kind {kind} (call {tag})")]
    Kind {
        /// The kind byte.
        kind: u8,
        /// The call named.
        tag: u32,
    },
    /// A field this kind must not carry, or must carry, is wrong.
    #[error("{kind:?} frame of call {tag}: {what}")]
    Field {
        /// The frame's kind.
        kind: Kind,
        /// The call named.
        tag: u32,
        /// What is wrong.
        what: &'static str,
    },
    /// The lengths in the header disagree with the bytes present.
    #[error("call {tag}: header says {declared} bytes, frame has {actual}")]
    Length {
        /// The call named.
        tag: u32,
        /// Header + method + payload as declared.
        declared: u64,
        /// What arrived.
        actual: usize,
    },
}

impl FrameError {
    /// The call the bad frame named, when its header got that far.
    pub fn tag(&self) -> Option<u32> {
        match *self {
            FrameError::Short(_) | FrameError::Version(_) => None,
            FrameError::Kind { tag, .. }
            | FrameError::Field { tag, .. }
            | FrameError::Length { tag, .. } => Some(tag),
        }
    }
}

/// The header fields of a frame to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    /// What the frame says.
    pub kind: Kind,
    /// [`Flags`] bits.
    pub flags: u8,
    /// The status code (STATUS frames).
    pub status: Code,
    /// The call.
    pub tag: u32,
    /// Microseconds the call has left (REQUEST; 0: no deadline).
    pub deadline_us: u32,
    /// Messages granted (CREDIT).
    pub credit: u32,
}

impl Head {
    /// A header of `kind` for call `tag`, every other field empty.
    pub fn new(kind: Kind, tag: u32) -> Head {
        Head {
            kind,
            flags: 0,
            status: Code::Ok,
            tag,
            deadline_us: 0,
            credit: 0,
        }
    }

    /// The bytes of the frame's header and method, to be followed by a
    /// payload of `payload_len` bytes, appended to `out`.
    pub fn encode(&self, method: &[u8], payload_len: usize, out: &mut BytesMut) {
        out.reserve(HEADER_LEN + method.len());
        out.put_u8(VERSION);
        out.put_u8(self.kind as u8);
        out.put_u8(self.flags);
        out.put_u8(self.status as u8);
        out.put_u32(self.tag);
        out.put_u32(self.deadline_us);
        out.put_u32(self.credit);
        out.put_u16(method.len() as u16);
        out.put_u16(0);
        out.put_u32(payload_len as u32);
        out.put_slice(method);
    }
}

/// The header of a frame, read from its first bytes (the rest may not
/// have arrived yet): enough to know its call and its size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Prefix {
    /// The call named.
    pub tag: u32,
    /// Bytes of the whole frame.
    pub total: u64,
}

impl Prefix {
    /// Reads the tag and total length from the first bytes of a frame.
    pub fn peek(b: &[u8]) -> Result<Prefix, FrameError> {
        if b.len() < HEADER_LEN {
            return Err(FrameError::Short(b.len()));
        }
        if b[field::VERSION] != VERSION {
            return Err(FrameError::Version(b[field::VERSION]));
        }
        let tag = be32(&b[field::TAG]);
        let method = be16(&b[field::METHOD_LEN]) as u64;
        let payload = be32(&b[field::PAYLOAD_LEN]) as u64;
        Ok(Prefix {
            tag,
            total: HEADER_LEN as u64 + method + payload,
        })
    }
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// A checked frame over its bytes.
#[derive(Clone, Debug)]
pub struct Frame {
    bytes: Bytes,
    kind: Kind,
}

impl Frame {
    /// Checks `bytes` as one whole frame.
    pub fn parse(bytes: Bytes) -> Result<Frame, FrameError> {
        let b = &bytes[..];
        let Prefix { tag, total } = Prefix::peek(b)?;
        let kind = Kind::from_u8(b[field::KIND]).ok_or(FrameError::Kind {
            kind: b[field::KIND],
            tag,
        })?;
        let bad = |what| Err(FrameError::Field { kind, tag, what });
        if total != b.len() as u64 {
            return Err(FrameError::Length {
                tag,
                declared: total,
                actual: b.len(),
            });
        }
        let flags = b[field::FLAGS];
        if flags & !kind.allowed_flags() != 0 {
            return bad("flags this kind does not take");
        }
        let Some(status) = Code::from_u8(b[field::STATUS]) else {
            return bad("unknown status code");
        };
        if kind != Kind::Status && status != Code::Ok {
            return bad("a status on a frame that is not STATUS");
        }
        if b[field::RESERVED] != [0, 0] {
            return bad("reserved bytes not zero");
        }
        if kind != Kind::Request && be32(&b[field::DEADLINE]) != 0 {
            return bad("a deadline on a frame that is not REQUEST");
        }
        let credit = be32(&b[field::CREDIT]);
        if (kind == Kind::Credit) != (credit != 0) {
            return bad("credit only on CREDIT frames, and not zero there");
        }
        if tag == 0 && kind != Kind::Status {
            return bad("tag 0 names the connection, which only a STATUS may");
        }
        let method_len = be16(&b[field::METHOD_LEN]) as usize;
        if (kind == Kind::Request) != (method_len != 0) {
            return bad("a method on REQUEST frames only, and not empty there");
        }
        if method_len > MAX_METHOD {
            return bad("method name too long");
        }
        if std::str::from_utf8(&b[HEADER_LEN..HEADER_LEN + method_len]).is_err() {
            return bad("method name not UTF-8");
        }
        let payload_len = b.len() - HEADER_LEN - method_len;
        let message = flags & Flags::MESSAGE != 0;
        if !message && payload_len != 0 && kind != Kind::Status {
            return bad("payload without the MESSAGE flag");
        }
        if kind == Kind::Status
            && !message
            && std::str::from_utf8(&b[HEADER_LEN + method_len..]).is_err()
        {
            return bad("status text not UTF-8");
        }
        Ok(Frame { bytes, kind })
    }

    /// What the frame says.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The call.
    pub fn tag(&self) -> u32 {
        be32(&self.bytes[field::TAG])
    }

    /// [`Flags`] bits.
    pub fn flags(&self) -> u8 {
        self.bytes[field::FLAGS]
    }

    /// Carries a message.
    pub fn has_message(&self) -> bool {
        self.flags() & Flags::MESSAGE != 0
    }

    /// The sender's stream ends here.
    pub fn is_end(&self) -> bool {
        self.flags() & Flags::END != 0
    }

    /// The status code (checked on parse).
    pub fn status(&self) -> Code {
        Code::from_u8(self.bytes[field::STATUS]).unwrap_or(Code::Internal)
    }

    /// Microseconds the call has left; 0: no deadline.
    pub fn deadline_us(&self) -> u32 {
        be32(&self.bytes[field::DEADLINE])
    }

    /// Messages granted.
    pub fn credit(&self) -> u32 {
        be32(&self.bytes[field::CREDIT])
    }

    fn method_len(&self) -> usize {
        be16(&self.bytes[field::METHOD_LEN]) as usize
    }

    /// The method, as bytes (zero-copy), checked UTF-8.
    pub fn method_bytes(&self) -> Bytes {
        self.bytes.slice(HEADER_LEN..HEADER_LEN + self.method_len())
    }

    /// The payload (zero-copy).
    pub fn payload(&self) -> Bytes {
        self.bytes.slice(HEADER_LEN + self.method_len()..)
    }
}

/// Appends a whole frame (header, method, payload) to `out`.
pub fn encode(head: &Head, method: &[u8], payload: &[u8], out: &mut BytesMut) {
    head.encode(method, payload.len(), out);
    out.put_slice(payload);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(head: Head, method: &[u8], payload: &[u8]) -> Bytes {
        let mut b = BytesMut::new();
        encode(&head, method, payload, &mut b);
        b.freeze()
    }

    fn request() -> Head {
        Head {
            flags: Flags::MESSAGE | Flags::END,
            deadline_us: 5000,
            ..Head::new(Kind::Request, 7)
        }
    }

    #[test]
    fn a_request_round_trips_with_every_field() {
        let f = Frame::parse(frame(request(), b"/echo/Unary", b"hi")).unwrap();
        assert_eq!(f.kind(), Kind::Request);
        assert_eq!(f.tag(), 7);
        assert!(f.has_message() && f.is_end());
        assert_eq!(f.deadline_us(), 5000);
        assert_eq!(&f.method_bytes()[..], b"/echo/Unary");
        assert_eq!(&f.payload()[..], b"hi");
    }

    #[test]
    fn a_status_with_text_round_trips() {
        let head = Head {
            status: Code::NotFound,
            ..Head::new(Kind::Status, 9)
        };
        let f = Frame::parse(frame(head, b"", b"no such thing")).unwrap();
        assert_eq!(f.status(), Code::NotFound);
        assert_eq!(&f.payload()[..], b"no such thing");
    }

    #[test]
    fn every_truncation_of_a_frame_is_an_error() {
        let whole = frame(request(), b"/m", b"payload");
        for n in 0..whole.len() {
            assert!(Frame::parse(whole.slice(..n)).is_err(), "{n} bytes");
        }
    }

    #[test]
    fn a_frame_with_trailing_bytes_is_an_error() {
        let mut b = BytesMut::from(&frame(request(), b"/m", b"x")[..]);
        b.put_u8(0);
        let e = Frame::parse(b.freeze()).unwrap_err();
        assert!(matches!(e, FrameError::Length { tag: 7, .. }), "{e}");
    }

    #[test]
    fn fields_a_kind_must_not_carry_are_refused_with_the_tag() {
        let cases: [(Head, &[u8], &[u8]); 8] = [
            // A method on a MESSAGE.
            (Head::new(Kind::Message, 3), b"/m", b""),
            // A REQUEST without a method.
            (Head::new(Kind::Request, 3), b"", b""),
            // A status on a REQUEST.
            (
                Head {
                    status: Code::Internal,
                    ..Head::new(Kind::Request, 3)
                },
                b"/m",
                b"",
            ),
            // END on a STATUS.
            (
                Head {
                    flags: Flags::END,
                    ..Head::new(Kind::Status, 3)
                },
                b"",
                b"",
            ),
            // CREDIT of zero.
            (Head::new(Kind::Credit, 3), b"", b""),
            // Credit on a CANCEL.
            (
                Head {
                    credit: 4,
                    ..Head::new(Kind::Cancel, 3)
                },
                b"",
                b"",
            ),
            // A deadline on a MESSAGE.
            (
                Head {
                    deadline_us: 1,
                    ..Head::new(Kind::Message, 3)
                },
                b"",
                b"",
            ),
            // A payload without MESSAGE.
            (Head::new(Kind::Message, 3), b"", b"x"),
        ];
        for (head, method, payload) in cases {
            let e = Frame::parse(frame(head, method, payload)).unwrap_err();
            assert_eq!(e.tag(), Some(3), "{head:?}: {e}");
        }
    }

    #[test]
    fn unknown_kinds_versions_and_codes_are_errors() {
        let good = frame(request(), b"/m", b"");
        for (at, value) in [(0, 2u8), (1, 0), (1, 6), (2, 0x80), (3, 17), (18, 1)] {
            let mut b = BytesMut::from(&good[..]);
            b[at] = value;
            assert!(Frame::parse(b.freeze()).is_err(), "byte {at} = {value}");
        }
    }

    #[test]
    fn a_method_that_is_not_utf8_is_an_error() {
        let e = Frame::parse(frame(request(), &[0xff, 0xfe], b"")).unwrap_err();
        assert_eq!(e.tag(), Some(7));
    }

    #[test]
    fn the_prefix_gives_the_whole_length_from_the_header_alone() {
        let whole = frame(request(), b"/m", &[0u8; 1000]);
        let p = Prefix::peek(&whole[..HEADER_LEN]).unwrap();
        assert_eq!(p.total, whole.len() as u64);
        assert_eq!(p.tag, 7);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for len in 0..400usize {
            let mut b = BytesMut::from(&frame(request(), b"/m", b"abc")[..]);
            b.resize(len.min(40), 0);
            for byte in b.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                if seed.is_multiple_of(3) {
                    *byte = seed as u8;
                }
            }
            let _ = Frame::parse(b.freeze());
        }
    }
}
