//! `tidelog-bench`: benchmarks and load generators for tidelog.
//!
//! ```text
//! tidelog-bench wal --record-size 1024 --sync none --duration 10s [--dir DIR] [--json]
//! tidelog-bench wal --all --duration 5s
//! tidelog-bench load --workload bank|kv|ordered --wal-dir D --tablets N --rate R --duration D [--seed S]
//! ```

mod load_cmd;
mod stats;
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Wal(args) => wal_bench::run(&args),
        Cmd::Load(args) => load_cmd::run(args),
    }
}
