//! Property tests through a real `Writer` → `Reader`: every record kind round-trips
//! (binary and empty keys and values, tombstones, optional trx ids and gtids, commit
//! participants), the format's maximum sizes fit and one byte more is refused with nothing
//! written, non-increasing hts are refused with nothing written, and `rollback` drops the
//! staged records.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::fuzzkit::body;
use common::*;
use proptest::prelude::*;
use tidelog_wal::format::{MAX_BODY_LEN, MAX_KEY_LEN, MAX_PARTICIPANTS, MAX_VALUE_LEN};
use tidelog_wal::*;

fn tablet() -> TabletId {
    "props".parse().unwrap()
}

fn opts(segment_size: u64) -> WalOptions {
    WalOptions {
        segment_size,
        ..Default::default()
    }
}

// ---- strategies ----

fn sync_policy() -> impl Strategy<Value = SyncPolicy> {
    prop_oneof![
        Just(SyncPolicy::Always),
        Just(SyncPolicy::Batch),
        Just(SyncPolicy::None)
    ]
}

/// Reads everything durable, failing on any error.
fn read_back(root: &std::path::Path) -> Vec<(WalPos, Record)> {
    read_ok(root, &tablet(), ReadLimit::Durable, 100_000)
}

fn expect_too_large(e: Error, what: &str, len: usize, max: usize) {
    match e {
        Error::TooLarge {
            tablet: t,
            what: w,
            len: l,
            max: m,
        } => {
            assert_eq!((w, l, m), (what, len, max));
            // The writer names the tablet it refused the record for.
            assert_eq!(t, Some(tablet()));
        }
        other => panic!("expected TooLarge {what}, got {other}"),
    }
}

// ---- round trips ----

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Records of every kind read back exactly, at the positions `append` returned, in
    /// order, across segment rotations, with every sync policy; and again after reopening.
    #[test]
    fn every_kind_round_trips(
        items in prop::collection::vec((body(), 1u64..1_000_000, any::<bool>()), 1..40),
        policy in sync_policy(),
        seg_kib in prop_oneof![Just(8u64), Just(16), Just(1024)],
    ) {
        let d = tempfile::tempdir().unwrap();
        let mut w = Writer::open(d.path(), &tablet(), opts(seg_kib << 10)).unwrap();
        let mut ht = 0u64;
        let mut want = Vec::new();
        for (body, dht, commit) in items {
            ht += dht;
            let r = Record::new(HybridTime(ht), body);
            let before = w.staged_pos();
            let p = w.append(&r).unwrap();
            prop_assert!(p >= before);
            prop_assert_eq!(w.staged_pos(), p.add(rec_len(&r)));
            want.push((p, r));
            if commit {
                w.commit(policy).unwrap();
            }
        }
        let end = w.commit(policy).unwrap();
        prop_assert_eq!(end, w.staged_pos());
        prop_assert!(w.wait_durable(end, Duration::from_secs(30)));
        prop_assert_eq!(w.durable_pos(), end);
        let got = read_back(d.path());
        prop_assert_eq!(&got, &want);
        let written = read_ok(d.path(), &tablet(), ReadLimit::Written, 100_000);
        prop_assert_eq!(&written, &want);
        drop(w);
        let w = Writer::open(d.path(), &tablet(), opts(seg_kib << 10)).unwrap();
        prop_assert_eq!(w.written_pos(), end);
        prop_assert_eq!(w.recovery_report().dropped_bytes, 0);
        prop_assert_eq!(w.last_ht(), Some(HybridTime(ht)));
        drop(w);
        prop_assert_eq!(&read_back(d.path()), &want);
    }

    /// A key, value or participant list one past its limit is refused with `TooLarge`,
    /// nothing staged and the record's ht not consumed.
    #[test]
    fn oversize_parts_are_refused(
        extra in 1usize..200,
        which in 0..4u8,
        at in 0usize..3,
        intent in any::<bool>(),
    ) {
        let d = tempfile::tempdir().unwrap();
        let mut w = Writer::open(d.path(), &tablet(), opts(64 << 10)).unwrap();
        let first = Record::new(HybridTime(5), Body::Heartbeat);
        w.append(&first).unwrap();
        w.commit(SyncPolicy::None).unwrap();
        let staged = w.staged_pos();
        let mut ops: Vec<Op> = (0..3).map(|i| Op::put(vec![i as u8], b"ok".to_vec())).collect();
        let (bad, what, len, max) = match which {
            0 => {
                ops[at] = Op::put(vec![7u8; MAX_KEY_LEN + extra], Vec::new());
                (None, "key", MAX_KEY_LEN + extra, MAX_KEY_LEN)
            }
            1 => {
                ops[at] = Op::delete(vec![7u8; MAX_KEY_LEN + extra]);
                (None, "key", MAX_KEY_LEN + extra, MAX_KEY_LEN)
            }
            2 => {
                ops[at] = Op::put(b"k".to_vec(), vec![1u8; MAX_VALUE_LEN + extra]);
                (None, "value", MAX_VALUE_LEN + extra, MAX_VALUE_LEN)
            }
            _ => {
                let participants = (0..MAX_PARTICIPANTS + extra)
                    .map(|i| format!("t{i}").parse().unwrap())
                    .collect();
                let body = Body::Commit {
                    txn: TxnId::from_u128(1),
                    participants,
                    trx_id: None,
                    gtid: None,
                };
                (Some(body), "participant list", MAX_PARTICIPANTS + extra, MAX_PARTICIPANTS)
            }
        };
        let body = bad.unwrap_or(if intent {
            Body::Intent { txn: TxnId::from_u128(2), trx_id: None, ops }
        } else {
            Body::Write { ops, trx_id: None, gtid: None }
        });
        let e = w.append(&Record::new(HybridTime(6), body)).unwrap_err();
        expect_too_large(e, what, len, max);
        prop_assert_eq!(w.staged_pos(), staged);
        prop_assert_eq!(w.last_ht(), Some(HybridTime(5)));
        // The same ht is still free.
        let ok = Record::new(HybridTime(6), Body::Heartbeat);
        let p = w.append(&ok).unwrap();
        prop_assert_eq!(p, staged);
        w.commit(SyncPolicy::None).unwrap();
        drop(w);
        prop_assert_eq!(read_back(d.path()), vec![(WalPos::ZERO, first), (p, ok)]);
    }

    /// hts must strictly increase: a record whose ht is not above the last staged one is
    /// refused, naming both, with nothing written; the accepted ones read back. Holds
    /// across commits and a reopen (the last ht is recovered).
    #[test]
    fn non_increasing_ht_is_refused(
        hts in prop::collection::vec((0u64..60, any::<bool>()), 1..60),
        reopen_at in 0usize..60,
    ) {
        let d = tempfile::tempdir().unwrap();
        let mut w = Writer::open(d.path(), &tablet(), opts(8 << 10)).unwrap();
        let mut last: Option<u64> = None;
        let mut want = Vec::new();
        for (i, (ht, commit)) in hts.into_iter().enumerate() {
            if i == reopen_at {
                w.commit(SyncPolicy::Always).unwrap();
                drop(w);
                w = Writer::open(d.path(), &tablet(), opts(8 << 10)).unwrap();
                prop_assert_eq!(w.last_ht(), last.map(HybridTime));
            }
            let r = Record::new(
                HybridTime(ht),
                Body::Write { ops: vec![Op::put(vec![i as u8], vec![0u8; i * 7])], trx_id: None, gtid: None },
            );
            let staged = w.staged_pos();
            match last {
                Some(l) if ht <= l => {
                    match w.append(&r).unwrap_err() {
                        Error::NonMonotonicHt { tablet: t, ht: h, last: lh } => {
                            prop_assert_eq!(t, tablet());
                            prop_assert_eq!(h, HybridTime(ht));
                            prop_assert_eq!(lh, HybridTime(l));
                        }
                        other => prop_assert!(false, "expected NonMonotonicHt, got {}", other),
                    }
                    prop_assert_eq!(w.staged_pos(), staged);
                    prop_assert_eq!(w.last_ht(), Some(HybridTime(l)));
                }
                _ => {
                    let p = w.append(&r).unwrap();
                    want.push((p, r));
                    last = Some(ht);
                }
            }
            if commit {
                w.commit(SyncPolicy::Always).unwrap();
            }
        }
        w.commit(SyncPolicy::Always).unwrap();
        drop(w);
        prop_assert_eq!(read_back(d.path()), want);
    }

    /// Any mix of append / commit / rollback, with segments small enough that staged
    /// records rotate: what is read back is exactly what was committed; after a rollback
    /// the staged position and last ht are the committed ones (rolled-back hts are free
    /// again), and reopening finds nothing to cut and no segment beyond the log's end.
    #[test]
    fn rollback_drops_staged_records(
        actions in prop::collection::vec((0u8..10, 0usize..3000, 1u64..5), 1..80),
    ) {
        let d = tempfile::tempdir().unwrap();
        let seg = 8u64 << 10;
        let mut w = Writer::open(d.path(), &tablet(), opts(seg)).unwrap();
        let mut committed: Vec<(WalPos, Record)> = Vec::new();
        let mut staged: Vec<(WalPos, Record)> = Vec::new();
        let mut committed_ht = 0u64;
        let mut staged_ht = 0u64;
        for (i, (a, size, dht)) in actions.into_iter().enumerate() {
            match a {
                0..=5 => {
                    staged_ht += dht;
                    let r = Record::new(
                        HybridTime(staged_ht),
                        Body::Intent { txn: TxnId::from_u128(i as u128), trx_id: None, ops: vec![Op::put(b"k".to_vec(), vec![i as u8; size])] },
                    );
                    let p = w.append(&r).unwrap();
                    staged.push((p, r));
                }
                6 | 7 => {
                    let end = w.commit(SyncPolicy::Always).unwrap();
                    committed.append(&mut staged);
                    committed_ht = staged_ht;
                    prop_assert_eq!(end, w.staged_pos());
                }
                _ => {
                    w.rollback().unwrap();
                    staged.clear();
                    staged_ht = committed_ht;
                    prop_assert_eq!(w.staged_pos(), w.written_pos());
                    prop_assert_eq!(w.last_ht(), (committed_ht > 0).then_some(HybridTime(committed_ht)));
                }
            }
            // Readers only ever see the committed records.
            prop_assert_eq!(&read_back(d.path()), &committed);
        }
        w.rollback().unwrap();
        let end = w.written_pos();
        drop(w);
        let w = Writer::open(d.path(), &tablet(), opts(seg)).unwrap();
        let rep = w.recovery_report();
        prop_assert_eq!(rep.dropped_bytes, 0, "rolled-back bytes left behind: {:?}", rep);
        prop_assert_eq!(rep.end, end);
        prop_assert_eq!(w.last_ht(), (committed_ht > 0).then_some(HybridTime(committed_ht)));
        for (first, path) in segments(w.dir()) {
            prop_assert!(first <= end, "segment {} lies beyond the end {}", path.display(), end);
        }
        drop(w);
        prop_assert_eq!(&read_back(d.path()), &committed);
    }
}

// ---- the format's maximum sizes ----

/// The largest key, a tombstone with it, and `MAX_PARTICIPANTS` participants of the longest
/// names round-trip.
#[test]
fn max_key_and_participants_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d.path(), &tablet(), opts(1 << 20)).unwrap();
    let long: String = "p".repeat(64);
    let recs = [
        Record::new(
            HybridTime(1),
            Body::Write {
                ops: vec![Op::put(vec![0xa5u8; MAX_KEY_LEN], vec![1, 2, 3])],
                trx_id: Some(TrxId::new(u64::MAX, u64::MAX)),
                gtid: Some(Gtid::new(u32::MAX, u32::MAX, u64::MAX)),
            },
        ),
        Record::new(
            HybridTime(2),
            Body::Intent {
                txn: TxnId::from_u128(u128::MAX),
                trx_id: None,
                ops: vec![
                    Op::delete(vec![0u8; MAX_KEY_LEN]),
                    Op::put(Vec::new(), Vec::new()),
                ],
            },
        ),
        Record::new(
            HybridTime(3),
            Body::Commit {
                txn: TxnId::from_u128(u128::MAX),
                participants: (0..MAX_PARTICIPANTS)
                    .map(|i| format!("{i:04}{}", &long[4..]).parse().unwrap())
                    .collect(),
                trx_id: Some(TrxId::new(0, 1)),
                gtid: None,
            },
        ),
    ];
    let mut want = Vec::new();
    for r in recs {
        let p = w.append(&r).unwrap();
        want.push((p, r));
    }
    w.commit(SyncPolicy::Always).unwrap();
    drop(w);
    assert!(read_back(d.path()) == want);
}

/// A value of `MAX_VALUE_LEN`, and a body of exactly `MAX_BODY_LEN`, round-trip in segments
/// big enough; one byte more of body is refused; a record bigger than the segment is
/// refused; nothing is written by a refusal.
#[test]
fn max_value_and_body_round_trip_and_one_more_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let seg = (MAX_BODY_LEN + (1 << 20)) as u64;
    let mut w = Writer::open(d.path(), &tablet(), opts(seg)).unwrap();
    let value: Vec<u8> = (0..MAX_VALUE_LEN).map(|i| (i * 31 % 251) as u8).collect();
    let big_value = Record::new(
        HybridTime(10),
        Body::Write {
            ops: vec![Op::put(b"big".to_vec(), value.clone())],
            trx_id: None,
            gtid: None,
        },
    );
    // Body: op count (4) + 2 × (klen 4 + vlen 4) + two values = MAX_BODY_LEN.
    let second = MAX_BODY_LEN - 4 - 16 - MAX_VALUE_LEN;
    let body_of = |n2: usize| Body::Intent {
        txn: TxnId::from_u128(9),
        trx_id: None,
        ops: vec![
            Op::put(Vec::new(), value.clone()),
            Op::put(Vec::new(), vec![0x5au8; n2]),
        ],
    };
    // Intent adds a 16-byte txn id: make the body exactly MAX_BODY_LEN.
    let max_body = Record::new(HybridTime(11), body_of(second - 16));
    assert_eq!(max_body.encoded_body_len().unwrap(), MAX_BODY_LEN);
    let too_big = Record::new(HybridTime(12), body_of(second - 15));
    let staged = w.staged_pos();
    expect_too_large(
        w.append(&too_big).unwrap_err(),
        "record body",
        MAX_BODY_LEN + 1,
        MAX_BODY_LEN,
    );
    assert_eq!(w.staged_pos(), staged);
    let mut want = Vec::new();
    for r in [big_value, max_body] {
        let p = w.append(&r).unwrap();
        want.push((p, r));
        w.commit(SyncPolicy::Always).unwrap();
    }
    let end = w.written_pos();
    drop(w);
    assert!(read_back(d.path()) == want, "maximum-size records differ");

    // With small segments the same value does not fit a segment: refused, nothing written.
    let d2 = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d2.path(), &tablet(), opts(1 << 20)).unwrap();
    let e = w.append(&want[0].1).unwrap_err();
    match e {
        Error::TooLarge { what, max, .. } => {
            assert!(what.contains("segment size"), "{what}");
            assert_eq!(max, (1 << 20) - 128);
        }
        other => panic!("expected TooLarge, got {other}"),
    }
    assert_eq!(w.staged_pos(), WalPos::ZERO);
    assert_eq!(w.last_ht(), None);
    w.commit(SyncPolicy::Always).unwrap();
    assert_eq!(w.written_pos(), WalPos::ZERO);
    drop(w);
    assert!(read_back(d2.path()).is_empty());
    let _ = end;
}
