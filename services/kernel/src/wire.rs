//! The frame around every message between a host and a kernel, on
//! whichever path carries it (PIO mailbox or FPGA Connect), and the rule
//! that keeps the two paths one ordered stream.
//!
//! ```text
//!  frame = [ kind u8 | code u8 | conn u16 | request u32 | seq u32 | payload … ]   (little-endian)
//! ```
//!
//! `seq` numbers the frames of one direction, whatever path each took: the
//! receiver takes frame `seq` from the head of either path ([`pick`]), so
//! a small message sent after a large one is not handed over first.
//! `request` is the `seq` of the request an answer belongs to. Answers end
//! their request with `Last`, `Done` (no answer) or `Error`.
//!
//! Decoding checks the kind, the code and the length; a frame that fails
//! is refused with a [`FrameError`], never trusted.

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 12;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// A message for the kernel (host to kernel).
    Request = 1,
    /// An answer; more answers to the same request follow.
    Answer = 2,
    /// The last answer to its request.
    Last = 3,
    /// The request is done and had no answer.
    Done = 4,
    /// The request failed: `code` says why ([`crate::KernelError::code`]).
    Error = 5,
    /// A new connection takes kernel connection `conn` (host to kernel,
    /// before its first request; the payload is its [`Caller`]). Whatever
    /// an earlier connection left in that slot is forgotten. Not
    /// answered.
    Open = 6,
    /// Connection `conn` ended (host to kernel, no payload). Not
    /// answered.
    Close = 7,
}

impl FrameKind {
    /// Whether it ends its request (the host forgets the request).
    pub fn ends_request(self) -> bool {
        matches!(self, FrameKind::Last | FrameKind::Done | FrameKind::Error)
    }
}

/// Who is at the other end of a kernel connection, as the daemon knows
/// it (from the overlay connection, not from anything the caller says):
/// what an [`Open`](FrameKind::Open) frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The caller's server (its UID's IPv4 part).
    pub server: std::net::Ipv4Addr,
    /// The caller's device (its UID's device part).
    pub device: u16,
    /// The caller's port of the connection.
    pub port: u16,
}

impl Caller {
    /// Bytes of an encoded caller.
    pub const BYTES: usize = 8;

    /// `[ server 4 | device u16 | port u16 ]`, little-endian numbers.
    pub fn encode(&self) -> [u8; Caller::BYTES] {
        let mut b = [0u8; Caller::BYTES];
        b[..4].copy_from_slice(&self.server.octets());
        b[4..6].copy_from_slice(&self.device.to_le_bytes());
        b[6..8].copy_from_slice(&self.port.to_le_bytes());
        b
    }

    /// The caller in an `Open` frame's payload, which must be exactly
    /// [`Caller::BYTES`] long.
    pub fn decode(b: &[u8]) -> Option<Caller> {
        let b: &[u8; Caller::BYTES] = b.try_into().ok()?;
        Some(Caller {
            server: std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]),
            device: u16::from_le_bytes([b[4], b[5]]),
            port: u16::from_le_bytes([b[6], b[7]]),
        })
    }
}

/// Why bytes are not a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than a header.
    #[error("frame of {0} bytes is shorter than its header")]
    Short(usize),
    /// An unknown kind.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// A code on a frame that carries none, or a payload on one that
    /// carries none.
    #[error("malformed frame")]
    Malformed,
}

/// A frame's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    /// What it is.
    pub kind: FrameKind,
    /// The error code of an `Error` frame, else 0.
    pub code: u8,
    /// The kernel connection.
    pub conn: u16,
    /// The request it belongs to (its own `seq` for a request).
    pub request: u32,
    /// Its number among the frames of its direction.
    pub seq: u32,
}

impl Frame {
    /// The header's bytes.
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut b = [0u8; FRAME_HEADER_BYTES];
        b[0] = self.kind as u8;
        b[1] = self.code;
        b[2..4].copy_from_slice(&self.conn.to_le_bytes());
        b[4..8].copy_from_slice(&self.request.to_le_bytes());
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// The header at the start of `b` and the payload after it, checked.
    pub fn decode(b: &[u8]) -> Result<(Frame, &[u8]), FrameError> {
        if b.len() < FRAME_HEADER_BYTES {
            return Err(FrameError::Short(b.len()));
        }
        let kind = match b[0] {
            1 => FrameKind::Request,
            2 => FrameKind::Answer,
            3 => FrameKind::Last,
            4 => FrameKind::Done,
            5 => FrameKind::Error,
            6 => FrameKind::Open,
            7 => FrameKind::Close,
            k => return Err(FrameError::Kind(k)),
        };
        let code = b[1];
        let payload = &b[FRAME_HEADER_BYTES..];
        let coded = kind == FrameKind::Error;
        let empty = matches!(kind, FrameKind::Done | FrameKind::Error | FrameKind::Close);
        let caller = kind != FrameKind::Open || payload.len() == Caller::BYTES;
        if (code != 0) != coded || (empty && !payload.is_empty()) || !caller {
            return Err(FrameError::Malformed);
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok((
            Frame {
                kind,
                code,
                conn: u16::from_le_bytes([b[2], b[3]]),
                request: u32_at(4),
                seq: u32_at(8),
            },
            payload,
        ))
    }
}

/// Which head to take next, of two paths each in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    /// The first path's head is the frame expected.
    First,
    /// The second path's.
    Second,
    /// The frame expected has not arrived yet.
    Wait,
    /// Both paths have a head and neither is the frame expected: frames
    /// were lost (refused as garbage); go on from the earlier head.
    Skip,
}

/// The next frame to take when `expect` is due and the paths' heads are
/// `first` and `second` (their `seq`s, when they have one).
pub fn pick(expect: u32, first: Option<u32>, second: Option<u32>) -> Pick {
    match (first, second) {
        (Some(a), _) if a == expect => Pick::First,
        (_, Some(b)) if b == expect => Pick::Second,
        (Some(_), Some(_)) => Pick::Skip,
        _ => Pick::Wait,
    }
}

/// Of two heads that are both not the one expected (see [`Pick::Skip`]),
/// the one that comes first after `expect` (wrapping).
pub fn earlier(expect: u32, a: u32, b: u32) -> Pick {
    if a.wrapping_sub(expect) <= b.wrapping_sub(expect) {
        Pick::First
    } else {
        Pick::Second
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_round_trips() {
        let f = Frame {
            kind: FrameKind::Last,
            code: 0,
            conn: 7,
            request: 41,
            seq: 99,
        };
        let mut b = f.encode().to_vec();
        b.extend_from_slice(b"xyz");
        assert_eq!(Frame::decode(&b), Ok((f, &b"xyz"[..])));
    }

    #[test]
    fn bad_frames_are_refused() {
        assert_eq!(Frame::decode(&[1, 0, 0]), Err(FrameError::Short(3)));
        let mut b = [0u8; FRAME_HEADER_BYTES];
        b[0] = 9;
        assert_eq!(Frame::decode(&b), Err(FrameError::Kind(9)));
        b[0] = FrameKind::Answer as u8;
        b[1] = 3;
        assert_eq!(
            Frame::decode(&b),
            Err(FrameError::Malformed),
            "a code on data"
        );
        b[0] = FrameKind::Error as u8;
        b[1] = 0;
        assert_eq!(
            Frame::decode(&b),
            Err(FrameError::Malformed),
            "an error without code"
        );
        let mut done = b.to_vec();
        done[0] = FrameKind::Done as u8;
        done.push(1);
        assert_eq!(
            Frame::decode(&done),
            Err(FrameError::Malformed),
            "done with a payload"
        );
        done[0] = FrameKind::Close as u8;
        assert_eq!(
            Frame::decode(&done),
            Err(FrameError::Malformed),
            "close with a payload"
        );
        let mut open = b.to_vec();
        open[0] = FrameKind::Open as u8;
        open.extend_from_slice(&[0; Caller::BYTES - 1]);
        assert_eq!(
            Frame::decode(&open),
            Err(FrameError::Malformed),
            "open with a short caller"
        );
    }

    #[test]
    fn an_open_frame_carries_its_caller() {
        let caller = Caller {
            server: std::net::Ipv4Addr::new(10, 1, 2, 3),
            device: 0xbeef,
            port: 4791,
        };
        let f = Frame {
            kind: FrameKind::Open,
            code: 0,
            conn: 3,
            request: 0,
            seq: 5,
        };
        let mut b = f.encode().to_vec();
        b.extend_from_slice(&caller.encode());
        let (got, payload) = Frame::decode(&b).unwrap();
        assert_eq!(got, f);
        assert_eq!(Caller::decode(payload), Some(caller));
        assert_eq!(Caller::decode(&payload[1..]), None);
    }

    #[test]
    fn the_expected_frame_is_taken_from_whichever_path_has_it() {
        assert_eq!(pick(5, Some(6), Some(5)), Pick::Second);
        assert_eq!(pick(5, Some(5), None), Pick::First);
        assert_eq!(pick(5, Some(6), None), Pick::Wait, "5 may still come");
        assert_eq!(pick(5, None, None), Pick::Wait);
        assert_eq!(pick(5, Some(7), Some(6)), Pick::Skip, "5 was lost");
        assert_eq!(earlier(5, 7, 6), Pick::Second);
        assert_eq!(earlier(u32::MAX, 0, 3), Pick::First, "wrapping");
    }
}
