//! One tablet's apply loop ([`TabletLoop`]), owned by the thread applying it: each step
//! applies the committed parts the consistency core says are ready and at most one batch
//! of the received log, from the position the store holds (see the module doc of
//! `apply/mod.rs` for why `Buffered` batches are safe).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidelog_wal::{ReadLimit, Reader, Record, TabletId, WalPos};

use super::state::{ApplyFault, LoopSettings, ReceivedReads, Shared};
use crate::consistency::Consistency;
use crate::disk::Backoff;
use crate::error::{Error, Result};
use crate::store::{Durability, Store};

/// An apply batch that takes this long is logged with the store's write pressure.
const SLOW_BATCH: Duration = Duration::from_millis(200);

/// What one look at a tablet did.
pub(super) enum Step {
    /// Applied something: look again soon. `full`: a whole batch (more is likely waiting).
    Worked { full: bool },
    /// Nothing to do; look again within this long at the latest.
    Idle(Duration),
}

/// Whether the writer has created the tablet's log far enough for a `Reader` to open it:
/// a control file and at least one segment.
fn log_ready(dir: &Path) -> Result<bool> {
    if !dir.join(tidelog_wal::control::CONTROL_FILE).is_file() {
        return Ok(false);
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(Error::Io {
                op: "list",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for ent in rd {
        let ent = ent.map_err(|source| Error::Io {
            op: "list",
            path: dir.to_path_buf(),
            source,
        })?;
        if ent.file_name().to_string_lossy().ends_with(".seg") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One tablet's apply state, owned by the thread applying it.
#[derive(Debug)]
pub(super) struct TabletLoop {
    pub(super) sh: Arc<Shared>,
    /// Entered for each step (made once: a new span per step costs the subscriber an
    /// allocation and the formatting of its fields each time).
    pub(super) span: tracing::Span,
    pub(super) store: Arc<Store>,
    pub(super) root: PathBuf,
    pub(super) cfg: LoopSettings,
    pub(super) reader: Option<Reader>,
    /// Reads intents back by position for committed parts.
    pub(super) parts_reader: Option<Reader>,
    pub(super) batch: Vec<(WalPos, Record)>,
    /// Batches applied `Buffered` since the store was last persisted.
    pub(super) dirty: bool,
    pub(super) last_persist: Instant,
    /// Warned that the log is missing although records were applied.
    pub(super) warned: bool,
    /// The store's generation this loop's positions were read from (see
    /// [`Store::generation`]): a reopened store is read again.
    pub(super) generation: u64,
    /// While the worker holds ([`Shared::held`]): when to try again.
    pub(super) retry: Option<Backoff>,
    /// While the received log ends below the apply position: its end when that was logged.
    pub(super) refill_from: Option<WalPos>,
}

/// Where the received log stands for the apply position.
enum LogState {
    /// The reader is open at the apply position (or further).
    Open,
    /// The log does not exist yet.
    Missing,
    /// The log ends at `end`, below the apply position: it lost its tail (a truncated
    /// segment, cut at its last valid record when the intake opened it, as the source's
    /// WAL is) and the intake is receiving it again. Records below the apply position are
    /// in the store already; applying goes on once the log reaches that position.
    Behind { end: WalPos },
}

impl TabletLoop {
    /// Applies the ready parts and at most one batch of the received log (after a hold,
    /// or once the store was reopened, from the position the store holds).
    pub(super) fn step(&mut self) -> Result<Step> {
        // Also while holding: a worker waiting for space is alive (the watchdog looks).
        self.sh.heartbeat.beat();
        if let Some(wait) = self.resume()? {
            return Ok(Step::Idle(wait));
        }
        let step = self.step_inner()?;
        if self.retry.take().is_some() {
            *self.sh.held.lock().unwrap_or_else(|p| p.into_inner()) = None;
            tracing::info!(applied_pos = %self.sh.applied_pos.load(), "apply resumed");
        }
        Ok(step)
    }

    /// Holds on a retryable error `e`: kept for status, logged once per change; returns
    /// when to look again.
    pub(super) fn hold(&mut self, e: Error) -> Duration {
        let mut held = self.sh.held.lock().unwrap_or_else(|p| p.into_inner());
        if held
            .as_ref()
            .is_none_or(|h| h.error.to_string() != e.to_string())
        {
            tracing::warn!(applied_pos = %self.sh.applied_pos.load(),
                "apply holds: {e}; it resumes on its own once that ends");
        }
        *held = Some(ApplyFault {
            pos: self.sh.applied_pos.load(),
            error: Arc::new(e),
        });
        self.retry.get_or_insert_with(Backoff::default).failed()
    }

    /// Before a step: `Some(wait)` while the worker must wait (held, and its retry is not
    /// due; or the store was reopened and the safe-time core not yet rebuilt from it).
    /// Otherwise, when the store was reopened or a retry is due, reads the tablet's apply
    /// position and safe time back from the store, as a restart would, and drops the
    /// readers: nothing in memory is trusted over what the store holds.
    fn resume(&mut self) -> Result<Option<Duration>> {
        let generation = self.store.generation();
        let reopened = generation != self.generation;
        if reopened {
            let core_behind = self
                .cfg
                .consistency
                .as_ref()
                .is_some_and(|c| c.store_generation() != generation);
            if core_behind {
                return Ok(Some(Duration::from_millis(10)));
            }
        } else if let Some(r) = &self.retry {
            if !r.due() {
                return Ok(Some(r.left()));
            }
        } else {
            return Ok(None);
        }
        let meta = self.store.tablet(&self.sh.tablet)?.unwrap_or_default();
        self.reader = None;
        self.parts_reader = None;
        if reopened {
            // What was applied `Buffered` is in the reopened store (its journal was read
            // back); nothing is left to persist from the old one.
            self.dirty = false;
        }
        self.generation = generation;
        self.sh.safe_time.store(meta.safe_time.0, Ordering::Release);
        self.sh.publish(meta.applied_pos, meta.safe_time);
        Ok(None)
    }

    /// Opens the reader of the tablet's received log at the apply position, unless the log
    /// does not exist yet or ends below that position (see [`LogState`]).
    fn open_reader(&mut self) -> Result<LogState> {
        let (sh, cfg) = (&self.sh, &self.cfg);
        let tablet = &sh.tablet;
        let wal = |source| Error::Wal {
            tablet: tablet.clone(),
            source,
        };
        let log_dir = self.root.join(tablet.as_str());
        if !log_ready(&log_dir)? {
            if !self.warned && sh.applied_pos.load() != WalPos::ZERO {
                // The store applied this tablet before, yet its log is gone.
                tracing::warn!(dir = %log_dir.display(), applied_pos = %sh.applied_pos.load(),
                    "received log missing although records were applied; waiting for it");
                self.warned = true;
            }
            return Ok(LogState::Missing);
        }
        let mut r = Reader::open(&self.root, tablet, ReadLimit::Durable).map_err(wal)?;
        match cfg.reads {
            ReceivedReads::Buffered => {}
            ReceivedReads::Direct => r.set_direct_io(true),
            ReceivedReads::DirectBacklogs => {
                r.set_direct_backlog_reads(Some(crate::intake::RECEIVED_CACHE_KEEP))
            }
        }
        let from = sh.applied_pos.load();
        // A tablet that applied nothing starts at the log's oldest record.
        if from != WalPos::ZERO {
            if let Some(end) = r.end().filter(|end| *end < from) {
                return Ok(LogState::Behind { end });
            }
            r.seek(from).map_err(wal)?;
        }
        tracing::info!(from = %Reader::position(&r), "apply worker reading the received log");
        self.reader = Some(r);
        Ok(LogState::Open)
    }

    /// [`TabletLoop::step`] itself.
    fn step_inner(&mut self) -> Result<Step> {
        self.sh.heartbeat.beat();
        let log = match &self.reader {
            Some(_) => LogState::Open,
            None => self.open_reader()?,
        };
        if let LogState::Behind { end } = log {
            // Ready parts wait too: their intents lie below the apply position.
            let from = self.sh.applied_pos.load();
            if self.refill_from.is_none() {
                tracing::warn!(%from, received_end = %end,
                    "the received log ends below the apply position: it lost its tail (cut \
                     at its last valid record when it was opened) and the shipper is sending \
                     it again; applying goes on from {from} once it gets there");
                self.refill_from = Some(end);
            }
            return Ok(Step::Idle(self.cfg.poll_interval));
        }
        if self.refill_from.take().is_some() {
            tracing::info!(from = %self.sh.applied_pos.load(), "the received log was refilled to the apply position");
        }
        let (sh, cfg) = (&self.sh, &self.cfg);
        let tablet = &sh.tablet;
        let wal = |source| Error::Wal {
            tablet: tablet.clone(),
            source,
        };
        if let Some(c) = &cfg.consistency {
            apply_ready_parts(tablet, &self.store, c, &self.root, &mut self.parts_reader)?;
        }
        let Some(r) = self.reader.as_mut() else {
            // No log yet.
            return Ok(Step::Idle(cfg.poll_interval));
        };
        let batch = &mut self.batch;
        batch.clear();
        let start = Reader::position(r);
        // A record that does not read (it stays the reader's position) or that the store
        // cannot take stops the tablet there: the ones before it are applied, nothing of
        // it, and the error is returned after them.
        let mut rejected = None;
        while batch.len() < cfg.batch_records && Reader::position(r).since(start) < cfg.batch_bytes
        {
            match r.next() {
                Ok(Some(rec)) => batch.push(rec),
                Ok(None) => break,
                Err(e) => {
                    rejected = Some(wal(e));
                    break;
                }
            }
        }
        let mut end = Reader::position(r);
        let full = batch.len() >= cfg.batch_records || end.since(start) >= cfg.batch_bytes;
        let mut unfit = None;
        for (i, (pos, rec)) in batch.iter().enumerate() {
            if let Err(e) = Store::check_record(tablet, *pos, rec) {
                unfit = Some((i, *pos, e));
                break;
            }
        }
        if let Some((i, pos, e)) = unfit {
            end = pos;
            batch.truncate(i);
            rejected = Some(e);
        }
        if !batch.is_empty() {
            if let Some(c) = &cfg.consistency {
                c.check_below_safe_time(tablet, batch.iter().map(|(_, r)| r));
            }
            // Test hook: a slow apply (`apply::batch=sleep(ms)`).
            fail::fail_point!("apply::batch");
            let started = Instant::now();
            let out = self.store.apply(tablet, batch, end, cfg.durability)?;
            let took = started.elapsed();
            sh.batch_latency.record(took);
            if let Some((_, newest)) = batch.last() {
                sh.applied_age.record_age(newest.ht);
            }
            if took >= SLOW_BATCH {
                tracing::warn!(
                    records = batch.len(),
                    took_ms = took.as_millis() as u64,
                    lsm = %self.store.lsm_pressure(),
                    "slow apply batch"
                );
            }
            if start < cfg.count_below {
                let below = batch.iter().filter(|(p, _)| *p < cfg.count_below).count();
                sh.records_below.fetch_add(below as u64, Ordering::Relaxed);
            }
            sh.applied_records.fetch_add(out.records, Ordering::Relaxed);
            sh.applied_bytes.fetch_add(out.bytes, Ordering::Relaxed);
            tracing::trace!(records = out.records, bytes = out.bytes, end = %end, "applied");
            sh.publish(out.applied_pos, out.safe_time);
            if let Some(c) = &cfg.consistency {
                c.after_batch(tablet, &out);
            }
            self.dirty |= cfg.durability == Durability::Buffered;
            if self.dirty && self.last_persist.elapsed() >= cfg.persist_interval {
                self.persist()?;
            }
            if let Some(e) = rejected {
                return Err(e);
            }
            return Ok(Step::Worked { full });
        }
        if let Some(e) = rejected {
            return Err(e);
        }
        let mut within = cfg.poll_interval;
        if self.dirty {
            let left = cfg
                .persist_interval
                .saturating_sub(self.last_persist.elapsed());
            if left.is_zero() {
                self.persist()?;
            } else {
                within = within.min(left);
            }
        }
        Ok(Step::Idle(within))
    }

    fn persist(&mut self) -> Result<()> {
        self.store.persist()?;
        self.dirty = false;
        self.last_persist = Instant::now();
        Ok(())
    }

    /// Leaves the thread: persists what was applied `Buffered`, keeps the error that
    /// ended it, and wakes `stop` and the `wait_applied` callers.
    /// `tablets` is its thread's count of tablets, which it leaves.
    pub(super) fn finish(&mut self, result: Result<()>, tablets: &AtomicUsize) {
        let persisted = if self.dirty { self.persist() } else { Ok(()) };
        if let Err(e) = result.and(persisted) {
            let fault = ApplyFault {
                pos: self.sh.applied_pos.load(),
                error: Arc::new(e),
            };
            tracing::error!(tablet = %self.sh.tablet, state = fault.state(), "{fault}");
            *self.sh.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault);
        }
        tablets.fetch_sub(1, Ordering::Relaxed);
        let _g = self.sh.progress();
        self.sh.running.store(false, Ordering::Release);
        self.sh.progress_cv.notify_all();
    }
}

/// Applies the committed parts of `tablet` that the consistency core says are ready: the
/// ops of the transaction's intents on this tablet, read back from the received log by
/// position, as versions at `commit_ht`.
fn apply_ready_parts(
    tablet: &TabletId,
    store: &Store,
    c: &Consistency,
    root: &Path,
    reader: &mut Option<Reader>,
) -> Result<()> {
    let parts = c.take_ready(tablet);
    if parts.is_empty() {
        return Ok(());
    }
    let wal = |source| Error::Wal {
        tablet: tablet.clone(),
        source,
    };
    let txns: Vec<tidelog_wal::TxnId> = parts.iter().map(|p| p.txn).collect();
    let intents = store.intents_on(tablet, &txns)?;
    let mut batch = Vec::with_capacity(parts.len());
    for (part, list) in parts.iter().zip(intents) {
        let list = list.ok_or_else(|| {
            Error::Invalid(format!(
                "tablet {tablet}: ready part of unknown txn {}",
                part.txn
            ))
        })?;
        let mut ops = Vec::new();
        if !list.is_empty() {
            let r = match reader {
                Some(r) => r,
                None => reader.insert(Reader::open(root, tablet, ReadLimit::Durable).map_err(wal)?),
            };
            for ir in &list {
                let rec = r.read_at(ir.pos).map_err(wal)?;
                Store::check_record(tablet, ir.pos, &rec)?;
                match rec.body {
                    tidelog_wal::Body::Intent { ops: o, .. } => {
                        ops.extend(o.into_iter().map(|op| (op.key, op.value)));
                    }
                    _ => {
                        return Err(Error::Invalid(format!(
                        "tablet {tablet}: position {} of txn {} holds a {} record, not an intent",
                        ir.pos,
                        part.txn,
                        rec.kind().name()
                    )))
                    }
                }
            }
        }
        batch.push(crate::store::Part {
            txn: part.txn,
            commit_ht: part.commit_ht,
            ops,
        });
    }
    // Every ready part of this tablet in one store batch.
    store.apply_parts(tablet, &batch, Durability::Buffered)?;
    c.parts_applied(&parts);
    Ok(())
}
