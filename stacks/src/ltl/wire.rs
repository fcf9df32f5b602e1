//! The LTL frame on the wire: a 32-byte header (one beat, like the overlay
//! header) and, for DATA and NACK, a payload. One frame is one datagram.
//!
//! ```text
//!  0       1       2       3       4
//!  +-------+-------+-------+-------+
//!  |version| kind  | flags | rsvd  |   version 1; flags and rsvd are 0
//!  +-------+-------+-------+-------+
//!  |            src_conn           |   sender's connection id (SYN_ACK: a cookie)
//!  +-------------------------------+
//!  |            dst_conn           |   receiver's connection id (0 in SYN)
//!  +-------------------------------+
//!  |              seq              |   DATA, FIN: this frame; SYN, SYN_ACK: initial
//!  +-------------------------------+   (SYN_ACK: a cookie)
//!  |              ack              |   next sequence number expected
//!  +-------------------------------+
//!  |             window            |   credit: SYN relative, else absolute limit
//!  +---------------+---------------+
//!  |    length     |     rsvd      |   payload bytes
//!  +---------------+---------------+
//!  |            checksum           |   CRC-32C of payload, then header (this field 0)
//!  +-------------------------------+
//! ```
//!
//! The handshake: SYN (the opener's id and initial sequence number, its
//! credit), SYN_ACK (the listener's id and initial sequence number, the
//! opener's initial sequence number as `ack`, credit as a limit), then
//! any frame of the opener's. A SYN_ACK's `src_conn` and `seq` are a SYN
//! cookie: the listener keeps nothing until the opener echoes them, which
//! it does in every frame until the listener sends it anything else
//! (`dst_conn` = the SYN_ACK's `src_conn`, `ack` = its `seq`). Those
//! frames also carry the opener's credit as an absolute `window`, so the
//! listener needs nothing of the SYN but what the cookie holds; the SYN's
//! own `window` goes unused.
//!
//! Big-endian. [`Frame::new_checked`] validates once — length, version,
//! kind, reserved bits, payload rules, checksum — and the accessors then
//! read in place, as smoltcp's wire views do.

use super::crc::Crc32c;

/// Field byte ranges.
pub mod field {
    use std::ops::Range;

    /// Protocol version.
    pub const VERSION: usize = 0;
    /// Frame kind.
    pub const KIND: usize = 1;
    /// Flags (none defined; must be 0).
    pub const FLAGS: usize = 2;
    /// Reserved byte.
    pub const RSVD0: usize = 3;
    /// Sender's connection id.
    pub const SRC_CONN: Range<usize> = 4..8;
    /// Receiver's connection id.
    pub const DST_CONN: Range<usize> = 8..12;
    /// Sequence number.
    pub const SEQ: Range<usize> = 12..16;
    /// Cumulative acknowledgement.
    pub const ACK: Range<usize> = 16..20;
    /// Receive credit.
    pub const WINDOW: Range<usize> = 20..24;
    /// Payload length.
    pub const LENGTH: Range<usize> = 24..26;
    /// Reserved.
    pub const RSVD1: Range<usize> = 26..28;
    /// CRC-32C.
    pub const CHECKSUM: Range<usize> = 28..32;
}

/// Header size in bytes.
pub const HEADER_LEN: usize = 32;
/// The protocol version this code speaks.
pub const VERSION: u8 = 1;
/// A NACK's selective-acknowledgement bitmap comes in blocks of this many
/// bytes: bit `i` (most significant first) says frame `ack + 1 + i`
/// arrived, and a NACK carries as many blocks as it needs, 1 to
/// [`MAX_SACK_BLOCKS`].
pub const SACK_LEN: usize = 32;
/// Most bitmap blocks in a NACK: it reports frames up to `ack + 2048`.
pub const MAX_SACK_BLOCKS: usize = 8;
/// Longest NACK bitmap in bytes.
pub const MAX_SACK_BYTES: usize = SACK_LEN * MAX_SACK_BLOCKS;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Overlay messages, packed; consumes a sequence number.
    Data = 1,
    /// Cumulative acknowledgement and credit.
    Ack = 2,
    /// An acknowledgement that reports a gap, with a bitmap of the frames
    /// received beyond it: retransmit the holes now.
    Nack = 3,
    /// Opens a connection.
    Syn = 4,
    /// Accepts a connection.
    SynAck = 5,
    /// The sender sends no more; consumes a sequence number.
    Fin = 6,
    /// Are you there? Answered with an ACK.
    Keepalive = 7,
    /// No such connection, or it was aborted.
    Rst = 8,
}

impl Kind {
    /// The kind with this code.
    pub const fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::Data,
            2 => Kind::Ack,
            3 => Kind::Nack,
            4 => Kind::Syn,
            5 => Kind::SynAck,
            6 => Kind::Fin,
            7 => Kind::Keepalive,
            8 => Kind::Rst,
            _ => return None,
        })
    }
}

/// Why bytes are not an LTL frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than a header, or than header and payload.
    #[error("truncated frame: {0} bytes")]
    Truncated(usize),
    /// Longer than header and payload.
    #[error("{0} bytes of trailing garbage")]
    Trailing(usize),
    /// Another version of the protocol.
    #[error("unknown version {0}")]
    Version(u8),
    /// An unassigned kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Reserved bits set.
    #[error("reserved bits set")]
    Reserved,
    /// A payload where none belongs, or none where one must be.
    #[error("{kind:?} frame with a payload of {length} bytes")]
    Payload {
        /// The frame's kind.
        kind: Kind,
        /// Its payload length.
        length: usize,
    },
    /// The checksum does not match: the frame was corrupted.
    #[error("checksum mismatch")]
    Checksum,
}

/// A checked view of an LTL frame.
#[derive(Clone, Copy, Debug)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

#[inline]
fn be32(b: &[u8], r: std::ops::Range<usize>) -> u32 {
    u32::from_be_bytes([b[r.start], b[r.start + 1], b[r.start + 2], b[r.start + 3]])
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` after checking every rule, the checksum included.
    pub fn new_checked(buffer: T) -> Result<Self, FrameError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(FrameError::Truncated(b.len()));
        }
        if b[field::VERSION] != VERSION {
            return Err(FrameError::Version(b[field::VERSION]));
        }
        let kind = Kind::from_u8(b[field::KIND]).ok_or(FrameError::Kind(b[field::KIND]))?;
        if b[field::FLAGS] != 0 || b[field::RSVD0] != 0 || b[field::RSVD1] != [0, 0] {
            return Err(FrameError::Reserved);
        }
        let length =
            u16::from_be_bytes([b[field::LENGTH.start], b[field::LENGTH.start + 1]]) as usize;
        let total = HEADER_LEN + length;
        if b.len() < total {
            return Err(FrameError::Truncated(b.len()));
        }
        if b.len() > total {
            return Err(FrameError::Trailing(b.len() - total));
        }
        let ok = match kind {
            Kind::Data => length > 0,
            Kind::Nack => length > 0 && length.is_multiple_of(SACK_LEN) && length <= MAX_SACK_BYTES,
            _ => length == 0,
        };
        if !ok {
            return Err(FrameError::Payload { kind, length });
        }
        if checksum(&b[..HEADER_LEN], &b[HEADER_LEN..]) != be32(b, field::CHECKSUM) {
            return Err(FrameError::Checksum);
        }
        Ok(Frame { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }

    /// The frame's kind.
    pub fn kind(&self) -> Kind {
        Kind::from_u8(self.b()[field::KIND]).unwrap_or(Kind::Rst)
    }

    /// Sender's connection id.
    pub fn src_conn(&self) -> u32 {
        be32(self.b(), field::SRC_CONN)
    }

    /// Receiver's connection id.
    pub fn dst_conn(&self) -> u32 {
        be32(self.b(), field::DST_CONN)
    }

    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.b(), field::SEQ)
    }

    /// Cumulative acknowledgement.
    pub fn ack(&self) -> u32 {
        be32(self.b(), field::ACK)
    }

    /// Receive credit.
    pub fn window(&self) -> u32 {
        be32(self.b(), field::WINDOW)
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..]
    }
}

/// The header fields of a frame to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Repr {
    /// Kind.
    pub kind: Kind,
    /// Sender's connection id.
    pub src_conn: u32,
    /// Receiver's connection id.
    pub dst_conn: u32,
    /// Sequence number.
    pub seq: u32,
    /// Cumulative acknowledgement.
    pub ack: u32,
    /// Receive credit.
    pub window: u32,
}

/// CRC-32C over the payload, then the header with the checksum field 0.
fn checksum(header: &[u8], payload: &[u8]) -> u32 {
    payload_checksum(payload).finish_with(header)
}

/// The checksum state after the payload, which a sender keeps to
/// retransmit a frame under a fresh header without reading the payload
/// again.
#[derive(Clone, Copy, Debug)]
pub struct PayloadSum(Crc32c);

/// Starts the checksum of a frame with its payload.
pub fn payload_checksum(payload: &[u8]) -> PayloadSum {
    PayloadSum(Crc32c::new().update(payload))
}

impl PayloadSum {
    fn finish_with(self, header: &[u8]) -> u32 {
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(&header[..HEADER_LEN]);
        h[field::CHECKSUM].fill(0);
        self.0.update(&h).finish()
    }
}

impl Repr {
    /// Appends the frame (header, then `payload`) to `out`; `sum` is
    /// [`payload_checksum`] of `payload`.
    pub fn emit(&self, payload: &[u8], sum: PayloadSum, out: &mut bytes::BytesMut) {
        let mut h = [0u8; HEADER_LEN];
        h[field::VERSION] = VERSION;
        h[field::KIND] = self.kind as u8;
        h[field::SRC_CONN].copy_from_slice(&self.src_conn.to_be_bytes());
        h[field::DST_CONN].copy_from_slice(&self.dst_conn.to_be_bytes());
        h[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        h[field::ACK].copy_from_slice(&self.ack.to_be_bytes());
        h[field::WINDOW].copy_from_slice(&self.window.to_be_bytes());
        h[field::LENGTH].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        let c = sum.finish_with(&h);
        h[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(payload);
    }

    /// Appends a frame with no payload.
    pub fn emit_empty(&self, out: &mut bytes::BytesMut) {
        self.emit(&[], payload_checksum(&[]), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;

    fn repr(kind: Kind) -> Repr {
        Repr {
            kind,
            src_conn: 7,
            dst_conn: 9,
            seq: 100,
            ack: 200,
            window: 300,
        }
    }

    #[test]
    fn an_emitted_frame_reads_back() {
        let mut out = BytesMut::new();
        repr(Kind::Data).emit(b"hello", payload_checksum(b"hello"), &mut out);
        let f = Frame::new_checked(&out[..]).unwrap();
        assert_eq!(f.kind(), Kind::Data);
        assert_eq!(
            (f.src_conn(), f.dst_conn(), f.seq(), f.ack(), f.window()),
            (7, 9, 100, 200, 300)
        );
        assert_eq!(f.payload(), b"hello");
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let mut out = BytesMut::new();
        repr(Kind::Data).emit(b"payload!", payload_checksum(b"payload!"), &mut out);
        for bit in 0..out.len() * 8 {
            let mut bad = out.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(Frame::new_checked(&bad[..]).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn a_nack_carries_one_to_eight_bitmap_blocks() {
        for blocks in 0..=MAX_SACK_BLOCKS + 1 {
            let bitmap = vec![0x5au8; blocks * SACK_LEN];
            let mut out = BytesMut::new();
            repr(Kind::Nack).emit(&bitmap, payload_checksum(&bitmap), &mut out);
            let ok = Frame::new_checked(&out[..]).is_ok();
            assert_eq!(
                ok,
                (1..=MAX_SACK_BLOCKS).contains(&blocks),
                "{blocks} blocks"
            );
        }
    }

    #[test]
    fn length_rules_are_checked() {
        let mut out = BytesMut::new();
        repr(Kind::Ack).emit_empty(&mut out);
        assert!(Frame::new_checked(&out[..]).is_ok());
        assert_eq!(
            Frame::new_checked(&out[..10]).unwrap_err(),
            FrameError::Truncated(10)
        );
        let mut longer = out.clone();
        longer.extend_from_slice(b"xx");
        assert_eq!(
            Frame::new_checked(&longer[..]).unwrap_err(),
            FrameError::Trailing(2)
        );
        let mut odd_nack = BytesMut::new();
        let bitmap = [0xffu8; SACK_LEN + 1];
        repr(Kind::Nack).emit(&bitmap, payload_checksum(&bitmap), &mut odd_nack);
        assert!(matches!(
            Frame::new_checked(&odd_nack[..]),
            Err(FrameError::Payload {
                kind: Kind::Nack,
                ..
            })
        ));
        let mut empty_data = BytesMut::new();
        repr(Kind::Data).emit_empty(&mut empty_data);
        assert!(matches!(
            Frame::new_checked(&empty_data[..]),
            Err(FrameError::Payload {
                kind: Kind::Data,
                ..
            })
        ));
    }
}
