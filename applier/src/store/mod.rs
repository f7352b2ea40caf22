//! `Store`: the applier's fjall database — MVCC data, transactions, the binlog and meta
//! (layouts: `applier/STORE.md`).
//!
//! [`Store::apply`] writes everything a run of records of one tablet implies — data,
//! transaction state, binlog entries and the tablet's new apply position — in **one**
//! atomic fjall batch, so after a crash the store is at some batch boundary and the apply
//! position says exactly which records it holds. Records below that position are skipped:
//! nothing is applied twice. Read-modify-write of `txns` and `meta` (a transaction's record
//! is touched by the apply workers of all its participants and its status tablet) is
//! serialized by one lock held while a batch is prepared; reads take no lock.
//!
//! The files form a DAG (checked by `tests/module_graph.rs`): each one names only those
//! below it, and data passes down as a value — a write goes into the batch the file above
//! hands down, and only `batch.rs` and the short sequences in `meta.rs`, `cutover.rs` and
//! `prune.rs` commit one.
//!
//! ```text
//!  mod.rs      this facade: re-exports
//!  reopen.rs   Store: the current opening, replaced after a failed write
//!  open.rs     OpenStore: one opening, made of the parts below
//!  batch.rs    one tablet's apply batch: records, committed parts
//!  rebuild.rs  unresolved transactions rebuilt from the received logs; pending ones;
//!              received-log retention floors
//!  prune.rs    binlog retention: expiry, horizon, prune floor
//!  cutover.rs  the cut, the report, the clean-up
//!  meta.rs     tablet records, global safe time, role
//!  txns.rs     the cache of unresolved transactions, write lock, commit order
//!  binlog.rs   the binlog and its trx, gtid and trx_open indexes
//!  mvcc.rs     versions: write at ht, get and scan at a time
//!  db.rs       the fjall database, its keyspaces, commit within the memtable bound
//!  history.rs  mvcc compaction filter   write_buffer.rs  memtable bound
//!  bloom.rs    filter of aborted ids
//!  codec.rs    every value's encoding   schema.rs  keyspaces, keys   types.rs  values
//! ```

mod batch;
pub mod binlog;
mod bloom;
mod codec;
mod cutover;
mod db;
mod history;
mod meta;
mod mvcc;
mod open;
mod prune;
mod rebuild;
mod reopen;
mod schema;
mod txns;
mod types;
mod write_buffer;

#[cfg(test)]
mod tests;

pub use codec::{
    decode_cutover, decode_tablet_meta, decode_txn, decode_value, encode_cutover,
    encode_tablet_meta, encode_txn, encode_value,
};
pub use db::{KeyspaceMemory, StoreMemory, StoreOptions, DEFAULT_CACHE_SIZE, WORKER_THREAD};
pub use open::OpenStore;
pub(crate) use rebuild::read_release;
pub use rebuild::Rebuilt;
pub use reopen::{BinlogRef, Store, REOPEN_MIN_FREE};
pub use schema::{ABORTED, META, MVCC, TXNS};
pub use types::{
    ApplyOutcome, CommitInfo, Cutover, CutoverReport, Durability, IntentRef, Part, RetentionFloor,
    Role, TabletMeta, TxnState, Version,
};
pub use write_buffer::{WriteBufferStats, DEFAULT_WRITE_BUFFER_SIZE, MIN_WRITE_BUFFER_SIZE};
