//! The session's tests: connect ids unique across threads, processes and restarts, the
//! state file, trx ids and gtids, distributed transactions, and the gtid recovery.
#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};

use tidelog_wal::{HybridTime, Record, SyncPolicy, WalOptions, Writer};

use super::*;

const CHILD_DIR_ENV: &str = "TIDELOG_SESSION_TEST_CHILD_DIR";
const CHILD_COUNT_ENV: &str = "TIDELOG_SESSION_TEST_CHILD_COUNT";
const CHILD_PREFIX: &str = "tidelog-connect-id ";

fn counter(id: u64) -> u64 {
    id & (COUNTER_LIMIT - 1)
}

fn insert_all(seen: &mut HashSet<u64>, ids: &[u64]) {
    for &id in ids {
        assert!(seen.insert(id), "connect id {id} handed out twice");
    }
}

#[test]
fn counter_moves_only_on_commit() {
    let mut s = Session::new(7);
    assert_eq!(s.connect_id(), 7);
    assert_eq!(s.trx_id(), TrxId::new(7, 1));
    assert_eq!(
        s.trx_id(),
        TrxId::new(7, 1),
        "reading the id must not move it"
    );
    assert_eq!(s.commit(), TrxId::new(7, 1));
    assert_eq!(s.trx_id(), TrxId::new(7, 2));
    assert_eq!(s.abort(), TrxId::new(7, 2));
    assert_eq!(s.trx_id(), TrxId::new(7, 2));
    assert_eq!(s.commit(), TrxId::new(7, 2));
    assert_eq!(s.commit(), TrxId::new(7, 3));
    assert_eq!(s.trx_id().to_string(), "7:4");
}

/// A distributed transaction's commit names the tablets its intents went to, each
/// once, and moves the session on; one that wrote no intent is refused (nothing to
/// commit) and leaves the session where it was, so it can abort instead.
#[test]
fn a_distributed_commit_names_its_intents_tablets_and_needs_one() {
    let t = |s: &str| -> TabletId { s.parse().unwrap() };
    let mut s = Session::new(9);
    let mut dt = s.begin(TxnId::from_u128(5));
    let b = dt.intent(&t("a"), vec![Op::put(b"k".to_vec(), b"v".to_vec())]);
    assert!(matches!(b, Body::Intent { trx_id: Some(id), .. } if id == TrxId::new(9, 1)));
    dt.intent(&t("b"), vec![]);
    dt.intent(&t("a"), vec![]);
    assert_eq!(dt.participants(), [t("a"), t("b")]);
    let g = Gtid::new(0, 1, 7);
    match dt.commit(&mut s, Some(g)).unwrap() {
        Body::Commit {
            participants,
            trx_id,
            gtid,
            ..
        } => {
            assert_eq!(participants, [t("a"), t("b")]);
            assert_eq!((trx_id, gtid), (Some(TrxId::new(9, 1)), Some(g)));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.trx_id(), TrxId::new(9, 2));

    let empty = s.begin(TxnId::from_u128(6));
    let e = empty.clone().commit(&mut s, None).unwrap_err().to_string();
    assert!(e.contains("wrote no intent") && e.contains("9:2"), "{e}");
    assert_eq!(
        s.trx_id(),
        TrxId::new(9, 2),
        "a refused commit moves nothing"
    );
    assert!(matches!(empty.abort(&mut s).unwrap(), Body::Abort { .. }));

    // A transaction whose session moved on cannot commit under the old id.
    let mut stale = s.begin(TxnId::from_u128(7));
    stale.intent(&t("a"), vec![]);
    s.commit();
    assert!(stale.commit(&mut s, None).is_err());
}

#[test]
fn abort_then_retry_reuses_the_id() {
    let mut s = Session::new(42);
    s.commit();
    let first_try = s.abort();
    let second_try = s.abort();
    let retry = s.commit();
    assert_eq!(first_try, TrxId::new(42, 2));
    assert_eq!(second_try, first_try);
    assert_eq!(retry, first_try);
    assert_eq!(s.trx_id(), TrxId::new(42, 3));
}

#[test]
fn session_open_takes_a_fresh_connect_id() {
    let dir = tempfile::tempdir().unwrap();
    let gen = ConnectIdGen::open(dir.path(), 3).unwrap();
    let a = Session::open(&gen).unwrap();
    let b = Session::open(&gen).unwrap();
    assert_ne!(a.connect_id(), b.connect_id());
    assert_eq!(a.connect_id() >> 56, 3);
    assert_eq!(a.trx_id().commit_counter, 1);
}

#[test]
fn connect_id_layout_and_clock_seed() {
    let before = clock_seed();
    let dir = tempfile::tempdir().unwrap();
    let gen = ConnectIdGen::open(dir.path(), 255).unwrap();
    let after = clock_seed();
    let id = gen.next().unwrap();
    assert_eq!(id >> 56, 255);
    assert!(
        counter(id) >= before && counter(id) <= after,
        "{id:#x} not seeded from the clock"
    );
    assert_eq!(gen.state_path(), dir.path().join("connect-id.255"));
    let persisted = read_state(gen.state_path()).unwrap().unwrap();
    assert_eq!(
        persisted,
        counter(id) + DEFAULT_BLOCK,
        "block must be durable before use"
    );
}

#[test]
fn persisted_high_water_mark_beats_the_clock() {
    let dir = tempfile::tempdir().unwrap();
    let ahead = clock_seed() + (1000 << 24) + 12345;
    std::fs::write(dir.path().join("connect-id.9"), encode_state(ahead)).unwrap();
    let gen = ConnectIdGen::open(dir.path(), 9).unwrap();
    assert_eq!(gen.next().unwrap(), 9 << 56 | ahead);
    assert_eq!(gen.next().unwrap(), 9 << 56 | (ahead + 1));
}

#[test]
fn exhausted_counter_is_an_error_not_a_wrap() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("connect-id.1"),
        encode_state(COUNTER_LIMIT - 2),
    )
    .unwrap();
    let gen = ConnectIdGen::open_with_block(dir.path(), 1, 2).unwrap();
    assert_eq!(counter(gen.next().unwrap()), COUNTER_LIMIT - 2);
    assert_eq!(counter(gen.next().unwrap()), COUNTER_LIMIT - 1);
    let e = gen.next().unwrap_err();
    assert!(e.to_string().contains("exhausted"), "{e}");
}

#[test]
fn server_id_above_255_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let e = ConnectIdGen::open(dir.path(), 256).unwrap_err();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("256"), "{e}");
    assert!(ConnectIdGen::open(dir.path(), u32::MAX).is_err());
    assert!(!dir.path().join("connect-id.256").exists());
    assert!(ConnectIdGen::open(dir.path(), 255).is_ok());
}

#[test]
fn unique_across_threads_from_one_gen() {
    let dir = tempfile::tempdir().unwrap();
    let gen = Arc::new(ConnectIdGen::open(dir.path(), 1).unwrap());
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let gen = Arc::clone(&gen);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                (0..10_000).map(|_| gen.next().unwrap()).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for h in handles {
        let ids = h.join().unwrap();
        assert_eq!(ids.len(), 10_000);
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "one thread's ids must increase"
        );
        insert_all(&mut seen, &ids);
    }
    assert_eq!(seen.len(), 40_000);
    assert!(seen.iter().all(|id| id >> 56 == 1));
}

#[test]
fn unique_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut seen = HashSet::new();
    let mut last = 0;
    for round in 0..200 {
        // Alternate the block size so some rounds use up a block and reserve another.
        let block = if round % 2 == 0 { 8 } else { DEFAULT_BLOCK };
        let gen = ConnectIdGen::open_with_block(dir.path(), 5, block).unwrap();
        let ids: Vec<u64> = (0..20).map(|_| gen.next().unwrap()).collect();
        assert!(
            ids[0] > last,
            "round {round}: {} not above previous run's {last}",
            ids[0]
        );
        last = *ids.last().unwrap();
        insert_all(&mut seen, &ids);
        drop(gen);
    }
    assert_eq!(seen.len(), 200 * 20);
}

#[test]
fn flock_on_separate_opens_contends() {
    // The premise of the cross-process tests: flock belongs to the open file
    // description, so a second open of the same file, even in this process, is locked out.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("connect-id.1.lock");
    let held = FileLock::exclusive(&path).unwrap();
    let other = File::open(&path).unwrap();
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    let e = std::io::Error::last_os_error();
    assert_eq!(rc, -1, "second open got the lock while the first held it");
    assert_eq!(e.raw_os_error(), Some(libc::EWOULDBLOCK));
    drop(held);
    // SAFETY: as above.
    let rc = unsafe { libc::flock(other.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    assert_eq!(rc, 0, "lock not released on drop");
}

#[test]
fn unique_across_gens_sharing_a_dir_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    // Small blocks so the two generators reserve hundreds of times, interleaved.
    let barrier = Arc::new(Barrier::new(3));
    let handles: Vec<_> = (0..3)
        .map(|_| {
            let path = path.clone();
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                let gen = ConnectIdGen::open_with_block(&path, 2, 4).unwrap();
                (0..2_000).map(|_| gen.next().unwrap()).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for h in handles {
        insert_all(&mut seen, &h.join().unwrap());
    }
    assert_eq!(seen.len(), 6_000);
    let hwm = read_state(&path.join("connect-id.2")).unwrap().unwrap();
    assert!(
        seen.iter().all(|&id| counter(id) < hwm),
        "an id above the persisted mark"
    );
}

/// Acts as a child process when `CHILD_DIR_ENV` is set (see
/// `unique_across_processes`); otherwise does nothing.
#[test]
fn connect_id_child_process() {
    let Some(dir) = std::env::var_os(CHILD_DIR_ENV) else {
        return;
    };
    let count: usize = std::env::var(CHILD_COUNT_ENV).unwrap().parse().unwrap();
    // Start gate: the parent closes our stdin once every child is running.
    let mut gate = Vec::new();
    std::io::stdin().read_to_end(&mut gate).unwrap();
    let gen = ConnectIdGen::open_with_block(Path::new(&dir), 4, 4).unwrap();
    let mut out = std::io::stdout().lock();
    // libtest has printed "test ... " without a newline; start our lines after it.
    writeln!(out).unwrap();
    for _ in 0..count {
        writeln!(out, "{CHILD_PREFIX}{}", gen.next().unwrap()).unwrap();
    }
    out.flush().unwrap();
}

#[test]
fn unique_across_processes() {
    const CHILDREN: usize = 3;
    const COUNT: usize = 1_500;
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut children: Vec<_> = (0..CHILDREN)
        .map(|_| {
            Command::new(&exe)
                .args([
                    "session::tests::connect_id_child_process",
                    "--exact",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_DIR_ENV, dir.path())
                .env(CHILD_COUNT_ENV, COUNT.to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Open the gate for all children at once; the parent competes too.
    for child in &mut children {
        drop(child.stdin.take());
    }
    let gen = ConnectIdGen::open_with_block(dir.path(), 4, 4).unwrap();
    let mine: Vec<u64> = (0..COUNT).map(|_| gen.next().unwrap()).collect();
    let mut seen = HashSet::new();
    insert_all(&mut seen, &mine);
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "child failed: {}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let ids: Vec<u64> = stdout
            .lines()
            .filter_map(|l| l.find(CHILD_PREFIX).map(|i| &l[i + CHILD_PREFIX.len()..]))
            .map(|n| n.trim().parse().unwrap())
            .collect();
        assert_eq!(
            ids.len(),
            COUNT,
            "child printed {} ids:\n{stdout}",
            ids.len()
        );
        insert_all(&mut seen, &ids);
    }
    assert_eq!(seen.len(), (CHILDREN + 1) * COUNT);
    assert!(seen.iter().all(|id| id >> 56 == 4));
}

fn assert_corrupt_refused(bytes: &[u8], what: &str) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("connect-id.6");
    std::fs::write(&path, bytes).unwrap();
    let e = ConnectIdGen::open(dir.path(), 6).unwrap_err();
    assert!(e.is_corruption(), "{what}: {e:?}");
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()), "{what}: {msg}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        bytes,
        "{what}: corrupt file was overwritten"
    );
}

#[test]
fn corrupt_state_file_is_an_error_naming_the_file() {
    let good = encode_state(clock_seed() + 77);
    assert_eq!(
        decode_state(&good, Path::new("x")).unwrap(),
        clock_seed() + 77
    );

    assert_corrupt_refused(&[], "empty");
    assert_corrupt_refused(&good[..10], "truncated");
    assert_corrupt_refused(&good[..CONNECT_ID_STATE_LEN - 1], "one byte short");
    let mut long = good.to_vec();
    long.push(0);
    assert_corrupt_refused(&long, "one byte long");

    let mut bad_magic = good;
    bad_magic[0..8].copy_from_slice(b"NOTMAGIC");
    assert_corrupt_refused(&bad_magic, "bad magic");

    for bit in [8 * 8, 8 * 8 + 3, 15 * 8 + 7, 16 * 8, 23 * 8 + 7] {
        let mut flipped = good;
        flipped[bit / 8] ^= 1 << (bit % 8);
        assert_corrupt_refused(&flipped, &format!("bit {bit} flipped"));
    }

    let mut too_big = encode_state(COUNTER_LIMIT + 1);
    assert_corrupt_refused(&too_big, "counter beyond 56 bits");
    too_big = encode_state(COUNTER_LIMIT);
    assert!(decode_state(&too_big, Path::new("x")).is_ok());
}

#[test]
fn gtid_seqs_start_at_one_in_a_fresh_domain() {
    let g = GtidGen::new(0, 1, 0);
    assert_eq!(g.last(), None);
    assert_eq!(g.next(), Gtid::new(0, 1, 1));
    assert_eq!(g.next().to_string(), "0-1-2");
    assert_eq!(g.last(), Some(Gtid::new(0, 1, 2)));
}

#[test]
fn gtid_seqs_consecutive_from_last_seq_across_threads() {
    let g = Arc::new(GtidGen::new(3, 7, 41));
    assert_eq!(g.last(), Some(Gtid::new(3, 7, 41)));
    let barrier = Arc::new(Barrier::new(4));
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let g = Arc::clone(&g);
            let barrier = Arc::clone(&barrier);
            std::thread::spawn(move || {
                barrier.wait();
                (0..10_000).map(|_| g.next()).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seqs = Vec::new();
    for h in handles {
        let gtids = h.join().unwrap();
        assert!(gtids.iter().all(|x| x.domain == 3 && x.server == 7));
        assert!(gtids.windows(2).all(|w| w[0].seq < w[1].seq));
        seqs.extend(gtids.iter().map(|x| x.seq));
    }
    seqs.sort_unstable();
    let expected: Vec<u64> = (42..42 + 40_000).collect();
    assert_eq!(seqs, expected, "seqs must be exactly 42..=40041, each once");
    assert_eq!(g.last(), Some(Gtid::new(3, 7, 40_041)));
}

#[test]
fn gtid_sequence_continues_after_restart() {
    let d = tempfile::tempdir().unwrap();
    let opts = WalOptions {
        segment_size: 4096,
        ..Default::default()
    };
    let gen = GtidGen::new(3, 1, recover_last_gtid_seq(d.path(), 3).unwrap());
    let tablets: Vec<TabletId> = ["a", "b"].iter().map(|t| t.parse().unwrap()).collect();
    let mut ws: Vec<Writer> = tablets
        .iter()
        .map(|t| Writer::open(d.path(), t, opts.clone()).unwrap())
        .collect();
    for i in 0..300u64 {
        let w = &mut ws[(i % 7 % 2) as usize];
        let gtid = Some(gen.next());
        w.append(&Record::new(
            HybridTime(10 + 2 * i),
            Body::Write {
                ops: vec![],
                trx_id: None,
                gtid,
            },
        ))
        .unwrap();
        // Heartbeats after the last gtid: recovery must look into older records.
        w.append(&Record::new(HybridTime(11 + 2 * i), Body::Heartbeat))
            .unwrap();
        w.commit(SyncPolicy::None).unwrap();
    }
    let last = gen.last().unwrap().seq;
    assert_eq!(last, 300);
    for _ in 0..40 {
        let w = &mut ws[0];
        let ht = w.last_ht().unwrap().next();
        w.append(&Record::new(ht, Body::Heartbeat)).unwrap();
        w.commit(SyncPolicy::None).unwrap();
    }
    drop(ws);
    assert_eq!(recover_last_gtid_seq(d.path(), 3).unwrap(), last);
    assert_eq!(recover_last_gtid_seq(d.path(), 4).unwrap(), 0);
    let gen2 = GtidGen::new(3, 1, recover_last_gtid_seq(d.path(), 3).unwrap());
    assert_eq!(gen2.next().seq, last + 1);
}
