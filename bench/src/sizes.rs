//! The sizes a run sends: one fixed size, or a repeating mix such as IMIX.
//!
//! IMIX here is the classic "simple IMIX" ratio 7:4:1 of 64, 594 and 1518
//! bytes, applied to the overlay payload (the 32-byte overlay header comes
//! on top, as it does for every size). The 12 messages of one cycle are
//! interleaved (smooth weighted round robin), not sent as runs of one size,
//! so even a short run has the mix's proportions.

/// The simple IMIX: (payload bytes, weight).
pub const IMIX: &[(usize, u32)] = &[(64, 7), (594, 4), (1518, 1)];

/// A repeating sequence of payload sizes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeMix {
    cycle: Vec<usize>,
    pos: usize,
    label: String,
}

impl SizeMix {
    /// Every message `size` bytes.
    pub fn fixed(size: usize) -> Self {
        SizeMix {
            cycle: vec![size],
            pos: 0,
            label: size.to_string(),
        }
    }

    /// The simple IMIX (see [`IMIX`]).
    pub fn imix() -> Self {
        Self::weighted("imix", IMIX)
    }

    /// A mix of `(size, weight)` pairs, interleaved by smooth weighted
    /// round robin; weights of zero are left out.
    pub fn weighted(label: &str, parts: &[(usize, u32)]) -> Self {
        let parts: Vec<(usize, i64)> = parts
            .iter()
            .filter(|(_, w)| *w > 0)
            .map(|&(s, w)| (s, i64::from(w)))
            .collect();
        let total: i64 = parts.iter().map(|p| p.1).sum();
        let mut credit = vec![0i64; parts.len()];
        let mut cycle = Vec::with_capacity(total.max(0) as usize);
        for _ in 0..total {
            let mut best = 0;
            for (i, (_, w)) in parts.iter().enumerate() {
                credit[i] += w;
                if credit[i] > credit[best] {
                    best = i;
                }
            }
            credit[best] -= total;
            cycle.push(parts[best].0);
        }
        SizeMix {
            cycle,
            pos: 0,
            label: label.to_owned(),
        }
    }

    /// The size of the next message.
    #[inline]
    pub fn next_size(&mut self) -> usize {
        let size = self.cycle[self.pos];
        self.pos += 1;
        if self.pos == self.cycle.len() {
            self.pos = 0;
        }
        size
    }

    /// Mean payload size over one cycle.
    pub fn mean(&self) -> f64 {
        self.cycle.iter().sum::<usize>() as f64 / self.cycle.len().max(1) as f64
    }

    /// Largest payload size.
    pub fn max(&self) -> usize {
        self.cycle.iter().copied().max().unwrap_or(0)
    }

    /// One cycle of sizes.
    pub fn cycle(&self) -> &[usize] {
        &self.cycle
    }

    /// `64` for a fixed size, `imix` for IMIX.
    pub fn label(&self) -> &str {
        &self.label
    }
}

/// Parses a list of byte sizes as the collective and PGAS benchmarks take
/// them: `8,4K,1M` (K and M are binary), and `FROM..TO` ranges that
/// double from FROM and end with TO. Every size is from 1 to `max`; at
/// most 64 sizes.
pub fn parse_byte_sizes(text: &str, max: usize) -> Result<Vec<usize>, String> {
    let one = |t: &str| -> Result<usize, String> {
        let t = t.trim();
        let (digits, unit) = match t.as_bytes().last() {
            Some(b'K' | b'k') => (&t[..t.len() - 1], 1 << 10),
            Some(b'M' | b'm') => (&t[..t.len() - 1], 1 << 20),
            _ => (t, 1),
        };
        digits
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_mul(unit))
            .filter(|n| (1..=max).contains(n))
            .ok_or_else(|| format!("{t:?} is not a size from 1 B to {} KiB", max >> 10))
    };
    let mut out = Vec::new();
    for part in text.split(',') {
        match part.split_once("..") {
            Some((from, to)) => {
                let (mut s, to) = (one(from)?, one(to)?);
                if s > to {
                    return Err(format!("empty range {part:?}"));
                }
                while s < to {
                    out.push(s);
                    s *= 2;
                }
                out.push(to);
            }
            None => out.push(one(part)?),
        }
        if out.len() > 64 {
            return Err("more than 64 sizes".into());
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imix_has_the_seven_four_one_ratio_interleaved() {
        let mix = SizeMix::imix();
        let c = mix.cycle();
        assert_eq!(c.len(), 12);
        assert_eq!(c.iter().filter(|&&s| s == 64).count(), 7);
        assert_eq!(c.iter().filter(|&&s| s == 594).count(), 4);
        assert_eq!(c.iter().filter(|&&s| s == 1518).count(), 1);
        // Interleaved: never more than two 64s in a row within the cycle.
        assert!(c.windows(3).all(|w| !w.iter().all(|&s| s == 64)), "{c:?}");
        assert!((mix.mean() - 4342.0 / 12.0).abs() < 1e-9);
        assert_eq!(mix.max(), 1518);
    }

    #[test]
    fn a_mix_repeats_its_cycle() {
        let mut mix = SizeMix::weighted("x", &[(100, 1), (200, 1)]);
        let got: Vec<usize> = (0..4).map(|_| mix.next_size()).collect();
        assert_eq!(got[0..2], got[2..4]);
        let mut fixed = SizeMix::fixed(64);
        assert!((0..5).all(|_| fixed.next_size() == 64));
        assert_eq!(fixed.label(), "64");
    }
}
