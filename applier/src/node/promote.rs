//! The cutover sequence (docs/ARCHITECTURE.md, "Cutover"; the phases are in
//! [`crate::cutover`]): refuse shippers, stop applying, cut at the safe time, persist the
//! cut (reads are capped at it from then on) and the report, and clean up above the cut in
//! the background. Idempotent: a promoted target returns its report.

use super::applier::{blocking, refusal_reason, Applier};
use super::error::{Error, Result};
use crate::cutover::{self, Cleanup};
use crate::store::Cutover;

impl Applier {
    /// Promotes the target to primary at the safe time (see the module doc) and returns
    /// the cutover with its report; a second call returns the same. Refused
    /// (`NoCleanCut`) while the safe time is not initialized. Calls are serialized.
    pub async fn promote(&self) -> Result<Cutover> {
        let _one = self.inner.promote_lock.lock().await;
        let a = self.clone();
        let c = blocking(move || a.promote_blocking()).await??;
        let mut g = self.inner.cleanup.lock().unwrap_or_else(|p| p.into_inner());
        if g.is_none() && !c.cleaned {
            *g = Some(Cleanup::start(self.store().clone())?);
        }
        Ok(c)
    }

    fn promote_blocking(&self) -> Result<Cutover> {
        let (store, consistency, intake) = (self.store(), self.consistency(), self.intake());
        if let Some(c) = store.cutover()? {
            return Ok(cutover::finish(store, c)?);
        }
        if consistency.safe_time().is_none() {
            let r = consistency.report();
            return Err(Error::NoCleanCut {
                reason: self.uninitialized_reason(&r),
            });
        }
        intake.refuse(
            "this target is being promoted to primary (cutover); it accepts no shipped logs",
        );
        self.inner.workers.stop_all();
        // Waiters for the safe time (a `trx_status` with a hint) hold on until the cut is
        // set, then answer as the promoted target.
        consistency.begin_cutover();
        let promoted = consistency
            .safe_time()
            .ok_or(Error::SafeTimeVanished)
            .and_then(|cut| Ok(cutover::promote(store, cut)?));
        let c = promoted.inspect_err(|_| consistency.cutover_failed())?;
        consistency.freeze(c.cut);
        intake.refuse(&refusal_reason(c.cut));
        tracing::info!(cut = %c.cut, lost_commits = c.report.as_ref().map_or(0, |r| r.lost_commits), "promoted to primary");
        Ok(c)
    }
}
