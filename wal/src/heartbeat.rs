//! Liveness ticks of worker threads, for a supervisor such as the daemons' systemd watchdog.
//!
//! A worker calls [`Heartbeat::beat`] once per iteration of its loop, including the
//! iterations that end in a bounded wait (a condvar or channel timeout), so an idle but
//! healthy worker still beats at least once per wait. A supervisor reads [`Heartbeat::age`]:
//! a worker whose heartbeat is older than the longest bounded step of its loop is stuck.
//!
//! A beat is one `Instant::now()` (vDSO) and one relaxed atomic store: no lock, no shared
//! cache line with anything else. Relaxed is enough because the value is the only thing
//! published; nobody reads other memory on the strength of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The process-wide origin of heartbeat times.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_nanos() -> u64 {
    u64::try_from(Instant::now().saturating_duration_since(epoch()).as_nanos()).unwrap_or(u64::MAX)
}

/// The time of a worker's last sign of life.
#[derive(Debug)]
pub struct Heartbeat(AtomicU64);

impl Default for Heartbeat {
    /// A heartbeat that beat just now.
    fn default() -> Self {
        Heartbeat(AtomicU64::new(now_nanos()))
    }
}

impl Heartbeat {
    /// A heartbeat that beat just now.
    pub fn new() -> Heartbeat {
        Heartbeat::default()
    }

    /// Records a sign of life now.
    #[inline]
    pub fn beat(&self) {
        self.0.store(now_nanos(), Ordering::Relaxed);
    }

    /// When [`beat`](Self::beat) was last called (or the heartbeat created).
    pub fn last(&self) -> Instant {
        epoch() + Duration::from_nanos(self.0.load(Ordering::Relaxed))
    }

    /// How long ago the last beat was.
    pub fn age(&self) -> Duration {
        Instant::now().saturating_duration_since(self.last())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beats_move_forward_and_age_grows() {
        let h = Heartbeat::new();
        let first = h.last();
        assert!(h.age() < Duration::from_secs(5));
        let t0 = Instant::now();
        while Instant::now() == t0 {}
        h.beat();
        assert!(h.last() > first);
        assert!(h.last() <= Instant::now());
    }
}
