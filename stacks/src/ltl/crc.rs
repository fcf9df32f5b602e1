//! CRC-32C (Castagnoli), the checksum of LTL frames, from the `crc32c`
//! crate: the CPU's `crc32` instruction where there is one (SSE 4.2 on
//! x86-64, the CRC extension on aarch64, checked at run time), else a
//! software fallback. The running state is what lets a sender sum the
//! payload once and finish the frame under each fresh header.

/// Running CRC-32C state: start with [`Crc32c::new`], feed bytes with
/// [`Crc32c::update`], read with [`Crc32c::finish`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Crc32c(u32);

impl Crc32c {
    /// A fresh state.
    pub const fn new() -> Self {
        Crc32c(0)
    }

    /// Feeds `data`.
    #[inline]
    pub fn update(self, data: &[u8]) -> Self {
        Crc32c(crc32c::crc32c_append(self.0, data))
    }

    /// The checksum of everything fed.
    pub const fn finish(self) -> u32 {
        self.0
    }
}

/// CRC-32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_answers() {
        // RFC 3720 B.4 and the common check value.
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
        assert_eq!(crc32c(b""), 0);
    }

    /// The crate picks the instruction or its software path at run time:
    /// every length class (below a word, words, long runs) gives what a
    /// bitwise reference computes.
    #[test]
    fn every_length_matches_the_bitwise_definition() {
        fn reference(data: &[u8]) -> u32 {
            let mut c = !0u32;
            for &b in data {
                c ^= u32::from(b);
                for _ in 0..8 {
                    c = if c & 1 != 0 {
                        (c >> 1) ^ 0x82f6_3b78
                    } else {
                        c >> 1
                    };
                }
            }
            !c
        }
        let data: Vec<u8> = (0..3000u32).map(|i| (i * 131 + 7) as u8).collect();
        for len in [0, 1, 7, 8, 9, 63, 64, 1400, 3000] {
            assert_eq!(crc32c(&data[..len]), reference(&data[..len]), "{len} bytes");
        }
    }

    #[test]
    fn feeding_in_pieces_is_feeding_at_once() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let whole = crc32c(&data);
        for cut in [0, 1, 7, 8, 9, 500, 999, 1000] {
            let (a, b) = data.split_at(cut);
            assert_eq!(Crc32c::new().update(a).update(b).finish(), whole);
        }
    }
}
