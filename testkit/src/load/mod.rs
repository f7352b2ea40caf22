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

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use tidelog_wal::{Gtid, HybridTime, SyncPolicy, TabletId, TrxId, WalPos};

mod gen;

use gen::{Gen, State};

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
    /// Records this run appended to the tablet (the source's retention may have deleted
    /// some of them by the end, so a count of the log's records can be lower).
    pub records: u64,
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
            .zip(&g.appended)
            .map(|(w, &records)| TabletEnd {
                tablet: w.tablet().clone(),
                end_pos: w.written_pos(),
                last_ht: w.last_ht(),
                records,
            })
            .collect(),
        bank_total: match &g.state {
            State::Bank { balances } => Some(bank_total(balances)),
            _ => None,
        },
    })
}
