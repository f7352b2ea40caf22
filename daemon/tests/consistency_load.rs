//! Consistency under load with real daemons: a concurrent reader of consistent reads sees
//! the bank total constant and ordered counters without gaps or regressions, and all of
//! it holds while the applier is SIGKILLed again and again (nothing lost or applied twice,
//! safe time never back, not even across restarts).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidelog_testkit::load::{self, LoadOptions, Workload};

fn expect_tablets(n: usize) -> String {
    let t: Vec<String> = (0..n).map(|i| format!("\"t{i}\"")).collect();
    format!(
        "expect-tablets = [{}]\nmax-staleness = \"10m\"\n",
        t.join(", ")
    )
}

fn start_load(
    c: &Cluster,
    workload: Workload,
    tablets: usize,
    rate: f64,
    secs: u64,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<load::Summary> {
    let mut o = LoadOptions::new(workload, &c.wal);
    o.tablets = tablets;
    o.rate = rate;
    o.duration = Some(Duration::from_secs(secs));
    o.accounts = 200;
    o.sessions = 8;
    o.connections = 64;
    o.session_dir = Some(c.root.join("sessions"));
    o.segment_size = 4 << 20;
    std::thread::spawn(move || load::run(o, &stop, |_| {}).unwrap())
}

/// A consistent scan: (read_ht, key → value), or None while it cannot be served.
fn scan(c: &Cluster, prefix: &str) -> Option<(u64, BTreeMap<String, String>)> {
    let (st, v) = api(
        &c.applier_sock,
        "GET",
        &format!("/v1/scan?prefix={prefix}&limit=100000"),
    )?;
    if st != 200 {
        assert_eq!(st, 503, "{v}");
        return None;
    }
    let ht = v["read_ht"].as_str().unwrap().parse().unwrap();
    Some((ht, scan_items(&v)))
}

fn safe_time(c: &Cluster) -> Option<u64> {
    let (_, v) = api(&c.applier_sock, "GET", "/v1/safe-time")?;
    v["safe_time"].as_str().map(|s| s.parse().unwrap())
}

/// Waits until the target's safe time covers every tablet's last record.
fn wait_visible(c: &Cluster, s: &load::Summary) {
    let last = s
        .tablet_ends
        .iter()
        .filter_map(|t| t.last_ht)
        .min()
        .unwrap()
        .0;
    wait_for(
        "safe time past the end of the workload",
        Duration::from_secs(90),
        || safe_time(c).is_some_and(|h| h >= last),
    );
}

fn check_bank(items: &BTreeMap<String, String>, accounts: usize) -> Option<u64> {
    if items.len() != accounts {
        return None;
    }
    Some(items.values().map(|v| v.parse::<u64>().unwrap()).sum())
}

/// Nothing lost, nothing applied twice: the (stopped) applier's store applied every record
/// of every source tablet exactly once, up to the tablet's end. Returns the store.
///
/// The sources start empty, so the load appended every record they ever held; the count
/// is the load's own, since the source's retention deletes acknowledged segments (a count
/// of the records left in the log is lower once a long run rotated and deleted some).
fn assert_applied_once(c: &Cluster, s: &load::Summary) -> tidelog_applier::store::Store {
    let store = tidelog_applier::store::Store::open(&c.data).unwrap();
    for t in &s.tablet_ends {
        let left = tidelog_wal::Reader::open(&c.wal, &t.tablet, tidelog_wal::ReadLimit::Durable)
            .unwrap()
            .count() as u64;
        assert!(left <= t.records, "{}: {left} > {}", t.tablet, t.records);
        let m = &store.tablets().unwrap()[&t.tablet];
        assert_eq!(
            m.applied_records, t.records,
            "{}: records applied once each",
            t.tablet
        );
        assert_eq!(m.applied_pos, t.end_pos, "{}", t.tablet);
    }
    store
}

#[test]
fn bank_total_constant_at_every_consistent_read_under_load() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", &expect_tablets(8), "");
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&c, Workload::Bank, 8, 3000.0, 8, stop);
    let (mut reads, mut last_ht, mut distinct) = (0, 0u64, 0);
    while !load.is_finished() || reads < 200 {
        let Some((ht, items)) = scan(&c, "acct/") else {
            continue;
        };
        assert!(ht >= last_ht, "read time went back: {last_ht} → {ht}");
        if ht > last_ht {
            distinct += 1;
        }
        last_ht = ht;
        if let Some(total) = check_bank(&items, 200) {
            assert_eq!(total, 200 * 1000, "bank total at safe time {ht}");
            reads += 1;
        }
    }
    let s = load.join().unwrap();
    wait_visible(&c, &s);
    let (_, items) = scan(&c, "acct/").unwrap();
    assert_eq!(check_bank(&items, 200), Some(200_000));
    assert!(reads >= 200, "{reads} reads");
    assert!(
        distinct >= 5,
        "safe time advanced only {distinct} times during the run"
    );
    assert!(s.txns_committed > 10_000, "{s:?}");
    eprintln!(
        "{reads} consistent reads, {distinct} distinct safe times, {} txns",
        s.txns_committed
    );
}

/// Per session, the counters visible must be exactly 1..k, and k never goes back.
fn check_ordered(items: &BTreeMap<String, String>, last: &mut BTreeMap<String, u64>) {
    let mut per: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (k, v) in items {
        let mut parts = k.split('/');
        let (_, s, c) = (
            parts.next(),
            parts.next().unwrap(),
            parts.next().unwrap().parse::<u64>().unwrap(),
        );
        assert_eq!(v.parse::<u64>().unwrap(), c, "{k}");
        per.entry(s.to_string()).or_default().push(c);
    }
    for (s, cs) in per {
        let k = cs.len() as u64;
        assert_eq!(
            cs,
            (1..=k).collect::<Vec<_>>(),
            "session {s}: a later commit visible without an earlier one"
        );
        let prev = last.insert(s.clone(), k).unwrap_or(0);
        assert!(k >= prev, "session {s}: counter went back {prev} → {k}");
    }
}

#[test]
fn ordered_counters_never_go_back_and_never_skip() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", &expect_tablets(4), "");
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let stop = Arc::new(AtomicBool::new(false));
    let load = start_load(&c, Workload::Ordered, 4, 2000.0, 6, stop);
    let mut last = BTreeMap::new();
    let mut reads = 0;
    while !load.is_finished() || reads < 100 {
        let Some((_, items)) = scan(&c, "ord/") else {
            continue;
        };
        check_ordered(&items, &mut last);
        reads += 1;
    }
    let s = load.join().unwrap();
    wait_visible(&c, &s);
    let (_, items) = scan(&c, "ord/").unwrap();
    check_ordered(&items, &mut last);
    let total: u64 = last.values().sum();
    assert_eq!(
        total,
        s.committed_by_kind
            .iter()
            .filter(|(k, _)| k.starts_with("ordered"))
            .map(|(_, v)| v)
            .sum::<u64>()
    );
}

#[test]
fn sigkill_the_applier_10_times_under_bank_load() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", &expect_tablets(4), "");
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    let stop = Arc::new(AtomicBool::new(false));
    // Long enough for the kills on a slow machine (a restart re-applies what the killed
    // process had received but not applied); the loop stops it after the last kill.
    let load = start_load(&c, Workload::Bank, 4, 2000.0, 900, stop.clone());
    let mut max_safe = 0u64;
    let mut reads = 0;
    let mut kills = 0;
    let mut next_kill = std::time::Instant::now() + Duration::from_millis(600);
    while kills < 10 {
        assert!(!load.is_finished(), "the load ended before 10 kills");
        if std::time::Instant::now() >= next_kill {
            applier.kill9();
            kills += 1;
            let t0 = std::time::Instant::now();
            applier = c.start_applier();
            // Safe time after a restart starts where it was: it never goes back.
            // A start re-applies what the killed process received but had not applied; on a
            // busy machine a debug build's apply falls behind and each start has more to do.
            wait_for("the restarted applier", Duration::from_secs(120), || {
                safe_time(&c).is_some()
            });
            eprintln!("restart {kills}: safe time served after {:?}", t0.elapsed());
            let s = safe_time(&c).unwrap();
            assert!(
                s >= max_safe,
                "safe time went back across a restart: {max_safe} → {s}"
            );
            next_kill = std::time::Instant::now() + Duration::from_millis(200 + 97 * kills);
        }
        if let Some(s) = safe_time(&c) {
            assert!(s >= max_safe, "safe time went back: {max_safe} → {s}");
            max_safe = s;
        }
        if let Some((_, items)) = scan(&c, "acct/") {
            if let Some(total) = check_bank(&items, 200) {
                assert_eq!(total, 200_000);
                reads += 1;
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    let s = load.join().unwrap();
    wait_visible(&c, &s);
    let (_, items) = scan(&c, "acct/").unwrap();
    assert_eq!(check_bank(&items, 200), Some(200_000));
    // Nothing lost, nothing applied twice: every record of every tablet applied once.
    let (_, st) = api(&c.applier_sock, "GET", "/v1/status").unwrap();
    for t in &s.tablet_ends {
        let row: &Value = &st["tablets"][t.tablet.as_str()];
        assert_eq!(
            row["applied_pos"].as_u64(),
            Some(t.end_pos.0),
            "{}",
            t.tablet
        );
    }
    assert!(applier.terminate(Duration::from_secs(20)));
    let store = assert_applied_once(&c, &s);
    assert!(
        store.pending_txns().unwrap().is_empty(),
        "transactions left pending"
    );
    eprintln!("{kills} kills, {reads} consistent reads with the right total");
}

/// Received-log retention in the running applier, across SIGKILLs: with 64 KiB received
/// segments, the released segments are deleted while the load runs and the applier is
/// killed every few seconds, and still every record is applied exactly once and the bank
/// total holds — retention never deleted anything applying needed after a restart.
#[test]
fn received_logs_are_deleted_as_applied_across_sigkills() {
    let tmp = tempfile::tempdir().unwrap();
    let extra = format!("{}segment-size = \"64KiB\"\n", expect_tablets(4));
    let c = Cluster::with(tmp.path(), "batch", &extra, "");
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    let stop = Arc::new(AtomicBool::new(false));
    // Long enough for the kills on a slow machine (a restart re-applies what the killed
    // process had received but not applied); the loop stops it after the last kill.
    let load = start_load(&c, Workload::Bank, 4, 2000.0, 900, stop.clone());
    let received = c.data.join("received");
    // The oldest received segment of tablet `t` (its first position), if any.
    let oldest = |t: &str| {
        tidelog_wal::reader::list_segments(&received.join(t))
            .ok()
            .and_then(|s| s.first().map(|(p, _)| p.0))
    };
    let deleted_everywhere = || (0..4).all(|i| oldest(&format!("t{i}")).is_some_and(|p| p > 0));
    // Each tablet's release (its received log's `acked` position; 0 while none).
    let releases = || -> Vec<u64> {
        (0..4)
            .map(|i| {
                tidelog_wal::retention::read_acked(&received.join(format!("t{i}")))
                    .ok()
                    .flatten()
                    .map_or(0, |p| p.0)
            })
            .collect()
    };
    let mut kills = 0;
    let deadline = std::time::Instant::now() + Duration::from_secs(50);
    // Kill the applier each time a retention round of it released more of some tablet's log
    // (a round runs every 2 s), until each tablet lost its first segments and at least 4
    // kills happened.
    while kills < 4 || !deleted_everywhere() {
        assert!(
            std::time::Instant::now() < deadline,
            "received segments not deleted after {kills} kills: oldest {:?}",
            (0..4).map(|i| oldest(&format!("t{i}"))).collect::<Vec<_>>()
        );
        assert!(!load.is_finished(), "the load ended early");
        let before = releases();
        wait_for("a release by this applier", Duration::from_secs(30), || {
            releases().iter().zip(&before).any(|(now, was)| now > was)
        });
        applier.kill9();
        kills += 1;
        applier = c.start_applier();
        // As in the test above: a start re-applies what the killed process received but had
        // not applied, which takes long on a busy machine.
        wait_for("the restarted applier", Duration::from_secs(120), || {
            safe_time(&c).is_some()
        });
    }
    stop.store(true, Ordering::Relaxed);
    let s = load.join().unwrap();
    wait_visible(&c, &s);
    let (_, items) = scan(&c, "acct/").unwrap();
    assert_eq!(check_bank(&items, 200), Some(200_000));
    assert!(applier.terminate(Duration::from_secs(20)));
    assert_applied_once(&c, &s);
    eprintln!(
        "{kills} kills; oldest received segment per tablet {:?}",
        (0..4).map(|i| oldest(&format!("t{i}"))).collect::<Vec<_>>()
    );
}
