//! What the daemons tell systemd beyond `READY=1` (see `notify`): whether the threads that
//! do the work are alive (gating the `WATCHDOG=1` pings) and the `STATUS=` line.
//!
//! Liveness comes from the workers' own heartbeats (`tidelog_wal::Heartbeat`), which they
//! beat in their loops, idle or not: the applier's apply workers (one per tablet), intake
//! writer threads (one per tablet) and safe-time publisher (`Applier::stalled`); the
//! shipper's lane threads and WAL scanner. A thread that ended on an error (a failed
//! tablet) is reported by status and metrics, not by the watchdog: restarting would not
//! mend a corrupt log.

use std::time::Duration;

use tidelog_shipper::Shipper;

use tidelog_applier::node::Applier;

/// How often the `STATUS=` line is refreshed.
pub const STATUS_INTERVAL: Duration = Duration::from_secs(5);

/// `Err` names a shipper thread that has shown no sign of life for longer than `limit`.
pub fn shipper_liveness(s: &Shipper, limit: Duration) -> Result<(), String> {
    match s.stalled(limit) {
        Some(what) => Err(what),
        None => Ok(()),
    }
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The applier's `STATUS=` line: safe-time lag, laggiest tablet, tablets streaming and
/// stopped (a record they cannot apply, frames beyond the clock).
pub fn applier_status(s: &Applier) -> String {
    let report = s.consistency().report();
    let tablets = s.intake().tablets();
    let streaming = tablets
        .iter()
        .filter(|t| t.status().state == "streaming")
        .count();
    let stopped = tablets
        .iter()
        .filter(|t| s.tablet_stopped(&t.tablet).is_some())
        .count();
    let stopped = if stopped > 0 {
        format!(", {stopped} stopped")
    } else {
        String::new()
    };
    let counts = format!(
        "{} tablets ({streaming} streaming{stopped}), {} pending txns",
        tablets.len(),
        report.pending_txns
    );
    match report.safe_time {
        Some(safe) => {
            let lag = now_micros().saturating_sub(safe.physical_micros());
            let laggiest = report
                .laggiest
                .map_or_else(String::new, |t| format!(" (laggiest {t})"));
            format!(
                "safe time lag {:.1}s{laggiest}; {counts}",
                lag as f64 / 1_000_000.0
            )
        }
        None => format!(
            "safe time uninitialized: {}; {counts}",
            s.uninitialized_reason(&report)
        ),
    }
}

/// The shipper's `STATUS=` line: tablets by state, lag, lanes connected.
pub fn shipper_status(s: &Shipper, applier: &str) -> String {
    let st = s.status();
    let mut by_state = std::collections::BTreeMap::<&str, usize>::new();
    let mut lag = 0u64;
    for row in st.values() {
        *by_state.entry(row.state).or_default() += 1;
        lag += row.lag_bytes;
    }
    let states = if by_state.is_empty() {
        "no tablets yet".to_string()
    } else {
        by_state
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "shipping {} tablets to {applier}: {states}; lag {lag} bytes; {}/{} lanes connected; io {}",
        st.len(),
        s.connected_lanes(),
        s.lanes(),
        s.io_engine().name()
    )
}
