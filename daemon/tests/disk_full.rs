//! A full disk under the applier, with real daemons on a small tmpfs (skipped with a note
//! where it cannot be mounted): intake and apply stop cleanly with a `disk_full` state that
//! names the path (status, metrics, the 503 of consistent reads), and go on by themselves
//! once space returns — no restart — with every record applied exactly once.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::time::Duration;

use common::tmpfs::Tmpfs;
use common::*;
use serde_json::Value;
use tidelog_wal::{SyncPolicy, TabletId, WalOptions, Writer};

const WAIT: Duration = Duration::from_secs(120);

fn status(socket: &Path) -> Value {
    api(socket, "GET", "/v1/status").map_or(Value::Null, |r| r.1)
}

/// The value of record `i` of tablet number `t`: 4 KiB of pseudo-random letters (that
/// compression does not shrink much), different for every record.
fn value(t: u64, i: u64) -> String {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(t << 32 | i);
    (0..4096)
        .map(|_| char::from(rng.random_range(b'a'..=b'z')))
        .collect()
}

/// Appends records `from..to` (`<tablet>/k<i:05>` = `value(t, i)`) to the source WAL, in
/// commits of 50.
fn append(wal: &Path, t: u64, from: u64, to: u64) {
    let tablet: TabletId = format!("d{t}").parse().unwrap();
    let mut w = Writer::open(wal, &tablet, WalOptions::default()).unwrap();
    for i in from..to {
        append_write(
            &mut w,
            format!("{tablet}/k{i:05}"),
            value(t, i).into_bytes(),
        );
        if i % 50 == 49 {
            w.commit(SyncPolicy::Always).unwrap();
        }
    }
    w.commit(SyncPolicy::Always).unwrap();
}

/// A test cluster whose applier `data-dir` is on a tmpfs of `size`, with `extra` applier
/// keys; `None` (the test skipped, with a printed note) where no tmpfs can be mounted.
fn on_tmpfs(size: &str, test: &str, extra: &str) -> Option<(Tmpfs, tempfile::TempDir, Cluster)> {
    let fs = Tmpfs::mount(size, test)?;
    let tmp = tempfile::tempdir().unwrap();
    let mut c = Cluster::with(tmp.path(), "batch", extra, "");
    c.move_data_dir(&fs.path().join("applier"));
    Some((fs, tmp, c))
}

/// Every key of tablet `t` holds its value, no other key is there, and the tablet applied
/// exactly `n` records (each once: a record applied twice counts twice). Read `latest`
/// (the source is idle by now, so its safe time is older than `max-staleness`), a hundred
/// keys per request.
fn assert_exactly_once(c: &Cluster, t: u64, n: u64) {
    let tablet = format!("d{t}");
    for h in 0..n.div_ceil(100) {
        let (code, v) = api(
            &c.applier_sock,
            "GET",
            &format!("/v1/scan?prefix={tablet}/k{h:03}&limit=1000&mode=latest"),
        )
        .unwrap_or_else(|| panic!("no answer to a scan; status {:#}", status(&c.applier_sock)));
        assert_eq!(code, 200, "{v}");
        let items = scan_items(&v);
        let want: Vec<u64> = (h * 100..((h + 1) * 100).min(n)).collect();
        assert_eq!(items.len(), want.len(), "keys {tablet}/k{h:03}xx");
        for i in want {
            let key = format!("{tablet}/k{i:05}");
            assert_eq!(
                items.get(&key).map(String::as_str),
                Some(value(t, i).as_str()),
                "{key}"
            );
        }
    }
    let row = &status(&c.applier_sock)["tablets"][&tablet];
    assert_eq!(row["applied_records"], n, "{row}");
    assert_eq!(row["applied_pos"], row["received_pos"], "{row}");
}

/// The disk under the applier's data-dir fills while two tablets stream: the tablet and
/// the store say `disk_full` with the path, in status, metrics and the 503 of a consistent
/// read; the logs say it once per change, not per retry. Once the ballast is removed
/// everything is applied without a restart, exactly once.
#[test]
fn a_full_disk_stops_intake_and_apply_cleanly_and_both_resume_once_space_returns() {
    let Some((fs, tmp, c)) = on_tmpfs(
        "48m",
        "a_full_disk_stops_intake_and_apply_cleanly_and_both_resume_once_space_returns",
        "max-staleness = \"10s\"\n",
    ) else {
        return;
    };
    // 2 × 2 500 records of 4 KiB: 20 MiB, with 8 MiB free.
    let n = 2_500u64;
    append(&c.wal, 0, 0, 200);
    append(&c.wal, 1, 0, 200);
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("the first records applied", WAIT, || {
        let st = status(&c.applier_sock);
        (0..2).all(|t| st["tablets"][format!("d{t}")]["applied_records"] == 200)
    });
    fs.fill(8 << 20);
    let writers: Vec<_> = (0..2)
        .map(|t| {
            let wal = c.wal.clone();
            std::thread::spawn(move || append(&wal, t, 200, n))
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }

    // Full: a tablet (its intake or its apply stage) or the store says so, with the path.
    let data = fs.path().join("applier").display().to_string();
    let mut full = Value::Null;
    wait_for("a disk_full state", WAIT, || {
        full = status(&c.applier_sock);
        full["store"]["state"] == "disk_full"
            || (0..2).any(|t| full["tablets"][format!("d{t}")]["state"] == "disk_full")
    });
    let said = full.to_string();
    assert!(
        said.contains(&format!("no space left on device at {data}")),
        "{full:#}"
    );
    let (_, metrics) = scrape(&c.applier_sock).unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("tidelog_applier_tablet_state{")
                && l.contains("state=\"disk_full\"")
                && l.ends_with(" 1")),
        "no tablet in state disk_full in the metrics"
    );
    // The safe time stops moving: once stale, a consistent read's 503 says why.
    let mut read = (0, Value::Null);
    wait_for(
        "a 503 of a consistent read naming the full disk",
        WAIT,
        || {
            read = api(&c.applier_sock, "GET", "/v1/kv/d0/k00000").unwrap_or((0, Value::Null));
            read.0 == 503
                && read.1["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("no space left on device at"))
        },
    );
    assert!(
        read.1["message"].as_str().unwrap().contains(&data),
        "{}",
        read.1
    );

    // Space returns: everything is applied, with no restart.
    fs.drain();
    wait_for(
        "every record applied after the space returned",
        WAIT,
        || {
            let st = status(&c.applier_sock);
            (0..2).all(|t| {
                let row = &st["tablets"][format!("d{t}")];
                row["applied_records"] == n && row["applied_pos"] == row["received_pos"]
            }) && st["store"]["state"] == "ok"
        },
    );
    assert!(applier.running(), "the applier exited");
    let st = status(&c.applier_sock);
    for t in 0..2 {
        let row = &st["tablets"][format!("d{t}")];
        assert!(row["error"].is_null(), "an error left behind: {row}");
        assert_ne!(row["state"], "disk_full", "{row}");
    }
    for t in 0..2 {
        assert_exactly_once(&c, t, n);
    }
    // The safe time covers everything, and consistent reads are served again once the
    // source writes (its idle tablets have no heartbeats here).
    let st = status(&c.applier_sock);
    for t in 0..2 {
        let row = &st["tablets"][format!("d{t}")];
        assert_eq!(row["safe_time"], row["received_safe_time"], "{row}");
    }
    // (Fresh records on both tablets, until one is read at the safe time.)
    let mut next = n;
    wait_for("a consistent read again", WAIT, || {
        append(&c.wal, 0, next, next + 1);
        append(&c.wal, 1, next, next + 1);
        // d0's record comes first, so the safe time (the lower of the two) covers it.
        let key = format!("/v1/kv/d0/k{next:05}");
        next += 1;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match api(&c.applier_sock, "GET", &key) {
                Some((200, v)) if v["found"] == true => return true,
                _ if std::time::Instant::now() > deadline => return false,
                _ => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    });
    // Each change of state is logged once, not each retry.
    let log = std::fs::read_to_string(tmp.path().join("applier.log")).unwrap();
    let stops = log.matches("intake stopped until space returns").count()
        + log.matches("store writes stopped").count();
    assert!(
        (1..=20).contains(&stops),
        "{stops} log lines for the disk filling up"
    );
}

/// A segment larger than the whole disk (64 MiB on 48 MiB): the tablet is listed with a
/// clear error (how much a segment needs, how much is free, where), the shipper is told
/// the target's disk is full (not that another shipper owns the tablet), and the tablet
/// streams once the disk is grown, without a restart.
#[test]
fn a_segment_that_cannot_be_preallocated_shows_its_tablet_with_a_clear_error() {
    let Some((fs, _tmp, c)) = on_tmpfs(
        "48m",
        "a_segment_that_cannot_be_preallocated_shows_its_tablet_with_a_clear_error",
        "segment-size = \"64MiB\"\n",
    ) else {
        return;
    };
    append(&c.wal, 0, 0, 10);
    let mut applier = c.start_applier();
    let shipper = c.start_shipper();
    let mut row = Value::Null;
    wait_for("tablet d0 listed as disk_full", WAIT, || {
        row = status(&c.applier_sock)["tablets"]["d0"].clone();
        row["state"] == "disk_full"
    });
    let err = row["error"].as_str().unwrap_or_default();
    let dir = fs.path().join("applier/received/d0");
    assert!(
        err.contains(&format!(
            "segment cannot be preallocated: needs {} bytes",
            64 << 20
        )) && err.contains(&format!("free at {}", dir.display()))
            && err.starts_with("no space left on device at"),
        "{row}"
    );
    // The shipper hears why: the target's disk, not another shipper.
    let mut srow = Value::Null;
    wait_for("the shipper told of the full disk", WAIT, || {
        srow = status(&c.shipper_sock)["tablets"]["d0"].clone();
        srow["error"]
            .as_str()
            .is_some_and(|e| e.contains("disk_full") && e.contains("no space left on device"))
    });
    assert!(
        !srow["error"].as_str().unwrap().contains("already shipped"),
        "{srow}"
    );
    assert_ne!(srow["state"], "refused", "{srow}");
    // A consistent read says what holds the tablet, not only that it has not reported.
    let (code, v) = api(&c.applier_sock, "GET", "/v1/kv/d0/k00000").unwrap();
    assert_eq!(code, 503, "{v}");
    let msg = v["message"].as_str().unwrap_or_default();
    assert!(msg.contains("segment cannot be preallocated"), "{v}");

    fs.resize("160m");
    wait_for("tablet d0 applied after the disk grew", WAIT, || {
        let r = &status(&c.applier_sock)["tablets"]["d0"];
        r["applied_records"] == 10 && r["error"].is_null()
    });
    assert!(applier.running(), "the applier exited");
    wait_for("the shipper streaming again", WAIT, || {
        let r = &status(&c.shipper_sock)["tablets"]["d0"];
        r["acked_pos"] == r["durable_pos"] && r["error"].is_null()
    });
    drop(shipper);
}

/// The store's disk fills while the received log still has room (its segment was
/// preallocated before): the store stops taking writes (`disk_full` naming the store's
/// path, apply holds), and once space returns the store is reopened by itself and every
/// record is applied exactly once, without a restart.
#[test]
fn a_full_store_is_reopened_by_itself_once_space_returns() {
    let Some((fs, _tmp, c)) = on_tmpfs(
        "64m",
        "a_full_store_is_reopened_by_itself_once_space_returns",
        "segment-size = \"32MiB\"\n",
    ) else {
        return;
    };
    let n = 2_200u64;
    append(&c.wal, 0, 0, 200);
    let mut applier = c.start_applier();
    let _shipper = c.start_shipper();
    wait_for("the first records applied", WAIT, || {
        status(&c.applier_sock)["tablets"]["d0"]["applied_records"] == 200
    });
    // 2 MiB free; 8 MiB more fit in the received log's segment, not in the store.
    fs.fill(2 << 20);
    append(&c.wal, 0, 200, n);
    let store = fs.path().join("applier/store").display().to_string();
    let mut st = Value::Null;
    wait_for("the store full", WAIT, || {
        st = status(&c.applier_sock);
        st["store"]["state"] == "disk_full" && st["tablets"]["d0"]["state"] == "disk_full"
    });
    let err = st["tablets"]["d0"]["error"].as_str().unwrap_or_default();
    assert!(
        err.contains(&format!("no space left on device at {store}")),
        "{st:#}"
    );
    assert_eq!(st["store"]["reopened"], 0, "{st:#}");

    fs.drain();
    wait_for(
        "every record applied after the space returned",
        WAIT,
        || {
            let st = status(&c.applier_sock);
            let row = &st["tablets"]["d0"];
            row["applied_records"] == n && row["applied_pos"] == row["received_pos"]
        },
    );
    let st = status(&c.applier_sock);
    assert_eq!(st["store"]["state"], "ok", "{st:#}");
    assert!(st["store"]["reopened"].as_u64() >= Some(1), "{st:#}");
    assert!(st["tablets"]["d0"]["error"].is_null(), "{st:#}");
    assert!(applier.running(), "the applier exited");
    assert_exactly_once(&c, 0, n);
    // And after a restart, the same (nothing was applied twice into the journal).
    applier.terminate(Duration::from_secs(30));
    let _applier = c.start_applier();
    wait_for("the restarted applier", WAIT, || {
        status(&c.applier_sock)["tablets"]["d0"]["applied_records"] == n
    });
    assert_exactly_once(&c, 0, n);
}
