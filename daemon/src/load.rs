//! Load generators: write source WALs the way a real transactional database would
//! (docs/ARCHITECTURE.md, "Concepts"), for the `tidelog demo` command, `tidelog-bench load`
//! and tests.
//!
//! Every tablet `t0..t{N-1}` under `wal_dir` has its own [`Writer`]; one [`HybridClock`]
//! stamps every record, so hts are globally increasing. Transactions run in **rounds** (about
//! one per millisecond, or as fast as possible at `rate = 0`):
//!
//! 1. each planned transaction is appended in plan order: a single-tablet transaction as one
//!    `write` record {ops, trx_id, gtid}, a distributed one as an `intent` {txn, trx_id, ops}
//!    on each participant tablet;
//! 2. every touched writer is committed with the sync policy; under `batch` the generator
//!    then waits until the intents are durable (`Writer::wait_durable`), as a 2PC
//!    coordinator waits for its prepare records;
//! 3. only then is each distributed transaction's decision appended to its **status
//!    tablet** (the first participant), at a commit_ht above all its intents: `commit`
//!    {txn, participants, trx_id, gtid} or, with probability `abort_rate`, `abort`
//!    {txn, trx_id}; and those writers are committed.
//!
//! Client connections are [`Session`]s (trx id `connect_id:commit_counter`, the counter
//! moving only on commit, so the transaction after an abort reuses its id). A session runs
//! its transactions one after the other: within a round it may run several single-tablet
//! transactions and at most one distributed transaction, last. Keys written by a
//! distributed transaction are locked until its decision (the end of the round), as a real
//! database's intents would lock them. Gtids come from one [`GtidGen`] (domain 0, server 1),
//! continuing after a restart; they are assigned in commit_ht order.
//!
//! Tablets without a record for `heartbeat_interval` get a `heartbeat`; at the end every
//! tablet gets one, so everything written becomes visible at a target.
//!
//! Workloads: `bank` (transfers between accounts, the total constant: [`bank_total`]),
//! `kv` (random puts and deletes) and `ordered` (per-session strictly increasing counters).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tidelog_testkit::session::{recover_last_gtid_seq, ConnectIdGen, GtidGen, Session};
use tidelog_wal::{
    Body, Gtid, HybridClock, HybridTime, Op, Record, SyncPolicy, TabletId, TrxId, TxnId,
    WalOptions, WalPos, Writer,
};

/// Gtid domain and server id of the generated commits.
pub const GTID_DOMAIN: u32 = 0;
pub const GTID_SERVER: u32 = 1;
/// Server id used for connect ids.
pub const CONNECT_SERVER_ID: u32 = 1;

/// Initial balance of every bank account.
pub const BANK_INITIAL_BALANCE: u64 = 1000;

/// Largest transfer amount.
const BANK_MAX_TRANSFER: u64 = 100;

/// How long to wait for intents to become durable before giving up.
const DURABLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Which workload to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Transfers between accounts; the sum of all balances is constant.
    Bank,
    /// Random puts and deletes.
    Kv,
    /// Sessions writing strictly increasing counters spread over the tablets.
    Ordered,
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Workload::Bank => "bank",
            Workload::Kv => "kv",
            Workload::Ordered => "ordered",
        })
    }
}

impl FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "bank" => Ok(Workload::Bank),
            "kv" => Ok(Workload::Kv),
            "ordered" => Ok(Workload::Ordered),
            _ => Err(format!(
                "unknown workload {s:?}: expected bank, kv or ordered"
            )),
        }
    }
}

/// Options of a load run. [`LoadOptions::new`] gives the documented defaults.
#[derive(Clone, Debug)]
pub struct LoadOptions {
    pub workload: Workload,
    /// Tablets `t0..t{N-1}` are written under this directory.
    pub wal_dir: PathBuf,
    pub tablets: usize,
    /// The last `idle_tablets` tablets get no transactions (only the bank's initial balances
    /// and heartbeats): for watching safe time advance on idle tablets.
    pub idle_tablets: usize,
    /// Transactions (committed or aborted) per second; 0 = as fast as possible.
    pub rate: f64,
    /// Stop after this long (`None`: until `stop` or `max_txns`).
    pub duration: Option<Duration>,
    /// Stop after this many transactions (committed or aborted), initial bank writes excluded.
    pub max_txns: Option<u64>,
    pub seed: u64,
    pub sync: SyncPolicy,
    pub segment_size: u64,
    /// Probability that a distributed transaction aborts.
    pub abort_rate: f64,
    /// A tablet without a record for this long gets a heartbeat.
    pub heartbeat_interval: Duration,
    /// Time between rounds when a rate is set.
    pub round_interval: Duration,
    /// At most this many transactions per round.
    pub max_round_txns: usize,
    /// Client connections (sessions) for `bank` and `kv`.
    pub connections: usize,
    /// Where the connect-id state lives (`None`: `$TMPDIR/tidelog-load-sessions`). Not under
    /// `wal_dir`: every directory there is taken for a tablet.
    pub session_dir: Option<PathBuf>,
    /// bank: number of accounts.
    pub accounts: u64,
    /// bank: probability that a transfer is between two accounts of one tablet.
    pub local_rate: f64,
    /// kv: number of keys.
    pub keys: u64,
    /// kv: value size in bytes.
    pub value_size: usize,
    /// ordered: number of sessions.
    pub sessions: usize,
    /// Send every `sample_every`-th commit (of any kind) to `samples`; 0 = none.
    pub sample_every: u64,
    pub samples: Option<Sender<CommitSample>>,
    /// Sent a [`SourceSafe`] whenever the source's safe time advances: the lowest, over
    /// all tablets, of the ht of each tablet's last committed record.
    pub source_safe: Option<Sender<SourceSafe>>,
}

impl LoadOptions {
    pub fn new(workload: Workload, wal_dir: impl Into<PathBuf>) -> LoadOptions {
        LoadOptions {
            workload,
            wal_dir: wal_dir.into(),
            tablets: 4,
            idle_tablets: 0,
            rate: 0.0,
            duration: Some(Duration::from_secs(10)),
            max_txns: None,
            seed: 1,
            sync: SyncPolicy::Batch,
            segment_size: tidelog_wal::format::DEFAULT_SEGMENT_SIZE,
            abort_rate: 0.05,
            heartbeat_interval: Duration::from_millis(50),
            round_interval: Duration::from_millis(1),
            max_round_txns: 1024,
            connections: 256,
            session_dir: None,
            accounts: 1000,
            local_rate: 0.2,
            keys: 100_000,
            value_size: 100,
            sessions: 16,
            sample_every: 0,
            samples: None,
            source_safe: None,
        }
    }

    fn validate(&self) -> Result<()> {
        if self.tablets == 0 {
            bail!("--tablets must be at least 1");
        }
        if self.idle_tablets >= self.tablets {
            bail!(
                "idle tablets ({}) must be fewer than tablets ({})",
                self.idle_tablets,
                self.tablets
            );
        }
        if !(self.rate >= 0.0 && self.rate.is_finite()) {
            bail!("--rate must be a finite number >= 0, not {}", self.rate);
        }
        for (name, p) in [
            ("--abort-rate", self.abort_rate),
            ("--local-rate", self.local_rate),
        ] {
            if !(0.0..=1.0).contains(&p) {
                bail!("{name} must be between 0 and 1, not {p}");
            }
        }
        if self.heartbeat_interval.is_zero() {
            bail!("--heartbeat-interval must be positive");
        }
        if self.max_round_txns == 0 {
            bail!("max round transactions must be at least 1");
        }
        match self.workload {
            Workload::Bank if self.accounts < 2 => bail!("--accounts must be at least 2"),
            Workload::Kv if self.keys < self.tablets as u64 => {
                bail!("--keys must be at least --tablets")
            }
            Workload::Ordered if self.sessions == 0 => bail!("--sessions must be at least 1"),
            _ if self.connections == 0 => bail!("--connections must be at least 1"),
            _ => Ok(()),
        }
    }
}

/// What kind of transaction a commit was.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TxnKind {
    /// A single-tablet `write` record.
    Local,
    /// Intents plus a `commit` on the status tablet.
    Distributed,
}

/// One sampled commit, sent once its record is committed to the writer.
#[derive(Clone, Debug, Serialize)]
pub struct CommitSample {
    pub commit_ht: HybridTime,
    pub trx_id: TrxId,
    pub gtid: Gtid,
    pub kind: TxnKind,
    /// The tablet holding the `write` or `commit` record.
    pub tablet: TabletId,
    /// Wall time when the record was committed to the writer.
    pub committed_at: SystemTime,
}

/// The source's safe time advanced: every tablet has committed a record with ht ≥ `ht`
/// (durable under `sync = always`), so a target can make everything up to `ht` visible once
/// it has received and applied them. The time from a commit to the first `SourceSafe` at
/// or past its `commit_ht` is the part of the safe-time lag the source itself takes.
#[derive(Clone, Copy, Debug)]
pub struct SourceSafe {
    pub ht: HybridTime,
    /// Wall time when the commit that advanced it returned.
    pub at: SystemTime,
}

/// Progress, reported about once a second.
#[derive(Clone, Debug, Serialize)]
pub struct Progress {
    pub elapsed: Duration,
    pub committed: u64,
    pub aborted: u64,
    pub records: u64,
    pub bytes: u64,
    /// Committed transactions per second over the last interval.
    pub interval_txn_per_s: f64,
    /// WAL MB (10^6 bytes) per second over the last interval.
    pub interval_mb_per_s: f64,
}

/// Where a tablet's log ended.
#[derive(Clone, Debug, Serialize)]
pub struct TabletEnd {
    pub tablet: TabletId,
    pub end_pos: WalPos,
    pub last_ht: Option<HybridTime>,
}

/// Record counts by kind.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RecordCounts {
    pub write: u64,
    pub intent: u64,
    pub commit: u64,
    pub abort: u64,
    pub heartbeat: u64,
}

/// The result of a run (printed as JSON by `tidelog-bench load`).
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub workload: Workload,
    pub tablets: usize,
    pub seed: u64,
    pub sync: String,
    pub elapsed_s: f64,
    /// Committed transactions, including the bank's initial writes.
    pub txns_committed: u64,
    pub txns_aborted: u64,
    /// Committed transactions by kind (`bank_init`, `bank_local`, `bank_distributed`,
    /// `kv_local`, `kv_distributed`, `ordered_local`, `ordered_distributed`).
    pub committed_by_kind: BTreeMap<String, u64>,
    pub records: u64,
    pub records_by_kind: RecordCounts,
    /// Bytes appended to the logs (headers included).
    pub bytes: u64,
    pub txn_per_s: f64,
    pub mb_per_s: f64,
    pub last_gtid: Option<Gtid>,
    /// The last committed transaction: its trx id and gtid.
    pub last_commit: Option<(TrxId, Gtid)>,
    /// Trx ids whose last attempt aborted (their session did not commit a retry), so
    /// `trx_status` reports them `ABORTED`.
    pub final_aborts: Vec<TrxId>,
    pub tablet_ends: Vec<TabletEnd>,
    /// bank: the sum of all balances (always `accounts × 1000`).
    pub bank_total: Option<u64>,
}

/// The sum of bank balances.
pub fn bank_total(accounts: &[u64]) -> u64 {
    accounts.iter().sum()
}

/// Key of bank account `a`.
pub fn bank_key(a: u64) -> String {
    format!("acct/{a:06}")
}

/// Key of kv key `k`.
pub fn kv_key(k: u64) -> String {
    format!("kv/{k:08}")
}

/// Key of counter `c` of ordered session `s`, and of its cross-tablet companion.
pub fn ordered_keys(s: usize, c: u64) -> (String, String) {
    (
        format!("ord/{s:04}/{c:012}"),
        format!("ord-x/{s:04}/{c:012}"),
    )
}

/// Tablet names `t0..t{n-1}`.
pub fn tablet_ids(n: usize) -> Result<Vec<TabletId>> {
    (0..n)
        .map(|i| TabletId::new(&format!("t{i}")).context("tablet id"))
        .collect()
}

/// A transaction planned for the current round.
struct Planned {
    session: usize,
    kind: &'static str,
    /// (tablet, ops); the first is the status tablet of a distributed transaction.
    parts: Vec<(usize, Vec<Op>)>,
    distributed: bool,
    abort: bool,
}

/// Per-workload state of the generator.
enum State {
    Bank {
        balances: Vec<u64>,
    },
    Kv,
    Ordered {
        /// Next counter of each session (last committed + 1).
        next: Vec<u64>,
    },
}

struct Gen {
    opts: LoadOptions,
    rng: StdRng,
    clock: HybridClock,
    gtids: GtidGen,
    tablets: Vec<TabletId>,
    writers: Vec<Writer>,
    last_record: Vec<Instant>,
    /// Per tablet: the ht of the last record committed.
    committed_ht: Vec<HybridTime>,
    /// The lowest `committed_ht` last sent as a [`SourceSafe`].
    source_safe: HybridTime,
    start_pos: Vec<WalPos>,
    sessions: Vec<Session>,
    /// Per session: the trx id of its last attempt if that attempt aborted.
    last_abort: Vec<Option<TrxId>>,
    last_commit: Option<(TrxId, Gtid)>,
    state: State,
    committed: u64,
    aborted: u64,
    attempted: u64,
    by_kind: BTreeMap<String, u64>,
    counts: RecordCounts,
    rr: usize,
    value_buf: Vec<u8>,
}

/// Runs the load until `opts.duration` has passed, `opts.max_txns` transactions ran, or
/// `stop` is set; calls `progress` about once a second.
pub fn run(
    opts: LoadOptions,
    stop: &AtomicBool,
    progress: impl FnMut(&Progress),
) -> Result<Summary> {
    run_when_ready(opts, stop, || Ok(()), progress)
}

/// [`run`], with `ready` called once every tablet's WAL exists and holds a committed record
/// (the bank's initial balances, then a heartbeat on every tablet) and before the timed load
/// starts: a benchmark waits there until the pipeline carries every tablet, so that start-up
/// (the shipper finding the tablets, the target registering them) is not measured as lag.
/// The duration, the rate schedule and the reported rates count from after `ready`.
pub fn run_when_ready(
    opts: LoadOptions,
    stop: &AtomicBool,
    ready: impl FnOnce() -> Result<()>,
    mut progress: impl FnMut(&Progress),
) -> Result<Summary> {
    opts.validate()?;
    let mut g = Gen::open(opts)?;
    g.init()?;
    g.heartbeats(true)?;
    ready()?;
    let start = Instant::now();
    let mut last_progress = start;
    let mut last_committed = g.committed;
    let mut last_bytes = g.bytes();
    let mut next_round = start;
    loop {
        let now = Instant::now();
        let elapsed = now - start;
        if stop.load(Ordering::Relaxed)
            || g.opts.duration.is_some_and(|d| elapsed >= d)
            || g.opts.max_txns.is_some_and(|m| g.attempted >= m)
        {
            break;
        }
        if now - last_progress >= Duration::from_secs(1) {
            let dt = (now - last_progress).as_secs_f64();
            progress(&Progress {
                elapsed,
                committed: g.committed,
                aborted: g.aborted,
                records: g.records(),
                bytes: g.bytes(),
                interval_txn_per_s: (g.committed - last_committed) as f64 / dt,
                interval_mb_per_s: g.bytes().saturating_sub(last_bytes) as f64 / dt / 1e6,
            });
            last_progress = now;
            last_committed = g.committed;
            last_bytes = g.bytes();
        }
        let mut budget = if g.opts.rate > 0.0 {
            let due = (g.opts.rate * elapsed.as_secs_f64()) as u64;
            (due.saturating_sub(g.attempted) as usize).min(g.opts.max_round_txns)
        } else {
            g.opts.max_round_txns
        };
        if let Some(m) = g.opts.max_txns {
            budget = budget.min((m - g.attempted) as usize);
        }
        if budget > 0 {
            g.round(budget)?;
        }
        g.heartbeats(false)?;
        if g.opts.rate > 0.0 {
            next_round += g.opts.round_interval;
            let now = Instant::now();
            if next_round > now {
                std::thread::sleep(next_round - now);
            } else {
                next_round = now;
            }
        }
    }
    g.heartbeats(true)?;
    for w in &mut g.writers {
        w.sync()
            .with_context(|| format!("syncing tablet {}", w.tablet()))?;
    }
    let elapsed = start.elapsed().as_secs_f64().max(1e-9);
    let bytes = g.bytes();
    Ok(Summary {
        workload: g.opts.workload,
        tablets: g.opts.tablets,
        seed: g.opts.seed,
        sync: g.opts.sync.to_string(),
        elapsed_s: elapsed,
        txns_committed: g.committed,
        txns_aborted: g.aborted,
        committed_by_kind: g.by_kind.clone(),
        records: g.records(),
        records_by_kind: g.counts.clone(),
        bytes,
        txn_per_s: g.committed as f64 / elapsed,
        mb_per_s: bytes as f64 / elapsed / 1e6,
        last_gtid: g.gtids.last(),
        last_commit: g.last_commit,
        final_aborts: g.last_abort.iter().flatten().copied().collect(),
        tablet_ends: g
            .writers
            .iter()
            .map(|w| TabletEnd {
                tablet: w.tablet().clone(),
                end_pos: w.written_pos(),
                last_ht: w.last_ht(),
            })
            .collect(),
        bank_total: match &g.state {
            State::Bank { balances } => Some(bank_total(balances)),
            _ => None,
        },
    })
}

impl Gen {
    fn open(opts: LoadOptions) -> Result<Gen> {
        std::fs::create_dir_all(&opts.wal_dir)
            .with_context(|| format!("creating {}", opts.wal_dir.display()))?;
        let last_seq = recover_last_gtid_seq(&opts.wal_dir, GTID_DOMAIN)
            .with_context(|| format!("recovering the last gtid in {}", opts.wal_dir.display()))?;
        let tablets = tablet_ids(opts.tablets)?;
        let wal_opts = WalOptions {
            segment_size: opts.segment_size,
            ..WalOptions::default()
        };
        let clock = HybridClock::new();
        let mut writers = Vec::with_capacity(tablets.len());
        for t in &tablets {
            let w = Writer::open(&opts.wal_dir, t, wal_opts.clone())
                .with_context(|| format!("opening the WAL of tablet {t}"))?;
            if let Some(ht) = w.last_ht() {
                if opts.workload != Workload::Kv {
                    bail!(
                        "tablet {t} under {} already has records: the {} workload needs an \
                         empty WAL directory (its state is not recovered)",
                        opts.wal_dir.display(),
                        opts.workload
                    );
                }
                clock.observe(ht);
            }
            writers.push(w);
        }
        let session_dir = opts
            .session_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("tidelog-load-sessions"));
        let ids = ConnectIdGen::open(&session_dir, CONNECT_SERVER_ID)
            .with_context(|| format!("opening connect ids in {}", session_dir.display()))?;
        let n_sessions = match opts.workload {
            Workload::Ordered => opts.sessions,
            _ => opts.connections,
        };
        let sessions = (0..n_sessions)
            .map(|_| Session::open(&ids).context("opening a session"))
            .collect::<Result<Vec<_>>>()?;
        let state = match opts.workload {
            Workload::Bank => State::Bank {
                balances: vec![BANK_INITIAL_BALANCE; opts.accounts as usize],
            },
            Workload::Kv => State::Kv,
            Workload::Ordered => State::Ordered {
                next: vec![1; opts.sessions],
            },
        };
        let now = Instant::now();
        Ok(Gen {
            rng: StdRng::seed_from_u64(opts.seed),
            clock,
            gtids: GtidGen::new(GTID_DOMAIN, GTID_SERVER, last_seq),
            last_record: vec![now; tablets.len()],
            committed_ht: vec![HybridTime(0); tablets.len()],
            source_safe: HybridTime(0),
            start_pos: writers.iter().map(|w| w.written_pos()).collect(),
            tablets,
            writers,
            last_abort: vec![None; sessions.len()],
            last_commit: None,
            sessions,
            state,
            committed: 0,
            aborted: 0,
            attempted: 0,
            by_kind: BTreeMap::new(),
            counts: RecordCounts::default(),
            rr: 0,
            value_buf: Vec::new(),
            opts,
        })
    }

    fn records(&self) -> u64 {
        let c = &self.counts;
        c.write + c.intent + c.commit + c.abort + c.heartbeat
    }

    fn bytes(&self) -> u64 {
        self.writers
            .iter()
            .zip(&self.start_pos)
            .map(|(w, s)| w.written_pos().since(*s))
            .sum()
    }

    fn active_tablets(&self) -> usize {
        self.opts.tablets - self.opts.idle_tablets
    }

    fn append(&mut self, tablet: usize, body: Body) -> Result<HybridTime> {
        let ht = self.clock.now();
        match &body {
            Body::Write { .. } => self.counts.write += 1,
            Body::Intent { .. } => self.counts.intent += 1,
            Body::Commit { .. } => self.counts.commit += 1,
            Body::Abort { .. } => self.counts.abort += 1,
            Body::Heartbeat => self.counts.heartbeat += 1,
        }
        let w = &mut self.writers[tablet];
        w.append(&Record::new(ht, body))
            .with_context(|| format!("appending to tablet {}", w.tablet()))?;
        self.last_record[tablet] = Instant::now();
        Ok(ht)
    }

    fn commit_writers(&mut self, touched: &[bool]) -> Result<Vec<(usize, WalPos)>> {
        let mut out = Vec::new();
        for (i, w) in self.writers.iter_mut().enumerate() {
            if touched[i] {
                let pos = w
                    .commit(self.opts.sync)
                    .with_context(|| format!("committing tablet {}", w.tablet()))?;
                out.push((i, pos));
                self.committed_ht[i] = w.last_ht().unwrap_or_default();
            }
        }
        if let Some(tx) = &self.opts.source_safe {
            let low = self
                .committed_ht
                .iter()
                .copied()
                .min()
                .unwrap_or(HybridTime(0));
            if low > self.source_safe {
                self.source_safe = low;
                // A receiver that went away just stops the events.
                let _ = tx.send(SourceSafe {
                    ht: low,
                    at: SystemTime::now(),
                });
            }
        }
        Ok(out)
    }

    fn count_commit(&mut self, kind: &str) {
        self.committed += 1;
        *self.by_kind.entry(kind.to_string()).or_default() += 1;
    }

    /// Session `s` commits its current transaction: its trx id and the next gtid; the
    /// session's last attempt is no longer an abort.
    fn commit_session(&mut self, s: usize) -> (TrxId, Gtid) {
        let trx_id = self.sessions[s].commit();
        let gtid = self.gtids.next();
        self.note_commit(s, trx_id, gtid);
        (trx_id, gtid)
    }

    /// Session `s` committed `trx_id` as `gtid`.
    fn note_commit(&mut self, s: usize, trx_id: TrxId, gtid: Gtid) {
        self.last_abort[s] = None;
        self.last_commit = Some((trx_id, gtid));
    }

    fn sample(&self, ht: HybridTime, trx_id: TrxId, gtid: Gtid, kind: TxnKind, tablet: usize) {
        let Some(tx) = &self.opts.samples else {
            return;
        };
        if self.opts.sample_every == 0 || gtid.seq % self.opts.sample_every != 0 {
            return;
        }
        // A receiver that went away just stops the samples.
        let _ = tx.send(CommitSample {
            commit_ht: ht,
            trx_id,
            gtid,
            kind,
            tablet: self.tablets[tablet].clone(),
            committed_at: SystemTime::now(),
        });
    }

    /// bank: the initial balances, one `write` per tablet (chunked).
    fn init(&mut self) -> Result<()> {
        let State::Bank { balances } = &self.state else {
            return Ok(());
        };
        let n = self.opts.tablets as u64;
        let max_bytes = (4usize << 20).min(self.opts.segment_size as usize / 4);
        let mut chunks: Vec<(usize, Vec<Op>)> = Vec::new();
        for t in 0..n {
            let mut ops = Vec::new();
            let mut size = 0;
            let mut a = t;
            while a < balances.len() as u64 {
                let op = Op::put(bank_key(a), balances[a as usize].to_string());
                size += 8 + op.key.len() + op.value.as_ref().map_or(0, |v| v.len());
                ops.push(op);
                if size >= max_bytes {
                    chunks.push((t as usize, std::mem::take(&mut ops)));
                    size = 0;
                }
                a += n;
            }
            if !ops.is_empty() {
                chunks.push((t as usize, ops));
            }
        }
        let mut touched = vec![false; self.opts.tablets];
        let mut done = Vec::new();
        for (k, (t, ops)) in chunks.into_iter().enumerate() {
            let s = k % self.sessions.len();
            let (trx_id, gtid) = self.commit_session(s);
            let ht = self.append(
                t,
                Body::Write {
                    ops,
                    trx_id: Some(trx_id),
                    gtid: Some(gtid),
                },
            )?;
            touched[t] = true;
            done.push((ht, trx_id, gtid, t));
        }
        self.commit_writers(&touched)?;
        for (ht, trx_id, gtid, t) in done {
            self.count_commit("bank_init");
            self.sample(ht, trx_id, gtid, TxnKind::Local, t);
        }
        Ok(())
    }

    /// Heartbeats on tablets idle for `heartbeat_interval` (all tablets when `all`).
    fn heartbeats(&mut self, all: bool) -> Result<()> {
        let now = Instant::now();
        let touched: Vec<bool> = self
            .last_record
            .iter()
            .map(|&last| all || now.duration_since(last) >= self.opts.heartbeat_interval)
            .collect();
        if !touched.contains(&true) {
            return Ok(());
        }
        for (t, &idle) in touched.iter().enumerate() {
            if idle {
                self.append(t, Body::Heartbeat)?;
            }
        }
        self.commit_writers(&touched)?;
        Ok(())
    }

    fn random_value(&mut self) -> Vec<u8> {
        let n = self.opts.value_size;
        self.value_buf.resize(n, 0);
        self.rng.fill(&mut self.value_buf[..]);
        self.value_buf.iter().map(|b| b'a' + b % 26).collect()
    }

    /// A random key index `k < keys` with `k % tablets == t`.
    fn kv_key_on(&mut self, t: usize) -> u64 {
        let n = self.opts.tablets as u64;
        let on_t = (self.opts.keys - t as u64).div_ceil(n);
        t as u64 + n * self.rng.random_range(0..on_t)
    }

    /// A random account on tablet `t`, if it has any.
    fn account_on(&mut self, t: usize) -> Option<u64> {
        let n = self.opts.tablets as u64;
        let on_t = self.opts.accounts.saturating_sub(t as u64).div_ceil(n);
        (on_t > 0).then(|| t as u64 + n * self.rng.random_range(0..on_t))
    }

    /// Another active tablet than `t` (requires at least 2 active tablets).
    fn other_tablet(&mut self, t: usize) -> usize {
        let active = self.active_tablets();
        (t + 1 + self.rng.random_range(0..active - 1)) % active
    }

    /// Plans the next transaction of session `s`; `None` when it cannot run this round
    /// (its keys are locked).
    fn plan(&mut self, s: usize, locked: &HashSet<Vec<u8>>) -> Option<Planned> {
        let active = self.active_tablets();
        let abort_rate = self.opts.abort_rate;
        match self.opts.workload {
            Workload::Bank => {
                let local = active < 2 || self.rng.random_bool(self.opts.local_rate);
                for _ in 0..8 {
                    let ta = self.rng.random_range(0..active);
                    let tb = if local { ta } else { self.other_tablet(ta) };
                    let (Some(a), Some(b)) = (self.account_on(ta), self.account_on(tb)) else {
                        continue;
                    };
                    let (ka, kb) = (bank_key(a), bank_key(b));
                    if a == b || locked.contains(ka.as_bytes()) || locked.contains(kb.as_bytes()) {
                        continue;
                    }
                    let State::Bank { balances } = &mut self.state else {
                        return None;
                    };
                    let amount = self
                        .rng
                        .random_range(0..=BANK_MAX_TRANSFER.min(balances[a as usize]));
                    let (na, nb) = (balances[a as usize] - amount, balances[b as usize] + amount);
                    let abort = !local && self.rng.random_bool(abort_rate);
                    if !abort {
                        balances[a as usize] = na;
                        balances[b as usize] = nb;
                    }
                    let (opa, opb) = (Op::put(ka, na.to_string()), Op::put(kb, nb.to_string()));
                    return Some(if local {
                        Planned {
                            session: s,
                            kind: "bank_local",
                            parts: vec![(ta, vec![opa, opb])],
                            distributed: false,
                            abort: false,
                        }
                    } else {
                        Planned {
                            session: s,
                            kind: "bank_distributed",
                            parts: vec![(ta, vec![opa]), (tb, vec![opb])],
                            distributed: true,
                            abort,
                        }
                    });
                }
                None
            }
            Workload::Kv => {
                let distributed = active >= 2 && self.rng.random_bool(0.2);
                let first = self.rng.random_range(0..active);
                let mut tablets = vec![first];
                if distributed {
                    let want = self.rng.random_range(2..=3usize.min(active));
                    while tablets.len() < want {
                        let t = self.other_tablet(first);
                        if !tablets.contains(&t) {
                            tablets.push(t);
                        }
                    }
                }
                let mut parts = Vec::new();
                let mut seen = HashSet::new();
                for t in tablets {
                    let n_ops = if distributed {
                        self.rng.random_range(1..=2)
                    } else {
                        self.rng.random_range(1..=4)
                    };
                    let mut ops = Vec::new();
                    for _ in 0..n_ops {
                        let key = kv_key(self.kv_key_on(t));
                        if locked.contains(key.as_bytes()) || !seen.insert(key.clone()) {
                            continue;
                        }
                        if self.rng.random_bool(0.05) {
                            ops.push(Op::delete(key));
                        } else {
                            let v = self.random_value();
                            ops.push(Op::put(key, v));
                        }
                    }
                    if ops.is_empty() {
                        return None;
                    }
                    parts.push((t, ops));
                }
                Some(Planned {
                    session: s,
                    kind: if distributed {
                        "kv_distributed"
                    } else {
                        "kv_local"
                    },
                    parts,
                    distributed,
                    abort: distributed && self.rng.random_bool(abort_rate),
                })
            }
            Workload::Ordered => {
                let State::Ordered { next } = &self.state else {
                    return None;
                };
                let c = next[s];
                let t = (s + c as usize) % active;
                let (key, xkey) = ordered_keys(s, c);
                let distributed = active >= 2 && self.rng.random_bool(0.2);
                let abort = distributed && self.rng.random_bool(abort_rate);
                let value = c.to_string();
                let mut parts = vec![(t, vec![Op::put(key, value.clone())])];
                if distributed {
                    let x = self.other_tablet(t);
                    parts.push((x, vec![Op::put(xkey, value)]));
                }
                if !abort {
                    if let State::Ordered { next } = &mut self.state {
                        next[s] += 1;
                    }
                }
                Some(Planned {
                    session: s,
                    kind: if distributed {
                        "ordered_distributed"
                    } else {
                        "ordered_local"
                    },
                    parts,
                    distributed,
                    abort,
                })
            }
        }
    }

    /// One round of up to `budget` transactions.
    fn round(&mut self, budget: usize) -> Result<()> {
        let n_sessions = self.sessions.len();
        let mut busy = vec![false; n_sessions];
        let mut n_busy = 0;
        let mut locked: HashSet<Vec<u8>> = HashSet::new();
        let mut planned = Vec::with_capacity(budget);
        let mut misses = 0;
        while planned.len() < budget && n_busy < n_sessions && misses < 16 {
            let s = self.rr % n_sessions;
            self.rr = self.rr.wrapping_add(1);
            if busy[s] {
                continue;
            }
            let Some(p) = self.plan(s, &locked) else {
                misses += 1;
                continue;
            };
            if p.distributed {
                // The session waits for the decision: nothing more from it this round, and
                // nobody touches its keys until then.
                busy[s] = true;
                n_busy += 1;
                for (_, ops) in &p.parts {
                    locked.extend(ops.iter().map(|o| o.key.clone()));
                }
            }
            planned.push(p);
        }
        self.attempted += planned.len() as u64;

        // Phase 1: writes and intents, in plan order.
        let mut touched = vec![false; self.opts.tablets];
        let mut intent_tablets = vec![false; self.opts.tablets];
        let mut local_done = Vec::new();
        let mut decisions = Vec::new();
        for p in planned {
            if !p.distributed {
                let (t, ops) = p.parts.into_iter().next().context("empty transaction")?;
                let (trx_id, gtid) = self.commit_session(p.session);
                let ht = self.append(
                    t,
                    Body::Write {
                        ops,
                        trx_id: Some(trx_id),
                        gtid: Some(gtid),
                    },
                )?;
                touched[t] = true;
                local_done.push((p.kind, ht, trx_id, gtid, t));
                continue;
            }
            let mut dt = self.sessions[p.session].begin(TxnId::from_u128(self.rng.random()));
            // The first participant holds the decision.
            let status = p
                .parts
                .first()
                .map(|(t, _)| *t)
                .context("empty transaction")?;
            for (t, ops) in p.parts {
                let intent = dt.intent(&self.tablets[t], ops);
                self.append(t, intent)?;
                touched[t] = true;
                intent_tablets[t] = true;
            }
            decisions.push((p.kind, p.session, dt, status, p.abort));
        }
        let ends = self.commit_writers(&touched)?;
        for (kind, ht, trx_id, gtid, t) in local_done {
            self.count_commit(kind);
            self.sample(ht, trx_id, gtid, TxnKind::Local, t);
        }
        if decisions.is_empty() {
            return Ok(());
        }
        if self.opts.sync == SyncPolicy::Batch {
            for (t, pos) in ends {
                if intent_tablets[t] && !self.writers[t].wait_durable(pos, DURABLE_TIMEOUT) {
                    bail!(
                        "intents on tablet {} did not become durable within {:?}",
                        self.tablets[t],
                        DURABLE_TIMEOUT
                    );
                }
            }
        }

        // Phase 2: the decisions, on each transaction's status tablet.
        let mut touched = vec![false; self.opts.tablets];
        let mut commits = Vec::new();
        for (kind, s, dt, status, abort) in decisions {
            touched[status] = true;
            let trx_id = dt.trx_id();
            if abort {
                let body = dt.abort(&mut self.sessions[s])?;
                self.last_abort[s] = Some(trx_id);
                self.append(status, body)?;
                self.aborted += 1;
                continue;
            }
            let gtid = self.gtids.next();
            let body = dt.commit(&mut self.sessions[s], Some(gtid))?;
            self.note_commit(s, trx_id, gtid);
            let ht = self.append(status, body)?;
            commits.push((kind, ht, trx_id, gtid, status));
        }
        self.commit_writers(&touched)?;
        for (kind, ht, trx_id, gtid, t) in commits {
            self.count_commit(kind);
            self.sample(ht, trx_id, gtid, TxnKind::Distributed, t);
        }
        Ok(())
    }
}
