//! The applier's front door: [`Applier::open`] starts the whole target side from
//! [`ApplierOptions`] — the store, the QUIC intake, the apply workers, the safe time,
//! binlog retention, received-log retention and, on a promoted target, the cutover's
//! clean-up — and the typed calls on [`Applier`] are everything a caller (the daemon's
//! admin API, tests) does with it: `status`, `read`, `scan`, `safe_time`, `trx_status`,
//! `binlog`, `gtid_current_pos`, `wait_gtid_pos`, `promote`, `pause`, `metrics`,
//! `shutdown`. Errors are [`Error`], one variant
//! per answer a caller branches on.
//!
//! ```text
//!  node/
//!    mod.rs          this facade: re-exports
//!    applier.rs      Applier, ApplierOptions: open, recover, pause, shutdown
//!    workers.rs      the apply workers by tablet, start-up replay
//!    read.rs         ReadMode, the read time and staleness policy, read, scan
//!    safe_time.rs    the safe time per tablet and overall, waiting for it
//!    trx_wait.rs     trx_status with its async wait
//!    gtid_pos.rs     gtid positions: the visible one, waiting for one
//!    binlog_read.rs  the visible binlog from a gtid (expired or not visible)
//!    promote.rs      the cutover sequence
//!    status.rs       status, liveness
//!    metrics.rs      the applier's metric families
//!    warm.rs         pre-loading the look-up indexes
//!    waiters.rs      the places for requests that wait
//!    error.rs        Error
//! ```

mod applier;
mod binlog_read;
mod error;
mod gtid_pos;
mod metrics;
mod promote;
mod read;
mod safe_time;
mod status;
mod trx_wait;
mod waiters;
mod warm;
mod workers;

pub use applier::{Applier, ApplierOptions};
pub use binlog_read::BinlogPage;
pub use error::{Error, Result};
pub use gtid_pos::{wait_seconds, GtidPos};
pub use metrics::tablet_states;
pub use read::{Read, ReadMode, Scan};
pub use safe_time::{SafeTimeStatus, TabletSafeTime};
pub use status::{CutoverStatus, NiceStatus, Setting, Status, StoreStatus, TabletStatus};
pub use trx_wait::MAX_TRX_WAIT;
pub use waiters::{WaitLimit, MAX_WAITERS};
pub use warm::WarmState;
