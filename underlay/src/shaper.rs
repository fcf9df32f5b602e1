//! Rate shaping: a token bucket on virtual time.
//!
//! Credit is kept in billionths of a byte, so that `rate` bytes per second
//! earn exactly `rate` units per nanosecond: integer arithmetic, no
//! rounding, byte-accurate over any run. A message may go when the credit
//! covers it (or covers the whole burst, for a message larger than the
//! burst, which then leaves a debt); it is charged its encoded length plus
//! the per-frame overhead.

use crate::{Nanos, NANOS_PER_SEC};

/// The shape of an interface's output.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ShaperConfig {
    /// Long-run rate in bytes per second (header, payload and overhead).
    pub rate: u64,
    /// Bytes that may leave back to back after the bucket filled up. Zero
    /// paces every message to the rate. Make it at least the largest
    /// message, or such messages run the bucket into debt (still at the
    /// configured rate over time, but in bursts larger than this).
    pub burst: u64,
    /// Bytes charged per message on top of its encoded length: framing
    /// the interface adds (preamble, gap, lower-layer headers).
    pub overhead: u32,
}

impl ShaperConfig {
    /// `rate` bytes per second with a burst of `burst` bytes, no overhead.
    pub const fn new(rate: u64, burst: u64) -> ShaperConfig {
        ShaperConfig {
            rate,
            burst,
            overhead: 0,
        }
    }

    /// `bits` bits per second with a burst of `burst` bytes.
    pub const fn bits_per_sec(bits: u64, burst: u64) -> ShaperConfig {
        ShaperConfig::new(bits / 8, burst)
    }

    /// This shape with `overhead` bytes charged per message.
    pub const fn with_overhead(self, overhead: u32) -> ShaperConfig {
        ShaperConfig { overhead, ..self }
    }
}

/// Why a [`ShaperConfig`] cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ShaperError {
    /// A rate of zero never sends; leave the shaper out instead to send
    /// unshaped, or stop offering to halt the interface.
    #[error("shaping rate of zero bytes per second")]
    ZeroRate,
}

/// One unit of credit is a billionth of a byte.
const SCALE: i128 = NANOS_PER_SEC as i128;

/// The most credit a bucket saves: the burst, plus what the rate earns in
/// under a nanosecond, so that waking at a ready time rounded up to a
/// whole nanosecond never throws credit away.
fn cap(config: ShaperConfig) -> i128 {
    i128::from(config.burst) * SCALE + i128::from(config.rate) - 1
}

/// A token bucket: `rate` bytes per second, up to `burst` bytes saved.
#[derive(Clone, Debug)]
pub struct TokenBucket {
    config: ShaperConfig,
    /// Credit in billionths of a byte; negative after a message larger
    /// than the burst.
    credit: i128,
    /// The most credit saved: see `cap()`.
    cap: i128,
    /// Time of the last refill.
    last: Nanos,
    /// Until when the throttled time is already counted.
    held_until: Nanos,
    throttled: u64,
    messages: u64,
    bytes: u64,
}

impl TokenBucket {
    /// A full bucket of `config` at time `now`.
    pub fn new(config: ShaperConfig, now: Nanos) -> Result<TokenBucket, ShaperError> {
        if config.rate == 0 {
            return Err(ShaperError::ZeroRate);
        }
        Ok(TokenBucket {
            config,
            credit: i128::from(config.burst) * SCALE,
            cap: cap(config),
            last: now,
            held_until: now,
            throttled: 0,
            messages: 0,
            bytes: 0,
        })
    }

    /// The shape in force.
    pub fn config(&self) -> ShaperConfig {
        self.config
    }

    /// Changes the shape at `now`: credit earned so far at the old rate is
    /// kept, up to the new burst; debt is kept. Counters are kept.
    pub fn set_config(&mut self, config: ShaperConfig, now: Nanos) -> Result<(), ShaperError> {
        if config.rate == 0 {
            return Err(ShaperError::ZeroRate);
        }
        self.refill(now);
        self.config = config;
        self.cap = cap(config);
        self.credit = self.credit.min(self.cap);
        Ok(())
    }

    /// Bytes a message of encoded length `len` is charged.
    #[inline]
    pub fn cost(&self, len: usize) -> u64 {
        (len as u64).saturating_add(u64::from(self.config.overhead))
    }

    #[inline]
    fn refill(&mut self, now: Nanos) {
        if now <= self.last {
            return;
        }
        let earned = u128::from(self.config.rate) * u128::from(now - self.last);
        // credit <= cap always holds, so the room is never negative.
        let room = (self.cap - self.credit) as u128;
        self.credit = if earned >= room {
            self.cap
        } else {
            self.credit + earned as i128
        };
        self.last = now;
    }

    /// Credit a message of `cost` bytes needs before it may go.
    #[inline]
    fn need(&self, cost: u64) -> i128 {
        i128::from(cost.min(self.config.burst)) * SCALE
    }

    /// When (at or after `now`) a message of encoded length `len` may go.
    /// Time it has to wait is counted as throttled.
    #[inline]
    pub fn ready_at(&mut self, len: usize, now: Nanos) -> Nanos {
        self.refill(now);
        let missing = self.need(self.cost(len)) - self.credit;
        if missing <= 0 {
            return now;
        }
        let rate = u128::from(self.config.rate);
        let wait = (missing as u128).div_ceil(rate);
        // Credit was last brought up to date at max(now, last).
        let from = now.max(self.last);
        let at = from.saturating_add(u64::try_from(wait).unwrap_or(u64::MAX));
        if at > self.held_until {
            self.throttled = self.throttled.saturating_add(at - now.max(self.held_until));
            self.held_until = at;
        }
        at
    }

    /// Charges a message of encoded length `len` if it may go at `now`;
    /// otherwise returns when it may.
    #[inline]
    pub fn try_send(&mut self, len: usize, now: Nanos) -> Result<(), Nanos> {
        let at = self.ready_at(len, now);
        if at > now {
            return Err(at);
        }
        let cost = self.cost(len);
        self.credit -= i128::from(cost) * SCALE;
        self.messages += 1;
        self.bytes = self.bytes.saturating_add(cost);
        Ok(())
    }

    /// Whole bytes of credit at the last call (negative while in debt).
    pub fn credit(&self) -> i64 {
        let bytes = self.credit.div_euclid(SCALE);
        i64::try_from(bytes).unwrap_or(if bytes < 0 { i64::MIN } else { i64::MAX })
    }

    /// Messages charged.
    pub fn messages(&self) -> u64 {
        self.messages
    }

    /// Bytes charged, overhead included.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Nanoseconds a message that was ready had to wait for credit.
    pub fn throttled_ns(&self) -> u64 {
        self.throttled
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    #[test]
    fn a_zero_rate_is_refused() {
        assert_eq!(
            TokenBucket::new(ShaperConfig::new(0, 10), 0).unwrap_err(),
            ShaperError::ZeroRate
        );
    }

    #[test]
    fn a_full_bucket_sends_the_burst_at_once_then_waits_exactly() {
        // 1 MB/s: one byte per microsecond.
        let mut tb = TokenBucket::new(ShaperConfig::new(1_000_000, 1000), 0).unwrap();
        for _ in 0..10 {
            assert_eq!(tb.try_send(100, 0), Ok(()));
        }
        assert_eq!(tb.try_send(100, 0), Err(100_000));
        assert_eq!(tb.try_send(100, 99_999), Err(100_000));
        assert_eq!(tb.try_send(100, 100_000), Ok(()));
        assert_eq!(tb.bytes(), 1100);
        assert_eq!(tb.throttled_ns(), 100_000, "counted once");
    }

    #[test]
    fn credit_never_exceeds_the_burst() {
        let mut tb = TokenBucket::new(ShaperConfig::new(1_000_000, 500), 0).unwrap();
        assert_eq!(tb.ready_at(0, 1000 * MS), 1000 * MS);
        assert_eq!(tb.credit(), 500);
    }

    #[test]
    fn a_message_larger_than_the_burst_goes_on_a_full_bucket_and_leaves_debt() {
        let mut tb = TokenBucket::new(ShaperConfig::new(1_000_000, 100), 0).unwrap();
        assert_eq!(tb.try_send(1000, 0), Ok(()));
        assert_eq!(tb.credit(), -900);
        // Debt, then the burst's worth again: 1000 µs.
        assert_eq!(tb.ready_at(1000, 0), 1_000_000);
    }

    #[test]
    fn overhead_is_charged_per_message() {
        let cfg = ShaperConfig::new(1_000_000, 0).with_overhead(20);
        let mut tb = TokenBucket::new(cfg, 0).unwrap();
        assert_eq!(tb.try_send(80, 0), Ok(()));
        assert_eq!(tb.ready_at(80, 0), 100_000);
        assert_eq!(tb.bytes(), 100);
    }

    #[test]
    fn rates_that_do_not_divide_a_second_stay_exact() {
        // 3 bytes per second, zero burst: 1 byte every 333_333_333.3 ns.
        let mut tb = TokenBucket::new(ShaperConfig::new(3, 0), 0).unwrap();
        let mut now = 0;
        for _ in 0..3000 {
            now = tb.ready_at(1, now);
            tb.try_send(1, now).unwrap();
        }
        // The 3000th byte may go once 2999 bytes are paid for.
        assert_eq!(now, 2999 * NANOS_PER_SEC / 3 + 1);
    }

    #[test]
    fn time_going_backwards_earns_nothing_and_does_not_panic() {
        let mut tb = TokenBucket::new(ShaperConfig::new(1000, 10), 5000).unwrap();
        assert!(tb.try_send(10, 5000).is_ok());
        assert_eq!(tb.ready_at(10, 0), 5000 + 10_000_000);
    }

    #[test]
    fn extreme_rates_and_times_saturate() {
        let mut tb = TokenBucket::new(ShaperConfig::new(u64::MAX, u64::MAX), 0).unwrap();
        assert!(tb.try_send(usize::MAX, u64::MAX).is_ok());
        let mut slow = TokenBucket::new(ShaperConfig::new(1, 0), 0).unwrap();
        assert!(slow.try_send(usize::MAX, 0).is_ok());
        assert_eq!(slow.ready_at(1, 1), u64::MAX);
    }

    #[test]
    fn a_new_shape_keeps_credit_up_to_the_new_burst() {
        let mut tb = TokenBucket::new(ShaperConfig::new(1000, 1000), 0).unwrap();
        tb.set_config(ShaperConfig::new(2000, 10), 0).unwrap();
        assert_eq!(tb.credit(), 10);
        assert_eq!(
            tb.set_config(ShaperConfig::new(0, 10), 0),
            Err(ShaperError::ZeroRate)
        );
    }
}
