//! The safe time as a caller sees it (docs/ARCHITECTURE.md, "Safe time"): the global
//! value, its lag behind the wall clock, the laggiest tablet and why it holds it, and a
//! wait until it reaches a target that holds no thread.

use std::collections::BTreeMap;
use std::time::Instant;

use tidelog_wal::{HybridTime, TabletId};

use super::applier::Applier;
use super::error::Result;

/// A tablet's safe time and its lag behind the wall clock (`None` before its first record).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TabletSafeTime {
    pub safe_time: HybridTime,
    pub lag_ms: Option<u64>,
}

/// The answer of [`Applier::safe_time`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SafeTimeStatus {
    /// The published global safe time (`None`: not initialized).
    pub safe_time: Option<HybridTime>,
    pub lag_ms: Option<u64>,
    pub laggiest_tablet: Option<TabletId>,
    /// Why the safe time does not move: not initialized, or held by a stopped tablet.
    pub reason: Option<String>,
    /// Newest minus oldest tablet safe time among the tablets that reported.
    pub skew_ms: u64,
    /// Committed transactions not yet applied everywhere.
    pub pending_txns: usize,
    pub tablets: BTreeMap<TabletId, TabletSafeTime>,
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Applier {
    /// Waits until the published safe time is ≥ `target` or `deadline` passes, in a place
    /// of the wait limit (refused with `TooManyWaiters` when none is left); answers at once
    /// when it is there already.
    pub async fn wait_safe_time(&self, target: HybridTime, deadline: Instant) -> Result<()> {
        let c = self.consistency();
        if c.safe_time().is_none_or(|st| st < target) && deadline > Instant::now() {
            let _place = self.inner.waiters.enter()?;
            c.wait_until(target, deadline).await;
        }
        Ok(())
    }

    /// The safe time now, per tablet and overall. Takes the consistency core's lock once.
    pub fn safe_time(&self) -> SafeTimeStatus {
        let r = self.consistency().report();
        let now = now_micros();
        let lag_ms = |h: HybridTime| now.saturating_sub(h.physical_micros()) / 1000;
        let tablets = r
            .tablets
            .iter()
            .map(|(t, h)| {
                let lag = (*h != HybridTime::MIN).then(|| lag_ms(*h));
                (
                    t.clone(),
                    TabletSafeTime {
                        safe_time: *h,
                        lag_ms: lag,
                    },
                )
            })
            .collect();
        let reason = match (&r.safe_time, &r.laggiest) {
            (None, _) => Some(self.uninitialized_reason(&r)),
            (Some(_), Some(t)) => self
                .tablet_stopped(t)
                .map(|why| format!("tablet {t} holds it: {why}")),
            (Some(_), None) => None,
        };
        SafeTimeStatus {
            safe_time: r.safe_time,
            lag_ms: r.safe_time.map(lag_ms),
            laggiest_tablet: r.laggiest.clone(),
            reason,
            skew_ms: skew_micros(&r.tablets) / 1000,
            pending_txns: r.pending_txns,
            tablets,
        }
    }
}

/// Newest minus oldest tablet safe time (physical microseconds) among the tablets that
/// reported; 0 with fewer than one.
pub(crate) fn skew_micros(tablets: &BTreeMap<TabletId, HybridTime>) -> u64 {
    let reported = tablets.values().filter(|h| **h != HybridTime::MIN);
    match (reported.clone().min(), reported.max()) {
        (Some(lo), Some(hi)) => hi.physical_micros().saturating_sub(lo.physical_micros()),
        _ => 0,
    }
}
