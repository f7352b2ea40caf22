//! What the store's fjall database holds: its keyspaces (with the options each is created
//! with), the keys of `meta`, and the layouts of the binlog's keys. The `mvcc` key
//! encoding is `crate::keys`; values are in `codec.rs`. Everything is drawn in
//! `applier/STORE.md`.
//!
//! ```text
//!  mvcc         keys::encode(key, ht)                → 00 | 01 ‖ value
//!  txns         txn id (16 bytes)                    → TxnState
//!  aborted      txn id (16 bytes)                    → ``
//!  meta         tablet/<id> | global/…               → TabletMeta | u64 | u8 | Cutover
//!  binlog       BE commit_ht ‖ carrier tablet        → BinlogEntry
//!  trx          BE connect_id ‖ BE counter           → TrxCommit
//!  trx_open     BE connect_id ‖ BE counter           → TrxOpen (aborted)
//!  gtid         BE domain ‖ BE seq                   → GtidEntry
//!  open_aborts  BE ht ‖ BE connect_id ‖ BE counter   → ``
//! ```

use fjall::config::{
    BlockSizePolicy, CompressionPolicy, HashRatioPolicy, PartitioningPolicy, PinningPolicy,
};
use fjall::KeyspaceCreateOptions;
use tidelog_wal::{HybridTime, TabletId, TrxId};
use zerocopy::big_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Keyspace names.
pub const MVCC: &str = "mvcc";
pub const TXNS: &str = "txns";
/// The aborted transactions (txn id → ``): what tells a new transaction from a late intent
/// of an aborted one without searching `txns`.
pub const ABORTED: &str = "aborted";
pub const META: &str = "meta";
pub const BINLOG: &str = "binlog";
pub const TRX: &str = "trx";
pub const TRX_OPEN: &str = "trx_open";
pub const GTID: &str = "gtid";
pub const OPEN_ABORTS: &str = "open_aborts";

// ---- keyspace options ----------------------------------------------------------------------

/// Filter and index blocks of the keyspaces searched by id (`trx`, `trx_open`, `gtid`,
/// `aborted`): pinned in memory on level 0 (bounded by the write buffer), in partitions read
/// through the block cache below it (bounded by `cache-size`).
fn lookup_index_options(o: KeyspaceCreateOptions) -> KeyspaceCreateOptions {
    o.filter_block_pinning_policy(PinningPolicy::new([true, false]))
        .index_block_pinning_policy(PinningPolicy::new([true, false]))
        .filter_block_partitioning_policy(PartitioningPolicy::new([false, true]))
        .index_block_partitioning_policy(PartitioningPolicy::new([false, true]))
}

/// The `trx_status` look-up keyspaces (`trx`, `trx_open`, `gtid`) keep the filter and index
/// blocks of their level-0 tables in memory (pinned), and those of deeper levels in
/// partitions of one block, read through the block cache: a random look-up over millions
/// of ids reads (or finds cached) one small filter partition, one index partition and at
/// most one data block per level, never a whole megabyte filter block. Pinned on every
/// level, as stores created before 2026-12-08 have them, they took ~3 bytes per retained
/// commit outside `cache-size`, growing with `binlog-retention` (`STORE.md`, "Memory").
/// (Stored with the keyspace: applies to keyspaces created so.)
/// Their data blocks are one page (4 KiB), uncompressed and hash-indexed: a look-up that
/// misses the block cache reads, checksums and searches one page; one that hits it searches
/// an index a quarter the size of 1 KiB blocks' (fewer cache misses on the binary search,
/// which is most of a hit's cost once the block is cached).
pub(super) fn lookup_options() -> KeyspaceCreateOptions {
    let mut o = lookup_index_options(KeyspaceCreateOptions::default())
        .data_block_compression_policy(CompressionPolicy::disabled())
        .data_block_hash_ratio_policy(HashRatioPolicy::all(0.75));
    o.data_block_size_policy = BlockSizePolicy::all(4096);
    o
}

/// Memtable size of the `aborted` keyspace.
const ABORTED_MEMTABLE: u64 = 2 << 20;

/// `aborted` is read once per new transaction (almost always a miss) and written once per
/// abort: small memtables, so that search stays in a few cache-resident levels, and filters
/// as the look-up keyspaces have them for the misses on disk.
pub(super) fn aborted_options() -> KeyspaceCreateOptions {
    lookup_index_options(KeyspaceCreateOptions::default().max_memtable_size(ABORTED_MEMTABLE))
}

// ---- meta ----------------------------------------------------------------------------------

/// Prefix of per-tablet keys in `meta`.
pub(super) const TABLET_PREFIX: &[u8] = b"tablet/";
pub(super) const GLOBAL_SAFE_TIME: &[u8] = b"global/safe_time";
pub(super) const GLOBAL_ROLE: &[u8] = b"global/role";
pub(super) const BINLOG_HORIZON: &[u8] = b"global/binlog_horizon";
pub(super) const CUTOVER: &[u8] = b"global/cutover";
pub(super) const CUTOVER_CURSOR: &[u8] = b"global/cutover_cursor";
pub(super) const CUTOVER_REMOVED: &[u8] = b"global/cutover_removed";

/// `tablet/<id>`.
pub(super) fn tablet_key(tablet: &TabletId) -> Vec<u8> {
    [TABLET_PREFIX, tablet.as_str().as_bytes()].concat()
}

// ---- binlog keys (big-endian: they sort as numbers) ----------------------------------------

/// `trx` and `trx_open` key.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct TrxKey {
    connect_id: U64,
    commit_counter: U64,
}
const _: () = assert!(size_of::<TrxKey>() == 16);

impl TrxKey {
    fn new(t: TrxId) -> TrxKey {
        TrxKey {
            connect_id: U64::new(t.connect_id),
            commit_counter: U64::new(t.commit_counter),
        }
    }

    fn get(&self) -> TrxId {
        TrxId::new(self.connect_id.get(), self.commit_counter.get())
    }
}

/// `gtid` key.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct GtidKey {
    pub(super) domain: U32,
    pub(super) seq: U64,
}
const _: () = assert!(size_of::<GtidKey>() == 12);

/// `open_aborts` key.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
struct OpenAbortKey {
    ht: U64,
    trx: TrxKey,
}
const _: () = assert!(size_of::<OpenAbortKey>() == 24);

/// The fixed start of a `binlog` key; the carrier tablet's id follows.
#[derive(FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub(super) struct BinlogKeyHead {
    pub(super) commit_ht: U64,
}
const _: () = assert!(size_of::<BinlogKeyHead>() == 8);

pub fn binlog_key(commit_ht: HybridTime, tablet: &TabletId) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + tablet.as_str().len());
    k.extend_from_slice(
        BinlogKeyHead {
            commit_ht: U64::new(commit_ht.0),
        }
        .as_bytes(),
    );
    k.extend_from_slice(tablet.as_str().as_bytes());
    k
}

pub fn trx_key(t: TrxId) -> [u8; 16] {
    let mut k = [0u8; 16];
    k.copy_from_slice(TrxKey::new(t).as_bytes());
    k
}

pub fn gtid_key(domain: u32, seq: u64) -> [u8; 12] {
    let mut k = [0u8; 12];
    let g = GtidKey {
        domain: U32::new(domain),
        seq: U64::new(seq),
    };
    k.copy_from_slice(g.as_bytes());
    k
}

/// `open_aborts` key: `BE ht ‖ trx key`.
pub fn open_abort_key(ht: HybridTime, t: TrxId) -> Vec<u8> {
    OpenAbortKey {
        ht: U64::new(ht.0),
        trx: TrxKey::new(t),
    }
    .as_bytes()
    .to_vec()
}

pub fn decode_open_abort_key(k: &[u8]) -> Option<(HybridTime, TrxId)> {
    let k = OpenAbortKey::ref_from_bytes(k).ok()?;
    Some((HybridTime(k.ht.get()), k.trx.get()))
}
