//! `trx_status` and the binlog with real daemons (docs/ARCHITECTURE.md, "Binlog and
//! trx_status"): every state, answers that survive a SIGKILL of the applier, `ctl
//! trx-status` riding out a restart, a gtid hint ahead of a paused target, retention
//! expiry, and bad ids answered, never an error page.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::records::*;
use common::*;
use serde_json::Value;

fn append(wal: &std::path::Path, lines: &[String]) {
    wal_append(wal, lines);
}

fn trx(c: &Cluster, path_and_query: &str) -> Value {
    let (st, v) = api(&c.applier_sock, "GET", &format!("/v1/trx/{path_and_query}"))
        .unwrap_or((0, Value::Null));
    assert_eq!(st, 200, "GET /v1/trx/{path_and_query}: {v}");
    for field in ["trx_id", "state", "safe_time", "caught_up"] {
        assert!(v.get(field).is_some(), "{field} missing in {v}");
    }
    v
}

fn safe_time(c: &Cluster) -> u64 {
    api(&c.applier_sock, "GET", "/v1/safe-time")
        .and_then(|(_, v)| v["safe_time"].as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// Asserts the answers the source log of `every_state_survives_sigkill` implies.
fn check_states(c: &Cluster) {
    let v = trx(c, "5:1");
    assert_eq!(v["state"], "COMMITTED", "{v}");
    assert_eq!(v["gtid"], "0-1-1");
    assert_eq!(v["connect_id"], "5");
    let v = trx(c, "5:2");
    assert_eq!(v["state"], "COMMITTED", "{v}");
    assert_eq!(v["gtid"], "0-1-2");
    assert!(v["commit_ht"].as_str().is_some());
    let v = trx(c, "6:1");
    assert_eq!(v["state"], "ABORTED", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("aborted at source"),
        "{v}"
    );
    let v = trx(c, "6:2");
    assert_eq!(v["state"], "IN_PROGRESS", "{v}");
    assert_eq!(v["connect_id"], "6");
    assert_eq!(v["txn"], format!("{:032x}", 4));
    assert!(
        v["waits_for"].as_str().unwrap().contains("commit or abort"),
        "{v}"
    );
    let v = trx(c, "9:9");
    assert_eq!(v["state"], "UNKNOWN", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("never seen"), "{v}");
    // Ids that are not UTF-8 or carry a bad escape are answers too, not error pages.
    for id in ["%FF", "5%FF:1", "%zz", "5:%"] {
        let v = trx(c, id);
        assert_eq!(v["state"], "UNKNOWN", "{id}: {v}");
        assert!(
            v["reason"].as_str().unwrap().contains("malformed"),
            "{id}: {v}"
        );
    }
    // The binlog, in commit order, from the start and from a gtid.
    let (st, b) = api(&c.applier_sock, "GET", "/v1/binlog").unwrap();
    assert_eq!(st, 200, "{b}");
    let gtids: Vec<&str> = b["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["gtid"].as_str().unwrap())
        .collect();
    assert_eq!(gtids, ["0-1-1", "0-1-2"]);
    let (_, b) = api(&c.applier_sock, "GET", "/v1/binlog?from-gtid=0-1-2&limit=5").unwrap();
    let e = &b["entries"][0];
    assert_eq!(e["trx_id"], "5:2", "{b}");
    let mut tablets: Vec<&str> = e["tablets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    tablets.sort_unstable();
    assert_eq!(tablets, ["a", "b"]);
    assert_eq!(b["entries"].as_array().unwrap().len(), 1);
    // `limit=0` is a bad request, not a limit of one.
    for route in ["/v1/binlog?limit=0", "/v1/scan?prefix=&limit=0"] {
        let (st, b) = api(&c.applier_sock, "GET", route).unwrap();
        assert_eq!(
            (st, b["error"].as_str()),
            (400, Some("bad_request")),
            "{route}: {b}"
        );
        assert!(b["message"].as_str().unwrap().contains("limit"), "{b}");
    }
    // A gtid the binlog does not hold is a state conflict named in the message, not a 404
    // (reserved for unknown routes); so is pausing a tablet the applier does not know.
    let (st, b) = api(&c.applier_sock, "GET", "/v1/binlog?from-gtid=0-1-99").unwrap();
    assert_eq!(
        (st, b["error"].as_str()),
        (409, Some("gtid_not_visible")),
        "{b}"
    );
    assert!(b["message"].as_str().unwrap().contains("0-1-99"), "{b}");
    let (st, b) = api(&c.applier_sock, "POST", "/v1/pause?tablet=nope").unwrap();
    assert_eq!((st, b["error"].as_str()), (400, Some("bad_request")), "{b}");
    assert!(b["message"].as_str().unwrap().contains("nope"), "{b}");
}

#[test]
fn every_state_survives_sigkill_and_ctl_rides_out_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", "expect-tablets = [\"a\", \"b\"]\n", "");
    let t = now_ht();
    append(
        &c.wal,
        &[
            write("a", t + 10, "5:1", "0-1-1"),
            intent("a", t + 20, 2, "5:2"),
            intent("b", t + 21, 2, "5:2"),
            commit("a", t + 30, 2, &["a", "b"], "5:2", "0-1-2"),
            intent("b", t + 40, 3, "6:1"),
            abort("b", t + 41, 3, "6:1"),
            intent("a", t + 50, 4, "6:2"),
            heartbeat("a", t + 60),
            heartbeat("b", t + 61),
        ],
    );
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for(
        "safe time past the workload",
        Duration::from_secs(30),
        || safe_time(&c) >= t + 60,
    );
    check_states(&c);

    // Bad input is an UNKNOWN answer with a reason, never an error page.
    for (path, why) in [
        ("abc", "malformed trx_id"),
        ("1%3A99999999999999999999999", "does not fit in 64 bits"),
        ("5%3A0", "malformed trx_id"),
        ("1%3A2%3A3", "malformed trx_id"),
        ("", "malformed trx_id"),
        ("5:1?gtid=garbage", "malformed gtid"),
        ("5:1?gtid=7-1-1", "domain 7"),
    ] {
        let v = trx(&c, path);
        assert_eq!(v["state"], "UNKNOWN", "{path}: {v}");
        assert!(v["reason"].as_str().unwrap().contains(why), "{path}: {v}");
    }
    let v = trx(&c, &format!("5:{}", u64::MAX));
    assert_eq!(v["state"], "UNKNOWN", "{v}");
    let (st, _) = api(&c.applier_sock, "GET", "/v1/trx/5:1?wait=forever").unwrap();
    assert_eq!(st, 400);

    // SIGKILL the applier: the same answers after restart. `ctl trx-status` started while
    // the applier is down retries until its socket is back.
    applier.kill9();
    let ctl = Command::new(bin())
        .args(["ctl", "--json", "--socket"])
        .arg(&c.applier_sock)
        .args(["trx-status", "5:2", "--gtid", "0-1-2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _applier = c.start_applier();
    let out = ctl.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "ctl trx-status: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["state"], "COMMITTED", "{v}");
    assert_eq!(v["caught_up"], true, "{v}");
    wait_for("safe time after restart", Duration::from_secs(30), || {
        safe_time(&c) >= t + 60
    });
    check_states(&c);
}

#[test]
fn a_hint_ahead_of_a_paused_target_is_not_caught_up_until_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    let t = now_ht();
    append(&c.wal, &[write("a", t + 10, "5:1", "0-1-1")]);
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("first commit visible", Duration::from_secs(30), || {
        safe_time(&c) >= t + 10
    });
    let (st, _) = api(&c.shipper_sock, "POST", "/v1/pause").unwrap();
    assert_eq!(st, 200);
    append(&c.wal, &[write("a", t + 20, "5:2", "0-1-2")]);
    // The client saw gtid 0-1-2 for its commit; the target has not: wait, then say so.
    let t0 = Instant::now();
    let v = trx(&c, "5:2?gtid=0-1-2&wait=700ms");
    assert!(
        t0.elapsed() >= Duration::from_millis(700),
        "answered too early"
    );
    assert_eq!(v["caught_up"], false, "{v}");
    assert_ne!(v["state"], "UNKNOWN", "{v}");
    assert_ne!(v["state"], "ABORTED", "{v}");
    assert!(v["waits_for"].as_str().unwrap().contains("0-1-2"), "{v}");
    // Without the hint it is not yet known.
    assert_eq!(trx(&c, "5:2")["state"], "UNKNOWN");
    let (st, _) = api(&c.shipper_sock, "POST", "/v1/resume").unwrap();
    assert_eq!(st, 200);
    let v = trx(&c, "5:2?gtid=0-1-2&wait=20s");
    assert_eq!(v["state"], "COMMITTED", "{v}");
    assert_eq!(v["caught_up"], true, "{v}");
}

#[test]
fn retention_expiry_gives_unknown() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", "binlog-retention = \"4s\"\n", "");
    let t = now_ht();
    append(&c.wal, &[write("a", t, "5:1", "0-1-1")]);
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("commit visible", Duration::from_secs(30), || {
        safe_time(&c) >= t
    });
    let v = trx(&c, "5:1");
    // Within retention (4 s after its commit) it is there; after, it is gone.
    assert!(
        v["state"] == "COMMITTED" || now_ht() > t + (4_000_000 << 12),
        "{v}"
    );
    wait_for("expiry", Duration::from_secs(30), || {
        trx(&c, "5:1")["state"] == "UNKNOWN"
    });
    let v = trx(&c, "5:1");
    assert!(v["reason"].as_str().unwrap().contains("retention"), "{v}");
    let (_, b) = api(&c.applier_sock, "GET", "/v1/binlog").unwrap();
    assert_eq!(b["entries"].as_array().unwrap().len(), 0, "{b}");
    // History before the retention horizon is refused (its versions may be compacted
    // away), naming the horizon; a read at the safe time still answers.
    let (st, v) = api(&c.applier_sock, "GET", &format!("/v1/scan?prefix=&at={t}")).unwrap();
    assert_eq!(st, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("retention horizon"),
        "{v}"
    );
    let (st, v) = api(&c.applier_sock, "GET", "/v1/scan?prefix=").unwrap();
    assert_eq!(st, 200, "{v}");
}
