//! `tidelog-bench load`: a thin CLI over the load generators in `tidelog_testkit::load`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use clap::Args;
use tidelog_testkit::load::{self, LoadOptions, Workload};
use tidelog_wal::SyncPolicy;

use crate::stats::parse_size;

#[derive(Debug, Args)]
pub struct LoadArgs {
    /// bank (transfers, constant total), kv (random puts/deletes) or ordered (per-session
    /// increasing counters).
    #[arg(long)]
    workload: Workload,
    /// The source WAL directory; tablets t0..t{N-1} are created under it.
    #[arg(long)]
    wal_dir: PathBuf,
    #[arg(long, default_value_t = 4)]
    tablets: usize,
    /// The last K tablets get no transactions, only heartbeats.
    #[arg(long, default_value_t = 0)]
    idle_tablets: usize,
    /// Transactions per second (0 = as fast as possible).
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// How long to run (e.g. `10s`, `500ms`, `1m`).
    #[arg(long, default_value = "10s")]
    duration: humantime::Duration,
    /// Stop after this many transactions.
    #[arg(long)]
    max_txns: Option<u64>,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Sync policy of every WAL commit: none, batch or always.
    #[arg(long, default_value = "batch")]
    sync: SyncPolicy,
    /// Segment file size (bytes, or with a KiB/MiB/GiB suffix).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Probability that a distributed transaction aborts.
    #[arg(long, default_value_t = 0.05)]
    abort_rate: f64,
    /// A tablet idle this long gets a heartbeat.
    #[arg(long, default_value = "50ms")]
    heartbeat_interval: humantime::Duration,
    /// Client connections (sessions) for bank and kv.
    #[arg(long, default_value_t = 256)]
    connections: usize,
    /// Connect-id state directory (default: $TMPDIR/tidelog-load-sessions).
    #[arg(long)]
    session_dir: Option<PathBuf>,
    /// bank: number of accounts.
    #[arg(long, default_value_t = 1000)]
    accounts: u64,
    /// bank: probability of a transfer within one tablet.
    #[arg(long, default_value_t = 0.2)]
    local_rate: f64,
    /// kv: number of keys.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// kv: value size in bytes.
    #[arg(long, default_value_t = 100)]
    value_size: usize,
    /// ordered: number of sessions.
    #[arg(long, default_value_t = 16)]
    sessions: usize,
}

pub fn run(a: LoadArgs) -> anyhow::Result<()> {
    let mut o = LoadOptions::new(a.workload, a.wal_dir);
    o.tablets = a.tablets;
    o.idle_tablets = a.idle_tablets;
    o.rate = a.rate;
    o.duration = Some(a.duration.into());
    o.max_txns = a.max_txns;
    o.seed = a.seed;
    o.sync = a.sync;
    o.segment_size = a.segment_size;
    o.abort_rate = a.abort_rate;
    o.heartbeat_interval = a.heartbeat_interval.into();
    o.connections = a.connections;
    o.session_dir = a.session_dir;
    o.accounts = a.accounts;
    o.local_rate = a.local_rate;
    o.keys = a.keys;
    o.value_size = a.value_size;
    o.sessions = a.sessions;
    let stop = AtomicBool::new(false);
    let summary = load::run(o, &stop, |p| {
        eprintln!(
            "[{:>6.1}s] committed {} aborted {} records {} {:.1} MB  {:.0} txn/s",
            p.elapsed.as_secs_f64(),
            p.committed,
            p.aborted,
            p.records,
            p.bytes as f64 / 1e6,
            p.interval_txn_per_s
        );
    })?;
    println!("{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}
