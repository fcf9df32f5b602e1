//! Seeded inputs: random printable ASCII (no newline, so `$` means the
//! same to every engine), some with a planted string known to match a
//! given rule of the Core Rule Set 3.3.
//!
//! Random printable bytes already match a good part of the rule set
//! (rules that look for a single odd character, say): the corpus
//! exercises the engines on those too, and the planted strings make sure
//! the rules the paper's application is about — SQL injection, XSS, path
//! traversal — are found where they are.

use uniplane_kernel::regex_stage::rules::PatternId;

/// Strings known to match a rule of the Core Rule Set 3.3 (each pattern
/// compiles with every engine), and that rule's pattern.
pub const PLANTED: &[(&str, PatternId)] = &[
    ("sleep(5)", PatternId(942160)),
    ("<script>alert(1)</script>", PatternId(941110)),
    ("../../etc/passwd", PatternId(930100)),
    ("information_schema.tables", PatternId(942140)),
    ("<img src=x onerror=alert(1)>", PatternId(941120)),
    ("javascript:alert(1)", PatternId(941170)),
    ("<?php echo 1; ?>", PatternId(933100)),
    ("java.lang.Runtime", PatternId(1 << 24 | 944110)),
    ("<!ENTITY xxe SYSTEM", PatternId(941130)),
    ("1 union select password from users", PatternId(942270)),
];

/// One input of a corpus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// Its bytes.
    pub bytes: Vec<u8>,
    /// The index into [`PLANTED`] of the string planted in it, if any.
    pub planted: Option<usize>,
}

/// A seeded stream of inputs.
#[derive(Clone, Debug)]
pub struct Corpus(u64);

impl Corpus {
    /// The stream of `seed`.
    pub fn new(seed: u64) -> Corpus {
        Corpus(seed ^ 0x2545_f491_4f6c_dd1d)
    }

    fn next(&mut self) -> u64 {
        // xorshift64*: never zero from a nonzero state.
        if self.0 == 0 {
            self.0 = 0x9e37_79b9_7f4a_7c15;
        }
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// `size` random printable bytes (0x20 to 0x7e).
    pub fn random(&mut self, size: usize) -> Vec<u8> {
        (0..size)
            .map(|_| 0x20 + (self.next() >> 33) as u8 % 95)
            .collect()
    }

    /// An input of `size` bytes: random, with `PLANTED[planted]`
    /// written at a random place, a blank on each side (rules look for
    /// word boundaries), when one is asked and fits.
    pub fn input(&mut self, size: usize, planted: Option<usize>) -> Input {
        let mut bytes = self.random(size);
        let planted = planted.filter(|&p| PLANTED.get(p).is_some_and(|s| s.0.len() + 2 <= size));
        if let Some(p) = planted {
            let text = PLANTED[p].0.as_bytes();
            let at = (self.next() as usize) % (size - text.len() - 1);
            bytes[at] = b' ';
            bytes[at + 1..at + 1 + text.len()].copy_from_slice(text);
            bytes[at + 1 + text.len()] = b' ';
        }
        Input { bytes, planted }
    }

    /// `count` inputs of the sizes in `sizes` in turn, every other one
    /// with the next of the planted strings.
    pub fn inputs(&mut self, count: usize, sizes: &[usize]) -> Vec<Input> {
        (0..count)
            .map(|i| {
                let size = sizes[i % sizes.len().max(1)];
                let planted = (i % 2 == 1).then_some(i / 2 % PLANTED.len());
                self.input(size, planted)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_seeded_printable_and_carry_their_planted_string() {
        let a = Corpus::new(5).inputs(40, &[64, 1024]);
        assert_eq!(a, Corpus::new(5).inputs(40, &[64, 1024]));
        assert_ne!(a, Corpus::new(6).inputs(40, &[64, 1024]));
        for (i, input) in a.iter().enumerate() {
            assert_eq!(input.bytes.len(), [64, 1024][i % 2]);
            assert!(input.bytes.iter().all(|b| (0x20..0x7f).contains(b)));
            if let Some(p) = input.planted {
                let text = PLANTED[p].0.as_bytes();
                assert!(input.bytes.windows(text.len()).any(|w| w == text));
            }
        }
        assert_eq!(a.iter().filter(|i| i.planted.is_some()).count(), 20);
    }

    #[test]
    fn a_planted_string_longer_than_the_input_is_left_out() {
        let input = Corpus::new(1).input(4, Some(0));
        assert_eq!((input.bytes.len(), input.planted), (4, None));
    }
}
