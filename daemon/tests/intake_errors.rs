//! A tablet's intake error is shown while its condition lasts and cleared once it ends:
//! a shipper that reported `needs_bootstrap` and then streams again leaves no stale error.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidelog_wal::{TabletId, WalOptions, Writer};

const WAIT: Duration = Duration::from_secs(60);

fn row(socket: &Path, t: &str) -> Value {
    api(socket, "GET", "/v1/status").map_or(Value::Null, |r| r.1["tablets"][t].clone())
}

#[test]
fn a_needs_bootstrap_error_is_cleared_once_the_tablet_streams_again() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    // A source log whose segments are gone (its control file says the log exists): the
    // shipper cannot serve position 0 and reports `needs_bootstrap`.
    let t: TabletId = "t1".parse().unwrap();
    drop(Writer::open(&c.wal, &t, WalOptions::default()).unwrap());
    for (_, path) in tidelog_wal::reader::list_segments(&c.wal.join("t1")).unwrap() {
        std::fs::remove_file(path).unwrap();
    }
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let mut r = Value::Null;
    wait_for("t1 needs bootstrap", WAIT, || {
        r = row(&c.applier_sock, "t1");
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("needs_bootstrap"))
    });

    // The source log is there again (as when a writer recovers it): the tablet streams.
    write_records(&c.wal, "t1", 20, |i| format!("v{i}").into_bytes());
    wait_for("t1 applied", WAIT, || {
        r = row(&c.applier_sock, "t1");
        r["applied_records"] == 20
    });
    wait_for("t1's stale error cleared", Duration::from_secs(5), || {
        r = row(&c.applier_sock, "t1");
        r["error"].is_null()
    });
    assert_ne!(r["state"], "needs_bootstrap", "{r}");
}
