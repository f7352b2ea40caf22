//! `tidelog-bench ship`: ships pre-written WAL over QUIC with mutual TLS to an applier in
//! another process on loopback, and measures bytes and records durably received and applied,
//! beside a raw quinn stream and a raw TCP copy of the same bytes in the same run.
//!
//! # What is measured
//!
//! * Source: `--tablets` WALs written with [`Writer`] (`sync=none`, one final `sync()`),
//!   untimed, `--total` bytes of `--record-size` records (a one-op `write` with an 8-byte
//!   key, as in `tidelog-bench wal`), in a temporary directory on the disk under test.
//! * tidelog: the applier (`__applier`, a re-exec of this binary) runs the intake, the
//!   store and one apply worker per tablet and prints its totals every 5 ms. The clock
//!   starts just before `Shipper::start` and stops when the sum of the tablets' received
//!   (durable) ends equals the sum of the source ends ("received") and, separately, when the
//!   sum of the applied positions does ("applied"). Progress resolution is 5 ms.
//! * raw quinn: one connection, one bidirectional stream, the same rustls/quinn
//!   configuration builders as the shipper and the applier (mutual TLS, TLS 1.3, same
//!   windows and UDP payload size); the client (in this process, one current-thread runtime
//!   like a lane) reads the same record bytes from the same segment files in 1 MiB chunks
//!   (`pread`, page cache) and writes them; the server (`__sink`) reads and discards and
//!   answers with the byte count. Clock: connect → answer received.
//! * raw quinn→disk: the same, but the server keeps the bytes as the intake does: 1 MiB
//!   buffers written into preallocated, pre-faulted 64 MiB segment files and `fdatasync`ed
//!   group by group, the answer after the last sync (`__sink --durable-dir`), measured after
//!   the tidelog runs. What a receiver that only makes the bytes durable costs. Then raw
//!   quinn→disk O_DIRECT: the same written around the page cache (`__sink --direct`).
//! * raw TCP: the same over a loopback TCP connection (`__sink --proto tcp`).
//! * CPU seconds: utime + stime of each process over the timed interval, from `/proc`, and
//!   by thread (grouped by name), so it shows where the time goes on the shared cores.

mod child;
pub(crate) mod cpu;

pub use child::{run_applier, run_sink, ApplierArgs, SinkArgs};

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use tidelog_net::{Congestion, QuicTuning};
use tidelog_shipper::io::IoChoice;
use tidelog_shipper::{Shipper, ShipperOptions};
use tidelog_testkit::{ImpairProxy, Impairment, ProxyStats};
use tidelog_wal::format::SEGMENT_HEADER_LEN;
use tidelog_wal::{Body, HybridTime, Op, Record, SyncPolicy, TabletId, WalOptions, Writer};

use crate::stats::{fmt_bytes, fmt_int, parse_size};
use crate::wal_bench::{filesystem_of, kernel_release, Sync};

#[derive(Debug, Args)]
pub struct ShipArgs {
    /// Bytes of WAL to ship, over all tablets (KiB/MiB/GiB suffixes).
    #[arg(long, default_value = "2GiB", value_parser = parse_size)]
    total: u64,
    #[arg(long, default_value_t = 8)]
    tablets: usize,
    /// Whole on-disk record size (32-byte header included; minimum 52).
    #[arg(long, default_value_t = 1024)]
    record_size: usize,
    /// Lane counts to run, comma-separated. Default `1,2`; with `--impair`, the shipper's
    /// default (`lanes = 0`: the number of cores).
    #[arg(long, value_delimiter = ',')]
    lanes: Option<Vec<usize>>,
    /// The applier intake's sync policy for received logs.
    #[arg(long, value_enum, default_value = "batch")]
    sync: Sync,
    /// Largest frame the shipper sends.
    #[arg(long, default_value = "1MiB", value_parser = parse_size)]
    frame: u64,
    /// Shipped-but-unacked bytes per tablet.
    #[arg(long, default_value = "16MiB", value_parser = parse_size)]
    window: u64,
    /// Initial (and minimum) QUIC UDP payload, both ends and the raw quinn baseline.
    #[arg(long, default_value_t = QuicTuning::default().max_udp_payload)]
    max_udp_payload: u16,
    /// The shipper's file I/O engine.
    #[arg(long, default_value = "auto", value_parser = parse_io)]
    io: IoChoice,
    /// Directory to create the temporary benchmark directory in (default: the current
    /// directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Also write every number as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Skip the raw quinn and TCP baselines (for quick iterations; no ratios).
    #[arg(long)]
    no_baselines: bool,
    /// Nice value of the applier's apply threads, as the daemon's `apply-nice` (0: the
    /// process's). A positive value gives intake (durable receipt) the CPU first.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    apply_nice: i32,
    /// Nice value of the applier store's flush and compaction workers, as the daemon's
    /// `store-nice`.
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    store_nice: i32,
    /// Write the received logs with `O_DIRECT`, as the daemon's `received-direct-io`.
    #[arg(long)]
    direct_io: bool,
    /// Received logs through the page cache during a catch-up too, as the daemon's
    /// `received-direct-io-in-catch-up = false` (its default, `true`, writes the segments
    /// begun during a catch-up with `O_DIRECT`).
    #[arg(long)]
    buffered_catch_up: bool,
    /// Hold the apply threads back during a catch-up, each time by at most this long, as the
    /// daemon's `apply-yield-to-intake` (its default `1s`; `0s`: never).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1s")]
    apply_yield: Duration,
    /// Worker threads of the applier's async runtime (QUIC), as the daemon's
    /// `runtime-threads` (0: its default, half the cores, at least one).
    #[arg(long, default_value_t = 0)]
    runtime_threads: usize,
    /// Measure the lanes=1 ratio this many times: after the first pass, raw quinn and a
    /// lanes=1 run alternate `rounds - 1` more times, and the ratio's budget is judged on
    /// the median of the rounds' ratios (each run against the raw quinn just before it), so
    /// a machine whose speed drifts between two runs does not decide it.
    #[arg(long, default_value_t = 1)]
    rounds: usize,
    /// Loss detection and congestion control of both ends, as the daemons' `[quic]` keys.
    #[command(flatten)]
    quic: QuicArgs,
    /// Ship the same backlog twice per lane count, straight and through the UDP impairment
    /// proxy (both directions), e.g. `loss=5%,delay=20ms,jitter=5ms,reorder=10%,dup=1%`,
    /// and judge the impaired received rate against the straight one (≥ `--impair-budget`×).
    /// No raw baselines then.
    #[arg(long)]
    impair: Option<Impairment>,
    /// The impairment proxy's RNG seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// With `--impair`: the budget, impaired ÷ straight received rate.
    #[arg(long, default_value_t = 0.3)]
    impair_budget: f64,
    /// With `--impair`: an impaired run still going after this long is stopped and judged by
    /// what it received so far.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "5m")]
    impair_limit: Duration,
}

/// `[quic]` loss detection and congestion control for both ends of a benchmark (defaults:
/// the daemons').
#[derive(Debug, Clone, Args)]
pub struct QuicArgs {
    /// The congestion controller: bbr, cubic or newreno (`quic.congestion`).
    #[arg(long, default_value_t = QuicTuning::default().congestion)]
    pub congestion: Congestion,
    /// `quic.packet-threshold`.
    #[arg(long, default_value_t = QuicTuning::default().packet_threshold)]
    pub packet_threshold: u32,
    /// `quic.time-threshold`.
    #[arg(long, default_value_t = QuicTuning::default().time_threshold)]
    pub time_threshold: f32,
}

impl QuicArgs {
    /// The default tuning with these settings and `max_udp_payload`.
    pub fn tuning(&self, max_udp_payload: u16) -> QuicTuning {
        QuicTuning {
            max_udp_payload,
            congestion: self.congestion,
            packet_threshold: self.packet_threshold,
            time_threshold: self.time_threshold,
            ..QuicTuning::default()
        }
    }

    /// The same as arguments of a peer process.
    fn to_args(&self) -> Vec<OsString> {
        vec![
            "--congestion".into(),
            self.congestion.to_string().into(),
            "--packet-threshold".into(),
            self.packet_threshold.to_string().into(),
            "--time-threshold".into(),
            self.time_threshold.to_string().into(),
        ]
    }

    fn describe(&self) -> String {
        format!(
            "congestion {}, packet threshold {}, time threshold {}",
            self.congestion, self.packet_threshold, self.time_threshold
        )
    }
}

fn parse_io(s: &str) -> Result<IoChoice, String> {
    s.parse()
}

/// Key length of the records (as in `tidelog-bench wal`).
const KEY_LEN: usize = 8;
/// Record header + op count + key and value lengths + key.
const FIXED_LEN: usize = tidelog_wal::format::RECORD_HEADER_LEN + 12 + KEY_LEN;
const CHUNK: usize = 1 << 20;

#[derive(Debug, Serialize)]
struct Source {
    tablets: usize,
    record_size: usize,
    bytes: u64,
    records: u64,
    write_s: f64,
    /// (tablet, end position, records)
    ends: Vec<(String, u64, u64)>,
}

/// A contiguous run of record bytes in a segment file.
#[derive(Debug, Clone)]
struct Extent {
    path: PathBuf,
    offset: u64,
    len: u64,
}

#[derive(Debug, Serialize, Clone)]
struct Rate {
    bytes: u64,
    records: u64,
    elapsed_s: f64,
    mb_per_s: f64,
    records_per_s: f64,
}

impl Rate {
    fn new(bytes: u64, records: u64, d: Duration) -> Rate {
        let s = d.as_secs_f64().max(1e-9);
        Rate {
            bytes,
            records,
            elapsed_s: s,
            mb_per_s: bytes as f64 / s / 1e6,
            records_per_s: records as f64 / s,
        }
    }
}

#[derive(Debug, Serialize)]
struct Baseline {
    name: &'static str,
    rate: Rate,
    cpu_bench: cpu::Usage,
    cpu_peer: cpu::Usage,
}

#[derive(Debug, Serialize)]
struct ShipRun {
    lanes: usize,
    io_engine: &'static str,
    received: Rate,
    applied: Rate,
    /// CPU from shipper start to all received / to all applied.
    cpu_bench_received: cpu::Usage,
    cpu_applier_received: cpu::Usage,
    cpu_bench_applied: cpu::Usage,
    cpu_applier_applied: cpu::Usage,
    frames: u64,
    /// Through the impairment proxy: its spec.
    link: Option<String>,
    /// The proxy's counts at the end.
    proxy: Option<String>,
    /// False when an impaired run was stopped at `--impair-limit` (rates are of what had
    /// arrived by then).
    complete: bool,
}

#[derive(Debug, Serialize)]
struct Output<'a> {
    nproc: usize,
    kernel: String,
    filesystem: String,
    loadavg_start: String,
    loadavg_end: String,
    dir: String,
    max_udp_payload: u16,
    frame: u64,
    window: u64,
    sync: &'static str,
    apply_nice: i32,
    store_nice: i32,
    source: &'a Source,
    baselines: &'a [Baseline],
    runs: &'a [ShipRun],
    rounds: &'a [Round],
}

/// One raw quinn run and the lanes=1 run right after it.
#[derive(Debug, Serialize)]
struct Round {
    quinn_mb_per_s: f64,
    received_mb_per_s: f64,
    applied_mb_per_s: f64,
}

impl Round {
    fn of(quinn: &Baseline, run: &ShipRun) -> Round {
        Round {
            quinn_mb_per_s: quinn.rate.mb_per_s,
            received_mb_per_s: run.received.mb_per_s,
            applied_mb_per_s: run.applied.mb_per_s,
        }
    }

    fn ratio(&self) -> f64 {
        self.received_mb_per_s / self.quinn_mb_per_s
    }
}

/// The median (the mean of the middle two for an even count); `None` when empty.
fn median(mut v: Vec<f64>) -> Option<f64> {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn tablet_id(i: usize) -> Result<TabletId> {
    format!("bench-{i}")
        .parse()
        .map_err(|e| anyhow::anyhow!("tablet id: {e:?}"))
}

impl ShipArgs {
    /// `--lanes`, or its default.
    fn lane_counts(&self) -> Vec<usize> {
        match (&self.lanes, &self.impair) {
            (Some(l), _) => l.clone(),
            (None, None) => vec![1, 2],
            (None, Some(_)) => vec![tidelog::config::ShipperConfig::default().effective_lanes()],
        }
    }
}

pub fn run(args: &ShipArgs) -> Result<()> {
    let lane_counts = args.lane_counts();
    if args.tablets == 0 || lane_counts.is_empty() || lane_counts.contains(&0) || args.rounds == 0 {
        bail!("--tablets, --rounds and every --lanes value must be positive");
    }
    if args.impair.is_none() && args.rounds > 1 && (args.no_baselines || !lane_counts.contains(&1))
    {
        bail!("--rounds {} compares lanes=1 with raw quinn: it needs 1 in --lanes and the baselines (no --no-baselines)", args.rounds);
    }
    let base = match &args.dir {
        Some(d) => d.clone(),
        None => std::env::current_dir()?,
    };
    let root = tempfile::Builder::new()
        .prefix(".tidelog-bench-ship-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a temporary directory in {}", base.display()))?;
    let fs = filesystem_of(root.path());
    let nproc = std::thread::available_parallelism().map_or(1, |n| n.get());
    let load0 = loadavg();
    println!(
        "tidelog-bench ship: {nproc} cores, Linux {}, {} ({fs}), load average {load0}",
        kernel_release(),
        root.path().display()
    );
    let certs = root.path().join("certs");
    std::fs::create_dir_all(&certs)?;
    tidelog_testkit::pki::write(&certs)?;
    let wal_dir = root.path().join("wal");
    let source = prewrite(args, &wal_dir)?;
    println!(
        "source: {} tablets, {} in {} records of {} B (pre-written untimed in {:.1}s: sync none + one final sync)",
        source.tablets,
        fmt_bytes(source.bytes),
        fmt_int(source.records),
        source.record_size,
        source.write_s
    );
    println!(
        "quic: max_udp_payload {} B, frame {}, window {}/tablet, stream window {}, connection window {}; intake sync={}{}, apply nice {}, store nice {}, apply yield {:?}, runtime threads {}",
        args.max_udp_payload,
        fmt_bytes(args.frame),
        fmt_bytes(args.window),
        fmt_bytes(QuicTuning::default().stream_receive_window),
        fmt_bytes(QuicTuning::default().receive_window),
        args.sync.name(),
        if args.direct_io {
            " O_DIRECT"
        } else if !args.buffered_catch_up {
            " O_DIRECT in catch-up"
        } else {
            ""
        },
        args.apply_nice,
        args.store_nice,
        args.apply_yield,
        tidelog::config::runtime_threads(args.runtime_threads)
    );
    println!("quic: {}", args.quic.describe());
    if let Some(imp) = &args.impair {
        return impaired(args, imp, root.path(), &wal_dir, &certs, &source);
    }
    let extents = extents(&wal_dir, &source)?;
    let mut baselines = Vec::new();
    if !args.no_baselines {
        for raw in [Raw::Tcp, Raw::Quinn] {
            let b = baseline(args, raw, root.path(), &certs, &extents, &source)?;
            print_baseline(&b);
            baselines.push(b);
        }
    }
    let mut runs = Vec::new();
    for (i, &lanes) in lane_counts.iter().enumerate() {
        let data = root.path().join(format!("applier-{i}"));
        let r = ship_run(args, lanes, &wal_dir, &data, &certs, &source, None)?;
        print_run(&r);
        runs.push(r);
        // Keep the disk free for the next run.
        let _ = std::fs::remove_dir_all(&data);
        quiesce();
    }
    if !args.no_baselines {
        // Last, so that tidelog's first run, not this one, pays for first writes to fresh
        // page-cache memory (on a VM with free page reporting that is a host fault per page).
        for raw in [Raw::QuinnDisk, Raw::QuinnDirect] {
            match baseline(args, raw, root.path(), &certs, &extents, &source) {
                Ok(b) => {
                    print_baseline(&b);
                    baselines.push(b);
                }
                // Not every filesystem takes O_DIRECT (tmpfs before Linux 6.6): say so and go on.
                Err(e) if raw == Raw::QuinnDirect => {
                    println!("  {}: skipped: {e:#}", raw.name());
                }
                Err(e) => return Err(e),
            }
        }
    }
    // Round 0 is the pass above; more rounds alternate raw quinn and lanes=1.
    let mut rounds: Vec<Round> = Vec::new();
    if let (Some(q), Some(r)) = (
        baselines.iter().find(|b| b.name == Raw::Quinn.name()),
        runs.iter().find(|r| r.lanes == 1),
    ) {
        rounds.push(Round::of(q, r));
        for i in 1..args.rounds {
            println!("[round {}/{}]", i + 1, args.rounds);
            let q = baseline(args, Raw::Quinn, root.path(), &certs, &extents, &source)?;
            print_baseline(&q);
            let data = root.path().join(format!("applier-round-{i}"));
            let r = ship_run(args, 1, &wal_dir, &data, &certs, &source, None)?;
            print_run(&r);
            let _ = std::fs::remove_dir_all(&data);
            quiesce();
            rounds.push(Round::of(&q, &r));
        }
    }
    let load1 = loadavg();
    print_summary(args, &source, &baselines, &runs, &rounds, &load1);
    if let Some(p) = &args.json {
        let out = Output {
            nproc,
            kernel: kernel_release(),
            filesystem: fs,
            loadavg_start: load0,
            loadavg_end: load1,
            dir: root.path().display().to_string(),
            max_udp_payload: args.max_udp_payload,
            frame: args.frame,
            window: args.window,
            sync: args.sync.name(),
            apply_nice: args.apply_nice,
            store_nice: args.store_nice,
            source: &source,
            baselines: &baselines,
            runs: &runs,
            rounds: &rounds,
        };
        std::fs::write(p, serde_json::to_string_pretty(&out)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Writes the source WALs (two threads), untimed for the results.
fn prewrite(args: &ShipArgs, wal_dir: &Path) -> Result<Source> {
    let per_tablet = args.total / args.tablets as u64;
    let value_len = args.record_size.max(FIXED_LEN) - FIXED_LEN;
    let started = Instant::now();
    let ids: Vec<TabletId> = (0..args.tablets).map(tablet_id).collect::<Result<_>>()?;
    let mut ends: Vec<(String, u64, u64)> = Vec::new();
    std::thread::scope(|s| -> Result<()> {
        let workers = 2.min(args.tablets);
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let mine: Vec<TabletId> = ids.iter().skip(w).step_by(workers).cloned().collect();
                s.spawn(move || -> Result<Vec<(String, u64, u64)>> {
                    let value = vec![0xA5u8; value_len];
                    let mut out = Vec::new();
                    for t in mine {
                        let mut wr = Writer::open(wal_dir, &t, WalOptions::default())?;
                        let mut n = 0u64;
                        while wr.written_pos().0 < per_tablet {
                            for _ in 0..256 {
                                let key = format!("{:08x}", n % (1 << 20));
                                let rec = Record::new(
                                    HybridTime(1 + n),
                                    Body::Write {
                                        ops: vec![Op::put(key.into_bytes(), value.clone())],
                                        trx_id: None,
                                        gtid: None,
                                    },
                                );
                                wr.append(&rec)?;
                                n += 1;
                            }
                            wr.commit(SyncPolicy::None)?;
                        }
                        wr.sync()?;
                        let end = wr.durable_pos().0;
                        wr.close()?;
                        out.push((t.to_string(), end, n));
                    }
                    Ok(out)
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(r) => ends.extend(r?),
                Err(_) => bail!("a pre-write thread panicked"),
            }
        }
        Ok(())
    })?;
    ends.sort();
    Ok(Source {
        tablets: args.tablets,
        record_size: value_len + FIXED_LEN,
        bytes: ends.iter().map(|e| e.1).sum(),
        records: ends.iter().map(|e| e.2).sum(),
        write_s: started.elapsed().as_secs_f64(),
        ends,
    })
}

/// The record bytes of every segment of every tablet, in log order.
fn extents(wal_dir: &Path, src: &Source) -> Result<Vec<Extent>> {
    let mut out = Vec::new();
    for (t, end, _) in &src.ends {
        let segs = tidelog_wal::reader::list_segments(&wal_dir.join(t))?;
        for (i, (first, path)) in segs.iter().enumerate() {
            let next = segs.get(i + 1).map_or(*end, |(p, _)| p.0);
            out.push(Extent {
                path: path.clone(),
                offset: SEGMENT_HEADER_LEN as u64,
                len: next.saturating_sub(first.0),
            });
        }
    }
    let total: u64 = out.iter().map(|e| e.len).sum();
    if total != src.bytes {
        bail!(
            "segment extents hold {total} bytes, the source {}",
            src.bytes
        );
    }
    Ok(out)
}

/// Calls `f` with each ≤ 1 MiB chunk of the extents, read with `pread`.
fn for_each_chunk(extents: &[Extent], mut f: impl FnMut(&[u8]) -> Result<()>) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    for e in extents {
        let file = std::fs::File::open(&e.path)?;
        let mut off = 0u64;
        while off < e.len {
            let n = (e.len - off).min(CHUNK as u64) as usize;
            file.read_exact_at(&mut buf[..n], e.offset + off)?;
            f(&buf[..n])?;
            off += n as u64;
        }
    }
    Ok(())
}

/// A peer process: this binary with a hidden subcommand.
struct Peer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Peer {
    fn spawn(args: Vec<OsString>) -> Result<Peer> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a peer process")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("peer stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::Builder::new()
            .name("peer-out".into())
            .spawn(move || {
                for l in BufReader::new(stdout).lines() {
                    let Ok(l) = l else { break };
                    if tx.send(l).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Peer {
            child,
            stdin,
            lines: rx,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The next line starting with `prefix` (others are echoed), within `timeout`.
    fn expect(&self, prefix: &str, timeout: Duration) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let l = self.lines.recv_timeout(left).with_context(|| {
                format!("waiting for a `{prefix}` line from the peer process (did it exit?)")
            })?;
            if let Some(rest) = l.strip_prefix(prefix) {
                return Ok(rest.trim().to_string());
            }
            println!("peer: {l}");
        }
    }

    fn addr(&self) -> Result<SocketAddr> {
        Ok(self.expect("ADDR ", Duration::from_secs(30))?.parse()?)
    }

    /// Closes stdin (the peer's signal to exit) and waits for it.
    fn finish(mut self) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(st) = self.child.try_wait()? {
                if !st.success() {
                    bail!("peer process exited with {st}");
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("peer process did not exit within 60 s of stdin EOF; killed");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        drop(self.stdin.take());
        if matches!(self.child.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(200));
            if matches!(self.child.try_wait(), Ok(None)) {
                let _ = self.child.kill();
            }
            let _ = self.child.wait();
        }
    }
}

/// The raw transfers measured beside tidelog.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Raw {
    Tcp,
    Quinn,
    /// Raw quinn whose receiver writes the bytes to disk and syncs them group by group.
    QuinnDisk,
    /// The same, written with `O_DIRECT`.
    QuinnDirect,
}

impl Raw {
    fn name(self) -> &'static str {
        match self {
            Raw::Tcp => "raw tcp",
            Raw::Quinn => "raw quinn",
            Raw::QuinnDisk => "raw quinn→disk",
            Raw::QuinnDirect => "raw quinn→disk O_DIRECT",
        }
    }
}

fn baseline(
    args: &ShipArgs,
    raw: Raw,
    root: &Path,
    certs: &Path,
    extents: &[Extent],
    src: &Source,
) -> Result<Baseline> {
    let name = raw.name();
    println!("[baseline] {name}: {} ...", fmt_bytes(src.bytes));
    let mut peer_args: Vec<OsString> = vec![
        "__sink".into(),
        "--proto".into(),
        if raw == Raw::Tcp { "tcp" } else { "quic" }.into(),
        "--certs-dir".into(),
        certs.into(),
        "--max-udp-payload".into(),
        args.max_udp_payload.to_string().into(),
    ];
    peer_args.extend(args.quic.to_args());
    let disk = root.join("raw-disk");
    if raw_disk_used(raw) {
        std::fs::create_dir_all(&disk)?;
        peer_args.extend(["--durable-dir".into(), disk.clone().into()]);
    }
    if raw == Raw::QuinnDirect {
        peer_args.push("--direct".into());
    }
    let peer = Peer::spawn(peer_args)?;
    let addr = peer.addr()?;
    let (c0, p0) = (cpu::snapshot(None), cpu::snapshot(Some(peer.pid())));
    let (elapsed, n) = match raw {
        Raw::Tcp => tcp_client(addr, extents)?,
        Raw::Quinn | Raw::QuinnDisk | Raw::QuinnDirect => {
            quinn_client(addr, args.quic.tuning(args.max_udp_payload), certs, extents)?
        }
    };
    let (c1, p1) = (cpu::snapshot(None), cpu::snapshot(Some(peer.pid())));
    peer.expect("DONE ", Duration::from_secs(30))?;
    peer.finish()?;
    // Keep the disk free for the runs after.
    if raw_disk_used(raw) {
        let _ = std::fs::remove_dir_all(&disk);
        quiesce();
    }
    if n != src.bytes {
        bail!("{name}: the sink counted {n} bytes, expected {}", src.bytes);
    }
    Ok(Baseline {
        name,
        rate: Rate::new(n, src.records, elapsed),
        cpu_bench: cpu::usage(&c0, &c1),
        cpu_peer: cpu::usage(&p0, &p1),
    })
}

fn raw_disk_used(raw: Raw) -> bool {
    matches!(raw, Raw::QuinnDisk | Raw::QuinnDirect)
}

/// Between runs: writes back what the last one left dirty (an applier's store, deleted
/// files' metadata) and waits for the device to go idle, so that the next run measured does
/// not share the machine with the previous one's writeback and discards.
fn quiesce() {
    crate::wal_bench::sync_all();
    crate::wal_bench::settle_device();
}

fn tcp_client(addr: SocketAddr, extents: &[Extent]) -> Result<(Duration, u64)> {
    use std::io::Read;
    let t0 = Instant::now();
    let mut s = std::net::TcpStream::connect(addr)?;
    for_each_chunk(extents, |c| Ok(s.write_all(c)?))?;
    s.shutdown(std::net::Shutdown::Write)?;
    let mut ack = [0u8; 8];
    s.read_exact(&mut ack)?;
    Ok((t0.elapsed(), u64::from_le_bytes(ack)))
}

fn quinn_client(
    addr: SocketAddr,
    tuning: QuicTuning,
    certs: &Path,
    extents: &[Extent],
) -> Result<(Duration, u64)> {
    let cc =
        tidelog_net::tls::client_config(&tidelog_testkit::pki::load(certs, "shipper")?, &tuning)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let run = async move {
        // The same socket as the shipper's lanes (quic.udp-receive-buffer).
        let ep = tidelog_shipper::client_endpoint(
            SocketAddr::from(([0, 0, 0, 0], 0)),
            tuning.udp_receive_buffer,
        )?;
        let t0 = Instant::now();
        let conn = ep.connect_with(cc, addr, "localhost")?.await?;
        let (mut send, mut recv) = conn.open_bi().await?;
        let mut buf = vec![0u8; CHUNK];
        for e in extents {
            let file = std::fs::File::open(&e.path)?;
            let mut off = 0u64;
            while off < e.len {
                let n = (e.len - off).min(CHUNK as u64) as usize;
                file.read_exact_at(&mut buf[..n], e.offset + off)?;
                send.write_all(&buf[..n]).await?;
                off += n as u64;
            }
        }
        send.finish()?;
        let mut ack = [0u8; 8];
        recv.read_exact(&mut ack).await?;
        let elapsed = t0.elapsed();
        conn.close(quinn::VarInt::from_u32(0), b"done");
        let _ = tokio::time::timeout(Duration::from_secs(3), ep.wait_idle()).await;
        Ok::<_, anyhow::Error>((elapsed, u64::from_le_bytes(ack)))
    };
    rt.block_on(async move {
        tokio::time::timeout(Duration::from_secs(300), run)
            .await
            .context("raw quinn baseline: no answer within 300 s")?
    })
}

/// Ships the backlog to a fresh applier; with `link`, through the impairment proxy.
fn ship_run(
    args: &ShipArgs,
    lanes: usize,
    wal_dir: &Path,
    data: &Path,
    certs: &Path,
    src: &Source,
    link: Option<&Impairment>,
) -> Result<ShipRun> {
    println!(
        "[ship] lanes={lanes}: {} over {} tablets{} ...",
        fmt_bytes(src.bytes),
        src.tablets,
        link.map_or(String::new(), |l| format!(" through {l}"))
    );
    std::fs::create_dir_all(data)?;
    let peer = Peer::spawn(
        vec![
            "__applier".into(),
            "--listen".into(),
            "127.0.0.1:0".into(),
            "--data-dir".into(),
            data.into(),
            "--certs-dir".into(),
            certs.into(),
            "--sync".into(),
            args.sync.name().into(),
            "--max-udp-payload".into(),
            args.max_udp_payload.to_string().into(),
            "--apply-nice".into(),
            args.apply_nice.to_string().into(),
            "--store-nice".into(),
            args.store_nice.to_string().into(),
        ]
        .into_iter()
        .chain(args.direct_io.then(|| "--direct-io".into()))
        .chain((!args.buffered_catch_up).then(|| "--direct-io-in-catch-up".into()))
        .chain([
            "--apply-yield-ms".into(),
            args.apply_yield.as_millis().to_string().into(),
            "--runtime-threads".into(),
            args.runtime_threads.to_string().into(),
        ])
        .chain(args.quic.to_args())
        .collect(),
    )?;
    let addr = peer.addr()?;
    // On a thread of its own in this process (`impair-proxy` in the CPU breakdown).
    let proxy = match link {
        Some(l) => Some(ImpairProxy::start_on_thread(addr, l.clone(), args.seed)?),
        None => None,
    };
    let mut o = ShipperOptions::new(
        wal_dir.to_path_buf(),
        proxy.as_ref().map_or(addr, |p| p.local_addr()),
    );
    o.shipper_id = "tidelog-bench".into();
    o.lanes = lanes;
    o.io_engine = args.io;
    o.max_frame_bytes = usize::try_from(args.frame)?;
    o.window_bytes = args.window;
    o.quic = args.quic.tuning(args.max_udp_payload);
    let tls = tidelog_testkit::pki::load(certs, "shipper")?;
    let (c0, p0) = (cpu::snapshot(None), cpu::snapshot(Some(peer.pid())));
    let t0 = Instant::now();
    let shipper = Shipper::start(o, tls)?;
    let mut received_at: Option<(Duration, cpu::Snapshot, cpu::Snapshot)> = None;
    let mut last_change = Instant::now();
    let mut last = (0u64, 0u64);
    // An impaired run past `--impair-limit`: what had been received and applied.
    let mut cut: Option<(u64, u64)> = None;
    let applied_at = loop {
        let l = peer.expect("", Duration::from_secs(120))?;
        if let Some(e) = l.strip_prefix("ERR ") {
            bail!("applier: {e}");
        }
        let Some(p) = l.strip_prefix("P ") else {
            println!("applier: {l}");
            continue;
        };
        let f: Vec<u64> = p
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        let (recv, applied) = (
            f.first().copied().unwrap_or(0),
            f.get(1).copied().unwrap_or(0),
        );
        if (recv, applied) != last {
            last = (recv, applied);
            last_change = Instant::now();
        } else if last_change.elapsed() > Duration::from_secs(60) {
            bail!(
                "no progress for 60 s: received {recv}, applied {applied} of {}",
                src.bytes
            );
        }
        if received_at.is_none() && recv >= src.bytes {
            let el = t0.elapsed();
            received_at = Some((el, cpu::snapshot(None), cpu::snapshot(Some(peer.pid()))));
        }
        let stop = link.is_some() && t0.elapsed() > args.impair_limit;
        if applied >= src.bytes || stop {
            if applied < src.bytes {
                cut = Some((recv, applied));
            }
            break (
                t0.elapsed(),
                cpu::snapshot(None),
                cpu::snapshot(Some(peer.pid())),
            );
        }
    };
    let (recv_bytes, applied_bytes) = cut.unwrap_or((src.bytes, src.bytes));
    let received_at = match (received_at, cut) {
        (Some(r), _) => r,
        (None, Some(_)) => applied_at.clone(),
        (None, None) => bail!("applied everything before receiving it?"),
    };
    let frames = shipper.status().values().map(|s| s.frames).sum();
    let io_engine = shipper.io_engine().name();
    shipper.shutdown();
    let proxy_stats = proxy.as_ref().map(|p| describe_proxy(&p.stats()));
    drop(proxy);
    peer.finish()?;
    // Records in proportion to the bytes for a run stopped early (the records are alike).
    let records = |bytes: u64| src.records * bytes / src.bytes.max(1);
    Ok(ShipRun {
        lanes,
        io_engine,
        received: Rate::new(
            recv_bytes.min(src.bytes),
            records(recv_bytes.min(src.bytes)),
            received_at.0,
        ),
        applied: Rate::new(applied_bytes, records(applied_bytes), applied_at.0),
        cpu_bench_received: cpu::usage(&c0, &received_at.1),
        cpu_applier_received: cpu::usage(&p0, &received_at.2),
        cpu_bench_applied: cpu::usage(&c0, &applied_at.1),
        cpu_applier_applied: cpu::usage(&p0, &applied_at.2),
        frames,
        link: link.map(|l| l.to_string()),
        proxy: proxy_stats,
        complete: cut.is_none(),
    })
}

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
fn impaired(
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

fn print_baseline(b: &Baseline) {
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

fn print_run(r: &ShipRun) {
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

fn pass(b: bool) -> &'static str {
    if b {
        "PASS"
    } else {
        "MISS"
    }
}

fn print_summary(
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

#[test]
fn median_of_odd_and_even_counts() {
    assert_eq!(median(vec![]), None);
    assert_eq!(median(vec![0.9, 0.7, 0.8]), Some(0.8));
    assert_eq!(median(vec![0.9, 0.7, 0.8, 0.6]), Some(0.75));
}
