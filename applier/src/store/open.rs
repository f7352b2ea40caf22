//! One opening of the store's fjall database ([`OpenStore`]): the parts it is made of,
//! how they are opened and rebuilt, and the calls the shared [`super::Store`]
//! (`reopen.rs`) makes on it. Each call is the part's own, or a short sequence of parts:
//! nothing here reads or writes a key itself.
//!
//! ```text
//!  OpenStore ─ tables: the database and its keyspaces (db.rs)
//!            ├ txns:   unresolved transactions, write lock, commit order (txns.rs)
//!            ├ meta:   tablet records, global safe time, role (meta.rs)
//!            ├ bl:     binlog and its indexes (binlog.rs)
//!            ├ cut:    the cutover's cut, reads capped at it (cutover.rs)
//!            ├ prune:  retention horizon and prune floor (prune.rs)
//!            └ rebuilt: what opening read back from the received logs (rebuild.rs)
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;

use tidelog_wal::{HybridTime, Record, TabletId, TrxId, TxnId, WalPos};

use super::batch::{self, Writer};
use super::binlog::Binlog;
use super::cutover::{self, Cut};
use super::db::{describe_open_error, StoreMemory, StoreOptions, Tables};
use super::meta::Meta;
use super::mvcc;
use super::prune::Prune;
use super::rebuild::{self, Rebuild, Rebuilt};
use super::txns::Txns;
use super::types::{
    ApplyOutcome, Cutover, CutoverReport, Durability, IntentRef, Part, RetentionFloor, Role,
    TabletMeta, TrxOpen, TxnState, Version,
};
use crate::error::{Error, Result};

/// One opening of the store's fjall database, with the in-memory state rebuilt when it was
/// opened. The [`super::Store`] users share goes through the current one and replaces it
/// with a fresh opening after a failed write (`reopen.rs`).
pub struct OpenStore {
    pub(super) tables: Tables,
    pub(super) txns: Txns,
    pub(super) meta: Meta,
    pub(super) bl: Binlog,
    pub(super) cut: Cut,
    prune: Prune,
    /// What opening rebuilt from the received logs.
    rebuilt: Rebuilt,
}

impl std::fmt::Debug for OpenStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStore").finish_non_exhaustive()
    }
}

impl OpenStore {
    /// Opens (creating if needed) the store with `opts` (block cache shared by every keyspace,
    /// memtable bound), and rebuilds the cache of unresolved transactions from the
    /// received logs. A failure is [`Error::Open`] naming the store's directory and what
    /// failed (a journal that does not recover names the journal files); a store locked by
    /// another process, a directory that cannot be created, or a full disk keeps its own
    /// error.
    pub(crate) fn open_with(data_dir: &Path, opts: &StoreOptions) -> Result<OpenStore> {
        let path = data_dir.join("store");
        Self::open_inner(data_dir, opts).map_err(|e| match e {
            e @ (Error::Open { .. } | Error::Io { .. } | Error::Invalid(_)) => e,
            e if e.is_no_space() => e,
            Error::Store { op, source } => Error::Open {
                detail: format!("{op}: {}", describe_open_error(&source, &path)),
                path,
            },
            e => Error::Open {
                path,
                detail: e.to_string(),
            },
        })
    }

    fn open_inner(data_dir: &Path, opts: &StoreOptions) -> Result<OpenStore> {
        let path = data_dir.join("store");
        std::fs::create_dir_all(&path).map_err(|source| Error::Io {
            op: "create directory",
            path: path.clone(),
            source,
        })?;
        // `mvcc` drops versions older than the retention horizon that no read can see.
        let horizon = Arc::new(AtomicU64::new(0));
        let tables = Tables::open(&path, opts, horizon.clone())?;
        let bl = Binlog {
            binlog: tables.binlog.clone(),
            trx: tables.trx.clone(),
            trx_open: tables.trx_open.clone(),
            gtid: tables.gtid.clone(),
            open_aborts: tables.open_aborts.clone(),
            visible: Default::default(),
        };
        let meta = Meta::open(tables.meta.clone())?;
        let cut = Cut::open(&meta)?;
        let prune = Prune::open(&meta, horizon)?;
        let received = data_dir.join("received");
        let tablets = meta.tablets()?;
        let released = rebuild::releases(&received, tablets.keys())?;
        let txns = Txns::open(tables.txns.clone(), tables.aborted.clone(), released)?;
        let mut store = OpenStore {
            tables,
            txns,
            meta,
            bl,
            cut,
            prune,
            rebuilt: Rebuilt::default(),
        };
        store.rebuilt = store.rebuild().unresolved(&received, tablets)?;
        if store.rebuilt.undecided + store.rebuilt.pending > 0 {
            tracing::info!(
                undecided = store.rebuilt.undecided,
                pending = store.rebuilt.pending,
                trx_ids = store.rebuilt.restored,
                records = store.rebuilt.records,
                "unresolved transactions rebuilt from the received logs"
            );
        }
        store.tables.flush_recovered_journal();
        Ok(store)
    }

    fn writer(&self) -> Writer<'_> {
        Writer {
            t: &self.tables,
            txns: &self.txns,
            meta: &self.meta,
            bl: &self.bl,
        }
    }

    pub(super) fn rebuild(&self) -> Rebuild<'_> {
        Rebuild {
            txns: &self.txns,
            bl: &self.bl,
            meta: &self.meta,
            cut: &self.cut,
        }
    }

    // ---- the database ----------------------------------------------------------------------

    /// The cut every read is capped at, once a cutover began.
    pub fn cut(&self) -> Option<HybridTime> {
        self.cut.get()
    }

    /// Makes everything committed so far durable (fsync of the journal).
    pub fn persist(&self) -> Result<()> {
        self.tables.persist()
    }

    /// Writes every keyspace's memtable out to tables and waits for it.
    pub fn flush(&self) -> Result<()> {
        self.tables.flush()
    }

    /// Loads the `trx_status` look-up keyspaces into the block cache (see
    /// `Tables::warm_lookup_cache`); stops early once `stop` is set.
    pub fn warm_lookup_cache(&self, stop: &AtomicBool) -> Result<u64> {
        self.tables.warm_lookup_cache(stop)
    }

    /// Whether fjall has no flush or compaction running or queued.
    pub fn background_idle(&self) -> bool {
        self.tables.background_idle()
    }

    /// On-disk bytes of the `trx_status` look-up keyspaces' tables (trx, gtid, trx_open).
    pub fn lookup_index_bytes(&self) -> u64 {
        self.tables.lookup_index_bytes()
    }

    /// On-disk bytes and table count (all levels, level 0) of each keyspace, by name.
    pub fn disk_sizes(&self) -> Vec<(&'static str, u64, usize, usize)> {
        self.tables.disk_sizes()
    }

    /// fjall's write pressure, for the log of a slow batch.
    pub fn lsm_pressure(&self) -> String {
        self.tables.lsm_pressure()
    }

    /// What the store holds in memory now (see [`StoreMemory`]).
    pub fn memory(&self) -> StoreMemory {
        let (unresolved_txns, open_trx, aborted_filter) = self.txns.memory();
        StoreMemory {
            unresolved_txns,
            open_trx,
            aborted_filter,
            ..self.tables.memory()
        }
    }

    // ---- meta ------------------------------------------------------------------------------

    /// The stored state of one tablet, if any.
    pub fn tablet(&self, tablet: &TabletId) -> Result<Option<TabletMeta>> {
        self.meta.tablet(tablet)
    }

    /// Every tablet the store knows (registered or applied), by id.
    pub fn tablets(&self) -> Result<BTreeMap<TabletId, TabletMeta>> {
        self.meta.tablets()
    }

    /// Marks `tablet` registered (announced by a shipper). Durable when it returns.
    pub fn register_tablet(&self, tablet: &TabletId) -> Result<()> {
        self.meta
            .update_tablet(&self.tables, &self.txns, tablet, |m| m.registered = true)
    }

    /// Records (or clears) the shipper that owns `tablet`. Durable when it returns.
    pub fn set_tablet_owner(&self, tablet: &TabletId, owner: Option<&str>) -> Result<()> {
        if owner.is_some_and(|o| o.len() > u8::MAX as usize) {
            return Err(Error::Invalid(format!(
                "owner of tablet {tablet} is longer than 255 bytes"
            )));
        }
        self.meta
            .update_tablet(&self.tables, &self.txns, tablet, |m| {
                m.owner = owner.map(str::to_owned)
            })
    }

    /// The persisted global safe time, if one was ever stored.
    pub fn global_safe_time(&self) -> Result<Option<HybridTime>> {
        self.meta.global_safe_time()
    }

    /// Raises the persisted global safe time to `ht` (never lowers it); returns the stored
    /// value afterwards (see `Meta::raise_global_safe_time`).
    pub fn raise_global_safe_time(
        &self,
        ht: HybridTime,
        durability: Durability,
    ) -> Result<HybridTime> {
        self.meta
            .raise_global_safe_time(&self.tables, ht, durability)
    }

    /// The persisted role (standby until a cutover stores another).
    pub fn role(&self) -> Result<Role> {
        self.meta.role()
    }

    /// Stores the role durably.
    pub fn set_role(&self, role: Role) -> Result<()> {
        self.meta.set_role(&self.tables, &self.txns, role)
    }

    // ---- binlog ----------------------------------------------------------------------------

    /// The binlog and its trx and gtid indexes (look-ups take no lock).
    pub fn binlog(&self) -> &Binlog {
        &self.bl
    }

    /// Binlog entries with `commit_ht` below this may have been removed by retention
    /// (`MIN`: none ever was). No store read: cached.
    pub fn binlog_horizon(&self) -> Result<HybridTime> {
        Ok(self.prune.horizon())
    }

    /// Retention: removes up to `max` binlog entries with `commit_ht < before` (see
    /// `Prune::expire_binlog`).
    pub fn expire_binlog(&self, before: HybridTime, max: usize) -> Result<(usize, bool)> {
        self.prune
            .expire_binlog(&self.tables, &self.txns, &self.meta, &self.bl, before, max)
    }

    /// See `Prune::set_floor`.
    pub fn set_prune_floor(&self, ht: HybridTime) {
        self.prune.set_floor(ht)
    }

    // ---- cutover ---------------------------------------------------------------------------

    /// The persisted cutover, if one began.
    pub fn cutover(&self) -> Result<Option<Cutover>> {
        cutover::cutover(&self.meta)
    }

    /// Phase 1 of a cutover (see `Cut::begin`).
    pub fn begin_cutover(&self, cut: HybridTime, cut_time_us: u64) -> Result<Cutover> {
        self.cut
            .begin(&self.tables, &self.txns, &self.meta, cut, cut_time_us)
    }

    /// Stores the cutover's report (phase 2), durably. Keeps an earlier report.
    pub fn save_cutover_report(&self, report: &CutoverReport) -> Result<Cutover> {
        cutover::save_report(&self.tables, &self.txns, &self.meta, report)
    }

    /// One step of the cutover's clean-up (see `cutover::cleanup_step`).
    pub fn cutover_cleanup_step(&self, max_scanned: usize) -> Result<(usize, usize, bool)> {
        cutover::cleanup_step(&self.tables, &self.txns, &self.meta, max_scanned)
    }

    /// Versions the cutover's clean-up has removed so far, over all its runs.
    pub fn cutover_removed(&self) -> Result<u64> {
        cutover::removed_so_far(&self.meta)
    }

    // ---- transactions ----------------------------------------------------------------------

    /// What the store knows about `txn` (see `Txns::txn_state`).
    pub fn txn_state(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        self.txns.txn_state(txn)
    }

    /// For each of `txns`, its intent records on `tablet` (see `Txns::intents_on`).
    pub fn intents_on(
        &self,
        tablet: &TabletId,
        txns: &[TxnId],
    ) -> Result<Vec<Option<Vec<IntentRef>>>> {
        self.txns.intents_on(tablet, txns)
    }

    /// The newest undecided or aborted transaction of trx id `t` (see `Txns::open_trx`).
    pub fn open_trx(&self, t: TrxId) -> Result<Option<TrxOpen>> {
        self.txns.open_trx(&self.bl, t)
    }

    /// What the store knows about `txn`: its `txns` record.
    pub fn txn(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        self.txns.txn(txn)
    }

    /// What opening rebuilt from the received logs.
    pub fn rebuilt(&self) -> Rebuilt {
        self.rebuilt
    }

    /// Committed transactions that may not be applied on every participant yet (see
    /// `Rebuild::pending_txns`).
    pub fn pending_txns(&self) -> Result<Vec<(TxnId, TxnState)>> {
        self.rebuild().pending_txns()
    }

    /// Per tablet, the lowest received-log position applying may still read (see
    /// `Rebuild::retention_floors`).
    pub fn retention_floors(&self) -> Result<Option<BTreeMap<TabletId, RetentionFloor>>> {
        self.rebuild().retention_floors()
    }

    // ---- apply -----------------------------------------------------------------------------

    /// Whether the store can take `rec` (see `batch::check_record`).
    pub fn check_record(tablet: &TabletId, pos: WalPos, rec: &Record) -> Result<()> {
        batch::check_record(tablet, pos, rec)
    }

    /// The cache of unresolved transactions may miss some: received-log retention stops
    /// trusting it until a reopen.
    pub(crate) fn mark_cache_incomplete(&self) {
        self.txns.mark_cache_incomplete()
    }

    /// Applies `records` of `tablet` in one atomic batch (see `Writer::apply`).
    pub fn apply(
        &self,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
        durability: Durability,
    ) -> Result<ApplyOutcome> {
        self.writer().apply(tablet, records, end_pos, durability)
    }

    /// Applies `tablet`'s part of the committed `txn`: its intents' `ops` (in log order)
    /// as versions at `commit_ht`, and records the part as applied, in one atomic batch.
    /// Idempotent: a part already applied is not written again (returns false).
    pub fn apply_part(
        &self,
        tablet: &TabletId,
        txn: &TxnId,
        commit_ht: HybridTime,
        ops: &[(Vec<u8>, Option<Vec<u8>>)],
        durability: Durability,
    ) -> Result<bool> {
        let part = Part {
            txn: *txn,
            commit_ht,
            ops: ops.to_vec(),
        };
        Ok(self.apply_parts(tablet, std::slice::from_ref(&part), durability)? == 1)
    }

    /// Several parts of `tablet` in one atomic batch (see `Writer::apply_parts`).
    pub fn apply_parts(
        &self,
        tablet: &TabletId,
        parts: &[Part],
        durability: Durability,
    ) -> Result<usize> {
        self.writer().apply_parts(tablet, parts, durability)
    }

    // ---- reads -----------------------------------------------------------------------------

    /// The newest version of `key` with ht ≤ `at` (newest of all for `None`), capped at the
    /// cut, by one seek.
    pub fn get(&self, key: &[u8], at: Option<HybridTime>) -> Result<Option<Version>> {
        mvcc::get(&self.tables.mvcc, key, self.cut.cap(at))
    }

    /// Per user key starting with `prefix`, ascending, the version visible at `at` (newest
    /// for `None`, capped at the cut), skipping deleted keys; at most `limit` entries and
    /// whether more visible keys follow. Reads one consistent snapshot.
    #[allow(clippy::type_complexity)]
    pub fn scan(
        &self,
        prefix: &[u8],
        at: Option<HybridTime>,
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>, HybridTime)>, bool)> {
        let at = self.cut.cap(at).unwrap_or(HybridTime::MAX);
        mvcc::scan(&self.tables.db, &self.tables.mvcc, prefix, at, limit)
    }
}
