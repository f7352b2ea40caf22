//! Staging records ([`Writer::append`]), dropping them ([`Writer::rollback`]), and
//! publishing them ([`Writer::commit`]) with the durability the sync policy asks for.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::sync::{flusher_loop, poisoned};
use super::{SyncPolicy, Writer};
use crate::error::{Error, Result};
use crate::format::{RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::fsutil;
use crate::pos::WalPos;
use crate::record::Record;
use crate::segment::{self, MappedSegment};
use crate::time::HybridTime;
use std::sync::Arc;

impl Writer {
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
    pub(super) fn check_not_ahead(&mut self, ht: HybridTime) -> Result<()> {
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
    pub(super) fn settle_none(&mut self) {
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

    pub(super) fn ensure_flusher(&mut self) {
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
}
