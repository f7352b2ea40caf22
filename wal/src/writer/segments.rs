//! The segments of the log: rotation to a spare prepared in the background, direct I/O
//! staging of the active segment, retention of acknowledged segments, and dropping old
//! bytes from the page cache.

use std::sync::atomic::Ordering;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;

use super::Writer;
use crate::direct::DirectStage;
use crate::error::{Error, Result};
use crate::format::SEGMENT_HEADER_LEN;
use crate::fsutil;
use crate::pos::WalPos;
use crate::retention::{self, RetentionReport};
use crate::segment::{self, MappedSegment};

/// The next segment, created and pre-faulted by a background thread.
#[derive(Debug)]
pub(super) struct SpareJob {
    /// The spare file, sent once created and mapped (before the pre-fault finishes).
    rx: mpsc::Receiver<Result<MappedSegment>>,
    handle: JoinHandle<()>,
}

impl Writer {
    /// With [`WalOptions::direct_io`]: stages the active segment from record offset `off`.
    /// A segment whose file is not a whole number of blocks (made with another segment size
    /// before direct I/O was turned on) is written through the page cache instead, until
    /// the next rotation: a padded block would grow its file.
    pub(super) fn restage(&mut self, off: usize) -> Result<()> {
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

    /// Seals the active segment and starts a new one at the staged position.
    pub(super) fn rotate(&mut self) -> Result<()> {
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
    pub(super) fn start_spare(&mut self) {
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
    pub(super) fn take_spare(&mut self) -> Option<MappedSegment> {
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
    pub(super) fn drop_spare(&mut self) {
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
