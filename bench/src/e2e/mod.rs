//! `tidelog-bench e2e`: the whole pipeline on one machine — the load generator in this
//! process writing source WALs, the real `tidelog ship` and `tidelog apply` binaries as child
//! processes (QUIC + mutual TLS on loopback, `sync = "batch"`, `lanes = 1`) — and the
//! **safe-time lag**: from a transaction's source commit to the moment the target's global
//! safe time is observed at or past its `commit_ht`.
//!
//! # What is measured
//!
//! * Load: `tidelog_testkit::load::run` on its own thread (`bank` or `kv`), every `--sample-every`-th
//!   commit sent as a `CommitSample` (commit_ht, wall time of the commit to the writer).
//! * Lag: one sampler thread keeps the outstanding samples in a min-heap by `commit_ht`
//!   and, while samples are outstanding, asks `GET /v1/safe-time?wait-for=<oldest
//!   commit_ht>&wait=50ms` on the applier's admin socket over one keep-alive HTTP/1.1
//!   connection — answered as soon as the published safe time reaches it — and resolves
//!   every sample with `commit_ht ≤ safe_time` at once: lag = wall time when the answer
//!   arrived − `committed_at`. Recorded in microseconds in an hdrhistogram (3 significant
//!   digits). The resolution is one round trip; the requests cost the applier little (one
//!   per advance that resolves a sample). `--lag-probe poll` polls `GET /v1/safe-time` every
//!   `--poll-us` instead (resolution: the poll interval plus a round trip; at 200 µs that
//!   was ~1 700 requests/s and ~10 % of the applier's CPU at max).
//!   The timed load starts only once the pipeline carries every tablet: the generator writes
//!   the bank's initial balances and a heartbeat on every tablet, then waits until the
//!   applier's safe time is initialized (the shipper found every tablet, the target applied
//!   a record of each). Samples committed within `--warmup` of the run's first sampled
//!   commit are not recorded either.
//! * Rates: txn/s and MB/s of the generator over the whole run; apply rate = sum over tablets
//!   of `applied_records` from `GET /v1/status`, delta over the load interval.
//! * Catch-up: after the load stops (its final heartbeats written), the time until the safe
//!   time passes every tablet's last record — how far behind the target was at the end.
//! * CPU seconds (utime + stime, `/proc/<pid>/stat`) of the applier, the shipper and this
//!   process (load generator + sampler) from load start to caught up.
//! * Lag by stage: the applier's `tidelog_applier_stage_lag_seconds` histograms (`received`,
//!   `applied`, `visible`), scraped at the load's start and after the catch-up; their
//!   quantiles are printed beside the sampler's (`stage_lag.rs`).
//! * Physical baseline in the same run: 4 KiB `pwrite` + `fdatasync` loop for 2 s on the same
//!   filesystem; the ratio lag p50 / fdatasync p50 is printed.
//!
//! Without `--rate`: a run at max (rate 0), then 10 %, 50 %, 90 % of the measured max, then
//! the budget run at `--budget-rate` (25 000 txn/s, 50 % of the 50 000 txn/s budget), each in
//! a fresh cluster (new directory, certificates, applier and shipper).
//!
//! # `--soak`: memory under a steady load
//!
//! One run at `--rate` (default 10 000 txn/s) for `--duration` (default 30 min). The resident
//! set size (`VmRSS`) of the applier and the shipper is sampled every `--rss-every` (5 s)
//! from the load's start; the progress lines (every 30 s) show it. At the end: RSS at
//! `--soak-reference` (5 min: the applier warm, its caches and memtables filled), at the end
//! of the load and its maximum, and the applier's documented memory bound computed from the
//! run's `applier.toml` (`tidelog::memory::ApplierBound`, `applier/STORE.md`, "Memory").
//! Budget: the applier's RSS at the end within 10 % of its RSS at the reference, and its
//! largest sample below the bound.
//!
//! Every run exits non-zero when a budget is missed.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use tidelog::memory::ApplierBound;
use tidelog_testkit::load::{self, CommitSample, LoadOptions, SourceSafe, Workload};
use tidelog_testkit::{Api, Daemon, ImpairProxy, Impairment, LocalCluster};
use tidelog_wal::SyncPolicy;

use crate::rss;
use crate::ship::cpu;
use crate::stage_lag;
use crate::stats::{fmt_int, fmt_ns, Latency};
use crate::wal_bench::{filesystem_of, kernel_release};

#[derive(Debug, Args)]
pub struct E2eArgs {
    /// bank (transfers between accounts) or kv (random puts/deletes).
    #[arg(long, default_value = "bank")]
    workload: Workload,
    /// Tablets (source shards).
    #[arg(long, default_value_t = 8)]
    tablets: usize,
    /// One run at this offered rate (txn/s; 0 = max) instead of the sweep. With `--soak`:
    /// default 10 000.
    #[arg(long)]
    rate: Option<f64>,
    /// Load duration of each run. Default 10 s; with `--soak` 30 min.
    #[arg(long, value_parser = humantime::parse_duration)]
    duration: Option<Duration>,
    /// One long run at a steady rate, sampling the daemons' RSS (see the module docs).
    #[arg(long)]
    soak: bool,
    /// With `--soak`: how often RSS is sampled.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    rss_every: Duration,
    /// With `--soak`: the time into the load whose RSS the end is compared with.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    soak_reference: Duration,
    /// Samples committed within this long of a run's first sampled commit are not recorded.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Parent of the per-run directories (default: the current directory; the runs go in a
    /// `.tidelog-bench-e2e-<pid>` directory below it, removed at the end unless `--keep`).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    keep: bool,
    /// bank: accounts.
    #[arg(long, default_value_t = 1000)]
    accounts: u64,
    /// Client connections (sessions) of the generator.
    #[arg(long, default_value_t = 256)]
    connections: usize,
    /// Sync policy of the source WALs: `always` (a commit returns once durable, like a
    /// database's commit; the lag starts there) or `batch` (the writer's 5 ms group commit:
    /// commit returns before the data is durable, so the lag includes that wait).
    #[arg(long, default_value = "always")]
    source_sync: SyncPolicy,
    /// The generator writes a heartbeat on a tablet idle this long. Safe time is the minimum
    /// over tablets, so at low rates the least recently written tablet gates it.
    #[arg(long, default_value = "50ms", value_parser = humantime::parse_duration)]
    heartbeat_interval: Duration,
    /// Sample every N-th commit for the lag.
    #[arg(long, default_value_t = 50)]
    sample_every: u64,
    /// How the lag sampler follows the safe time: `wait` asks
    /// `GET /v1/safe-time?wait-for=HT` (answered when the safe time reaches the oldest
    /// outstanding sample's commit_ht); `poll` asks `GET /v1/safe-time` every `--poll-us`.
    #[arg(long, value_enum, default_value = "wait")]
    lag_probe: LagProbe,
    /// With `--lag-probe poll`: sleep between safe-time polls while samples are outstanding,
    /// in microseconds.
    #[arg(long, default_value_t = 200)]
    poll_us: u64,
    /// The budget run's offered rate (skipped with `--rate`).
    #[arg(long, default_value_t = 25_000.0)]
    budget_rate: f64,
    /// The throughput budget (txn/s) the max run is checked against.
    #[arg(long, default_value_t = 50_000.0)]
    budget_max: f64,
    /// The applier's `apply-nice`: nice value of its apply threads and safe-time publisher
    /// (0: the process's). Below 0 needs root or CAP_SYS_NICE here.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    apply_nice: i32,
    /// The applier's `store-nice`: nice value of its store's flush and compaction workers
    /// (0: the process's).
    #[arg(long, default_value_t = 0, allow_negative_numbers = true)]
    store_nice: i32,
    /// The applier's `apply-threads` (0: its default, half the cores, at least two).
    #[arg(long, default_value_t = 0)]
    apply_threads: usize,
    /// The applier's `runtime-threads` (0: its default, half the cores, at least one).
    #[arg(long, default_value_t = 0)]
    runtime_threads: usize,
    /// The applier's `received-direct-io`: received logs written with `O_DIRECT`.
    #[arg(long)]
    received_direct_io: bool,
    /// The applier's `apply-yield-to-intake` (default: the daemon's, `1s`; `0s`: never).
    #[arg(long, value_parser = humantime::parse_duration)]
    apply_yield: Option<Duration>,
    /// Put the UDP impairment proxy (in this process) between the shipper and the applier,
    /// impairing both directions, e.g. `loss=5%,delay=20ms,jitter=5ms,reorder=10%,dup=1%`;
    /// each run is then judged by `--impair-lag-p99`, and a miss exits non-zero.
    #[arg(long)]
    impair: Option<Impairment>,
    /// The impairment proxy's RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// With `--impair`: the budget on each run's safe-time lag p99.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    impair_lag_p99: Duration,
    /// A `[quic]` key for both daemons, as a TOML line (`congestion = "cubic"`); repeatable.
    /// Default: the daemons' defaults.
    #[arg(long)]
    quic: Vec<String>,
}

impl E2eArgs {
    /// The load duration of each run (`--duration`, else 10 s, or 30 min with `--soak`).
    fn duration(&self) -> Duration {
        self.duration.unwrap_or(if self.soak {
            SOAK_DURATION
        } else {
            Duration::from_secs(10)
        })
    }
}

/// `--soak`'s defaults: 30 min at 10 000 txn/s.
const SOAK_DURATION: Duration = Duration::from_secs(30 * 60);
const SOAK_RATE: f64 = 10_000.0;

/// `--soak`: the applier's RSS at the end may differ from its RSS at the reference by at
/// most this fraction.
const SOAK_DRIFT: f64 = 0.10;

/// `--soak`: the RSS "at" a time is the highest sample of the window ending there.
const SOAK_WINDOW: Duration = Duration::from_secs(60);

// ---- child processes ----

pub(crate) fn tidelog_exe() -> Result<PathBuf> {
    let me = std::env::current_exe().context("locating this binary")?;
    let exe = me
        .parent()
        .context("this binary has no parent directory")?
        .join("tidelog");
    if !exe.is_file() {
        bail!(
            "{} not found: the e2e bench runs the real tidelog binary next to tidelog-bench; \
             build both first with `cargo build --release`",
            exe.display()
        );
    }
    Ok(exe)
}

// ---- the admin socket, over the test kit's blocking client (`Api`) ----

/// What the benches read from the applier's admin API.
pub(crate) trait AdminExt {
    /// The applier's lag-by-stage histograms (`GET /metrics`; empty when it fails).
    fn stage_lag(&self) -> stage_lag::Scrape;
    /// The published global safe time (0 while uninitialized).
    fn safe_time(&self) -> Result<u64>;
    /// The `safe_time` of the answer to `GET path` (0 when absent).
    fn safe_time_at(&self, path: &str) -> Result<u64>;
    /// Sum over tablets of `applied_records`.
    fn applied_records(&self) -> Result<u64>;
}

impl AdminExt for Api {
    fn stage_lag(&self) -> stage_lag::Scrape {
        match self.get_raw("/metrics") {
            Ok((200, body)) => stage_lag::parse(&String::from_utf8_lossy(&body)),
            _ => stage_lag::Scrape::default(),
        }
    }

    fn safe_time(&self) -> Result<u64> {
        self.safe_time_at("/v1/safe-time")
    }

    fn safe_time_at(&self, path: &str) -> Result<u64> {
        let (_, v) = self.get(path)?;
        Ok(v["safe_time"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0))
    }

    fn applied_records(&self) -> Result<u64> {
        let (_, v) = self.get("/v1/status")?;
        Ok(v["tablets"]
            .as_object()
            .map(|m| {
                m.values()
                    .filter_map(|t| t["applied_records"].as_u64())
                    .sum()
            })
            .unwrap_or(0))
    }
}

// ---- the sampler ----

fn micros_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

fn lag_histogram() -> Result<Histogram<u64>> {
    // 1 µs .. 1 h, 3 significant digits.
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

struct SamplerOut {
    hist: Histogram<u64>,
    /// The source's part of each lag: commit → the source's safe time at or past it.
    source_hist: Histogram<u64>,
    polls: u64,
    poll_busy: Duration,
    skipped_warmup: u64,
    unresolved: u64,
    poll_errors: u64,
}

/// The source's part of the lag: each (post-warm-up) sample is matched with the first
/// [`SourceSafe`] at or past its `commit_ht`. The two arrive on different channels, so a
/// sample may find its event already here (kept, ht ascending) or wait for it.
struct SourceSplit {
    events: std::collections::VecDeque<(u64, u64)>,
    waiting: BinaryHeap<Reverse<(u64, u64)>>,
}

impl SourceSplit {
    /// Events kept for samples that arrive after them (about 10 s of advances).
    const KEEP: usize = 20_000;

    fn sample(&mut self, ht: u64, at: u64, hist: &mut Histogram<u64>) {
        let i = self.events.partition_point(|&(e, _)| e < ht);
        match self.events.get(i) {
            Some(&(_, e_at)) => hist.saturating_record(e_at.saturating_sub(at).max(1)),
            None => self.waiting.push(Reverse((ht, at))),
        }
    }

    fn event(&mut self, e: SourceSafe, hist: &mut Histogram<u64>) {
        let (ht, e_at) = (e.ht.0, micros_since_epoch(e.at));
        while let Some(Reverse((s_ht, s_at))) = self.waiting.peek().copied() {
            if s_ht > ht {
                break;
            }
            self.waiting.pop();
            hist.saturating_record(e_at.saturating_sub(s_at).max(1));
        }
        if self.events.len() == Self::KEEP {
            self.events.pop_front();
        }
        self.events.push_back((ht, e_at));
    }
}

/// Resolves samples against the published safe time (see the module docs).
fn sampler(
    socket: PathBuf,
    rx: mpsc::Receiver<CommitSample>,
    source_rx: mpsc::Receiver<SourceSafe>,
    warmup: Duration,
    probe: LagProbe,
    poll: Duration,
    give_up: Arc<AtomicBool>,
) -> Result<SamplerOut> {
    // The warm-up counts from the first sampled commit.
    let warmup_us = u64::try_from(warmup.as_micros()).unwrap_or(u64::MAX);
    let mut warm_us: Option<u64> = None;
    let admin = Api::new(&socket);
    let mut heap: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut out = SamplerOut {
        hist: lag_histogram()?,
        source_hist: lag_histogram()?,
        polls: 0,
        poll_busy: Duration::ZERO,
        skipped_warmup: 0,
        unresolved: 0,
        poll_errors: 0,
    };
    let mut disconnected = false;
    let mut split = SourceSplit {
        events: std::collections::VecDeque::new(),
        waiting: BinaryHeap::new(),
    };
    let mut push = |s: CommitSample,
                    heap: &mut BinaryHeap<Reverse<(u64, u64)>>,
                    split: &mut SourceSplit,
                    o: &mut SamplerOut| {
        let at = micros_since_epoch(s.committed_at);
        let until = *warm_us.get_or_insert(at.saturating_add(warmup_us));
        if at < until {
            o.skipped_warmup += 1;
        } else {
            heap.push(Reverse((s.commit_ht.0, at)));
            split.sample(s.commit_ht.0, at, &mut o.source_hist);
        }
    };
    loop {
        // Source events first: a sample pushed below then finds the events sent before it.
        while let Ok(e) = source_rx.try_recv() {
            split.event(e, &mut out.source_hist);
        }
        loop {
            match rx.try_recv() {
                Ok(s) => push(s, &mut heap, &mut split, &mut out),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        if heap.is_empty() {
            if disconnected {
                break;
            }
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(s) => push(s, &mut heap, &mut split, &mut out),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => disconnected = true,
            }
            continue;
        }
        if give_up.load(Ordering::Relaxed) {
            out.unresolved = heap.len() as u64;
            break;
        }
        let t0 = Instant::now();
        let safe = match (probe, heap.peek()) {
            (LagProbe::Wait, Some(Reverse((oldest, _)))) => {
                admin.safe_time_at(&format!("/v1/safe-time?wait-for={oldest}&wait=50ms"))
            }
            _ => admin.safe_time(),
        };
        let seen = micros_since_epoch(SystemTime::now());
        out.poll_busy += t0.elapsed();
        out.polls += 1;
        match safe {
            Ok(safe) => {
                while let Some(Reverse((ht, at))) = heap.peek().copied() {
                    if ht > safe {
                        break;
                    }
                    heap.pop();
                    out.hist.saturating_record(seen.saturating_sub(at).max(1));
                }
            }
            Err(_) => {
                out.poll_errors += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if probe == LagProbe::Poll {
            std::thread::sleep(poll);
        }
    }
    Ok(out)
}

/// How the lag sampler follows the safe time (`--lag-probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LagProbe {
    /// `GET /v1/safe-time?wait-for=HT`: answered when the safe time reaches HT.
    Wait,
    /// `GET /v1/safe-time` every `--poll-us`.
    Poll,
}

// ---- one run ----

#[derive(Clone, Debug, Serialize)]
pub struct LagUs {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

impl LagUs {
    fn of(h: &Histogram<u64>) -> LagUs {
        LagUs {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            mean_us: h.mean(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub label: String,
    /// Offered txn/s (0 = max).
    pub offered: f64,
    pub txn_per_s: f64,
    pub mb_per_s: f64,
    pub records_per_s: f64,
    pub txns_committed: u64,
    pub txns_aborted: u64,
    /// Applied records per second during the load (sum over tablets).
    pub apply_records_per_s: f64,
    /// From the end of the load to the safe time passing every tablet's last record.
    pub catch_up_ms: f64,
    /// txn/s × min(1, applied records/s ÷ generated records/s): the rate the target kept up with.
    pub sustained_txn_per_s: f64,
    pub lag: LagUs,
    /// The source's part of `lag`: from the commit until every tablet had committed a
    /// record at or past its `commit_ht` at the source.
    pub source_lag: LagUs,
    /// The applier's own histograms of how old the newest data was at each stage, between
    /// the load's start and the catch-up (per event, bucket-interpolated; `stage_lag.rs`).
    pub stage_lag: Vec<stage_lag::StageLag>,
    pub samples_skipped_warmup: u64,
    pub samples_unresolved: u64,
    pub polls_per_s: f64,
    pub us_per_poll: f64,
    pub cpu_applier: cpu::Usage,
    pub cpu_shipper: cpu::Usage,
    pub cpu_bench: cpu::Usage,
    pub wall_s: f64,
    pub loadavg_end: String,
    /// Through the impairment proxy (`--impair`).
    pub link: Option<LinkStats>,
    /// `--soak`: the daemons' RSS from the load's start to its end.
    pub rss: Vec<rss::Sample>,
    /// `--soak`: the applier's memory bound computed from the run's `applier.toml`.
    pub bound: Option<ApplierBound>,
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn run_step(args: &E2eArgs, exe: &Path, dir: &Path, label: &str, offered: f64) -> Result<Step> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut extra = match args.apply_nice {
        0 => String::new(),
        n => format!("apply-nice = {n}\n"),
    };
    if args.store_nice != 0 {
        extra.push_str(&format!("store-nice = {}\n", args.store_nice));
    }
    if args.apply_threads > 0 {
        extra.push_str(&format!("apply-threads = {}\n", args.apply_threads));
    }
    if args.runtime_threads > 0 {
        extra.push_str(&format!("runtime-threads = {}\n", args.runtime_threads));
    }
    if args.received_direct_io {
        extra.push_str("received-direct-io = true\n");
    }
    if let Some(y) = args.apply_yield {
        extra.push_str(&format!(
            "apply-yield-to-intake = \"{}ms\"\n",
            y.as_millis()
        ));
    }
    let c = LocalCluster::write(dir, args.tablets, "1h", "bench-source", &extra)?;
    let proxy = link_through(args, &c)?;
    let (applier_cfg, shipper_cfg, asock, wal) =
        (c.applier_cfg, c.shipper_cfg, c.applier_sock, c.wal);
    // The bound the applier documents for the configuration it runs with.
    let bound = match args.soak {
        true => Some(ApplierBound::of(
            &tidelog::config::load_applier(&applier_cfg)?,
            args.tablets,
        )),
        false => None,
    };
    let mut applier = Daemon::spawn(exe, "apply", &applier_cfg, &dir.join("applier.log"), "warn")?;
    let mut shipper = Daemon::spawn(exe, "ship", &shipper_cfg, &dir.join("shipper.log"), "warn")?;
    let admin = Api::new(&asock);
    applier.wait_until(
        &format!("the applier answering on {}", asock.display()),
        Duration::from_secs(30),
        || Ok(admin.get("/v1/status").is_ok()),
    )?;
    println!(
        "-- {label}: offered {}, applier pid {}, shipper pid {}, {}{}",
        if offered > 0.0 {
            format!("{} txn/s", fmt_int(offered as u64))
        } else {
            "max".into()
        },
        applier.pid(),
        shipper.pid(),
        dir.display(),
        proxy.as_ref().map_or(String::new(), |p| format!(
            ", shipper → impairment proxy {} ({}, seed {}) → applier",
            p.local_addr(),
            p.impairment(),
            args.seed
        ))
    );

    let (tx, rx) = mpsc::channel::<CommitSample>();
    let (source_tx, source_rx) = mpsc::channel::<SourceSafe>();
    let give_up = Arc::new(AtomicBool::new(false));
    let warmup = args.warmup;
    let sampler_t = {
        let (sock, gu, probe, poll) = (
            asock.clone(),
            give_up.clone(),
            args.lag_probe,
            Duration::from_micros(args.poll_us),
        );
        std::thread::Builder::new()
            .name("lag-sampler".into())
            .spawn(move || sampler(sock, rx, source_rx, warmup, probe, poll, gu))?
    };

    let stop = Arc::new(AtomicBool::new(false));
    // The generator's own once-a-second report: the bench's ticks are not in step with its
    // reports (a tick between two reports would show 0 txn/s, the next one double).
    let report: Arc<Mutex<Option<load::Progress>>> = Arc::default();
    let mut lo = LoadOptions::new(args.workload, &wal);
    lo.tablets = args.tablets;
    lo.rate = offered;
    lo.duration = Some(args.duration());
    lo.accounts = args.accounts;
    lo.connections = args.connections;
    lo.session_dir = Some(dir.join("sessions"));
    lo.sample_every = args.sample_every;
    lo.sync = args.source_sync;
    lo.heartbeat_interval = args.heartbeat_interval;
    lo.samples = Some(tx);
    lo.source_safe = Some(source_tx);

    // Start-up is not steady state: the generator writes the bank's initial balances and a
    // heartbeat on every tablet, then (in `ready`) waits until the applier's safe time is
    // initialized — the shipper found every tablet and the target applied a record of each —
    // before its timed load starts; the measured interval starts there too.
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
    let ready_sock = asock.clone();
    let ready = move || -> Result<()> {
        let a = Api::new(&ready_sock);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Answered as soon as a safe time is published (≥ 1), or after a second.
        while a.safe_time_at("/v1/safe-time?wait-for=1&wait=1s")? == 0 {
            if Instant::now() >= deadline {
                bail!(
                    "the applier's safe time was not initialized within 60 s of the first records"
                );
            }
        }
        let _ = ready_tx.send(());
        Ok(())
    };
    let (st2, r2) = (stop.clone(), report.clone());
    let load_t = std::thread::Builder::new()
        .name("load-gen".into())
        .spawn(move || {
            load::run_when_ready(lo, &st2, ready, |p| {
                *r2.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.clone());
            })
        })?;
    // Wait for `ready` (or the generator failing before it).
    if ready_rx.recv().is_err() {
        give_up.store(true, Ordering::Relaxed);
        return match load_t.join() {
            Ok(Err(e)) => Err(e.context("load generator (before the load started)")),
            _ => bail!("the load generator stopped before the load started"),
        };
    }
    // Scraped outside the CPU-measured interval: rendering the metrics costs the applier.
    let stages0 = admin.stage_lag();
    let (cpu_a0, cpu_s0, cpu_b0) = (
        cpu::snapshot(Some(applier.pid())),
        cpu::snapshot(Some(shipper.pid())),
        cpu::snapshot(None),
    );
    let applied0 = admin.applied_records()?;
    let t_start = Instant::now();
    let rss_sampler = match args.soak {
        true => Some(rss::Sampler::start(
            applier.pid(),
            shipper.pid(),
            args.rss_every,
        )?),
        false => None,
    };
    // A soak prints a line every 30 s (with the daemons' RSS), other runs every second.
    let report_every = Duration::from_secs(if args.soak { 30 } else { 1 });
    let (mut last_a, mut last_t) = (applied0, Instant::now());
    let mut last_check = Instant::now();
    while !load_t.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            if let Err(e) = applier.check_alive().and_then(|()| shipper.check_alive()) {
                stop.store(true, Ordering::Relaxed);
                give_up.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        if last_t.elapsed() < report_every {
            continue;
        }
        let a = admin.applied_records().unwrap_or(last_a);
        let safe = admin.safe_time().unwrap_or(0);
        let now_us = micros_since_epoch(SystemTime::now());
        let dt = last_t.elapsed().as_secs_f64();
        let rss_now = match args.soak {
            true => format!(
                "  RSS applier {} shipper {}",
                fmt_mib(rss::rss_bytes(applier.pid()).unwrap_or(0)),
                fmt_mib(rss::rss_bytes(shipper.pid()).unwrap_or(0))
            ),
            false => String::new(),
        };
        println!(
            "   {:>5.1}s {:>9} txn/s {:>10.0} applied rec/s  safe-time lag {}{rss_now}",
            t_start.elapsed().as_secs_f64(),
            // `-` until its first report.
            report
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map_or("-".to_string(), |p| format!("{:.0}", p.interval_txn_per_s)),
            a.saturating_sub(last_a) as f64 / dt,
            if safe == 0 {
                "-".to_string()
            } else {
                fmt_ns(now_us.saturating_sub(safe >> 12).saturating_mul(1000))
            }
        );
        (last_a, last_t) = (a, Instant::now());
    }
    let summary = load_t
        .join()
        .map_err(|_| anyhow::anyhow!("the load thread panicked"))??;
    let t_load_end = Instant::now();
    let rss = rss_sampler.map(rss::Sampler::finish).unwrap_or_default();
    let load_s = (t_load_end - t_start).as_secs_f64();
    let applied1 = admin.applied_records()?;
    let last_ht = summary
        .tablet_ends
        .iter()
        .filter_map(|t| t.last_ht)
        .min()
        .map_or(0, |h| h.0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if admin.safe_time()? >= last_ht {
            break;
        }
        applier.check_alive()?;
        shipper.check_alive()?;
        if Instant::now() > deadline {
            give_up.store(true, Ordering::Relaxed);
            // A soak measures memory during the load: a target that fell behind (a busy
            // machine) is reported with it, not a reason to drop the samples.
            if !args.soak {
                bail!("the safe time did not reach the end of the load within 120 s");
            }
            println!(
                "   the safe time did not reach the end of the load within 120 s (reported below)"
            );
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let catch_up = t_load_end.elapsed();
    let (cpu_a1, cpu_s1, cpu_b1) = (
        cpu::snapshot(Some(applier.pid())),
        cpu::snapshot(Some(shipper.pid())),
        cpu::snapshot(None),
    );
    let stages = stage_lag::between(&stages0, &admin.stage_lag());
    let wall = t_start.elapsed().as_secs_f64();
    // Everything is visible now; whatever the sampler still holds resolves on its next poll.
    let gu = give_up.clone();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10));
        gu.store(true, Ordering::Relaxed);
    });
    let s = sampler_t
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))??;
    drop(watchdog);
    for d in [&mut shipper, &mut applier] {
        if let Err(e) = d.stop(Duration::from_secs(10)) {
            eprintln!("warning: {e:#}");
        }
    }
    let link = proxy.map(|p| LinkStats {
        spec: p.impairment().to_string(),
        seed: args.seed,
        proxy: crate::ship::describe_proxy(&p.stats()),
    });

    Ok(Step {
        label: label.to_string(),
        offered,
        txn_per_s: summary.txn_per_s,
        mb_per_s: summary.mb_per_s,
        records_per_s: summary.records as f64 / summary.elapsed_s.max(1e-9),
        txns_committed: summary.txns_committed,
        txns_aborted: summary.txns_aborted,
        apply_records_per_s: applied1.saturating_sub(applied0) as f64 / load_s.max(1e-9),
        catch_up_ms: catch_up.as_secs_f64() * 1e3,
        sustained_txn_per_s: {
            let rps = summary.records as f64 / summary.elapsed_s.max(1e-9);
            let aps = applied1.saturating_sub(applied0) as f64 / load_s.max(1e-9);
            summary.txn_per_s * (aps / rps.max(1.0)).min(1.0)
        },
        lag: LagUs::of(&s.hist),
        source_lag: LagUs::of(&s.source_hist),
        stage_lag: stages,
        samples_skipped_warmup: s.skipped_warmup,
        samples_unresolved: s.unresolved,
        polls_per_s: s.polls as f64 / wall.max(1e-9),
        us_per_poll: s.poll_busy.as_secs_f64() * 1e6 / (s.polls.max(1) as f64),
        cpu_applier: cpu::usage(&cpu_a0, &cpu_a1),
        cpu_shipper: cpu::usage(&cpu_s0, &cpu_s1),
        cpu_bench: cpu::usage(&cpu_b0, &cpu_b1),
        wall_s: wall,
        loadavg_end: loadavg(),
        link,
        rss,
        bound,
    })
}

/// The impaired link of a run: its spec, seed and the proxy's counts at the end.
#[derive(Clone, Debug, Serialize)]
pub struct LinkStats {
    pub spec: String,
    pub seed: u64,
    pub proxy: String,
}

/// Appends the `--quic` lines to both configs and, with `--impair`, starts the impairment
/// proxy in front of the applier and points the shipper at it.
fn link_through(args: &E2eArgs, c: &LocalCluster) -> Result<Option<ImpairProxy>> {
    if !args.quic.is_empty() {
        let table = format!("\n[quic]\n{}\n", args.quic.join("\n"));
        for f in [&c.applier_cfg, &c.shipper_cfg] {
            let mut text = std::fs::read_to_string(f)?;
            text.push_str(&table);
            std::fs::write(f, text)?;
        }
    }
    let Some(imp) = &args.impair else {
        return Ok(None);
    };
    let applier = std::net::SocketAddr::from(([127, 0, 0, 1], c.port));
    let proxy = ImpairProxy::start_on_thread(applier, imp.clone(), args.seed)?;
    let text = std::fs::read_to_string(&c.shipper_cfg)?;
    let line = format!("applier = \"{applier}\"");
    if !text.contains(&line) {
        bail!(
            "{} has no line {line}: cannot point the shipper at the proxy",
            c.shipper_cfg.display()
        );
    }
    let text = text.replace(&line, &format!("applier = \"{}\"", proxy.local_addr()));
    std::fs::write(&c.shipper_cfg, text)?;
    Ok(Some(proxy))
}

fn fmt_mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1u32 << 20))
}

fn print_step(s: &Step) {
    println!(
        "   {}: {} txn/s ({} committed, {} aborted), {:.2} MB/s, {} records/s; applied {} records/s; caught up {:.1} ms after the load stopped",
        s.label,
        fmt_int(s.txn_per_s as u64),
        fmt_int(s.txns_committed),
        fmt_int(s.txns_aborted),
        s.mb_per_s,
        fmt_int(s.records_per_s as u64),
        fmt_int(s.apply_records_per_s as u64),
        s.catch_up_ms
    );
    println!(
        "   safe-time lag over {} samples: p50 {} p99 {} p999 {} max {} (mean {}); {} warm-up samples skipped, {} unresolved; {:.0} safe-time requests/s at {:.0} µs each",
        fmt_int(s.lag.count),
        fmt_ns(s.lag.p50_us * 1000),
        fmt_ns(s.lag.p99_us * 1000),
        fmt_ns(s.lag.p999_us * 1000),
        fmt_ns(s.lag.max_us * 1000),
        fmt_ns((s.lag.mean_us * 1000.0) as u64),
        s.samples_skipped_warmup,
        s.samples_unresolved,
        s.polls_per_s,
        s.us_per_poll
    );
    println!(
        "   of which at the source (commit → every tablet committed past it): p50 {} p99 {} p999 {} max {} (mean {}) over {} samples",
        fmt_ns(s.source_lag.p50_us * 1000),
        fmt_ns(s.source_lag.p99_us * 1000),
        fmt_ns(s.source_lag.p999_us * 1000),
        fmt_ns(s.source_lag.max_us * 1000),
        fmt_ns((s.source_lag.mean_us * 1000.0) as u64),
        fmt_int(s.source_lag.count),
    );
    if !s.stage_lag.is_empty() {
        println!(
            "   by stage (the applier's histograms, per event, bucket-interpolated): {}",
            stage_lag::describe(&s.stage_lag)
        );
    }
    if let Some(l) = &s.link {
        println!("   link {} (seed {}): {}", l.spec, l.seed, l.proxy);
    }
    println!("   CPU applier {}", s.cpu_applier.describe(4));
    println!("   CPU shipper {}", s.cpu_shipper.describe(4));
    println!("   CPU bench   {}", s.cpu_bench.describe(4));
}

// ---- fdatasync baseline ----

fn fdatasync_baseline(dir: &Path, d: Duration) -> Result<Latency> {
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("fdatasync-baseline");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let buf = vec![0xa5u8; 4096];
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let start = Instant::now();
    let mut off = 0u64;
    while start.elapsed() < d {
        let t = Instant::now();
        f.write_all_at(&buf, off)?;
        // SAFETY: fdatasync on an open file descriptor we own.
        if unsafe { libc::fdatasync(f.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        h.saturating_record(crate::stats::nanos(t.elapsed()).max(1));
        off += 4096;
        if off >= 64 << 20 {
            off = 0;
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(Latency::of_ticks(&h, 1.0))
}

// ---- the command ----

#[derive(Debug, Serialize)]
struct Check {
    what: String,
    actual: f64,
    target: f64,
    pass: bool,
}

#[derive(Debug, Serialize)]
struct Report {
    workload: String,
    tablets: usize,
    source_sync: String,
    heartbeat_interval_ms: f64,
    duration_s: f64,
    warmup_s: f64,
    sample_every: u64,
    lag_probe: LagProbe,
    poll_us: u64,
    connections: usize,
    accounts: u64,
    kernel: String,
    filesystem: String,
    cpus: usize,
    loadavg_start: String,
    fdatasync_4k: Latency,
    steps: Vec<Step>,
    checks: Vec<Check>,
}

fn pass(b: bool) -> &'static str {
    if b {
        "PASS"
    } else {
        "MISS"
    }
}

pub fn run(args: &E2eArgs) -> Result<()> {
    if args.tablets == 0 {
        bail!("--tablets must be at least 1");
    }
    if args.soak && args.rate.is_some_and(|r| r <= 0.0) {
        bail!("--soak needs a steady offered rate: --rate must be > 0");
    }
    if !matches!(args.workload, Workload::Bank | Workload::Kv) {
        bail!("--workload must be bank or kv");
    }
    let exe = tidelog_exe()?;
    let parent = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir()?,
    };
    let base = parent.join(format!(".tidelog-bench-e2e-{}", std::process::id()));
    std::fs::create_dir_all(&base).with_context(|| format!("creating {}", base.display()))?;
    let result = sweep(args, &exe, &base);
    if args.keep || result.is_err() {
        println!("run directory kept: {}", base.display());
    } else if let Err(e) = std::fs::remove_dir_all(&base) {
        eprintln!("warning: removing {}: {e}", base.display());
    }
    result
}

fn sweep(args: &E2eArgs, exe: &Path, base: &Path) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let la0 = loadavg();
    println!(
        "tidelog-bench e2e: {} workload, {} tablets, source sync {}, heartbeats after {:?} idle, {}s per run ({}s warm-up not sampled), every {}th commit sampled, {}",
        args.workload,
        args.tablets,
        args.source_sync,
        args.heartbeat_interval,
        args.duration().as_secs_f64(),
        args.warmup.as_secs_f64(),
        args.sample_every,
        match args.lag_probe {
            LagProbe::Wait => "safe time followed by wait-for requests".to_string(),
            LagProbe::Poll => format!("safe time polled every {} µs", args.poll_us),
        }
    );
    println!(
        "  {} CPUs, kernel {}, {} at {}, load average at start {la0}",
        cpus,
        kernel_release(),
        filesystem_of(base),
        base.display()
    );
    let fsync = fdatasync_baseline(base, Duration::from_secs(2))?;
    println!(
        "  baseline: 4 KiB pwrite + fdatasync: p50 {} p99 {} p999 {} ({} in 2 s)",
        fmt_ns(fsync.p50_ns),
        fmt_ns(fsync.p99_ns),
        fmt_ns(fsync.p999_ns),
        fmt_int(fsync.count)
    );
    let mut steps = Vec::new();
    let mut n = 0usize;
    let mut step = |label: &str, rate: f64, steps: &mut Vec<Step>| -> Result<()> {
        n += 1;
        let s = run_step(args, exe, &base.join(format!("run-{n}")), label, rate)?;
        print_step(&s);
        steps.push(s);
        Ok(())
    };
    if args.soak {
        step("soak", args.rate.unwrap_or(SOAK_RATE), &mut steps)?;
    } else if let Some(r) = args.rate {
        step(if r > 0.0 { "fixed" } else { "max" }, r, &mut steps)?;
    } else {
        step("max", 0.0, &mut steps)?;
        // What the pipeline sustains with the target keeping up: the generator's rate scaled
        // down by how far the apply rate fell short of the record rate it was offered.
        let m = &steps[0];
        let keep_up = (m.apply_records_per_s / m.records_per_s.max(1.0)).min(1.0);
        let max = m.txn_per_s * keep_up;
        println!(
            "   sustained max: {} txn/s generated × {:.3} (applied / generated records) = {} txn/s; the sweep offers 10/50/90% of that",
            fmt_int(m.txn_per_s as u64),
            keep_up,
            fmt_int(max as u64)
        );
        for pct in [10u32, 50, 90] {
            step(
                &format!("{pct}% of max"),
                max * f64::from(pct) / 100.0,
                &mut steps,
            )?;
        }
        step("budget", args.budget_rate, &mut steps)?;
    }

    println!();
    println!(
        "== summary: {} over {} tablets, source sync {}, applier sync batch, apply-nice {}, store-nice {}, apply-threads {}, runtime-threads {}, received logs {}, 1 lane, loopback QUIC+mTLS{}; fdatasync 4 KiB p50 {} p99 {}; load average at end {} ==",
        args.workload,
        args.tablets,
        args.source_sync,
        args.apply_nice,
        args.store_nice,
        match args.apply_threads {
            0 => "default".to_string(),
            n => n.to_string(),
        },
        match args.runtime_threads {
            0 => "default".to_string(),
            n => n.to_string(),
        },
        if args.received_direct_io {
            "O_DIRECT"
        } else {
            "buffered"
        },
        match (&args.impair, args.quic.is_empty()) {
            (None, true) => String::new(),
            (imp, _) => format!(
                " (link {}; [quic] {})",
                imp.as_ref()
                    .map_or("straight".to_string(), |i| format!("{i}, seed {}", args.seed)),
                if args.quic.is_empty() {
                    "defaults".to_string()
                } else {
                    args.quic.join(", ")
                }
            ),
        },
        fmt_ns(fsync.p50_ns),
        fmt_ns(fsync.p99_ns),
        loadavg()
    );
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7}",
        "run",
        "offered",
        "txn/s",
        "kept-up",
        "MB/s",
        "apply r/s",
        "lag p50",
        "p99",
        "p999",
        "max",
        "src p50",
        "catch-up",
        "×fsync",
        "CPU app",
        "CPU shp",
        "CPU gen"
    );
    for s in &steps {
        println!(
            "{:<12} {:>9} {:>9} {:>9} {:>7.2} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7.1}ms {:>7.1}× {:>6.2}s {:>6.2}s {:>6.2}s",
            s.label,
            if s.offered > 0.0 { fmt_int(s.offered as u64) } else { "max".into() },
            fmt_int(s.txn_per_s as u64),
            fmt_int(s.sustained_txn_per_s as u64),
            s.mb_per_s,
            fmt_int(s.apply_records_per_s as u64),
            fmt_ns(s.lag.p50_us * 1000),
            fmt_ns(s.lag.p99_us * 1000),
            fmt_ns(s.lag.p999_us * 1000),
            fmt_ns(s.lag.max_us * 1000),
            fmt_ns(s.source_lag.p50_us * 1000),
            s.catch_up_ms,
            (s.lag.p50_us * 1000) as f64 / fsync.p50_ns.max(1) as f64,
            s.cpu_applier.total_s,
            s.cpu_shipper.total_s,
            s.cpu_bench.total_s,
        );
    }
    println!("(kept-up = txn/s × min(1, applied ÷ generated records/s); lag = source commit → visible at the target's safe time; src p50 = its part at the source: commit → every tablet committed past it; ×fsync = lag p50 / fdatasync p50; CPU over load + catch-up; CPU gen = this process: generator + sampler)");

    let mut checks = Vec::new();
    if let Some(max) = steps.iter().find(|s| s.label == "max") {
        checks.push(Check {
            what: format!("max txn/s generated ≥ {}", fmt_int(args.budget_max as u64)),
            actual: max.txn_per_s,
            target: args.budget_max,
            pass: max.txn_per_s >= args.budget_max,
        });
        checks.push(Check {
            what: format!("max txn/s applied ≥ {}", fmt_int(args.budget_max as u64)),
            actual: max.sustained_txn_per_s,
            target: args.budget_max,
            pass: max.sustained_txn_per_s >= args.budget_max,
        });
    }
    if let Some(b) = steps.iter().find(|s| s.label == "budget") {
        checks.push(Check {
            what: format!(
                "at {} txn/s: achieved ≥ 95% of offered",
                fmt_int(b.offered as u64)
            ),
            actual: b.txn_per_s,
            target: b.offered * 0.95,
            pass: b.txn_per_s >= b.offered * 0.95,
        });
        checks.push(Check {
            what: format!("at {} txn/s: lag p99 ≤ 10 ms", fmt_int(b.offered as u64)),
            actual: b.lag.p99_us as f64 / 1e3,
            target: 10.0,
            pass: b.lag.p99_us <= 10_000,
        });
        checks.push(Check {
            what: format!("at {} txn/s: lag p50 ≤ 3 ms", fmt_int(b.offered as u64)),
            actual: b.lag.p50_us as f64 / 1e3,
            target: 3.0,
            pass: b.lag.p50_us <= 3_000,
        });
    }
    // With `--impair`, every run's lag p99 (and no sample left unresolved).
    if let Some(imp) = &args.impair {
        let limit_ms = args.impair_lag_p99.as_secs_f64() * 1e3;
        for s in &steps {
            let c = Check {
                what: format!("{}: lag p99 ≤ {limit_ms:.0} ms through {imp}", s.label),
                actual: s.lag.p99_us as f64 / 1e3,
                target: limit_ms,
                pass: (s.lag.p99_us as f64 / 1e3) <= limit_ms && s.samples_unresolved == 0,
            };
            checks.push(c);
        }
    }
    for s in steps.iter().filter(|s| s.label == "soak") {
        checks.extend(soak_checks(args, s));
    }
    for c in &checks {
        println!(
            "{}  {:<40} actual {:.2}, target {:.2}",
            pass(c.pass),
            c.what,
            c.actual,
            c.target
        );
    }
    let (missed, total_checks) = (checks.iter().filter(|c| !c.pass).count(), checks.len());
    if let Some(path) = &args.json {
        let r = Report {
            workload: args.workload.to_string(),
            tablets: args.tablets,
            source_sync: args.source_sync.to_string(),
            heartbeat_interval_ms: args.heartbeat_interval.as_secs_f64() * 1e3,
            duration_s: args.duration().as_secs_f64(),
            warmup_s: args.warmup.as_secs_f64(),
            sample_every: args.sample_every,
            lag_probe: args.lag_probe,
            poll_us: args.poll_us,
            connections: args.connections,
            accounts: args.accounts,
            kernel: kernel_release(),
            filesystem: filesystem_of(base),
            cpus,
            loadavg_start: la0,
            fdatasync_4k: fsync,
            steps,
            checks,
        };
        std::fs::write(path, serde_json::to_vec_pretty(&r)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("JSON written to {}", path.display());
    }
    if missed > 0 {
        bail!("{missed} of {total_checks} budgets missed");
    }
    Ok(())
}

/// `--soak`: prints the RSS summary and the bound, and returns the two memory budgets (in
/// MiB) — end within [`SOAK_DRIFT`] of the reference, largest sample below the bound.
fn soak_checks(args: &E2eArgs, s: &Step) -> Vec<Check> {
    let mib = |b: u64| b as f64 / f64::from(1u32 << 20);
    let reference_s = args.soak_reference.as_secs_f64();
    let (Some(first), Some(end)) = (s.rss.first(), s.rss.last()) else {
        return vec![Check {
            what: "RSS sampled during the soak".into(),
            actual: 0.0,
            target: 1.0,
            pass: false,
        }];
    };
    let at_ref = rss::at(&s.rss, reference_s).unwrap_or(*first);
    // The budget compares the highest RSS of the minute before each point: one sample can
    // fall on either side of a short burst (a batch of transactions waiting for a lagging
    // tablet, returned to the kernel SOAK_WINDOW later), the minute's high-water mark does not.
    let window = SOAK_WINDOW.as_secs_f64();
    let ref_max =
        rss::applier_max_between(&s.rss, at_ref.t_s - window, at_ref.t_s).unwrap_or(at_ref);
    let end_max = rss::applier_max_between(&s.rss, end.t_s - window, end.t_s).unwrap_or(*end);
    let max_a = s.rss.iter().map(|x| x.applier).max().unwrap_or(0);
    let max_s = s.rss.iter().map(|x| x.shipper).max().unwrap_or(0);
    println!();
    println!(
        "== soak: {} samples every {:?} over {:.0} s of load ==",
        s.rss.len(),
        args.rss_every,
        end.t_s
    );
    println!(
        "   load: {} txn/s of {} offered ({:.1} %){}",
        fmt_int(s.txn_per_s as u64),
        fmt_int(s.offered as u64),
        100.0 * s.txn_per_s / s.offered.max(1.0),
        if s.txn_per_s < 0.95 * s.offered {
            " — the offered rate was NOT held"
        } else {
            ""
        }
    );
    println!(
        "   target: safe-time lag p50 {} p99 {}; {}",
        fmt_ns(s.lag.p50_us * 1000),
        fmt_ns(s.lag.p99_us * 1000),
        if s.catch_up_ms >= 120_000.0 {
            "NOT caught up 120 s after the load stopped: the applier did not keep up".to_string()
        } else {
            format!(
                "caught up {:.1} s after the load stopped",
                s.catch_up_ms / 1e3
            )
        }
    );
    println!("   {:<34} {:>12} {:>12}", "RSS (MiB)", "applier", "shipper");
    for (what, a, sh) in [
        (
            format!("at start ({:.0} s)", first.t_s),
            first.applier,
            first.shipper,
        ),
        (
            format!("at {:.0} s (reference)", at_ref.t_s),
            at_ref.applier,
            at_ref.shipper,
        ),
        (
            format!("max in the minute to {:.0} s", at_ref.t_s),
            ref_max.applier,
            ref_max.shipper,
        ),
        (
            format!("at end ({:.0} s)", end.t_s),
            end.applier,
            end.shipper,
        ),
        (
            format!("max in the minute to {:.0} s", end.t_s),
            end_max.applier,
            end_max.shipper,
        ),
        ("max over the run".to_string(), max_a, max_s),
    ] {
        println!("   {what:<34} {:>12.1} {:>12.1}", mib(a), mib(sh));
    }
    let mut checks = Vec::new();
    if end.t_s < reference_s {
        println!(
            "   the load ended before the reference time ({reference_s:.0} s): the drift is measured from the last sample"
        );
    }
    let drift = (mib(end_max.applier) - mib(ref_max.applier)) / mib(ref_max.applier).max(1e-9);
    println!(
        "   applier RSS drift, minute to {:.0} s → minute to {:.0} s: {:+.1} %",
        at_ref.t_s,
        end.t_s,
        drift * 100.0
    );
    checks.push(Check {
        what: format!(
            "applier RSS at end within {:.0} % of RSS at {:.0} s (MiB; each the minute's max)",
            SOAK_DRIFT * 100.0,
            at_ref.t_s
        ),
        actual: mib(end_max.applier),
        target: mib(ref_max.applier) * (1.0 + SOAK_DRIFT),
        pass: drift.abs() <= SOAK_DRIFT,
    });
    if let Some(b) = &s.bound {
        println!(
            "   documented bound (applier/STORE.md, \"Memory\"), from the run's applier.toml:"
        );
        for (part, bytes) in &b.parts {
            println!("     {part:<58} {:>9.1} MiB", mib(*bytes));
        }
        println!("     {:<58} {:>9.1} MiB", "total", mib(b.total()));
        checks.push(Check {
            what: "applier RSS max below the documented bound (MiB)".into(),
            actual: mib(max_a),
            target: mib(b.total()),
            pass: max_a < b.total(),
        });
    }
    checks
}
