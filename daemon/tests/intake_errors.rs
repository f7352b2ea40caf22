//! A tablet's intake error is shown while its condition lasts and cleared once it ends:
//! a shipper that reported `needs_bootstrap` and then streams again leaves no stale error.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::Value;
use tidelog_wal::{Body, HybridTime, Op, Record, SyncPolicy, TabletId, WalOptions, Writer};

const WAIT: Duration = Duration::from_secs(60);

fn row(socket: &Path, t: &str) -> Value {
    api(socket, "GET", "/v1/status").map_or(Value::Null, |r| r.1["tablets"][t].clone())
}

#[test]
fn a_needs_bootstrap_error_is_cleared_once_the_tablet_streams_again() {
    let tmp = tempfile::tempdir().unwrap();
    let c = Cluster::new(tmp.path(), "batch", "");
    // A source log whose first segment is gone (moved away): the shipper cannot serve
    // position 0, where the target starts, and reports `needs_bootstrap`.
    let t: TabletId = "t1".parse().unwrap();
    let n = 1_500u64;
    let mut w = Writer::open(
        &c.wal,
        &t,
        WalOptions {
            segment_size: 64 << 10,
            ..WalOptions::default()
        },
    )
    .unwrap();
    for i in 0..n {
        w.append(&Record::new(
            HybridTime::from_system_time(std::time::SystemTime::now())
                .max(w.last_ht().map_or(HybridTime(1), HybridTime::next)),
            Body::Write {
                ops: vec![Op::put(format!("t1/k{i}"), format!("v{i}"))],
                trx_id: None,
                gtid: None,
            },
        ))
        .unwrap();
    }
    w.commit(SyncPolicy::Always).unwrap();
    drop(w);
    let segs = tidelog_wal::reader::list_segments(&c.wal.join("t1")).unwrap();
    assert!(segs.len() > 1, "{segs:?}");
    let aside = tmp.path().join("first-segment");
    std::fs::rename(&segs[0].1, &aside).unwrap();
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let mut r = Value::Null;
    wait_for("t1 needs bootstrap", WAIT, || {
        r = row(&c.applier_sock, "t1");
        r["error"]
            .as_str()
            .is_some_and(|e| e.contains("needs_bootstrap"))
    });

    // The segment is put back (the operator restored it): the tablet streams again.
    std::fs::rename(&aside, &segs[0].1).unwrap();
    wait_for("t1 applied", WAIT, || {
        r = row(&c.applier_sock, "t1");
        r["applied_records"] == n
    });
    wait_for("t1's stale error cleared", Duration::from_secs(5), || {
        r = row(&c.applier_sock, "t1");
        r["error"].is_null()
    });
    assert_ne!(r["state"], "needs_bootstrap", "{r}");
}
