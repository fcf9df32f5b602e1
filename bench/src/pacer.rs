//! Rate control: when each message may leave.
//!
//! [`Pacer`] keeps the departure time of the next message and grants every
//! message whose time has come; it never sleeps and reads time only from
//! the [`Clock`] it is given, so tests drive it with a
//! [`VirtualClock`](crate::clock::VirtualClock). A sender that fell behind
//! catches up (the mean rate holds), in bursts no larger than it asks for.

use uniplane_dataplane::SplitMix64;

use crate::args::Pattern;
use crate::clock::Clock;

/// Grants departures at a mean rate in a [`Pattern`].
#[derive(Debug)]
pub struct Pacer<C> {
    clock: C,
    /// Mean gap between messages in ns; `None` means unlimited.
    gap_ns: Option<f64>,
    pattern: Pattern,
    /// Departure time of the next message.
    next_ns: f64,
    /// Messages already granted in the current burst.
    in_burst: u32,
    rng: SplitMix64,
}

impl<C: Clock> Pacer<C> {
    /// A pacer at `pps` messages per second (`None`: as fast as asked) in
    /// `pattern`, whose first departure is now. `seed` drives the Poisson
    /// gaps.
    pub fn new(clock: C, pps: Option<f64>, pattern: Pattern, seed: u64) -> Self {
        let start = clock.now_ns() as f64;
        let gap_ns = pps.filter(|p| p.is_finite() && *p > 0.0).map(|p| 1e9 / p);
        let mut pacer = Pacer {
            clock,
            gap_ns,
            pattern,
            next_ns: start,
            in_burst: 0,
            rng: SplitMix64::new(seed),
        };
        if pattern == Pattern::Poisson {
            // A Poisson process has no departure at its origin.
            pacer.advance();
        }
        pacer
    }

    /// The clock the pacer reads.
    pub fn clock(&self) -> &C {
        &self.clock
    }

    /// How many messages (at most `max`) may leave now.
    #[inline]
    pub fn grant(&mut self, max: usize) -> usize {
        let now = self.clock.now_ns();
        self.grant_at(now, max)
    }

    /// How many messages (at most `max`) may leave at `now_ns`.
    #[inline]
    pub fn grant_at(&mut self, now_ns: u64, max: usize) -> usize {
        if self.gap_ns.is_none() {
            return max;
        }
        let now = now_ns as f64;
        let mut n = 0;
        while n < max && self.next_ns <= now {
            n += 1;
            self.advance();
        }
        n
    }

    /// When the next message may leave (ns of the clock); `None` when the
    /// pacer is unlimited.
    #[inline]
    pub fn next_due_ns(&self) -> Option<u64> {
        self.gap_ns.map(|_| self.next_ns.max(0.0).ceil() as u64)
    }

    fn advance(&mut self) {
        let Some(gap) = self.gap_ns else { return };
        match self.pattern {
            Pattern::Constant => self.next_ns += gap,
            Pattern::Burst(size) => {
                let size = size.max(1);
                self.in_burst += 1;
                if self.in_burst >= size {
                    self.in_burst = 0;
                    self.next_ns += gap * f64::from(size);
                }
            }
            Pattern::Poisson => {
                // Inverse transform of a uniform in (0, 1].
                let u = 1.0 - self.rng.next_f64();
                self.next_ns += -u.ln() * gap;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::VirtualClock;

    /// Drives a pacer for one virtual second in steps of `step_ns`, asking
    /// for up to `max` per step; returns the departure times granted.
    fn departures(pps: f64, pattern: Pattern, step_ns: u64, max: usize) -> Vec<u64> {
        let clock = VirtualClock::at(1_000);
        let mut pacer = Pacer::new(&clock, Some(pps), pattern, 42);
        let mut out = Vec::new();
        let end = clock.now_ns() + 1_000_000_000;
        while clock.now_ns() < end {
            let now = clock.now_ns();
            for _ in 0..pacer.grant(max) {
                out.push(now);
            }
            clock.advance(step_ns);
        }
        out
    }

    fn within(got: usize, want: f64, tolerance: f64) -> bool {
        (got as f64 - want).abs() <= want * tolerance
    }

    #[test]
    fn constant_rate_is_within_two_percent() {
        for pps in [1e3, 1e5, 1e6, 5e6] {
            let d = departures(pps, Pattern::Constant, 97, 64);
            assert!(within(d.len(), pps, 0.02), "{pps}: {}", d.len());
        }
    }

    #[test]
    fn constant_rate_spaces_messages_evenly() {
        let d = departures(1e4, Pattern::Constant, 1_000, 64);
        let gaps: Vec<u64> = d.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(
            gaps.iter().all(|g| (99_000..=101_000).contains(g)),
            "{gaps:?}"
        );
    }

    #[test]
    fn burst_rate_is_within_two_percent_and_comes_in_bursts() {
        let d = departures(1e5, Pattern::Burst(16), 250, 64);
        assert!(within(d.len(), 1e5, 0.02), "{}", d.len());
        // Each burst leaves at one instant, 16 / 100k s = 160 us apart.
        for chunk in d.chunks(16).filter(|c| c.len() == 16) {
            assert!(chunk.iter().all(|t| *t == chunk[0]));
        }
        let starts: Vec<u64> = d.chunks(16).map(|c| c[0]).collect();
        assert!(starts
            .windows(2)
            .all(|w| (159_000..=161_000).contains(&(w[1] - w[0]))));
    }

    #[test]
    fn poisson_rate_is_within_two_percent_with_exponential_gaps() {
        let d = departures(1e5, Pattern::Poisson, 50, 64);
        assert!(within(d.len(), 1e5, 0.02), "{}", d.len());
        let gaps: Vec<f64> = d.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        // An exponential distribution's standard deviation equals its mean.
        let cv = var.sqrt() / mean;
        assert!((0.95..1.05).contains(&cv), "coefficient of variation {cv}");
    }

    #[test]
    fn a_late_sender_catches_up_but_never_beyond_what_it_asks() {
        let clock = VirtualClock::at(0);
        let mut pacer = Pacer::new(&clock, Some(1e6), Pattern::Constant, 1);
        clock.advance(100_000); // 100 us late: 101 messages are due.
        assert_eq!(pacer.grant(64), 64);
        assert_eq!(pacer.grant(64), 37);
        assert_eq!(pacer.grant(64), 0);
        assert_eq!(pacer.next_due_ns(), Some(101_000));
    }

    #[test]
    fn an_unlimited_pacer_grants_everything_asked() {
        let clock = VirtualClock::at(0);
        let mut pacer = Pacer::new(&clock, None, Pattern::Constant, 1);
        assert_eq!(pacer.grant(32), 32);
        assert_eq!(pacer.next_due_ns(), None);
    }
}
