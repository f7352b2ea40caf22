//! `--impair`: the same ship run through the UDP impairment proxy (loss, delay, reordering,
//! duplication), beside an unimpaired one, with its budget.

use std::path::Path;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tidelog_testkit::{Impairment, ProxyStats};

use crate::stats::{fmt_bytes, fmt_int};
use crate::wal_bench::kernel_release;

use super::raw::quiesce;
use super::report::{pass, print_run};
use super::run::ship_run;
use super::{loadavg, median, ShipArgs, ShipRun, Source};

/// The proxy's counts, one line.
pub(crate) fn describe_proxy(s: &ProxyStats) -> String {
    let d = |x: &tidelog_testkit::DirStats| {
        format!(
            "{} in, {} out, {} lost, {} reordered, {} duplicated, {} overflow",
            fmt_int(x.received),
            fmt_int(x.sent),
            fmt_int(x.lost),
            fmt_int(x.reordered),
            fmt_int(x.duplicated),
            fmt_int(x.overflow)
        )
    };
    format!(
        "to the applier: {}; to the shipper: {}",
        d(&s.to_target),
        d(&s.to_client)
    )
}

#[derive(Debug, Serialize)]
struct ImpairedPair {
    lanes: usize,
    straight: ShipRun,
    impaired: ShipRun,
    /// Impaired ÷ straight received MB/s.
    ratio: f64,
}

#[derive(Debug, Serialize)]
struct ImpairedOutput<'a> {
    nproc: usize,
    kernel: String,
    link: String,
    seed: u64,
    congestion: String,
    packet_threshold: u32,
    time_threshold: f32,
    budget: f64,
    source: &'a Source,
    pairs: &'a [ImpairedPair],
}

/// `--impair`: per lane count, `--rounds` pairs of a straight and an impaired run of the
/// same backlog, and the budget on the median of the pairs' ratios.
pub(super) fn impaired(
    args: &ShipArgs,
    imp: &Impairment,
    root: &Path,
    wal_dir: &Path,
    certs: &Path,
    src: &Source,
) -> Result<()> {
    println!(
        "link: {imp} (seed {}) in both directions, by the impairment proxy on a thread of this \
         process; the straight runs go to the applier directly",
        args.seed
    );
    let mut pairs: Vec<ImpairedPair> = Vec::new();
    for &lanes in &args.lane_counts() {
        for round in 0..args.rounds {
            let run = |link: Option<&Impairment>| -> Result<ShipRun> {
                let data = root.join(format!(
                    "applier-{lanes}-{round}-{}",
                    if link.is_some() {
                        "impaired"
                    } else {
                        "straight"
                    }
                ));
                let r = ship_run(args, lanes, wal_dir, &data, certs, src, link)?;
                print_run(&r);
                let _ = std::fs::remove_dir_all(&data);
                quiesce();
                Ok(r)
            };
            let straight = run(None)?;
            let impaired = run(Some(imp))?;
            let ratio = impaired.received.mb_per_s / straight.received.mb_per_s.max(1e-9);
            pairs.push(ImpairedPair {
                lanes,
                straight,
                impaired,
                ratio,
            });
        }
    }
    println!();
    println!(
        "== summary: {} in {} records of {} B over {} tablets, link {imp} (seed {}), {}; load average at end {} ==",
        fmt_bytes(src.bytes),
        fmt_int(src.records),
        src.record_size,
        src.tablets,
        args.seed,
        args.quic.describe(),
        loadavg()
    );
    println!(
        "{:<10} {:>11} {:>11} {:>11} {:>11} {:>9}",
        "lanes", "straight", "(applied)", "impaired", "(applied)", "ratio"
    );
    for p in &pairs {
        println!(
            "{:<10} {:>7.1} MB/s {:>6.1} MB/s {:>6.1} MB/s {:>6.1} MB/s {:>8.3}×{}",
            p.lanes,
            p.straight.received.mb_per_s,
            p.straight.applied.mb_per_s,
            p.impaired.received.mb_per_s,
            p.impaired.applied.mb_per_s,
            p.ratio,
            if p.impaired.complete {
                ""
            } else {
                "  (impaired run stopped at --impair-limit)"
            }
        );
    }
    println!("(MB/s durably received, applied in brackets; ratio = impaired ÷ straight received)");
    let mut missed = Vec::new();
    for &lanes in &args.lane_counts() {
        let ratios: Vec<f64> = pairs
            .iter()
            .filter(|p| p.lanes == lanes)
            .map(|p| p.ratio)
            .collect();
        let n = ratios.len();
        let Some(m) = median(ratios) else { continue };
        let ok = m >= args.impair_budget;
        println!(
            "budget lanes={lanes} impaired received ≥ {}× straight{:<16} actual {m:>8.3}  target {:>6}  {}",
            args.impair_budget,
            if n > 1 {
                format!(" (median of {n})")
            } else {
                String::new()
            },
            args.impair_budget,
            pass(ok)
        );
        if !ok {
            missed.push(format!("lanes={lanes}: {m:.3}× < {}×", args.impair_budget));
        }
    }
    if let Some(p) = &args.json {
        let out = ImpairedOutput {
            nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
            kernel: kernel_release(),
            link: imp.to_string(),
            seed: args.seed,
            congestion: args.quic.congestion.to_string(),
            packet_threshold: args.quic.packet_threshold,
            time_threshold: args.quic.time_threshold,
            budget: args.impair_budget,
            source: src,
            pairs: &pairs,
        };
        std::fs::write(p, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if !missed.is_empty() {
        bail!("impaired-link budget missed: {}", missed.join("; "));
    }
    Ok(())
}
