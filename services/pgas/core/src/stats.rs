//! The statistics segment of a hardware endpoint: what its target side
//! counted, read with an ordinary get, as a register block is read.
//!
//! Segment [`STATS_SEGMENT`] is read-only for every rank (a write or an
//! atomic to it is refused `Denied`) and holds [`STATS_BYTES`] bytes:
//! nine little-endian `u64`s, in the order of [`HardwareStats`]'s fields.

use crate::access::SegmentId;
use crate::target::TargetStats;

/// The segment ID of a hardware endpoint's statistics.
pub const STATS_SEGMENT: SegmentId = 0xffff;

/// Bytes of the statistics segment.
pub const STATS_BYTES: usize = 9 * 8;

/// What a hardware endpoint counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HardwareStats {
    /// Its target side's counters (frames, refusals by reason).
    pub target: TargetStats,
    /// The built-in counter handler's total.
    pub counter: u64,
}

impl HardwareStats {
    /// The segment's bytes.
    pub fn encode(&self) -> [u8; STATS_BYTES] {
        let t = &self.target;
        let words = [
            t.frames,
            t.malformed,
            t.out_of_bounds,
            t.no_segment,
            t.no_handler,
            t.denied,
            t.misaligned,
            t.too_large,
            self.counter,
        ];
        let mut b = [0u8; STATS_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    /// The statistics in `bytes` (a get of the whole segment); `None`
    /// when it is not [`STATS_BYTES`] long.
    pub fn decode(bytes: &[u8]) -> Option<HardwareStats> {
        if bytes.len() != STATS_BYTES {
            return None;
        }
        let w = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&bytes[i * 8..i * 8 + 8]);
            u64::from_le_bytes(x)
        };
        Some(HardwareStats {
            target: TargetStats {
                frames: w(0),
                malformed: w(1),
                out_of_bounds: w(2),
                no_segment: w(3),
                no_handler: w(4),
                denied: w(5),
                misaligned: w(6),
                too_large: w(7),
            },
            counter: w(8),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statistics_round_trip_through_their_segment_bytes() {
        let s = HardwareStats {
            target: TargetStats {
                frames: 1,
                malformed: 2,
                out_of_bounds: 3,
                no_segment: 4,
                no_handler: 5,
                denied: 6,
                misaligned: 7,
                too_large: 8,
            },
            counter: u64::MAX,
        };
        assert_eq!(HardwareStats::decode(&s.encode()), Some(s));
        assert_eq!(HardwareStats::decode(&[0; 8]), None);
    }
}
