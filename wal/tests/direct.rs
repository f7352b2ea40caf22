//! The direct-I/O writer (`WalOptions::direct_io`) against the buffered one: fed the same
//! appends, commits, rollbacks, reopens and switches of the direct writer between the two
//! ways (`Writer::set_direct_io`), both leave byte-identical segment files, and readers see
//! the same committed records at every step, buffered readers and direct
//! (`Reader::set_direct_io`) ones, fresh and tailing.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::*;
use proptest::prelude::*;
use tidelog_wal::*;

fn opts(segment_size: u64, direct_io: bool) -> WalOptions {
    WalOptions {
        segment_size,
        direct_io,
        ..Default::default()
    }
}

fn tablet() -> TabletId {
    "direct".parse().unwrap()
}

/// Every segment file of the tablet under `root`, by name, with its bytes.
fn files(root: &Path) -> Vec<(String, Vec<u8>)> {
    segments(&root.join(tablet().as_str()))
        .into_iter()
        .map(|(_, p)| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect()
}

fn record(i: u64, ht: u64, size: usize) -> Record {
    Record::new(
        HybridTime(ht),
        Body::Write {
            ops: vec![Op::put(format!("k{i}"), vec![(i % 251) as u8; size])],
            trx_id: Some(TrxId::new(7, i + 1)),
            gtid: None,
        },
    )
}

/// Readers of the log under `root`, buffered and direct, see exactly `want`, up to the
/// durable end.
fn assert_reads_back(root: &Path, want: &[(WalPos, Record)]) {
    let got = read_ok(root, &tablet(), ReadLimit::Durable, 100_000);
    assert!(
        got == want,
        "read back {} of {} records",
        got.len(),
        want.len()
    );
    let mut got = Vec::new();
    read_on(&mut direct_reader(root, ReadLimit::Durable), &mut got);
    assert!(
        got == want,
        "read back {} of {} records with direct reads",
        got.len(),
        want.len()
    );
}

/// A reader of the log under `root` with `O_DIRECT` reads, from the oldest record.
fn direct_reader(root: &Path, limit: ReadLimit) -> Reader {
    let mut r = Reader::open(root, &tablet(), limit).unwrap();
    r.set_direct_io(true);
    assert_eq!(
        r.direct_io_in_use(),
        tidelog_wal::direct_io_supported(root),
        "O_DIRECT reads not in use where the file system takes them"
    );
    r
}

/// Reads on from where `r` is to the readable end.
fn read_on(r: &mut Reader, into: &mut Vec<(WalPos, Record)>) {
    while let Some(pr) = r.next().unwrap() {
        into.push(pr);
    }
}

/// One step applied to both writers.
#[derive(Clone, Debug)]
enum Step {
    /// Records of these value sizes, appended one by one (`append`) or as one verbatim run
    /// (`append_encoded`).
    Append {
        sizes: Vec<usize>,
        encoded: bool,
    },
    Commit(SyncPolicy),
    Rollback,
    Reopen,
    /// `set_direct_io` on the direct writer: from here (or, with records staged, from the
    /// next rotation or rollback) it writes the other way; the files must not change.
    Switch(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (prop::collection::vec(0usize..5000, 1..12), any::<bool>())
            .prop_map(|(sizes, encoded)| Step::Append { sizes, encoded }),
        3 => prop_oneof![Just(SyncPolicy::Always), Just(SyncPolicy::Batch), Just(SyncPolicy::None)]
            .prop_map(Step::Commit),
        1 => Just(Step::Rollback),
        1 => Just(Step::Reopen),
        2 => any::<bool>().prop_map(Step::Switch),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn direct_writer_leaves_the_same_files_as_the_buffered_one(
        steps in prop::collection::vec(step(), 1..40),
        seg_kib in prop_oneof![Just(16u64), Just(64)],
    ) {
        let seg = seg_kib << 10;
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let open = |k: usize| Writer::open(dirs[k].path(), &tablet(), opts(seg, k == 1)).unwrap();
        let mut ws = [Some(open(0)), Some(open(1))];
        // Tails the direct writer's log with direct reads across every step.
        let mut tail = direct_reader(dirs[1].path(), ReadLimit::Written);
        let mut tailed: Vec<(WalPos, Record)> = Vec::new();
        let mut committed: Vec<(WalPos, Record)> = Vec::new();
        let mut staged: Vec<(WalPos, Record)> = Vec::new();
        let (mut ht, mut committed_ht, mut i) = (1000u64, 1000u64, 0u64);
        for s in steps {
            match s {
                Step::Append { sizes, encoded } => {
                    let start = ws[0].as_ref().unwrap().staged_pos();
                    let mut at = start;
                    let mut recs = Vec::new();
                    for size in sizes {
                        ht += 1;
                        i += 1;
                        let r = record(i, ht, size);
                        let len = rec_len(&r);
                        recs.push((at, r));
                        at = at.add(len);
                    }
                    for w in ws.iter_mut().map(|w| w.as_mut().unwrap()) {
                        prop_assert_eq!(w.staged_pos(), start);
                        if encoded {
                            let raw: Vec<u8> = recs.iter().flat_map(|(p, r)| r.encode(*p).unwrap()).collect();
                            w.append_encoded(&raw).unwrap();
                        } else {
                            for (p, r) in &recs {
                                prop_assert_eq!(w.append(r).unwrap(), *p);
                            }
                        }
                    }
                    staged.extend(recs);
                }
                Step::Commit(policy) => {
                    for w in ws.iter_mut().map(|w| w.as_mut().unwrap()) {
                        w.commit(policy).unwrap();
                    }
                    committed.append(&mut staged);
                    committed_ht = ht;
                }
                Step::Rollback => {
                    for w in ws.iter_mut().map(|w| w.as_mut().unwrap()) {
                        w.rollback().unwrap();
                    }
                    staged.clear();
                    ht = committed_ht;
                }
                Step::Switch(on) => {
                    ws[1].as_mut().unwrap().set_direct_io(on).unwrap();
                }
                Step::Reopen => {
                    // Staged records are rolled back first: left staged at a close, the
                    // buffered writer's are in the file (and recovered if whole) while the
                    // direct writer's may still be in its buffer; either is allowed for
                    // records never committed.
                    for (k, w) in ws.iter_mut().enumerate() {
                        w.as_mut().unwrap().rollback().unwrap();
                        drop(w.take());
                        *w = Some(open(k));
                    }
                    staged.clear();
                    ht = committed_ht;
                }
            }
            // Readers of both logs see exactly the committed records.
            for (k, d) in dirs.iter().enumerate() {
                let got = read_ok(d.path(), &tablet(), ReadLimit::Written, 100_000);
                prop_assert!(got == committed, "a reader of the {} writer's log saw {} records, {} committed",
                    ["buffered", "direct"][k], got.len(), committed.len());
            }
            let mut got = Vec::new();
            read_on(&mut direct_reader(dirs[1].path(), ReadLimit::Written), &mut got);
            prop_assert!(got == committed, "a direct reader saw {} records, {} committed", got.len(), committed.len());
            read_on(&mut tail, &mut tailed);
            prop_assert!(tailed == committed, "a tailing direct reader saw {} records, {} committed", tailed.len(), committed.len());
        }
        for w in ws.iter_mut().map(|w| w.as_mut().unwrap()) {
            w.rollback().unwrap();
        }
        drop(ws);
        let (a, b) = (files(dirs[0].path()), files(dirs[1].path()));
        prop_assert_eq!(a.len(), b.len());
        for ((na, ba), (nb, bb)) in a.iter().zip(&b) {
            prop_assert_eq!(na, nb);
            prop_assert!(ba == bb, "segment {} differs between the buffered and the direct writer", na);
        }
    }
}

/// Runs longer than the direct writer's staging buffer, over several 8 MiB segments, in
/// 1 MiB frames as a shipper sends them: durable, read back whole, and identical on disk to
/// the buffered writer's files.
#[test]
fn long_verbatim_runs_cross_the_staging_buffer_and_segments() {
    let seg = 8u64 << 20;
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut ws: Vec<Writer> = (0..2)
        .map(|k| Writer::open(dirs[k].path(), &tablet(), opts(seg, k == 1)).unwrap())
        .collect();
    let mut at = WalPos::ZERO;
    let mut want = Vec::new();
    let mut frame = Vec::new();
    for i in 0..30_000u64 {
        let r = record(i, 1000 + i, 1000);
        let bytes = r.encode(at).unwrap();
        want.push((at, r));
        at = at.add(bytes.len() as u64);
        frame.extend_from_slice(&bytes);
        if frame.len() >= 1 << 20 || i == 29_999 {
            for w in &mut ws {
                w.append_encoded(&frame).unwrap();
            }
            frame.clear();
            if i % 5 == 0 {
                for w in &mut ws {
                    w.commit(SyncPolicy::Always).unwrap();
                }
            }
        }
    }
    for w in &mut ws {
        assert_eq!(w.commit(SyncPolicy::Always).unwrap(), at);
        assert_eq!(w.durable_pos(), at);
    }
    assert!(
        at.0 > 3 * seg,
        "the run spans several segments ({} bytes)",
        at.0
    );
    drop(ws);
    for d in &dirs {
        assert_reads_back(d.path(), &want);
    }
    assert!(files(dirs[0].path()) == files(dirs[1].path()));
    // Reopened, the direct writer recovers the same end and goes on.
    let mut w = Writer::open(dirs[1].path(), &tablet(), opts(seg, true)).unwrap();
    assert_eq!(w.written_pos(), at);
    assert_eq!(w.recovery_report().dropped_bytes, 0);
    let r = record(30_000, 1000 + 30_000, 10);
    let p = w.append(&r).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    drop(w);
    want.push((p, r));
    assert_reads_back(dirs[1].path(), &want);
}

/// A log written through the page cache with segments of an odd size, reopened with direct
/// I/O (and a block-multiple segment size): its odd active segment goes on through the page
/// cache without growing, the next segments are written direct, and everything reads back.
#[test]
fn an_odd_sized_segment_from_before_is_finished_through_the_page_cache() {
    let d = tempfile::tempdir().unwrap();
    let odd = 64 * 1024 + 512;
    let mut w = Writer::open(d.path(), &tablet(), opts(odd, false)).unwrap();
    let mut want = Vec::new();
    let mut ht = 1000;
    let mut append = |w: &mut Writer, n: u64, want: &mut Vec<(WalPos, Record)>| {
        for _ in 0..n {
            ht += 1;
            let r = record(ht, ht, 700);
            want.push((w.append(&r).unwrap(), r));
        }
        w.commit(SyncPolicy::Always).unwrap();
    };
    append(&mut w, 20, &mut want);
    drop(w);
    let odd_files: Vec<_> = segments(&d.path().join(tablet().as_str()));
    assert_eq!(odd_files.len(), 1);
    let mut w = Writer::open(d.path(), &tablet(), opts(64 * 1024, true)).unwrap();
    append(&mut w, 400, &mut want);
    drop(w);
    let segs = segments(&d.path().join(tablet().as_str()));
    assert!(segs.len() > 2, "{} segments", segs.len());
    let first_len = std::fs::metadata(&segs[0].1).unwrap().len();
    assert_eq!(first_len, odd, "the odd segment's file changed size");
    for (_, p) in &segs[1..] {
        assert_eq!(std::fs::metadata(p).unwrap().len(), 64 * 1024);
    }
    assert_reads_back(d.path(), &want);
    let w = Writer::open(d.path(), &tablet(), opts(64 * 1024, true)).unwrap();
    assert_eq!(w.recovery_report().dropped_bytes, 0);
}

/// A segment size that is not a multiple of the direct-I/O block is refused at open, with
/// a message that says why.
#[test]
fn direct_io_needs_block_multiple_segments() {
    let d = tempfile::tempdir().unwrap();
    let e = Writer::open(d.path(), &tablet(), opts(64 * 1024 + 512, true)).unwrap_err();
    assert!(e.to_string().contains("direct I/O"), "{e}");
}

/// Records larger than a direct reader's 1 MiB read-ahead, between small ones at odd
/// offsets: each is read whole, in one read of the blocks around it.
#[test]
fn direct_reads_of_records_larger_than_the_read_ahead() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d.path(), &tablet(), opts(8 << 20, true)).unwrap();
    let mut want = Vec::new();
    for (i, size) in [3, 1_500_000, 17, 2_200_000, 1, 999_999, 5]
        .into_iter()
        .enumerate()
    {
        let r = record(i as u64, 1000 + i as u64, size);
        want.push((w.append(&r).unwrap(), r));
        w.commit(SyncPolicy::Always).unwrap();
    }
    drop(w);
    assert_reads_back(d.path(), &want);
}

/// Which pages of `path` are in the page cache (`mincore` over a mapping of it).
fn resident(path: &Path) -> Vec<bool> {
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: a read-only mapping, only handed to mincore (never read through).
    let map = unsafe { memmap2::Mmap::map(&f) }.unwrap();
    let pages = map.len().div_ceil(4096);
    let mut v = vec![0u8; pages];
    // SAFETY: `map` is a live mapping of `map.len()` bytes; `v` has one byte per page.
    let rc = unsafe { libc::mincore(map.as_ptr() as *mut _, map.len(), v.as_mut_ptr()) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    v.into_iter().map(|b| b & 1 == 1).collect()
}

/// Whether the record area's `[from, to)` of the log (positions) is in the page cache,
/// page by page, over all segments.
fn cached(root: &Path, from: WalPos, to: WalPos) -> Vec<bool> {
    let segs = segments(&root.join(tablet().as_str()));
    let mut out = Vec::new();
    for (i, (first, path)) in segs.iter().enumerate() {
        let end = segs.get(i + 1).map_or(WalPos(u64::MAX), |s| s.0);
        let (a, b) = (from.max(*first), to.min(end));
        if a >= b {
            continue;
        }
        let r = resident(path);
        // Whole pages inside the range only (file offsets = 128-byte header + record offset).
        let (pa, pb) = (
            (128 + a.since(*first) as usize).div_ceil(4096),
            (128 + b.since(*first) as usize) / 4096,
        );
        out.extend_from_slice(&r[pa..pb]);
    }
    out
}

/// A buffered log drops what lies `keep` below its durable end from the page cache, over
/// sealed segments and the active one, and keeps the rest; a reader with direct backlog
/// reads reads it all back without bringing the dropped part into the cache again.
#[test]
fn bytes_far_below_the_end_leave_the_page_cache_and_are_read_around_it() {
    if !tidelog_wal::direct_io_supported(&std::env::temp_dir()) {
        eprintln!("the temporary directory's file system refuses O_DIRECT: skipped");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    let keep = 2u64 << 20;
    // As the applier's intake writes: verbatim frames through the file, no pre-faulting
    // (pages written through the mapping stay mapped, and mapped pages are not dropped).
    let o = WalOptions {
        prefault: false,
        ..opts(4 << 20, false)
    };
    let mut w = Writer::open(d.path(), &tablet(), o).unwrap();
    let mut want = Vec::new();
    let (mut i, mut at, mut frame) = (0u64, WalPos::ZERO, Vec::new());
    while at.0 < 11 << 20 {
        let r = record(i, 1000 + i, 1000);
        let bytes = r.encode(at).unwrap();
        want.push((at, r));
        at = at.add(bytes.len() as u64);
        frame.extend_from_slice(&bytes);
        i += 1;
        if i % 100 == 0 {
            w.append_encoded(&frame).unwrap();
            w.commit(SyncPolicy::Always).unwrap();
            frame.clear();
        }
    }
    w.append_encoded(&frame).unwrap();
    w.commit(SyncPolicy::Always).unwrap();
    let end = w.durable_pos();
    let cut = WalPos(end.0 - keep);
    assert!(
        cached(d.path(), WalPos::ZERO, end).iter().all(|c| *c),
        "just written, every page is cached"
    );
    w.drop_cached_below(keep).unwrap();
    let below = cached(d.path(), WalPos::ZERO, cut);
    assert!(
        below.len() > 2000 && below.iter().all(|c| !*c),
        "dropped below {cut}"
    );
    assert!(
        cached(d.path(), cut, end).iter().all(|c| *c),
        "kept above {cut}"
    );
    let mut r = Reader::open(d.path(), &tablet(), ReadLimit::Durable).unwrap();
    r.set_direct_backlog_reads(Some(keep));
    let mut got = Vec::new();
    read_on(&mut r, &mut got);
    assert!(
        got == want,
        "read back {} of {} records",
        got.len(),
        want.len()
    );
    let below = cached(d.path(), WalPos::ZERO, cut);
    let refilled = below.iter().filter(|c| **c).count();
    // Within the last read-ahead window before the cut a read may be buffered.
    assert!(
        refilled * 4096 <= 1 << 20,
        "{refilled} dropped pages back in the cache after the read"
    );
    drop(w);
}
