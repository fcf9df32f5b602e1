//! Parsing of the generator's workload arguments: payload sizes, size
//! sweeps, rates and pacing patterns, with errors that say what would have
//! been accepted.
//!
//! - sizes: `64` (fixed), `64,256,1500` (a list), `64..4096` (doubling from
//!   the start, the end included), `64..1500:256` (a linear step);
//! - rates: `1Mpps`, `500kpps`, `20000pps` (messages per second) or
//!   `10Gbps`, `500Mbit/s`, `64kbps` (bits per second of encoded messages,
//!   L2), or `max` for as fast as the link accepts;
//! - patterns: `constant`, `burst` (32 per burst), `burst:N`, `poisson`.

use std::fmt;
use std::str::FromStr;

use crate::stamp::Stamp;

/// The largest payload of one overlay message (`msg_length` is 16 bits).
pub const MAX_SIZE: usize = uniplane_dataplane::Message::MAX_PAYLOAD;
/// The smallest payload the generator sends: its stamp must fit.
pub const MIN_SIZE: usize = Stamp::LEN;
/// Most sizes one sweep may hold.
pub const MAX_SWEEP: usize = 4096;

/// Why an argument was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ArgError {
    /// Nothing was given.
    #[error("empty value")]
    Empty,
    /// A part that should be a number is not.
    #[error("`{0}` is not a number")]
    NotANumber(String),
    /// A rate without a unit; bare numbers are ambiguous.
    #[error(
        "rate `{0}` has no unit: write messages per second (pps, kpps, Mpps, Gpps) \
         or bits per second (bps, kbps, Mbps, Gbps, or 10Gbit/s), or `max`"
    )]
    MissingRateUnit(String),
    /// A rate with a unit this parser does not know.
    #[error("rate `{value}` has unknown unit `{unit}`: use pps, kpps, Mpps, Gpps, bps, kbps, Mbps, Gbps or bit/s forms")]
    UnknownRateUnit {
        /// The whole value.
        value: String,
        /// The part taken for the unit.
        unit: String,
    },
    /// Zero, negative, or not finite.
    #[error("rate `{0}` must be a positive finite number")]
    BadRate(String),
    /// A size too small for the generator's stamp.
    #[error("size {size} is below {min} bytes, the generator stamp every message carries")]
    SizeTooSmall {
        /// The size asked for.
        size: usize,
        /// The smallest accepted.
        min: usize,
    },
    /// A size larger than one overlay message carries.
    #[error("size {size} is above {max} bytes, the largest overlay payload")]
    SizeTooLarge {
        /// The size asked for.
        size: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A range whose start is past its end.
    #[error("range `{0}` is empty: its start must not exceed its end")]
    EmptyRange(String),
    /// A range step of zero.
    #[error("range `{0}` has a zero step")]
    ZeroStep(String),
    /// A sweep of too many sizes.
    #[error("sweep `{text}` has {count} sizes, more than the {max} allowed")]
    TooManySizes {
        /// The sweep as given.
        text: String,
        /// How many sizes it would hold.
        count: usize,
        /// The most accepted.
        max: usize,
    },
    /// An unknown pacing pattern.
    #[error("unknown pattern `{0}`: use constant, burst, burst:N or poisson")]
    UnknownPattern(String),
}

/// Parses one payload size in bytes and checks it is in range.
pub fn parse_size(text: &str) -> Result<usize, ArgError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(ArgError::Empty);
    }
    let size: usize = t.parse().map_err(|_| ArgError::NotANumber(t.to_owned()))?;
    check_size(size)
}

fn check_size(size: usize) -> Result<usize, ArgError> {
    if size < MIN_SIZE {
        Err(ArgError::SizeTooSmall {
            size,
            min: MIN_SIZE,
        })
    } else if size > MAX_SIZE {
        Err(ArgError::SizeTooLarge {
            size,
            max: MAX_SIZE,
        })
    } else {
        Ok(size)
    }
}

/// A list of payload sizes to sweep, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SizeSweep(pub Vec<usize>);

impl FromStr for SizeSweep {
    type Err = ArgError;

    fn from_str(text: &str) -> Result<Self, ArgError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(ArgError::Empty);
        }
        let mut sizes = Vec::new();
        for part in t.split(',') {
            let part = part.trim();
            match part.split_once("..") {
                Some((from, rest)) => expand_range(part, from, rest, &mut sizes, t)?,
                None => sizes.push(parse_size(part)?),
            }
            if sizes.len() > MAX_SWEEP {
                return Err(ArgError::TooManySizes {
                    text: t.to_owned(),
                    count: sizes.len(),
                    max: MAX_SWEEP,
                });
            }
        }
        Ok(SizeSweep(sizes))
    }
}

fn expand_range(
    part: &str,
    from: &str,
    rest: &str,
    out: &mut Vec<usize>,
    whole: &str,
) -> Result<(), ArgError> {
    let (to, step) = match rest.split_once(':') {
        Some((to, step)) => {
            let step: usize = step
                .trim()
                .parse()
                .map_err(|_| ArgError::NotANumber(step.trim().to_owned()))?;
            if step == 0 {
                return Err(ArgError::ZeroStep(part.to_owned()));
            }
            (to, Some(step))
        }
        None => (rest, None),
    };
    let from = parse_size(from)?;
    let to = parse_size(to)?;
    if from > to {
        return Err(ArgError::EmptyRange(part.to_owned()));
    }
    let count = match step {
        Some(s) => (to - from) / s + 1,
        None => (usize::BITS - (to / from).leading_zeros()) as usize + 1,
    };
    if out.len() + count > MAX_SWEEP {
        return Err(ArgError::TooManySizes {
            text: whole.to_owned(),
            count: out.len() + count,
            max: MAX_SWEEP,
        });
    }
    let mut size = from;
    while size <= to {
        out.push(size);
        size = match step {
            Some(s) => size.saturating_add(s),
            None => size.saturating_mul(2),
        };
    }
    if step.is_none() && out.last() != Some(&to) {
        out.push(to);
    }
    Ok(())
}

/// How fast to send.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// As fast as the link accepts.
    Max,
    /// Messages per second.
    Pps(f64),
    /// Bits per second of encoded messages (header and payload, L2).
    Bps(f64),
}

impl Rate {
    /// Messages per second for messages of `mean_l2_bytes` encoded bytes on
    /// average; `None` for [`Rate::Max`].
    pub fn pps(&self, mean_l2_bytes: f64) -> Option<f64> {
        match *self {
            Rate::Max => None,
            Rate::Pps(p) => Some(p),
            Rate::Bps(b) => Some(b / (8.0 * mean_l2_bytes.max(1.0))),
        }
    }
}

impl fmt::Display for Rate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Rate::Max => f.write_str("max"),
            Rate::Pps(p) => write!(f, "{p}pps"),
            Rate::Bps(b) => write!(f, "{b}bps"),
        }
    }
}

impl FromStr for Rate {
    type Err = ArgError;

    fn from_str(text: &str) -> Result<Self, ArgError> {
        let t = text.trim();
        if t.is_empty() {
            return Err(ArgError::Empty);
        }
        if t.eq_ignore_ascii_case("max") || t.eq_ignore_ascii_case("unlimited") {
            return Ok(Rate::Max);
        }
        // The number may be written `1e6`; the unit starts at the first
        // other letter.
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || matches!(c, '.' | 'e' | 'E' | '_')))
            .unwrap_or(t.len());
        let (number, unit) = t.split_at(split);
        let number = number.replace('_', "");
        if number.is_empty() {
            return Err(ArgError::NotANumber(t.to_owned()));
        }
        let value: f64 = number
            .parse()
            .map_err(|_| ArgError::NotANumber(number.clone()))?;
        let unit = unit.trim();
        if unit.is_empty() {
            return Err(ArgError::MissingRateUnit(t.to_owned()));
        }
        let lower = unit.to_ascii_lowercase();
        let (scale, base) = match lower.chars().next() {
            Some('k') => (1e3, &lower[1..]),
            Some('m') => (1e6, &lower[1..]),
            Some('g') => (1e9, &lower[1..]),
            Some('t') => (1e12, &lower[1..]),
            _ => (1.0, lower.as_str()),
        };
        let rate = value * scale;
        match base {
            "pps" | "p/s" | "bps" | "bit/s" | "b/s" if !(rate.is_finite() && rate > 0.0) => {
                Err(ArgError::BadRate(t.to_owned()))
            }
            "pps" | "p/s" => Ok(Rate::Pps(rate)),
            "bps" | "bit/s" | "b/s" => Ok(Rate::Bps(rate)),
            _ => Err(ArgError::UnknownRateUnit {
                value: t.to_owned(),
                unit: unit.to_owned(),
            }),
        }
    }
}

/// How departures are spaced at a given mean rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Evenly spaced: one message every 1/rate.
    Constant,
    /// Back-to-back bursts of this many messages, one burst every
    /// burst/rate.
    Burst(u32),
    /// Exponentially distributed gaps (a Poisson process) of mean 1/rate.
    Poisson,
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Constant => f.write_str("constant"),
            Pattern::Burst(n) => write!(f, "burst:{n}"),
            Pattern::Poisson => f.write_str("poisson"),
        }
    }
}

impl FromStr for Pattern {
    type Err = ArgError;

    /// `constant`, `poisson`, `burst` (32 per burst) or `burst:N`.
    fn from_str(text: &str) -> Result<Self, ArgError> {
        let t = text.trim().to_ascii_lowercase();
        match t.as_str() {
            "" => Err(ArgError::Empty),
            "constant" | "cbr" => Ok(Pattern::Constant),
            "poisson" => Ok(Pattern::Poisson),
            "burst" => Ok(Pattern::Burst(32)),
            other => match other.strip_prefix("burst:") {
                Some(n) => match n.parse::<u32>() {
                    Ok(n) if n > 0 => Ok(Pattern::Burst(n)),
                    _ => Err(ArgError::NotANumber(n.to_owned())),
                },
                None => Err(ArgError::UnknownPattern(text.trim().to_owned())),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(s: &str) -> Result<Vec<usize>, ArgError> {
        s.parse::<SizeSweep>().map(|s| s.0)
    }

    #[test]
    fn a_fixed_size_parses_and_its_bounds_are_checked() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size(" 1500 "), Ok(1500));
        assert_eq!(
            parse_size("8"),
            Err(ArgError::SizeTooSmall {
                size: 8,
                min: MIN_SIZE
            })
        );
        assert_eq!(
            parse_size("70000"),
            Err(ArgError::SizeTooLarge {
                size: 70000,
                max: MAX_SIZE
            })
        );
        assert_eq!(parse_size("6x"), Err(ArgError::NotANumber("6x".into())));
        assert_eq!(parse_size("-64"), Err(ArgError::NotANumber("-64".into())));
        assert_eq!(parse_size(""), Err(ArgError::Empty));
    }

    #[test]
    fn a_list_sweep_keeps_the_order_given() {
        assert_eq!(sweep("64,256,1500"), Ok(vec![64, 256, 1500]));
        assert_eq!(sweep("1500, 64"), Ok(vec![1500, 64]));
    }

    #[test]
    fn a_range_sweep_doubles_and_includes_its_end() {
        assert_eq!(
            sweep("64..4096"),
            Ok(vec![64, 128, 256, 512, 1024, 2048, 4096])
        );
        assert_eq!(sweep("64..1500"), Ok(vec![64, 128, 256, 512, 1024, 1500]));
        assert_eq!(sweep("100..100"), Ok(vec![100]));
    }

    #[test]
    fn a_range_sweep_with_a_step_is_linear() {
        assert_eq!(sweep("64..1000:300"), Ok(vec![64, 364, 664, 964]));
        assert_eq!(sweep("64..128,1500"), Ok(vec![64, 128, 1500]));
        assert_eq!(sweep("64..65535:18446744073709551615"), Ok(vec![64]));
    }

    #[test]
    fn bad_sweeps_say_what_is_wrong() {
        assert_eq!(
            sweep("4096..64"),
            Err(ArgError::EmptyRange("4096..64".into()))
        );
        assert_eq!(
            sweep("64..128:0"),
            Err(ArgError::ZeroStep("64..128:0".into()))
        );
        assert!(matches!(sweep("1..64"), Err(ArgError::SizeTooSmall { .. })));
        assert!(matches!(
            sweep("24..65535:1"),
            Err(ArgError::TooManySizes { .. })
        ));
        assert_eq!(sweep("64,,128"), Err(ArgError::Empty));
        assert_eq!(sweep("64..x"), Err(ArgError::NotANumber("x".into())));
    }

    #[test]
    fn message_rates_parse_with_si_prefixes() {
        assert_eq!("1Mpps".parse(), Ok(Rate::Pps(1e6)));
        assert_eq!("500kpps".parse(), Ok(Rate::Pps(5e5)));
        assert_eq!("20000pps".parse(), Ok(Rate::Pps(2e4)));
        assert_eq!("1.5Mpps".parse(), Ok(Rate::Pps(1.5e6)));
        assert_eq!("1e6pps".parse(), Ok(Rate::Pps(1e6)));
        assert_eq!("max".parse(), Ok(Rate::Max));
    }

    #[test]
    fn bit_rates_parse_and_convert_to_messages_at_l2() {
        assert_eq!("10Gbps".parse(), Ok(Rate::Bps(1e10)));
        assert_eq!("500Mbit/s".parse(), Ok(Rate::Bps(5e8)));
        assert_eq!("64kbps".parse(), Ok(Rate::Bps(64e3)));
        // 96-byte messages (32 header + 64 payload) at 768 kbit/s: 1000 pps.
        assert_eq!(Rate::Bps(768e3).pps(96.0), Some(1000.0));
        assert_eq!(Rate::Max.pps(96.0), None);
    }

    #[test]
    fn bad_rates_say_which_units_exist() {
        assert_eq!(
            "1000".parse::<Rate>(),
            Err(ArgError::MissingRateUnit("1000".into()))
        );
        assert!(matches!(
            "5 furlongs".parse::<Rate>(),
            Err(ArgError::UnknownRateUnit { .. })
        ));
        assert_eq!(
            "0pps".parse::<Rate>(),
            Err(ArgError::BadRate("0pps".into()))
        );
        assert_eq!(
            "Mpps".parse::<Rate>(),
            Err(ArgError::NotANumber("Mpps".into()))
        );
        let msg = "1000".parse::<Rate>().unwrap_err().to_string();
        assert!(msg.contains("Mpps") && msg.contains("Gbps"), "{msg}");
    }

    #[test]
    fn patterns_parse_with_an_optional_burst_size() {
        assert_eq!("constant".parse(), Ok(Pattern::Constant));
        assert_eq!("poisson".parse(), Ok(Pattern::Poisson));
        assert_eq!("burst".parse(), Ok(Pattern::Burst(32)));
        assert_eq!("burst:8".parse(), Ok(Pattern::Burst(8)));
        assert!("burst:0".parse::<Pattern>().is_err());
        assert_eq!(
            "zigzag".parse::<Pattern>(),
            Err(ArgError::UnknownPattern("zigzag".into()))
        );
    }
}
