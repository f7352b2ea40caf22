//! Retention: a segment goes only when the shipper's `acked` position covers all of it, or
//! when `max_retained_bytes` forces the oldest out (readers then get `Error::Truncated`);
//! the active segment never goes.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::path::Path;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tidelog_wal::*;

const SEG: u64 = 8 << 10;

fn opts(max_retained_bytes: Option<u64>) -> WalOptions {
    WalOptions {
        segment_size: SEG,
        max_retained_bytes,
        ..Default::default()
    }
}

fn rec(i: u64) -> Record {
    Record::new(
        HybridTime(100 + i),
        Body::Write {
            ops: vec![Op::put(
                format!("key{i}"),
                vec![i as u8; (i as usize * 131) % 900],
            )],
            trx_id: Some(TrxId::new(1, i + 1)),
            gtid: None,
        },
    )
}

/// Appends records `from..to`, committing each; returns them with their positions and
/// adds every segment start seen on disk to `starts`.
fn write(
    w: &mut Writer,
    from: u64,
    to: u64,
    starts: &mut BTreeSet<WalPos>,
) -> Vec<(WalPos, Record)> {
    let mut out = Vec::new();
    for i in from..to {
        let r = rec(i);
        let p = w.append(&r).unwrap();
        w.commit(SyncPolicy::Always).unwrap();
        out.push((p, r));
        starts.extend(segments(w.dir()).into_iter().map(|s| s.0));
    }
    out
}

fn on_disk(dir: &Path) -> Vec<WalPos> {
    segments(dir).into_iter().map(|s| s.0).collect()
}

/// Every record at or above the oldest retained segment reads back; older positions are
/// `Truncated`.
fn check_readable(root: &Path, t: &TabletId, all: &[(WalPos, Record)], oldest: WalPos) {
    let want: Vec<_> = all.iter().filter(|r| r.0 >= oldest).cloned().collect();
    let mut r = Reader::open(root, t, ReadLimit::Durable).unwrap();
    assert_eq!(r.oldest(), oldest);
    assert_eq!(r.position(), oldest);
    let (got, err) = read_all(&mut r, all.len() + 8);
    assert!(err.is_none(), "{err:?}");
    assert!(got == want, "retained records differ (oldest {oldest})");
    if let Some((p, _)) = all.iter().rev().find(|r| r.0 < oldest) {
        let e = r.seek(*p).unwrap_err();
        assert!(e.is_truncated(), "seek({p}) below the oldest {oldest}: {e}");
        assert!(r.seek(WalPos::ZERO).unwrap_err().is_truncated());
    }
    if let Some(first) = want.first() {
        r.seek(first.0).unwrap();
        assert!(r.next().unwrap().unwrap() == *first);
    }
}

#[test]
fn acked_retention_never_deletes_an_unacked_segment() {
    let root = tempfile::tempdir().unwrap();
    let t: TabletId = "ret".parse().unwrap();
    let mut w = Writer::open(root.path(), &t, opts(None)).unwrap();
    let mut starts = BTreeSet::new();
    let all = write(&mut w, 0, 400, &mut starts);
    let dir = w.dir().to_path_buf();
    let segs = on_disk(&dir);
    assert!(segs.len() >= 15, "{} segments", segs.len());
    let end = w.written_pos();
    // Without an acked file nothing goes, even at rotation.
    assert_eq!(segs, starts.iter().copied().collect::<Vec<_>>());

    // Positions to ack, in order: none, the very start, inside segment 0, one below and at
    // a segment boundary, mid-segment, mid-record, a lower ack than before (nothing comes
    // back), the end, and beyond it.
    let mut rng = StdRng::seed_from_u64(11);
    let mid = |k: usize| segs[k].add(segs[k + 1].since(segs[k]) / 2);
    let mut acks = vec![
        WalPos::ZERO,
        mid(0),
        WalPos(segs[2].0 - 1),
        segs[2],
        mid(4),
        all[all.partition_point(|r| r.0 < segs[7])].0.add(3),
        mid(9),
        segs[12],
    ];
    let mut random: Vec<_> = (0..4)
        .map(|_| WalPos(rng.random_range(segs[12].0..end.0)))
        .collect();
    random.sort();
    acks.extend(random);
    // A lower ack than before: nothing comes back, nothing more goes.
    acks.insert(7, mid(5));
    acks.extend([end, WalPos(end.0 + 12345)]);

    let mut max_acked = WalPos::ZERO;
    let mut deleted_so_far = BTreeSet::new();
    for acked in acks {
        retention::write_acked(&dir, acked).unwrap();
        assert_eq!(retention::read_acked(&dir).unwrap(), Some(acked));
        let before = on_disk(&dir);
        let rep = w.enforce_retention().unwrap();
        let after = on_disk(&dir);
        max_acked = max_acked.max(acked);
        assert!(rep.forced.is_empty(), "{rep:?}");
        for (k, first) in segs.iter().enumerate() {
            let seg_end = segs.get(k + 1).copied();
            let active = seg_end.is_none();
            // A sealed segment wholly at or below the acked position goes; anything else
            // (partly unacked, or the active one) stays.
            let may_go = !active && seg_end.is_some_and(|e| e <= max_acked);
            let exists = after.contains(first);
            assert_eq!(
                exists, !may_go,
                "ack {acked} (max {max_acked}): segment {first} (end {seg_end:?}) exists={exists}"
            );
        }
        let gone: Vec<_> = before.iter().filter(|p| !after.contains(p)).collect();
        for p in &gone {
            // Deleted in this pass: wholly at or below this pass's acked position.
            let k = segs.binary_search(p).unwrap();
            assert!(
                segs.get(k + 1).is_some_and(|e| *e <= acked),
                "unacked segment {p} deleted at ack {acked}"
            );
        }
        assert_eq!(rep.deleted.len(), gone.len(), "{rep:?}");
        for p in &rep.deleted {
            assert!(!p.exists(), "{} reported deleted but exists", p.display());
        }
        deleted_so_far.extend(gone.into_iter().copied());
        let oldest = after[0];
        assert_eq!(w.oldest_pos(), oldest);
        assert_eq!(rep.retained_bytes, end.since(oldest));
        check_readable(root.path(), &t, &all, oldest);
    }
    // Everything acked: only the active segment is left, and it still takes records.
    assert_eq!(on_disk(&dir), vec![*segs.last().unwrap()]);
    let more = write(&mut w, 400, 420, &mut starts);
    let mut all = all;
    all.extend(more);
    let oldest = on_disk(&dir)[0];
    check_readable(root.path(), &t, &all, oldest);

    // Reopening a log whose oldest segments are gone: recovery starts at the oldest kept.
    let end = w.written_pos();
    drop(w);
    let w = Writer::open(root.path(), &t, opts(None)).unwrap();
    assert_eq!(w.written_pos(), end);
    assert_eq!(w.oldest_pos(), oldest);
    assert_eq!(w.recovery_report().dropped_bytes, 0);
    drop(w);
    check_readable(root.path(), &t, &all, oldest);
}

/// Retention runs at every rotation: with the acked position inside the active segment,
/// rotating deletes the older acked segments but never the one holding the acked position.
#[test]
fn rotation_enforces_retention_up_to_the_acked_segment() {
    let root = tempfile::tempdir().unwrap();
    let t: TabletId = "rot".parse().unwrap();
    let mut w = Writer::open(root.path(), &t, opts(None)).unwrap();
    let mut starts = BTreeSet::new();
    let mut all = write(&mut w, 0, 200, &mut starts);
    let dir = w.dir().to_path_buf();
    let acked = all[150].0.add(1); // inside record 150
    retention::write_acked(&dir, acked).unwrap();
    let holding = *on_disk(&dir).iter().rev().find(|p| **p <= acked).unwrap();
    all.extend(write(&mut w, 200, 400, &mut starts));
    let segs = on_disk(&dir);
    assert_eq!(
        segs[0], holding,
        "retention at rotation: oldest should be {holding}"
    );
    check_readable(root.path(), &t, &all, holding);
}

/// `max_retained_bytes` deletes the oldest segments even unacked, as few as needed; readers
/// asking for them get `Truncated`; the active segment stays even with a limit of 0.
#[test]
fn max_retained_bytes_forces_oldest_out() {
    let root = tempfile::tempdir().unwrap();
    let t: TabletId = "max".parse().unwrap();
    let max = 3 * SEG;
    let mut w = Writer::open(root.path(), &t, opts(Some(max))).unwrap();
    let mut starts = BTreeSet::new();
    let mut all = write(&mut w, 0, 400, &mut starts);
    let dir = w.dir().to_path_buf();
    let rep = w.enforce_retention().unwrap();
    let end = w.written_pos();
    let segs = on_disk(&dir);
    let starts: Vec<_> = starts.into_iter().collect();
    assert!(starts.len() >= 15);
    let oldest = segs[0];
    // Minimal: within the limit, and keeping the previous segment would exceed it.
    assert!(
        end.since(oldest) <= max,
        "retained {} > {max}",
        end.since(oldest)
    );
    let i = starts.binary_search(&oldest).unwrap();
    assert!(i > 0 && end.since(starts[i - 1]) > max);
    // Nothing missing in between.
    assert_eq!(segs, starts[i..].to_vec());
    assert!(rep.retained_bytes <= max);
    assert_eq!(w.oldest_pos(), oldest);
    check_readable(root.path(), &t, &all, oldest);
    let mut r = Reader::open(root.path(), &t, ReadLimit::Durable).unwrap();
    let e = r.seek(all[0].0).unwrap_err();
    assert!(e.is_truncated(), "{e}");
    match e {
        Error::Truncated {
            requested,
            oldest: o,
            ..
        } => assert_eq!((requested, o), (all[0].0, oldest)),
        _ => unreachable!(),
    }

    // A limit of 0 removes every sealed segment but never the active one: at once when a
    // writer opens the log with it (retention runs at open).
    drop(w);
    let before = on_disk(&dir).len();
    assert!(before > 1);
    let mut w = Writer::open(root.path(), &t, opts(Some(0))).unwrap();
    let segs = on_disk(&dir);
    assert_eq!(segs.len(), 1, "{segs:?}");
    assert_eq!(segs[0], *starts.last().unwrap());
    let rep = w.enforce_retention().unwrap();
    assert!(rep.forced.is_empty() && rep.deleted.is_empty(), "{rep:?}");
    let mut starts2 = BTreeSet::new();
    all.extend(write(&mut w, 400, 450, &mut starts2));
    assert_eq!(
        on_disk(&dir).len(),
        1,
        "each rotation deletes the sealed segment"
    );
    let oldest = on_disk(&dir)[0];
    check_readable(root.path(), &t, &all, oldest);
}

/// A tailer that falls behind `max_retained_bytes` gets the original records it can still
/// read, then `Truncated` (needs bootstrap) — never wrong data, and not "corruption".
///
/// Regression (fixed): a reader that opened while its segment was the only one caches a segment list
/// without the next segment; when that next segment has been deleted by retention by the
/// time the reader reaches its first position, `Reader::next` refreshes the list, does not
/// find the position and reports `Corruption` ("no record at position P although the log
/// reaches E", naming the deleted segment's predecessor) instead of `Truncated`.
/// Fix: in that branch, when `pos` is below the first listed segment (or the control
/// file's oldest), return `Error::Truncated { requested: pos, oldest }`.
#[test]

fn tailer_overtaken_by_retention_gets_truncated() {
    let root = tempfile::tempdir().unwrap();
    let t: TabletId = "late".parse().unwrap();
    let mut w = Writer::open(root.path(), &t, opts(Some(3 * SEG))).unwrap();
    let mut starts = BTreeSet::new();
    let mut all = write(&mut w, 0, 5, &mut starts);
    // A tailer that has read the first record.
    let mut early = Reader::open(root.path(), &t, ReadLimit::Durable).unwrap();
    assert!(early.next().unwrap().unwrap() == all[0]);
    all.extend(write(&mut w, 5, 400, &mut starts));
    assert!(!on_disk(w.dir()).contains(&WalPos::ZERO));
    let (got, err) = read_all(&mut early, all.len() + 8);
    assert!(
        got[..] == all[1..1 + got.len()],
        "the early reader returned wrong data"
    );
    let err = err.expect("the early reader must hit the deleted segments");
    assert!(err.is_truncated(), "expected Truncated, got: {err}");
}

/// Opening a writer runs retention: segments the shipper acknowledged while no writer ran
/// go at once (on a full disk they are the space the next rotation needs).
#[test]
fn opening_a_writer_deletes_the_acknowledged_segments() {
    let root = tempfile::tempdir().unwrap();
    let t: TabletId = "open".parse().unwrap();
    let mut w = Writer::open(root.path(), &t, opts(None)).unwrap();
    let mut starts = BTreeSet::new();
    let all = write(&mut w, 0, 200, &mut starts);
    let dir = w.dir().to_path_buf();
    drop(w);
    let segs = on_disk(&dir);
    assert!(segs.len() > 4, "{segs:?}");
    // The shipper acknowledges everything after the writer went away.
    let end = all.last().unwrap().0.add(rec_len(&all.last().unwrap().1));
    retention::write_acked(&dir, end).unwrap();
    let w = Writer::open(root.path(), &t, opts(None)).unwrap();
    assert_eq!(
        on_disk(&dir),
        vec![*segs.last().unwrap()],
        "only the active segment is left"
    );
    assert_eq!(w.oldest_pos(), *segs.last().unwrap());
    drop(w);
    check_readable(root.path(), &t, &all, *segs.last().unwrap());
}

/// A source on a full disk appends again, without reopening, once the shipper's `acked`
/// covers its old segments: the rotation deletes them before it allocates the next one.
/// (Before, it allocated first, failed with ENOSPC, and never reached retention.)
#[test]
fn a_full_disk_clears_once_the_shipper_acknowledges() {
    const BIG: u64 = 64 << 10;
    // Room for the control file and three segments, not a fourth.
    let Some(fs) = tmpfs::Tmpfs::mount(4 * BIG - 4096) else {
        return;
    };
    let t: TabletId = "full".parse().unwrap();
    let o = WalOptions {
        segment_size: BIG,
        ..Default::default()
    };
    let mut w = Writer::open(fs.path(), &t, o).unwrap();
    let dir = w.dir().to_path_buf();
    let mut all = Vec::new();
    let mut i = 0u64;
    let err = loop {
        let r = rec(i);
        match w.append(&r) {
            Ok(p) => {
                w.commit(SyncPolicy::Always).unwrap();
                all.push((p, r));
                i += 1;
            }
            Err(e) => break e,
        }
        assert!(i < 10_000, "the disk never filled");
    };
    assert!(err.to_string().contains("No space left"), "{err}");
    assert_eq!(on_disk(&dir).len(), 3);
    // Nothing acknowledged yet: still full.
    assert!(w.append(&rec(i)).is_err());
    // The shipper acknowledges everything written.
    retention::write_acked(&dir, w.written_pos()).unwrap();
    // Appends resume at once, on the same writer.
    // (Two segments' worth: more than the free space before the ack.)
    for k in 0..250 {
        let r = rec(i + k);
        let p = w
            .append(&r)
            .unwrap_or_else(|e| panic!("append {k} after the ack: {e}"));
        w.commit(SyncPolicy::Always).unwrap();
        all.push((p, r));
    }
    let oldest = on_disk(&dir)[0];
    assert!(oldest > WalPos::ZERO);
    drop(w);
    check_readable(fs.path(), &t, &all, oldest);
}
