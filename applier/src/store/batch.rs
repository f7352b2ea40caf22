//! One tablet's apply batch ([`Writer`]): a run of records read from its received log — or
//! the committed parts ready on it — turned into **one** atomic fjall batch with the
//! tablet's new apply position (`applier/STORE.md`, "Atomicity and recovery"):
//!
//! ```text
//!  records ─► check position, ht, key limits ─► write: mvcc versions (mvcc.rs)
//!                                               + binlog entry, trx, gtid (binlog.rs)
//!             intent / commit / abort ─► txn state, moved out of the cache (txns.rs)
//!                                        + trx_open edits (binlog.rs)
//!        ─► txns / aborted records of the decided ─► tablet meta ─► hand over, commit
//! ```
//!
//! Every lower file writes into the batch passed down; only this one commits it. Records
//! below the stored apply position are skipped (a replay after a crash): nothing is applied
//! twice.

use std::collections::HashMap;

use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, HybridTime, Record, TabletId, TxnId, WalPos};

use super::binlog::{Binlog, OpenEdits};
use super::codec::encode_txn;
use super::db::Tables;
use super::meta::Meta;
use super::mvcc;
use super::txns::{untraceable_intent, OpenOp, Txns};
use super::types::{
    ApplyOutcome, BinlogEntry, CommitInfo, Durability, IntentRef, OpenKind, Part, TrxOpen, TxnState,
};
use crate::error::{Error, Result};
use crate::keys;

thread_local! {
    /// An apply worker's map of the transactions its batch touches, reused batch to batch.
    static BATCH_TXNS: std::cell::RefCell<HashMap<TxnId, TxnState>> =
        std::cell::RefCell::new(HashMap::new());
}

/// An apply batch prepared under the write lock, to be committed under the commit order.
struct Prepared {
    /// `None`: nothing to write (a pure replay).
    batch: Option<fjall::OwnedWriteBatch>,
    /// Pending-entry changes, made once the batch is committed.
    opens: Vec<OpenOp>,
    out: ApplyOutcome,
}

/// What an apply batch reads and writes: the parts of one opening of the store.
pub(super) struct Writer<'a> {
    pub(super) t: &'a Tables,
    pub(super) txns: &'a Txns,
    pub(super) meta: &'a Meta,
    pub(super) bl: &'a Binlog,
}

/// Whether the store can take `rec` (at `pos` in `tablet`'s received log): every key of
/// a `write` or `intent` fits the store's key limit once encoded
/// ([`keys::MAX_ENCODED_LEN`]), every value its value limit. [`Error::Rejected`] names
/// the record and the reason. A record that decodes can still fail this where the WAL's
/// key limit is above what the encoding allows (NUL bytes are escaped to two, and ten
/// bytes are added), so the apply stage asks before it builds a batch: an insert of
/// such a key would panic inside fjall.
pub(super) fn check_record(tablet: &TabletId, pos: WalPos, rec: &Record) -> Result<()> {
    check_ops(
        tablet,
        pos,
        rec.ops()
            .iter()
            .map(|op| (&op.key[..], op.value.as_deref())),
    )
}

/// [`check_record`] for ops (key, value) of the record at `pos`.
fn check_ops<'a>(
    tablet: &TabletId,
    pos: WalPos,
    ops: impl IntoIterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> Result<()> {
    let reject = |reason: String| Error::Rejected {
        tablet: tablet.clone(),
        pos,
        reason,
    };
    for (i, (k, v)) in ops.into_iter().enumerate() {
        let enc = keys::encoded_len(k);
        if enc > keys::MAX_ENCODED_LEN {
            return Err(reject(format!(
                "op {i}: a key of {} bytes takes {enc} bytes in the store (each NUL byte \
                 escaped to two, 10 bytes of terminator and version added), above its \
                 limit of {} bytes",
                k.len(),
                keys::MAX_ENCODED_LEN
            )));
        }
        // The stored value is a tag byte and the bytes; fjall takes up to u32::MAX.
        if let Some(v) = v {
            if v.len() >= u32::MAX as usize {
                return Err(reject(format!(
                    "op {i}: a value of {} bytes is above the store's limit of {} bytes",
                    v.len(),
                    u32::MAX - 1
                )));
            }
        }
    }
    Ok(())
}

impl Writer<'_> {
    /// Applies `records` of `tablet` (read from its received log; `end_pos` is the end of
    /// the last one) in one atomic batch together with the tablet's new apply position and
    /// safe time. Records that end at or below the stored apply position are skipped (a
    /// replay after a crash); the first record not skipped must start exactly at the apply
    /// position and each next one where the previous ended, else [`Error::Gap`].
    pub(super) fn apply(
        &self,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
        durability: Durability,
    ) -> Result<ApplyOutcome> {
        self.t.write_stall();
        self.apply_inner(tablet, records, end_pos, durability)
            .inspect_err(|_| self.txns.mark_cache_incomplete())
    }

    fn apply_inner(
        &self,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
        durability: Durability,
    ) -> Result<ApplyOutcome> {
        let mut g = self.txns.cache_lock();
        // The batch's transactions, moved out of the cache (see `Txns::txn_entry`). They go
        // back whether the batch commits or not: an undecided transaction's state lives only
        // here (its intents are rebuilt from the received logs at start, not stored), so a
        // failed batch must not drop it. What a failed batch added to them is re-applied
        // after a restart anyway (adding an intent twice is a no-op).
        // (Kept per thread with its capacity: a fresh table per batch of thousands of
        // transactions was allocated, page-faulted in and freed every time.)
        let mut txns = BATCH_TXNS.with(|t| std::mem::take(&mut *t.borrow_mut()));
        // A panic while preparing (a bug) is an error of this tablet, and the batch's
        // transactions still go back to the cache.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.apply_locked(&mut g, &mut txns, tablet, records, end_pos)
        }))
        .unwrap_or_else(|p| {
            Err(Error::Panicked {
                tablet: tablet.clone(),
                from: records.first().map_or(end_pos, |(pos, _)| *pos),
                message: Error::panic_message(&*p),
            })
        });
        let committing = matches!(&r, Ok(p) if p.batch.is_some());
        // The next batch is prepared while this one commits (see `Txns::hand_over`).
        let _committing = self.txns.hand_over(g, txns.drain(), committing);
        BATCH_TXNS.with(|t| *t.borrow_mut() = txns);
        r.and_then(|p| {
            if let Some(batch) = p.batch {
                self.t.commit(batch, durability)?;
                self.meta.note_tablet(tablet);
                self.txns.apply_open_ops(p.opens);
            }
            Ok(p.out)
        })
    }

    /// Prepares `tablet`'s batch under the write lock (`g`, the cache); the caller commits.
    fn apply_locked(
        &self,
        g: &mut HashMap<TxnId, TxnState>,
        txns: &mut HashMap<TxnId, TxnState>,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
    ) -> Result<Prepared> {
        let mut meta = self.meta.tablet(tablet)?.unwrap_or_default();
        let start = meta.applied_pos;
        // A tablet that never applied anything may start wherever its received log starts.
        let fresh = start == WalPos::ZERO;
        let mut expected = (!fresh).then_some(start);
        let mut out = ApplyOutcome::default();
        let mut batch = self.t.batch();
        let mut opens = OpenEdits::default();
        let mut pending_opens: Vec<OpenOp> = Vec::new();
        let mut key_buf = Vec::new();
        // Committed transactions without a `txns` record that met an untraceable intent.
        let mut late_records: Vec<TxnId> = Vec::new();

        let reject = |pos: &WalPos, reason: String| Error::Rejected {
            tablet: tablet.clone(),
            pos: *pos,
            reason,
        };
        for (pos, rec) in records {
            let body_len = rec
                .encoded_body_len()
                .map_err(|e| reject(pos, e.to_string()))?;
            let end = pos.add((RECORD_HEADER_LEN + body_len) as u64);
            if !fresh && *pos < start {
                if end > start {
                    return Err(Error::Gap {
                        tablet: tablet.clone(),
                        expected: start,
                        got: *pos,
                    });
                }
                out.skipped += 1;
                continue;
            }
            if let Some(e) = expected {
                if *pos != e {
                    return Err(Error::Gap {
                        tablet: tablet.clone(),
                        expected: e,
                        got: *pos,
                    });
                }
            }
            if meta.safe_time != HybridTime::MIN && rec.ht <= meta.safe_time {
                return Err(reject(
                    pos,
                    format!(
                        "its ht {} is not above the tablet's safe time {}",
                        rec.ht, meta.safe_time
                    ),
                ));
            }
            check_record(tablet, *pos, rec)?;
            expected = Some(end);
            out.records += 1;
            out.bytes += end.since(*pos);
            meta.safe_time = rec.ht;
            match &rec.body {
                Body::Write { ops, trx_id, gtid } => {
                    out.writes += 1;
                    if trx_id.is_some() || gtid.is_some() {
                        self.bl.add_commit(
                            &mut batch,
                            &BinlogEntry {
                                commit_ht: rec.ht,
                                tablet: tablet.clone(),
                                trx_id: *trx_id,
                                gtid: *gtid,
                                txn: None,
                                tablets: vec![tablet.clone()],
                            },
                        )?;
                        out.binlog += 1;
                    }
                    let ops = ops.iter().map(|op| (&op.key[..], &op.value));
                    out.ops += mvcc::write(&mut batch, &self.t.mvcc, ops, rec.ht, &mut key_buf);
                }
                Body::Intent { txn, trx_id, .. } => {
                    out.intents += 1;
                    let st = self.txns.txn_entry(g, txns, txn)?;
                    let list = st.intents.entry(tablet.clone()).or_default();
                    let r = IntentRef {
                        pos: *pos,
                        ht: rec.ht,
                    };
                    if let Err(i) = list.binary_search(&r) {
                        list.insert(i, r);
                    }
                    if untraceable_intent(st.trx_id, *trx_id) {
                        // Committed already without a `txns` record: write one now.
                        if !st.untraceable && st.commit.is_some() {
                            late_records.push(*txn);
                        }
                        st.untraceable = true;
                    }
                    if trx_id.is_some() {
                        st.trx_id = *trx_id;
                    }
                    if let (Some(t), None, false, None) =
                        (st.trx_id, &st.commit, st.aborted, &st.open)
                    {
                        pending_opens.push(OpenOp::Set(
                            t,
                            TrxOpen {
                                ht: rec.ht,
                                kind: OpenKind::Pending,
                                txn: *txn,
                                tablet: tablet.clone(),
                            },
                        ));
                        st.open = Some((rec.ht, tablet.clone()));
                    }
                }
                Body::Commit {
                    txn,
                    participants,
                    trx_id,
                    gtid,
                } => {
                    out.commits += 1;
                    let st = self.txns.txn_entry(g, txns, txn)?;
                    if let Some(c) = &st.commit {
                        if c.commit_ht != rec.ht {
                            return Err(reject(
                                pos,
                                format!(
                                    "the commit of txn {txn} at ht {} contradicts an earlier commit at ht {} (tablet {}, position {})",
                                    rec.ht, c.commit_ht, c.tablet, c.pos
                                ),
                            ));
                        }
                    }
                    if st.aborted {
                        tracing::warn!(%tablet, %txn, %pos, "commit received for an aborted transaction");
                    }
                    let ci = CommitInfo {
                        commit_ht: rec.ht,
                        tablet: tablet.clone(),
                        pos: *pos,
                        participants: participants.clone(),
                    };
                    if st.commit.is_none() && !st.aborted {
                        out.new_commits.push((*txn, ci.clone()));
                        if let (Some((ht, t)), Some(id)) = (st.open.take(), st.trx_id) {
                            pending_opens.push(OpenOp::Clear(id, ht, t));
                        }
                        self.bl.add_commit(
                            &mut batch,
                            &BinlogEntry {
                                commit_ht: rec.ht,
                                tablet: tablet.clone(),
                                trx_id: trx_id.or(st.trx_id),
                                gtid: *gtid,
                                txn: Some(*txn),
                                tablets: participants.clone(),
                            },
                        )?;
                        out.binlog += 1;
                    }
                    st.commit = Some(ci);
                    if trx_id.is_some() {
                        // Committed under another trx id than its intents carry.
                        if untraceable_intent(st.trx_id, *trx_id) {
                            st.untraceable = true;
                        }
                        st.trx_id = *trx_id;
                    }
                    if gtid.is_some() {
                        st.gtid = *gtid;
                    }
                }
                Body::Abort { txn, trx_id } => {
                    out.aborts += 1;
                    let st = self.txns.txn_entry(g, txns, txn)?;
                    if st.commit.is_some() {
                        tracing::warn!(%tablet, %txn, %pos, "abort received for a committed transaction");
                    } else if !st.aborted {
                        if let (Some((ht, t)), Some(id)) = (st.open.take(), st.trx_id) {
                            pending_opens.push(OpenOp::Clear(id, ht, t));
                        }
                        if let Some(id) = trx_id.or(st.trx_id) {
                            self.bl.add_open(
                                &mut opens,
                                id,
                                TrxOpen {
                                    ht: rec.ht,
                                    kind: OpenKind::Aborted,
                                    txn: *txn,
                                    tablet: tablet.clone(),
                                },
                            )?;
                        }
                    }
                    st.aborted = true;
                    if trx_id.is_some() {
                        st.trx_id = *trx_id;
                    }
                }
                Body::Heartbeat => out.heartbeats += 1,
            }
        }

        match expected {
            // Something applied: end_pos must be where the last record ended.
            Some(e) if out.records > 0 => {
                if end_pos != e {
                    return Err(Error::Invalid(format!(
                        "tablet {tablet}: end position {end_pos} is not the end {e} of the last record"
                    )));
                }
            }
            _ => {
                if end_pos > start {
                    return Err(Error::Gap {
                        tablet: tablet.clone(),
                        expected: start,
                        got: end_pos,
                    });
                }
                // Nothing new: a pure replay.
                out.applied_pos = start;
                out.safe_time = meta.safe_time;
                return Ok(Prepared {
                    batch: None,
                    opens: Vec::new(),
                    out,
                });
            }
        }

        // A `txns` record is written when the transaction is aborted (the abort, or intents
        // arriving after it, so that the record's intents bound what binlog retention may
        // prune; see `prune.rs`), and when it commits with an intent the `trx` index
        // cannot lead back to (`untraceable`). An undecided transaction, or one committed
        // under the trx id of all its intents, is not written: its intents are in the
        // received logs, its commit in the binlog and the `trx` index, and `rebuild.rs`
        // finds them there after a restart (one LSM put fewer per transaction: ~15 % more
        // transactions per second at the maximum, BENCHMARKS.md).
        let committed = out
            .new_commits
            .iter()
            .map(|(t, _)| t)
            .filter(|t| {
                txns.get(t)
                    .is_some_and(|st| st.untraceable || st.trx_id.is_none())
            })
            .chain(late_records.iter());
        let aborted = txns.iter().filter(|(_, st)| st.aborted).map(|(t, _)| t);
        for txn in committed.chain(aborted) {
            if let Some(st) = txns.get(txn) {
                batch.insert(&self.txns.ks, txn.0.to_vec(), encode_txn(st)?);
                if st.aborted {
                    batch.insert(&self.txns.aborted, txn.0.to_vec(), Vec::new());
                    // Before the commit: the filter may say yes too early, never no.
                    self.txns.note_aborted(txn);
                }
            }
        }
        self.bl.write_open(&mut batch, opens);
        meta.applied_pos = end_pos;
        meta.applied_records += out.records;
        self.meta.put_tablet(&mut batch, tablet, &meta)?;
        out.applied_pos = meta.applied_pos;
        out.safe_time = meta.safe_time;
        Ok(Prepared {
            batch: Some(batch),
            opens: pending_opens,
            out,
        })
    }

    /// [`super::Store::apply_part`] for several parts of `tablet` in **one** atomic batch
    /// (one lock, one journal write). Returns how many were applied (not already applied in
    /// this process: applied parts are tracked in the cache of unresolved transactions, and
    /// a restart re-applies the parts of the transactions still pending, idempotently).
    pub(super) fn apply_parts(
        &self,
        tablet: &TabletId,
        parts: &[Part],
        durability: Durability,
    ) -> Result<usize> {
        self.t.write_stall();
        self.apply_parts_inner(tablet, parts, durability)
            .inspect_err(|_| self.txns.mark_cache_incomplete())
    }

    fn apply_parts_inner(
        &self,
        tablet: &TabletId,
        parts: &[Part],
        durability: Durability,
    ) -> Result<usize> {
        let mut g = self.txns.cache_lock();
        let mut batch = self.t.batch();
        let mut updated: Vec<(TxnId, TxnState)> = Vec::with_capacity(parts.len());
        let mut applied = 0;
        let mut key_buf = Vec::new();
        let mut failed = None;
        for p in parts {
            // Moved out of the cache (see `Txns::txn_entry`), put back after the commit.
            let mut st = match g.remove(&p.txn) {
                Some(st) => st,
                None => match self.txns.settled_txn(&p.txn) {
                    Ok(Some(st)) => st,
                    Ok(None) => {
                        failed = Some(Error::Invalid(format!(
                            "tablet {tablet}: part of unknown txn {}",
                            p.txn
                        )));
                        break;
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                },
            };
            if st.applied_parts.contains(tablet) {
                // Nothing to write; goes back to the cache unchanged.
                updated.push((p.txn, st));
                continue;
            }
            // The apply stage refuses such intents when it reads them (`check_record`);
            // this keeps an insert that would panic out of the batch all the same.
            let first = st
                .intents
                .get(tablet)
                .and_then(|l| l.first())
                .map_or(WalPos::ZERO, |r| r.pos);
            let ops = p.ops.iter().map(|(k, v)| (&k[..], v.as_deref()));
            if let Err(e) = check_ops(tablet, first, ops) {
                updated.push((p.txn, st));
                failed = Some(e);
                break;
            }
            applied += 1;
            let ops = p.ops.iter().map(|(k, v)| (&k[..], v));
            mvcc::write(&mut batch, &self.t.mvcc, ops, p.commit_ht, &mut key_buf);
            st.applied_parts.insert(tablet.clone());
            // Applied parts are tracked in memory only: neither `txns` is rewritten nor the
            // `pending` entry removed once all are (the safe time passing the commit makes
            // it stale; see `Meta::pending_floor`). After a crash the parts of every
            // transaction still pending are applied again, which writes the same versions
            // at the same ht (idempotent).
            updated.push((p.txn, st));
        }
        // Back into the cache even when the batch fails (the only copy of their intents;
        // the parts marked applied are applied again after a restart, idempotently); the
        // next batch is prepared while this one commits (see `Txns::hand_over`).
        let committing = failed.is_none() && applied > 0;
        let _committing = self.txns.hand_over(g, updated, committing);
        match failed {
            Some(e) => Err(e),
            None if committing => self.t.commit(batch, durability).map(|()| applied),
            None => Ok(applied),
        }
    }
}
