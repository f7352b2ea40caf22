//! Bad input stops as little as possible, with real daemons: a record the applier cannot
//! apply stops only its own tablet with a named state, before and after a restart; the
//! status and the 503 of a consistent read name the tablet, the received-log position and
//! the reason; the other tablets keep flowing.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use serde_json::Value;
use tidelog_wal::format::{record_checksum, MAX_KEY_LEN, RECORD_HEADER_LEN};
use tidelog_wal::{SyncPolicy, TabletId, WalOptions, WalPos, Writer};

const WAIT: Duration = Duration::from_secs(60);

/// Hybrid time `ago` before now.
fn ht_ago(ago: Duration) -> u64 {
    let us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
        - ago.as_micros() as u64;
    us << 12
}

/// A `write` record of one op (`key` = `v`) at `pos`, encoded by hand: the WAL writer's
/// own limits (key length, ht bounds) are not applied, as a source built with other limits,
/// or a damaged one whose checksums still match, would have written it.
fn encode_write(pos: WalPos, ht: u64, key: &[u8]) -> Vec<u8> {
    let mut rec = vec![0u8; RECORD_HEADER_LEN];
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(&(key.len() as u32).to_le_bytes());
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(key);
    rec.push(b'v');
    let body_len = (rec.len() - RECORD_HEADER_LEN) as u32;
    rec[8..12].copy_from_slice(&body_len.to_le_bytes());
    rec[12] = 1; // write
    rec[16..24].copy_from_slice(&ht.to_le_bytes());
    rec[24..32].copy_from_slice(&pos.0.to_le_bytes());
    let sum = record_checksum(&rec);
    rec[..8].copy_from_slice(&sum.to_le_bytes());
    rec
}

/// Appends hand-encoded write records `(ht, key)` to `tablet` in the source WAL `wal`
/// (bytes verbatim, checked only for position, checksum and ht order); returns their
/// positions.
fn append_raw(wal: &Path, tablet: &str, recs: &[(u64, Vec<u8>)]) -> Vec<WalPos> {
    let t: TabletId = tablet.parse().unwrap();
    let mut w = Writer::open(wal, &t, WalOptions::default()).unwrap();
    let mut pos = Vec::new();
    for (ht, key) in recs {
        let at = w.staged_pos();
        w.append_encoded(&encode_write(at, *ht, key)).unwrap();
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
    let bad = append_raw(
        &c.wal,
        "k2",
        &[(ht_ago(Duration::ZERO), vec![b'K'; 65_526])],
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
    let (st, body) = get(&c, "t1/k0", "consistent");
    assert_eq!(st, 503, "{body}");
    assert_eq!(body["error"], "safe_time_uninitialized", "{body}");
    let msg = body["message"].as_str().unwrap();
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
    let (code, body) = get(&c, "t1/k0", "consistent");
    assert_eq!(code, 503, "{body}");
    assert_eq!(body["error"], "stale_safe_time", "{body}");
    let msg = body["message"].as_str().unwrap();
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
