//! Bounds a writer holds every new record to, so that nothing it accepts can stop the
//! target: one key limit end to end, an ht no further ahead of the wall clock than the
//! allowed skew, a commit that names its participants; and a log whose first segment could
//! not be created reads as empty, not as truncated.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, SystemTime};

use common::tmpfs::Tmpfs;
use common::*;
use tidelog_wal::format::MAX_KEY_LEN;
use tidelog_wal::*;

fn t() -> TabletId {
    "k2".parse().unwrap()
}

fn now() -> HybridTime {
    HybridTime::from_system_time(SystemTime::now())
}

fn write(key: Vec<u8>) -> Body {
    Body::Write {
        ops: vec![Op::put(key, b"v".to_vec())],
        trx_id: None,
        gtid: None,
    }
}

/// The keys that panicked the target's store (65 526 bytes; 32 763 NUL bytes, which its
/// encoding doubles) are refused by the writer, naming the tablet, the key's length and the
/// limit, with nothing written; the longest key allowed, all NULs (the worst case for the
/// store's encoding), is written and reads back.
#[test]
fn keys_beyond_the_end_to_end_limit_are_refused_naming_tablet_and_limit() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d.path(), &t(), WalOptions::default()).unwrap();
    for key in [
        vec![b'K'; 65_526],
        vec![0u8; 32_763],
        vec![0u8; MAX_KEY_LEN + 1],
    ] {
        let len = key.len();
        let e = w.append(&Record::new(now(), write(key))).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::TooLarge { what: "key", .. }), "{msg}");
        for part in ["tablet k2", &format!("key is {len} bytes"), "limit 32752"] {
            assert!(msg.contains(part), "{part:?} not in {msg:?}");
        }
        assert_eq!(w.staged_pos(), WalPos::ZERO, "nothing staged");
    }
    let ok = Record::new(now(), write(vec![0u8; MAX_KEY_LEN]));
    let p = w.append(&ok).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    let mut r = Reader::open(d.path(), &t(), ReadLimit::Durable).unwrap();
    assert!(r.next().unwrap().unwrap() == (p, ok));
    // 2 × the limit + the store's 10 bytes fit its 65 535-byte keys.
    const { assert!(2 * MAX_KEY_LEN + 10 <= 65_535) };
}

/// An ht beyond the wall clock plus the allowed skew (500 ms by default) is refused, naming
/// the tablet; u64::MAX (which held the target's safe time in the year 2112) among them.
/// Nothing is written and the refused ht is not consumed. Within the skew, an ht is taken.
#[test]
fn hts_beyond_the_clock_skew_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d.path(), &t(), WalOptions::default()).unwrap();
    let first = Record::new(now(), Body::Heartbeat);
    w.append(&first).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    let staged = w.staged_pos();
    let ahead = |d: Duration| HybridTime::new(now().physical_micros() + d.as_micros() as u64, 0);
    for ht in [
        HybridTime::MAX,
        ahead(Duration::from_secs(2)),
        ahead(Duration::from_secs(3600 * 24 * 365 * 50)),
    ] {
        let e = w.append(&Record::new(ht, Body::Heartbeat)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::HtAhead { .. }), "{msg}");
        assert!(
            msg.contains("tablet k2") && msg.contains(&ht.to_string()),
            "{msg}"
        );
        assert!(msg.contains("500 ms"), "{msg}");
        assert_eq!(w.staged_pos(), staged);
        assert_eq!(w.last_ht(), Some(first.ht));
    }
    // Within the skew: taken.
    let near = ahead(Duration::from_millis(100));
    w.append(&Record::new(near, Body::Heartbeat)).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    drop(w);

    // A larger skew takes more; `None` takes anything (a log replayed from elsewhere).
    let o = WalOptions {
        max_clock_skew: Some(Duration::from_secs(10)),
        ..Default::default()
    };
    let mut w = Writer::open(d.path(), &t(), o).unwrap();
    w.append(&Record::new(ahead(Duration::from_secs(2)), Body::Heartbeat))
        .unwrap();
    assert!(w
        .append(&Record::new(
            ahead(Duration::from_secs(60)),
            Body::Heartbeat
        ))
        .is_err());
    drop(w);
    let o = WalOptions {
        max_clock_skew: None,
        ..Default::default()
    };
    let mut w = Writer::open(d.path(), &t(), o).unwrap();
    w.append(&Record::new(HybridTime::MAX, Body::Heartbeat))
        .unwrap();
}

/// A commit that names no participant is refused by the writer, naming the tablet and the
/// transaction; a commit naming one is taken.
#[test]
fn a_commit_without_participants_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d.path(), &t(), WalOptions::default()).unwrap();
    let txn = TxnId::from_u128(0xabc);
    let commit = |participants: Vec<TabletId>| {
        Record::new(
            now(),
            Body::Commit {
                txn,
                participants,
                trx_id: None,
                gtid: None,
            },
        )
    };
    let e = w.append(&commit(vec![])).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, Error::InvalidRecord(_)), "{msg}");
    assert!(
        msg.contains("tablet k2") && msg.contains(&txn.to_string()),
        "{msg}"
    );
    assert!(msg.contains("no participant"), "{msg}");
    assert_eq!(w.staged_pos(), WalPos::ZERO);
    w.append(&commit(vec![t()])).unwrap();
}

/// A log whose first segment could not be created (no space for its preallocation) keeps
/// no `.partial`, reads as an empty log rather than as one truncated by retention ("needs
/// bootstrap"), and once there is space the next open creates the segment and the reader
/// that was waiting reads its records.
#[test]
fn a_first_segment_that_found_no_space_leaves_an_empty_log() {
    let Some(fs) = Tmpfs::mount(256 << 10) else {
        return;
    };
    let big = WalOptions {
        segment_size: 1 << 20,
        ..Default::default()
    };
    let e = Writer::open(fs.path(), &t(), big.clone()).unwrap_err();
    assert!(e.to_string().contains("No space left"), "{e}");
    let dir = fs.path().join("k2");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(left, ["control"], "the failed segment is removed");

    // Readers see an empty log, not a truncated one.
    let mut r = Reader::open(fs.path(), &t(), ReadLimit::Durable).unwrap();
    assert!(r.next().unwrap().is_none());
    assert_eq!(r.position(), WalPos::ZERO);

    // A `.partial` left by a writer that died in the preallocation: the same.
    std::fs::write(dir.join("0000000000000000.seg.partial"), b"").unwrap();
    let mut r2 = Reader::open(fs.path(), &t(), ReadLimit::Durable).unwrap();
    assert!(r2.next().unwrap().is_none());

    // Space comes back: the next open recovers (the partial goes) and writes.
    fs.resize(4 << 20);
    let mut w = Writer::open(fs.path(), &t(), big).unwrap();
    assert!(w
        .recovery_report()
        .removed
        .iter()
        .any(|p| p.ends_with("0000000000000000.seg.partial")));
    let rec = Record::new(now(), write(b"k".to_vec()));
    let p = w.append(&rec).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    for r in [&mut r, &mut r2] {
        assert!(r.next().unwrap().unwrap() == (p, rec.clone()));
        assert!(r.next().unwrap().is_none());
    }
    let _ = segments(&dir);
}
