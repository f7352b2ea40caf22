//! Cutover with real daemons (docs/ARCHITECTURE.md, "Cutover"): bank load with one tablet's
//! stream paused so it lags, the source gone, then `POST /v1/promote`. The cut is the safe
//! time; the target equals a replay of the source WALs up to the cut, key by key;
//! `lost_commits` equals the commits above the cut in the source WALs; `trx_status` is
//! final; a shipper connecting afterwards is refused; a crash in the middle of the
//! promotion is finished on restart with the same report.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, HashMap};

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidelog_testkit::load::{self, LoadOptions, Workload};
use tidelog_wal::{Body, ReadLimit, Reader};

const TABLETS: usize = 4;

fn cluster(root: &std::path::Path) -> Cluster {
    let t: Vec<String> = (0..TABLETS).map(|i| format!("\"t{i}\"")).collect();
    Cluster::with(
        root,
        "batch",
        &format!(
            "expect-tablets = [{}]\nmax-staleness = \"10m\"\n",
            t.join(", ")
        ),
        "",
    )
}

fn ht_of(v: &Value) -> u64 {
    v.as_str().unwrap().parse().unwrap()
}

fn safe_report(c: &Cluster) -> Option<Value> {
    api(&c.applier_sock, "GET", "/v1/safe-time").map(|r| r.1)
}

/// Everything the source WALs say: the committed state at `cut` (key → value) and the
/// commits above it (`(ht, trx_id, gtid)`), replaying writes at their ht and each
/// committed transaction's intents at its commit ht.
#[allow(clippy::type_complexity)]
fn replay(
    wal: &std::path::Path,
    cut: u64,
) -> (BTreeMap<String, String>, Vec<(u64, String, String)>) {
    let mut intents: HashMap<[u8; 16], Vec<tidelog_wal::Op>> = HashMap::new();
    let mut versions: Vec<(u64, tidelog_wal::Op)> = Vec::new();
    let mut commits = Vec::new();
    let mut lost = Vec::new();
    for t in tidelog_wal::reader::list_tablets(wal).unwrap() {
        for r in Reader::open(wal, &t, ReadLimit::Durable).unwrap() {
            let (_, rec) = r.unwrap();
            let ht = rec.ht.0;
            let ids = (
                rec.trx_id().map(|t| t.to_string()).unwrap_or_default(),
                rec.gtid().map(|g| g.to_string()).unwrap_or_default(),
            );
            match rec.body {
                Body::Write { ops, trx_id, gtid } => {
                    if ht <= cut {
                        versions.extend(ops.into_iter().map(|o| (ht, o)));
                    } else if trx_id.is_some() || gtid.is_some() {
                        lost.push((ht, ids.0, ids.1));
                    }
                }
                Body::Intent { txn, ops, .. } => intents.entry(txn.0).or_default().extend(ops),
                Body::Commit { txn, .. } => {
                    if ht <= cut {
                        commits.push((ht, txn.0));
                    } else {
                        lost.push((ht, ids.0, ids.1));
                    }
                }
                Body::Abort { .. } | Body::Heartbeat => {}
            }
        }
    }
    for (ht, txn) in commits {
        for o in intents.remove(&txn).unwrap_or_default() {
            versions.push((ht, o));
        }
    }
    // Stable sort: within one ht (one record or one transaction) the later op wins.
    versions.sort_by_key(|(ht, _)| *ht);
    let mut state = BTreeMap::new();
    for (_, o) in versions {
        let k = String::from_utf8(o.key).unwrap();
        match o.value {
            Some(v) => state.insert(k, String::from_utf8(v).unwrap()),
            None => state.remove(&k),
        };
    }
    (state, lost)
}

fn target_state(c: &Cluster, mode: &str) -> BTreeMap<String, String> {
    let (st, v) = api(
        &c.applier_sock,
        "GET",
        &format!("/v1/scan?prefix=&limit=1000000&mode={mode}"),
    )
    .unwrap();
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["more"], false);
    scan_items(&v)
}

fn append(wal: &std::path::Path, line: &str) {
    wal_append(wal, &[line.to_string()]);
}

#[test]
fn promote_under_load_with_a_lagging_tablet() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster(tmp.path());
    let _applier = c.start_applier();
    let mut shipper = c.start_shipper();
    let mut o = LoadOptions::new(Workload::Bank, &c.wal);
    o.tablets = TABLETS;
    o.rate = 1500.0;
    o.duration = Some(Duration::from_secs(4));
    o.accounts = 100;
    o.connections = 16;
    o.session_dir = Some(c.root.join("sessions"));
    o.segment_size = 4 << 20;
    let stop = Arc::new(AtomicBool::new(false));
    let load = std::thread::spawn(move || load::run(o, &stop, |_| {}).unwrap());
    wait_for("safe time initialized", Duration::from_secs(60), || {
        safe_report(&c).is_some_and(|v| v["initialized"] == true)
    });
    // Lag t1 mid-load: once it has applied part of the workload.
    wait_for("t1 applying the load", Duration::from_secs(60), || {
        api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["tablets"]["t1"]["applied_records"].as_u64() >= Some(300))
    });
    let (st, _) = api(&c.shipper_sock, "POST", "/v1/pause?tablet=t1").unwrap();
    assert_eq!(st, 200);
    let s = load.join().unwrap();
    // The last commit of the source, on a tablet that still ships, so the target sees
    // how far the gtid sequence went (the paused tablet's commits are never received).
    let last = s.last_gtid.unwrap();
    let final_ht = now_ht();
    append(
        &c.wal,
        &format!(
            r#"{{"tablet":"t0","kind":"write","ht":"{final_ht}","trx_id":"42:1","gtid":"{}-{}-{}","ops":[{{"key":"final","value":"1"}}]}}"#,
            last.domain,
            last.server,
            last.seq + 1
        ),
    );
    wait_for(
        "tablets other than t1 fully applied",
        Duration::from_secs(60),
        || {
            safe_report(&c).is_some_and(|v| {
                ["t0", "t2", "t3"].iter().all(|t| {
                    let want = if *t == "t0" {
                        final_ht
                    } else {
                        s.tablet_ends
                            .iter()
                            .find(|e| e.tablet.as_str() == *t)
                            .and_then(|e| e.last_ht)
                            .map_or(0, |h| h.0)
                    };
                    v["tablets"][t]["safe_time"]
                        .as_str()
                        .is_some_and(|h| h.parse::<u64>().unwrap() >= want)
                })
            })
        },
    );
    // The source host is gone.
    shipper.kill9();
    let before = ht_of(&safe_report(&c).unwrap()["safe_time"]);

    let (st, rep) = api(&c.applier_sock, "POST", "/v1/promote").unwrap();
    assert_eq!(st, 200, "{rep}");
    let cut = ht_of(&rep["cut_ht"]);
    let after = safe_report(&c).unwrap();
    assert_eq!(
        ht_of(&after["safe_time"]),
        cut,
        "safe time is the cut: {after}"
    );
    assert!(
        cut >= before,
        "cut {cut} below the safe time {before} seen before promoting"
    );
    let t1_end = s
        .tablet_ends
        .iter()
        .find(|e| e.tablet.as_str() == "t1")
        .unwrap();
    assert!(
        cut < t1_end.last_ht.unwrap().0,
        "t1 was paused, so the cut lies inside its log"
    );
    assert_eq!(rep["role"], "primary");
    assert_eq!(rep["tablets"].as_object().unwrap().len(), TABLETS, "{rep}");
    let lag = |t: &str| rep["tablets"][t]["lag_ms"].as_u64().unwrap();
    assert!(lag("t1") >= lag("t0"), "{rep}");

    // Source replay up to the cut equals the target, key by key (consistent and latest).
    let (want, lost) = replay(&c.wal, cut);
    assert!(
        !lost.is_empty(),
        "nothing above the cut: the test lost its point"
    );
    assert_eq!(target_state(&c, "consistent"), want);
    assert_eq!(target_state(&c, "latest"), want);
    let total: u64 = want
        .iter()
        .filter(|(k, _)| k.starts_with("acct/"))
        .map(|(_, v)| v.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, 100 * 1000);
    assert_eq!(
        rep["lost_commits"].as_u64().unwrap(),
        lost.len() as u64,
        "{rep}"
    );
    assert!(rep["lost_window_ms"].as_u64().is_some());

    // trx_status is final: a kept commit, a lost commit received, a lost one never received.
    let (_, bl) = api(&c.applier_sock, "GET", "/v1/binlog?limit=1").unwrap();
    let kept = bl["entries"][0]["trx_id"].as_str().unwrap().to_string();
    let v = api(&c.applier_sock, "GET", &format!("/v1/trx/{kept}"))
        .unwrap()
        .1;
    assert_eq!(v["state"], "COMMITTED", "{v}");
    let v = api(&c.applier_sock, "GET", "/v1/trx/42:1").unwrap().1;
    assert_eq!(v["state"], "ABORTED", "{v}");
    assert!(v["reason"].as_str().unwrap().contains("cutover"), "{v}");
    let t1_lost = lost.iter().find(|(ht, trx, _)| {
        *ht <= t1_end.last_ht.unwrap().0 && !trx.is_empty() && {
            let r = api(&c.applier_sock, "GET", &format!("/v1/trx/{trx}"))
                .unwrap()
                .1;
            r["commit_ht"].is_null()
        }
    });
    if let Some((_, trx, gtid)) = t1_lost {
        let v = api(
            &c.applier_sock,
            "GET",
            &format!("/v1/trx/{trx}?gtid={gtid}"),
        )
        .unwrap()
        .1;
        assert_eq!(v["state"], "ABORTED", "never received, lost: {v}");
        assert_eq!(v["caught_up"], true);
    }

    // Idempotent.
    let (_, again) = api(&c.applier_sock, "POST", "/v1/promote").unwrap();
    assert_eq!(again, rep);
    let (_, status) = api(&c.applier_sock, "GET", "/v1/status").unwrap();
    assert_eq!(status["role"], "primary");
    // Its intake is closed for good: pausing or resuming it is a conflict, not an `ok`.
    for route in ["/v1/pause", "/v1/resume", "/v1/pause?tablet=t1"] {
        let (st, v) = api(&c.applier_sock, "POST", route).unwrap();
        assert_eq!(st, 409, "{route}: {v}");
        assert!(v["message"].as_str().unwrap().contains("promoted"), "{v}");
    }

    // A shipper that connects afterwards is refused, with the reason in its status.
    let _shipper = c.start_shipper();
    wait_for("the shipper refused", Duration::from_secs(30), || {
        api(&c.shipper_sock, "GET", "/v1/status").is_some_and(|(_, v)| {
            v["tablets"]["t0"]["state"] == "refused"
                && v["tablets"]["t0"]["error"]
                    .as_str()
                    .is_some_and(|e| e.contains("promoted"))
        })
    });
    wait_for("clean-up finished", Duration::from_secs(60), || {
        api(&c.applier_sock, "GET", "/v1/status")
            .is_some_and(|(_, v)| v["cutover"]["cleanup_done"] == true)
    });
    assert_eq!(target_state(&c, "latest"), want);
}

/// Five commits (`write`s with a trx id and a gtid) per tablet as JSON lines: key
/// `k{i}-{k}` = `k` at ht `t0 + k·10 + i` on tablet `t{i}`. The safe time once all are in
/// is t0's last, `t0 + 40`; t1..t3 each have one commit above it.
fn five_commits_per_tablet(t0: u64) -> String {
    let mut lines = Vec::new();
    for i in 0..TABLETS as u64 {
        for k in 0..5u64 {
            lines.push(format!(
                r#"{{"tablet":"t{i}","kind":"write","ht":"{}","trx_id":"{}:{}","gtid":"0-1-{}","ops":[{{"key":"k{i}-{k}","value":"{k}"}}]}}"#,
                t0 + k * 10 + i,
                i + 1,
                k + 1,
                k * TABLETS as u64 + i + 1
            ));
        }
    }
    lines.join("\n")
}

#[test]
fn a_crash_in_the_middle_of_promotion_is_finished_on_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster(tmp.path());
    let t0 = now_ht();
    append(&c.wal, &five_commits_per_tablet(t0));
    let mut applier = Daemon::start_env(
        "apply",
        &c.applier_cfg,
        &c.root.join("applier.log"),
        &[("FAILPOINTS", "cutover::after_cut=return")],
    );
    let mut shipper = c.start_shipper();
    wait_for("everything visible", Duration::from_secs(60), || {
        safe_report(&c).is_some_and(|v| {
            v["safe_time"]
                .as_str()
                .is_some_and(|h| h.parse::<u64>().unwrap() >= t0 + 40)
        })
    });
    let before = ht_of(&safe_report(&c).unwrap()["safe_time"]);
    shipper.kill9();
    // The applier dies right after persisting the cut.
    let r = api(&c.applier_sock, "POST", "/v1/promote");
    assert!(r.as_ref().is_none_or(|(st, _)| *st != 200), "{r:?}");
    wait_for("the applier died", Duration::from_secs(10), || {
        applier
            .child
            .as_mut()
            .unwrap()
            .try_wait()
            .unwrap()
            .is_some()
    });
    let _applier = c.start_applier();
    wait_for(
        "the restarted applier answers",
        Duration::from_secs(30),
        || api(&c.applier_sock, "GET", "/v1/status").is_some(),
    );
    let (_, status) = api(&c.applier_sock, "GET", "/v1/status").unwrap();
    assert_eq!(status["role"], "primary", "{status}");
    let (st, rep) = api(&c.applier_sock, "POST", "/v1/promote").unwrap();
    assert_eq!(st, 200, "{rep}");
    assert_eq!(ht_of(&rep["cut_ht"]), before);
    // The cut is t0's last write (the lowest tablet); t1..t3 each wrote one later.
    assert_eq!(rep["lost_commits"], 3, "{rep}");
    let (_, again) = api(&c.applier_sock, "POST", "/v1/promote").unwrap();
    assert_eq!(again, rep);
    let state = target_state(&c, "consistent");
    assert_eq!(state.len(), TABLETS * 5 - 3);
}

/// Status keeps its totals across restarts: `received_records` and `applied_records` both
/// count over the target's life (the first used to restart from 0), and a promoted applier
/// that restarts shows each tablet's final apply position and safe time (not 0, with the
/// whole log as lag) and the clean-up's persisted count of removed versions (not 0).
#[test]
fn status_totals_and_a_promoted_applier_survive_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster(tmp.path());
    let t0 = now_ht();
    append(&c.wal, &five_commits_per_tablet(t0));
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    let visible = || {
        wait_for("everything visible", Duration::from_secs(60), || {
            safe_report(&c).is_some_and(|v| {
                v["safe_time"]
                    .as_str()
                    .is_some_and(|h| h.parse::<u64>().unwrap() >= t0 + 40)
            })
        })
    };
    let status = || api(&c.applier_sock, "GET", "/v1/status").unwrap().1;
    visible();
    let before = status();
    // A restarted replica: the same totals.
    assert!(applier.terminate(Duration::from_secs(30)), "clean stop");
    applier = c.start_applier();
    visible();
    let after = status();
    for i in 0..TABLETS {
        let (b, a) = (
            &before["tablets"][format!("t{i}")],
            &after["tablets"][format!("t{i}")],
        );
        for k in ["received_records", "applied_records"] {
            assert_eq!(a[k], 5, "t{i} {k} after a restart: {a}");
            assert_eq!(b[k], 5, "t{i} {k}: {b}");
        }
        assert_eq!(a["lag_records"], 0, "{a}");
        assert_eq!(a["received_bytes"], a["received_pos"], "{a}");
        assert_eq!(a["received_pos"], b["received_pos"], "{a}");
    }
    shipper.kill9();
    let (st, rep) = api(&c.applier_sock, "POST", "/v1/promote").unwrap();
    assert_eq!(st, 200, "{rep}");
    wait_for("the clean-up done", Duration::from_secs(60), || {
        status()["cutover"]["cleanup_done"] == true
    });
    let promoted = status();
    // The cut is t0's last write; t1..t3 each wrote one version above it.
    assert_eq!(promoted["cutover"]["removed_versions"], 3, "{promoted}");
    assert!(applier.terminate(Duration::from_secs(30)), "clean stop");
    let _applier = c.start_applier();
    wait_for(
        "the restarted applier answers",
        Duration::from_secs(30),
        || api(&c.applier_sock, "GET", "/v1/status").is_some(),
    );
    let restarted = status();
    assert_eq!(restarted["role"], "primary", "{restarted}");
    assert_eq!(restarted["safe_time"], rep["cut_ht"], "{restarted}");
    assert_eq!(restarted["cutover"]["removed_versions"], 3, "{restarted}");
    for i in 0..TABLETS {
        let t = format!("t{i}");
        let (p, r) = (&promoted["tablets"][&t], &restarted["tablets"][&t]);
        for k in [
            "applied_pos",
            "safe_time",
            "received_pos",
            "lag_bytes",
            "applied_records",
        ] {
            assert_eq!(
                r[k], p[k],
                "{t} {k} after restarting the promoted applier: {r}"
            );
        }
        assert_ne!(r["applied_pos"], 0, "{r}");
        assert_eq!(r["lag_bytes"], 0, "{r}");
        assert_eq!(r["safe_time"], rep["tablets"][&t]["safe_time"], "{r}");
    }
}
