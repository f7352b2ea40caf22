//! One run: a fresh cluster (directory, certificates, applier and shipper), the load, the
//! catch-up, and what it measured ([`Step`]).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use tidelog_config::ApplierBound;
use tidelog_testkit::load::{self, CommitSample, LoadOptions, SourceSafe};
use tidelog_testkit::{Api, Daemon, ImpairProxy, LocalCluster};

use super::admin::AdminExt;
use super::sampler::{micros_since_epoch, sampler};
use super::E2eArgs;
use crate::rss;
use crate::ship::cpu;
use crate::stage_lag;
use crate::stats::{fmt_int, fmt_ns};

#[derive(Clone, Debug, Serialize)]
pub struct LagUs {
    pub count: u64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub p999_us: u64,
    pub max_us: u64,
    pub mean_us: f64,
}

impl LagUs {
    fn of(h: &Histogram<u64>) -> LagUs {
        LagUs {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50),
            p99_us: h.value_at_quantile(0.99),
            p999_us: h.value_at_quantile(0.999),
            max_us: h.max(),
            mean_us: h.mean(),
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct Step {
    pub label: String,
    /// Offered txn/s (0 = max).
    pub offered: f64,
    pub txn_per_s: f64,
    pub mb_per_s: f64,
    pub records_per_s: f64,
    pub txns_committed: u64,
    pub txns_aborted: u64,
    /// Applied records per second during the load (sum over tablets).
    pub apply_records_per_s: f64,
    /// From the end of the load to the safe time passing every tablet's last record.
    pub catch_up_ms: f64,
    /// txn/s × min(1, applied records/s ÷ generated records/s): the rate the target kept up with.
    pub sustained_txn_per_s: f64,
    pub lag: LagUs,
    /// The source's part of `lag`: from the commit until every tablet had committed a
    /// record at or past its `commit_ht` at the source.
    pub source_lag: LagUs,
    /// The applier's own histograms of how old the newest data was at each stage, between
    /// the load's start and the catch-up (per event, bucket-interpolated; `stage_lag.rs`).
    pub stage_lag: Vec<stage_lag::StageLag>,
    pub samples_skipped_warmup: u64,
    pub samples_unresolved: u64,
    pub polls_per_s: f64,
    pub us_per_poll: f64,
    pub cpu_applier: cpu::Usage,
    pub cpu_shipper: cpu::Usage,
    pub cpu_bench: cpu::Usage,
    pub wall_s: f64,
    pub loadavg_end: String,
    /// Through the impairment proxy (`--impair`).
    pub link: Option<LinkStats>,
    /// `--soak`: the daemons' RSS from the load's start to its end.
    pub rss: Vec<rss::Sample>,
    /// `--soak`: the applier's memory bound computed from the run's `applier.toml`.
    pub bound: Option<ApplierBound>,
}

pub(super) fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

pub(super) fn run_step(
    args: &E2eArgs,
    exe: &Path,
    dir: &Path,
    label: &str,
    offered: f64,
) -> Result<Step> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut extra = match args.apply_nice {
        0 => String::new(),
        n => format!("apply-nice = {n}\n"),
    };
    if args.store_nice != 0 {
        extra.push_str(&format!("store-nice = {}\n", args.store_nice));
    }
    if args.apply_threads > 0 {
        extra.push_str(&format!("apply-threads = {}\n", args.apply_threads));
    }
    if args.runtime_threads > 0 {
        extra.push_str(&format!("runtime-threads = {}\n", args.runtime_threads));
    }
    if args.received_direct_io {
        extra.push_str("received-direct-io = true\n");
    }
    if let Some(y) = args.apply_yield {
        extra.push_str(&format!(
            "apply-yield-to-intake = \"{}ms\"\n",
            y.as_millis()
        ));
    }
    let c = LocalCluster::write(dir, args.tablets, "1h", "bench-source", &extra)?;
    let proxy = link_through(args, &c)?;
    let (applier_cfg, shipper_cfg, asock, wal) =
        (c.applier_cfg, c.shipper_cfg, c.applier_sock, c.wal);
    // The bound the applier documents for the configuration it runs with.
    let bound = match args.soak {
        true => Some(ApplierBound::of(
            &tidelog_config::load_applier(&applier_cfg)?,
            args.tablets,
        )),
        false => None,
    };
    let mut applier = Daemon::spawn(exe, "apply", &applier_cfg, &dir.join("applier.log"), "warn")?;
    let mut shipper = Daemon::spawn(exe, "ship", &shipper_cfg, &dir.join("shipper.log"), "warn")?;
    let admin = Api::new(&asock);
    applier.wait_until(
        &format!("the applier answering on {}", asock.display()),
        Duration::from_secs(30),
        || Ok(admin.get("/v1/status").is_ok()),
    )?;
    println!(
        "-- {label}: offered {}, applier pid {}, shipper pid {}, {}{}",
        if offered > 0.0 {
            format!("{} txn/s", fmt_int(offered as u64))
        } else {
            "max".into()
        },
        applier.pid(),
        shipper.pid(),
        dir.display(),
        proxy.as_ref().map_or(String::new(), |p| format!(
            ", shipper → impairment proxy {} ({}, seed {}) → applier",
            p.local_addr(),
            p.impairment(),
            args.seed
        ))
    );

    let (tx, rx) = mpsc::channel::<CommitSample>();
    let (source_tx, source_rx) = mpsc::channel::<SourceSafe>();
    let give_up = Arc::new(AtomicBool::new(false));
    let warmup = args.warmup;
    let sampler_t = {
        let (sock, gu, probe, poll) = (
            asock.clone(),
            give_up.clone(),
            args.lag_probe,
            Duration::from_micros(args.poll_us),
        );
        std::thread::Builder::new()
            .name("lag-sampler".into())
            .spawn(move || sampler(sock, rx, source_rx, warmup, probe, poll, gu))?
    };

    let stop = Arc::new(AtomicBool::new(false));
    // The generator's own once-a-second report: the bench's ticks are not in step with its
    // reports (a tick between two reports would show 0 txn/s, the next one double).
    let report: Arc<Mutex<Option<load::Progress>>> = Arc::default();
    let mut lo = LoadOptions::new(args.workload, &wal);
    lo.tablets = args.tablets;
    lo.rate = offered;
    lo.duration = Some(args.duration());
    lo.accounts = args.accounts;
    lo.connections = args.connections;
    lo.session_dir = Some(dir.join("sessions"));
    lo.sample_every = args.sample_every;
    lo.sync = args.source_sync;
    lo.heartbeat_interval = args.heartbeat_interval;
    lo.samples = Some(tx);
    lo.source_safe = Some(source_tx);

    // Start-up is not steady state: the generator writes the bank's initial balances and a
    // heartbeat on every tablet, then (in `ready`) waits until the applier's safe time is
    // initialized — the shipper found every tablet and the target applied a record of each —
    // before its timed load starts; the measured interval starts there too.
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
    let ready_sock = asock.clone();
    let ready = move || -> Result<()> {
        let a = Api::new(&ready_sock);
        let deadline = Instant::now() + Duration::from_secs(60);
        // Answered as soon as a safe time is published (≥ 1), or after a second.
        while a.safe_time_at("/v1/safe-time?wait-for=1&wait=1s")? == 0 {
            if Instant::now() >= deadline {
                bail!(
                    "the applier's safe time was not initialized within 60 s of the first records"
                );
            }
        }
        let _ = ready_tx.send(());
        Ok(())
    };
    let (st2, r2) = (stop.clone(), report.clone());
    let load_t = std::thread::Builder::new()
        .name("load-gen".into())
        .spawn(move || {
            load::run_when_ready(lo, &st2, ready, |p| {
                *r2.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.clone());
            })
        })?;
    // Wait for `ready` (or the generator failing before it).
    if ready_rx.recv().is_err() {
        give_up.store(true, Ordering::Relaxed);
        return match load_t.join() {
            Ok(Err(e)) => Err(e.context("load generator (before the load started)")),
            _ => bail!("the load generator stopped before the load started"),
        };
    }
    // Scraped outside the CPU-measured interval: rendering the metrics costs the applier.
    let stages0 = admin.stage_lag();
    let (cpu_a0, cpu_s0, cpu_b0) = (
        cpu::snapshot(Some(applier.pid())),
        cpu::snapshot(Some(shipper.pid())),
        cpu::snapshot(None),
    );
    let applied0 = admin.applied_records()?;
    let t_start = Instant::now();
    let rss_sampler = match args.soak {
        true => Some(rss::Sampler::start(
            applier.pid(),
            shipper.pid(),
            args.rss_every,
        )?),
        false => None,
    };
    // A soak prints a line every 30 s (with the daemons' RSS), other runs every second.
    let report_every = Duration::from_secs(if args.soak { 30 } else { 1 });
    let (mut last_a, mut last_t) = (applied0, Instant::now());
    let mut last_check = Instant::now();
    while !load_t.is_finished() {
        std::thread::sleep(Duration::from_millis(100));
        if last_check.elapsed() >= Duration::from_secs(1) {
            last_check = Instant::now();
            if let Err(e) = applier.check_alive().and_then(|()| shipper.check_alive()) {
                stop.store(true, Ordering::Relaxed);
                give_up.store(true, Ordering::Relaxed);
                return Err(e);
            }
        }
        if last_t.elapsed() < report_every {
            continue;
        }
        let a = admin.applied_records().unwrap_or(last_a);
        let safe = admin.safe_time().unwrap_or(0);
        let now_us = micros_since_epoch(SystemTime::now());
        let dt = last_t.elapsed().as_secs_f64();
        let rss_now = match args.soak {
            true => format!(
                "  RSS applier {} shipper {}",
                fmt_mib(rss::rss_bytes(applier.pid()).unwrap_or(0)),
                fmt_mib(rss::rss_bytes(shipper.pid()).unwrap_or(0))
            ),
            false => String::new(),
        };
        println!(
            "   {:>5.1}s {:>9} txn/s {:>10.0} applied rec/s  safe-time lag {}{rss_now}",
            t_start.elapsed().as_secs_f64(),
            // `-` until its first report.
            report
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .map_or("-".to_string(), |p| format!("{:.0}", p.interval_txn_per_s)),
            a.saturating_sub(last_a) as f64 / dt,
            if safe == 0 {
                "-".to_string()
            } else {
                fmt_ns(now_us.saturating_sub(safe >> 12).saturating_mul(1000))
            }
        );
        (last_a, last_t) = (a, Instant::now());
    }
    let summary = load_t
        .join()
        .map_err(|_| anyhow::anyhow!("the load thread panicked"))??;
    let t_load_end = Instant::now();
    let rss = rss_sampler.map(rss::Sampler::finish).unwrap_or_default();
    let load_s = (t_load_end - t_start).as_secs_f64();
    let applied1 = admin.applied_records()?;
    let last_ht = summary
        .tablet_ends
        .iter()
        .filter_map(|t| t.last_ht)
        .min()
        .map_or(0, |h| h.0);
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if admin.safe_time()? >= last_ht {
            break;
        }
        applier.check_alive()?;
        shipper.check_alive()?;
        if Instant::now() > deadline {
            give_up.store(true, Ordering::Relaxed);
            // A soak measures memory during the load: a target that fell behind (a busy
            // machine) is reported with it, not a reason to drop the samples.
            if !args.soak {
                bail!("the safe time did not reach the end of the load within 120 s");
            }
            println!(
                "   the safe time did not reach the end of the load within 120 s (reported below)"
            );
            break;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let catch_up = t_load_end.elapsed();
    let (cpu_a1, cpu_s1, cpu_b1) = (
        cpu::snapshot(Some(applier.pid())),
        cpu::snapshot(Some(shipper.pid())),
        cpu::snapshot(None),
    );
    let stages = stage_lag::between(&stages0, &admin.stage_lag());
    let wall = t_start.elapsed().as_secs_f64();
    // Everything is visible now; whatever the sampler still holds resolves on its next poll.
    let gu = give_up.clone();
    let watchdog = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(10));
        gu.store(true, Ordering::Relaxed);
    });
    let s = sampler_t
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))??;
    drop(watchdog);
    for d in [&mut shipper, &mut applier] {
        if let Err(e) = d.stop(Duration::from_secs(10)) {
            eprintln!("warning: {e:#}");
        }
    }
    let link = proxy.map(|p| LinkStats {
        spec: p.impairment().to_string(),
        seed: args.seed,
        proxy: crate::ship::describe_proxy(&p.stats()),
    });

    Ok(Step {
        label: label.to_string(),
        offered,
        txn_per_s: summary.txn_per_s,
        mb_per_s: summary.mb_per_s,
        records_per_s: summary.records as f64 / summary.elapsed_s.max(1e-9),
        txns_committed: summary.txns_committed,
        txns_aborted: summary.txns_aborted,
        apply_records_per_s: applied1.saturating_sub(applied0) as f64 / load_s.max(1e-9),
        catch_up_ms: catch_up.as_secs_f64() * 1e3,
        sustained_txn_per_s: {
            let rps = summary.records as f64 / summary.elapsed_s.max(1e-9);
            let aps = applied1.saturating_sub(applied0) as f64 / load_s.max(1e-9);
            summary.txn_per_s * (aps / rps.max(1.0)).min(1.0)
        },
        lag: LagUs::of(&s.hist),
        source_lag: LagUs::of(&s.source_hist),
        stage_lag: stages,
        samples_skipped_warmup: s.skipped_warmup,
        samples_unresolved: s.unresolved,
        polls_per_s: s.polls as f64 / wall.max(1e-9),
        us_per_poll: s.poll_busy.as_secs_f64() * 1e6 / (s.polls.max(1) as f64),
        cpu_applier: cpu::usage(&cpu_a0, &cpu_a1),
        cpu_shipper: cpu::usage(&cpu_s0, &cpu_s1),
        cpu_bench: cpu::usage(&cpu_b0, &cpu_b1),
        wall_s: wall,
        loadavg_end: loadavg(),
        link,
        rss,
        bound,
    })
}

/// The impaired link of a run: its spec, seed and the proxy's counts at the end.
#[derive(Clone, Debug, Serialize)]
pub struct LinkStats {
    pub spec: String,
    pub seed: u64,
    pub proxy: String,
}

/// Appends the `--quic` lines to both configs and, with `--impair`, starts the impairment
/// proxy in front of the applier and points the shipper at it.
pub(super) fn link_through(args: &E2eArgs, c: &LocalCluster) -> Result<Option<ImpairProxy>> {
    if !args.quic.is_empty() {
        let table = format!("\n[quic]\n{}\n", args.quic.join("\n"));
        for f in [&c.applier_cfg, &c.shipper_cfg] {
            let mut text = std::fs::read_to_string(f)?;
            text.push_str(&table);
            std::fs::write(f, text)?;
        }
    }
    let Some(imp) = &args.impair else {
        return Ok(None);
    };
    let applier = std::net::SocketAddr::from(([127, 0, 0, 1], c.port));
    let proxy = ImpairProxy::start_on_thread(applier, imp.clone(), args.seed)?;
    let text = std::fs::read_to_string(&c.shipper_cfg)?;
    let line = format!("applier = \"{applier}\"");
    if !text.contains(&line) {
        bail!(
            "{} has no line {line}: cannot point the shipper at the proxy",
            c.shipper_cfg.display()
        );
    }
    let text = text.replace(&line, &format!("applier = \"{}\"", proxy.local_addr()));
    std::fs::write(&c.shipper_cfg, text)?;
    Ok(Some(proxy))
}

pub(super) fn fmt_mib(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / f64::from(1u32 << 20))
}

pub(super) fn print_step(s: &Step) {
    println!(
        "   {}: {} txn/s ({} committed, {} aborted), {:.2} MB/s, {} records/s; applied {} records/s; caught up {:.1} ms after the load stopped",
        s.label,
        fmt_int(s.txn_per_s as u64),
        fmt_int(s.txns_committed),
        fmt_int(s.txns_aborted),
        s.mb_per_s,
        fmt_int(s.records_per_s as u64),
        fmt_int(s.apply_records_per_s as u64),
        s.catch_up_ms
    );
    println!(
        "   safe-time lag over {} samples: p50 {} p99 {} p999 {} max {} (mean {}); {} warm-up samples skipped, {} unresolved; {:.0} safe-time requests/s at {:.0} µs each",
        fmt_int(s.lag.count),
        fmt_ns(s.lag.p50_us * 1000),
        fmt_ns(s.lag.p99_us * 1000),
        fmt_ns(s.lag.p999_us * 1000),
        fmt_ns(s.lag.max_us * 1000),
        fmt_ns((s.lag.mean_us * 1000.0) as u64),
        s.samples_skipped_warmup,
        s.samples_unresolved,
        s.polls_per_s,
        s.us_per_poll
    );
    println!(
        "   of which at the source (commit → every tablet committed past it): p50 {} p99 {} p999 {} max {} (mean {}) over {} samples",
        fmt_ns(s.source_lag.p50_us * 1000),
        fmt_ns(s.source_lag.p99_us * 1000),
        fmt_ns(s.source_lag.p999_us * 1000),
        fmt_ns(s.source_lag.max_us * 1000),
        fmt_ns((s.source_lag.mean_us * 1000.0) as u64),
        fmt_int(s.source_lag.count),
    );
    if !s.stage_lag.is_empty() {
        println!(
            "   by stage (the applier's histograms, per event, bucket-interpolated): {}",
            stage_lag::describe(&s.stage_lag)
        );
    }
    if let Some(l) = &s.link {
        println!("   link {} (seed {}): {}", l.spec, l.seed, l.proxy);
    }
    println!("   CPU applier {}", s.cpu_applier.describe(4));
    println!("   CPU shipper {}", s.cpu_shipper.describe(4));
    println!("   CPU bench   {}", s.cpu_bench.describe(4));
}
