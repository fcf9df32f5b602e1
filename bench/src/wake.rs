//! The floor of a paced sender's CPU: a thread that does nothing but
//! wake at a rate.
//!
//! `gen --rate 2kpps` wakes once a message; on a virtual machine each
//! wake-up of an idle vCPU costs tens of microseconds of the woken task's
//! time whatever the task then does. `wake` measures that cost alone:
//! `clock_nanosleep` to absolute departure times, the same rate and
//! seconds, no runtime, no message. The suite runs it as the paced row's
//! peer, as its own process measured the same way, so the row says how
//! much of a paced sender's CPU is the machine's waking and how much is
//! the sender's work.

use std::time::Duration;

use crate::hist::LatencyHistogram;
use crate::BenchError;

/// What one run of wake-ups measured.
#[derive(Debug)]
pub struct WakeRun {
    /// Wake-ups made.
    pub wakeups: u64,
    /// How late each wake-up was after its due time (ns).
    pub late: LatencyHistogram,
    /// Seconds from the first due time to the last wake-up.
    pub seconds: f64,
    /// CPU time of the waking thread over the run.
    pub cpu: Duration,
}

impl WakeRun {
    /// The waking thread's CPU, percent of a core.
    pub fn cpu_percent(&self) -> f64 {
        if self.seconds > 0.0 {
            100.0 * self.cpu.as_secs_f64() / self.seconds
        } else {
            0.0
        }
    }
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec.
    unsafe { libc::clock_gettime(clock, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The most wake-ups per second: above it a thread sleeping between them
/// is no longer what a paced sender does (it would spin).
pub const MAX_PPS: f64 = 200_000.0;

/// Wakes on this thread at `pps` for `seconds`, each time at an absolute
/// due time (so lateness does not accumulate), doing nothing else.
pub fn run_wake(pps: f64, seconds: f64) -> Result<WakeRun, BenchError> {
    if !(pps.is_finite() && pps > 0.0 && pps <= MAX_PPS) {
        return Err(BenchError::Config(format!(
            "wake: the rate must be a message rate above 0 and at most {MAX_PPS} per second, not {pps}"
        )));
    }
    if !(seconds.is_finite() && seconds > 0.0 && seconds <= 3600.0) {
        return Err(BenchError::Config(format!(
            "wake: seconds must be above 0 and at most 3600, not {seconds}"
        )));
    }
    // As the pacer's sleeper does: no timer slack, so a wake-up is not
    // moved up to 50 us later to be merged with others.
    // SAFETY: PR_SET_TIMERSLACK takes an integer and changes only this
    // thread's slack; failure leaves the default.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong);
    }
    let step = 1e9 / pps;
    let count = (seconds * pps).round().max(1.0) as u64;
    let mut late = LatencyHistogram::new();
    let cpu0 = clock_ns(libc::CLOCK_THREAD_CPUTIME_ID);
    let start = clock_ns(libc::CLOCK_MONOTONIC);
    let mut last = start;
    for i in 1..=count {
        let due = start + (i as f64 * step) as u64;
        let t = libc::timespec {
            tv_sec: (due / 1_000_000_000) as libc::time_t,
            tv_nsec: (due % 1_000_000_000) as libc::c_long,
        };
        // EINTR: sleep again to the same absolute time.
        loop {
            // SAFETY: `t` is a live timespec; no remainder is asked for
            // (absolute sleeps have none).
            let rc = unsafe {
                libc::clock_nanosleep(
                    libc::CLOCK_MONOTONIC,
                    libc::TIMER_ABSTIME,
                    &t,
                    std::ptr::null_mut(),
                )
            };
            match rc {
                0 => break,
                libc::EINTR => continue,
                e => {
                    return Err(BenchError::Timer(std::io::Error::from_raw_os_error(e)));
                }
            }
        }
        last = clock_ns(libc::CLOCK_MONOTONIC);
        late.record(last.saturating_sub(due));
    }
    let cpu = Duration::from_nanos(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID).saturating_sub(cpu0));
    Ok(WakeRun {
        wakeups: count,
        late,
        seconds: last.saturating_sub(start) as f64 / 1e9,
        cpu,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn it_wakes_as_often_as_asked_and_never_before_its_due_time() {
        let r = run_wake(2_000.0, 0.05).unwrap();
        assert_eq!(r.wakeups, 100);
        assert_eq!(r.late.len(), 100);
        // Absolute due times: the run lasts its seconds, however late each
        // wake-up was (at least the last due time).
        assert!(r.seconds >= 0.05, "{}", r.seconds);
        assert!(r.cpu > Duration::ZERO);
    }

    #[test]
    fn rates_and_seconds_out_of_range_are_refused() {
        assert!(run_wake(0.0, 1.0).is_err());
        assert!(run_wake(f64::NAN, 1.0).is_err());
        assert!(run_wake(MAX_PPS * 2.0, 1.0).is_err());
        assert!(run_wake(1000.0, 0.0).is_err());
        assert!(run_wake(1000.0, 1e9).is_err());
    }
}
