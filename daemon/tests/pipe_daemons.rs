//! The pipe with real daemons (`tidelog apply`, `tidelog ship`) on loopback: 8 tablets
//! written continuously at the source while the shipper and the applier are SIGKILLed at
//! random moments; afterwards the received logs equal the sources record for record (from
//! what retention kept on) and every record is applied exactly once (the store equals a replay of the source logs).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};
use tidelog_wal::{
    Body, HybridTime, Op, ReadLimit, Reader, Record, SyncPolicy, TabletId, WalOptions, WalPos,
    Writer,
};

const TABLETS: usize = 8;

/// Versions of each key in source order: (ht, value or None for a delete).
type Model = BTreeMap<Vec<u8>, Vec<(HybridTime, Option<Vec<u8>>)>>;

fn tablet(i: usize) -> TabletId {
    format!("t{i}").parse().unwrap()
}

/// Writes records to every tablet until `stop`; returns the writers (for their end
/// positions) and how many records each appended (the source's retention may delete its
/// acked head before the end, so its log alone does not say).
fn source_load(
    wal: std::path::PathBuf,
    stop: Arc<AtomicBool>,
    seed: u64,
) -> std::thread::JoinHandle<(Vec<Writer>, Vec<u64>)> {
    std::thread::spawn(move || {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let opts = WalOptions {
            segment_size: 256 << 10,
            ..WalOptions::default()
        };
        let mut ws: Vec<Writer> = (0..TABLETS)
            .map(|i| Writer::open(&wal, &tablet(i), opts.clone()).unwrap())
            .collect();
        let mut seq = 0u64;
        let mut appended = vec![0u64; TABLETS];
        while !stop.load(Ordering::Relaxed) {
            for (w, n) in ws.iter_mut().zip(appended.iter_mut()) {
                for _ in 0..rng.random_range(1..20) {
                    seq += 1;
                    *n += 1;
                    let ht = HybridTime(w.last_ht().map_or(1 << 20, |h| h.0 + 1));
                    let key = format!("{}/k{}", w.tablet(), rng.random_range(0..40));
                    let op = if rng.random_ratio(1, 10) {
                        Op::delete(key)
                    } else {
                        Op::put(
                            key,
                            format!("v{seq}-{}", "x".repeat(rng.random_range(0..300))),
                        )
                    };
                    w.append(&Record::new(
                        ht,
                        Body::Write {
                            ops: vec![op],
                            trx_id: None,
                            gtid: None,
                        },
                    ))
                    .unwrap();
                }
                let sync = if rng.random_ratio(1, 4) {
                    SyncPolicy::Always
                } else {
                    SyncPolicy::Batch
                };
                w.commit(sync).unwrap();
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        for w in ws.iter_mut() {
            w.sync().unwrap();
        }
        (ws, appended)
    })
}

fn applied_everything(c: &Cluster, ends: &BTreeMap<String, u64>) -> bool {
    let Some((200, st)) = api(&c.applier_sock, "GET", "/v1/status") else {
        return false;
    };
    ends.iter().all(|(t, end)| {
        let row = &st["tablets"][t];
        row["received_pos"].as_u64() == Some(*end) && row["applied_pos"].as_u64() == Some(*end)
    })
}

#[test]
fn sigkill_shipper_and_applier_24_times_nothing_lost_nothing_applied_twice() {
    let tmp = tempfile::tempdir().unwrap();
    // The received logs are written with O_DIRECT by every other applier, through the
    // page cache by the rest: each mode recovers what the other left at a SIGKILL.
    let c = Cluster::with(
        tmp.path(),
        "batch",
        "received-direct-io = true\n",
        "max-frame-bytes = \"64KiB\"\nwindow-bytes = \"512KiB\"\n",
    );
    let seed: u64 = std::env::var("PIPE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed);
    let stop = Arc::new(AtomicBool::new(false));
    let load = source_load(c.wal.clone(), stop.clone(), seed);
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    wait_for("the applier's admin API", Duration::from_secs(30), || {
        api(&c.applier_sock, "GET", "/v1/status").is_some()
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut kills = (0, 0);
    for round in 0..24 {
        // A random moment in the stream (this is the fault schedule, not synchronisation).
        std::thread::sleep(Duration::from_millis(rng.random_range(50..350)));
        match rng.random_range(0..3) {
            0 => {
                shipper.kill9();
                kills.0 += 1;
                shipper = c.start_shipper();
            }
            1 => {
                applier.kill9();
                kills.1 += 1;
                flip_direct_io(&c.applier_cfg);
                applier = c.start_applier();
            }
            _ => {
                shipper.kill9();
                applier.kill9();
                kills = (kills.0 + 1, kills.1 + 1);
                flip_direct_io(&c.applier_cfg);
                applier = c.start_applier();
                shipper = c.start_shipper();
            }
        }
        eprintln!(
            "round {round}: kills so far shipper {} applier {}",
            kills.0, kills.1
        );
    }
    assert!(kills.0 >= 8 && kills.1 >= 8, "{kills:?}");
    stop.store(true, Ordering::Relaxed);
    let (writers, appended) = load.join().unwrap();
    let ends: BTreeMap<String, u64> = writers
        .iter()
        .map(|w| (w.tablet().to_string(), w.written_pos().0))
        .collect();
    drop(writers);
    wait_for(
        "everything received and applied",
        Duration::from_secs(120),
        || applied_everything(&c, &ends),
    );
    // The last applier writes its received logs as its config says (this file system
    // takes O_DIRECT), and its status says so.
    let direct = std::fs::read_to_string(&c.applier_cfg)
        .unwrap()
        .contains("received-direct-io = true");
    let (_, st) = api(&c.applier_sock, "GET", "/v1/status").expect("the applier's status");
    assert_eq!(st["received_direct_io"]["configured"], direct, "{st}");
    assert_eq!(st["received_direct_io"]["in_use"], direct, "{st}");
    // The shipper's status agrees: everything acked, nothing in flight.
    wait_for("the shipper's acks", Duration::from_secs(30), || {
        api(&c.shipper_sock, "GET", "/v1/status").is_some_and(|(_, st)| {
            ends.iter()
                .all(|(t, end)| st["tablets"][t]["acked_pos"].as_u64() == Some(*end))
        })
    });
    assert!(
        shipper.terminate(Duration::from_secs(20)),
        "the shipper did not stop cleanly on SIGTERM"
    );
    assert!(
        applier.terminate(Duration::from_secs(20)),
        "the applier did not stop cleanly on SIGTERM"
    );

    // Received logs: record for record the sources.
    let mut model: Model = BTreeMap::new();
    let mut counts = BTreeMap::new();
    for (i, n) in appended.iter().enumerate() {
        let t = tablet(i);
        let src: Vec<_> = Reader::open(&c.wal, &t, ReadLimit::Durable)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        let got: Vec<_> = Reader::open(&c.data.join("received"), &t, ReadLimit::Durable)
            .unwrap()
            .map(|r| r.unwrap())
            .collect();
        // Retention may have deleted the head of either log — the received log's applied
        // and released segments, the source's acked ones: from the later of the two heads
        // on, both hold the same records, to the same end.
        let head = match (src.first(), got.first()) {
            (Some((a, _)), Some((b, _))) => (*a).max(*b),
            _ => panic!(
                "{t}: an empty log (source {}, received {})",
                src.len(),
                got.len()
            ),
        };
        let from = |log: &[(WalPos, Record)]| log.iter().position(|(p, _)| *p == head);
        let (Some(s0), Some(g0)) = (from(&src), from(&got)) else {
            panic!("{t}: the logs' heads are not a record boundary of both (head {head})");
        };
        assert_eq!(src.len() - s0, got.len() - g0, "{t}: record count");
        assert!(
            src[s0..] == got[g0..],
            "{t}: the received log differs from the source"
        );
        counts.insert(t.clone(), *n);
        for (_, r) in src {
            for op in r.ops() {
                model
                    .entry(op.key.clone())
                    .or_default()
                    .push((r.ht, op.value.clone()));
            }
        }
    }
    // Store: every record applied exactly once, every version where the replay puts it.
    let store = tidelog_applier::store::Store::open(&c.data).unwrap();
    let metas = store.tablets().unwrap();
    for (t, n) in &counts {
        assert_eq!(
            metas[t].applied_records, *n,
            "{t}: records applied (a double or missing apply)"
        );
        assert_eq!(
            metas[t].applied_pos.0,
            ends[t.as_str()],
            "{t}: apply position"
        );
    }
    let mut versions = 0;
    for (key, vs) in &model {
        for (ht, value) in vs {
            let v = store.get(key, Some(*ht)).unwrap().unwrap();
            assert_eq!(
                v.ht,
                *ht,
                "{}: version at {ht}",
                String::from_utf8_lossy(key)
            );
            assert_eq!(
                &v.value,
                value,
                "{}: value at {ht}",
                String::from_utf8_lossy(key)
            );
            versions += 1;
        }
        let (last_ht, last) = vs.last().unwrap();
        let latest = store.get(key, None).unwrap().unwrap();
        assert_eq!((latest.ht, &latest.value), (*last_ht, last));
    }
    assert!(
        versions > 1000,
        "too little data to mean anything: {versions} versions"
    );
    eprintln!(
        "checked {versions} versions over {} keys; kills: shipper {} applier {}",
        model.len(),
        kills.0,
        kills.1
    );
}

/// The durable position in a tablet's control file.
/// Switches the applier's `received-direct-io` for its next start.
fn flip_direct_io(cfg: &Path) {
    let text = std::fs::read_to_string(cfg).unwrap();
    let flipped = if text.contains("received-direct-io = true") {
        text.replace("received-direct-io = true", "received-direct-io = false")
    } else {
        text.replace("received-direct-io = false", "received-direct-io = true")
    };
    assert_ne!(
        flipped,
        text,
        "no received-direct-io key in {}",
        cfg.display()
    );
    std::fs::write(cfg, flipped).unwrap();
}

fn control_durable(wal: &Path, tablet: &str) -> u64 {
    tidelog_wal::control::ControlView::open(&wal.join(tablet))
        .unwrap()
        .unwrap()
        .durable()
        .0
}

/// A cluster whose daemons keep a silent QUIC connection for 30 s (the kit's is 1 s): what
/// the silence limit (5 s) and stateless resets must beat.
fn cluster_with_long_idle_timeout(root: &Path) -> Cluster {
    let c = Cluster::new(root, "batch", "");
    for cfg in [&c.applier_cfg, &c.shipper_cfg] {
        let text = std::fs::read_to_string(cfg).unwrap();
        let longer = text.replace("idle-timeout = \"1s\"", "idle-timeout = \"30s\"");
        assert_ne!(text, longer, "the kit's idle timeout");
        std::fs::write(cfg, longer).unwrap();
    }
    c
}

/// A shipper status row of `tablet`, once the admin API answers and has it.
fn ship_row(c: &Cluster, tablet: &str) -> Option<serde_json::Value> {
    let (200, st) = api(&c.shipper_sock, "GET", "/v1/status")? else {
        return None;
    };
    let row = st["tablets"].get(tablet)?.clone();
    Some(row)
}

/// A per-tablet sample of the shipper's Prometheus metrics.
fn ship_metric(c: &Cluster, name: &str, tablet: &str) -> Option<u64> {
    let (_, text) = scrape(&c.shipper_sock)?;
    let prefix = format!("{name}{{tablet=\"{tablet}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// Status and metrics agree with the control file: `durable_pos` = `durable`,
/// `lag_bytes` = `durable` − `acked_pos`.
fn reports_durable(c: &Cluster, tablet: &str, durable: u64) -> bool {
    let Some(row) = ship_row(c, tablet) else {
        return false;
    };
    let acked = row["acked_pos"].as_u64().unwrap();
    row["durable_pos"].as_u64() == Some(durable)
        && row["lag_bytes"].as_u64() == Some(durable.saturating_sub(acked))
        && ship_metric(c, "tidelog_shipper_durable_pos_bytes", tablet) == Some(durable)
        && ship_metric(c, "tidelog_shipper_lag_bytes", tablet)
            == Some(durable.saturating_sub(acked))
}

#[test]
fn shipper_status_durable_pos_is_live_while_a_tablet_is_paused() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 5, |i| format!("v{i}").into_bytes());
    let first = control_durable(&c.wal, "t1");
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    wait_for("t1 shipped and acked", Duration::from_secs(30), || {
        ship_row(&c, "t1").is_some_and(|r| r["acked_pos"].as_u64() == Some(first))
    });
    assert!(reports_durable(&c, "t1", first));

    let (code, v) = api(&c.shipper_sock, "POST", "/v1/pause?tablet=t1").unwrap();
    assert_eq!((code, &v), (200, &serde_json::json!({"ok": true})));
    assert_eq!(ship_row(&c, "t1").unwrap()["state"], "paused");
    write_records(&c.wal, "t1", 3, |i| format!("w{i}").into_bytes());
    let second = control_durable(&c.wal, "t1");
    assert!(second > first);
    wait_for(
        "the paused tablet's status to show the new durable_pos and its lag",
        Duration::from_secs(10),
        || reports_durable(&c, "t1", second),
    );
    let row = ship_row(&c, "t1").unwrap();
    assert_eq!(row["acked_pos"].as_u64(), Some(first), "{row}");
    assert_eq!(row["lag_bytes"].as_u64(), Some(second - first), "{row}");

    let (code, _) = api(&c.shipper_sock, "POST", "/v1/resume?tablet=t1").unwrap();
    assert_eq!(code, 200);
    wait_for(
        "the rest acked after resume",
        Duration::from_secs(30),
        || {
            ship_row(&c, "t1").is_some_and(|r| {
                r["acked_pos"].as_u64() == Some(second) && r["lag_bytes"].as_u64() == Some(0)
            })
        },
    );
    assert!(shipper.terminate(Duration::from_secs(20)), "shipper stop");
    assert!(applier.terminate(Duration::from_secs(20)), "applier stop");
}

#[test]
fn shipper_status_durable_pos_is_live_without_a_connection() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    // The shipper trusts another CA: its lane never connects to the applier.
    let other = tmp.path().join("other-tls");
    certs_init(&other);
    let cfg = std::fs::read_to_string(&c.shipper_cfg).unwrap();
    let ca = tmp.path().join("tls").join("ca.pem").display().to_string();
    assert!(cfg.contains(&ca));
    std::fs::write(
        &c.shipper_cfg,
        cfg.replace(&ca, &other.join("ca.pem").display().to_string()),
    )
    .unwrap();
    write_records(&c.wal, "t1", 5, |i| format!("v{i}").into_bytes());
    let first = control_durable(&c.wal, "t1");
    assert!(first > 0);
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    wait_for(
        "the unconnected shipper to report the durable_pos",
        Duration::from_secs(10),
        || reports_durable(&c, "t1", first),
    );
    write_records(&c.wal, "t1", 2, |i| format!("w{i}").into_bytes());
    let second = control_durable(&c.wal, "t1");
    wait_for(
        "the unconnected shipper to follow the durable_pos",
        Duration::from_secs(10),
        || reports_durable(&c, "t1", second),
    );
    let (_, st) = api(&c.shipper_sock, "GET", "/v1/status").unwrap();
    assert_eq!(st["connected_lanes"], 0, "{st}");
    assert_eq!(st["tablets"]["t1"]["acked_pos"], 0, "{st}");
    assert_eq!(st["tablets"]["t1"]["lag_bytes"], second, "{st}");
    assert!(shipper.terminate(Duration::from_secs(20)), "shipper stop");
    assert!(applier.terminate(Duration::from_secs(20)), "applier stop");
}

#[test]
fn shipper_pause_of_an_unknown_tablet_is_a_bad_request_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 1, |i| format!("v{i}").into_bytes());
    // No applier: the admin API answers all the same.
    let mut shipper = c.start_shipper();
    wait_for("the shipper's admin API", Duration::from_secs(30), || {
        ship_row(&c, "t1").is_some()
    });
    for route in ["/v1/pause?tablet=nope", "/v1/resume?tablet=nope"] {
        let (code, v) = api(&c.shipper_sock, "POST", route).unwrap();
        assert_eq!(code, 400, "{route}: {v}");
        assert_eq!(
            v,
            serde_json::json!({"error": "bad_request", "message": "unknown tablet nope"}),
            "{route}"
        );
    }
    // A known tablet still works, and an unknown route is still 404.
    let (code, _) = api(&c.shipper_sock, "POST", "/v1/pause?tablet=t1").unwrap();
    assert_eq!(code, 200);
    let (code, v) = api(&c.shipper_sock, "POST", "/v1/nope").unwrap();
    assert_eq!((code, v["error"].as_str()), (404, Some("not_found")));
    assert!(shipper.terminate(Duration::from_secs(20)), "shipper stop");
}

/// A shipper that restarts (SIGTERM, started again at once) takes its tablets over from its
/// old connections, whose streams end a little later: the applier's status must still say
/// `streaming` for them (the old streams' teardown used to mark them `disconnected` while
/// their data kept flowing), and a clean stop is no "corrupt frame".
#[test]
fn applier_status_stays_streaming_across_a_shipper_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "lanes = 4\n");
    let tablets = ["a", "b", "c"];
    for t in tablets {
        write_records(&c.wal, t, 3, |i| format!("v{i}").into_bytes());
    }
    let mut applier = c.start_applier();
    let states = |c: &Cluster| -> Vec<(String, u64)> {
        let Some((200, st)) = api(&c.applier_sock, "GET", "/v1/status") else {
            return Vec::new();
        };
        tablets
            .iter()
            .map(|t| {
                let row = &st["tablets"][*t];
                (
                    row["state"].as_str().unwrap_or("").to_string(),
                    row["received_pos"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let streaming_past = |c: &Cluster, ends: &[u64]| {
        let s = states(c);
        s.len() == ends.len()
            && s.iter()
                .zip(ends)
                .all(|((state, pos), end)| state == "streaming" && pos >= end)
    };
    for round in 0..3 {
        let mut shipper = c.start_shipper();
        for t in tablets {
            write_records(&c.wal, t, 2, |i| format!("r{round}-{i}").into_bytes());
        }
        let ends: Vec<u64> = tablets.iter().map(|t| control_durable(&c.wal, t)).collect();
        wait_for(
            &format!("round {round}: every tablet streaming and received"),
            Duration::from_secs(20),
            || streaming_past(&c, &ends),
        );
        assert!(shipper.terminate(Duration::from_secs(20)), "shipper stop");
    }
    let log = std::fs::read_to_string(c.root.join("applier.log")).unwrap();
    assert!(
        !log.contains("corrupt frame"),
        "a clean stop is not a corrupt frame"
    );
    assert!(applier.terminate(Duration::from_secs(20)), "applier stop");
}

/// After an applier is SIGKILLed and started again, the shipper's old connection is reset
/// by the new process (the stateless-reset key is kept in the data directory) and the
/// stream resumes at once — not after the QUIC idle timeout (30 s here), while the safe
/// time stood still.
#[test]
fn a_restarted_applier_resets_the_old_connection_at_once() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster_with_long_idle_timeout(tmp.path());
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    let received = |c: &Cluster| -> u64 {
        api(&c.applier_sock, "GET", "/v1/status")
            .and_then(|(_, st)| st["tablets"]["t1"]["received_pos"].as_u64())
            .unwrap_or(0)
    };
    let end = control_durable(&c.wal, "t1");
    wait_for("t1 received", Duration::from_secs(20), || {
        received(&c) >= end
    });
    let key = c.data.join("quic-reset.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the reset key is private");
    applier.kill9();
    let _applier = c.start_applier();
    write_records(&c.wal, "t1", 2, |i| format!("w{i}").into_bytes());
    let end = control_durable(&c.wal, "t1");
    let t0 = std::time::Instant::now();
    wait_for(
        "t1's new records received by the restarted applier well within the idle timeout",
        Duration::from_secs(10),
        || received(&c) >= end,
    );
    eprintln!("resumed {:?} after the restart", t0.elapsed());
}

/// A SIGKILLed applier that stays down: the shipper notices within its silence limit (5 s),
/// not after the QUIC idle timeout (30 s here) — its status leaves `streaming`/`idle` and
/// names the reason — and resumes within seconds once the applier is back.
#[test]
fn a_dead_applier_is_noticed_within_the_silence_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster_with_long_idle_timeout(tmp.path());
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    let end = control_durable(&c.wal, "t1");
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    let connected = |c: &Cluster| -> Option<(String, u64)> {
        let row = ship_row(c, "t1")?;
        Some((
            row["state"].as_str()?.to_string(),
            row["acked_pos"].as_u64()?,
        ))
    };
    wait_for("t1 shipped and acked", Duration::from_secs(20), || {
        connected(&c).is_some_and(|(s, a)| (s == "streaming" || s == "idle") && a >= end)
    });
    applier.kill9();
    let t0 = std::time::Instant::now();
    wait_for(
        "the shipper to give up the dead applier's connection",
        Duration::from_secs(15),
        || connected(&c).is_some_and(|(s, _)| s == "connecting"),
    );
    eprintln!("noticed {:?} after the SIGKILL", t0.elapsed());
    let (_, st) = api(&c.shipper_sock, "GET", "/v1/status").unwrap();
    assert_eq!(st["connected_lanes"], 0, "{st}");
    // The outage outlasts a few reconnect attempts.
    wait_for("a few reconnect attempts", Duration::from_secs(30), || {
        scrape(&c.shipper_sock).is_some_and(|(_, text)| {
            text.lines()
                .find_map(|l| l.strip_prefix("tidelog_shipper_reconnects_total "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .is_some_and(|n| n >= 3)
        })
    });
    let mut applier = c.start_applier();
    write_records(&c.wal, "t1", 2, |i| format!("w{i}").into_bytes());
    let end = control_durable(&c.wal, "t1");
    let t0 = std::time::Instant::now();
    wait_for(
        "t1's new records acked by the restarted applier",
        Duration::from_secs(15),
        || connected(&c).is_some_and(|(_, a)| a >= end),
    );
    eprintln!("resumed {:?} after the restart", t0.elapsed());
    assert!(shipper.terminate(Duration::from_secs(20)), "shipper stop");
    assert!(applier.terminate(Duration::from_secs(20)), "applier stop");
}

/// The other way round: a SIGKILLed shipper's connection is given up by the applier within
/// the silence limit (5 s), not after the QUIC idle timeout (30 s here): its tablets show
/// `disconnected` and are free for another shipper at once.
#[test]
fn a_dead_shipper_is_noticed_by_the_applier_within_the_silence_limit() {
    let tmp = tempfile::tempdir().unwrap();
    let c = cluster_with_long_idle_timeout(tmp.path());
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    let end = control_durable(&c.wal, "t1");
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    let state = |c: &Cluster| -> Option<(String, u64)> {
        let (_, st) = api(&c.applier_sock, "GET", "/v1/status")?;
        let row = &st["tablets"]["t1"];
        Some((
            row["state"].as_str()?.to_string(),
            row["received_pos"].as_u64()?,
        ))
    };
    wait_for("t1 streaming and received", Duration::from_secs(20), || {
        state(&c).is_some_and(|(s, r)| s == "streaming" && r >= end)
    });
    shipper.kill9();
    let t0 = std::time::Instant::now();
    wait_for(
        "the applier to give up the dead shipper's connection",
        Duration::from_secs(15),
        || state(&c).is_some_and(|(s, _)| s == "disconnected"),
    );
    eprintln!("noticed {:?} after the SIGKILL", t0.elapsed());
    assert!(applier.terminate(Duration::from_secs(20)), "applier stop");
}

/// Frames shipped but never acked (the applier stopped, then SIGKILLed) are shipped again
/// on the next connection; the shipper's record lag counts the current stream's unacked
/// records only, so it returns to 0 once everything is acked instead of keeping the resent
/// frames counted twice.
#[test]
fn shipper_record_lag_returns_to_zero_after_unacked_frames_are_resent() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    let mut applier = c.start_applier();
    let mut shipper = c.start_shipper();
    let row = |c: &Cluster| -> Option<(u64, u64, u64)> {
        let r = ship_row(c, "t1")?;
        Some((
            r["shipped_pos"].as_u64()?,
            r["acked_pos"].as_u64()?,
            r["lag_records"].as_u64()?,
        ))
    };
    let end = control_durable(&c.wal, "t1");
    wait_for("t1 acked", Duration::from_secs(20), || {
        row(&c).is_some_and(|(_, a, lag)| a >= end && lag == 0)
    });
    // Frozen: frames go out, no ack comes back.
    unsafe { libc::kill(applier.pid(), libc::SIGSTOP) };
    write_records(&c.wal, "t1", 4, |i| format!("w{i}").into_bytes());
    let end = control_durable(&c.wal, "t1");
    wait_for("t1 shipped, not acked", Duration::from_secs(20), || {
        row(&c).is_some_and(|(s, a, lag)| s >= end && a < end && lag == 4)
    });
    applier.kill9();
    let mut applier = c.start_applier();
    wait_for("t1 resent and acked", Duration::from_secs(30), || {
        row(&c).is_some_and(|(_, a, _)| a >= end)
    });
    let r = ship_row(&c, "t1").unwrap();
    assert_eq!(r["lag_records"], 0, "{r}");
    assert_eq!(r["records_acked"], 7, "{r}");
    assert_eq!(
        ship_metric(&c, "tidelog_shipper_lag_records", "t1"),
        Some(0)
    );
    assert!(shipper.terminate(Duration::from_secs(20)), "shipper stop");
    assert!(applier.terminate(Duration::from_secs(20)), "applier stop");
}
