//! Writer → Reader round trips, rotation, ht enforcement, recovery of a torn tail.
#![allow(clippy::unwrap_used)]

use tidelog_wal::*;

fn opts(seg: u64) -> WalOptions {
    WalOptions {
        segment_size: seg,
        ..Default::default()
    }
}

fn write_rec(i: u64, n: usize) -> Record {
    Record::new(
        HybridTime(1000 + i),
        Body::Write {
            ops: vec![Op::put(format!("k{i}"), vec![i as u8; n])],
            trx_id: Some(TrxId::new(1, i + 1)),
            gtid: None,
        },
    )
}

#[test]
fn write_rotate_read_reopen() {
    let d = tempfile::tempdir().unwrap();
    let t: TabletId = "t1".parse().unwrap();
    let mut w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    let mut want = Vec::new();
    for i in 0..200 {
        let r = write_rec(i, (i as usize * 37) % 700);
        let p = w.append(&r).unwrap();
        want.push((p, r));
        w.commit(SyncPolicy::Always).unwrap();
    }
    assert!(
        std::fs::read_dir(d.path().join("t1")).unwrap().count() > 5,
        "expected rotation"
    );
    let end = w.durable_pos();
    let got: Vec<_> = Reader::open(d.path(), &t, ReadLimit::Durable)
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got, want);
    // ht must increase: refused, nothing written.
    let e = w.append(&write_rec(5, 1)).unwrap_err();
    assert!(matches!(e, Error::NonMonotonicHt { .. }), "{e}");
    assert_eq!(w.staged_pos(), end);
    drop(w);
    let w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    assert_eq!(w.written_pos(), end);
    assert_eq!(w.recovery_report().dropped_bytes, 0);
    assert_eq!(w.last_ht(), Some(HybridTime(1199)));
    // Seek to a middle record.
    let mut r = Reader::open(d.path(), &t, ReadLimit::Durable).unwrap();
    r.seek(want[150].0).unwrap();
    assert_eq!(r.next().unwrap().unwrap(), want[150].clone());
    // Not a record boundary.
    r.seek(want[150].0.add(1)).unwrap();
    assert!(r.next().unwrap_err().is_corruption());
}

#[test]
fn batch_commits_become_durable() {
    let d = tempfile::tempdir().unwrap();
    let t: TabletId = "b".parse().unwrap();
    let mut w = Writer::open(d.path(), &t, WalOptions::default()).unwrap();
    w.append(&write_rec(1, 10)).unwrap();
    let end = w.commit(SyncPolicy::Batch).unwrap();
    assert!(w.wait_durable(end, std::time::Duration::from_secs(10)));
    assert_eq!(w.durable_pos(), end);
}

#[test]
fn locked_by_another_writer() {
    let d = tempfile::tempdir().unwrap();
    let t: TabletId = "l".parse().unwrap();
    let _w = Writer::open(d.path(), &t, WalOptions::default()).unwrap();
    let e = Writer::open(d.path(), &t, WalOptions::default()).unwrap_err();
    assert!(matches!(e, Error::Locked { .. }), "{e}");
}

#[test]
fn rollback_across_rotation_leaves_only_committed_records() {
    let d = tempfile::tempdir().unwrap();
    let t: TabletId = "r".parse().unwrap();
    let mut w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    let first = write_rec(0, 1000);
    let p0 = w.append(&first).unwrap();
    let end = w.commit(SyncPolicy::Always).unwrap();
    for i in 1..20 {
        w.append(&write_rec(i, 1000)).unwrap();
    }
    assert!(w.staged_pos() > end);
    w.rollback().unwrap();
    assert_eq!(w.staged_pos(), end);
    let after = write_rec(100, 10);
    let p1 = w.append(&after).unwrap();
    assert_eq!(p1, end);
    w.commit(SyncPolicy::Always).unwrap();
    let got: Vec<_> = Reader::open(d.path(), &t, ReadLimit::Durable)
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got, vec![(p0, first), (p1, after)]);
    drop(w);
    let w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    assert_eq!(w.recovery_report().dropped_bytes, 0);
    assert_eq!(w.recovery_report().segments, 1);
}

/// `append_encoded` copies another log's records verbatim (rotating at record boundaries
/// with its own segment size) and refuses anything misplaced, with nothing staged.
#[test]
fn append_encoded_copies_a_log_verbatim() {
    use tidelog_wal::{
        Body, HybridTime, Op, ReadLimit, Reader, Record, SyncPolicy, WalOptions, WalPos, Writer,
    };
    let src = tempfile::tempdir().unwrap();
    let dst = tempfile::tempdir().unwrap();
    let t: tidelog_wal::TabletId = "copy".parse().unwrap();
    let small = WalOptions {
        segment_size: 8192,
        ..WalOptions::default()
    };
    let mut w = Writer::open(src.path(), &t, small.clone()).unwrap();
    let mut recs = Vec::new();
    for i in 0..200u64 {
        let r = Record::new(
            HybridTime(1000 + i),
            Body::Write {
                ops: vec![Op::put(format!("k{i}"), vec![b'v'; (i % 300) as usize])],
                trx_id: None,
                gtid: None,
            },
        );
        let p = w.append(&r).unwrap();
        recs.push((p, r));
    }
    w.commit(SyncPolicy::Always).unwrap();
    let end = w.written_pos();
    // Read the source's raw bytes record by record through the reader's positions.
    let raw: Vec<u8> = recs
        .iter()
        .flat_map(|(p, r)| r.encode(*p).unwrap())
        .collect();
    assert_eq!(raw.len() as u64, end.0);
    let other = WalOptions {
        segment_size: 12288,
        ..WalOptions::default()
    };
    let mut r = Writer::open(dst.path(), &t, other).unwrap();
    // Misplaced (starting at the second record): refused, nothing staged.
    let second = recs[1].0 .0 as usize;
    assert!(r.append_encoded(&raw[second..]).is_err());
    assert_eq!(r.staged_pos(), WalPos::ZERO);
    // A flipped bit in the last record: refused, nothing staged.
    let mut bad = raw.clone();
    let n = bad.len();
    bad[n - 3] ^= 1;
    assert!(r.append_encoded(&bad).is_err());
    assert_eq!(r.staged_pos(), WalPos::ZERO);
    // In uneven chunks at record boundaries.
    let mut at = 0usize;
    for (k, (p, _)) in recs.iter().enumerate().skip(1) {
        if k % 7 == 0 {
            r.append_encoded(&raw[at..p.0 as usize]).unwrap();
            at = p.0 as usize;
        }
    }
    r.append_encoded(&raw[at..]).unwrap();
    r.commit(SyncPolicy::Always).unwrap();
    assert_eq!(r.written_pos(), end);
    // Replaying the same records is refused (ht and position).
    assert!(r.append_encoded(&raw[..second]).is_err());
    drop(r);
    let got: Vec<_> = Reader::open(dst.path(), &t, ReadLimit::Durable)
        .unwrap()
        .map(|x| x.unwrap())
        .collect();
    assert!(got == recs);
}

#[test]
fn none_commits_mixed_with_durable_policies_across_rotations() {
    let d = tempfile::tempdir().unwrap();
    let t: TabletId = "mix".parse().unwrap();
    let mut w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    let mut want = Vec::new();
    for i in 0..300u64 {
        let r = write_rec(i, (i as usize * 53) % 900);
        let p = w.append(&r).unwrap();
        want.push((p, r));
        let policy = match (i / 40) % 3 {
            0 => SyncPolicy::None,
            1 => SyncPolicy::Batch,
            _ => SyncPolicy::Always,
        };
        let end = w.commit(policy).unwrap();
        assert_eq!(w.written_pos(), end);
        if policy != SyncPolicy::Batch {
            assert_eq!(w.durable_pos(), end, "record {i} ({policy})");
        }
        assert!(w.wait_durable(end, std::time::Duration::from_secs(10)));
    }
    let end = w.sync().unwrap();
    assert_eq!(w.durable_pos(), end);
    w.close().unwrap();
    let got: Vec<_> = Reader::open(d.path(), &t, ReadLimit::Durable)
        .unwrap()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(got, want);
    // Rotations used spares prepared in the background; close removes the unused one.
    let names: Vec<String> = std::fs::read_dir(d.path().join("mix"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".partial")), "{names:?}");
    // A spare left by a crash is an interrupted creation: recovery deletes it.
    std::fs::write(d.path().join("mix").join("spare.seg.partial"), [0u8; 4096]).unwrap();
    let w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    assert_eq!(w.written_pos(), end);
    assert_eq!(w.recovery_report().dropped_bytes, 0);
    assert!(!d.path().join("mix").join("spare.seg.partial").exists());
    drop(w);
    // The shipper's `acked` write in progress is another process's: left alone, and no error.
    let acked_partial = d.path().join("mix").join("acked.partial");
    std::fs::write(&acked_partial, b"in flight").unwrap();
    let w = Writer::open(d.path(), &t, opts(8192)).unwrap();
    assert_eq!(w.written_pos(), end);
    assert_eq!(std::fs::read(&acked_partial).unwrap(), b"in flight");
}

/// `Reader::read_at` finds records in segments created after the reader listed the
/// directory (a reader of intents by position on a live log).
#[test]
fn read_at_follows_rotations_made_after_the_reader_opened() {
    use tidelog_wal::{
        Body, HybridTime, Op, ReadLimit, Reader, Record, SyncPolicy, WalOptions, Writer,
    };
    let d = tempfile::tempdir().unwrap();
    let t: tidelog_wal::TabletId = "ra".parse().unwrap();
    let mut w = Writer::open(
        d.path(),
        &t,
        WalOptions {
            segment_size: 8192,
            ..WalOptions::default()
        },
    )
    .unwrap();
    let rec = |i: u64| {
        Record::new(
            HybridTime(10 + i),
            Body::Write {
                ops: vec![Op::put(format!("k{i}"), vec![b'x'; 300])],
                trx_id: None,
                gtid: None,
            },
        )
    };
    let p0 = w.append(&rec(0)).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    let mut r = Reader::open(d.path(), &t, ReadLimit::Durable).unwrap();
    assert!(r.read_at(p0).unwrap() == rec(0));
    let mut later = Vec::new();
    for i in 1..100 {
        later.push((w.append(&rec(i)).unwrap(), rec(i)));
    }
    w.commit(SyncPolicy::Always).unwrap();
    assert!(r.segment_starts().len() == 1);
    for (p, want) in later.iter().rev() {
        assert!(r.read_at(*p).unwrap() == *want, "record at {p}");
    }
}
