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

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::control::ControlFile;
use crate::direct::DirectStage;
use crate::error::{Error, Result};
use crate::format::{
    DEFAULT_SEGMENT_SIZE, MIN_SEGMENT_SIZE, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::fsutil;
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::record::Record;
use crate::recovery::{self, RecoveryReport};
use crate::retention::{self, RetentionReport};
use crate::segment::{self, MappedSegment};
use crate::time::HybridTime;

/// When a commit becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// msync before `commit` returns.
    Always,
    /// Group commit: synced by a flusher within `batch_interval`, or once `batch_bytes` pend.
    #[default]
    Batch,
    /// Never synced by the writer; `durable_pos` follows `written_pos`.
    None,
}

impl fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncPolicy::Always => "always",
            SyncPolicy::Batch => "batch",
            SyncPolicy::None => "none",
        })
    }
}

impl FromStr for SyncPolicy {
    type Err = crate::ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(SyncPolicy::Always),
            "batch" => Ok(SyncPolicy::Batch),
            "none" => Ok(SyncPolicy::None),
            _ => Err(crate::ParseError::new(
                "sync policy",
                s,
                "expected always, batch or none",
            )),
        }
    }
}

/// Writer options.
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Size each segment file is preallocated to. Default 64 MiB.
    pub segment_size: u64,
    /// Group-commit interval for [`SyncPolicy::Batch`]. Default 5 ms.
    pub batch_interval: Duration,
    /// Pending bytes that make a batch commit sync at once. Default 4 MiB.
    pub batch_bytes: u64,
    /// Oldest segments go past this many retained bytes even when not acked; readers that
    /// want them get [`Error::Truncated`]. Default: no limit.
    pub max_retained_bytes: Option<u64>,
    /// Verify every sealed segment on open, not only the last one. Default false.
    pub verify_on_open: bool,
    /// Pre-fault each spare segment's mapping in the background, so that appends through
    /// the mapping ([`Writer::append`]) take no page faults. Default true. A log written
    /// only with [`Writer::append_encoded`] (through the file) gains nothing from it: the
    /// applier's received logs turn it off.
    pub prefault: bool,
    /// Write the active segment with `O_DIRECT` from an aligned staging buffer, around the
    /// page cache, and sync with `fdatasync` (module `direct`). For logs written in large
    /// verbatim runs: the copy into the page cache and its writeback are the cost it saves;
    /// readers then read from the device. Needs a segment size that is a multiple of
    /// 4 KiB (an active segment made earlier with another size is finished through the
    /// page cache); a file system that refuses `O_DIRECT` makes [`Writer::open`] fail.
    /// Default false.
    pub direct_io: bool,
    /// How far ahead of this host's wall clock a record's ht may be: [`Writer::append`]
    /// refuses one beyond `now + max_clock_skew` ([`Error::HtAhead`]), since a record from
    /// the future holds the target's safe time there and no later record can bring it back.
    /// The same bound as the applier's `max-clock-skew`. `None`: no bound (a log replayed
    /// from elsewhere). Records staged verbatim with [`Writer::append_encoded`] (another
    /// log's bytes: the receiving end applies its own bound) are not checked. Default
    /// 500 ms.
    pub max_clock_skew: Option<Duration>,
}

/// Default of [`WalOptions::max_clock_skew`].
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_millis(500);

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_size: DEFAULT_SEGMENT_SIZE,
            batch_interval: Duration::from_millis(5),
            batch_bytes: 4 << 20,
            max_retained_bytes: None,
            verify_on_open: false,
            prefault: true,
            direct_io: false,
            max_clock_skew: Some(DEFAULT_MAX_CLOCK_SKEW),
        }
    }
}

impl WalOptions {
    pub fn validate(&self) -> Result<()> {
        if self.segment_size < MIN_SEGMENT_SIZE {
            return Err(Error::Config(format!(
                "segment size {} is below the minimum {MIN_SEGMENT_SIZE}",
                self.segment_size
            )));
        }
        if self.segment_size > (1 << 40) {
            return Err(Error::Config(format!(
                "segment size {} is above 1 TiB",
                self.segment_size
            )));
        }
        if self.direct_io && self.segment_size % crate::direct::BLOCK as u64 != 0 {
            return Err(Error::Config(format!(
                "segment size {} is not a multiple of {} bytes, which direct I/O needs",
                self.segment_size,
                crate::direct::BLOCK
            )));
        }
        if self.batch_interval.is_zero() {
            return Err(Error::Config("batch interval must be positive".into()));
        }
        Ok(())
    }
}

impl SyncState {
    /// Drops sealed segments wholly below `synced`: they need no more syncing.
    fn prune(&mut self) {
        while self.segs.len() > 1 && self.segs[0].limit() <= self.synced {
            self.segs.remove(0);
        }
    }
}

/// Sync state shared with the batch flusher.
#[derive(Debug)]
struct SyncState {
    /// Segments that may hold unsynced bytes, oldest first; the last is the active one.
    segs: Vec<Arc<MappedSegment>>,
    synced: WalPos,
    written: WalPos,
    shutdown: bool,
    /// A failed sync poisons the writer: nothing after it can be claimed durable.
    failed: Option<String>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<SyncState>,
    wake: Condvar,
    control: ControlFile,
    /// Set (after `SyncState::failed`) when a sync failed, so the `None` commit path can
    /// check for poisoning without taking the lock.
    failed_flag: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, SyncState> {
        // A panic while holding the lock leaves consistent data (plain positions).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// msync everything below `to` and publish it as durable.
    fn sync_to(&self, to: WalPos) -> Result<()> {
        let (from, segs) = {
            let st = self.lock();
            if let Some(f) = &st.failed {
                return Err(poisoned(f));
            }
            if st.synced >= to {
                return Ok(());
            }
            (st.synced, st.segs.clone())
        };
        for seg in &segs {
            let lo = from.max(seg.first);
            let hi = to.min(seg.limit());
            if lo < hi {
                let synced = if seg.is_direct() {
                    seg.sync_data()
                } else {
                    seg.sync_range(lo.since(seg.first) as usize, hi.since(seg.first) as usize)
                };
                if let Err(e) = synced {
                    let mut st = self.lock();
                    st.failed = Some(e.to_string());
                    self.failed_flag.store(true, Ordering::Release);
                    tracing::error!(error = %e, "WAL sync failed; the writer is poisoned");
                    return Err(e);
                }
            }
        }
        let mut st = self.lock();
        if to > st.synced {
            st.synced = to;
        }
        st.prune();
        drop(st);
        self.control.raise_durable(to);
        Ok(())
    }
}

fn poisoned(reason: &str) -> Error {
    Error::io(
        "sync",
        PathBuf::new(),
        std::io::Error::other(format!(
            "an earlier WAL sync failed ({reason}); the writer must be reopened"
        )),
    )
}

/// The next segment, created and pre-faulted by a background thread.
#[derive(Debug)]
struct SpareJob {
    /// The spare file, sent once created and mapped (before the pre-fault finishes).
    rx: mpsc::Receiver<Result<MappedSegment>>,
    handle: JoinHandle<()>,
}

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

    /// With [`WalOptions::direct_io`]: stages the active segment from record offset `off`.
    /// A segment whose file is not a whole number of blocks (made with another segment size
    /// before direct I/O was turned on) is written through the page cache instead, until
    /// the next rotation: a padded block would grow its file.
    fn restage(&mut self, off: usize) -> Result<()> {
        let file_len = self.active.capacity + SEGMENT_HEADER_LEN;
        if !self.opts.direct_io || file_len % crate::direct::BLOCK != 0 {
            // Through the page cache (the stage, if any, was written out or rolled back).
            self.direct = None;
            return Ok(());
        }
        self.active.mark_direct();
        let end = (SEGMENT_HEADER_LEN + off) as u64;
        match self.direct.as_mut() {
            Some(stage) => stage.retarget(&self.active.path, end),
            None => {
                self.direct = Some(DirectStage::open(&self.active.path, end)?);
                Ok(())
            }
        }
    }

    /// Turns [`WalOptions::direct_io`] on or off: at once when nothing is staged beyond the
    /// last commit, else at the next rotation or rollback. A segment written partly each way
    /// is synced with `fdatasync`, which covers both; the kernel keeps the page cache
    /// coherent with the direct writes. A segment that is not a whole number of blocks stays
    /// in the page cache. On an error (opening the segment with `O_DIRECT`) the writer goes
    /// on through the page cache and tries again at the next rotation.
    pub fn set_direct_io(&mut self, on: bool) -> Result<()> {
        if self.opts.direct_io == on {
            return Ok(());
        }
        self.opts.direct_io = on;
        if self.staged_pos() == self.committed {
            self.restage(self.off)?;
        }
        Ok(())
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

    /// Stages `rec`; returns its position. Refused, with nothing written, when its ht is not
    /// greater than the previous record's or lies beyond the wall clock plus
    /// [`WalOptions::max_clock_skew`], when it exceeds a size limit, or when it is not a
    /// valid new record ([`Record::check_new`]); every refusal names the tablet.
    pub fn append(&mut self, rec: &Record) -> Result<WalPos> {
        if let Some(last) = self.staged_ht {
            if rec.ht <= last {
                return Err(Error::NonMonotonicHt {
                    tablet: self.tablet.clone(),
                    ht: rec.ht,
                    last,
                });
            }
        }
        self.check_not_ahead(rec.ht)?;
        rec.check_new().map_err(|e| e.in_tablet(&self.tablet))?;
        let total = RECORD_HEADER_LEN
            + rec
                .encoded_body_len()
                .map_err(|e| e.in_tablet(&self.tablet))?;
        let max = self.opts.segment_size as usize - SEGMENT_HEADER_LEN;
        if total > max {
            return Err(Error::TooLarge {
                tablet: Some(self.tablet.clone()),
                what: "record (for this segment size)",
                len: total,
                max,
            });
        }
        if self.off + total > self.active.capacity {
            self.rotate()?;
        }
        let pos = self.staged_pos();
        if let Some(stage) = self.direct.as_mut() {
            let mut encoded = vec![0u8; total];
            rec.encode_at(pos, &mut encoded);
            stage.push(&encoded)?;
        } else {
            // SAFETY: we hold the tablet lock and `&mut self`; the range is unstaged space.
            let dst = unsafe { self.active.data_mut(self.off, total) };
            rec.encode_at(pos, dst);
        }
        self.off += total;
        self.staged_ht = Some(rec.ht);
        if self.spare.is_none() && self.off >= self.active.capacity / 4 {
            self.start_spare();
        }
        Ok(pos)
    }

    /// Refuses an ht beyond the wall clock plus [`WalOptions::max_clock_skew`].
    fn check_not_ahead(&mut self, ht: HybridTime) -> Result<()> {
        let Some(skew) = self.opts.max_clock_skew else {
            return Ok(());
        };
        if ht <= self.ht_ceiling {
            return Ok(());
        }
        let now = HybridTime::from_system_time(std::time::SystemTime::now());
        let skew_us = u64::try_from(skew.as_micros()).unwrap_or(u64::MAX);
        let ceiling_us = now.physical_micros().saturating_add(skew_us);
        let logical_max = (1u64 << crate::time::LOGICAL_BITS) - 1;
        self.ht_ceiling = HybridTime(
            ceiling_us
                .checked_mul(1 << crate::time::LOGICAL_BITS)
                .map_or(u64::MAX, |v| v | logical_max),
        );
        if ht <= self.ht_ceiling {
            return Ok(());
        }
        Err(Error::HtAhead {
            tablet: self.tablet.clone(),
            ht,
            now,
            ahead_ms: ht.physical_micros().saturating_sub(now.physical_micros()) / 1000,
            max_ms: u64::try_from(skew.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Drops the staged, uncommitted records: their bytes are zeroed, and segments created
    /// for them since the last commit are removed.
    pub fn rollback(&mut self) -> Result<()> {
        while self.active.first > self.committed && self.segments.len() > 1 {
            let path = self.active.path.clone();
            self.segments.pop();
            let prev = self.segments[self.segments.len() - 1];
            let prev_path = self.dir.join(segment::segment_file_name(prev));
            let seg = Arc::new(MappedSegment::open(prev_path, prev)?);
            {
                let mut st = self.shared.lock();
                st.segs.retain(|s| s.first < self.active.first);
                if !st.segs.iter().any(|s| s.first == prev) {
                    st.segs.push(seg.clone());
                }
            }
            self.active = seg;
            std::fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
            fsutil::fsync_dir(&self.dir)?;
            self.off = self.active.capacity;
        }
        let committed_off = self.committed.since(self.active.first) as usize;
        if self.off > committed_off {
            if self.direct.is_some() {
                // Through the file (the kernel keeps it coherent with the direct writes);
                // the stage is reloaded from it below.
                self.active
                    .write_at(committed_off, &vec![0u8; self.off - committed_off])?;
            } else {
                // SAFETY: as in `append`; the range is staged, unpublished space.
                unsafe {
                    self.active
                        .data_mut(committed_off, self.off - committed_off)
                }
                .fill(0);
            }
        }
        self.off = committed_off;
        self.restage(committed_off)?;
        self.staged_ht = self.committed_ht;
        Ok(())
    }

    /// Publishes the staged records to tailers and makes them durable per `sync`.
    /// Returns the new written position.
    pub fn commit(&mut self, sync: SyncPolicy) -> Result<WalPos> {
        let end = self.staged_pos();
        if let Some(stage) = self.direct.as_mut() {
            // Readers read the file: the committed bytes must be in it before they are
            // published.
            stage.write_out()?;
        }
        if sync != SyncPolicy::None {
            self.settle_none();
        }
        self.durable_segments = sync != SyncPolicy::None;
        self.committed = end;
        self.committed_ht = self.staged_ht;
        match sync {
            SyncPolicy::None => {
                // No lock on this path: two atomic stores to the control file. The lock
                // state catches up in `settle_none` (rotation, a durable commit, sync,
                // close).
                if self.shared.failed_flag.load(Ordering::Acquire) {
                    self.shared.control.set_written(end);
                    let st = self.shared.lock();
                    if let Some(f) = &st.failed {
                        return Err(poisoned(f));
                    }
                }
                self.unsettled_none = true;
                self.shared.control.publish_unsynced(end);
            }
            SyncPolicy::Always => {
                self.shared.control.set_written(end);
                self.shared.lock().written = end;
                self.shared.sync_to(end)?;
            }
            SyncPolicy::Batch => {
                self.shared.control.set_written(end);
                self.ensure_flusher();
                let mut st = self.shared.lock();
                if let Some(f) = &st.failed {
                    return Err(poisoned(f));
                }
                st.written = end;
                let pending = end.since(st.synced);
                drop(st);
                if pending >= self.opts.batch_bytes {
                    self.shared.wake.notify_all();
                }
            }
        }
        Ok(end)
    }

    /// Brings the lock state up to the `None` commits made since the last call: they are
    /// declared synced, and sealed segments below them stop being tracked for syncing.
    fn settle_none(&mut self) {
        if !self.unsettled_none {
            return;
        }
        self.unsettled_none = false;
        let mut st = self.shared.lock();
        st.written = st.written.max(self.committed);
        st.synced = st.synced.max(self.committed);
        st.prune();
    }

    /// Makes everything committed durable now.
    pub fn sync(&mut self) -> Result<WalPos> {
        self.settle_none();
        self.shared.sync_to(self.committed)?;
        Ok(self.committed)
    }

    /// Blocks until `durable_pos ≥ pos` or `timeout`; returns whether it got there.
    pub fn wait_durable(&self, pos: WalPos, timeout: Duration) -> bool {
        let deadline = std::time::Instant::now() + timeout;
        // `None` commits raise durable_pos in the control file without the lock.
        if self.shared.control.durable() >= pos {
            return true;
        }
        let mut st = self.shared.lock();
        loop {
            if st.synced >= pos || st.failed.is_some() {
                return st.synced >= pos;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            self.shared.wake.notify_all();
            st = self
                .shared
                .wake
                .wait_timeout(st, (deadline - now).min(self.opts.batch_interval))
                .map(|(g, _)| g)
                .unwrap_or_else(|p| p.into_inner().0);
        }
    }

    fn ensure_flusher(&mut self) {
        if self.flusher.is_some() {
            return;
        }
        let shared = self.shared.clone();
        let interval = self.opts.batch_interval;
        let batch_bytes = self.opts.batch_bytes;
        let tablet = self.tablet.clone();
        let h = std::thread::Builder::new()
            .name(format!("wal-flush-{tablet}"))
            .spawn(move || flusher_loop(&shared, interval, batch_bytes));
        match h {
            Ok(h) => self.flusher = Some(h),
            Err(e) => {
                tracing::error!(tablet = %self.tablet, error = %e, "cannot start the WAL flusher; batch commits sync at the next commit")
            }
        }
    }

    /// Seals the active segment and starts a new one at the staged position.
    fn rotate(&mut self) -> Result<()> {
        let first = self.staged_pos();
        fail::fail_point!("wal::rotate::err", |_| Err(Error::io(
            "rotate",
            &self.dir,
            std::io::Error::other("failpoint wal::rotate::err")
        )));
        if let Some(stage) = self.direct.as_mut() {
            // The sealed segment gets its staged tail before the stage moves on.
            stage.write_out()?;
        }
        // Acknowledged segments go before the next one is allocated: on a full disk they
        // are the space it needs (retention after the allocation would never run there).
        if let Err(e) = self.enforce_retention() {
            tracing::warn!(tablet = %self.tablet, error = %e, "retention failed; segments kept");
        }
        let seg = match self.take_spare() {
            Some(spare) => {
                spare.activate_spare(&self.dir, &self.tablet, first, self.durable_segments)?
            }
            None => MappedSegment::create(
                &self.dir,
                &self.tablet,
                first,
                self.opts.segment_size,
                self.durable_segments,
            )?,
        };
        let seg = Arc::new(seg);
        self.settle_none();
        self.shared.lock().segs.push(seg.clone());
        self.active = seg;
        self.segments.push(first);
        self.off = 0;
        self.restage(0)?;
        if let Err(e) = self.enforce_retention() {
            tracing::warn!(tablet = %self.tablet, error = %e, "retention failed; segments kept");
        }
        Ok(())
    }

    /// Starts preparing the next segment in a background thread: create `spare.seg.partial`
    /// (preallocated), map it, hand it over, then pre-fault it, so the rotation does no file
    /// creation inline and the appends after it take no page faults that zero fresh
    /// page-cache pages. Pre-faulted for write (dirty, no fault left at all) while commits
    /// use `None`; for read otherwise, so a durable rotation's fdatasync does not write
    /// back a whole segment of zeros.
    ///
    /// The thread first creates and hands over the spare, then waits for the previous
    /// pre-fault (of the active segment, still ahead of the writer) to finish, then
    /// pre-faults the spare: one pre-faulting thread at a time, active segment first.
    fn start_spare(&mut self) {
        let prev = self.prefaulting.take();
        let (tx, rx) = mpsc::sync_channel(1);
        let dir = self.dir.clone();
        let size = self.opts.segment_size;
        let write = !self.durable_segments;
        // Direct writes go around the page cache: pages faulted in would only be dropped.
        let prefault = self.opts.prefault && !self.opts.direct_io;
        let stop = self.bg_stop.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("wal-spare-{}", self.tablet))
            .spawn(move || {
                let seg = MappedSegment::create_spare(&dir, size);
                let pf = seg.as_ref().ok().map(MappedSegment::prefaulter);
                let sent = tx.send(seg).is_ok();
                if let Some(prev) = prev {
                    let _ = prev.join();
                }
                if let (true, true, Some(pf)) = (sent, prefault, pf) {
                    pf.run(write, &stop);
                }
            });
        match spawned {
            Ok(handle) => self.spare = Some(SpareJob { rx, handle }),
            Err(e) => {
                tracing::warn!(tablet = %self.tablet, error = %e, "cannot start the spare segment thread; segments are created at rotation")
            }
        }
    }

    /// The prepared spare, waiting for its creation if needed; `None` when there is none or
    /// preparing it failed (the caller creates the segment itself).
    fn take_spare(&mut self) -> Option<MappedSegment> {
        let job = self.spare.take()?;
        match job.rx.recv() {
            Ok(Ok(seg)) => {
                // It may still be pre-faulting; the writer can overtake it safely.
                self.prefaulting = Some(job.handle);
                Some(seg)
            }
            Ok(Err(e)) => {
                tracing::warn!(tablet = %self.tablet, error = %e, "preparing the spare segment failed; creating it at rotation");
                self.prefaulting = Some(job.handle);
                None
            }
            Err(_) => {
                let _ = job.handle.join();
                None
            }
        }
    }

    /// Stops the background segment threads and removes an unused spare.
    fn drop_spare(&mut self) {
        self.bg_stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.prefaulting.take() {
            let _ = h.join();
        }
        if let Some(job) = self.spare.take() {
            let _ = job.handle.join();
            let path = self.dir.join(segment::SPARE_FILE);
            if let Err(e) = std::fs::remove_file(&path) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(file = %path.display(), error = %e, "cannot remove the spare segment; recovery will");
                }
            }
        }
    }

    /// Deletes sealed segments the shipper has acknowledged, and the oldest ones past
    /// `max_retained_bytes`. Never the active segment.
    pub fn enforce_retention(&mut self) -> Result<RetentionReport> {
        let acked = retention::read_acked(&self.dir)?;
        let plan = retention::plan(
            &self.segments,
            self.committed,
            acked,
            self.opts.max_retained_bytes,
        );
        if plan.delete == 0 {
            return Ok(RetentionReport {
                retained_bytes: self.committed.since(self.oldest_pos()),
                ..Default::default()
            });
        }
        let new_oldest = self.segments[plan.delete];
        // Readers learn the new oldest position before the files go.
        self.shared.control.set_oldest(new_oldest);
        let mut report = RetentionReport::default();
        for (k, first) in self.segments.drain(..plan.delete).enumerate() {
            let path = self.dir.join(segment::segment_file_name(first));
            std::fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
            if k >= plan.acked_whole {
                tracing::warn!(tablet = %self.tablet, file = %path.display(), acked = ?acked,
                    "deleting an unacked segment: max_retained_bytes exceeded; the target will need a bootstrap");
                report.forced.push(path);
            } else {
                report.deleted.push(path);
            }
        }
        fsutil::fsync_dir(&self.dir)?;
        report.retained_bytes = self.committed.since(new_oldest);
        Ok(report)
    }

    /// Commits nothing new, syncs what is committed, and stops the flusher.
    pub fn close(mut self) -> Result<()> {
        self.shutdown()
    }

    fn shutdown(&mut self) -> Result<()> {
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

/// The batch flusher: syncs pending commits once `interval` has passed since the previous
/// sync, or at once when `batch_bytes` are pending. Every wait is bounded by `interval`.
fn flusher_loop(shared: &Shared, interval: Duration, batch_bytes: u64) {
    let mut last_sync = Instant::now();
    let mut st = shared.lock();
    loop {
        if st.shutdown || st.failed.is_some() {
            return;
        }
        let pending = st.written.since(st.synced);
        let due = last_sync + interval;
        let now = Instant::now();
        if pending > 0 && (now >= due || pending >= batch_bytes) {
            let target = st.written;
            drop(st);
            // A failure poisons the writer inside sync_to; the next commit reports it.
            let _ = shared.sync_to(target);
            last_sync = Instant::now();
            shared.wake.notify_all();
            st = shared.lock();
            continue;
        }
        let wait = if pending > 0 { due - now } else { interval };
        st = shared
            .wake
            .wait_timeout(st, wait)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}

impl Writer {
    /// Stages already-encoded records verbatim — the bytes of another log of the same
    /// tablet, as a shipper sends them. `bytes` must be whole records at consecutive
    /// positions starting at [`Writer::staged_pos`], with ht above the last staged record.
    /// Everything is checked (header, position, checksum, ht order, size) before anything
    /// is written; on refusal nothing is staged. Records never span segments: a record that
    /// does not fit in the active segment starts the next one at the same logical position.
    /// Returns the number of records and the last ht. On an I/O error (rotation) part of the
    /// records may be staged: `rollback` drops them.
    pub fn append_encoded(&mut self, bytes: &[u8]) -> Result<(u32, Option<HybridTime>)> {
        let start = self.staged_pos();
        let sum = crate::verify::verify_records(&self.tablet, bytes, start, self.staged_ht)
            .map_err(|e| Error::InvalidRecord(e.to_string()))?;
        let max = self.opts.segment_size as usize - SEGMENT_HEADER_LEN;
        let mut off = 0usize;
        while off < bytes.len() {
            let room = self.active.capacity - self.off;
            // Checked whole records above: when the rest fits, no need to walk the headers
            // again (the common case, a frame well inside a segment).
            let n = if bytes.len() - off <= room {
                bytes.len() - off
            } else {
                crate::verify::whole_records_prefix(&bytes[off..], room).0
            };
            if n == 0 {
                use zerocopy::FromBytes;
                let first = crate::format::RecordHeader::read_from_prefix(&bytes[off..])
                    .map_or(usize::MAX, |(h, _)| {
                        RECORD_HEADER_LEN + h.len.get() as usize
                    });
                if first > max || self.off == 0 {
                    return Err(Error::TooLarge {
                        tablet: Some(self.tablet.clone()),
                        what: "record (for this segment size)",
                        len: first,
                        max,
                    });
                }
                self.rotate()?;
                continue;
            }
            // Through the file: verbatim bytes are large runs (a shipper's frames), where
            // faulting the mapping in and write-protecting it for writeback cost more than
            // the copy (BENCHMARKS.md, changelog).
            match self.direct.as_mut() {
                Some(stage) => stage.push(&bytes[off..off + n])?,
                None => self.active.write_at(self.off, &bytes[off..off + n])?,
            }
            self.off += n;
            debug_assert!(self
                .direct
                .as_ref()
                .is_none_or(|s| s.end() == (SEGMENT_HEADER_LEN + self.off) as u64));
            off += n;
        }
        if sum.last_ht.is_some() {
            self.staged_ht = sum.last_ht;
        }
        Ok((sum.count, sum.last_ht))
    }

    /// Drops from the page cache the log's bytes more than `keep` below the durable end
    /// (in steps of at least 1 MiB): they were read long ago, or will be read in bulk (see
    /// `Reader::set_direct_backlog_reads`), and the kernel hands their pages to the next
    /// writes, which would otherwise each take a fresh page. Nothing with direct I/O
    /// (nothing cached).
    pub fn drop_cached_below(&mut self, keep: u64) -> Result<()> {
        if self.direct.is_some() {
            return Ok(());
        }
        let to = WalPos(self.durable_pos().0.saturating_sub(keep));
        let from = self
            .dropped
            .max(self.segments.first().copied().unwrap_or_default());
        if to.0 < from.0 + (1 << 20) {
            return Ok(());
        }
        for (i, &first) in self.segments.iter().enumerate() {
            let end = self
                .segments
                .get(i + 1)
                .copied()
                .unwrap_or(WalPos(u64::MAX));
            if end <= from || first >= to {
                continue;
            }
            let (a, b) = (
                from.max(first).since(first) as usize,
                to.min(end).since(first) as usize,
            );
            if first == self.active.first {
                self.active.drop_cached(a, b.min(self.active.capacity))?;
            } else {
                let path = self.dir.join(segment::segment_file_name(first));
                match std::fs::File::open(&path) {
                    Ok(f) => segment::drop_cached(&f, &path, a, b)?,
                    // Deleted by retention meanwhile: nothing cached.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io("open", &path, e)),
                }
            }
        }
        self.dropped = to;
        Ok(())
    }
}
