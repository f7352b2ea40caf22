//! A connection's silence, seen in its count of received datagrams: each end gives up a
//! connection that has received nothing for `silence-limit` (`QuicTuning::silence_limit`).

/// Watches a connection's count of received datagrams for a silence longer than a limit.
#[derive(Debug)]
pub struct Silence {
    received: u64,
    at: std::time::Instant,
}

impl Silence {
    /// Starts the clock at the connection's current count of received datagrams.
    pub fn new(received: u64) -> Silence {
        Silence {
            received,
            at: std::time::Instant::now(),
        }
    }

    /// How often to look, for a silence to be noticed soon after `limit`.
    pub fn look_every(limit: std::time::Duration) -> std::time::Duration {
        (limit / 5).clamp(
            std::time::Duration::from_millis(10),
            std::time::Duration::from_secs(1),
        )
    }

    /// With the current count: how long nothing has arrived, once that exceeds `limit`.
    pub fn exceeded(
        &mut self,
        received: u64,
        limit: std::time::Duration,
    ) -> Option<std::time::Duration> {
        if received != self.received {
            self.received = received;
            self.at = std::time::Instant::now();
        }
        let quiet = self.at.elapsed();
        (quiet > limit).then_some(quiet)
    }
}
