//! `trx_status` through the front door: the look-up of [`crate::trx`], waiting (as an
//! async task, in a place of the wait limit) for a gtid hint that is not visible yet, and
//! the answers counted by state for the metrics.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::applier::Applier;
use super::error::Result;
use crate::trx::{trx_status_now, TrxQuery, TrxState, TrxStatus};

/// Longest `wait` a `trx_status` call may ask for.
pub const MAX_TRX_WAIT: Duration = Duration::from_secs(300);

impl Applier {
    /// The state of transaction `trx_id`, waiting up to `wait` (capped at
    /// [`MAX_TRX_WAIT`]) for the `gtid_hint` when it is not visible yet. Each look-up is a
    /// few point reads, run inline; between two, the call waits as a task for the safe
    /// time the look-up named, in a place of the wait limit (`TooManyWaiters` when none
    /// is left), holding no thread. Malformed ids are an `UNKNOWN` answer, never an error.
    pub async fn trx_status(
        &self,
        trx_id: &str,
        gtid_hint: Option<&str>,
        wait: Duration,
    ) -> Result<TrxStatus> {
        let answer = self
            .trx_answer(trx_id, gtid_hint, wait.min(MAX_TRX_WAIT))
            .await?;
        if let Some(i) = TrxState::ALL.iter().position(|st| *st == answer.state) {
            self.inner.trx_lookups[i].fetch_add(1, Ordering::Relaxed);
        }
        Ok(answer)
    }

    async fn trx_answer(
        &self,
        trx_id: &str,
        gtid_hint: Option<&str>,
        wait: Duration,
    ) -> Result<TrxStatus> {
        let deadline = Instant::now() + wait;
        let ask = |wait| {
            trx_status_now(
                self.store(),
                &**self.consistency(),
                &TrxQuery {
                    trx_id,
                    gtid_hint,
                    wait,
                    max_staleness: self.inner.opts.max_staleness,
                },
            )
        };
        let mut place = None;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let (answer, wanted) = ask(left)?;
            let Some(wanted) = wanted else {
                return Ok(answer);
            };
            if place.is_none() {
                place = Some(self.inner.waiters.enter()?);
            }
            if !self.consistency().wait_until(wanted, deadline).await {
                // The wait is over, or nothing will move the safe time now: answer as it is.
                return Ok(ask(Duration::ZERO)?.0);
            }
        }
    }

    /// `trx_status` answers given since start, by state (in [`TrxState::ALL`] order).
    pub fn trx_lookups(&self) -> [u64; 4] {
        std::array::from_fn(|i| self.inner.trx_lookups[i].load(Ordering::Relaxed))
    }
}
