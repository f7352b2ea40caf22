//! `tidelog-bench trx-status`: `trx_status` look-up latency on a binlog of millions of
//! commits (docs/ARCHITECTURE.md, "Binlog and trx_status"; results in BENCHMARKS.md),
//! in-process and through the admin API, with PostgreSQL's `pg_xact_status` beside it in
//! the same run.
//!
//! # What is measured
//!
//! * **Build**: `--commits` commits (default 10 M) written into a fresh store by the real
//!   apply path, `Store::apply` with `Durability::Buffered`, one call per tablet per round of
//!   `--batch` records per tablet, records placed contiguously in each tablet's log. Commits
//!   come from `--sessions` source connections (`tidelog_testkit::session::Session`, connect ids
//!   in the connect-id generator's `server_id << 56 | (unix_seconds << 24) + n` form), gtids
//!   `0-1-seq`; `--distributed-pct` of them are distributed (an intent on two tablets and a
//!   `commit` on the first, then `Store::apply_part` on both, as the apply workers do) and
//!   `--abort-pct` of the attempts are aborted (intent + `abort`; the session's retry reuses
//!   the id, so `trx_open` holds them). Then a heartbeat on every tablet,
//!   `raise_global_safe_time` to the last ht and `persist`. The build rate (commits/s) is
//!   printed. With `--data-dir D` the built store is kept in `D` and reused by later runs
//!   with the same parameters (a `trx-bench.json` manifest records them; the look-up sets
//!   are regenerated from the seed).
//! * **Library**: `tidelog_applier::trx::trx_status` called in this process on the store,
//!   with a safe time ≥ every commit, for four cases: hit without hint, hit with hint (the
//!   trx's own gtid), miss without hint (a valid id never seen: a known session's counter
//!   beyond its last commit, or a connect id no session used), miss with hint (a random
//!   visible gtid). Ids are uniform over all commits. Each case: `--warmup` look-ups, then
//!   `--lookups` timed ones, each timed alone with the TSC clock into an hdrhistogram. Every
//!   answer is checked (COMMITTED with the right gtid / UNKNOWN).
//! * **Admin API**: the real `target/release/tidelog apply` on that data dir; `GET
//!   /v1/trx/{id}[?gtid=G]` over one keep-alive HTTP/1.1 connection on the Unix socket
//!   (a blocking socket client like the PostgreSQL one, `--api-client hyper` for hyper's),
//!   the same four cases, `--api-lookups` each after a warm-up;
//!   a look-up's time is request sent → whole body received. SIGTERM afterwards.
//! * **PostgreSQL baseline**: `bench/pg-baseline.sh` starts a throwaway PostgreSQL (Debian
//!   package, installed with apt-get if missing), assigns `--pg-xids` transaction ids
//!   (default: `--commits`), every 100th rolled back, then `SELECT pg_xact_status($1::xid8)`
//!   as a prepared statement over one Unix-socket connection (`pgwire.rs`): hits are
//!   committed xids, misses aborted ones (`pg_xact_status` errors for xids not yet assigned,
//!   and every xid below the current one was assigned, so "never seen" has no equivalent).
//!   Skipped with a message where PostgreSQL cannot be started.
//! * **Side by side**: both servers run at once and each case alternates blocks of ~500
//!   admin-API look-ups with blocks of PostgreSQL look-ups (the PostgreSQL row measured
//!   beside an API case is named after it: committed xids beside hits, aborted beside
//!   misses), so whatever else the machine does falls on both columns alike. By default
//!   (`--pin split`) both servers are pinned to the last CPU and the measuring thread to the
//!   first: each look-up then wakes the other CPU, as a client on another core or host
//!   does; `--pin same` puts all three on one CPU (no cross-CPU wake-up: the servers' own
//!   cost), `--pin none` leaves placement to the scheduler.
//! * **SQL endpoint** (`--sql`): the same daemon with `[sql]` on (TLS off); the same look-ups
//!   as `SELECT trx_status(?)` / `SELECT trx_status(?, ?)`, two server-side prepared
//!   statements executed over one keep-alive TCP connection by a minimal blocking client
//!   (`sqlwire.rs`: the binary protocol, no connector library in the measured path), in
//!   blocks beside the admin API's and PostgreSQL's; a look-up's time is `COM_STMT_EXECUTE`
//!   sent → the result set's closing EOF received. Every answer is checked.
//! * Output: a table (case × count, p50/p99/p999/max in µs), the budget verdicts (library
//!   p99 ≤ 10 µs; admin-API p99 / PostgreSQL p99 ≤ 1.0; with `--sql`, SQL p99 /
//!   PostgreSQL p99 ≤ 0.8 on every case, and the run exits non-zero when one is missed),
//!   and `--json FILE`.

use std::collections::HashSet;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::Args;
use http_body_util::{BodyExt, Empty};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tidelog_applier::store::{Durability, Store};
use tidelog_applier::trx::{trx_status, SafeTimeView, TrxQuery, TrxState};
use tidelog_testkit::http1::Http1;
use tidelog_testkit::{Daemon, Session};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, Gtid, HybridTime, Op, Record, TabletId, TxnId, WalPos};

use crate::e2e::tidelog_exe;
use crate::pgwire::PgConn;
use crate::sqlwire::SqlConn;
use crate::stats::{fmt_int, new_histogram, ns_per_tick, Clock, Latency};
use crate::wal_bench::{filesystem_of, kernel_release};

const PG_SCRIPT: &str = include_str!("../pg-baseline.sh");
const MANIFEST: &str = "trx-bench.json";
const MANIFEST_VERSION: u32 = 1;
/// Every this many PostgreSQL xids is rolled back (1 %).
const PG_ABORT_EVERY: u64 = 100;
/// Budgets (issue 5).
const LIBRARY_P99_BUDGET_NS: u64 = 10_000;
const API_OVER_PG_P99_BUDGET: f64 = 1.0;
const SQL_OVER_PG_P99_BUDGET: f64 = 0.8;
/// The SQL endpoint's user and password in the bench's daemon.
const SQL_USER: &str = "bench";
const SQL_PASSWORD: &str = "bench-password";

#[derive(Debug, Args)]
pub struct TrxArgs {
    /// Commits in the binlog.
    #[arg(long, default_value_t = 10_000_000)]
    commits: u64,
    /// Tablets the commits are spread over.
    #[arg(long, default_value_t = 8)]
    tablets: usize,
    /// Source sessions (connect ids).
    #[arg(long, default_value_t = 4096)]
    sessions: usize,
    /// Records per tablet per `Store::apply` call.
    #[arg(long, default_value_t = 4096)]
    batch: usize,
    /// Percent of the commits that are distributed (intents on two tablets + commit).
    #[arg(long, default_value_t = 2.0)]
    distributed_pct: f64,
    /// Percent of the attempts that abort (the session retries with the same trx id).
    #[arg(long, default_value_t = 1.0)]
    abort_pct: f64,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep the built store here and reuse it when it was built with the same parameters.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Parent of the run directory (default: the current directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the run directory (certificates, config, daemon log, temporary store).
    #[arg(long)]
    keep: bool,
    /// Timed library look-ups per case.
    #[arg(long, default_value_t = 200_000)]
    lookups: u64,
    /// Timed admin-API look-ups per case.
    #[arg(long, default_value_t = 50_000)]
    api_lookups: u64,
    /// Timed PostgreSQL look-ups per case. The same as the admin API's by default: the
    /// blocks then hold as many look-ups of each, so the first look-ups after each switch
    /// (the slowest: the other server ran in between) are the same share of both columns.
    #[arg(long, default_value_t = 50_000)]
    pg_lookups: u64,
    /// Untimed look-ups before each case (a tenth of it for the admin API and PostgreSQL).
    #[arg(long, default_value_t = 20_000)]
    warmup: u64,
    /// Transaction ids PostgreSQL assigns for its baseline (default: --commits).
    #[arg(long)]
    pg_xids: Option<u64>,
    /// Skip the PostgreSQL baseline.
    #[arg(long)]
    no_pg: bool,
    /// Skip the admin-API cases.
    #[arg(long)]
    no_api: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Block cache of the store, in the bench process and the daemon (`cache-size`; default:
    /// the daemon's default, 256 MiB).
    #[arg(long, value_parser = crate::stats::parse_size)]
    cache_size: Option<u64>,
    /// Do not pre-load the look-up indexes into the bench process's block cache (the daemon
    /// and, by default, the library case load them when they fit in 3/4 of the cache).
    #[arg(long)]
    cold: bool,
    /// The admin-API client: `blocking` (a blocking socket, like the PostgreSQL baseline's
    /// client) or `hyper` (hyper's HTTP/1.1 client on a current-thread tokio runtime).
    #[arg(long, value_enum, default_value_t = ApiClientKind::Blocking)]
    api_client: ApiClientKind,
    /// Where the servers (the daemon, PostgreSQL) and the measuring thread run during the
    /// comparison: `split` (servers on the last CPU, the measuring thread on the first: every
    /// look-up wakes the other CPU), `same` (all on the first CPU) or `none` (wherever the
    /// scheduler puts them). Unpinned, a look-up's wake-up lands on the same CPU or the other
    /// as the scheduler happens to place the threads — ~10 µs or ~45 µs on this VM — and
    /// that placement, not the server, decides the percentiles of a phase.
    #[arg(long, value_enum, default_value_t = Pin::Split)]
    pin: Pin,
    /// Also measure the SQL endpoint (`[sql]` on the same daemon): the same look-ups as
    /// prepared `SELECT trx_status(?[, ?])` over one TCP connection, as many as the admin
    /// API's; budget p99 ≤ 0.8 × PostgreSQL's on every case.
    #[arg(long)]
    sql: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Pin {
    Split,
    Same,
    None,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ApiClientKind {
    Blocking,
    Hyper,
}

// ---- the commit generator ----

/// splitmix64: small, fast and deterministic; the generator replays from the seed.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// What a built store holds (written next to it; a later run reuses the store only if its
/// own parameters match).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
struct Manifest {
    version: u32,
    commits: u64,
    tablets: usize,
    sessions: usize,
    distributed_pct: f64,
    abort_pct: f64,
    seed: u64,
    /// Connect id of session 0 (session n has `connect_base + n`).
    connect_base: u64,
    first_ht: u64,
    last_ht: u64,
    records: u64,
    aborts: u64,
    distributed: u64,
    build_s: f64,
}

impl Manifest {
    fn same_plan(&self, o: &Manifest) -> bool {
        (
            self.version,
            self.commits,
            self.tablets,
            self.sessions,
            self.seed,
        ) == (o.version, o.commits, o.tablets, o.sessions, o.seed)
            && self.distributed_pct == o.distributed_pct
            && self.abort_pct == o.abort_pct
    }
}

/// One step of the source: an aborted attempt or a commit, as records per tablet.
enum Step {
    Abort,
    Commit { distributed: bool },
}

struct Gen {
    rng: Rng,
    sessions: Vec<Session>,
    tablets: usize,
    /// Per million: aborts, then distributed commits.
    abort_ppm: u64,
    dist_ppm: u64,
    txn_seq: u128,
    gtid_seq: u64,
    /// Per commit (gtid seq − 1): session index and commit counter.
    table: Vec<(u32, u32)>,
}

impl Gen {
    fn new(m: &Manifest) -> Gen {
        let ppm = |pct: f64| (pct * 10_000.0).round().clamp(0.0, 1_000_000.0) as u64;
        Gen {
            rng: Rng(m.seed),
            sessions: (0..m.sessions as u64)
                .map(|i| Session::new(m.connect_base + i))
                .collect(),
            tablets: m.tablets,
            abort_ppm: ppm(m.abort_pct),
            dist_ppm: ppm(m.distributed_pct),
            txn_seq: 0,
            gtid_seq: 0,
            table: Vec::with_capacity(m.commits as usize),
        }
    }

    fn ops(&mut self) -> Vec<Op> {
        let k = self.rng.below(1_000_000);
        vec![Op {
            key: format!("acct/{k:07}").into_bytes(),
            value: Some(self.rng.next().to_le_bytes().to_vec()),
        }]
    }

    fn txn(&mut self) -> TxnId {
        self.txn_seq += 1;
        TxnId::from_u128(self.txn_seq)
    }

    /// Appends the records of the next attempt to `recs` as (tablet index, body).
    fn step(&mut self, recs: &mut Vec<(usize, Body)>) -> Step {
        let s = self.rng.below(self.sessions.len() as u64) as usize;
        let roll = self.rng.below(1_000_000);
        let t = self.rng.below(self.tablets as u64) as usize;
        if roll < self.abort_ppm {
            let trx = self.sessions[s].abort();
            let txn = self.txn();
            let ops = self.ops();
            recs.push((
                t,
                Body::Intent {
                    txn,
                    trx_id: Some(trx),
                    ops,
                },
            ));
            recs.push((
                t,
                Body::Abort {
                    txn,
                    trx_id: Some(trx),
                },
            ));
            return Step::Abort;
        }
        let trx = self.sessions[s].commit();
        self.gtid_seq += 1;
        let gtid = Gtid::new(0, 1, self.gtid_seq);
        self.table.push((
            s as u32,
            u32::try_from(trx.commit_counter).unwrap_or(u32::MAX),
        ));
        if roll < self.abort_ppm + self.dist_ppm && self.tablets >= 2 {
            let b = (t + 1 + self.rng.below(self.tablets as u64 - 1) as usize) % self.tablets;
            let txn = self.txn();
            for p in [t, b] {
                let ops = self.ops();
                recs.push((
                    p,
                    Body::Intent {
                        txn,
                        trx_id: Some(trx),
                        ops,
                    },
                ));
            }
            recs.push((
                t,
                Body::Commit {
                    txn,
                    participants: vec![tablet_id(t), tablet_id(b)],
                    trx_id: Some(trx),
                    gtid: Some(gtid),
                },
            ));
            Step::Commit { distributed: true }
        } else {
            let ops = self.ops();
            recs.push((
                t,
                Body::Write {
                    ops,
                    trx_id: Some(trx),
                    gtid: Some(gtid),
                },
            ));
            Step::Commit { distributed: false }
        }
    }
}

fn tablet_id(i: usize) -> TabletId {
    // "t<n>" is always a valid tablet id.
    format!("t{i}")
        .parse()
        .unwrap_or_else(|_| unreachable!("t{i} is a valid tablet id"))
}

/// A distributed commit's part, applied with `Store::apply_part` after its round.
struct Part {
    txn: TxnId,
    tablet: usize,
    commit_ht: HybridTime,
    ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Builds the store by the apply path; returns the manifest and the generator's tables.
fn build(store: &Store, args: &TrxArgs) -> Result<(Manifest, Gen)> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let first_ht = HybridTime::from_system_time(SystemTime::now());
    let mut m = Manifest {
        version: MANIFEST_VERSION,
        commits: args.commits,
        tablets: args.tablets,
        sessions: args.sessions,
        distributed_pct: args.distributed_pct,
        abort_pct: args.abort_pct,
        seed: args.seed,
        connect_base: (1u64 << 56) | (now.as_secs() << 24),
        first_ht: first_ht.0,
        last_ht: 0,
        records: 0,
        aborts: 0,
        distributed: 0,
        build_s: 0.0,
    };
    let tablets: Vec<TabletId> = (0..args.tablets).map(tablet_id).collect();
    let mut gen = Gen::new(&m);
    let mut bufs: Vec<Vec<(WalPos, Record)>> = vec![Vec::new(); args.tablets];
    let mut pos = vec![WalPos(0); args.tablets];
    let mut parts: Vec<Part> = Vec::new();
    let mut recs = Vec::new();
    let mut ht = first_ht.0;
    let mut buffered = 0usize;
    let round = args.batch * args.tablets;
    let start = Instant::now();
    let mut next_report = 1_000_000u64;

    let flush = |bufs: &mut Vec<Vec<(WalPos, Record)>>,
                 pos: &[WalPos],
                 parts: &mut Vec<Part>|
     -> Result<()> {
        for (i, b) in bufs.iter_mut().enumerate() {
            if b.is_empty() {
                continue;
            }
            store
                .apply(&tablets[i], b, pos[i], Durability::Buffered)
                .with_context(|| {
                    format!("applying {} records of tablet {}", b.len(), tablets[i])
                })?;
            b.clear();
        }
        for p in parts.drain(..) {
            store
                .apply_part(
                    &tablets[p.tablet],
                    &p.txn,
                    p.commit_ht,
                    &p.ops,
                    Durability::Buffered,
                )
                .with_context(|| {
                    format!(
                        "applying the part of txn {} on {}",
                        p.txn, tablets[p.tablet]
                    )
                })?;
        }
        Ok(())
    };

    while (gen.table.len() as u64) < args.commits {
        let step = gen.step(&mut recs);
        let first_part = parts.len();
        for (t, body) in recs.drain(..) {
            ht += 1;
            if let (Step::Commit { distributed: true }, Body::Intent { txn, ops, .. }) =
                (&step, &body)
            {
                parts.push(Part {
                    txn: *txn,
                    tablet: t,
                    commit_ht: HybridTime::MIN,
                    ops: ops
                        .iter()
                        .map(|o| (o.key.clone(), o.value.clone()))
                        .collect(),
                });
            }
            let r = Record::new(HybridTime(ht), body);
            let len = RECORD_HEADER_LEN + r.encoded_body_len()?;
            bufs[t].push((pos[t], r));
            pos[t] = pos[t].add(len as u64);
            buffered += 1;
            m.records += 1;
        }
        match step {
            Step::Abort => m.aborts += 1,
            Step::Commit { distributed } => {
                if distributed {
                    m.distributed += 1;
                    for p in &mut parts[first_part..] {
                        p.commit_ht = HybridTime(ht);
                    }
                }
            }
        }
        if buffered >= round {
            flush(&mut bufs, &pos, &mut parts)?;
            buffered = 0;
        }
        let done = gen.table.len() as u64;
        if done >= next_report {
            let s = start.elapsed().as_secs_f64();
            println!(
                "  built {:>11} commits in {s:6.1} s ({:.0} commits/s)",
                fmt_int(done),
                done as f64 / s
            );
            next_report += 1_000_000;
        }
    }
    // Heartbeats: every tablet's safe time reaches the last ht.
    ht += 1;
    for (t, b) in bufs.iter_mut().enumerate() {
        let r = Record::new(HybridTime(ht), Body::Heartbeat);
        let len = RECORD_HEADER_LEN + r.encoded_body_len()?;
        b.push((pos[t], r));
        pos[t] = pos[t].add(len as u64);
        m.records += 1;
    }
    flush(&mut bufs, &pos, &mut parts)?;
    store.raise_global_safe_time(HybridTime(ht), Durability::Buffered)?;
    store.persist()?;
    m.last_ht = ht;
    m.build_s = start.elapsed().as_secs_f64();
    Ok((m, gen))
}

/// Replays the generator of a built store (no store writes) to get its tables back.
fn replay(m: &Manifest) -> Gen {
    let mut gen = Gen::new(m);
    let mut recs = Vec::new();
    while (gen.table.len() as u64) < m.commits {
        gen.step(&mut recs);
        recs.clear();
    }
    gen
}

// ---- the look-up sets ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Hit,
    HitWithHint,
    Miss,
    MissWithHint,
}

impl Case {
    const ALL: [Case; 4] = [Case::Hit, Case::HitWithHint, Case::Miss, Case::MissWithHint];
    fn name(self) -> &'static str {
        match self {
            Case::Hit => "hit, no hint",
            Case::HitWithHint => "hit, hint",
            Case::Miss => "miss, no hint",
            Case::MissWithHint => "miss, hint",
        }
    }
    fn hit(self) -> bool {
        matches!(self, Case::Hit | Case::HitWithHint)
    }
}

struct Query {
    trx: String,
    hint: Option<String>,
    /// For hits: the commit's gtid.
    gtid: Option<Gtid>,
}

fn queries(case: Case, n: u64, m: &Manifest, gen: &Gen, rng: &mut Rng) -> Vec<Query> {
    (0..n)
        .map(|_| {
            let any_gtid = |rng: &mut Rng| format!("0-1-{}", rng.below(m.commits) + 1);
            if case.hit() {
                let i = rng.below(m.commits);
                let (s, c) = gen.table[i as usize];
                let g = Gtid::new(0, 1, i + 1);
                Query {
                    trx: format!("{}:{c}", m.connect_base + s as u64),
                    hint: (case == Case::HitWithHint).then(|| g.to_string()),
                    gtid: Some(g),
                }
            } else {
                let trx = if rng.below(2) == 0 {
                    // A known session, a counter it has not reached.
                    let s = rng.below(m.sessions as u64) as usize;
                    let next = gen.sessions[s].trx_id();
                    format!(
                        "{}:{}",
                        next.connect_id,
                        next.commit_counter + 1 + rng.below(1_000_000)
                    )
                } else {
                    // A connect id no session used.
                    format!(
                        "{}:{}",
                        m.connect_base + m.sessions as u64 + rng.below(1 << 20),
                        1 + rng.below(1000)
                    )
                };
                Query {
                    trx,
                    hint: (case == Case::MissWithHint).then(|| any_gtid(rng)),
                    gtid: None,
                }
            }
        })
        .collect()
}

// ---- results ----

#[derive(Clone, Debug, Serialize)]
struct CaseResult {
    path: &'static str,
    case: String,
    #[serde(flatten)]
    latency: Latency,
}

fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0)
}

fn print_table(rows: &[CaseResult]) {
    println!(
        "{:<64} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case (µs)", "count", "p50", "p99", "p999", "max", "mean"
    );
    for r in rows {
        let l = &r.latency;
        println!(
            "{:<64} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9.2}",
            format!("{} {}", r.path, r.case),
            fmt_int(l.count),
            us(l.p50_ns),
            us(l.p99_ns),
            us(l.p999_ns),
            us(l.max_ns),
            l.mean_ns / 1000.0
        );
    }
}

// ---- library ----

/// A safe time past every commit.
struct FixedSafeTime(HybridTime);

impl SafeTimeView for FixedSafeTime {
    fn safe_time(&self) -> Option<HybridTime> {
        Some(self.0)
    }
    fn wait_for(&self, ht: HybridTime, _deadline: Instant) -> bool {
        ht <= self.0
    }
}

fn check_answer(what: &str, case: Case, q: &Query, state: &str, gtid: Option<&str>) -> Result<()> {
    let want = if case.hit() { "COMMITTED" } else { "UNKNOWN" };
    if state != want {
        bail!(
            "{what} {}: trx {} (hint {:?}) answered {state}, expected {want}",
            case.name(),
            q.trx,
            q.hint
        );
    }
    if let Some(g) = q.gtid {
        if gtid != Some(g.to_string().as_str()) {
            bail!(
                "{what} {}: trx {} answered gtid {gtid:?}, expected {g}",
                case.name(),
                q.trx
            );
        }
    }
    Ok(())
}

fn library_case(
    store: &Store,
    view: &FixedSafeTime,
    case: Case,
    warm: &[Query],
    timed: &[Query],
    clock: &Clock,
) -> Result<Latency> {
    let ask = |q: &Query| {
        trx_status(
            store,
            view,
            &TrxQuery {
                trx_id: &q.trx,
                gtid_hint: q.hint.as_deref(),
                wait: Duration::ZERO,
                max_staleness: Duration::from_secs(365 * 86_400),
            },
        )
    };
    for q in warm {
        let a = ask(q)?;
        check_answer(
            "library",
            case,
            q,
            a.state.name(),
            a.gtid.map(|g| g.to_string()).as_deref(),
        )?;
    }
    let mut h = new_histogram()?;
    let mut answers = Vec::with_capacity(timed.len());
    let m0 = clock.mark();
    for q in timed {
        let t0 = clock.now();
        let a = ask(q);
        let t1 = clock.now();
        h.saturating_record(t1.wrapping_sub(t0).max(1));
        answers.push(a.map(|a| (a.state, a.gtid)));
    }
    let m1 = clock.mark();
    for (q, a) in timed.iter().zip(answers) {
        let (state, gtid) = a?;
        debug_assert!(TrxState::ALL.contains(&state));
        check_answer(
            "library",
            case,
            q,
            state.name(),
            gtid.map(|g| g.to_string()).as_deref(),
        )?;
    }
    Ok(Latency::of_ticks(&h, ns_per_tick(m0, m1)))
}

// ---- admin API ----

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// One keep-alive connection to the admin socket, through either client.
enum ApiClient {
    Blocking(Http1),
    Hyper {
        rt: tokio::runtime::Runtime,
        sender: Sender,
    },
}

impl ApiClient {
    fn connect(kind: ApiClientKind, socket: &Path) -> Result<ApiClient> {
        Ok(match kind {
            ApiClientKind::Blocking => ApiClient::Blocking(Http1::connect(socket)?),
            ApiClientKind::Hyper => {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                let sender = rt.block_on(async {
                    let stream = tokio::net::UnixStream::connect(socket)
                        .await
                        .with_context(|| format!("connecting to {}", socket.display()))?;
                    let (sender, conn) =
                        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                            .await
                            .with_context(|| format!("HTTP handshake on {}", socket.display()))?;
                    tokio::spawn(conn);
                    anyhow::Ok(sender)
                })?;
                ApiClient::Hyper { rt, sender }
            }
        })
    }

    fn get(&mut self, path: &str) -> Result<(u16, Vec<u8>)> {
        match self {
            ApiClient::Blocking(c) => c.get(path),
            ApiClient::Hyper { rt, sender } => rt.block_on(hyper_get(sender, path)),
        }
    }
}

async fn hyper_get(sender: &mut Sender, path: &str) -> Result<(u16, Vec<u8>)> {
    sender
        .ready()
        .await
        .with_context(|| format!("the admin connection closed before GET {path}"))?;
    let req = hyper::Request::builder()
        .method(hyper::Method::GET)
        .uri(path)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .with_context(|| format!("bad request GET {path}"))?;
    let resp = sender
        .send_request(req)
        .await
        .with_context(|| format!("GET {path}"))?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .with_context(|| format!("reading the answer to GET {path}"))?
        .to_bytes();
    Ok((status, body.to_vec()))
}

fn api_path(q: &Query) -> String {
    match &q.hint {
        Some(g) => format!("/v1/trx/{}?gtid={g}", q.trx),
        None => format!("/v1/trx/{}", q.trx),
    }
}

fn check_api_answer(case: Case, q: &Query, status: u16, body: &[u8]) -> Result<()> {
    if status != 200 {
        bail!(
            "admin API {}: GET {} answered HTTP {status}: {}",
            case.name(),
            api_path(q),
            String::from_utf8_lossy(body)
        );
    }
    let v: Value = serde_json::from_slice(body).with_context(|| {
        format!(
            "admin API {}: GET {} answered a body that is not JSON: {}",
            case.name(),
            api_path(q),
            String::from_utf8_lossy(body)
        )
    })?;
    let state = v["state"].as_str().ok_or_else(|| {
        anyhow!(
            "admin API {}: GET {} answered without a string `state`: {v}",
            case.name(),
            api_path(q)
        )
    })?;
    check_answer("admin API", case, q, state, v["gtid"].as_str())
}

/// One admin-API look-up, checked.
fn api_lookup(client: &mut ApiClient, case: Case, q: &Query, path: &str) -> Result<()> {
    let (st, body) = client.get(path)?;
    check_api_answer(case, q, st, &body)
}

fn write_applier_config(
    work: &Path,
    data_dir: &Path,
    tablets: usize,
    cache_size: u64,
    sql: Option<SocketAddr>,
) -> Result<(PathBuf, PathBuf)> {
    let tls = work.join("tls");
    tidelog_testkit::pki::write(&tls)?;
    let port = tidelog_testkit::cluster::free_udp_port()?;
    let sock = work.join("applier.sock");
    let cfg = work.join("applier.toml");
    let ids: Vec<String> = (0..tablets).map(|i| format!("\"t{i}\"")).collect();
    let p = |f: &str| tls.join(f).display().to_string();
    std::fs::write(
        &cfg,
        format!(
            "listen = \"127.0.0.1:{port}\"\ndata-dir = \"{}\"\nadmin-socket = \"{}\"\nsync = \"batch\"\nmax-staleness = \"365d\"\nbinlog-retention = \"365d\"\ncache-size = \"{cache_size}\"\nexpect-tablets = [{}]\n[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
            data_dir.display(),
            sock.display(),
            ids.join(", "),
            p("ca.pem"),
            p("applier.pem"),
            p("applier.key")
        ),
    )
    .with_context(|| format!("writing {}", cfg.display()))?;
    if let Some(addr) = sql {
        let pw = work.join("sql-password");
        std::fs::write(&pw, format!("{SQL_PASSWORD}\n"))
            .with_context(|| format!("writing {}", pw.display()))?;
        std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let mut f = std::fs::OpenOptions::new().append(true).open(&cfg)?;
        write!(
            f,
            "[sql]\nlisten = \"{addr}\"\nuser = \"{SQL_USER}\"\npassword-file = \"{}\"\ntls = \"off\"\n",
            pw.display()
        )?;
    }
    Ok((cfg, sock))
}

/// The SQL side: one connection with the two look-ups prepared.
struct SqlSide {
    conn: SqlConn,
    plain: u32,
    hinted: u32,
    answer: String,
}

impl SqlSide {
    fn connect(addr: SocketAddr) -> Result<SqlSide> {
        let mut conn = SqlConn::connect(addr, SQL_USER, SQL_PASSWORD)?;
        let (plain, _) = conn.prepare("SELECT trx_status(?)")?;
        let (hinted, _) = conn.prepare("SELECT trx_status(?, ?)")?;
        Ok(SqlSide {
            conn,
            plain,
            hinted,
            answer: String::new(),
        })
    }

    /// One look-up (not checked: [`SqlSide::check`]).
    fn lookup(&mut self, q: &Query) -> Result<()> {
        let got = match &q.hint {
            Some(h) => self
                .conn
                .execute_one(self.hinted, &[&q.trx, h], &mut self.answer)?,
            None => self
                .conn
                .execute_one(self.plain, &[&q.trx], &mut self.answer)?,
        };
        if !got {
            bail!("SQL endpoint: trx_status({}) answered no row", q.trx);
        }
        Ok(())
    }

    /// The state the last look-up answered, against what `case` expects.
    fn check(&self, case: Case, q: &Query) -> Result<()> {
        let want = if case.hit() { "COMMITTED" } else { "UNKNOWN" };
        if self.answer != want {
            bail!(
                "SQL endpoint {}: trx_status({}, {:?}) answered {}, expected {want}",
                case.name(),
                q.trx,
                q.hint,
                self.answer
            );
        }
        Ok(())
    }
}

/// The admin-API side of the comparison: the real daemon and one connection to it (and,
/// with `--sql`, one to its SQL endpoint).
struct ApiSide {
    daemon: Daemon,
    client: ApiClient,
    sql: Option<SqlSide>,
}

impl ApiSide {
    fn stop(mut self) {
        if let Err(e) = self.daemon.stop(Duration::from_secs(30)) {
            eprintln!("warning: {e:#}");
        }
    }
}

/// Starts `tidelog apply` on `data_dir` and waits until it answers and has pre-loaded its
/// look-up indexes.
fn start_api(args: &TrxArgs, work: &Path, data_dir: &Path) -> Result<ApiSide> {
    let exe = tidelog_exe()?;
    let sql_addr = if args.sql {
        let l = std::net::TcpListener::bind("127.0.0.1:0").context("a free TCP port")?;
        Some(l.local_addr()?)
    } else {
        None
    };
    let (cfg, sock) = write_applier_config(
        work,
        data_dir,
        args.tablets,
        args.cache_size
            .unwrap_or(tidelog_applier::store::DEFAULT_CACHE_SIZE),
        sql_addr,
    )?;
    let log = work.join("applier.log");
    let mut daemon = Daemon::spawn(&exe, "apply", &cfg, &log, "warn")?;
    let r = (|| {
        let t0 = Instant::now();
        let deadline = t0 + Duration::from_secs(120);
        let mut client = loop {
            daemon.check_alive()?;
            if let Ok(mut c) = ApiClient::connect(args.api_client, &sock) {
                if let Ok((200, _)) = c.get("/v1/status") {
                    break c;
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the applier did not answer on {} within 120 s; see {}",
                    sock.display(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let (_, st) = client.get("/v1/safe-time")?;
        let st: Value = serde_json::from_slice(&st).context("GET /v1/safe-time: not JSON")?;
        println!(
            "  tidelog apply pid {} answering after {:.2} s; safe time {} (initialized: {}); {:?} client",
            daemon.pid(),
            t0.elapsed().as_secs_f64(),
            st["safe_time"],
            st["initialized"],
            args.api_client,
        );
        // The daemon pre-loads its look-up indexes into the block cache in the background:
        // measure once that is over (it competes for the two cores meanwhile).
        let t1 = Instant::now();
        let warm = loop {
            let (_, body) = client.get("/v1/status")?;
            let v: Value = serde_json::from_slice(&body).context("GET /v1/status: not JSON")?;
            let lc = v["lookup_cache"].clone();
            if lc["state"] != "loading" {
                break lc;
            }
            if Instant::now() > deadline {
                bail!("the applier still pre-loads its look-up indexes after 120 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        println!(
            "  look-up indexes {} in the daemon's block cache after {:.1} s more ({} MiB of {} MiB)",
            warm["state"].as_str().unwrap_or("?"),
            t1.elapsed().as_secs_f64(),
            warm["index_bytes"].as_u64().unwrap_or(0) >> 20,
            warm["cache_size"].as_u64().unwrap_or(0) >> 20,
        );
        let sql = match sql_addr {
            Some(a) => {
                let s = SqlSide::connect(a)?;
                println!(
                    "  SQL endpoint on {a}: SELECT trx_status(?) and trx_status(?, ?) prepared"
                );
                Some(s)
            }
            None => None,
        };
        Ok((client, sql))
    })();
    match r {
        Ok((client, sql)) => Ok(ApiSide {
            daemon,
            client,
            sql,
        }),
        Err(e) => {
            if let Err(e2) = daemon.stop(Duration::from_secs(30)) {
                eprintln!("warning: {e2:#}");
            }
            Err(e)
        }
    }
}

// ---- PostgreSQL ----

struct PgCluster {
    script: PathBuf,
    dir: Option<PathBuf>,
}

impl PgCluster {
    fn stop(&mut self) {
        if let Some(d) = self.dir.take() {
            match Command::new("bash")
                .arg(&self.script)
                .arg("stop")
                .arg(&d)
                .output()
            {
                Ok(o) if o.status.success() => {}
                Ok(o) => eprintln!(
                    "stopping the baseline PostgreSQL in {}: {}",
                    d.display(),
                    String::from_utf8_lossy(&o.stderr).trim()
                ),
                Err(e) => eprintln!("stopping the baseline PostgreSQL in {}: {e}", d.display()),
            }
        }
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        self.stop();
    }
}

#[derive(Clone, Debug, Serialize)]
struct PgInfo {
    version: String,
    xids: u64,
    first_xid: u64,
    last_xid: u64,
    aborted: u64,
    build_s: String,
    settings: &'static str,
}

/// The PostgreSQL side of the comparison: a throwaway cluster with `--pg-xids` assigned
/// xids and one connection with the prepared look-up.
struct PgSide {
    info: PgInfo,
    conn: PgConn,
    cluster: PgCluster,
    first: u64,
    last: u64,
    aborted: Vec<u64>,
    aborted_set: HashSet<u64>,
    rng: Rng,
    answer: String,
}

/// Restricts the calling thread (and the processes it spawns from now on) to `cpus`.
fn pin_thread(cpus: &[usize]) -> Result<()> {
    // SAFETY: `cpu_set_t` is plain data; CPU_SET writes within it for ids below
    // CPU_SETSIZE (checked); sched_setaffinity reads `size_of` bytes of it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            if c >= libc::CPU_SETSIZE as usize {
                bail!("CPU {c} is beyond CPU_SETSIZE");
            }
            libc::CPU_SET(c, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!(
                "sched_setaffinity to CPUs {cpus:?}: {}",
                std::io::Error::last_os_error()
            );
        }
    }
    Ok(())
}

/// Look-ups per block when the admin API and PostgreSQL alternate.
const API_PG_BLOCK: usize = 500;

/// The PostgreSQL row measured beside `case`.
fn pg_case_name(case: Case) -> String {
    format!("{} xid beside {}", pg_want(case), case.name())
}

/// The `pg_xact_status` answer a case expects.
fn pg_want(case: Case) -> &'static str {
    if case.hit() {
        "committed"
    } else {
        "aborted"
    }
}

impl PgSide {
    /// `n` xids to look up for `case`: committed ones for hits, aborted ones for misses.
    fn ids(&mut self, case: Case, n: u64) -> Vec<String> {
        (0..n)
            .map(|_| {
                if case.hit() {
                    loop {
                        let x = self.first + 1 + self.rng.below(self.last - self.first - 1);
                        if !self.aborted_set.contains(&x) {
                            break x.to_string();
                        }
                    }
                } else {
                    self.aborted[self.rng.below(self.aborted.len() as u64) as usize].to_string()
                }
            })
            .collect()
    }

    /// One `pg_xact_status` look-up, checked.
    fn lookup(&mut self, case: Case, xid: &str) -> Result<()> {
        let want = pg_want(case);
        let got = self.conn.query_one("st", &[xid], &mut self.answer)?;
        if !got || self.answer != want {
            bail!(
                "pg_xact_status({xid}) answered {:?}, expected {want}",
                self.answer
            );
        }
        Ok(())
    }

    fn stop(self) {
        let PgSide {
            conn, mut cluster, ..
        } = self;
        drop(conn);
        cluster.stop();
    }
}

fn start_pg(args: &TrxArgs, work: &Path) -> Result<PgSide> {
    let script = work.join("pg-baseline.sh");
    std::fs::write(&script, PG_SCRIPT).with_context(|| format!("writing {}", script.display()))?;
    let xids = args.pg_xids.unwrap_or(args.commits);
    println!(
        "  starting a throwaway PostgreSQL and assigning {} xids (every {PG_ABORT_EVERY}th rolled back) ...",
        fmt_int(xids)
    );
    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(&script)
        .arg("start")
        .arg(xids.to_string())
        .arg(PG_ABORT_EVERY.to_string())
        .output()
        .context("running bash pg-baseline.sh")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let kv = |k: &str| -> Option<String> {
        text.lines()
            .find_map(|l| l.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .map(str::to_string)
    };
    // Owns the cluster from here, so every error path below stops it.
    let cluster = PgCluster {
        script: script.clone(),
        dir: kv("dir").map(PathBuf::from),
    };
    if !out.status.success() {
        bail!(
            "pg-baseline.sh start failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let need =
        |k: &str| kv(k).ok_or_else(|| anyhow!("pg-baseline.sh printed no {k}= line: {text}"));
    let num = |k: &str| -> Result<u64> {
        need(k)?
            .trim()
            .parse()
            .map_err(|e| anyhow!("pg-baseline.sh: {k}= is not a number: {e}"))
    };
    let socket_dir = PathBuf::from(need("socket_dir")?);
    let port: u16 = num("port")?
        .try_into()
        .map_err(|_| anyhow!("pg-baseline.sh: port out of range"))?;
    let (first, last) = (num("first_xid")?, num("last_xid")?);
    let aborted_file = PathBuf::from(need("aborted_file")?);
    let aborted: Vec<u64> = std::fs::read_to_string(&aborted_file)
        .with_context(|| format!("reading {}", aborted_file.display()))?
        .lines()
        .enumerate()
        .map(|(i, l)| {
            l.trim().parse().map_err(|e| {
                anyhow!(
                    "{} line {}: {l:?} is not an xid: {e}",
                    aborted_file.display(),
                    i + 1
                )
            })
        })
        .collect::<Result<_>>()?;
    if aborted.is_empty() || last <= first + 2 {
        bail!(
            "the baseline PostgreSQL has no xid range to look up ({first}..{last}, {} aborted)",
            aborted.len()
        );
    }
    let info = PgInfo {
        version: need("version")?,
        xids,
        first_xid: first,
        last_xid: last,
        aborted: aborted.len() as u64,
        build_s: need("build_s")?,
        settings: "initdb --auth=trust; fsync=off synchronous_commit=off full_page_writes=off autovacuum=off; Unix socket only; shared_buffers default (128MB)",
    };
    println!(
        "  PostgreSQL {} up in {:.1} s: xids {first}..{last} assigned in {} s ({} aborted)",
        info.version,
        t0.elapsed().as_secs_f64(),
        info.build_s,
        fmt_int(info.aborted)
    );
    let mut conn = PgConn::connect(&socket_dir, port, "postgres", "postgres")?;
    conn.prepare("st", "SELECT pg_xact_status($1::xid8)")?;
    let aborted_set: HashSet<u64> = aborted.iter().copied().collect();
    Ok(PgSide {
        info,
        conn,
        cluster,
        first,
        last,
        aborted,
        aborted_set,
        rng: Rng(args.seed ^ 0x5047),
        answer: String::new(),
    })
}

// ---- the run ----

#[derive(Debug, Serialize)]
struct Report {
    machine: String,
    loadavg_start: String,
    loadavg_end: String,
    clock: &'static str,
    data_dir: String,
    filesystem: String,
    reused: bool,
    build: Manifest,
    build_commits_per_s: Option<f64>,
    results: Vec<CaseResult>,
    pg: Option<PgInfo>,
    pg_skipped: Option<String>,
    api_skipped: Option<String>,
    ratios: Vec<Ratio>,
    budgets: Vec<Budget>,
}

#[derive(Debug, Serialize)]
struct Ratio {
    what: String,
    value: f64,
}

#[derive(Debug, Serialize)]
struct Budget {
    what: String,
    actual: f64,
    target: f64,
    pass: bool,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub fn run(args: &TrxArgs) -> Result<()> {
    if args.tablets == 0 || args.sessions == 0 || args.commits == 0 || args.batch == 0 {
        bail!("--commits, --tablets, --sessions and --batch must be > 0");
    }
    if args.sessions > u32::MAX as usize {
        bail!("--sessions must fit in u32");
    }
    let parent = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir()?,
    };
    let work = tempfile::Builder::new()
        .prefix(".tidelog-bench-trx-")
        .tempdir_in(&parent)
        .with_context(|| format!("creating a run directory in {}", parent.display()))?;
    let work_path = work.path().to_path_buf();
    let r = run_in(args, &work_path);
    if args.keep {
        let p = work.keep();
        println!("run directory kept: {}", p.display());
    }
    r
}

fn run_in(args: &TrxArgs, work: &Path) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let machine = format!("{cpus} CPUs, kernel {}", kernel_release());
    let loadavg_start = loadavg();
    let clock = Clock::new();
    // The store lives in `<root>/applier` (the daemon's data-dir).
    let root = args.data_dir.clone().unwrap_or_else(|| work.join("data"));
    let data_dir = root.join("applier");
    std::fs::create_dir_all(&data_dir)
        .with_context(|| format!("creating {}", data_dir.display()))?;
    println!(
        "tidelog-bench trx-status: {} commits, {} tablets, {} sessions, {}% distributed, {}% aborted attempts, seed {}",
        fmt_int(args.commits),
        args.tablets,
        fmt_int(args.sessions as u64),
        args.distributed_pct,
        args.abort_pct,
        args.seed
    );
    println!(
        "  machine: {machine}; load average at start {loadavg_start}; timing clock {}",
        clock.source()
    );
    println!(
        "  store: {} ({})",
        data_dir.display(),
        filesystem_of(&data_dir)
    );

    let manifest_path = root.join(MANIFEST);
    let cache_size = args
        .cache_size
        .unwrap_or(tidelog_applier::store::DEFAULT_CACHE_SIZE);
    let store = Store::open_with(
        &data_dir,
        &tidelog_applier::store::StoreOptions {
            cache_size,
            ..Default::default()
        },
    )?;
    let (manifest, gen, reused) = match std::fs::read(&manifest_path) {
        Ok(bytes) => {
            let m: Manifest = serde_json::from_slice(&bytes)
                .with_context(|| format!("reading {}", manifest_path.display()))?;
            let want = Manifest {
                commits: args.commits,
                tablets: args.tablets,
                sessions: args.sessions,
                distributed_pct: args.distributed_pct,
                abort_pct: args.abort_pct,
                seed: args.seed,
                ..m.clone()
            };
            if !m.same_plan(&want) {
                bail!(
                    "{} was built with other parameters ({} commits, {} tablets, {} sessions, {}% distributed, {}% aborts, seed {}); remove it or pass the same flags",
                    root.display(), m.commits, m.tablets, m.sessions, m.distributed_pct, m.abort_pct, m.seed
                );
            }
            let t0 = Instant::now();
            let gen = replay(&m);
            println!(
                "  reusing the store built earlier ({} commits in {:.1} s = {:.0} commits/s then); look-up tables regenerated in {:.1} s",
                fmt_int(m.commits),
                m.build_s,
                m.commits as f64 / m.build_s,
                t0.elapsed().as_secs_f64()
            );
            (m, gen, true)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if store.global_safe_time()?.is_some() {
                bail!(
                    "{} holds a store but no {MANIFEST}: a build was interrupted; remove it",
                    root.display()
                );
            }
            println!("  building the binlog by Store::apply (Durability::Buffered) ...");
            let (m, gen) = build(&store, args)?;
            let body = serde_json::to_vec_pretty(&m)?;
            std::fs::write(&manifest_path, body)
                .with_context(|| format!("writing {}", manifest_path.display()))?;
            (m, gen, false)
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", manifest_path.display())),
    };
    let build_rate = (!reused).then(|| manifest.commits as f64 / manifest.build_s);
    println!(
        "  binlog: {} commits ({} distributed), {} aborted attempts, {} records; {}",
        fmt_int(manifest.commits),
        fmt_int(manifest.distributed),
        fmt_int(manifest.aborts),
        fmt_int(manifest.records),
        match build_rate {
            Some(r) => format!(
                "built in {:.1} s = {} commits/s (Store::apply, {} records per tablet per call, Buffered, then persist)",
                manifest.build_s,
                fmt_int(r as u64),
                args.batch
            ),
            None => "reused".into(),
        }
    );

    // A daemon that has run for a while holds most of its binlog in tables, not in
    // memtables replayed from the journal: flush them before measuring.
    let t0 = Instant::now();
    store.flush()?;
    // And let compaction settle: a background compaction on the second core would be
    // measured as look-up latency.
    let settle = t0 + Duration::from_secs(600);
    let mut quiet_since = Instant::now();
    while quiet_since.elapsed() < Duration::from_secs(2) && Instant::now() < settle {
        if !store.background_idle() {
            quiet_since = Instant::now();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let sizes = store.disk_sizes();
    let size_of = |n: &str| {
        sizes
            .iter()
            .find(|(k, ..)| *k == n)
            .map_or(0, |(_, b, ..)| *b)
    };
    let lookup_bytes = size_of("trx") + size_of("gtid") + size_of("trx_open");
    println!(
        "  memtables flushed and compaction idle for 2 s after {:.1} s; tables: {}; look-up keyspaces (trx, gtid, trx_open) {:.0} MiB; block cache {:.0} MiB",
        t0.elapsed().as_secs_f64(),
        sizes
            .iter()
            .map(|(n, b, t, l0)| format!(
                "{n} {:.0} MiB ({t} tables, {l0} in L0)",
                *b as f64 / (1 << 20) as f64
            ))
            .collect::<Vec<_>>()
            .join(", "),
        lookup_bytes as f64 / (1 << 20) as f64,
        cache_size as f64 / (1 << 20) as f64
    );

    if !args.cold && lookup_bytes <= cache_size / 4 * 3 {
        // What the daemon does at start.
        let t0 = Instant::now();
        let n = store.warm_lookup_cache()?;
        println!(
            "  look-up indexes pre-loaded into the block cache: {} entries in {:.1} s",
            fmt_int(n),
            t0.elapsed().as_secs_f64()
        );
    } else {
        println!("  look-up indexes not pre-loaded (--cold, or larger than 3/4 of the cache)");
    }

    // The look-up sets, the same for every path.
    let mut rng = Rng(args.seed ^ 0x7472_7873);
    let n_sets = args.warmup + args.lookups.max(args.api_lookups);
    let sets: Vec<(Case, Vec<Query>, Vec<Query>)> = Case::ALL
        .iter()
        .map(|&c| {
            let mut all = queries(c, n_sets, &manifest, &gen, &mut rng);
            let timed = all.split_off(args.warmup as usize);
            (c, all, timed)
        })
        .collect();
    drop(gen);

    let mut results = Vec::new();
    println!(
        "-- library: trx_status in-process, {} timed per case after {} warm-up",
        fmt_int(args.lookups),
        fmt_int(args.warmup)
    );
    let view = FixedSafeTime(HybridTime(manifest.last_ht));
    for (case, warm, timed) in &sets {
        let l = library_case(
            &store,
            &view,
            *case,
            warm,
            &timed[..args.lookups as usize],
            &clock,
        )?;
        println!(
            "  {:<14} p50 {} µs  p99 {} µs  p999 {} µs",
            case.name(),
            us(l.p50_ns),
            us(l.p99_ns),
            us(l.p999_ns)
        );
        results.push(CaseResult {
            path: "library",
            case: case.name().into(),
            latency: l,
        });
    }
    drop(store);

    // The admin API and PostgreSQL are measured side by side: both servers up, each case
    // in alternating blocks of look-ups, so that whatever else the machine does at a given
    // moment falls on both columns alike.
    // Servers on the last CPU (children inherit this thread's affinity), the measuring
    // thread on the first: every look-up crosses CPUs, for both servers alike.
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (server_cpu, client_cpu) = match args.pin {
        Pin::Split if ncpu >= 2 => (Some(ncpu - 1), Some(0)),
        Pin::Split | Pin::None => (None, None),
        Pin::Same => (Some(0), Some(0)),
    };
    if let (Some(s), Some(c)) = (server_cpu, client_cpu) {
        pin_thread(&[s])?;
        println!("-- servers pinned to CPU {s}, the measuring thread to CPU {c}");
    }
    let (mut pg, mut pg_skipped, mut pg_side) = (None, None, None);
    if args.no_pg {
        pg_skipped = Some("--no-pg".to_string());
    } else {
        println!(
            "-- PostgreSQL baseline: SELECT pg_xact_status($1::xid8), prepared, one Unix-socket connection"
        );
        match start_pg(args, work) {
            Ok(p) => {
                pg = Some(p.info.clone());
                pg_side = Some(p);
            }
            Err(e) => {
                let why = format!("{e:#}");
                println!("  PostgreSQL baseline SKIPPED: {why}");
                pg_skipped = Some(why);
            }
        }
    }
    let (mut api_skipped, mut api_side) = (None, None);
    if args.no_api {
        api_skipped = Some("--no-api".to_string());
    } else {
        println!("-- admin API: GET /v1/trx/{{id}}[?gtid=G] on one keep-alive HTTP/1.1 connection");
        api_side = Some(start_api(args, work, &data_dir)?);
    }
    if let Some(c) = client_cpu {
        pin_thread(&[c])?;
    }
    if api_side.is_some() || pg_side.is_some() {
        println!(
            "-- {} timed admin-API and {} timed PostgreSQL look-ups per case, alternating in blocks of ~{API_PG_BLOCK}",
            fmt_int(if api_side.is_some() { args.api_lookups } else { 0 }),
            fmt_int(if pg_side.is_some() { args.pg_lookups } else { 0 }),
        );
    }
    let measured = (|| -> Result<Vec<CaseResult>> {
        let mut out = Vec::new();
        if api_side.is_none() && pg_side.is_none() {
            return Ok(out);
        }
        for (case, warm, timed) in &sets {
            let case = *case;
            let warm_n = (warm.len() / 10).max(1).min(warm.len());
            let paths: Vec<String> = match &api_side {
                Some(_) => timed[..(args.api_lookups as usize).min(timed.len())]
                    .iter()
                    .map(api_path)
                    .collect(),
                None => Vec::new(),
            };
            let xids: Vec<String> = match &mut pg_side {
                Some(p) => p.ids(case, warm_n as u64 + args.pg_lookups),
                None => Vec::new(),
            };
            let (pg_warm, pg_timed) = xids.split_at(if xids.is_empty() { 0 } else { warm_n });
            if let Some(a) = &mut api_side {
                for q in &warm[..warm_n] {
                    api_lookup(&mut a.client, case, q, &api_path(q))?;
                }
            }
            if let Some(p) = &mut pg_side {
                for x in pg_warm {
                    p.lookup(case, x)?;
                }
            }
            if let Some(sq) = api_side.as_mut().and_then(|a| a.sql.as_mut()) {
                for q in &warm[..warm_n] {
                    sq.lookup(q)?;
                    sq.check(case, q)?;
                }
            }
            let (na, np) = (paths.len(), pg_timed.len());
            let blocks = (na.max(np) / API_PG_BLOCK).max(1);
            let (mut ha, mut hp, mut hs) = (new_histogram()?, new_histogram()?, new_histogram()?);
            let m0 = clock.mark();
            for k in 0..blocks {
                if let Some(a) = &mut api_side {
                    for i in k * na / blocks..(k + 1) * na / blocks {
                        let t0 = clock.now();
                        let (st, body) = a.client.get(&paths[i])?;
                        let t1 = clock.now();
                        ha.saturating_record(t1.wrapping_sub(t0).max(1));
                        check_api_answer(case, &timed[i], st, &body)?;
                    }
                    if let Some(sq) = &mut a.sql {
                        for q in &timed[k * na / blocks..(k + 1) * na / blocks] {
                            let t0 = clock.now();
                            sq.lookup(q)?;
                            let t1 = clock.now();
                            hs.saturating_record(t1.wrapping_sub(t0).max(1));
                            sq.check(case, q)?;
                        }
                    }
                }
                if let Some(p) = &mut pg_side {
                    for x in &pg_timed[k * np / blocks..(k + 1) * np / blocks] {
                        let t0 = clock.now();
                        p.lookup(case, x)?;
                        let t1 = clock.now();
                        hp.saturating_record(t1.wrapping_sub(t0).max(1));
                    }
                }
            }
            let npt = ns_per_tick(m0, clock.mark());
            let ns = if api_side.as_ref().is_some_and(|a| a.sql.is_some()) {
                na
            } else {
                0
            };
            for (path, name, h, n) in [
                ("admin API", case.name().to_string(), &ha, na),
                ("SQL endpoint", case.name().to_string(), &hs, ns),
                ("PostgreSQL pg_xact_status", pg_case_name(case), &hp, np),
            ] {
                if n == 0 {
                    continue;
                }
                let l = Latency::of_ticks(h, npt);
                println!(
                    "  {:<42} p50 {} µs  p99 {} µs  p999 {} µs",
                    format!("{path} {name}"),
                    us(l.p50_ns),
                    us(l.p99_ns),
                    us(l.p999_ns)
                );
                out.push(CaseResult {
                    path,
                    case: name,
                    latency: l,
                });
            }
        }
        Ok(out)
    })();
    if let Some(a) = api_side {
        a.stop();
    }
    if let Some(p) = pg_side {
        p.stop();
    }
    if client_cpu.is_some() {
        pin_thread(&(0..ncpu).collect::<Vec<_>>())?;
    }
    results.extend(measured?);

    // Summary.
    let loadavg_end = loadavg();
    println!();
    println!(
        "== trx_status on a binlog of {} commits ({} tablets) (load average {loadavg_start} at start, {loadavg_end} at end) ==",
        fmt_int(manifest.commits),
        manifest.tablets
    );
    print_table(&results);
    let find = |path: &str, case: &str| {
        results
            .iter()
            .find(|r| r.path == path && r.case == case)
            .map(|r| r.latency.p99_ns)
    };
    let mut ratios = Vec::new();
    let mut budgets = Vec::new();
    for c in Case::ALL {
        if let Some(p99) = find("library", c.name()) {
            budgets.push(Budget {
                what: format!("library {} p99 ≤ 10 µs", c.name()),
                actual: p99 as f64 / 1000.0,
                target: LIBRARY_P99_BUDGET_NS as f64 / 1000.0,
                pass: p99 <= LIBRARY_P99_BUDGET_NS,
            });
        }
    }
    for c in Case::ALL {
        let pg_case = pg_case_name(c);
        for (path, target) in [
            ("admin API", API_OVER_PG_P99_BUDGET),
            ("SQL endpoint", SQL_OVER_PG_P99_BUDGET),
        ] {
            if let (Some(a), Some(p)) = (
                find(path, c.name()),
                find("PostgreSQL pg_xact_status", &pg_case),
            ) {
                let r = a as f64 / p.max(1) as f64;
                ratios.push(Ratio {
                    what: format!("{path} {} p99 / PostgreSQL {pg_case} p99", c.name()),
                    value: r,
                });
                budgets.push(Budget {
                    what: format!("{path} {} p99 / PostgreSQL p99 ≤ {target:.1}", c.name()),
                    actual: r,
                    target,
                    pass: r <= target,
                });
            }
        }
        if let (Some(a), Some(p)) = (
            find("library", c.name()),
            find("PostgreSQL pg_xact_status", &pg_case),
        ) {
            ratios.push(Ratio {
                what: format!("library {} p99 / PostgreSQL {pg_case} p99", c.name()),
                value: a as f64 / p.max(1) as f64,
            });
        }
    }
    for r in &ratios {
        println!("ratio {:<82} {:>8.3}", r.what, r.value);
    }
    let sql_budgets = budgets
        .iter()
        .filter(|b| b.what.starts_with("SQL endpoint"))
        .count();
    let sql_missed: Vec<String> = budgets
        .iter()
        .filter(|b| b.what.starts_with("SQL endpoint") && !b.pass)
        .map(|b| format!("{} (actual {:.3})", b.what, b.actual))
        .collect();
    for b in &budgets {
        println!(
            "budget {:<60} actual {:>8.3}  target {:>5}  {}",
            b.what,
            b.actual,
            b.target,
            if b.pass { "PASS" } else { "MISS" }
        );
    }
    if let Some(why) = &pg_skipped {
        println!("PostgreSQL column skipped: {why}");
    }
    if let Some(pg) = &pg {
        println!(
            "PostgreSQL {}: {} xids ({}..{}), {} aborted, assigned in {} s; {}",
            pg.version,
            fmt_int(pg.xids),
            pg.first_xid,
            pg.last_xid,
            fmt_int(pg.aborted),
            pg.build_s,
            pg.settings
        );
    }
    println!("timing: one {} read before and after each look-up; warm page cache (the store and the PostgreSQL cluster were just written)", clock.source());

    if let Some(path) = &args.json {
        let report = Report {
            machine,
            loadavg_start,
            loadavg_end,
            clock: clock.source(),
            data_dir: data_dir.display().to_string(),
            filesystem: filesystem_of(&data_dir),
            reused,
            build: manifest,
            build_commits_per_s: build_rate,
            results,
            pg,
            pg_skipped,
            api_skipped,
            ratios,
            budgets,
        };
        let mut f =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        f.write_all(&serde_json::to_vec_pretty(&report)?)?;
        println!("JSON written to {}", path.display());
    }
    if args.sql {
        if sql_budgets == 0 {
            bail!("--sql: no SQL budget could be checked (PostgreSQL skipped or no admin API)");
        }
        if !sql_missed.is_empty() {
            bail!("SQL endpoint budget missed: {}", sql_missed.join("; "));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generator_replays_and_places_commits() {
        let m = Manifest {
            version: MANIFEST_VERSION,
            commits: 5000,
            tablets: 4,
            sessions: 16,
            distributed_pct: 10.0,
            abort_pct: 5.0,
            seed: 7,
            connect_base: 1 << 56,
            first_ht: 1,
            last_ht: 0,
            records: 0,
            aborts: 0,
            distributed: 0,
            build_s: 0.0,
        };
        let a = replay(&m);
        let b = replay(&m);
        assert_eq!(a.table, b.table);
        assert_eq!(a.table.len(), 5000);
        // Every session's commits are numbered 1, 2, 3… in order.
        let mut next = [1u32; 16];
        for (s, c) in &a.table {
            assert_eq!(*c, next[*s as usize]);
            next[*s as usize] += 1;
        }
        let mut r = Rng(1);
        assert!((0..1000).all(|_| r.below(3) < 3));
    }
}
