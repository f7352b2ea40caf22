//! A full disk under the store: writes stop with an error naming the path, and resume on
//! their own once space returns (the store is reopened), with nothing lost or applied twice.
//! Run on a small tmpfs; skipped with a note where it cannot be mounted.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tmpfs::Tmpfs;
use tidelog_applier::apply::{ApplyConfig, ApplyWorker};
use tidelog_applier::consistency::Consistency;
use tidelog_applier::error::Error;
use tidelog_applier::store::{Durability, Store};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, HybridTime, Op, Record, SyncPolicy, TabletId, WalOptions, WalPos, Writer};

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

/// Write record `i`: key `k{i:06}`, a value of `len` pseudo-random bytes derived from `i`
/// (that no compression shrinks).
fn record(i: u64, len: usize) -> Record {
    use rand::{RngCore, SeedableRng};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(i).fill_bytes(&mut v);
    Record::new(
        HybridTime(1_000 + i),
        Body::Write {
            ops: vec![Op::put(format!("k{i:06}"), v)],
            trx_id: None,
            gtid: None,
        },
    )
}

fn wait_until(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?}: {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every key `k0..kn` holds its value, once, and the tablet applied exactly `n` records.
fn assert_exactly_once(s: &Store, tablet: &TabletId, n: u64, len: usize) {
    for i in 0..n {
        let want = record(i, len);
        let Body::Write { ops, .. } = &want.body else {
            unreachable!()
        };
        let got = s.get(&ops[0].key, None).unwrap();
        let got = got.unwrap_or_else(|| panic!("key {i} missing"));
        assert_eq!(got.value, ops[0].value, "key {i}");
        assert_eq!(got.ht, want.ht, "key {i}");
    }
    let (all, more) = s.scan(b"k", None, (n + 10) as usize).unwrap();
    assert!(!more);
    assert_eq!(all.len() as u64, n, "no key beyond the records");
    assert_eq!(s.tablet(tablet).unwrap().unwrap().applied_records, n);
}

/// Store writes on a full disk fail with "no space left on device at <store path>"; once
/// the space returns the store is reopened by itself and writes go on from the apply
/// position it holds: every record exactly once.
#[test]
fn store_writes_resume_on_their_own_once_space_returns() {
    let Some(fs) = Tmpfs::mount("16m", "store_writes_resume_on_their_own_once_space_returns")
    else {
        return;
    };
    let data = fs.path().join("applier");
    let s = Store::open_with(&data, &small_cache()).unwrap();
    let tablet = t("t1");
    // Batches of 16 records of 4 KiB, each at its place in a log.
    let len = 4096;
    let mut batches: Vec<(Vec<(WalPos, Record)>, WalPos)> = Vec::new();
    let mut pos = WalPos(0);
    for b in 0..100u64 {
        let mut recs = Vec::new();
        for i in b * 16..(b + 1) * 16 {
            let r = record(i, len);
            let l = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
            recs.push((pos, r));
            pos = pos.add(l);
        }
        batches.push((recs, pos));
    }
    let n = batches.len() as u64 * 16;
    fs.fill(1 << 20);
    let mut failed = None;
    for (i, (recs, end)) in batches.iter().enumerate() {
        match s.apply(&tablet, recs, *end, Durability::Buffered) {
            Ok(_) => {}
            Err(e) => {
                failed = Some((i, e));
                break;
            }
        }
    }
    let (at, e) = failed.expect("1 MiB free took 6 MiB of records");
    let msg = e.to_string();
    let store_dir = data.join("store");
    assert!(
        matches!(e, Error::DiskFull(_))
            && msg.starts_with(&format!(
                "no space left on device at {}",
                store_dir.display()
            )),
        "{msg}"
    );
    assert!(s.disk_full().is_some_and(|d| d.path == store_dir));
    // Still full: writes keep failing the same clear way, reads go on.
    let again = s.apply(&tablet, &batches[at].0, batches[at].1, Durability::Buffered);
    assert!(matches!(again, Err(Error::DiskFull(_))), "{again:?}");
    assert_eq!(s.generation(), 0);
    s.get(b"k000000", None).unwrap();

    fs.drain();
    wait_until(
        "the store reopened once space returned",
        Duration::from_secs(30),
        || s.generation() > 0 && s.fault().is_none(),
    );
    // On from the position the store holds (the failed batch may have reached the journal
    // before its commit failed: then it is there, and is not applied again).
    let applied = s
        .tablet(&tablet)
        .unwrap()
        .map_or(WalPos(0), |m| m.applied_pos);
    let from = batches
        .iter()
        .position(|(recs, _)| recs[0].0 == applied)
        .unwrap_or_else(|| panic!("the stored apply position {applied} is no batch boundary"));
    assert!(
        from >= at.saturating_sub(1) && from <= at + 1,
        "{from} vs {at}"
    );
    for (recs, end) in &batches[from..] {
        s.apply(&tablet, recs, *end, Durability::Buffered).unwrap();
    }
    assert_exactly_once(&s, &tablet, n, len);
    drop(s);
    let s = Store::open_with(&data, &small_cache()).unwrap();
    assert_exactly_once(&s, &tablet, n, len);
}

/// An apply worker on a full disk holds (still running, the disk named) and applies on by
/// itself once space returns: the received log exactly once, and the safe time gets there.
#[test]
fn apply_holds_on_a_full_disk_and_resumes_exactly_once() {
    let Some(fs) = Tmpfs::mount("16m", "apply_holds_on_a_full_disk_and_resumes_exactly_once")
    else {
        return;
    };
    // The received log on the regular disk, the store on the small one.
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("received");
    let tablet = t("t1");
    let len = 4096;
    let n = 1_600u64;
    let mut w = Writer::open(&root, &tablet, WalOptions::default()).unwrap();
    for i in 0..n {
        w.append(&record(i, len)).unwrap();
    }
    let end = w.commit(SyncPolicy::Always).unwrap();
    drop(w);
    // A second tablet (keys `x…`), whose worker starts while the disk is full.
    let t2 = t("t2");
    let mut w = Writer::open(&root, &t2, WalOptions::default()).unwrap();
    for i in 0..10u64 {
        w.append(&Record::new(
            HybridTime(1_000 + n + i),
            Body::Write {
                ops: vec![Op::put(format!("x{i}"), format!("w{i}").into_bytes())],
                trx_id: None,
                gtid: None,
            },
        ))
        .unwrap();
    }
    let end2 = w.commit(SyncPolicy::Always).unwrap();
    drop(w);
    let data = fs.path().join("applier");
    let store = Arc::new(Store::open_with(&data, &small_cache()).unwrap());
    let consistency = Consistency::start(store.clone(), vec![tablet.clone(), t2.clone()]).unwrap();
    fs.fill(1 << 20);
    let cfg = || ApplyConfig {
        consistency: Some(consistency.clone()),
        batch_records: 64,
        ..ApplyConfig::default()
    };
    let mut worker = ApplyWorker::start(store.clone(), &root, tablet.clone(), cfg()).unwrap();
    worker.notify();
    wait_until(
        "the worker held on the full disk",
        Duration::from_secs(30),
        || worker.held().is_some(),
    );
    let held = worker.fault().unwrap();
    assert_eq!(held.state(), "disk_full");
    let msg = held.error.to_string();
    assert!(
        msg.starts_with(&format!(
            "no space left on device at {}",
            data.join("store").display()
        )),
        "{msg}"
    );
    assert!(worker.is_running() && worker.error().is_none());
    assert!(worker.applied_pos() < end);
    let before = consistency.safe_time();
    // Started while the store takes no writes: it runs, holding too.
    let mut worker2 = ApplyWorker::start(store.clone(), &root, t2.clone(), cfg()).unwrap();
    worker2.notify();
    wait_until("the second worker held", Duration::from_secs(30), || {
        worker2.fault().is_some_and(|f| f.state() == "disk_full")
    });
    assert!(worker2.is_running());

    fs.drain();
    assert!(
        worker.wait_applied(end, Duration::from_secs(60)),
        "not applied to the end once space returned: at {} of {end}, held {:?}, error {:?}",
        worker.applied_pos(),
        worker.held(),
        worker.error()
    );
    assert!(
        worker.held().is_none(),
        "the hold is cleared: {:?}",
        worker.held()
    );
    assert!(
        worker2.wait_applied(end2, Duration::from_secs(60)),
        "the second tablet: {:?}",
        worker2.fault()
    );
    let last = HybridTime(1_000 + n - 1);
    assert!(
        consistency.wait_for(last, Instant::now() + Duration::from_secs(30)),
        "safe time stuck at {:?}",
        consistency.safe_time()
    );
    assert!(consistency.safe_time() >= before);
    worker.stop().unwrap();
    worker2.stop().unwrap();
    consistency.stop();
    assert_exactly_once(&store, &tablet, n, len);
    assert_eq!(store.tablet(&t2).unwrap().unwrap().applied_records, 10);
    let (xs, _) = store.scan(b"x", None, 100).unwrap();
    let want: Vec<_> = (0..10)
        .map(|i| (format!("x{i}").into_bytes(), format!("w{i}").into_bytes()))
        .collect();
    let got: Vec<_> = xs.into_iter().map(|(k, v, _)| (k, v)).collect();
    assert_eq!(got, want);
}

/// A small block cache: the tests' stores hold little.
fn small_cache() -> tidelog_applier::store::StoreOptions {
    tidelog_applier::store::StoreOptions {
        cache_size: 8 << 20,
        ..Default::default()
    }
}
