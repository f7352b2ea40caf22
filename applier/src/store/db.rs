//! The store's fjall database and its nine keyspaces ([`Tables`]): opening it with the
//! options `schema.rs` gives each keyspace, committing a batch within the bound on the
//! memtables (`write_buffer.rs`), and what it holds in memory and on disk.
//!
//! Everything above writes by filling one `OwnedWriteBatch` and handing it to
//! [`Tables::commit`]; nothing here knows what the keys mean.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use fjall::{Database, Keyspace, KeyspaceCreateOptions, OwnedWriteBatch, PersistMode};

use super::history::HistoryFactory;
use super::schema::{
    aborted_options, lookup_options, ABORTED, BINLOG, GTID, META, MVCC, OPEN_ABORTS, TRX, TRX_OPEN,
    TXNS,
};
use super::types::Durability;
use super::write_buffer::{WriteBuffer, WriteBufferStats, DEFAULT_WRITE_BUFFER_SIZE};
use crate::error::{Error, Result};

/// The default block cache: 256 MiB (fjall's own default is 32 MiB).
pub const DEFAULT_CACHE_SIZE: u64 = 256 << 20;

/// The name fjall gives its flush and compaction worker threads.
pub const WORKER_THREAD: &str = "fjall:worker";

/// Memtables recovered from the journal at least this large are flushed at once
/// ([`Tables::flush_recovered_journal`]).
const RECOVERED_FLUSH_MIN: u64 = 8 << 20;

/// How the store is opened: its memory (see `STORE.md`, "Memory").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoreOptions {
    /// The block cache, shared by every keyspace (`cache-size`).
    pub cache_size: u64,
    /// The bound on all memtables together (`write-buffer-size`, `store/write_buffer.rs`).
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

/// The opened database and a handle on each keyspace.
pub(super) struct Tables {
    pub(super) db: Database,
    pub(super) mvcc: Keyspace,
    pub(super) txns: Keyspace,
    pub(super) aborted: Keyspace,
    pub(super) meta: Keyspace,
    pub(super) binlog: Keyspace,
    pub(super) trx: Keyspace,
    pub(super) trx_open: Keyspace,
    pub(super) gtid: Keyspace,
    pub(super) open_aborts: Keyspace,
    /// The bound on the memtables (`write-buffer-size`).
    write_buffer: WriteBuffer,
}

impl Tables {
    /// Opens (creating if needed) the database at `path` with the block cache of `opts`;
    /// `mvcc` compactions drop the versions older than `horizon` that no read can see
    /// (`history.rs`).
    pub(super) fn open(
        path: &Path,
        opts: &StoreOptions,
        horizon: Arc<AtomicU64>,
    ) -> Result<Tables> {
        let db = Database::builder(path)
            .cache_size(opts.cache_size)
            .with_compaction_filter_factories(Arc::new(move |name: &str| {
                type F = Arc<dyn fjall::compaction::filter::Factory>;
                match name {
                    MVCC => Some(Arc::new(HistoryFactory {
                        horizon: horizon.clone(),
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
        let lookup = |name: &'static str| {
            db.keyspace(name, lookup_options)
                .map_err(Error::store("open keyspace"))
        };
        let (mvcc, txns, meta) = (ks(MVCC)?, ks(TXNS)?, ks(META)?);
        let aborted = db
            .keyspace(ABORTED, aborted_options)
            .map_err(Error::store("open keyspace"))?;
        Ok(Tables {
            binlog: ks(BINLOG)?,
            trx: lookup(TRX)?,
            trx_open: lookup(TRX_OPEN)?,
            gtid: lookup(GTID)?,
            open_aborts: ks(OPEN_ABORTS)?,
            db,
            mvcc,
            txns,
            aborted,
            meta,
            write_buffer: WriteBuffer::new(opts.write_buffer_size),
        })
    }

    /// Sets the memtables that journal recovery refilled flushing in the background when
    /// they are large. Until they are flushed, the next opening replays the same journal
    /// again: an applier restarted over and over (a crash loop, SIGKILLs under load)
    /// otherwise replayed ever more of it at each start, and its starts grew from about a
    /// second to tens of seconds.
    pub(super) fn flush_recovered_journal(&self) {
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

    pub(super) fn batch(&self) -> OwnedWriteBatch {
        self.db.batch()
    }

    /// Commits `batch`, then keeps the memtables within their bound.
    pub(super) fn commit(&self, batch: OwnedWriteBatch, durability: Durability) -> Result<()> {
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
    pub(super) fn write_stall(&self) {
        self.write_buffer.stall(&self.db, &self.keyspaces());
    }

    /// Every keyspace, with its name.
    fn keyspaces(&self) -> [(&'static str, &Keyspace); 9] {
        [
            (MVCC, &self.mvcc),
            (TXNS, &self.txns),
            (ABORTED, &self.aborted),
            (META, &self.meta),
            (BINLOG, &self.binlog),
            (TRX, &self.trx),
            (TRX_OPEN, &self.trx_open),
            (GTID, &self.gtid),
            (OPEN_ABORTS, &self.open_aborts),
        ]
    }

    /// Makes everything committed so far durable (fsync of the journal).
    pub(super) fn persist(&self) -> Result<()> {
        self.db
            .persist(PersistMode::SyncAll)
            .map_err(Error::store("persist"))
    }

    /// Writes every keyspace's memtable out to tables and waits for it (the journal then
    /// holds nothing to replay). Used after bulk loads and before shutdown-free measurements.
    pub(super) fn flush(&self) -> Result<()> {
        for (_, ks) in self.keyspaces() {
            ks.rotate_memtable_and_wait()
                .map_err(Error::store("flush memtable"))?;
        }
        Ok(())
    }

    /// Reads the `trx_status` look-up keyspaces (trx, gtid, trx_open) through once, which
    /// loads their data blocks into the block cache, so that look-ups then read no block
    /// from the file system. Worth it only while those keyspaces fit in `cache-size`
    /// ([`Tables::disk_sizes`]). Returns the entries read.
    /// Stops early (between two blocks of entries) once `stop` is set.
    pub(super) fn warm_lookup_cache(&self, stop: &AtomicBool) -> Result<u64> {
        let mut n = 0u64;
        for ks in [&self.trx, &self.gtid, &self.trx_open] {
            for g in ks.iter() {
                g.key().map_err(Error::store("warm the block cache"))?;
                n += 1;
                if n % 4096 == 0 && stop.load(Ordering::Relaxed) {
                    return Ok(n);
                }
            }
        }
        Ok(n)
    }

    /// Whether fjall has no flush or compaction running or queued.
    pub(super) fn background_idle(&self) -> bool {
        self.db.outstanding_flushes() == 0 && self.db.active_compactions() == 0
    }

    /// On-disk bytes of the `trx_status` look-up keyspaces' tables (trx, gtid, trx_open).
    pub(super) fn lookup_index_bytes(&self) -> u64 {
        [&self.trx, &self.gtid, &self.trx_open]
            .iter()
            .map(|ks| ks.disk_space())
            .sum()
    }

    /// On-disk bytes and table count (all levels, level 0) of each keyspace, by name.
    pub(super) fn disk_sizes(&self) -> Vec<(&'static str, u64, usize, usize)> {
        self.keyspaces()
            .into_iter()
            .map(|(n, ks)| (n, ks.disk_space(), ks.table_count(), ks.l0_table_count()))
            .collect()
    }

    /// fjall's write pressure, for the log of a slow batch: per keyspace with any, its sealed
    /// memtables and level-0 tables (fjall halts writes at 4 sealed memtables and slows
    /// them from 20 level-0 runs), then flushes queued, compactions running, journals.
    pub(super) fn lsm_pressure(&self) -> String {
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

    /// What the database holds in memory now; the transaction counts are the caller's.
    pub(super) fn memory(&self) -> StoreMemory {
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
        StoreMemory {
            write_buffer_stats: self.write_buffer.stats(),
            block_cache: self.db.cache_size(),
            block_cache_capacity: self.db.cache_capacity(),
            write_buffer: self.db.write_buffer_size(),
            journals: self.db.journal_count(),
            keyspaces,
            ..StoreMemory::default()
        }
    }
}

/// What fjall's error `e` at opening the store under `dir` means, in words, with the
/// files it concerns where fjall does not name them: its journal (`*.jnl`) when that is
/// what does not recover. fjall's own form ends it.
pub(super) fn describe_open_error(e: &fjall::Error, dir: &Path) -> String {
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
