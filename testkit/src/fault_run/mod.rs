//! The seeded fault run (`tidelog-bench faults`): the real `tidelog apply` and `tidelog ship`
//! as child processes, the bank load in this process, the link between them through the
//! UDP impairment proxy, and faults injected on a schedule drawn from a seed
//! ([`schedule`]):
//!
//! * `applier_kill`, `shipper_kill`: SIGKILL, then a new process with the same config, as
//!   systemd's `Restart=` would start it;
//! * `partition`: the proxy drops every datagram, both ways, for a few seconds;
//! * `disk_full`: the applier's data-dir is on a small tmpfs (mounted here, as root); a
//!   ballast file fills it until the applier reports `disk_full`, stays a few seconds, and
//!   is removed. The applier must go on by itself: no restart. Where the tmpfs cannot be
//!   mounted, only this fault is skipped, with a note saying why.
//!
//! While it runs, [`watch`] follows the safe time and makes consistent reads of the whole
//! bank back to back. After the load, [`verify`] replays the source WALs against the target.
//! The [`FaultReport`] lists each fault (when, how long, how long until the safe time passed
//! its end, the commits made meanwhile and how many of them the target lacks), then a
//! PASS/MISS line per check:
//!
//! | check | holds when |
//! | --- | --- |
//! | exactly once: state | a consistent read of everything equals the source replay, key by key |
//! | exactly once: records | every tablet applied each of its source records once, up to its end |
//! | exactly once: commits | the binlog holds every source commit and no other |
//! | bank total | every consistent read served during the run holds every account and the total |
//! | safe time monotone | no safe time seen (across restarts) or `read_ht` served was below an earlier one |
//! | recovered | after each fault the safe time passed the fault's end within `recover_within` |
//! | no restart after space returned | the applier reported `disk_full`, left it by itself once the ballast was removed, and is the same process |
//! | no unplanned exit | neither daemon exited but by the run's SIGKILL |

mod report;
pub mod schedule;
mod tmpfs;
mod verify;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use tidelog_wal::HybridTime;

use crate::api::Api;
use crate::cluster::LocalCluster;
use crate::impair::{ImpairProxy, Impairment};
use crate::load::{self, LoadOptions, Workload};
use crate::process::Daemon;
use report::{check, secs};
pub use report::{Check, FaultOutcome, FaultReport, Verdict};
pub use schedule::{FaultKind, PlannedFault};
use tmpfs::Tmpfs;
use watch::{lock, Watch};

/// What to run. [`FaultRunOptions::new`] gives the defaults of `tidelog-bench faults`.
#[derive(Clone, Debug)]
pub struct FaultRunOptions {
    /// The `tidelog` binary.
    pub exe: PathBuf,
    /// Where the run's files go (created; the caller removes it).
    pub dir: PathBuf,
    /// Draws the schedule, the load and the impairment.
    pub seed: u64,
    /// How long the load runs; faults are planned within it. Default 180 s.
    pub duration: Duration,
    /// Default 8.
    pub tablets: usize,
    /// Offered transactions per second. Default 2 000.
    pub rate: f64,
    /// Bank accounts. Default 1 000.
    pub accounts: u64,
    /// The link between shipper and applier outside partitions. Default loss 1 %, delay
    /// 5 ms, jitter 2 ms, reorder 2 %.
    pub impairment: Impairment,
    /// Size of the tmpfs under the applier's data-dir. Default 1 GiB.
    pub tmpfs_size: u64,
    /// Each fault's budget: the safe time passes its end within this long. Default 60 s.
    pub recover_within: Duration,
    /// How long the ballast may take to make the applier report `disk_full`. Default 60 s.
    pub disk_full_within: Duration,
    /// Segment size of the source WALs: large enough that retention never removes the
    /// beginning the replay needs. Default 256 MiB.
    pub source_segment_size: u64,
    /// More top-level applier keys, one `key = value` per line. Default none.
    pub applier_extra: String,
    /// `RUST_LOG` of the daemons. Default `info`.
    pub rust_log: String,
    /// Print a line per event as the run goes.
    pub verbose: bool,
}

impl FaultRunOptions {
    pub fn new(exe: &Path, dir: &Path) -> FaultRunOptions {
        FaultRunOptions {
            exe: exe.to_path_buf(),
            dir: dir.to_path_buf(),
            seed: 1,
            duration: Duration::from_secs(180),
            tablets: 8,
            rate: 2000.0,
            accounts: 1000,
            impairment: Impairment {
                loss: 0.01,
                delay: Duration::from_millis(5),
                jitter: Duration::from_millis(2),
                reorder: 0.02,
                duplicate: 0.0,
            },
            tmpfs_size: 1 << 30,
            recover_within: Duration::from_secs(60),
            disk_full_within: Duration::from_secs(60),
            source_segment_size: 256 << 20,
            applier_extra: String::new(),
            rust_log: "info".into(),
            verbose: false,
        }
    }
}

fn now_ht() -> HybridTime {
    HybridTime::from_system_time(SystemTime::now())
}

/// Where a `disk_full` shows in an applier status: the store's or a tablet's error.
fn disk_full_in(status: &Value) -> Option<String> {
    if status["store"]["state"] == "disk_full" {
        return Some(format!(
            "store: {}",
            status["store"]["error"].as_str().unwrap_or("disk_full")
        ));
    }
    status["tablets"].as_object()?.iter().find_map(|(t, row)| {
        (row["state"] == "disk_full").then(|| {
            format!(
                "tablet {t}: {}",
                row["error"].as_str().unwrap_or("disk_full")
            )
        })
    })
}

/// The running cluster: files, tmpfs, proxy and the two daemons, restarted as systemd
/// would when they exit unplanned (and counted).
struct Cluster {
    o: FaultRunOptions,
    files: LocalCluster,
    // Dropped after the daemons (field order): unmounted once nothing writes there.
    applier: Daemon,
    shipper: Daemon,
    proxy: ImpairProxy,
    tmpfs: Option<Tmpfs>,
    disk_note: Option<String>,
    api: Api,
    /// Exits the run did not cause: what and when.
    unplanned: Vec<String>,
    /// Processes started, per daemon.
    applier_starts: u32,
    t0: Instant,
}

impl Cluster {
    fn start(o: &FaultRunOptions) -> Result<Cluster> {
        std::fs::create_dir_all(&o.dir).with_context(|| format!("creating {}", o.dir.display()))?;
        let files = LocalCluster::write(&o.dir, o.tablets, "1h", "fault-source", &o.applier_extra)?;
        // The applier's data-dir on a tmpfs of its own.
        let (tmpfs, disk_note) = match Tmpfs::mount(&o.dir.join("applier-disk"), o.tmpfs_size) {
            Ok(fs) => {
                let data = fs.path().join("applier");
                replace_line(
                    &files.applier_cfg,
                    &format!("data-dir = \"{}\"", o.dir.join("applier").display()),
                    &format!("data-dir = \"{}\"", data.display()),
                )?;
                (Some(fs), None)
            }
            Err(e) => (None, Some(format!("cannot mount a tmpfs: {e:#}"))),
        };
        // The shipper reaches the applier through the proxy.
        let applier_addr = std::net::SocketAddr::from(([127, 0, 0, 1], files.port));
        let proxy = ImpairProxy::start_on_thread(applier_addr, o.impairment.clone(), o.seed)
            .context("starting the impairment proxy")?;
        replace_line(
            &files.shipper_cfg,
            &format!("applier = \"{applier_addr}\""),
            &format!("applier = \"{}\"", proxy.local_addr()),
        )?;
        let applier = spawn(o, "apply", &files.applier_cfg)?;
        let shipper = spawn(o, "ship", &files.shipper_cfg)?;
        let api = Api::new(&files.applier_sock);
        Ok(Cluster {
            o: o.clone(),
            files,
            applier,
            shipper,
            proxy,
            tmpfs,
            disk_note,
            api,
            unplanned: Vec::new(),
            applier_starts: 1,
            t0: Instant::now(),
        })
    }

    fn say(&self, what: &str) {
        if self.o.verbose {
            println!("  {:>6.1}s  {what}", self.t0.elapsed().as_secs_f64());
        }
    }

    fn status(&self) -> Option<Value> {
        match self.api.get("/v1/status") {
            Ok((200, v)) => Some(v),
            _ => None,
        }
    }

    /// Restarts a daemon that exited without the run killing it, and notes it.
    fn supervise(&mut self) -> Result<()> {
        if let Err(e) = self.applier.check_alive() {
            self.unplanned
                .push(format!("{:.1}s: {e:#}", self.t0.elapsed().as_secs_f64()));
            self.say(&format!("UNPLANNED: {e:#}; restarting it"));
            self.applier = spawn(&self.o, "apply", &self.files.applier_cfg)?;
            self.applier_starts += 1;
        }
        if let Err(e) = self.shipper.check_alive() {
            self.unplanned
                .push(format!("{:.1}s: {e:#}", self.t0.elapsed().as_secs_f64()));
            self.say(&format!("UNPLANNED: {e:#}; restarting it"));
            self.shipper = spawn(&self.o, "ship", &self.files.shipper_cfg)?;
        }
        Ok(())
    }

    /// Waits until `until`, keeping the daemons running (and `each` called every 100 ms).
    fn idle_until(
        &mut self,
        until: Instant,
        mut each: impl FnMut(&mut Cluster) -> Result<()>,
    ) -> Result<()> {
        loop {
            self.supervise()?;
            each(self)?;
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            std::thread::sleep((until - now).min(Duration::from_millis(100)));
        }
    }

    fn inject(&mut self, f: &PlannedFault, watch: &Watch) -> Result<FaultOutcome> {
        let mut out = FaultOutcome {
            planned: *f,
            at: self.t0.elapsed(),
            length: Duration::ZERO,
            recovered_in: None,
            max_lag: Duration::ZERO,
            commits: 0,
            lost: 0,
            skipped: None,
            note: String::new(),
            no_restart: None,
            window: (now_ht(), now_ht()),
        };
        let start = Instant::now();
        let ht_start = now_ht();
        let mut end = None;
        match f.kind {
            FaultKind::ApplierKill => {
                self.say(&format!(
                    "SIGKILL applier (pid {}); restart in {}",
                    self.applier.pid(),
                    secs(f.length)
                ));
                self.applier.kill();
                // (`supervise` leaves a killed daemon alone: it has no child to check.)
                self.idle_until(start + f.length, |_| Ok(()))?;
                self.applier = spawn(&self.o, "apply", &self.files.applier_cfg)?;
                self.applier_starts += 1;
                out.note = format!("restarted as pid {}", self.applier.pid());
            }
            FaultKind::ShipperKill => {
                self.say(&format!(
                    "SIGKILL shipper (pid {}); restart in {}",
                    self.shipper.pid(),
                    secs(f.length)
                ));
                self.shipper.kill();
                self.idle_until(start + f.length, |_| Ok(()))?;
                self.shipper = spawn(&self.o, "ship", &self.files.shipper_cfg)?;
                out.note = format!("restarted as pid {}", self.shipper.pid());
            }
            FaultKind::Partition => {
                self.say(&format!("partition for {}", secs(f.length)));
                self.proxy.set_impairment(Impairment {
                    loss: 1.0,
                    ..Impairment::default()
                });
                let r = self.idle_until(start + f.length, |_| Ok(()));
                self.proxy.set_impairment(self.o.impairment.clone());
                r?;
            }
            FaultKind::DiskFull => {
                if self.tmpfs.is_none() {
                    out.skipped = self.disk_note.clone();
                    return Ok(out);
                }
                end = Some(self.disk_episode(f, &mut out)?);
            }
        }
        let end = end.unwrap_or_else(Instant::now);
        // The wall clock of the fault's end, as a hybrid time.
        let ht_end = HybridTime::from_system_time(SystemTime::now() - end.elapsed());
        out.length = end - start;
        let recovered = watch.wait_safe_time(ht_end, self.o.recover_within);
        // (Daemons that exited while we waited are restarted now; the check notes them.)
        self.supervise()?;
        out.recovered_in = recovered.map(|s| s.at.saturating_duration_since(end));
        let until = recovered.map_or_else(Instant::now, |s| s.at);
        out.max_lag = lock(&watch.safe).max_lag(start, until);
        out.window = (ht_start, recovered.map_or_else(now_ht, |s| s.safe));
        self.say(&format!(
            "{} over after {}; {}",
            f.kind,
            secs(out.length),
            match out.recovered_in {
                Some(d) => format!("safe time past its end {} later", secs(d)),
                None => format!(
                    "safe time NOT past its end within {}",
                    secs(self.o.recover_within)
                ),
            }
        ));
        Ok(out)
    }

    /// Fills the tmpfs until the applier reports `disk_full`, keeps it full for the
    /// fault's length, removes the ballast and waits until the applier has left
    /// `disk_full` by itself — the same process throughout.
    /// Returns when the ballast was removed: the fault's end.
    fn disk_episode(&mut self, f: &PlannedFault, out: &mut FaultOutcome) -> Result<Instant> {
        let (pid, starts) = (self.applier.pid(), self.applier_starts);
        let start = Instant::now();
        self.say(&format!("filling the applier's disk (pid {pid})"));
        let mut reported: Option<(Duration, String)> = None;
        let deadline = start + self.o.disk_full_within;
        let fill = |c: &mut Cluster| -> Result<()> {
            if let Some(fs) = &c.tmpfs {
                fs.fill(0)?;
            }
            Ok(())
        };
        while reported.is_none() && Instant::now() < deadline {
            self.idle_until(Instant::now() + Duration::from_millis(50), fill)?;
            reported = self
                .status()
                .as_ref()
                .and_then(disk_full_in)
                .map(|w| (start.elapsed(), w));
        }
        match &reported {
            Some((after, what)) => {
                self.say(&format!("disk_full after {}: {what}", secs(*after)));
                self.idle_until(Instant::now() + f.length, fill)?;
            }
            None => self.say(&format!(
                "the applier did NOT report disk_full within {}",
                secs(self.o.disk_full_within)
            )),
        }
        if let Some(fs) = &self.tmpfs {
            fs.drain()?;
        }
        let returned = Instant::now();
        self.say("ballast removed");
        // It leaves `disk_full` by itself: the store takes writes and no tablet is full.
        let mut left = None;
        let deadline = returned + self.o.recover_within;
        while Instant::now() < deadline {
            self.supervise()?;
            if self
                .status()
                .is_some_and(|s| s["store"]["state"] == "ok" && disk_full_in(&s).is_none())
            {
                left = Some(returned.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let same = self.applier.pid() == pid && self.applier_starts == starts;
        out.no_restart = Some(reported.is_some() && left.is_some() && same);
        out.note = format!(
            "{}; {}; pid {} {}",
            reported.as_ref().map_or_else(
                || format!(
                    "disk_full NOT reported within {}",
                    secs(self.o.disk_full_within)
                ),
                |(after, what)| format!("disk_full after {} ({})", secs(*after), short(what, 90))
            ),
            left.map_or_else(
                || "did NOT leave disk_full by itself".to_string(),
                |d| format!("left it {} after space returned", secs(d))
            ),
            pid,
            if same {
                "unchanged"
            } else {
                "CHANGED (restarted)"
            }
        );
        Ok(returned)
    }

    /// SIGTERM to both (a clean stop); the tmpfs is unmounted when the cluster drops.
    fn stop(&mut self) {
        for d in [&mut self.shipper, &mut self.applier] {
            if let Err(e) = d.stop(Duration::from_secs(30)) {
                self.unplanned.push(format!("at the end: {e:#}"));
            }
        }
    }
}

fn short(s: &str, n: usize) -> String {
    match s.char_indices().nth(n) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

fn spawn(o: &FaultRunOptions, what: &'static str, cfg: &Path) -> Result<Daemon> {
    let log = o.dir.join(format!(
        "{}.log",
        if what == "apply" {
            "applier"
        } else {
            "shipper"
        }
    ));
    Daemon::spawn(&o.exe, what, cfg, &log, &o.rust_log)
}

fn replace_line(file: &Path, old: &str, new: &str) -> Result<()> {
    let text = std::fs::read_to_string(file)?;
    if !text.contains(old) {
        bail!("{} has no line {old}", file.display());
    }
    std::fs::write(file, text.replace(old, new))?;
    Ok(())
}

/// Runs the fault run: see the module docs.
pub fn run(o: &FaultRunOptions) -> Result<FaultReport> {
    if o.tablets == 0 || o.accounts < 2 {
        bail!("the fault run needs at least one tablet and two accounts");
    }
    let plan = schedule::plan(o.seed, o.duration);
    let mut c = Cluster::start(o)?;
    if let Some(n) = &c.disk_note {
        println!("NOTE: the disk_full faults are skipped: {n}");
    }
    c.applier.wait_until(
        &format!(
            "the applier answering on {}",
            c.files.applier_sock.display()
        ),
        Duration::from_secs(60),
        || Ok(c.api.get("/v1/status").is_ok()),
    )?;

    // The load; timed from when the target carries every tablet.
    let stop = Arc::new(AtomicBool::new(false));
    let mut lo = LoadOptions::new(Workload::Bank, &c.files.wal);
    lo.tablets = o.tablets;
    lo.rate = o.rate;
    lo.duration = None;
    lo.accounts = o.accounts;
    lo.seed = o.seed;
    lo.segment_size = o.source_segment_size;
    lo.session_dir = Some(o.dir.join("sessions"));
    let (ready_tx, ready_rx) = mpsc::sync_channel::<()>(1);
    let ready_api = Api::new(&c.files.applier_sock);
    let ready = move || -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok((200, v)) = ready_api.get("/v1/safe-time?wait-for=1&wait=1s") {
                if v["initialized"] == true {
                    break;
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "the applier's safe time was not initialized within 60 s of the first records"
                );
            }
        }
        let _ = ready_tx.send(());
        Ok(())
    };
    let st2 = stop.clone();
    let load_t = std::thread::Builder::new()
        .name("fault-load".into())
        .spawn(move || load::run_when_ready(lo, &st2, ready, |_| {}))?;
    if ready_rx.recv().is_err() {
        return match load_t.join() {
            Ok(Err(e)) => Err(e.context("the load (before it started)")),
            _ => bail!("the load stopped before it started"),
        };
    }
    let total = o.accounts * load::BANK_INITIAL_BALANCE;
    let mut watch = Watch::start(&c.files.applier_sock, o.accounts, total)?;
    c.t0 = Instant::now();
    c.say(&format!(
        "load running: applier pid {}, shipper pid {}, {} faults planned",
        c.applier.pid(),
        c.shipper.pid(),
        plan.len()
    ));

    let mut faults = Vec::new();
    let result = (|| -> Result<()> {
        for f in &plan {
            let t0 = c.t0;
            c.idle_until(t0 + f.at, |_| Ok(()))?;
            if load_t.is_finished() {
                bail!("the load stopped during the run");
            }
            faults.push(c.inject(f, &watch)?);
        }
        let t0 = c.t0;
        c.idle_until(t0 + o.duration, |_| Ok(()))
    })();
    stop.store(true, Ordering::Relaxed);
    let summary = load_t
        .join()
        .map_err(|_| anyhow::anyhow!("the load thread panicked"))?
        .context("the load")?;
    result?;

    // Everything the load wrote becomes visible: its final heartbeats are above every commit.
    let last = summary
        .tablet_ends
        .iter()
        .filter_map(|t| t.last_ht)
        .min()
        .unwrap_or(HybridTime::MIN);
    let t_end = Instant::now();
    let caught_up = watch.wait_safe_time(last, o.recover_within);
    c.supervise()?;
    c.say(&format!(
        "load stopped after {} transactions; {}",
        summary.txns_committed,
        match caught_up {
            Some(s) => format!("caught up {} later", secs(s.at - t_end)),
            None => "NOT caught up".into(),
        }
    ));
    watch.stop();

    let report = verify_run(o, &mut c, &watch, &summary, faults, caught_up.is_some());
    c.stop();
    let mut report = report?;
    report.checks.push(check(
        "no unplanned exit",
        c.unplanned.is_empty(),
        if c.unplanned.is_empty() {
            "neither daemon exited but by the run's SIGKILLs; both stopped cleanly at the end"
                .into()
        } else {
            c.unplanned.join("; ")
        },
    ));
    Ok(report)
}

fn verify_run(
    o: &FaultRunOptions,
    c: &mut Cluster,
    watch: &Watch,
    summary: &load::Summary,
    mut faults: Vec<FaultOutcome>,
    caught_up: bool,
) -> Result<FaultReport> {
    let src = verify::replay(&c.files.wal)?;
    let status = c
        .status()
        .context("no status from the applier after the run")?;
    let target = verify::target_state(&c.api)?;
    let binlog = verify::target_binlog(&c.api)?;
    let state = verify::diff_state(&src.state, &target);
    let (missing, extra) = verify::diff_commits(&src.commits, &binlog);

    // Per tablet: applied each record once, up to the end.
    let (mut lost, mut twice, mut records, mut off_end) = (0u64, 0u64, 0u64, Vec::new());
    for (t, n) in &src.records {
        records += n;
        let row = &status["tablets"][t.as_str()];
        let applied = row["applied_records"].as_u64().unwrap_or(0);
        lost += n.saturating_sub(applied);
        twice += applied.saturating_sub(*n);
        let end = summary
            .tablet_ends
            .iter()
            .find(|e| e.tablet == *t)
            .map_or(0, |e| e.end_pos.0);
        if row["applied_pos"].as_u64() != Some(end) {
            off_end.push(format!("{t} applied to {} of {end}", row["applied_pos"]));
        }
    }
    for f in faults.iter_mut().filter(|f| f.skipped.is_none()) {
        let (from, to) = (f.window.0 .0, f.window.1 .0);
        let inside = |c: &&verify::Commit| c.ht >= from && c.ht <= to;
        f.commits = src.commits.iter().filter(inside).count() as u64;
        f.lost = missing.iter().filter(inside).count() as u64;
    }

    let safe = lock(&watch.safe);
    let reads = lock(&watch.reads);
    let mut checks = vec![
        check(
            "exactly once: state",
            state.differing == 0,
            format!(
                "target = replay of the source WALs key by key: {} keys compared, {} differ{}",
                state.compared,
                state.differing,
                if state.examples.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", state.examples.join("; "))
                }
            ),
        ),
        check(
            "exactly once: records",
            lost == 0 && twice == 0 && off_end.is_empty(),
            format!(
                "{records} source records over {} tablets: {lost} lost, {twice} applied twice{}",
                src.records.len(),
                if off_end.is_empty() {
                    ", every tablet applied to its end".to_string()
                } else {
                    format!("; {}", off_end.join(", "))
                }
            ),
        ),
        check(
            "exactly once: commits",
            missing.is_empty() && extra.is_empty(),
            format!(
                "{} source commits, {} in the binlog: {} missing, {} not from the source{}",
                src.commits.len(),
                binlog.len(),
                missing.len(),
                extra.len(),
                missing
                    .first()
                    .map_or(String::new(), |m| format!(" (first missing: {m:?})"))
            ),
        ),
        check(
            "bank total at every consistent read",
            reads.failure_count == 0 && reads.served > 0,
            format!(
                "{} reads served, each {} accounts summing to {}: {} wrong{}; {} answered 503 and {} not answered (the applier down)",
                reads.served,
                o.accounts,
                o.accounts * load::BANK_INITIAL_BALANCE,
                reads.failure_count,
                reads
                    .failures
                    .first()
                    .map_or(String::new(), |f| format!(" (first: {f})")),
                reads.unavailable,
                reads.unanswered
            ),
        ),
        check(
            "safe time monotone",
            safe.regression_count == 0 && !safe.samples.is_empty(),
            format!(
                "{} safe times seen across {} applier processes: {} below an earlier one{}",
                safe.samples.len(),
                c.applier_starts,
                safe.regression_count,
                safe.regressions
                    .first()
                    .map_or(String::new(), |(a, b)| format!(" (first: {a} then {b})"))
            ),
        ),
    ];
    let injected: Vec<&FaultOutcome> = faults.iter().filter(|f| f.skipped.is_none()).collect();
    let slow: Vec<String> = injected
        .iter()
        .filter(|f| f.recovered_in.is_none())
        .map(|f| format!("{} at {}", f.planned.kind, secs(f.at)))
        .collect();
    checks.push(check(
        "recovered",
        slow.is_empty() && caught_up,
        format!(
            "after each of {} faults the safe time passed its end within {}{}; {}",
            injected.len(),
            secs(o.recover_within),
            if slow.is_empty() {
                String::new()
            } else {
                format!(" (not: {})", slow.join(", "))
            },
            if caught_up {
                "caught up after the load"
            } else {
                "NOT caught up after the load"
            }
        ),
    ));
    let disks: Vec<&FaultOutcome> = injected
        .iter()
        .copied()
        .filter(|f| f.planned.kind == FaultKind::DiskFull)
        .collect();
    checks.push(match &c.disk_note {
        Some(n) => Check {
            name: "no restart after space returned".into(),
            verdict: Verdict::Skip,
            detail: format!("no disk_full fault: {n}"),
        },
        None => check(
            "no restart after space returned",
            !disks.is_empty() && disks.iter().all(|f| f.no_restart == Some(true)),
            format!(
                "{} disk_full episodes: the applier reported disk_full, left it by itself and kept its pid in {}",
                disks.len(),
                disks.iter().filter(|f| f.no_restart == Some(true)).count()
            ),
        ),
    });
    Ok(FaultReport {
        seed: o.seed,
        duration: o.duration,
        tablets: o.tablets,
        rate: o.rate,
        impairment: o.impairment.clone(),
        faults,
        checks,
        txns_committed: summary.txns_committed,
        records,
        records_lost: lost,
        records_applied_twice: twice,
        link: describe_link(&c.proxy),
        disk_note: c.disk_note.clone(),
    })
}

fn describe_link(p: &ImpairProxy) -> String {
    let s = p.stats();
    format!(
        "to the applier {} datagrams ({} lost, {} reordered), back {} ({} lost, {} reordered)",
        s.to_target.received,
        s.to_target.lost,
        s.to_target.reordered,
        s.to_client.received,
        s.to_client.lost,
        s.to_client.reordered
    )
}
