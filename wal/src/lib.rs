//! `tidelog-wal`: the source-side write-ahead log of tidelog.
//!
//! A tablet's log is a directory of preallocated, memory-mapped segment files holding
//! checksummed records (`write`, `intent`, `commit`, `abort`, `heartbeat`) in strictly
//! increasing hybrid time. This crate contains the ids and time types, the record model and
//! its on-disk format (`wal/FORMAT.md`), the [`Writer`] with its sync policies, the
//! [`Reader`] that another process may run while the writer writes, recovery of a torn tail,
//! retention against the shipper's `acked` file, the checks of a run of encoded records
//! ([`verify`]), and the JSON form of records used by `tidelog wal dump|append`. (The source
//! session that hands out trx ids and gtids is in the test kit, `tidelog-testkit`.)
//!
//! It contains no networking code (the wire protocol is `tidelog-proto`'s, the sockets
//! `tidelog-net`'s) and starts no threads except the group-commit flusher of a writer
//! opened with [`SyncPolicy::Batch`].

pub mod control;
mod direct;
pub mod error;
pub mod format;
mod fsutil;
pub mod hash;
pub mod heartbeat;
pub mod ids;
pub mod json;
pub mod pos;
pub mod reader;
pub mod record;
pub mod recovery;
pub mod retention;
mod segment;
pub mod time;
pub mod verify;
pub mod writer;

pub use direct::supported as direct_io_supported;
pub use error::{Error, ParseError, Result};
pub use fsutil::{write_atomic, write_atomic_private};
pub use heartbeat::Heartbeat;
pub use ids::{Gtid, TabletId, TrxId, TxnId};
pub use pos::{AtomicWalPos, WalPos};
pub use reader::{ReadLimit, Reader};
pub use record::{Body, Op, Record};
pub use recovery::RecoveryReport;
pub use time::{HybridClock, HybridTime};
pub use writer::{SyncPolicy, WalOptions, Writer};
