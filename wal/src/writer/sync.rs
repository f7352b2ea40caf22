//! What the writer shares with its batch flusher: the segments that may hold unsynced
//! bytes, the synced and written ends, the poisoning of a failed sync, and the flusher's
//! loop.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::control::ControlFile;
use crate::error::{Error, Result};
use crate::pos::WalPos;
use crate::segment::MappedSegment;

impl SyncState {
    /// Drops sealed segments wholly below `synced`: they need no more syncing.
    pub(super) fn prune(&mut self) {
        while self.segs.len() > 1 && self.segs[0].limit() <= self.synced {
            self.segs.remove(0);
        }
    }
}

/// Sync state shared with the batch flusher.
#[derive(Debug)]
pub(super) struct SyncState {
    /// Segments that may hold unsynced bytes, oldest first; the last is the active one.
    pub(super) segs: Vec<Arc<MappedSegment>>,
    pub(super) synced: WalPos,
    pub(super) written: WalPos,
    pub(super) shutdown: bool,
    /// A failed sync poisons the writer: nothing after it can be claimed durable.
    pub(super) failed: Option<String>,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) state: Mutex<SyncState>,
    pub(super) wake: Condvar,
    pub(super) control: ControlFile,
    /// Set (after `SyncState::failed`) when a sync failed, so the `None` commit path can
    /// check for poisoning without taking the lock.
    pub(super) failed_flag: AtomicBool,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, SyncState> {
        // A panic while holding the lock leaves consistent data (plain positions).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// msync everything below `to` and publish it as durable.
    pub(super) fn sync_to(&self, to: WalPos) -> Result<()> {
        let (from, segs) = {
            let st = self.lock();
            if let Some(f) = &st.failed {
                return Err(poisoned(f));
            }
            if st.synced >= to {
                return Ok(());
            }
            (st.synced, st.segs.clone())
        };
        for seg in &segs {
            let lo = from.max(seg.first);
            let hi = to.min(seg.limit());
            if lo < hi {
                let synced = if seg.is_direct() {
                    seg.sync_data()
                } else {
                    seg.sync_range(lo.since(seg.first) as usize, hi.since(seg.first) as usize)
                };
                if let Err(e) = synced {
                    let mut st = self.lock();
                    st.failed = Some(e.to_string());
                    self.failed_flag.store(true, Ordering::Release);
                    tracing::error!(error = %e, "WAL sync failed; the writer is poisoned");
                    return Err(e);
                }
            }
        }
        let mut st = self.lock();
        if to > st.synced {
            st.synced = to;
        }
        st.prune();
        drop(st);
        self.control.raise_durable(to);
        Ok(())
    }
}

pub(super) fn poisoned(reason: &str) -> Error {
    Error::io(
        "sync",
        PathBuf::new(),
        std::io::Error::other(format!(
            "an earlier WAL sync failed ({reason}); the writer must be reopened"
        )),
    )
}

/// The batch flusher: syncs pending commits once `interval` has passed since the previous
/// sync, or at once when `batch_bytes` are pending. Every wait is bounded by `interval`.
pub(super) fn flusher_loop(shared: &Shared, interval: Duration, batch_bytes: u64) {
    let mut last_sync = Instant::now();
    let mut st = shared.lock();
    loop {
        if st.shutdown || st.failed.is_some() {
            return;
        }
        let pending = st.written.since(st.synced);
        let due = last_sync + interval;
        let now = Instant::now();
        if pending > 0 && (now >= due || pending >= batch_bytes) {
            let target = st.written;
            drop(st);
            // A failure poisons the writer inside sync_to; the next commit reports it.
            let _ = shared.sync_to(target);
            last_sync = Instant::now();
            shared.wake.notify_all();
            st = shared.lock();
            continue;
        }
        let wait = if pending > 0 { due - now } else { interval };
        st = shared
            .wake
            .wait_timeout(st, wait)
            .map(|(g, _)| g)
            .unwrap_or_else(|p| p.into_inner().0);
    }
}
