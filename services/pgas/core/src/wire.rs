//! The frames endpoints exchange inside uniplane messages.
//!
//! Every frame starts with a fixed 32-byte header (big-endian fields),
//! then a descriptor whose shape depends on the kind, then payload bytes:
//!
//! ```text
//!  0      1      2        4        8        12       14     15     16        24       28       32
//!  ┌──────┬──────┬────────┬────────┬────────┬────────┬──────┬──────┬─────────┬────────┬────────┐
//!  │ kind │flags │handler │ token  │ credit │segment │status│  op  │   arg   │  len   │ count  │ descriptor │ payload
//!  └──────┴──────┴────────┴────────┴────────┴────────┴──────┴──────┴─────────┴────────┴────────┘
//! ```
//!
//! Requests travel on the data connection (traffic class 0), replies,
//! credits and barrier messages on the control connection (class 1). A
//! message whose payload does not fit one frame is sent as a first frame
//! (header, descriptor, start of the payload) followed by [`Kind::Cont`]
//! frames carrying the rest; `len` in the first frame is the whole
//! payload's length, so the target validates the whole access once.
//!
//! Decoding never panics: a frame too short for its header or
//! descriptor, an unknown kind, or a descriptor that contradicts `len` is
//! a [`WireError`].

use std::net::Ipv4Addr;

use bytes::{BufMut, BytesMut};

/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 32;
/// The largest frame: one uniplane message's payload
/// (`uniplane_dataplane::Message::MAX_PAYLOAD`; `uniplane-pgas` checks
/// the two agree, this crate stays free of the dataplane).
pub const MAX_FRAME: usize = 65_535;
/// The least credit a frame costs: bounds the frames in flight to a
/// target (a full connection inbox would stall its whole session).
pub const MIN_CHARGE: usize = 512;

/// The credit a frame of `len` bytes costs; sender and target count
/// alike.
pub fn charge(len: usize) -> usize {
    len.max(MIN_CHARGE)
}

/// Most entries of a vectored long message (its descriptor must fit the
/// first frame).
pub const MAX_VECTOR: usize = 4096;

/// Bytes of one vector entry in the descriptor (offset u64, length u32).
const VECTOR_ENTRY: usize = 12;

/// Most members a `Hello` to a hardware rank names (its payload: the
/// group, [`put_members`]).
pub const MAX_MEMBERS: usize = 4096;

/// Bytes a member takes in a `Hello`'s payload.
pub const MEMBER_BYTES: usize = 6;

/// Appends `members` (server IPv4, device; by rank) as a `Hello` to a
/// hardware rank carries them: 6 bytes each, the device little-endian.
/// A hardware rank checks the connection's caller, as the daemon names
/// it, against the member at the rank the `Hello` claims.
pub fn put_members(members: impl IntoIterator<Item = (Ipv4Addr, u16)>, buf: &mut BytesMut) {
    for (server, device) in members {
        buf.extend_from_slice(&server.octets());
        buf.extend_from_slice(&device.to_le_bytes());
    }
}

/// The members in a `Hello`'s payload: `None` when it is not a whole
/// number of members, or none, or more than [`MAX_MEMBERS`].
pub fn parse_members(b: &[u8]) -> Option<Vec<(Ipv4Addr, u16)>> {
    let n = b.len() / MEMBER_BYTES;
    if !b.len().is_multiple_of(MEMBER_BYTES) || n == 0 || n > MAX_MEMBERS {
        return None;
    }
    Some(
        b.chunks_exact(MEMBER_BYTES)
            .map(|m| {
                (
                    Ipv4Addr::new(m[0], m[1], m[2], m[3]),
                    u16::from_le_bytes([m[4], m[5]]),
                )
            })
            .collect(),
    )
}

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Short active message: no payload, `arg` to the handler.
    Short = 1,
    /// Medium: payload to the handler.
    Medium = 2,
    /// Long: payload written at `offset` of `segment`, then the handler.
    Long = 3,
    /// Strided long: `count` blocks of `block` bytes, `stride` apart.
    Strided = 4,
    /// Vectored long: `count` (offset, length) pieces.
    Vectored = 5,
    /// The next part of the payload of the message in progress.
    Cont = 6,
    /// Get medium: payload to the handler, its answer comes back.
    GetMedium = 7,
    /// Get long: `len` bytes at `offset` of `segment` come back.
    GetLong = 8,
    /// An atomic on a 32- or 64-bit word of a segment.
    Atomic = 9,
    /// Answered once everything sent before it was processed (quiet).
    Flush = 10,
    /// A reply: `token` and `status` of a request, maybe data.
    Reply = 32,
    /// Credit (bytes) given back to the sender, nothing else.
    Credit = 33,
    /// A rank reached barrier `arg` (sent to rank 0).
    BarrierEnter = 34,
    /// Everyone reached barrier `arg` (sent by rank 0).
    BarrierRelease = 35,
    /// The connector names itself: rank in `len`, role in `op`.
    Hello = 36,
    /// The acceptor has routed the connection: the connector may send.
    Ready = 37,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        use Kind::*;
        Some(match b {
            1 => Short,
            2 => Medium,
            3 => Long,
            4 => Strided,
            5 => Vectored,
            6 => Cont,
            7 => GetMedium,
            8 => GetLong,
            9 => Atomic,
            10 => Flush,
            32 => Reply,
            33 => Credit,
            34 => BarrierEnter,
            35 => BarrierRelease,
            36 => Hello,
            37 => Ready,
            _ => return None,
        })
    }

    /// Bytes of this kind's descriptor when it has a fixed one.
    fn fixed_descriptor(self) -> usize {
        match self {
            Kind::Long | Kind::GetLong => 8,
            Kind::Strided => 20,
            Kind::Atomic => 24,
            _ => 0,
        }
    }
}

/// Header flag: no reply unless the request is refused.
pub const FLAG_ASYNC: u8 = 1;

/// Header flag of a contiguous long message whose `len` bytes the sender
/// has written itself into the target's segment, shared with it on one
/// server: the frame carries no payload, and the target counts the
/// bytes, runs the handler and replies as if they had come in frames.
pub const FLAG_LANDED: u8 = 2;

/// Why a decoder refused bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than what the header or descriptor needs.
    #[error("frame of {0} bytes is truncated")]
    Truncated(usize),
    /// An unknown kind byte.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A descriptor that cannot describe an access (overflow, a stride
    /// shorter than its block, too many vector entries, lengths that do
    /// not add up to `len`).
    #[error("bad descriptor: {0}")]
    BadDescriptor(&'static str),
}

/// The fixed header of a frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Head {
    /// What the frame is (a [`Kind`] as a byte).
    pub kind: u8,
    /// [`FLAG_ASYNC`] or 0.
    pub flags: u8,
    /// Handler ID.
    pub handler: u16,
    /// Matches a reply to its request.
    pub token: u32,
    /// Credit bytes given back (replies and credit frames).
    pub credit: u32,
    /// Segment ID.
    pub segment: u16,
    /// Reply status (a [`crate::Refusal`] code, 0 for success).
    pub status: u8,
    /// Atomic operation, or the role of a hello.
    pub op: u8,
    /// Handler argument, atomic operand, barrier epoch.
    pub arg: u64,
    /// Payload length of the whole message (or of a get; a hello's rank).
    pub len: u32,
    /// Strided blocks, vector entries, atomic width in bytes.
    pub count: u32,
}

impl Head {
    /// A header of `kind`, every other field zero.
    pub fn new(kind: Kind) -> Head {
        Head {
            kind: kind as u8,
            ..Head::default()
        }
    }

    /// Its kind.
    pub fn kind(&self) -> Option<Kind> {
        Kind::from_u8(self.kind)
    }

    /// Appends the header's 32 bytes.
    pub fn put(&self, b: &mut BytesMut) {
        b.put_u8(self.kind);
        b.put_u8(self.flags);
        b.put_u16(self.handler);
        b.put_u32(self.token);
        b.put_u32(self.credit);
        b.put_u16(self.segment);
        b.put_u8(self.status);
        b.put_u8(self.op);
        b.put_u64(self.arg);
        b.put_u32(self.len);
        b.put_u32(self.count);
    }

    /// The header of `frame` and the bytes after it.
    pub fn parse(frame: &[u8]) -> Result<(Head, &[u8]), WireError> {
        if frame.len() < HEADER_LEN {
            return Err(WireError::Truncated(frame.len()));
        }
        let u16_at = |i: usize| u16::from_be_bytes([frame[i], frame[i + 1]]);
        let u32_at = |i: usize| u32::from_be_bytes(frame[i..i + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |i: usize| u64::from_be_bytes(frame[i..i + 8].try_into().unwrap_or([0; 8]));
        let head = Head {
            kind: frame[0],
            flags: frame[1],
            handler: u16_at(2),
            token: u32_at(4),
            credit: u32_at(8),
            segment: u16_at(12),
            status: frame[14],
            op: frame[15],
            arg: u64_at(16),
            len: u32_at(24),
            count: u32_at(28),
        };
        if head.kind().is_none() {
            return Err(WireError::UnknownKind(head.kind));
        }
        Ok((head, &frame[HEADER_LEN..]))
    }
}

/// Where the payload of a long message lands in the target's segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// One range from `offset`.
    Contiguous {
        /// Start in the segment.
        offset: u64,
    },
    /// `count` blocks of `block` bytes, the first at `offset`, each next
    /// one `stride` bytes further.
    Strided {
        /// Start of the first block.
        offset: u64,
        /// Distance between block starts (at least `block`).
        stride: u64,
        /// Bytes per block.
        block: u32,
        /// Blocks.
        count: u32,
    },
    /// Pieces (offset, length), filled in order.
    Vectored(Vec<(u64, u32)>),
}

impl Shape {
    /// Payload bytes the shape takes.
    pub fn total(&self) -> Option<u64> {
        match self {
            Shape::Contiguous { .. } => None,
            Shape::Strided { block, count, .. } => u64::from(*block).checked_mul(u64::from(*count)),
            Shape::Vectored(v) => Some(v.iter().map(|(_, l)| u64::from(*l)).sum()),
        }
    }

    /// One past the highest byte the shape touches for a `total`-byte
    /// payload, or `None` on overflow.
    pub fn end(&self, total: u64) -> Option<u64> {
        match self {
            Shape::Contiguous { offset } => offset.checked_add(total),
            Shape::Strided {
                offset,
                stride,
                block,
                count,
            } => {
                if *count == 0 {
                    return Some(*offset);
                }
                stride
                    .checked_mul(u64::from(*count - 1))?
                    .checked_add(u64::from(*block))?
                    .checked_add(*offset)
            }
            Shape::Vectored(v) => v.iter().try_fold(0u64, |end, (o, l)| {
                Some(end.max(o.checked_add(u64::from(*l))?))
            }),
        }
    }

    /// Pieces of the shape.
    pub fn pieces(&self, total: u64) -> usize {
        match self {
            Shape::Contiguous { .. } => usize::from(total > 0),
            Shape::Strided { count, .. } => *count as usize,
            Shape::Vectored(v) => v.len(),
        }
    }

    /// Piece `i`: its offset and length (`total` for a contiguous shape).
    pub fn piece(&self, i: usize, total: u64) -> (u64, u64) {
        match self {
            Shape::Contiguous { offset } => (*offset, total),
            Shape::Strided {
                offset,
                stride,
                block,
                ..
            } => (offset + stride * i as u64, u64::from(*block)),
            Shape::Vectored(v) => (v[i].0, u64::from(v[i].1)),
        }
    }

    /// The descriptor bytes, and the count field that goes with them.
    pub fn put(&self, b: &mut BytesMut) -> u32 {
        match self {
            Shape::Contiguous { offset } => {
                b.put_u64(*offset);
                0
            }
            Shape::Strided {
                offset,
                stride,
                block,
                count,
            } => {
                b.put_u64(*offset);
                b.put_u64(*stride);
                b.put_u32(*block);
                *count
            }
            Shape::Vectored(v) => {
                for (o, l) in v {
                    b.put_u64(*o);
                    b.put_u32(*l);
                }
                v.len() as u32
            }
        }
    }

    /// Descriptor bytes of this shape.
    pub fn descriptor_len(&self) -> usize {
        match self {
            Shape::Contiguous { .. } => 8,
            Shape::Strided { .. } => 20,
            Shape::Vectored(v) => v.len() * VECTOR_ENTRY,
        }
    }

    /// Checks what the decoder checks, before sending.
    pub fn validate(&self, total: u64) -> Result<(), WireError> {
        if let Shape::Strided {
            stride,
            block,
            count,
            ..
        } = self
        {
            if *count > 1 && *stride < u64::from(*block) {
                return Err(WireError::BadDescriptor("stride shorter than block"));
            }
        }
        if let Shape::Vectored(v) = self {
            if v.len() > MAX_VECTOR {
                return Err(WireError::BadDescriptor("too many vector entries"));
            }
        }
        if let Some(t) = self.total() {
            if t != total {
                return Err(WireError::BadDescriptor("pieces do not add up to len"));
            }
        }
        if self.end(total).is_none() {
            return Err(WireError::BadDescriptor("range overflows"));
        }
        Ok(())
    }
}

/// The shape of a long, strided or vectored first frame, and the payload
/// bytes after its descriptor.
pub fn parse_shape<'a>(head: &Head, rest: &'a [u8]) -> Result<(Shape, &'a [u8]), WireError> {
    let u64_at = |i: usize| u64::from_be_bytes(rest[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |i: usize| u32::from_be_bytes(rest[i..i + 4].try_into().unwrap_or([0; 4]));
    let (shape, used) = match head.kind() {
        Some(Kind::Long) => {
            if rest.len() < 8 {
                return Err(WireError::Truncated(HEADER_LEN + rest.len()));
            }
            (Shape::Contiguous { offset: u64_at(0) }, 8)
        }
        Some(Kind::Strided) => {
            if rest.len() < 20 {
                return Err(WireError::Truncated(HEADER_LEN + rest.len()));
            }
            let shape = Shape::Strided {
                offset: u64_at(0),
                stride: u64_at(8),
                block: u32_at(16),
                count: head.count,
            };
            (shape, 20)
        }
        Some(Kind::Vectored) => {
            let n = head.count as usize;
            if n > MAX_VECTOR {
                return Err(WireError::BadDescriptor("too many vector entries"));
            }
            let used = n * VECTOR_ENTRY;
            if rest.len() < used {
                return Err(WireError::Truncated(HEADER_LEN + rest.len()));
            }
            let v = (0..n)
                .map(|i| (u64_at(i * VECTOR_ENTRY), u32_at(i * VECTOR_ENTRY + 8)))
                .collect();
            (Shape::Vectored(v), used)
        }
        _ => return Err(WireError::BadDescriptor("not a long message")),
    };
    shape.validate(u64::from(head.len))?;
    Ok((shape, &rest[used..]))
}

/// The fixed descriptor of a get-long (offset) or atomic (offset,
/// operand, compare) frame, as three words (missing ones zero).
pub fn parse_words(head: &Head, rest: &[u8]) -> Result<[u64; 3], WireError> {
    let need = head.kind().map_or(0, Kind::fixed_descriptor);
    if rest.len() < need {
        return Err(WireError::Truncated(HEADER_LEN + rest.len()));
    }
    let mut words = [0u64; 3];
    for (i, w) in words.iter_mut().enumerate().take(need / 8) {
        *w = u64::from_be_bytes(rest[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    }
    Ok(words)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_header_round_trips() {
        let h = Head {
            kind: Kind::Strided as u8,
            flags: FLAG_ASYNC,
            handler: 700,
            token: 0xdead_beef,
            credit: 12345,
            segment: 9,
            status: 3,
            op: 2,
            arg: u64::MAX - 1,
            len: 4 << 20,
            count: 77,
        };
        let mut b = BytesMut::new();
        h.put(&mut b);
        assert_eq!(b.len(), HEADER_LEN);
        let (back, rest) = Head::parse(&b).unwrap();
        assert_eq!(back, h);
        assert!(rest.is_empty());
    }

    #[test]
    fn a_short_or_unknown_header_is_an_error() {
        assert_eq!(Head::parse(&[1; 31]), Err(WireError::Truncated(31)));
        let mut b = BytesMut::new();
        Head {
            kind: 99,
            ..Head::default()
        }
        .put(&mut b);
        assert_eq!(Head::parse(&b), Err(WireError::UnknownKind(99)));
    }

    #[test]
    fn a_strided_shape_with_a_stride_shorter_than_its_block_is_refused() {
        let mut h = Head::new(Kind::Strided);
        h.len = 8;
        h.count = 2;
        let mut b = BytesMut::new();
        Shape::Strided {
            offset: 0,
            stride: 2,
            block: 4,
            count: 2,
        }
        .put(&mut b);
        assert!(matches!(
            parse_shape(&h, &b),
            Err(WireError::BadDescriptor(_))
        ));
    }

    #[test]
    fn a_hellos_members_round_trip_and_bad_lists_are_refused() {
        let members: Vec<(Ipv4Addr, u16)> = (0..5u16)
            .map(|i| (Ipv4Addr::new(10, 0, i as u8, 1), 0xff00 | i))
            .collect();
        let mut b = BytesMut::new();
        put_members(members.iter().copied(), &mut b);
        assert_eq!(b.len(), 5 * MEMBER_BYTES);
        assert_eq!(parse_members(&b), Some(members));
        assert_eq!(parse_members(&b[..b.len() - 1]), None, "a cut member");
        assert_eq!(parse_members(&[]), None, "no members");
        let too_many = vec![0u8; (MAX_MEMBERS + 1) * MEMBER_BYTES];
        assert_eq!(parse_members(&too_many), None);
        assert_eq!(
            parse_members(&too_many[MEMBER_BYTES..]).map(|m| m.len()),
            Some(MAX_MEMBERS)
        );
    }

    #[test]
    fn an_overflowing_range_is_refused() {
        let mut h = Head::new(Kind::Long);
        h.len = 16;
        let mut b = BytesMut::new();
        Shape::Contiguous {
            offset: u64::MAX - 4,
        }
        .put(&mut b);
        assert!(matches!(
            parse_shape(&h, &b),
            Err(WireError::BadDescriptor(_))
        ));
    }

    proptest! {
        /// Whatever the bytes, decoding returns, never panics.
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok((h, rest)) = Head::parse(&bytes) {
                let _ = parse_shape(&h, rest);
                let _ = parse_words(&h, rest);
            }
        }

        /// A vectored descriptor reads back as written.
        #[test]
        fn vectored_shapes_round_trip(v in proptest::collection::vec((0u64..1 << 40, 0u32..1 << 20), 0..50)) {
            let shape = Shape::Vectored(v);
            let total = shape.total().unwrap();
            let mut h = Head::new(Kind::Vectored);
            h.len = total as u32;
            let mut b = BytesMut::new();
            h.count = shape.put(&mut b);
            let (back, rest) = parse_shape(&h, &b).unwrap();
            prop_assert_eq!(back, shape);
            prop_assert!(rest.is_empty());
        }
    }
}
