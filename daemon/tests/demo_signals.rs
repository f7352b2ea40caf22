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
    let limit = Duration::from_secs(30);
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = demo.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "the demo still runs {limit:?} after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
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
