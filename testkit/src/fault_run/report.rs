//! What a fault run found: each fault's outcome and a PASS/MISS per check ([`FaultReport`]),
//! printed as the table of `tidelog-bench faults`.

use std::fmt;
use std::time::Duration;

use tidelog_wal::HybridTime;

use crate::impair::Impairment;

use super::schedule::{FaultKind, PlannedFault};

/// What became of one fault.
#[derive(Clone, Debug)]
pub struct FaultOutcome {
    pub planned: PlannedFault,
    /// When it started, from the start of the load.
    pub at: Duration,
    /// How long it lasted: SIGKILL to restart, partition on to off, ballast placed to
    /// removed.
    pub length: Duration,
    /// From its end until the safe time passed the wall clock of its end (`None`: not
    /// within the budget).
    pub recovered_in: Option<Duration>,
    /// The largest safe-time lag seen from its start until it recovered.
    pub max_lag: Duration,
    /// Source commits with a commit_ht from its start until it recovered.
    pub commits: u64,
    /// Of those, how many the target's binlog lacks.
    pub lost: u64,
    /// Why it was not injected.
    pub skipped: Option<String>,
    /// What happened (the disk episode's details).
    pub note: String,
    /// A `disk_full` episode: whether the applier went on by itself (reported
    /// `disk_full`, left it, same process).
    pub no_restart: Option<bool>,
    /// From its start until it recovered, as hybrid times (what the check of its commits
    /// looks at).
    pub(super) window: (HybridTime, HybridTime),
}

/// A check's verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Pass,
    Miss,
    /// Not run here (the tmpfs could not be mounted); not a miss.
    Skip,
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Verdict::Pass => "PASS",
            Verdict::Miss => "MISS",
            Verdict::Skip => "SKIP",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Check {
    pub name: String,
    pub verdict: Verdict,
    pub detail: String,
}

pub(super) fn check(name: &str, pass: bool, detail: String) -> Check {
    Check {
        name: name.to_string(),
        verdict: if pass { Verdict::Pass } else { Verdict::Miss },
        detail,
    }
}

/// The run's result: printed as a table by its `Display`.
#[derive(Clone, Debug)]
pub struct FaultReport {
    pub seed: u64,
    pub duration: Duration,
    pub tablets: usize,
    pub rate: f64,
    pub impairment: Impairment,
    pub faults: Vec<FaultOutcome>,
    pub checks: Vec<Check>,
    /// Transactions committed by the load.
    pub txns_committed: u64,
    /// Source records, over all tablets.
    pub records: u64,
    /// Source records the target did not apply (computed per tablet).
    pub records_lost: u64,
    /// Source records applied more than once.
    pub records_applied_twice: u64,
    /// The proxy's counts at the end.
    pub link: String,
    /// Where the tmpfs could not be mounted: why.
    pub disk_note: Option<String>,
}

impl FaultReport {
    /// No check missed.
    pub fn passed(&self) -> bool {
        self.checks.iter().all(|c| c.verdict != Verdict::Miss)
    }

    /// The faults of each kind that were injected (not skipped).
    pub fn injected(&self, kind: FaultKind) -> usize {
        self.faults
            .iter()
            .filter(|f| f.planned.kind == kind && f.skipped.is_none())
            .count()
    }
}

pub(super) fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

impl fmt::Display for FaultReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fault run, seed {} (replay: --seed {}): bank over {} tablets at {} txn/s for {}, link {}",
            self.seed,
            self.seed,
            self.tablets,
            self.rate,
            secs(self.duration),
            self.impairment
        )?;
        if let Some(n) = &self.disk_note {
            writeln!(f, "NOTE: disk_full faults skipped: {n}")?;
        }
        writeln!(
            f,
            "{:>2}  {:<13} {:>7} {:>7} {:>10} {:>8} {:>9} {:>5}  note",
            "#", "fault", "at", "length", "recovered", "max lag", "commits", "lost"
        )?;
        for (i, o) in self.faults.iter().enumerate() {
            if let Some(why) = &o.skipped {
                writeln!(
                    f,
                    "{:>2}  {:<13} {:>7} {:>7} {:>10} {:>8} {:>9} {:>5}  SKIPPED: {why}",
                    i + 1,
                    o.planned.kind.name(),
                    secs(o.planned.at),
                    "-",
                    "-",
                    "-",
                    "-",
                    "-"
                )?;
                continue;
            }
            writeln!(
                f,
                "{:>2}  {:<13} {:>7} {:>7} {:>10} {:>8} {:>9} {:>5}  {}",
                i + 1,
                o.planned.kind.name(),
                secs(o.at),
                secs(o.length),
                o.recovered_in.map_or("NO".to_string(), secs),
                secs(o.max_lag),
                o.commits,
                o.lost,
                o.note
            )?;
        }
        writeln!(
            f,
            "records lost {} and applied twice {} of {} source records; {} transactions committed; link: {}",
            self.records_lost,
            self.records_applied_twice,
            self.records,
            self.txns_committed,
            self.link
        )?;
        writeln!(
            f,
            "(at: from the load's start; recovered: from the fault's end until the safe time passed it; max lag: \
             wall clock − safe time from the fault's start until then; commits: source commits in that window; \
             lost: of those, missing from the target)"
        )?;
        for c in &self.checks {
            writeln!(f, "{}  {}: {}", c.verdict, c.name, c.detail)?;
        }
        Ok(())
    }
}
