//! Tests of one opening of the store ([`OpenStore`]) through its calls, looking inside at
//! its keyspaces where a test needs to.
#![allow(clippy::unwrap_used)]

use std::path::Path;

use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, Gtid, HybridTime, Op, Record, TabletId, TrxId, TxnId, WalPos};

use super::codec::{decode_tablet_meta, decode_txn, encode_tablet_meta, encode_txn};
use super::open::OpenStore;
use super::types::{CommitInfo, Durability, IntentRef, OpenKind, Part, Role, TabletMeta, TxnState};
use super::StoreOptions;
use crate::error::{Error, Result};
use crate::keys;

/// The tests below look inside one opening (its keyspaces and private helpers).
struct Store;

impl Store {
    fn open(data_dir: &Path) -> Result<OpenStore> {
        OpenStore::open_with(data_dir, &StoreOptions::default())
    }
}

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

/// Positions records as a log starting at `from` would.
fn place(from: u64, recs: Vec<Record>) -> (Vec<(WalPos, Record)>, WalPos) {
    let mut pos = WalPos(from);
    let mut out = Vec::new();
    for r in recs {
        let len = (RECORD_HEADER_LEN + r.encoded_body_len().unwrap()) as u64;
        out.push((pos, r));
        pos = pos.add(len);
    }
    (out, pos)
}

fn write(ht: u64, ops: Vec<Op>) -> Record {
    Record::new(
        HybridTime(ht),
        Body::Write {
            ops,
            trx_id: None,
            gtid: None,
        },
    )
}

/// A `write` committing trx id `trx` (a binlog entry), no ops.
fn trx_write(ht: u64, trx: TrxId) -> Record {
    Record::new(
        HybridTime(ht),
        Body::Write {
            ops: vec![],
            trx_id: Some(trx),
            gtid: None,
        },
    )
}

fn abort(ht: u64, txn: TxnId, trx_id: Option<TrxId>) -> Record {
    Record::new(HybridTime(ht), Body::Abort { txn, trx_id })
}

fn intent(ht: u64, txn: TxnId, trx_id: Option<TrxId>, ops: Vec<Op>) -> Record {
    Record::new(HybridTime(ht), Body::Intent { txn, trx_id, ops })
}

#[test]
fn apply_get_scan_and_replay() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let a = t("a");
    let (recs, end) = place(
        0,
        vec![
            write(
                10,
                vec![
                    Op::put("k1", "v1"),
                    Op::put("k2", "x"),
                    Op::put("k1", "v1b"),
                ],
            ),
            write(20, vec![Op::delete("k2"), Op::put("k3", "z")]),
            Record::new(HybridTime(30), Body::Heartbeat),
        ],
    );
    let o = s
        .apply(&a, &recs[..2], recs[2].0, Durability::Sync)
        .unwrap();
    assert_eq!((o.records, o.writes, o.ops), (2, 2, 4));
    let o = s.apply(&a, &recs, end, Durability::Buffered).unwrap();
    assert_eq!((o.records, o.skipped, o.heartbeats), (1, 2, 1));
    assert_eq!((o.applied_pos, o.safe_time), (end, HybridTime(30)));
    // Full replay: nothing.
    let o = s.apply(&a, &recs, end, Durability::Buffered).unwrap();
    assert_eq!((o.records, o.skipped), (0, 3));

    let v = s.get(b"k1", None).unwrap().unwrap();
    assert_eq!(
        (v.value.as_deref(), v.ht),
        (Some(&b"v1b"[..]), HybridTime(10))
    );
    assert_eq!(s.get(b"k1", Some(HybridTime(9))).unwrap(), None);
    assert_eq!(s.get(b"k2", None).unwrap().unwrap().value, None);
    assert_eq!(
        s.get(b"k2", Some(HybridTime(19))).unwrap().unwrap().value,
        Some(b"x".to_vec())
    );
    let (rows, more) = s.scan(b"k", None, 10).unwrap();
    let keys: Vec<_> = rows.iter().map(|r| r.0.clone()).collect();
    assert_eq!(keys, vec![b"k1".to_vec(), b"k3".to_vec()]);
    assert!(!more);
    let (rows, more) = s.scan(b"k", Some(HybridTime(15)), 1).unwrap();
    assert_eq!(
        rows,
        vec![(b"k1".to_vec(), b"v1b".to_vec(), HybridTime(10))]
    );
    assert!(more);
    let m = s.tablets().unwrap();
    assert_eq!(m[&a].applied_pos, end);
    assert_eq!(m[&a].safe_time, HybridTime(30));
    assert_eq!(m[&a].applied_records, 3);
    assert!(!m[&a].registered);
    s.register_tablet(&a).unwrap();
    s.set_tablet_owner(&a, Some("host1")).unwrap();
    let m = s.tablet(&a).unwrap().unwrap();
    assert!(m.registered);
    assert_eq!(m.owner.as_deref(), Some("host1"));
    assert_eq!(m.applied_pos, end);
    // A tablet only registered is listed too, and both are found again after a reopen.
    s.register_tablet(&t("b")).unwrap();
    let listed = |s: &OpenStore| s.tablets().unwrap().into_keys().collect::<Vec<_>>();
    assert_eq!(listed(&s), vec![a.clone(), t("b")]);
    drop(s);
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(listed(&s), vec![a.clone(), t("b")]);
    assert_eq!(s.tablets().unwrap()[&a].applied_pos, end);
}

#[test]
fn gaps_and_overlaps_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let a = t("a");
    let (recs, end) = place(
        0,
        (1..=4)
            .map(|i| write(i, vec![Op::put("k", [i as u8])]))
            .collect(),
    );
    s.apply(&a, &recs[..1], recs[1].0, Durability::Buffered)
        .unwrap();
    // Skipping record 1.
    let e = s
        .apply(&a, &recs[2..], end, Durability::Buffered)
        .unwrap_err();
    assert!(
        matches!(e, Error::Gap { expected, got, .. } if expected == recs[1].0 && got == recs[2].0),
        "{e}"
    );
    // Wrong end position.
    let e = s
        .apply(&a, &recs[1..], end.add(1), Durability::Buffered)
        .unwrap_err();
    assert!(matches!(e, Error::Invalid(_)), "{e}");
    // Nothing was written by the failed calls.
    assert_eq!(s.tablet(&a).unwrap().unwrap().applied_pos, recs[1].0);
    assert_eq!(s.get(b"k", None).unwrap().unwrap().ht, HybridTime(1));
}

#[test]
fn txn_state_roundtrip_through_apply() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let (a, st) = (t("a"), t("status"));
    let x = TxnId::from_u128(0x2a);
    let y = TxnId::from_u128(0x2b);
    let (ra, enda) = place(
        0,
        vec![
            Record::new(
                HybridTime(5),
                Body::Intent {
                    txn: x,
                    trx_id: Some(TrxId::new(7, 1)),
                    ops: vec![Op::put("p", "q")],
                },
            ),
            Record::new(
                HybridTime(6),
                Body::Intent {
                    txn: y,
                    trx_id: None,
                    ops: vec![],
                },
            ),
        ],
    );
    s.apply(&a, &ra, enda, Durability::Sync).unwrap();
    let (rs, ends) = place(
        0,
        vec![
            Record::new(
                HybridTime(8),
                Body::Commit {
                    txn: x,
                    participants: vec![a.clone()],
                    trx_id: Some(TrxId::new(7, 1)),
                    gtid: Some(Gtid::new(0, 1, 99)),
                },
            ),
            Record::new(
                HybridTime(9),
                Body::Abort {
                    txn: y,
                    trx_id: None,
                },
            ),
        ],
    );
    let o = s.apply(&st, &rs, ends, Durability::Sync).unwrap();
    assert_eq!((o.commits, o.aborts), (1, 1));
    // Committed under the trx id of all its intents: no `txns` record (the binlog and
    // the `trx` index hold the commit); the state is in the cache until applied.
    assert_eq!(
        s.txn(&x).unwrap(),
        None,
        "a traceable commit was written to txns"
    );
    assert!(s
        .rebuild()
        .committed_as(&x, Some(TrxId::new(7, 1)))
        .unwrap());
    let sx = s.txn_state(&x).unwrap().unwrap();
    assert_eq!(
        sx.intents[&a],
        vec![IntentRef {
            pos: WalPos(0),
            ht: HybridTime(5)
        }]
    );
    let c = sx.commit.unwrap();
    assert_eq!(
        (c.commit_ht, c.tablet, c.participants),
        (HybridTime(8), st.clone(), vec![a.clone()])
    );
    assert_eq!(sx.gtid, Some(Gtid::new(0, 1, 99)));
    assert_eq!(sx.trx_id, Some(TrxId::new(7, 1)));
    assert!(!sx.aborted);
    let sy = s.txn(&y).unwrap().unwrap();
    assert!(sy.aborted && sy.commit.is_none());
    assert_eq!(sy.intents[&a][0].pos, ra[1].0);
    assert_eq!(s.txn(&TxnId::from_u128(1)).unwrap(), None);
    // Intents are not copied into mvcc.
    assert_eq!(s.get(b"p", None).unwrap(), None);
}

/// The pending transactions are the distributed commits in the binlog above the global
/// safe time: listed while the safe time is below the commit (also after a reopen, even
/// once applied everywhere), not once it passed; single-tablet commits in the binlog are
/// never listed.
#[test]
fn distributed_commits_above_the_safe_time_are_pending() {
    let dir = tempfile::tempdir().unwrap();
    let (a, st) = (t("a"), t("status"));
    let x = TxnId::from_u128(3);
    let listed = |s: &OpenStore| -> Vec<TxnId> {
        s.pending_txns()
            .unwrap()
            .into_iter()
            .map(|(t, _)| t)
            .collect()
    };
    {
        let s = Store::open(dir.path()).unwrap();
        let (ra, enda) = place(0, vec![intent(5, x, None, vec![Op::put("k", "v")])]);
        s.apply(&a, &ra, enda, Durability::Sync).unwrap();
        let commit = Record::new(
            HybridTime(8),
            Body::Commit {
                txn: x,
                participants: vec![a.clone()],
                trx_id: None,
                gtid: None,
            },
        );
        let local = trx_write(9, "4:1".parse().unwrap());
        let (rs, ends) = place(0, vec![commit, local]);
        s.apply(&st, &rs, ends, Durability::Sync).unwrap();
        assert_eq!(s.bl.read(None, HybridTime::MAX, 10).unwrap().0.len(), 2);
        let part = Part {
            txn: x,
            commit_ht: HybridTime(8),
            ops: vec![(b"k".to_vec(), Some(b"v".to_vec()))],
        };
        assert_eq!(s.apply_parts(&a, &[part], Durability::Sync).unwrap(), 1);
        assert_eq!(listed(&s), vec![x], "listed before the safe time passed it");
        s.raise_global_safe_time(HybridTime(7), Durability::Sync)
            .unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(
        listed(&s),
        vec![x],
        "listed after a reopen below its commit"
    );
    s.raise_global_safe_time(HybridTime(8), Durability::Sync)
        .unwrap();
    assert_eq!(listed(&s), vec![], "listed at the safe time");
    drop(s);
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(listed(&s), vec![], "listed again after a reopen");
}

/// The `mvcc` history filter, through a real compaction: once the retention horizon
/// passed, versions older than the newest one at or below it are gone; reads at or
/// after the horizon answer as before.
#[test]
fn compaction_drops_versions_no_read_can_see() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let a = t("a");
    let mut recs = Vec::new();
    for (i, ht) in [10u64, 20, 30, 40].into_iter().enumerate() {
        recs.push(write(ht, vec![Op::put("k", format!("v{ht}"))]));
        recs.push(write(ht + 1, vec![Op::put(format!("other{i}"), "x")]));
    }
    // A commit with a trx id at 50: expiring it raises the horizon.
    recs.push(trx_write(50, TrxId::new(1, 1)));
    let (r, end) = place(0, recs);
    s.apply(&a, &r, end, Durability::Sync).unwrap();
    let k_prefix = keys::encode(b"k", HybridTime::MAX)[..3].to_vec();
    let versions = |s: &OpenStore| -> Vec<u64> {
        s.tables
            .mvcc
            .prefix(&k_prefix)
            .map(|g| keys::split(&g.key().unwrap()).unwrap().1 .0)
            .collect()
    };
    s.flush().unwrap();
    s.tables.mvcc.major_compact().unwrap();
    assert_eq!(
        versions(&s),
        vec![40, 30, 20, 10],
        "no horizon yet: all kept"
    );
    s.set_prune_floor(HybridTime::MAX);
    assert_eq!(s.expire_binlog(HybridTime(55), 10).unwrap(), (1, true));
    assert_eq!(s.binlog_horizon().unwrap(), HybridTime(55));
    // Horizon 55 is above every version of k: only the newest (40) can be read.
    let at = |ht| s.get(b"k", Some(HybridTime(ht))).unwrap().map(|v| v.ht.0);
    assert_eq!((at(55), at(35)), (Some(40), Some(30)));
    s.tables.mvcc.major_compact().unwrap();
    assert_eq!(versions(&s), vec![40]);
    assert_eq!(at(55), Some(40));
    assert_eq!(
        s.get(b"k", None).unwrap().unwrap().value.as_deref(),
        Some(&b"v40"[..])
    );
    assert_eq!(s.get(b"other0", None).unwrap().unwrap().ht, HybridTime(11));
}

/// Binlog retention prunes the `txns` records of the transactions it expires — a
/// committed one with its binlog entry, an aborted one with its `trx_open` entry — and
/// keeps those of younger and undecided ones.
#[test]
fn binlog_retention_prunes_resolved_transactions() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let (a, st) = (t("a"), t("status"));
    let (x, y, z, w) = (
        TxnId::from_u128(1),
        TxnId::from_u128(2),
        TxnId::from_u128(3),
        TxnId::from_u128(4),
    );
    let intent = |ht, txn, c| {
        intent(
            ht,
            txn,
            Some(TrxId::new(9, c)),
            vec![Op::put(format!("k{c}"), "v")],
        )
    };
    let (ra, enda) = place(
        0,
        vec![
            intent(5, x, 1),
            intent(6, y, 2),
            intent(7, z, 3),
            intent(8, w, 4),
        ],
    );
    s.apply(&a, &ra, enda, Durability::Sync).unwrap();
    let commit = |ht, txn, c| {
        Record::new(
            HybridTime(ht),
            Body::Commit {
                txn,
                participants: vec![a.clone()],
                trx_id: Some(TrxId::new(9, c)),
                gtid: Some(Gtid::new(0, 1, c)),
            },
        )
    };
    let (rs, ends) = place(
        0,
        vec![
            commit(10, x, 1),
            Record::new(
                HybridTime(11),
                Body::Abort {
                    txn: y,
                    trx_id: Some(TrxId::new(9, 2)),
                },
            ),
            commit(30, z, 3),
        ],
    );
    s.apply(&st, &rs, ends, Durability::Sync).unwrap();
    let part = |txn, ht| Part {
        txn,
        commit_ht: HybridTime(ht),
        ops: vec![],
    };
    s.apply_parts(&a, &[part(x, 10), part(z, 30)], Durability::Sync)
        .unwrap();
    let known = |txn| s.txn(&txn).unwrap().is_some();
    // What a restart tells x and z's commits by: the `trx` index (no `txns` record).
    let traced = |txn, c| {
        s.rebuild()
            .committed_as(&txn, Some(TrxId::new(9, c)))
            .unwrap()
    };
    let indexed = |txn: TxnId| s.tables.aborted.contains_key(txn.0).unwrap();
    assert!(traced(x, 1) && known(y) && traced(z, 3));
    assert!(
        !known(x) && !known(z),
        "a traceable commit was written to txns"
    );
    assert!(!known(w), "an undecided transaction was written to txns");
    assert!(indexed(y) && !indexed(x) && !indexed(z) && !indexed(w));
    // Until received-log retention says what is retained, nothing expires.
    assert_eq!(s.expire_binlog(HybridTime(20), 100).unwrap(), (0, true));
    // Records at ht ≥ 10 retained (x's intents could be there): x's record stays.
    s.set_prune_floor(HybridTime(10));
    assert_eq!(s.expire_binlog(HybridTime(20), 100).unwrap(), (0, true));
    assert!(
        traced(x, 1) && known(y),
        "pruned while the floor is at the commit"
    );
    // Nothing retained below 20: x's commit and y's abort go, with their records; z
    // (committed at 30) stays, and w stays undecided in the cache.
    s.set_prune_floor(HybridTime(25));
    let (n, done) = s.expire_binlog(HybridTime(20), 100).unwrap();
    assert_eq!((n, done), (1, true));
    assert!(!traced(x, 1), "the expired commit's trx index entry stayed");
    assert!(!known(y), "the expired abort's record stayed");
    assert!(!indexed(y), "the expired abort stayed in the aborted index");
    assert!(traced(z, 3));
    let sw = s.txn_state(&w).unwrap().unwrap();
    assert!(sw.commit.is_none() && !sw.aborted && sw.intents.contains_key(&a));
}

/// An aborted transaction whose intent arrives after the abort (in ht too) keeps its
/// record while that intent's ht is at or above the prune floor.
#[test]
fn expiry_keeps_an_abort_with_a_late_intent_above_the_floor() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let (a, b, st) = (t("a"), t("b"), t("status"));
    let x = TxnId::from_u128(1);
    let id = TrxId::new(9, 1);
    let (ra, enda) = place(0, vec![intent(5, x, Some(id), vec![])]);
    s.apply(&a, &ra, enda, Durability::Sync).unwrap();
    let (rs, ends) = place(0, vec![abort(10, x, Some(id))]);
    s.apply(&st, &rs, ends, Durability::Sync).unwrap();
    // The late intent on b, at ht 15: the record is written again with it.
    let (rb, endb) = place(0, vec![intent(15, x, Some(id), vec![])]);
    s.apply(&b, &rb, endb, Durability::Sync).unwrap();
    let rec = s.txn(&x).unwrap().unwrap();
    assert!(rec.aborted && rec.intents.contains_key(&b), "{rec:?}");
    s.set_prune_floor(HybridTime(12));
    s.expire_binlog(HybridTime(20), 100).unwrap();
    assert!(
        s.txn(&x).unwrap().is_some(),
        "pruned with an intent above the floor"
    );
    s.set_prune_floor(HybridTime(16));
    s.expire_binlog(HybridTime(20), 100).unwrap();
    assert!(
        s.txn(&x).unwrap().is_none(),
        "kept once the floor passed its intents"
    );
    assert!(s.bl.trx_open(id).unwrap().is_none());
}

/// A late intent of a transaction aborted before a reopen (and of one aborted after it)
/// is recognised as the aborted transaction's, not taken for a new undecided one: the
/// filter in front of the `aborted` keyspace is rebuilt at open and fed by every abort.
#[test]
fn a_late_intent_after_an_abort_is_recognised_across_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, st) = (t("a"), t("b"), t("status"));
    let (x, y) = (TxnId::from_u128(1), TxnId::from_u128(2));
    let (ix, iy) = (TrxId::new(9, 1), TrxId::new(9, 2));
    {
        let s = Store::open(dir.path()).unwrap();
        let (ra, enda) = place(0, vec![intent(5, x, Some(ix), vec![])]);
        s.apply(&a, &ra, enda, Durability::Sync).unwrap();
        let (rs, ends) = place(0, vec![abort(10, x, Some(ix))]);
        s.apply(&st, &rs, ends, Durability::Sync).unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    let from = s.tablet(&st).unwrap().unwrap().applied_pos.0;
    let (rs, ends) = place(from, vec![abort(11, y, Some(iy))]);
    s.apply(&st, &rs, ends, Durability::Sync).unwrap();
    let (rb, endb) = place(
        0,
        vec![
            intent(15, x, Some(ix), vec![]),
            intent(16, y, Some(iy), vec![]),
        ],
    );
    s.apply(&b, &rb, endb, Durability::Sync).unwrap();
    for txn in [x, y] {
        let st = s.txn_state(&txn).unwrap().unwrap();
        assert!(
            st.aborted && st.intents.contains_key(&b),
            "{txn}: late intent taken for a new transaction: {st:?}"
        );
    }
    // Neither is held as undecided: b's release is not kept at the late intents.
    let floors = s.retention_floors().unwrap().unwrap();
    assert_eq!(floors[&b].intent, None, "{floors:?}");
}

/// Expiring an aborted attempt of a trx id whose retry (same trx id, newer) is
/// undecided keeps the retry's `trx_open` entry: the time index is checked against it.
#[test]
fn expiry_keeps_a_retry_that_replaced_an_aborted_attempt() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let (a, st) = (t("a"), t("status"));
    let id = TrxId::new(9, 2);
    let (first, retry) = (TxnId::from_u128(1), TxnId::from_u128(2));
    let intent = |ht, txn| intent(ht, txn, Some(id), vec![]);
    let (ra, _) = place(0, vec![intent(5, first), intent(12, retry)]);
    s.apply(&a, &ra[..1], ra[1].0, Durability::Sync).unwrap();
    let (rs, ends) = place(0, vec![abort(11, first, Some(id))]);
    s.apply(&st, &rs, ends, Durability::Sync).unwrap();
    let o = s.bl.trx_open(id).unwrap().unwrap();
    assert_eq!((o.kind, o.txn), (OpenKind::Aborted, first));
    let (_, enda) = place(0, vec![intent(5, first), intent(12, retry)]);
    s.apply(&a, &ra[1..], enda, Durability::Sync).unwrap();
    let o = s.open_trx(id).unwrap().unwrap();
    assert_eq!((o.kind, o.txn), (OpenKind::Pending, retry));
    // A binlog entry below 20, so that expiry runs to the end and expires opens.
    let (rw, endw) = place(enda.0, vec![trx_write(13, TrxId::new(1, 1))]);
    s.apply(&a, &rw, endw, Durability::Sync).unwrap();
    s.set_prune_floor(HybridTime::MAX);
    assert_eq!(s.expire_binlog(HybridTime(20), 10).unwrap(), (1, true));
    let o = s.open_trx(id).unwrap().unwrap();
    assert_eq!(
        (o.kind, o.txn),
        (OpenKind::Pending, retry),
        "the retry's entry went"
    );
    assert!(
        s.bl.trx_open(id).unwrap().is_none(),
        "the expired abort stayed"
    );
    assert_eq!(
        s.bl.open_aborts.iter().count(),
        0,
        "the stale index entry stayed"
    );
}

#[test]
fn corrupt_values_are_named_errors() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let x = TxnId::from_u128(0x2a);
    s.tables.txns.insert(x.0, vec![1u8, 0, 3]).unwrap();
    let e = s.txn(&x).unwrap_err().to_string();
    assert!(
        e.contains("txn 0000000000000000000000000000002a in keyspace txns"),
        "{e}"
    );
    s.tables.meta.insert(b"tablet/a", vec![1u8]).unwrap();
    let e = s.tablet(&t("a")).unwrap_err().to_string();
    assert!(e.contains("tablet a in keyspace meta"), "{e}");
    s.tables
        .mvcc
        .insert(keys::encode(b"k", HybridTime(1)), vec![7u8])
        .unwrap();
    let e = s.get(b"k", None).unwrap_err().to_string();
    assert!(e.contains("unknown value tag 7"), "{e}");
    s.tables.mvcc.insert(vec![b'z', 0, 9], vec![1u8]).unwrap();
    assert!(matches!(s.scan(b"z", None, 10), Err(Error::Key(_))));
    assert!(matches!(s.scan(b"k", None, 10), Err(Error::Corrupt { .. })));
    // The tablet records are scanned when the store opens.
    s.persist().unwrap();
    drop(s);
    let e = Store::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("tablet a in keyspace meta"), "{e}");
}

#[test]
fn txn_and_meta_encodings_roundtrip() {
    let mut st = TxnState {
        aborted: true,
        trx_id: Some(TrxId::new(1, u64::MAX)),
        gtid: Some(Gtid::new(u32::MAX, 2, 3)),
        commit: Some(CommitInfo {
            commit_ht: HybridTime(77),
            tablet: t("s"),
            pos: WalPos(123),
            participants: vec![t("a"), t("b")],
        }),
        ..TxnState::default()
    };
    st.intents.insert(
        t("a"),
        vec![IntentRef {
            pos: WalPos(1),
            ht: HybridTime(2),
        }],
    );
    let enc = encode_txn(&st).unwrap();
    assert_eq!(decode_txn(&enc).unwrap(), st);
    for cut in 0..enc.len() {
        assert!(decode_txn(&enc[..cut]).is_err());
    }
    let m = TabletMeta {
        applied_pos: WalPos(9),
        safe_time: HybridTime(10),
        registered: true,
        owner: Some("o".into()),
        applied_records: 42,
    };
    let enc = encode_tablet_meta(&m).unwrap();
    assert_eq!(decode_tablet_meta(&enc).unwrap(), m);
    for cut in 0..enc.len() {
        assert!(decode_tablet_meta(&enc[..cut]).is_err());
    }
}

#[test]
fn global_safe_time_is_monotone_and_role_persists() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.global_safe_time().unwrap(), None);
        assert_eq!(
            s.raise_global_safe_time(HybridTime(10), Durability::Sync)
                .unwrap(),
            HybridTime(10)
        );
        assert_eq!(
            s.raise_global_safe_time(HybridTime(5), Durability::Sync)
                .unwrap(),
            HybridTime(10)
        );
        assert_eq!(s.role().unwrap(), Role::Standby);
        s.set_role(Role::Primary).unwrap();
    }
    let s = Store::open(dir.path()).unwrap();
    assert_eq!(s.global_safe_time().unwrap(), Some(HybridTime(10)));
    assert_eq!(s.role().unwrap(), Role::Primary);
}

#[test]
fn a_store_in_use_is_refused_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Store::open(dir.path()).unwrap();
    let e = Store::open(dir.path()).unwrap_err().to_string();
    assert!(e.contains("locked by another process"), "{e}");
    assert!(
        e.contains(&dir.path().join("store").display().to_string()),
        "{e}"
    );
}
