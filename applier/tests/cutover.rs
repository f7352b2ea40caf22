//! Cutover in the library: reads capped at the cut at once, the report (lost commits by gtid
//! sequence, counting ones never received), final `trx_status` answers, the background
//! clean-up, idempotence and reopen.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Log;
use tidelog_applier::cutover::{self, Cleanup};
use tidelog_applier::store::Store;
use tidelog_applier::trx::{trx_status, SafeTimeView, TrxQuery, TrxState, TrxStatus};
use tidelog_wal::*;

struct Frozen(HybridTime);

impl SafeTimeView for Frozen {
    fn safe_time(&self) -> Option<HybridTime> {
        Some(self.0)
    }
    fn wait_for(&self, ht: HybridTime, _deadline: Instant) -> bool {
        self.0 >= ht
    }
    fn cut(&self) -> Option<HybridTime> {
        Some(self.0)
    }
}

fn put(k: &str, v: &str) -> Vec<Op> {
    vec![Op {
        key: k.as_bytes().to_vec(),
        value: Some(v.as_bytes().to_vec()),
    }]
}

fn ask(s: &Store, cut: HybridTime, trx: &str, hint: Option<&str>) -> TrxStatus {
    trx_status(
        s,
        &Frozen(cut),
        &TrxQuery {
            trx_id: trx,
            gtid_hint: hint,
            wait: Duration::from_secs(5),
            max_staleness: Duration::from_secs(1),
        },
    )
    .unwrap()
}

#[test]
fn promote_caps_reports_answers_and_cleans_up() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(Store::open(dir.path()).unwrap());
    let (mut a, mut b) = (Log::new("a"), Log::new("b"));
    let w = |k: &str, v: &str, c: u64, seq: u64| Body::Write {
        ops: put(k, v),
        trx_id: Some(TrxId::new(c, seq)),
        gtid: Some(Gtid::new(0, 1, seq)),
    };
    // Commits 1..=3 at or below the cut (30); 4 on tablet b above it; 5 never received
    // (the paused tablet); 6 received above it. A txn undecided at the cut.
    a.apply(&s, 10, w("k", "1", 7, 1));
    b.apply(&s, 20, w("k", "2", 7, 2));
    a.apply(&s, 30, w("k", "3", 7, 3));
    b.apply(&s, 40, w("k", "4", 7, 4));
    a.apply(&s, 60, w("j", "6", 7, 6));
    a.apply(
        &s,
        61,
        Body::Intent {
            txn: TxnId::from_u128(9),
            trx_id: Some(TrxId::new(8, 1)),
            ops: put("x", "1"),
        },
    );
    let cut = HybridTime(30);
    assert_eq!(s.get(b"k", None).unwrap().unwrap().ht, HybridTime(40));

    let c = cutover::promote(&s, cut).unwrap();
    // Reads are capped at the cut at once, before any clean-up.
    assert_eq!(s.cut(), Some(cut));
    assert_eq!(
        s.get(b"k", None).unwrap().unwrap().value,
        Some(b"3".to_vec())
    );
    assert!(s.get(b"j", None).unwrap().is_none());
    assert_eq!(s.scan(b"", None, 10).unwrap().0.len(), 1);
    let r = c.report.clone().unwrap();
    assert_eq!(r.lost_commits, 3, "seqs 4, 5 (never received) and 6");
    assert_eq!(
        r.lost_window_ms, 0,
        "hts here are below a millisecond apart"
    );
    assert_eq!(r.tablets.len(), 2);
    assert_eq!(
        r.tablets[&"b".parse::<TabletId>().unwrap()].0,
        HybridTime(40)
    );
    // Idempotent: a second promote (any cut) returns the first.
    assert_eq!(cutover::promote(&s, HybridTime(55)).unwrap(), c);

    // Final answers.
    assert_eq!(ask(&s, cut, "7:3", None).state, TrxState::Committed);
    for (trx, hint) in [
        ("7:4", None),
        ("7:6", None),
        ("8:1", None),
        ("7:5", None),
        ("7:5", Some("0-1-5")),
    ] {
        let v = ask(&s, cut, trx, hint);
        assert_eq!(v.state, TrxState::Aborted, "{trx}: {v:?}");
        assert!(v.reason.as_deref().unwrap().contains("cutover"), "{v:?}");
        assert!(v.caught_up);
    }
    // A connection this target never saw: unknown, not a guess.
    assert_eq!(ask(&s, cut, "99:1", None).state, TrxState::Unknown);
    // The binlog is capped too: only what is at or below the cut.
    let (entries, _) = s.binlog().unwrap().read(None, cut, 100).unwrap();
    assert_eq!(entries.len(), 3);

    // Clean-up removes the versions above the cut; reopen keeps cut and report.
    Cleanup::start(s.clone()).unwrap().join();
    assert!(s.cutover().unwrap().unwrap().cleaned);
    drop(s);
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.cut(), Some(cut));
    assert_eq!(s.cutover().unwrap().unwrap().report, Some(r));
    assert_eq!(s.role().unwrap(), tidelog_applier::store::Role::Primary);
    // No version above the cut is left, even for an uncapped look at the raw keyspace.
    let (all, _) = s.scan(b"", Some(HybridTime::MAX), 100).unwrap();
    assert_eq!(all.len(), 1);
    assert_eq!(
        s.get(b"k", Some(HybridTime(35))).unwrap().unwrap().ht,
        HybridTime(30)
    );
}
