//! Safe time in the running applier: the [`Core`] behind a mutex for the apply workers, and
//! the published global safe time that readers load **without a lock**
//! (docs/ARCHITECTURE.md, "Safe time").
//!
//! ```text
//!  apply workers ──after_batch / part_applied──► Core (mutex) ──► ready parts → workers
//!                                                   │ signal
//!                                                   ▼
//!  publisher thread: S = core.safe_time(); write S (buffered); publish S
//!                                                   │
//!  readers: global.load(Acquire)  ◄─────────────────┘   waiters: wait_until(T, deadline)
//! ```
//!
//! Waiters ([`Consistency::wait_until`] for async callers, [`Consistency::wait_for`] for
//! threads) register their target with a [`SeqWait`]: an async wait holds no thread, and
//! the publisher pays a fence and a relaxed load per publish while nobody waits.
//!
//! S is published as soon as the store batches it covers are written, **before** they are
//! fsynced: the publisher writes S into the store's journal after those batches and
//! publishes it; the store is fsynced later, off this path (the apply workers' persist
//! interval, a cutover, a stop). S never goes backwards, not even across a restart:
//!
//! * every record S covers was durable in a received log before it was applied (the
//!   workers read only the durable part), and nothing above a tablet's persisted apply
//!   position is released from its received log;
//! * a crash keeps a prefix of the store's journal: some earlier S' (≤ S) with exactly the
//!   batches S' covers;
//! * at start the applier replays every received log to the end it had at the crash and
//!   waits until the published safe time covers what it replayed ([`Consistency::replayed`])
//!   before anyone can read (the daemon opens its admin socket only then). That value is at
//!   least S, because safe time is a function of the received logs alone.
//!
//! Publishing after an fsync instead (one store fsync per published value) cost about
//! 1.2 ms of the safe-time lag at p50 on the 2-core benchmark machine.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam::utils::CachePadded;
use tidelog_wal::{Heartbeat, HybridTime, TabletId, WalPos};

use crate::core::{Core, Part, SafeTime};
use crate::doorbell::Doorbell;
use crate::error::Result;
use crate::latency::{HistogramSnapshot, LatencyHistogram};
use crate::seq_wait::{SeqWait, Wake};
use crate::store::{ApplyOutcome, Durability, Store};

type Waker = Arc<dyn Fn() + Send + Sync>;

/// A store write before a publish that takes this long is logged.
const SLOW_PUBLISH: Duration = Duration::from_millis(100);

struct Wakers(BTreeMap<TabletId, Waker>);

impl std::fmt::Debug for Wakers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.keys()).finish()
    }
}

/// A snapshot for `GET /v1/safe-time`.
#[derive(Clone, Debug)]
pub struct SafeTimeReport {
    /// The published global safe time (`None`: not initialized).
    pub safe_time: Option<HybridTime>,
    /// Why it is not initialized, or which tablet holds it back.
    pub laggiest: Option<TabletId>,
    pub uninitialized_reason: Option<String>,
    /// Per tablet: its applied safe time.
    pub tablets: BTreeMap<TabletId, HybridTime>,
    /// Committed transactions not yet applied everywhere.
    pub pending_txns: usize,
}

/// A tablet's apply stage as start-up recovery waits on it ([`Consistency::replayed`]):
/// the apply worker's progress (`crate::apply::ApplyProgress`), seen from here without
/// naming the apply stage, which sits above this core.
pub trait Replaying {
    fn tablet(&self) -> &TabletId;
    /// Waits up to `timeout` until everything before `pos` is applied; whether it is.
    fn wait_applied(&self, pos: WalPos, timeout: Duration) -> bool;
    /// Whether the worker still applies (false after a stop or an error).
    fn is_running(&self) -> bool;
    /// Why it stopped, if it stopped on an error.
    fn fault(&self) -> Option<String>;
}

/// The running safe-time machinery of one applier.
#[derive(Debug)]
pub struct Consistency {
    core: Mutex<Core>,
    store: Arc<Store>,
    /// Published global safe time; 0 = not initialized. Readers load it lock-free.
    global: CachePadded<AtomicU64>,
    wakers: Mutex<Wakers>,
    /// Work for the publisher.
    signal: Doorbell,
    /// Each publish: the new value written to the store before it is published.
    publish_latency: LatencyHistogram,
    /// Age of each published safe time when readers could first see it (the `visible` lag
    /// stage).
    visible_age: LatencyHistogram,
    /// Callers waiting for the published safe time to reach a value.
    waiters: SeqWait,
    stop: AtomicBool,
    publisher: Mutex<Option<JoinHandle<()>>>,
    /// The cutover's cut (0: none): safe time is frozen there.
    cut: AtomicU64,
    /// A cutover has begun and not failed: once the publisher stops, waiters hold on for
    /// the cut instead of giving up.
    cutting: AtomicBool,
    /// Beats once per publisher iteration (at least every 50 ms).
    heartbeat: Heartbeat,
    /// The tablets that must report before the safe time is initialized (`expect-tablets`).
    expected: Vec<TabletId>,
    /// The store generation the core was built from ([`Store::generation`]): after a
    /// reopen of the store the core is built again from it, and the apply workers wait
    /// for that before they apply.
    generation: AtomicU64,
    /// Records (not heartbeats) applied at or below the published safe time: only a tablet
    /// that registered after the safe time passed its records can have them (see
    /// [`Consistency::check_below_safe_time`]).
    below_safe_time: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A core built from the store: its tablets and their applied safe times (and `known`
/// ones, registered with none yet), and its pending commits with the parts already applied.
fn core_from(
    store: &Store,
    expected: &[TabletId],
    known: impl IntoIterator<Item = TabletId>,
) -> Result<Core> {
    let mut core = Core::new(expected.iter().cloned());
    for t in known {
        core.register(&t, HybridTime::MIN);
    }
    for (t, m) in store.tablets()? {
        core.register(&t, m.safe_time);
    }
    for (txn, st) in store.pending_txns()? {
        if let Some(c) = &st.commit {
            core.commit(txn, c.commit_ht, &c.participants, &st.applied_parts);
        }
    }
    Ok(core)
}

impl Consistency {
    /// Rebuilds the core from the store (tablets and their applied safe times, pending
    /// commits with the parts already applied) and starts the publisher.
    pub fn start(store: Arc<Store>, expected: Vec<TabletId>) -> Result<Arc<Consistency>> {
        Self::start_with_nice(store, expected, 0)
    }

    /// [`Consistency::start`], the publisher thread at nice value `nice` (0: the process's;
    /// see [`crate::priority`]).
    pub fn start_with_nice(
        store: Arc<Store>,
        expected: Vec<TabletId>,
        nice: i32,
    ) -> Result<Arc<Consistency>> {
        let c = Self::build(store, expected, None)?;
        let c2 = c.clone();
        let h = std::thread::Builder::new()
            .name("safe-time".into())
            .spawn(move || {
                crate::priority::apply_stage_nice("safe-time", nice);
                c2.publisher_loop()
            })
            .map_err(|source| crate::error::Error::Io {
                op: "spawn the safe-time publisher",
                path: Default::default(),
                source,
            })?;
        *lock(&c.publisher) = Some(h);
        Ok(c)
    }

    /// A promoted target's safe time: frozen at `cut`, no publisher; the core (for
    /// reports) is rebuilt from the store as usual.
    pub fn frozen(
        store: Arc<Store>,
        expected: Vec<TabletId>,
        cut: HybridTime,
    ) -> Result<Arc<Consistency>> {
        Self::build(store, expected, Some(cut))
    }

    /// Stops the publisher and freezes the published safe time at `cut` (a cutover). The
    /// cut must be the safe time published last (a cutover takes it after `stop`).
    pub fn freeze(&self, cut: HybridTime) {
        self.stop();
        self.cut.store(cut.0, Ordering::SeqCst);
        self.global.store(cut.0, Ordering::Release);
        self.waiters.wake_all();
    }

    /// A cutover begins: stops the publisher; [`wait_for`](Self::wait_for) callers keep
    /// waiting (within their deadlines) until [`freeze`](Self::freeze) sets the cut, so that
    /// they answer as the promoted target, or until [`cutover_failed`](Self::cutover_failed).
    pub fn begin_cutover(&self) {
        self.cutting.store(true, Ordering::SeqCst);
        self.stop();
    }

    /// The cutover begun by [`begin_cutover`](Self::begin_cutover) failed before its cut
    /// was set: waiters give up (the publisher stays stopped).
    pub fn cutover_failed(&self) {
        self.cutting.store(false, Ordering::SeqCst);
        self.waiters.wake_all();
    }

    /// The cutover's cut, once frozen.
    pub fn cut(&self) -> Option<HybridTime> {
        match self.cut.load(Ordering::SeqCst) {
            0 => None,
            c => Some(HybridTime(c)),
        }
    }

    fn build(
        store: Arc<Store>,
        expected: Vec<TabletId>,
        cut: Option<HybridTime>,
    ) -> Result<Arc<Consistency>> {
        let generation = store.generation();
        let core = core_from(&store, &expected, std::iter::empty())?;
        let persisted = match cut {
            Some(c) => c,
            None => store.global_safe_time()?.unwrap_or_default(),
        };
        let c = Arc::new(Consistency {
            core: Mutex::new(core),
            store,
            global: CachePadded::new(AtomicU64::new(persisted.0)),
            wakers: Mutex::new(Wakers(BTreeMap::new())),
            signal: Doorbell::new(true),
            publish_latency: LatencyHistogram::new(),
            visible_age: LatencyHistogram::new(),
            waiters: SeqWait::default(),
            stop: AtomicBool::new(cut.is_some()),
            publisher: Mutex::new(None),
            cut: AtomicU64::new(cut.map_or(0, |c| c.0)),
            cutting: AtomicBool::new(false),
            heartbeat: Heartbeat::new(),
            expected,
            generation: AtomicU64::new(generation),
            below_safe_time: AtomicU64::new(0),
        });
        Ok(c)
    }

    /// The store generation the core reflects (see the `generation` field).
    pub fn store_generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// After a reopen of the store: builds the core again from what the reopened store
    /// holds, as at start (tablets known to the old core count as registered), and wakes
    /// every worker to read its position back. The published safe time stays: every batch
    /// it covers was committed, so the reopened store holds it.
    fn rebuild(&self) -> Result<()> {
        let generation = self.store.generation();
        let known: Vec<TabletId> = lock(&self.core).tablets().map(|(t, _)| t.clone()).collect();
        let core = core_from(&self.store, &self.expected, known)?;
        *lock(&self.core) = core;
        self.generation.store(generation, Ordering::Release);
        let published = self.global.load(Ordering::Acquire);
        if published > 0 {
            self.store
                .raise_global_safe_time(HybridTime(published), Durability::Buffered)?;
        }
        for wake in lock(&self.wakers).0.values() {
            wake();
        }
        Ok(())
    }

    /// Registers tablet `t`'s worker: `wake` is called when parts become ready for it.
    pub fn register_worker(&self, t: &TabletId, safe: HybridTime, wake: Waker) {
        lock(&self.core).register(t, safe);
        lock(&self.wakers).0.insert(t.clone(), wake);
        self.kick();
    }

    /// Makes `t` count for safe time before its worker starts (a registered tablet).
    pub fn register_tablet(&self, t: &TabletId) {
        lock(&self.core).register(t, HybridTime::MIN);
        self.kick();
    }

    /// How long publishing took (the value written to the store), per published value.
    pub fn publish_latency(&self) -> HistogramSnapshot {
        self.publish_latency.snapshot()
    }

    /// How old each published safe time was when it was published.
    pub fn visible_age(&self) -> HistogramSnapshot {
        self.visible_age.snapshot()
    }

    /// Tablet `t` applied a batch: record its commits and its new safe time; wake the
    /// workers that got ready parts.
    pub fn after_batch(&self, t: &TabletId, out: &ApplyOutcome) {
        let mut woken = Vec::new();
        {
            let mut core = lock(&self.core);
            for (txn, ci) in &out.new_commits {
                core.commit(*txn, ci.commit_ht, &ci.participants, &Default::default());
                for p in &ci.participants {
                    if p != t && core.has_ready(p) {
                        woken.push(p.clone());
                    }
                }
            }
            core.advance(t, out.safe_time);
        }
        if !woken.is_empty() {
            let w = lock(&self.wakers);
            for p in woken {
                if let Some(f) = w.0.get(&p) {
                    f();
                }
            }
        }
        self.kick();
    }

    /// Before tablet `t` applies `records`: counts (and logs) those at or below the
    /// published safe time. A registered tablet never has any (the safe time is at most its
    /// own); a tablet the target learns of only after the safe time passed its first
    /// records — a shipper started late, or a new tablet whose records carry old hts —
    /// does, and consistent reads at times between its first record and its registration
    /// did not see them. Nothing can take the safe time back: this makes it
    /// visible (`tidelog_applier_records_below_safe_time_total`).
    pub fn check_below_safe_time<'a>(
        &self,
        t: &TabletId,
        records: impl IntoIterator<Item = &'a tidelog_wal::Record>,
    ) {
        let Some(safe) = self.safe_time() else {
            return;
        };
        let mut n = 0u64;
        let mut first = None;
        for r in records {
            if r.ht > safe {
                break;
            }
            if !matches!(r.body, tidelog_wal::Body::Heartbeat) {
                n += 1;
                first.get_or_insert(r.ht);
            }
        }
        if let Some(first) = first {
            self.below_safe_time.fetch_add(n, Ordering::Relaxed);
            tracing::error!(
                tablet = %t,
                records = n,
                first_ht = %first,
                safe_time = %safe,
                "records at or below the published safe time: the tablet was registered after \
                 the safe time passed them (a tablet added while running); consistent reads \
                 between its first record and its registration did not include them"
            );
        }
    }

    /// Records counted by [`Consistency::check_below_safe_time`] since start.
    pub fn records_below_safe_time(&self) -> u64 {
        self.below_safe_time.load(Ordering::Relaxed)
    }

    /// Parts tablet `t`'s worker must apply now.
    pub fn take_ready(&self, t: &TabletId) -> Vec<Part> {
        lock(&self.core).take_ready(t)
    }

    /// `part` is applied (its batch committed to the store).
    pub fn part_applied(&self, part: &Part) {
        self.parts_applied(std::slice::from_ref(part));
    }

    /// [`Consistency::part_applied`] for several parts, under one lock.
    pub fn parts_applied(&self, parts: &[Part]) {
        {
            let mut core = lock(&self.core);
            for p in parts {
                core.part_applied(p);
            }
        }
        self.kick();
    }

    fn kick(&self) {
        self.signal.ring();
    }

    /// The last step of start-up recovery (see the module docs): waits until every
    /// worker in `replay` has applied its tablet's received log to the end given with it
    /// (the end the log had at start), then until the published safe time covers the
    /// tablets' safe times as replayed. Until then a reader could be shown a safe time
    /// below one published before a crash. `waiting` is called about once a second while
    /// a tablet is still replaying. A tablet whose worker stopped (a record it cannot
    /// apply) is not waited for: it holds the safe time at its last applied record, and
    /// the others are replayed and published all the same. Returns `Err` naming the tablets
    /// whose workers stopped, or when the safe time did not follow within `publish_within`
    /// of the replay's end.
    pub fn replayed<P: Replaying>(
        &self,
        replay: &[(P, WalPos)],
        publish_within: Duration,
        mut waiting: impl FnMut(&P, WalPos),
    ) -> std::result::Result<(), String> {
        let mut stopped = Vec::new();
        for (p, end) in replay {
            while !p.wait_applied(*end, Duration::from_secs(1)) {
                if !p.is_running() {
                    let why = p.fault().unwrap_or_else(|| "stopped".to_string());
                    stopped.push(format!(
                        "tablet {} stopped before the end {end} of its received log: {why}",
                        p.tablet()
                    ));
                    break;
                }
                waiting(p, *end);
            }
        }
        self.publish_replayed(publish_within)?;
        if stopped.is_empty() {
            Ok(())
        } else {
            Err(stopped.join("; "))
        }
    }

    /// The end of [`Consistency::replayed`]: waits until the published safe time covers the
    /// tablets' safe times as replayed.
    fn publish_replayed(&self, publish_within: Duration) -> std::result::Result<(), String> {
        // Uninitialized now (an expected tablet never applied anything) means it was then.
        let target = {
            let core = lock(&self.core);
            match core.safe_time() {
                SafeTime::At { .. } => core.tablets().map(|(_, ht)| ht).min(),
                SafeTime::Uninitialized { .. } | SafeTime::NoTablets => None,
            }
        };
        let Some(target) = target else {
            return Ok(());
        };
        self.kick();
        if self.wait_for(target, Instant::now() + publish_within) {
            return Ok(());
        }
        let now = match self.safe_time() {
            Some(s) => s.to_string(),
            None => "uninitialized".to_string(),
        };
        Err(format!(
            "the safe time did not reach {target} (the tablets' minimum after replaying) within {publish_within:?}: it is {now}, held by {}",
            self.report().laggiest.map_or_else(|| "no tablet".to_string(), |t| t.to_string())
        ))
    }

    /// The published global safe time (lock-free), `None` before it is initialized.
    pub fn safe_time(&self) -> Option<HybridTime> {
        match self.global.load(Ordering::Acquire) {
            0 => None,
            v => Some(HybridTime(v)),
        }
    }

    /// Whether the published safe time is ≥ `ht`.
    fn reached(&self, ht: HybridTime) -> bool {
        self.safe_time().is_some_and(|s| s >= ht)
    }

    /// Whether waiting can no longer help: the publisher stopped (a shutdown, or a cutover
    /// once its cut is set: the safe time advances no more).
    fn gave_up(&self) -> bool {
        let awaiting_cut =
            self.cutting.load(Ordering::SeqCst) && self.cut.load(Ordering::SeqCst) == 0;
        self.stop.load(Ordering::SeqCst) && !awaiting_cut
    }

    /// Blocks the calling thread until the published safe time is ≥ `ht`, `deadline`, or
    /// the publisher stops (a shutdown, or a cutover once its cut is set: the safe time
    /// advances no more); whether it got there. Async callers use
    /// [`wait_until`](Self::wait_until), which holds no thread.
    pub fn wait_for(&self, ht: HybridTime, deadline: Instant) -> bool {
        loop {
            if self.reached(ht) {
                return true;
            }
            if self.gave_up() || Instant::now() >= deadline {
                return false;
            }
            let (tx, rx) = std::sync::mpsc::sync_channel(1);
            let ticket = self.waiters.register(ht.0, Wake::Thread(tx));
            if !self.reached(ht) && !self.gave_up() {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = rx.recv_timeout(left);
            }
            self.waiters.deregister(ticket);
        }
    }

    /// [`wait_for`](Self::wait_for) for an async caller: the task sleeps, no thread is
    /// held, however many wait. Dropping the future (a client that went away) removes its
    /// registration.
    pub async fn wait_until(&self, ht: HybridTime, deadline: Instant) -> bool {
        /// Deregisters on every way out, cancellation included.
        struct Registered<'a>(&'a SeqWait, crate::seq_wait::Ticket);
        impl Drop for Registered<'_> {
            fn drop(&mut self) {
                self.0.deregister(self.1);
            }
        }
        loop {
            if self.reached(ht) {
                return true;
            }
            if self.gave_up() || Instant::now() >= deadline {
                return false;
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            let _registered =
                Registered(&self.waiters, self.waiters.register(ht.0, Wake::Task(tx)));
            if !self.reached(ht) && !self.gave_up() {
                let _ = tokio::time::timeout_at(deadline.into(), rx).await;
            }
        }
    }

    /// Callers waiting in [`wait_for`](Self::wait_for) or [`wait_until`](Self::wait_until)
    /// now.
    pub fn waiters(&self) -> usize {
        self.waiters.len()
    }

    /// What `GET /v1/safe-time` shows.
    pub fn report(&self) -> SafeTimeReport {
        let core = lock(&self.core);
        let tablets = core.tablets().map(|(t, s)| (t.clone(), s)).collect();
        let pending_txns = core.pending_len();
        let (laggiest, reason) = match core.safe_time() {
            SafeTime::At { laggiest, .. } => (Some(laggiest), None),
            SafeTime::Uninitialized { missing } => {
                let r = format!("tablet {missing} has not reported yet");
                (Some(missing), Some(r))
            }
            SafeTime::NoTablets => (None, Some("no tablets registered yet".into())),
        };
        drop(core);
        SafeTimeReport {
            safe_time: self.safe_time(),
            laggiest,
            uninitialized_reason: reason,
            tablets,
            pending_txns,
        }
    }

    /// When the publisher thread last went round its loop (at least every 50 ms while it
    /// runs); `None` when no publisher runs: after [`stop`](Self::stop) or a cutover's
    /// freeze, and on a promoted target.
    pub fn last_progress(&self) -> Option<Instant> {
        let running = lock(&self.publisher)
            .as_ref()
            .is_some_and(|h| !h.is_finished());
        (running && !self.stop.load(Ordering::SeqCst)).then(|| self.heartbeat.last())
    }

    /// Stops the publisher (after one last publish).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.kick();
        if let Some(h) = lock(&self.publisher).take() {
            let _ = h.join();
        }
        // Waiters give up: nothing will advance the safe time now.
        self.waiters.wake_all();
    }

    fn publisher_loop(&self) {
        // The last failure logged (each change once, not each retry).
        let mut failing: Option<String> = None;
        let mut report = |r: std::result::Result<(), String>| match (r, &failing) {
            (Ok(()), Some(_)) => {
                tracing::info!("safe time: store writes resumed");
                failing = None;
            }
            (Err(e), last) if last.as_deref() != Some(e.as_str()) => {
                tracing::error!("safe time held: {e}; retrying");
                failing = Some(e);
            }
            _ => {}
        };
        loop {
            self.heartbeat.beat();
            self.signal.wait(Duration::from_millis(50), || {
                self.stop.load(Ordering::SeqCst)
            });
            if self.store.generation() != self.store_generation() {
                match self.rebuild() {
                    Ok(()) => tracing::info!(
                        generation = self.store_generation(),
                        "safe-time core rebuilt from the reopened store"
                    ),
                    Err(e) => {
                        report(Err(format!(
                            "rebuilding the core after a store reopen: {e}"
                        )));
                        continue;
                    }
                }
            }
            let candidate = match lock(&self.core).safe_time() {
                SafeTime::At { ht, .. } => Some(ht),
                SafeTime::Uninitialized { .. } | SafeTime::NoTablets => None,
            };
            if let Some(ht) = candidate {
                if ht.0 > self.global.load(Ordering::Acquire) {
                    // Written after the batches it covers (a recovery that keeps it keeps
                    // them), not fsynced: see the module docs for why a crash cannot take a
                    // published value back.
                    let t0 = Instant::now();
                    let r = self.store.raise_global_safe_time(ht, Durability::Buffered);
                    let took = t0.elapsed();
                    self.publish_latency.record(took);
                    if took >= SLOW_PUBLISH {
                        tracing::warn!(
                            took_ms = took.as_millis() as u64,
                            lsm = %self.store.lsm_pressure(),
                            "slow store write before publishing the safe time"
                        );
                    }
                    report(
                        r.as_ref()
                            .map(|_| ())
                            .map_err(|e| format!("writing safe time {ht}: {e}")),
                    );
                    if r.is_ok() {
                        let before = self.global.fetch_max(ht.0, Ordering::Release);
                        self.visible_age.record_age(ht);
                        self.waiters.advanced(before.max(ht.0));
                    }
                }
            }
            if self.stop.load(Ordering::SeqCst) {
                let _ = self.store.persist();
                return;
            }
        }
    }
}
