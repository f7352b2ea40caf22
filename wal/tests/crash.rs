//! Crash tests: a pristine multi-segment log (every commit `SyncPolicy::Always`) is cut or
//! torn at a random byte and reopened; recovery must keep exactly the whole records below
//! the damage, report what it dropped, and leave a log that accepts appends.
//!
//! Each case picks a flat byte offset X over the headers and written record regions of all
//! segments, in order:
//! - truncate: the segment containing X is cut at X (`set_len`), later segments deleted. X in
//!   a segment header is the torn-creation case (recovery case 5).
//! - tear: bytes from X to the end of the written data of that segment become random
//!   non-zero garbage, later segments deleted. X in a header is a damaged header (case 4).
//!
//! Reproduce: `WAL_CRASH_SEED=<seed> WAL_CRASH_CASE=<case> cargo test -p tidelog-wal --test
//! crash <test name>`; `WAL_CRASH_CASES=<n>` changes the number of cases per test.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::FileExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::time::{Duration, Instant};

use common::*;
use rand::rngs::StdRng;
use rand::Rng;
use tidelog_wal::recovery::Cut;
use tidelog_wal::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Truncate,
    Tear,
}

const DEFAULT_SEED: u64 = 0x7ade_10c5_eed5_0001;

fn opts(seg_size: u64) -> WalOptions {
    WalOptions {
        segment_size: seg_size,
        ..Default::default()
    }
}

/// Bytes from the start of `b` through its last non-zero byte.
fn nonzero_extent(b: &[u8]) -> u64 {
    b.iter().rposition(|&x| x != 0).map_or(0, |i| i as u64 + 1)
}

/// Picks the flat offset of a case: some in segment headers, some exactly on record
/// boundaries, the rest uniform.
fn pick_x(img: &Image, rng: &mut StdRng) -> u64 {
    let flat_of =
        |k: usize, o: u64| -> u64 { (0..k).map(|j| img.seg_written_len(j)).sum::<u64>() + o };
    match rng.random_range(0..10) {
        0 => {
            let k = rng.random_range(0..img.segs.len());
            flat_of(k, rng.random_range(0..HDR))
        }
        1 => {
            let i = rng.random_range(0..img.recs.len());
            let p = img.recs[i].0;
            let k = img.segs.partition_point(|s| s.0 <= p) - 1;
            flat_of(k, HDR + p.since(img.segs[k].0))
        }
        _ => rng.random_range(0..img.flat_len()),
    }
}

/// Runs one case; panics (with a plain message) on any violated expectation.
/// Returns which kind of outcome the case had.
fn crash_case(img: &Image, work: &Path, mode: Mode, x: u64, rng: &mut StdRng) -> &'static str {
    let (k, o) = img.locate(x);
    let dir = img.copy_to(work);
    for (_, name) in &img.segs[k + 1..] {
        std::fs::remove_file(dir.join(name)).unwrap();
    }
    let seg_path = dir.join(&img.segs[k].1);
    let seg_first = img.segs[k].0;
    let data_end = img.seg_end(k);
    let xl = img.logical(k, o);
    let header_hit = o < HDR;
    let pristine = img.seg_bytes(k);
    match mode {
        Mode::Truncate => {
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&seg_path)
                .unwrap();
            f.set_len(o).unwrap();
        }
        Mode::Tear => {
            let n = (img.seg_written_len(k) - o) as usize;
            let mut g: Vec<u8> = (0..n).map(|_| rng.random_range(1..=255u8)).collect();
            // The first torn byte really changes.
            while g[0] == pristine[o as usize] {
                g[0] = rng.random_range(1..=255u8);
            }
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(&seg_path)
                .unwrap();
            f.write_all_at(&g, o).unwrap();
        }
    }

    // Exactly the records wholly below X survive.
    let n_surv = img
        .recs
        .iter()
        .zip(&img.lens)
        .take_while(|((p, _), l)| p.add(**l) <= xl)
        .count();
    let exp_end = match n_surv {
        0 => WalPos::ZERO,
        n => img.recs[n - 1].0.add(img.lens[n - 1]),
    };
    let survivors = &img.recs[..n_surv];

    let res = Writer::open(work, &img.tablet, opts(img.seg_size));
    if mode == Mode::Tear && header_hit {
        // A damaged header is corruption, never a tail to cut (segment creation is atomic).
        let e = res.expect_err("a damaged segment header must not open");
        let msg = e.to_string();
        match &e {
            Error::Corruption {
                tablet,
                file,
                offset,
                ..
            } => {
                assert_eq!(tablet, img.tablet.as_str(), "{msg}");
                assert_eq!(file, &seg_path, "{msg}");
                assert_eq!(*offset, 0, "{msg}");
            }
            other => panic!("expected corruption, got {other}"),
        }
        assert!(msg.contains(&img.segs[k].1), "{msg}");
        return "damaged header refused";
    }
    if mode == Mode::Truncate && header_hit && k == 0 {
        // The only segment is gone while the control file says the log reaches its end:
        // refused, naming the control file.
        let e = res.expect_err("no segments left while the control file names records");
        match &e {
            Error::Corruption { file, .. } => {
                assert_eq!(file, &dir.join("control"), "{e}");
            }
            other => panic!("expected corruption, got {other}"),
        }
        return "only segment torn: refused";
    }
    let mut w = res.unwrap_or_else(|e| panic!("recovery failed: {e}"));
    let rep = w.recovery_report().clone();
    assert_eq!(rep.end, exp_end, "recovered end; report {rep:?}");
    assert_eq!(w.written_pos(), exp_end, "written_pos");
    assert_eq!(w.durable_pos(), exp_end, "durable_pos");
    assert_eq!(w.staged_pos(), exp_end, "staged_pos");
    assert_eq!(w.oldest_pos(), WalPos::ZERO);
    assert_eq!(rep.oldest, WalPos::ZERO);
    assert_eq!(w.last_ht(), survivors.last().map(|r| r.1.ht), "last_ht");
    assert_eq!(rep.last_ht, w.last_ht());
    // The control file had published the pristine end as durable: the loss is reported.
    assert_eq!(
        rep.lost_durable,
        Some(img.end),
        "lost_durable; report {rep:?}"
    );

    let outcome;
    let active_k = if mode == Mode::Truncate && header_hit {
        // Case 5: the torn segment is deleted, the previous one is last.
        assert_eq!(rep.removed, vec![seg_path.clone()], "removed");
        assert!(!seg_path.exists());
        assert_eq!(rep.dropped_bytes, o, "dropped_bytes of a torn header");
        assert_eq!(rep.cut, None);
        assert_eq!(exp_end, seg_first);
        outcome = "torn header removed";
        k - 1
    } else {
        assert!(rep.removed.is_empty(), "removed {:?}", rep.removed);
        let cut_off = HDR + exp_end.since(seg_first);
        let expect_dropped = match mode {
            // The partial record's bytes that were left (trailing zeros look like free space).
            Mode::Truncate => nonzero_extent(&pristine[cut_off as usize..o as usize]),
            // Everything from the cut to the end of the garbage.
            Mode::Tear => data_end.since(exp_end),
        };
        if mode == Mode::Tear {
            assert!(rep.dropped_bytes > 0, "tear not reported; report {rep:?}");
        }
        assert_eq!(
            rep.dropped_bytes, expect_dropped,
            "dropped_bytes; report {rep:?}"
        );
        outcome = if expect_dropped > 0 {
            "tail cut"
        } else {
            "clean end (cut on a record boundary)"
        };
        if expect_dropped > 0 {
            let cut = rep.cut.clone().expect("a cut must be reported");
            let Cut {
                file, offset, pos, ..
            } = cut;
            assert_eq!(
                (file, offset, pos),
                (seg_path.clone(), cut_off, exp_end),
                "cut"
            );
        } else {
            assert_eq!(rep.cut, None);
        }
        k
    };
    assert_eq!(rep.segments, active_k + 1, "segments");

    // The active segment is back to its preallocated size and zero after the records.
    let active_path = dir.join(&img.segs[active_k].1);
    let bytes = std::fs::read(&active_path).unwrap();
    assert_eq!(bytes.len() as u64, img.seg_size, "active segment size");
    let from = (HDR + exp_end.since(img.segs[active_k].0)) as usize;
    assert!(
        bytes[from..].iter().all(|&b| b == 0),
        "non-zero bytes left after the recovered end (file offset {})",
        from + bytes[from..].iter().position(|&b| b != 0).unwrap_or(0)
    );

    // A reader sees exactly the survivors, no partial record.
    let max = img.recs.len() + 16;
    let got = read_ok(work, &img.tablet, ReadLimit::Durable, max);
    assert_eq!(got.len(), n_surv, "survivor count");
    assert!(got == survivors, "survivors differ");

    // Appending after recovery works; the new records follow the survivors. Their hts
    // only need to exceed the last surviving record's (lost records do not count).
    let mut want = survivors.to_vec();
    let mut ht = w.last_ht().map_or(1, |h| h.0 + 1);
    let mut p = exp_end;
    for _ in 0..rng.random_range(1..=4) {
        let r = random_record(rng, HybridTime(ht), (img.seg_size as usize - 600) / 2);
        ht += rng.random_range(1..100);
        let at = w.append(&r).unwrap();
        // Contiguous, unless the record started a new segment (at that segment's start).
        assert!(at >= p);
        if at != p {
            assert!(segments(&dir).iter().any(|s| s.0 == at), "gap at {p}..{at}");
        }
        p = at.add(rec_len(&r));
        want.push((at, r));
    }
    let end2 = w.commit(SyncPolicy::Always).unwrap();
    assert_eq!(end2, p);
    assert_eq!(w.durable_pos(), p);
    let got = read_ok(work, &img.tablet, ReadLimit::Durable, max);
    assert!(
        got == want,
        "records after the post-recovery appends differ"
    );
    let last_ht = w.last_ht();
    drop(w);

    // Reopening finds a clean log.
    let w = Writer::open(work, &img.tablet, opts(img.seg_size)).unwrap();
    let rep = w.recovery_report();
    assert_eq!(rep.dropped_bytes, 0, "second open dropped bytes: {rep:?}");
    assert_eq!(rep.cut, None);
    assert!(rep.removed.is_empty());
    assert_eq!(rep.lost_durable, None);
    assert_eq!(rep.end, end2);
    assert_eq!(w.durable_pos(), end2);
    assert_eq!(w.last_ht(), last_ht);
    drop(w);
    let got = read_ok(work, &img.tablet, ReadLimit::Durable, max);
    assert!(got == want, "records after reopening differ");
    outcome
}

/// Builds one image and runs `cases` crash cases of `mode` against copies of it.
fn run(name: &str, mode: Mode, seg_size: u64, n_records: usize, default_cases: usize) {
    let seed = seed_from_env("WAL_CRASH_SEED", DEFAULT_SEED);
    let cases = env_usize("WAL_CRASH_CASES").unwrap_or(default_cases);
    let only = env_usize("WAL_CRASH_CASE");
    let started = Instant::now();
    let img = Image::build("crash", seg_size, n_records, seed ^ seg_size);
    let work = tempfile::tempdir().unwrap();
    let mut ran = 0;
    let mut outcomes = std::collections::BTreeMap::<&str, usize>::new();
    for case in 0..cases {
        if only.is_some_and(|c| c != case) {
            continue;
        }
        let mut rng = case_rng(seed ^ seg_size ^ mode as u64, case);
        let x = pick_x(&img, &mut rng);
        let (k, o) = img.locate(x);
        let r = catch_unwind(AssertUnwindSafe(|| {
            crash_case(&img, work.path(), mode, x, &mut rng)
        }));
        match r {
            Ok(outcome) => *outcomes.entry(outcome).or_default() += 1,
            Err(p) => {
                eprintln!(
                "{name}: FAILED case {case} ({mode:?} at flat offset {x}: segment {} `{}`, file                  offset {o}, logical {}); seed {seed:#x}. Reproduce: WAL_CRASH_SEED={seed:#x}                  WAL_CRASH_CASE={case} cargo test -p tidelog-wal --test crash {name}",
                k,
                img.segs[k].1,
                img.logical(k, o),
            );
                std::panic::resume_unwind(p);
            }
        }
        ran += 1;
    }
    eprintln!(
        "{name}: {ran} cases over {} records in {} segments ({} bytes) in {:.1?}",
        img.recs.len(),
        img.segs.len(),
        img.end.0,
        started.elapsed()
    );
    eprintln!("{name}: outcomes {outcomes:?}");
    if only.is_none() && cases >= 100 {
        // Every interesting path was exercised.
        let need: &[&str] = match mode {
            Mode::Truncate => &[
                "torn header removed",
                "tail cut",
                "clean end (cut on a record boundary)",
            ],
            Mode::Tear => &["damaged header refused", "tail cut"],
        };
        for n in need {
            assert!(
                outcomes.contains_key(n),
                "no case had outcome {n:?}: {outcomes:?}"
            );
        }
    }
}

#[test]
fn truncate_8k_segments() {
    run("truncate_8k_segments", Mode::Truncate, 8 << 10, 220, 280);
}

#[test]
fn tear_8k_segments() {
    run("tear_8k_segments", Mode::Tear, 8 << 10, 220, 280);
}

#[test]
fn truncate_32k_segments() {
    run("truncate_32k_segments", Mode::Truncate, 32 << 10, 400, 240);
}

#[test]
fn tear_32k_segments() {
    run("tear_32k_segments", Mode::Tear, 32 << 10, 400, 240);
}

/// A crash right after a rotation leaves an empty last segment (its first record torn).
/// A `ReadLimit::Scan` reader — what `tidelog wal check` and `dump` use without a control
/// file — must return every record and then end.
///
/// Regression (fixed): `Reader::next` loops forever when the bytes at the current segment's own first
/// position are zero: it finds the position in `segments`, `open_segment_for` returns early
/// because that segment is already open, and the loop `continue`s without progress. An
/// empty log (`Writer::open` then `Reader::open(Scan)`) hangs the same way.
#[test]

fn scan_terminates_when_the_last_segment_is_empty() {
    let img = Image::build("scan", 8 << 10, 150, 7);
    let work = tempfile::tempdir().unwrap();
    let dir = img.copy_to(work.path());
    let (last_first, last_name) = img.segs.last().unwrap().clone();
    // Tear the last segment's first record, recover: the last segment is now empty.
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(&last_name))
        .unwrap();
    f.set_len(HDR + 10).unwrap();
    drop(f);
    let w = Writer::open(work.path(), &img.tablet, opts(img.seg_size)).unwrap();
    assert_eq!(w.written_pos(), last_first);
    drop(w);
    std::fs::remove_file(dir.join("control")).unwrap();
    let want: Vec<_> = img
        .recs
        .iter()
        .filter(|r| r.0 < last_first)
        .cloned()
        .collect();
    let (root, t) = (work.path().to_path_buf(), img.tablet.clone());
    let got = with_timeout(Duration::from_secs(20), move || {
        let mut r = Reader::open(&root, &t, ReadLimit::Scan).unwrap();
        read_all(&mut r, 10_000)
    })
    .expect("Reader::next (Scan) did not return within 20 s");
    assert!(got.1.is_none(), "{:?}", got.1);
    assert!(got.0 == want);

    // The same with a brand-new, empty log.
    let empty = tempfile::tempdir().unwrap();
    drop(Writer::open(empty.path(), &img.tablet, opts(img.seg_size)).unwrap());
    let (root, t) = (empty.path().to_path_buf(), img.tablet.clone());
    let got = with_timeout(Duration::from_secs(20), move || {
        Reader::open(&root, &t, ReadLimit::Scan)
            .unwrap()
            .next()
            .map(|r| r.is_none())
    })
    .expect("Reader::next (Scan) of an empty log did not return within 20 s");
    assert!(got.unwrap());
}
