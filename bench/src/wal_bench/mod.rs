//! `tidelog-bench wal`: one tablet's [`Writer`] appending and committing one record at a
//! time, against a raw baseline over the same bytes.
//!
//! # Record size
//!
//! `--record-size N` is the record's whole on-disk size: the 32-byte header plus the body.
//! The record is a `write` with no trx id and no gtid and one put op whose key is 8 bytes;
//! its body is `u32 op count + u32 key len + u32 value len + key + value` = 20 + value bytes,
//! so the value is `N − 52` bytes and every N ≥ 52 is hit exactly (smaller N are raised to
//! 52, the smallest such record). One `Record` is built once and reused, only its ht bumped
//! (`HybridTime(base + i)`), so the loop measures the WAL and not allocation.
//!
//! # What is timed
//!
//! The `always` and `batch` loops read the clock once per record: a record's latency is the
//! time from the return of the previous `commit` to the return of its own, i.e. `append` +
//! `commit` plus a few ns of loop and histogram bookkeeping (measured and printed as the
//! instrumentation overhead). The `none` loop times one record in 32 (a clock read before
//! its `append` and after its `commit`, so its latency rows are a 1/32 sample and exclude
//! the loop itself) and runs the others uninstrumented: the per-record clock read and
//! histogram update (~20–50 ns) cost as much as a 100-byte append and the memcpy baseline
//! carries none. The clock is the TSC (`rdtsc`, ~13 ns here) when the CPU has a constant,
//! non-stop TSC, else `Instant` (~35 ns on this VM); ticks are converted to ns by the
//! monotonic clock read at the start and end of each loop. Throughput uses the monotonic
//! clock. Segment rotation and its costs fall inside the records that trigger it.
//!
//! - `sync=none`: baseline = `memcpy` of the record bytes, pre-encoded once with
//!   [`Record::encode`], into preallocated (`posix_fallocate`) memory-mapped files of the
//!   segment size, rotated at the same record boundaries as the WAL (records start after a
//!   128-byte header gap); the same number of records as the WAL wrote; no checksum, no
//!   clock reads inside the loop. The first file is created before the clock starts, as the
//!   WAL's first segment is created by `Writer::open`; every later file is created, mapped
//!   and pre-faulted (`MADV_POPULATE_WRITE`) by a background thread started when the
//!   current file is a quarter full — exactly what the WAL does for its next segment — so
//!   both sides have the same page-fault exposure (both pre-fault, the same way).
//!   Before the WAL runs, an untimed-for-the-ratio memcpy warm-up (deleted before the WAL
//!   starts) makes both measured phases reuse page-cache memory the guest already touched:
//!   on this VM, guest memory never touched before costs a host fault on first touch
//!   (memcpy into it runs at ~0.3–0.45 GB/s instead of 1.5–2 GB/s), which would otherwise
//!   penalise the WAL, which runs first (the baseline reuses the memory the WAL's files just
//!   freed). The warm-up lasts the run's duration **and** at least `--warmup-bytes`
//!   (default 6 GiB, capped at a third of `MemAvailable`), so it covers at least as many
//!   bytes as the WAL then writes; the output says so when the WAL wrote more than the
//!   warm-up. The warm-up's own rate is printed (its first pass is the first-touch figure).
//! - `sync=always`: baseline = `pwrite` of the record bytes at increasing offsets into a
//!   preallocated file followed by `fdatasync`, one per record, for the same duration.
//! - `sync=batch`: two WAL latencies: the `commit` call (which returns before the bytes are
//!   durable) and commit → durable, measured for **every** commit without blocking the
//!   writer: after each commit the loop polls `durable_pos()` and resolves all commits it
//!   covers (resolution: one loop iteration). The `always` baseline runs too.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use serde::Serialize;
use tidelog_wal::format::{RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use tidelog_wal::{Body, HybridTime, Op, Record, SyncPolicy, TabletId, WalOptions, WalPos, Writer};

use crate::stats::{
    fmt_bytes, instrumentation_overhead_ns, nanos, new_histogram, ns_per_tick, parse_size, Clock,
    Latency,
};

mod baseline;
mod host;
mod report;

use baseline::{baseline_fdatasync, baseline_memcpy, mem_available};
use host::count_files;
pub(crate) use host::{filesystem_of, kernel_release, settle_device, sync_all};
use report::{print_run, print_summary};

/// sync=none: one record in this many is timed (latency row); the rest run uninstrumented.
const NONE_SAMPLE: u64 = 32;

/// Key length of the benchmark record's op.
const KEY_LEN: usize = 8;
/// Record bytes besides the value: header, op count, key and value lengths, key.
const FIXED_LEN: usize = RECORD_HEADER_LEN + 4 + 4 + 4 + KEY_LEN;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Sync {
    /// No sync: durable is declared at once.
    None,
    /// Group commit by the writer's flusher thread.
    Batch,
    /// msync before every commit returns.
    Always,
}

impl Sync {
    pub(crate) fn policy(self) -> SyncPolicy {
        match self {
            Sync::None => SyncPolicy::None,
            Sync::Batch => SyncPolicy::Batch,
            Sync::Always => SyncPolicy::Always,
        }
    }
    pub(crate) fn name(self) -> &'static str {
        match self {
            Sync::None => "none",
            Sync::Batch => "batch",
            Sync::Always => "always",
        }
    }
}

#[derive(Debug, Args)]
pub struct WalArgs {
    /// Total on-disk record size in bytes, including the 32-byte header (a one-op `write`
    /// with an 8-byte key; the value gets the rest; minimum 52).
    #[arg(long, default_value_t = 1024, conflicts_with = "all")]
    record_size: usize,
    /// Sync policy of every commit.
    #[arg(long, value_enum, required_unless_present = "all")]
    sync: Option<Sync>,
    /// How long the WAL writes (e.g. `10s`, `500ms`, `1m`).
    #[arg(long, default_value = "10s")]
    duration: humantime::Duration,
    /// Directory to create the temporary benchmark directory in (default: the current
    /// directory, so the disk under test is the working directory's filesystem).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Segment file size (bytes, or with a KiB/MiB/GiB suffix).
    #[arg(long, default_value = "64MiB", value_parser = parse_size)]
    segment_size: u64,
    /// Print one JSON object with every number instead of the tables.
    #[arg(long)]
    json: bool,
    /// Run the matrix (1 KiB, none), (100 B, none), (1 KiB, always), (1 KiB, batch).
    #[arg(long, conflicts_with = "sync")]
    all: bool,
    /// sync=none: the memcpy warm-up before the WAL covers at least this many bytes
    /// (capped at a third of MemAvailable), besides lasting `--duration`.
    #[arg(long, default_value = "6GiB", value_parser = parse_size)]
    warmup_bytes: u64,
}

#[derive(Clone, Copy, Debug)]
struct Spec {
    record_size: usize,
    sync: Sync,
}

const MATRIX: [Spec; 4] = [
    Spec {
        record_size: 1024,
        sync: Sync::None,
    },
    Spec {
        record_size: 100,
        sync: Sync::None,
    },
    Spec {
        record_size: 1024,
        sync: Sync::Always,
    },
    Spec {
        record_size: 1024,
        sync: Sync::Batch,
    },
];

#[derive(Debug, Serialize)]
struct Machine {
    nproc: usize,
    kernel: String,
    filesystem: String,
    /// /proc/loadavg when the benchmark started (other work on the machine skews results).
    loadavg: String,
    dir: String,
}

#[derive(Debug, Serialize)]
struct Output<'a> {
    machine: &'a Machine,
    duration_s: f64,
    segment_size: u64,
    /// Clock read + histogram record per timed record, in ns (included in every timed loop).
    instrumentation_overhead_ns: f64,
    /// `rdtsc` or `clock_gettime(CLOCK_MONOTONIC)`.
    clock: &'static str,
    runs: &'a [RunResult],
}

#[derive(Debug, Serialize)]
struct Throughput {
    records: u64,
    bytes: u64,
    elapsed_s: f64,
    records_per_s: f64,
    /// 10^6 bytes per second.
    mb_per_s: f64,
    /// 10^9 bytes per second.
    gb_per_s: f64,
}

impl Throughput {
    fn new(records: u64, bytes: u64, elapsed: Duration) -> Throughput {
        let s = elapsed.as_secs_f64().max(1e-9);
        Throughput {
            records,
            bytes,
            elapsed_s: s,
            records_per_s: records as f64 / s,
            mb_per_s: bytes as f64 / s / 1e6,
            gb_per_s: bytes as f64 / s / 1e9,
        }
    }
}

#[derive(Debug, Serialize)]
struct TidelogResult {
    #[serde(flatten)]
    throughput: Throughput,
    /// append + commit, per record (for batch: the commit call, not durability).
    commit_latency: Latency,
    /// batch only: commit start → `durable_pos()` covers the commit, every commit.
    durable_latency: Option<Latency>,
    segments: usize,
}

#[derive(Debug, Serialize)]
struct BaselineResult {
    /// `mmap_memcpy` or `pwrite_fdatasync`.
    kind: &'static str,
    #[serde(flatten)]
    throughput: Throughput,
    /// pwrite + fdatasync per record (none for the memcpy baseline, which is not timed per
    /// record).
    latency: Option<Latency>,
    files: usize,
}

#[derive(Debug, Serialize)]
struct Budget {
    name: String,
    actual: f64,
    target: f64,
    pass: bool,
}

#[derive(Debug, Serialize)]
struct RunResult {
    record_size: usize,
    requested_record_size: usize,
    key_len: usize,
    value_len: usize,
    sync: Sync,
    tidelog: TidelogResult,
    baseline: BaselineResult,
    /// sync=none: the untimed-for-ratio memcpy warm-up that ran first (first-touch memory).
    warmup: Option<BaselineResult>,
    /// none: tidelog bytes/s ÷ baseline bytes/s.
    throughput_ratio: Option<f64>,
    /// always: tidelog commit p99 ÷ fdatasync p99; batch: durable p99 ÷ fdatasync p99.
    p99_ratio: Option<f64>,
    budgets: Vec<Budget>,
}

pub fn run(args: &WalArgs) -> Result<()> {
    let duration: Duration = args.duration.into();
    if duration.is_zero() {
        bail!("--duration must be positive");
    }
    let parent = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir().context("current directory")?,
    };
    std::fs::create_dir_all(&parent).with_context(|| format!("create {}", parent.display()))?;
    let root = tempfile::Builder::new()
        .prefix(".tidelog-bench-")
        .tempdir_in(&parent)
        .with_context(|| format!("create a temporary directory in {}", parent.display()))?;
    let fs = filesystem_of(root.path());
    let machine = Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        kernel: kernel_release(),
        filesystem: fs.clone(),
        loadavg: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        dir: root.path().display().to_string(),
    };
    if fs == "tmpfs" || fs == "ramfs" {
        eprintln!(
            "warning: {} is on {fs}: syncs cost nothing there; pass --dir on a real disk",
            root.path().display()
        );
    }
    let clock = Clock::new();
    let clock_tpn = clock.ticks_per_ns(Duration::from_millis(20));
    let overhead = instrumentation_overhead_ns(&clock)?;
    let specs: Vec<Spec> = if args.all {
        MATRIX.to_vec()
    } else {
        vec![Spec {
            record_size: args.record_size,
            sync: args.sync.unwrap_or(Sync::None),
        }]
    };
    if !args.json {
        println!(
            "tidelog-bench wal: {} cores, Linux {}, load average {}, {} ({}), duration {} per run, segments {}",
            machine.nproc,
            machine.kernel,
            machine.loadavg,
            machine.dir,
            machine.filesystem,
            humantime::format_duration(duration),
            fmt_bytes(args.segment_size),
        );
        println!(
            "timing: one {} read per record; a record's latency = previous commit's return → \
             its commit's return (append + commit); instrumentation {overhead:.1} ns/record \
             (sync=none: 1 record in {NONE_SAMPLE} timed alone, the rest uninstrumented)",
            clock.source()
        );
    }
    let mut results = Vec::new();
    for (k, spec) in specs.iter().enumerate() {
        eprintln!(
            "[{}/{}] {} B records, sync={}, {} ...",
            k + 1,
            specs.len(),
            spec.record_size,
            spec.sync.name(),
            humantime::format_duration(duration)
        );
        let r = run_one(
            *spec,
            duration,
            args.segment_size,
            root.path(),
            (k, args.warmup_bytes),
            (&clock, clock_tpn),
        )?;
        if !args.json {
            print_run(&r, duration);
        }
        results.push(r);
    }
    if args.json {
        let out = Output {
            machine: &machine,
            duration_s: duration.as_secs_f64(),
            segment_size: args.segment_size,
            instrumentation_overhead_ns: overhead,
            clock: clock.source(),
            runs: &results,
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else if args.all {
        print_summary(&results);
    }
    Ok(())
}

/// The benchmark record of (as close as possible to) `size` total bytes.
fn bench_record(size: usize) -> Result<Record> {
    let value_len = size.saturating_sub(FIXED_LEN);
    let rec = Record::new(
        HybridTime(1),
        Body::Write {
            ops: vec![Op::put(*b"benchkey", vec![0xA5u8; value_len])],
            trx_id: None,
            gtid: None,
        },
    );
    let total = RECORD_HEADER_LEN + rec.encoded_body_len()?;
    if total != value_len + FIXED_LEN {
        bail!(
            "record layout changed: expected {} bytes, got {total}",
            value_len + FIXED_LEN
        );
    }
    Ok(rec)
}

fn run_one(
    spec: Spec,
    duration: Duration,
    segment_size: u64,
    root: &Path,
    (k, warmup_bytes): (usize, u64),
    clock: (&Clock, f64),
) -> Result<RunResult> {
    let mut rec = bench_record(spec.record_size)?;
    let record_len = rec.encode(WalPos::ZERO)?.len();
    let cap = segment_size as usize - SEGMENT_HEADER_LEN;
    if record_len > cap {
        bail!("a {record_len}-byte record does not fit a {segment_size}-byte segment");
    }
    // Start from a quiet device: flush whatever earlier runs left dirty, and wait for the
    // discards of the files they deleted (ext4 `-o discard`) before timing syncs.
    sync_all();
    if spec.sync != Sync::None {
        settle_device();
    }
    let bytes = rec.encode(WalPos::ZERO)?;
    // sync=none: the baseline reuses the page-cache memory the WAL's files just freed; memory
    // the guest never touched costs a host fault on first touch (see the module docs), so a
    // memcpy warm-up of at least `warmup_bytes` runs first and the WAL starts warm too.
    let warmup = if spec.sync == Sync::None {
        let d = root.join(format!("warmup-{k}"));
        std::fs::create_dir_all(&d)?;
        let until = Instant::now() + duration;
        let min_bytes = warmup_bytes.min(mem_available() / 3);
        let w = baseline_memcpy(&bytes, u64::MAX, Some((until, min_bytes)), segment_size, &d)?;
        // No sync here: the files are deleted (their dirty pages dropped, not written), and
        // the WAL starts at once on the memory they freed.
        std::fs::remove_dir_all(&d).with_context(|| format!("remove {}", d.display()))?;
        Some(w)
    } else {
        None
    };
    let wal_dir = root.join(format!("wal-{k}"));
    let tidelog = run_tidelog(&mut rec, spec.sync, duration, segment_size, &wal_dir, clock)?;
    std::fs::remove_dir_all(&wal_dir).with_context(|| format!("remove {}", wal_dir.display()))?;
    sync_all();
    if spec.sync != Sync::None {
        settle_device();
    }

    let base_dir = root.join(format!("baseline-{k}"));
    std::fs::create_dir_all(&base_dir)?;
    let baseline = match spec.sync {
        Sync::None => baseline_memcpy(
            &bytes,
            tidelog.throughput.records,
            None,
            segment_size,
            &base_dir,
        )?,
        Sync::Always | Sync::Batch => {
            baseline_fdatasync(&bytes, duration, segment_size, &base_dir, clock)?
        }
    };
    std::fs::remove_dir_all(&base_dir).with_context(|| format!("remove {}", base_dir.display()))?;
    sync_all();

    let throughput_ratio = (spec.sync == Sync::None)
        .then(|| tidelog.throughput.mb_per_s / baseline.throughput.mb_per_s);
    let base_p99 = baseline.latency.as_ref().map(|l| l.p99_ns as f64);
    let p99_ratio = match spec.sync {
        Sync::None => None,
        Sync::Always => base_p99.map(|b| tidelog.commit_latency.p99_ns as f64 / b),
        Sync::Batch => base_p99
            .zip(tidelog.durable_latency.as_ref())
            .map(|(b, d)| d.p99_ns as f64 / b),
    };
    let mut budgets = Vec::new();
    match spec.sync {
        Sync::None => {
            if record_len == 1024 {
                let gbs = tidelog.throughput.gb_per_s;
                budgets.push(Budget {
                    name: "sync=none 1 KiB records: GB/s ≥ 2".into(),
                    actual: gbs,
                    target: 2.0,
                    pass: gbs >= 2.0,
                });
            }
            if record_len == 100 {
                let mrs = tidelog.throughput.records_per_s / 1e6;
                budgets.push(Budget {
                    name: "sync=none 100 B records: M records/s ≥ 5".into(),
                    actual: mrs,
                    target: 5.0,
                    pass: mrs >= 5.0,
                });
            }
            if let Some(r) = throughput_ratio {
                budgets.push(Budget {
                    name: "sync=none: throughput ≥ 0.5× memcpy baseline".into(),
                    actual: r,
                    target: 0.5,
                    pass: r >= 0.5,
                });
            }
        }
        Sync::Always => {
            if let Some(r) = p99_ratio {
                budgets.push(Budget {
                    name: "sync=always: commit p99 ≤ 1.5× fdatasync p99".into(),
                    actual: r,
                    target: 1.5,
                    pass: r <= 1.5,
                });
            }
        }
        Sync::Batch => {}
    }
    Ok(RunResult {
        record_size: record_len,
        requested_record_size: spec.record_size,
        key_len: KEY_LEN,
        value_len: record_len - FIXED_LEN,
        sync: spec.sync,
        tidelog,
        baseline,
        warmup,
        throughput_ratio,
        p99_ratio,
        budgets,
    })
}

/// The WAL under test: append + commit one record at a time until `duration` has passed.
fn run_tidelog(
    rec: &mut Record,
    sync: Sync,
    duration: Duration,
    segment_size: u64,
    wal_dir: &Path,
    (clock, clock_tpn): (&Clock, f64),
) -> Result<TidelogResult> {
    let tablet: TabletId = "bench".parse()?;
    let opts = WalOptions {
        segment_size,
        ..WalOptions::default()
    };
    let mut w = Writer::open(wal_dir, &tablet, opts)?;
    let policy = sync.policy();
    let base = HybridTime::from_system_time(SystemTime::now()).0;
    let mut commit_h = new_histogram()?;
    let mut durable_h = new_histogram()?;
    // batch: commits not yet seen durable, (end, start of the append).
    let mut pending: VecDeque<(WalPos, u64)> = VecDeque::new();
    let track_durable = sync == Sync::Batch;
    let start_pos = w.written_pos();

    let start = clock.mark();
    let deadline = start.ticks + deadline_ticks(duration, clock_tpn);
    let mut prev = start.ticks;
    let mut i = 0u64;
    // sync=none: time one record in NONE_SAMPLE (a clock read before its append and after
    // its commit); the others carry no instrumentation, like the baseline's loop.
    if sync == Sync::None {
        loop {
            let timed = i % NONE_SAMPLE == 0;
            let t0 = if timed { clock.now() } else { 0 };
            rec.ht = HybridTime(base + i);
            w.append(rec)?;
            w.commit(policy)?;
            i += 1;
            if timed {
                let now = clock.now();
                commit_h.saturating_record(now.wrapping_sub(t0));
                if now >= deadline {
                    break;
                }
            }
        }
    } else {
        loop {
            rec.ht = HybridTime(base + i);
            w.append(rec)?;
            let end = w.commit(policy)?;
            i += 1;
            let now = clock.now();
            commit_h.saturating_record(now.wrapping_sub(prev));
            if track_durable {
                pending.push_back((end, prev));
                let durable = w.durable_pos();
                while let Some(&(p, t)) = pending.front() {
                    if p > durable {
                        break;
                    }
                    durable_h.saturating_record(now.wrapping_sub(t));
                    pending.pop_front();
                }
            }
            prev = now;
            if now >= deadline {
                break;
            }
        }
    }
    let stop = clock.mark();
    if let Some(&(last, _)) = pending.back() {
        if !w.wait_durable(last, Duration::from_secs(120)) {
            bail!("batch commits were not durable 120 s after the run");
        }
        let now = clock.now();
        for (_, t) in pending.drain(..) {
            durable_h.saturating_record(now.wrapping_sub(t));
        }
    }
    let npt = ns_per_tick(start, stop);
    let bytes = w.written_pos().since(start_pos);
    let dir = w.dir().to_path_buf();
    w.close()?;
    let segments = count_files(&dir, ".seg")?;
    Ok(TidelogResult {
        throughput: Throughput::new(i, bytes, stop.instant - start.instant),
        commit_latency: Latency::of_ticks(&commit_h, npt),
        durable_latency: track_durable.then(|| Latency::of_ticks(&durable_h, npt)),
        segments,
    })
}

/// `duration` in clock ticks.
fn deadline_ticks(duration: Duration, ticks_per_ns: f64) -> u64 {
    (nanos(duration) as f64 * ticks_per_ns) as u64
}
