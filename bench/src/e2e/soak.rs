//! `--soak`: the memory budgets of a long run at a steady rate.

use super::step::Step;
use super::sweep::Check;
use super::{E2eArgs, SOAK_DRIFT, SOAK_WINDOW};
use crate::rss;
use crate::stats::{fmt_int, fmt_ns};

/// `--soak`: prints the RSS summary and the bound, and returns the two memory budgets (in
/// MiB) — end within [`SOAK_DRIFT`] of the reference, largest sample below the bound.
pub(super) fn soak_checks(args: &E2eArgs, s: &Step) -> Vec<Check> {
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
