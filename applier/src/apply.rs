//! The apply stage of one tablet (docs/ARCHITECTURE.md, "Apply"): reads the tablet's
//! received log from the store's apply position and applies it in batches with
//! [`Store::apply`].
//!
//! An [`ApplyWorker`] runs on a thread of an [`ApplyThreads`] group (its own, unless
//! [`ApplyConfig::threads`] names a shared one: a thread then takes its tablets in turn, one
//! batch each per round, and sleeps only when none of them has work). It opens a [`Reader`] with
//! [`ReadLimit::Durable`] on `received/<tablet>/` (waiting while the log does not exist
//! yet), seeks to the tablet's persisted `applied_pos`, reads what is durable in batches of
//! at most [`ApplyConfig::batch_bytes`] / [`ApplyConfig::batch_records`], applies each batch
//! atomically, and then sleeps until [`ApplyWorker::notify`] (the intake calls it after each
//! durable append) or the fallback [`ApplyConfig::poll_interval`] — never spinning.
//!
//! # Why `Buffered` batches are safe
//!
//! By default batches are committed with [`Durability::Buffered`] (written to OS buffers,
//! not fsynced) and the store is fsynced every [`ApplyConfig::persist_interval`] and on
//! stop. This loses nothing and applies nothing twice:
//!
//! * The worker only reads the received log up to its **durable** end, so every record it
//!   applies survives any crash in the received log.
//! * Each batch carries the tablet's new `applied_pos` in the **same** atomic fjall batch as
//!   the data and transaction state it implies. fjall's journal is one sequential log and
//!   recovers to a batch boundary, so after a crash the store holds exactly the batches up
//!   to some point, and `applied_pos` names that point.
//! * On restart the worker seeks the received log to the persisted `applied_pos` and
//!   re-applies from there; [`Store::apply`] also skips any record below it and refuses a
//!   gap. So a crash costs re-doing at most `persist_interval` of apply work.
//!
//! What `Buffered` does cost: readers may see data that a machine crash rolls back (to be
//! re-applied identically). Anything that must not go backwards across a crash — the
//! published global safe time — is persisted with `Sync` by its owner, after the store
//! batches below it were persisted ([`Store::persist`]).
//!
//! # Errors
//!
//! A corrupt or truncated received log, a gap, or a store failure stops the worker; the
//! error (naming tablet, file and offset for corruption) is kept in [`ApplyWorker::fault`]
//! with the position the tablet stopped at, and logged once. Nothing is ever skipped.
//!
//! A record that passed its checksum but that the store cannot take (a key too long for its
//! encoding, see [`Store::check_record`]) stops its tablet at that record: the records
//! before it in the batch are applied, nothing of it, and the fault is
//! [`Error::Rejected`] (state `record_rejected`) naming the tablet, the record's
//! received-log position and the reason. The other tablets go on. The tablet's safe time
//! stays at its last applied record, so the global safe time holds there (it must: the
//! record may belong to a transaction or precede commits on other tablets). After a
//! restart the same record is refused again the same way; the state clears only when the
//! record can be applied (a version that takes it), as nothing is ever skipped.
//!
//! A panic while applying (a bug) is caught around each step and stops only its tablet
//! ([`Error::Panicked`], state `apply_failed`); the store's cache of unresolved
//! transactions is then no longer trusted for received-log retention until a restart.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidelog_wal::{
    AtomicWalPos, Heartbeat, HybridTime, ReadLimit, Reader, Record, TabletId, WalPos,
};

use crate::consistency::Consistency;
use crate::disk::Backoff;
use crate::doorbell::Doorbell;
use crate::error::{Error, Result};
use crate::intake::IntakeActivity;
use crate::latency::{HistogramSnapshot, LatencyHistogram};
use crate::store::{Durability, Store};

/// Longest wait of a yielding apply thread between looks at the intake's state.
const YIELD_CHECK: Duration = Duration::from_millis(50);

/// An apply batch that takes this long is logged with the store's write pressure.
const SLOW_BATCH: Duration = Duration::from_millis(200);

/// Apply-stage settings.
#[derive(Clone, Debug)]
pub struct ApplyConfig {
    /// Received-log bytes per batch, at most (a batch ends after the record that crosses
    /// it). Default 4 MiB.
    pub batch_bytes: u64,
    /// Records per batch, at most. Default 10 000.
    pub batch_records: usize,
    /// Fallback wake-up when no `notify` arrives. Default 50 ms.
    pub poll_interval: Duration,
    /// Durability of each batch. Default `Buffered` (see the module doc).
    pub durability: Durability,
    /// With `Buffered`, fsync the store at least this often while applying. Default 1 s.
    pub persist_interval: Duration,
    /// The safe-time machinery: commits are reported to it and committed parts of this
    /// tablet are applied when it says they are ready. `None`: writes only.
    pub consistency: Option<Arc<Consistency>>,
    /// The threads that apply this tablet, shared with other tablets. `None`: a thread of
    /// its own.
    pub threads: Option<Arc<ApplyThreads>>,
    /// How the received log is read. Default [`ReceivedReads::Buffered`].
    pub reads: ReceivedReads,
    /// Records applied below this received-log position are counted apart
    /// ([`ApplyWorker::records_below`]): given the log's end when the intake opened it,
    /// that is what was received before this process started and not yet applied, so the
    /// intake's count of this run plus it plus the stored applied total is every record
    /// ever received. Default 0 (none).
    pub count_below: WalPos,
}

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

impl Default for ApplyConfig {
    fn default() -> Self {
        ApplyConfig {
            batch_bytes: 4 << 20,
            batch_records: 10_000,
            poll_interval: Duration::from_millis(50),
            durability: Durability::Buffered,
            persist_interval: Duration::from_secs(1),
            consistency: None,
            threads: None,
            reads: ReceivedReads::Buffered,
            count_below: WalPos::ZERO,
        }
    }
}

#[derive(Debug)]
struct Shared {
    tablet: TabletId,
    applied_pos: AtomicWalPos,
    safe_time: AtomicU64,
    stop: AtomicBool,
    running: AtomicBool,
    /// The thread applying this tablet: rung for more to read, ready parts, or stop.
    lane: Arc<Lane>,
    /// Callers blocked on `progress_cv` in [`ApplyWorker::wait_applied`] (notified only
    /// when some are: a condvar notify is a system call, waiter or not).
    progress_waiters: Mutex<usize>,
    /// Wakes `wait_applied` callers after each batch and when the worker ends.
    progress_cv: Condvar,
    fault: Mutex<Option<ApplyFault>>,
    /// What the worker holds on while it runs: a full disk or a store being reopened
    /// ([`Error::is_retryable`]). Cleared once it applies again.
    held: Mutex<Option<ApplyFault>>,
    /// Beats once per loop iteration (each bounded by `poll_interval` when idle).
    heartbeat: Heartbeat,
    /// Records applied by this worker below [`ApplyConfig::count_below`].
    records_below: AtomicU64,
    /// Records and received-log bytes applied by this worker since it started.
    applied_records: AtomicU64,
    applied_bytes: AtomicU64,
    /// Wall time of each `Store::apply` batch.
    batch_latency: LatencyHistogram,
    /// Age of each batch's newest record once the batch is in the store (the `applied` lag
    /// stage).
    applied_age: LatencyHistogram,
}

impl Shared {
    fn progress(&self) -> MutexGuard<'_, usize> {
        // A count: a panic elsewhere cannot leave it inconsistent.
        self.progress_waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    fn wait_applied(&self, pos: WalPos, timeout: Duration) -> bool {
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

    fn publish(&self, pos: WalPos, safe: HybridTime) {
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
    fn fault(&self) -> Option<ApplyFault> {
        self.fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .or_else(|| self.held())
    }

    fn held(&self) -> Option<ApplyFault> {
        self.held.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Wakes the worker (more to read, ready parts, or stop).
    fn notify(&self) {
        self.lane.bell.ring();
    }
}

/// Why and where a tablet's apply stage stopped ([`ApplyWorker::fault`]).
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
struct Applying;

impl Applying {
    fn enter(t: &TabletId) -> Applying {
        APPLYING.with(|a| *a.borrow_mut() = Some(t.clone()));
        Applying
    }
}

impl Drop for Applying {
    fn drop(&mut self) {
        APPLYING.with(|a| *a.borrow_mut() = None);
    }
}

/// One apply thread: its doorbell and the tablets handed to it.
#[derive(Debug)]
struct Lane {
    bell: Doorbell,
    /// Tablets given to the thread and not yet taken in by it.
    inbox: Mutex<Vec<TabletLoop>>,
    /// Tablets on this thread (taken in or not), for placing new ones.
    tablets: AtomicUsize,
    shutdown: AtomicBool,
    /// The thread has ended (normally, or by a panic outside a tablet's step).
    exited: AtomicBool,
    /// Set by [`ApplyThreads::yield_to_intake`].
    yield_to: OnceLock<(Arc<IntakeActivity>, Duration)>,
    /// The thread is holding back for a catch-up.
    holding: AtomicBool,
    /// Nanoseconds held back since start.
    held_ns: AtomicU64,
}

/// How the group's threads have held back for catch-ups ([`ApplyThreads::yield_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct YieldStatus {
    /// The configured limit of one hold (`None`: never held back).
    pub limit: Option<Duration>,
    /// Threads holding back now.
    pub holding_threads: usize,
    /// Time held back since start, summed over the threads.
    pub held_total: Duration,
}

/// Marks its lane's thread as ended when dropped (also while unwinding).
struct ExitMark<'a>(&'a Lane);

impl Drop for ExitMark<'_> {
    fn drop(&mut self) {
        self.0.exited.store(true, Ordering::Release);
    }
}

/// A group of apply threads shared by tablets (see the module doc). Dropping it stops the
/// tablets still on it and joins the threads.
#[derive(Debug)]
pub struct ApplyThreads {
    lanes: Vec<Arc<Lane>>,
    threads: Vec<JoinHandle<()>>,
}

impl ApplyThreads {
    /// `n` threads (at least one), named `{name}-{i}`.
    pub fn new(n: usize, name: &str) -> Result<ApplyThreads> {
        Self::with_nice(n, name, 0)
    }

    /// [`ApplyThreads::new`], each thread at nice value `nice` (0: the process's; see
    /// [`crate::priority`]).
    pub fn with_nice(n: usize, name: &str, nice: i32) -> Result<ApplyThreads> {
        let mut lanes = Vec::new();
        let mut threads = Vec::new();
        for i in 0..n.max(1) {
            let lane = Arc::new(Lane {
                bell: Doorbell::new(false),
                inbox: Mutex::new(Vec::new()),
                tablets: AtomicUsize::new(0),
                shutdown: AtomicBool::new(false),
                exited: AtomicBool::new(false),
                yield_to: OnceLock::new(),
                holding: AtomicBool::new(false),
                held_ns: AtomicU64::new(0),
            });
            let l = lane.clone();
            let t = std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || {
                    let _mark = ExitMark(&l);
                    crate::priority::apply_stage_nice("apply", nice);
                    lane_main(&l)
                })
                .map_err(|source| Error::Io {
                    op: "spawn apply thread",
                    path: PathBuf::new(),
                    source,
                })?;
            lanes.push(lane);
            threads.push(t);
        }
        Ok(ApplyThreads { lanes, threads })
    }

    /// The default size of a group: half the cores (the other half is left to the intake,
    /// QUIC and reads), at least two: the store prepares one batch while the one before it
    /// commits, which takes a second thread. On 2 cores two threads kept up with 10-20 %
    /// more transactions per second than one, with a lower safe-time lag (`BENCHMARKS.md`).
    pub fn default_count() -> usize {
        std::thread::available_parallelism().map_or(2, |n| (n.get() / 2).max(2))
    }

    /// During a catch-up — a thread's last round applied full batches (the received logs
    /// are ahead of it) while `activity` says shippers are sending a backlog (large frames)
    /// — the thread holds its rounds back, each time by at most `max`: durable receipt (what a
    /// disaster would lose) gets the CPU first, and the target's safe time follows when the
    /// burst is over, or every `max` during a long one. Between holds a thread applies one
    /// full batch (its round ends there; the next starts at the following tablet). A thread
    /// that keeps up (partial batches) never holds back, nor while a tablet is being stopped.
    /// `max` zero: never. Set once; later calls change nothing.
    pub fn yield_to_intake(&self, activity: Arc<IntakeActivity>, max: Duration) {
        if max.is_zero() {
            return;
        }
        for l in &self.lanes {
            let _ = l.yield_to.set((activity.clone(), max));
            l.bell.ring();
        }
    }

    /// Whether and how long the threads held back for catch-ups (`/v1/status`
    /// `apply_yield`, metrics).
    pub fn yield_status(&self) -> YieldStatus {
        YieldStatus {
            limit: self
                .lanes
                .first()
                .and_then(|l| l.yield_to.get())
                .map(|(_, d)| *d),
            holding_threads: self
                .lanes
                .iter()
                .filter(|l| l.holding.load(Ordering::Relaxed))
                .count(),
            held_total: Duration::from_nanos(
                self.lanes
                    .iter()
                    .map(|l| l.held_ns.load(Ordering::Relaxed))
                    .sum(),
            ),
        }
    }

    /// The running thread with the fewest tablets (an ended one only if all have ended).
    fn pick(&self) -> Arc<Lane> {
        self.lanes
            .iter()
            .min_by_key(|l| {
                (
                    l.exited.load(Ordering::Acquire),
                    l.tablets.load(Ordering::Relaxed),
                )
            })
            .cloned()
            .unwrap_or_else(|| unreachable!("an ApplyThreads has at least one lane"))
    }
}

impl Drop for ApplyThreads {
    fn drop(&mut self) {
        for l in &self.lanes {
            l.shutdown.store(true, Ordering::Release);
            l.bell.ring();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// What one look at a tablet did.
enum Step {
    /// Applied something: look again soon. `full`: a whole batch (more is likely waiting).
    Worked { full: bool },
    /// Nothing to do; look again within this long at the latest.
    Idle(Duration),
}

/// An apply thread: one step per tablet per round, asleep only after a round without work.
fn lane_main(lane: &Lane) {
    let mut tablets: Vec<TabletLoop> = Vec::new();
    // How long the rounds have been held back for the intake, and whether the last round
    // applied a full batch (more was waiting).
    let mut held = Duration::ZERO;
    let mut behind = false;
    loop {
        tablets.append(&mut lane.inbox.lock().unwrap_or_else(|p| p.into_inner()));
        let shutdown = lane.shutdown.load(Ordering::Acquire);
        if let Some((activity, max)) = lane.yield_to.get() {
            let stopping = shutdown || tablets.iter().any(|t| t.sh.stop.load(Ordering::Acquire));
            if behind && !stopping && held < *max && activity.catching_up() {
                // Each durable group of the intake rings the bell: the state is looked at
                // again then, or after YIELD_CHECK at the latest.
                let t0 = Instant::now();
                lane.holding.store(true, Ordering::Relaxed);
                lane.bell.wait((*max - held).min(YIELD_CHECK), || {
                    lane.shutdown.load(Ordering::Acquire)
                });
                let waited = t0.elapsed();
                held += waited;
                lane.held_ns
                    .fetch_add(waited.as_nanos() as u64, Ordering::Relaxed);
                continue;
            }
            held = Duration::ZERO;
            lane.holding.store(false, Ordering::Relaxed);
        }
        let mut worked = false;
        behind = false;
        let mut sleep = Duration::from_secs(1);
        // During a catch-up a round ends at its first full batch, and the next one starts
        // at the tablet after it: a thread that is behind does one batch between holds,
        // not one per tablet (its first round, before it knew, cost up to eight).
        let catch_up = !shutdown
            && lane
                .yield_to
                .get()
                .is_some_and(|(activity, _)| activity.catching_up());
        let mut cut: Option<usize> = None;
        let mut kept = 0usize;
        tablets.retain_mut(|t| {
            if cut.is_some() {
                return true;
            }
            if shutdown || t.sh.stop.load(Ordering::Acquire) {
                t.finish(Ok(()), lane);
                return false;
            }
            let span = t.span.clone();
            let _e = span.enter();
            let stepped = {
                let _a = Applying::enter(&t.sh.tablet);
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.step()))
            };
            match stepped {
                Ok(Ok(Step::Worked { full })) => {
                    worked = true;
                    behind |= full;
                    kept += 1;
                    if full && catch_up {
                        cut = Some(kept);
                    }
                    true
                }
                Ok(Ok(Step::Idle(within))) => {
                    sleep = sleep.min(within);
                    kept += 1;
                    true
                }
                Ok(Err(e)) if e.is_retryable() => {
                    // A full disk: nothing of the batch took effect; tried again later.
                    sleep = sleep.min(t.hold(e));
                    kept += 1;
                    true
                }
                Ok(Err(e)) => {
                    t.finish(Err(e), lane);
                    false
                }
                Err(p) => {
                    // The panic hook has logged it. What the store holds in memory for the
                    // batch may be half-changed: received-log retention stops trusting it.
                    t.store.mark_cache_incomplete();
                    let e = Error::Panicked {
                        tablet: t.sh.tablet.clone(),
                        from: t.sh.applied_pos.load(),
                        message: Error::panic_message(&*p),
                    };
                    t.finish(Err(e), lane);
                    false
                }
            }
        });
        if let Some(next) = cut {
            let n = tablets.len();
            tablets.rotate_left(next % n);
        }
        if shutdown {
            return;
        }
        if !worked {
            lane.bell
                .wait(sleep, || lane.shutdown.load(Ordering::Acquire));
        }
    }
}

/// One tablet's apply progress, apart from its [`ApplyWorker`] ([`ApplyWorker::progress`]):
/// for waiting on it without holding the worker.
#[derive(Clone, Debug)]
pub struct ApplyProgress(Arc<Shared>);

impl ApplyProgress {
    pub fn tablet(&self) -> &TabletId {
        &self.0.tablet
    }

    /// End of the last applied record.
    pub fn applied_pos(&self) -> WalPos {
        self.0.applied_pos.load()
    }

    /// The tablet's safe time: ht of its last applied record or heartbeat (0 if none).
    pub fn safe_time(&self) -> HybridTime {
        HybridTime(self.0.safe_time.load(Ordering::Acquire))
    }

    /// Whether the worker still applies (false after a stop or an error).
    pub fn is_running(&self) -> bool {
        self.0.running.load(Ordering::Acquire)
    }

    /// As [`ApplyWorker::fault`].
    pub fn fault(&self) -> Option<ApplyFault> {
        self.0.fault()
    }

    /// As [`ApplyWorker::wait_applied`].
    pub fn wait_applied(&self, pos: WalPos, timeout: Duration) -> bool {
        self.0.wait_applied(pos, timeout)
    }
}

impl crate::consistency::Replaying for ApplyProgress {
    fn tablet(&self) -> &TabletId {
        ApplyProgress::tablet(self)
    }
    fn wait_applied(&self, pos: WalPos, timeout: Duration) -> bool {
        ApplyProgress::wait_applied(self, pos, timeout)
    }
    fn is_running(&self) -> bool {
        ApplyProgress::is_running(self)
    }
    fn fault(&self) -> Option<String> {
        ApplyProgress::fault(self).map(|f| f.to_string())
    }
}

/// The apply stage of one tablet, on a thread of its [`ApplyThreads`] group.
#[derive(Debug)]
pub struct ApplyWorker {
    shared: Arc<Shared>,
    /// The worker's own thread, when it has no shared ones.
    own: Option<ApplyThreads>,
}

impl ApplyWorker {
    /// Starts applying `received_dir/<tablet>/` into `store` from the tablet's stored
    /// apply position.
    pub fn start(
        store: Arc<Store>,
        received_dir: &Path,
        tablet: TabletId,
        cfg: ApplyConfig,
    ) -> Result<ApplyWorker> {
        if cfg.batch_records == 0 || cfg.batch_bytes == 0 || cfg.poll_interval.is_zero() {
            return Err(Error::Invalid(format!(
                "apply config needs positive batch limits and poll interval: {cfg:?}"
            )));
        }
        let generation = store.generation();
        // A store that takes no writes now (a full disk, a reopen in progress): the worker
        // starts holding, and reads its position from the store once it can.
        let (meta, held) = match store.tablet(&tablet) {
            Ok(m) => (m.unwrap_or_default(), None),
            Err(e) if e.is_retryable() => (crate::store::TabletMeta::default(), Some(e)),
            Err(e) => return Err(e),
        };
        let (own, lane) = match &cfg.threads {
            Some(t) => (None, t.pick()),
            None => {
                let t = ApplyThreads::new(1, &format!("apply-{tablet}"))?;
                let lane = t.pick();
                (Some(t), lane)
            }
        };
        let shared = Arc::new(Shared {
            tablet: tablet.clone(),
            applied_pos: AtomicWalPos::new(meta.applied_pos),
            safe_time: AtomicU64::new(meta.safe_time.0),
            stop: AtomicBool::new(false),
            running: AtomicBool::new(true),
            lane: lane.clone(),
            progress_waiters: Mutex::new(0),
            progress_cv: Condvar::new(),
            fault: Mutex::new(None),
            held: Mutex::new(held.map(|e| ApplyFault {
                pos: WalPos::ZERO,
                error: Arc::new(e),
            })),
            heartbeat: Heartbeat::new(),
            records_below: AtomicU64::new(0),
            applied_records: AtomicU64::new(0),
            applied_bytes: AtomicU64::new(0),
            batch_latency: LatencyHistogram::new(),
            applied_age: LatencyHistogram::new(),
        });
        if let Some(c) = &cfg.consistency {
            let sh = shared.clone();
            c.register_worker(&tablet, meta.safe_time, Arc::new(move || sh.notify()));
        }
        let looper = TabletLoop {
            span: tracing::info_span!("apply", tablet = %tablet),
            sh: shared.clone(),
            store,
            root: received_dir.to_path_buf(),
            // The loop must not hold the group: its last handle would be dropped (and the
            // threads joined) on one of those threads.
            cfg: ApplyConfig {
                threads: None,
                ..cfg
            },
            reader: None,
            parts_reader: None,
            batch: Vec::new(),
            dirty: false,
            last_persist: Instant::now(),
            warned: false,
            generation,
            retry: shared.held().is_some().then(|| {
                let mut b = Backoff::default();
                b.reset();
                b
            }),
            refill_from: None,
        };
        lane.tablets.fetch_add(1, Ordering::Relaxed);
        lane.inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(looper);
        lane.bell.ring();
        Ok(ApplyWorker { shared, own })
    }

    pub fn tablet(&self) -> &TabletId {
        &self.shared.tablet
    }

    /// Tells the worker that more of the received log is durable. Cheap; never blocks long.
    pub fn notify(&self) {
        self.shared.notify();
    }

    /// End of the last applied record (what the store holds, maybe not yet fsynced).
    pub fn applied_pos(&self) -> WalPos {
        self.shared.applied_pos.load()
    }

    /// The tablet's safe time: ht of its last applied record or heartbeat (0 if none).
    pub fn safe_time(&self) -> HybridTime {
        HybridTime(self.shared.safe_time.load(Ordering::Acquire))
    }

    /// When the worker thread last went round its loop. An idle worker still goes round at
    /// least every [`ApplyConfig::poll_interval`]; one stuck in a batch does not.
    pub fn last_progress(&self) -> Instant {
        self.shared.heartbeat.last()
    }

    /// Records applied by this worker since it started.
    pub fn applied_records(&self) -> u64 {
        self.shared.applied_records.load(Ordering::Relaxed)
    }

    /// Records applied by this worker below [`ApplyConfig::count_below`].
    pub fn records_below(&self) -> u64 {
        self.shared.records_below.load(Ordering::Relaxed)
    }

    /// Received-log bytes applied by this worker since it started.
    pub fn applied_bytes(&self) -> u64 {
        self.shared.applied_bytes.load(Ordering::Relaxed)
    }

    /// The latency of this worker's apply batches so far.
    pub fn batch_latency(&self) -> HistogramSnapshot {
        self.shared.batch_latency.snapshot()
    }

    /// How old each batch's newest record was once the batch was in the store.
    pub fn applied_age(&self) -> HistogramSnapshot {
        self.shared.applied_age.snapshot()
    }

    /// Whether the thread is still applying (false after `stop` or an error).
    pub fn is_running(&self) -> bool {
        self.shared.running.load(Ordering::Acquire)
    }

    /// What the worker holds on while it still runs: a full disk (naming its path) or a
    /// store being reopened. It applies again on its own once that ends.
    pub fn held(&self) -> Option<ApplyFault> {
        self.shared.held()
    }

    /// The error that stopped the worker, if any.
    pub fn error(&self) -> Option<Arc<Error>> {
        self.shared
            .fault
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|f| f.error.clone())
    }

    /// Why and where the worker stopped, if an error stopped it; else what it holds on
    /// while it runs ([`ApplyWorker::held`]).
    pub fn fault(&self) -> Option<ApplyFault> {
        self.shared.fault()
    }

    /// Blocks until `applied_pos ≥ pos`, the worker stops, or `timeout`; returns whether
    /// the position was reached.
    pub fn wait_applied(&self, pos: WalPos, timeout: Duration) -> bool {
        self.shared.wait_applied(pos, timeout)
    }

    /// A handle on this worker's progress that can wait without holding the worker.
    pub fn progress(&self) -> ApplyProgress {
        ApplyProgress(self.shared.clone())
    }

    /// Stops the worker, joins its thread (which persists the store first) and returns the
    /// error that stopped it, if any. Idempotent.
    pub fn stop(&mut self) -> std::result::Result<(), Arc<Error>> {
        self.shared.stop.store(true, Ordering::Release);
        self.notify();
        {
            let mut g = self.shared.progress();
            while self.is_running() {
                if self.shared.lane.exited.load(Ordering::Acquire) {
                    // The thread died outside a step: nothing will finish this tablet.
                    let mut e = self.shared.fault.lock().unwrap_or_else(|p| p.into_inner());
                    e.get_or_insert_with(|| ApplyFault {
                        pos: self.shared.applied_pos.load(),
                        error: Arc::new(Error::Shutdown(self.shared.tablet.clone())),
                    });
                    self.shared.running.store(false, Ordering::Release);
                    break;
                }
                *g += 1;
                g = self
                    .shared
                    .progress_cv
                    .wait_timeout(g, Duration::from_millis(100))
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
                *g -= 1;
            }
        }
        drop(self.own.take());
        match self.error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for ApplyWorker {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Whether the writer has created the tablet's log far enough for a `Reader` to open it:
/// a control file and at least one segment.
fn log_ready(dir: &Path) -> Result<bool> {
    if !dir.join(tidelog_wal::control::CONTROL_FILE).is_file() {
        return Ok(false);
    }
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(source) => {
            return Err(Error::Io {
                op: "list",
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    for ent in rd {
        let ent = ent.map_err(|source| Error::Io {
            op: "list",
            path: dir.to_path_buf(),
            source,
        })?;
        if ent.file_name().to_string_lossy().ends_with(".seg") {
            return Ok(true);
        }
    }
    Ok(false)
}

/// One tablet's apply state, owned by the thread applying it.
#[derive(Debug)]
struct TabletLoop {
    sh: Arc<Shared>,
    /// Entered for each step (made once: a new span per step costs the subscriber an
    /// allocation and the formatting of its fields each time).
    span: tracing::Span,
    store: Arc<Store>,
    root: PathBuf,
    cfg: ApplyConfig,
    reader: Option<Reader>,
    /// Reads intents back by position for committed parts.
    parts_reader: Option<Reader>,
    batch: Vec<(WalPos, Record)>,
    /// Batches applied `Buffered` since the store was last persisted.
    dirty: bool,
    last_persist: Instant,
    /// Warned that the log is missing although records were applied.
    warned: bool,
    /// The store's generation this loop's positions were read from (see
    /// [`Store::generation`]): a reopened store is read again.
    generation: u64,
    /// While the worker holds ([`Shared::held`]): when to try again.
    retry: Option<Backoff>,
    /// While the received log ends below the apply position: its end when that was logged.
    refill_from: Option<WalPos>,
}

/// Where the received log stands for the apply position.
enum LogState {
    /// The reader is open at the apply position (or further).
    Open,
    /// The log does not exist yet.
    Missing,
    /// The log ends at `end`, below the apply position: it lost its tail (a truncated
    /// segment, cut at its last valid record when the intake opened it, as the source's
    /// WAL is) and the intake is receiving it again. Records below the apply position are
    /// in the store already; applying goes on once the log reaches that position.
    Behind { end: WalPos },
}

impl TabletLoop {
    /// Applies the ready parts and at most one batch of the received log (after a hold,
    /// or once the store was reopened, from the position the store holds).
    fn step(&mut self) -> Result<Step> {
        // Also while holding: a worker waiting for space is alive (the watchdog looks).
        self.sh.heartbeat.beat();
        if let Some(wait) = self.resume()? {
            return Ok(Step::Idle(wait));
        }
        let step = self.step_inner()?;
        if self.retry.take().is_some() {
            *self.sh.held.lock().unwrap_or_else(|p| p.into_inner()) = None;
            tracing::info!(applied_pos = %self.sh.applied_pos.load(), "apply resumed");
        }
        Ok(step)
    }

    /// Holds on a retryable error `e`: kept for status, logged once per change; returns
    /// when to look again.
    fn hold(&mut self, e: Error) -> Duration {
        let mut held = self.sh.held.lock().unwrap_or_else(|p| p.into_inner());
        if held
            .as_ref()
            .is_none_or(|h| h.error.to_string() != e.to_string())
        {
            tracing::warn!(applied_pos = %self.sh.applied_pos.load(),
                "apply holds: {e}; it resumes on its own once that ends");
        }
        *held = Some(ApplyFault {
            pos: self.sh.applied_pos.load(),
            error: Arc::new(e),
        });
        self.retry.get_or_insert_with(Backoff::default).failed()
    }

    /// Before a step: `Some(wait)` while the worker must wait (held, and its retry is not
    /// due; or the store was reopened and the safe-time core not yet rebuilt from it).
    /// Otherwise, when the store was reopened or a retry is due, reads the tablet's apply
    /// position and safe time back from the store, as a restart would, and drops the
    /// readers: nothing in memory is trusted over what the store holds.
    fn resume(&mut self) -> Result<Option<Duration>> {
        let generation = self.store.generation();
        let reopened = generation != self.generation;
        if reopened {
            let core_behind = self
                .cfg
                .consistency
                .as_ref()
                .is_some_and(|c| c.store_generation() != generation);
            if core_behind {
                return Ok(Some(Duration::from_millis(10)));
            }
        } else if let Some(r) = &self.retry {
            if !r.due() {
                return Ok(Some(r.left()));
            }
        } else {
            return Ok(None);
        }
        let meta = self.store.tablet(&self.sh.tablet)?.unwrap_or_default();
        self.reader = None;
        self.parts_reader = None;
        if reopened {
            // What was applied `Buffered` is in the reopened store (its journal was read
            // back); nothing is left to persist from the old one.
            self.dirty = false;
        }
        self.generation = generation;
        self.sh.safe_time.store(meta.safe_time.0, Ordering::Release);
        self.sh.publish(meta.applied_pos, meta.safe_time);
        Ok(None)
    }

    /// Opens the reader of the tablet's received log at the apply position, unless the log
    /// does not exist yet or ends below that position (see [`LogState`]).
    fn open_reader(&mut self) -> Result<LogState> {
        let (sh, cfg) = (&self.sh, &self.cfg);
        let tablet = &sh.tablet;
        let wal = |source| Error::Wal {
            tablet: tablet.clone(),
            source,
        };
        let log_dir = self.root.join(tablet.as_str());
        if !log_ready(&log_dir)? {
            if !self.warned && sh.applied_pos.load() != WalPos::ZERO {
                // The store applied this tablet before, yet its log is gone.
                tracing::warn!(dir = %log_dir.display(), applied_pos = %sh.applied_pos.load(),
                    "received log missing although records were applied; waiting for it");
                self.warned = true;
            }
            return Ok(LogState::Missing);
        }
        let mut r = Reader::open(&self.root, tablet, ReadLimit::Durable).map_err(wal)?;
        match cfg.reads {
            ReceivedReads::Buffered => {}
            ReceivedReads::Direct => r.set_direct_io(true),
            ReceivedReads::DirectBacklogs => {
                r.set_direct_backlog_reads(Some(crate::intake::RECEIVED_CACHE_KEEP))
            }
        }
        let from = sh.applied_pos.load();
        // A tablet that applied nothing starts at the log's oldest record.
        if from != WalPos::ZERO {
            if let Some(end) = r.end().filter(|end| *end < from) {
                return Ok(LogState::Behind { end });
            }
            r.seek(from).map_err(wal)?;
        }
        tracing::info!(from = %Reader::position(&r), "apply worker reading the received log");
        self.reader = Some(r);
        Ok(LogState::Open)
    }

    /// [`TabletLoop::step`] itself.
    fn step_inner(&mut self) -> Result<Step> {
        self.sh.heartbeat.beat();
        let log = match &self.reader {
            Some(_) => LogState::Open,
            None => self.open_reader()?,
        };
        if let LogState::Behind { end } = log {
            // Ready parts wait too: their intents lie below the apply position.
            let from = self.sh.applied_pos.load();
            if self.refill_from.is_none() {
                tracing::warn!(%from, received_end = %end,
                    "the received log ends below the apply position: it lost its tail (cut \
                     at its last valid record when it was opened) and the shipper is sending \
                     it again; applying goes on from {from} once it gets there");
                self.refill_from = Some(end);
            }
            return Ok(Step::Idle(self.cfg.poll_interval));
        }
        if self.refill_from.take().is_some() {
            tracing::info!(from = %self.sh.applied_pos.load(), "the received log was refilled to the apply position");
        }
        let (sh, cfg) = (&self.sh, &self.cfg);
        let tablet = &sh.tablet;
        let wal = |source| Error::Wal {
            tablet: tablet.clone(),
            source,
        };
        if let Some(c) = &cfg.consistency {
            apply_ready_parts(tablet, &self.store, c, &self.root, &mut self.parts_reader)?;
        }
        let Some(r) = self.reader.as_mut() else {
            // No log yet.
            return Ok(Step::Idle(cfg.poll_interval));
        };
        let batch = &mut self.batch;
        batch.clear();
        let start = Reader::position(r);
        // A record that does not read (it stays the reader's position) or that the store
        // cannot take stops the tablet there: the ones before it are applied, nothing of
        // it, and the error is returned after them.
        let mut rejected = None;
        while batch.len() < cfg.batch_records && Reader::position(r).since(start) < cfg.batch_bytes
        {
            match r.next() {
                Ok(Some(rec)) => batch.push(rec),
                Ok(None) => break,
                Err(e) => {
                    rejected = Some(wal(e));
                    break;
                }
            }
        }
        let mut end = Reader::position(r);
        let full = batch.len() >= cfg.batch_records || end.since(start) >= cfg.batch_bytes;
        let mut unfit = None;
        for (i, (pos, rec)) in batch.iter().enumerate() {
            if let Err(e) = Store::check_record(tablet, *pos, rec) {
                unfit = Some((i, *pos, e));
                break;
            }
        }
        if let Some((i, pos, e)) = unfit {
            end = pos;
            batch.truncate(i);
            rejected = Some(e);
        }
        if !batch.is_empty() {
            if let Some(c) = &cfg.consistency {
                c.check_below_safe_time(tablet, batch.iter().map(|(_, r)| r));
            }
            // Test hook: a slow apply (`apply::batch=sleep(ms)`).
            fail::fail_point!("apply::batch");
            let started = Instant::now();
            let out = self.store.apply(tablet, batch, end, cfg.durability)?;
            let took = started.elapsed();
            sh.batch_latency.record(took);
            if let Some((_, newest)) = batch.last() {
                sh.applied_age.record_age(newest.ht);
            }
            if took >= SLOW_BATCH {
                tracing::warn!(
                    records = batch.len(),
                    took_ms = took.as_millis() as u64,
                    lsm = %self.store.lsm_pressure(),
                    "slow apply batch"
                );
            }
            if start < cfg.count_below {
                let below = batch.iter().filter(|(p, _)| *p < cfg.count_below).count();
                sh.records_below.fetch_add(below as u64, Ordering::Relaxed);
            }
            sh.applied_records.fetch_add(out.records, Ordering::Relaxed);
            sh.applied_bytes.fetch_add(out.bytes, Ordering::Relaxed);
            tracing::trace!(records = out.records, bytes = out.bytes, end = %end, "applied");
            sh.publish(out.applied_pos, out.safe_time);
            if let Some(c) = &cfg.consistency {
                c.after_batch(tablet, &out);
            }
            self.dirty |= cfg.durability == Durability::Buffered;
            if self.dirty && self.last_persist.elapsed() >= cfg.persist_interval {
                self.persist()?;
            }
            if let Some(e) = rejected {
                return Err(e);
            }
            return Ok(Step::Worked { full });
        }
        if let Some(e) = rejected {
            return Err(e);
        }
        let mut within = cfg.poll_interval;
        if self.dirty {
            let left = cfg
                .persist_interval
                .saturating_sub(self.last_persist.elapsed());
            if left.is_zero() {
                self.persist()?;
            } else {
                within = within.min(left);
            }
        }
        Ok(Step::Idle(within))
    }

    fn persist(&mut self) -> Result<()> {
        self.store.persist()?;
        self.dirty = false;
        self.last_persist = Instant::now();
        Ok(())
    }

    /// Leaves the thread: persists what was applied `Buffered`, keeps the error that
    /// ended it, and wakes `stop` and the `wait_applied` callers.
    fn finish(&mut self, result: Result<()>, lane: &Lane) {
        let persisted = if self.dirty { self.persist() } else { Ok(()) };
        if let Err(e) = result.and(persisted) {
            let fault = ApplyFault {
                pos: self.sh.applied_pos.load(),
                error: Arc::new(e),
            };
            tracing::error!(tablet = %self.sh.tablet, state = fault.state(), "{fault}");
            *self.sh.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(fault);
        }
        lane.tablets.fetch_sub(1, Ordering::Relaxed);
        let _g = self.sh.progress();
        self.sh.running.store(false, Ordering::Release);
        self.sh.progress_cv.notify_all();
    }
}

/// Applies the committed parts of `tablet` that the consistency core says are ready: the
/// ops of the transaction's intents on this tablet, read back from the received log by
/// position, as versions at `commit_ht`.
fn apply_ready_parts(
    tablet: &TabletId,
    store: &Store,
    c: &Consistency,
    root: &Path,
    reader: &mut Option<Reader>,
) -> Result<()> {
    let parts = c.take_ready(tablet);
    if parts.is_empty() {
        return Ok(());
    }
    let wal = |source| Error::Wal {
        tablet: tablet.clone(),
        source,
    };
    let txns: Vec<tidelog_wal::TxnId> = parts.iter().map(|p| p.txn).collect();
    let intents = store.intents_on(tablet, &txns)?;
    let mut batch = Vec::with_capacity(parts.len());
    for (part, list) in parts.iter().zip(intents) {
        let list = list.ok_or_else(|| {
            Error::Invalid(format!(
                "tablet {tablet}: ready part of unknown txn {}",
                part.txn
            ))
        })?;
        let mut ops = Vec::new();
        if !list.is_empty() {
            let r = match reader {
                Some(r) => r,
                None => reader.insert(Reader::open(root, tablet, ReadLimit::Durable).map_err(wal)?),
            };
            for ir in &list {
                let rec = r.read_at(ir.pos).map_err(wal)?;
                Store::check_record(tablet, ir.pos, &rec)?;
                match rec.body {
                    tidelog_wal::Body::Intent { ops: o, .. } => {
                        ops.extend(o.into_iter().map(|op| (op.key, op.value)));
                    }
                    _ => {
                        return Err(Error::Invalid(format!(
                        "tablet {tablet}: position {} of txn {} holds a {} record, not an intent",
                        ir.pos,
                        part.txn,
                        rec.kind().name()
                    )))
                    }
                }
            }
        }
        batch.push(crate::store::Part {
            txn: part.txn,
            commit_ht: part.commit_ht,
            ops,
        });
    }
    // Every ready part of this tablet in one store batch.
    store.apply_parts(tablet, &batch, Durability::Buffered)?;
    c.parts_applied(&parts);
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A tablet placed on a thread that has ended (as after a panic outside a step) is
    /// stopped with an error at once instead of waiting forever for the thread to finish it.
    #[test]
    fn stop_does_not_wait_for_a_thread_that_has_ended() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let group = Arc::new(ApplyThreads::new(1, "apply-ended").unwrap());
        let lane = group.lanes[0].clone();
        lane.shutdown.store(true, Ordering::Release);
        lane.bell.ring();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !lane.exited.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the lane thread did not end");
            std::thread::sleep(Duration::from_millis(5));
        }
        let cfg = ApplyConfig {
            threads: Some(group.clone()),
            ..ApplyConfig::default()
        };
        let t: TabletId = "t1".parse().unwrap();
        let mut w = ApplyWorker::start(store, &dir.path().join("received"), t, cfg).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = w.stop();
            let _ = tx.send(r.map_err(|e| e.to_string()));
        });
        let r = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("stop() returned");
        let e = r.unwrap_err();
        assert!(e.contains("t1"), "{e}");
    }

    /// A log of `n` write records for tablet `t` under `root`; returns its end.
    fn write_log(root: &Path, t: &TabletId, n: u64) -> WalPos {
        append_log(root, t, 0..n)
    }

    /// Appends write records `range` (key `k{i}`, ht 1000 + i) to tablet `t`'s log under
    /// `root`; returns its end.
    fn append_log(root: &Path, t: &TabletId, range: std::ops::Range<u64>) -> WalPos {
        let mut w = tidelog_wal::Writer::open(root, t, tidelog_wal::WalOptions::default()).unwrap();
        for i in range {
            let r = Record::new(
                HybridTime(1000 + i),
                tidelog_wal::Body::Write {
                    ops: vec![tidelog_wal::Op::put(format!("k{i}"), b"v".to_vec())],
                    trx_id: None,
                    gtid: None,
                },
            );
            w.append(&r).unwrap();
        }
        w.commit(tidelog_wal::SyncPolicy::Always).unwrap()
    }

    /// An intake stand-in that makes a group durable every 20 ms until dropped.
    struct Receiving(Arc<AtomicBool>, Option<JoinHandle<()>>);

    impl Receiving {
        fn start(activity: Arc<IntakeActivity>) -> Receiving {
            let stop = Arc::new(AtomicBool::new(false));
            let s = stop.clone();
            let h = std::thread::spawn(move || {
                while !s.load(Ordering::Relaxed) {
                    activity.group_durable(crate::intake::BACKLOG_FRAME);
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
            Receiving(stop, Some(h))
        }
    }

    impl Drop for Receiving {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
            if let Some(h) = self.1.take() {
                let _ = h.join();
            }
        }
    }

    /// A worker on a group told to yield for up to `max`, in batches of 10 records, over a
    /// log of `n` records; returns it with the log's end and the group.
    fn yielding_worker(
        dir: &Path,
        n: u64,
        activity: &Arc<IntakeActivity>,
        max: Duration,
    ) -> (ApplyWorker, WalPos, Arc<ApplyThreads>) {
        let root = dir.join("received");
        let t: TabletId = "t1".parse().unwrap();
        let end = write_log(&root, &t, n);
        let store = Arc::new(Store::open(&dir.join("store")).unwrap());
        let group = Arc::new(ApplyThreads::new(1, "apply-yield").unwrap());
        group.yield_to_intake(activity.clone(), max);
        let cfg = ApplyConfig {
            threads: Some(group.clone()),
            batch_records: 10,
            ..ApplyConfig::default()
        };
        let w = ApplyWorker::start(store, &root, t, cfg).unwrap();
        w.notify();
        (w, end, group)
    }

    /// Behind (full batches) while the intake receives, the apply thread holds back after
    /// its first batch; once the intake goes quiet it applies the rest.
    #[test]
    fn apply_behind_yields_to_a_receiving_intake_until_it_goes_quiet() {
        let dir = tempfile::tempdir().unwrap();
        let activity = Arc::new(IntakeActivity::default());
        let rx = Receiving::start(activity.clone());
        let (mut w, end, group) =
            yielding_worker(dir.path(), 50, &activity, Duration::from_secs(3600));
        let first = w.wait_applied(WalPos(1), Duration::from_secs(10));
        assert!(
            first,
            "the first batch (the thread is not yet known to be behind) was not applied"
        );
        // Held back: the log's end is not reached within a generous window (a negative
        // check; the positive one below shows the same worker does get there).
        assert!(!w.wait_applied(end, Duration::from_millis(300)));
        assert!(w.applied_pos() < end);
        let st = group.yield_status();
        assert_eq!(st.limit, Some(Duration::from_secs(3600)));
        assert_eq!(st.holding_threads, 1, "{st:?}");
        assert!(st.held_total > Duration::ZERO, "{st:?}");
        drop(rx);
        assert!(
            w.wait_applied(end, Duration::from_secs(10)),
            "not applied once the intake went quiet"
        );
        assert_eq!(group.yield_status().holding_threads, 0);
        w.stop().unwrap();
    }

    /// During a catch-up a thread's round ends at its first full batch, and the next round
    /// starts at the tablet after it. Two tablets on one thread: `t1` falls behind and the
    /// thread holds back; `t2` falls behind during the hold. The round after the hold
    /// applies a batch of `t2` only, where a round over both would first apply a second
    /// batch of `t1`.
    #[test]
    fn a_catch_up_round_ends_at_its_first_full_batch() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("received");
        let tablets: Vec<TabletId> = ["t1", "t2"].iter().map(|t| t.parse().unwrap()).collect();
        let starts: Vec<WalPos> = tablets.iter().map(|t| write_log(&root, t, 1)).collect();
        let store = Arc::new(Store::open(&dir.path().join("store")).unwrap());
        let activity = Arc::new(IntakeActivity::default());
        let group = Arc::new(ApplyThreads::new(1, "apply-cut").unwrap());
        let hold = Duration::from_secs(2);
        group.yield_to_intake(activity.clone(), hold);
        let mut workers: Vec<ApplyWorker> = tablets
            .iter()
            .map(|t| {
                let cfg = ApplyConfig {
                    threads: Some(group.clone()),
                    batch_records: 10,
                    ..ApplyConfig::default()
                };
                ApplyWorker::start(store.clone(), &root, t.clone(), cfg).unwrap()
            })
            .collect();
        workers.iter().for_each(ApplyWorker::notify);
        // Both tablets on the thread and caught up (partial batches: no hold).
        for (w, start) in workers.iter_mut().zip(&starts) {
            assert!(
                w.wait_applied(*start, Duration::from_secs(10)),
                "{}",
                w.tablet()
            );
        }
        let rx = Receiving::start(activity.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while !activity.catching_up() {
            assert!(
                Instant::now() < deadline,
                "the stand-in intake never signalled"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut ends = vec![append_log(&root, &tablets[0], 1..51)];
        workers[0].notify();
        let deadline = Instant::now() + Duration::from_secs(10);
        while group.yield_status().holding_threads == 0 {
            assert!(Instant::now() < deadline, "the thread never held back");
            std::thread::sleep(Duration::from_millis(1));
        }
        let t1_held = workers[0].applied_pos();
        assert!(t1_held > starts[0] && t1_held < ends[0], "{t1_held}");
        ends.push(append_log(&root, &tablets[1], 1..51));
        // The round after the hold: `t2` moves first, `t1` not with it.
        let deadline = Instant::now() + hold + Duration::from_secs(10);
        while workers[1].applied_pos() == starts[1] {
            assert!(Instant::now() < deadline, "t2 never applied");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            workers[0].applied_pos(),
            t1_held,
            "t1 applied a second batch in the round that applied t2's first"
        );
        drop(rx);
        for (w, end) in workers.iter_mut().zip(&ends) {
            assert!(
                w.wait_applied(*end, Duration::from_secs(10)),
                "{}",
                w.tablet()
            );
        }
        for mut w in workers {
            w.stop().unwrap();
        }
    }

    /// With the intake receiving a backlog throughout, a log of `n` records is applied to
    /// its end by a group that yields for up to `max`.
    fn applied_while_receiving(n: u64, max: Duration) -> bool {
        let dir = tempfile::tempdir().unwrap();
        let activity = Arc::new(IntakeActivity::default());
        let _rx = Receiving::start(activity.clone());
        let (mut w, end, _g) = yielding_worker(dir.path(), n, &activity, max);
        let applied = w.wait_applied(end, Duration::from_secs(10));
        w.stop().unwrap();
        applied
    }

    /// A thread that keeps up (partial batches) never holds back, however busy the intake.
    #[test]
    fn apply_that_keeps_up_does_not_yield() {
        assert!(applied_while_receiving(5, Duration::from_secs(3600)));
    }

    /// A long catch-up holds each round back by at most the limit: the log is applied while
    /// the intake keeps receiving.
    #[test]
    fn a_long_catch_up_holds_apply_back_by_at_most_the_limit() {
        assert!(
            applied_while_receiving(50, Duration::from_millis(100)),
            "a receiving intake held apply back for good"
        );
    }
}
