//! The load generators write what a real transactional database would: read the WALs back
//! and check every promise of `tidelog_testkit::load` independently of its code.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tidelog_testkit::load::{self, LoadOptions, Summary, Workload};
use tidelog_wal::{Body, HybridTime, ReadLimit, Reader, SyncPolicy, TabletId, TrxId, TxnId};

struct Intent {
    tablet: usize,
    ht: HybridTime,
    trx_id: Option<TrxId>,
    ops: Vec<tidelog_wal::Op>,
}

/// A committed transaction in commit order: its ht, gtid seq and the writes it made.
struct Committed {
    ht: HybridTime,
    seq: u64,
    writes: Vec<tidelog_wal::Op>,
}

/// What the checker found.
struct Checked {
    /// Per tablet, all records in log order.
    records: Vec<Vec<(HybridTime, Body)>>,
    /// Committed transactions (writes and distributed commits) in commit_ht order.
    commits: Vec<Committed>,
    aborts: usize,
    distributed_commits: usize,
    /// Aborted transactions whose session ran a later transaction (with the same trx id).
    retried_aborts: usize,
}

fn opts(workload: Workload, dir: &Path) -> LoadOptions {
    let mut o = LoadOptions::new(workload, dir.join("wal"));
    o.session_dir = Some(dir.join("sessions"));
    o.segment_size = 1 << 20;
    o.duration = Some(Duration::from_secs(20));
    o.sync = SyncPolicy::None;
    o
}

fn run(o: LoadOptions) -> Summary {
    let stop = AtomicBool::new(false);
    load::run(o, &stop, |_| {}).unwrap()
}

/// Reads every tablet and checks the structural rules; panics on the first violation.
fn check(wal_dir: &Path, n: usize, first_seq: u64) -> Checked {
    let tablets: Vec<TabletId> = (0..n).map(|i| format!("t{i}").parse().unwrap()).collect();
    let index: HashMap<TabletId, usize> = tablets
        .iter()
        .enumerate()
        .map(|(i, t)| (t.clone(), i))
        .collect();
    let mut records = Vec::new();
    for t in &tablets {
        let mut recs = Vec::new();
        let mut last = None;
        for r in Reader::open(wal_dir, t, ReadLimit::Durable).unwrap() {
            let (_, rec) = r.unwrap();
            assert!(
                last.is_none_or(|l| rec.ht > l),
                "tablet {t}: ht not increasing"
            );
            last = Some(rec.ht);
            recs.push((rec.ht, rec.body));
        }
        records.push(recs);
    }

    let mut intents: HashMap<TxnId, Vec<Intent>> = HashMap::new();
    // (ht, tablet, body) of every write, commit and abort.
    let mut events: Vec<(HybridTime, usize, Body)> = Vec::new();
    for (t, recs) in records.iter().enumerate() {
        for (ht, body) in recs {
            match body {
                Body::Intent { txn, trx_id, ops } => {
                    intents.entry(*txn).or_default().push(Intent {
                        tablet: t,
                        ht: *ht,
                        trx_id: *trx_id,
                        ops: ops.clone(),
                    })
                }
                Body::Heartbeat => {}
                other => events.push((*ht, t, other.clone())),
            }
        }
    }
    events.sort_by_key(|e| e.0);
    for its in intents.values_mut() {
        its.sort_by_key(|i| i.ht);
    }

    let mut decided = HashSet::new();
    let mut commits = Vec::new();
    let mut aborts = 0;
    let mut distributed_commits = 0;
    // Per connect id: the next commit counter expected, and whether the last event was an
    // abort (whose retry must reuse the id).
    let mut sessions: HashMap<u64, (u64, bool)> = HashMap::new();
    let mut retried_aborts = 0;
    let mut session_event = |trx: TrxId, commit: bool| {
        let (expect, after_abort) = sessions.entry(trx.connect_id).or_insert((1, false));
        assert_eq!(
            trx.commit_counter, *expect,
            "session {}: trx id {trx} out of order (commit counter {expect} expected)",
            trx.connect_id
        );
        if *after_abort {
            retried_aborts += 1;
        }
        *after_abort = !commit;
        if commit {
            *expect += 1;
        }
    };
    for (ht, tablet, body) in events {
        match body {
            Body::Write { ops, trx_id, gtid } => {
                let (trx, gtid) = (trx_id.unwrap(), gtid.unwrap());
                session_event(trx, true);
                commits.push((ht, gtid, ops));
            }
            Body::Commit {
                txn,
                participants,
                trx_id,
                gtid,
            } => {
                assert!(decided.insert(txn), "txn {txn} decided twice");
                let trx = trx_id.unwrap();
                session_event(trx, true);
                let parts: Vec<usize> = participants.iter().map(|p| index[p]).collect();
                let unique: HashSet<usize> = parts.iter().copied().collect();
                assert_eq!(unique.len(), parts.len(), "txn {txn}: repeated participant");
                assert!(
                    unique.contains(&tablet),
                    "txn {txn}: commit on tablet {tablet}, not a participant"
                );
                assert_eq!(
                    parts[0], tablet,
                    "txn {txn}: status tablet is not the first"
                );
                let its = intents.get(&txn).expect("a committed txn without intents");
                let mut with_intents = HashSet::new();
                let mut writes = Vec::new();
                for i in its {
                    assert!(i.ht < ht, "txn {txn}: intent at {} ≥ commit_ht {ht}", i.ht);
                    assert!(
                        unique.contains(&i.tablet),
                        "txn {txn}: intent on non-participant t{}",
                        i.tablet
                    );
                    assert_eq!(i.trx_id, Some(trx), "txn {txn}: intent trx id differs");
                    with_intents.insert(i.tablet);
                    writes.extend(i.ops.iter().cloned());
                }
                assert_eq!(
                    with_intents, unique,
                    "txn {txn}: a participant has no intent"
                );
                distributed_commits += 1;
                commits.push((ht, gtid.unwrap(), writes));
            }
            Body::Abort { txn, trx_id } => {
                assert!(decided.insert(txn), "txn {txn} decided twice");
                let trx = trx_id.unwrap();
                session_event(trx, false);
                let its = intents.get(&txn).expect("an aborted txn without intents");
                assert_eq!(its[0].tablet, tablet, "abort not on the status tablet");
                for i in its {
                    assert!(i.ht < ht);
                    assert_eq!(i.trx_id, Some(trx));
                }
                aborts += 1;
            }
            _ => unreachable!(),
        }
    }
    for txn in intents.keys() {
        assert!(
            decided.contains(txn),
            "txn {txn} has intents but no decision"
        );
    }
    // Gtids: unique, seq +1 per commit in commit_ht order.
    let commits: Vec<Committed> = commits
        .into_iter()
        .enumerate()
        .map(|(k, (ht, gtid, writes))| {
            assert_eq!((gtid.domain, gtid.server), (0, 1));
            assert_eq!(
                gtid.seq,
                first_seq + k as u64,
                "gtid {gtid} out of sequence"
            );
            Committed {
                ht,
                seq: gtid.seq,
                writes,
            }
        })
        .collect();
    Checked {
        records,
        commits,
        aborts,
        distributed_commits,
        retried_aborts,
    }
}

fn assert_summary(s: &Summary, c: &Checked, first_seq: u64) {
    let n = c.commits.len() as u64;
    assert_eq!(s.txns_committed, n);
    assert_eq!(s.txns_aborted, c.aborts as u64);
    assert_eq!(s.last_gtid.unwrap().seq, first_seq + n - 1);
    let records: usize = c.records.iter().map(Vec::len).sum();
    assert_eq!(s.records, records as u64);
    // Everything ends with a heartbeat, so all of it becomes visible at a target.
    for (t, recs) in c.records.iter().enumerate() {
        assert!(
            matches!(recs.last(), Some((_, Body::Heartbeat))),
            "tablet t{t} does not end with a heartbeat"
        );
    }
}

#[test]
fn bank_total_is_constant_at_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(Workload::Bank, dir.path());
    o.tablets = 4;
    o.accounts = 200;
    o.max_txns = Some(4000);
    o.abort_rate = 0.1;
    o.sync = SyncPolicy::Batch;
    let accounts = o.accounts;
    let s = run(o);
    assert_eq!(s.bank_total, Some(accounts * 1000));
    let c = check(&dir.path().join("wal"), 4, 1);
    assert_summary(&s, &c, 1);
    assert!(c.aborts > 100, "aborts: {}", c.aborts);
    assert!(
        c.retried_aborts > 50,
        "retried aborts: {}",
        c.retried_aborts
    );
    assert!(c.distributed_commits > 1000);

    let mut balances: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut total = 0u64;
    for (k, commit) in c.commits.iter().enumerate() {
        for op in &commit.writes {
            let v: u64 = std::str::from_utf8(op.value.as_ref().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            total += v;
            if let Some(old) = balances.insert(op.key.clone(), v) {
                total -= old;
            }
        }
        // After the initial writes (one per tablet), every consistent cut has the total.
        if k >= 3 {
            assert_eq!(
                total,
                accounts * 1000,
                "total after commit {} (ht {}) is {total}",
                commit.seq,
                commit.ht
            );
        }
    }
    assert_eq!(balances.len() as u64, accounts);
    for (a, key) in (0..accounts).map(|a| (a, load::bank_key(a))).take(5) {
        assert!(balances.contains_key(key.as_bytes()), "account {a} missing");
    }
    // Account a lives on tablet a % N.
    for (t, recs) in c.records.iter().enumerate() {
        for (_, body) in recs {
            if let Body::Write { ops, .. } | Body::Intent { ops, .. } = body {
                for op in ops {
                    let a: usize = std::str::from_utf8(&op.key[5..]).unwrap().parse().unwrap();
                    assert_eq!(a % 4, t, "account {a} written on t{t}");
                }
            }
        }
    }
}

#[test]
fn ordered_counters_have_no_gaps_in_commit_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(Workload::Ordered, dir.path());
    o.tablets = 3;
    o.sessions = 5;
    o.max_txns = Some(3000);
    o.abort_rate = 0.2;
    let s = run(o);
    let c = check(&dir.path().join("wal"), 3, 1);
    assert_summary(&s, &c, 1);
    assert!(c.aborts > 20 && c.retried_aborts > 20);
    assert!(c.distributed_commits > 100);
    let mut last = [0u64; 5];
    let mut x_keys = 0;
    for commit in &c.commits {
        for op in &commit.writes {
            let key = std::str::from_utf8(&op.key).unwrap();
            let value: u64 = std::str::from_utf8(op.value.as_ref().unwrap())
                .unwrap()
                .parse()
                .unwrap();
            let parts: Vec<&str> = key.split('/').collect();
            let s: usize = parts[1].parse().unwrap();
            let n: u64 = parts[2].parse().unwrap();
            assert_eq!(n, value);
            match parts[0] {
                "ord" => {
                    assert_eq!(n, last[s] + 1, "session {s}: {key} after {}", last[s]);
                    last[s] = n;
                }
                "ord-x" => {
                    assert_eq!(n, last[s], "{key} without its ord key");
                    x_keys += 1;
                }
                other => panic!("unexpected key prefix {other}"),
            }
        }
    }
    assert!(x_keys > 100);
    assert!(last.iter().all(|&k| k > 100), "{last:?}");
    // ord/{s}/{c} lives on tablet (s + c) % N.
    for (t, recs) in c.records.iter().enumerate() {
        for (_, body) in recs {
            if let Body::Write { ops, .. } = body {
                for op in ops {
                    let key = std::str::from_utf8(&op.key).unwrap();
                    let parts: Vec<&str> = key.split('/').collect();
                    let s: usize = parts[1].parse().unwrap();
                    let n: usize = parts[2].parse().unwrap();
                    assert_eq!((s + n) % 3, t, "{key} on t{t}");
                }
            }
        }
    }
}

#[test]
fn kv_mixes_local_and_distributed_and_continues_gtids_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(Workload::Kv, dir.path());
    o.tablets = 4;
    o.keys = 1000;
    o.max_txns = Some(2000);
    o.sync = SyncPolicy::Always;
    let first = run(o.clone());
    let c = check(&dir.path().join("wal"), 4, 1);
    assert_summary(&first, &c, 1);
    let n1 = c.commits.len() as u64;
    let local = first.committed_by_kind["kv_local"];
    let dist = first.committed_by_kind["kv_distributed"];
    assert_eq!(local + dist, n1);
    assert!(
        dist > 200 && local > 1000,
        "local {local}, distributed {dist}"
    );
    let mut deletes = 0;
    for commit in &c.commits {
        for op in &commit.writes {
            assert!(op.key.starts_with(b"kv/"));
            match &op.value {
                Some(v) => assert_eq!(v.len(), 100),
                None => deletes += 1,
            }
        }
    }
    assert!(deletes > 20, "deletes: {deletes}");

    // A second run over the same WALs continues the gtid sequence and the clock.
    o.seed = 2;
    o.max_txns = Some(500);
    let second = run(o);
    let c2 = check(&dir.path().join("wal"), 4, 1);
    assert_eq!(c2.commits.len() as u64, n1 + second.txns_committed);
    assert_eq!(second.last_gtid.unwrap().seq, n1 + second.txns_committed);
}

#[test]
fn idle_tablets_get_heartbeats() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = opts(Workload::Bank, dir.path());
    o.tablets = 3;
    o.idle_tablets = 1;
    o.accounts = 30;
    o.rate = 200.0;
    o.max_txns = None;
    o.duration = Some(Duration::from_millis(1500));
    o.heartbeat_interval = Duration::from_millis(20);
    let s = run(o);
    let c = check(&dir.path().join("wal"), 3, 1);
    assert_summary(&s, &c, 1);
    // Rate-limited: about 200 txn/s for 1.5 s.
    let attempted = s.txns_committed + s.txns_aborted - 3;
    assert!(
        (200..=330).contains(&attempted),
        "attempted {attempted} transactions"
    );
    let idle = &c.records[2];
    // The initial balances, then only heartbeats, about one per interval.
    assert!(matches!(idle[0].1, Body::Write { .. }));
    assert!(idle[1..].iter().all(|(_, b)| *b == Body::Heartbeat));
    assert!(idle.len() > 20, "{} records on the idle tablet", idle.len());
    for w in idle.windows(2) {
        let gap = w[1].0.physical_micros() - w[0].0.physical_micros();
        assert!(gap < 500_000, "a {gap} µs gap between heartbeats");
    }
    // Busy tablets carry heartbeats only where they were idle; they do carry transactions.
    for recs in &c.records[..2] {
        assert!(recs.iter().any(|(_, b)| matches!(b, Body::Intent { .. })));
    }
}

#[test]
fn samples_every_kth_commit_and_bank_refuses_a_used_wal_dir() {
    let dir = tempfile::tempdir().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut o = opts(Workload::Bank, dir.path());
    o.max_txns = Some(1000);
    o.sample_every = 10;
    o.samples = Some(tx);
    let s = run(o.clone());
    let samples: Vec<_> = rx.try_iter().collect();
    assert_eq!(samples.len() as u64, s.txns_committed / 10);
    let c = check(&dir.path().join("wal"), 4, 1);
    let by_seq: HashMap<u64, HybridTime> = c.commits.iter().map(|c| (c.seq, c.ht)).collect();
    for x in &samples {
        assert_eq!(x.gtid.seq % 10, 0);
        assert_eq!(by_seq[&x.gtid.seq], x.commit_ht);
    }
    assert!(samples
        .iter()
        .any(|x| x.kind == tidelog_testkit::load::TxnKind::Distributed));
    let stop = AtomicBool::new(false);
    let err = load::run(o, &stop, |_| {}).unwrap_err();
    assert!(
        format!("{err:#}").contains("already has records"),
        "{err:#}"
    );
}

/// 2PC durability ordering, watched from outside like a crash would see it: whenever a
/// `commit` record is durable, all of its transaction's intents are durable too.
#[test]
fn durable_commits_never_precede_their_durable_intents() {
    let dir = tempfile::tempdir().unwrap();
    let wal = dir.path().join("wal");
    let mut o = opts(Workload::Bank, dir.path());
    o.tablets = 4;
    o.sync = SyncPolicy::Batch;
    o.local_rate = 0.0;
    o.abort_rate = 0.0;
    o.rate = 4000.0;
    o.max_txns = None;
    o.duration = Some(Duration::from_millis(2000));
    let gen = std::thread::spawn(move || run(o));
    // Wait for all tablets to exist.
    let tablets: Vec<TabletId> = (0..4).map(|i| format!("t{i}").parse().unwrap()).collect();
    let mut readers = loop {
        let rs: Result<Vec<Reader>, _> = tablets
            .iter()
            .map(|t| Reader::open(&wal, t, ReadLimit::Durable))
            .collect();
        if let Ok(rs) = rs {
            break rs;
        }
        std::thread::sleep(Duration::from_millis(1));
    };
    let mut durable_intents: HashSet<(TxnId, TabletId)> = HashSet::new();
    // Commits read but not yet known durable at a first snapshot: (tablet, pos, txn, parts).
    let mut pending: Vec<(usize, u64, TxnId, Vec<TabletId>)> = Vec::new();
    let mut checked = 0usize;
    loop {
        let done = gen.is_finished();
        // Snapshot 1 then snapshot 2: a commit durable at snapshot 1 had its intents durable
        // before it was appended, so they are within snapshot 2.
        let p1: Vec<u64> = readers.iter().map(|r| r.end().unwrap().0).collect();
        let p2: Vec<u64> = readers.iter().map(|r| r.end().unwrap().0).collect();
        for (t, r) in readers.iter_mut().enumerate() {
            while Reader::position(r).0 < p2[t] {
                let (pos, rec) = Reader::next(r).unwrap().unwrap();
                match rec.body {
                    Body::Intent { txn, .. } => {
                        durable_intents.insert((txn, tablets[t].clone()));
                    }
                    Body::Commit {
                        txn, participants, ..
                    } => pending.push((t, pos.0, txn, participants)),
                    _ => {}
                }
            }
        }
        pending.retain(|(t, pos, txn, parts)| {
            if *pos >= p1[*t] {
                return true;
            }
            for p in parts {
                assert!(
                    durable_intents.contains(&(*txn, p.clone())),
                    "txn {txn}: commit durable on t{t} before its intent on {p}"
                );
            }
            checked += 1;
            false
        });
        if done {
            break;
        }
    }
    let s = gen.join().unwrap();
    assert!(pending.is_empty());
    assert_eq!(checked as u64, s.committed_by_kind["bank_distributed"]);
    assert!(checked > 1000, "{checked} commits checked");
}
