//! `tidelog-bench`: benchmarks and load generators for tidelog.
//!
//! ```text
//! tidelog-bench wal --record-size 1024 --sync none --duration 10s [--dir DIR] [--json]
//! tidelog-bench wal --all --duration 5s
//! ```

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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Wal(args) => wal_bench::run(&args),
    }
}
