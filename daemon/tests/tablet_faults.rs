//! Bad input stops as little as possible, with real daemons: a record the applier cannot
//! apply stops only its own tablet with a named state, before and after a restart; the
//! status and the 503 of a consistent read name the tablet, the received-log position and
//! the reason; the other tablets keep flowing.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidelog_wal::format::{record_checksum, MAX_KEY_LEN, RECORD_HEADER_LEN};
use tidelog_wal::{SyncPolicy, TabletId, WalOptions, WalPos, Writer};

const WAIT: Duration = Duration::from_secs(60);

/// A record of `kind` with `body` at `pos`, encoded by hand: the WAL writer's own limits
/// (key length, ht bounds) are not applied, as a source built with other limits, or a
/// damaged one whose checksums still match, would have written it.
fn encode(pos: WalPos, ht: u64, kind: u8, body: &[u8]) -> Vec<u8> {
    let mut rec = vec![0u8; RECORD_HEADER_LEN];
    rec[8..12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    rec[12] = kind;
    rec[16..24].copy_from_slice(&ht.to_le_bytes());
    rec[24..32].copy_from_slice(&pos.0.to_le_bytes());
    rec.extend_from_slice(body);
    let sum = record_checksum(&rec);
    rec[..8].copy_from_slice(&sum.to_le_bytes());
    rec
}

/// The body of a `write` of one op, `key` = `v`.
fn write_body(key: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(&(key.len() as u32).to_le_bytes());
    b.extend_from_slice(&1u32.to_le_bytes());
    b.extend_from_slice(key);
    b.push(b'v');
    b
}

/// Appends hand-encoded write records `(ht, key)` to `tablet` in the source WAL `wal`
/// (bytes verbatim, checked only for position, checksum and ht order); returns their
/// positions.
fn append_raw(wal: &Path, tablet: &str, recs: &[(u64, Vec<u8>)]) -> Vec<WalPos> {
    let recs: Vec<(u64, u8, Vec<u8>)> = recs.iter().map(|(h, k)| (*h, 1, write_body(k))).collect();
    append_encoded(wal, tablet, &recs)
}

/// Appends hand-encoded records `(ht, kind, body)` to `tablet` in `wal`; their positions.
fn append_encoded(wal: &Path, tablet: &str, recs: &[(u64, u8, Vec<u8>)]) -> Vec<WalPos> {
    let t: TabletId = tablet.parse().unwrap();
    let mut w = Writer::open(wal, &t, WalOptions::default()).unwrap();
    let mut pos = Vec::new();
    for (ht, kind, body) in recs {
        let at = w.staged_pos();
        w.append_encoded(&encode(at, *ht, *kind, body)).unwrap();
        pos.push(at);
    }
    w.commit(SyncPolicy::Always).unwrap();
    pos
}

fn status(c: &Cluster) -> Value {
    api(&c.applier_sock, "GET", "/v1/status").map_or(Value::Null, |r| r.1)
}

fn get(c: &Cluster, key: &str, mode: &str) -> (u16, Value) {
    api(&c.applier_sock, "GET", &format!("/v1/kv/{key}?mode={mode}")).unwrap_or((0, Value::Null))
}

/// A consistent read refused with a 503 of `code`; its message.
fn refused_read(c: &Cluster, code: &str) -> String {
    let (st, body) = get(c, "t1/k0", "consistent");
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"], code, "{body}");
    body["message"].as_str().unwrap().to_string()
}

/// The state a key of 65 526 bytes puts its tablet in: the store refuses it
/// (`record_rejected`), or, where the WAL's own key limit is below it, the received log's
/// reader does (`apply_failed`, the record does not decode).
fn long_key_state() -> &'static str {
    if MAX_KEY_LEN >= 65_526 {
        "record_rejected"
    } else {
        "apply_failed"
    }
}

/// Waits until tablet `t` shows a stopped state; returns its row.
fn wait_stopped(c: &Cluster, t: &str) -> Value {
    let mut row = Value::Null;
    wait_for(&format!("tablet {t} stopped"), WAIT, || {
        row = status(c)["tablets"][t].clone();
        row["state"] == "record_rejected" || row["state"] == "apply_failed"
    });
    row
}

/// Asserts a stopped tablet's row: the state, and an error naming the tablet, the
/// received-log position of the record and the reason (the key's size); no panic.
fn assert_rejected_row(row: &Value, t: &str, pos: WalPos) {
    let err = row["error"].as_str().unwrap_or_default();
    assert_eq!(row["state"], long_key_state(), "{row}");
    assert!(
        err.contains(&format!("tablet {t}"))
            && err.contains(&format!("received-log position {pos}"))
            && err.contains("65526"),
        "{row}"
    );
    assert!(!err.contains("panic"), "{row}");
    assert_eq!(row["applied_pos"], pos.0, "{row}");
}

/// The key of 65 526 bytes that panicked the apply worker inside fjall (the encoding adds
/// 10 bytes), as the first record of a new tablet: that tablet alone stops, named, with
/// the position and the reason, in status and in the 503 of a consistent read (not "has
/// not reported yet"); another tablet keeps being applied; a restart finds the same state
/// without a panic.
#[test]
fn a_record_the_store_cannot_take_stops_only_its_tablet_with_a_named_state() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 5, |i| format!("v{i}").into_bytes());
    let now = ht_ago(Duration::ZERO);
    // A record follows the bad one: on a restart, the received log's recovery must not
    // take the bad one for corruption (it would refuse the log) or a torn tail (it would
    // cut what was acknowledged).
    let bad = append_raw(
        &c.wal,
        "k2",
        &[(now, vec![b'K'; 65_526]), (now + 1, b"k2/after".to_vec())],
    )[0];
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    let row = wait_stopped(&c, "k2");
    assert_rejected_row(&row, "k2", bad);
    wait_for("t1 applied", WAIT, || {
        let t1 = &status(&c)["tablets"]["t1"];
        t1["applied_pos"].as_u64().is_some() && t1["applied_pos"] == t1["received_pos"]
    });

    // Consistent reads name the stopped tablet, the position and the reason.
    let msg = refused_read(&c, "safe_time_uninitialized");
    assert!(
        msg.contains("tablet k2")
            && msg.contains(&format!("received-log position {bad}"))
            && msg.contains("65526")
            && !msg.contains("has not reported yet"),
        "{msg}"
    );
    let st = api(&c.applier_sock, "GET", "/v1/safe-time").unwrap().1;
    assert!(
        st["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("tablet k2"),
        "{st}"
    );
    // The other tablet keeps flowing: new records are applied, latest reads see them.
    write_records(&c.wal, "t1", 8, |i| format!("w{i}").into_bytes());
    wait_for("t1's new records applied", WAIT, || {
        get(&c, "t1/k7", "latest").1["value"] == "w7"
    });

    // After a restart: the same state, the same record, no panic.
    assert!(applier.terminate(Duration::from_secs(30)), "clean stop");
    let _applier = c.start_applier();
    let row = wait_stopped(&c, "k2");
    assert_rejected_row(&row, "k2", bad);
    wait_for("t1 streaming again", WAIT, || {
        status(&c)["tablets"]["t1"]["state"] == "streaming"
    });
    let log = std::fs::read_to_string(tmp.path().join("applier.log")).unwrap();
    assert!(!log.contains("panicked"), "{log}");
}

/// A tablet stopped by a record it cannot apply holds the global safe time at its last
/// applied record (as it must: what follows may belong to transactions or precede commits
/// elsewhere). Within `max-staleness` consistent reads are served there; beyond it the
/// `stale_safe_time` 503 names the stopped tablet, the position and the reason.
#[test]
fn a_stopped_tablet_holds_the_safe_time_and_the_stale_read_names_it() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", "max-staleness = \"1m\"\n", "");
    let old = ht_ago(Duration::from_secs(3600));
    let pos = append_raw(
        &c.wal,
        "k2",
        &[(old, b"k2/a".to_vec()), (old + 10, vec![b'K'; 65_526])],
    );
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let row = wait_stopped(&c, "k2");
    assert_rejected_row(&row, "k2", pos[1]);
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    wait_for("t1 applied", WAIT, || {
        get(&c, "t1/k2", "latest").1["value"] == "v2"
    });
    // Held at k2's last applied record, an hour old: stale, and the 503 says why.
    let st = api(&c.applier_sock, "GET", "/v1/safe-time").unwrap().1;
    assert_eq!(st["safe_time"], old.to_string(), "{st}");
    assert_eq!(st["laggiest_tablet"], "k2", "{st}");
    let msg = refused_read(&c, "stale_safe_time");
    assert!(
        msg.contains("laggiest tablet k2")
            && msg.contains(long_key_state())
            && msg.contains(&format!("received-log position {}", pos[1]))
            && msg.contains("65526"),
        "{msg}"
    );
    // Reads at the held safe time are consistent and served.
    let (code, body) = api(&c.applier_sock, "GET", &format!("/v1/kv/k2/a?at={old}")).unwrap();
    assert_eq!((code, body["value"].as_str()), (200, Some("v")), "{body}");
}

/// The heartbeat with ht = u64::MAX that set the global safe time to the year 2112 for
/// good (lag 0, so `stale_safe_time` never fired): refused at intake, its tablet shows
/// `clock_skew` naming it, nothing of it is written, and the safe time stays in the
/// present, also after a restart.
#[test]
fn a_frame_beyond_the_clock_is_refused_and_the_safe_time_does_not_move() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    write_records(&c.wal, "e1", 2, |i| format!("v{i}").into_bytes());
    let bad = append_encoded(&c.wal, "e1", &[(u64::MAX, 5, Vec::new())])[0];
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    for round in 0..2 {
        let mut row = Value::Null;
        // The records before it are written; from it on nothing is.
        wait_for("e1 refused for clock skew at the record", WAIT, || {
            row = status(&c)["tablets"]["e1"].clone();
            row["state"] == "clock_skew" && row["received_pos"] == bad.0
        });
        let err = row["error"].as_str().unwrap_or_default();
        assert!(
            err.contains("tablet e1")
                && err.contains(&format!("received-log position {bad}"))
                && err.contains("18446744073709551615")
                && err.contains("max-clock-skew 500ms"),
            "round {round}: {row}"
        );
        wait_for("e1 and t1 applied", WAIT, || {
            let s = status(&c);
            ["e1", "t1"].iter().all(|t| {
                let r = &s["tablets"][t];
                r["applied_pos"].as_u64().is_some() && r["applied_pos"] == r["received_pos"]
            })
        });
        let st = api(&c.applier_sock, "GET", "/v1/safe-time").unwrap().1;
        let safe: u64 = st["safe_time"].as_str().unwrap().parse().unwrap();
        assert!(
            safe <= now_ht(),
            "round {round}: the safe time is in the future: {st}"
        );
        let e1: u64 = st["tablets"]["e1"]["safe_time"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(e1 <= now_ht(), "round {round}: {st}");
        let (code, body) = get(&c, "t1/k2", "consistent");
        assert_eq!((code, body["value"].as_str()), (200, Some("v2")), "{body}");
        if round == 0 {
            assert!(applier.terminate(Duration::from_secs(30)), "clean stop");
            applier = c.start_applier();
        }
    }
}

/// A record a little ahead of the applier's clock (a source clock a few seconds fast) is
/// refused while it is beyond `max-clock-skew`, and taken once the clock has caught up: the
/// state clears by itself, with no restart.
#[test]
fn a_frame_a_little_ahead_is_taken_once_the_clock_catches_up() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::with(tmp.path(), "batch", "max-clock-skew = \"500ms\"\n", "");
    write_records(&c.wal, "e1", 1, |i| format!("v{i}").into_bytes());
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("e1 applied", WAIT, || {
        get(&c, "e1/k0", "latest").1["value"] == "v0"
    });
    let ahead = ht_ago(Duration::ZERO) + ((6_000_000u64) << 12);
    append_raw(&c.wal, "e1", &[(ahead, b"e1/ahead".to_vec())]);
    let mut row = Value::Null;
    wait_for("e1 refused for clock skew", WAIT, || {
        row = status(&c)["tablets"]["e1"].clone();
        row["state"] == "clock_skew"
    });
    assert!(
        row["error"].as_str().unwrap_or_default().contains("e1"),
        "{row}"
    );
    wait_for("the record taken once within the bound", WAIT, || {
        get(&c, "e1/ahead", "latest").1["value"] == "v"
    });
    assert!(
        now_ht() + (500_000u64 << 12) >= ahead,
        "taken while still beyond the bound"
    );
    wait_for("e1 streaming again", WAIT, || {
        let r = &status(&c)["tablets"]["e1"];
        r["state"] == "streaming" && r["error"].is_null()
    });
}

/// A panic while applying (here injected with the `apply::batch` fail point) stops only
/// its tablet (`apply_failed`, naming the position and the panic), is logged through the
/// log (tracing) with the thread and the tablet rather than only as the standard panic
/// message, and leaves nothing behind: after a restart the tablet applies.
#[test]
fn a_panic_while_applying_is_logged_with_its_tablet_and_stops_only_that_tablet() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 3, |i| format!("v{i}").into_bytes());
    let log_path = tmp.path().join("applier.log");
    let mut applier = Daemon::start_env(
        "apply",
        &c.applier_cfg,
        &log_path,
        &[("FAILPOINTS", "apply::batch=1*panic(injected apply failure)")],
    );
    let _shipper = c.start_shipper();
    let mut row = Value::Null;
    wait_for("t1 stopped by the panic", WAIT, || {
        row = status(&c)["tablets"]["t1"].clone();
        row["state"] == "apply_failed"
    });
    let err = row["error"].as_str().unwrap_or_default();
    assert!(
        err.contains("tablet t1")
            && err.contains("received-log position 0")
            && err.contains("panicked: injected apply failure"),
        "{row}"
    );
    let log = std::fs::read_to_string(&log_path).unwrap();
    let line = log
        .lines()
        .find(|l| l.contains("injected apply failure") && l.contains("ERROR"))
        .unwrap_or_else(|| panic!("no error line for the panic in the log:\n{log}"));
    assert!(
        line.contains("tablet=t1") && line.contains("thread=\"apply-"),
        "{line}"
    );
    assert!(
        !log.contains("' panicked at"),
        "the standard panic message was printed:\n{log}"
    );
    assert!(applier.terminate(Duration::from_secs(30)), "clean stop");
    let _applier = c.start_applier();
    wait_for("t1 applied after a restart", WAIT, || {
        get(&c, "t1/k2", "latest").1["value"] == "v2"
    });
}
