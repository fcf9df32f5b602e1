//! Sealed tunnels (the daemon's tunnel links use this; so can a
//! benchmark): every overlay message crossing a tunnel travels inside
//! a FWRD frame from daemon to daemon whose payload is
//!
//! ```text
//!   seq (8, big-endian) | the message, encoded | tag (16)
//! ```
//!
//! The tag is keyed BLAKE3 under the tunnel's key (from its handshake)
//! over the direction, `seq` and the encoded message. The receiver drops
//! and counts a frame that is unsealed, fails its tag, repeats a `seq`
//! seen before or older than a 1,024-frame window (anti-replay as in
//! IPsec, RFC 4303 §3.4.3, so datagram tunnels may reorder), or carries a
//! message whose source UID is not on the server at the tunnel's other
//! end — a peer cannot speak for anyone else. Only then is the message
//! decoded (with the validating decoder).
//!
//! Sealing copies each message once into an arena whose memory is reused
//! once the frames cut from it are gone: no allocation per message.

use std::net::Ipv4Addr;

use bytes::{BufMut, BytesMut};
use uniplane_dataplane::wire::{Header, Params, PortParams, ReqType, Request, EXTENDED_HEADER_LEN};
use uniplane_dataplane::{LinkError, Message, Uid};

use crate::auth::{tags_equal, Key, TAG_LEN};

/// Bytes a seal adds around a message: sequence number and tag.
const TRAILER: usize = 8 + TAG_LEN;
/// What a tunnel's payload limit must leave for the seal and the inner
/// header.
pub const SEAL_OVERHEAD: usize = TRAILER + EXTENDED_HEADER_LEN;
/// Frames a receiver still accepts out of order behind the newest.
const WINDOW: u64 = 1024;
/// Arena chunk; frames are cut from it.
const ARENA: usize = 256 * 1024;

/// Which end of the tunnel we are: the tags of the two directions differ,
/// so a frame cannot be reflected back to its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// The daemon that opened the tunnel.
    Opener,
    /// The daemon that accepted it.
    Acceptor,
}

impl End {
    fn byte(self) -> u8 {
        match self {
            End::Opener => b'o',
            End::Acceptor => b'a',
        }
    }

    fn other(self) -> End {
        match self {
            End::Opener => End::Acceptor,
            End::Acceptor => End::Opener,
        }
    }
}

/// Which sequence numbers were seen: the newest, and a bitmap of the
/// [`WINDOW`] before it.
#[derive(Default)]
pub struct ReplayWindow {
    /// Newest seen plus one (0: none yet).
    top: u64,
    seen: [u64; (WINDOW / 64) as usize],
}

impl ReplayWindow {
    fn bit(&mut self, seq: u64) -> (&mut u64, u64) {
        let i = (seq % WINDOW) as usize;
        (&mut self.seen[i / 64], 1 << (i % 64))
    }

    /// Whether `seq` is new and inside the window (checked before its tag).
    pub fn fresh(&self, seq: u64) -> bool {
        if seq >= self.top {
            return true;
        }
        if self.top - seq > WINDOW {
            return false;
        }
        let i = (seq % WINDOW) as usize;
        self.seen[i / 64] & (1 << (i % 64)) == 0
    }

    /// Records `seq` (after its tag checked).
    pub fn mark(&mut self, seq: u64) {
        if seq >= self.top {
            // Slide: forget what falls out of the window.
            let gap = seq + 1 - self.top;
            if gap >= WINDOW {
                self.seen = Default::default();
            } else {
                for s in self.top..=seq {
                    let (word, bit) = self.bit(s);
                    *word &= !bit;
                }
            }
            self.top = seq + 1;
        }
        let (word, bit) = self.bit(seq);
        *word |= bit;
    }
}

/// The sealing of one tunnel: a key, our end and the peer's server.
pub struct Sealer {
    key: Key,
    end: End,
    peer: Ipv4Addr,
    /// Servers beyond the peer whose messages it carries on to us.
    beyond: Vec<Ipv4Addr>,
    me: Uid,
    peer_daemon: Uid,
    next: u64,
    arena: BytesMut,
    window: ReplayWindow,
}

impl Sealer {
    /// The sealing of a tunnel keyed `key` (from its handshake), seen
    /// from `end`, between the daemons `me` and `peer_daemon`.
    pub fn new(key: Key, end: End, me: Uid, peer_daemon: Uid) -> Sealer {
        Sealer {
            key,
            end,
            peer: peer_daemon.server(),
            beyond: Vec::new(),
            me,
            peer_daemon,
            next: 0,
            arena: BytesMut::new(),
            window: ReplayWindow::default(),
        }
    }

    /// The same, for a peer that also carries on to us what the servers
    /// `beyond` it send (a transit server): their sources are its too.
    pub fn carrying(mut self, beyond: Vec<Ipv4Addr>) -> Sealer {
        self.beyond = beyond;
        self
    }

    fn tag(&self, from: End, body: &[u8]) -> [u8; TAG_LEN] {
        let mut h = self.key.hasher();
        h.update(&[from.byte()]);
        h.update(body);
        let mut tag = [0u8; TAG_LEN];
        tag.copy_from_slice(&h.finalize().as_bytes()[..TAG_LEN]);
        tag
    }

    /// The frame carrying `m`.
    pub fn seal(&mut self, m: &Message) -> Result<Message, LinkError> {
        let need = TRAILER + m.encoded_len();
        if self.arena.capacity() - self.arena.len() < need {
            // Reclaims the old chunk when every frame cut from it is gone.
            self.arena.reserve(need.max(ARENA));
        }
        self.arena.put_u64(self.next);
        self.next += 1;
        m.encode(&mut self.arena);
        let tag = self.tag(self.end, &self.arena);
        self.arena.put_slice(&tag);
        let body = self.arena.split().freeze();
        let request = Request::new(ReqType::Forward, Params::Port(PortParams::default()))?;
        Ok(Message::new(
            Header::new(self.me, self.peer_daemon, request),
            body,
        )?)
    }

    /// The message inside `frame`, or why the frame is not to be
    /// believed.
    pub fn open(&mut self, frame: Message) -> Result<Message, Refused> {
        let body = frame.payload();
        if frame.kind() != ReqType::Forward || body.len() < TRAILER {
            return Err(Refused::Unsealed);
        }
        let (signed, tag) = body.split_at(body.len() - TAG_LEN);
        let seq = u64::from_be_bytes(signed[..8].try_into().unwrap_or_default());
        if !self.window.fresh(seq) {
            return Err(Refused::Replayed);
        }
        if !tags_equal(tag, &self.tag(self.end.other(), signed)) {
            return Err(Refused::BadTag);
        }
        self.window.mark(seq);
        let inner = body.slice(8..body.len() - TAG_LEN);
        match Message::decode(&inner) {
            Ok((m, used)) if used == inner.len() => {
                let src = m.header().src.server();
                if src != self.peer && !self.beyond.contains(&src) {
                    return Err(Refused::ForeignSource);
                }
                Ok(m)
            }
            // Sealed by the peer, so malformed only through its bug.
            _ => Err(Refused::Unsealed),
        }
    }
}

/// Why a frame was not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a sealed frame, or nothing valid inside.
    Unsealed,
    /// A sequence number seen before, or older than the window.
    Replayed,
    /// The tag does not match: forged, altered or reflected.
    BadTag,
    /// The message's source is not on the tunnel's other server, nor on
    /// a server reached through it.
    ForeignSource,
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use uniplane_dataplane::Endpoint;

    fn key() -> Key {
        Key::from_hex(&"5a".repeat(32)).unwrap()
    }

    fn uid(s: &str) -> Uid {
        s.parse().unwrap()
    }

    fn pair() -> (Sealer, Sealer) {
        let a = uid("10.0.0.1:0");
        let b = uid("10.0.0.2:0");
        (
            Sealer::new(key(), End::Opener, a, b),
            Sealer::new(key(), End::Acceptor, b, a),
        )
    }

    fn msg(src: &str, body: &'static [u8]) -> Message {
        Message::send(
            Endpoint {
                uid: uid(src),
                port: 5,
            },
            Endpoint {
                uid: uid("10.0.0.2:1"),
                port: 7,
            },
            Bytes::from_static(body),
        )
        .unwrap()
    }

    #[test]
    fn sealed_messages_open_unchanged_once() {
        let (mut a, mut b) = pair();
        let m = msg("10.0.0.1:3", b"hello");
        let f = a.seal(&m).unwrap();
        assert_eq!(b.open(f.clone()).unwrap(), m);
        assert_eq!(b.open(f), Err(Refused::Replayed), "a replay is dropped");
    }

    #[test]
    fn altered_reflected_foreign_and_unsealed_frames_are_refused() {
        let (mut a, mut b) = pair();
        // Altered payload.
        let f = a.seal(&msg("10.0.0.1:3", b"hello")).unwrap();
        let (h, body) = f.into_parts();
        let mut v = body.to_vec();
        let last = v.len() - TAG_LEN - 1;
        v[last] ^= 1;
        assert_eq!(
            b.open(Message::new(h, Bytes::from(v)).unwrap()),
            Err(Refused::BadTag)
        );
        // Reflected to its sender.
        let f = a.seal(&msg("10.0.0.1:3", b"x")).unwrap();
        assert_eq!(a.open(f), Err(Refused::BadTag));
        // A source on another server, sealed by the real peer (a relay
        // bug) — or on this server (a forged local source).
        for src in ["10.0.0.9:3", "10.0.0.2:1"] {
            let f = a.seal(&msg(src, b"x")).unwrap();
            assert_eq!(b.open(f), Err(Refused::ForeignSource));
        }
        // A peer that carries on what a server beyond it sends: those
        // sources are its, and no others.
        let (mut c, mut d) = pair();
        d = d.carrying(vec!["10.0.0.9".parse().unwrap()]);
        let f = c.seal(&msg("10.0.0.9:3", b"x")).unwrap();
        assert!(d.open(f).is_ok());
        let f = c.seal(&msg("10.0.0.8:3", b"x")).unwrap();
        assert_eq!(d.open(f), Err(Refused::ForeignSource));
        // A bare message, as a process that is no peer would send.
        assert_eq!(b.open(msg("10.0.0.1:3", b"raw")), Err(Refused::Unsealed));
        // A wrong key.
        let mut forger = Sealer::new(
            Key::from_hex(&"00".repeat(32)).unwrap(),
            End::Opener,
            uid("10.0.0.1:0"),
            uid("10.0.0.2:0"),
        );
        let f = forger.seal(&msg("10.0.0.1:3", b"x")).unwrap();
        assert_eq!(b.open(f), Err(Refused::BadTag));
    }

    #[test]
    fn the_window_takes_reordering_and_refuses_repeats_and_the_too_old() {
        let mut w = ReplayWindow::default();
        for s in [5u64, 3, 4, 0, 2000, 1990, 1500] {
            assert!(w.fresh(s), "{s}");
            w.mark(s);
            assert!(!w.fresh(s), "{s} twice");
        }
        // 1,500 frames behind the newest: outside the window.
        assert!(!w.fresh(900));
        assert!(w.fresh(1999));
        assert!(w.fresh(1_000_000));
        w.mark(1_000_000);
        assert!(!w.fresh(2000));
        assert!(w.fresh(999_999));
    }
}
