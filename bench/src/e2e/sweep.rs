//! The command: the runs (a sweep, one fixed rate, or a soak), the summary table, the
//! budget checks and the JSON report.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use super::baseline::fdatasync_baseline;
use super::sampler::LagProbe;
use super::soak::soak_checks;
use super::step::{loadavg, print_step, run_step, Step};
use super::{E2eArgs, SOAK_RATE};
use crate::stats::{fmt_int, fmt_ns, Latency};
use crate::wal_bench::{filesystem_of, kernel_release};

#[derive(Debug, Serialize)]
pub(super) struct Check {
    pub(super) what: String,
    pub(super) actual: f64,
    pub(super) target: f64,
    pub(super) pass: bool,
}

#[derive(Debug, Serialize)]
pub(super) struct Report {
    workload: String,
    tablets: usize,
    source_sync: String,
    heartbeat_interval_ms: f64,
    duration_s: f64,
    warmup_s: f64,
    sample_every: u64,
    lag_probe: LagProbe,
    poll_us: u64,
    connections: usize,
    accounts: u64,
    kernel: String,
    filesystem: String,
    cpus: usize,
    loadavg_start: String,
    fdatasync_4k: Latency,
    steps: Vec<Step>,
    checks: Vec<Check>,
}

pub(super) fn pass(b: bool) -> &'static str {
    if b {
        "PASS"
    } else {
        "MISS"
    }
}

pub(super) fn sweep(args: &E2eArgs, exe: &Path, base: &Path) -> Result<()> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let la0 = loadavg();
    println!(
        "tidelog-bench e2e: {} workload, {} tablets, source sync {}, heartbeats after {:?} idle, {}s per run ({}s warm-up not sampled), every {}th commit sampled, {}",
        args.workload,
        args.tablets,
        args.source_sync,
        args.heartbeat_interval,
        args.duration().as_secs_f64(),
        args.warmup.as_secs_f64(),
        args.sample_every,
        match args.lag_probe {
            LagProbe::Wait => "safe time followed by wait-for requests".to_string(),
            LagProbe::Poll => format!("safe time polled every {} µs", args.poll_us),
        }
    );
    println!(
        "  {} CPUs, kernel {}, {} at {}, load average at start {la0}",
        cpus,
        kernel_release(),
        filesystem_of(base),
        base.display()
    );
    let fsync = fdatasync_baseline(base, Duration::from_secs(2))?;
    println!(
        "  baseline: 4 KiB pwrite + fdatasync: p50 {} p99 {} p999 {} ({} in 2 s)",
        fmt_ns(fsync.p50_ns),
        fmt_ns(fsync.p99_ns),
        fmt_ns(fsync.p999_ns),
        fmt_int(fsync.count)
    );
    let mut steps = Vec::new();
    let mut n = 0usize;
    let mut step = |label: &str, rate: f64, steps: &mut Vec<Step>| -> Result<()> {
        n += 1;
        let s = run_step(args, exe, &base.join(format!("run-{n}")), label, rate)?;
        print_step(&s);
        steps.push(s);
        Ok(())
    };
    if args.soak {
        step("soak", args.rate.unwrap_or(SOAK_RATE), &mut steps)?;
    } else if let Some(r) = args.rate {
        step(if r > 0.0 { "fixed" } else { "max" }, r, &mut steps)?;
    } else {
        step("max", 0.0, &mut steps)?;
        // What the pipeline sustains with the target keeping up: the generator's rate scaled
        // down by how far the apply rate fell short of the record rate it was offered.
        let m = &steps[0];
        let keep_up = (m.apply_records_per_s / m.records_per_s.max(1.0)).min(1.0);
        let max = m.txn_per_s * keep_up;
        println!(
            "   sustained max: {} txn/s generated × {:.3} (applied / generated records) = {} txn/s; the sweep offers 10/50/90% of that",
            fmt_int(m.txn_per_s as u64),
            keep_up,
            fmt_int(max as u64)
        );
        for pct in [10u32, 50, 90] {
            step(
                &format!("{pct}% of max"),
                max * f64::from(pct) / 100.0,
                &mut steps,
            )?;
        }
        step("budget", args.budget_rate, &mut steps)?;
    }

    println!();
    println!(
        "== summary: {} over {} tablets, source sync {}, applier sync batch, apply-nice {}, store-nice {}, apply-threads {}, runtime-threads {}, received logs {}, 1 lane, loopback QUIC+mTLS{}; fdatasync 4 KiB p50 {} p99 {}; load average at end {} ==",
        args.workload,
        args.tablets,
        args.source_sync,
        args.apply_nice,
        args.store_nice,
        match args.apply_threads {
            0 => "default".to_string(),
            n => n.to_string(),
        },
        match args.runtime_threads {
            0 => "default".to_string(),
            n => n.to_string(),
        },
        if args.received_direct_io {
            "O_DIRECT"
        } else {
            "buffered"
        },
        match (&args.impair, args.quic.is_empty()) {
            (None, true) => String::new(),
            (imp, _) => format!(
                " (link {}; [quic] {})",
                imp.as_ref()
                    .map_or("straight".to_string(), |i| format!("{i}, seed {}", args.seed)),
                if args.quic.is_empty() {
                    "defaults".to_string()
                } else {
                    args.quic.join(", ")
                }
            ),
        },
        fmt_ns(fsync.p50_ns),
        fmt_ns(fsync.p99_ns),
        loadavg()
    );
    println!(
        "{:<12} {:>9} {:>9} {:>9} {:>7} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>8} {:>7} {:>7} {:>7}",
        "run",
        "offered",
        "txn/s",
        "kept-up",
        "MB/s",
        "apply r/s",
        "lag p50",
        "p99",
        "p999",
        "max",
        "src p50",
        "catch-up",
        "×fsync",
        "CPU app",
        "CPU shp",
        "CPU gen"
    );
    for s in &steps {
        println!(
            "{:<12} {:>9} {:>9} {:>9} {:>7.2} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7.1}ms {:>7.1}× {:>6.2}s {:>6.2}s {:>6.2}s",
            s.label,
            if s.offered > 0.0 { fmt_int(s.offered as u64) } else { "max".into() },
            fmt_int(s.txn_per_s as u64),
            fmt_int(s.sustained_txn_per_s as u64),
            s.mb_per_s,
            fmt_int(s.apply_records_per_s as u64),
            fmt_ns(s.lag.p50_us * 1000),
            fmt_ns(s.lag.p99_us * 1000),
            fmt_ns(s.lag.p999_us * 1000),
            fmt_ns(s.lag.max_us * 1000),
            fmt_ns(s.source_lag.p50_us * 1000),
            s.catch_up_ms,
            (s.lag.p50_us * 1000) as f64 / fsync.p50_ns.max(1) as f64,
            s.cpu_applier.total_s,
            s.cpu_shipper.total_s,
            s.cpu_bench.total_s,
        );
    }
    println!("(kept-up = txn/s × min(1, applied ÷ generated records/s); lag = source commit → visible at the target's safe time; src p50 = its part at the source: commit → every tablet committed past it; ×fsync = lag p50 / fdatasync p50; CPU over load + catch-up; CPU gen = this process: generator + sampler)");

    let mut checks = Vec::new();
    if let Some(max) = steps.iter().find(|s| s.label == "max") {
        checks.push(Check {
            what: format!("max txn/s generated ≥ {}", fmt_int(args.budget_max as u64)),
            actual: max.txn_per_s,
            target: args.budget_max,
            pass: max.txn_per_s >= args.budget_max,
        });
        checks.push(Check {
            what: format!("max txn/s applied ≥ {}", fmt_int(args.budget_max as u64)),
            actual: max.sustained_txn_per_s,
            target: args.budget_max,
            pass: max.sustained_txn_per_s >= args.budget_max,
        });
    }
    if let Some(b) = steps.iter().find(|s| s.label == "budget") {
        checks.push(Check {
            what: format!(
                "at {} txn/s: achieved ≥ 95% of offered",
                fmt_int(b.offered as u64)
            ),
            actual: b.txn_per_s,
            target: b.offered * 0.95,
            pass: b.txn_per_s >= b.offered * 0.95,
        });
        checks.push(Check {
            what: format!("at {} txn/s: lag p99 ≤ 10 ms", fmt_int(b.offered as u64)),
            actual: b.lag.p99_us as f64 / 1e3,
            target: 10.0,
            pass: b.lag.p99_us <= 10_000,
        });
        checks.push(Check {
            what: format!("at {} txn/s: lag p50 ≤ 3 ms", fmt_int(b.offered as u64)),
            actual: b.lag.p50_us as f64 / 1e3,
            target: 3.0,
            pass: b.lag.p50_us <= 3_000,
        });
    }
    // With `--impair`, every run's lag p99 (and no sample left unresolved).
    if let Some(imp) = &args.impair {
        let limit_ms = args.impair_lag_p99.as_secs_f64() * 1e3;
        for s in &steps {
            let c = Check {
                what: format!("{}: lag p99 ≤ {limit_ms:.0} ms through {imp}", s.label),
                actual: s.lag.p99_us as f64 / 1e3,
                target: limit_ms,
                pass: (s.lag.p99_us as f64 / 1e3) <= limit_ms && s.samples_unresolved == 0,
            };
            checks.push(c);
        }
    }
    for s in steps.iter().filter(|s| s.label == "soak") {
        checks.extend(soak_checks(args, s));
    }
    for c in &checks {
        println!(
            "{}  {:<40} actual {:.2}, target {:.2}",
            pass(c.pass),
            c.what,
            c.actual,
            c.target
        );
    }
    let (missed, total_checks) = (checks.iter().filter(|c| !c.pass).count(), checks.len());
    if let Some(path) = &args.json {
        let r = Report {
            workload: args.workload.to_string(),
            tablets: args.tablets,
            source_sync: args.source_sync.to_string(),
            heartbeat_interval_ms: args.heartbeat_interval.as_secs_f64() * 1e3,
            duration_s: args.duration().as_secs_f64(),
            warmup_s: args.warmup.as_secs_f64(),
            sample_every: args.sample_every,
            lag_probe: args.lag_probe,
            poll_us: args.poll_us,
            connections: args.connections,
            accounts: args.accounts,
            kernel: kernel_release(),
            filesystem: filesystem_of(base),
            cpus,
            loadavg_start: la0,
            fdatasync_4k: fsync,
            steps,
            checks,
        };
        std::fs::write(path, serde_json::to_vec_pretty(&r)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("JSON written to {}", path.display());
    }
    if missed > 0 {
        bail!("{missed} of {total_checks} budgets missed");
    }
    Ok(())
}
