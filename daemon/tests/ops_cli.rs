//! `tidelog certs init` and `tidelog ctl`, run as the real binary; `ctl` talks to a small
//! axum router served in-process by `tidelog::admin::serve` on a temporary socket.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, Query};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tidelog::admin::{self, ApiError};

fn tidelog(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tidelog"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const FILES: [&str; 6] = [
    "ca.pem",
    "ca.key",
    "applier.pem",
    "applier.key",
    "shipper.pem",
    "shipper.key",
];

#[test]
fn certs_init_writes_six_files_keys_0600_and_refuses_to_overwrite() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tls");
    let d = dir.to_str().unwrap();
    let out = tidelog(&[
        "certs",
        "init",
        "--dir",
        d,
        "--san",
        "dr.example",
        "--san",
        "10.9.8.7",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in FILES {
        let meta = std::fs::metadata(dir.join(f)).unwrap();
        let mode = meta.permissions().mode() & 0o777;
        if f.ends_with(".key") {
            assert_eq!(mode, 0o600, "{f}");
            assert!(std::fs::read_to_string(dir.join(f))
                .unwrap()
                .contains("PRIVATE KEY"));
        } else {
            assert_eq!(mode & 0o022, 0, "{f} writable by others");
            assert!(std::fs::read_to_string(dir.join(f))
                .unwrap()
                .contains("BEGIN CERTIFICATE"));
        }
    }
    // The applier certificate carries the SANs; both certificates chain to the CA.
    let applier = tidelog_net::tls::load_certs(&dir.join("applier.pem")).unwrap();
    let der = applier[0].as_ref();
    assert!(der.windows(b"dr.example".len()).any(|w| w == b"dr.example"));
    assert!(der.windows(4).any(|w| w == [10, 9, 8, 7]));
    assert!(der.windows(9).any(|w| w == b"localhost"));
    assert!(der.windows(4).any(|w| w == [127, 0, 0, 1]));

    let before: Vec<Vec<u8>> = FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    let out = tidelog(&["certs", "init", "--dir", d]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to overwrite") && err.contains("--force"),
        "{err}"
    );
    let after: Vec<Vec<u8>> = FILES
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    assert_eq!(before, after, "nothing was touched");

    // One existing file is enough to refuse, and nothing else gets written.
    let dir2 = tmp.path().join("partial");
    std::fs::create_dir(&dir2).unwrap();
    std::fs::write(dir2.join("shipper.key"), "mine").unwrap();
    let out = tidelog(&["certs", "init", "--dir", dir2.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(!dir2.join("ca.pem").exists());

    let out = tidelog(&["certs", "init", "--dir", d, "--force"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_ne!(std::fs::read(dir.join("ca.key")).unwrap(), before[1]);
    let mode = std::fs::metadata(dir.join("ca.key"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    let out = tidelog(&["certs", "init", "--dir", d, "--force", "--san", "bad name!"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("bad name!"));
}

fn status_body() -> Value {
    json!({
        "role": "replica",
        "safe_time": "7300000000000000001",
        "tablets": {
            "t1": {"received_pos": 8192, "applied_pos": 4096, "safe_time": "7300000000000000001", "state": "streaming"},
            "t2": {"received_pos": 0, "applied_pos": 0, "safe_time": "0", "state": "needs_bootstrap"}
        }
    })
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ScanQuery {
    prefix: String,
    #[allow(dead_code)]
    mode: Option<String>,
    #[serde(with = "admin::opt_ht", default)]
    at: Option<u64>,
    limit: Option<u64>,
}

fn router() -> Router {
    Router::new()
        .route("/v1/status", get(|| async { Json(status_body()) }))
        .route(
            "/v1/kv/{key}",
            get(
                |UrlPath(key): UrlPath<String>,
                 Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    if key == "stale" {
                        return Err(ApiError::unavailable(
                            "stale_safe_time",
                            "safe time lags by 20m; laggiest tablet t2",
                        ));
                    }
                    let at = q.get("at").map(|a| admin::parse_ht("at", a)).transpose()?;
                    if key == "missing" {
                        return Ok(Json(json!({"key": key, "found": false, "value": null,
                            "version_ht": null, "read_ht": "9"})));
                    }
                    Ok(Json(json!({
                        "key": key,
                        "found": true,
                        "value": {"b64": "AP8="},
                        "version_ht": "5",
                        "read_ht": at.map_or("9".to_string(), |a| a.to_string()),
                        "mode": q.get("mode"),
                    })))
                },
            ),
        )
        .route(
            "/v1/scan",
            get(
                |admin::ApiQuery(q): admin::ApiQuery<ScanQuery>| async move {
                    Json(json!({
                        "read_ht": q.at.unwrap_or(9).to_string(),
                        "items": [{"key": q.prefix, "value": "v", "version_ht": "3"}],
                        "more": false,
                        "limit": q.limit,
                    }))
                },
            ),
        )
        .route(
            "/v1/promote",
            post(|| async { ApiError::conflict("promoted", "already primary") }),
        )
        .route(
            "/v1/pause",
            post(
                |Query(q): Query<std::collections::HashMap<String, String>>| async move {
                    Json(json!({"ok": true, "tablet": q.get("tablet")}))
                },
            ),
        )
        .route(
            "/metrics",
            get(|| async { admin::prometheus(METRICS.into()) }),
        )
}

const METRICS: &str = "# HELP tidelog_applier_safe_time_lag_seconds Safe-time lag.\n\
                       # TYPE tidelog_applier_safe_time_lag_seconds gauge\n\
                       tidelog_applier_safe_time_lag_seconds 0.5\n\
                       # HELP tidelog_applier_received_bytes_total Bytes received.\n\
                       # TYPE tidelog_applier_received_bytes_total counter\n\
                       tidelog_applier_received_bytes_total{tablet=\"t1\"} 4096\n";

struct Server {
    rt: tokio::runtime::Runtime,
    socket: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start() -> Server {
        Server::start_with(router())
    }

    fn start_with(router: Router) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/applier.sock");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let s = socket.clone();
        let task = rt.spawn(async move {
            admin::serve(&s, router, async move {
                let _ = rx.await;
            })
            .await
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(Instant::now() < deadline, "admin socket never came up");
            std::thread::sleep(Duration::from_millis(5));
        }
        Server {
            rt,
            socket,
            stop: Some(tx),
            task: Some(task),
            _dir: dir,
        }
    }

    fn ctl(&self, args: &[&str]) -> Output {
        let mut all = vec!["ctl", "--socket", self.socket.to_str().unwrap()];
        all.extend_from_slice(args);
        tidelog(&all)
    }

    fn shutdown(mut self) -> PathBuf {
        self.stop.take().unwrap().send(()).unwrap();
        let task = self.task.take().unwrap();
        self.rt.block_on(task).unwrap().unwrap();
        self.socket.clone()
    }
}

#[test]
fn ctl_against_an_admin_server() {
    let srv = Server::start();
    let mode = std::fs::metadata(&srv.socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);

    // --json: the body as is.
    let out = srv.ctl(&["--json", "status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v, status_body());
    assert_eq!(
        text(&out.stdout).trim_end(),
        serde_json::to_string(&status_body()).unwrap()
    );
    // --json after the subcommand works too.
    let out = srv.ctl(&["status", "--json"]);
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        status_body()
    );

    // Human: health first, then a compact table of the tablets.
    let out = srv.ctl(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    let heads: Vec<&str> = s
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| l.split("  ").next().unwrap())
        .collect();
    assert_eq!(
        heads,
        ["applier", "safe time", "laggiest", "errors", "tablets"],
        "{s}"
    );
    assert!(s.contains("errors     t2: needs_bootstrap\n"), "{s}");
    assert!(
        s.contains("tablets    2: 1 needs_bootstrap, 1 streaming\n"),
        "{s}"
    );
    assert!(s.contains("TABLET  STATE            LAG"), "{s}");
    assert!(s.lines().all(|l| l.chars().count() <= 100), "{s}");
    // --wide: every field, the generic way.
    let out = srv.ctl(&["status", "--wide"]);
    let s = text(&out.stdout);
    assert!(
        s.starts_with("role       replica\nsafe_time  7300000000000000001 ("),
        "{s}"
    );
    assert!(s.contains("RECEIVED_POS"), "{s}");

    // Path segments are encoded and decoded back by the server; the mode is passed.
    let out = srv.ctl(&["--json", "get", "a b/c?d&e", "--latest"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["key"], "a b/c?d&e");
    assert_eq!(v["mode"], "latest");
    let out = srv.ctl(&["--json", "get", "k", "--at", "77"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["mode"].as_str(), v["read_ht"].as_str()),
        (Some("consistent"), Some("77"))
    );
    let out = srv.ctl(&["get", "k"]);
    let s = text(&out.stdout);
    assert!(
        s.starts_with("found       true\nkey         k\nvalue       b64:AP8=\n"),
        "{s}"
    );
    assert_eq!(out.status.code(), Some(0));
    // Not found: exit 3, with and without --json.
    for json in [false, true] {
        let mut args = vec!["get", "missing"];
        if json {
            args.push("--json");
        }
        let out = srv.ctl(&args);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert!(text(&out.stdout).contains("false"), "{}", text(&out.stdout));
    }

    // An error answer: exit 1, `error: <code>: <message>` on stderr.
    let out = srv.ctl(&["get", "stale"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        "error: stale_safe_time: safe time lags by 20m; laggiest tablet t2"
    );
    assert!(out.stdout.is_empty());
    // With --json the error body is printed as is, and the exit status is still 1.
    let out = srv.ctl(&["--json", "promote", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v,
        json!({"error": "promoted", "message": "already primary"})
    );
    assert!(text(&out.stderr).contains("error: promoted: already primary"));
    // A route the daemon does not have: the JSON 404.
    let out = srv.ctl(&["binlog", "--from-gtid", "0-1-5"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("error: not_found: no route GET /v1/binlog"),
        "{err}"
    );
    // A bad value the server rejects.
    let out = srv.ctl(&["get", "k", "--at", "notanumber"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "clap rejects it: {}",
        text(&out.stderr)
    );

    let out = srv.ctl(&["scan", "acct/1", "--limit", "5", "--at", "42"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("read_ht  42"), "{s}");
    assert!(s.contains("limit    5"), "{s}");
    assert!(s.contains("acct/1  v      3"), "{s}");

    let out = srv.ctl(&["pause", "--tablet", "t 1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("t 1"));
    let out = srv.ctl(&["metrics"]);
    assert_eq!(text(&out.stdout), METRICS);
    // --json: the exposition parsed, one object per family, on one line when piped.
    let out = srv.ctl(&["metrics", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).lines().count(),
        1,
        "{}",
        text(&out.stdout)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["tidelog_applier_safe_time_lag_seconds"],
        json!({"type": "gauge", "help": "Safe-time lag.", "samples": [{"labels": {}, "value": 0.5}]})
    );
    assert_eq!(
        v["tidelog_applier_received_bytes_total"]["samples"][0],
        json!({"labels": {"tablet": "t1"}, "value": 4096.0})
    );

    let socket = srv.shutdown();
    assert!(!socket.exists(), "the socket is removed on shutdown");
}

#[test]
fn ctl_names_the_socket_it_cannot_reach() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody.sock");
    let out = tidelog(&["ctl", "--socket", missing.to_str().unwrap(), "status"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains(missing.to_str().unwrap()), "{err}");
    assert!(err.contains("cannot connect"), "{err}");
    assert!(err.contains("No such file"), "{err}");

    // A socket file nobody listens on.
    let stale = dir.path().join("stale.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let out = tidelog(&[
        "ctl",
        "--socket",
        stale.to_str().unwrap(),
        "--json",
        "safe-time",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("stale.sock") && err.contains("refused"),
        "{err}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn serve_replaces_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("a.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
    let rt = tokio::runtime::Runtime::new().unwrap();
    let s: &Path = &socket;
    rt.block_on(async {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let s2 = s.to_path_buf();
        let task = tokio::spawn(async move {
            admin::serve(&s2, router(), async move {
                let _ = rx.await;
            })
            .await
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(a) = tidelog::ctl::call(s, hyper::Method::GET, "/v1/status").await {
                assert_eq!(a.status, 200);
                assert_eq!(a.json().unwrap(), status_body());
                break;
            }
            assert!(Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let a = tidelog::ctl::call(s, hyper::Method::GET, "/nope")
            .await
            .unwrap();
        assert_eq!(a.status, 404);
        assert_eq!(a.json().unwrap()["error"], "not_found");
        tx.send(()).unwrap();
        task.await.unwrap().unwrap();
    });
    assert!(!socket.exists());
}

/// `tidelog <args>` (RUST_LOG unset, so a daemon's `log-level` key counts), killed if it
/// has not exited within `limit` (a daemon that starts instead of failing).
fn tidelog_bounded(args: &[&str], limit: Duration) -> Output {
    common::tidelog_bounded_in(None, args, limit)
}

#[test]
fn ship_waits_for_a_missing_wal_dir_and_refuses_a_file() {
    let tmp = tempfile::tempdir().unwrap();
    let c = common::Cluster::new(tmp.path(), "batch", "");
    let cfg = c.shipper_cfg.to_str().unwrap();
    let limit = Duration::from_secs(30);
    let out = tidelog_bounded(&["ship", "--config", cfg, "--check"], limit);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(out.stderr.is_empty(), "{}", text(&out.stderr));

    // Missing: --check passes with a warning naming the key and what the shipper does.
    std::fs::remove_dir(&c.wal).unwrap();
    let out = tidelog_bounded(&["ship", "--config", cfg, "--check"], limit);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let want = format!(
        "warning: {cfg}: key \"wal-dir\": {} does not exist yet; the shipper waits for it to appear",
        c.wal.display()
    );
    assert!(err.contains(&want), "{err}");

    // The daemons started before the WAL directory exists: the shipper logs that it waits,
    // then ships what is written once it appears.
    let _applier = c.start_applier();
    let mut shipper = c.start_shipper();
    let log = tmp.path().join("shipper.log");
    common::wait_for("the shipper's waiting line", limit, || {
        std::fs::read_to_string(&log)
            .is_ok_and(|l| l.contains("the shipper waits for it to appear"))
    });
    // Up and answering, with the directory still missing.
    common::wait_for("the shipper's admin socket", limit, || {
        common::api(&c.shipper_sock, "GET", "/v1/status").is_some()
    });
    assert!(!c.wal.exists());
    common::write_records(&c.wal, "t1", 5, |i| format!("v{i}").into_bytes());
    common::wait_for("t1 applied", limit, || {
        common::api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["tablets"]["t1"]["applied_records"].as_u64() == Some(5))
    });
    let l = std::fs::read_to_string(&log).unwrap();
    assert!(l.contains("wal-dir appeared"), "{l}");
    assert!(shipper.terminate(limit));

    // A file where the directory should be stays an error, with and without --check.
    std::fs::remove_dir_all(&c.wal).unwrap();
    std::fs::write(&c.wal, "not a directory").unwrap();
    for check in [true, false] {
        let mut args = vec!["ship", "--config", cfg];
        if check {
            args.push("--check");
        }
        let out = tidelog_bounded(&args, limit);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        let want = format!(
            "{cfg}: key \"wal-dir\": {} is not a directory",
            c.wal.display()
        );
        assert!(err.contains(&want), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
    }
}

#[test]
fn a_bad_log_level_is_a_config_error_naming_the_file_and_key() {
    let tmp = tempfile::tempdir().unwrap();
    let c = common::Cluster::new(tmp.path(), "batch", "");
    let limit = Duration::from_secs(30);
    for (cmd, path) in [("apply", &c.applier_cfg), ("ship", &c.shipper_cfg)] {
        let cfg = path.to_str().unwrap();
        let good = std::fs::read_to_string(path).unwrap();
        // Top-level keys come before the [tls] table.
        std::fs::write(path, format!("log-level = \"tidelog=notalevel\"\n{good}")).unwrap();
        for check in [true, false] {
            let mut args = vec![cmd, "--config", cfg];
            if check {
                args.push("--check");
            }
            let out = tidelog_bounded(&args, limit);
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            assert!(
                err.contains(&format!("{cfg}: key \"log-level\": invalid filter")),
                "{args:?}: {err}"
            );
            assert!(err.contains("tidelog=notalevel"), "{args:?}: {err}");
        }
        std::fs::write(path, good).unwrap();
        let out = tidelog_bounded(&[cmd, "--config", cfg, "--check"], limit);
        assert!(out.status.success(), "{cmd}: {}", text(&out.stderr));
    }
}

/// An applier's `/v1/status` as the daemon writes it after a cutover: besides the tablets,
/// two maps of scalars (`cutover`, `lookup_cache`).
fn promoted_status_body() -> Value {
    json!({
        "role": "primary",
        "cutover": {
            "cut_ht": "7300000000000000001",
            "cut_time": "2025-01-01T00:00:00.000000Z",
            "cleanup_done": true,
            "removed_versions": 12
        },
        "safe_time": "7300000000000000001",
        "safe_time_initialized": true,
        "listen": "127.0.0.1:7400",
        "lookup_cache": {"state": "warm", "index_bytes": 1234, "cache_size": 268435456},
        "tablets": {
            "t1": {"received_pos": 8192, "applied_pos": 8192, "safe_time": "7300000000000000001", "state": "promoted"}
        }
    })
}

#[derive(serde::Deserialize)]
struct TrxQuery {
    wait: Option<String>,
}

/// Routes answering like a promoted applier: the status above, a scan that finds nothing,
/// and a `trx_status` that echoes the `wait` it was given.
fn promoted_router() -> Router {
    Router::new()
        .route("/v1/status", get(|| async { Json(promoted_status_body()) }))
        .route(
            "/v1/scan",
            get(|| async { Json(json!({"read_ht": "9", "items": [], "more": false})) }),
        )
        .route(
            "/v1/trx/{trx}",
            get(
                |UrlPath(trx): UrlPath<String>, admin::ApiQuery(q): admin::ApiQuery<TrxQuery>| async move {
                    if let Some(w) = &q.wait {
                        admin::parse_wait("wait", w)?;
                    }
                    let state = match trx.as_str() {
                        "1:1" => "COMMITTED",
                        "1:3" => "IN_PROGRESS",
                        "1:4" => "ABORTED",
                        _ => "UNKNOWN",
                    };
                    Ok::<_, ApiError>(Json(json!({"trx_id": trx, "state": state, "wait": q.wait,
                        "caught_up": true, "commit_ht": null, "connect_id": "1", "gtid": null,
                        "reason": null, "safe_time": "7300000000000000001"})))
                },
            ),
        )
}

#[test]
fn ctl_renders_nested_status_fields_and_empty_lists_readably() {
    let srv = Server::start_with(promoted_router());
    let out = srv.ctl(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.starts_with(
            "applier    primary, QUIC on udp 127.0.0.1:7400; promoted at cut \
             2025-01-01T00:00:00.000000Z (cleanup done)\n"
        ),
        "{s}"
    );
    let out = srv.ctl(&["status", "--wide"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(!s.contains('{') && !s.contains('"'), "raw JSON in: {s}");
    let line = |name: &str| {
        s.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in: {s}"))
            .to_string()
    };
    assert!(
        line("lookup_cache").ends_with("  state: warm, cache_size: 268435456, index_bytes: 1234"),
        "{s}"
    );
    let cutover = line("cutover");
    assert!(
        cutover.contains("  cut_ht: 7300000000000000001 (")
            && cutover.ends_with("Z), cut_time: 2025-01-01T00:00:00.000000Z, cleanup_done: true, removed_versions: 12"),
        "{s}"
    );
    assert!(s.contains("TABLET  STATE     SAFE_TIME"), "{s}");

    // A scan that finds nothing: the items line says so instead of dangling.
    let out = srv.ctl(&["scan", "nothing/"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.lines().any(|l| l == "items    (none)"), "{s:?}");
    assert!(s.lines().all(|l| l == l.trim_end()), "{s:?}");
}

#[test]
fn ctl_trx_status_checks_wait_like_the_daemon() {
    let srv = Server::start_with(promoted_router());
    let out = srv.ctl(&["--json", "trx-status", "7:3", "--wait", "250ms"]);
    assert_eq!(out.status.code(), Some(3), "UNKNOWN: {}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["wait"], "250ms", "passed to the daemon as written");
    // A bare number (the daemon refuses it) and a negative duration (which clap used to take
    // for a flag): command-line errors, exit 2, naming the value and what is wanted.
    for bad in ["1", "-1s", "abc"] {
        let out = srv.ctl(&["trx-status", "7:3", "--wait", bad]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--wait {bad}: {err}");
        assert!(
            err.contains(&format!("invalid value '{bad}' for '--wait <DURATION>'")),
            "--wait {bad}: {err}"
        );
        assert!(err.contains("e.g. 5s"), "--wait {bad}: {err}");
        assert!(out.stdout.is_empty());
    }
    let out = srv.ctl(&["trx-status", "7:3", "--wait=-1s"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn ctl_trx_status_prints_state_first_and_exits_by_state() {
    let srv = Server::start_with(promoted_router());
    let out = srv.ctl(&["trx-status", "1:1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(
        s.starts_with("state       COMMITTED\ntrx_id      1:1\n"),
        "{s}"
    );
    for (trx, state, code) in [
        ("1:1", "COMMITTED", 0),
        ("1:2", "UNKNOWN", 3),
        ("1:3", "IN_PROGRESS", 4),
        ("1:4", "ABORTED", 5),
    ] {
        for json in [false, true] {
            let mut args = vec!["trx-status", trx];
            if json {
                args.push("--json");
            }
            let out = srv.ctl(&args);
            assert_eq!(out.status.code(), Some(code), "{args:?}");
            assert!(text(&out.stdout).contains(state), "{args:?}");
        }
    }
}

/// Answers like a shipper: its status, and no applier routes.
fn shipper_router() -> Router {
    Router::new().route(
        "/v1/status",
        get(|| async {
            Json(
                json!({"io_engine": "uring", "io_engine_note": null, "lanes": 1,
                "connected_lanes": 1, "tablets": {}}),
            )
        }),
    )
}

#[test]
fn ctl_says_when_the_socket_is_the_other_daemons() {
    let srv = Server::start_with(shipper_router());
    for args in [
        vec!["get", "acct/1"],
        vec!["trx-status", "7:3"],
        vec!["promote", "--yes"],
    ] {
        let out = srv.ctl(&args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        let want = format!(
            "{} is a shipper's admin socket; `{}` is an applier command",
            srv.socket.display(),
            args[0]
        );
        assert!(err.contains(&want), "{args:?}: {err}");
        assert!(!err.contains("no route"), "{args:?}: {err}");
    }
    // Its own commands work.
    let out = srv.ctl(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("shipper  io engine uring, 1/1 lanes connected\n"));
    // An applier's 404 for a route it does have but a key it does not is not "the wrong
    // daemon": only a missing route is.
    let srv = Server::start();
    let out = srv.ctl(&["binlog"]);
    assert!(
        text(&out.stderr).contains("no route GET /v1/binlog"),
        "{}",
        text(&out.stderr)
    );
}

/// A router that counts the promotes it is asked for.
fn counting_router(promotes: std::sync::Arc<std::sync::atomic::AtomicUsize>) -> Router {
    Router::new().route(
        "/v1/promote",
        post(move || {
            promotes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async {
                Json(
                    json!({"cut_ht": "7300000000000000001", "cut_time": "2026-01-01T00:00:00Z",
                    "lost_commits": 0, "lost_window_ms": 0, "tablets": {}}),
                )
            }
        }),
    )
}

#[test]
fn ctl_promote_needs_yes_or_a_typed_confirmation() {
    use std::io::Write;
    use std::process::Stdio;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let promotes = std::sync::Arc::new(AtomicUsize::new(0));
    let srv = Server::start_with(counting_router(promotes.clone()));
    // No --yes, stdin not a terminal: refused, exit 2, nothing sent.
    let out = srv.ctl(&["promote"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(
        err.contains("irreversible") && err.contains("--yes"),
        "{err}"
    );
    assert_eq!(promotes.load(Ordering::SeqCst), 0);
    // --yes: promoted.
    let out = srv.ctl(&["promote", "--yes"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("cut_ht"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(promotes.load(Ordering::SeqCst), 1);
    // On a terminal: the word typed confirms; anything else does not.
    for (typed, code, sent) in [("no\n", 1, 1), ("promote\n", 0, 2)] {
        let (mut master, slave) = common::pty();
        let child = Command::new(env!("CARGO_BIN_EXE_tidelog"))
            .args(["ctl", "--socket", srv.socket.to_str().unwrap(), "promote"])
            .stdin(Stdio::from(slave))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        master.write_all(typed.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{typed:?}: {err}");
        assert!(err.contains("Type 'promote' to confirm"), "{err}");
        assert_eq!(promotes.load(Ordering::SeqCst), sent, "{typed:?}");
    }
}

#[test]
fn ctl_json_is_pretty_on_a_terminal_and_one_line_in_a_pipe() {
    use std::process::Stdio;
    let srv = Server::start();
    let out = srv.ctl(&["status", "--json"]);
    assert_eq!(text(&out.stdout).lines().count(), 1);
    let (master, slave) = common::pty();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidelog"))
        .args([
            "ctl",
            "--socket",
            srv.socket.to_str().unwrap(),
            "status",
            "--json",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::from(slave))
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    assert!(child.wait().unwrap().success());
    let s = common::read_pty(master).replace("\r\n", "\n");
    assert!(s.starts_with("{\n  \"role\": \"replica\",\n"), "{s:?}");
    assert_eq!(serde_json::from_str::<Value>(&s).unwrap(), status_body());
}

#[test]
fn ctl_waits_for_a_socket_that_is_about_to_appear() {
    use std::io::BufRead;
    use std::process::Stdio;
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("later.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tidelog"))
        .args([
            "ctl",
            "--socket",
            socket.to_str().unwrap(),
            "status",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once it says it waits, the daemon comes up.
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    assert!(
        line.contains("not available yet") && line.contains("waiting up to 5s"),
        "{line}"
    );
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let s2 = socket.clone();
    let task = rt.spawn(async move {
        admin::serve(&s2, router(), async move {
            let _ = rx.await;
        })
        .await
    });
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{line}");
    assert_eq!(
        serde_json::from_slice::<Value>(&out.stdout).unwrap(),
        status_body()
    );
    tx.send(()).unwrap();
    rt.block_on(task).unwrap().unwrap();
}
