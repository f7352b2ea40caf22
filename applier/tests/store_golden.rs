//! The store's on-disk bytes, pinned: each value and key encoding of one sample of every
//! kind, against the bytes the format (drawn in `applier/STORE.md`) gives. A change of
//! layout — a field moved, a width changed, an endianness flipped — fails here even when
//! encoder and decoder change together (which the round trips of `fuzz.rs` would accept).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;

use tidelog_applier::binlog::{self, BinlogEntry, OpenKind, TrxOpen};
use tidelog_applier::store::{self, CommitInfo, Cutover, CutoverReport, IntentRef};
use tidelog_applier::store::{TabletMeta, TxnState};
use tidelog_wal::{Gtid, HybridTime, TabletId, TrxId, TxnId, WalPos};

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// One sample of every encoding, by name.
fn samples() -> Vec<(&'static str, Vec<u8>)> {
    let trx = TrxId::new(0x0102_0304_0506_0708, 0x1112_1314_1516_1718);
    let gtid = Gtid::new(0x2122_2324, 0x3132_3334, 0x4142_4344_4546_4748);
    let txn = TxnId::from_u128(0x5152_5354_5556_5758_595a_5b5c_5d5e_5f60);
    let mut full = TxnState {
        aborted: true,
        trx_id: Some(trx),
        gtid: Some(gtid),
        commit: Some(CommitInfo {
            commit_ht: HybridTime(0x77),
            tablet: t("s"),
            pos: WalPos(0x1234),
            participants: vec![t("a"), t("b")],
        }),
        open: Some((HybridTime(0x99), t("a"))),
        ..TxnState::default()
    };
    full.intents.insert(
        t("a"),
        vec![
            IntentRef {
                pos: WalPos(1),
                ht: HybridTime(2),
            },
            IntentRef {
                pos: WalPos(3),
                ht: HybridTime(4),
            },
        ],
    );
    full.intents.insert(t("b"), vec![]);
    full.applied_parts.insert(t("a"));
    let report = CutoverReport {
        lost_commits: 5,
        lost_window_ms: 6,
        tablets: BTreeMap::from([(t("a"), (HybridTime(7), 8)), (t("bb"), (HybridTime(9), 10))]),
    };
    let entry = BinlogEntry {
        commit_ht: HybridTime(0x0a0b),
        tablet: t("st"),
        trx_id: Some(trx),
        gtid: Some(gtid),
        txn: Some(txn),
        tablets: vec![t("a"), t("b")],
    };
    let bare = BinlogEntry {
        commit_ht: HybridTime(1),
        tablet: t("a"),
        trx_id: None,
        gtid: None,
        txn: None,
        tablets: vec![t("a")],
    };
    let open = |kind| TrxOpen {
        ht: HybridTime(0x0c0d),
        kind,
        txn,
        tablet: t("a"),
    };
    vec![
        ("value tombstone", store::encode_value(None)),
        ("value put", store::encode_value(Some(b"ab"))),
        (
            "tablet meta",
            store::encode_tablet_meta(&TabletMeta {
                applied_pos: WalPos(0x0102),
                safe_time: HybridTime(0x0304),
                registered: false,
                owner: None,
                applied_records: 0x0506,
            })
            .unwrap(),
        ),
        (
            "tablet meta owner",
            store::encode_tablet_meta(&TabletMeta {
                applied_pos: WalPos(1),
                safe_time: HybridTime(2),
                registered: true,
                owner: Some("h1".into()),
                applied_records: 3,
            })
            .unwrap(),
        ),
        (
            "cutover",
            store::encode_cutover(&Cutover {
                cut: HybridTime(0x0102),
                cut_time_us: 0x0304,
                report: None,
                cleaned: false,
            })
            .unwrap(),
        ),
        (
            "cutover report cleaned",
            store::encode_cutover(&Cutover {
                cut: HybridTime(1),
                cut_time_us: 2,
                report: Some(report),
                cleaned: true,
            })
            .unwrap(),
        ),
        (
            "txn empty",
            store::encode_txn(&TxnState::default()).unwrap(),
        ),
        ("txn full", store::encode_txn(&full).unwrap()),
        ("binlog entry", binlog::encode_entry(&entry).unwrap()),
        ("binlog entry bare", binlog::encode_entry(&bare).unwrap()),
        ("trx commit", binlog::encode_commit(&entry)),
        ("trx commit bare", binlog::encode_commit(&bare)),
        ("gtid", binlog::encode_gtid(&entry, gtid)),
        ("gtid bare", binlog::encode_gtid(&bare, gtid)),
        (
            "trx_open pending",
            binlog::encode_open(&open(OpenKind::Pending)),
        ),
        (
            "trx_open aborted",
            binlog::encode_open(&open(OpenKind::Aborted)),
        ),
        (
            "binlog key",
            binlog::binlog_key(HybridTime(0x0102), &t("st")),
        ),
        ("trx key", binlog::trx_key(trx).to_vec()),
        ("gtid key", binlog::gtid_key(0x0102_0304, 0x0506).to_vec()),
        (
            "open_aborts key",
            binlog::open_abort_key(HybridTime(0x0a), trx),
        ),
    ]
}

/// The bytes of each sample, as the format gives them.
const GOLDEN: &[(&str, &str)] = &[
    ("value tombstone", "00"),
    ("value put", "016162"),
    ("tablet meta", "0100020100000000000004030000000000000605000000000000"),
    ("tablet meta owner", "0103010000000000000002000000000000000300000000000000026831"),
    ("cutover", "010002010000000000000403000000000000"),
    ("cutover report cleaned", "01030100000000000000020000000000000005000000000000000600000000000000020001610700000000000000080000000000000002626209000000000000000a00000000000000"),
    ("txn empty", "01000000"),
    ("txn full", "013f0807060504030201181716151413121124232221343332314847464544434241770000000000000034120000000000000173020001610162020001610200000001000000000000000200000000000000030000000000000004000000000000000162000000000100016199000000000000000161"),
    ("binlog entry", "010708070605040302011817161514131211242322213433323148474645444342415152535455565758595a5b5c5d5e5f60020001610162"),
    ("binlog entry bare", "010001000161"),
    ("trx commit", "01060b0a000000000000027374242322213433323148474645444342415152535455565758595a5b5c5d5e5f60"),
    ("trx commit bare", "010001000000000000000161"),
    ("gtid", "0101343332310b0a00000000000002737408070605040302011817161514131211"),
    ("gtid bare", "01003433323101000000000000000161"),
    ("trx_open pending", "01010d0c00000000000001615152535455565758595a5b5c5d5e5f60"),
    ("trx_open aborted", "01020d0c00000000000001615152535455565758595a5b5c5d5e5f60"),
    ("binlog key", "00000000000001027374"),
    ("trx key", "01020304050607081112131415161718"),
    ("gtid key", "010203040000000000000506"),
    ("open_aborts key", "000000000000000a01020304050607081112131415161718"),
];

#[test]
fn encodings_are_the_documented_bytes() {
    let got = samples();
    if std::env::var_os("GOLDEN_PRINT").is_some() {
        for (name, b) in &got {
            println!("    (\"{name}\", \"{}\"),", hex(b));
        }
    }
    assert_eq!(
        got.len(),
        GOLDEN.len(),
        "samples and golden bytes differ in number"
    );
    for ((name, b), (gname, want)) in got.iter().zip(GOLDEN) {
        assert_eq!(name, gname);
        assert_eq!(hex(b), *want, "{name}");
    }
}
