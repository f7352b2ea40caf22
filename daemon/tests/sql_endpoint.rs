//! The SQL endpoint (`[sql]`) with real daemons and real MySQL clients: the Debian
//! `mariadb` client (skipped with a note where it is not installed; `.ci/run` installs it)
//! and the `mysql_async` connector. Every `trx_status` state, a gtid hint ahead of the
//! target, prepared statements, a restart of the applier, `MASTER_GTID_WAIT`, bad
//! credentials, unsupported statements, garbage bytes, the connection limit, the idle
//! timeout, TLS, and a password file others can read.
#![allow(clippy::unwrap_used)]

mod common;
// The benchmark's minimal client: logs in, then lets a test send any bytes.
#[allow(dead_code)]
#[path = "../../bench/src/sqlwire.rs"]
mod sqlwire;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::records::{abort, heartbeat, intent, write};
use common::*;
use mysql_async::prelude::Queryable;
use serde_json::Value;

const PASSWORD: &str = "s3cret-pw";

/// A cluster whose applier has `[sql]` on a free port with `sql_extra` keys, and a 0600
/// password file.
struct SqlCluster {
    c: Cluster,
    port: u16,
    password_file: PathBuf,
}

fn sql_cluster(root: &Path, sql_extra: &str) -> SqlCluster {
    let c = Cluster::new(root, "batch", "");
    let port = free_tcp_port();
    let password_file = root.join("sql-password");
    std::fs::write(&password_file, format!("{PASSWORD}\n")).unwrap();
    std::fs::set_permissions(&password_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cfg = std::fs::read_to_string(&c.applier_cfg).unwrap();
    cfg.push_str(&format!(
        "[sql]\nlisten = \"127.0.0.1:{port}\"\nuser = \"tidelog\"\npassword-file = \"{}\"\n{sql_extra}",
        password_file.display()
    ));
    std::fs::write(&c.applier_cfg, cfg).unwrap();
    SqlCluster {
        c,
        port,
        password_file,
    }
}

impl SqlCluster {
    fn url(&self, password: &str) -> String {
        format!("mysql://tidelog:{password}@127.0.0.1:{}/", self.port)
    }

    fn status(&self) -> Value {
        let (st, v) = api(&self.c.applier_sock, "GET", "/v1/status").unwrap();
        assert_eq!(st, 200, "{v}");
        v
    }

    /// Waits until the applier answers and its SQL endpoint listens.
    fn wait_ready(&self) {
        wait_for("the SQL endpoint", Duration::from_secs(30), || {
            api(&self.c.applier_sock, "GET", "/v1/status")
                .is_some_and(|(_, v)| v["sql"]["listen"].is_string())
        });
    }
}

fn safe_time(c: &Cluster) -> u64 {
    api(&c.applier_sock, "GET", "/v1/safe-time")
        .and_then(|(_, v)| v["safe_time"].as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// `mariadb … -e statement`: (exit success, stdout, stderr).
fn mariadb(
    exe: &Path,
    port: u16,
    password: &str,
    extra: &[&str],
    statement: &str,
) -> (bool, String, String) {
    let out = Command::new(exe)
        .args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "tidelog"])
        .arg(format!("-p{password}"))
        .args(["-N", "-B", "--connect-timeout=10"])
        .args(extra)
        .args(["-e", statement])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).trim().to_string(),
    )
}

fn mariadb_ok(exe: &Path, port: u16, extra: &[&str], statement: &str) -> String {
    let (ok, out, err) = mariadb(exe, port, PASSWORD, extra, statement);
    assert!(ok, "mariadb -e {statement:?}: {err}");
    out
}

/// The records of `every_state`: 5:1 and 5:2 committed (gtids 0-1-1, 0-1-2), 6:1 aborted,
/// 6:2 undecided; heartbeats past them. Returns the last ht.
fn every_state(wal: &Path) -> u64 {
    let t = now_ht();
    wal_append(
        wal,
        &[
            write("a", t + 10, "5:1", "0-1-1"),
            write("a", t + 20, "5:2", "0-1-2"),
            intent("a", t + 40, 3, "6:1"),
            abort("a", t + 41, 3, "6:1"),
            intent("a", t + 50, 4, "6:2"),
            heartbeat("a", t + 60),
        ],
    );
    t + 60
}

#[test]
fn the_mariadb_client_gets_every_state_and_a_hint_ahead_waits() {
    let Some(exe) = tool("mariadb", "the SQL endpoint with the mariadb client") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let s = sql_cluster(tmp.path(), "");
    let last = every_state(&s.c.wal);
    let _applier = s.c.start_applier();
    let shipper = s.c.start_shipper();
    s.wait_ready();
    wait_for(
        "safe time past the workload",
        Duration::from_secs(30),
        || safe_time(&s.c) >= last,
    );
    for (id, want) in [
        ("5:1", "COMMITTED"),
        ("6:1", "ABORTED"),
        ("6:2", "IN_PROGRESS"),
        ("9:9", "UNKNOWN"),
    ] {
        let got = mariadb_ok(
            &exe,
            s.port,
            &[],
            &format!("select trx_status('{id}','0-1-2')"),
        );
        assert_eq!(got, want, "trx_status('{id}')");
    }
    assert_eq!(
        mariadb_ok(&exe, s.port, &[], "SELECT trx_status('5:2')"),
        "COMMITTED"
    );
    assert_eq!(
        mariadb_ok(&exe, s.port, &[], "select @@gtid_current_pos"),
        "0-1-2"
    );
    let json: Value = serde_json::from_str(&mariadb_ok(
        &exe,
        s.port,
        &["-r"],
        "select trx_status_json('5:1')",
    ))
    .unwrap();
    assert_eq!(json["state"], "COMMITTED");
    assert_eq!(json["gtid"], "0-1-1");
    // SHOW SLAVE STATUS with its column names (`-E`: one `name: value` a line).
    let out = Command::new(&exe)
        .args([
            "-h",
            "127.0.0.1",
            "-P",
            &s.port.to_string(),
            "-u",
            "tidelog",
        ])
        .arg(format!("-p{PASSWORD}"))
        .args(["-E", "-e", "SHOW SLAVE STATUS"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| -> String {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{name}: ")))
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
            .to_string()
    };
    assert_eq!(field("Slave_IO_Running"), "Yes", "{text}");
    assert_eq!(field("Slave_SQL_Running"), "Yes", "{text}");
    assert_eq!(field("Gtid_IO_Pos"), "0-1-2", "{text}");
    assert!(
        field("Seconds_Behind_Master").parse::<u64>().is_ok(),
        "{text}"
    );

    // Unsupported: error 1235 naming what is supported.
    let (ok, _, err) = mariadb(&exe, s.port, PASSWORD, &[], "select * from orders");
    assert!(!ok);
    assert!(err.contains("ERROR 1235"), "{err}");
    assert!(err.contains("trx_status("), "{err}");
    // A bad password: 1045.
    let (ok, _, err) = mariadb(&exe, s.port, "wrong", &[], "select 1");
    assert!(!ok);
    assert!(err.contains("ERROR 1045"), "{err}");

    // The client saw gtid 0-1-3 for its commit; the target has not: the look-up waits for
    // it, then answers IN_PROGRESS (never a false UNKNOWN).
    let (st, _) = api(&s.c.shipper_sock, "POST", "/v1/pause").unwrap();
    assert_eq!(st, 200);
    wal_append(&s.c.wal, &[write("a", now_ht(), "5:3", "0-1-3")]);
    let t0 = Instant::now();
    let got = mariadb_ok(&exe, s.port, &[], "select trx_status('5:3', '0-1-3', 1)");
    assert!(t0.elapsed() >= Duration::from_secs(1), "answered too early");
    assert_eq!(got, "IN_PROGRESS");
    let json: Value = serde_json::from_str(&mariadb_ok(
        &exe,
        s.port,
        &["-r"],
        "select trx_status_json('5:3', '0-1-3', 0.2)",
    ))
    .unwrap();
    assert_eq!(json["caught_up"], false, "{json}");
    assert_eq!(json["state"], "IN_PROGRESS", "{json}");
    let (st, _) = api(&s.c.shipper_sock, "POST", "/v1/resume").unwrap();
    assert_eq!(st, 200);
    assert_eq!(
        mariadb_ok(&exe, s.port, &[], "select trx_status('5:3', '0-1-3', 20)"),
        "COMMITTED"
    );
    drop(shipper);
}

#[test]
fn tls_required_refuses_plain_clients_and_serves_ssl_ones() {
    let Some(exe) = tool("mariadb", "the SQL endpoint's TLS with the mariadb client") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let s = sql_cluster(tmp.path(), "tls = \"required\"\n");
    let _applier = s.c.start_applier();
    s.wait_ready();
    let (ok, _, err) = mariadb(&exe, s.port, PASSWORD, &["--skip-ssl"], "select 1");
    assert!(!ok);
    assert!(err.contains("ERROR 3159"), "{err}");
    let ca = tmp.path().join("tls/ca.pem");
    let ca = format!("--ssl-ca={}", ca.display());
    assert_eq!(mariadb_ok(&exe, s.port, &["--ssl"], "select 1"), "1");
    assert_eq!(
        mariadb_ok(
            &exe,
            s.port,
            &["--ssl", &ca, "--ssl-verify-server-cert"],
            "select trx_status('1:1')"
        ),
        "UNKNOWN"
    );
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn connect(url: &str) -> mysql_async::Conn {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match mysql_async::Conn::from_url(url).await {
            Ok(c) => return c,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("connecting to {url}: {e}"),
        }
    }
}

fn server_code(e: &mysql_async::Error) -> Option<u16> {
    match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    }
}

#[test]
fn mysql_async_prepared_statements_restart_and_master_gtid_wait() {
    let tmp = tempfile::tempdir().unwrap();
    let s = sql_cluster(tmp.path(), "");
    let last = every_state(&s.c.wal);
    let mut applier = s.c.start_applier();
    let _shipper = s.c.start_shipper();
    s.wait_ready();
    wait_for(
        "safe time past the workload",
        Duration::from_secs(30),
        || safe_time(&s.c) >= last,
    );
    let rt = rt();
    let url = s.url(PASSWORD);
    let answers = |conn: &mut mysql_async::Conn| {
        rt.block_on(async {
            let mut got = Vec::new();
            for id in ["5:1", "5:2", "6:1", "6:2", "9:9"] {
                let st: Option<String> = conn
                    .exec_first("SELECT trx_status(?, ?)", (id, "0-1-1"))
                    .await
                    .unwrap();
                got.push(st.unwrap());
            }
            let json: Option<String> = conn
                .exec_first("SELECT trx_status_json(?, NULL, ?)", ("5:2", 0.5))
                .await
                .unwrap();
            let json: Value = serde_json::from_str(&json.unwrap()).unwrap();
            got.push(json["gtid"].as_str().unwrap().to_string());
            let pos: Option<String> = conn.query_first("SELECT @@gtid_current_pos").await.unwrap();
            got.push(pos.unwrap());
            got
        })
    };
    let want = [
        "COMMITTED",
        "COMMITTED",
        "ABORTED",
        "IN_PROGRESS",
        "UNKNOWN",
        "0-1-2",
        "0-1-2",
    ];
    let mut conn = rt.block_on(connect(&url));
    assert_eq!(answers(&mut conn), want);
    // Unsupported: 1235, and the connection goes on.
    let e = rt
        .block_on(conn.query_drop("UPDATE t SET x = 1"))
        .unwrap_err();
    assert_eq!(server_code(&e), Some(1235), "{e}");
    let e = rt
        .block_on(conn.exec_drop("SELECT MASTER_GTID_WAIT(?, ?)", ("0-1-1", -1)))
        .unwrap_err();
    assert_eq!(server_code(&e), Some(1210), "{e}");
    let one: Option<i64> = rt.block_on(conn.query_first("SELECT 1")).unwrap();
    assert_eq!(one, Some(1));
    rt.block_on(conn.ping()).unwrap();
    // Bad credentials: 1045.
    let e = rt
        .block_on(mysql_async::Conn::from_url(s.url("wrong")))
        .unwrap_err();
    assert_eq!(server_code(&e), Some(1045), "{e}");

    // The applier restarts: a new connection gets the same answers.
    applier.kill9();
    let _ = rt.block_on(conn.disconnect());
    let _applier = s.c.start_applier();
    let mut conn = rt.block_on(connect(&url));
    wait_for("safe time after restart", Duration::from_secs(30), || {
        safe_time(&s.c) >= last
    });
    assert_eq!(answers(&mut conn), want);

    // MASTER_GTID_WAIT: -1 while the shipper is paused, 0 once it resumes.
    let (st, _) = api(&s.c.shipper_sock, "POST", "/v1/pause").unwrap();
    assert_eq!(st, 200);
    wal_append(&s.c.wal, &[write("a", now_ht(), "5:3", "0-1-3")]);
    let r: Option<i64> = rt
        .block_on(conn.exec_first("SELECT MASTER_GTID_WAIT(?, ?)", ("0-1-3", 0.3)))
        .unwrap();
    assert_eq!(r, Some(-1));
    let r: Option<i64> = rt
        .block_on(conn.query_first("SELECT MASTER_GTID_WAIT('0-1-2', 0)"))
        .unwrap();
    assert_eq!(r, Some(0), "a visible position is reached at once");
    // A wait in progress (seen parked on the safe time in status), then the shipper resumes.
    let url2 = url.clone();
    let waiter = std::thread::spawn(move || {
        self::rt().block_on(async {
            let mut c = connect(&url2).await;
            let r: Option<i64> = c
                .exec_first("SELECT MASTER_GTID_WAIT(?)", ("0-1-3",))
                .await
                .unwrap();
            let _ = c.disconnect().await;
            r
        })
    });
    wait_for("MASTER_GTID_WAIT parked", Duration::from_secs(30), || {
        s.status()["admin_waiters"]["waiting"] == 1
    });
    let (st, _) = api(&s.c.shipper_sock, "POST", "/v1/resume").unwrap();
    assert_eq!(st, 200);
    assert_eq!(waiter.join().unwrap(), Some(0));
    let pos: Option<String> = rt
        .block_on(conn.query_first("SELECT @@gtid_binlog_pos"))
        .unwrap();
    assert_eq!(pos.as_deref(), Some("0-1-3"));
    let _ = rt.block_on(conn.disconnect());
}

/// Reads one MySQL packet's payload (None when the server closed the connection).
fn read_packet(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut h = [0u8; 4];
    s.read_exact(&mut h).ok()?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], 0]) as usize;
    let mut p = vec![0u8; len];
    s.read_exact(&mut p).ok()?;
    Some(p)
}

/// Whether the server closes `s` within `limit` (reads until EOF or an error).
fn closed_within(s: &mut TcpStream, limit: Duration) -> bool {
    s.set_read_timeout(Some(limit)).unwrap();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                return false
            }
            Err(_) => return true,
        }
    }
    false
}

/// Raises this process's open-file limit to its hard limit (a thousand sockets).
fn raise_nofile() -> u64 {
    // SAFETY: getrlimit/setrlimit on a stack struct.
    unsafe {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut r);
        r.rlim_cur = r.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        r.rlim_cur
    }
}

#[test]
fn garbage_a_thousand_connections_and_the_idle_timeout() {
    let tmp = tempfile::tempdir().unwrap();
    let s = sql_cluster(tmp.path(), "max-connections = 40\nidle-timeout = \"2s\"\n");
    let _applier = s.c.start_applier();
    s.wait_ready();
    let addr = format!("127.0.0.1:{}", s.port);

    // Garbage instead of a handshake response, and garbage framing: that connection is
    // closed, the daemon goes on.
    for garbage in [
        vec![0xffu8; 64],
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
        vec![0x05, 0, 0, 1, 0xde, 0xad, 0xbe, 0xef, 0x00],
        vec![0x20, 0, 0, 7, 1, 2, 3],
    ] {
        let mut c = TcpStream::connect(&addr).unwrap();
        let greeting = read_packet(&mut c).unwrap();
        assert_eq!(greeting[0], 10, "protocol 10 greeting");
        c.write_all(&garbage).unwrap();
        assert!(
            closed_within(&mut c, Duration::from_secs(15)),
            "{garbage:?}: not closed"
        );
    }
    let rt = rt();
    let mut conn = rt.block_on(connect(&s.url(PASSWORD)));
    let v: Option<String> = rt
        .block_on(conn.query_first("SELECT trx_status('1:1')"))
        .unwrap();
    assert_eq!(v.as_deref(), Some("UNKNOWN"));
    let _ = rt.block_on(conn.disconnect());
    wait_for("connections closed", Duration::from_secs(10), || {
        s.status()["sql"]["connections"] == 0
    });

    // A thousand connections: 40 are greeted and held, the others refused with 1040 at
    // once; status answers meanwhile.
    let limit = raise_nofile();
    assert!(
        limit >= 1100,
        "RLIMIT_NOFILE {limit} is too low for 1000 connections"
    );
    let mut held = Vec::new();
    let (mut greeted, mut refused) = (0, 0);
    for _ in 0..1000 {
        let mut c = TcpStream::connect(&addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let p = read_packet(&mut c).expect("a first packet");
        match p[0] {
            10 => {
                greeted += 1;
                held.push(c);
            }
            0xff => {
                assert_eq!(u16::from_le_bytes([p[1], p[2]]), 1040, "{p:?}");
                refused += 1;
            }
            other => panic!("first byte {other:#x}"),
        }
    }
    assert_eq!((greeted, refused), (40, 960));
    let t0 = Instant::now();
    let st = s.status();
    assert!(
        t0.elapsed() < Duration::from_secs(5),
        "status took {:?}",
        t0.elapsed()
    );
    assert_eq!(st["sql"]["connections"], 40, "{}", st["sql"]);
    drop(held);
    wait_for("held connections closed", Duration::from_secs(15), || {
        s.status()["sql"]["connections"] == 0
    });

    // Idle for longer than idle-timeout: the server closes the connection.
    let mut conn = rt.block_on(connect(&s.url(PASSWORD)));
    rt.block_on(conn.ping()).unwrap();
    assert_eq!(s.status()["sql"]["connections"], 1);
    wait_for(
        "the idle connection closed",
        Duration::from_secs(15),
        || s.status()["sql"]["connections"] == 0,
    );
    assert!(rt.block_on(conn.ping()).is_err());
    let (_, metrics) = scrape(&s.c.applier_sock).unwrap();
    for needle in [
        "tidelog_applier_sql_connections_refused_total{reason=\"max_connections\"} 960",
        "tidelog_applier_sql_connections_refused_total{reason=\"idle_timeout\"}",
        "tidelog_applier_sql_statements_total{kind=\"trx_status\"}",
        "tidelog_applier_sql_errors_total{code=\"1040\"} 960",
    ] {
        assert!(metrics.contains(needle), "{needle} missing:\n{metrics}");
    }
}

#[test]
fn a_password_file_others_can_read_is_refused_by_check_and_start() {
    let tmp = tempfile::tempdir().unwrap();
    let s = sql_cluster(tmp.path(), "");
    let cfg = s.c.applier_cfg.to_str().unwrap().to_string();
    let out = tidelog_bounded_in(
        None,
        &["apply", "--config", &cfg, "--check"],
        Duration::from_secs(30),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::set_permissions(&s.password_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    for args in [
        &["apply", "--config", cfg.as_str(), "--check"][..],
        &["apply", "--config", cfg.as_str()][..],
    ] {
        let out = tidelog_bounded_in(None, args, Duration::from_secs(30));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(err.contains("sql.password-file"), "{args:?}: {err}");
        assert!(
            err.contains("group or others can read it"),
            "{args:?}: {err}"
        );
    }
}
