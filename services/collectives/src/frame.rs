//! The frames ranks exchange inside the payload of uniplane SEND
//! messages, one frame per message.
//!
//! ```text
//!  0      1      2       4              12             20             28      32
//!  ┌──────┬──────┬───────┬──────────────┬──────────────┬──────────────┬───────┬──────────┐
//!  │ kind │ flag │ 0     │ communicator │ tag          │ value        │ offset│ data …   │
//!  └──────┴──────┴───────┴──────────────┴──────────────┴──────────────┴───────┴──────────┘
//! ```
//!
//! Big-endian. `value` is, by kind: DATA the whole message's length;
//! RTS the length offered; CTS the receiver's window address; FIN the
//! length written; CREDIT the bytes returned; WELCOME the sender's world
//! rank. `offset` is where a DATA segment's bytes go in its message.
//! [`Frame::parse`] checks everything once; a bad frame is an error,
//! counted and dropped by the caller, never a panic.

use bytes::{BufMut, Bytes, BytesMut};
use uniplane_dataplane::Message;

/// Header bytes in front of every frame's data.
pub const HEADER: usize = 32;
/// The most data one segment carries.
pub const SEGMENT: usize = Message::MAX_PAYLOAD - HEADER;

/// The last DATA segment of a message.
pub const FLAG_LAST: u8 = 1;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// A segment of an eager message.
    Data = 1,
    /// Rendezvous: "I have `value` bytes for this key".
    Rts = 2,
    /// Rendezvous: "write them at my window address `value`".
    Cts = 3,
    /// Rendezvous: "they are written".
    Fin = 4,
    /// Flow control: the receiver consumed `value` bytes of its window.
    Credit = 5,
    // 6 was HELLO, the connector asking again for a WELCOME it had not
    // got: retired once the caller's daemon admitted a connection before
    // the acceptor heard of it.
    /// Connection setup, acceptor to connector: the acceptor's world rank.
    /// Sent once, on accepting; the connector sends no data before it
    /// arrives.
    Welcome = 7,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Data,
            2 => Kind::Rts,
            3 => Kind::Cts,
            4 => Kind::Fin,
            5 => Kind::Credit,
            7 => Kind::Welcome,
            _ => return None,
        })
    }
}

/// Which communicator and tag a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Key {
    /// The communicator's context id.
    pub comm: u64,
    /// The tag within it (collectives use the high half).
    pub tag: u64,
}

/// A checked frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Its kind.
    pub kind: Kind,
    /// Flags ([`FLAG_LAST`]).
    pub flags: u8,
    /// Communicator and tag.
    pub key: Key,
    /// Kind-specific value (see the module documentation).
    pub value: u64,
    /// Offset of a DATA segment in its message.
    pub offset: u32,
    /// The data (DATA only).
    pub data: Bytes,
}

/// Why a frame was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Fewer bytes than a header.
    #[error("frame of {0} bytes is shorter than its header")]
    Short(usize),
    /// An unknown kind byte.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// Reserved bits set, or data on a frame that has none.
    #[error("malformed {0:?} frame")]
    Malformed(Kind),
}

impl Frame {
    /// Parses and checks `payload`.
    pub fn parse(payload: &Bytes) -> Result<Frame, FrameError> {
        let p = payload.as_ref();
        if p.len() < HEADER {
            return Err(FrameError::Short(p.len()));
        }
        let kind = Kind::from_u8(p[0]).ok_or(FrameError::Kind(p[0]))?;
        let flags = p[1];
        let word = |at: usize| u64::from_be_bytes(p[at..at + 8].try_into().unwrap_or([0; 8]));
        let key = Key {
            comm: word(4),
            tag: word(12),
        };
        let value = word(20);
        let offset = u32::from_be_bytes(p[28..32].try_into().unwrap_or([0; 4]));
        let reserved = p[2] != 0 || p[3] != 0;
        let bad_flags = flags & !FLAG_LAST != 0 || (kind != Kind::Data && flags != 0);
        let stray = kind != Kind::Data && (p.len() > HEADER || offset != 0);
        if reserved || bad_flags || stray {
            return Err(FrameError::Malformed(kind));
        }
        Ok(Frame {
            kind,
            flags,
            key,
            value,
            offset,
            data: payload.slice(HEADER..),
        })
    }
}

/// Writes a frame header followed by `data` into `out`.
pub fn encode(
    out: &mut BytesMut,
    kind: Kind,
    flags: u8,
    key: Key,
    value: u64,
    offset: u32,
    data: &[u8],
) {
    out.reserve(HEADER + data.len());
    out.put_u8(kind as u8);
    out.put_u8(flags);
    out.put_u16(0);
    out.put_u64(key.comm);
    out.put_u64(key.tag);
    out.put_u64(value);
    out.put_u32(offset);
    out.put_slice(data);
}

/// A control frame (no data) as bytes.
pub fn control(kind: Kind, key: Key, value: u64) -> Bytes {
    let mut b = BytesMut::with_capacity(HEADER);
    encode(&mut b, kind, 0, key, value, 0, &[]);
    b.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: Key = Key { comm: 7, tag: 9 };

    #[test]
    fn a_data_segment_round_trips() {
        let mut b = BytesMut::new();
        encode(&mut b, Kind::Data, FLAG_LAST, KEY, 100, 40, b"abc");
        let f = Frame::parse(&b.freeze()).unwrap();
        assert_eq!(f.kind, Kind::Data);
        assert_eq!(f.key, KEY);
        assert_eq!((f.value, f.offset, f.flags), (100, 40, FLAG_LAST));
        assert_eq!(&f.data[..], b"abc");
    }

    #[test]
    fn malformed_frames_are_errors_not_panics() {
        assert_eq!(
            Frame::parse(&Bytes::from_static(b"short")),
            Err(FrameError::Short(5))
        );
        let mut b = control(Kind::Cts, KEY, 1).to_vec();
        b[0] = 99;
        assert_eq!(Frame::parse(&Bytes::from(b)), Err(FrameError::Kind(99)));
        let mut b = control(Kind::Cts, KEY, 1).to_vec();
        b.push(0);
        assert_eq!(
            Frame::parse(&Bytes::from(b)),
            Err(FrameError::Malformed(Kind::Cts))
        );
        let mut b = control(Kind::Rts, KEY, 1).to_vec();
        b[1] = FLAG_LAST;
        assert!(Frame::parse(&Bytes::from(b)).is_err());
        // Every prefix and every single-byte corruption parses or fails cleanly.
        let mut whole = BytesMut::new();
        encode(&mut whole, Kind::Data, 0, KEY, 3, 0, b"xyz");
        let whole = whole.to_vec();
        for cut in 0..whole.len() {
            let _ = Frame::parse(&Bytes::copy_from_slice(&whole[..cut]));
        }
        for i in 0..whole.len() {
            let mut c = whole.clone();
            c[i] ^= 0xff;
            let _ = Frame::parse(&Bytes::from(c));
        }
    }
}
