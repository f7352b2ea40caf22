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
//! run's `applier.toml` (`tidelog_config::ApplierBound`, `applier/STORE.md`, "Memory").
//! Budget: the applier's RSS at the end within 10 % of its RSS at the reference, and its
//! largest sample below the bound.
//!
//! Every run exits non-zero when a budget is missed.
//!
//! ```text
//!  e2e/
//!    mod.rs       the arguments, the command's entry (`run`), the bench's exe
//!    sweep.rs     the runs, the summary table, the budget checks, JSON
//!    step.rs      one run: cluster, load, catch-up, what it measured
//!    sampler.rs   the lag sampler
//!    admin.rs     what the benches read from the applier's admin socket
//!    baseline.rs  the fdatasync baseline
//!    soak.rs      --soak's memory budgets
//! ```

mod admin;
mod baseline;
mod sampler;
mod soak;
mod step;
mod sweep;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use tidelog_testkit::load::Workload;
use tidelog_testkit::Impairment;
use tidelog_wal::SyncPolicy;

pub use sampler::LagProbe;

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
pub(super) const SOAK_DURATION: Duration = Duration::from_secs(30 * 60);
pub(super) const SOAK_RATE: f64 = 10_000.0;

/// `--soak`: the applier's RSS at the end may differ from its RSS at the reference by at
/// most this fraction.
pub(super) const SOAK_DRIFT: f64 = 0.10;

/// `--soak`: the RSS "at" a time is the highest sample of the window ending there.
pub(super) const SOAK_WINDOW: Duration = Duration::from_secs(60);

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
    let result = sweep::sweep(args, &exe, &base);
    if args.keep || result.is_err() {
        println!("run directory kept: {}", base.display());
    } else if let Err(e) = std::fs::remove_dir_all(&base) {
        eprintln!("warning: removing {}: {e}", base.display());
    }
    result
}
