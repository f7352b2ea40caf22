//! Capped exponential backoff with jitter, for the shipper's reconnects and stream reopens.

use std::time::{Duration, Instant};

/// How long to wait after each failed attempt: from `min`, doubling up to `max`, each wait
/// drawn in [wait/2, wait] (the caller's random `jitter`); an attempt that lasted longer
/// than `reset_after` before it failed starts again from `min` (it was a working
/// connection that broke, not a peer still unreachable).
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    reset_after: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration, reset_after: Duration) -> Backoff {
        Backoff {
            min,
            max,
            reset_after,
            next: min,
        }
    }

    /// An attempt that began at `started` failed at `now`: the wait before the next one.
    /// `jitter` is a random draw in [0.5, 1] (values outside are clamped into it).
    pub fn failed(&mut self, started: Instant, now: Instant, jitter: f64) -> Duration {
        if now.saturating_duration_since(started) > self.reset_after {
            self.next = self.min;
        }
        let wait = self.next.mul_f64(jitter.clamp(0.5, 1.0));
        self.next = (self.next * 2).min(self.max);
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_and_a_long_attempt_starts_over() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(100), ms(1000), ms(2000));
        let t0 = Instant::now();
        let waits: Vec<_> = (0..6).map(|_| b.failed(t0, t0, 1.0)).collect();
        assert_eq!(
            waits,
            [ms(100), ms(200), ms(400), ms(800), ms(1000), ms(1000)]
        );
        // Jitter: half the wait at the least.
        assert_eq!(b.failed(t0, t0, 0.5), ms(500));
        assert_eq!(b.failed(t0, t0, 0.0), ms(500));
        // An attempt that lasted past `reset_after`: from the minimum again.
        assert_eq!(b.failed(t0, t0 + ms(2001), 1.0), ms(100));
        assert_eq!(b.failed(t0, t0 + ms(2000), 1.0), ms(200));
    }
}
