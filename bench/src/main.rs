//! `tidelog-bench`: benchmarks and load generators for tidelog.
//!
//! ```text
//! tidelog-bench wal --record-size 1024 --sync none --duration 10s [--dir DIR] [--json]
//! tidelog-bench wal --all --duration 5s
//! tidelog-bench load --workload bank|kv|ordered --wal-dir D --tablets N --rate R --duration D [--seed S]
//! tidelog-bench ship [--total 2GiB] [--tablets 8] [--lanes 1,2] [--sync batch] [--json FILE]
//! tidelog-bench e2e --workload bank|kv --tablets N [--rate R] [--duration D] [--json FILE]
//! tidelog-bench e2e --soak [--rate 10000] [--duration 30m] [--rss-every 5s]
//! tidelog-bench faults [--seed N] [--duration 180s] [--tablets 8] [--rate 2000] [--impair SPEC]
//! tidelog-bench cutover [--sizes 10k,1M,10M] [--json FILE]
//! tidelog-bench trx-status [--commits 10000000] [--data-dir D] [--no-pg] [--json FILE]
//! ```

/// The allocator the `tidelog` binary ships with: the benches that host the applier or call
/// the library in-process measure what runs in production.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

mod cutover;
mod e2e;
mod faults;
mod load_cmd;
mod pgwire;
mod rss;
mod ship;
mod sqlwire;
mod stage_lag;
mod stats;
mod trx_bench;
mod wal_bench;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "tidelog-bench", version, about = "tidelog benchmarks")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Single-tablet WAL writer throughput and commit latency, against a raw baseline.
    Wal(wal_bench::WalArgs),
    /// Write source WALs like a transactional database would (bank, kv, ordered workloads).
    Load(load_cmd::LoadArgs),
    /// Ships pre-written WAL to an applier on loopback; raw quinn and TCP beside it.
    Ship(ship::ShipArgs),
    /// Source load → tidelog ship → tidelog apply: txn/s, apply rate and safe-time lag.
    E2e(e2e::E2eArgs),
    /// Seeded fault run: bank load through the impairment proxy while the daemons are
    /// SIGKILLed, the link partitioned and the applier's disk filled; checks exactly once,
    /// the bank total at every consistent read and recovery without a restart.
    Faults(faults::FaultsArgs),
    /// Promotion time with 10 k / 1 M / 10 M versions above the cut, and clean-up rate.
    Cutover(cutover::CutoverArgs),
    /// trx_status look-ups on a binlog of millions of commits: library, admin API, and
    /// PostgreSQL's pg_xact_status as the baseline.
    #[command(name = "trx-status")]
    TrxStatus(trx_bench::TrxArgs),
    /// (internal) the applier peer process of `ship`.
    #[command(name = "__applier", hide = true)]
    Applier(ship::ApplierArgs),
    /// (internal) the raw quinn / TCP sink peer process of `ship`.
    #[command(name = "__sink", hide = true)]
    Sink(ship::SinkArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // As the daemons do (and inherited by the ones it starts): see `tidelog_memory`.
    if let Err(e) = tidelog_memory::set_up() {
        eprintln!("warning: cannot turn transparent huge pages off: {e}");
    }
    match cli.cmd {
        Cmd::Wal(args) => wal_bench::run(&args),
        Cmd::Load(args) => load_cmd::run(args),
        Cmd::Ship(args) => ship::run(&args),
        Cmd::E2e(args) => e2e::run(&args),
        Cmd::Faults(args) => faults::run(&args),
        Cmd::Cutover(args) => cutover::run(&args),
        Cmd::TrxStatus(args) => trx_bench::run(&args),
        Cmd::Applier(args) => ship::run_applier(&args),
        Cmd::Sink(args) => ship::run_sink(&args),
    }
}
