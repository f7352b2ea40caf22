//! `tidelog-applier`: the target side (docs/ARCHITECTURE.md, "The applier"): QUIC intake
//! into per-tablet received logs, apply into the MVCC store, safe time, reads, binlog,
//! `trx_status` and cutover.
//!
//! Its front door is [`node::Applier`]: `Applier::open(ApplierOptions)` starts all of it,
//! and its typed calls (status, reads, safe time, `trx_status`, binlog, promote, pause,
//! metrics, shutdown) are what a daemon or a test uses. The other modules are its parts.

pub mod apply;
pub mod binlog;
pub mod consistency;
pub mod core;
pub mod cutover;
pub mod disk;
mod doorbell;
pub mod endpoint;
pub mod error;
mod frame_queue;
pub mod intake;
pub mod keys;
pub mod latency;
pub mod node;
mod periodic;
pub mod priority;
pub mod retention;
mod seq_wait;
pub mod store;
pub mod trx;
pub mod trx_json;
