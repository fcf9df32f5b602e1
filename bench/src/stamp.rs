//! The generator stamp: 24 bytes at the start of every payload the
//! generator sends, so the receiver can tell loss, reordering and one-way
//! latency.
//!
//! ```text
//!  0       2      3      4          8                 16                24
//!  +-------+------+------+----------+-----------------+-----------------+
//!  | magic | vers | flags |  flow   |    sequence     |  send time (ns) |
//!  | 0x5542|  1   |       |  u32    |      u64        |      u64        |
//!  +-------+------+------+----------+-----------------+-----------------+
//! ```
//!
//! Big-endian. `flags` bit 0 marks warm-up traffic (counted apart, never in
//! the figures). The send time is read from the monotonic clock the sender
//! and the receiver share inside one process. The rest of the payload is
//! left as it is (zeros).
//!
//! Decoding is validated: a short payload, a wrong magic or version, or
//! unknown flags are errors the receiver counts, never a panic.

/// Why a payload does not start with a valid stamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum StampError {
    /// Fewer than [`Stamp::LEN`] bytes.
    #[error("payload of {0} bytes is shorter than the 24-byte stamp")]
    Short(usize),
    /// The first two bytes are not the stamp's magic.
    #[error("bad stamp magic {0:#06x}")]
    BadMagic(u16),
    /// A stamp version this build does not read.
    #[error("unknown stamp version {0}")]
    BadVersion(u8),
    /// Flag bits this version does not define.
    #[error("unknown stamp flags {0:#04x}")]
    BadFlags(u8),
}

/// What the sender writes into each payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The flow the message belongs to (0..flows).
    pub flow: u32,
    /// The message's sequence number within its flow, from 0.
    pub seq: u64,
    /// When the sender stamped it, in ns of the shared monotonic clock.
    pub tx_ns: u64,
    /// Sent during warm-up: counted apart, excluded from every figure.
    pub warmup: bool,
}

mod field {
    use std::ops::Range;
    pub const MAGIC: Range<usize> = 0..2;
    pub const VERSION: usize = 2;
    pub const FLAGS: usize = 3;
    pub const FLOW: Range<usize> = 4..8;
    pub const SEQ: Range<usize> = 8..16;
    pub const TX_NS: Range<usize> = 16..24;
}

const MAGIC: u16 = 0x5542;
const VERSION: u8 = 1;
const FLAG_WARMUP: u8 = 0x01;

impl Stamp {
    /// Encoded length in bytes.
    pub const LEN: usize = 24;

    /// Writes the stamp at the start of `buf`.
    ///
    /// Returns [`StampError::Short`] when `buf` has fewer than
    /// [`Stamp::LEN`] bytes.
    #[inline]
    pub fn write(&self, buf: &mut [u8]) -> Result<(), StampError> {
        let len = buf.len();
        let Some(out) = buf.get_mut(..Self::LEN) else {
            return Err(StampError::Short(len));
        };
        out[field::MAGIC].copy_from_slice(&MAGIC.to_be_bytes());
        out[field::VERSION] = VERSION;
        out[field::FLAGS] = if self.warmup { FLAG_WARMUP } else { 0 };
        out[field::FLOW].copy_from_slice(&self.flow.to_be_bytes());
        out[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        out[field::TX_NS].copy_from_slice(&self.tx_ns.to_be_bytes());
        Ok(())
    }

    /// Reads and checks the stamp at the start of `buf`.
    #[inline]
    pub fn read(buf: &[u8]) -> Result<Stamp, StampError> {
        let Some(b) = buf.get(..Self::LEN) else {
            return Err(StampError::Short(buf.len()));
        };
        let magic = u16::from_be_bytes([b[0], b[1]]);
        if magic != MAGIC {
            return Err(StampError::BadMagic(magic));
        }
        if b[field::VERSION] != VERSION {
            return Err(StampError::BadVersion(b[field::VERSION]));
        }
        let flags = b[field::FLAGS];
        if flags & !FLAG_WARMUP != 0 {
            return Err(StampError::BadFlags(flags));
        }
        let mut flow = [0u8; 4];
        flow.copy_from_slice(&b[field::FLOW]);
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&b[field::SEQ]);
        let mut tx = [0u8; 8];
        tx.copy_from_slice(&b[field::TX_NS]);
        Ok(Stamp {
            flow: u32::from_be_bytes(flow),
            seq: u64::from_be_bytes(seq),
            tx_ns: u64::from_be_bytes(tx),
            warmup: flags & FLAG_WARMUP != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Stamp = Stamp {
        flow: 7,
        seq: 0x0102_0304_0506_0708,
        tx_ns: 123_456_789,
        warmup: true,
    };

    #[test]
    fn a_written_stamp_reads_back() {
        let mut buf = [0xffu8; 64];
        S.write(&mut buf).unwrap();
        assert_eq!(Stamp::read(&buf), Ok(S));
        assert_eq!(&buf[..4], &[0x55, 0x42, 1, 1]);
        assert_eq!(buf[24], 0xff, "bytes past the stamp are left alone");
    }

    #[test]
    fn a_short_payload_is_an_error_not_a_panic() {
        let mut small = [0u8; 23];
        assert_eq!(S.write(&mut small), Err(StampError::Short(23)));
        for len in 0..Stamp::LEN {
            assert_eq!(Stamp::read(&[0u8; 24][..len]), Err(StampError::Short(len)));
        }
    }

    #[test]
    fn a_corrupt_stamp_is_rejected() {
        let mut buf = [0u8; 24];
        S.write(&mut buf).unwrap();
        let mut bad = buf;
        bad[0] = 0;
        assert_eq!(Stamp::read(&bad), Err(StampError::BadMagic(0x0042)));
        let mut bad = buf;
        bad[2] = 9;
        assert_eq!(Stamp::read(&bad), Err(StampError::BadVersion(9)));
        let mut bad = buf;
        bad[3] = 0x81;
        assert_eq!(Stamp::read(&bad), Err(StampError::BadFlags(0x81)));
    }

    #[test]
    fn any_bytes_decode_to_a_stamp_or_an_error() {
        let mut rng = uniplane_dataplane::SplitMix64::new(5);
        let mut buf = [0u8; 40];
        for _ in 0..10_000 {
            let len = rng.below(41) as usize;
            for b in buf.iter_mut() {
                *b = rng.next_u64() as u8;
            }
            if rng.chance(0.5) {
                buf[..3].copy_from_slice(&[0x55, 0x42, 1]);
            }
            let _ = Stamp::read(&buf[..len]);
        }
    }
}
