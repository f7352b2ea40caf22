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
    let applier = tidelog::certs::load_certs(&dir.join("applier.pem")).unwrap();
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
            get(|| async {
                admin::prometheus("tidelog_applier_safe_time_lag_seconds 0.5\n".into())
            }),
        )
}

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

    // Human: scalars then an aligned table of tablets.
    let out = srv.ctl(&["status"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let s = text(&out.stdout);
    assert!(s.contains("role       replica"), "{s}");
    assert!(
        s.contains("TABLET  RECEIVED_POS  APPLIED_POS  SAFE_TIME            STATE"),
        "{s}"
    );
    assert!(
        s.contains("t2      0             0            0                    needs_bootstrap"),
        "{s}"
    );

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
    assert!(s.contains("value") && s.contains("b64:AP8="), "{s}");

    // An error answer: exit 1, `error: <code>: <message>` on stderr.
    let out = srv.ctl(&["get", "stale"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        text(&out.stderr).trim(),
        "error: stale_safe_time: safe time lags by 20m; laggiest tablet t2"
    );
    assert!(out.stdout.is_empty());
    // With --json the error body is printed as is, and the exit status is still 1.
    let out = srv.ctl(&["--json", "promote"]);
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
    assert_eq!(
        text(&out.stdout),
        "tidelog_applier_safe_time_lag_seconds 0.5\n"
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
fn ship_check_needs_an_existing_wal_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let c = common::Cluster::new(tmp.path(), "batch", "");
    let cfg = c.shipper_cfg.to_str().unwrap();
    let limit = Duration::from_secs(30);
    let out = tidelog_bounded(&["ship", "--config", cfg, "--check"], limit);
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Missing (with and without --check), then a file where the directory should be.
    std::fs::remove_dir(&c.wal).unwrap();
    for (check, problem) in [
        (true, "does not exist"),
        (false, "does not exist"),
        (true, "is not a directory"),
    ] {
        if problem == "is not a directory" {
            std::fs::write(&c.wal, "not a directory").unwrap();
        }
        let mut args = vec!["ship", "--config", cfg];
        if check {
            args.push("--check");
        }
        let out = tidelog_bounded(&args, limit);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        let want = format!("{cfg}: key \"wal-dir\": {} {problem}", c.wal.display());
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
                    Ok::<_, ApiError>(Json(json!({"trx_id": trx, "state": "unknown", "wait": q.wait})))
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
    assert!(!s.contains('{') && !s.contains('"'), "raw JSON in: {s}");
    let line = |name: &str| {
        s.lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .unwrap_or_else(|| panic!("no {name} line in: {s}"))
            .to_string()
    };
    assert!(
        line("lookup_cache").ends_with("  cache_size: 268435456, index_bytes: 1234, state: warm"),
        "{s}"
    );
    let cutover = line("cutover");
    assert!(
        cutover.contains("  cleanup_done: true, cut_ht: 7300000000000000001 (")
            && cutover.ends_with("Z), cut_time: 2025-01-01T00:00:00.000000Z, removed_versions: 12"),
        "{s}"
    );
    assert!(s.contains("TABLET  RECEIVED_POS"), "{s}");

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
    assert!(out.status.success(), "{}", text(&out.stderr));
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
