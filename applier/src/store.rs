//! `Store`: the applier's fjall database — MVCC data, transactions and meta (layouts:
//! `applier/STORE.md`).
//!
//! One fjall [`Database`] under `data_dir/store/` with three keyspaces (layouts drawn in
//! `applier/STORE.md`):
//!
//! * `mvcc`: [`keys::encode`]`(key, ht)` → `00` (tombstone) or `01 ‖ value`.
//! * `txns`: txn id (16 bytes) → [`TxnState`]: per tablet the positions of its intents in
//!   the received log, the commit if one was seen, the aborted flag, trx_id and gtid. Intent
//!   ops are not copied: the received log holds them durably.
//! * `meta`: `tablet/<id>` → [`TabletMeta`]; `global/safe_time`; `global/role`.
//!
//! [`Store::apply`] writes everything a run of records of one tablet implies — data,
//! transaction state and the tablet's new apply position — in **one** atomic fjall batch, so
//! after a crash the store is at some batch boundary and the apply position says exactly
//! which records it holds. Records below that position are skipped: nothing is applied twice.
//!
//! Read-modify-write of `txns` and `meta` (a transaction's record is touched by the apply
//! workers of all its participants and its status tablet) is serialized by one mutex held
//! while a batch is built and committed; reads take no lock.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use fjall::config::{
    BlockSizePolicy, CompressionPolicy, HashRatioPolicy, PartitioningPolicy, PinningPolicy,
};
use fjall::{Database, Keyspace, KeyspaceCreateOptions, PersistMode, Readable};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{
    Body, Gtid, HybridTime, ReadLimit, Reader, Record, TabletId, TrxId, TxnId, WalPos,
};

use crate::binlog::{self, Binlog, BinlogEntry, OpenEdits, OpenKind, TrxOpen};
use crate::bloom::IdFilter;
use crate::error::{Error, Result};
use crate::history::HistoryFactory;
use crate::keys;
use crate::write_buffer::WriteBuffer;

mod reopen;
pub use reopen::{BinlogRef, Store, REOPEN_MIN_FREE};

/// The default block cache: 256 MiB (fjall's own default is 32 MiB).
pub const DEFAULT_CACHE_SIZE: u64 = 256 << 20;

pub use crate::write_buffer::{WriteBufferStats, DEFAULT_WRITE_BUFFER_SIZE, MIN_WRITE_BUFFER_SIZE};

/// How the store is opened: its memory (see `STORE.md`, "Memory").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// The block cache, shared by every keyspace (`cache-size`).
    pub cache_size: u64,
    /// The bound on all memtables together (`write-buffer-size`, [`crate::write_buffer`]).
    pub write_buffer_size: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            cache_size: DEFAULT_CACHE_SIZE,
            write_buffer_size: DEFAULT_WRITE_BUFFER_SIZE,
        }
    }
}

/// Keyspace names.
pub const MVCC: &str = "mvcc";
pub const TXNS: &str = "txns";
/// The aborted transactions (txn id → ``): what tells a new transaction from a late intent
/// of an aborted one without searching `txns`.
pub const ABORTED: &str = "aborted";
pub const META: &str = "meta";

/// Filter and index blocks of the keyspaces searched by id (`trx`, `trx_open`, `gtid`,
/// `aborted`): pinned in memory on level 0 (bounded by the write buffer), in partitions read
/// through the block cache below it (bounded by `cache-size`).
fn lookup_index_options(o: KeyspaceCreateOptions) -> KeyspaceCreateOptions {
    o.filter_block_pinning_policy(PinningPolicy::new([true, false]))
        .index_block_pinning_policy(PinningPolicy::new([true, false]))
        .filter_block_partitioning_policy(PartitioningPolicy::new([false, true]))
        .index_block_partitioning_policy(PartitioningPolicy::new([false, true]))
}

/// Memtable size of the `aborted` keyspace.
const ABORTED_MEMTABLE: u64 = 2 << 20;

/// Prefix of per-tablet keys in `meta`.
const TABLET_PREFIX: &[u8] = b"tablet/";
const GLOBAL_SAFE_TIME: &[u8] = b"global/safe_time";
const GLOBAL_ROLE: &[u8] = b"global/role";
const BINLOG_HORIZON: &[u8] = b"global/binlog_horizon";
const CUTOVER: &[u8] = b"global/cutover";
const CUTOVER_CURSOR: &[u8] = b"global/cutover_cursor";
const CUTOVER_REMOVED: &[u8] = b"global/cutover_removed";

const VALUE_TOMBSTONE: u8 = 0;
const VALUE_PUT: u8 = 1;
const FORMAT_VERSION: u8 = 1;

/// When an apply batch is on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync (fdatasync) the journal before `apply` returns.
    Sync,
    /// Written to OS buffers; made durable by a later [`Store::persist`] (or a later
    /// `Sync` batch: the journal is one sequential file).
    #[default]
    Buffered,
}

/// The target's role (docs/ARCHITECTURE.md, "Cutover").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    /// Receiving and applying shipped logs.
    #[default]
    Standby,
    /// Promoted by a cutover; every answer is final.
    Primary,
}

/// Per-tablet state kept in `meta`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TabletMeta {
    /// End of the last record applied from the received log (0: nothing applied yet).
    pub applied_pos: WalPos,
    /// ht of the last applied record or heartbeat (0 if none).
    pub safe_time: HybridTime,
    /// Announced by a shipper (persisted).
    pub registered: bool,
    /// Identity of the shipper that owns the tablet, if recorded.
    pub owner: Option<String>,
    /// Records applied from the received log, ever (each exactly once; a replay skipped by
    /// the apply position does not count).
    pub applied_records: u64,
}

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// `None`: the key was deleted at `ht`.
    pub value: Option<Vec<u8>>,
    pub ht: HybridTime,
}

/// One keyspace's share of [`StoreMemory`] (bytes unless said otherwise).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyspaceMemory {
    pub name: &'static str,
    /// Active and sealed memtables, and older ones still referenced by a retained version.
    pub memtables: u64,
    pub active_memtable: u64,
    /// Sealed memtables waiting for their flush (a count).
    pub sealed_memtables: usize,
    /// Superseded versions (lists of tables and memtables) kept for open snapshots (a count).
    pub old_versions: usize,
    pub pinned_filters: u64,
    pub pinned_indexes: u64,
}

/// What the store holds in memory, by part (bytes unless said otherwise).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreMemory {
    /// Blocks in the block cache, and its capacity (`cache-size`).
    pub block_cache: u64,
    pub block_cache_capacity: u64,
    /// fjall's count of memtable bytes not yet flushed, over all keyspaces.
    pub write_buffer: u64,
    /// The bound on it and what keeping to it cost.
    pub write_buffer_stats: WriteBufferStats,
    /// Journal files (a count).
    pub journals: usize,
    pub keyspaces: Vec<KeyspaceMemory>,
    /// Transactions in the cache of unresolved ones (a count).
    pub unresolved_txns: usize,
    /// Pending `trx_open` entries (a count).
    pub open_trx: usize,
    /// The Bloom filter of aborted transactions.
    pub aborted_filter: u64,
}

/// Where one intent record of a transaction lies in a tablet's received log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IntentRef {
    pub pos: WalPos,
    pub ht: HybridTime,
}

/// A commit record seen for a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    pub commit_ht: HybridTime,
    /// The (status) tablet whose log carried the commit, and its position there.
    pub tablet: TabletId,
    pub pos: WalPos,
    pub participants: Vec<TabletId>,
}

/// What the store knows about a distributed transaction.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TxnState {
    /// Per participant tablet, its intent records, ascending by position.
    pub intents: BTreeMap<TabletId, Vec<IntentRef>>,
    pub commit: Option<CommitInfo>,
    pub aborted: bool,
    pub trx_id: Option<TrxId>,
    pub gtid: Option<Gtid>,
    /// Participants whose part (intents applied at commit_ht) is in `mvcc`.
    pub applied_parts: std::collections::BTreeSet<TabletId>,
    /// The `trx_open` entry (ht, tablet of the intent) that marks this undecided
    /// transaction under its trx id; removed when the decision arrives.
    pub open: Option<(HybridTime, TabletId)>,
    /// In memory only: an intent of this transaction was seen without its trx id (or with
    /// another one), so after a restart the `trx` index cannot tell that it committed; its
    /// commit is then recorded in `txns` (see `OpenStore::apply_locked`).
    pub untraceable: bool,
}

/// What keeps one tablet's received log (see [`Store::retention_floors`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionFloor {
    /// The tablet's apply position.
    pub applied_pos: WalPos,
    /// The tablet's safe time: the ht of the last record applied (every later one is
    /// higher).
    pub safe_time: HybridTime,
    /// The lowest first intent on the tablet of a cached transaction whose part there is
    /// not applied yet, and that transaction.
    pub intent: Option<(IntentRef, TxnId)>,
}

impl RetentionFloor {
    /// The lowest position still needed.
    pub fn pos(&self) -> WalPos {
        self.intent
            .map_or(self.applied_pos, |(i, _)| i.pos.min(self.applied_pos))
    }

    /// A lower bound of the ht of every record at or after [`RetentionFloor::pos`]: the
    /// intent's there, else just above the safe time (records not applied yet are newer).
    pub fn ht(&self) -> HybridTime {
        match self.intent {
            Some((i, _)) if i.pos < self.applied_pos => i.ht.min(self.safe_time),
            _ => self.safe_time.next(),
        }
    }
}

/// One participant's part of a committed transaction: its intents' ops on one tablet, to be
/// written at `commit_ht`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub txn: TxnId,
    pub commit_ht: HybridTime,
    pub ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// What one `apply` call did.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ApplyOutcome {
    /// Records applied by this call.
    pub records: u64,
    /// Records skipped because they lie below the stored apply position (a replay).
    pub skipped: u64,
    /// `write` records and their ops written to `mvcc`.
    pub writes: u64,
    pub ops: u64,
    pub intents: u64,
    pub commits: u64,
    pub aborts: u64,
    pub heartbeats: u64,
    /// Received-log bytes covered by the applied records.
    pub bytes: u64,
    /// The tablet's apply position and safe time after the call.
    pub applied_pos: WalPos,
    pub safe_time: HybridTime,
    /// Commit records applied by this call: the transaction and its commit.
    pub new_commits: Vec<(TxnId, CommitInfo)>,
    /// Binlog entries written (commits: `write`s with a trx_id or gtid, and `commit`s).
    pub binlog: u64,
}

/// One opening of the store's fjall database, with the in-memory state rebuilt when it was
/// opened. The [`Store`] users share goes through the current one and replaces it with a
/// fresh opening after a failed write (`store/reopen.rs`).
pub struct OpenStore {
    db: Database,
    mvcc: Keyspace,
    txns: Keyspace,
    aborted: Keyspace,
    /// Every txn id in `aborted` (or in a batch about to write it there), and rarely one
    /// that is not: a new transaction's first intent is told from a late intent of an
    /// aborted one without searching the keyspace (that search was 9 % of the apply
    /// thread at the maximum rate, BENCHMARKS.md). Rebuilt at open. Taken only under the
    /// write lock.
    aborted_filter: Mutex<IdFilter>,
    meta: Keyspace,
    bl: Binlog,
    /// The cutover's cut (0: none). Every read is capped at it.
    cut: std::sync::atomic::AtomicU64,
    /// `global/binlog_horizon`, cached (raised only by `expire_binlog`); shared with the
    /// `mvcc` history filter ([`crate::history`]).
    horizon: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Serializes read-modify-write of `txns` and `meta`, and guards the cache of unresolved
    /// transactions: every undecided one and every committed one not applied everywhere,
    /// with their intents. It is the only copy of an undecided transaction's state (nothing
    /// is written before the decision); [`OpenStore::open_with`] rebuilds it from the
    /// received logs.
    /// Resolved ones leave it.
    write_lock: Mutex<HashMap<TxnId, TxnState>>,
    /// Orders store commits as the write lock ordered their preparation. Apply batches take
    /// it before letting go of the write lock and commit under it alone, so the next batch
    /// is prepared (decoding, transaction state, building the fjall batch) while this one's
    /// memtable inserts run — a two-stage pipeline instead of one lock over both. Everything
    /// else takes both ([`OpenStore::lock`]): store and cache then agree.
    commit_order: Mutex<()>,
    /// Transactions resolved by a batch whose commit is in flight: gone from the cache, not
    /// yet readable in the store. [`OpenStore::settled_txn`] looks here first.
    in_flight: Mutex<HashMap<TxnId, TxnState>>,
    /// Set when an apply batch failed after taking transactions out of the cache: the cache
    /// no longer lists every unresolved transaction, so received-log retention must not
    /// trust it until a restart.
    cache_incomplete: std::sync::atomic::AtomicBool,
    /// Every tablet with a `meta` record. `tablets()` reads each by a point read instead of
    /// scanning the `tablet/` prefix: every apply batch rewrites its tablet's record, so the
    /// prefix holds thousands of versions per tablet until a flush, and a scan steps over all
    /// of them (20 ms after a few seconds of load, growing with the memtable) — under the
    /// store lock when retention asks.
    tablet_ids: Mutex<std::collections::BTreeSet<TabletId>>,
    /// The pending `trx_open` entries — trx id → its undecided transaction (intents, no
    /// decision) — in memory only: they change twice per transaction (set by its first
    /// intent, cleared by its decision), and writing them cost two LSM puts and two reads
    /// per transaction. Their durable form is the intents in the received logs: after a
    /// restart `rebuild_unresolved` puts them back with the undecided transactions they
    /// belong to. Aborted entries stay
    /// in the `trx_open` keyspace (binlog retention expires them).
    opens: Mutex<HashMap<TrxId, TrxOpen>>,
    /// The global safe time as last raised (`raise_global_safe_time`). Every transaction
    /// committed at or below it was applied everywhere and persisted before it was raised;
    /// the distributed commits above it are the ones that may still be pending
    /// ([`Store::pending_txns`], read from the binlog).
    pending_floor: std::sync::atomic::AtomicU64,
    /// See [`Store::set_prune_floor`] (0 until set: nothing pruned).
    prune_floor: std::sync::atomic::AtomicU64,
    /// What opening rebuilt from the received logs.
    rebuilt: Rebuilt,
    /// Each tablet's received-log release when the store was opened (see
    /// `note_released_parts`).
    released_at_open: BTreeMap<TabletId, WalPos>,
    /// Serializes [`Store::raise_global_safe_time`] (read, compare, write).
    global_lock: Mutex<()>,
    /// The bound on the memtables (`write-buffer-size`).
    write_buffer: WriteBuffer,
}

/// What [`OpenStore::open_with`] found in the retained received logs (`OpenStore::rebuild_unresolved`).
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

/// A batch between [`OpenStore::hand_over`] and the end of its commit.
struct Committing<'a> {
    store: &'a OpenStore,
    /// Resolved by the batch: in `in_flight` until the commit is done.
    settled: Vec<TxnId>,
    _order: MutexGuard<'a, ()>,
}

impl Drop for Committing<'_> {
    fn drop(&mut self) {
        // Before the commit order is let go (fields drop after this body).
        if !self.settled.is_empty() {
            let mut fl = self.store.in_flight();
            for id in &self.settled {
                fl.remove(id);
            }
        }
    }
}

/// [`OpenStore::lock`]'s guard: the cache, with the commit order held.
struct Locked<'a> {
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

/// A pending-entry change of one apply batch, in record order.
enum OpenOp {
    Set(TrxId, TrxOpen),
    Clear(TrxId, HybridTime, TabletId),
}

impl fmt::Debug for OpenStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenStore").finish_non_exhaustive()
    }
}

/// The name fjall gives its flush and compaction worker threads.
pub const WORKER_THREAD: &str = "fjall:worker";

/// Memtables recovered from the journal at least this large are flushed at once
/// ([`OpenStore::flush_recovered_journal`]).
const RECOVERED_FLUSH_MIN: u64 = 8 << 20;

/// Scans re-seek instead of stepping once they passed this many invisible versions of one key.
const RESEEK_AFTER: usize = 8;

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
            e if crate::disk::caused_by_no_space(&e) => e,
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
        let cache_size = opts.cache_size;
        let path = data_dir.join("store");
        std::fs::create_dir_all(&path).map_err(|source| Error::Io {
            op: "create directory",
            path: path.clone(),
            source,
        })?;
        // `mvcc` drops versions older than the retention horizon that no read can see.
        let horizon = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let h2 = horizon.clone();
        let db = Database::builder(&path)
            .cache_size(cache_size)
            .with_compaction_filter_factories(std::sync::Arc::new(move |name: &str| {
                type F = std::sync::Arc<dyn fjall::compaction::filter::Factory>;
                match name {
                    MVCC => Some(std::sync::Arc::new(HistoryFactory {
                        horizon: h2.clone(),
                    }) as F),
                    _ => None,
                }
            }))
            .open()
            .map_err(|e| match e {
                fjall::Error::Locked => Error::Invalid(format!(
                    "store {}: locked by another process (is another applier running with this data-dir?)",
                    path.display()
                )),
                e => Error::Store {
                    op: "open database",
                    source: e,
                },
            })?;
        let ks = |name: &'static str| {
            db.keyspace(name, KeyspaceCreateOptions::default)
                .map_err(Error::store("open keyspace"))
        };
        // The trx_status look-up keyspaces keep the filter and index blocks of their level-0
        // tables in memory (pinned), and those of deeper levels in partitions of one block,
        // read through the block cache: a random look-up over millions of ids reads (or
        // finds cached) one small filter partition, one index partition and at most one data
        // block per level, never a whole megabyte filter block. Pinned on every level, as
        // stores created before 2026-12-08 have them, they took ~3 bytes per retained
        // commit outside `cache-size`, growing with `binlog-retention` (`STORE.md`,
        // "Memory"). (Stored with the keyspace: applies to keyspaces created so.)
        // Their data blocks are one page (4 KiB), uncompressed and hash-indexed: a look-up
        // that misses the block cache reads, checksums and searches one page; one that hits
        // it searches an index a quarter the size of 1 KiB blocks' (fewer cache misses on
        // the binary search, which is most of a hit's cost once the block is cached).
        let lookup = |name: &'static str| {
            db.keyspace(name, || {
                let mut o = lookup_index_options(KeyspaceCreateOptions::default())
                    .data_block_compression_policy(CompressionPolicy::disabled())
                    .data_block_hash_ratio_policy(HashRatioPolicy::all(0.75));
                o.data_block_size_policy = BlockSizePolicy::all(4096);
                o
            })
            .map_err(Error::store("open keyspace"))
        };
        let (mvcc, txns, meta) = (ks(MVCC)?, ks(TXNS)?, ks(META)?);
        // Read once per new transaction (almost always a miss) and written once per abort:
        // small memtables, so that search stays in a few cache-resident levels, and filters
        // as the look-up keyspaces have them for the misses on disk.
        let aborted = db
            .keyspace(ABORTED, || {
                lookup_index_options(
                    KeyspaceCreateOptions::default().max_memtable_size(ABORTED_MEMTABLE),
                )
            })
            .map_err(Error::store("open keyspace"))?;
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
        let bl = Binlog {
            binlog: ks(binlog::BINLOG)?,
            trx: lookup(binlog::TRX)?,
            trx_open: lookup(binlog::TRX_OPEN)?,
            gtid: lookup(binlog::GTID)?,
            open_aborts: ks(binlog::OPEN_ABORTS)?,
            visible: Default::default(),
        };
        let mut store = OpenStore {
            db,
            mvcc,
            txns,
            aborted,
            aborted_filter: Mutex::new(aborted_filter),
            meta,
            bl,
            cut: std::sync::atomic::AtomicU64::new(0),
            horizon,
            write_lock: Mutex::new(HashMap::new()),
            commit_order: Mutex::new(()),
            in_flight: Mutex::new(HashMap::new()),
            cache_incomplete: std::sync::atomic::AtomicBool::new(false),
            tablet_ids: Mutex::new(Default::default()),
            opens: Mutex::new(HashMap::new()),
            prune_floor: std::sync::atomic::AtomicU64::new(0),
            pending_floor: std::sync::atomic::AtomicU64::new(0),
            rebuilt: Rebuilt::default(),
            released_at_open: BTreeMap::new(),
            global_lock: Mutex::new(()),
            write_buffer: WriteBuffer::new(opts.write_buffer_size),
        };
        let ids = store.scan_tablets()?.into_keys().collect();
        *store
            .tablet_ids
            .get_mut()
            .unwrap_or_else(|p| p.into_inner()) = ids;
        if let Some(c) = store.cutover()? {
            *store.cut.get_mut() = c.cut.0;
        }
        store.horizon.store(
            store.read_binlog_horizon()?.0,
            std::sync::atomic::Ordering::Release,
        );
        if let Some(g) = store.global_safe_time()? {
            store
                .pending_floor
                .store(g.0, std::sync::atomic::Ordering::Release);
        }
        let received = data_dir.join("received");
        let tablets = store.tablets()?;
        for t in tablets.keys() {
            let dir = received.join(t.as_str());
            if dir.is_dir() {
                let r = crate::retention::read_release(t, &dir)?;
                store.released_at_open.insert(t.clone(), r);
            }
        }
        store.rebuilt = store.rebuild_unresolved(&received, tablets)?;
        if store.rebuilt.undecided + store.rebuilt.pending > 0 {
            tracing::info!(
                undecided = store.rebuilt.undecided,
                pending = store.rebuilt.pending,
                trx_ids = store.rebuilt.restored,
                records = store.rebuilt.records,
                "unresolved transactions rebuilt from the received logs"
            );
        }
        store.flush_recovered_journal();
        Ok(store)
    }

    /// Sets the memtables that journal recovery refilled flushing in the background when
    /// they are large. Until they are flushed, the next opening replays the same journal
    /// again: an applier restarted over and over (a crash loop, SIGKILLs under load)
    /// otherwise replayed ever more of it at each start, and its starts grew from about a
    /// second to tens of seconds.
    fn flush_recovered_journal(&self) {
        let recovered = self.db.write_buffer_size();
        if recovered < RECOVERED_FLUSH_MIN {
            return;
        }
        let mut sealed = 0;
        for (name, ks) in self.keyspaces() {
            match ks.rotate_memtable() {
                Ok(true) => sealed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(keyspace = name, "sealing a recovered memtable: {e}"),
            }
        }
        tracing::info!(
            recovered_bytes = recovered,
            sealed,
            "memtables recovered from the journal are being flushed"
        );
    }

    /// The cut every read is capped at, once a cutover began.
    pub fn cut(&self) -> Option<HybridTime> {
        match self.cut.load(std::sync::atomic::Ordering::Acquire) {
            0 => None,
            c => Some(HybridTime(c)),
        }
    }

    /// `at` capped at the cut.
    fn cap(&self, at: Option<HybridTime>) -> Option<HybridTime> {
        match (self.cut(), at) {
            (Some(c), Some(a)) => Some(a.min(c)),
            (Some(c), None) => Some(c),
            (None, a) => a,
        }
    }

    /// The write lock and then the commit order: no apply batch is being prepared or
    /// committed, so the store and the cache agree.
    fn lock(&self) -> Locked<'_> {
        let cache = self.cache_lock();
        let order = self.order_lock();
        Locked {
            cache,
            _order: order,
        }
    }

    fn cache_lock(&self) -> MutexGuard<'_, HashMap<TxnId, TxnState>> {
        // A failed batch puts its transactions back (see `apply_inner`); a panic while
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

    /// The state of a transaction out of the cache: resolved by a batch still committing,
    /// else its `txns` record.
    fn settled_txn(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        if let Some(st) = self.in_flight().get(txn) {
            return Ok(Some(st.clone()));
        }
        self.txn(txn)
    }

    /// Ends the preparation of a batch under `cache` (the write lock): the batch's
    /// transactions go back to the cache (unresolved ones) or to `in_flight` (resolved
    /// ones, until the commit), the commit order is taken, and the write lock is let go.
    /// The caller commits while holding the returned guard; dropping it takes the resolved
    /// ones out of `in_flight` and lets the next batch commit.
    fn hand_over<'a>(
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
            store: self,
            settled,
            _order: order,
        }
    }

    /// Makes everything committed so far durable (fsync of the journal).
    pub fn persist(&self) -> Result<()> {
        self.db
            .persist(PersistMode::SyncAll)
            .map_err(Error::store("persist"))
    }

    /// Writes every keyspace's memtable out to tables and waits for it (the journal then
    /// holds nothing to replay). Used after bulk loads and before shutdown-free measurements.
    pub fn flush(&self) -> Result<()> {
        for (_, ks) in self.keyspaces() {
            ks.rotate_memtable_and_wait()
                .map_err(Error::store("flush memtable"))?;
        }
        Ok(())
    }

    /// Reads the `trx_status` look-up keyspaces (trx, gtid, trx_open) through once, which
    /// loads their data blocks into the block cache, so that look-ups then read no block
    /// from the file system. Worth it only while those keyspaces fit in `cache-size`
    /// ([`Store::disk_sizes`]). Returns the entries read.
    /// Stops early (between two blocks of entries) once `stop` is set.
    pub fn warm_lookup_cache(&self, stop: &std::sync::atomic::AtomicBool) -> Result<u64> {
        let mut n = 0u64;
        for ks in [&self.bl.trx, &self.bl.gtid, &self.bl.trx_open] {
            for g in ks.iter() {
                g.key().map_err(Error::store("warm the block cache"))?;
                n += 1;
                if n % 4096 == 0 && stop.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(n);
                }
            }
        }
        Ok(n)
    }

    /// Whether fjall has no flush or compaction running or queued.
    pub fn background_idle(&self) -> bool {
        self.db.outstanding_flushes() == 0 && self.db.active_compactions() == 0
    }

    /// On-disk bytes of the `trx_status` look-up keyspaces' tables (trx, gtid, trx_open).
    pub fn lookup_index_bytes(&self) -> u64 {
        [&self.bl.trx, &self.bl.gtid, &self.bl.trx_open]
            .iter()
            .map(|ks| ks.disk_space())
            .sum()
    }

    /// On-disk bytes and table count (all levels, level 0) of each keyspace, by name.
    pub fn disk_sizes(&self) -> Vec<(&'static str, u64, usize, usize)> {
        self.keyspaces()
            .into_iter()
            .map(|(n, ks)| (n, ks.disk_space(), ks.table_count(), ks.l0_table_count()))
            .collect()
    }

    /// fjall's write pressure, for the log of a slow batch: per keyspace with any, its sealed
    /// memtables and level-0 tables (fjall halts writes at 4 sealed memtables and slows
    /// them from 20 level-0 runs), then flushes queued, compactions running, journals.
    pub fn lsm_pressure(&self) -> String {
        let mut out = String::new();
        for (n, ks) in self.keyspaces() {
            let (sealed, l0) = (ks.sealed_memtable_count(), ks.l0_table_count());
            if sealed > 0 || l0 > 0 {
                out.push_str(&format!("{n}: sealed {sealed} L0 {l0}; "));
            }
        }
        out.push_str(&format!(
            "flushes queued {}, compactions {}, journals {}, write buffer {} MiB",
            self.db.outstanding_flushes(),
            self.db.active_compactions(),
            self.db.journal_count(),
            self.db.write_buffer_size() >> 20
        ));
        out
    }

    /// What the store holds in memory now (see [`StoreMemory`]).
    pub fn memory(&self) -> StoreMemory {
        use fjall::AbstractTree;
        let keyspaces = self
            .keyspaces()
            .into_iter()
            .map(|(name, ks)| {
                let t = &ks.tree;
                KeyspaceMemory {
                    name,
                    memtables: t.version_memtable_size_sum(),
                    active_memtable: t.active_memtable().size(),
                    sealed_memtables: ks.sealed_memtable_count(),
                    old_versions: t.version_free_list_len(),
                    pinned_filters: t.pinned_filter_size() as u64,
                    pinned_indexes: t.pinned_block_index_size() as u64,
                }
            })
            .collect();
        let (cache, txns) = {
            let g = self.cache_lock();
            (g.len(), self.in_flight.lock().map_or(0, |f| f.len()))
        };
        StoreMemory {
            write_buffer_stats: self.write_buffer.stats(),
            block_cache: self.db.cache_size(),
            block_cache_capacity: self.db.cache_capacity(),
            write_buffer: self.db.write_buffer_size(),
            journals: self.db.journal_count(),
            keyspaces,
            unresolved_txns: cache + txns,
            open_trx: self.opens.lock().map_or(0, |o| o.len()),
            aborted_filter: self.aborted_filter.lock().map_or(0, |f| f.memory() as u64),
        }
    }

    /// Every keyspace, with its name.
    fn keyspaces(&self) -> [(&'static str, &Keyspace); 9] {
        [
            (MVCC, &self.mvcc),
            (TXNS, &self.txns),
            (ABORTED, &self.aborted),
            (META, &self.meta),
            (binlog::BINLOG, &self.bl.binlog),
            (binlog::TRX, &self.bl.trx),
            (binlog::TRX_OPEN, &self.bl.trx_open),
            (binlog::GTID, &self.bl.gtid),
            (binlog::OPEN_ABORTS, &self.bl.open_aborts),
        ]
    }

    fn commit(&self, batch: fjall::OwnedWriteBatch, durability: Durability) -> Result<()> {
        let mode = match durability {
            Durability::Sync => PersistMode::SyncData,
            Durability::Buffered => PersistMode::Buffer,
        };
        batch
            .durability(Some(mode))
            .commit()
            .map_err(Error::store("commit batch"))?;
        self.write_buffer.after_commit(&self.db, &self.keyspaces());
        Ok(())
    }

    /// Waits while the memtables are above `write-buffer-size` and their flushes behind
    /// ([`WriteBuffer::stall`]); the apply paths call it before a batch, holding no lock.
    fn write_stall(&self) {
        self.write_buffer.stall(&self.db, &self.keyspaces());
    }

    // ---- meta ----------------------------------------------------------------------------

    fn tablet_key(tablet: &TabletId) -> Vec<u8> {
        [TABLET_PREFIX, tablet.as_str().as_bytes()].concat()
    }

    /// The stored state of one tablet, if any.
    pub fn tablet(&self, tablet: &TabletId) -> Result<Option<TabletMeta>> {
        let key = Self::tablet_key(tablet);
        match self.meta.get(&key).map_err(Error::store("read meta"))? {
            None => Ok(None),
            Some(v) => decode_tablet_meta(&v)
                .map(Some)
                .map_err(|r| Error::corrupt(META, format!("tablet {tablet}"), r)),
        }
    }

    /// Every tablet the store knows (registered or applied), by id.
    pub fn tablets(&self) -> Result<BTreeMap<TabletId, TabletMeta>> {
        let ids: Vec<TabletId> = self
            .tablet_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let mut out = BTreeMap::new();
        for id in ids {
            if let Some(m) = self.tablet(&id)? {
                out.insert(id, m);
            }
        }
        Ok(out)
    }

    /// `tablet` has a `meta` record now (called after the batch that wrote it).
    fn note_tablet(&self, tablet: &TabletId) {
        let mut ids = self.tablet_ids.lock().unwrap_or_else(|p| p.into_inner());
        if !ids.contains(tablet) {
            ids.insert(tablet.clone());
        }
    }

    /// Every tablet record in `meta`, by a scan of the `tablet/` prefix (at open).
    fn scan_tablets(&self) -> Result<BTreeMap<TabletId, TabletMeta>> {
        let mut out = BTreeMap::new();
        for g in self.meta.prefix(TABLET_PREFIX) {
            let (k, v) = g.into_inner().map_err(Error::store("scan meta"))?;
            let name = k.get(TABLET_PREFIX.len()..).unwrap_or_default();
            let id = std::str::from_utf8(name)
                .ok()
                .and_then(|s| s.parse::<TabletId>().ok())
                .ok_or_else(|| {
                    Error::corrupt(
                        META,
                        format!("key {}", name.escape_ascii()),
                        "not a valid tablet id",
                    )
                })?;
            let m = decode_tablet_meta(&v)
                .map_err(|r| Error::corrupt(META, format!("tablet {id}"), r))?;
            out.insert(id, m);
        }
        Ok(out)
    }

    fn update_tablet(&self, tablet: &TabletId, f: impl FnOnce(&mut TabletMeta)) -> Result<()> {
        let _g = self.lock();
        let mut m = self.tablet(tablet)?.unwrap_or_default();
        f(&mut m);
        let mut b = self.db.batch();
        b.insert(
            &self.meta,
            Self::tablet_key(tablet),
            encode_tablet_meta(&m)?,
        );
        self.commit(b, Durability::Sync)?;
        self.note_tablet(tablet);
        Ok(())
    }

    /// Marks `tablet` registered (announced by a shipper). Durable when it returns.
    pub fn register_tablet(&self, tablet: &TabletId) -> Result<()> {
        self.update_tablet(tablet, |m| m.registered = true)
    }

    /// Records (or clears) the shipper that owns `tablet`. Durable when it returns.
    pub fn set_tablet_owner(&self, tablet: &TabletId, owner: Option<&str>) -> Result<()> {
        if owner.is_some_and(|o| o.len() > u8::MAX as usize) {
            return Err(Error::Invalid(format!(
                "owner of tablet {tablet} is longer than 255 bytes"
            )));
        }
        self.update_tablet(tablet, |m| m.owner = owner.map(str::to_owned))
    }

    /// The persisted global safe time, if one was ever stored.
    pub fn global_safe_time(&self) -> Result<Option<HybridTime>> {
        match self
            .meta
            .get(GLOBAL_SAFE_TIME)
            .map_err(Error::store("read meta"))?
        {
            None => Ok(None),
            Some(v) => <[u8; 8]>::try_from(&v[..])
                .map(|b| Some(HybridTime(u64::from_le_bytes(b))))
                .map_err(|_| {
                    Error::corrupt(
                        META,
                        "global/safe_time",
                        format!("{} bytes, expected 8", v.len()),
                    )
                }),
        }
    }

    /// Raises the persisted global safe time to `ht` (never lowers it); returns the stored
    /// value afterwards.
    ///
    /// Only its own lock, not the store's: it touches neither the transaction cache nor
    /// anything an apply batch reads, and the batches a safe time covers finished their
    /// commit before it was computed, so its record follows them in the journal whatever
    /// batch is being prepared or committed meanwhile (taking the store lock made the
    /// publisher wait for that batch before each fsync).
    pub fn raise_global_safe_time(
        &self,
        ht: HybridTime,
        durability: Durability,
    ) -> Result<HybridTime> {
        let _g = self.global_lock.lock().unwrap_or_else(|p| p.into_inner());
        let cur = self.global_safe_time()?;
        if cur.is_some_and(|c| c >= ht) {
            return Ok(cur.unwrap_or(ht));
        }
        let mut b = self.db.batch();
        b.insert(&self.meta, GLOBAL_SAFE_TIME, ht.0.to_le_bytes().to_vec());
        self.commit(b, durability)?;
        self.pending_floor
            .fetch_max(ht.0, std::sync::atomic::Ordering::Release);
        Ok(ht)
    }

    /// The persisted role (standby until a cutover stores another).
    pub fn role(&self) -> Result<Role> {
        match self
            .meta
            .get(GLOBAL_ROLE)
            .map_err(Error::store("read meta"))?
        {
            None => Ok(Role::Standby),
            Some(v) => match &v[..] {
                [0] => Ok(Role::Standby),
                [1] => Ok(Role::Primary),
                other => Err(Error::corrupt(
                    META,
                    "global/role",
                    format!("unknown role bytes {:02x?}", other),
                )),
            },
        }
    }

    /// Stores the role durably.
    pub fn set_role(&self, role: Role) -> Result<()> {
        let _g = self.lock();
        let mut b = self.db.batch();
        let v: u8 = match role {
            Role::Standby => 0,
            Role::Primary => 1,
        };
        b.insert(&self.meta, GLOBAL_ROLE, vec![v]);
        self.commit(b, Durability::Sync)
    }

    // ---- binlog ----------------------------------------------------------------------------

    /// The binlog and its trx and gtid indexes (look-ups take no lock).
    pub fn binlog(&self) -> &Binlog {
        &self.bl
    }

    /// Binlog entries with `commit_ht` below this may have been removed by retention
    /// (`MIN`: none ever was). No store read: cached.
    pub fn binlog_horizon(&self) -> Result<HybridTime> {
        Ok(HybridTime(
            self.horizon.load(std::sync::atomic::Ordering::Acquire),
        ))
    }

    fn read_binlog_horizon(&self) -> Result<HybridTime> {
        match self
            .meta
            .get(BINLOG_HORIZON)
            .map_err(Error::store("read meta"))?
        {
            None => Ok(HybridTime::MIN),
            Some(v) => <[u8; 8]>::try_from(&v[..])
                .map(|b| HybridTime(u64::from_le_bytes(b)))
                .map_err(|_| {
                    Error::corrupt(
                        META,
                        "global/binlog_horizon",
                        format!("{} bytes, expected 8", v.len()),
                    )
                }),
        }
    }

    /// Retention: removes up to `max` binlog entries with `commit_ht < before`, their
    /// index entries and old aborts, in one batch, and raises the horizon. Returns the
    /// number of binlog entries removed and whether everything below `before` is gone.
    pub fn expire_binlog(&self, before: HybridTime, max: usize) -> Result<(usize, bool)> {
        let floor = self.prune_floor();
        let before = before.min(floor);
        let mut b = self.db.batch();
        let mut txns = Vec::new();
        let (n, done) = self.bl.expire(&mut b, before, max, &mut txns)?;
        // Their `txns` records go too (committed below safe time: applied everywhere, so
        // nothing reads them again); apply read-modify-writes `txns`, so under the lock.
        let _g = self.lock();
        if done {
            // Aborted `trx_open` entries, and their transactions' records.
            let mut ob = self.db.batch();
            let mut aborted = Vec::new();
            // An aborted transaction's intents may come after its abort (in ht too): its
            // record goes only once none of them can be retained.
            let prunable = |t: &TxnId| -> Result<bool> {
                Ok(self
                    .txn(t)?
                    .is_none_or(|st| st.intents.values().flatten().all(|i| i.ht < floor)))
            };
            self.bl
                .expire_open(&mut ob, before, &mut aborted, &prunable)?;
            for t in aborted {
                ob.remove(&self.txns, t.0.to_vec());
                ob.remove(&self.aborted, t.0.to_vec());
            }
            if !ob.is_empty() {
                self.commit(ob, Durability::Buffered)?;
            }
        }
        for t in txns {
            b.remove(&self.txns, t.0.to_vec());
        }
        let raise = n > 0 && before > self.binlog_horizon()?;
        if raise {
            b.insert(&self.meta, BINLOG_HORIZON, before.0.to_le_bytes().to_vec());
        }
        self.commit(b, Durability::Buffered)?;
        if raise {
            self.horizon
                .fetch_max(before.0, std::sync::atomic::Ordering::Release);
        }
        Ok((n, done))
    }

    // ---- cutover ---------------------------------------------------------------------------

    /// The persisted cutover, if one began.
    pub fn cutover(&self) -> Result<Option<Cutover>> {
        match self.meta.get(CUTOVER).map_err(Error::store("read meta"))? {
            None => Ok(None),
            Some(v) => decode_cutover(&v)
                .map(Some)
                .map_err(|r| Error::corrupt(META, "global/cutover", r)),
        }
    }

    /// Phase 1 of a cutover: caps every read at `cut`, then persists the cut and
    /// `role = primary` in one synced batch. Returns the stored cutover (an earlier one
    /// if a cutover already began: idempotent).
    pub fn begin_cutover(&self, cut: HybridTime, cut_time_us: u64) -> Result<Cutover> {
        let _g = self.lock();
        if let Some(c) = self.cutover()? {
            return Ok(c);
        }
        if cut == HybridTime::MIN {
            return Err(Error::Invalid("a cut at ht 0".into()));
        }
        self.cut.store(cut.0, std::sync::atomic::Ordering::Release);
        let c = Cutover {
            cut,
            cut_time_us,
            report: None,
            cleaned: false,
        };
        let mut b = self.db.batch();
        b.insert(&self.meta, CUTOVER, encode_cutover(&c)?);
        b.insert(&self.meta, GLOBAL_ROLE, vec![1]);
        if let Err(e) = self.commit(b, Durability::Sync) {
            self.cut.store(0, std::sync::atomic::Ordering::Release);
            return Err(e);
        }
        Ok(c)
    }

    /// Stores the cutover's report (phase 2), durably. Keeps an earlier report.
    pub fn save_cutover_report(&self, report: &CutoverReport) -> Result<Cutover> {
        let _g = self.lock();
        let mut c = self
            .cutover()?
            .ok_or_else(|| Error::Invalid("no cutover began".into()))?;
        if c.report.is_some() {
            return Ok(c);
        }
        c.report = Some(report.clone());
        let mut b = self.db.batch();
        b.insert(&self.meta, CUTOVER, encode_cutover(&c)?);
        self.commit(b, Durability::Sync)?;
        Ok(c)
    }

    /// One step of the cutover's background clean-up: scans `mvcc` from the persisted
    /// cursor, removing versions above the cut, until `max_scanned` keys were looked at;
    /// then persists the cursor (and, at the end, clears `pending` and marks the cutover
    /// clean), all in one batch. Returns (scanned, removed, done).
    pub fn cutover_cleanup_step(&self, max_scanned: usize) -> Result<(usize, usize, bool)> {
        let Some(c) = self.cutover()? else {
            return Err(Error::Invalid("no cutover began".into()));
        };
        if c.cleaned {
            return Ok((0, 0, true));
        }
        let from = self
            .meta
            .get(CUTOVER_CURSOR)
            .map_err(Error::store("read meta"))?
            .map(|v| v.to_vec())
            .unwrap_or_default();
        let mut b = self.db.batch();
        let (mut scanned, mut removed) = (0, 0);
        let mut last: Option<Vec<u8>> = None;
        for g in self.mvcc.range(from..) {
            if scanned >= max_scanned {
                break;
            }
            let (k, _) = g.into_inner().map_err(Error::store("scan mvcc"))?;
            let (_, ht) = keys::split(&k)?;
            if ht > c.cut {
                b.remove(&self.mvcc, k.to_vec());
                removed += 1;
            }
            scanned += 1;
            last = Some(k.to_vec());
        }
        let done = scanned < max_scanned;
        if removed > 0 {
            let total = self.cutover_removed()? + removed as u64;
            b.insert(&self.meta, CUTOVER_REMOVED, total.to_le_bytes().to_vec());
        }
        if done {
            let c = Cutover { cleaned: true, ..c };
            b.insert(&self.meta, CUTOVER, encode_cutover(&c)?);
            b.remove(&self.meta, CUTOVER_CURSOR);
        } else if let Some(mut k) = last {
            // Resume just after the last key looked at.
            k.push(0);
            b.insert(&self.meta, CUTOVER_CURSOR, k);
        }
        let _g = self.lock();
        self.commit(b, Durability::Sync)?;
        Ok((scanned, removed, done))
    }

    /// Versions the cutover's clean-up has removed so far, over all its runs (persisted
    /// with each step).
    pub fn cutover_removed(&self) -> Result<u64> {
        match self
            .meta
            .get(CUTOVER_REMOVED)
            .map_err(Error::store("read meta"))?
        {
            None => Ok(0),
            Some(v) => <[u8; 8]>::try_from(&v[..])
                .map(u64::from_le_bytes)
                .map_err(|_| {
                    Error::corrupt(
                        META,
                        "global/cutover_removed",
                        format!("{} bytes, expected 8", v.len()),
                    )
                }),
        }
    }

    // ---- transactions --------------------------------------------------------------------

    /// What the store knows about `txn`, from the cache of unresolved transactions when it
    /// is there (no LSM read), else from `txns`.
    pub fn txn_state(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        if let Some(st) = self.cache_lock().get(txn) {
            return Ok(Some(st.clone()));
        }
        self.settled_txn(txn)
    }

    /// For each of `txns`, its intent records on `tablet` (`None`: the store does not know
    /// the transaction), under one lock and without copying the rest of its state: what
    /// applying the transactions' parts on `tablet` reads back from the received log.
    pub fn intents_on(
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

    fn apply_open_ops(&self, ops: Vec<OpenOp>) {
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
    /// memory or the aborted one in `trx_open`, whichever has the higher ht.
    pub fn open_trx(&self, t: TrxId) -> Result<Option<TrxOpen>> {
        let mem = self
            .opens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&t)
            .cloned();
        let stored = self.bl.trx_open(t)?;
        Ok(match (mem, stored) {
            (Some(m), Some(s)) => Some(if m.ht >= s.ht { m } else { s }),
            (m, s) => m.or(s),
        })
    }

    /// What the store knows about `txn`.
    pub fn txn(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        match self.txns.get(txn.0).map_err(Error::store("read txns"))? {
            None => Ok(None),
            Some(v) => {
                let mut st =
                    decode_txn(&v).map_err(|r| Error::corrupt(TXNS, format!("txn {txn}"), r))?;
                self.note_released_parts(&mut st);
                Ok(Some(st))
            }
        }
    }

    // ---- apply ---------------------------------------------------------------------------

    /// Whether the store can take `rec` (at `pos` in `tablet`'s received log): every key of
    /// a `write` or `intent` fits the store's key limit once encoded
    /// ([`keys::MAX_ENCODED_LEN`]), every value its value limit. [`Error::Rejected`] names
    /// the record and the reason. A record that decodes can still fail this where the WAL's
    /// key limit is above what the encoding allows (NUL bytes are escaped to two, and ten
    /// bytes are added), so the apply stage asks before it builds a batch: an insert of
    /// such a key would panic inside fjall.
    pub fn check_record(tablet: &TabletId, pos: WalPos, rec: &Record) -> Result<()> {
        Self::check_ops(
            tablet,
            pos,
            rec.ops()
                .iter()
                .map(|op| (&op.key[..], op.value.as_deref())),
        )
    }

    /// [`Store::check_record`] for ops (key, value) of the record at `pos`.
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

    /// Applies `records` of `tablet` (read from its received log; `end_pos` is the end of
    /// the last one) in one atomic batch together with the tablet's new apply position and
    /// safe time. Records that end at or below the stored apply position are skipped (a
    /// replay after a crash); the first record not skipped must start exactly at the apply
    /// position and each next one where the previous ended, else [`Error::Gap`].
    pub fn apply(
        &self,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
        durability: Durability,
    ) -> Result<ApplyOutcome> {
        self.write_stall();
        self.apply_inner(tablet, records, end_pos, durability)
            .inspect_err(|_| self.mark_cache_incomplete())
    }

    pub(crate) fn mark_cache_incomplete(&self) {
        self.cache_incomplete
            .store(true, std::sync::atomic::Ordering::Release);
    }

    fn apply_inner(
        &self,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
        durability: Durability,
    ) -> Result<ApplyOutcome> {
        let mut g = self.cache_lock();
        // The batch's transactions, moved out of the cache (see `txn_entry`). They go back
        // whether the batch commits or not: an undecided transaction's state lives only
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
        // The next batch is prepared while this one commits (see `commit_order`).
        let _committing = self.hand_over(g, txns.drain(), committing);
        BATCH_TXNS.with(|t| *t.borrow_mut() = txns);
        r.and_then(|p| {
            if let Some(batch) = p.batch {
                self.commit(batch, durability)?;
                self.note_tablet(tablet);
                self.apply_open_ops(p.opens);
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
        let mut meta = self.tablet(tablet)?.unwrap_or_default();
        let start = meta.applied_pos;
        // A tablet that never applied anything may start wherever its received log starts.
        let fresh = start == WalPos::ZERO;
        let mut expected = (!fresh).then_some(start);
        let mut out = ApplyOutcome::default();
        let mut batch = self.db.batch();
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
            Self::check_record(tablet, *pos, rec)?;
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
                    // Several ops on one key in one record: the last one wins (one version
                    // per key and ht).
                    let mut last: BTreeMap<&[u8], &Option<Vec<u8>>> = BTreeMap::new();
                    for op in ops {
                        last.insert(&op.key, &op.value);
                    }
                    for (k, v) in last {
                        key_buf.clear();
                        keys::encode_into(&mut key_buf, k, rec.ht);
                        batch.insert(&self.mvcc, key_buf.clone(), encode_value(v.as_deref()));
                        out.ops += 1;
                    }
                }
                Body::Intent { txn, trx_id, .. } => {
                    out.intents += 1;
                    let st = Self::txn_entry(self, g, txns, txn)?;
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
                    let st = Self::txn_entry(self, g, txns, txn)?;
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
                    let st = Self::txn_entry(self, g, txns, txn)?;
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
        // prune; see `prune_floor`), and when it commits with an intent the `trx` index
        // cannot lead back to (`untraceable`). An undecided transaction, or one committed
        // under the trx id of all its intents, is not written: its intents are in the
        // received logs, its commit in the binlog and the `trx` index, and
        // `rebuild_unresolved` finds them there after a restart (one LSM put fewer per
        // transaction: ~15 % more transactions per second at the maximum, BENCHMARKS.md).
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
                batch.insert(&self.txns, txn.0.to_vec(), encode_txn(st)?);
                if st.aborted {
                    batch.insert(&self.aborted, txn.0.to_vec(), Vec::new());
                    // Before the commit: the filter may say yes too early, never no.
                    self.aborted_filter
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(&txn.0);
                }
            }
        }
        self.bl.write_open(&mut batch, opens);
        meta.applied_pos = end_pos;
        meta.applied_records += out.records;
        batch.insert(
            &self.meta,
            Self::tablet_key(tablet),
            encode_tablet_meta(&meta)?,
        );
        out.applied_pos = meta.applied_pos;
        out.safe_time = meta.safe_time;
        Ok(Prepared {
            batch: Some(batch),
            opens: pending_opens,
            out,
        })
    }

    /// Applies `tablet`'s part of the committed `txn`: its intents' `ops` (in log order)
    /// as versions at `commit_ht`, and records the part as applied, in one atomic batch.
    /// Once every participant's part is applied the transaction leaves `pending`.
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

    /// [`Store::apply_part`] for several parts of `tablet` in **one** atomic batch (one
    /// lock, one journal write). Returns how many were applied (not already applied in this
    /// process: applied parts are tracked in the cache of unresolved transactions, and a
    /// restart re-applies the parts of the transactions still in `pending`, idempotently).
    pub fn apply_parts(
        &self,
        tablet: &TabletId,
        parts: &[Part],
        durability: Durability,
    ) -> Result<usize> {
        self.write_stall();
        self.apply_parts_inner(tablet, parts, durability)
            .inspect_err(|_| self.mark_cache_incomplete())
    }

    fn apply_parts_inner(
        &self,
        tablet: &TabletId,
        parts: &[Part],
        durability: Durability,
    ) -> Result<usize> {
        let mut g = self.cache_lock();
        let mut batch = self.db.batch();
        let mut updated: Vec<(TxnId, TxnState)> = Vec::with_capacity(parts.len());
        let mut applied = 0;
        let mut key_buf = Vec::new();
        let mut failed = None;
        for p in parts {
            // Moved out of the cache (see `txn_entry`), put back after the commit.
            let mut st = match g.remove(&p.txn) {
                Some(st) => st,
                None => match self.settled_txn(&p.txn) {
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
            if let Err(e) = Self::check_ops(tablet, first, ops) {
                updated.push((p.txn, st));
                failed = Some(e);
                break;
            }
            applied += 1;
            let mut last: BTreeMap<&[u8], &Option<Vec<u8>>> = BTreeMap::new();
            for (k, v) in &p.ops {
                last.insert(k, v);
            }
            for (k, v) in last {
                key_buf.clear();
                keys::encode_into(&mut key_buf, k, p.commit_ht);
                batch.insert(&self.mvcc, key_buf.clone(), encode_value(v.as_deref()));
            }
            st.applied_parts.insert(tablet.clone());
            // Applied parts are tracked in memory only: neither `txns` is rewritten nor the
            // `pending` entry removed once all are (the safe time passing the commit makes
            // it stale; see `pending_floor`). After a crash the parts of every transaction
            // still pending are applied again, which writes the same versions at the same
            // ht (idempotent).
            updated.push((p.txn, st));
        }
        // Back into the cache even when the batch fails (the only copy of their intents;
        // the parts marked applied are applied again after a restart, idempotently); the
        // next batch is prepared while this one commits (see `commit_order`).
        let committing = failed.is_none() && applied > 0;
        let _committing = self.hand_over(g, updated, committing);
        match failed {
            Some(e) => Err(e),
            None if committing => self.commit(batch, durability).map(|()| applied),
            None => Ok(applied),
        }
    }

    // ---- received-log retention -------------------------------------------------------

    /// Per tablet, the lowest received-log position applying may still read: the apply
    /// position, or the first intent there of an unresolved transaction whose part on that
    /// tablet is not applied yet, whichever is lower. The cache holds every unresolved
    /// transaction (rebuilt at open from the retained logs), and this is taken under the
    /// write lock, so apply positions and the cache agree. `None` when the cache cannot be
    /// trusted (an apply batch failed; see `cache_incomplete`).
    pub fn retention_floors(&self) -> Result<Option<BTreeMap<TabletId, RetentionFloor>>> {
        let g = self.lock();
        if self
            .cache_incomplete
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Ok(None);
        }
        let mut out: BTreeMap<TabletId, RetentionFloor> = self
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

    /// Rebuilds the cache of unresolved transactions from the retained received logs under
    /// `received` (one directory per tablet), before anything applies. Undecided
    /// transactions and the intents of committed ones that arrive after their commit are
    /// not stored (see `apply_locked`); their intents are in the received logs, and every
    /// one a part may still need is retained: a tablet's release never passes the first
    /// intent of a transaction whose part there is not applied (`crate::retention`). So
    /// each tablet's log is read from its release up to its apply position (what lies
    /// above is applied again by its worker), and each transaction found is classified by
    /// its `txns` record, in chunks of at most [`REBUILD_CHUNK`] transactions:
    ///
    /// * no record: undecided (binlog retention keeps the record of a decided transaction
    ///   while its intents may still be retained — `prune_floor`) → cached, with its
    ///   pending `trx_open` entry when it carries a trx id;
    /// * committed and still in `pending` → cached with its record, intents added;
    /// * aborted, or committed and applied everywhere → resolved, skipped.
    fn rebuild_unresolved(
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
            let Some(&release) = self.released_at_open.get(&t) else {
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
                    self.rebuild_chunk(&t, chunk.drain(), &mut ops, &mut out)?;
                }
                if done {
                    break;
                }
            }
            tracing::info!(tablet = %t, from = %start, to = %m.applied_pos,
                "received log read for the transactions applied before this start");
        }
        out.restored = ops.len();
        self.apply_open_ops(ops);
        Ok(out)
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

    fn rebuild_chunk(
        &self,
        tablet: &TabletId,
        chunk: impl Iterator<Item = (TxnId, ScannedTxn)>,
        ops: &mut Vec<OpenOp>,
        out: &mut Rebuilt,
    ) -> Result<()> {
        let mut g = self.lock();
        for (txn, scanned) in chunk {
            let ScannedTxn {
                intents,
                trx_id,
                untraceable,
            } = scanned;
            let st = match g.remove(&txn) {
                Some(st) => st,
                None => match self.txn(&txn)? {
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
                            // Above the safe time (see `pending_floor`); on a promoted
                            // target nothing is pending (discarded by the cutover).
                            if c.commit_ht <= self.pending_floor() || self.cut().is_some() {
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
    fn committed_as(&self, txn: &TxnId, trx_id: Option<TrxId>) -> Result<bool> {
        let Some(t) = trx_id else { return Ok(false) };
        Ok(self.bl.trx_commit(t)?.is_some_and(|c| c.txn == Some(*txn)))
    }

    /// What [`OpenStore::open_with`] rebuilt from the received logs.
    pub fn rebuilt(&self) -> Rebuilt {
        self.rebuilt
    }

    /// Binlog retention keeps the `txns` record of every transaction decided at or after
    /// `ht` (and the binlog from there): received-log retention says that every record still
    /// retained — what [`Store::open`] reads back after a restart — has an ht of at least
    /// `ht`. A transaction's intents come before its commit, so a committed transaction
    /// whose record goes has none left there (else it would look undecided after a
    /// restart); an aborted one is checked against its record's intents. Until the first
    /// call nothing is pruned.
    pub fn set_prune_floor(&self, ht: HybridTime) {
        self.prune_floor
            .store(ht.0, std::sync::atomic::Ordering::Release);
    }

    fn prune_floor(&self) -> HybridTime {
        HybridTime(self.prune_floor.load(std::sync::atomic::Ordering::Acquire))
    }

    /// See the `pending_floor` field.
    fn pending_floor(&self) -> HybridTime {
        HybridTime(
            self.pending_floor
                .load(std::sync::atomic::Ordering::Acquire),
        )
    }

    /// Committed transactions that may not be applied on every participant yet, by commit
    /// ht: the distributed commits in the binlog above the global safe time (see
    /// `pending_floor`; some of them may be applied everywhere — applying a part again is
    /// idempotent). None on a promoted target: the cutover discarded them.
    pub fn pending_txns(&self) -> Result<Vec<(TxnId, TxnState)>> {
        let mut out = Vec::new();
        if self.cut().is_some() {
            return Ok(out);
        }
        // Put in the cache at open (`preload_pending`), with the intents the received logs
        // still hold.
        let g = self.cache_lock();
        for (txn, e) in self.bl.distributed_above(self.pending_floor())? {
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
        Ok(match self.txn(txn)? {
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
        if self.cut().is_some() {
            return Ok(0);
        }
        let mut g = self.lock();
        let mut n = 0;
        for (txn, e) in self.bl.distributed_above(self.pending_floor())? {
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
    /// [`OpenStore::first_seen`].
    fn txn_entry<'a>(
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

    // ---- reads ---------------------------------------------------------------------------

    /// The newest version of `key` with ht ≤ `at` (newest of all for `None`), by one seek.
    pub fn get(&self, key: &[u8], at: Option<HybridTime>) -> Result<Option<Version>> {
        if keys::encoded_len(key) > keys::MAX_ENCODED_LEN {
            // Never stored (`check_record`), and fjall asserts on such a seek key.
            return Ok(None);
        }
        let at = self.cap(at);
        let (lo, hi) = keys::visible_range(key, at.unwrap_or(HybridTime::MAX));
        let Some(g) = self.mvcc.range(lo..hi).next() else {
            return Ok(None);
        };
        let (k, v) = g.into_inner().map_err(Error::store("read mvcc"))?;
        let (_, ht) = keys::split(&k)?;
        let value = decode_value(&v).map_err(|r| {
            Error::corrupt(MVCC, format!("key {} at ht {ht}", key.escape_ascii()), r)
        })?;
        Ok(Some(Version { value, ht }))
    }

    /// Per user key starting with `prefix`, ascending, the version visible at `at` (newest for
    /// `None`), skipping keys whose visible version is a delete; at most `limit` entries and
    /// whether more visible keys follow. Reads one consistent snapshot.
    #[allow(clippy::type_complexity)]
    pub fn scan(
        &self,
        prefix: &[u8],
        at: Option<HybridTime>,
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>, HybridTime)>, bool)> {
        if keys::encoded_len(prefix) > keys::MAX_ENCODED_LEN {
            // No stored key is that long (`check_record`), and fjall asserts on such a bound.
            return Ok((Vec::new(), false));
        }
        let at = self.cap(at).unwrap_or(HybridTime::MAX);
        let snap = self.db.snapshot();
        let (start, end) = keys::prefix_range(prefix);
        let mut iter = snap.range(&self.mvcc, (start, end.clone()));
        let mut out = Vec::new();
        // Encoded user key (`escape ‖ 00 01`) whose visible version was already taken.
        let mut done: Option<Vec<u8>> = None;
        // Invisible versions stepped over in a row for one key.
        let mut stepped = 0usize;
        while let Some(g) = iter.next() {
            let (k, v) = g.into_inner().map_err(Error::store("scan mvcc"))?;
            let (user, ht) = keys::split(&k)?;
            let finished = done.as_deref() == Some(user);
            if finished || ht > at {
                stepped += 1;
                if stepped >= RESEEK_AFTER {
                    stepped = 0;
                    let mut from = user.to_vec();
                    if finished {
                        // Past every version of this key: escape ‖ 00 02.
                        if let Some(last) = from.last_mut() {
                            *last += 1;
                        }
                    } else {
                        from.extend_from_slice(&(!at.0).to_be_bytes());
                    }
                    iter = snap.range(&self.mvcc, (std::ops::Bound::Included(from), end.clone()));
                }
                continue;
            }
            stepped = 0;
            done = Some(user.to_vec());
            let value = decode_value(&v).map_err(|r| {
                Error::corrupt(MVCC, format!("key {} at ht {ht}", k.escape_ascii()), r)
            })?;
            let Some(value) = value else { continue };
            if out.len() >= limit {
                return Ok((out, true));
            }
            let (key, _) = keys::decode(&k)?;
            out.push((key, value, ht));
        }
        Ok((out, false))
    }
}

// ---- value encodings (little-endian; see applier/STORE.md)
// ---------------------------------
//
// Public, like the binlog's, so that each codec can be driven on its own (the fuzz tests in
// `tests/fuzz.rs`): every `decode_*` refuses what its `encode_*` does not write.

/// What fjall's error `e` at opening the store under `dir` means, in words, with the
/// files it concerns where fjall does not name them: its journal (`*.jnl`) when that is
/// what does not recover. fjall's own form ends it.
fn describe_open_error(e: &fjall::Error, dir: &Path) -> String {
    use fjall::Error as F;
    let what = match e {
        F::JournalRecovery(r) => {
            use fjall::JournalRecoveryError as R;
            let why = match r {
                R::ChecksumMismatch => "a write batch's checksum does not match its contents",
                R::InsufficientLength => "a write batch holds fewer items than its header says",
                R::TooManyItems => "a write batch holds more items than its header says",
                R::InvalidFileName => "a journal file's name does not parse",
            };
            format!(
                "its journal does not recover: {why} (damage inside the journal, not a write \
                 cut short at its end, which recovery drops by itself); journal files: {}",
                journal_files(dir)
            )
        }
        F::Io(io) => format!("I/O error: {io}"),
        F::InvalidVersion(v) => format!("its format version {v:?} is not one this build reads"),
        F::Storage(_) => "a table or a keyspace's metadata does not read".to_string(),
        F::Unrecoverable => {
            "fjall found it unrecoverable (its log lines above say why)".to_string()
        }
        _ => "fjall refused it".to_string(),
    };
    format!("{what} (fjall: {e:?})")
}

/// The journal files under `dir` with their sizes, oldest first (`0.jnl (64 MiB), …`).
fn journal_files(dir: &Path) -> String {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return format!("{} cannot be listed", dir.display());
    };
    let mut files: Vec<(u64, std::path::PathBuf, u64)> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            let n: u64 = p
                .file_name()?
                .to_str()?
                .strip_suffix(".jnl")?
                .parse()
                .ok()?;
            Some((n, p, e.metadata().map_or(0, |m| m.len())))
        })
        .collect();
    if files.is_empty() {
        return "none found".to_string();
    }
    files.sort();
    files
        .iter()
        .map(|(_, p, len)| format!("{} ({len} bytes)", p.display()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn encode_value(v: Option<&[u8]>) -> Vec<u8> {
    match v {
        None => vec![VALUE_TOMBSTONE],
        Some(v) => {
            let mut out = Vec::with_capacity(1 + v.len());
            out.push(VALUE_PUT);
            out.extend_from_slice(v);
            out
        }
    }
}

pub fn decode_value(v: &[u8]) -> Result<Option<Vec<u8>>, String> {
    match v.split_first() {
        Some((&VALUE_TOMBSTONE, [])) => Ok(None),
        Some((&VALUE_TOMBSTONE, rest)) => {
            Err(format!("tombstone with {} trailing bytes", rest.len()))
        }
        Some((&VALUE_PUT, rest)) => Ok(Some(rest.to_vec())),
        Some((tag, _)) => Err(format!("unknown value tag {tag}")),
        None => Err("empty value".into()),
    }
}

/// Bounded little-endian reader over a stored value; every failure says what and where.
pub(crate) struct Cur<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Cur<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Cur<'a> {
        Cur { buf, at: 0 }
    }
    pub(crate) fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let s = self
            .buf
            .get(self.at..self.at.saturating_add(n))
            .ok_or_else(|| {
                format!(
                    "truncated at byte {} reading {what} ({n} bytes, {} left)",
                    self.at,
                    self.buf.len().saturating_sub(self.at)
                )
            })?;
        self.at += n;
        Ok(s)
    }
    pub(crate) fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &str) -> Result<u16, String> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self, what: &str) -> Result<u32, String> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4, what)?);
        Ok(u32::from_le_bytes(a))
    }
    pub(crate) fn u64(&mut self, what: &str) -> Result<u64, String> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8, what)?);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn tablet(&mut self, what: &str) -> Result<TabletId, String> {
        let n = self.u8(what)? as usize;
        let at = self.at;
        let b = self.take(n, what)?;
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("invalid tablet id in {what} at byte {at}"))
    }
    /// A tablet id of a list kept in ascending order, each once (a map's keys or a set),
    /// that must come after `prev`: every value then has one encoding only.
    pub(crate) fn tablet_after(
        &mut self,
        what: &str,
        prev: Option<&TabletId>,
    ) -> Result<TabletId, String> {
        let at = self.at;
        let t = self.tablet(what)?;
        match prev {
            Some(p) if *p >= t => Err(format!(
                "{what} {t} at byte {at} does not follow {p}: the list must be in ascending order, each once"
            )),
            _ => Ok(t),
        }
    }
    pub(crate) fn end(&self) -> Result<(), String> {
        if self.at == self.buf.len() {
            Ok(())
        } else {
            Err(format!(
                "{} trailing bytes at byte {}",
                self.buf.len() - self.at,
                self.at
            ))
        }
    }
}

pub(crate) fn put_tablet(out: &mut Vec<u8>, t: &TabletId) {
    // Tablet ids are at most 64 bytes (checked by `TabletId`).
    out.push(t.as_str().len() as u8);
    out.extend_from_slice(t.as_str().as_bytes());
}

const TM_REGISTERED: u8 = 1;
const TM_OWNER: u8 = 2;

pub fn encode_tablet_meta(m: &TabletMeta) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(20);
    out.push(FORMAT_VERSION);
    let mut flags = 0;
    if m.registered {
        flags |= TM_REGISTERED;
    }
    if m.owner.is_some() {
        flags |= TM_OWNER;
    }
    out.push(flags);
    out.extend_from_slice(&m.applied_pos.0.to_le_bytes());
    out.extend_from_slice(&m.safe_time.0.to_le_bytes());
    out.extend_from_slice(&m.applied_records.to_le_bytes());
    if let Some(o) = &m.owner {
        let n = u8::try_from(o.len())
            .map_err(|_| Error::Invalid(format!("owner {o:?} is longer than 255 bytes")))?;
        out.push(n);
        out.extend_from_slice(o.as_bytes());
    }
    Ok(out)
}

pub fn decode_tablet_meta(v: &[u8]) -> Result<TabletMeta, String> {
    let mut c = Cur { buf: v, at: 0 };
    let ver = c.u8("version")?;
    if ver != FORMAT_VERSION {
        return Err(format!("unknown format version {ver}"));
    }
    let flags = c.u8("flags")?;
    if flags & !(TM_REGISTERED | TM_OWNER) != 0 {
        return Err(format!("unknown flags {flags:#04x}"));
    }
    let applied_pos = WalPos(c.u64("applied_pos")?);
    let safe_time = HybridTime(c.u64("safe_time")?);
    let applied_records = c.u64("applied_records")?;
    let owner = if flags & TM_OWNER != 0 {
        let n = c.u8("owner length")? as usize;
        let b = c.take(n, "owner")?;
        Some(String::from_utf8(b.to_vec()).map_err(|_| "owner is not UTF-8".to_string())?)
    } else {
        None
    };
    c.end()?;
    Ok(TabletMeta {
        applied_pos,
        safe_time,
        registered: flags & TM_REGISTERED != 0,
        owner,
        applied_records,
    })
}

/// A cutover (docs/ARCHITECTURE.md, "Cutover") as persisted in `meta` under
/// `global/cutover`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cutover {
    pub cut: HybridTime,
    /// Wall-clock time of the promotion, microseconds since the epoch.
    pub cut_time_us: u64,
    /// Phase 2: the report, once computed (a restart computes it if missing).
    pub report: Option<CutoverReport>,
    /// Phase 3: versions above the cut are gone.
    pub cleaned: bool,
}

/// What a cutover lost, as returned by `POST /v1/promote`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CutoverReport {
    /// Commits above the cut (by gtid sequence, so commits never received count too).
    pub lost_commits: u64,
    /// From the cut to the newest commit received, in milliseconds.
    pub lost_window_ms: u64,
    /// Per tablet: its safe time at the cut and how far it lagged the wall clock then (ms).
    pub tablets: BTreeMap<TabletId, (HybridTime, u64)>,
}

const CUT_REPORT: u8 = 1;
const CUT_CLEANED: u8 = 2;

pub fn encode_cutover(c: &Cutover) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    let mut flags = 0;
    if c.report.is_some() {
        flags |= CUT_REPORT;
    }
    if c.cleaned {
        flags |= CUT_CLEANED;
    }
    out.push(flags);
    out.extend_from_slice(&c.cut.0.to_le_bytes());
    out.extend_from_slice(&c.cut_time_us.to_le_bytes());
    if let Some(r) = &c.report {
        out.extend_from_slice(&r.lost_commits.to_le_bytes());
        out.extend_from_slice(&r.lost_window_ms.to_le_bytes());
        let n = u16::try_from(r.tablets.len())
            .map_err(|_| Error::Invalid(format!("{} tablets", r.tablets.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for (t, (safe, lag)) in &r.tablets {
            put_tablet(&mut out, t);
            out.extend_from_slice(&safe.0.to_le_bytes());
            out.extend_from_slice(&lag.to_le_bytes());
        }
    }
    Ok(out)
}

pub fn decode_cutover(v: &[u8]) -> Result<Cutover, String> {
    let mut c = Cur::new(v);
    let ver = c.u8("version")?;
    if ver != FORMAT_VERSION {
        return Err(format!("unknown format version {ver}"));
    }
    let flags = c.u8("flags")?;
    if flags & !(CUT_REPORT | CUT_CLEANED) != 0 {
        return Err(format!("unknown flags {flags:#04x}"));
    }
    let cut = HybridTime(c.u64("cut")?);
    let cut_time_us = c.u64("cut_time")?;
    let report = if flags & CUT_REPORT != 0 {
        let lost_commits = c.u64("lost_commits")?;
        let lost_window_ms = c.u64("lost_window_ms")?;
        let n = c.u16("tablet count")?;
        let mut tablets = BTreeMap::new();
        for _ in 0..n {
            let t = c.tablet_after("tablet", tablets.keys().next_back())?;
            let safe = HybridTime(c.u64("tablet safe time")?);
            let lag = c.u64("tablet lag")?;
            tablets.insert(t, (safe, lag));
        }
        Some(CutoverReport {
            lost_commits,
            lost_window_ms,
            tablets,
        })
    } else {
        None
    };
    c.end()?;
    Ok(Cutover {
        cut,
        cut_time_us,
        report,
        cleaned: flags & CUT_CLEANED != 0,
    })
}

const TX_COMMIT: u8 = 1;
const TX_ABORTED: u8 = 2;
const TX_TRX_ID: u8 = 4;
const TX_GTID: u8 = 8;
const TX_APPLIED_PARTS: u8 = 16;
const TX_OPEN: u8 = 32;

/// An intent carrying `carried` leaves transaction `known` untraceable through the `trx`
/// index (see [`TxnState::untraceable`]): it carries no trx id, or another one.
fn untraceable_intent(known: Option<TrxId>, carried: Option<TrxId>) -> bool {
    carried.is_none() || known.is_some_and(|k| Some(k) != carried)
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

/// A transaction nothing will change any more: aborted, or committed and applied on every
/// participant.
fn resolved(st: &TxnState) -> bool {
    st.aborted
        || st
            .commit
            .as_ref()
            .is_some_and(|c| c.participants.iter().all(|p| st.applied_parts.contains(p)))
}

pub fn encode_txn(st: &TxnState) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(64);
    out.push(FORMAT_VERSION);
    let mut flags = 0;
    if st.commit.is_some() {
        flags |= TX_COMMIT;
    }
    if st.aborted {
        flags |= TX_ABORTED;
    }
    if st.trx_id.is_some() {
        flags |= TX_TRX_ID;
    }
    if st.gtid.is_some() {
        flags |= TX_GTID;
    }
    if !st.applied_parts.is_empty() {
        flags |= TX_APPLIED_PARTS;
    }
    if st.open.is_some() {
        flags |= TX_OPEN;
    }
    out.push(flags);
    if let Some(t) = st.trx_id {
        out.extend_from_slice(&t.connect_id.to_le_bytes());
        out.extend_from_slice(&t.commit_counter.to_le_bytes());
    }
    if let Some(g) = st.gtid {
        out.extend_from_slice(&g.domain.to_le_bytes());
        out.extend_from_slice(&g.server.to_le_bytes());
        out.extend_from_slice(&g.seq.to_le_bytes());
    }
    if let Some(c) = &st.commit {
        out.extend_from_slice(&c.commit_ht.0.to_le_bytes());
        out.extend_from_slice(&c.pos.0.to_le_bytes());
        put_tablet(&mut out, &c.tablet);
        let n = u16::try_from(c.participants.len())
            .map_err(|_| Error::Invalid(format!("{} participants", c.participants.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for p in &c.participants {
            put_tablet(&mut out, p);
        }
    }
    let n = u16::try_from(st.intents.len())
        .map_err(|_| Error::Invalid(format!("{} intent tablets", st.intents.len())))?;
    out.extend_from_slice(&n.to_le_bytes());
    for (t, list) in &st.intents {
        put_tablet(&mut out, t);
        let n = u32::try_from(list.len())
            .map_err(|_| Error::Invalid(format!("{} intents on tablet {t}", list.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for r in list {
            out.extend_from_slice(&r.pos.0.to_le_bytes());
            out.extend_from_slice(&r.ht.0.to_le_bytes());
        }
    }
    if !st.applied_parts.is_empty() {
        let n = u16::try_from(st.applied_parts.len())
            .map_err(|_| Error::Invalid(format!("{} applied parts", st.applied_parts.len())))?;
        out.extend_from_slice(&n.to_le_bytes());
        for t in &st.applied_parts {
            put_tablet(&mut out, t);
        }
    }
    if let Some((ht, t)) = &st.open {
        out.extend_from_slice(&ht.0.to_le_bytes());
        put_tablet(&mut out, t);
    }
    Ok(out)
}

pub fn decode_txn(v: &[u8]) -> Result<TxnState, String> {
    let mut c = Cur { buf: v, at: 0 };
    let ver = c.u8("version")?;
    if ver != FORMAT_VERSION {
        return Err(format!("unknown format version {ver}"));
    }
    let flags = c.u8("flags")?;
    if flags & !(TX_COMMIT | TX_ABORTED | TX_TRX_ID | TX_GTID | TX_APPLIED_PARTS | TX_OPEN) != 0 {
        return Err(format!("unknown flags {flags:#04x}"));
    }
    let mut st = TxnState {
        aborted: flags & TX_ABORTED != 0,
        ..TxnState::default()
    };
    if flags & TX_TRX_ID != 0 {
        st.trx_id = Some(TrxId::new(c.u64("trx_id")?, c.u64("trx_id")?));
    }
    if flags & TX_GTID != 0 {
        st.gtid = Some(Gtid::new(c.u32("gtid")?, c.u32("gtid")?, c.u64("gtid")?));
    }
    if flags & TX_COMMIT != 0 {
        let commit_ht = HybridTime(c.u64("commit_ht")?);
        let pos = WalPos(c.u64("commit position")?);
        let tablet = c.tablet("commit tablet")?;
        let n = c.u16("participant count")?;
        let participants = (0..n)
            .map(|_| c.tablet("participant"))
            .collect::<Result<Vec<_>, _>>()?;
        st.commit = Some(CommitInfo {
            commit_ht,
            tablet,
            pos,
            participants,
        });
    }
    let n = c.u16("intent tablet count")?;
    for _ in 0..n {
        let t = c.tablet_after("intent tablet", st.intents.keys().next_back())?;
        let k = c.u32("intent count")?;
        let mut list = Vec::with_capacity((k as usize).min(v.len() / 16));
        for _ in 0..k {
            list.push(IntentRef {
                pos: WalPos(c.u64("intent position")?),
                ht: HybridTime(c.u64("intent ht")?),
            });
        }
        st.intents.insert(t, list);
    }
    if flags & TX_APPLIED_PARTS != 0 {
        let n = c.u16("applied part count")?;
        for _ in 0..n {
            let t = c.tablet_after("applied part", st.applied_parts.last())?;
            st.applied_parts.insert(t);
        }
    }
    if flags & TX_OPEN != 0 {
        st.open = Some((HybridTime(c.u64("open ht")?), c.tablet("open tablet")?));
    }
    c.end()?;
    Ok(st)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tidelog_wal::Op;

    /// The tests below look inside one opening (its keyspaces and private helpers).
    struct Store;

    impl Store {
        fn open(data_dir: &Path) -> Result<OpenStore> {
            OpenStore::open_with(data_dir, &StoreOptions::default())
        }
    }

    fn t(s: &str) -> TabletId {
        s.parse().unwrap()
    }

    /// Positions records as a log starting at `from` would.
    fn place(from: u64, recs: Vec<Record>) -> (Vec<(WalPos, Record)>, WalPos) {
        let mut pos = WalPos(from);
        let mut out = Vec::new();
        for r in recs {
            let len = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
            out.push((pos, r));
            pos = pos.add(len);
        }
        (out, pos)
    }

    fn write(ht: u64, ops: Vec<Op>) -> Record {
        Record::new(
            HybridTime(ht),
            Body::Write {
                ops,
                trx_id: None,
                gtid: None,
            },
        )
    }

    /// A `write` committing trx id `trx` (a binlog entry), no ops.
    fn trx_write(ht: u64, trx: TrxId) -> Record {
        Record::new(
            HybridTime(ht),
            Body::Write {
                ops: vec![],
                trx_id: Some(trx),
                gtid: None,
            },
        )
    }

    fn abort(ht: u64, txn: TxnId, trx_id: Option<TrxId>) -> Record {
        Record::new(HybridTime(ht), Body::Abort { txn, trx_id })
    }

    fn intent(ht: u64, txn: TxnId, trx_id: Option<TrxId>, ops: Vec<Op>) -> Record {
        Record::new(HybridTime(ht), Body::Intent { txn, trx_id, ops })
    }

    #[test]
    fn apply_get_scan_and_replay() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let a = t("a");
        let (recs, end) = place(
            0,
            vec![
                write(
                    10,
                    vec![
                        Op::put("k1", "v1"),
                        Op::put("k2", "x"),
                        Op::put("k1", "v1b"),
                    ],
                ),
                write(20, vec![Op::delete("k2"), Op::put("k3", "z")]),
                Record::new(HybridTime(30), Body::Heartbeat),
            ],
        );
        let o = s
            .apply(&a, &recs[..2], recs[2].0, Durability::Sync)
            .unwrap();
        assert_eq!((o.records, o.writes, o.ops), (2, 2, 4));
        let o = s.apply(&a, &recs, end, Durability::Buffered).unwrap();
        assert_eq!((o.records, o.skipped, o.heartbeats), (1, 2, 1));
        assert_eq!((o.applied_pos, o.safe_time), (end, HybridTime(30)));
        // Full replay: nothing.
        let o = s.apply(&a, &recs, end, Durability::Buffered).unwrap();
        assert_eq!((o.records, o.skipped), (0, 3));

        let v = s.get(b"k1", None).unwrap().unwrap();
        assert_eq!(
            (v.value.as_deref(), v.ht),
            (Some(&b"v1b"[..]), HybridTime(10))
        );
        assert_eq!(s.get(b"k1", Some(HybridTime(9))).unwrap(), None);
        assert_eq!(s.get(b"k2", None).unwrap().unwrap().value, None);
        assert_eq!(
            s.get(b"k2", Some(HybridTime(19))).unwrap().unwrap().value,
            Some(b"x".to_vec())
        );
        let (rows, more) = s.scan(b"k", None, 10).unwrap();
        let keys: Vec<_> = rows.iter().map(|r| r.0.clone()).collect();
        assert_eq!(keys, vec![b"k1".to_vec(), b"k3".to_vec()]);
        assert!(!more);
        let (rows, more) = s.scan(b"k", Some(HybridTime(15)), 1).unwrap();
        assert_eq!(
            rows,
            vec![(b"k1".to_vec(), b"v1b".to_vec(), HybridTime(10))]
        );
        assert!(more);
        let m = s.tablets().unwrap();
        assert_eq!(m[&a].applied_pos, end);
        assert_eq!(m[&a].safe_time, HybridTime(30));
        assert_eq!(m[&a].applied_records, 3);
        assert!(!m[&a].registered);
        s.register_tablet(&a).unwrap();
        s.set_tablet_owner(&a, Some("host1")).unwrap();
        let m = s.tablet(&a).unwrap().unwrap();
        assert!(m.registered);
        assert_eq!(m.owner.as_deref(), Some("host1"));
        assert_eq!(m.applied_pos, end);
        // A tablet only registered is listed too, and both are found again after a reopen.
        s.register_tablet(&t("b")).unwrap();
        let listed = |s: &OpenStore| s.tablets().unwrap().into_keys().collect::<Vec<_>>();
        assert_eq!(listed(&s), vec![a.clone(), t("b")]);
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(listed(&s), vec![a.clone(), t("b")]);
        assert_eq!(s.tablets().unwrap()[&a].applied_pos, end);
    }

    #[test]
    fn gaps_and_overlaps_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let a = t("a");
        let (recs, end) = place(
            0,
            (1..=4)
                .map(|i| write(i, vec![Op::put("k", [i as u8])]))
                .collect(),
        );
        s.apply(&a, &recs[..1], recs[1].0, Durability::Buffered)
            .unwrap();
        // Skipping record 1.
        let e = s
            .apply(&a, &recs[2..], end, Durability::Buffered)
            .unwrap_err();
        assert!(
            matches!(e, Error::Gap { expected, got, .. } if expected == recs[1].0 && got == recs[2].0),
            "{e}"
        );
        // Wrong end position.
        let e = s
            .apply(&a, &recs[1..], end.add(1), Durability::Buffered)
            .unwrap_err();
        assert!(matches!(e, Error::Invalid(_)), "{e}");
        // Nothing was written by the failed calls.
        assert_eq!(s.tablet(&a).unwrap().unwrap().applied_pos, recs[1].0);
        assert_eq!(s.get(b"k", None).unwrap().unwrap().ht, HybridTime(1));
    }

    #[test]
    fn txn_state_roundtrip_through_apply() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (a, st) = (t("a"), t("status"));
        let x = TxnId::from_u128(0x2a);
        let y = TxnId::from_u128(0x2b);
        let (ra, enda) = place(
            0,
            vec![
                Record::new(
                    HybridTime(5),
                    Body::Intent {
                        txn: x,
                        trx_id: Some(TrxId::new(7, 1)),
                        ops: vec![Op::put("p", "q")],
                    },
                ),
                Record::new(
                    HybridTime(6),
                    Body::Intent {
                        txn: y,
                        trx_id: None,
                        ops: vec![],
                    },
                ),
            ],
        );
        s.apply(&a, &ra, enda, Durability::Sync).unwrap();
        let (rs, ends) = place(
            0,
            vec![
                Record::new(
                    HybridTime(8),
                    Body::Commit {
                        txn: x,
                        participants: vec![a.clone()],
                        trx_id: Some(TrxId::new(7, 1)),
                        gtid: Some(Gtid::new(0, 1, 99)),
                    },
                ),
                Record::new(
                    HybridTime(9),
                    Body::Abort {
                        txn: y,
                        trx_id: None,
                    },
                ),
            ],
        );
        let o = s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        assert_eq!((o.commits, o.aborts), (1, 1));
        // Committed under the trx id of all its intents: no `txns` record (the binlog and
        // the `trx` index hold the commit); the state is in the cache until applied.
        assert_eq!(
            s.txn(&x).unwrap(),
            None,
            "a traceable commit was written to txns"
        );
        assert!(s.committed_as(&x, Some(TrxId::new(7, 1))).unwrap());
        let sx = s.txn_state(&x).unwrap().unwrap();
        assert_eq!(
            sx.intents[&a],
            vec![IntentRef {
                pos: WalPos(0),
                ht: HybridTime(5)
            }]
        );
        let c = sx.commit.unwrap();
        assert_eq!(
            (c.commit_ht, c.tablet, c.participants),
            (HybridTime(8), st.clone(), vec![a.clone()])
        );
        assert_eq!(sx.gtid, Some(Gtid::new(0, 1, 99)));
        assert_eq!(sx.trx_id, Some(TrxId::new(7, 1)));
        assert!(!sx.aborted);
        let sy = s.txn(&y).unwrap().unwrap();
        assert!(sy.aborted && sy.commit.is_none());
        assert_eq!(sy.intents[&a][0].pos, ra[1].0);
        assert_eq!(s.txn(&TxnId::from_u128(1)).unwrap(), None);
        // Intents are not copied into mvcc.
        assert_eq!(s.get(b"p", None).unwrap(), None);
    }

    /// The pending transactions are the distributed commits in the binlog above the global
    /// safe time: listed while the safe time is below the commit (also after a reopen, even
    /// once applied everywhere), not once it passed; single-tablet commits in the binlog are
    /// never listed.
    #[test]
    fn distributed_commits_above_the_safe_time_are_pending() {
        let dir = tempfile::tempdir().unwrap();
        let (a, st) = (t("a"), t("status"));
        let x = TxnId::from_u128(3);
        let listed = |s: &OpenStore| -> Vec<TxnId> {
            s.pending_txns()
                .unwrap()
                .into_iter()
                .map(|(t, _)| t)
                .collect()
        };
        {
            let s = Store::open(dir.path()).unwrap();
            let (ra, enda) = place(0, vec![intent(5, x, None, vec![Op::put("k", "v")])]);
            s.apply(&a, &ra, enda, Durability::Sync).unwrap();
            let commit = Record::new(
                HybridTime(8),
                Body::Commit {
                    txn: x,
                    participants: vec![a.clone()],
                    trx_id: None,
                    gtid: None,
                },
            );
            let local = trx_write(9, "4:1".parse().unwrap());
            let (rs, ends) = place(0, vec![commit, local]);
            s.apply(&st, &rs, ends, Durability::Sync).unwrap();
            assert_eq!(s.bl.read(None, HybridTime::MAX, 10).unwrap().0.len(), 2);
            let part = Part {
                txn: x,
                commit_ht: HybridTime(8),
                ops: vec![(b"k".to_vec(), Some(b"v".to_vec()))],
            };
            assert_eq!(s.apply_parts(&a, &[part], Durability::Sync).unwrap(), 1);
            assert_eq!(listed(&s), vec![x], "listed before the safe time passed it");
            s.raise_global_safe_time(HybridTime(7), Durability::Sync)
                .unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(
            listed(&s),
            vec![x],
            "listed after a reopen below its commit"
        );
        s.raise_global_safe_time(HybridTime(8), Durability::Sync)
            .unwrap();
        assert_eq!(listed(&s), vec![], "listed at the safe time");
        drop(s);
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(listed(&s), vec![], "listed again after a reopen");
    }

    /// The `mvcc` history filter, through a real compaction: once the retention horizon
    /// passed, versions older than the newest one at or below it are gone; reads at or
    /// after the horizon answer as before.
    #[test]
    fn compaction_drops_versions_no_read_can_see() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let a = t("a");
        let mut recs = Vec::new();
        for (i, ht) in [10u64, 20, 30, 40].into_iter().enumerate() {
            recs.push(write(ht, vec![Op::put("k", format!("v{ht}"))]));
            recs.push(write(ht + 1, vec![Op::put(format!("other{i}"), "x")]));
        }
        // A commit with a trx id at 50: expiring it raises the horizon.
        recs.push(trx_write(50, TrxId::new(1, 1)));
        let (r, end) = place(0, recs);
        s.apply(&a, &r, end, Durability::Sync).unwrap();
        let k_prefix = keys::encode(b"k", HybridTime::MAX)[..3].to_vec();
        let versions = |s: &OpenStore| -> Vec<u64> {
            s.mvcc
                .prefix(&k_prefix)
                .map(|g| keys::split(&g.key().unwrap()).unwrap().1 .0)
                .collect()
        };
        s.flush().unwrap();
        s.mvcc.major_compact().unwrap();
        assert_eq!(
            versions(&s),
            vec![40, 30, 20, 10],
            "no horizon yet: all kept"
        );
        s.set_prune_floor(HybridTime::MAX);
        assert_eq!(s.expire_binlog(HybridTime(55), 10).unwrap(), (1, true));
        assert_eq!(s.binlog_horizon().unwrap(), HybridTime(55));
        // Horizon 55 is above every version of k: only the newest (40) can be read.
        let at = |ht| s.get(b"k", Some(HybridTime(ht))).unwrap().map(|v| v.ht.0);
        assert_eq!((at(55), at(35)), (Some(40), Some(30)));
        s.mvcc.major_compact().unwrap();
        assert_eq!(versions(&s), vec![40]);
        assert_eq!(at(55), Some(40));
        assert_eq!(
            s.get(b"k", None).unwrap().unwrap().value.as_deref(),
            Some(&b"v40"[..])
        );
        assert_eq!(s.get(b"other0", None).unwrap().unwrap().ht, HybridTime(11));
    }

    /// Binlog retention prunes the `txns` records of the transactions it expires — a
    /// committed one with its binlog entry, an aborted one with its `trx_open` entry — and
    /// keeps those of younger and undecided ones.
    #[test]
    fn binlog_retention_prunes_resolved_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (a, st) = (t("a"), t("status"));
        let (x, y, z, w) = (
            TxnId::from_u128(1),
            TxnId::from_u128(2),
            TxnId::from_u128(3),
            TxnId::from_u128(4),
        );
        let intent = |ht, txn, c| {
            intent(
                ht,
                txn,
                Some(TrxId::new(9, c)),
                vec![Op::put(format!("k{c}"), "v")],
            )
        };
        let (ra, enda) = place(
            0,
            vec![
                intent(5, x, 1),
                intent(6, y, 2),
                intent(7, z, 3),
                intent(8, w, 4),
            ],
        );
        s.apply(&a, &ra, enda, Durability::Sync).unwrap();
        let commit = |ht, txn, c| {
            Record::new(
                HybridTime(ht),
                Body::Commit {
                    txn,
                    participants: vec![a.clone()],
                    trx_id: Some(TrxId::new(9, c)),
                    gtid: Some(Gtid::new(0, 1, c)),
                },
            )
        };
        let (rs, ends) = place(
            0,
            vec![
                commit(10, x, 1),
                Record::new(
                    HybridTime(11),
                    Body::Abort {
                        txn: y,
                        trx_id: Some(TrxId::new(9, 2)),
                    },
                ),
                commit(30, z, 3),
            ],
        );
        s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        let part = |txn, ht| Part {
            txn,
            commit_ht: HybridTime(ht),
            ops: vec![],
        };
        s.apply_parts(&a, &[part(x, 10), part(z, 30)], Durability::Sync)
            .unwrap();
        let known = |txn| s.txn(&txn).unwrap().is_some();
        // What a restart tells x and z's commits by: the `trx` index (no `txns` record).
        let traced = |txn, c| s.committed_as(&txn, Some(TrxId::new(9, c))).unwrap();
        let indexed = |txn: TxnId| s.aborted.contains_key(txn.0).unwrap();
        assert!(traced(x, 1) && known(y) && traced(z, 3));
        assert!(
            !known(x) && !known(z),
            "a traceable commit was written to txns"
        );
        assert!(!known(w), "an undecided transaction was written to txns");
        assert!(indexed(y) && !indexed(x) && !indexed(z) && !indexed(w));
        // Until received-log retention says what is retained, nothing expires.
        assert_eq!(s.expire_binlog(HybridTime(20), 100).unwrap(), (0, true));
        // Records at ht ≥ 10 retained (x's intents could be there): x's record stays.
        s.set_prune_floor(HybridTime(10));
        assert_eq!(s.expire_binlog(HybridTime(20), 100).unwrap(), (0, true));
        assert!(
            traced(x, 1) && known(y),
            "pruned while the floor is at the commit"
        );
        // Nothing retained below 20: x's commit and y's abort go, with their records; z
        // (committed at 30) stays, and w stays undecided in the cache.
        s.set_prune_floor(HybridTime(25));
        let (n, done) = s.expire_binlog(HybridTime(20), 100).unwrap();
        assert_eq!((n, done), (1, true));
        assert!(!traced(x, 1), "the expired commit's trx index entry stayed");
        assert!(!known(y), "the expired abort's record stayed");
        assert!(!indexed(y), "the expired abort stayed in the aborted index");
        assert!(traced(z, 3));
        let sw = s.txn_state(&w).unwrap().unwrap();
        assert!(sw.commit.is_none() && !sw.aborted && sw.intents.contains_key(&a));
    }

    /// An aborted transaction whose intent arrives after the abort (in ht too) keeps its
    /// record while that intent's ht is at or above the prune floor.
    #[test]
    fn expiry_keeps_an_abort_with_a_late_intent_above_the_floor() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (a, b, st) = (t("a"), t("b"), t("status"));
        let x = TxnId::from_u128(1);
        let id = TrxId::new(9, 1);
        let (ra, enda) = place(0, vec![intent(5, x, Some(id), vec![])]);
        s.apply(&a, &ra, enda, Durability::Sync).unwrap();
        let (rs, ends) = place(0, vec![abort(10, x, Some(id))]);
        s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        // The late intent on b, at ht 15: the record is written again with it.
        let (rb, endb) = place(0, vec![intent(15, x, Some(id), vec![])]);
        s.apply(&b, &rb, endb, Durability::Sync).unwrap();
        let rec = s.txn(&x).unwrap().unwrap();
        assert!(rec.aborted && rec.intents.contains_key(&b), "{rec:?}");
        s.set_prune_floor(HybridTime(12));
        s.expire_binlog(HybridTime(20), 100).unwrap();
        assert!(
            s.txn(&x).unwrap().is_some(),
            "pruned with an intent above the floor"
        );
        s.set_prune_floor(HybridTime(16));
        s.expire_binlog(HybridTime(20), 100).unwrap();
        assert!(
            s.txn(&x).unwrap().is_none(),
            "kept once the floor passed its intents"
        );
        assert!(s.bl.trx_open(id).unwrap().is_none());
    }

    /// A late intent of a transaction aborted before a reopen (and of one aborted after it)
    /// is recognised as the aborted transaction's, not taken for a new undecided one: the
    /// filter in front of the `aborted` keyspace is rebuilt at open and fed by every abort.
    #[test]
    fn a_late_intent_after_an_abort_is_recognised_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b, st) = (t("a"), t("b"), t("status"));
        let (x, y) = (TxnId::from_u128(1), TxnId::from_u128(2));
        let (ix, iy) = (TrxId::new(9, 1), TrxId::new(9, 2));
        {
            let s = Store::open(dir.path()).unwrap();
            let (ra, enda) = place(0, vec![intent(5, x, Some(ix), vec![])]);
            s.apply(&a, &ra, enda, Durability::Sync).unwrap();
            let (rs, ends) = place(0, vec![abort(10, x, Some(ix))]);
            s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        let from = s.tablet(&st).unwrap().unwrap().applied_pos.0;
        let (rs, ends) = place(from, vec![abort(11, y, Some(iy))]);
        s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        let (rb, endb) = place(
            0,
            vec![
                intent(15, x, Some(ix), vec![]),
                intent(16, y, Some(iy), vec![]),
            ],
        );
        s.apply(&b, &rb, endb, Durability::Sync).unwrap();
        for txn in [x, y] {
            let st = s.txn_state(&txn).unwrap().unwrap();
            assert!(
                st.aborted && st.intents.contains_key(&b),
                "{txn}: late intent taken for a new transaction: {st:?}"
            );
        }
        // Neither is held as undecided: b's release is not kept at the late intents.
        let floors = s.retention_floors().unwrap().unwrap();
        assert_eq!(floors[&b].intent, None, "{floors:?}");
    }

    /// Expiring an aborted attempt of a trx id whose retry (same trx id, newer) is
    /// undecided keeps the retry's `trx_open` entry: the time index is checked against it.
    #[test]
    fn expiry_keeps_a_retry_that_replaced_an_aborted_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let (a, st) = (t("a"), t("status"));
        let id = TrxId::new(9, 2);
        let (first, retry) = (TxnId::from_u128(1), TxnId::from_u128(2));
        let intent = |ht, txn| intent(ht, txn, Some(id), vec![]);
        let (ra, _) = place(0, vec![intent(5, first), intent(12, retry)]);
        s.apply(&a, &ra[..1], ra[1].0, Durability::Sync).unwrap();
        let (rs, ends) = place(0, vec![abort(11, first, Some(id))]);
        s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        let o = s.bl.trx_open(id).unwrap().unwrap();
        assert_eq!((o.kind, o.txn), (OpenKind::Aborted, first));
        let (_, enda) = place(0, vec![intent(5, first), intent(12, retry)]);
        s.apply(&a, &ra[1..], enda, Durability::Sync).unwrap();
        let o = s.open_trx(id).unwrap().unwrap();
        assert_eq!((o.kind, o.txn), (OpenKind::Pending, retry));
        // A binlog entry below 20, so that expiry runs to the end and expires opens.
        let (rw, endw) = place(enda.0, vec![trx_write(13, TrxId::new(1, 1))]);
        s.apply(&a, &rw, endw, Durability::Sync).unwrap();
        s.set_prune_floor(HybridTime::MAX);
        assert_eq!(s.expire_binlog(HybridTime(20), 10).unwrap(), (1, true));
        let o = s.open_trx(id).unwrap().unwrap();
        assert_eq!(
            (o.kind, o.txn),
            (OpenKind::Pending, retry),
            "the retry's entry went"
        );
        assert!(
            s.bl.trx_open(id).unwrap().is_none(),
            "the expired abort stayed"
        );
        assert_eq!(
            s.bl.open_aborts.iter().count(),
            0,
            "the stale index entry stayed"
        );
    }

    #[test]
    fn corrupt_values_are_named_errors() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let x = TxnId::from_u128(0x2a);
        s.txns.insert(x.0, vec![1u8, 0, 3]).unwrap();
        let e = s.txn(&x).unwrap_err().to_string();
        assert!(
            e.contains("txn 0000000000000000000000000000002a in keyspace txns"),
            "{e}"
        );
        s.meta.insert(b"tablet/a", vec![1u8]).unwrap();
        let e = s.tablet(&t("a")).unwrap_err().to_string();
        assert!(e.contains("tablet a in keyspace meta"), "{e}");
        s.mvcc
            .insert(keys::encode(b"k", HybridTime(1)), vec![7u8])
            .unwrap();
        let e = s.get(b"k", None).unwrap_err().to_string();
        assert!(e.contains("unknown value tag 7"), "{e}");
        s.mvcc.insert(vec![b'z', 0, 9], vec![1u8]).unwrap();
        assert!(matches!(s.scan(b"z", None, 10), Err(Error::Key(_))));
        assert!(matches!(s.scan(b"k", None, 10), Err(Error::Corrupt { .. })));
        // The tablet records are scanned when the store opens.
        s.persist().unwrap();
        drop(s);
        let e = Store::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("tablet a in keyspace meta"), "{e}");
    }

    #[test]
    fn txn_and_meta_encodings_roundtrip() {
        let mut st = TxnState {
            aborted: true,
            trx_id: Some(TrxId::new(1, u64::MAX)),
            gtid: Some(Gtid::new(u32::MAX, 2, 3)),
            commit: Some(CommitInfo {
                commit_ht: HybridTime(77),
                tablet: t("s"),
                pos: WalPos(123),
                participants: vec![t("a"), t("b")],
            }),
            ..TxnState::default()
        };
        st.intents.insert(
            t("a"),
            vec![IntentRef {
                pos: WalPos(1),
                ht: HybridTime(2),
            }],
        );
        let enc = encode_txn(&st).unwrap();
        assert_eq!(decode_txn(&enc).unwrap(), st);
        for cut in 0..enc.len() {
            assert!(decode_txn(&enc[..cut]).is_err());
        }
        let m = TabletMeta {
            applied_pos: WalPos(9),
            safe_time: HybridTime(10),
            registered: true,
            owner: Some("o".into()),
            applied_records: 42,
        };
        let enc = encode_tablet_meta(&m).unwrap();
        assert_eq!(decode_tablet_meta(&enc).unwrap(), m);
        for cut in 0..enc.len() {
            assert!(decode_tablet_meta(&enc[..cut]).is_err());
        }
    }

    #[test]
    fn global_safe_time_is_monotone_and_role_persists() {
        let dir = tempfile::tempdir().unwrap();
        {
            let s = Store::open(dir.path()).unwrap();
            assert_eq!(s.global_safe_time().unwrap(), None);
            assert_eq!(
                s.raise_global_safe_time(HybridTime(10), Durability::Sync)
                    .unwrap(),
                HybridTime(10)
            );
            assert_eq!(
                s.raise_global_safe_time(HybridTime(5), Durability::Sync)
                    .unwrap(),
                HybridTime(10)
            );
            assert_eq!(s.role().unwrap(), Role::Standby);
            s.set_role(Role::Primary).unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.global_safe_time().unwrap(), Some(HybridTime(10)));
        assert_eq!(s.role().unwrap(), Role::Primary);
    }

    #[test]
    fn a_store_in_use_is_refused_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let _first = Store::open(dir.path()).unwrap();
        let e = Store::open(dir.path()).unwrap_err().to_string();
        assert!(e.contains("locked by another process"), "{e}");
        assert!(
            e.contains(&dir.path().join("store").display().to_string()),
            "{e}"
        );
    }
}
