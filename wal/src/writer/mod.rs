//! The tablet log `Writer`: appends records into a memory-mapped, preallocated segment,
//! commits them (visible to tailers) and makes them durable per the sync policy.
//!
//! ```text
//!   append ──► staged (in the mapping, not published)
//!   commit ──► written_pos  (control file; tailers may read up to here on request)
//!          ──► durable_pos  always: msync now
//!                           batch: msync by the flusher thread every `batch_interval`,
//!                                  or at once when `batch_bytes` are pending
//!                           none:  declared durable at once (no sync; a machine crash may
//!                                  lose it)
//! ```
//!
//! One writer per tablet (an exclusive `flock` on the control file); many tablets may be
//! written concurrently from different threads, each with its own `Writer`.
//!
//! ```text
//!  writer/
//!    mod.rs       Writer: open (recovery), positions, close
//!    commit.rs    append, rollback, commit, sync, wait_durable
//!    encoded.rs   append_encoded: another log's records, verbatim
//!    segments.rs  rotation, the spare segment, direct I/O staging, retention, page cache
//!    sync.rs      what the batch flusher shares with the writer; the flusher's loop
//!    options.rs   SyncPolicy, WalOptions
//! ```

mod commit;
mod encoded;
mod options;
mod segments;
mod sync;

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

pub use options::{SyncPolicy, WalOptions, DEFAULT_MAX_CLOCK_SKEW};

use crate::control::ControlFile;
use crate::direct::DirectStage;
use crate::error::{Error, Result};
use crate::fsutil;
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::recovery::{self, RecoveryReport};
use crate::segment::MappedSegment;
use crate::time::HybridTime;
use segments::SpareJob;
use sync::{Shared, SyncState};

/// Appends records to one tablet's log.
#[derive(Debug)]
pub struct Writer {
    tablet: TabletId,
    dir: PathBuf,
    opts: WalOptions,
    shared: Arc<Shared>,
    active: Arc<MappedSegment>,
    /// First positions of all retained segments, ascending; the last is `active`.
    segments: Vec<WalPos>,
    /// Offset in the active record area where the next record goes.
    off: usize,
    committed: WalPos,
    staged_ht: Option<HybridTime>,
    committed_ht: Option<HybridTime>,
    flusher: Option<JoinHandle<()>>,
    report: RecoveryReport,
    /// Whether new segments must be created durably (false while commits use `None`).
    durable_segments: bool,
    /// `None` commits since the last `settle_none`: they published `written_pos` and
    /// `durable_pos` through the control file only, without the lock; `SyncState`'s
    /// `written`/`synced` still lag behind `committed`.
    unsettled_none: bool,
    /// The spare being prepared for the next rotation (started once the active segment is
    /// a quarter full).
    spare: Option<SpareJob>,
    /// The thread still pre-faulting the active segment (a spare taken before its
    /// pre-fault finished).
    prefaulting: Option<JoinHandle<()>>,
    /// Stops the background segment threads (set on close).
    bg_stop: Arc<AtomicBool>,
    /// With [`WalOptions::direct_io`]: the active segment's staged tail, written with
    /// `O_DIRECT` (the mapping is then never written through).
    direct: Option<DirectStage>,
    /// Where [`Writer::drop_cached_below`] got to.
    dropped: WalPos,
    /// An ht at or below this is within [`WalOptions::max_clock_skew`] of the wall clock
    /// (computed from an earlier reading of the clock, so the bound only grows): appends
    /// read the clock only when an ht goes past it.
    ht_ceiling: HybridTime,
}

impl Writer {
    /// Opens (creating if needed) the log of `tablet` under `wal_dir/<tablet>/`, recovering it.
    pub fn open(wal_dir: &Path, tablet: &TabletId, opts: WalOptions) -> Result<Writer> {
        opts.validate()?;
        let dir = wal_dir.join(tablet.as_str());
        if !dir.exists() {
            std::fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
            fsutil::fsync_dir(wal_dir)?;
        }
        let Some((control, prev)) = ControlFile::open_locked(&dir)? else {
            return Err(Error::Locked {
                tablet: tablet.clone(),
                path: dir,
            });
        };
        let rec = recovery::recover(
            &dir,
            tablet,
            prev,
            opts.segment_size,
            opts.verify_on_open,
            true,
        )?;
        let report = rec.report;
        control.reset(report.oldest, report.end);
        tracing::info!(
            tablet = %tablet, end = %report.end, segments = report.segments,
            dropped = report.dropped_bytes, "WAL opened"
        );
        let active = Arc::new(rec.active);
        // No MADV_SEQUENTIAL: it made appends 3x slower (BENCHMARKS.md).
        let shared = Arc::new(Shared {
            state: Mutex::new(SyncState {
                segs: vec![active.clone()],
                synced: report.end,
                written: report.end,
                shutdown: false,
                failed: None,
            }),
            wake: Condvar::new(),
            control,
            failed_flag: AtomicBool::new(false),
        });
        let mut w = Writer {
            tablet: tablet.clone(),
            dir,
            opts,
            shared,
            active,
            segments: rec.segments,
            off: rec.active_off,
            committed: report.end,
            staged_ht: report.last_ht,
            committed_ht: report.last_ht,
            flusher: None,
            report,
            durable_segments: true,
            unsettled_none: false,
            spare: None,
            prefaulting: None,
            bg_stop: Arc::new(AtomicBool::new(false)),
            direct: None,
            dropped: WalPos::ZERO,
            ht_ceiling: HybridTime::MIN,
        };
        w.restage(w.off)?;
        // Segments the shipper acknowledged while no writer ran go now: on a full disk
        // they are the space the next rotation needs.
        match w.enforce_retention() {
            Ok(r) if !r.deleted.is_empty() || !r.forced.is_empty() => {
                tracing::info!(tablet = %w.tablet, deleted = r.deleted.len(), forced = r.forced.len(),
                    "retention at open removed acknowledged segments");
            }
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(tablet = %w.tablet, error = %e, "retention at open failed; segments kept")
            }
        }
        Ok(w)
    }

    pub fn tablet(&self) -> &TabletId {
        &self.tablet
    }

    /// The tablet's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What recovery found when this writer opened the log.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.report
    }

    /// End of the staged records (where the next append goes).
    pub fn staged_pos(&self) -> WalPos {
        self.active.first.add(self.off as u64)
    }

    /// End of the committed records.
    pub fn written_pos(&self) -> WalPos {
        self.committed
    }

    /// End of the records on stable storage (or declared so by `SyncPolicy::None`).
    pub fn durable_pos(&self) -> WalPos {
        self.shared.control.durable()
    }

    /// The ht of the last staged record.
    pub fn last_ht(&self) -> Option<HybridTime> {
        self.staged_ht
    }

    /// First position still retained.
    pub fn oldest_pos(&self) -> WalPos {
        self.segments.first().copied().unwrap_or(self.active.first)
    }

    /// Commits nothing new, syncs what is committed, and stops the flusher.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    pub(super) fn shutdown(&mut self) -> Result<()> {
        self.drop_spare();
        self.settle_none();
        let r = if self.shared.lock().failed.is_none() && self.committed > self.shared.lock().synced
        {
            self.shared.sync_to(self.committed)
        } else {
            Ok(())
        };
        self.shared.lock().shutdown = true;
        self.shared.wake.notify_all();
        if let Some(h) = self.flusher.take() {
            let _ = h.join();
        }
        r
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // Staged, uncommitted records are not published; committed ones are synced when a
        // batch flush is pending, so a clean close leaves nothing undurable.
        if let Err(e) = self.shutdown() {
            tracing::error!(tablet = %self.tablet, error = %e, "final WAL sync failed");
        }
    }
}
