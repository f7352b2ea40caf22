//! A received-log segment that loses its tail while the applier is down: on restart the
//! log is cut at its last valid record (as the source's WAL is), the shipper sends the
//! rest again, and the tablet goes on applying from its apply position — no
//! `apply_failed`, no second restart, every record exactly once.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(60);

fn row(socket: &Path, t: &str) -> Value {
    api(socket, "GET", "/v1/status").map_or(Value::Null, |r| r.1["tablets"][t].clone())
}

#[test]
fn a_truncated_received_log_is_refilled_and_applied_on_without_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    write_records(&c.wal, "t1", 300, |i| format!("v{i}").into_bytes());
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("300 records applied", WAIT, || {
        row(&c.applier_sock, "t1")["applied_records"] == 300
    });
    let before = row(&c.applier_sock, "t1");
    assert!(applier.terminate(Duration::from_secs(30)));

    // The last segment of the received log loses the second half of what it holds.
    let dir = c.data.join("received/t1");
    let segs = tidelog_wal::reader::list_segments(&dir).unwrap();
    let (first, path) = segs.last().unwrap().clone();
    let end = before["received_pos"].as_u64().unwrap();
    let kept = (end - first.0) / 2;
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(tidelog_wal::format::SEGMENT_HEADER_LEN as u64 + kept)
        .unwrap();

    let mut applier = c.start_applier();
    // The intake cuts the log at its last valid record, below the apply position, and the
    // shipper sends the rest again; the tablet never stops.
    let mut r = Value::Null;
    wait_for("the received log refilled", WAIT, || {
        r = row(&c.applier_sock, "t1");
        assert_ne!(r["state"], "apply_failed", "{r}");
        r["received_pos"].as_u64() >= Some(end)
    });
    write_record_range(&c.wal, "t1", 300..350, |i| format!("v{i}").into_bytes());
    wait_for("the new records applied", WAIT, || {
        r = row(&c.applier_sock, "t1");
        assert_ne!(r["state"], "apply_failed", "{r}");
        r["applied_records"] == 350 && r["applied_pos"] == r["received_pos"]
    });
    assert!(r["error"].is_null(), "{r}");
    assert!(applier.running(), "the applier exited");
    // Every key once, with its value.
    let (code, v) = api(
        &c.applier_sock,
        "GET",
        "/v1/scan?prefix=t1/&mode=latest&limit=1000",
    )
    .unwrap();
    assert_eq!(code, 200, "{v}");
    let items = scan_items(&v);
    assert_eq!(items.len(), 350);
    for i in 0..350 {
        assert_eq!(
            items.get(&format!("t1/k{i}")).map(String::as_str),
            Some(format!("v{i}").as_str())
        );
    }
}
