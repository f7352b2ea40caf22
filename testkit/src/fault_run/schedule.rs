//! The fault schedule: which faults a run injects, in what order, when and for how long —
//! all drawn from one seed, so that `--seed N` replays it.
//!
//! The run's middle (after a lead-in, before a tail) is cut into one slot per fault; each
//! fault starts at a random point of the first half of its slot. Every kind appears at
//! least once (when the run has room for at least one fault of each kind), the rest are
//! drawn at random, and the order is shuffled. The lengths:
//!
//! | kind | length drawn | meaning |
//! | --- | --- | --- |
//! | `applier_kill` | 0–2 s | SIGKILL, then that long until the restart (systemd's `RestartSec=`) |
//! | `shipper_kill` | 0–2 s | the same for the shipper |
//! | `partition` | 2–8 s | the link drops every datagram both ways for that long |
//! | `disk_full` | 2–6 s | once the applier reports `disk_full`, the disk stays full that long |
//!
//! A fault starts at its planned time or, if the one before has not recovered by then,
//! once it has: the plan is the same for a seed, the actual times are measured.

use std::fmt;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

/// What a fault does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL of the applier, restarted with the same config.
    ApplierKill,
    /// SIGKILL of the shipper, restarted with the same config.
    ShipperKill,
    /// The impairment proxy drops everything, both ways.
    Partition,
    /// The applier's data-dir (a small tmpfs) filled by a ballast file until the applier
    /// reports `disk_full`, then the ballast removed.
    DiskFull,
}

impl FaultKind {
    pub const ALL: [FaultKind; 4] = [
        FaultKind::ApplierKill,
        FaultKind::ShipperKill,
        FaultKind::Partition,
        FaultKind::DiskFull,
    ];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::ApplierKill => "applier_kill",
            FaultKind::ShipperKill => "shipper_kill",
            FaultKind::Partition => "partition",
            FaultKind::DiskFull => "disk_full",
        }
    }

    /// The range the fault's length is drawn from (see the module docs).
    fn length_range(self) -> (Duration, Duration) {
        match self {
            FaultKind::ApplierKill | FaultKind::ShipperKill => {
                (Duration::ZERO, Duration::from_secs(2))
            }
            FaultKind::Partition => (Duration::from_secs(2), Duration::from_secs(8)),
            FaultKind::DiskFull => (Duration::from_secs(2), Duration::from_secs(6)),
        }
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One fault of the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlannedFault {
    pub kind: FaultKind,
    /// When it starts, from the start of the load.
    pub at: Duration,
    /// How long it lasts (see [`FaultKind`] and the module docs for what that means).
    pub length: Duration,
}

/// Time before the first fault: the load settles first.
pub const LEAD_IN: Duration = Duration::from_secs(5);
/// Time after the last planned start kept free of new faults.
pub const TAIL: Duration = Duration::from_secs(5);
/// Room planned per fault: fewer faults when the run is shorter.
pub const SLOT: Duration = Duration::from_secs(20);

/// The faults of a run of `duration` under `seed`: one per [`SLOT`] of the time between
/// [`LEAD_IN`] and `duration - TAIL`, at least one of each kind, in start order.
pub fn plan(seed: u64, duration: Duration) -> Vec<PlannedFault> {
    let mut rng = StdRng::seed_from_u64(seed);
    let span = duration.saturating_sub(LEAD_IN + TAIL);
    let n = usize::try_from(span.as_millis() / SLOT.as_millis())
        .unwrap_or(usize::MAX)
        .max(FaultKind::ALL.len());
    let mut kinds: Vec<FaultKind> = FaultKind::ALL.to_vec();
    while kinds.len() < n {
        kinds.push(FaultKind::ALL[rng.random_range(0..FaultKind::ALL.len())]);
    }
    kinds.shuffle(&mut rng);
    let slot = span / u32::try_from(n).unwrap_or(u32::MAX);
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| {
            let (lo, hi) = kind.length_range();
            let jitter = rng.random_range(0..=slot.as_millis() as u64 / 2);
            let length = rng.random_range(lo.as_millis() as u64..=hi.as_millis() as u64);
            PlannedFault {
                kind,
                at: LEAD_IN
                    + slot * u32::try_from(i).unwrap_or(u32::MAX)
                    + Duration::from_millis(jitter),
                length: Duration::from_millis(length),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_replays_its_schedule_and_another_seed_draws_another() {
        let d = Duration::from_secs(180);
        assert_eq!(plan(7, d), plan(7, d));
        assert_ne!(plan(7, d), plan(8, d));
    }

    #[test]
    fn every_kind_appears_in_order_within_the_run_and_its_length_range() {
        for seed in 0..200 {
            for secs in [10, 40, 180, 600] {
                let d = Duration::from_secs(secs);
                let p = plan(seed, d);
                for k in FaultKind::ALL {
                    assert!(p.iter().any(|f| f.kind == k), "seed {seed}: no {k}");
                }
                assert!(p.windows(2).all(|w| w[0].at <= w[1].at), "{p:?}");
                assert!(p[0].at >= LEAD_IN);
                for f in &p {
                    let (lo, hi) = f.kind.length_range();
                    assert!((lo..=hi).contains(&f.length), "{f:?}");
                    if secs >= 40 {
                        assert!(f.at <= d - TAIL, "seed {seed}: {f:?} past the run");
                    }
                }
                if secs == 180 {
                    assert_eq!(p.len(), 8);
                }
            }
        }
    }
}
