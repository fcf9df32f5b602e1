//! SYN cookies: how a listener answers a SYN without remembering it.
//!
//! The SYN_ACK's two fields of the listener's choosing, its connection id
//! and its initial sequence number, are the cookie; the opener echoes both
//! in every frame it sends until the listener answers with anything else
//! (`dst_conn` is the id, `ack` the sequence number, since nothing of the
//! listener's can have arrived before it has a connection to send from).
//!
//! ```text
//!  id  = MAC(key, peer, peer_conn, peer_isn, epoch) with its low bit := epoch & 1
//!  isn = peer_isn XOR PAD(key, peer, peer_conn, epoch)
//! ```
//!
//! Both are SipHash-2-4 (the `siphasher` crate) under the key of the 64-second epoch the SYN came
//! in (31 bits of MAC, 32 of pad). The key is 128 random bits from the
//! operating system, replaced at each epoch; the previous epoch's key is
//! kept, so a cookie is good for 64 to 128 seconds. A frame for no
//! connection here is checked by recomputing: the id's low bit picks the
//! epoch (and key), the pad gives back the opener's initial sequence
//! number, and the MAC over it must equal the id. Anything the accepted
//! connection needs is either in the cookie (the opener's initial sequence
//! number) or in every frame the opener sends (its id and its credit,
//! which after the SYN is an absolute limit on the listener's sequence
//! numbers): the listener needs nothing from the SYN itself.

use std::hash::{BuildHasher, Hash, Hasher};

use siphasher::sip::SipHasher24;
use std::time::{Duration, Instant};

/// How long one key makes cookies. A cookie is accepted while its key is
/// the current one or the one before: 64 to 128 seconds after the SYN.
pub const COOKIE_EPOCH: Duration = Duration::from_secs(64);

/// The listener's half of a handshake it answered: what its SYN_ACK says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cookie {
    /// The listener's connection id.
    pub id: u32,
    /// The listener's initial sequence number.
    pub isn: u32,
}

/// What a valid cookie gives back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Echo {
    /// The opener's initial sequence number, from its SYN.
    pub peer_isn: u32,
    /// The listener's initial sequence number.
    pub isn: u32,
}

/// The keys that make and check cookies, one per epoch; the only state a
/// listener keeps for handshakes in progress (two keys, whatever the
/// number of SYNs).
pub(crate) struct Cookies {
    current: [u64; 2],
    previous: [u64; 2],
    /// The current key's epoch, counted from `start`.
    epoch: u64,
    /// The first time a cookie was made or checked.
    start: Option<Instant>,
}

/// Domain separation: the pad and the MAC never hash the same input.
const PAD: u8 = 1;
const MAC: u8 = 2;

impl Cookies {
    /// Keys drawn from the operating system's random source.
    pub fn new() -> Self {
        Cookies {
            current: random_key(),
            previous: random_key(),
            epoch: 0,
            start: None,
        }
    }

    /// Moves to the epoch of `now`: a new key, the current one kept as the
    /// previous (or, after more than one epoch without use, a new one too,
    /// since no cookie of the epoch before was made).
    fn advance(&mut self, now: Instant) {
        let start = *self.start.get_or_insert(now);
        let epoch = now.saturating_duration_since(start).as_secs() / COOKIE_EPOCH.as_secs();
        if epoch <= self.epoch {
            return;
        }
        self.previous = if epoch == self.epoch + 1 {
            self.current
        } else {
            random_key()
        };
        self.current = random_key();
        self.epoch = epoch;
    }

    /// The cookie for a SYN from `peer`, connection `peer_conn`, initial
    /// sequence number `peer_isn`, arriving at `now`.
    pub fn make<A: Hash>(
        &mut self,
        peer: &A,
        peer_conn: u32,
        peer_isn: u32,
        now: Instant,
    ) -> Cookie {
        self.advance(now);
        let (key, epoch) = (self.current, self.epoch);
        Cookie {
            id: mac(key, peer, peer_conn, peer_isn, epoch),
            isn: peer_isn ^ pad(key, peer, peer_conn, epoch),
        }
    }

    /// Checks a frame from `peer`, connection `peer_conn`, sent to
    /// connection `id` and acknowledging `ack`, against the cookie it
    /// would echo; what the handshake needs if it does.
    pub fn check<A: Hash>(
        &mut self,
        peer: &A,
        peer_conn: u32,
        id: u32,
        ack: u32,
        now: Instant,
    ) -> Option<Echo> {
        self.advance(now);
        let (key, epoch) = if u64::from(id & 1) == self.epoch & 1 {
            (self.current, self.epoch)
        } else if self.epoch > 0 {
            (self.previous, self.epoch - 1)
        } else {
            return None;
        };
        let peer_isn = ack ^ pad(key, peer, peer_conn, epoch);
        (mac(key, peer, peer_conn, peer_isn, epoch) == id).then_some(Echo { peer_isn, isn: ack })
    }
}

/// 32 bits that hide the opener's initial sequence number.
fn pad<A: Hash>(key: [u64; 2], peer: &A, peer_conn: u32, epoch: u64) -> u32 {
    let mut h = SipHasher24::new_with_keys(key[0], key[1]);
    h.write_u8(PAD);
    peer.hash(&mut h);
    h.write_u32(peer_conn);
    h.write_u64(epoch);
    h.finish() as u32
}

/// The connection id: 31 bits of MAC and the epoch's parity; never 0.
fn mac<A: Hash>(key: [u64; 2], peer: &A, peer_conn: u32, peer_isn: u32, epoch: u64) -> u32 {
    let mut h = SipHasher24::new_with_keys(key[0], key[1]);
    h.write_u8(MAC);
    peer.hash(&mut h);
    h.write_u32(peer_conn);
    h.write_u32(peer_isn);
    h.write_u64(epoch);
    let id = (h.finish() >> 32) as u32 & !1 | (epoch & 1) as u32;
    if id == 0 {
        2
    } else {
        id
    }
}

/// 128 bits from the operating system's random source. Should that fail,
/// the standard library's hash keys, which it draws from the same source
/// at start, mixed with the time.
fn random_key() -> [u64; 2] {
    let mut b = [0u8; 16];
    if getrandom::fill(&mut b).is_ok() {
        let (lo, hi) = b.split_at(8);
        let word = |s: &[u8]| u64::from_le_bytes([s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]]);
        return [word(lo), word(hi)];
    }
    let std_random = std::hash::RandomState::new();
    let now = std::time::SystemTime::now();
    [
        std_random.hash_one((now, 0u8)),
        std_random.hash_one((now, 1u8)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cookie_checks_out_with_what_its_opener_echoes_and_gives_back_its_isn() {
        let mut c = Cookies::new();
        let t = Instant::now();
        let cookie = c.make(&7u8, 11, 1000, t);
        assert_ne!(cookie.id, 0);
        let echo = c.check(
            &7u8,
            11,
            cookie.id,
            cookie.isn,
            t + Duration::from_millis(1),
        );
        assert_eq!(
            echo,
            Some(Echo {
                peer_isn: 1000,
                isn: cookie.isn
            })
        );
    }

    #[test]
    fn a_cookie_is_bound_to_its_peer_and_connection() {
        let mut c = Cookies::new();
        let t = Instant::now();
        let cookie = c.make(&7u8, 11, 1000, t);
        assert_eq!(c.check(&8u8, 11, cookie.id, cookie.isn, t), None);
        assert_eq!(c.check(&7u8, 12, cookie.id, cookie.isn, t), None);
        assert_eq!(c.check(&7u8, 11, cookie.id ^ 4, cookie.isn, t), None);
    }

    #[test]
    fn a_cookie_lives_one_epoch_more_and_no_longer() {
        let mut c = Cookies::new();
        let t = Instant::now();
        c.make(&0u8, 0, 0, t);
        let at = t + COOKIE_EPOCH / 2;
        let cookie = c.make(&7u8, 11, 1000, at);
        let next_epoch = at + COOKIE_EPOCH;
        assert!(c
            .check(&7u8, 11, cookie.id, cookie.isn, next_epoch)
            .is_some());
        let two_on = at + COOKIE_EPOCH * 2;
        assert_eq!(c.check(&7u8, 11, cookie.id, cookie.isn, two_on), None);
    }
}
