//! `tidelog demo` stopped by SIGTERM: its daemons stop, its directory goes, it says so in
//! one line and exits 143.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The demo process; SIGKILLed if the test fails before it exits (its daemons then get
/// SIGTERM through PR_SET_PDEATHSIG).
struct Demo(Child);

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether a process with `pid` runs with `needle` in its command line.
fn running_with(pid: u32, needle: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
}

#[test]
fn sigterm_stops_the_demo_and_removes_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let child = Command::new(common::bin())
        .args(["demo", "--duration", "10m", "--tablets", "2"])
        .args(["--accounts", "100", "--rate", "200"])
        .env("TMPDIR", tmp.path())
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut demo = Demo(child);
    let (tx, rx) = mpsc::channel();
    let stdout = demo.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            if line.is_err() || tx.send(line.unwrap()).is_err() {
                break;
            }
        }
    });
    let mut stderr = demo.0.stderr.take().unwrap();
    let stderr = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    // Until the directory is named, both daemons run and a progress line came.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut dir, mut pids, mut progress) = (None::<PathBuf>, Vec::new(), false);
    let mut seen = Vec::new();
    while dir.is_none() || pids.is_empty() || !progress {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|e| panic!("demo output so far ({e}): {seen:#?}"));
        if let Some(d) = line.trim().strip_prefix("directory ") {
            dir = Some(PathBuf::from(d));
        }
        if line.contains("applier (pid") {
            pids = line
                .split("(pid ")
                .skip(1)
                .map(|p| p.split(')').next().unwrap().parse::<u32>().unwrap())
                .collect();
        }
        progress |= line.contains("txn/s") && line.contains("safe-time lag");
        seen.push(line);
    }
    let dir = dir.unwrap();
    let dir_text = dir.display().to_string();
    assert_eq!(
        dir,
        tmp.path().join(format!("tidelog-demo-{}", demo.0.id())),
        "{seen:#?}"
    );
    assert!(dir.is_dir(), "{dir_text}");
    assert_eq!(pids.len(), 2, "{seen:#?}");
    for pid in &pids {
        assert!(running_with(*pid, &dir_text), "daemon {pid} not running");
    }

    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(demo.0.id() as i32, libc::SIGTERM) };
    let status = exit_within(&mut demo, Duration::from_secs(30));
    let err = stderr.join().unwrap();
    assert_eq!(status.code(), Some(143), "{err}");
    let last = err.lines().last().unwrap_or("");
    assert!(
        last.contains("interrupted by SIGTERM") && last.contains(&format!("{dir_text} removed")),
        "{err}"
    );
    assert!(!err.contains("warning"), "{err}");
    assert!(!Path::new(&dir).exists(), "{dir_text} left behind");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    for pid in &pids {
        assert!(!running_with(*pid, &dir_text), "daemon {pid} still running");
    }
}

/// Waits for `child` to exit within `limit` (killed and a panic otherwise).
fn exit_within(demo: &mut Demo, limit: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(st) = demo.0.try_wait().unwrap() {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "the demo still runs after {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A small, short demo with TMPDIR in `tmp`.
fn small_demo(tmp: &Path, duration: &str) -> Command {
    let mut c = Command::new(common::bin());
    c.args(["demo", "--duration", duration, "--tablets", "2"])
        .args(["--accounts", "100", "--rate", "200"])
        .env("TMPDIR", tmp)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null());
    c
}

#[test]
fn demo_into_head_exits_quietly_and_removes_its_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let mut demo = Demo(
        small_demo(tmp.path(), "1m")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // `| head -3`: three lines read, then the pipe closed.
    let mut out = BufReader::new(demo.0.stdout.take().unwrap());
    for _ in 0..3 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        assert!(!l.is_empty());
    }
    drop(out);
    let mut stderr = demo.0.stderr.take().unwrap();
    let status = exit_within(&mut demo, Duration::from_secs(60));
    let mut err = String::new();
    stderr.read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        !err.contains("panicked") && !err.contains("Broken pipe"),
        "{err}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

#[test]
fn demo_counts_lag_only_while_the_load_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let out = small_demo(tmp.path(), "3s").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Progress lines: `  1.0s  200 txn/s  0.01 MB/s  safe-time lag  12 ms  bank …`.
    let mut lags = Vec::new();
    let mut lines = 0;
    for l in text
        .lines()
        .filter(|l| l.contains("txn/s") && l.contains("safe-time lag"))
    {
        lines += 1;
        let secs: f64 = l
            .split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches('s')
            .parse()
            .unwrap();
        assert!(secs < 3.0, "a sample after the 3 s load ended: {l}\n{text}");
        let after = l.split("safe-time lag").nth(1).unwrap().trim_start();
        if let Some(ms) = after
            .split(" ms")
            .next()
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            lags.push(ms);
        }
    }
    assert!(lines >= 1, "{text}");
    // The summary's maximum is the largest lag shown, not a sample from after the end.
    let summary = text
        .lines()
        .find(|l| l.contains("safe-time lag  p50"))
        .unwrap();
    let max = summary
        .split("max ")
        .nth(1)
        .unwrap()
        .split(" ms")
        .next()
        .unwrap();
    match lags.iter().max() {
        Some(m) => assert_eq!(max, m.to_string(), "{text}"),
        None => assert_eq!(max, "-", "{text}"),
    }
}

#[test]
fn demo_progress_redraws_in_place_on_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    let (master, slave) = common::pty();
    let mut demo = Demo(
        small_demo(tmp.path(), "3s")
            .stdout(Stdio::from(slave))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let reader = std::thread::spawn(move || common::read_pty(master));
    let status = exit_within(&mut demo, Duration::from_secs(120));
    assert!(status.success());
    let text = reader.join().unwrap();
    // Each progress update erases the line it replaces; the lines before and after stay.
    let redraws = text.matches("\r\x1b[2K").count();
    assert!(redraws >= 2, "{text:?}");
    let progress_lines = text
        .split("\r\n")
        .filter(|l| l.contains("txn/s") && l.contains("safe-time lag"))
        .count();
    assert_eq!(progress_lines, 1, "one line on the screen: {text:?}");
    assert!(text.contains("\r\nsummary\r\n"), "{text:?}");
}
