//! Fuzz-style property tests of every decoder of disk input in the WAL crate: the record
//! walks of a run of records (`take_records`, `verify_records`, which a data frame's payload
//! also goes through; the wire messages' own are in `proto/tests/fuzz.rs`), records and
//! record bodies, segment headers, a WAL directory recovered
//! on open (arbitrary bytes after a valid prefix, a whole segment of arbitrary bytes, an
//! arbitrary `control` file), the `acked` file, the JSON record form (`wal append` input)
//! and the ids and times parsed from text.
//!
//! Each decoder never panics on arbitrary bytes and answers a clear error; what it accepts
//! re-encodes to the bytes it was given, so a mutated encoding either decodes to the value
//! it encoded or is refused (changed bytes never pass a checksum); and
//! `decode(encode(x)) == x` for arbitrary `x`.
//!
//! CI runs the short form, a few hundred cases each (`cargo test -p tidelog-wal --test
//! fuzz`). The long form runs 100 000 cases of each property (minutes in release; the
//! directory properties want a tmpfs):
//!
//! ```text
//! TMPDIR=/dev/shm cargo test --release -p tidelog-wal --test fuzz -- --ignored --nocapture --test-threads 1
//! ```
//!
//! `FUZZ_CASES=N` sets the case count of either form and `FUZZ_SEED=S` replays a run: each
//! property prints its seed and time.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;

use common::fuzzkit::*;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use tidelog_wal::control::{ControlView, CONTROL_FILE, CONTROL_MAGIC, CONTROL_VERSION};
use tidelog_wal::format::{
    record_checksum, RecordHeader, SegmentHeader, MIN_SEGMENT_SIZE, RECORD_HEADER_LEN,
    SEGMENT_HEADER_LEN,
};
use tidelog_wal::json::{from_json_line, from_json_line_or, to_json_line};
use tidelog_wal::record::{parse_record, Parsed};
use tidelog_wal::retention::{read_acked, write_acked, ACKED_FILE};
use tidelog_wal::*;
use zerocopy::{FromBytes, IntoBytes};

fuzz_tests! {
    record_walks: 300;
    record_parse: 500;
    record_body_decode: 500;
    record_round_trip: 300;
    segment_header_decode: 500;
    recovery_after_a_valid_prefix: 48;
    recovery_of_an_arbitrary_segment: 48;
    recovery_with_an_arbitrary_control_file: 48;
    acked_file: 100;
    json_arbitrary_lines: 500;
    json_round_trip: 300;
    ids_from_text: 1000;
    ids_round_trip: 500;
}

fn tablet() -> TabletId {
    "fz".parse().unwrap()
}

/// The records a reader of `area` (records from position `first`) finds before the first
/// invalid one, and where they end.
fn valid_prefix(area: &[u8], first: u64) -> (Vec<Record>, usize) {
    let mut off = 0;
    let mut recs: Vec<Record> = Vec::new();
    while let Parsed::Record { record, len } = parse_record(&area[off..], first + off as u64) {
        if recs.last().is_some_and(|l| record.ht <= l.ht) {
            break;
        }
        recs.push(record);
        off += len;
    }
    (recs, off)
}

// ---- record walks ------------------------------------------------------------------------

/// The sender's and receiver's walks over records (valid ones, mutated, or followed by
/// arbitrary bytes): `take_records` takes a whole, verified prefix within `max` and names
/// the damaged record that stopped it at the position right after; `verify_records` and
/// `whole_records_prefix` agree with it.
fn record_walks(cases: u32) {
    let valid = (0u64..u64::MAX / 2, prop::collection::vec(body(), 0..6))
        .prop_map(|(first, b)| (first, place(first, 1, b).1));
    let input = (
        valid,
        mutations(),
        any::<bool>(),
        prop::collection::vec(any::<u8>(), 0..64),
        any::<Index>(),
    );
    check(
        "record_walks",
        cases,
        input,
        |((first, orig), ms, mutated, tail, max)| {
            let mut b = if mutated { mutate(&orig, &ms) } else { orig };
            b.extend_from_slice(&tail);
            let max = max.index(b.len() + 1);
            let t = tablet();
            let first = WalPos(first);
            let taken = verify::take_records(&t, &b, first, max);
            prop_assert!(taken.len <= max.min(b.len()));
            let good = verify::verify_records(&t, &b[..taken.len], first, None)
                .map_err(|e| TestCaseError::fail(format!("taken prefix does not verify: {e}")))?;
            prop_assert_eq!(good, taken.summary);
            if let Some(e) = &taken.bad {
                message_text(e)?;
                prop_assert_eq!(e.pos, first.add(taken.len as u64));
            }
            let (prefix, n, _) = verify::whole_records_prefix(&b, max);
            prop_assert!(prefix >= taken.len && prefix <= max.min(b.len()));
            prop_assert!(n >= taken.summary.count);
            match verify::verify_records(&t, &b, first, None) {
                Ok(s) if max >= b.len() => {
                    prop_assert_eq!(taken.len, b.len());
                    prop_assert_eq!(s, taken.summary);
                }
                Ok(_) => {}
                Err(e) => {
                    message_text(&e)?;
                }
            }
            Ok(())
        },
    );
}

// ---- records and headers -------------------------------------------------------------------

/// A record header with a right checksum over `body` (kind, flags, ht and reserved
/// arbitrary), at `pos`.
fn sealed_record(kind: u8, flags: u8, reserved: u16, ht: u64, pos: u64, body: &[u8]) -> Vec<u8> {
    use zerocopy::little_endian::{U16, U32, U64};
    let h = RecordHeader {
        checksum: U64::new(0),
        len: U32::new(body.len() as u32),
        kind,
        flags,
        reserved: U16::new(reserved),
        ht: U64::new(ht),
        pos: U64::new(pos),
    };
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(body);
    let sum = record_checksum(&out);
    out[..8].copy_from_slice(&sum.to_le_bytes());
    out
}

/// A record's bytes at `pos`: valid, mutated, random, or a right checksum over a body of
/// arbitrary (or mutated valid) bytes with any kind and flags.
fn record_input() -> impl Strategy<Value = (u64, Option<Vec<u8>>, Vec<u8>)> {
    let pos = prop_oneof![0u64..1 << 20, any::<u64>()];
    let valid = (pos, record())
        .prop_map(|(p, r)| (p, r.encode(WalPos(p)).unwrap()))
        .boxed();
    let plain = valid
        .clone()
        .prop_flat_map(|(p, v)| random_or_mutated(Just(v), 200).prop_map(move |x| (p, x)))
        .prop_map(|(p, (orig, b))| (p, orig, b));
    let sealed = (
        valid,
        prop_oneof![1u8..=5, any::<u8>()],
        prop_oneof![0u8..4, any::<u8>()],
        prop_oneof![4 => Just(0u16), 1 => any::<u16>()],
        mutations(),
    )
        .prop_map(|((p, v), kind, flags, reserved, ms)| {
            let body = mutate(&v[RECORD_HEADER_LEN..], &ms);
            let ht = u64::from_le_bytes(v[16..24].try_into().unwrap());
            (p, None, sealed_record(kind, flags, reserved, ht, p, &body))
        });
    prop_oneof![plain, sealed]
}

/// `parse_record` on anything: a record only from bytes that are its encoding (never from
/// changed bytes under a valid checksum), the end only on zeros, else a reason.
fn record_parse(cases: u32) {
    check("record_parse", cases, record_input(), |(pos, orig, b)| {
        match parse_record(&b, pos) {
            Parsed::Record { record, len } => {
                prop_assert_eq!(&record.encode(WalPos(pos)).unwrap()[..], &b[..len]);
                if let Some(orig) = orig {
                    prop_assert_eq!(&b[..len], &orig[..], "changed bytes passed the checksum");
                }
            }
            Parsed::End => prop_assert!(b.iter().take(RECORD_HEADER_LEN).all(|&x| x == 0)),
            Parsed::Invalid(reason) => prop_assert!(!reason.is_empty()),
            // A checksum that matches a body this build does not decode: only from bytes
            // sealed under a fresh checksum, never from changed bytes under the old one.
            Parsed::Undecodable { len, reason, .. } => {
                prop_assert!(!reason.is_empty() && len <= b.len());
                prop_assert!(orig.is_none(), "changed bytes passed the checksum");
            }
        }
        Ok(())
    });
}

/// `Record::decode_body` on any kind, flags and body: what it accepts re-encodes to the
/// same body bytes, of the same kind.
fn record_body_decode(cases: u32) {
    let valid = record().prop_map(|r| {
        let b = r.encode(WalPos(0)).unwrap();
        (r.kind(), b[13], b[RECORD_HEADER_LEN..].to_vec())
    });
    let input = valid.prop_flat_map(|(kind, flags, body)| {
        (
            prop_oneof![3 => Just(kind as u8), 1 => 1u8..=5],
            prop_oneof![3 => Just(flags), 1 => any::<u8>()],
            random_or_mutated(Just(body), 200),
        )
    });
    check(
        "record_body_decode",
        cases,
        input,
        |(kind, flags, (_, body))| {
            let kind = format::Kind::from_u8(kind).unwrap();
            match Record::decode_body(kind, flags, HybridTime(7), &body) {
                Ok(r) => {
                    prop_assert_eq!(r.kind(), kind);
                    let n = r.encoded_body_len().map_err(|e| {
                        TestCaseError::fail(format!("decoded {r:?} does not encode: {e}"))
                    })?;
                    let mut out = vec![0u8; n];
                    r.encode_body(&mut out);
                    prop_assert_eq!(out, body);
                }
                Err(reason) => prop_assert!(!reason.is_empty()),
            }
            Ok(())
        },
    );
}

/// Every record parses back from its encoding, whatever follows it.
fn record_round_trip(cases: u32) {
    let input = (
        record(),
        any::<u64>(),
        prop::collection::vec(any::<u8>(), 0..64),
    );
    check("record_round_trip", cases, input, |(r, pos, tail)| {
        let mut b = r.encode(WalPos(pos)).unwrap();
        let len = b.len();
        b.extend_from_slice(&tail);
        match parse_record(&b, pos) {
            Parsed::Record { record, len: n } => {
                prop_assert_eq!(record, r);
                prop_assert_eq!(n, len);
            }
            other => prop_assert!(false, "{other:?}"),
        }
        prop_assert!(matches!(parse_record(&b, pos ^ 1), Parsed::Invalid(_)));
        Ok(())
    });
}

/// Segment headers: valid ones validate with their fields; mutated ones are refused unless
/// unchanged; random ones, and ones with a right checksum over arbitrary fields, validate
/// only with a sane header and tablet length.
fn segment_header_decode(cases: u32) {
    let valid = (tablet_id(), any::<u64>(), any::<u64>()).prop_map(|(t, first, size)| {
        SegmentHeader::new(&t, WalPos(first), size)
            .as_bytes()
            .to_vec()
    });
    let resealed = prop::collection::vec(any::<u8>(), SEGMENT_HEADER_LEN - 8).prop_map(|mut b| {
        b[..8].copy_from_slice(&format::SEGMENT_MAGIC);
        b[8..12].copy_from_slice(&format::FORMAT_VERSION.to_le_bytes());
        let sum = hash::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        (None, b)
    });
    let input = prop_oneof![3 => random_or_mutated(valid, 160), 1 => resealed];
    check("segment_header_decode", cases, input, |(orig, b)| {
        let Ok((h, _)) = SegmentHeader::read_from_prefix(&b) else {
            prop_assert!(b.len() < SEGMENT_HEADER_LEN);
            return Ok(());
        };
        prop_assert!(h.tablet_str().len() <= 64);
        match h.validate() {
            Ok(()) => {
                if let Some(orig) = &orig {
                    prop_assert_eq!(&b[..SEGMENT_HEADER_LEN], &orig[..], "changed bytes passed");
                }
                prop_assert_eq!(h.header_len.get() as usize, SEGMENT_HEADER_LEN);
                prop_assert!((1..=64).contains(&h.tablet_str().len()));
            }
            Err(reason) => {
                prop_assert!(!reason.is_empty());
                prop_assert!(orig
                    .as_ref()
                    .is_none_or(|o| b[..SEGMENT_HEADER_LEN] != o[..]));
            }
        }
        Ok(())
    });
}

// ---- a WAL directory on open ---------------------------------------------------------------

fn seg_name(first: u64) -> String {
    format!("{first:016x}.seg")
}

/// A control file as the writer leaves it (layout in `wal/src/control.rs`).
fn control_bytes(written: u64, durable: u64, oldest: u64) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    b[..8].copy_from_slice(&CONTROL_MAGIC);
    b[8..12].copy_from_slice(&CONTROL_VERSION.to_le_bytes());
    b[16..24].copy_from_slice(&written.to_le_bytes());
    b[24..32].copy_from_slice(&durable.to_le_bytes());
    b[32..40].copy_from_slice(&oldest.to_le_bytes());
    b
}

fn wal_opts(segment_size: u64) -> WalOptions {
    WalOptions {
        segment_size,
        prefault: false,
        ..Default::default()
    }
}

/// Everything a reader finds in the tablet's log (at most `max` records), or the error that
/// stopped it.
fn read_log(root: &Path, limit: ReadLimit, max: usize) -> Result<Vec<Record>, Error> {
    let mut r = Reader::open(root, &tablet(), limit)?;
    let mut out = Vec::new();
    while out.len() < max {
        match r.next()? {
            Some((_, rec)) => out.push(rec),
            None => break,
        }
    }
    Ok(out)
}

/// After a successful open: the log holds `want`, a new record appends after them, and a
/// reopened log holds both.
fn live_after_open(root: &Path, mut w: Writer, want: &[Record]) -> Result<(), TestCaseError> {
    let got = read_log(root, ReadLimit::Durable, want.len() + 1)
        .map_err(|e| TestCaseError::fail(format!("reading the recovered log: {e}")))?;
    prop_assert_eq!(&got[..], want);
    let ht = want.last().map_or(HybridTime(1), |r| r.ht.next());
    let next = Record::new(ht, Body::Heartbeat);
    w.append(&next)
        .map_err(|e| TestCaseError::fail(format!("append after recovery: {e}")))?;
    w.commit(SyncPolicy::Always)
        .map_err(|e| TestCaseError::fail(format!("commit after recovery: {e}")))?;
    w.close().unwrap();
    let w = Writer::open(root, &tablet(), wal_opts(MIN_SEGMENT_SIZE))
        .map_err(|e| TestCaseError::fail(format!("reopen after recovery: {e}")))?;
    drop(w);
    let mut all = want.to_vec();
    all.push(next);
    // The cut tail is gone: a scan without the control file's bound ends cleanly too.
    for limit in [ReadLimit::Durable, ReadLimit::Scan] {
        let got = read_log(root, limit, all.len() + 1)
            .map_err(|e| TestCaseError::fail(format!("reading the reopened log: {e}")))?;
        prop_assert_eq!(&got, &all);
    }
    Ok(())
}

/// The one segment's file: a header for a segment of `size` bytes, then `area`, padded with
/// zeros to `size` unless `short`. Returns the record area as written.
fn write_segment(dir: &Path, area: &[u8], size: u64, short: bool) -> Vec<u8> {
    let mut f = SegmentHeader::new(&tablet(), WalPos(0), size)
        .as_bytes()
        .to_vec();
    f.extend_from_slice(area);
    if !short {
        f.resize(size as usize, 0);
    }
    std::fs::write(dir.join(seg_name(0)), &f).unwrap();
    f.split_off(SEGMENT_HEADER_LEN)
}

/// What follows the valid records of a log.
#[derive(Clone, Debug)]
enum Tail {
    Bytes(Vec<u8>),
    /// A record at the end position, damaged (or not) by the mutations.
    Damaged(Body, Vec<Mutation>),
}

/// Valid records, then arbitrary bytes (random, zeros then random, or a damaged record), in
/// the last segment, with or without a control file: the log opens with exactly the records
/// of the valid prefix (and any record the damage left whole), the rest is cut, and the log
/// appends and reopens.
fn recovery_after_a_valid_prefix(cases: u32) {
    let tail = prop_oneof![
        prop::collection::vec(any::<u8>(), 1..600).prop_map(Tail::Bytes),
        (1usize..64, prop::collection::vec(any::<u8>(), 1..200)).prop_map(|(z, mut r)| {
            r.splice(0..0, std::iter::repeat_n(0u8, z));
            Tail::Bytes(r)
        }),
        (body(), mutations()).prop_map(|(b, ms)| Tail::Damaged(b, ms)),
    ];
    let input = (
        prop::collection::vec(body(), 0..5),
        tail,
        prop_oneof![Just(None), Just(Some(0i64)), Just(Some(1)), Just(Some(-1))],
        any::<bool>(),
    );
    check(
        "recovery_after_a_valid_prefix",
        cases,
        input,
        |(bodies, tail, control, short)| {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join(tablet().as_str());
            std::fs::create_dir(&dir).unwrap();
            let (recs, mut area) = place(0, 100, bodies);
            let end = area.len() as u64;
            match tail {
                Tail::Bytes(b) => area.extend_from_slice(&b),
                Tail::Damaged(b, ms) => {
                    let r = Record::new(HybridTime(1000), b)
                        .encode(WalPos(end))
                        .unwrap();
                    area.extend(mutate(&r, &ms));
                }
            }
            let size = (SEGMENT_HEADER_LEN + area.len()).next_multiple_of(4096) as u64;
            // The padding may complete a damaged record (a removed zero byte comes back).
            let area = write_segment(&dir, &area, size, short);
            if let Some(delta) = control {
                let durable = end.saturating_add_signed(delta * 50);
                std::fs::write(dir.join(CONTROL_FILE), control_bytes(durable, durable, 0)).unwrap();
            }
            let (want, want_end) = valid_prefix(&area, 0);
            prop_assert!(want.starts_with(&recs));
            let w = Writer::open(d.path(), &tablet(), wal_opts(size))
                .map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
            prop_assert_eq!(w.recovery_report().end, WalPos(want_end as u64));
            live_after_open(d.path(), w, &want)
        },
    );
}

/// The records of `area` (from position `first`) up to offset `stop`, if they are valid
/// and end exactly there.
fn records_until(area: &[u8], first: u64, stop: usize) -> Option<Vec<Record>> {
    let (mut recs, mut off) = (Vec::new(), 0);
    while off < stop {
        let Parsed::Record { record, len } = parse_record(&area[off..], first + off as u64) else {
            return None;
        };
        recs.push(record);
        off += len;
    }
    (off == stop).then_some(recs)
}

/// A log whose first segment is arbitrary bytes (random, or a valid segment mutated) —
/// the last one, or (`sealed`) followed by a valid segment where its records should end,
/// opened with every segment verified. Read first: the reader stops with an error rather
/// than panic. Opening either recovers exactly the valid records (cutting a torn tail of
/// the last segment) and goes on, or refuses with a corruption error naming the file.
fn recovery_of_an_arbitrary_segment(cases: u32) {
    let valid = prop::collection::vec(body(), 0..5).prop_map(|b| {
        let (_, area) = place(0, 100, b);
        let mut f = SegmentHeader::new(&tablet(), WalPos(0), 4096)
            .as_bytes()
            .to_vec();
        f.extend_from_slice(&area);
        f.resize(f.len().next_multiple_of(4096), 0);
        (area.len(), f)
    });
    let input = valid.prop_flat_map(|(end, image)| {
        (
            Just(end),
            random_or_mutated(Just(image), 400),
            any::<bool>(),
        )
    });
    check(
        "recovery_of_an_arbitrary_segment",
        cases,
        input,
        |(end, (_, file), sealed)| {
            let sealed = sealed && end > 0;
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join(tablet().as_str());
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join(seg_name(0)), &file).unwrap();
            let next = Record::new(HybridTime(1000), Body::Heartbeat);
            if sealed {
                let mut f = SegmentHeader::new(&tablet(), WalPos(end as u64), 4096)
                    .as_bytes()
                    .to_vec();
                f.extend(next.encode(WalPos(end as u64)).unwrap());
                f.resize(4096, 0);
                std::fs::write(dir.join(seg_name(end as u64)), f).unwrap();
            }
            if let Err(e) = read_log(d.path(), ReadLimit::Scan, 1000) {
                message_text(&e)?;
            }
            let header_ok = SegmentHeader::read_from_prefix(&file).is_ok_and(|(h, _)| {
                h.validate().is_ok() && h.tablet_str() == b"fz" && h.first_pos.get() == 0
            });
            let area = file.get(SEGMENT_HEADER_LEN..).unwrap_or_default();
            // What opening must find: every record up to the next segment and its record;
            // or, in a last segment, the valid prefix (a short file is a torn creation).
            let want = if sealed {
                records_until(area, 0, end)
                    .filter(|_| header_ok)
                    .map(|mut r| {
                        r.push(next.clone());
                        (r, end + RECORD_HEADER_LEN)
                    })
            } else if header_ok || file.len() < SEGMENT_HEADER_LEN {
                Some(valid_prefix(area, 0))
            } else {
                None
            };
            let opts = WalOptions {
                verify_on_open: true,
                ..wal_opts(4096)
            };
            match (Writer::open(d.path(), &tablet(), opts), want) {
                (Ok(w), Some((want, want_end))) => {
                    prop_assert_eq!(w.recovery_report().end, WalPos(want_end as u64));
                    live_after_open(d.path(), w, &want)?;
                }
                (Ok(w), None) => {
                    prop_assert!(false, "opened a damaged log: {:?}", w.recovery_report())
                }
                (Err(e), _) => {
                    let text = message_text(&e)?;
                    prop_assert!(e.is_corruption(), "{e}");
                    prop_assert!(text.contains(&seg_name(0)), "{text}");
                }
            }
            Ok(())
        },
    );
}

/// A valid log with an arbitrary `control` file (random, or a valid one mutated, of any
/// length): a reader that trusts it stops with an error or reads a run of the log's records,
/// never panics; the writer rebuilds it from the segments and opens with every record.
fn recovery_with_an_arbitrary_control_file(cases: u32) {
    let input = (prop::collection::vec(body(), 0..5), any::<u64>()).prop_flat_map(|(b, extra)| {
        let (recs, area) = place(0, 100, b);
        let end = area.len() as u64;
        let valid = prop_oneof![
            Just(control_bytes(end, end, 0)),
            Just(control_bytes(end, end + extra % 4096, extra % 64)),
        ];
        (
            Just(recs),
            Just(area),
            prop_oneof![
                3 => random_or_mutated(valid, 5000),
                1 => prop::collection::vec(any::<u8>(), 4096).prop_map(|b| (None, b)),
            ],
        )
    });
    check(
        "recovery_with_an_arbitrary_control_file",
        cases,
        input,
        |(recs, area, (_, control))| {
            let d = tempfile::tempdir().unwrap();
            let dir = d.path().join(tablet().as_str());
            std::fs::create_dir(&dir).unwrap();
            write_segment(&dir, &area, 4096, false);
            std::fs::write(dir.join(CONTROL_FILE), &control).unwrap();
            for limit in [ReadLimit::Durable, ReadLimit::Written] {
                match read_log(d.path(), limit, recs.len() + 1) {
                    // From the first position the file says is retained: a run of the log.
                    Ok(got) => prop_assert!(
                        got.is_empty() || recs.windows(got.len()).any(|w| w == &got[..]),
                        "{got:?}"
                    ),
                    Err(e) => {
                        message_text(&e)?;
                    }
                }
            }
            let w = Writer::open(d.path(), &tablet(), wal_opts(4096))
                .map_err(|e| TestCaseError::fail(format!("open: {e}")))?;
            let end = WalPos(area.len() as u64);
            prop_assert_eq!(w.recovery_report().end, end);
            let view = ControlView::open(&dir).unwrap().unwrap();
            prop_assert_eq!((view.written(), view.durable()), (end, end));
            live_after_open(d.path(), w, &recs)
        },
    );
}

/// The `acked` file: any bytes but a valid encoding are refused with an error naming the
/// file; the valid ones give their position.
fn acked_file(cases: u32) {
    let valid = any::<u64>().prop_map(|p| {
        let mut b = b"TDLACKD\0".to_vec();
        b.extend_from_slice(&p.to_le_bytes());
        let sum = hash::xxh3_64(&b);
        b.extend_from_slice(&sum.to_le_bytes());
        b
    });
    check(
        "acked_file",
        cases,
        (random_or_mutated(valid, 40), any::<u64>()),
        |((orig, b), pos)| {
            let d = tempfile::tempdir().unwrap();
            write_acked(d.path(), WalPos(pos)).unwrap();
            prop_assert_eq!(read_acked(d.path()).unwrap(), Some(WalPos(pos)));
            std::fs::write(d.path().join(ACKED_FILE), &b).unwrap();
            match read_acked(d.path()) {
                Ok(Some(p)) => {
                    prop_assert_eq!(b.len(), 24);
                    prop_assert_eq!(&b[8..16], &p.0.to_le_bytes()[..]);
                    if let Some(orig) = orig {
                        prop_assert_eq!(&b, &orig, "changed bytes passed the checksum");
                    }
                }
                Ok(None) => prop_assert!(false, "an acked file read as absent"),
                Err(e) => {
                    let text = message_text(&e)?;
                    prop_assert!(e.is_corruption() && text.contains(ACKED_FILE), "{text}");
                }
            }
            Ok(())
        },
    );
}

// ---- text ----------------------------------------------------------------------------------

/// JSON-shaped lines: objects with record field names (and others) and values of every
/// JSON type.
fn json_shaped() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        Just(serde_json::Value::Null),
        any::<bool>().prop_map(serde_json::Value::from),
        any::<u64>().prop_map(serde_json::Value::from),
        any::<i64>().prop_map(serde_json::Value::from),
        any::<f64>().prop_map(serde_json::Value::from),
        "[a-z0-9:\\-]{0,40}".prop_map(serde_json::Value::from),
        prop_oneof![
            Just("write"),
            Just("intent"),
            Just("commit"),
            Just("abort"),
            Just("heartbeat")
        ]
        .prop_map(serde_json::Value::from),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::from),
            prop::collection::vec(("(key|value|b64|[a-z]{1,3})", inner), 0..3)
                .prop_map(|kv| { serde_json::Value::Object(kv.into_iter().collect()) }),
        ]
    });
    let name = "(tablet|pos|kind|ht|txn|trx_id|gtid|participants|ops|x)";
    prop::collection::vec((name, value), 0..8).prop_map(|fields| {
        let body: Vec<String> = fields
            .iter()
            .map(|(k, v)| format!("{}:{v}", serde_json::Value::from(k.as_str())))
            .collect();
        format!("{{{}}}", body.join(","))
    })
}

/// `from_json_line` on arbitrary text, JSON-shaped lines and mutated valid lines: never a
/// panic; what parses writes back as a line that parses the same.
fn json_arbitrary_lines(cases: u32) {
    let valid = (tablet_id(), any::<u64>(), record())
        .prop_map(|(t, p, r)| to_json_line(&t, WalPos(p), &r).into_bytes());
    let input = prop_oneof![
        any::<String>(),
        json_shaped(),
        random_or_mutated(valid, 200).prop_map(|(_, b)| String::from_utf8_lossy(&b).into_owned()),
    ];
    check("json_arbitrary_lines", cases, input, |line| {
        let dflt = tablet();
        for parsed in [from_json_line(&line), from_json_line_or(&line, Some(&dflt))] {
            match parsed {
                Ok((t, r)) => {
                    let again = to_json_line(&t, WalPos(0), &r);
                    prop_assert_eq!(from_json_line(&again), Ok((t, r)));
                }
                Err(e) => {
                    message_text(&e)?;
                }
            }
        }
        Ok(())
    });
}

/// Every record's JSON line parses back to it and prints the same line again; read by
/// `serde_json` it has the documented form (`ht` a decimal string, `pos` a number, keys and
/// values strings or `{"b64": …}`).
fn json_round_trip(cases: u32) {
    use base64::Engine as _;
    check(
        "json_round_trip",
        cases,
        (tablet_id(), any::<u64>(), record()),
        |(t, pos, r)| {
            let line = to_json_line(&t, WalPos(pos), &r);
            prop_assert!(!line.contains('\n'), "{}", line);
            let (t2, r2) =
                from_json_line(&line).map_err(|e| TestCaseError::fail(format!("{e}: {line}")))?;
            prop_assert_eq!(&t2, &t);
            prop_assert_eq!(&r2, &r);
            prop_assert_eq!(to_json_line(&t2, WalPos(pos), &r2), line.clone());

            let v: serde_json::Value = serde_json::from_str(&line).unwrap();
            let ht = r.ht.0.to_string();
            prop_assert_eq!(v["ht"].as_str(), Some(ht.as_str()));
            prop_assert_eq!(v["pos"].as_u64(), Some(pos));
            prop_assert_eq!(v["kind"].as_str(), Some(r.kind().name()));
            let has_ops = matches!(r.body, Body::Write { .. } | Body::Intent { .. });
            prop_assert_eq!(v.get("ops").is_some(), has_ops);
            let expect = |b: &[u8]| match std::str::from_utf8(b) {
                Ok(s) => serde_json::json!(s),
                Err(_) => serde_json::json!({
                    "b64": base64::engine::general_purpose::STANDARD.encode(b)
                }),
            };
            for (op, j) in r
                .ops()
                .iter()
                .zip(v["ops"].as_array().into_iter().flatten())
            {
                prop_assert_eq!(&j["key"], &expect(&op.key));
                match &op.value {
                    Some(val) => prop_assert_eq!(&j["value"], &expect(val)),
                    None => prop_assert!(j["value"].is_null()),
                }
            }
            Ok(())
        },
    );
}

/// What parses from text prints as text that parses the same (JSON strings too).
fn parses_stably<T>(s: &str) -> Result<(), TestCaseError>
where
    T: std::str::FromStr
        + std::fmt::Display
        + PartialEq
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
    T::Err: std::fmt::Display,
{
    let json = serde_json::to_string(s).unwrap();
    match s.parse::<T>() {
        Ok(v) => {
            let again = v.to_string().parse::<T>().ok();
            prop_assert_eq!(again.as_ref(), Some(&v));
            if let Ok(j) = serde_json::from_str::<T>(&json) {
                prop_assert_eq!(j, v);
            }
        }
        Err(e) => {
            message_text(&e)?;
            prop_assert!(serde_json::from_str::<T>(&json).is_err());
        }
    }
    Ok(())
}

/// Ids and times parsed from text (JSON lines, the admin API, the command line).
fn ids_from_text(cases: u32) {
    let input = prop_oneof![
        any::<String>(),
        "[0-9:\\- ]{0,44}",
        "(0x)?[0-9a-fA-F]{0,34}",
        "[A-Za-z0-9_./-]{0,70}",
    ];
    check("ids_from_text", cases, input, |s| {
        parses_stably::<TabletId>(&s)?;
        parses_stably::<TrxId>(&s)?;
        parses_stably::<Gtid>(&s)?;
        parses_stably::<TxnId>(&s)?;
        parses_stably::<HybridTime>(&s)?;
        if let Ok(p) = s.parse::<WalPos>() {
            prop_assert_eq!(p.to_string().parse::<WalPos>(), Ok(p));
        }
        Ok(())
    });
}

/// Every id and time parses back from how it prints.
fn ids_round_trip(cases: u32) {
    let input = (tablet_id(), trx(), gtid(), txn(), any::<u64>());
    check("ids_round_trip", cases, input, |(t, trx, g, x, n)| {
        let again = t.to_string().parse::<TabletId>();
        prop_assert_eq!(again.as_ref(), Ok(&t));
        if let Some(trx) = trx {
            prop_assert_eq!(trx.to_string().parse::<TrxId>(), Ok(trx));
        }
        if let Some(g) = g {
            prop_assert_eq!(g.to_string().parse::<Gtid>(), Ok(g));
        }
        prop_assert_eq!(x.to_string().parse::<TxnId>(), Ok(x));
        prop_assert_eq!(
            HybridTime(n).to_string().parse::<HybridTime>(),
            Ok(HybridTime(n))
        );
        prop_assert_eq!(WalPos(n).to_string().parse::<WalPos>(), Ok(WalPos(n)));
        Ok(())
    });
}

/// A sealed segment's records end where the next segment begins, whatever bytes follow them
/// in its file (as recovery and the shipper's tailer take it): a reader moves on to the next
/// segment there instead of reporting the bytes as a damaged record.
#[test]
fn a_reader_leaves_a_sealed_segment_where_the_next_begins() {
    let d = tempfile::tempdir().unwrap();
    let mut w = Writer::open(d.path(), &tablet(), wal_opts(4096)).unwrap();
    let mut want = Vec::new();
    for i in 0..6u64 {
        let r = Record::new(
            HybridTime(10 + i),
            Body::Write {
                ops: vec![Op::put(vec![i as u8], vec![7u8; 900])],
                trx_id: None,
                gtid: None,
            },
        );
        w.append(&r).unwrap();
        want.push(r);
    }
    w.commit(SyncPolicy::Always).unwrap();
    w.close().unwrap();
    let dir = d.path().join(tablet().as_str());
    let segs = reader::list_segments(&dir).unwrap();
    assert!(segs.len() >= 2, "{segs:?}");
    let (next, _) = segs[1];
    // Damage the unused room of the first segment, right where the second begins.
    let off = SEGMENT_HEADER_LEN as u64 + next.0;
    assert!(off + 8 <= 4096);
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::File::options()
            .write(true)
            .open(&segs[0].1)
            .unwrap(),
        &[0xEE; 8],
        off,
    )
    .unwrap();
    for limit in [ReadLimit::Durable, ReadLimit::Scan] {
        assert_eq!(read_log(d.path(), limit, 100).unwrap(), want, "{limit:?}");
    }
    let opts = WalOptions {
        verify_on_open: true,
        ..wal_opts(4096)
    };
    let w = Writer::open(d.path(), &tablet(), opts).unwrap();
    assert_eq!(w.recovery_report().records_scanned, want.len() as u64);
}
