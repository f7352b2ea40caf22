//! The human output of `tidelog-bench wal`: one block per run, then the summary table.

use std::time::Duration;

use super::{RunResult, Sync, Throughput, NONE_SAMPLE};
use crate::stats::{fmt_bytes, fmt_int, fmt_ns, Latency};

fn lat_cols(l: Option<&Latency>) -> String {
    match l {
        Some(l) => format!(
            "{:>9} {:>9} {:>9} {:>9}",
            fmt_ns(l.p50_ns),
            fmt_ns(l.p99_ns),
            fmt_ns(l.p999_ns),
            fmt_ns(l.max_ns)
        ),
        None => format!("{:>9} {:>9} {:>9} {:>9}", "-", "-", "-", "-"),
    }
}

fn tput_cols(t: &Throughput) -> String {
    format!(
        "{:>12} {:>9.3}s {:>12} {:>10.1}",
        fmt_int(t.records),
        t.elapsed_s,
        fmt_int(t.records_per_s.round() as u64),
        t.mb_per_s
    )
}

fn pass(b: bool) -> &'static str {
    if b {
        "PASS"
    } else {
        "MISS"
    }
}

pub(super) fn print_run(r: &RunResult, duration: Duration) {
    println!();
    println!(
        "== {} B records (key {} B, value {} B{}), sync={}, {} ==",
        r.record_size,
        r.key_len,
        r.value_len,
        if r.record_size != r.requested_record_size {
            format!(
                "; {} B requested, 52 B is the smallest",
                r.requested_record_size
            )
        } else {
            String::new()
        },
        r.sync.name(),
        humantime::format_duration(duration)
    );
    println!(
        "{:<30} {:>12} {:>10} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9}",
        "", "records", "elapsed", "records/s", "MB/s", "p50", "p99", "p999", "max"
    );
    let t = &r.tidelog;
    let label = match r.sync {
        Sync::None => "tidelog append+commit(none)",
        Sync::Always => "tidelog append+commit(always)",
        Sync::Batch => "tidelog append+commit(batch)",
    };
    println!(
        "{label:<30} {} {}",
        tput_cols(&t.throughput),
        lat_cols(Some(&t.commit_latency))
    );
    if let Some(d) = &t.durable_latency {
        println!(
            "{:<30} {:>12} {:>10} {:>12} {:>10} {}",
            "tidelog commit→durable",
            fmt_int(d.count),
            "",
            "",
            "",
            lat_cols(Some(d))
        );
    }
    let b = &r.baseline;
    let blabel = match b.kind {
        "mmap_memcpy" => "baseline mmap memcpy",
        _ => "baseline pwrite+fdatasync",
    };
    println!(
        "{blabel:<30} {} {}",
        tput_cols(&b.throughput),
        lat_cols(b.latency.as_ref())
    );
    if let Some(w) = &r.warmup {
        println!(
            "{:<30} {} {}",
            "(memcpy warm-up, ran first)",
            tput_cols(&w.throughput),
            lat_cols(None)
        );
        if t.throughput.bytes > w.throughput.bytes {
            println!(
                "warning: the WAL wrote {} more than the warm-up covered: that part of it \
                 touched guest memory for the first time (raise --warmup-bytes)",
                fmt_bytes(t.throughput.bytes - w.throughput.bytes)
            );
        }
    }
    println!(
        "tidelog: {} segment file(s); baseline: {} file(s), {:.3} GB/s, {} records/s",
        t.segments,
        b.files,
        b.throughput.gb_per_s,
        fmt_int(b.throughput.records_per_s.round() as u64)
    );
    match r.sync {
        Sync::None => println!(
            "baseline: the same {} records memcpy'd (pre-encoded, no checksum, not timed per \
             record); order: warm-up, tidelog, baseline; tidelog latency: 1 record in \
             {NONE_SAMPLE} timed, the rest uninstrumented",
            fmt_int(b.throughput.records)
        ),
        Sync::Always => {}
        Sync::Batch => println!(
            "batch: the first latency row is the commit call (returns before durability); \
             commit→durable runs from the start of the append to the first poll of \
             durable_pos() that covers it, for every commit"
        ),
    }
    if let Some(x) = r.throughput_ratio {
        println!("ratio tidelog/baseline throughput: {x:.3}×");
    }
    if let Some(x) = r.p99_ratio {
        let what = if r.sync == Sync::Batch {
            "commit→durable p99 / fdatasync p99"
        } else {
            "commit p99 / fdatasync p99"
        };
        println!("ratio tidelog/baseline {what}: {x:.3}×");
    }
    for bu in &r.budgets {
        println!(
            "budget {:<48} actual {:>8.3}  target {:>5}  {}",
            bu.name,
            bu.actual,
            bu.target,
            pass(bu.pass)
        );
    }
}

pub(super) fn print_summary(results: &[RunResult]) {
    println!();
    println!("== summary ==");
    println!(
        "{:<7} {:<7} {:>12} {:>10} {:>9} {:>9} {:>9} {:>9}  {:<28} {:<10} budgets",
        "record", "sync", "records/s", "MB/s", "p50", "p99", "p999", "max", "baseline", "ratio"
    );
    for r in results {
        let t = &r.tidelog;
        let base = match r.sync {
            Sync::None => format!("memcpy {:.3} GB/s", r.baseline.throughput.gb_per_s),
            _ => format!(
                "fdatasync p99 {}",
                r.baseline
                    .latency
                    .as_ref()
                    .map_or("-".into(), |l| fmt_ns(l.p99_ns))
            ),
        };
        let ratio = match (r.throughput_ratio, r.p99_ratio) {
            (Some(x), _) => format!("{x:.3}× tput"),
            (None, Some(x)) => format!("{x:.3}× p99"),
            _ => "-".into(),
        };
        let budgets = if r.budgets.is_empty() {
            "(none)".to_string()
        } else {
            r.budgets
                .iter()
                .map(|b| format!("{} {}", short_budget(&b.name), pass(b.pass)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "{:<7} {:<7} {:>12} {:>10.1} {}  {:<28} {:<10} {}",
            format!("{} B", r.record_size),
            r.sync.name(),
            fmt_int(t.throughput.records_per_s.round() as u64),
            t.throughput.mb_per_s,
            lat_cols(Some(&t.commit_latency)),
            base,
            ratio,
            budgets
        );
        if let Some(d) = &t.durable_latency {
            println!(
                "{:<7} {:<7} {:>12} {:>10} {}  (commit→durable)",
                "",
                "",
                "",
                "",
                lat_cols(Some(d))
            );
        }
    }
}

fn short_budget(name: &str) -> &str {
    match name.split_once(": ") {
        Some((_, rest)) => rest,
        None => name,
    }
}
