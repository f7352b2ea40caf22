//! Kit for end-to-end tests with real daemons: certificates via `tidelog certs init`,
//! generated configs on 127.0.0.1 with a free UDP port, child processes that are killed
//! when dropped, the admin API through `tidelog::ctl::call`, and deadline waits.
#![allow(dead_code, clippy::unwrap_used)]

#[path = "../../../applier/tests/common/tmpfs.rs"]
pub mod tmpfs;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

pub mod prom;
pub mod records;

/// Set (by `.ci/run`) to make the checks by external tools (promtool, systemd-analyze)
/// mandatory; without it a test whose tool is missing skips that check with a note.
pub const REQUIRE_TOOLS: &str = "TIDELOG_REQUIRE_TEST_TOOLS";

/// `name` found on PATH, for the `check` it does. Missing: a printed note and `None`, or a
/// panic when [`REQUIRE_TOOLS`] is set.
pub fn tool(name: &str, check: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var_os(REQUIRE_TOOLS).is_none(),
            "{name} is missing and {REQUIRE_TOOLS} is set: `bash .ci/run` installs it"
        );
        eprintln!(
            "note: {name} is not on PATH: {check} skipped (`bash .ci/run` installs it and runs it)"
        );
    }
    found
}

pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tidelog")
}

/// `tidelog <args>` (in `cwd` when given; RUST_LOG unset, so a daemon's `log-level` key
/// counts), killed if it has not exited within `limit` (a daemon that starts instead of
/// failing); its output.
pub fn tidelog_bounded_in(
    cwd: Option<&Path>,
    args: &[&str],
    limit: Duration,
) -> std::process::Output {
    let mut cmd = Command::new(bin());
    cmd.args(args)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(d) = cwd {
        cmd.current_dir(d);
    }
    let mut child = cmd.spawn().unwrap();
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "tidelog {args:?} still running after {limit:?}; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A UDP port free right now on 127.0.0.1.
pub fn free_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A test cluster's files: certificates, configs, WAL dir, applier data dir, sockets, logs.
pub struct Cluster {
    pub root: PathBuf,
    pub wal: PathBuf,
    pub data: PathBuf,
    pub applier_cfg: PathBuf,
    pub shipper_cfg: PathBuf,
    pub applier_sock: PathBuf,
    pub shipper_sock: PathBuf,
    pub port: u16,
}

impl Cluster {
    pub fn new(root: &Path, sync: &str, extra_shipper: &str) -> Cluster {
        Cluster::with(root, sync, "", extra_shipper)
    }

    /// Like `new`, with extra top-level applier keys (e.g. `max-staleness = "1m"\n`).
    pub fn with(root: &Path, sync: &str, extra_applier: &str, extra_shipper: &str) -> Cluster {
        certs_init(&root.join("tls"));
        let port = free_udp_port();
        let c = Cluster {
            root: root.to_path_buf(),
            wal: root.join("wal"),
            data: root.join("applier"),
            applier_cfg: root.join("applier.toml"),
            shipper_cfg: root.join("shipper.toml"),
            applier_sock: root.join("applier.sock"),
            shipper_sock: root.join("shipper.sock"),
            port,
        };
        std::fs::create_dir_all(&c.wal).unwrap();
        let tls = root.join("tls");
        let t = |f: &str| tls.join(f).display().to_string();
        // Small received segments (rotation and retention run in tests) unless the test
        // sets its own.
        let segment = if extra_applier.contains("segment-size") {
            ""
        } else {
            "segment-size = \"1MiB\"\n"
        };
        std::fs::write(
            &c.applier_cfg,
            format!(
                "listen = \"127.0.0.1:{port}\"\ndata-dir = \"{}\"\nadmin-socket = \"{}\"\nsync = \"{sync}\"\n{segment}{extra_applier}[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[quic]\nidle-timeout = \"1s\"\n",
                c.data.display(),
                c.applier_sock.display(),
                t("ca.pem"),
                t("applier.pem"),
                t("applier.key")
            ),
        )
        .unwrap();
        std::fs::write(
            &c.shipper_cfg,
            format!(
                "wal-dir = \"{}\"\napplier = \"127.0.0.1:{port}\"\nadmin-socket = \"{}\"\nshipper-id = \"test-source\"\nreconnect-min = \"20ms\"\nreconnect-max = \"300ms\"\n{extra_shipper}[tls]\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n[quic]\nidle-timeout = \"1s\"\n",
                c.wal.display(),
                c.shipper_sock.display(),
                t("ca.pem"),
                t("shipper.pem"),
                t("shipper.key")
            ),
        )
        .unwrap();
        c
    }

    /// Moves the applier's `data-dir` to `to` (e.g. a small tmpfs) in its config.
    pub fn move_data_dir(&mut self, to: &Path) {
        let cfg = std::fs::read_to_string(&self.applier_cfg).unwrap();
        let old = format!("data-dir = \"{}\"", self.data.display());
        assert!(cfg.contains(&old), "{cfg}");
        let cfg = cfg.replace(&old, &format!("data-dir = \"{}\"", to.display()));
        std::fs::write(&self.applier_cfg, cfg).unwrap();
        self.data = to.to_path_buf();
    }

    pub fn start_applier(&self) -> Daemon {
        Daemon::start("apply", &self.applier_cfg, &self.root.join("applier.log"))
    }

    pub fn start_shipper(&self) -> Daemon {
        Daemon::start("ship", &self.shipper_cfg, &self.root.join("shipper.log"))
    }
}

/// A daemon child process; SIGKILLed and reaped when dropped.
pub struct Daemon {
    pub child: Option<Child>,
    pub what: &'static str,
}

impl Daemon {
    pub fn start(what: &'static str, cfg: &Path, log: &Path) -> Daemon {
        Daemon::start_env(what, cfg, log, &[])
    }

    /// Like `start`, with extra environment variables (e.g. `FAILPOINTS`).
    pub fn start_env(what: &'static str, cfg: &Path, log: &Path, env: &[(&str, &str)]) -> Daemon {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let child = Command::new(bin())
            .arg(what)
            .arg("--config")
            .arg(cfg)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
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

    /// Whether the process still runs (has not exited).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().map_or(0, |c| c.id() as i32)
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then waits up to `timeout` for a clean exit; returns whether it exited 0.
    pub fn terminate(&mut self, timeout: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return false;
        };
        // SAFETY: plain kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait().unwrap() {
                return st.success();
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// `tidelog certs init --dir dir`: a CA and the two ends' certificates.
pub fn certs_init(dir: &Path) {
    let st = Command::new(bin())
        .args(["certs", "init", "--dir"])
        .arg(dir)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "certs init: {}",
        String::from_utf8_lossy(&st.stderr)
    );
}

/// GET (or POST) a route on an admin socket; `None` while the daemon is not answering.
pub fn api(socket: &Path, method: &str, path: &str) -> Option<(u16, Value)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let m = axum::http::Method::from_bytes(method.as_bytes()).unwrap();
    let a = rt
        .block_on(async {
            tokio::time::timeout(Duration::from_secs(5), tidelog::ctl::call(socket, m, path)).await
        })
        .ok()?
        .ok()?;
    let v = serde_json::from_slice(&a.body).unwrap_or(Value::Null);
    Some((a.status.as_u16(), v))
}

/// `GET /metrics` on an admin socket: the status and the Prometheus text; `None` while the
/// daemon is not answering.
pub fn scrape(socket: &Path) -> Option<(u16, String)> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let a = rt
        .block_on(async {
            tokio::time::timeout(
                Duration::from_secs(10),
                tidelog::ctl::call(socket, axum::http::Method::GET, "/metrics"),
            )
            .await
        })
        .ok()?
        .ok()?;
    Some((a.status.as_u16(), String::from_utf8(a.body.to_vec()).ok()?))
}

pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Appends JSON-line records (one per string) with `tidelog wal append --sync always`.
pub fn wal_append(wal: &Path, lines: &[String]) {
    let mut c = Command::new(bin())
        .args(["wal", "append", "--sync", "always", "--dir"])
        .arg(wal)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    c.stdin
        .take()
        .unwrap()
        .write_all(lines.join("\n").as_bytes())
        .unwrap();
    assert!(c.wait().unwrap().success());
}

/// The `items` of a `/v1/scan` answer as key → value (UTF-8 keys and values).
pub fn scan_items(v: &Value) -> BTreeMap<String, String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["key"].as_str().unwrap().to_string(),
                i["value"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Hybrid time `ago` before now (physical microseconds, logical 0).
pub fn ht_ago(ago: Duration) -> u64 {
    tidelog_wal::HybridTime::from_system_time(std::time::SystemTime::now() - ago).0
}

/// The hybrid time of now (physical microseconds, logical 0).
pub fn now_ht() -> u64 {
    tidelog_wal::HybridTime::from_system_time(std::time::SystemTime::now()).0
}

/// Appends `n` write records (`<tablet>/k<i>` = `value(i)`) to `tablet` in `wal` with the
/// library writer, hybrid times from the wall clock, and syncs them.
pub fn write_records(wal: &Path, tablet: &str, n: usize, value: impl Fn(usize) -> Vec<u8>) {
    write_record_range(wal, tablet, 0..n, value);
}

/// Like [`write_records`], for records (and keys) `range`.
pub fn write_record_range(
    wal: &Path,
    tablet: &str,
    range: std::ops::Range<usize>,
    value: impl Fn(usize) -> Vec<u8>,
) {
    use tidelog_wal::{SyncPolicy, TabletId, WalOptions, Writer};
    let t: TabletId = tablet.parse().unwrap();
    let mut w = Writer::open(wal, &t, WalOptions::default()).unwrap();
    for i in range {
        append_write(&mut w, format!("{tablet}/k{i}"), value(i));
    }
    w.commit(SyncPolicy::Always).unwrap();
}

/// Appends one `write` record (`key` = `value`) to `w` at the wall clock's hybrid time, or
/// just after the last record if that is ahead.
pub fn append_write(w: &mut tidelog_wal::Writer, key: String, value: Vec<u8>) {
    use tidelog_wal::{Body, HybridTime, Op, Record};
    let now = HybridTime::from_system_time(std::time::SystemTime::now());
    let ht = match w.last_ht() {
        Some(last) if last >= now => last.next(),
        _ => now,
    };
    w.append(&Record::new(
        ht,
        Body::Write {
            ops: vec![Op::put(key, value)],
            trx_id: None,
            gtid: None,
        },
    ))
    .unwrap();
}

/// A pseudo-terminal: the master end (to type into and read from) and the slave end (for
/// the child's stdin or stdout).
pub fn pty() -> (std::fs::File, std::os::fd::OwnedFd) {
    use std::os::fd::FromRawFd;
    let (mut m, mut s) = (0, 0);
    // SAFETY: openpty(3) writes two descriptors into the integers given; the other
    // arguments may be null.
    let rc = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: both descriptors were just opened and are owned by nobody else.
    unsafe {
        (
            std::fs::File::from_raw_fd(m),
            std::os::fd::OwnedFd::from_raw_fd(s),
        )
    }
}

/// Everything a finished child printed, stdout then stderr.
pub fn output_text(out: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// What was written to the terminal `master` until its other side closed (reading a
/// pseudo-terminal whose slave side is closed fails with EIO: the end).
pub fn read_pty(mut master: std::fs::File) -> String {
    use std::io::Read;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}
