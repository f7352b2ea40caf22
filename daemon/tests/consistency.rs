//! Consistent reads with real daemons: safe time initialization (`expect-tablets`), the
//! staleness guard, atomic visibility of a distributed transaction, and a paused tablet
//! stalling safe time while `latest` shows the partial state.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;

fn append(wal: &std::path::Path, lines: &[String]) {
    wal_append(wal, lines);
}

fn write(t: &str, ht: u64, key: &str, v: &str) -> String {
    format!(
        r#"{{"tablet":"{t}","kind":"write","ht":"{ht}","ops":[{{"key":"{key}","value":"{v}"}}]}}"#
    )
}
fn intent(t: &str, ht: u64, txn: u32, key: &str, v: &str) -> String {
    format!(
        r#"{{"tablet":"{t}","kind":"intent","ht":"{ht}","txn":"{txn:032x}","trx_id":"7:{txn}","ops":[{{"key":"{key}","value":"{v}"}}]}}"#
    )
}
fn commit(t: &str, ht: u64, txn: u32, parts: &[&str]) -> String {
    let p: Vec<String> = parts.iter().map(|p| format!("\"{p}\"")).collect();
    format!(
        r#"{{"tablet":"{t}","kind":"commit","ht":"{ht}","txn":"{txn:032x}","participants":[{}],"trx_id":"7:{txn}","gtid":"0-1-{txn}"}}"#,
        p.join(",")
    )
}
fn heartbeat(t: &str, ht: u64) -> String {
    format!(r#"{{"tablet":"{t}","kind":"heartbeat","ht":"{ht}"}}"#)
}

fn get(c: &Cluster, key: &str, mode: &str) -> (u16, Value) {
    api(&c.applier_sock, "GET", &format!("/v1/kv/{key}?mode={mode}")).unwrap_or((0, Value::Null))
}

fn safe_time(c: &Cluster) -> Value {
    api(&c.applier_sock, "GET", "/v1/safe-time").map_or(Value::Null, |r| r.1)
}

#[test]
fn uninitialized_then_stale_then_fresh() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(
        tmp.path(),
        "batch",
        "max-staleness = \"1m\"\nexpect-tablets = [\"a\", \"b\"]\n",
        "",
    );
    let old = ht_ago(Duration::from_secs(3600));
    append(&c.wal, &[write("a", old, "k", "1")]);
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("tablet a applied", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, s)| s["tablets"]["a"]["applied_pos"].as_u64() > Some(0))
    });
    // b is expected but has not reported: 503 naming b.
    let (st, body) = get(&c, "k", "consistent");
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"], "safe_time_uninitialized");
    assert!(body["message"].as_str().unwrap().contains('b'), "{body}");
    assert_eq!(safe_time(&c)["initialized"], false);
    // latest works regardless.
    let (st, body) = get(&c, "k", "latest");
    assert_eq!((st, body["value"].as_str()), (200, Some("1")));
    // b reports, but an hour ago: stale, naming the laggiest tablet.
    append(&c.wal, &[heartbeat("b", old + 10)]);
    wait_for("safe time initialized", Duration::from_secs(30), || {
        safe_time(&c)["initialized"] == true
    });
    let (st, body) = get(&c, "k", "consistent");
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"], "stale_safe_time");
    let msg = body["message"].as_str().unwrap();
    assert!(msg.contains("laggiest tablet a"), "{msg}");
    // Both fresh: served, at the safe time.
    let now = ht_ago(Duration::ZERO);
    append(
        &c.wal,
        &[write("a", now, "k", "2"), heartbeat("b", now + 1)],
    );
    wait_for("a fresh consistent read", Duration::from_secs(30), || {
        get(&c, "k", "consistent").0 == 200
    });
    let (_, body) = get(&c, "k", "consistent");
    assert_eq!(body["value"], "2");
    let st = safe_time(&c);
    assert_eq!(body["read_ht"], st["safe_time"]);
    assert!(st["lag_ms"].as_u64().unwrap() < 60_000);
}

#[test]
fn a_distributed_transaction_is_all_or_nothing_at_safe_time_and_a_paused_tablet_stalls_it() {
    let tmp = tempfile::tempdir().unwrap();
    // No keep-alives on idle tablets: the intake's receive loop of b then sits waiting for
    // its next frame when the pause comes, and that frame is the one the pause must hold.
    let c = Cluster::new(tmp.path(), "batch", "keepalive-interval = \"1h\"\n");
    let h = ht_ago(Duration::ZERO);
    append(
        &c.wal,
        &[
            write("a", h, "acct/1", "100"),
            write("b", h + 1, "acct/2", "100"),
            heartbeat("a", h + 2),
            heartbeat("b", h + 3),
        ],
    );
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for(
        "initial balances at safe time",
        Duration::from_secs(30),
        || {
            get(&c, "acct/2", "consistent").1["value"] == "100"
                && get(&c, "acct/1", "consistent").1["value"] == "100"
        },
    );
    // Pause tablet b's stream at the applier, then transfer 10 from acct/1 (a) to acct/2 (b).
    let (st, _) = api(&c.applier_sock, "POST", "/v1/pause?tablet=b").unwrap();
    assert_eq!(st, 200);
    let received_b = |c: &Cluster| {
        api(&c.applier_sock, "GET", "/v1/status").unwrap().1["tablets"]["b"]["received_pos"]
            .as_u64()
            .unwrap()
    };
    let paused_at = received_b(&c);
    append(
        &c.wal,
        &[
            intent("a", h + 10, 42, "acct/1", "90"),
            intent("b", h + 11, 42, "acct/2", "110"),
            commit("a", h + 12, 42, &["a", "b"]),
            heartbeat("a", h + 13),
            heartbeat("b", h + 14),
        ],
    );
    // a's part is applied (latest shows the partial state) ...
    wait_for("a's part applied", Duration::from_secs(30), || {
        get(&c, "acct/1", "latest").1["value"] == "90"
    });
    assert_eq!(get(&c, "acct/2", "latest").1["value"], "100", "b is paused");
    // The shipper has sent b's new records; none of them reached b's received log (the
    // intake's receive loop was already waiting for the next frame when the pause came:
    // that frame used to be written after the pause had answered).
    wait_for("b's records shipped", Duration::from_secs(30), || {
        api(&c.shipper_sock, "GET", "/v1/status").is_some_and(|(_, v)| {
            let t = &v["tablets"]["b"];
            t["shipped_pos"].as_u64().is_some() && t["shipped_pos"] == t["durable_pos"]
        })
    });
    assert_eq!(received_b(&c), paused_at, "b received records while paused");
    // ... while safe time stays below the commit: consistent reads show neither part.
    let st = safe_time(&c);
    let safe: u64 = st["safe_time"].as_str().unwrap().parse().unwrap();
    assert!(
        safe < h + 12,
        "safe time {safe} passed the commit of a transaction not applied on b"
    );
    assert_eq!(st["laggiest_tablet"], "b");
    assert_eq!(get(&c, "acct/1", "consistent").1["value"], "100");
    assert_eq!(get(&c, "acct/2", "consistent").1["value"], "100");
    // Resume: both parts at the safe time, total constant.
    let (st, _) = api(&c.applier_sock, "POST", "/v1/resume?tablet=b").unwrap();
    assert_eq!(st, 200);
    wait_for("the transaction visible", Duration::from_secs(30), || {
        get(&c, "acct/2", "consistent").1["value"] == "110"
    });
    let (_, a) = get(&c, "acct/1", "consistent");
    let (_, b) = get(&c, "acct/2", "consistent");
    assert_eq!(
        (a["value"].as_str(), b["value"].as_str()),
        (Some("90"), Some("110"))
    );
    assert_eq!(a["version_ht"], (h + 12).to_string());
    let (_, scan) = api(&c.applier_sock, "GET", "/v1/scan?prefix=acct/").unwrap();
    let total: i64 = scan["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["value"].as_str().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(total, 200);
}

/// Lanes connect one by one: the first `Hello` registers every tablet of the shipper
/// (`all_tablets`), so while lane 1 cannot connect its tablets hold the safe time
/// uninitialized although lane 0's tablets are applied. (Before, tablets registered at
/// their first durable frame, and the safe time was published over lane 0's tablets alone,
/// above the lane-1 tablets' records: a later consistent read at the same time saw more.)
#[test]
fn a_tablet_of_a_lane_not_yet_connected_holds_the_safe_time() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "lanes = 2\n");
    let h = ht_ago(Duration::ZERO);
    // FNV-1a lanes of 2: t1 and t3 on lane 0, t2 and t4 on lane 1.
    let mut lines = Vec::new();
    for (i, t) in ["t1", "t2", "t3", "t4"].iter().enumerate() {
        let i = i as u64;
        // Lane 1's tablets hold the older records.
        let at = if i % 2 == 1 { h + i } else { h + 100 + i };
        lines.push(write(t, at, &format!("k/{t}"), "v"));
        lines.push(heartbeat(t, at + 10));
    }
    append(&c.wal, &lines);
    let _applier = c.start_applier();
    let _shipper = Daemon::start_env(
        "ship",
        &c.shipper_cfg,
        &c.root.join("shipper.log"),
        &[("FAILPOINTS", "shipper::lane_1_connect=return")],
    );
    wait_for("lane 0's tablets applied", Duration::from_secs(30), || {
        get(&c, "k/t1", "latest").1["found"] == true && get(&c, "k/t3", "latest").1["found"] == true
    });
    let (_, ship) = api(&c.shipper_sock, "GET", "/v1/status").unwrap();
    for t in ["t2", "t4"] {
        assert_ne!(
            ship["tablets"][t]["state"], "streaming",
            "lane 1 ({t}) must be held back: {ship}"
        );
    }
    let st = safe_time(&c);
    assert_eq!(st["initialized"], false, "safe time over lane 0 only: {st}");
    assert!(
        st["laggiest_tablet"] == "t2" || st["laggiest_tablet"] == "t4",
        "the laggiest tablet is one of lane 1's: {st}"
    );
    let (code, body) = get(&c, "k/t1", "consistent");
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("safe_time_uninitialized")),
        "{body}"
    );
    for t in ["t1", "t2", "t3", "t4"] {
        assert!(
            st["tablets"].get(t).is_some(),
            "{t} counts for the safe time: {st}"
        );
    }
}

/// A tablet that appears at the source while running is announced at the shipper's next
/// scan, after the safe time may have passed its first records: those are applied below the
/// published safe time. Nothing can take that back; it is counted and logged.
#[test]
fn records_of_a_tablet_added_below_the_safe_time_are_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    let h = ht_ago(Duration::from_secs(60));
    append(
        &c.wal,
        &[write("a", h, "k/a", "1"), heartbeat("a", h + 100)],
    );
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for(
        "the safe time past a's heartbeat",
        Duration::from_secs(30),
        || {
            safe_time(&c)["safe_time"]
                .as_str()
                .and_then(|v| v.parse::<u64>().ok())
                .is_some_and(|v| v >= h + 100)
        },
    );
    let below = |c: &Cluster| {
        scrape(&c.applier_sock).and_then(|(_, text)| {
            text.lines()
                .find_map(|l| l.strip_prefix("tidelog_applier_records_below_safe_time_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
    };
    assert_eq!(below(&c), Some(0));
    // Tablet b, new, with a write (and a heartbeat) older than the published safe time.
    append(
        &c.wal,
        &[write("b", h + 50, "k/b", "1"), heartbeat("b", h + 60)],
    );
    wait_for("b's write applied", Duration::from_secs(30), || {
        get(&c, "k/b", "latest").1["found"] == true
    });
    assert_eq!(below(&c), Some(1), "the write, not the heartbeat");
}

/// Keys are bytes: one that is not UTF-8 (written as `{"b64": …}`) is listed by a scan as
/// `{"b64": …}` and can be read back and scanned for with its percent-encoded bytes.
#[test]
fn keys_that_are_not_utf8_are_read_by_their_percent_encoded_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    let h = ht_ago(Duration::ZERO);
    append(
        &c.wal,
        &[
            format!(
                r#"{{"tablet":"a","kind":"write","ht":"{h}","ops":[{{"key":{{"b64":"AP8="}},"value":"raw"}},{{"key":"a b","value":"space"}}]}}"#
            ),
            heartbeat("a", h + 1),
        ],
    );
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("the write visible", Duration::from_secs(30), || {
        get(&c, "a%20b", "consistent").1["value"] == "space"
    });
    let (code, v) = get(&c, "%00%FF", "consistent");
    assert_eq!(code, 200, "{v}");
    assert_eq!(
        (&v["found"], &v["value"], &v["key"]["b64"]),
        (
            &Value::Bool(true),
            &Value::from("raw"),
            &Value::from("AP8=")
        ),
        "{v}"
    );
    let (_, all) = api(&c.applier_sock, "GET", "/v1/scan?prefix=").unwrap();
    assert_eq!(all["items"].as_array().unwrap().len(), 2, "{all}");
    let (_, sc) = api(&c.applier_sock, "GET", "/v1/scan?prefix=%00").unwrap();
    let items = sc["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{sc}");
    assert_eq!(items[0]["key"]["b64"], "AP8=", "{sc}");
    let (_, sc) = api(&c.applier_sock, "GET", "/v1/scan?prefix=a+").unwrap();
    assert_eq!(sc["items"][0]["value"], "space", "{sc}");
    let (code, e) = get(&c, "%zz", "consistent");
    assert_eq!(
        (code, e["error"].as_str()),
        (400, Some("bad_request")),
        "{e}"
    );
}

/// `GET /v1/safe-time?wait-for=HT` answers when the safe time reaches HT (not before, and
/// without waiting out `wait`), answers with the safe time as it is after `wait` when it
/// does not, and refuses a malformed HT or a `wait` without `wait-for`, naming the parameter.
#[test]
fn safe_time_wait_for_answers_when_the_safe_time_arrives() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", "expect-tablets = [\"a\"]\n", "");
    let h = ht_ago(Duration::ZERO);
    append(&c.wal, &[write("a", h, "k", "1")]);
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("safe time initialized", Duration::from_secs(30), || {
        safe_time(&c)["initialized"] == true
    });
    let safe_of = |v: &Value| -> u64 { v["safe_time"].as_str().unwrap().parse().unwrap() };
    assert_eq!(safe_of(&safe_time(&c)), h);

    // Not reached within `wait`: answered after about `wait`, with the safe time as it is.
    let t0 = std::time::Instant::now();
    let (st, v) = api(
        &c.applier_sock,
        "GET",
        &format!("/v1/safe-time?wait-for={}&wait=300ms", h + 1000),
    )
    .unwrap();
    let took = t0.elapsed();
    assert_eq!(st, 200, "{v}");
    assert_eq!(safe_of(&v), h);
    assert!(
        took >= Duration::from_millis(290),
        "answered after {took:?}"
    );

    // Reached while waiting: a waiter (wait 4s) is answered once the heartbeat is applied.
    let sock = c.applier_sock.clone();
    let target = h + 10;
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        let r = api(
            &sock,
            "GET",
            &format!("/v1/safe-time?wait-for={target}&wait=4s"),
        );
        tx.send(()).unwrap();
        (r, t0.elapsed())
    });
    // Still waiting while the safe time is below the target.
    assert!(rx.recv_timeout(Duration::from_millis(200)).is_err());
    append(&c.wal, &[heartbeat("a", target)]);
    let (r, took) = waiter.join().unwrap();
    let (st, v) = r.unwrap();
    assert_eq!(st, 200, "{v}");
    assert!(safe_of(&v) >= target, "{v}");
    assert!(took < Duration::from_secs(4), "waited out `wait`: {took:?}");

    // Already reached: at once.
    let (st, v) = api(
        &c.applier_sock,
        "GET",
        &format!("/v1/safe-time?wait-for={h}&wait=4s"),
    )
    .unwrap();
    assert_eq!((st, safe_of(&v) >= target), (200, true));

    for (q, name) in [
        ("wait-for=soon", "wait-for"),
        (&*format!("wait-for={h}&wait=forever"), "wait"),
        ("wait=1s", "wait-for"),
    ] {
        let (st, v) = api(&c.applier_sock, "GET", &format!("/v1/safe-time?{q}")).unwrap();
        assert_eq!(st, 400, "{q}: {v}");
        assert!(v["message"].as_str().unwrap().contains(name), "{q}: {v}");
    }
}

/// The safe time is published before the store's fsync, so a restart re-applies the
/// received logs to their ends and lets the safe time cover them before the admin socket
/// opens: otherwise a machine crash could show readers a safe time below one they saw.
/// With apply slowed by a failpoint (a sleep before each batch), the applier is killed
/// while its received logs hold more than it applied; restarted as slow, its very first
/// answer already shows every tablet applied to its received end and the safe time at the
/// tablets' minimum.
#[test]
fn a_restarted_applier_answers_only_after_replaying_its_received_logs() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    let tablets = ["r0", "r1", "r2", "r3"];
    for t in tablets {
        write_records(&c.wal, t, 2000, |i| format!("{t}-{i:0>96}").into_bytes());
    }
    let slow = [("FAILPOINTS", "apply::batch=sleep(1500)")];
    let log = c.root.join("applier.log");
    let mut applier = Daemon::start_env("apply", &c.applier_cfg, &log, &slow);
    let mut shipper = c.start_shipper();
    let status = || api(&c.applier_sock, "GET", "/v1/status").map(|(_, s)| s);
    let received = |s: &Value, t: &str| s["tablets"][t]["received_records"].as_u64();
    wait_for("every record received", Duration::from_secs(60), || {
        status().is_some_and(|s| tablets.iter().all(|t| received(&s, t) == Some(2000)))
    });
    assert!(shipper.terminate(Duration::from_secs(20)));
    let s = status().unwrap();
    let behind: Vec<&str> = tablets
        .iter()
        .copied()
        .filter(|t| {
            s["tablets"][t]["applied_pos"].as_u64() < s["tablets"][t]["received_pos"].as_u64()
        })
        .collect();
    assert!(
        !behind.is_empty(),
        "nothing left to re-apply at the kill: {s}"
    );
    applier.kill9();

    let _applier = Daemon::start_env("apply", &c.applier_cfg, &log, &slow);
    let mut first = None;
    wait_for(
        "the restarted applier answers",
        Duration::from_secs(60),
        || {
            first = status();
            first.is_some()
        },
    );
    let s = first.unwrap();
    let mut least = u64::MAX;
    for t in tablets {
        let v = &s["tablets"][t];
        assert_eq!(
            v["applied_pos"], v["received_pos"],
            "tablet {t} not re-applied: {s}"
        );
        least = least.min(v["safe_time"].as_str().unwrap().parse::<u64>().unwrap());
    }
    let st = api(&c.applier_sock, "GET", "/v1/safe-time").unwrap().1;
    assert_eq!(st["initialized"], true, "{st}");
    let safe: u64 = st["safe_time"].as_str().unwrap().parse().unwrap();
    assert!(safe >= least, "{st} below the tablets' {least}");
}
