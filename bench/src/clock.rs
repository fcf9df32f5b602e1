//! Clocks: the monotonic clock sender and receiver share, and a virtual
//! clock that tests move by hand.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A source of nanoseconds that never goes backwards.
pub trait Clock: Send + Sync {
    /// Nanoseconds since the clock's own epoch.
    fn now_ns(&self) -> u64;
}

impl<C: Clock + ?Sized> Clock for Arc<C> {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

impl<C: Clock + ?Sized> Clock for &C {
    #[inline]
    fn now_ns(&self) -> u64 {
        (**self).now_ns()
    }
}

/// The operating system's monotonic clock, counted from one epoch; copies
/// share the epoch, so a time read on one thread compares with a time read
/// on another.
#[derive(Clone, Copy, Debug)]
pub struct MonotonicClock {
    epoch: Instant,
}

impl MonotonicClock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        MonotonicClock {
            epoch: Instant::now(),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }
}

/// A clock that only moves when told: for deterministic tests of anything
/// that paces or times out.
#[derive(Debug, Default)]
pub struct VirtualClock {
    now: AtomicU64,
}

impl VirtualClock {
    /// A clock standing at `ns`.
    pub fn at(ns: u64) -> Self {
        VirtualClock {
            now: AtomicU64::new(ns),
        }
    }

    /// Moves the clock forward by `ns`.
    pub fn advance(&self, ns: u64) {
        self.now.fetch_add(ns, Ordering::Relaxed);
    }

    /// Sets the clock to `ns` (never backwards: a smaller value is ignored).
    pub fn set(&self, ns: u64) {
        self.now.fetch_max(ns, Ordering::Relaxed);
    }
}

impl Clock for VirtualClock {
    fn now_ns(&self) -> u64 {
        self.now.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_virtual_clock_moves_only_forward_and_only_when_told() {
        let c = VirtualClock::at(10);
        assert_eq!(c.now_ns(), 10);
        c.advance(5);
        c.set(3);
        assert_eq!(c.now_ns(), 15);
        c.set(100);
        assert_eq!(c.now_ns(), 100);
    }

    #[test]
    fn copies_of_the_monotonic_clock_share_an_epoch() {
        let a = MonotonicClock::new();
        let b = a;
        let t1 = a.now_ns();
        let t2 = b.now_ns();
        assert!(t2 >= t1);
    }
}
