//! `tidelog demo`: the whole product on one machine in one command. Creates a temporary
//! directory and certificates, starts an applier and a shipper as child processes of this
//! binary (the way systemd would: `tidelog apply|ship --config F`), runs the bank workload
//! over 8 tablets with a live progress line, checks the bank total at consistent reads while
//! it runs, prints a summary and stops everything.
//!
//! The progress line (txn/s, MB/s, safe-time lag, the bank check) is redrawn in place on a
//! terminal, one line per second otherwise. The safe-time lag is sampled once a second while
//! the timed load runs: after it ends, its heartbeats stop and so does the safe time, and a
//! sample then would measure the stop. A reader that goes away (`tidelog demo | head -3`)
//! ends the demo quietly (exit 0) after stopping both daemons and removing the directory.
//!
//! SIGTERM or SIGINT (Ctrl-C) while it runs stops the workload, stops both daemons with
//! SIGTERM (a clean stop), removes the directory (unless `--keep`) and exits with 128 + the
//! signal after one line saying so ([`DemoEnd::Interrupted`]); a second signal exits at once, leaving
//! the directory (the daemons still get SIGTERM: `PR_SET_PDEATHSIG`).

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::Value;
use tokio::signal::unix::{signal, SignalKind};

use tidelog_testkit::api::{bank_sum, Api, BANK_SCAN};
use tidelog_testkit::cluster::LocalCluster;
use tidelog_testkit::load::{self, LoadOptions, Workload};
use tidelog_testkit::process::Daemon;

use crate::ctl;

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// How long the bank workload runs.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Tablets (source shards).
    #[arg(long, default_value_t = 8)]
    pub tablets: usize,
    /// Offered load in transactions per second (0 = as fast as the machine goes).
    #[arg(long, default_value_t = 5000.0)]
    pub rate: f64,
    /// Bank accounts.
    #[arg(long, default_value_t = 1000)]
    pub accounts: u64,
    /// Keep the demo directory (configs, WALs, store, logs) instead of removing it.
    #[arg(long)]
    pub keep: bool,
}

/// Sums the bank at the safe time; `None` when no consistent read can be served yet.
fn bank_total(api: &Api) -> Result<Option<(u64, usize, String)>> {
    let (st, v) = api.get(BANK_SCAN)?;
    if st != 200 {
        return Ok(None);
    }
    bank_sum(&v).map(Some)
}

/// How long a daemon of the demo gets to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(20);

fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        _ => "a signal",
    }
}

/// SIGTERM or SIGINT received during the demo: the first one's number, and a wake-up for
/// the demo's waits.
#[derive(Debug, Clone, Default)]
struct Interrupt(Arc<(Mutex<Option<i32>>, Condvar)>);

impl Interrupt {
    /// Handles SIGTERM and SIGINT from now on, on a thread of its own: the first one is
    /// recorded (and wakes [`Interrupt::sleep`]); a second exits the process at once with
    /// 128 + its number, saying that `dir` stays.
    fn install(dir: &Path) -> Result<Interrupt> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("starting the runtime of the signal handlers")?;
        let (mut term, mut int) = {
            let _in_rt = rt.enter();
            (
                signal(SignalKind::terminate()).context("SIGTERM handler")?,
                signal(SignalKind::interrupt()).context("SIGINT handler")?,
            )
        };
        let interrupt = Interrupt::default();
        let (i2, dir) = (interrupt.clone(), dir.to_path_buf());
        std::thread::Builder::new()
            .name("demo-signals".into())
            .spawn(move || {
                rt.block_on(async move {
                    loop {
                        let sig = tokio::select! {
                            Some(()) = term.recv() => libc::SIGTERM,
                            Some(()) = int.recv() => libc::SIGINT,
                            else => return,
                        };
                        if !i2.set(sig) {
                            eprintln!(
                                "tidelog demo: second {}: exiting at once, leaving {}",
                                signal_name(sig),
                                dir.display()
                            );
                            std::process::exit(128 + sig);
                        }
                    }
                });
            })
            .context("spawning the signal thread")?;
        Ok(interrupt)
    }

    /// Records `sig` unless a signal was already recorded; whether it was the first.
    fn set(&self, sig: i32) -> bool {
        let (m, cv) = &*self.0;
        let mut got = m.lock().unwrap_or_else(|p| p.into_inner());
        if got.is_some() {
            return false;
        }
        *got = Some(sig);
        cv.notify_all();
        true
    }

    /// The first signal received, if any.
    fn signal(&self) -> Option<i32> {
        *self.0 .0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An error once a signal was received.
    fn check(&self) -> Result<()> {
        match self.signal() {
            Some(sig) => Err(anyhow!("interrupted by {}", signal_name(sig))),
            None => Ok(()),
        }
    }

    /// Sleeps for `d`, or until a signal arrives (an error then).
    fn sleep(&self, d: Duration) -> Result<()> {
        let (m, cv) = &*self.0;
        let got = m.lock().unwrap_or_else(|p| p.into_inner());
        let (got, _) = cv
            .wait_timeout_while(got, d, |g| g.is_none())
            .unwrap_or_else(|p| p.into_inner());
        drop(got);
        self.check()
    }
}

/// How a demo that did not fail ended.
#[derive(Debug)]
pub enum DemoEnd {
    /// It ran its course.
    Finished,
    /// The reader of its output went away (`tidelog demo | head -3`): stopped quietly.
    OutputClosed,
    /// Stopped by a signal: `main` prints the one line and exits with
    /// [`Interrupted::exit_code`].
    Interrupted(Interrupted),
}

/// The end of a demo stopped by SIGTERM or SIGINT; `main` prints it (one line) and exits
/// with [`Interrupted::exit_code`].
#[derive(Debug)]
pub struct Interrupted {
    /// The signal's number.
    pub signal: i32,
    /// What became of the demo directory.
    pub dir_note: String,
}

impl Interrupted {
    /// 128 + the signal, as a shell reports a process the signal ended.
    pub fn exit_code(&self) -> u8 {
        u8::try_from(128 + self.signal).unwrap_or(1)
    }
}

impl fmt::Display for Interrupted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "tidelog demo: interrupted by {}; workload, applier and shipper stopped, {}",
            signal_name(self.signal),
            self.dir_note
        )
    }
}

pub fn run(args: DemoArgs) -> Result<DemoEnd> {
    if args.tablets == 0 || args.accounts < 2 {
        bail!("the demo needs at least one tablet and two accounts");
    }
    let dir = std::env::temp_dir().join(format!("tidelog-demo-{}", std::process::id()));
    // Before the directory exists: from now on SIGTERM and SIGINT are the demo's to handle.
    let interrupt = Interrupt::install(&dir)?;
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let mut out = Out::new();
    let result = demo(&args, &dir, &interrupt, &mut out);
    if let Some(signal) = interrupt.signal() {
        // Whatever `demo` was doing ended because of the signal (a child that got the
        // terminal's SIGINT too may have exited first): its error is not the story.
        let dir_note = if args.keep {
            format!("directory kept: {}", dir.display())
        } else {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => format!("{} removed", dir.display()),
                Err(e) => format!("removing {}: {e}", dir.display()),
            }
        };
        return Ok(DemoEnd::Interrupted(Interrupted { signal, dir_note }));
    }
    // A reader that went away (`tidelog demo | head -3`) ends the demo as a signal would,
    // quietly: the daemons are stopped (by `demo`) and the directory goes.
    if (args.keep || result.is_err()) && !out.closed {
        let _ = out.line(format_args!("demo directory kept: {}", dir.display()));
    } else if let Err(e) = std::fs::remove_dir_all(&dir) {
        eprintln!("warning: removing {}: {e}", dir.display());
    }
    match result {
        Ok(()) => Ok(DemoEnd::Finished),
        Err(_) if out.closed => Ok(DemoEnd::OutputClosed),
        Err(e) => Err(e),
    }
}

/// `println!` on [`Out`] that returns the write's error (a closed pipe) instead of
/// panicking.
macro_rules! say {
    ($out:expr, $($arg:tt)*) => {
        $out.line(format_args!($($arg)*))?
    };
}

/// The demo's stdout: lines, and the progress line, redrawn in place on a terminal (one
/// line per update otherwise). A write that fails is an error for the caller to stop on;
/// one that failed because the reader went away also sets `closed`.
#[derive(Debug)]
struct Out {
    tty: bool,
    /// A progress line is on the screen without its newline.
    drawn: bool,
    /// A write failed because nobody reads stdout any more.
    closed: bool,
}

impl Out {
    fn new() -> Out {
        use std::io::IsTerminal;
        Out {
            tty: std::io::stdout().is_terminal(),
            drawn: false,
            closed: false,
        }
    }

    /// `r`, noting a reader that went away.
    fn noted(&mut self, r: std::io::Result<()>) -> std::io::Result<()> {
        if let Err(e) = &r {
            self.closed |= crate::output::reader_gone(e);
        }
        r
    }

    fn line(&mut self, text: fmt::Arguments<'_>) -> std::io::Result<()> {
        let r = self.write_line(text);
        self.noted(r)
    }

    fn write_line(&mut self, text: fmt::Arguments<'_>) -> std::io::Result<()> {
        use std::io::Write;
        let mut o = std::io::stdout().lock();
        if std::mem::take(&mut self.drawn) {
            o.write_all(b"\n")?;
        }
        writeln!(o, "{text}")?;
        o.flush()
    }

    fn progress(&mut self, text: fmt::Arguments<'_>) -> std::io::Result<()> {
        if !self.tty {
            return self.line(text);
        }
        let r = self.draw(text);
        self.noted(r)
    }

    fn draw(&mut self, text: fmt::Arguments<'_>) -> std::io::Result<()> {
        use std::io::Write;
        let mut o = std::io::stdout().lock();
        // Back to the start of the line, erase it, draw the new one.
        write!(o, "\r\x1b[2K{text}")?;
        self.drawn = true;
        o.flush()
    }
}

fn demo(args: &DemoArgs, dir: &Path, interrupt: &Interrupt, out: &mut Out) -> Result<()> {
    say!(
        out,
        "tidelog demo: {} tablets, bank workload ({} accounts) for {}, offered {} txn/s",
        args.tablets,
        args.accounts,
        humantime::format_duration(args.duration),
        if args.rate > 0.0 {
            format!("{}", args.rate)
        } else {
            "max".into()
        }
    );
    say!(out, "  directory {}", dir.display());
    let cluster = LocalCluster::write(dir, args.tablets, "1m", "demo-source", "")?;
    let (applier_cfg, shipper_cfg, port) =
        (&cluster.applier_cfg, &cluster.shipper_cfg, cluster.port);
    say!(
        out,
        "  certificates, applier.toml, shipper.toml written; applier on udp 127.0.0.1:{port}"
    );
    let exe = std::env::current_exe().context("locating this binary")?;
    interrupt.check()?;
    let mut applier = Daemon::spawn(&exe, "apply", applier_cfg, &dir.join("applier.log"), "info")?;
    let mut shipper = Daemon::spawn(&exe, "ship", shipper_cfg, &dir.join("shipper.log"), "info")?;
    let result = drive(
        args,
        dir,
        interrupt,
        &mut applier,
        &mut shipper,
        &cluster,
        out,
    );
    if interrupt.signal().is_some() || out.closed {
        // A clean stop (the load thread has stopped: `drive` joined it), not the SIGKILL
        // of their drop. On the normal path `drive` stopped them already.
        for d in [&mut shipper, &mut applier] {
            if let Err(e) = d.stop(STOP_TIMEOUT) {
                eprintln!("warning: {e:#}");
            }
        }
    }
    result
}

/// The bank workload's thread; when dropped (an early return), stopped and joined, so that
/// nothing writes into the demo directory any more.
struct LoadThread {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Result<load::Summary>>>,
}

impl LoadThread {
    fn is_finished(&self) -> bool {
        self.handle.as_ref().is_none_or(JoinHandle::is_finished)
    }

    fn join(mut self) -> Result<load::Summary> {
        let h = self
            .handle
            .take()
            .context("the load thread was joined already")?;
        h.join().map_err(|_| anyhow!("the load thread panicked"))?
    }
}

impl Drop for LoadThread {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.stop.store(true, Ordering::Relaxed);
            let _ = h.join();
        }
    }
}

/// The demo with its daemons running: the workload with its progress lines and checks, the
/// summary, and the daemons' clean stop. Returns early (an error) on a signal.
fn drive(
    args: &DemoArgs,
    dir: &Path,
    interrupt: &Interrupt,
    applier: &mut Daemon,
    shipper: &mut Daemon,
    cluster: &LocalCluster,
    out: &mut Out,
) -> Result<()> {
    let (asock, wal) = (&cluster.applier_sock, &cluster.wal);
    let api = Api::new(asock);
    applier.wait_until(
        &format!("the applier answering on {}", asock.display()),
        Duration::from_secs(30),
        || {
            interrupt.check()?;
            Ok(api.get("/v1/status").is_ok())
        },
    )?;
    say!(
        out,
        "  applier (pid {}) and shipper (pid {}) running\n",
        applier.pid(),
        shipper.pid()
    );

    // The workload, on its own thread.
    let stop = Arc::new(AtomicBool::new(false));
    // The generator's own once-a-second report: this loop's ticks are not in step with
    // its reports, so counts sampled here would show 0 one second and double the next.
    let report: Arc<Mutex<Option<load::Progress>>> = Arc::default();
    let mut lo = LoadOptions::new(Workload::Bank, wal);
    lo.tablets = args.tablets;
    lo.rate = args.rate;
    lo.duration = Some(args.duration);
    lo.accounts = args.accounts;
    lo.session_dir = Some(dir.join("sessions"));
    // Safe time is the minimum over tablets: a tablet that goes without a record holds it
    // back until its heartbeat, so heartbeats come quickly here (8 tablets × 200/s).
    lo.heartbeat_interval = Duration::from_millis(5);
    // When the timed load began (after the bank's initial balances), set by its thread.
    let began: Arc<Mutex<Option<Instant>>> = Arc::default();
    let (st2, r2, b2) = (stop.clone(), report.clone(), began.clone());
    let handle = std::thread::Builder::new()
        .name("bank".into())
        .spawn(move || {
            load::run_when_ready(
                lo,
                &st2,
                || {
                    *b2.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
                    Ok(())
                },
                |p| {
                    *r2.lock().unwrap_or_else(|p| p.into_inner()) = Some(p.clone());
                },
            )
        })?;
    let load = LoadThread {
        stop,
        handle: Some(handle),
    };

    let mut lags: Vec<u64> = Vec::new();
    let mut checks = 0u32;
    let expected = args.accounts * 1000;
    while !load.is_finished() {
        interrupt.sleep(Duration::from_millis(1000))?;
        applier.check_alive()?;
        shipper.check_alive()?;
        let (txn_s, mb_s) = report
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map_or((0.0, 0.0), |p| (p.interval_txn_per_s, p.interval_mb_per_s));
        let began = *began.lock().unwrap_or_else(|p| p.into_inner());
        let (_, st) = api.get("/v1/safe-time").unwrap_or((0, Value::Null));
        let answered = Instant::now();
        // A sample counts only if answered while the timed load ran. When it ends, its
        // records and heartbeats stop and the safe time, rightly, stops with them: a sample
        // taken after that measures the wait since the end (up to the whole second between
        // samples), not the pipeline. Such a last sample was the reported maximum.
        let elapsed = began.map(|b| answered.duration_since(b));
        if elapsed.is_some_and(|e| e >= args.duration) {
            break;
        }
        let lag = st["lag_ms"].as_u64();
        if let (Some(l), Some(_)) = (lag, elapsed) {
            lags.push(l);
        }
        let total = bank_total(&api)?;
        let check = match &total {
            Some((t, n, _)) if *n as u64 == args.accounts => {
                if *t != expected {
                    bail!("bank total at a consistent read is {t}, expected {expected}");
                }
                checks += 1;
                format!("total {t} ok")
            }
            Some((_, n, _)) => format!("{n} accounts visible"),
            None => "safe time not yet initialized".into(),
        };
        out.progress(format_args!(
            "  {:>4.1}s  {:>8.0} txn/s  {:>6.2} MB/s  safe-time lag {:>6}  bank {check}",
            // Tenths of a second, cut (not rounded): within the run, never its end.
            (elapsed.unwrap_or_default().as_millis() / 100) as f64 / 10.0,
            txn_s,
            mb_s,
            lag.map_or("-".into(), |l| format!("{l} ms")),
        ))?;
    }
    let summary = load.join()?;
    // Everything written becomes visible: wait for the safe time to pass the last record.
    let last_ht = summary
        .tablet_ends
        .iter()
        .filter_map(|t| t.last_ht)
        .min()
        .map_or(0, |h| h.0);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, st) = api.get("/v1/safe-time")?;
        let safe: u64 = st["safe_time"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        if safe >= last_ht {
            break;
        }
        if Instant::now() > deadline {
            bail!("safe time did not reach the end of the workload within 60 s");
        }
        interrupt.sleep(Duration::from_millis(20))?;
    }
    let Some((total, n, read_ht)) = bank_total(&api)? else {
        bail!("no consistent read possible after the workload");
    };
    if total != expected || n as u64 != args.accounts {
        bail!(
            "final bank total {total} over {n} accounts, expected {expected} over {}",
            args.accounts
        );
    }
    checks += 1;
    lags.sort_unstable();
    let pct = |q: f64| {
        lags.get(((lags.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    say!(out, "");
    say!(out, "summary");
    say!(
        out,
        "  transactions   {} committed, {} aborted ({:.0} txn/s)",
        summary.txns_committed,
        summary.txns_aborted,
        summary.txn_per_s
    );
    say!(
        out,
        "  WAL            {} records, {:.1} MB ({:.2} MB/s)",
        summary.records,
        summary.bytes as f64 / 1e6,
        summary.mb_per_s
    );
    say!(
        out,
        "  safe-time lag  p50 {} ms, max {} ms (sampled once a second while the load ran)",
        pct(0.5).map_or("-".into(), |v| v.to_string()),
        pct(1.0).map_or("-".into(), |v| v.to_string())
    );
    say!(out, "  bank total     {total} at {checks} consistent reads (last at ht {read_ht}), always {expected}");
    say!(
        out,
        "  last gtid      {}",
        summary.last_gtid.map_or("-".into(), |g| g.to_string())
    );
    // Did my commit land? One committed, one aborted and one never-seen trx id.
    let mut asks: Vec<(String, Option<String>, &str)> = Vec::new();
    if let Some((t, g)) = summary.last_commit {
        asks.push((t.to_string(), Some(g.to_string()), "COMMITTED"));
    }
    match summary.final_aborts.first() {
        Some(t) => asks.push((t.to_string(), None, "ABORTED")),
        None => say!(
            out,
            "  trx_status     (no session ended on an abort this run)"
        ),
    }
    let unknown = summary.last_commit.map_or_else(
        || "1:1".to_string(),
        |(t, _)| format!("{}:{}", t.connect_id, t.commit_counter + 1_000_000),
    );
    asks.push((unknown, None, "UNKNOWN"));
    for (trx, gtid, want) in asks {
        let path = match &gtid {
            Some(g) => format!("/v1/trx/{}?gtid={}", ctl::encode(&trx), ctl::encode(g)),
            None => format!("/v1/trx/{}", ctl::encode(&trx)),
        };
        let (st, v) = api.get(&path)?;
        let state = v["state"].as_str().unwrap_or("-");
        if st != 200 || state != want {
            bail!("trx_status {trx}: HTTP {st}, {v}; expected {want}");
        }
        let detail = match state {
            "COMMITTED" => format!(
                "gtid {} at ht {}",
                v["gtid"].as_str().unwrap_or("-"),
                v["commit_ht"].as_str().unwrap_or("-")
            ),
            _ => v["reason"].as_str().unwrap_or("-").to_string(),
        };
        say!(out, "  trx_status     {trx:<26} {state:<9} {detail}");
    }
    shipper.stop(STOP_TIMEOUT)?;
    applier.stop(STOP_TIMEOUT)?;
    say!(out, "  applier and shipper stopped cleanly (SIGTERM)");
    Ok(())
}
