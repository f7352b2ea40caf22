//! Two processes: this test binary re-executes itself as a child that writes a tablet's log
//! with `SyncPolicy::Batch`, while the parent tails it with a `Reader` (`ReadLimit::Durable`)
//! and must see every record exactly once, in order, with the right contents.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tidelog_wal::*;

/// Set in the child's environment: the WAL directory to write.
const CHILD_ENV: &str = "TIDELOG_WAL_TWO_PROCESS_CHILD_DIR";
const CHILD_TEST: &str = "child_writer";
const RECORDS: u64 = 20_000;
const SEG: u64 = 64 << 10;
const DEADLINE: Duration = Duration::from_secs(60);

fn tablet() -> TabletId {
    "tp".parse().unwrap()
}

/// Record `i`, regenerated identically by both processes.
fn record(i: u64) -> Record {
    let ht = HybridTime(1_000_000 + i * 7);
    let key = format!("key-{i}").into_bytes();
    let value = vec![(i % 251) as u8; ((i * 7919) % 400) as usize];
    let txn = TxnId::from_u128(u128::from(i) << 64 | 0xabc);
    let body = match i % 5 {
        0 => Body::Write {
            ops: vec![Op::put(key, value)],
            trx_id: Some(TrxId::new(3, i + 1)),
            gtid: Some(Gtid::new(0, 1, i)),
        },
        1 => Body::Intent {
            txn,
            trx_id: None,
            ops: vec![Op::put(key.clone(), value), Op::delete(key)],
        },
        2 => Body::Commit {
            txn,
            participants: vec![tablet(), "other".parse().unwrap()],
            trx_id: Some(TrxId::new(3, i + 1)),
            gtid: None,
        },
        3 => Body::Abort { txn, trx_id: None },
        _ => Body::Heartbeat,
    };
    Record::new(ht, body)
}

/// The child: appends `RECORDS` records in commits of 1–200 records with
/// `SyncPolicy::Batch`, then closes (which syncs the rest). A no-op when run as an
/// ordinary test.
#[test]
fn child_writer() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let mut w = Writer::open(
        Path::new(&dir),
        &tablet(),
        WalOptions {
            segment_size: SEG,
            ..Default::default()
        },
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut i = 0;
    while i < RECORDS {
        let n = rng.random_range(1..=200).min(RECORDS - i);
        for _ in 0..n {
            w.append(&record(i)).unwrap();
            i += 1;
        }
        w.commit(SyncPolicy::Batch).unwrap();
        if rng.random_ratio(1, 5) {
            // Let the tailer catch up now and then.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    w.close().unwrap();
}

/// Kills the child if the parent fails or times out.
struct KillOnDrop(Option<Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(c) = self.0.as_mut() {
            if c.try_wait().ok().flatten().is_none() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn open_reader(root: &Path, deadline: Instant, child: &mut KillOnDrop) -> Reader {
    // The child creates the directory, control file and first segment; until then
    // `Reader::open` fails. Retry until it works.
    loop {
        match Reader::open(root, &tablet(), ReadLimit::Durable) {
            Ok(r) => return r,
            Err(e) => {
                if let Some(status) = child.0.as_mut().unwrap().try_wait().unwrap() {
                    if !status.success() {
                        panic!("the child writer failed ({status}) before the log existed: {e}");
                    }
                }
                assert!(
                    Instant::now() < deadline,
                    "no readable log after {DEADLINE:?}: {e}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
        }
    }
}

#[test]
fn reader_tails_a_writer_in_another_process() {
    let root = tempfile::tempdir().unwrap();
    let exe: PathBuf = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args(["--exact", CHILD_TEST, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, root.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = KillOnDrop(Some(child));
    let started = Instant::now();
    let deadline = started + DEADLINE;

    let mut r = open_reader(root.path(), deadline, &mut child);
    let mut next = 0u64;
    let mut expect_pos = WalPos::ZERO;
    let mut empty_polls = 0u64;
    let mut max_seen_segments = 0;
    let mut child_done = false;
    let mut read_while_running = 0u64;
    while next < RECORDS {
        match r.next() {
            Ok(Some((p, rec))) => {
                assert!(next < RECORDS, "more records than written");
                assert!(p >= expect_pos, "record {next} at {p}, before {expect_pos}");
                if p != expect_pos {
                    // Only a new segment may start later than the previous record's end.
                    assert!(
                        r.segment_starts().contains(&p),
                        "gap before record {next} at {p}"
                    );
                }
                let want = record(next);
                assert!(
                    rec == want,
                    "record {next} at {p} differs: {rec:?} vs {want:?}"
                );
                expect_pos = p.add(rec_len(&rec));
                next += 1;
                if !child_done {
                    read_while_running += 1;
                }
                max_seen_segments = max_seen_segments.max(r.segment_starts().len());
            }
            Ok(None) => {
                empty_polls += 1;
                if child_done {
                    // The child had exited before this poll: everything must be readable.
                    panic!(
                        "the child exited after writing all records, but the reader stops at \
                         record {next} (position {}, readable end {:?})",
                        r.position(),
                        r.end()
                    );
                }
                if let Some(status) = child.0.as_mut().unwrap().try_wait().unwrap() {
                    assert!(status.success(), "the child writer failed: {status}");
                    child_done = true;
                    continue;
                }
                assert!(
                    Instant::now() < deadline,
                    "deadline: got {next} of {RECORDS} records in {DEADLINE:?}"
                );
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => panic!(
                "reader error at record {next} (position {}): {e}",
                r.position()
            ),
        }
    }
    // The child exits; afterwards nothing more appears and the reader is at the end.
    let status = loop {
        if let Some(s) = child.0.as_mut().unwrap().try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "the child writer did not exit");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(status.success(), "the child writer failed: {status}");
    assert!(
        r.next().unwrap().is_none(),
        "a record beyond the {RECORDS} written"
    );
    assert_eq!(r.end(), Some(expect_pos));
    assert!(max_seen_segments > 3 || segments(&root.path().join("tp")).len() > 3);
    eprintln!(
        "two_process: {RECORDS} records tailed in {:.1?} ({read_while_running} before the \
         child's exit was seen, {empty_polls} empty polls, {} segments)",
        started.elapsed(),
        segments(&root.path().join("tp")).len()
    );
    // And a fresh reader agrees.
    let all = read_ok(
        root.path(),
        &tablet(),
        ReadLimit::Durable,
        RECORDS as usize + 8,
    );
    assert_eq!(all.len() as u64, RECORDS);
    assert!(all
        .iter()
        .enumerate()
        .all(|(i, (_, rec))| *rec == record(i as u64)));
}
