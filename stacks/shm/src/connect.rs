//! FPGA Connect semantics (DUA §7.2.2): SEND/RECV between devices of one
//! server through one receive window per device, with token-based flow
//! control per connection.
//!
//! Every frame in a window starts with a 16-byte [`FrameHeader`]: the
//! destination connection, the frame kind, flags, the payload length, a
//! sequence number and a token count. Many connections share a window;
//! the receiver moves each data frame out of the window into its
//! connection's queue at once, so the window never stalls behind a slow
//! application. What bounds a connection's queue is its tokens: a sender
//! may have at most as many data frames outstanding as the receiver
//! granted, asks for more once per round trip (the `REQ` flag on a data
//! frame, or a standalone token request when it ran dry), and the
//! receiver answers with an ACK carrying the tokens its application freed.
//! A slow connection therefore only blocks itself and never holds more
//! than its grant.
//!
//! [`ConnectProtocol`] is the protocol, sans-IO: it says which header to
//! put on a frame and what to do with an arriving one. [`ConnectPort`]
//! runs it over a pair of [rings](crate::ring) standing for the two
//! devices' receive windows (written here by the CPU, as PIO; a DMA engine
//! writes the same bytes).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};

use crate::ring::{RingConsumer, RingError, RingProducer};
use crate::sys::SharedMemory;

/// Bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Flag: the sender asks for tokens (once per round trip).
pub const FLAG_REQ: u8 = 1;

/// What a frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Application data for a connection.
    Data = 1,
    /// A request for tokens, when the sender has none and no data to carry it.
    TokenRequest = 2,
    /// Tokens returned by the receiver.
    Ack = 3,
}

/// The header at the start of every frame in a receive window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Destination connection.
    pub conn: u16,
    /// Frame kind.
    pub kind: FrameKind,
    /// [`FLAG_REQ`] or nothing.
    pub flags: u8,
    /// Payload bytes that follow.
    pub len: u32,
    /// Per-connection sequence number of data frames.
    pub seq: u32,
    /// Tokens carried (ACK).
    pub tokens: u32,
}

/// Why a frame or a call was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnectError {
    /// The connection has no tokens: wait for an ACK.
    #[error("connection {0} has no tokens")]
    NoTokens(u16),
    /// No such connection is open.
    #[error("unknown connection {0}")]
    UnknownConnection(u16),
    /// A header that cannot be right (kind, flags, length).
    #[error("malformed frame header")]
    Malformed,
    /// The peer sent data beyond its grant or out of sequence.
    #[error("connection {0}: frame beyond its tokens or out of order")]
    Violation(u16),
    /// A payload larger than the configured maximum.
    #[error("payload of {0} bytes exceeds the maximum")]
    TooLarge(usize),
    /// The shared window is corrupt.
    #[error("receive window: {0}")]
    Window(#[from] RingError),
}

impl FrameHeader {
    /// The 16 bytes of the header (little-endian).
    pub fn encode(&self) -> [u8; FRAME_HEADER_BYTES] {
        let mut b = [0u8; FRAME_HEADER_BYTES];
        b[0..2].copy_from_slice(&self.conn.to_le_bytes());
        b[2] = self.kind as u8;
        b[3] = self.flags;
        b[4..8].copy_from_slice(&self.len.to_le_bytes());
        b[8..12].copy_from_slice(&self.seq.to_le_bytes());
        b[12..16].copy_from_slice(&self.tokens.to_le_bytes());
        b
    }

    /// Reads and checks a header at the start of `b`.
    pub fn decode(b: &[u8]) -> Result<FrameHeader, ConnectError> {
        let b = b.get(..FRAME_HEADER_BYTES).ok_or(ConnectError::Malformed)?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let kind = match b[2] {
            1 => FrameKind::Data,
            2 => FrameKind::TokenRequest,
            3 => FrameKind::Ack,
            _ => return Err(ConnectError::Malformed),
        };
        let flags = b[3];
        let len = u32_at(4);
        if flags & !FLAG_REQ != 0 || (kind != FrameKind::Data && len != 0) {
            return Err(ConnectError::Malformed);
        }
        Ok(FrameHeader {
            conn: u16::from_le_bytes([b[0], b[1]]),
            kind,
            flags,
            len,
            seq: u32_at(8),
            tokens: u32_at(12),
        })
    }
}

/// Sizes of the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectConfig {
    /// Connections per device (ids `0..max_connections`).
    pub max_connections: u16,
    /// Data frames a receiver grants each connection: its queue's bound.
    pub tokens: u32,
    /// Largest payload of one data frame.
    pub max_payload: usize,
}

impl Default for ConnectConfig {
    fn default() -> Self {
        ConnectConfig {
            max_connections: 64,
            tokens: 16,
            max_payload: 64 << 10,
        }
    }
}

#[derive(Clone, Debug, Default)]
struct Connection {
    open: bool,
    // Sending half.
    tokens: u32,
    request_outstanding: bool,
    next_seq: u32,
    // Receiving half.
    expect_seq: u32,
    /// Data frames received and not yet consumed by the application.
    queued: u32,
    /// Tokens freed by the application and not yet returned.
    to_return: u32,
    peer_requested: bool,
}

/// Counters of a device's FPGA Connect protocol.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectStats {
    /// Token requests sent (flag or standalone).
    pub requests: u64,
    /// ACKs sent.
    pub acks: u64,
    /// Frames refused (malformed, unknown connection, violation).
    pub refused: u64,
}

/// One device's end of FPGA Connect: the protocol, without I/O.
#[derive(Debug)]
pub struct ConnectProtocol {
    cfg: ConnectConfig,
    conns: Vec<Connection>,
    outbox: VecDeque<FrameHeader>,
    stats: ConnectStats,
}

/// What an arriving frame means for the application.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A data frame for `conn`, to queue for the application.
    Data {
        /// The connection.
        conn: u16,
        /// Its sequence number.
        seq: u32,
    },
    /// A control frame, handled.
    Control,
}

impl ConnectProtocol {
    /// The protocol with every connection closed.
    pub fn new(cfg: ConnectConfig) -> ConnectProtocol {
        ConnectProtocol {
            conns: vec![Connection::default(); cfg.max_connections as usize],
            cfg,
            outbox: VecDeque::new(),
            stats: ConnectStats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ConnectConfig {
        &self.cfg
    }

    /// Counters so far.
    pub fn stats(&self) -> ConnectStats {
        self.stats
    }

    /// Opens connection `conn` on this side with the initial grant (both
    /// sides open the same id when the control plane sets it up).
    pub fn open(&mut self, conn: u16) -> Result<(), ConnectError> {
        let c = self
            .conns
            .get_mut(conn as usize)
            .ok_or(ConnectError::UnknownConnection(conn))?;
        *c = Connection {
            open: true,
            tokens: self.cfg.tokens,
            ..Connection::default()
        };
        Ok(())
    }

    fn conn(&mut self, conn: u16) -> Result<&mut Connection, ConnectError> {
        self.conns
            .get_mut(conn as usize)
            .filter(|c| c.open)
            .ok_or(ConnectError::UnknownConnection(conn))
    }

    /// Tokens `conn` may still spend.
    pub fn tokens(&self, conn: u16) -> u32 {
        self.conns.get(conn as usize).map_or(0, |c| c.tokens)
    }

    /// Data frames of `conn` received and not consumed.
    pub fn queued(&self, conn: u16) -> u32 {
        self.conns.get(conn as usize).map_or(0, |c| c.queued)
    }

    /// The header of the next data frame of `len` bytes on `conn`, spending
    /// a token. Without tokens: `NoTokens`, and a token request is queued
    /// for [`ConnectProtocol::poll_transmit`] unless one is outstanding.
    pub fn send(&mut self, conn: u16, len: usize) -> Result<FrameHeader, ConnectError> {
        if len > self.cfg.max_payload {
            return Err(ConnectError::TooLarge(len));
        }
        let c = self.conn(conn)?;
        if c.tokens == 0 {
            if !c.request_outstanding {
                c.request_outstanding = true;
                self.stats.requests += 1;
                self.outbox.push_back(FrameHeader {
                    conn,
                    kind: FrameKind::TokenRequest,
                    flags: FLAG_REQ,
                    len: 0,
                    seq: 0,
                    tokens: 0,
                });
            }
            return Err(ConnectError::NoTokens(conn));
        }
        c.tokens -= 1;
        let flags = if c.request_outstanding {
            0
        } else {
            c.request_outstanding = true;
            FLAG_REQ
        };
        let seq = c.next_seq;
        c.next_seq = c.next_seq.wrapping_add(1);
        if flags != 0 {
            self.stats.requests += 1;
        }
        Ok(FrameHeader {
            conn,
            kind: FrameKind::Data,
            flags,
            len: len as u32,
            seq,
            tokens: 0,
        })
    }

    fn ack_if_due(&mut self, conn: u16) {
        let Some(c) = self.conns.get_mut(conn as usize) else {
            return;
        };
        if c.peer_requested && c.to_return > 0 {
            self.outbox.push_back(FrameHeader {
                conn,
                kind: FrameKind::Ack,
                flags: 0,
                len: 0,
                seq: 0,
                tokens: c.to_return,
            });
            c.to_return = 0;
            c.peer_requested = false;
            self.stats.acks += 1;
        }
    }

    /// Handles a frame from the peer. Data frames beyond the grant or out
    /// of sequence are refused (and counted), never queued.
    pub fn receive(&mut self, h: &FrameHeader) -> Result<Arrival, ConnectError> {
        let granted = self.cfg.tokens;
        let max = self.cfg.max_payload;
        let Ok(c) = self.conn(h.conn) else {
            self.stats.refused += 1;
            return Err(ConnectError::UnknownConnection(h.conn));
        };
        let arrival = match h.kind {
            FrameKind::Data => {
                // Tokens outstanding at the peer = granted - queued - to_return.
                if h.seq != c.expect_seq
                    || c.queued + c.to_return >= granted
                    || h.len as usize > max
                {
                    self.stats.refused += 1;
                    return Err(ConnectError::Violation(h.conn));
                }
                c.expect_seq = c.expect_seq.wrapping_add(1);
                c.queued += 1;
                if h.flags & FLAG_REQ != 0 {
                    c.peer_requested = true;
                }
                Arrival::Data {
                    conn: h.conn,
                    seq: h.seq,
                }
            }
            FrameKind::TokenRequest => {
                c.peer_requested = true;
                Arrival::Control
            }
            FrameKind::Ack => {
                let total = c.tokens.saturating_add(h.tokens);
                if total > granted {
                    self.stats.refused += 1;
                    return Err(ConnectError::Violation(h.conn));
                }
                c.tokens = total;
                c.request_outstanding = false;
                Arrival::Control
            }
        };
        self.ack_if_due(h.conn);
        Ok(arrival)
    }

    /// The application took `n` data frames of `conn`: their tokens go back
    /// to the peer with the next ACK (at once if it asked).
    pub fn consume(&mut self, conn: u16, n: u32) {
        if let Ok(c) = self.conn(conn) {
            let n = n.min(c.queued);
            c.queued -= n;
            c.to_return += n;
        }
        self.ack_if_due(conn);
    }

    /// The next control frame to send, if any.
    pub fn poll_transmit(&mut self) -> Option<FrameHeader> {
        self.outbox.pop_front()
    }
}

/// FPGA Connect between two devices over their receive windows: the
/// protocol plus the window this side writes (the peer's) and the one it
/// reads (its own), and a queue per connection.
pub struct ConnectPort {
    protocol: ConnectProtocol,
    mem: std::sync::Arc<SharedMemory>,
    tx: RingProducer,
    rx: RingConsumer,
    queues: Vec<VecDeque<Bytes>>,
}

impl std::fmt::Debug for ConnectPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectPort")
            .field("protocol", &self.protocol)
            .finish_non_exhaustive()
    }
}

impl ConnectPort {
    /// A port writing frames into the window `peer_window` and reading its
    /// own window `own_window`, both rings in `mem`.
    pub fn new(
        cfg: ConnectConfig,
        mem: std::sync::Arc<SharedMemory>,
        peer_window: crate::ring::RingLayout,
        own_window: crate::ring::RingLayout,
    ) -> Option<ConnectPort> {
        if !peer_window.fits(&mem) || !own_window.fits(&mem) {
            return None;
        }
        Some(ConnectPort {
            protocol: ConnectProtocol::new(cfg),
            tx: RingProducer::new(peer_window),
            rx: RingConsumer::new(own_window),
            queues: vec![VecDeque::new(); cfg.max_connections as usize],
            mem,
        })
    }

    /// The protocol state.
    pub fn protocol(&mut self) -> &mut ConnectProtocol {
        &mut self.protocol
    }

    fn flush_control(&mut self) -> Result<(), ConnectError> {
        while let Some(h) = self.protocol.poll_transmit() {
            if !self.tx.try_push(&self.mem, &[&h.encode()])? {
                // The window is full: try again on the next call.
                self.protocol.outbox.push_front(h);
                break;
            }
        }
        self.tx.publish(&self.mem);
        Ok(())
    }

    /// Sends `payload` on `conn`: `Ok(false)` when the connection has no
    /// tokens or the peer's window is full now (retry after [`Self::poll`]).
    pub fn send(&mut self, conn: u16, payload: &[u8]) -> Result<bool, ConnectError> {
        self.flush_control()?;
        let h = match self.protocol.send(conn, payload.len()) {
            Ok(h) => h,
            Err(ConnectError::NoTokens(_)) => {
                self.flush_control()?;
                return Ok(false);
            }
            Err(e) => return Err(e),
        };
        if !self.tx.try_push(&self.mem, &[&h.encode(), payload])? {
            // Give the token back: the frame never left.
            if let Ok(c) = self.protocol.conn(conn) {
                c.tokens += 1;
                c.next_seq = c.next_seq.wrapping_sub(1);
                if h.flags & FLAG_REQ != 0 {
                    c.request_outstanding = false;
                }
            }
            return Ok(false);
        }
        self.tx.publish(&self.mem);
        Ok(true)
    }

    /// Drains this side's window: data into the connections' queues,
    /// control frames into the protocol; sends due ACKs. Returns the frames
    /// taken. Malformed or refused frames are counted and skipped.
    pub fn poll(&mut self) -> Result<usize, ConnectError> {
        let mut n = 0;
        let mut buf = BytesMut::new();
        while let Some(r) = self.rx.next_record(&self.mem)? {
            n += 1;
            buf.clear();
            self.mem.read_into(r.offset, r.len, &mut buf);
            let Ok(h) = FrameHeader::decode(&buf) else {
                self.protocol.stats.refused += 1;
                continue;
            };
            if h.len as usize != r.len - FRAME_HEADER_BYTES {
                self.protocol.stats.refused += 1;
                continue;
            }
            if let Ok(Arrival::Data { conn, .. }) = self.protocol.receive(&h) {
                let payload = buf.split().freeze().slice(FRAME_HEADER_BYTES..);
                if let Some(q) = self.queues.get_mut(conn as usize) {
                    q.push_back(payload);
                }
            }
        }
        self.rx.release(&self.mem);
        self.flush_control()?;
        Ok(n)
    }

    /// Takes the next message of `conn`, returning its token to the peer.
    pub fn take(&mut self, conn: u16) -> Option<Bytes> {
        let m = self.queues.get_mut(conn as usize)?.pop_front()?;
        self.protocol.consume(conn, 1);
        Some(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{RingLayout, CONTROL_BYTES};
    use crate::sys::memfd_name;
    use std::sync::Arc;

    fn cfg(tokens: u32) -> ConnectConfig {
        ConnectConfig {
            max_connections: 4,
            tokens,
            max_payload: 4096,
        }
    }

    #[test]
    fn headers_round_trip_and_bad_ones_are_refused() {
        let h = FrameHeader {
            conn: 7,
            kind: FrameKind::Data,
            flags: FLAG_REQ,
            len: 100,
            seq: 3,
            tokens: 0,
        };
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
        let mut b = h.encode();
        b[2] = 9;
        assert_eq!(FrameHeader::decode(&b), Err(ConnectError::Malformed));
        let mut b = h.encode();
        b[3] = 0x80;
        assert_eq!(FrameHeader::decode(&b), Err(ConnectError::Malformed));
        assert_eq!(FrameHeader::decode(&[0u8; 3]), Err(ConnectError::Malformed));
    }

    #[test]
    fn a_sender_stops_at_its_grant_and_resumes_after_the_ack() {
        let mut a = ConnectProtocol::new(cfg(2));
        let mut b = ConnectProtocol::new(cfg(2));
        a.open(1).unwrap();
        b.open(1).unwrap();
        let h1 = a.send(1, 10).unwrap();
        assert_eq!(h1.flags, FLAG_REQ, "first frame of the round trip asks");
        let h2 = a.send(1, 10).unwrap();
        assert_eq!(h2.flags, 0, "one request per round trip");
        assert_eq!(a.send(1, 10), Err(ConnectError::NoTokens(1)));
        b.receive(&h1).unwrap();
        b.receive(&h2).unwrap();
        assert_eq!(
            b.poll_transmit(),
            None,
            "nothing consumed: nothing to return"
        );
        b.consume(1, 2);
        let ack = b.poll_transmit().unwrap();
        assert_eq!((ack.kind, ack.tokens), (FrameKind::Ack, 2));
        a.receive(&ack).unwrap();
        assert_eq!(a.tokens(1), 2);
        assert_eq!(
            a.send(1, 10).unwrap().flags,
            FLAG_REQ,
            "a new round trip asks again"
        );
    }

    #[test]
    fn data_beyond_the_grant_is_a_violation_not_queued() {
        let mut b = ConnectProtocol::new(cfg(1));
        b.open(0).unwrap();
        let mut h = FrameHeader {
            conn: 0,
            kind: FrameKind::Data,
            flags: 0,
            len: 1,
            seq: 0,
            tokens: 0,
        };
        b.receive(&h).unwrap();
        h.seq = 1;
        assert_eq!(b.receive(&h), Err(ConnectError::Violation(0)));
        assert_eq!(b.queued(0), 1);
        let ack = FrameHeader {
            kind: FrameKind::Ack,
            tokens: 99,
            len: 0,
            ..h
        };
        assert_eq!(
            b.receive(&ack),
            Err(ConnectError::Violation(0)),
            "over-grant"
        );
    }

    fn ports(tokens: u32) -> (ConnectPort, ConnectPort) {
        let size = 64 << 10;
        let mem = Arc::new(
            SharedMemory::create(&memfd_name("connect"), 2 * (CONTROL_BYTES + size)).unwrap(),
        );
        let w = |i: usize| RingLayout {
            control: i * CONTROL_BYTES,
            data: 2 * CONTROL_BYTES + i * size,
            size,
        };
        let a = ConnectPort::new(cfg(tokens), mem.clone(), w(1), w(0)).unwrap();
        let b = ConnectPort::new(cfg(tokens), mem, w(0), w(1)).unwrap();
        (a, b)
    }

    #[test]
    fn a_slow_connection_neither_blocks_the_other_nor_grows_past_its_tokens() {
        let (mut a, mut b) = ports(4);
        for p in [&mut a, &mut b] {
            p.protocol().open(1).unwrap();
            p.protocol().open(2).unwrap();
        }
        let mut fast_got = 0;
        let mut slow_sent = 0;
        for i in 0..1000u32 {
            if a.send(1, b"slow").unwrap() {
                slow_sent += 1;
            }
            assert!(
                a.send(2, &i.to_le_bytes()).unwrap(),
                "fast connection never waits"
            );
            b.poll().unwrap();
            // The application reads connection 2 only.
            let m = b.take(2).unwrap();
            assert_eq!(m.as_ref(), i.to_le_bytes());
            fast_got += 1;
            a.poll().unwrap();
        }
        assert_eq!(fast_got, 1000);
        assert_eq!(slow_sent, 4, "the slow connection stopped at its grant");
        assert_eq!(b.protocol().queued(1), 4);
        // Once its reader catches up, the slow connection flows again.
        for _ in 0..4 {
            assert!(b.take(1).is_some());
        }
        b.poll().unwrap();
        a.poll().unwrap();
        assert!(a.send(1, b"again").unwrap());
    }

    #[test]
    fn a_garbage_frame_in_the_window_is_skipped() {
        let (mut a, mut b) = ports(4);
        a.protocol().open(0).unwrap();
        b.protocol().open(0).unwrap();
        assert!(a.tx.try_push(&a.mem, &[b"garbage!"]).unwrap());
        assert!(a.send(0, b"ok").unwrap());
        b.poll().unwrap();
        assert_eq!(b.take(0).unwrap().as_ref(), b"ok");
        assert_eq!(b.protocol().stats().refused, 1);
    }
}
