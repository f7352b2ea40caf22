//! Scanning segments and recovering a tablet's log on open.
//!
//! Recovery cases (what `Writer::open` does with what it finds), in order:
//!
//! | # | found | action |
//! |---|-------|--------|
//! | 1 | `*.partial` file (interrupted atomic write or segment creation), except `acked.partial` (the shipper's write of `acked` in progress, from another process) | delete it |
//! | 2 | a file that is not a segment, `control` or `acked` | error naming the file |
//! | 3 | no segment at all: a new log, or one whose first segment could not be created (its `.seg.partial`, e.g. a preallocation that found no space, went in case 1) and whose control file publishes nothing beyond the start | create the first segment; if that fails again its `.partial` is removed at once and the error names it. Meanwhile readers and the shipper see an empty log, not a truncated one |
//! | 4 | a segment header with bad magic, version, checksum, tablet or position | error naming file, offset 0 |
//! | 5 | the **last** segment shorter than its header (creation torn) | delete it; the previous one is last |
//! | 6 | a record that fails validation in a segment that is **not the last** | error naming file and offset |
//! | 7 | a segment that is not the last whose records do not end exactly where the next begins | error naming file and offset |
//! | 8 | in the last segment, an invalid record followed by a valid record further on, below the durable position the control file last published | error: corruption before the tail |
//! | 9 | in the last segment, an invalid or partial record with nothing valid after it | torn tail: cut at the last whole valid record, zero the rest, report the bytes dropped |
//! | 10 | in the last segment, zeros after the last record but non-zero bytes further on | torn tail (unsynced pages written out of order): zero them, report the bytes |
//! | 11 | the cut lies below the `durable_pos` of the control file | as 9, and the report's `lost_durable` says so (logged as a warning) |
//!
//! Only the last segment is scanned record by record on open (older ones were sealed whole
//! and are verified by every read and by `tidelog wal check`), unless
//! [`WalOptions::verify_on_open`](crate::WalOptions) asks for all.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;

use crate::error::{Error, Result};
use crate::format::{RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::fsutil;
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::record::{parse_record, Parsed, Record};
use crate::segment::{self, MappedSegment};
use crate::time::HybridTime;

/// How the valid records of a segment end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// Zeros (or the end of the file) after the last record.
    Clean,
    /// Bytes after the last valid record that are not a record: `garbage` bytes from data
    /// offset `at`.
    Torn {
        at: usize,
        reason: String,
        garbage: u64,
    },
}

/// What scanning one segment's record area found.
#[derive(Debug, Clone)]
pub struct Scan {
    pub records: u64,
    /// Offset in the record area one past the last valid record.
    pub end: usize,
    pub first_ht: Option<HybridTime>,
    pub last_ht: Option<HybridTime>,
    pub tail: Tail,
}

/// Where a segment's records must end.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Expect {
    /// Sealed: records end exactly at this record-area offset (where the next segment begins).
    SealedAt(usize),
    /// The last segment: a torn tail is tolerated unless valid records follow below `durable`.
    Last { durable: Option<WalPos> },
}

pub(crate) fn corruption(
    tablet: &TabletId,
    path: &Path,
    data_off: usize,
    reason: impl Into<String>,
) -> Error {
    Error::Corruption {
        tablet: tablet.to_string(),
        file: path.to_path_buf(),
        offset: (SEGMENT_HEADER_LEN + data_off) as u64,
        reason: reason.into(),
    }
}

/// Scans the record area `data` of the segment at `path` starting at logical `first`.
/// Calls `each` for every valid record in order.
pub(crate) fn scan_area(
    tablet: &TabletId,
    path: &Path,
    first: WalPos,
    data: &[u8],
    prev_ht: Option<HybridTime>,
    expect: Expect,
    mut each: impl FnMut(WalPos, &Record) -> Result<()>,
) -> Result<Scan> {
    let mut off = 0usize;
    let mut scan = Scan {
        records: 0,
        end: 0,
        first_ht: None,
        last_ht: None,
        tail: Tail::Clean,
    };
    let mut last_ht = prev_ht;
    loop {
        if let Expect::SealedAt(e) = expect {
            if off == e {
                break;
            }
            if off > e {
                return Err(corruption(
                    tablet,
                    path,
                    off,
                    format!(
                        "records run past position {}, where the next segment begins",
                        first.add(e as u64)
                    ),
                ));
            }
        }
        let pos = first.add(off as u64);
        let parsed = match parse_record(&data[off..], pos.0) {
            Parsed::Record { record, .. } if last_ht.is_some_and(|l| record.ht <= l) => {
                Parsed::Invalid(format!(
                    "record ht {} is not greater than the previous ht {}",
                    record.ht,
                    last_ht.unwrap_or_default()
                ))
            }
            Parsed::Undecodable { ht, .. } if last_ht.is_some_and(|l| ht <= l) => {
                Parsed::Invalid(format!(
                    "record ht {ht} is not greater than the previous ht {}",
                    last_ht.unwrap_or_default()
                ))
            }
            p => p,
        };
        match parsed {
            Parsed::Record { record, len } => {
                each(pos, &record)?;
                scan.records += 1;
                scan.first_ht.get_or_insert(record.ht);
                last_ht = Some(record.ht);
                scan.last_ht = Some(record.ht);
                off += len;
            }
            Parsed::Undecodable { ht, len, reason } => {
                // Framed and summed as written: kept (a reader refuses it, naming it).
                tracing::warn!(
                    tablet = %tablet,
                    file = %path.display(),
                    offset = SEGMENT_HEADER_LEN + off,
                    %pos,
                    "a whole record whose body does not decode is kept: {reason}"
                );
                scan.records += 1;
                scan.first_ht.get_or_insert(ht);
                last_ht = Some(ht);
                scan.last_ht = Some(ht);
                off += len;
            }
            Parsed::End => {
                if let Expect::SealedAt(e) = expect {
                    return Err(corruption(
                        tablet,
                        path,
                        off,
                        format!(
                            "records end at position {pos} but the next segment begins at {}",
                            first.add(e as u64)
                        ),
                    ));
                }
                let garbage = nonzero_extent(&data[off..]);
                if garbage > 0 {
                    scan.tail = Tail::Torn {
                        at: off,
                        reason: "non-zero bytes after the end of the records".into(),
                        garbage,
                    };
                }
                break;
            }
            Parsed::Invalid(reason) => {
                let Expect::Last { durable } = expect else {
                    return Err(corruption(tablet, path, off, reason));
                };
                let below_durable = durable.is_none_or(|d| pos < d);
                if below_durable {
                    if let Some(q) = find_valid_after(data, first, off + 1) {
                        return Err(corruption(
                            tablet,
                            path,
                            off,
                            format!(
                                "{reason}; a valid record follows at file offset {}, so this is corruption before the tail, not a torn write",
                                SEGMENT_HEADER_LEN + q
                            ),
                        ));
                    }
                }
                scan.tail = Tail::Torn {
                    at: off,
                    reason,
                    garbage: nonzero_extent(&data[off..]).max(1),
                };
                break;
            }
        }
    }
    scan.end = off;
    Ok(scan)
}

/// Bytes from the start of `data` through its last non-zero byte.
fn nonzero_extent(data: &[u8]) -> u64 {
    // Scan 8 bytes at a time from the end.
    let mut end = data.len();
    while end >= 8 {
        let w = u64::from_ne_bytes(data[end - 8..end].try_into().unwrap_or([0; 8]));
        if w != 0 {
            break;
        }
        end -= 8;
    }
    while end > 0 && data[end - 1] == 0 {
        end -= 1;
    }
    end as u64
}

/// The first offset at or after `from` holding a valid record for its position.
fn find_valid_after(data: &[u8], first: WalPos, from: usize) -> Option<usize> {
    if data.len() < RECORD_HEADER_LEN {
        return None;
    }
    (from..=data.len() - RECORD_HEADER_LEN).find(|&q| {
        // Cheap filter: the header's position field (bytes 24..32) must name this offset.
        let p = u64::from_le_bytes(data[q + 24..q + 32].try_into().unwrap_or([0; 8]));
        p == first.0 + q as u64
            && matches!(
                parse_record(&data[q..], p),
                Parsed::Record { .. } | Parsed::Undecodable { .. }
            )
    })
}

/// Where recovery cut a torn tail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut {
    pub file: PathBuf,
    /// Byte offset in `file`.
    pub offset: u64,
    pub pos: WalPos,
    pub reason: String,
}

/// What opening a tablet's log found and did.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    pub tablet: TabletId,
    pub segments: usize,
    pub oldest: WalPos,
    /// End of the valid records: where the next append goes.
    pub end: WalPos,
    pub last_ht: Option<HybridTime>,
    pub records_scanned: u64,
    /// Bytes of torn tail that were removed.
    pub dropped_bytes: u64,
    pub cut: Option<Cut>,
    /// Set when the control file had published a `durable_pos` beyond the recovered end.
    pub lost_durable: Option<WalPos>,
    /// Leftover `.partial` files and torn segment files that were removed.
    pub removed: Vec<PathBuf>,
}

pub(crate) struct Recovered {
    pub report: RecoveryReport,
    pub segments: Vec<WalPos>,
    pub active: MappedSegment,
    pub active_off: usize,
}

/// Maps a segment file read-only for scanning.
pub(crate) fn map_readonly(path: &Path) -> Result<(File, Option<Mmap>)> {
    let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
    let len = file
        .metadata()
        .map_err(|e| Error::io("stat", path, e))?
        .len();
    if len == 0 {
        return Ok((file, None));
    }
    // SAFETY: segment files are never truncated while mapped by the process that owns the
    // tablet lock; other processes only read them.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io("map", path, e))?;
    Ok((file, Some(map)))
}

fn record_area(map: &Option<Mmap>) -> &[u8] {
    match map {
        Some(m) if m.len() >= SEGMENT_HEADER_LEN => &m[SEGMENT_HEADER_LEN..],
        _ => &[],
    }
}

/// Recovers the log in `dir` (the caller holds the tablet lock).
pub(crate) fn recover(
    dir: &Path,
    tablet: &TabletId,
    control_prev: Option<(WalPos, WalPos)>,
    segment_size: u64,
    verify_all: bool,
    durable_create: bool,
) -> Result<Recovered> {
    let listing = segment::list_dir(dir)?;
    let mut removed = Vec::new();
    for p in &listing.partial {
        std::fs::remove_file(p).map_err(|e| Error::io("remove", p, e))?;
        removed.push(p.clone());
    }
    let mut segs = listing.segments;
    let mut dropped = 0u64;
    let mut segment_sizes = Vec::with_capacity(segs.len());
    // Headers of every segment (cases 4 and 5).
    let mut i = 0;
    while i < segs.len() {
        let (first, path) = &segs[i];
        let file = File::open(path).map_err(|e| Error::io("open", path, e))?;
        match segment::read_header(&file, path, tablet, *first)? {
            Some(h) => segment_sizes.push(h.segment_size.get()),
            None if i + 1 == segs.len() => {
                let len = file
                    .metadata()
                    .map_err(|e| Error::io("stat", path, e))?
                    .len();
                tracing::warn!(file = %path.display(), "last segment's header is torn; removing it");
                std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e))?;
                fsutil::fsync_dir(dir)?;
                dropped += len;
                removed.push(path.clone());
                segs.pop();
                continue;
            }
            None => {
                return Err(Error::Corruption {
                    tablet: tablet.to_string(),
                    file: path.clone(),
                    offset: 0,
                    reason: "segment is shorter than its header but is not the last one".into(),
                })
            }
        }
        if i > 0 && segs[i - 1].0 >= *first {
            return Err(Error::Corruption {
                tablet: tablet.to_string(),
                file: path.clone(),
                offset: 0,
                reason: "segment positions are not increasing".into(),
            });
        }
        i += 1;
    }
    let durable_hint = control_prev.map(|(_, d)| d);

    if segs.is_empty() {
        let start = match removed
            .iter()
            .filter_map(|p| {
                p.file_name()?
                    .to_str()
                    .and_then(segment::parse_segment_name)
            })
            .min()
        {
            Some(p) => p,
            None => WalPos::ZERO,
        };
        if let Some((w, _)) = control_prev.filter(|(w, _)| *w > start) {
            return Err(Error::Corruption {
                tablet: tablet.to_string(),
                file: dir.join(crate::control::CONTROL_FILE),
                offset: 0,
                reason: format!(
                    "the control file says the log reaches position {w}, but there are no segments"
                ),
            });
        }
        let active = MappedSegment::create(dir, tablet, start, segment_size, durable_create)?;
        return Ok(Recovered {
            report: RecoveryReport {
                tablet: tablet.clone(),
                segments: 1,
                oldest: start,
                end: start,
                last_ht: None,
                records_scanned: 0,
                dropped_bytes: dropped,
                cut: None,
                lost_durable: durable_hint.filter(|d| *d > start),
                removed,
            },
            segments: vec![start],
            active,
            active_off: 0,
        });
    }

    let mut records_scanned = 0u64;
    let last_idx = segs.len() - 1;
    // Optionally verify every sealed segment, oldest first (cases 6 and 7).
    let mut prev_ht = None;
    if verify_all {
        for k in 0..last_idx {
            let (first, path) = &segs[k];
            let (_f, map) = map_readonly(path)?;
            let end = segs[k + 1].0.since(*first) as usize;
            let s = scan_area(
                tablet,
                path,
                *first,
                record_area(&map),
                prev_ht,
                Expect::SealedAt(end),
                |_, _| Ok(()),
            )?;
            records_scanned += s.records;
            prev_ht = s.last_ht.or(prev_ht);
        }
    }

    // The last segment, record by record (cases 8–11).
    let (last_first, last_path) = segs[last_idx].clone();
    let (file, map) = map_readonly(&last_path)?;
    let scan = scan_area(
        tablet,
        &last_path,
        last_first,
        record_area(&map),
        prev_ht,
        Expect::Last {
            durable: durable_hint,
        },
        |_, _| Ok(()),
    )?;
    drop(map);
    records_scanned += scan.records;
    let end = last_first.add(scan.end as u64);
    let mut cut = None;
    if let Tail::Torn {
        at,
        reason,
        garbage,
    } = &scan.tail
    {
        let offset = (SEGMENT_HEADER_LEN + at) as u64;
        tracing::warn!(
            tablet = %tablet, file = %last_path.display(), offset, bytes = garbage, %reason,
            "torn tail: cutting the log back to the last whole record"
        );
        zero_range(&file, &last_path, offset, *garbage)?;
        dropped += garbage;
        cut = Some(Cut {
            file: last_path.clone(),
            offset,
            pos: end,
            reason: reason.clone(),
        });
    }
    // A truncated file is grown back to its preallocated size.
    let want = segment_sizes[last_idx];
    let have = file
        .metadata()
        .map_err(|e| Error::io("stat", &last_path, e))?
        .len();
    drop(file);
    if have < want || cut.is_some() {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&last_path)
            .map_err(|e| Error::io("open", &last_path, e))?;
        if have < want {
            fsutil::preallocate(&f, &last_path, want)?;
        }
        f.sync_data()
            .map_err(|e| Error::io("fdatasync", &last_path, e))?;
    }

    // Last ht: from the last segment, or the newest earlier segment that has records.
    let mut last_ht = scan.last_ht.or(prev_ht);
    if scan.last_ht.is_none() && !verify_all {
        for k in (0..last_idx).rev() {
            let (first, path) = &segs[k];
            let (_f, map) = map_readonly(path)?;
            let end_off = segs[k + 1].0.since(*first) as usize;
            let s = scan_area(
                tablet,
                path,
                *first,
                record_area(&map),
                None,
                Expect::SealedAt(end_off),
                |_, _| Ok(()),
            )?;
            records_scanned += s.records;
            if s.last_ht.is_some() {
                last_ht = s.last_ht;
                break;
            }
        }
    }

    let lost_durable = durable_hint.filter(|d| *d > end);
    if let Some(d) = lost_durable {
        tracing::warn!(tablet = %tablet, durable = %d, end = %end,
            "the log ends before the durable position last published: durable data was lost (disk or operator damage)");
    }
    let active = MappedSegment::open(last_path, last_first)?;
    Ok(Recovered {
        report: RecoveryReport {
            tablet: tablet.clone(),
            segments: segs.len(),
            oldest: segs[0].0,
            end,
            last_ht,
            records_scanned,
            dropped_bytes: dropped,
            cut,
            lost_durable,
            removed,
        },
        segments: segs.iter().map(|(p, _)| *p).collect(),
        active,
        active_off: scan.end,
    })
}

/// Writes `len` zero bytes at `offset` of `file`.
fn zero_range(file: &File, path: &Path, offset: u64, len: u64) -> Result<()> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(|e| Error::io("open", path, e))?;
    let _ = file;
    let file_len = f.metadata().map_err(|e| Error::io("stat", path, e))?.len();
    let end = (offset + len).min(file_len);
    let zeros = vec![0u8; 1 << 20];
    let mut at = offset;
    while at < end {
        let n = ((end - at) as usize).min(zeros.len());
        f.write_all_at(&zeros[..n], at)
            .map_err(|e| Error::io("write", path, e))?;
        at += n as u64;
    }
    Ok(())
}
