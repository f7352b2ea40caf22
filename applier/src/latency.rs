//! A fixed-bucket latency histogram made of atomics, cheap enough for every apply batch,
//! exported by the daemon as a Prometheus histogram (`_bucket{le=…}`, `_sum`, `_count`).
//!
//! Each recorder owns its histogram (one per apply worker: no cache line shared between
//! workers); a reader takes [`LatencyHistogram::snapshot`]s and adds them up with
//! [`HistogramSnapshot::merge`]. Counts are per bucket (not cumulative) in memory and
//! cumulative in a snapshot, as Prometheus wants them. A snapshot taken while a batch is
//! recorded may count it in `count` but not yet in its bucket or `sum` (relaxed loads): a
//! scrape is off by at most the batches in flight, never inconsistent over time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use tidelog_wal::HybridTime;

/// Upper bounds of the buckets, in seconds (`+Inf` is implied).
pub const BUCKETS_SECONDS: [f64; 14] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Bucket bounds in microseconds, for recording without floating point.
const BUCKETS_MICROS: [u64; 14] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];

/// Latencies recorded by one thread (any thread may read).
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Per bucket; the last one is `+Inf`.
    buckets: [AtomicU64; BUCKETS_MICROS.len() + 1],
    sum_micros: AtomicU64,
    count: AtomicU64,
}

/// A point-in-time copy with cumulative bucket counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Cumulative: `cumulative[i]` counts the observations ≤ `BUCKETS_SECONDS[i]`; the last
    /// entry is `+Inf` (every observation).
    pub cumulative: Vec<u64>,
    pub sum_micros: u64,
    pub count: u64,
}

impl LatencyHistogram {
    pub fn new() -> LatencyHistogram {
        LatencyHistogram::default()
    }

    /// Records how old data stamped `ht` is now: this host's clock minus the ht's physical
    /// part (0 when the source's clock is ahead). One of the lag stages
    /// (`tidelog_applier_stage_lag_seconds`).
    pub fn record_age(&self, ht: HybridTime) {
        let now = HybridTime::from_system_time(SystemTime::now()).physical_micros();
        self.record(Duration::from_micros(
            now.saturating_sub(ht.physical_micros()),
        ));
    }

    /// Records one observation.
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let i = BUCKETS_MICROS
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(BUCKETS_MICROS.len());
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum_micros.fetch_add(us, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut acc = 0u64;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                acc += b.load(Ordering::Relaxed);
                acc
            })
            .collect();
        HistogramSnapshot {
            cumulative,
            sum_micros: self.sum_micros.load(Ordering::Relaxed),
            count: acc,
        }
    }
}

impl HistogramSnapshot {
    /// An empty snapshot with the standard buckets.
    pub fn empty() -> HistogramSnapshot {
        HistogramSnapshot {
            cumulative: vec![0; BUCKETS_SECONDS.len() + 1],
            sum_micros: 0,
            count: 0,
        }
    }

    /// Adds another snapshot's counts to this one.
    pub fn merge(&mut self, other: &HistogramSnapshot) {
        if self.cumulative.len() < other.cumulative.len() {
            self.cumulative.resize(other.cumulative.len(), 0);
        }
        for (a, b) in self.cumulative.iter_mut().zip(&other.cumulative) {
            *a += b;
        }
        self.sum_micros += other.sum_micros;
        self.count += other.count;
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_merge_adds() {
        let h = LatencyHistogram::new();
        h.record(Duration::from_micros(100)); // ≤ 0.5 ms
        h.record(Duration::from_millis(3)); // ≤ 5 ms
        h.record(Duration::from_secs(60)); // +Inf only
        let s = h.snapshot();
        assert_eq!(s.count, 3);
        assert_eq!(s.cumulative.len(), BUCKETS_SECONDS.len() + 1);
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[2], 1); // ≤ 2.5 ms
        assert_eq!(s.cumulative[3], 2); // ≤ 5 ms
        assert_eq!(s.cumulative[13], 2); // ≤ 10 s
        assert_eq!(*s.cumulative.last().unwrap(), 3);
        assert_eq!(s.sum_micros, 100 + 3_000 + 60_000_000);
        let mut m = HistogramSnapshot::empty();
        m.merge(&s);
        m.merge(&s);
        assert_eq!(m.count, 6);
        assert_eq!(m.cumulative[3], 4);
        assert!(m.cumulative.windows(2).all(|w| w[0] <= w[1]));
    }
}
