//! The daemons as systemd services. The test plays systemd's side: a
//! `NOTIFY_SOCKET` datagram socket, `WATCHDOG_USEC` and `WATCHDOG_PID` (the daemon's own pid,
//! set by a `sh -c 'WATCHDOG_PID=$$ exec …'` wrapper) and checks the order of what the real
//! `tidelog apply` / `tidelog ship` binaries say: `STATUS=` first, `READY=1` only once the
//! admin socket answers, `WATCHDOG=1` about every half interval, `STOPPING=1` on SIGTERM,
//! exit 0. Also: a second SIGTERM or a SIGQUIT exits at once, logs carry no ANSI colours and
//! follow `log-level`/RUST_LOG, and `systemd-analyze verify` accepts both units.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The watchdog interval the tests ask for (systemd's `WatchdogSec=`), in microseconds: short,
/// with room for a loaded CI machine's scheduling delays (pings every 500 ms, each gap
/// must stay within 1 s).
const WATCHDOG_USEC: u64 = 1_000_000;

/// systemd's end of `NOTIFY_SOCKET`.
struct Notify {
    sock: UnixDatagram,
    path: PathBuf,
}

impl Notify {
    fn bind(dir: &Path) -> Notify {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        Notify { sock, path }
    }

    /// The next message (one datagram may hold several `KEY=value` lines), or `None` at the
    /// deadline.
    fn recv(&self, deadline: Instant) -> Option<(Instant, Vec<String>)> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return None;
        }
        self.sock.set_read_timeout(Some(left)).unwrap();
        let mut buf = [0u8; 4096];
        match self.sock.recv(&mut buf) {
            Ok(n) => Some((
                Instant::now(),
                String::from_utf8_lossy(&buf[..n])
                    .lines()
                    .filter(|l| !l.is_empty())
                    .map(str::to_string)
                    .collect(),
            )),
            Err(_) => None,
        }
    }

    /// Receives until a line satisfies `want`; returns every line seen before it and the
    /// time it arrived. Panics at the deadline, naming what was seen.
    fn until(
        &self,
        what: &str,
        timeout: Duration,
        want: impl Fn(&str) -> bool,
    ) -> (Instant, Vec<String>) {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            let Some((at, lines)) = self.recv(deadline) else {
                panic!("no {what} within {timeout:?}; saw {seen:?}");
            };
            for l in lines {
                if want(&l) {
                    return (at, seen);
                }
                seen.push(l);
            }
        }
    }
}

/// Starts `tidelog <what> --config cfg` the way systemd would with `Type=notify` and
/// `WatchdogSec=`: `NOTIFY_SOCKET`, `WATCHDOG_USEC`, and `WATCHDOG_PID` = its own pid.
fn start_notified(what: &'static str, cfg: &Path, notify: &Notify, log: &Path) -> Daemon {
    start_notified_with(what, cfg, notify, log, true)
}

/// `tidelog <what> --config cfg` under a fake service manager: `NOTIFY_SOCKET` and
/// `WATCHDOG_USEC`, and — when `watchdog_pid` — `WATCHDOG_PID` naming the daemon (as systemd
/// sets it; set from a shell that then execs the daemon, to know its pid). Without it (as a
/// service manager other than systemd, or a wrapper that drops it, may start the daemon),
/// libsystemd's `sd_watchdog_enabled` takes the pings as this process's.
fn start_notified_with(
    what: &'static str,
    cfg: &Path,
    notify: &Notify,
    log: &Path,
    watchdog_pid: bool,
) -> Daemon {
    let log = std::fs::File::create(log).unwrap();
    let mut cmd = if watchdog_pid {
        let mut c = Command::new("sh");
        c.arg("-c")
            .arg("WATCHDOG_PID=$$; export WATCHDOG_PID; exec \"$0\" \"$1\" --config \"$2\"")
            .arg(bin())
            .arg(what)
            .arg(cfg);
        c
    } else {
        let mut c = Command::new(bin());
        c.arg(what)
            .arg("--config")
            .arg(cfg)
            .env_remove("WATCHDOG_PID");
        c
    };
    let child = cmd
        .env("NOTIFY_SOCKET", &notify.path)
        .env("WATCHDOG_USEC", WATCHDOG_USEC.to_string())
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    Daemon {
        child: Some(child),
        what,
    }
}

fn signal(d: &Daemon, sig: i32) {
    let pid = d.pid();
    assert!(pid > 0, "{} is not running", d.what);
    // SAFETY: kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
}

/// Waits for the daemon to exit; panics at the deadline.
fn wait_exit(d: &mut Daemon, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    let c = d.child.as_mut().unwrap();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            d.child = None;
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "{} did not exit within {timeout:?}",
            d.what
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The pings after READY: at least `n` of them, every gap within the watchdog interval.
fn check_pings(notify: &Notify, n: usize) {
    let interval = Duration::from_micros(WATCHDOG_USEC);
    let deadline = Instant::now() + interval * (2 * n as u32 + 10);
    let mut pings: Vec<Instant> = Vec::new();
    while pings.len() < n {
        let Some((at, lines)) = notify.recv(deadline) else {
            panic!("only {} WATCHDOG=1 pings before the deadline", pings.len());
        };
        if lines.iter().any(|l| l == "WATCHDOG=1") {
            pings.push(at);
        }
    }
    let gaps: Vec<Duration> = pings.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter().all(|g| *g <= interval),
        "a watchdog gap exceeds the interval {interval:?}: {gaps:?}"
    );
    // About half the interval: not a burst, not once per interval.
    let total: Duration = gaps.iter().sum();
    let mean = total / gaps.len() as u32;
    assert!(
        mean >= interval / 4 && mean <= interval * 3 / 4,
        "mean ping gap {mean:?} is not about half of {interval:?}: {gaps:?}"
    );
}

#[test]
fn applier_notifies_status_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    write_records(&c.wal, "t1", 20, |i| format!("v{i}").into_bytes());
    let notify = Notify::bind(dir.path());
    let mut applier = start_notified("apply", &c.applier_cfg, &notify, &dir.path().join("a.log"));

    // STATUS= (recovering) comes before READY=1, and at READY the admin socket answers.
    let (_, before) = notify.until("READY=1", Duration::from_secs(30), |l| l == "READY=1");
    assert!(
        before.iter().any(|l| l.starts_with("STATUS=recovering")),
        "no recovery STATUS before READY: {before:?}"
    );
    assert!(
        !before.iter().any(|l| l == "WATCHDOG=1"),
        "watchdog pings before READY: {before:?}"
    );
    let (code, status) = api(&c.applier_sock, "GET", "/v1/status")
        .expect("the admin socket must answer once READY=1 was sent");
    assert_eq!(code, 200);
    assert_eq!(status["role"], "replica");
    notify.until("STATUS with the safe time", Duration::from_secs(10), |l| {
        l.starts_with("STATUS=safe time")
    });

    // Traffic, so apply workers and intake writers exist and their liveness counts.
    let mut shipper = c.start_shipper();
    wait_for("t1 applied", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["tablets"]["t1"]["applied_records"].as_u64() == Some(20))
    });
    check_pings(&notify, 6);

    // SIGTERM: STOPPING=1, then a clean exit.
    signal(&applier, libc::SIGTERM);
    notify.until("STOPPING=1", Duration::from_secs(10), |l| l == "STOPPING=1");
    let st = wait_exit(&mut applier, Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "applier exit: {st:?}");
    assert!(
        !c.applier_sock.exists(),
        "the admin socket is removed on a clean stop"
    );
    assert!(shipper.terminate(Duration::from_secs(30)));
}

#[test]
fn applier_pings_the_watchdog_when_watchdog_pid_is_unset() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "");
    let notify = Notify::bind(dir.path());
    let mut applier = start_notified_with(
        "apply",
        &c.applier_cfg,
        &notify,
        &dir.path().join("a.log"),
        false,
    );
    notify.until("READY=1", Duration::from_secs(30), |l| l == "READY=1");
    check_pings(&notify, 4);
    signal(&applier, libc::SIGTERM);
    notify.until("STOPPING=1", Duration::from_secs(10), |l| l == "STOPPING=1");
    let st = wait_exit(&mut applier, Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "applier exit: {st:?}");
}

/// After a cutover the safe-time publisher is stopped on purpose: that is not a hang, and
/// the pings go on past the 5 s a silent worker is given.
#[test]
fn a_promoted_applier_keeps_pinging_the_watchdog() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    write_records(&c.wal, "t1", 10, |i| format!("v{i}").into_bytes());
    let notify = Notify::bind(dir.path());
    let mut applier = start_notified("apply", &c.applier_cfg, &notify, &dir.path().join("a.log"));
    notify.until("READY=1", Duration::from_secs(30), |l| l == "READY=1");
    let mut shipper = c.start_shipper();
    wait_for(
        "t1 applied and safe time published",
        Duration::from_secs(30),
        || {
            api(&c.applier_sock, "GET", "/v1/status").is_some_and(|(_, v)| {
                v["tablets"]["t1"]["applied_records"].as_u64() == Some(10)
                    && v["safe_time_initialized"] == true
            })
        },
    );
    assert!(shipper.terminate(Duration::from_secs(30)));
    let (code, rep) = api(&c.applier_sock, "POST", "/v1/promote").unwrap();
    assert_eq!(code, 200, "{rep}");
    // 14 pings at 500 ms: about 7 s, more than notify::MIN_STALL.
    check_pings(&notify, 14);
    signal(&applier, libc::SIGTERM);
    let st = wait_exit(&mut applier, Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "applier exit: {st:?}");
}

#[test]
fn shipper_notifies_ready_after_connecting_then_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    write_records(&c.wal, "t1", 10, |i| format!("v{i}").into_bytes());
    let _applier = c.start_applier();
    wait_for("applier socket", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status").is_some()
    });
    let notify = Notify::bind(dir.path());
    let mut shipper = start_notified("ship", &c.shipper_cfg, &notify, &dir.path().join("s.log"));

    let (_, before) = notify.until("READY=1", Duration::from_secs(30), |l| l == "READY=1");
    assert!(
        before.iter().any(|l| l.starts_with("STATUS=")),
        "no STATUS before READY: {before:?}"
    );
    // READY=1 after the first connection attempt: with the applier up, it connected.
    let (_, st) = api(&c.shipper_sock, "GET", "/v1/status")
        .expect("the admin socket must answer once READY=1 was sent");
    assert_eq!(st["connected_lanes"], 1, "{st}");
    notify.until(
        "STATUS with the shipping state",
        Duration::from_secs(10),
        |l| l.starts_with("STATUS=shipping 1 tablets"),
    );
    check_pings(&notify, 6);

    signal(&shipper, libc::SIGTERM);
    notify.until("STOPPING=1", Duration::from_secs(10), |l| l == "STOPPING=1");
    let st = wait_exit(&mut shipper, Duration::from_secs(30));
    assert_eq!(st.code(), Some(0), "shipper exit: {st:?}");
}

/// The graceful stop is held up by a stuck disk (the shipper's `acked.partial` is a FIFO
/// nobody reads, so recording the acked position blocks); a second SIGTERM still ends the
/// process at once, with 143.
#[test]
fn second_sigterm_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    write_records(&c.wal, "t1", 10, |i| format!("v{i}").into_bytes());
    let fifo = c.wal.join("t1").join("acked.partial");
    let cpath = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo(3) with a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(cpath.as_ptr(), 0o600) }, 0);
    let _applier = c.start_applier();
    let notify = Notify::bind(dir.path());
    let mut shipper = start_notified("ship", &c.shipper_cfg, &notify, &dir.path().join("s.log"));
    notify.until("READY=1", Duration::from_secs(30), |l| l == "READY=1");
    wait_for("t1 acked", Duration::from_secs(30), || {
        api(&c.shipper_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["tablets"]["t1"]["acked_pos"].as_u64() > Some(0))
    });

    signal(&shipper, libc::SIGTERM);
    notify.until("STOPPING=1", Duration::from_secs(10), |l| l == "STOPPING=1");
    // The stop is stuck on the FIFO: still running a while later.
    let c2 = shipper.child.as_mut().unwrap();
    let stuck_until = Instant::now() + Duration::from_millis(500);
    while Instant::now() < stuck_until {
        assert!(
            c2.try_wait().unwrap().is_none(),
            "the graceful stop was not held up: the test setup does not work"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let sent = Instant::now();
    signal(&shipper, libc::SIGTERM);
    let st = wait_exit(&mut shipper, Duration::from_secs(5));
    assert_eq!(st.code(), Some(143), "exit after a second SIGTERM: {st:?}");
    assert!(sent.elapsed() < Duration::from_secs(3));
}

#[test]
fn sigquit_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "");
    let notify = Notify::bind(dir.path());
    let mut applier = start_notified("apply", &c.applier_cfg, &notify, &dir.path().join("a.log"));
    notify.until("READY=1", Duration::from_secs(30), |l| l == "READY=1");
    signal(&applier, libc::SIGQUIT);
    let st = wait_exit(&mut applier, Duration::from_secs(5));
    assert_eq!(st.code(), Some(131), "exit after SIGQUIT: {st:?}");
}

/// Runs the applier with stderr to a file (not a terminal) until its admin socket answers,
/// stops it, and returns what it logged.
fn applier_log(extra: &str, rust_log: Option<&str>) -> String {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::with(dir.path(), "batch", extra, "");
    let log = dir.path().join("a.log");
    let mut cmd = Command::new(bin());
    cmd.arg("apply")
        .arg("--config")
        .arg(&c.applier_cfg)
        .env_remove("RUST_LOG")
        .env_remove("NO_COLOR")
        .env_remove("JOURNAL_STREAM")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    if let Some(v) = rust_log {
        cmd.env("RUST_LOG", v);
    }
    let mut d = Daemon {
        child: Some(cmd.spawn().unwrap()),
        what: "apply",
    };
    wait_for("admin socket", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status").is_some()
    });
    assert!(d.terminate(Duration::from_secs(30)));
    std::fs::read_to_string(&log).unwrap()
}

#[test]
fn logs_are_plain_and_follow_log_level_unless_rust_log() {
    // Default level info, no colours on a non-terminal stderr; the store's and QUIC's own
    // info lines held back (they would bury tidelog's at every start).
    let text = applier_log("", None);
    assert!(text.contains("applier ready"), "{text}");
    assert!(!text.contains("\x1b["), "ANSI escapes in the log: {text:?}");
    assert!(!text.contains("DEBUG"), "{text}");
    let from_libraries = |t: &str| {
        t.lines()
            .filter(|l| {
                l.contains(" INFO ")
                    && [" fjall:", " lsm_tree:", " quinn", " rustls:"]
                        .iter()
                        .any(|lib| l.contains(lib))
            })
            .count()
    };
    assert_eq!(from_libraries(&text), 0, "{text}");
    // A filter that names them lets them through.
    let text = applier_log("", Some("info,fjall=info,lsm_tree=info"));
    assert!(from_libraries(&text) > 0, "{text}");
    // log-level from the config.
    let text = applier_log("log-level = \"debug\"\n", None);
    assert!(
        text.contains("DEBUG"),
        "log-level = debug logs no DEBUG line: {text}"
    );
    assert!(!text.contains("\x1b["), "{text:?}");
    // RUST_LOG wins over the config.
    let text = applier_log("log-level = \"debug\"\n", Some("warn"));
    assert!(
        !text.contains("DEBUG") && !text.contains(" INFO "),
        "{text}"
    );
}

/// `systemd-analyze verify` on both units, with ExecStart/ExecStartPre pointing at the
/// built binary (the units name /usr/bin/tidelog, which a test machine does not have).
/// Skipped with a note where systemd-analyze is missing (`.ci/run` installs it).
#[test]
fn systemd_units_verify() {
    let Some(analyze) = tool("systemd-analyze", "`systemd-analyze verify` of the units") else {
        return;
    };
    let units = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../systemd");
    let dir = tempfile::tempdir().unwrap();
    for unit in ["tidelog-applier.service", "tidelog-shipper.service"] {
        let text = std::fs::read_to_string(units.join(unit)).unwrap();
        assert!(text.contains("/usr/bin/tidelog "), "{unit}");
        let copy = dir.path().join(unit);
        std::fs::write(
            &copy,
            text.replace("/usr/bin/tidelog ", &format!("{} ", bin())),
        )
        .unwrap();
        let out = Command::new(&analyze)
            .arg("verify")
            .arg(&copy)
            .env("SYSTEMD_LOG_LEVEL", "notice")
            .output()
            .unwrap();
        let all = output_text(&out);
        assert!(
            out.status.success(),
            "{unit}: systemd-analyze verify failed:\n{all}"
        );
        for bad in [
            "Unknown key",
            "Unknown section",
            "Failed",
            "bad-setting",
            "Invalid",
        ] {
            assert!(!all.contains(bad), "{unit}: {bad:?} in:\n{all}");
        }
    }
}

/// Nice value of each thread of process `pid`, by thread name.
fn thread_nice(pid: i32) -> Vec<(String, i32)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let (Ok(comm), Ok(stat)) = (
            std::fs::read_to_string(t.path().join("comm")),
            std::fs::read_to_string(t.path().join("stat")),
        ) else {
            continue;
        };
        // Field 19 of stat is the nice value; fields are counted after the "(comm)".
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        if let Some(Ok(n)) = rest.split(' ').nth(16).map(str::parse::<i32>) {
            out.push((comm.trim().to_string(), n));
        }
    }
    out
}

/// `apply-nice` sets the nice value of the apply threads and the safe-time publisher,
/// `store-nice` that of the store's flush and compaction workers, and no other thread
/// changes. (Raised values, which need no privilege.)
#[test]
fn apply_and_store_nice_set_their_threads_only() {
    let own = thread_nice(std::process::id() as i32)
        .first()
        .map(|(_, n)| *n)
        .unwrap();
    if own >= 18 {
        eprintln!("skipped: this test already runs at nice {own}, nothing can be raised twice");
        return;
    }
    let (want, store_want) = (19, 18);
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::with(
        dir.path(),
        "batch",
        &format!("apply-nice = {want}\nstore-nice = {store_want}\napply-threads = 2\n"),
        "",
    );
    let mut a = c.start_applier();
    let pid = a.pid();
    let critical = |name: &str| name.starts_with("apply-") || name == "safe-time";
    let store = |name: &str| name == tidelog_applier::store::WORKER_THREAD;
    wait_for(
        "both apply threads and the safe-time thread at apply-nice, every store worker at \
         store-nice",
        Duration::from_secs(30),
        || {
            let t = thread_nice(pid);
            let workers: Vec<_> = t.iter().filter(|(n, _)| store(n)).collect();
            t.iter().filter(|(n, v)| critical(n) && *v == want).count() == 3
                && !workers.is_empty()
                && workers.iter().all(|(_, v)| *v == store_want)
        },
    );
    let t = thread_nice(pid);
    let workers = t.iter().filter(|(n, _)| store(n)).count();
    let others: Vec<_> = t
        .iter()
        .filter(|(n, _)| !critical(n) && !store(n))
        .collect();
    assert!(!others.is_empty(), "{t:?}");
    for (name, nice) in others {
        assert_eq!(*nice, own, "thread {name} changed: {t:?}");
    }
    // Operators see it in the status: configured, and the threads that got it. The threads
    // are set before the admin socket listens, so wait for it to answer.
    let mut answer = None;
    wait_for(
        "the applier's admin socket",
        Duration::from_secs(30),
        || {
            answer = api(&c.applier_sock, "GET", "/v1/status");
            answer.is_some()
        },
    );
    let (code, st) = answer.unwrap();
    assert_eq!(code, 200, "{st}");
    assert_eq!(st["apply_nice"]["configured"], want, "{st}");
    assert_eq!(st["apply_nice"]["set_threads"], 3, "{st}");
    assert_eq!(st["apply_nice"]["refused_threads"], 0, "{st}");
    assert_eq!(st["store_nice"]["configured"], store_want, "{st}");
    assert_eq!(st["store_nice"]["set_threads"], workers, "{st}");
    // And the intake's UDP receive buffer (quic.udp-receive-buffer, default 8 MiB): at least
    // what rmem_max allows, all of it with CAP_NET_ADMIN.
    let rmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/rmem_max")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let rcv = &st["udp_receive_buffer"];
    assert_eq!(rcv["configured"], 8 << 20, "{st}");
    assert!(
        rcv["bytes"].as_u64().unwrap() >= rmem_max.min(8 << 20),
        "{st}"
    );
    assert!(a.terminate(Duration::from_secs(20)));
}
