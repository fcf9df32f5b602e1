//! One 256-bit beat as two big-endian 128-bit words, with field access by
//! bit span. Spans come from the tables in [`super::field`] and are
//! constants, so each access compiles to a shift and a mask.

/// A 256-bit beat; `hi` holds bits 255..128 (the first 16 bytes on the wire).
#[derive(Clone, Copy, Default)]
pub(super) struct Beat {
    hi: u128,
    lo: u128,
}

#[inline(always)]
const fn mask(bits: u32) -> u128 {
    if bits >= 128 {
        u128::MAX
    } else {
        (1u128 << bits) - 1
    }
}

impl Beat {
    #[inline(always)]
    pub(super) fn load(bytes: &[u8; 32]) -> Beat {
        let (hi, lo) = bytes.split_at(16);
        Beat {
            hi: u128::from_be_bytes(hi.try_into().unwrap_or([0; 16])),
            lo: u128::from_be_bytes(lo.try_into().unwrap_or([0; 16])),
        }
    }

    #[inline(always)]
    pub(super) fn store(&self, out: &mut [u8; 32]) {
        out[..16].copy_from_slice(&self.hi.to_be_bytes());
        out[16..].copy_from_slice(&self.lo.to_be_bytes());
    }

    /// The field at `(start, bits)`, `start` counted from the most
    /// significant bit.
    #[inline(always)]
    pub(super) fn get(&self, (start, bits): (u32, u32)) -> u128 {
        let end = start + bits;
        if end <= 128 {
            (self.hi >> (128 - end)) & mask(bits)
        } else if start >= 128 {
            (self.lo >> (256 - end)) & mask(bits)
        } else {
            let low_bits = end - 128;
            ((self.hi << low_bits) | (self.lo >> (128 - low_bits))) & mask(bits)
        }
    }

    /// ORs `value` into the field at `(start, bits)`; the field must be zero.
    #[inline(always)]
    pub(super) fn put(&mut self, (start, bits): (u32, u32), value: u128) {
        let value = value & mask(bits);
        let end = start + bits;
        if end <= 128 {
            self.hi |= value << (128 - end);
        } else if start >= 128 {
            self.lo |= value << (256 - end);
        } else {
            let low_bits = end - 128;
            self.hi |= value >> low_bits;
            self.lo |= value << (128 - low_bits);
        }
    }

    /// The low 128 bits (the last 16 bytes on the wire).
    #[inline(always)]
    pub(super) fn low(&self) -> u128 {
        self.lo
    }

    /// Whether every bit of the span is zero.
    #[inline(always)]
    pub(super) fn is_zero(&self, span: (u32, u32)) -> bool {
        self.get(span) == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_straddling_the_halves_round_trip() {
        let mut b = Beat::default();
        b.put((120, 32), 0xdead_beef);
        assert_eq!(b.get((120, 32)), 0xdead_beef);
        let mut bytes = [0u8; 32];
        b.store(&mut bytes);
        assert_eq!(&bytes[15..19], &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(Beat::load(&bytes).get((120, 32)), 0xdead_beef);
    }

    #[test]
    fn fields_in_each_half() {
        let mut b = Beat::default();
        b.put((0, 48), 0x0a00_0007_0003);
        b.put((160, 96), u128::MAX);
        assert_eq!(b.get((0, 48)), 0x0a00_0007_0003);
        assert_eq!(b.get((160, 96)), mask(96));
        assert!(b.is_zero((48, 112)));
    }
}
