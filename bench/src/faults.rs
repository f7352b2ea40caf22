//! `tidelog-bench faults`: the seeded fault run (`tidelog_testkit::fault_run`): bank load
//! through the impairment proxy while the applier and the shipper are SIGKILLed, the link
//! partitioned and the applier's disk filled, on a schedule drawn from `--seed`; prints the
//! faults with their recovery times and the commits lost, then PASS/MISS per check, and
//! exits non-zero on a miss. Run as root for the full-disk fault (it mounts a tmpfs); elsewhere that fault
//! is skipped with a note.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;
use tidelog_testkit::fault_run::{self, FaultRunOptions};
use tidelog_testkit::Impairment;

use crate::e2e::tidelog_exe;
use crate::stats::parse_size;

#[derive(Debug, Args)]
pub struct FaultsArgs {
    /// Draws the schedule, the load and the impairment; printed, so that a run can be
    /// replayed. Default: drawn from the clock.
    #[arg(long)]
    seed: Option<u64>,
    /// How long the load runs; one fault per 20 s of it (at least one of each kind).
    #[arg(long, default_value = "180s", value_parser = humantime::parse_duration)]
    duration: Duration,
    #[arg(long, default_value_t = 8)]
    tablets: usize,
    /// Offered transactions per second.
    #[arg(long, default_value_t = 2000.0)]
    rate: f64,
    #[arg(long, default_value_t = 1000)]
    accounts: u64,
    /// The link between the shipper and the applier outside partitions.
    #[arg(long, default_value = "loss=1%,delay=5ms,jitter=2ms,reorder=2%")]
    impair: Impairment,
    /// Size of the tmpfs the applier's data-dir is on.
    #[arg(long, default_value = "1GiB", value_parser = parse_size)]
    tmpfs_size: u64,
    /// Each fault's recovery budget (the safe time passes the fault's end within it).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    recover_within: Duration,
    /// Parent of the run directory (default: the current directory; the run goes in a
    /// `.tidelog-bench-faults-<pid>` directory below it, removed at the end unless `--keep`
    /// or the run missed).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    keep: bool,
}

pub fn run(args: &FaultsArgs) -> Result<()> {
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() ^ u64::from(d.subsec_nanos()))
    });
    let parent = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir()?,
    };
    let dir = parent.join(format!(".tidelog-bench-faults-{}", std::process::id()));
    let mut o = FaultRunOptions::new(&tidelog_exe()?, &dir);
    o.seed = seed;
    o.duration = args.duration;
    o.tablets = args.tablets;
    o.rate = args.rate;
    o.accounts = args.accounts;
    o.impairment = args.impair.clone();
    o.tmpfs_size = args.tmpfs_size;
    o.recover_within = args.recover_within;
    o.verbose = true;
    println!(
        "tidelog-bench faults: seed {seed} (replay with --seed {seed}), bank over {} tablets at {} txn/s for {}, link {}, run directory {}",
        o.tablets,
        o.rate,
        humantime::format_duration(o.duration),
        o.impairment,
        dir.display()
    );
    for (i, f) in fault_run::schedule::plan(seed, o.duration)
        .iter()
        .enumerate()
    {
        println!(
            "  plan {:>2}: {:<13} at {:>6.1}s for {:.1}s",
            i + 1,
            f.kind.name(),
            f.at.as_secs_f64(),
            f.length.as_secs_f64()
        );
    }
    let result = fault_run::run(&o);
    let passed = result.as_ref().is_ok_and(|r| r.passed());
    if args.keep || !passed {
        println!("run directory kept: {}", dir.display());
    } else if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("warning: removing {}: {e}", dir.display());
    }
    let report = result?;
    println!();
    print!("{report}");
    if !report.passed() {
        bail!("the fault run missed a check (seed {seed})");
    }
    Ok(())
}
