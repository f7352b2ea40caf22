//! Fuzz-style property tests of every decoder of the applier's store: the MVCC key encoding
//! (`keys`), the stored value of a version, a tablet's meta record, the cutover, a
//! transaction's state (`TX_*` flags), the binlog entry and its `trx`, `gtid`, `trx_open`
//! and `open_aborts` index records — and, through a real store, arbitrary bytes under each
//! key the store reads (`store_with_arbitrary_values`).
//!
//! Each decoder never panics on arbitrary bytes and answers an error that says what and
//! where; what it accepts re-encodes to the very bytes it was given (so a mutated value
//! either decodes to what was encoded or is refused); and `decode(encode(x)) == x` for
//! arbitrary `x`. The received logs the applier reads are WAL segments: their decoders are
//! fuzzed by `wal/tests/fuzz.rs`.
//!
//! CI runs the short form (`cargo test -p tidelog-applier --test fuzz`). The long form runs
//! 100 000 cases of each codec property (`store_with_arbitrary_values` opens a store per
//! case: 20 000):
//!
//! ```text
//! TMPDIR=/dev/shm cargo test --release -p tidelog-applier --test fuzz -- --ignored --nocapture --test-threads 1
//! ```
//!
//! `FUZZ_CASES=N` sets the case count of either form and `FUZZ_SEED=S` replays a run.
#![allow(clippy::unwrap_used)]

#[path = "../../wal/tests/common/fuzzkit.rs"]
mod fuzzkit;

use fuzzkit::*;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use tidelog_applier::binlog::{self, BinlogEntry, OpenKind, TrxCommit, TrxOpen};
use tidelog_applier::keys;
use tidelog_applier::store::{self, CommitInfo, Cutover, CutoverReport, IntentRef, Store};
use tidelog_applier::store::{TabletMeta, TxnState};
use tidelog_wal::{HybridTime, TabletId, TrxId, TxnId, WalPos};

fuzz_tests! {
    keys_decode: 1000;
    keys_round_trip: 300;
    value_decode: 1000;
    value_round_trip: 300;
    tablet_meta_decode: 1000;
    tablet_meta_round_trip: 300;
    cutover_decode: 1000;
    cutover_round_trip: 300;
    txn_decode: 1000;
    txn_round_trip: 300;
    binlog_entry_decode: 1000;
    binlog_entry_round_trip: 300;
    trx_commit_decode: 1000;
    gtid_entry_decode: 1000;
    trx_open_decode: 1000;
    trx_open_round_trip: 300;
    open_abort_key_decode: 1000;
    store_with_arbitrary_values: 3, 20_000;
}

/// What a decoder refuses it refuses with a reason.
fn refused(reason: &str) -> Result<(), TestCaseError> {
    prop_assert!(!reason.trim().is_empty(), "refused without a reason");
    Ok(())
}

/// Decoding gave a value: its encoding must be the very bytes decoded.
fn canonical(again: &[u8], input: &[u8]) -> Result<(), TestCaseError> {
    prop_assert_eq!(again, input, "decoded bytes that encode differently");
    Ok(())
}

fn ht() -> impl Strategy<Value = HybridTime> {
    prop_oneof![
        Just(HybridTime(0)),
        Just(HybridTime(u64::MAX)),
        any::<u64>().prop_map(HybridTime)
    ]
}

fn pos() -> impl Strategy<Value = WalPos> {
    prop_oneof![0u64..1 << 30, any::<u64>()].prop_map(WalPos)
}

fn tablets() -> impl Strategy<Value = Vec<TabletId>> {
    prop::collection::vec(tablet_id(), 0..5)
}

/// A codec's decoder on random bytes and on mutated encodings of `values`: what it accepts
/// re-encodes to the very bytes decoded, what it refuses has a reason.
fn decodes_canonically<T: std::fmt::Debug>(
    name: &str,
    cases: u32,
    values: impl Strategy<Value = T> + 'static,
    max_random: usize,
    encode: fn(&T) -> Vec<u8>,
    decode: fn(&[u8]) -> Result<T, String>,
) {
    let valid = values.prop_map(move |v| encode(&v));
    check(
        name,
        cases,
        random_or_mutated(valid, max_random),
        |(_, b)| {
            match decode(&b) {
                Ok(v) => canonical(&encode(&v), &b)?,
                Err(r) => refused(&r)?,
            }
            Ok(())
        },
    );
}

/// `decode(encode(v)) == v` for every `v` of `values`.
fn round_trips<T: std::fmt::Debug + PartialEq>(
    name: &str,
    cases: u32,
    values: impl Strategy<Value = T>,
    encode: fn(&T) -> Vec<u8>,
    decode: fn(&[u8]) -> Result<T, String>,
) {
    check(name, cases, values, |v| {
        let b = encode(&v);
        prop_assert_eq!(decode(&b), Ok(v));
        Ok(())
    });
}

/// The two properties of each value codec: `decodes_canonically` and `round_trips`.
macro_rules! codec_properties {
    ($($decode_name:ident, $round_trip_name:ident: $values:expr, $max:expr, $encode:expr, $decode:expr;)*) => {$(
        fn $decode_name(cases: u32) {
            decodes_canonically(stringify!($decode_name), cases, $values, $max, $encode, $decode);
        }
        fn $round_trip_name(cases: u32) {
            round_trips(stringify!($round_trip_name), cases, $values, $encode, $decode);
        }
    )*};
}

codec_properties! {
    value_decode, value_round_trip: value(), 40, |v| store::encode_value(v.as_deref()), store::decode_value;
    tablet_meta_decode, tablet_meta_round_trip: tablet_meta(), 60, |m| store::encode_tablet_meta(m).unwrap(), store::decode_tablet_meta;
    cutover_decode, cutover_round_trip: cutover(), 80, |c| store::encode_cutover(c).unwrap(), store::decode_cutover;
    txn_decode, txn_round_trip: txn_state(), 120, |st| store::encode_txn(st).unwrap(), store::decode_txn;
    trx_open_decode, trx_open_round_trip: trx_open(), 100, binlog::encode_open, binlog::decode_open;
}

// ---- keys ----------------------------------------------------------------------------------

/// User keys rich in the escape bytes.
fn user_key() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(
        prop_oneof![Just(0u8), Just(1), Just(0xFF), any::<u8>()],
        0..24,
    )
}

fn keys_decode(cases: u32) {
    let valid = (user_key(), ht()).prop_map(|(k, h)| keys::encode(&k, h));
    check(
        "keys_decode",
        cases,
        random_or_mutated(valid, 40),
        |(_, b)| {
            match keys::decode(&b) {
                Ok((k, h)) => {
                    canonical(&keys::encode(&k, h), &b)?;
                    let (user, h2) =
                        keys::split(&b).map_err(|e| TestCaseError::fail(e.to_string()))?;
                    prop_assert_eq!(user, &keys::encode_user_key(&k)[..]);
                    prop_assert_eq!(h2, h);
                }
                Err(e) => {
                    refused(&e.to_string())?;
                    prop_assert_eq!(keys::split(&b).err(), Some(e));
                }
            }
            Ok(())
        },
    );
}

fn keys_round_trip(cases: u32) {
    check("keys_round_trip", cases, (user_key(), ht()), |(k, h)| {
        let e = keys::encode(&k, h);
        prop_assert_eq!(keys::decode(&e), Ok((k.clone(), h)));
        let (lo, hi) = keys::visible_range(&k, h);
        prop_assert!(lo <= e && e < hi);
        Ok(())
    });
}

// ---- store values --------------------------------------------------------------------------

/// A version's value: `None` is a delete.
fn value() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop::option::of(prop::collection::vec(any::<u8>(), 0..40))
}

fn tablet_meta() -> impl Strategy<Value = TabletMeta> {
    (
        pos(),
        ht(),
        any::<bool>(),
        prop::option::of(prop_oneof![
            "[a-z0-9-]{0,20}",
            any::<String>().prop_filter("≤ 255 bytes", |s| s.len() <= 255),
        ]),
        any::<u64>(),
    )
        .prop_map(
            |(applied_pos, safe_time, registered, owner, applied_records)| TabletMeta {
                applied_pos,
                safe_time,
                registered,
                owner,
                applied_records,
            },
        )
}

fn cutover() -> impl Strategy<Value = Cutover> {
    let report = (
        any::<u64>(),
        any::<u64>(),
        prop::collection::btree_map(tablet_id(), (ht(), any::<u64>()), 0..5),
    )
        .prop_map(|(lost_commits, lost_window_ms, tablets)| CutoverReport {
            lost_commits,
            lost_window_ms,
            tablets,
        });
    (ht(), any::<u64>(), prop::option::of(report), any::<bool>()).prop_map(
        |(cut, cut_time_us, report, cleaned)| Cutover {
            cut,
            cut_time_us,
            report,
            cleaned,
        },
    )
}

/// A transaction's state as the store keeps it (`untraceable` is memory only).
fn txn_state() -> impl Strategy<Value = TxnState> {
    let intent = (pos(), ht()).prop_map(|(pos, ht)| IntentRef { pos, ht });
    let commit =
        (ht(), tablet_id(), pos(), tablets()).prop_map(|(commit_ht, tablet, pos, participants)| {
            CommitInfo {
                commit_ht,
                tablet,
                pos,
                participants,
            }
        });
    (
        prop::collection::btree_map(tablet_id(), prop::collection::vec(intent, 0..4), 0..4),
        prop::option::of(commit),
        any::<bool>(),
        trx(),
        gtid(),
        prop::collection::btree_set(tablet_id(), 0..4),
        prop::option::of((ht(), tablet_id())),
    )
        .prop_map(
            |(intents, commit, aborted, trx_id, gtid, applied_parts, open)| TxnState {
                intents,
                commit,
                aborted,
                trx_id,
                gtid,
                applied_parts,
                open,
                untraceable: false,
            },
        )
}

// ---- binlog and its indexes ----------------------------------------------------------------

fn binlog_entry() -> impl Strategy<Value = BinlogEntry> {
    (
        ht(),
        tablet_id(),
        trx(),
        gtid(),
        prop::option::of(txn()),
        tablets(),
    )
        .prop_map(
            |(commit_ht, tablet, trx_id, gtid, txn, tablets)| BinlogEntry {
                commit_ht,
                tablet,
                trx_id,
                gtid,
                txn,
                tablets,
            },
        )
}

/// A stored record's key and value: random, or valid ones with either mutated.
fn key_and_value(
    valid: impl Strategy<Value = (Vec<u8>, Vec<u8>)> + 'static,
) -> impl Strategy<Value = (Vec<u8>, Vec<u8>)> {
    let valid = valid.boxed();
    prop_oneof![
        (
            prop::collection::vec(any::<u8>(), 0..40),
            prop::collection::vec(any::<u8>(), 0..80)
        ),
        (valid.clone(), mutations()).prop_map(|((k, v), ms)| (mutate(&k, &ms), v)),
        (valid, mutations()).prop_map(|((k, v), ms)| (k, mutate(&v, &ms))),
    ]
}

/// A keyed record's decoder on random keys and values and on valid ones with either
/// mutated: what it accepts encodes (`again`) to the very key and value decoded.
fn key_value_decodes_canonically<T>(
    name: &str,
    cases: u32,
    valid: impl Strategy<Value = (Vec<u8>, Vec<u8>)> + 'static,
    decode: fn(&[u8], &[u8]) -> Result<T, String>,
    again: fn(T) -> (Vec<u8>, Vec<u8>),
) {
    check(name, cases, key_and_value(valid), |(k, v)| {
        match decode(&k, &v) {
            Ok(x) => {
                let (k2, v2) = again(x);
                canonical(&k2, &k)?;
                canonical(&v2, &v)?;
            }
            Err(r) => refused(&r)?,
        }
        Ok(())
    });
}

fn entry_key_value(e: &BinlogEntry) -> (Vec<u8>, Vec<u8>) {
    (
        binlog::binlog_key(e.commit_ht, &e.tablet),
        binlog::encode_entry(e).unwrap(),
    )
}

fn binlog_entry_decode(cases: u32) {
    let valid = binlog_entry().prop_map(|e| entry_key_value(&e));
    key_value_decodes_canonically(
        "binlog_entry_decode",
        cases,
        valid,
        binlog::decode_entry,
        |e| entry_key_value(&e),
    );
}

fn binlog_entry_round_trip(cases: u32) {
    check("binlog_entry_round_trip", cases, binlog_entry(), |e| {
        let (k, v) = entry_key_value(&e);
        prop_assert_eq!(binlog::decode_entry(&k, &v), Ok(e.clone()));
        let c = binlog::decode_commit(&binlog::encode_commit(&e)).map_err(TestCaseError::fail)?;
        prop_assert_eq!(
            (c.commit_ht, &c.tablet, c.gtid, c.txn),
            (e.commit_ht, &e.tablet, e.gtid, e.txn)
        );
        if let Some(g) = e.gtid {
            let ge = binlog::decode_gtid(
                &binlog::gtid_key(g.domain, g.seq),
                &binlog::encode_gtid(&e, g),
            )
            .map_err(TestCaseError::fail)?;
            prop_assert_eq!(
                (ge.gtid, ge.commit_ht, &ge.tablet, ge.trx_id),
                (g, e.commit_ht, &e.tablet, e.trx_id)
            );
        }
        Ok(())
    });
}

/// The `trx` index record of a commit (carrier, commit_ht, gtid?, txn?), as written.
fn commit_bytes(c: &TrxCommit) -> Vec<u8> {
    binlog::encode_commit(&BinlogEntry {
        commit_ht: c.commit_ht,
        tablet: c.tablet.clone(),
        trx_id: None,
        gtid: c.gtid,
        txn: c.txn,
        tablets: Vec::new(),
    })
}

fn trx_commit_decode(cases: u32) {
    let commits = binlog_entry().prop_map(|e| TrxCommit {
        commit_ht: e.commit_ht,
        tablet: e.tablet,
        gtid: e.gtid,
        txn: e.txn,
    });
    decodes_canonically(
        "trx_commit_decode",
        cases,
        commits,
        120,
        commit_bytes,
        binlog::decode_commit,
    );
}

/// The `gtid` index record (key: domain and seq; value: server, commit_ht, carrier, trx_id?).
fn gtid_entry_decode(cases: u32) {
    let valid = (binlog_entry(), any::<(u32, u32, u64)>()).prop_map(|(e, (d, s, q))| {
        let g = tidelog_wal::Gtid::new(d, s, q);
        (binlog::gtid_key(d, q).to_vec(), binlog::encode_gtid(&e, g))
    });
    key_value_decodes_canonically(
        "gtid_entry_decode",
        cases,
        valid,
        binlog::decode_gtid,
        |ge| {
            let e = BinlogEntry {
                commit_ht: ge.commit_ht,
                tablet: ge.tablet,
                trx_id: ge.trx_id,
                gtid: Some(ge.gtid),
                txn: None,
                tablets: Vec::new(),
            };
            (
                binlog::gtid_key(ge.gtid.domain, ge.gtid.seq).to_vec(),
                binlog::encode_gtid(&e, ge.gtid),
            )
        },
    );
}

fn trx_open() -> impl Strategy<Value = TrxOpen> {
    (ht(), any::<bool>(), txn(), tablet_id()).prop_map(|(ht, aborted, txn, tablet)| TrxOpen {
        ht,
        kind: if aborted {
            OpenKind::Aborted
        } else {
            OpenKind::Pending
        },
        txn,
        tablet,
    })
}

fn open_abort_key_decode(cases: u32) {
    let valid =
        (ht(), trx()).prop_map(|(h, t)| binlog::open_abort_key(h, t.unwrap_or(TrxId::new(1, 1))));
    check(
        "open_abort_key_decode",
        cases,
        random_or_mutated(valid, 40),
        |(_, k)| {
            if let Some((h, t)) = binlog::decode_open_abort_key(&k) {
                canonical(&binlog::open_abort_key(h, t), &k)?;
            }
            Ok(())
        },
    );
}

// ---- through a store -----------------------------------------------------------------------

/// A valid key of keyspace `ks` (`meta`: the key `meta_key`) and a valid value for it.
fn stored(ks: &'static str, meta_key: Vec<u8>) -> (Vec<u8>, Vec<u8>) {
    let t1: TabletId = "t1".parse().unwrap();
    let e = BinlogEntry {
        commit_ht: HybridTime(5),
        tablet: t1.clone(),
        trx_id: Some(TrxId::new(7, 1)),
        gtid: Some(tidelog_wal::Gtid::new(0, 1, 1)),
        txn: Some(TxnId([7; 16])),
        tablets: vec![t1.clone()],
    };
    let meta = |k: &[u8]| match k {
        b"global/role" => vec![1],
        b"global/cutover" => store::encode_cutover(&Cutover {
            cut: HybridTime(5),
            cut_time_us: 1,
            report: Some(CutoverReport::default()),
            cleaned: false,
        })
        .unwrap(),
        b"global/safe_time" | b"global/binlog_horizon" => 5u64.to_le_bytes().to_vec(),
        _ => store::encode_tablet_meta(&TabletMeta {
            registered: true,
            owner: Some("s1".into()),
            ..TabletMeta::default()
        })
        .unwrap(),
    };
    let txn = TxnState {
        intents: [(
            t1.clone(),
            vec![IntentRef {
                pos: WalPos(0),
                ht: HybridTime(4),
            }],
        )]
        .into(),
        trx_id: e.trx_id,
        applied_parts: [t1.clone()].into(),
        ..TxnState::default()
    };
    let trx = binlog::trx_key(TrxId::new(7, 1)).to_vec();
    match ks {
        store::META => (meta_key.clone(), meta(&meta_key)),
        store::MVCC => (
            keys::encode(b"k", HybridTime(5)),
            store::encode_value(Some(b"v")),
        ),
        store::TXNS => ([7u8; 16].to_vec(), store::encode_txn(&txn).unwrap()),
        store::ABORTED => ([7u8; 16].to_vec(), Vec::new()),
        binlog::BINLOG => (
            binlog::binlog_key(e.commit_ht, &t1),
            binlog::encode_entry(&e).unwrap(),
        ),
        binlog::TRX => (trx, binlog::encode_commit(&e)),
        binlog::TRX_OPEN => {
            let o = TrxOpen {
                ht: HybridTime(5),
                kind: OpenKind::Aborted,
                txn: TxnId([7; 16]),
                tablet: t1,
            };
            (trx, binlog::encode_open(&o))
        }
        binlog::GTID => (
            binlog::gtid_key(0, 1).to_vec(),
            binlog::encode_gtid(&e, e.gtid.unwrap()),
        ),
        _ => (
            binlog::open_abort_key(HybridTime(5), TrxId::new(7, 1)),
            Vec::new(),
        ),
    }
}

/// Where arbitrary bytes go in a store: a keyspace the store reads, a key it reads there (or
/// arbitrary bytes where keys are scanned), and a value that is random or a valid one
/// mutated.
fn store_target() -> impl Strategy<Value = (&'static str, Vec<u8>, Vec<u8>)> {
    let bytes = |n| prop::collection::vec(any::<u8>(), 1..n);
    let meta_key = prop_oneof![
        Just(b"global/safe_time".to_vec()),
        Just(b"global/role".to_vec()),
        Just(b"global/binlog_horizon".to_vec()),
        Just(b"global/cutover".to_vec()),
        Just(b"global/cutover_cursor".to_vec()),
        Just(b"tablet/t1".to_vec()),
        bytes(24).prop_map(|b| [&b"tablet/"[..], &b].concat()),
    ];
    let keyspace = prop_oneof![
        Just(store::META),
        Just(store::TXNS),
        Just(store::MVCC),
        Just(store::ABORTED),
        Just(binlog::BINLOG),
        Just(binlog::TRX),
        Just(binlog::TRX_OPEN),
        Just(binlog::GTID),
        Just(binlog::OPEN_ABORTS),
    ];
    (keyspace, meta_key).prop_flat_map(move |(ks, meta_key)| {
        let (key, value) = stored(ks, meta_key);
        // Keyspaces read by scans take any key too.
        let scanned = matches!(
            ks,
            store::MVCC | binlog::BINLOG | binlog::GTID | binlog::OPEN_ABORTS
        );
        let key = if scanned {
            prop_oneof![3 => Just(key), 1 => bytes(32)].boxed()
        } else {
            Just(key).boxed()
        };
        let value = prop_oneof![
            1 => bytes(64),
            3 => mutations().prop_map(move |ms| mutate(&value, &ms)),
        ];
        (Just(ks), key, value)
    })
}

/// A store holding arbitrary bytes under one key it reads: it opens, or refuses naming the
/// keyspace; every read answers or refuses the same way; none panics.
fn store_with_arbitrary_values(cases: u32) {
    let input = prop::collection::vec(store_target(), 1..4);
    check("store_with_arbitrary_values", cases, input, |targets| {
        let d = tempfile::tempdir().unwrap();
        let s = Store::open(d.path()).unwrap();
        let t1: TabletId = "t1".parse().unwrap();
        s.register_tablet(&t1).unwrap();
        drop(s);
        {
            let db = fjall::Database::builder(d.path().join("store"))
                .open()
                .unwrap();
            for (ks, k, v) in &targets {
                let ks = db
                    .keyspace(ks, fjall::KeyspaceCreateOptions::default)
                    .unwrap();
                ks.insert(k.clone(), v.clone()).unwrap();
            }
            db.persist(fjall::PersistMode::SyncAll).unwrap();
        }
        let named = |e: &dyn std::fmt::Display| -> Result<(), TestCaseError> {
            let text = e.to_string();
            prop_assert!(!text.trim().is_empty());
            if text.contains("corrupt") {
                prop_assert!(
                    targets.iter().any(|(ks, _, _)| text.contains(ks)),
                    "{text} names none of {:?}",
                    targets.iter().map(|t| t.0).collect::<Vec<_>>()
                );
            }
            Ok(())
        };
        let s = match Store::open(d.path()) {
            Ok(s) => s,
            Err(e) => return named(&e),
        };
        let gtid_key = targets
            .iter()
            .find(|t| t.0 == binlog::GTID && t.1.len() == 12)
            .map(|t| {
                let d = u32::from_be_bytes(t.1[..4].try_into().unwrap());
                (d, u64::from_be_bytes(t.1[4..].try_into().unwrap()))
            })
            .unwrap_or((0, 0));
        let bl = s.binlog().unwrap();
        let results: Vec<Result<(), tidelog_applier::error::Error>> = vec![
            s.tablets().map(drop),
            s.tablet(&t1).map(drop),
            s.global_safe_time().map(drop),
            s.role().map(drop),
            s.cutover().map(drop),
            s.binlog_horizon().map(drop),
            s.get(b"k", None).map(drop),
            s.scan(b"", None, 100).map(drop),
            s.txn_state(&TxnId([7; 16])).map(drop),
            bl.trx_commit(TrxId::new(7, 1)).map(drop),
            bl.trx_open(TrxId::new(7, 1)).map(drop),
            bl.gtid(gtid_key.0, gtid_key.1).map(drop),
            bl.read(None, HybridTime::MAX, 100).map(drop),
            bl.last_commit_ht().map(drop),
            bl.domains().map(drop),
            s.expire_binlog(HybridTime::MAX, 100).map(drop),
        ];
        for r in results {
            if let Err(e) = r {
                named(&e)?;
            }
        }
        Ok(())
    });
}

#[test]
fn the_generators_cover_every_tx_flag() {
    // The txn generator reaches every flag bit the decoder knows (commit, aborted, trx_id,
    // gtid, applied parts, open), so the fuzz runs see each branch.
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut seen = 0u8;
    for _ in 0..400 {
        let st =
            proptest::strategy::ValueTree::current(&txn_state().new_tree(&mut runner).unwrap());
        seen |= store::encode_txn(&st).unwrap()[1];
    }
    assert_eq!(seen, 0b11_1111);
}

/// `bytes` with the one-byte tablet names `a` and `b` (each after its length byte 1) swapped
/// (`dup`: both made `a`).
fn reorder_names(bytes: &[u8], dup: bool) -> Vec<u8> {
    let mut b = bytes.to_vec();
    let at = |b: &[u8], name: u8| b.windows(2).position(|w| w == [1, name]).unwrap() + 1;
    let (ia, ib) = (at(&b, b'a'), at(&b, b'b'));
    b[ia] = if dup { b'a' } else { b'b' };
    b[ib] = b'a';
    b
}

/// The tablets of a cutover report, of a transaction's intents and of its applied parts are
/// stored in ascending order, once each: any other order, or a tablet twice, is refused
/// (decoded, it would re-encode to other bytes).
#[test]
fn tablet_lists_out_of_order_or_repeated_are_refused() {
    let (a, b): (TabletId, TabletId) = ("a".parse().unwrap(), "b".parse().unwrap());
    let c = Cutover {
        cut: HybridTime(9),
        cut_time_us: 1,
        report: Some(CutoverReport {
            lost_commits: 0,
            lost_window_ms: 0,
            tablets: [
                (a.clone(), (HybridTime(1), 2)),
                (b.clone(), (HybridTime(3), 4)),
            ]
            .into(),
        }),
        cleaned: false,
    };
    let intents = TxnState {
        intents: [(a.clone(), Vec::new()), (b.clone(), Vec::new())].into(),
        ..TxnState::default()
    };
    let parts = TxnState {
        applied_parts: [a.clone(), b.clone()].into(),
        ..TxnState::default()
    };
    for dup in [false, true] {
        let e = store::decode_cutover(&reorder_names(&store::encode_cutover(&c).unwrap(), dup))
            .unwrap_err();
        assert!(e.contains("does not follow") && e.contains("byte"), "{e}");
        for st in [&intents, &parts] {
            let bytes = reorder_names(&store::encode_txn(st).unwrap(), dup);
            let e = store::decode_txn(&bytes).unwrap_err();
            assert!(e.contains("does not follow") && e.contains("byte"), "{e}");
        }
    }
}
