//! The [`Store`] every stage shares: the current [`OpenStore`] behind a swap, replaced by a
//! fresh opening after a failed write.
//!
//! fjall refuses every write after one has failed (it "poisons" its database when a
//! journal write or a flush fails, e.g. on a full disk) until the database is opened
//! again. The apply workers, the safe-time publisher, retention and the admin API's readers
//! all hold one `Arc<Store>` and reach the database through it, so a reopen is seen by all:
//!
//! ```text
//!  a write fails: ENOSPC, or Poisoned after one ──► fault recorded: disk_full at <path>
//!        │                                          (logged once); writers hold, readers
//!        │                                          go on reading the old opening
//!        ▼
//!  reopen thread, with backoff: waits until space returned (statvfs), takes the current
//!  opening out (calls now get the fault), waits until no call holds it, drops it (fjall
//!  closes), opens the database again (journal recovery, unresolved transactions rebuilt
//!  from the received logs, as at start), installs it: generation + 1, fault cleared
//!        ▼
//!  the users see the new generation: the safe-time publisher rebuilds its core from the
//!  store, each apply worker re-reads its apply position from it and applies on
//! ```
//!
//! Everything is rebuilt from the reopened database, as a restart would: a batch whose
//! commit failed may still have reached the journal (its bytes waited in a buffer that a
//! later flush wrote out), and is then in the store after the reopen together with the
//! apply position it carries; what memory said before is not trusted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tidelog_wal::{HybridTime, Record, TabletId, TrxId, TxnId, WalPos};

use super::binlog::Binlog;
use super::db::{StoreMemory, StoreOptions, WORKER_THREAD};
use super::open::OpenStore;
use super::rebuild::Rebuilt;
use super::types::{
    ApplyOutcome, Cutover, CutoverReport, Durability, IntentRef, Part, RetentionFloor, Role,
    TabletMeta, TrxOpen, TxnState, Version,
};
use crate::disk::{self, Backoff, DiskFull};
use crate::error::{Error, Result};

/// A reopen is tried only with at least this much space free where the store lives.
pub const REOPEN_MIN_FREE: u64 = 4 << 20;

/// A store that failed for a reason other than a full disk ("Poisoned" without one) with
/// less than this free is taken to have filled its disk (fjall's flushes fail with no
/// error of their own reaching a caller).
const LOW_FREE: u64 = 64 << 20;

/// How long a reopen waits for the calls holding the old opening to finish.
const HOLDERS_WAIT: Duration = Duration::from_secs(30);

/// A reopen within this long of the previous one keeps the backoff where it was (a disk
/// that fills again at once is not retried at the shortest interval forever).
const SETTLED: Duration = Duration::from_secs(10);

/// Why the store takes no writes.
#[derive(Clone, Debug)]
enum Fault {
    DiskFull(DiskFull),
    Unavailable(String),
}

#[derive(Debug, Default)]
struct Wake {
    rung: bool,
    stop: bool,
}

#[derive(Debug)]
struct Shared {
    data_dir: PathBuf,
    /// `data_dir/store`: where the database lives (named in faults).
    path: PathBuf,
    opts: StoreOptions,
    cur: RwLock<Option<Arc<OpenStore>>>,
    /// Bumped by each reopen.
    generation: AtomicU64,
    fault: Mutex<Option<Fault>>,
    wake: Mutex<Wake>,
    wake_cv: Condvar,
    reopener: Mutex<Option<JoinHandle<()>>>,
    /// `store-nice`, applied again to a reopened database's workers.
    background_nice: Mutex<Option<i32>>,
    /// [`Store::set_prune_floor`], passed on to a reopened database.
    prune_floor: AtomicU64,
    /// A reopen waits for the old opening's users: long reads stop early.
    closing: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The applier's store. Cheap to share behind an `Arc`; all methods take `&self`. See the
/// module doc for how it lives through a full disk.
#[derive(Debug)]
pub struct Store {
    sh: Arc<Shared>,
}

/// The binlog of the current opening ([`Store::binlog`]); holding it holds that opening
/// (a reopen waits for it), so keep it for one look-up.
#[derive(Debug)]
pub struct BinlogRef(Arc<OpenStore>);

impl std::ops::Deref for BinlogRef {
    type Target = Binlog;
    fn deref(&self) -> &Binlog {
        self.0.binlog()
    }
}

impl Store {
    /// Opens (creating if needed) the store under `data_dir/store/` with the default
    /// memory settings ([`StoreOptions::default`]).
    pub fn open(data_dir: &Path) -> Result<Store> {
        Store::open_with(data_dir, &StoreOptions::default())
    }

    /// Opens (creating if needed) the store with the given block cache (shared by every
    /// keyspace) and memtable bound.
    pub fn open_with(data_dir: &Path, opts: &StoreOptions) -> Result<Store> {
        let s = OpenStore::open_with(data_dir, opts)?;
        Ok(Store {
            sh: Arc::new(Shared {
                data_dir: data_dir.to_path_buf(),
                path: data_dir.join("store"),
                opts: *opts,
                cur: RwLock::new(Some(Arc::new(s))),
                generation: AtomicU64::new(0),
                fault: Mutex::new(None),
                wake: Mutex::new(Wake::default()),
                wake_cv: Condvar::new(),
                reopener: Mutex::new(None),
                background_nice: Mutex::new(None),
                prune_floor: AtomicU64::new(0),
                closing: AtomicBool::new(false),
            }),
        })
    }

    /// Where the database lives (`data_dir/store`).
    pub fn path(&self) -> &Path {
        &self.sh.path
    }

    /// How many times the database was reopened since start. A user that keeps state
    /// derived from the store rebuilds it when this changes.
    pub fn generation(&self) -> u64 {
        self.sh.generation.load(Ordering::Acquire)
    }

    /// Why the store takes no writes now (a full disk names its path), if it does not.
    pub fn fault(&self) -> Option<Error> {
        lock(&self.sh.fault).as_ref().map(|f| self.sh.error(f))
    }

    /// The full disk that stopped the store's writes, if one did.
    pub fn disk_full(&self) -> Option<DiskFull> {
        match lock(&self.sh.fault).as_ref() {
            Some(Fault::DiskFull(d)) => Some(d.clone()),
            _ => None,
        }
    }

    /// The current opening, or the fault while there is none (a reopen in progress).
    pub(crate) fn current(&self) -> Result<Arc<OpenStore>> {
        self.sh.current()
    }

    /// Runs `f` on the current opening; a failed write records the fault (see the module
    /// doc) and returns it.
    fn run<T>(&self, f: impl FnOnce(&OpenStore) -> Result<T>) -> Result<T> {
        let s = self.current()?;
        let r = f(&s);
        drop(s);
        r.map_err(|e| Shared::failed(&self.sh, e))
    }

    /// Sets the nice value of the store's background workers (fjall's flushes and
    /// compactions, threads named [`WORKER_THREAD`]; with one store per process, as the
    /// daemon has, exactly this store's): the applier's `store-nice`, set again on the
    /// workers of a reopened database. Returns how many threads it set.
    pub fn set_background_nice(&self, nice: i32) -> std::io::Result<usize> {
        *lock(&self.sh.background_nice) = Some(nice);
        crate::priority::set_threads_nice(WORKER_THREAD, nice)
    }

    /// The cut every read is capped at, once a cutover began.
    pub fn cut(&self) -> Option<HybridTime> {
        self.current().ok().and_then(|s| s.cut())
    }

    /// Makes everything committed so far durable (fsync of the journal).
    pub fn persist(&self) -> Result<()> {
        self.run(|s| s.persist())
    }

    /// Writes every keyspace's memtable out to tables and waits for it.
    pub fn flush(&self) -> Result<()> {
        self.run(|s| s.flush())
    }

    /// Reads the `trx_status` look-up keyspaces through once, loading their blocks into the
    /// block cache (see [`OpenStore::warm_lookup_cache`]); stops early when a reopen needs
    /// the database. Returns the entries read.
    pub fn warm_lookup_cache(&self) -> Result<u64> {
        self.run(|s| s.warm_lookup_cache(&self.sh.closing))
    }

    /// What the store holds in memory (`STORE.md`, "Memory"); the default while it is
    /// being reopened.
    pub fn memory(&self) -> StoreMemory {
        self.current().map(|s| s.memory()).unwrap_or_default()
    }

    /// Whether fjall has no flush or compaction running or queued.
    pub fn background_idle(&self) -> bool {
        self.current().is_ok_and(|s| s.background_idle())
    }

    /// On-disk bytes of the `trx_status` look-up keyspaces' tables (trx, gtid, trx_open).
    pub fn lookup_index_bytes(&self) -> u64 {
        self.current().map_or(0, |s| s.lookup_index_bytes())
    }

    /// On-disk bytes and table count (all levels, level 0) of each keyspace, by name.
    pub fn disk_sizes(&self) -> Vec<(&'static str, u64, usize, usize)> {
        self.current().map(|s| s.disk_sizes()).unwrap_or_default()
    }

    /// fjall's write pressure, for the log of a slow batch.
    pub fn lsm_pressure(&self) -> String {
        match self.current() {
            Ok(s) => s.lsm_pressure(),
            Err(e) => e.to_string(),
        }
    }

    /// The stored state of one tablet, if any.
    pub fn tablet(&self, tablet: &TabletId) -> Result<Option<TabletMeta>> {
        self.run(|s| s.tablet(tablet))
    }

    /// Every tablet the store knows (registered or applied), by id.
    pub fn tablets(&self) -> Result<std::collections::BTreeMap<TabletId, TabletMeta>> {
        self.run(|s| s.tablets())
    }

    /// Marks `tablet` registered (announced by a shipper). Durable when it returns.
    pub fn register_tablet(&self, tablet: &TabletId) -> Result<()> {
        self.run(|s| s.register_tablet(tablet))
    }

    /// Records (or clears) the shipper that owns `tablet`. Durable when it returns.
    pub fn set_tablet_owner(&self, tablet: &TabletId, owner: Option<&str>) -> Result<()> {
        self.run(|s| s.set_tablet_owner(tablet, owner))
    }

    /// The persisted global safe time, if one was ever stored.
    pub fn global_safe_time(&self) -> Result<Option<HybridTime>> {
        self.run(|s| s.global_safe_time())
    }

    /// Raises the persisted global safe time to `ht` (never lowers it); returns the stored
    /// value afterwards.
    pub fn raise_global_safe_time(
        &self,
        ht: HybridTime,
        durability: Durability,
    ) -> Result<HybridTime> {
        self.run(|s| s.raise_global_safe_time(ht, durability))
    }

    /// The persisted role (standby until a cutover stores another).
    pub fn role(&self) -> Result<Role> {
        self.run(|s| s.role())
    }

    /// Stores the role durably.
    pub fn set_role(&self, role: Role) -> Result<()> {
        self.run(|s| s.set_role(role))
    }

    /// The binlog and its trx and gtid indexes (look-ups take no lock).
    pub fn binlog(&self) -> Result<BinlogRef> {
        self.current().map(BinlogRef)
    }

    /// Binlog entries with `commit_ht` below this may have been removed by retention.
    pub fn binlog_horizon(&self) -> Result<HybridTime> {
        self.run(|s| s.binlog_horizon())
    }

    /// Retention: removes up to `max` binlog entries with `commit_ht < before` (see
    /// [`OpenStore::expire_binlog`]).
    pub fn expire_binlog(&self, before: HybridTime, max: usize) -> Result<(usize, bool)> {
        self.run(|s| s.expire_binlog(before, max))
    }

    /// The persisted cutover, if one began.
    pub fn cutover(&self) -> Result<Option<Cutover>> {
        self.run(|s| s.cutover())
    }

    /// Phase 1 of a cutover (see [`OpenStore::begin_cutover`]).
    pub fn begin_cutover(&self, cut: HybridTime, cut_time_us: u64) -> Result<Cutover> {
        self.run(|s| s.begin_cutover(cut, cut_time_us))
    }

    /// Stores the cutover's report (see [`OpenStore::save_cutover_report`]).
    pub fn save_cutover_report(&self, report: &CutoverReport) -> Result<Cutover> {
        self.run(|s| s.save_cutover_report(report))
    }

    /// One step of the cutover's clean-up (see [`OpenStore::cutover_cleanup_step`]).
    pub fn cutover_cleanup_step(&self, max_scanned: usize) -> Result<(usize, usize, bool)> {
        self.run(|s| s.cutover_cleanup_step(max_scanned))
    }

    /// Versions the cutover's clean-up has removed so far, over all its runs.
    pub fn cutover_removed(&self) -> Result<u64> {
        self.run(|s| s.cutover_removed())
    }

    /// What the store knows about a transaction (see [`OpenStore::txn_state`]).
    pub fn txn_state(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        self.run(|s| s.txn_state(txn))
    }

    /// The intents on `tablet` of each of `txns` (see [`OpenStore::intents_on`]).
    pub fn intents_on(
        &self,
        tablet: &TabletId,
        txns: &[TxnId],
    ) -> Result<Vec<Option<Vec<IntentRef>>>> {
        self.run(|s| s.intents_on(tablet, txns))
    }

    /// The pending `trx_open` entry of `t` (see [`OpenStore::open_trx`]).
    pub fn open_trx(&self, t: TrxId) -> Result<Option<TrxOpen>> {
        self.run(|s| s.open_trx(t))
    }

    /// A transaction's `txns` record (see [`OpenStore::txn`]).
    pub fn txn(&self, txn: &TxnId) -> Result<Option<TxnState>> {
        self.run(|s| s.txn(txn))
    }

    /// Whether the store can take `rec` (see [`OpenStore::check_record`]).
    pub fn check_record(tablet: &TabletId, pos: WalPos, rec: &Record) -> Result<()> {
        OpenStore::check_record(tablet, pos, rec)
    }

    /// The cache of unresolved transactions may be incomplete (see
    /// [`OpenStore::mark_cache_incomplete`]); a reopen rebuilds it.
    pub(crate) fn mark_cache_incomplete(&self) {
        if let Ok(s) = self.current() {
            s.mark_cache_incomplete();
        }
    }

    /// Applies `records` of `tablet` in one atomic batch (see [`OpenStore::apply`]).
    pub fn apply(
        &self,
        tablet: &TabletId,
        records: &[(WalPos, Record)],
        end_pos: WalPos,
        durability: Durability,
    ) -> Result<ApplyOutcome> {
        self.run(|s| s.apply(tablet, records, end_pos, durability))
    }

    /// Applies `tablet`'s part of a committed transaction (see [`OpenStore::apply_part`]).
    pub fn apply_part(
        &self,
        tablet: &TabletId,
        txn: &TxnId,
        commit_ht: HybridTime,
        ops: &[(Vec<u8>, Option<Vec<u8>>)],
        durability: Durability,
    ) -> Result<bool> {
        self.run(|s| s.apply_part(tablet, txn, commit_ht, ops, durability))
    }

    /// Several parts of `tablet` in one atomic batch (see [`OpenStore::apply_parts`]).
    pub fn apply_parts(
        &self,
        tablet: &TabletId,
        parts: &[Part],
        durability: Durability,
    ) -> Result<usize> {
        self.run(|s| s.apply_parts(tablet, parts, durability))
    }

    /// Per tablet, the lowest received-log position applying may still read (see
    /// [`OpenStore::retention_floors`]).
    pub fn retention_floors(
        &self,
    ) -> Result<Option<std::collections::BTreeMap<TabletId, RetentionFloor>>> {
        self.run(|s| s.retention_floors())
    }

    /// What opening the database (the last time) rebuilt from the received logs.
    pub fn rebuilt(&self) -> Rebuilt {
        self.current().map(|s| s.rebuilt()).unwrap_or_default()
    }

    /// See [`OpenStore::set_prune_floor`]; kept for a reopened database.
    pub fn set_prune_floor(&self, ht: HybridTime) {
        self.sh.prune_floor.store(ht.0, Ordering::Release);
        if let Ok(s) = self.current() {
            s.set_prune_floor(ht);
        }
    }

    /// Committed transactions that may not be applied on every participant yet (see
    /// [`OpenStore::pending_txns`]).
    pub fn pending_txns(&self) -> Result<Vec<(TxnId, TxnState)>> {
        self.run(|s| s.pending_txns())
    }

    /// The newest version of `key` with ht ≤ `at` (newest of all for `None`).
    pub fn get(&self, key: &[u8], at: Option<HybridTime>) -> Result<Option<Version>> {
        self.run(|s| s.get(key, at))
    }

    /// Per user key starting with `prefix`, the version visible at `at` (see
    /// [`OpenStore::scan`]).
    #[allow(clippy::type_complexity)]
    pub fn scan(
        &self,
        prefix: &[u8],
        at: Option<HybridTime>,
        limit: usize,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>, HybridTime)>, bool)> {
        self.run(|s| s.scan(prefix, at, limit))
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        {
            let mut w = lock(&self.sh.wake);
            w.stop = true;
            self.sh.wake_cv.notify_all();
        }
        if let Some(h) = lock(&self.sh.reopener).take() {
            let _ = h.join();
        }
    }
}

impl Shared {
    fn current(&self) -> Result<Arc<OpenStore>> {
        let cur = self.cur.read().unwrap_or_else(|p| p.into_inner()).clone();
        match cur {
            Some(s) => Ok(s),
            None => Err(match lock(&self.fault).as_ref() {
                Some(f) => self.error(f),
                None => self.unavailable("being reopened"),
            }),
        }
    }

    fn unavailable(&self, reason: &str) -> Error {
        Error::Unavailable {
            path: self.path.clone(),
            reason: reason.to_string(),
        }
    }

    fn error(&self, f: &Fault) -> Error {
        match f {
            Fault::DiskFull(d) => Error::DiskFull(d.clone()),
            Fault::Unavailable(r) => self.unavailable(r),
        }
    }

    /// A call on the store failed with `e`. A write that failed for a full disk, or one
    /// refused because an earlier write failed (fjall's "Poisoned"), stops the store's
    /// writes until a reopen: the fault is recorded (once), the reopen thread woken, and
    /// the fault returned. Anything else is returned as it is.
    fn failed(sh: &Arc<Shared>, e: Error) -> Error {
        let no_space = e.is_no_space();
        let poisoned = matches!(
            &e,
            Error::Store {
                source: fjall::Error::Poisoned,
                ..
            }
        );
        if !no_space && !poisoned {
            return e;
        }
        let mut g = lock(&sh.fault);
        let fault = match g.as_ref() {
            Some(f) => f.clone(),
            None => {
                let what = match &e {
                    Error::Store { op, .. } if no_space => format!("a store write failed ({op})"),
                    _ if no_space => format!("a store write failed: {e}"),
                    _ => "the store refuses writes after a failed one".to_string(),
                };
                let full = no_space || disk::free_bytes(&sh.path).is_ok_and(|free| free < LOW_FREE);
                let f = if full {
                    Fault::DiskFull(DiskFull {
                        path: sh.path.clone(),
                        message: disk::no_space_message(&sh.path, &what),
                    })
                } else {
                    Fault::Unavailable(format!("{what} ({e}); reopening"))
                };
                tracing::error!(store = %sh.path.display(),
                    "store writes stopped: {}; apply holds and retries once it is reopened", sh.error(&f));
                *g = Some(f.clone());
                Shared::start_reopener(sh);
                f
            }
        };
        drop(g);
        let mut w = lock(&sh.wake);
        w.rung = true;
        sh.wake_cv.notify_all();
        drop(w);
        sh.error(&fault)
    }

    fn start_reopener(sh: &Arc<Shared>) {
        let mut r = lock(&sh.reopener);
        if r.is_some() {
            return;
        }
        let sh2 = sh.clone();
        match std::thread::Builder::new()
            .name("store-reopen".into())
            .spawn(move || reopen_loop(&sh2))
        {
            Ok(h) => *r = Some(h),
            Err(e) => tracing::error!("cannot start the store's reopen thread: {e}"),
        }
    }

    /// Closes the current opening once no call holds it and opens the database again.
    fn reopen(&self) -> Result<Duration> {
        let t0 = Instant::now();
        self.closing.store(true, Ordering::SeqCst);
        let old = self.cur.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(old) = old {
            while Arc::strong_count(&old) > 1 {
                if t0.elapsed() >= HOLDERS_WAIT {
                    let holders = Arc::strong_count(&old) - 1;
                    *self.cur.write().unwrap_or_else(|p| p.into_inner()) = Some(old);
                    self.closing.store(false, Ordering::SeqCst);
                    return Err(self.unavailable(&format!(
                        "{holders} calls still hold the failed database after {HOLDERS_WAIT:?}"
                    )));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            // fjall closes: its workers stop and its lock file is released.
            drop(old);
        }
        self.closing.store(false, Ordering::SeqCst);
        let s = OpenStore::open_with(&self.data_dir, &self.opts)?;
        s.set_prune_floor(HybridTime(self.prune_floor.load(Ordering::Acquire)));
        *self.cur.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(s));
        *lock(&self.fault) = None;
        self.generation.fetch_add(1, Ordering::AcqRel);
        if let Some(nice) = *lock(&self.background_nice) {
            if let Err(e) = crate::priority::set_threads_nice(WORKER_THREAD, nice) {
                tracing::warn!(nice, "store-nice on the reopened store's workers: {e}");
            }
        }
        Ok(t0.elapsed())
    }
}

/// The reopen thread: while the store has a fault, tries to reopen it with backoff — for a
/// full disk only once [`REOPEN_MIN_FREE`] is free again. Logs each change of state once.
fn reopen_loop(sh: &Arc<Shared>) {
    let mut backoff = Backoff::default();
    let mut faulty = false;
    let mut last_reopen: Option<Instant> = None;
    // What was last logged about waiting, so that each change is logged once.
    let mut said = String::new();
    loop {
        {
            let g = lock(&sh.wake);
            let wait = if faulty {
                backoff.left().max(Duration::from_millis(1))
            } else {
                Duration::from_secs(3600)
            };
            let (mut g, _) = sh
                .wake_cv
                .wait_timeout_while(g, wait, |w| !w.rung && !w.stop)
                .unwrap_or_else(|p| p.into_inner());
            if g.stop {
                return;
            }
            g.rung = false;
        }
        let Some(fault) = lock(&sh.fault).clone() else {
            faulty = false;
            continue;
        };
        if !faulty {
            faulty = true;
            if last_reopen.is_none_or(|t| t.elapsed() >= SETTLED) {
                backoff.reset();
            }
            backoff.failed();
            continue;
        }
        if !backoff.due() {
            continue;
        }
        if let Fault::DiskFull(d) = &fault {
            let free = disk::free_bytes(&sh.path).unwrap_or(0);
            if free < REOPEN_MIN_FREE {
                let now = format!("waiting for space at {}", d.path.display());
                if now != said {
                    tracing::warn!(store = %sh.path.display(), free, need = REOPEN_MIN_FREE,
                        "store: {now}; retrying with backoff");
                    said = now;
                }
                backoff.failed();
                continue;
            }
        }
        match sh.reopen() {
            Ok(took) => {
                tracing::info!(store = %sh.path.display(), took_ms = took.as_millis() as u64,
                    generation = sh.generation.load(Ordering::Acquire),
                    "store reopened after a failed write: writes resume");
                faulty = false;
                said.clear();
                last_reopen = Some(Instant::now());
            }
            Err(e) => {
                // Logged once per kind of failure (a full disk's message counts the bytes
                // free, which change from one try to the next).
                let now = match e.disk_full() {
                    Some(d) => {
                        format!("reopening failed: the disk is full at {}", d.path.display())
                    }
                    None => format!("reopening failed: {e}"),
                };
                if now != said {
                    tracing::warn!(store = %sh.path.display(), "store: reopening failed: {e}; retrying with backoff");
                    said = now;
                }
                if let Some(d) = e.disk_full() {
                    *lock(&sh.fault) = Some(Fault::DiskFull(d.clone()));
                } else if e.is_no_space() {
                    *lock(&sh.fault) = Some(Fault::DiskFull(DiskFull {
                        path: sh.path.clone(),
                        message: disk::no_space_message(&sh.path, "reopening the store failed"),
                    }));
                }
                backoff.failed();
            }
        }
    }
}
