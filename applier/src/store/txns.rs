//! The transactions the store is still deciding about ([`Txns`]): the cache of unresolved
//! transactions behind the write lock, the commit order that lets the next apply batch be
//! prepared while this one commits, the pending `trx_open` entries, and the `txns` and
//! `aborted` keyspaces that hold the decided ones (drawn in `applier/STORE.md`, "`txns`",
//! "`aborted`" and "Unresolved transactions").
//!
//! ```text
//!  write lock (cache) ─► prepare a batch (batch.rs) ─► hand_over: commit order taken,
//!                                                     write lock let go ─► commit
//!                                                     (next batch prepared meanwhile)
//! ```
//!
//! Everything that must see the store and the cache agree takes both ([`Txns::lock`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use fjall::Keyspace;
use tidelog_wal::{HybridTime, TabletId, TrxId, TxnId, WalPos};

use super::binlog::Binlog;
use super::bloom::IdFilter;
use super::codec::decode_txn;
use super::schema::TXNS;
use super::types::{IntentRef, TrxOpen, TxnState};
use crate::error::{Error, Result};

/// The unresolved transactions and the keyspaces of the decided ones.
pub(super) struct Txns {
    /// `txns`: the records of decided transactions (see `batch.rs` for which are written).
    pub(super) ks: Keyspace,
    /// `aborted`: the aborted transactions' ids.
    pub(super) aborted: Keyspace,
    /// Every txn id in `aborted` (or in a batch about to write it there), and rarely one
    /// that is not: a new transaction's first intent is told from a late intent of an
    /// aborted one without searching the keyspace (that search was 9 % of the apply
    /// thread at the maximum rate, BENCHMARKS.md). Rebuilt at open. Taken only under the
    /// write lock.
    aborted_filter: Mutex<IdFilter>,
    /// Serializes read-modify-write of `txns` and `meta`, and guards the cache of unresolved
    /// transactions: every undecided one and every committed one not applied everywhere,
    /// with their intents. It is the only copy of an undecided transaction's state (nothing
    /// is written before the decision); opening the store rebuilds it from the received
    /// logs (`rebuild.rs`). Resolved ones leave it.
    write_lock: Mutex<HashMap<TxnId, TxnState>>,
    /// Orders store commits as the write lock ordered their preparation. Apply batches take
    /// it before letting go of the write lock and commit under it alone, so the next batch
    /// is prepared (decoding, transaction state, building the fjall batch) while this one's
    /// memtable inserts run — a two-stage pipeline instead of one lock over both. Everything
    /// else takes both ([`Txns::lock`]): store and cache then agree.
    commit_order: Mutex<()>,
    /// Transactions resolved by a batch whose commit is in flight: gone from the cache, not
    /// yet readable in the store. [`Txns::settled_txn`] looks here first.
    in_flight: Mutex<HashMap<TxnId, TxnState>>,
    /// Set when an apply batch failed after taking transactions out of the cache: the cache
    /// no longer lists every unresolved transaction, so received-log retention must not
    /// trust it until a restart.
    cache_incomplete: AtomicBool,
    /// The pending `trx_open` entries — trx id → its undecided transaction (intents, no
    /// decision) — in memory only: they change twice per transaction (set by its first
    /// intent, cleared by its decision), and writing them cost two LSM puts and two reads
    /// per transaction. Their durable form is the intents in the received logs: after a
    /// restart `rebuild.rs` puts them back with the undecided transactions they belong to.
    /// Aborted entries stay in the `trx_open` keyspace (binlog retention expires them).
    opens: Mutex<HashMap<TrxId, TrxOpen>>,
    /// Each tablet's received-log release when the store was opened (see
    /// [`Txns::note_released_parts`]).
    released_at_open: BTreeMap<TabletId, WalPos>,
}

/// A pending-entry change of one apply batch, in record order.
pub(super) enum OpenOp {
    Set(TrxId, TrxOpen),
    Clear(TrxId, HybridTime, TabletId),
}

/// [`Txns::lock`]'s guard: the cache, with the commit order held.
pub(super) struct Locked<'a> {
    cache: MutexGuard<'a, HashMap<TxnId, TxnState>>,
    _order: MutexGuard<'a, ()>,
}

impl std::ops::Deref for Locked<'_> {
    type Target = HashMap<TxnId, TxnState>;
    fn deref(&self) -> &Self::Target {
        &self.cache
    }
}

impl std::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.cache
    }
}

/// A batch between [`Txns::hand_over`] and the end of its commit.
pub(super) struct Committing<'a> {
    txns: &'a Txns,
    /// Resolved by the batch: in `in_flight` until the commit is done.
    settled: Vec<TxnId>,
    _order: MutexGuard<'a, ()>,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        // Before the commit order is let go (fields drop after this body).
        if !self.settled.is_empty() {
            let mut fl = self.txns.in_flight();
            for id in &self.settled {
                fl.remove(id);
            }
        }
    }
}

/// An intent carrying `carried` leaves transaction `known` untraceable through the `trx`
/// index (see [`TxnState::untraceable`]): it carries no trx id, or another one.
pub(super) fn untraceable_intent(known: Option<TrxId>, carried: Option<TrxId>) -> bool {
    carried.is_none() || known.is_some_and(|k| Some(k) != carried)
}

/// A transaction nothing will change any more: aborted, or committed and applied on every
/// participant.
fn resolved(st: &TxnState) -> bool {
    st.aborted
        || st
            .commit
            .as_ref()
            .is_some_and(|c| c.participants.iter().all(|p| st.applied_parts.contains(p)))
}

impl Txns {
    /// The transactions of a store whose keyspaces are `txns` and `aborted`, with an empty
    /// cache (`rebuild.rs` fills it) and the filter of aborted ids read from `aborted`.
    pub(super) fn open(
        ks: Keyspace,
        aborted: Keyspace,
        released_at_open: BTreeMap<TabletId, WalPos>,
    ) -> Result<Txns> {
        let mut aborted_filter = IdFilter::default();
        for g in aborted.iter() {
            aborted_filter.insert(&g.key().map_err(Error::store("read aborted"))?);
        }
        if !aborted_filter.is_empty() {
            tracing::info!(
                aborted = aborted_filter.len(),
                filter_bytes = aborted_filter.memory(),
                "filter of aborted transactions built"
            );
        }
        Ok(Txns {
            ks,
            aborted,
            aborted_filter: Mutex::new(aborted_filter),
            write_lock: Mutex::new(HashMap::new()),
            commit_order: Mutex::new(()),
            in_flight: Mutex::new(HashMap::new()),
            cache_incomplete: AtomicBool::new(false),
            opens: Mutex::new(HashMap::new()),
            released_at_open,
        })
    }

    // ---- locks ---------------------------------------------------------------------------

    /// The write lock and then the commit order: no apply batch is being prepared or
    /// committed, so the store and the cache agree.
    pub(super) fn lock(&self) -> Locked<'_> {
        let cache = self.cache_lock();
        let order = self.order_lock();
        Locked {
            cache,
            _order: order,
        }
    }

    pub(super) fn cache_lock(&self) -> MutexGuard<'_, HashMap<TxnId, TxnState>> {
        // A failed batch puts its transactions back (see `batch.rs`); a panic while
        // holding it can leave the cache incomplete, which a restart rebuilds.
        self.write_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn order_lock(&self) -> MutexGuard<'_, ()> {
        self.commit_order
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn in_flight(&self) -> MutexGuard<'_, HashMap<TxnId, TxnState>> {
        self.in_flight
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Ends the preparation of a batch under `cache` (the write lock): the batch's
    /// transactions go back to the cache (unresolved ones) or to `in_flight` (resolved
    /// ones, until the commit), the commit order is taken, and the write lock is let go.
    /// The caller commits while holding the returned guard; dropping it takes the resolved
    /// ones out of `in_flight` and lets the next batch commit.
    pub(super) fn hand_over<'a>(
        &'a self,
        mut cache: MutexGuard<'a, HashMap<TxnId, TxnState>>,
        txns: impl IntoIterator<Item = (TxnId, TxnState)>,
        committing: bool,
    ) -> Committing<'a> {
        let order = self.order_lock();
        let mut settled = Vec::new();
        {
            let mut fl = self.in_flight();
            for (txn, st) in txns {
                if !resolved(&st) {
                    cache.insert(txn, st);
                } else if committing {
                    settled.push(txn);
                    fl.insert(txn, st);
                }
            }
        }
        drop(cache);
        Committing {
            txns: self,
            settled,
            _order: order,
        }
    }

    /// An apply batch failed after taking transactions out of the cache.
    pub(super) fn mark_cache_incomplete(&self) {
        self.cache_incomplete.store(true, Ordering::Release);
    }

    /// Whether the cache may miss an unresolved transaction (see `cache_incomplete`).
    pub(super) fn cache_incomplete(&self) -> bool {
        self.cache_incomplete.load(Ordering::Acquire)
    }

    // ---- look-ups ------------------------------------------------------------------------

    /// What the store knows about `txn`: its `txns` record.
    pub(super) fn txn(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        match self.ks.get(txn.0).map_err(Error::store("read txns"))? {
            None => Ok(None),
            Some(v) => {
                let mut st =
                    decode_txn(&v).map_err(|r| Error::corrupt(TXNS, format!("txn {txn}"), r))?;
                self.note_released_parts(&mut st);
                Ok(Some(st))
            }
        }
    }

    /// The state of a transaction out of the cache: resolved by a batch still committing,
    /// else its `txns` record.
    pub(super) fn settled_txn(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        if let Some(st) = self.in_flight().get(txn) {
            return Ok(Some(st.clone()));
        }
        self.txn(txn)
    }

    /// What the store knows about `txn`, from the cache of unresolved transactions when it
    /// is there (no LSM read), else from `txns`.
    pub(super) fn txn_state(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        if let Some(st) = self.cache_lock().get(txn) {
            return Ok(Some(st.clone()));
        }
        self.settled_txn(txn)
    }

    /// For each of `txns`, its intent records on `tablet` (`None`: the store does not know
    /// the transaction), under one lock and without copying the rest of its state: what
    /// applying the transactions' parts on `tablet` reads back from the received log.
    pub(super) fn intents_on(
        &self,
        tablet: &TabletId,
        txns: &[TxnId],
    ) -> Result<Vec<Option<Vec<IntentRef>>>> {
        let on = |st: &TxnState| st.intents.get(tablet).cloned().unwrap_or_default();
        let mut out: Vec<Option<Option<Vec<IntentRef>>>> = {
            let g = self.cache_lock();
            txns.iter()
                .map(|t| g.get(t).map(|st| Some(on(st))))
                .collect()
        };
        // Out of the cache (read outside the lock): the stored record.
        for (txn, o) in txns.iter().zip(out.iter_mut()) {
            if o.is_none() {
                *o = Some(self.settled_txn(txn)?.as_ref().map(on));
            }
        }
        Ok(out.into_iter().flatten().collect())
    }

    /// Each tablet's received-log release when the store was opened (`rebuild::releases`).
    pub(super) fn released_at_open(&self) -> &BTreeMap<TabletId, WalPos> {
        &self.released_at_open
    }

    /// Marks the parts of a committed transaction's stored state that were applied before
    /// this process started, as far as the received logs tell: a release passes an intent
    /// only once its transaction's part on that tablet was applied and persisted, so a
    /// participant with an intent below its release at open has its part applied — and
    /// reading those intents again could fail, the log below the release being deleted.
    /// (Applied parts are otherwise tracked in memory only.)
    fn note_released_parts(&self, st: &mut TxnState) {
        if st.commit.is_none() || st.aborted {
            return;
        }
        for (t, list) in &st.intents {
            let released = self
                .released_at_open
                .get(t)
                .copied()
                .unwrap_or(WalPos::ZERO);
            if list.first().is_some_and(|i| i.pos < released) {
                st.applied_parts.insert(t.clone());
            }
        }
    }

    /// A transaction an apply batch meets that the cache does not hold: resolved by a batch
    /// still committing, aborted earlier (a late intent, or a repeated abort), or new
    /// (`None`). A committed transaction leaves the cache only once applied on every
    /// participant, which needs each one's safe time at its `commit_ht`, so all its intents
    /// (`ht < commit_ht`, the source's guarantee) were applied before: no record of it is
    /// looked for here, only the small `aborted` index — one search of `txns` per new
    /// transaction was 6 % of the applier's CPU at 25 000 txn/s (`BENCHMARKS.md`).
    fn first_seen(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        if let Some(st) = self.in_flight().get(txn) {
            return Ok(Some(st.clone()));
        }
        let maybe_aborted = self
            .aborted_filter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .may_contain(&txn.0);
        if !maybe_aborted
            || !self
                .aborted
                .contains_key(txn.0)
                .map_err(Error::store("read aborted"))?
        {
            return Ok(None);
        }
        self.txn(txn)
    }

    /// The state of `txn` for this batch, moved out of the cache of unresolved transactions
    /// (no copy; put back after the batch, also when it fails). Not in the cache: see
    /// [`Txns::first_seen`].
    pub(super) fn txn_entry<'a>(
        &self,
        unresolved: &mut HashMap<TxnId, TxnState>,
        cache: &'a mut HashMap<TxnId, TxnState>,
        txn: &TxnId,
    ) -> Result<&'a mut TxnState> {
        if !cache.contains_key(txn) {
            let st = match unresolved.remove(txn) {
                Some(st) => st,
                None => self.first_seen(txn)?.unwrap_or_default(),
            };
            cache.insert(*txn, st);
        }
        cache
            .get_mut(txn)
            .ok_or_else(|| Error::Invalid(format!("txn {txn} vanished from the apply cache")))
    }

    /// `txn` is about to be written to `aborted`: the filter says yes from now on (before
    /// the commit: it may say yes too early, never no).
    pub(super) fn note_aborted(&self, txn: &TxnId) {
        self.aborted_filter
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(&txn.0);
    }

    // ---- pending trx_open entries ----------------------------------------------------------

    pub(super) fn apply_open_ops(&self, ops: Vec<OpenOp>) {
        if ops.is_empty() {
            return;
        }
        let mut m = self.opens.lock().unwrap_or_else(|p| p.into_inner());
        for op in ops {
            match op {
                // A retry applied first from another tablet keeps its newer entry.
                OpenOp::Set(t, o) => {
                    if m.get(&t).is_none_or(|c| c.ht < o.ht) {
                        m.insert(t, o);
                    }
                }
                // Only the transaction that set the entry clears it.
                OpenOp::Clear(t, ht, tablet) => {
                    if m.get(&t).is_some_and(|c| c.ht == ht && c.tablet == tablet) {
                        m.remove(&t);
                    }
                }
            }
        }
    }

    /// The newest undecided or aborted transaction of trx id `t`: the pending entry in
    /// memory or the aborted one in `bl`'s `trx_open`, whichever has the higher ht.
    pub(super) fn open_trx(&self, bl: &Binlog, t: TrxId) -> Result<Option<TrxOpen>> {
        let mem = self
            .opens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&t)
            .cloned();
        let stored = bl.trx_open(t)?;
        Ok(match (mem, stored) {
            (Some(m), Some(s)) => Some(if m.ht >= s.ht { m } else { s }),
            (m, s) => m.or(s),
        })
    }

    // ---- memory --------------------------------------------------------------------------

    /// Unresolved transactions (the cache and the batches committing), pending `trx_open`
    /// entries, and the bytes of the filter of aborted ids.
    pub(super) fn memory(&self) -> (usize, usize, u64) {
        let (cache, txns) = {
            let g = self.cache_lock();
            (g.len(), self.in_flight.lock().map_or(0, |f| f.len()))
        };
        (
            cache + txns,
            self.opens.lock().map_or(0, |o| o.len()),
            self.aborted_filter.lock().map_or(0, |f| f.memory() as u64),
        )
    }
}
