//! What one tablet's apply stage shares between the worker's handles and the thread
//! applying it ([`Shared`]), why it stopped ([`ApplyFault`]), how its received log is read
//! ([`ReceivedReads`]) and the settings its loop runs with ([`LoopSettings`]). The bottom
//! of `apply/`: it names none of the other files.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tidelog_wal::{AtomicWalPos, Heartbeat, HybridTime, TabletId, WalPos};

use crate::consistency::Consistency;
use crate::doorbell::Doorbell;
use crate::error::Error;
use crate::latency::LatencyHistogram;
use crate::store::Durability;

/// How the apply stage reads a received log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReceivedReads {
    /// Through the page cache.
    #[default]
    Buffered,
    /// With `O_DIRECT` (`Reader::set_direct_io`): for a log the intake writes so
    /// (`IntakeOptions::direct_io`), whose bytes are not in the page cache; a buffered read
    /// would bring them into it from the device and copy them out.
    Direct,
    /// With `O_DIRECT` when [`crate::intake::RECEIVED_CACHE_KEEP`] or more behind the
    /// received end, where the intake has dropped a buffered log from the page cache, and
    /// through the cache closer to it (`Reader::set_direct_backlog_reads`).
    DirectBacklogs,
}

impl ReceivedReads {
    /// For the received logs under `received`, written with `O_DIRECT` when `direct_writes`
    /// (`IntakeOptions::direct_io`) and the file system takes it, as the intake decides.
    pub fn for_logs(received: &Path, direct_writes: bool) -> ReceivedReads {
        let direct_ok =
            std::fs::create_dir_all(received).is_ok() && tidelog_wal::direct_io_supported(received);
        match (direct_ok, direct_writes) {
            (false, _) => ReceivedReads::Buffered,
            (true, true) => ReceivedReads::Direct,
            (true, false) => ReceivedReads::DirectBacklogs,
        }
    }
}

/// What a tablet's loop runs with: its [`super::ApplyConfig`] without the thread group,
/// which the loop must not hold (its last handle would be dropped, and the threads
/// joined, on one of those threads). Each field is documented on `ApplyConfig`.
#[derive(Clone, Debug)]
pub(super) struct LoopSettings {
    pub(super) batch_bytes: u64,
    pub(super) batch_records: usize,
    pub(super) poll_interval: Duration,
    pub(super) durability: Durability,
    pub(super) persist_interval: Duration,
    pub(super) consistency: Option<Arc<Consistency>>,
    pub(super) reads: ReceivedReads,
    pub(super) count_below: WalPos,
}

/// How an apply thread is woken, and whether it has ended: shared by the thread's lane and
/// every tablet on it.
#[derive(Debug)]
pub(super) struct Wake {
    pub(super) bell: Doorbell,
    /// The thread has ended (normally, or by a panic outside a tablet's step).
    pub(super) exited: AtomicBool,
}

/// One tablet's apply state shared between its [`super::ApplyWorker`], its
/// [`super::ApplyProgress`] handles and the thread applying it.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) tablet: TabletId,
    pub(super) applied_pos: AtomicWalPos,
    pub(super) safe_time: AtomicU64,
    pub(super) stop: AtomicBool,
    pub(super) running: AtomicBool,
    /// The thread applying this tablet: rung for more to read, ready parts, or stop.
    pub(super) wake: Arc<Wake>,
    /// Callers blocked on `progress_cv` in [`ApplyWorker::wait_applied`] (notified only
    /// when some are: a condvar notify is a system call, waiter or not).
    pub(super) progress_waiters: Mutex<usize>,
    /// Wakes `wait_applied` callers after each batch and when the worker ends.
    pub(super) progress_cv: Condvar,
    pub(super) fault: Mutex<Option<ApplyFault>>,
    /// What the worker holds on while it runs: a full disk or a store being reopened
    /// ([`Error::is_retryable`]). Cleared once it applies again.
    pub(super) held: Mutex<Option<ApplyFault>>,
    /// Beats once per loop iteration (each bounded by `poll_interval` when idle).
    pub(super) heartbeat: Heartbeat,
    /// Records applied by this worker below [`ApplyConfig::count_below`].
    pub(super) records_below: AtomicU64,
    /// Records and received-log bytes applied by this worker since it started.
    pub(super) applied_records: AtomicU64,
    pub(super) applied_bytes: AtomicU64,
    /// Wall time of each `Store::apply` batch.
    pub(super) batch_latency: LatencyHistogram,
    /// Age of each batch's newest record once the batch is in the store (the `applied` lag
    /// stage).
    pub(super) applied_age: LatencyHistogram,
}

impl Shared {
    pub(super) fn progress(&self) -> MutexGuard<'_, usize> {
        // A count: a panic elsewhere cannot leave it inconsistent.
        self.progress_waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn wait_applied(&self, pos: WalPos, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut g = self.progress();
        loop {
            if self.applied_pos.load() >= pos {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.running.load(Ordering::Acquire) {
                return false;
            }
            *g += 1;
            g = self
                .progress_cv
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            *g -= 1;
        }
    }

    pub(super) fn publish(&self, pos: WalPos, safe: HybridTime) {
        // Release stores: a reader that sees `pos` sees the store batch committed before.
        self.safe_time.fetch_max(safe.0, Ordering::Release);
        self.applied_pos.store(pos);
        // A waiter checks `applied_pos` under this lock before it sleeps, so it either sees
        // the new position or is counted here.
        if *self.progress() > 0 {
            self.progress_cv.notify_all();
        }
    }

    /// The fault that stopped the worker, else the one it holds on.
    pub(super) fn fault(&self) -> Option<ApplyFault> {
        self.fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .or_else(|| self.held())
    }

    pub(super) fn held(&self) -> Option<ApplyFault> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wakes the worker (more to read, ready parts, or stop).
    pub(super) fn notify(&self) {
        self.wake.bell.ring();
    }
}

/// Why and where a tablet's apply stage stopped ([`super::ApplyWorker::fault`]).
#[derive(Clone, Debug)]
pub struct ApplyFault {
    /// The tablet's apply position when it stopped: the received-log position of the
    /// first record not applied (for a rejected record, that record's).
    pub pos: WalPos,
    pub error: Arc<Error>,
}

impl ApplyFault {
    /// The tablet's state in status and metrics ([`Error::tablet_state`]).
    pub fn state(&self) -> &'static str {
        self.error.tablet_state()
    }
}

impl std::fmt::Display for ApplyFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A full disk does not stop the tablet: it waits there and goes on by itself.
        let how = if self.error.is_retryable() {
            "waits"
        } else {
            "stopped"
        };
        write!(
            f,
            "apply {how} at received-log position {}: {}",
            self.pos, self.error
        )
    }
}

thread_local! {
    /// The tablet the current thread is applying (for the panic hook's report).
    static APPLYING: std::cell::RefCell<Option<TabletId>> = const { std::cell::RefCell::new(None) };
}

/// The tablet this thread is applying a step of, if it is an apply thread in a step (the
/// daemons' panic hook names it).
pub fn current_tablet() -> Option<TabletId> {
    APPLYING.with(|a| a.borrow().clone())
}

/// Sets [`current_tablet`] for its lifetime (also while unwinding).
pub(super) struct Applying;

impl Applying {
    pub(super) fn enter(t: &TabletId) -> Applying {
        APPLYING.with(|a| *a.borrow_mut() = Some(t.clone()));
        Applying
    }
}

impl Drop for Applying {
    fn drop(&mut self) {
        APPLYING.with(|a| *a.borrow_mut() = None);
    }
}
