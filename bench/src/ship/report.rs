//! The human output of `tidelog-bench ship`: the baselines, each run, and the summary with
//! its budgets.

use crate::stats::{fmt_bytes, fmt_int};

use super::raw::Raw;
use super::{median, Baseline, Round, ShipArgs, ShipRun, Source};

pub(super) fn print_baseline(b: &Baseline) {
    println!(
        "  {}: {:.3}s, {:.1} MB/s, {} records/s; CPU client {}; server {}",
        b.name,
        b.rate.elapsed_s,
        b.rate.mb_per_s,
        fmt_int(b.rate.records_per_s as u64),
        b.cpu_bench.describe(3),
        b.cpu_peer.describe(3)
    );
}

pub(super) fn print_run(r: &ShipRun) {
    if !r.complete {
        println!(
            "  stopped at --impair-limit: {} received, {} applied",
            fmt_bytes(r.received.bytes),
            fmt_bytes(r.applied.bytes)
        );
    }
    println!(
        "  received: {:.3}s, {:.1} MB/s, {} records/s ({} frames, io {})",
        r.received.elapsed_s,
        r.received.mb_per_s,
        fmt_int(r.received.records_per_s as u64),
        fmt_int(r.frames),
        r.io_engine
    );
    if let Some(p) = &r.proxy {
        println!("  proxy: {p}");
    }
    println!(
        "    CPU to received: shipper process {}",
        r.cpu_bench_received.describe(4)
    );
    println!(
        "                     applier process {}",
        r.cpu_applier_received.describe(5)
    );
    println!(
        "  applied:  {:.3}s, {:.1} MB/s, {} records/s",
        r.applied.elapsed_s,
        r.applied.mb_per_s,
        fmt_int(r.applied.records_per_s as u64)
    );
    println!(
        "    CPU to applied:  shipper process {}",
        r.cpu_bench_applied.describe(4)
    );
    println!(
        "                     applier process {}",
        r.cpu_applier_applied.describe(5)
    );
}

pub(super) fn pass(b: bool) -> &'static str {
    if b {
        "PASS"
    } else {
        "MISS"
    }
}

pub(super) fn print_summary(
    args: &ShipArgs,
    src: &Source,
    baselines: &[Baseline],
    runs: &[ShipRun],
    rounds: &[Round],
    load_end: &str,
) {
    let rate_of = |raw: Raw| {
        baselines
            .iter()
            .find(|b| b.name == raw.name())
            .map(|b| b.rate.mb_per_s)
    };
    let (quinn, tcp, disk) = (
        rate_of(Raw::Quinn),
        rate_of(Raw::Tcp),
        rate_of(Raw::QuinnDisk),
    );
    let ratio =
        |x: f64, base: Option<f64>| base.map_or("-".to_string(), |b| format!("{:.3}×", x / b));
    println!();
    println!(
        "== summary: {} in {} records of {} B over {} tablets, loopback, load average at end {load_end} ==",
        fmt_bytes(src.bytes),
        fmt_int(src.records),
        src.record_size,
        src.tablets
    );
    println!(
        "{:<28} {:>9} {:>9} {:>12} {:>9} {:>9} {:>9} {:>10} {:>10}",
        "run", "elapsed", "MB/s", "records/s", "×quinn", "×tcp", "×disk", "CPU send", "CPU recv"
    );
    for b in baselines {
        println!(
            "{:<28} {:>8.3}s {:>9.1} {:>12} {:>9} {:>9} {:>9} {:>9.2}s {:>9.2}s",
            b.name,
            b.rate.elapsed_s,
            b.rate.mb_per_s,
            fmt_int(b.rate.records_per_s as u64),
            ratio(b.rate.mb_per_s, quinn),
            ratio(b.rate.mb_per_s, tcp),
            ratio(b.rate.mb_per_s, disk),
            b.cpu_bench.total_s,
            b.cpu_peer.total_s
        );
    }
    for r in runs {
        for (what, rate, cs, cr) in [
            (
                "received",
                &r.received,
                &r.cpu_bench_received,
                &r.cpu_applier_received,
            ),
            (
                "applied",
                &r.applied,
                &r.cpu_bench_applied,
                &r.cpu_applier_applied,
            ),
        ] {
            println!(
                "{:<28} {:>8.3}s {:>9.1} {:>12} {:>9} {:>9} {:>9} {:>9.2}s {:>9.2}s",
                format!("tidelog lanes={} {what}", r.lanes),
                rate.elapsed_s,
                rate.mb_per_s,
                fmt_int(rate.records_per_s as u64),
                ratio(rate.mb_per_s, quinn),
                ratio(rate.mb_per_s, tcp),
                ratio(rate.mb_per_s, disk),
                cs.total_s,
                cr.total_s
            );
        }
    }
    println!(
        "(CPU send = this process: client / shipper; CPU recv = the peer process: sink / applier;"
    );
    println!(
        " ×disk = against raw quinn→disk, whose receiver writes the bytes to disk and fdatasyncs them)"
    );
    let line = |name: String, actual: f64, target: f64| {
        println!(
            "budget {name:<52} actual {actual:>8.3}  target {target:>6}  {}",
            pass(actual >= target)
        );
    };
    if rounds.len() > 1 {
        println!("rounds (raw quinn, then lanes=1 right after it):");
        for (i, r) in rounds.iter().enumerate() {
            println!(
                "  round {}: raw quinn {:>7.1} MB/s, lanes=1 received {:>7.1} MB/s, applied {:>6.1} MB/s, ratio {:.3}",
                i + 1,
                r.quinn_mb_per_s,
                r.received_mb_per_s,
                r.applied_mb_per_s,
                r.ratio()
            );
        }
    }
    for r in runs {
        if r.lanes == 1 {
            if rounds.len() > 1 {
                if let Some(m) = median(rounds.iter().map(Round::ratio).collect()) {
                    line(
                        format!(
                            "lanes=1 received: ≥ 0.8× raw quinn (median of {} rounds)",
                            rounds.len()
                        ),
                        m,
                        0.8,
                    );
                }
            } else if let Some(q) = quinn {
                line(
                    "lanes=1 received: ≥ 0.8× raw quinn (ratio)".into(),
                    r.received.mb_per_s / q,
                    0.8,
                );
            }
            if let Some(d) = disk {
                println!(
                    "(not a budget) lanes=1 received ÷ raw quinn→disk                 actual {:>8.3}",
                    r.received.mb_per_s / d
                );
            }
        }
        if args.record_size == 1024 {
            // lanes=1 over several rounds: the medians, as for the ratio.
            let (received, applied, of) = match (r.lanes, rounds.len()) {
                (1, n) if n > 1 => (
                    median(rounds.iter().map(|x| x.received_mb_per_s).collect()),
                    median(rounds.iter().map(|x| x.applied_mb_per_s).collect()),
                    format!(" (median of {n} rounds)"),
                ),
                _ => (
                    Some(r.received.mb_per_s),
                    Some(r.applied.mb_per_s),
                    String::new(),
                ),
            };
            if let (Some(received), Some(applied)) = (received, applied) {
                line(
                    format!("lanes={} durably received MB/s ≥ 300{of}", r.lanes),
                    received,
                    300.0,
                );
                line(
                    format!("lanes={} applied MB/s ≥ 150{of}", r.lanes),
                    applied,
                    150.0,
                );
            }
        }
    }
}
