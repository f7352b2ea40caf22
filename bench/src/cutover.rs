//! `tidelog-bench cutover`: promotion time (request to report) of a real `tidelog apply`
//! with 10 k, 1 M and 10 M versions above the cut, and the background clean-up rate.
//!
//! # What is measured
//!
//! * Store: built in-process through the real apply path (`Store::apply`, one atomic batch
//!   per 1 000 records) in a fresh data directory: tablet `t0` lags and ends at the cut;
//!   `t1`..`t7` hold a few commits below the cut and then `--ops-per-commit` versions per
//!   `write` record (each a commit with a trx_id and a gtid, gtids in ht order) above it,
//!   `N` versions in all. The global safe time is persisted at the cut.
//! * Promotion: the real `tidelog apply` started on that directory; once its safe time is
//!   the cut, `POST /v1/promote` is timed from request to the complete JSON report, on an
//!   already open keep-alive connection of the admin socket. A second `POST` (idempotent)
//!   is timed too.
//! * Clean-up: from the report until `GET /v1/status` shows `cutover.cleanup_done`
//!   (polled every 20 ms): versions removed per second.
//! * Baseline in the same run: the clean-up itself — what promoting would cost if it
//!   removed the versions above the cut before answering; the ratio promotion / clean-up
//!   is printed.
//! * Checks: the report's `lost_commits` equals the commits written above the cut, and a
//!   `latest` read of a key written above the cut answers its version at or below the cut.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use serde_json::Value;
use tidelog_applier::store::{Durability, Store};
use tidelog_testkit::{Api, Daemon, LocalCluster};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, Gtid, HybridTime, Op, Record, TabletId, TrxId, WalPos};

use crate::e2e::tidelog_exe;
use crate::stats::fmt_int;

#[derive(Debug, Args)]
pub struct CutoverArgs {
    /// Versions above the cut, one run each (k/M suffixes).
    #[arg(long, value_delimiter = ',', default_value = "10k,1M,10M", value_parser = parse_count)]
    sizes: Vec<u64>,
    /// Versions (ops on distinct keys) per commit record above the cut.
    #[arg(long, default_value_t = 10)]
    ops_per_commit: u64,
    /// Value size in bytes.
    #[arg(long, default_value_t = 64)]
    value_size: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Keep the data directories (printed).
    #[arg(long)]
    keep: bool,
}

fn parse_count(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (n, mul) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1_000),
        Some('M' | 'm') => (&s[..s.len() - 1], 1_000_000),
        _ => (s, 1),
    };
    n.parse::<u64>()
        .map(|v| v * mul)
        .map_err(|e| format!("{s:?}: {e}"))
}

/// Tablets: `t0` lags (ends at the cut), the others carry the data above it.
const TABLETS: usize = 8;
/// Commits per tablet at or below the cut.
const BELOW: u64 = 100;
/// Records per `Store::apply` batch while building.
const BUILD_BATCH: usize = 1000;

#[derive(Debug, Serialize)]
struct Run {
    versions_above_cut: u64,
    commits_above_cut: u64,
    build_s: f64,
    build_versions_per_s: f64,
    promote_ms: f64,
    promote_again_ms: f64,
    cleanup_s: f64,
    cleanup_versions_per_s: f64,
    lost_commits: u64,
    ratio_promote_to_cleanup: f64,
}

/// One tablet's received-log positions while building.
struct Placer {
    tablet: TabletId,
    pos: WalPos,
    batch: Vec<(WalPos, Record)>,
}

impl Placer {
    fn push(&mut self, store: &Store, r: Record) -> Result<()> {
        let len = (RECORD_HEADER_LEN + r.encoded_body_len()?) as u64;
        self.batch.push((self.pos, r));
        self.pos = self.pos.add(len);
        if self.batch.len() >= BUILD_BATCH {
            self.flush(store)?;
        }
        Ok(())
    }
    fn flush(&mut self, store: &Store) -> Result<()> {
        if !self.batch.is_empty() {
            store.apply(&self.tablet, &self.batch, self.pos, Durability::Buffered)?;
            self.batch.clear();
        }
        Ok(())
    }
}

/// Builds the store; returns (cut, commits above it, a key written above it).
fn build(data_dir: &Path, versions: u64, args: &CutoverArgs) -> Result<(HybridTime, u64, String)> {
    let store = Store::open(data_dir)?;
    let now = HybridTime::from_system_time(std::time::SystemTime::now()).0;
    let mut tablets: Vec<Placer> = (0..TABLETS)
        .map(|i| -> Result<Placer> {
            Ok(Placer {
                tablet: format!("t{i}").parse()?,
                pos: WalPos(0),
                batch: Vec::new(),
            })
        })
        .collect::<Result<_>>()?;
    for p in &tablets {
        store.register_tablet(&p.tablet)?;
    }
    let value = vec![b'v'; args.value_size];
    let mut seq = 0u64;
    let mut ht = now - (3_600_000_000 << 12); // an hour ago, 1 logical tick per record
    let mut commit = |store: &Store, p: &mut Placer, ht: u64, ops: Vec<Op>| -> Result<()> {
        seq += 1;
        let r = Record::new(
            HybridTime(ht),
            Body::Write {
                ops,
                trx_id: Some(TrxId::new(1 + seq % 1000, 1 + seq / 1000)),
                gtid: Some(Gtid::new(0, 1, seq)),
            },
        );
        p.push(store, r)
    };
    // Below the cut: every tablet.
    for r in 0..BELOW {
        for (i, p) in tablets.iter_mut().enumerate() {
            ht += 1;
            let ops = vec![Op::put(format!("below/{i}/{r}"), value.clone())];
            commit(&store, p, ht, ops)?;
        }
    }
    let cut = HybridTime(ht);
    // Above the cut: t1..t7, round robin, gtids in ht order.
    let per = args.ops_per_commit.max(1);
    let commits = versions.div_ceil(per);
    let mut written = 0u64;
    let mut probe = String::new();
    for c in 0..commits {
        let i = 1 + (c as usize % (TABLETS - 1));
        let n = per.min(versions - written);
        let ops: Vec<Op> = (0..n)
            .map(|k| {
                let key = if c == 0 && k == 0 {
                    // A key that also has a version below the cut.
                    format!("below/{i}/0")
                } else {
                    format!("above/{i}/{c}/{k}")
                };
                Op::put(key, value.clone())
            })
            .collect();
        if c == 0 {
            probe = format!("below/{i}/0");
        }
        written += n;
        ht += 1;
        commit(&store, &mut tablets[i], ht, ops)?;
    }
    for p in &mut tablets {
        p.flush(&store)?;
    }
    store.raise_global_safe_time(cut, Durability::Sync)?;
    store.persist()?;
    Ok((cut, commits, probe))
}

fn ht_of(v: &Value, field: &str) -> Result<u64> {
    v[field]
        .as_str()
        .and_then(|s| s.parse().ok())
        .with_context(|| format!("no {field} in {v}"))
}

fn run_one(exe: &Path, dir: &Path, versions: u64, args: &CutoverArgs) -> Result<Run> {
    let c = LocalCluster::write(dir, TABLETS, "1h", "bench-source", "")?;
    let t0 = Instant::now();
    let (cut, commits, probe) = build(&dir.join("applier"), versions, args)?;
    let build_s = t0.elapsed().as_secs_f64();
    println!(
        "  built {} versions above the cut ({} commits) in {build_s:.1} s ({}/s)",
        fmt_int(versions),
        fmt_int(commits),
        fmt_int((versions as f64 / build_s) as u64)
    );
    let mut applier = Daemon::spawn(
        exe,
        "apply",
        &c.applier_cfg,
        &dir.join("applier.log"),
        "warn",
    )?;
    let admin = Api::new(&c.applier_sock);
    applier.wait_until(
        "the applier reporting safe time = cut",
        Duration::from_secs(120),
        || match admin.get("/v1/safe-time") {
            Ok((200, v)) => Ok(v["initialized"] == true && ht_of(&v, "safe_time")? == cut.0),
            _ => Ok(false),
        },
    )?;
    // Timed: request to complete report, on the open keep-alive connection.
    let t = Instant::now();
    let (st, rep) = admin.request("POST", "/v1/promote")?;
    let promote = t.elapsed();
    if st != 200 {
        bail!("promote answered {st}: {rep}");
    }
    let t = Instant::now();
    let (_, again) = admin.request("POST", "/v1/promote")?;
    let promote_again = t.elapsed();
    if again != rep {
        bail!("a second promote returned another report: {again} vs {rep}");
    }
    if ht_of(&rep, "cut_ht")? != cut.0 {
        bail!("cut {} is not the safe time {cut}", rep["cut_ht"]);
    }
    let lost = rep["lost_commits"].as_u64().unwrap_or(0);
    if lost != commits {
        bail!("lost_commits {lost}, but {commits} commits were written above the cut");
    }
    let (_, kv) = admin.get(&format!("/v1/kv/{probe}?mode=latest"))?;
    if ht_of(&kv, "version_ht")? > cut.0 {
        bail!("a latest read after promote shows a version above the cut: {kv}");
    }
    let t = Instant::now();
    applier.wait_until(
        "the cutover clean-up done",
        Duration::from_secs(3600),
        || Ok(admin.get("/v1/status")?.1["cutover"]["cleanup_done"] == true),
    )?;
    let cleanup = t.elapsed().as_secs_f64();
    if let Err(e) = applier.stop(Duration::from_secs(30)) {
        eprintln!("warning: {e:#}");
    }
    let promote_ms = promote.as_secs_f64() * 1e3;
    Ok(Run {
        versions_above_cut: versions,
        commits_above_cut: commits,
        build_s,
        build_versions_per_s: versions as f64 / build_s,
        promote_ms,
        promote_again_ms: promote_again.as_secs_f64() * 1e3,
        cleanup_s: cleanup,
        cleanup_versions_per_s: versions as f64 / cleanup,
        lost_commits: lost,
        ratio_promote_to_cleanup: promote_ms / (cleanup * 1e3),
    })
}

pub fn run(args: &CutoverArgs) -> Result<()> {
    let exe = tidelog_exe()?;
    println!(
        "tidelog-bench cutover: {} tablets (t0 lags at the cut), {} ops per commit, {} B values",
        TABLETS, args.ops_per_commit, args.value_size
    );
    let mut runs = Vec::new();
    for &n in &args.sizes {
        println!("{} versions above the cut", fmt_int(n));
        let tmp = tempfile::Builder::new()
            .prefix("tidelog-cutover-")
            .tempdir()?;
        let r = run_one(&exe, tmp.path(), n, args)?;
        println!(
            "  promote {:.2} ms (again {:.2} ms), lost_commits {}; clean-up {:.2} s ({}/s)",
            r.promote_ms,
            r.promote_again_ms,
            fmt_int(r.lost_commits),
            r.cleanup_s,
            fmt_int(r.cleanup_versions_per_s as u64)
        );
        if args.keep {
            println!("  kept {}", tmp.keep().display());
        }
        runs.push(r);
    }
    println!();
    println!(
        "{:>14} {:>12} {:>12} {:>12} {:>14} {:>12} {:>8}",
        "versions>cut",
        "promote ms",
        "again ms",
        "cleanup s",
        "cleanup ver/s",
        "prom/clean",
        "≤100ms"
    );
    for r in &runs {
        println!(
            "{:>14} {:>12.2} {:>12.2} {:>12.2} {:>14} {:>12.5} {:>8}",
            fmt_int(r.versions_above_cut),
            r.promote_ms,
            r.promote_again_ms,
            r.cleanup_s,
            fmt_int(r.cleanup_versions_per_s as u64),
            r.ratio_promote_to_cleanup,
            if r.promote_ms <= 100.0 {
                "pass"
            } else {
                "FAIL"
            }
        );
    }
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_vec_pretty(&runs)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
