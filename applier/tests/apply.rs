//! The apply stage end to end: a received log written with `tidelog_wal::Writer`, an
//! `ApplyWorker` applying it into a `Store`, and the store compared with a model replay of
//! the records — latest values, every historical version, tombstones, transaction state and
//! the exactly-once record count — including across restarts, a SIGKILLed child process
//! applying the log, and a corrupt received log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tidelog_applier::apply::{ApplyConfig, ApplyThreads, ApplyWorker};
use tidelog_applier::error::Error;
use tidelog_applier::store::{Durability, IntentRef, Store};
use tidelog_wal::*;

const DEADLINE: Duration = Duration::from_secs(60);

fn tablet() -> TabletId {
    "t1".parse().unwrap()
}

fn seed() -> u64 {
    std::env::var("TIDELOG_APPLY_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed)
}

fn key(i: u64) -> Vec<u8> {
    // Keys with 0x00 inside and keys that are prefixes of others.
    match i % 4 {
        0 => format!("k{i:02}").into_bytes(),
        1 => format!("k{i:02}\0x").into_bytes(),
        2 => format!("k{i:02}x").into_bytes(),
        _ => vec![b'k', 0, i as u8],
    }
}

/// `n` records with strictly increasing ht; every value encodes (record index, op index) so
/// a lost or repeated apply shows as a wrong version list.
fn records(seed: u64, n: usize) -> Vec<Record> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let ht = HybridTime(1_000_000 + i as u64 * 3);
            let txn = TxnId::from_u128((i / 8) as u128 + 1);
            // Transactions are groups of 8 records; the last of a group decides it (once).
            let group = (i / 8) as u64;
            let decide = i % 8 == 7;
            let body = match rng.random_range(0..100) {
                _ if decide && group % 3 == 2 => Body::Abort { txn, trx_id: None },
                _ if decide => Body::Commit {
                    txn,
                    participants: vec![tablet()],
                    trx_id: None,
                    gtid: Some(Gtid::new(0, 1, i as u64)),
                },
                0..65 => Body::Write {
                    ops: (0..rng.random_range(1..=3))
                        .map(|j| {
                            let k = key(rng.random_range(0..24));
                            if rng.random_ratio(1, 6) {
                                Op::delete(k)
                            } else {
                                Op::put(k, format!("{i}:{j}").into_bytes())
                            }
                        })
                        .collect(),
                    trx_id: Some(TrxId::new(1, i as u64 + 1)),
                    gtid: None,
                },
                65..85 => Body::Intent {
                    txn,
                    trx_id: Some(TrxId::new(2, group + 1)),
                    ops: vec![Op::put(key(99), format!("intent{i}").into_bytes())],
                },
                _ => Body::Heartbeat,
            };
            Record::new(ht, body)
        })
        .collect()
}

/// Writes `recs` as the received log of `tablet()` under `root` in commits of 1–50
/// records, calling `after_commit` after each; returns each record's position and the end.
fn write_log(
    root: &Path,
    recs: &[Record],
    seed: u64,
    mut after_commit: impl FnMut(),
) -> (Vec<WalPos>, WalPos) {
    let mut w = Writer::open(
        root,
        &tablet(),
        WalOptions {
            segment_size: 256 << 10,
            ..Default::default()
        },
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut pos = Vec::new();
    let mut i = 0;
    while i < recs.len() {
        let n = rng.random_range(1..=50).min(recs.len() - i);
        for r in &recs[i..i + n] {
            pos.push(w.append(r).unwrap());
        }
        i += n;
        w.commit(SyncPolicy::Always).unwrap();
        after_commit();
    }
    let end = w.durable_pos();
    w.close().unwrap();
    (pos, end)
}

/// Model: per key, versions ascending by ht (value None = deleted); per txn, intent refs,
/// commit ht, aborted.
type Versions = Vec<(HybridTime, Option<Vec<u8>>)>;

#[derive(Default)]
struct Model {
    versions: BTreeMap<Vec<u8>, Versions>,
    txns: BTreeMap<TxnId, (Vec<IntentRef>, Option<HybridTime>, bool)>,
}

fn model(recs: &[Record], pos: &[WalPos]) -> Model {
    let mut m = Model::default();
    for (r, p) in recs.iter().zip(pos) {
        match &r.body {
            Body::Write { ops, .. } => {
                let mut last = BTreeMap::new();
                for op in ops {
                    last.insert(op.key.clone(), op.value.clone());
                }
                for (k, v) in last {
                    m.versions.entry(k).or_default().push((r.ht, v));
                }
            }
            Body::Intent { txn, .. } => m
                .txns
                .entry(*txn)
                .or_default()
                .0
                .push(IntentRef { pos: *p, ht: r.ht }),
            Body::Commit { txn, .. } => m.txns.entry(*txn).or_default().1 = Some(r.ht),
            Body::Abort { txn, .. } => m.txns.entry(*txn).or_default().2 = true,
            Body::Heartbeat => {}
        }
    }
    m
}

/// Every version of `key` in the store, newest first, found by stepping `get` back in time.
fn all_versions(s: &Store, key: &[u8]) -> Versions {
    let mut out = Vec::new();
    let mut at = None;
    while let Some(v) = s.get(key, at).unwrap() {
        out.push((v.ht, v.value));
        if v.ht == HybridTime(0) {
            break;
        }
        at = Some(HybridTime(v.ht.0 - 1));
    }
    out
}

fn check(s: &Store, recs: &[Record], pos: &[WalPos], end: WalPos) {
    let m = model(recs, pos);
    for (k, vs) in &m.versions {
        let mut want = vs.clone();
        want.reverse();
        assert_eq!(
            all_versions(s, k),
            want,
            "versions of key {}",
            k.escape_ascii()
        );
    }
    // Reads at historical times, and scans, at a few hts.
    for at in [
        None,
        Some(recs[recs.len() / 3].ht),
        Some(recs[recs.len() / 2].ht.next()),
    ] {
        let mut want = Vec::new();
        for (k, vs) in &m.versions {
            let visible = vs.iter().rev().find(|(h, _)| at.is_none_or(|a| *h <= a));
            if let Some((h, Some(v))) = visible {
                want.push((k.clone(), v.clone(), *h));
            }
        }
        let (got, more) = s.scan(b"", at, usize::MAX).unwrap();
        assert_eq!(got, want, "scan at {at:?}");
        assert!(!more);
        let (got, more) = s.scan(b"k", at, 3).unwrap();
        assert_eq!(got[..], want[..3.min(want.len())]);
        assert_eq!(more, want.len() > 3);
    }
    // Intents are not copied into mvcc.
    assert_eq!(s.get(&key(99), None).unwrap(), None);
    for (txn, (intents, commit, aborted)) in &m.txns {
        let st = s.txn_state(txn).unwrap().expect("txn in store");
        let got = st.intents.get(&tablet()).cloned().unwrap_or_default();
        assert_eq!(&got, intents, "intents of {txn}");
        assert_eq!(st.commit.map(|c| c.commit_ht), *commit, "commit of {txn}");
        assert_eq!(st.aborted, *aborted, "abort of {txn}");
    }
    let meta = s.tablet(&tablet()).unwrap().unwrap();
    assert_eq!(meta.applied_pos, end);
    assert_eq!(
        meta.applied_records,
        recs.len() as u64,
        "records applied exactly once"
    );
    assert_eq!(meta.safe_time, recs.last().unwrap().ht);
}

fn small_batches() -> ApplyConfig {
    ApplyConfig {
        batch_records: 7,
        batch_bytes: 2048,
        ..Default::default()
    }
}

#[test]
fn worker_applies_a_live_log_and_matches_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    std::fs::create_dir_all(&received).unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    // Started before the log exists: it must wait for it.
    let mut w = ApplyWorker::start(store.clone(), &received, tablet(), small_batches()).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    assert!(w.is_running());
    assert_eq!(w.applied_pos(), WalPos::ZERO);
    let recs = records(seed(), 3000);
    let (pos, end) = write_log(&received, &recs, seed(), || w.notify());
    assert!(w.wait_applied(end, DEADLINE), "error: {:?}", w.error());
    assert_eq!(w.safe_time(), recs.last().unwrap().ht);
    w.stop().unwrap();
    check(&store, &recs, &pos, end);
}

/// The watchdog's liveness signal: an idle worker (here waiting for a log that does not
/// exist yet) still beats once per poll; a worker that applied counts its work and times
/// its batches.
#[test]
fn idle_worker_keeps_beating_and_counts_its_batches() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    std::fs::create_dir_all(&received).unwrap();
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let cfg = ApplyConfig {
        poll_interval: Duration::from_millis(10),
        ..small_batches()
    };
    let mut w = ApplyWorker::start(store.clone(), &received, tablet(), cfg).unwrap();
    let mut last = w.last_progress();
    for _ in 0..3 {
        let deadline = Instant::now() + Duration::from_secs(10);
        while w.last_progress() == last {
            assert!(Instant::now() < deadline, "an idle worker stopped beating");
            std::thread::sleep(Duration::from_millis(5));
        }
        last = w.last_progress();
    }
    assert_eq!(w.batch_latency().count, 0);
    let recs = records(seed() + 9, 100);
    let (_, end) = write_log(&received, &recs, 9, || w.notify());
    assert!(w.wait_applied(end, DEADLINE), "error: {:?}", w.error());
    assert_eq!(w.applied_records(), 100);
    assert_eq!(w.applied_bytes(), end.0);
    let h = w.batch_latency();
    assert!(h.count >= 100 / 7, "{h:?}");
    assert_eq!(h.cumulative.last().copied(), Some(h.count));
    w.stop().unwrap();
}

#[test]
fn worker_without_notify_catches_up_by_polling() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let recs = records(seed() + 1, 500);
    let (pos, end) = write_log(&received, &recs, 1, || {});
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let cfg = ApplyConfig {
        poll_interval: Duration::from_millis(5),
        durability: Durability::Sync,
        ..Default::default()
    };
    let mut w = ApplyWorker::start(store.clone(), &received, tablet(), cfg).unwrap();
    assert!(w.wait_applied(end, DEADLINE), "error: {:?}", w.error());
    w.stop().unwrap();
    check(&store, &recs, &pos, end);
}

#[test]
fn notify_wakes_the_worker_without_waiting_for_the_poll() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let store = Arc::new(Store::open(dir.path()).unwrap());
    // A poll interval far beyond the deadline: only `notify` can make progress in time.
    let cfg = ApplyConfig {
        poll_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let mut w = ApplyWorker::start(store.clone(), &received, tablet(), cfg).unwrap();
    let recs = records(seed() + 6, 200);
    let (pos, end) = write_log(&received, &recs, 6, || {});
    assert!(
        !w.wait_applied(end, Duration::from_millis(200)),
        "applied without notify"
    );
    w.notify();
    assert!(w.wait_applied(end, DEADLINE), "error: {:?}", w.error());
    let t0 = Instant::now();
    w.stop().unwrap();
    assert!(
        t0.elapsed() < Duration::from_secs(10),
        "stop waited for the poll"
    );
    check(&store, &recs, &pos, end);
}

#[test]
fn restarts_resume_from_the_apply_position_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let recs = records(seed() + 2, 2000);
    let (pos, end) = write_log(&received, &recs, 2, || {});
    let mut rng = StdRng::seed_from_u64(seed());
    let mut target = 0;
    while target < pos.len() {
        target = (target + rng.random_range(1..400)).min(pos.len());
        let want = pos.get(target).copied().unwrap_or(end);
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let before = store.tablet(&tablet()).unwrap().unwrap_or_default();
        let mut w =
            ApplyWorker::start(store.clone(), &received, tablet(), small_batches()).unwrap();
        assert!(
            w.applied_pos() >= before.applied_pos,
            "starts at the stored position"
        );
        assert!(w.wait_applied(want, DEADLINE), "error: {:?}", w.error());
        w.stop().unwrap();
        drop(w);
        // Replaying everything below the apply position is a no-op.
        let at = store.tablet(&tablet()).unwrap().unwrap();
        let n = pos.iter().filter(|p| **p < at.applied_pos).count();
        let replay: Vec<_> = pos[..n]
            .iter()
            .copied()
            .zip(recs[..n].iter().cloned())
            .collect();
        let o = store
            .apply(&tablet(), &replay, at.applied_pos, Durability::Buffered)
            .unwrap();
        assert_eq!((o.records, o.skipped), (0, n as u64));
        assert_eq!(at.applied_records, n as u64);
        drop(store);
    }
    let store = Store::open(dir.path()).unwrap();
    check(&store, &recs, &pos, end);
}

#[test]
fn store_apply_reapplied_after_reopen_is_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let recs = records(seed() + 3, 400);
    let (pos, end) = write_log(&received, &recs, 3, || {});
    let all: Vec<_> = pos.iter().copied().zip(recs.iter().cloned()).collect();
    {
        let s = Store::open(dir.path()).unwrap();
        s.apply(&tablet(), &all[..150], all[150].0, Durability::Buffered)
            .unwrap();
    }
    {
        // Re-open and hand it an overlapping run: the first 150 are skipped.
        let s = Store::open(dir.path()).unwrap();
        let o = s
            .apply(&tablet(), &all[100..300], all[300].0, Durability::Sync)
            .unwrap();
        assert_eq!((o.skipped, o.records), (50, 150));
        // A run that starts past the apply position is a gap and changes nothing.
        let e = s
            .apply(&tablet(), &all[301..], end, Durability::Sync)
            .unwrap_err();
        assert!(matches!(e, Error::Gap { .. }), "{e}");
        let o = s.apply(&tablet(), &all, end, Durability::Sync).unwrap();
        assert_eq!((o.skipped, o.records), (300, 100));
    }
    let s = Store::open(dir.path()).unwrap();
    check(&s, &recs, &pos, end);
}

/// Waits (up to `DEADLINE`) for `w` to stop by itself; `what` names the failure.
fn wait_stopped(w: &ApplyWorker, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while w.is_running() {
        assert!(Instant::now() < deadline, "{what}");
        w.wait_applied(WalPos(u64::MAX), Duration::from_millis(100));
    }
}

/// Damages the body of a write record in the middle of the first segment of the log
/// written by [`write_log`]; returns its index.
fn damage_a_write(received: &Path, recs: &[Record], pos: &[WalPos]) -> usize {
    let m = (recs.len() / 2..recs.len())
        .find(|&i| matches!(recs[i].body, Body::Write { .. }))
        .unwrap();
    let seg = received.join("t1").join("0000000000000000.seg");
    assert!(
        pos[m].0 + 64 < (256 << 10) - 128,
        "record {m} in the first segment"
    );
    let mut bytes = std::fs::read(&seg).unwrap();
    let off = 128 + pos[m].0 as usize + 33;
    bytes[off] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    m
}

#[test]
fn corrupt_received_log_stops_the_worker_without_skipping() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let recs = records(seed() + 4, 300);
    let (pos, _end) = write_log(&received, &recs, 4, || {});
    let m = damage_a_write(&received, &recs, &pos);

    for attempt in 0..2 {
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let mut w =
            ApplyWorker::start(store.clone(), &received, tablet(), small_batches()).unwrap();
        wait_stopped(&w, "worker did not stop on corruption");
        let e = w.stop().unwrap_err();
        let msg = e.to_string();
        assert!(
            matches!(
                &*e,
                Error::Wal {
                    source: tidelog_wal::Error::Corruption { .. },
                    ..
                }
            ),
            "{msg}"
        );
        assert!(
            msg.contains("t1") && msg.contains("0000000000000000.seg"),
            "{msg}"
        );
        assert!(
            msg.contains(&format!("offset {}", 128 + pos[m].0)),
            "record {m} at {}: {msg}",
            pos[m]
        );
        let meta = store.tablet(&tablet()).unwrap().unwrap();
        assert!(
            meta.applied_pos <= pos[m],
            "attempt {attempt}: applied past the damage"
        );
        // Nothing at or after the damaged record was applied.
        let (rows, _) = store.scan(b"", None, usize::MAX).unwrap();
        assert!(rows.iter().all(|(_, _, ht)| *ht < recs[m].ht));
    }
}

/// Tablets on one shared apply thread (each of its own store here, so the model check
/// applies to each): every one applies its log exactly once, one stopped leaves the thread
/// serving the others, and a corrupt log stops only its own tablet.
#[test]
fn tablets_sharing_one_apply_thread_stay_independent() {
    let group = Arc::new(ApplyThreads::new(1, "apply-shared").unwrap());
    let shared = || ApplyConfig {
        threads: Some(group.clone()),
        ..small_batches()
    };
    let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
    let received: Vec<PathBuf> = dirs.iter().map(|d| d.path().join("received")).collect();
    let stores: Vec<_> = dirs
        .iter()
        .map(|d| Arc::new(Store::open(d.path()).unwrap()))
        .collect();
    // The fourth tablet's log is damaged before its worker starts.
    let bad_recs = records(seed() + 20, 300);
    let (bad_pos, _) = write_log(&received[3], &bad_recs, 20, || {});
    let m = damage_a_write(&received[3], &bad_recs, &bad_pos);
    let mut workers: Vec<ApplyWorker> = (0..4)
        .map(|i| {
            std::fs::create_dir_all(&received[i]).unwrap();
            ApplyWorker::start(stores[i].clone(), &received[i], tablet(), shared()).unwrap()
        })
        .collect();
    // Whole groups of 8 (see `records`): every transaction decided, so `check` finds each
    // in the store (undecided ones live in the store's cache only).
    let logs: Vec<_> = (0..3)
        .map(|i| records(seed() + 21 + i as u64, 800 + 304 * i))
        .collect();
    let (pos0, end0) = write_log(&received[0], &logs[0], 21, || workers[0].notify());
    assert!(
        workers[0].wait_applied(end0, DEADLINE),
        "{:?}",
        workers[0].error()
    );
    workers[0].stop().unwrap();
    check(&stores[0], &logs[0], &pos0, end0);
    // The thread goes on with the others once one has left it.
    let mut written = Vec::new();
    for i in 1..3 {
        let (pos, end) = write_log(&received[i], &logs[i], 21 + i as u64, || {
            workers[i].notify()
        });
        assert!(
            workers[i].wait_applied(end, DEADLINE),
            "tablet {i}: {:?}",
            workers[i].error()
        );
        written.push((pos, end));
    }
    wait_stopped(&workers[3], "corrupt log not noticed");
    assert!(workers[1].is_running() && workers[2].is_running());
    let e = workers[3].stop().unwrap_err();
    assert!(matches!(&*e, Error::Wal { .. }), "{e}");
    assert!(stores[3].tablet(&tablet()).unwrap().unwrap().applied_pos <= bad_pos[m]);
    for (i, (pos, end)) in (1..3).zip(written) {
        check(&stores[i], &logs[i], &pos, end);
        workers[i].stop().unwrap();
    }
}

// ---- a real crash: the worker runs in a child process that is SIGKILLed ------------------

const CHILD_ENV: &str = "TIDELOG_APPLY_CHILD_DIR";
const CHILD_RECORDS: usize = 20_000;
/// Marker file the child creates once it applies.
const STARTED: &str = "child-started";
/// File where the child keeps its worker's apply position (rewritten every millisecond).
const PROGRESS: &str = "child-progress";

/// The child: applies the received log under `$CHILD_ENV/received` into `$CHILD_ENV`'s
/// store with `Buffered` batches and no periodic persist, until killed. A no-op when run
/// as an ordinary test.
#[test]
fn child_applier() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let store = Arc::new(Store::open(&dir).unwrap());
    let cfg = ApplyConfig {
        batch_records: 13,
        persist_interval: Duration::from_secs(3600),
        ..Default::default()
    };
    let w = ApplyWorker::start(store, &dir.join("received"), tablet(), cfg).unwrap();
    // Tell the parent the store is open (recovery done) and the worker runs; then keep
    // telling it how far the worker got, so that it can kill at a chosen point.
    std::fs::write(dir.join(STARTED), b"").unwrap();
    let deadline = Instant::now() + DEADLINE;
    let progress = dir.join(PROGRESS);
    while w.is_running() && Instant::now() < deadline {
        let tmp = dir.join("progress.tmp");
        std::fs::write(&tmp, w.applied_pos().0.to_string()).unwrap();
        std::fs::rename(&tmp, &progress).unwrap();
        std::thread::sleep(Duration::from_millis(1));
    }
    panic!("child applier not killed: {:?}", w.error());
}

struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn sigkilled_applier_resumes_exactly_once() {
    if std::env::var(CHILD_ENV).is_ok() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let recs = records(seed() + 5, CHILD_RECORDS);
    let (pos, end) = write_log(&received, &recs, 5, || {});
    let mut rng = StdRng::seed_from_u64(seed());
    let mut last = WalPos::ZERO;
    let mut mid_way = 0;
    for round in 0..4 {
        let _ = std::fs::remove_file(dir.path().join(PROGRESS));
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_applier",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(Some(child));
        let marker = dir.path().join(STARTED);
        let deadline = Instant::now() + DEADLINE;
        while !marker.exists() {
            assert!(Instant::now() < deadline, "child did not start");
            if let Some(st) = child.0.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("child exited early: {st}");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        std::fs::remove_file(&marker).unwrap();
        // Kill once the child reported a position past a random point of what is left.
        let target = last.0 + rng.random_range(0..end.since(last).max(1));
        loop {
            let seen = std::fs::read_to_string(dir.path().join(PROGRESS))
                .ok()
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0);
            if seen >= target {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "child made no progress to {target}"
            );
            if let Some(st) = child.0.as_mut().and_then(|c| c.try_wait().unwrap()) {
                panic!("child exited early: {st}");
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        if let Some(c) = child.0.as_mut() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
        drop(child);
        let s = Store::open(dir.path()).unwrap();
        let meta = s.tablet(&tablet()).unwrap().unwrap_or_default();
        assert!(
            meta.applied_pos >= last,
            "round {round}: apply position went back"
        );
        let n = pos.iter().filter(|p| **p < meta.applied_pos).count();
        assert_eq!(
            meta.applied_records, n as u64,
            "round {round}: records below the apply position"
        );
        if meta.applied_pos > WalPos::ZERO && meta.applied_pos < end {
            mid_way += 1;
        }
        eprintln!(
            "round {round}: killed at applied_pos {} of {end}",
            meta.applied_pos
        );
        last = meta.applied_pos;
    }
    assert!(mid_way > 0, "no kill landed mid-way; raise CHILD_RECORDS");
    let store = Arc::new(Store::open(dir.path()).unwrap());
    let mut w =
        ApplyWorker::start(store.clone(), &received, tablet(), ApplyConfig::default()).unwrap();
    assert!(w.wait_applied(end, DEADLINE), "error: {:?}", w.error());
    w.stop().unwrap();
    check(&store, &recs, &pos, end);
}
