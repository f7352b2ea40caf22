//! The binlog's retention thread (`binlog-retention`). The binlog itself — its keyspaces,
//! look-ups and encodings — lives with the store in `store/binlog.rs` and is re-exported
//! here, so `tidelog_applier::binlog::…` names it as before (docs/ARCHITECTURE.md, "Binlog
//! and trx_status"; layouts in `applier/STORE.md`).
//!
//! The thread sits above the store and the consistency core: it asks the one for the
//! published safe time and tells the other what to expire, so it cannot live in the store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tidelog_wal::HybridTime;

use crate::consistency::Consistency;
use crate::error::{Error, Result};
use crate::periodic::Periodic;
pub use crate::store::binlog::*;
use crate::store::Store;

/// Binlog retention (`binlog-retention`): a thread that removes entries whose `commit_ht`
/// is older than the retention (and below safe time), in batches, every tenth of the
/// retention (between 100 ms and 1 min). Stops when dropped.
#[derive(Debug)]
pub struct Retention {
    /// Held for its `Drop`: stops and joins the thread.
    _thread: Periodic,
}

/// Entries removed per store batch by retention.
const EXPIRE_BATCH: usize = 10_000;

impl Retention {
    pub fn start(
        store: Arc<Store>,
        consistency: Arc<Consistency>,
        retention: Duration,
    ) -> Result<Retention> {
        let every = (retention / 10).clamp(Duration::from_millis(100), Duration::from_secs(60));
        let p = Periodic::start("binlog-retention", every, move || {
            let Some(safe) = consistency.safe_time() else {
                return;
            };
            // A retention reaching before the epoch keeps everything.
            let horizon = SystemTime::now()
                .checked_sub(retention)
                .map_or(HybridTime::MIN, HybridTime::from_system_time);
            let before = horizon.min(safe.next());
            loop {
                match store.expire_binlog(before, EXPIRE_BATCH) {
                    Ok((n, done)) => {
                        if n > 0 {
                            tracing::debug!(removed = n, %before, "binlog retention");
                        }
                        if done {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::error!("binlog retention: {e}");
                        break;
                    }
                }
            }
        })
        .map_err(|source| Error::Io {
            op: "spawn the binlog retention thread",
            path: Default::default(),
            source,
        })?;
        Ok(Retention { _thread: p })
    }
}
