//! The received logs as the durable form of the unresolved transactions (`applier/STORE.md`,
//! "Unresolved transactions" and "Pending commits"): opening the store puts every committed
//! transaction that may still be pending (read from the binlog) and every undecided one
//! (read back from the retained received logs) in the cache of unresolved transactions
//! ([`Rebuild::unresolved`]); the pending ones are listed again for the consistency core
//! ([`Rebuild::pending_txns`]); and what of each received log must stay retained follows
//! from the same cache ([`Rebuild::retention_floors`]).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tidelog_wal::{Body, ReadLimit, Reader, TabletId, TrxId, TxnId, WalPos};

use super::binlog::Binlog;
use super::cutover::Cut;
use super::meta::Meta;
use super::txns::{untraceable_intent, OpenOp, Txns};
use super::types::{
    BinlogEntry, CommitInfo, IntentRef, OpenKind, RetentionFloor, TabletMeta, TrxOpen, TxnState,
};
use crate::error::{Error, Result};

/// What opening the store found in the retained received logs (`Rebuild::unresolved`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// Records read.
    pub records: u64,
    /// Undecided transactions put back in the cache.
    pub undecided: usize,
    /// Committed transactions not applied everywhere, put back with their intents.
    pub pending: usize,
    /// Pending `trx_open` entries put back (undecided transactions with a trx id).
    pub restored: usize,
}

/// One transaction's intents read back from one tablet's received log while rebuilding.
#[derive(Default)]
struct ScannedTxn {
    intents: Vec<IntentRef>,
    /// The trx id they carry.
    trx_id: Option<TrxId>,
    /// One of them carries none, or another one (see [`TxnState::untraceable`]).
    untraceable: bool,
}

/// Transactions classified at once while rebuilding (memory bounded by the chunk; a
/// transaction spanning chunks is classified twice, harmlessly).
const REBUILD_CHUNK: usize = 65_536;

/// Tablet `t`'s release as its `acked` file in `dir` says (0: none written yet).
pub(crate) fn read_release(t: &TabletId, dir: &Path) -> Result<WalPos> {
    Ok(tidelog_wal::retention::read_acked(dir)
        .map_err(|source| Error::Wal {
            tablet: t.clone(),
            source,
        })?
        .unwrap_or(WalPos::ZERO))
}

/// Each of `tablets`' received-log release, for those with a directory under `received`.
pub(super) fn releases<'a>(
    received: &Path,
    tablets: impl IntoIterator<Item = &'a TabletId>,
) -> Result<BTreeMap<TabletId, WalPos>> {
    let mut out = BTreeMap::new();
    for t in tablets {
        let dir = received.join(t.as_str());
        if dir.is_dir() {
            out.insert(t.clone(), read_release(t, &dir)?);
        }
    }
    Ok(out)
}

/// The state of a committed transaction known only from its binlog entry: no intents yet
/// (the received logs add them), no part applied (applying one again is idempotent), and
/// the position of its commit record unknown (0).
fn committed_from_binlog(e: &BinlogEntry) -> TxnState {
    TxnState {
        commit: Some(CommitInfo {
            commit_ht: e.commit_ht,
            tablet: e.tablet.clone(),
            pos: WalPos::ZERO,
            participants: e.tablets.clone(),
        }),
        trx_id: e.trx_id,
        gtid: e.gtid,
        ..TxnState::default()
    }
}

/// What rebuilding reads: the parts of one opening of the store.
pub(super) struct Rebuild<'a> {
    pub(super) txns: &'a Txns,
    pub(super) bl: &'a Binlog,
    pub(super) meta: &'a Meta,
    pub(super) cut: &'a Cut,
}

impl Rebuild<'_> {
    /// Rebuilds the cache of unresolved transactions from the retained received logs under
    /// `received` (one directory per tablet), before anything applies. Undecided
    /// transactions and the intents of committed ones that arrive after their commit are
    /// not stored (see `batch.rs`); their intents are in the received logs, and every
    /// one a part may still need is retained: a tablet's release never passes the first
    /// intent of a transaction whose part there is not applied (`crate::retention`). So
    /// each tablet's log is read from its release up to its apply position (what lies
    /// above is applied again by its worker), and each transaction found is classified by
    /// its `txns` record, in chunks of at most [`REBUILD_CHUNK`] transactions:
    ///
    /// * no record: undecided (binlog retention keeps the record of a decided transaction
    ///   while its intents may still be retained — `prune.rs`) → cached, with its
    ///   pending `trx_open` entry when it carries a trx id;
    /// * committed and still pending → cached with its record, intents added;
    /// * aborted, or committed and applied everywhere → resolved, skipped.
    pub(super) fn unresolved(
        &self,
        received: &Path,
        tablets: BTreeMap<TabletId, TabletMeta>,
    ) -> Result<Rebuilt> {
        let mut out = Rebuilt {
            pending: self.preload_pending()?,
            ..Rebuilt::default()
        };
        let mut ops = Vec::new();
        for (t, m) in tablets {
            // No directory: nothing received (and no release).
            let Some(&release) = self.txns.released_at_open().get(&t) else {
                continue;
            };
            if m.applied_pos == WalPos::ZERO {
                continue;
            }
            let wal = |source| Error::Wal {
                tablet: t.clone(),
                source,
            };
            let mut r = Reader::open(received, &t, ReadLimit::Durable).map_err(wal)?;
            let start = release.max(r.oldest());
            if start >= m.applied_pos {
                continue;
            }
            r.seek(start).map_err(wal)?;
            let mut chunk: HashMap<TxnId, ScannedTxn> = HashMap::new();
            loop {
                // Not a record further: the one at the apply position may be one the apply
                // stage stopped at (it does not decode, or the store cannot take it), and
                // the tablet's fault, not the store's opening, must report it.
                let rec = if r.position() >= m.applied_pos {
                    None
                } else {
                    r.next().map_err(wal)?.filter(|(p, _)| *p < m.applied_pos)
                };
                let done = rec.is_none();
                if let Some((pos, rec)) = rec {
                    out.records += 1;
                    if let Body::Intent { txn, trx_id, .. } = rec.body {
                        let e = chunk.entry(txn).or_default();
                        e.intents.push(IntentRef { pos, ht: rec.ht });
                        if untraceable_intent(e.trx_id, trx_id) {
                            e.untraceable = true;
                        }
                        e.trx_id = trx_id.or(e.trx_id);
                    }
                }
                if done || chunk.len() >= REBUILD_CHUNK {
                    self.chunk(&t, chunk.drain(), &mut ops, &mut out)?;
                }
                if done {
                    break;
                }
            }
            tracing::info!(tablet = %t, from = %start, to = %m.applied_pos,
                "received log read for the transactions applied before this start");
        }
        out.restored = ops.len();
        self.txns.apply_open_ops(ops);
        Ok(out)
    }

    fn chunk(
        &self,
        tablet: &TabletId,
        chunk: impl Iterator<Item = (TxnId, ScannedTxn)>,
        ops: &mut Vec<OpenOp>,
        out: &mut Rebuilt,
    ) -> Result<()> {
        let mut g = self.txns.lock();
        for (txn, scanned) in chunk {
            let ScannedTxn {
                intents,
                trx_id,
                untraceable,
            } = scanned;
            let st = match g.remove(&txn) {
                Some(st) => st,
                None => match self.txns.txn(&txn)? {
                    // Committed under its trx id (no record): every commit that may still
                    // be pending is in the cache already (`preload_pending`), so this one
                    // is applied everywhere, or discarded by a cutover.
                    None if self.committed_as(&txn, trx_id)? => continue,
                    None => {
                        out.undecided += 1;
                        TxnState::default()
                    }
                    Some(st) if st.aborted => continue,
                    Some(st) => match &st.commit {
                        // A record without a decision: written by an older version
                        // (its trx_open entry is put back below).
                        None => {
                            out.undecided += 1;
                            TxnState { open: None, ..st }
                        }
                        Some(c) => {
                            // Above the safe time (see `Meta::pending_floor`); on a
                            // promoted target nothing is pending (discarded by the cutover).
                            if c.commit_ht <= self.meta.pending_floor() || self.cut.get().is_some()
                            {
                                continue;
                            }
                            out.pending += 1;
                            st
                        }
                    },
                },
            };
            let mut st = st;
            let first = intents.first().copied();
            let list = st.intents.entry(tablet.clone()).or_default();
            for ir in intents {
                if let Err(i) = list.binary_search(&ir) {
                    list.insert(i, ir);
                }
            }
            // Restored with the intents read back (it is kept in memory only): a commit
            // after this restart is then recorded in `txns`.
            // (`trx_id` is `None` only when every intent carried none: `untraceable` then.)
            if untraceable || untraceable_intent(st.trx_id, trx_id) {
                st.untraceable = true;
            }
            st.trx_id = st.trx_id.or(trx_id);
            if let (Some(id), None, false, None, Some(first)) =
                (st.trx_id, &st.commit, st.aborted, &st.open, first)
            {
                ops.push(OpenOp::Set(
                    id,
                    TrxOpen {
                        ht: first.ht,
                        kind: OpenKind::Pending,
                        txn,
                        tablet: tablet.clone(),
                    },
                ));
                st.open = Some((first.ht, tablet.clone()));
            }
            g.insert(txn, st);
        }
        Ok(())
    }

    /// Whether the `trx` index holds a commit of `txn` under `trx_id`.
    pub(super) fn committed_as(&self, txn: &TxnId, trx_id: Option<TrxId>) -> Result<bool> {
        let Some(t) = trx_id else { return Ok(false) };
        Ok(self.bl.trx_commit(t)?.is_some_and(|c| c.txn == Some(*txn)))
    }

    /// Committed transactions that may not be applied on every participant yet, by commit
    /// ht: the distributed commits in the binlog above the global safe time (see
    /// `Meta::pending_floor`; some of them may be applied everywhere — applying a part again
    /// is idempotent). None on a promoted target: the cutover discarded them.
    pub(super) fn pending_txns(&self) -> Result<Vec<(TxnId, TxnState)>> {
        let mut out = Vec::new();
        if self.cut.get().is_some() {
            return Ok(out);
        }
        // Put in the cache at open (`preload_pending`), with the intents the received logs
        // still hold.
        let g = self.txns.cache_lock();
        for (txn, e) in self.bl.distributed_above(self.meta.pending_floor())? {
            let st = match g.get(&txn) {
                Some(st) => Some(st.clone()),
                None => self.committed_state(&txn, &e)?,
            };
            out.extend(st.map(|st| (txn, st)));
        }
        Ok(out)
    }

    /// The state of `txn`, committed by binlog entry `e`: its `txns` record when it has one
    /// with the commit, else what the entry says; `None` when the record says it aborted.
    fn committed_state(&self, txn: &TxnId, e: &BinlogEntry) -> Result<Option<TxnState>> {
        Ok(match self.txns.txn(txn)? {
            Some(st) if st.aborted => None,
            Some(st) if st.commit.is_some() => Some(st),
            _ => Some(committed_from_binlog(e)),
        })
    }

    /// Puts every committed transaction that may still be pending (the distributed commits
    /// in the binlog above the persisted safe time; none on a promoted target) in the cache
    /// before the received logs are read back: a transaction committed under the trx id of
    /// all its intents has no `txns` record, so this is where its commit is known from.
    fn preload_pending(&self) -> Result<usize> {
        if self.cut.get().is_some() {
            return Ok(0);
        }
        let mut g = self.txns.lock();
        let mut n = 0;
        for (txn, e) in self.bl.distributed_above(self.meta.pending_floor())? {
            if g.contains_key(&txn) {
                continue;
            }
            if let Some(st) = self.committed_state(&txn, &e)? {
                g.insert(txn, st);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Per tablet, the lowest received-log position applying may still read: the apply
    /// position, or the first intent there of an unresolved transaction whose part on that
    /// tablet is not applied yet, whichever is lower. The cache holds every unresolved
    /// transaction (rebuilt at open from the retained logs), and this is taken under the
    /// write lock, so apply positions and the cache agree. `None` when the cache cannot be
    /// trusted (an apply batch failed; see `Txns::cache_incomplete`).
    pub(super) fn retention_floors(&self) -> Result<Option<BTreeMap<TabletId, RetentionFloor>>> {
        let g = self.txns.lock();
        if self.txns.cache_incomplete() {
            return Ok(None);
        }
        let mut out: BTreeMap<TabletId, RetentionFloor> = self
            .meta
            .tablets()?
            .into_iter()
            .map(|(t, m)| {
                let f = RetentionFloor {
                    applied_pos: m.applied_pos,
                    safe_time: m.safe_time,
                    intent: None,
                };
                (t, f)
            })
            .collect();
        for (txn, st) in g.iter() {
            if st.aborted {
                continue;
            }
            for (t, list) in &st.intents {
                if st.applied_parts.contains(t) {
                    continue;
                }
                if let Some(first) = list.first() {
                    let f = out.entry(t.clone()).or_default();
                    if f.intent.is_none_or(|(i, _)| first.pos < i.pos) {
                        f.intent = Some((*first, *txn));
                    }
                }
            }
        }
        Ok(Some(out))
    }
}
