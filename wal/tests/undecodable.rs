//! A whole record whose checksum matches but whose body this build does not decode (a key
//! beyond its `MAX_KEY_LEN`, written by a build with other limits) is not a torn write:
//! opening the log neither refuses it as corruption nor cuts it as a torn tail — what was
//! acknowledged stays — and a reader refuses it, naming the file and the offset.
#![allow(clippy::unwrap_used)]

use tidelog_wal::format::{record_checksum, MAX_KEY_LEN, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use tidelog_wal::*;

/// A `write` of one op (`key` = `v`) at `pos`, encoded by hand (no key limit applied).
fn raw_write(pos: WalPos, ht: u64, key: &[u8]) -> Vec<u8> {
    let mut rec = vec![0u8; RECORD_HEADER_LEN];
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(&(key.len() as u32).to_le_bytes());
    rec.extend_from_slice(&1u32.to_le_bytes());
    rec.extend_from_slice(key);
    rec.push(b'v');
    let body = (rec.len() - RECORD_HEADER_LEN) as u32;
    rec[8..12].copy_from_slice(&body.to_le_bytes());
    rec[12] = 1;
    rec[16..24].copy_from_slice(&ht.to_le_bytes());
    rec[24..32].copy_from_slice(&pos.0.to_le_bytes());
    let sum = record_checksum(&rec);
    rec[..8].copy_from_slice(&sum.to_le_bytes());
    rec
}

#[test]
fn an_undecodable_whole_record_is_kept_by_recovery_and_refused_by_readers() {
    let d = tempfile::tempdir().unwrap();
    let t: TabletId = "k2".parse().unwrap();
    let long = vec![b'K'; MAX_KEY_LEN + 1];
    // In the middle of the log (a record follows), and as its last record.
    for (case, after) in [("middle", true), ("tail", false)] {
        let dir = d.path().join(case);
        let mut w = Writer::open(&dir, &t, WalOptions::default()).unwrap();
        let good = w
            .append(&Record::new(
                HybridTime(100),
                Body::Write {
                    ops: vec![Op::put(b"a".to_vec(), b"v".to_vec())],
                    trx_id: None,
                    gtid: None,
                },
            ))
            .unwrap();
        let bad = w.staged_pos();
        w.append_encoded(&raw_write(bad, 110, &long)).unwrap();
        if after {
            let at = w.staged_pos();
            w.append_encoded(&raw_write(at, 120, b"c")).unwrap();
        }
        let end = w.commit(SyncPolicy::Always).unwrap();
        drop(w);

        let w = Writer::open(&dir, &t, WalOptions::default())
            .unwrap_or_else(|e| panic!("{case}: the log does not open: {e}"));
        assert_eq!(w.written_pos(), end, "{case}: recovery cut the log");
        assert_eq!(w.recovery_report().dropped_bytes, 0, "{case}");
        drop(w);

        let mut r = Reader::open(&dir, &t, ReadLimit::Durable).unwrap();
        assert_eq!(r.next().unwrap().unwrap().0, good);
        let e = r.next().unwrap_err().to_string();
        let offset = SEGMENT_HEADER_LEN as u64 + bad.0;
        assert!(
            e.contains("k2")
                && e.contains("0000000000000000.seg")
                && e.contains(&format!("offset {offset}"))
                && e.contains(&format!("key length {}", long.len())),
            "{case}: {e}"
        );
        assert_eq!(r.position(), bad, "{case}: the reader stays at the record");
    }
}
