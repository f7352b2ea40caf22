//! Records that passed their checksum but that the store cannot take (keys too long for its
//! key encoding): refused with a named error, never a panic; only their own tablet stops,
//! exactly at them, also after a restart.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidelog_applier::apply::{ApplyConfig, ApplyThreads, ApplyWorker};
use tidelog_applier::consistency::Consistency;
use tidelog_applier::error::{Error, APPLY_FAILED, RECORD_REJECTED};
use tidelog_applier::store::{Durability, Store};
use tidelog_wal::format::{record_checksum, MAX_KEY_LEN, RECORD_HEADER_LEN};
use tidelog_wal::{
    Body, HybridTime, Op, Record, SyncPolicy, TabletId, TxnId, WalOptions, WalPos, Writer,
};

const DEADLINE: Duration = Duration::from_secs(30);

fn t(s: &str) -> TabletId {
    s.parse().unwrap()
}

fn put(key: Vec<u8>) -> Body {
    Body::Write {
        ops: vec![Op::put(key, b"v".to_vec())],
        trx_id: None,
        gtid: None,
    }
}

/// A write or intent record of one op encoded at `pos` by hand, as a source with a larger
/// key limit than this build's (or a damaged one whose checksum still matches) would have
/// written it: the WAL writer's own limits are not applied.
fn encode_raw(pos: WalPos, ht: u64, txn: Option<TxnId>, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some(txn) = txn {
        body.extend_from_slice(&txn.0);
    }
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&(key.len() as u32).to_le_bytes());
    body.extend_from_slice(&(value.len() as u32).to_le_bytes());
    body.extend_from_slice(key);
    body.extend_from_slice(value);
    let mut rec = vec![0u8; RECORD_HEADER_LEN];
    rec[8..12].copy_from_slice(&(body.len() as u32).to_le_bytes());
    rec[12] = if txn.is_some() { 2 } else { 1 };
    rec[16..24].copy_from_slice(&ht.to_le_bytes());
    rec[24..32].copy_from_slice(&pos.0.to_le_bytes());
    rec.extend_from_slice(&body);
    let sum = record_checksum(&rec);
    rec[..8].copy_from_slice(&sum.to_le_bytes());
    rec
}

/// Appends records to `tablet`'s log under `root`, each `(ht, txn, key)` with value `v`;
/// returns their positions and the log's end.
fn append(
    root: &Path,
    tablet: &TabletId,
    recs: &[(u64, Option<TxnId>, Vec<u8>)],
) -> (Vec<WalPos>, WalPos) {
    let mut w = Writer::open(root, tablet, WalOptions::default()).unwrap();
    let mut pos = Vec::new();
    for (ht, txn, key) in recs {
        let at = w.staged_pos();
        w.append_encoded(&encode_raw(at, *ht, *txn, key, b"v"))
            .unwrap();
        pos.push(at);
    }
    let end = w.commit(SyncPolicy::Always).unwrap();
    (pos, end)
}

fn wait_stopped(w: &ApplyWorker, what: &str) {
    let deadline = Instant::now() + DEADLINE;
    while w.is_running() {
        assert!(Instant::now() < deadline, "{what}");
        w.wait_applied(WalPos(u64::MAX), Duration::from_millis(100));
    }
}

/// The store refuses, with an error naming the tablet, the record's position and the key's
/// size, any key whose encoding is longer than fjall takes (fjall asserts on it, which
/// panicked the apply worker), whatever the WAL's own key limit is; it takes the longest
/// key the WAL allows, NUL bytes and all.
#[test]
fn store_refuses_keys_too_long_for_its_encoding_and_takes_the_longest_the_wal_allows() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    let tablet = t("k2");
    let pos = WalPos(4096);
    let assert_rejected = |e: &Error, len: usize| {
        let msg = e.to_string();
        assert!(
            matches!(e, Error::Rejected { pos: p, .. } if *p == pos),
            "{msg}"
        );
        assert_eq!(e.tablet_state(), RECORD_REJECTED);
        assert!(
            msg.contains("tablet k2")
                && msg.contains(&format!("position {pos}"))
                && msg.contains(&len.to_string()),
            "{msg}"
        );
    };
    // The store's own limit, exactly: 65 535 bytes encoded.
    for (key, fits) in [
        (vec![b'K'; 65_526], false),
        (vec![0u8; 32_763], false),
        (vec![b'K'; 65_525], true),
        (vec![0u8; 32_762], true),
    ] {
        let len = key.len();
        let rec = Record::new(HybridTime(1000), put(key));
        match Store::check_record(&tablet, pos, &rec) {
            Ok(()) => assert!(fits, "a key of {len} bytes passed"),
            Err(e) => {
                assert!(!fits, "{e}");
                assert_rejected(&e, len);
                assert!(
                    e.to_string().contains(&format!("a key of {len} bytes")),
                    "{e}"
                );
            }
        }
    }
    // Handed to `apply` (as a build with a larger WAL key limit would read them): refused,
    // by the WAL's limit or the store's, and nothing of them applied.
    for key in [vec![b'K'; 65_526], vec![0u8; 32_763]] {
        let len = key.len();
        let rec = Record::new(HybridTime(1000), put(key));
        let e = s
            .apply(&tablet, &[(pos, rec)], pos.add(100), Durability::Buffered)
            .unwrap_err();
        assert_rejected(&e, len);
        assert!(s
            .tablet(&tablet)
            .unwrap()
            .is_none_or(|m| m.applied_pos == WalPos::ZERO));
    }
    // The longest key the WAL allows, every byte NUL, is stored and read back.
    let key = vec![0u8; MAX_KEY_LEN];
    let rec = Record::new(HybridTime(2000), put(key.clone()));
    let end = pos.add((RECORD_HEADER_LEN + rec.encoded_body_len().unwrap()) as u64);
    s.apply(&tablet, &[(pos, rec)], end, Durability::Buffered)
        .unwrap();
    let v = s.get(&key, None).unwrap().unwrap();
    assert_eq!(
        (v.value.as_deref(), v.ht),
        (Some(&b"v"[..]), HybridTime(2000))
    );
}

/// The state a key of `len` bytes stops its tablet in: the store refuses it
/// (`record_rejected`) where the WAL's key limit lets it be read; where it does not, the
/// received log's reader does (`apply_failed`: the record does not decode).
fn long_key_state(len: usize) -> &'static str {
    if len <= MAX_KEY_LEN {
        RECORD_REJECTED
    } else {
        APPLY_FAILED
    }
}

/// A record that cannot be applied (its key is too long for the store, or for this
/// build's WAL limit so that it does not decode) stops only its own tablet, exactly at the
/// record: what precedes it is applied, nothing of it or after it; the tablet's safe time stays at its last applied
/// record (holding the global one there) while the other tablets on the same apply thread
/// go on. An intent is refused when it is read, not later at its commit. After a restart
/// the same record is refused the same way, without a panic.
#[test]
fn a_rejected_record_stops_only_its_tablet_exactly_there_also_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let received = dir.path().join("received");
    let (k2, k3, t1) = (t("k2"), t("k3"), t("t1"));
    let txn = TxnId::from_u128(7);
    let (k2_pos, k2_end) = append(
        &received,
        &k2,
        &[
            (100, None, b"k2/a".to_vec()),
            (110, None, vec![b'K'; 65_526]),
            (120, None, b"k2/c".to_vec()),
        ],
    );
    let (k3_pos, _) = append(
        &received,
        &k3,
        &[
            (101, None, b"k3/a".to_vec()),
            (111, Some(txn), vec![0u8; 32_763]),
        ],
    );
    let (_, t1_end) = append(
        &received,
        &t1,
        &(0..50)
            .map(|i| (200 + i, None, format!("t1/{i}").into_bytes()))
            .collect::<Vec<_>>(),
    );
    for attempt in 0..2 {
        let store = Arc::new(Store::open(dir.path()).unwrap());
        let c = Consistency::start(store.clone(), vec![]).unwrap();
        let group = Arc::new(ApplyThreads::new(1, "apply-rejected").unwrap());
        let mut workers: Vec<ApplyWorker> = [&k2, &k3, &t1]
            .into_iter()
            .map(|tb| {
                let cfg = ApplyConfig {
                    consistency: Some(c.clone()),
                    threads: Some(group.clone()),
                    batch_records: 2,
                    ..ApplyConfig::default()
                };
                let w = ApplyWorker::start(store.clone(), &received, tb.clone(), cfg).unwrap();
                w.notify();
                w
            })
            .collect();
        assert!(
            workers[2].wait_applied(t1_end, DEADLINE),
            "attempt {attempt}: t1 was held up by the other tablets' rejected records"
        );
        for (w, bad, good_ht, key_len) in [
            (&workers[0], k2_pos[1], 100, 65_526),
            (&workers[1], k3_pos[1], 101, 32_763),
        ] {
            wait_stopped(w, "the worker did not stop at the rejected record");
            let f = w.fault().unwrap();
            let msg = f.to_string();
            assert_eq!(f.state(), long_key_state(key_len), "{msg}");
            assert_eq!(f.pos, bad, "{msg}");
            assert!(
                msg.contains(&format!("tablet {}", w.tablet()))
                    && msg.contains(&format!("received-log position {bad}"))
                    && msg.contains(&key_len.to_string()),
                "{msg}"
            );
            assert_eq!(w.applied_pos(), bad, "{msg}");
            assert_eq!(w.safe_time(), HybridTime(good_ht));
            assert_eq!(
                store.tablet(w.tablet()).unwrap().unwrap().applied_pos,
                bad,
                "the persisted apply position is the rejected record's"
            );
        }
        assert!(store.get(b"k2/a", None).unwrap().is_some());
        assert!(store.get(b"k3/a", None).unwrap().is_some());
        assert!(
            store.get(b"k2/c", None).unwrap().is_none(),
            "applied past the rejected record"
        );
        assert!(k2_end > k2_pos[2]);
        // The global safe time is held by the stopped tablets' last applied records.
        let deadline = Instant::now() + DEADLINE;
        while c.safe_time() != Some(HybridTime(100))
            || c.report().tablets.get(&t1) != Some(&HybridTime(249))
        {
            assert!(
                Instant::now() < deadline,
                "safe time {:?}, report {:?}",
                c.safe_time(),
                c.report()
            );
            c.wait_for(HybridTime(100), Instant::now() + Duration::from_millis(100));
        }
        let r = c.report();
        assert_eq!(r.tablets[&k2], HybridTime(100));
        assert_eq!(r.tablets[&k3], HybridTime(101));
        assert_eq!(r.tablets[&t1], HybridTime(249));
        for w in &mut workers {
            let _ = w.stop();
        }
        c.stop();
    }
}

/// Reads of a key or prefix too long for the store's encoding find nothing (no such key can
/// be stored) instead of panicking inside fjall on the seek key.
#[test]
fn reads_of_keys_too_long_for_the_store_find_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path()).unwrap();
    for key in [vec![b'K'; 70_000], vec![0u8; 40_000]] {
        assert!(s.get(&key, None).unwrap().is_none());
        assert!(s.get(&key, Some(HybridTime(5))).unwrap().is_none());
        assert_eq!(s.scan(&key, None, 10).unwrap(), (Vec::new(), false));
    }
}
