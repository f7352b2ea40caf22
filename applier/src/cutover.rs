//! Cutover (docs/ARCHITECTURE.md, "Cutover"): promote the target to a clean cut of the
//! source.
//!
//! ```text
//!  daemon: refuse shippers ─► stop apply workers ─► freeze safe time S
//!                                                      │ cut = S
//!  phase 1  Store::begin_cutover: cap reads at cut (memory), then persist
//!           {cut, cut_time} + role = primary in one synced batch      ── O(1)
//!  phase 2  report: lost commits by gtid sequence (binary search),
//!           lost window (newest commit received), per-tablet lag; persisted ── O(log n)
//!  phase 3  background: remove mvcc versions above the cut (cursor persisted per step),
//!           clear `pending`; mark clean                                ── O(data), after
//! ```
//!
//! A crash anywhere resumes on restart: phase 1 missing → nothing happened (still a
//! replica); phase 2 missing → the report is computed from the store, which no longer
//! changes (intake and apply stay off on a primary); phase 3 unfinished → the clean-up
//! continues from its cursor. `trx_status` answers `ABORTED` (discarded by cutover) for
//! commits above the cut and undecided transactions from the cut alone, so nothing needs
//! rewriting in the trx index.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use tidelog_wal::HybridTime;

use crate::error::{Error, Result};
use crate::store::{Cutover, CutoverReport, Store};

/// Wall-clock microseconds since the epoch.
pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Computes the report of cutover `c` from the store: lost commits by gtid sequence, the
/// window from the cut to the newest commit received, per-tablet safe time and lag.
pub fn compute_report(store: &Store, c: &Cutover) -> Result<CutoverReport> {
    let bl = store.binlog()?;
    let lost_commits = bl.commits_above(c.cut)?;
    let lost_window_ms = bl.last_commit_ht()?.filter(|h| *h > c.cut).map_or(0, |h| {
        (h.physical_micros() - c.cut.physical_micros()) / 1000
    });
    let tablets = store
        .tablets()?
        .into_iter()
        .map(|(t, m)| {
            let lag = c.cut_time_us.saturating_sub(m.safe_time.physical_micros()) / 1000;
            (t, (m.safe_time, lag))
        })
        .collect();
    Ok(CutoverReport {
        lost_commits,
        lost_window_ms,
        tablets,
    })
}

/// Promotes at `cut` (phases 1 and 2), or finishes a cutover that began earlier (with its
/// own cut), and returns it with its report. Idempotent.
pub fn promote(store: &Store, cut: HybridTime) -> Result<Cutover> {
    let c = store.begin_cutover(cut, now_us())?;
    fail::fail_point!("cutover::after_cut", |_| {
        tracing::error!("failpoint cutover::after_cut: aborting the process");
        std::process::abort()
    });
    finish(store, c)
}

/// Phase 2 of a cutover that has begun: computes and persists the report if missing.
pub fn finish(store: &Store, c: Cutover) -> Result<Cutover> {
    if c.report.is_some() {
        return Ok(c);
    }
    let r = compute_report(store, &c)?;
    store.save_cutover_report(&r)
}

/// Keys looked at per clean-up step (one synced batch each).
const CLEANUP_STEP: usize = 50_000;

/// Progress of the background clean-up (phase 3).
#[derive(Debug, Default)]
pub struct CleanupProgress {
    /// Keys looked at by this run.
    pub scanned: AtomicU64,
    /// Versions removed, over all runs (the persisted total at start, then this run's).
    pub removed: AtomicU64,
    pub done: AtomicBool,
    /// Microseconds the clean-up has run so far (this process).
    pub elapsed_us: AtomicU64,
}

/// The background clean-up thread; stops (between steps) when dropped.
#[derive(Debug)]
pub struct Cleanup {
    pub progress: Arc<CleanupProgress>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Cleanup {
    /// Starts removing versions above the cut, from the persisted cursor; `removed` counts
    /// on from the total earlier runs persisted.
    pub fn start(store: Arc<Store>) -> Result<Cleanup> {
        let progress = Arc::new(CleanupProgress::default());
        progress
            .removed
            .store(store.cutover_removed()?, Ordering::Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (progress.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name("cutover-cleanup".into())
            .spawn(move || {
                let t0 = Instant::now();
                // While the store takes no writes (a full disk): retried with backoff.
                let mut held: Option<crate::disk::Backoff> = None;
                while !s.load(Ordering::SeqCst) {
                    match store.cutover_cleanup_step(CLEANUP_STEP) {
                        Err(e) if e.is_retryable() => {
                            if held.is_none() {
                                tracing::warn!("cutover clean-up holds: {e}; it goes on once the store takes writes again");
                            }
                            let until = Instant::now()
                                + held.get_or_insert_with(Default::default).failed();
                            while Instant::now() < until && !s.load(Ordering::SeqCst) {
                                std::thread::sleep(std::time::Duration::from_millis(50));
                            }
                        }
                        Ok((scanned, removed, done)) => {
                            if held.take().is_some() {
                                tracing::info!("cutover clean-up goes on");
                            }
                            p.scanned.fetch_add(scanned as u64, Ordering::Relaxed);
                            p.removed.fetch_add(removed as u64, Ordering::Relaxed);
                            p.elapsed_us
                                .store(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
                            if done {
                                p.done.store(true, Ordering::SeqCst);
                                tracing::info!(
                                    removed = p.removed.load(Ordering::Relaxed),
                                    "cutover clean-up finished"
                                );
                                return;
                            }
                        }
                        Err(e) => {
                            tracing::error!("cutover clean-up: {e}");
                            return;
                        }
                    }
                }
            })
            .map_err(|source| Error::Io {
                op: "spawn the cutover clean-up thread",
                path: Default::default(),
                source,
            })?;
        Ok(Cleanup {
            progress,
            stop,
            handle: Some(handle),
        })
    }

    /// Waits for the clean-up to finish (or fail).
    pub fn join(mut self) {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
