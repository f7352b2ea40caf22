//! Binlog and `trx_status` through the store's apply path, with a controllable safe time:
//! every state, the hint wait, a reused trx id, reopen after close, retention and bad input.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use common::Log;
use tidelog_applier::binlog::OpenKind;
use tidelog_applier::store::Store;
use tidelog_applier::trx::{trx_status, SafeTimeView, TrxQuery, TrxState, TrxStatus};
use tidelog_wal::*;

/// A safe time the test moves by hand; `wait_for` blocks on it like the real one.
#[derive(Default)]
struct Safe {
    v: AtomicU64,
    /// A cutover's cut (0: none), set by `promote`.
    cut: AtomicU64,
    /// Calls of `wait_for` so far (a look-up that waits).
    waits: AtomicUsize,
    m: Mutex<()>,
    cv: Condvar,
}

impl Safe {
    fn set(&self, ht: u64) {
        self.v.store(ht, Ordering::SeqCst);
        let _g = self.m.lock().unwrap();
        self.cv.notify_all();
    }

    /// A cutover: the safe time freezes at `cut` and waiters stop waiting.
    fn promote(&self, cut: u64) {
        self.v.store(cut, Ordering::SeqCst);
        self.cut.store(cut, Ordering::SeqCst);
        let _g = self.m.lock().unwrap();
        self.cv.notify_all();
    }
}

impl SafeTimeView for Safe {
    fn safe_time(&self) -> Option<HybridTime> {
        match self.v.load(Ordering::SeqCst) {
            0 => None,
            v => Some(HybridTime(v)),
        }
    }
    fn cut(&self) -> Option<HybridTime> {
        match self.cut.load(Ordering::SeqCst) {
            0 => None,
            c => Some(HybridTime(c)),
        }
    }
    fn wait_for(&self, ht: HybridTime, deadline: Instant) -> bool {
        let mut g = self.m.lock().unwrap();
        self.waits.fetch_add(1, Ordering::SeqCst);
        loop {
            if self.v.load(Ordering::SeqCst) >= ht.0 {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.cut.load(Ordering::SeqCst) != 0 {
                return false;
            }
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
    }
}

fn op(k: &str) -> Vec<Op> {
    vec![Op {
        key: k.as_bytes().to_vec(),
        value: Some(b"v".to_vec()),
    }]
}

fn ask(s: &Store, v: &Safe, trx: &str, hint: Option<&str>, wait_ms: u64) -> TrxStatus {
    trx_status(
        s,
        v,
        &TrxQuery {
            trx_id: trx,
            gtid_hint: hint,
            wait: Duration::from_millis(wait_ms),
            max_staleness: Duration::from_secs(u64::MAX / 4_000_000),
        },
    )
    .unwrap()
}

fn tid(c: u64, n: u64) -> Option<TrxId> {
    Some(TrxId::new(c, n))
}

fn g(seq: u64) -> Option<Gtid> {
    Some(Gtid::new(0, 1, seq))
}

#[test]
fn every_state_from_the_apply_path() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let v = Safe::default();
    let (mut a, mut b) = (Log::new("a"), Log::new("b"));
    let x1 = TxnId::from_u128(1);
    let x2 = TxnId::from_u128(2);
    let x3 = TxnId::from_u128(3);
    // 7:1 a local write, committed at 10.
    a.apply(
        &s,
        10,
        Body::Write {
            ops: op("k1"),
            trx_id: tid(7, 1),
            gtid: g(1),
        },
    );
    // 7:2 distributed: intents on a and b, commit on a at 30.
    a.apply(
        &s,
        20,
        Body::Intent {
            txn: x1,
            trx_id: tid(7, 2),
            ops: op("k2"),
        },
    );
    let pending = ask(&s, &v, "7:2", None, 0);
    assert_eq!(pending.state, TrxState::InProgress, "{pending:?}");
    assert_eq!(pending.txn, Some(x1));
    assert!(pending.waits_for.unwrap().contains(&x1.to_string()));
    b.apply(
        &s,
        21,
        Body::Intent {
            txn: x1,
            trx_id: tid(7, 2),
            ops: op("k3"),
        },
    );
    a.apply(
        &s,
        30,
        Body::Commit {
            txn: x1,
            participants: vec![a.tablet.clone(), b.tablet.clone()],
            trx_id: tid(7, 2),
            gtid: g(2),
        },
    );
    // 8:1 aborted, then its retry (same id) is pending, then committed at 60.
    b.apply(
        &s,
        40,
        Body::Intent {
            txn: x2,
            trx_id: tid(8, 1),
            ops: op("k4"),
        },
    );
    b.apply(
        &s,
        41,
        Body::Abort {
            txn: x2,
            trx_id: tid(8, 1),
        },
    );
    v.set(41);
    let aborted = ask(&s, &v, "8:1", None, 0);
    assert_eq!(aborted.state, TrxState::Aborted, "{aborted:?}");
    assert!(aborted.reason.unwrap().contains("aborted at source"));
    b.apply(
        &s,
        50,
        Body::Intent {
            txn: x3,
            trx_id: tid(8, 1),
            ops: op("k5"),
        },
    );
    assert_eq!(ask(&s, &v, "8:1", None, 0).state, TrxState::InProgress);
    b.apply(
        &s,
        60,
        Body::Commit {
            txn: x3,
            participants: vec![b.tablet.clone()],
            trx_id: tid(8, 1),
            gtid: g(3),
        },
    );

    // Safe time 25: 7:1 visible, 7:2 committed but not visible.
    v.set(25);
    let c = ask(&s, &v, "7:1", None, 0);
    assert_eq!(c.state, TrxState::Committed, "{c:?}");
    assert_eq!((c.gtid, c.commit_ht), (g(1), Some(HybridTime(10))));
    assert_eq!(c.connect_id, Some(7));
    let ip = ask(&s, &v, "7:2", None, 0);
    assert_eq!(ip.state, TrxState::InProgress, "{ip:?}");
    assert_eq!(ip.commit_ht, Some(HybridTime(30)));
    assert!(ip.waits_for.is_some());
    v.set(60);
    assert_eq!(ask(&s, &v, "7:2", None, 0).state, TrxState::Committed);
    // The retry of 8:1 committed: the latest outcome wins.
    let r = ask(&s, &v, "8:1", None, 0);
    assert_eq!((r.state, r.gtid), (TrxState::Committed, g(3)), "{r:?}");
    // Never seen, malformed, huge.
    for (id, why) in [
        ("9:1", "never seen"),
        ("7", "malformed"),
        ("x:1", "malformed"),
        ("7:0", "malformed"),
        ("1:99999999999999999999999", "malformed"),
        ("", "malformed"),
    ] {
        let u = ask(&s, &v, id, None, 0);
        assert_eq!(u.state, TrxState::Unknown, "{id}: {u:?}");
        assert!(u.reason.as_deref().unwrap().contains(why), "{id}: {u:?}");
    }
    let huge = ask(&s, &v, &format!("7:{}", u64::MAX), None, 0);
    assert_eq!(huge.state, TrxState::Unknown);
    // Hints: visible → caught up; from another domain and malformed → UNKNOWN with reason.
    let h = ask(&s, &v, "7:2", Some("0-1-2"), 0);
    assert!(h.caught_up && h.state == TrxState::Committed, "{h:?}");
    let f = ask(&s, &v, "7:2", Some("5-1-2"), 0);
    assert_eq!(f.state, TrxState::Unknown);
    assert!(f.reason.unwrap().contains("domain 5"));
    let m = ask(&s, &v, "7:2", Some("0-1"), 0);
    assert!(m.state == TrxState::Unknown && m.reason.unwrap().contains("malformed gtid"));

    // The binlog in commit order, and from a gtid.
    let bl = s.binlog().unwrap();
    let (all, more) = bl.read(None, HybridTime(60), 100).unwrap();
    assert!(!more);
    let gt: Vec<_> = all.iter().map(|e| e.gtid.unwrap().seq).collect();
    assert_eq!(gt, vec![1, 2, 3]);
    assert_eq!(all[1].tablets.len(), 2);
    let e2 = bl.gtid(0, 2).unwrap().unwrap();
    let (from2, _) = bl
        .read(Some((e2.commit_ht, &e2.tablet)), HybridTime(60), 1)
        .unwrap();
    assert_eq!(from2[0].trx_id, tid(7, 2));
    // Capped at safe time.
    assert_eq!(bl.read(None, HybridTime(29), 100).unwrap().0.len(), 1);
    // Resolved transactions leave no pending entry: 7:2 has none at all; 8:1 keeps its
    // aborted first attempt's entry (binlog retention expires it), shadowed by the commit.
    assert!(s.open_trx(TrxId::new(7, 2)).unwrap().is_none());
    let o = s.open_trx(TrxId::new(8, 1)).unwrap().unwrap();
    assert_eq!(o.kind, OpenKind::Aborted);
    assert_eq!(ask(&s, &v, "8:1", None, 0).state, TrxState::Committed);

    // Everything survives a reopen.
    drop((bl, s));
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(ask(&s, &v, "7:2", None, 0).state, TrxState::Committed);
    assert_eq!(ask(&s, &v, "8:1", None, 0).gtid, g(3));
}

#[test]
fn a_hint_ahead_of_the_target_waits_then_reports_behind() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let v = std::sync::Arc::new(Safe::default());
    let mut a = Log::new("a");
    a.apply(
        &s,
        10,
        Body::Write {
            ops: op("k"),
            trx_id: tid(1, 1),
            gtid: g(1),
        },
    );
    v.set(10);
    // 1:2 (gtid 2) has not arrived: the answer waits for the hint, then says behind.
    let t0 = Instant::now();
    let r = ask(&s, &v, "1:2", Some("0-1-2"), 300);
    assert!(t0.elapsed() >= Duration::from_millis(300));
    assert!(!r.caught_up, "{r:?}");
    assert_eq!(r.state, TrxState::InProgress, "{r:?}");
    assert!(r.waits_for.unwrap().contains("0-1-2"));
    // Without a hint the same look-up is UNKNOWN at once.
    assert_eq!(ask(&s, &v, "1:2", None, 0).state, TrxState::Unknown);
    // It arrives and becomes visible while a look-up waits: COMMITTED, caught up.
    let (s2, v2) = (s.clone(), v.clone());
    let before = v.waits.load(Ordering::SeqCst);
    let waiter = std::thread::spawn(move || ask(&s2, &v2, "1:2", Some("0-1-2"), 10_000));
    // Apply only once the look-up is waiting (it read the indexes before), so the answer
    // must come from what arrived during the wait.
    let deadline = Instant::now() + Duration::from_secs(10);
    while v.waits.load(Ordering::SeqCst) == before {
        assert!(Instant::now() < deadline, "the look-up never waited");
        std::thread::yield_now();
    }
    a.apply(
        &s,
        20,
        Body::Write {
            ops: op("k"),
            trx_id: tid(1, 2),
            gtid: g(2),
        },
    );
    v.set(20);
    let r = waiter.join().unwrap();
    assert!(r.caught_up && r.state == TrxState::Committed, "{r:?}");
}

#[test]
fn retention_expires_entries_and_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let v = Safe::default();
    let mut a = Log::new("a");
    let now = HybridTime::from_system_time(SystemTime::now()).0;
    for i in 1..=5u64 {
        a.apply(
            &s,
            now + i,
            Body::Write {
                ops: op("k"),
                trx_id: tid(3, i),
                gtid: g(i),
            },
        );
    }
    a.apply(
        &s,
        now + 6,
        Body::Abort {
            txn: TxnId::from_u128(9),
            trx_id: tid(4, 1),
        },
    );
    v.set(now + 10);
    assert_eq!(ask(&s, &v, "3:2", None, 0).state, TrxState::Committed);
    // Expire everything below the 4th commit (no received log retains anything).
    s.set_prune_floor(HybridTime::MAX);
    let (n, done) = s.expire_binlog(HybridTime(now + 4), 2).unwrap();
    assert_eq!((n, done), (2, false));
    let (n, done) = s.expire_binlog(HybridTime(now + 4), 2).unwrap();
    assert_eq!((n, done), (1, true));
    let gone = ask(&s, &v, "3:2", None, 0);
    assert_eq!(gone.state, TrxState::Unknown);
    assert!(
        gone.reason.as_deref().unwrap().contains("retention"),
        "{gone:?}"
    );
    assert_eq!(ask(&s, &v, "3:4", None, 0).state, TrxState::Committed);
    assert!(s.binlog().unwrap().gtid(0, 3).unwrap().is_none());
    assert_eq!(
        s.binlog()
            .unwrap()
            .first_in_domain(0)
            .unwrap()
            .unwrap()
            .gtid
            .seq,
        4
    );
    // A hint older than anything retained counts as caught up.
    assert!(ask(&s, &v, "3:4", Some("0-1-1"), 0).caught_up);
    assert_eq!(ask(&s, &v, "4:1", None, 0).state, TrxState::Aborted);
    s.expire_binlog(HybridTime(now + 7), 100).unwrap();
    assert_eq!(ask(&s, &v, "4:1", None, 0).state, TrxState::Unknown);
    assert_eq!(
        s.binlog()
            .unwrap()
            .read(None, HybridTime::MAX, 10)
            .unwrap()
            .0
            .len(),
        0
    );
}

/// A retry's intents may be applied (from one tablet) before the abort of the attempt it
/// retries (from another): the newest attempt is what trx_status reports.
#[test]
fn a_late_abort_of_an_earlier_attempt_does_not_hide_the_retry() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let v = Safe::default();
    let (mut a, mut b) = (Log::new("a"), Log::new("b"));
    let (first, retry) = (TxnId::from_u128(21), TxnId::from_u128(22));
    a.apply(
        &s,
        10,
        Body::Intent {
            txn: first,
            trx_id: tid(5, 1),
            ops: op("k1"),
        },
    );
    // The retry's intent (ht 30) reaches the store before the first attempt's abort (20).
    b.apply(
        &s,
        30,
        Body::Intent {
            txn: retry,
            trx_id: tid(5, 1),
            ops: op("k2"),
        },
    );
    a.apply(
        &s,
        20,
        Body::Abort {
            txn: first,
            trx_id: tid(5, 1),
        },
    );
    v.set(35);
    let r = ask(&s, &v, "5:1", None, 0);
    assert_eq!(
        (r.state, r.txn),
        (TrxState::InProgress, Some(retry)),
        "{r:?}"
    );
    let o = s.open_trx(TrxId::new(5, 1)).unwrap().unwrap();
    assert_eq!((o.kind, o.txn), (OpenKind::Pending, retry));
    // The retry aborts too: now the answer is its abort.
    b.apply(
        &s,
        40,
        Body::Abort {
            txn: retry,
            trx_id: tid(5, 1),
        },
    );
    v.set(45);
    let r = ask(&s, &v, "5:1", None, 0);
    assert_eq!((r.state, r.txn), (TrxState::Aborted, Some(retry)), "{r:?}");
}

/// A hint at or below a seq of its domain that a look-up found visible is visible without a
/// `gtid` read — here seq 2, which the binlog never held (a hole below visible seq 3), so
/// only that rule can answer it: before seq 3 was seen visible the same look-up waits and
/// reports behind. A higher seq and another domain still go to the binlog.
#[test]
fn a_hint_below_a_seq_found_visible_needs_no_gtid_read() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let v = Safe::default();
    let mut a = Log::new("a");
    for (ht, n, seq) in [(10, 1, 1), (30, 3, 3)] {
        a.apply(
            &s,
            ht,
            Body::Write {
                ops: op("k"),
                trx_id: tid(1, n),
                gtid: g(seq),
            },
        );
    }
    v.set(30);
    let r = ask(&s, &v, "9:9", Some("0-1-2"), 0);
    assert!(!r.caught_up, "nothing known visible yet: {r:?}");
    assert_eq!(r.state, TrxState::InProgress, "{r:?}");
    // A look-up whose hint (seq 3) is in the binlog and visible.
    let r = ask(&s, &v, "9:8", Some("0-1-3"), 0);
    assert!(r.caught_up && r.state == TrxState::Unknown, "{r:?}");
    let waits = v.waits.load(Ordering::SeqCst);
    let r = ask(&s, &v, "9:9", Some("0-1-2"), 0);
    assert!(r.caught_up, "seq 2 ≤ visible seq 3: {r:?}");
    assert_eq!(r.state, TrxState::Unknown, "{r:?}");
    assert_eq!(
        v.waits.load(Ordering::SeqCst),
        waits,
        "answered without waiting"
    );
    // Above what is known, and in another domain: read and answered as before.
    let r = ask(&s, &v, "9:9", Some("0-1-4"), 0);
    assert!(!r.caught_up && r.state == TrxState::InProgress, "{r:?}");
    let r = ask(&s, &v, "9:9", Some("5-1-1"), 0);
    assert!(r.reason.unwrap().contains("domain 5"));
}

/// Waits until `v` has had a `wait_for` call since `before` (the look-up is waiting).
fn wait_until_waiting(v: &Safe, before: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while v.waits.load(Ordering::SeqCst) == before {
        assert!(Instant::now() < deadline, "the look-up never waited");
        std::thread::yield_now();
    }
}

#[test]
fn a_hint_below_the_domains_first_entry_waits_while_that_entry_is_not_visible() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let v = std::sync::Arc::new(Safe::default());
    let (mut a, mut b) = (Log::new("a"), Log::new("b"));
    a.apply(&s, 5, Body::Heartbeat);
    b.apply(&s, 5, Body::Heartbeat);
    v.set(5);
    // gtid 2 arrived on `a`; gtid 1 (committed before it, on `b`) is still on its way.
    a.apply(
        &s,
        20,
        Body::Write {
            ops: op("k2"),
            trx_id: tid(1, 2),
            gtid: g(2),
        },
    );
    let r = ask(&s, &v, "1:1", Some("0-1-1"), 200);
    assert!(
        !r.caught_up,
        "below the first entry, but not past it: {r:?}"
    );
    assert_eq!(r.state, TrxState::InProgress, "{r:?}");
    // It arrives while a look-up waits: COMMITTED.
    let (s2, v2) = (s.clone(), v.clone());
    let before = v.waits.load(Ordering::SeqCst);
    let waiter = std::thread::spawn(move || ask(&s2, &v2, "1:1", Some("0-1-1"), 10_000));
    wait_until_waiting(&v, before);
    b.apply(
        &s,
        10,
        Body::Write {
            ops: op("k1"),
            trx_id: tid(1, 1),
            gtid: g(1),
        },
    );
    v.set(20);
    let r = waiter.join().unwrap();
    assert!(r.caught_up && r.state == TrxState::Committed, "{r:?}");
    assert_eq!(r.gtid, g(1));
}

#[test]
fn a_look_up_waiting_when_the_target_is_promoted_answers_as_the_promoted_target() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let v = std::sync::Arc::new(Safe::default());
    let mut a = Log::new("a");
    a.apply(
        &s,
        10,
        Body::Write {
            ops: op("k"),
            trx_id: tid(3, 1),
            gtid: g(1),
        },
    );
    // 3:2 has intents and no decision; its client saw gtid 0-1-2, which never arrives.
    a.apply(
        &s,
        20,
        Body::Intent {
            txn: TxnId::from_u128(9),
            trx_id: tid(3, 2),
            ops: op("k"),
        },
    );
    v.set(20);
    let (s2, v2) = (s.clone(), v.clone());
    let before = v.waits.load(Ordering::SeqCst);
    let waiter = std::thread::spawn(move || ask(&s2, &v2, "3:2", Some("0-1-2"), 10_000));
    wait_until_waiting(&v, before);
    v.promote(20);
    let r = waiter.join().unwrap();
    assert!(r.caught_up, "answers on a promoted target are final: {r:?}");
    assert_eq!(r.state, TrxState::Aborted, "{r:?}");
    assert!(r.reason.unwrap().contains("cutover"));
}
