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

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tidelog_applier::store::Store;
use tidelog_wal::HybridTime;

use crate::stats::{fmt_int, new_histogram, ns_per_tick, Clock, Latency};
use crate::wal_bench::{filesystem_of, kernel_release};

mod api;
mod build;
mod cases;
mod pg;

use api::*;
use build::*;
use cases::*;
use pg::*;

const PG_SCRIPT: &str = include_str!("../../pg-baseline.sh");
const MANIFEST: &str = "trx-bench.json";
const MANIFEST_VERSION: u32 = 1;
/// Every this many PostgreSQL xids is rolled back (1 %).
const PG_ABORT_EVERY: u64 = 100;
/// Budgets (BENCHMARKS.md, "trx-status").
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
mod tests;
