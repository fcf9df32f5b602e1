//! Latency histograms (HDR, 3 significant digits, 1 ns to 60 s) and
//! mean ± standard deviation summaries of per-second samples.

use hdrhistogram::Histogram;
use serde::Serialize;

/// The largest latency recorded exactly; larger values count as this.
pub const MAX_TRACKED_NS: u64 = 60_000_000_000;

/// A latency histogram whose recording never allocates and never fails.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    inner: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram of 1 ns to 60 s at 3 significant digits.
    pub fn new() -> Self {
        let inner = match Histogram::new_with_bounds(1, MAX_TRACKED_NS, 3) {
            Ok(h) => h,
            Err(e) => unreachable!("constant histogram bounds are valid: {e}"),
        };
        LatencyHistogram { inner }
    }

    /// Records one latency in ns (values past 60 s count as 60 s).
    #[inline]
    pub fn record(&mut self, ns: u64) {
        self.inner.saturating_record(ns.min(MAX_TRACKED_NS));
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        // Both histograms have the same bounds, so adding cannot fail.
        let _ = self.inner.add(&other.inner);
    }

    /// Values recorded.
    pub fn len(&self) -> u64 {
        self.inner.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.inner.is_empty()
    }

    /// The value at `quantile` (0.0 to 1.0), 0 when empty.
    pub fn quantile(&self, quantile: f64) -> u64 {
        if self.is_empty() {
            0
        } else {
            self.inner.value_at_quantile(quantile)
        }
    }

    /// The usual percentiles, all in ns; zeros when empty.
    pub fn percentiles(&self) -> Percentiles {
        let empty = self.is_empty();
        Percentiles {
            count: self.len(),
            min: if empty { 0 } else { self.inner.min() },
            mean: if empty { 0.0 } else { self.inner.mean() },
            p50: self.quantile(0.50),
            p90: self.quantile(0.90),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            p9999: self.quantile(0.9999),
            max: if empty { 0 } else { self.inner.max() },
        }
    }

    /// Points of the cumulative distribution: (latency in ns, fraction of
    /// values at or below it), one per distinct recorded bucket.
    pub fn cdf(&self) -> Vec<(u64, f64)> {
        let total = self.len();
        if total == 0 {
            return Vec::new();
        }
        let mut seen = 0u64;
        self.inner
            .iter_recorded()
            .map(|v| {
                seen += v.count_at_value();
                (
                    self.inner.highest_equivalent(v.value_iterated_to()),
                    seen as f64 / total as f64,
                )
            })
            .collect()
    }
}

/// Latency percentiles in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Values recorded.
    pub count: u64,
    /// Smallest value.
    pub min: u64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: u64,
    /// 90th percentile.
    pub p90: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// 99.99th percentile.
    pub p9999: u64,
    /// Largest value.
    pub max: u64,
}

/// Mean and sample standard deviation of a series (per-second figures).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Summary {
    /// Arithmetic mean; 0 for an empty series.
    pub mean: f64,
    /// Sample standard deviation (n − 1); 0 for fewer than two values.
    pub stddev: f64,
    /// Number of values.
    pub n: usize,
}

impl Summary {
    /// The summary of `values`.
    pub fn of(values: impl IntoIterator<Item = f64>) -> Summary {
        let values: Vec<f64> = values.into_iter().collect();
        let n = values.len();
        if n == 0 {
            return Summary::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let stddev = if n < 2 {
            0.0
        } else {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        };
        Summary { mean, stddev, n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use uniplane_dataplane::SplitMix64;

    /// Relative error of `got` against `want`.
    fn rel(got: u64, want: f64) -> f64 {
        (got as f64 - want).abs() / want
    }

    #[test]
    fn percentiles_of_a_uniform_distribution_are_where_they_belong() {
        let mut h = LatencyHistogram::new();
        let n = 100_000u64;
        for v in 1..=n {
            h.record(v);
        }
        let p = h.percentiles();
        assert_eq!(p.count, n);
        assert_eq!(p.min, 1);
        // Three significant digits: every figure within 0.1 %.
        assert!(rel(p.p50, 50_000.0) < 1e-3, "{p:?}");
        assert!(rel(p.p90, 90_000.0) < 1e-3, "{p:?}");
        assert!(rel(p.p99, 99_000.0) < 1e-3, "{p:?}");
        assert!(rel(p.p999, 99_900.0) < 1e-3, "{p:?}");
        assert!(rel(p.max, 100_000.0) < 1e-3, "{p:?}");
        assert!((p.mean - 50_000.5).abs() / 50_000.5 < 1e-3);
    }

    #[test]
    fn percentiles_of_an_exponential_sample_match_its_quantile_function() {
        // Exponential of mean 10 us: the q-quantile is -ln(1 - q) * mean.
        let mean = 10_000.0;
        let mut rng = SplitMix64::new(7);
        let mut h = LatencyHistogram::new();
        for _ in 0..1_000_000 {
            let u = 1.0 - rng.next_f64();
            h.record((-u.ln() * mean) as u64);
        }
        for (q, got) in [
            (0.5, h.quantile(0.5)),
            (0.9, h.quantile(0.9)),
            (0.99, h.quantile(0.99)),
        ] {
            let want = -(1.0f64 - q).ln() * mean;
            assert!(rel(got, want) < 0.02, "q{q}: {got} vs {want}");
        }
        assert!((h.percentiles().mean - mean).abs() / mean < 0.01);
    }

    #[test]
    fn an_empty_histogram_reports_zeros() {
        let p = LatencyHistogram::new().percentiles();
        assert_eq!(p, Percentiles::default());
        assert!(LatencyHistogram::new().cdf().is_empty());
    }

    #[test]
    fn huge_values_saturate_instead_of_failing() {
        let mut h = LatencyHistogram::new();
        h.record(u64::MAX);
        h.record(0);
        assert_eq!(h.len(), 2);
        assert!(h.percentiles().max >= MAX_TRACKED_NS);
    }

    #[test]
    fn the_cdf_rises_to_one() {
        let mut h = LatencyHistogram::new();
        for v in [10, 20, 20, 30] {
            h.record(v);
        }
        let cdf = h.cdf();
        assert_eq!(cdf.len(), 3);
        assert_eq!(cdf[0], (10, 0.25));
        assert_eq!(cdf[1].1, 0.75);
        assert_eq!(cdf[2].1, 1.0);
    }

    #[test]
    fn merging_adds_the_counts() {
        let mut a = LatencyHistogram::new();
        let mut b = LatencyHistogram::new();
        a.record(5);
        b.record(7);
        a.merge(&b);
        assert_eq!(a.len(), 2);
        assert_eq!(a.percentiles().max, 7);
    }

    #[test]
    fn summary_is_mean_and_sample_stddev() {
        let s = Summary::of([2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert_eq!(s.n, 8);
        assert_eq!(s.mean, 5.0);
        assert!((s.stddev - 2.138).abs() < 1e-3);
        assert_eq!(Summary::of([3.0]).stddev, 0.0);
        assert_eq!(Summary::of([]), Summary::default());
    }
}
