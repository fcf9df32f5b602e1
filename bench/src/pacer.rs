//! Rate control: when each message may leave, and waiting for it.
//!
//! [`Pacer`] keeps the departure time of the next message and grants every
//! message whose time has come; it never sleeps and reads time only from
//! the [`Clock`] it is given, so tests drive it with a
//! [`VirtualClock`](crate::clock::VirtualClock). A sender that fell behind
//! catches up (the mean rate holds), in bursts no larger than it asks for,
//! and learns each message's *intended* departure, which it stamps (so a
//! sender held back counts the delay: no coordinated omission, as wrk2
//! and MoonGen measure).
//!
//! [`Sleeper`] waits for a departure without blocking the sender's
//! runtime and without spinning through the gap: a timerfd (microsecond
//! precision, where the runtime's timer has a millisecond) for all but the
//! last stretch, then a spin that yields to the runtime's other tasks
//! (a stack's own timers and acknowledgments run there) on each check.
//! The stretch is as long as the timer is late ([`SpinBudget`]: the 95th
//! percentile of its measured lateness, plus a margin, at most
//! [`SPIN_NS`]), not a fixed guess: where the timer is punctual a few
//! microseconds, so at 2,000 messages a second the spin costs a percent
//! or two of a core less.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use uniplane_dataplane::SplitMix64;

use crate::args::Pattern;
use crate::clock::Clock;
use crate::BenchError;

/// How long before a departure the sleeper stops sleeping and spins
/// until it has measured its timer: a timer's wake-up is late by a few to
/// some tens of microseconds.
pub const SPIN_NS: u64 = 20_000;

/// How long to spin before a departure: the 95th percentile of the
/// timer's lateness, tracked as it is observed (a stochastic quantile
/// estimate: up by 19 steps on a later wake-up, down by 1 on an earlier
/// one), plus a margin, within [`SpinBudget::MIN_NS`] and
/// [`SpinBudget::MAX_NS`].
#[derive(Clone, Copy, Debug)]
pub struct SpinBudget {
    /// The lateness estimate, in ns.
    late_ns: f64,
}

impl SpinBudget {
    /// The least spin: the clock reads and the yield around a departure.
    pub const MIN_NS: u64 = 2_000;
    /// The most: [`SPIN_NS`]. A timer later than that is left late rather
    /// than spun through: the gap costs a core's time, and the latency
    /// figures are taken against the intended departure anyway. (On the
    /// 2-vCPU development VM the timer is 25 us late at the median, 29 us
    /// at p95: spinning that long cost 6.3-8.3 % of a core at 2 kpps,
    /// 20 us 5.3 %, none 5.0-5.2 % — two wake-ups a message, sender's
    /// and receiver's, are the rest.)
    pub const MAX_NS: u64 = SPIN_NS;
    /// Added to the estimate.
    const MARGIN_NS: f64 = 1_000.0;
    /// One step of the estimate.
    const STEP_NS: f64 = 100.0;

    /// Starts at [`SPIN_NS`] until observations come.
    pub fn new() -> SpinBudget {
        SpinBudget {
            late_ns: SPIN_NS as f64 - Self::MARGIN_NS,
        }
    }

    /// The timer woke `late_ns` after it was set for.
    pub fn observe(&mut self, late_ns: u64) {
        let late = late_ns as f64;
        if late > self.late_ns {
            self.late_ns += 19.0 * Self::STEP_NS;
        } else {
            self.late_ns -= Self::STEP_NS;
        }
        self.late_ns = self.late_ns.clamp(0.0, Self::MAX_NS as f64);
    }

    /// How long to spin before a departure, in ns.
    pub fn spin_ns(&self) -> u64 {
        ((self.late_ns + Self::MARGIN_NS) as u64).clamp(Self::MIN_NS, Self::MAX_NS)
    }
}

impl Default for SpinBudget {
    fn default() -> Self {
        SpinBudget::new()
    }
}

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

    /// Like [`Pacer::grant_at`], writing each granted message's intended
    /// departure into `out` (at most `out.len()` granted); an unlimited
    /// pacer's are all `now_ns`.
    #[inline]
    pub fn departures_at(&mut self, now_ns: u64, max: usize, out: &mut [u64]) -> usize {
        let max = max.min(out.len());
        if self.gap_ns.is_none() {
            out[..max].fill(now_ns);
            return max;
        }
        let now = now_ns as f64;
        let mut n = 0;
        while n < max && self.next_ns <= now {
            out[n] = self.next_ns.max(0.0) as u64;
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

/// Waits for departures on a timerfd registered with the runtime: see
/// the module documentation. One per sender.
#[derive(Debug)]
pub struct Sleeper {
    timer: AsyncFd<OwnedFd>,
    budget: SpinBudget,
}

impl Sleeper {
    /// A sleeper on a fresh monotonic timerfd. Lowers the calling
    /// thread's timer slack to 1 ns (Linux's default lets a sleeper wake
    /// up to 50 us late), so call it on the sender's own thread.
    pub fn new() -> Result<Sleeper, BenchError> {
        // SAFETY: timerfd_create takes no pointers; the descriptor it
        // returns is owned by the OwnedFd below and by nothing else.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(BenchError::Timer(io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: PR_SET_TIMERSLACK takes an integer; it only changes this
        // thread's timer slack. Failure leaves the default: harmless.
        unsafe {
            libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
        }
        // SAFETY: the OwnedFd is moved into the AsyncFd, which never
        // swaps it out; it stays open and the same until the AsyncFd drops.
        let timer = unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
            .map_err(|e| BenchError::Timer(io::Error::from(e)))?;
        Ok(Sleeper {
            timer,
            budget: SpinBudget::new(),
        })
    }

    /// Sleeps `d` on the timerfd, letting the runtime run other tasks.
    async fn sleep(&mut self, d: Duration) -> Result<(), BenchError> {
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: d.as_secs() as libc::time_t,
                // Both zero would disarm the timer: at least 1 ns.
                tv_nsec: d.subsec_nanos().max(1) as libc::c_long,
            },
        };
        // SAFETY: the descriptor is a live timerfd; `spec` outlives the
        // call and the old value is not asked for (null).
        let armed = unsafe {
            libc::timerfd_settime(self.timer.as_raw_fd(), 0, &spec, std::ptr::null_mut())
        };
        if armed < 0 {
            return Err(BenchError::Timer(io::Error::last_os_error()));
        }
        loop {
            let mut guard = self.timer.readable().await.map_err(BenchError::Timer)?;
            let mut expirations = [0u8; 8];
            // SAFETY: reads at most 8 bytes into an 8-byte buffer.
            let n = unsafe {
                libc::read(
                    guard.get_inner().as_raw_fd(),
                    expirations.as_mut_ptr().cast(),
                    expirations.len(),
                )
            };
            if n == 8 {
                // The timer is one-shot and now read: forget its readiness,
                // or the next sleep would first read it in vain (a syscall
                // a departure).
                guard.clear_ready();
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::WouldBlock {
                return Err(BenchError::Timer(e));
            }
            guard.clear_ready();
        }
    }

    /// Waits until `clock` reads `due_ns`: asleep on the timer until the
    /// spin budget before it, then checking the clock, yielding to the
    /// runtime's other tasks between checks. Each sleep's lateness
    /// teaches the budget.
    pub async fn wait_until<C: Clock>(&mut self, clock: &C, due_ns: u64) -> Result<(), BenchError> {
        loop {
            let now = clock.now_ns();
            if now >= due_ns {
                return Ok(());
            }
            let left = due_ns - now;
            let spin = self.budget.spin_ns();
            if left > spin {
                let nap = left - spin;
                self.sleep(Duration::from_nanos(nap)).await?;
                let woke = clock.now_ns();
                self.budget.observe(woke.saturating_sub(now + nap));
            } else {
                tokio::task::yield_now().await;
            }
        }
    }

    /// The spin before a departure, as learned so far (ns).
    pub fn spin_ns(&self) -> u64 {
        self.budget.spin_ns()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{MonotonicClock, VirtualClock};

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

    #[test]
    fn the_spin_budget_settles_at_the_timers_95th_percentile_of_lateness() {
        let mut b = SpinBudget::new();
        assert_eq!(b.spin_ns(), SPIN_NS);
        // Lateness uniform over 0..10 us: p95 = 9.5 us (the mean is 5),
        // plus the 1 us margin; the estimate moves by 1.9 us at most a step.
        let mut rng = SplitMix64::new(7);
        for _ in 0..200_000 {
            b.observe(rng.next_u64() % 10_000);
        }
        let spin = b.spin_ns();
        assert!((8_500..=12_500).contains(&spin), "{spin}");
        // A machine whose timer grows later: the budget follows it up, to
        // its ceiling.
        for _ in 0..20_000 {
            b.observe(14_000 + rng.next_u64() % 2_000);
        }
        let spin = b.spin_ns();
        assert!((14_500..=18_500).contains(&spin), "{spin}");
        // Never below the floor nor above the ceiling.
        for _ in 0..100_000 {
            b.observe(0);
        }
        assert_eq!(b.spin_ns(), SpinBudget::MIN_NS);
        for _ in 0..100_000 {
            b.observe(10_000_000);
        }
        assert_eq!(b.spin_ns(), SpinBudget::MAX_NS);
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
    fn departures_are_the_intended_times_not_the_time_asked() {
        let clock = VirtualClock::at(0);
        let mut pacer = Pacer::new(&clock, Some(1e6), Pattern::Constant, 1);
        let mut out = [0u64; 8];
        // 3.5 us late: the departures due at 0, 1, 2 and 3 us.
        assert_eq!(pacer.departures_at(3_500, 8, &mut out), 4);
        assert_eq!(out[..4], [0, 1_000, 2_000, 3_000]);
        assert_eq!(pacer.departures_at(3_500, 8, &mut out), 0);
        // Never more than the buffer holds.
        assert_eq!(pacer.departures_at(100_000, 64, &mut out), 8);
        let mut unlimited = Pacer::new(&clock, None, Pattern::Constant, 1);
        assert_eq!(unlimited.departures_at(77, 3, &mut out), 3);
        assert_eq!(out[..3], [77, 77, 77]);
    }

    /// The sleeper neither returns early nor holds the runtime: a task
    /// beside it runs while it waits.
    #[test]
    fn the_sleeper_wakes_at_the_due_time_and_lets_other_tasks_run() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let local = tokio::task::LocalSet::new();
            local
                .run_until(async {
                    let clock = MonotonicClock::new();
                    let ticks = std::rc::Rc::new(std::cell::Cell::new(0u32));
                    let beside = tokio::task::spawn_local({
                        let ticks = ticks.clone();
                        async move {
                            loop {
                                ticks.set(ticks.get() + 1);
                                tokio::task::yield_now().await;
                            }
                        }
                    });
                    let mut sleeper = Sleeper::new().unwrap();
                    for gap in [300_000u64, 50_000, 5_000, 2_000_000] {
                        let due = clock.now_ns() + gap;
                        let before = ticks.get();
                        sleeper.wait_until(&clock, due).await.unwrap();
                        assert!(clock.now_ns() >= due, "woke before {gap} ns were up");
                        assert!(ticks.get() > before, "the runtime was blocked for {gap} ns");
                    }
                    beside.abort();
                })
                .await
        });
    }

    #[test]
    fn an_unlimited_pacer_grants_everything_asked() {
        let clock = VirtualClock::at(0);
        let mut pacer = Pacer::new(&clock, None, Pattern::Constant, 1);
        assert_eq!(pacer.grant(32), 32);
        assert_eq!(pacer.next_due_ns(), None);
    }
}
