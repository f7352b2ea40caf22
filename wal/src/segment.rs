//! Segment files: naming, listing a tablet directory, creating and mapping a segment.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use memmap2::MmapRaw;
use zerocopy::{FromBytes, IntoBytes};

use crate::control::CONTROL_FILE;
use crate::error::{Error, Result};
use crate::format::{SegmentHeader, SEGMENT_HEADER_LEN};
use crate::fsutil;
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::retention::ACKED_FILE;

pub(crate) const SEGMENT_SUFFIX: &str = ".seg";

/// `<first_pos as 16 lowercase hex digits>.seg`
pub(crate) fn segment_file_name(first: WalPos) -> String {
    format!("{:016x}{SEGMENT_SUFFIX}", first.0)
}

pub(crate) fn parse_segment_name(name: &str) -> Option<WalPos> {
    let hex = name.strip_suffix(SEGMENT_SUFFIX)?;
    if hex.len() != 16 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok().map(WalPos)
}

/// What a tablet directory holds.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Segments by first position, ascending.
    pub segments: Vec<(WalPos, PathBuf)>,
    /// Leftovers of interrupted atomic writes (`*.partial`), safe to delete.
    pub partial: Vec<PathBuf>,
}

/// Lists a tablet directory; any file that does not belong there is an error naming it.
pub(crate) fn list_dir(dir: &Path) -> Result<Listing> {
    let mut l = Listing::default();
    let rd = fs::read_dir(dir).map_err(|e| Error::io("list", dir, e))?;
    for ent in rd {
        let ent = ent.map_err(|e| Error::io("list", dir, e))?;
        let path = ent.path();
        let Some(name) = ent.file_name().to_str().map(str::to_owned) else {
            return Err(Error::UnexpectedFile {
                path,
                reason: "file name is not UTF-8".into(),
            });
        };
        if name == CONTROL_FILE || name == ACKED_FILE {
            continue;
        }
        if name.ends_with(".partial") {
            l.partial.push(path);
            continue;
        }
        match parse_segment_name(&name) {
            Some(p) => {
                let ft = ent.file_type().map_err(|e| Error::io("stat", &path, e))?;
                if !ft.is_file() {
                    return Err(Error::UnexpectedFile {
                        path,
                        reason: "a segment name that is not a regular file".into(),
                    });
                }
                l.segments.push((p, path));
            }
            None => {
                return Err(Error::UnexpectedFile {
                    path,
                    reason: format!(
                        "not a segment (<16 hex digits>{SEGMENT_SUFFIX}), `{CONTROL_FILE}` or `{ACKED_FILE}`"
                    ),
                })
            }
        }
    }
    l.segments.sort_by_key(|(p, _)| *p);
    Ok(l)
}

/// Reads and validates the header of a segment file; checks it belongs to `tablet` at
/// `first`. `Ok(None)` when the file is shorter than a header (a torn creation).
pub(crate) fn read_header(
    file: &File,
    path: &Path,
    tablet: &TabletId,
    first: WalPos,
) -> Result<Option<SegmentHeader>> {
    let mut buf = [0u8; SEGMENT_HEADER_LEN];
    let n = fsutil::read_at_most(file, path, &mut buf, 0)?;
    if n < SEGMENT_HEADER_LEN {
        return Ok(None);
    }
    let corrupt = |reason: String| Error::Corruption {
        tablet: tablet.to_string(),
        file: path.to_path_buf(),
        offset: 0,
        reason,
    };
    let h = SegmentHeader::read_from_bytes(&buf[..])
        .map_err(|_| corrupt("unreadable segment header".into()))?;
    h.validate().map_err(corrupt)?;
    if h.tablet_str() != tablet.as_str().as_bytes() {
        return Err(corrupt(format!(
            "segment belongs to tablet {:?}, not {tablet}",
            String::from_utf8_lossy(h.tablet_str())
        )));
    }
    if h.first_pos.get() != first.0 {
        return Err(corrupt(format!(
            "segment header says first position {}, its file name says {first}",
            h.first_pos.get()
        )));
    }
    Ok(Some(h))
}

/// A segment mapped read-write by the writer.
#[derive(Debug)]
pub(crate) struct MappedSegment {
    pub path: PathBuf,
    pub first: WalPos,
    /// Bytes available for records (file size − header).
    pub capacity: usize,
    map: MmapRaw,
}

impl MappedSegment {
    /// Creates a new preallocated segment durably: `.partial`, header, fdatasync, rename,
    /// fsync directory.
    pub fn create(
        dir: &Path,
        tablet: &TabletId,
        first: WalPos,
        size: u64,
        durable: bool,
    ) -> Result<MappedSegment> {
        let path = dir.join(segment_file_name(first));
        let partial = dir.join(format!("{}.partial", segment_file_name(first)));
        {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&partial)
                .map_err(|e| Error::io("create", &partial, e))?;
            fsutil::preallocate(&file, &partial, size)?;
            let h = SegmentHeader::new(tablet, first, size);
            use std::os::unix::fs::FileExt;
            file.write_all_at(h.as_bytes(), 0)
                .map_err(|e| Error::io("write", &partial, e))?;
            if durable {
                file.sync_data()
                    .map_err(|e| Error::io("fdatasync", &partial, e))?;
            }
        }
        fs::rename(&partial, &path).map_err(|e| Error::io("rename", &partial, e))?;
        if durable {
            fsutil::fsync_dir(dir)?;
        }
        Self::open(path, first)
    }

    /// Maps an existing segment (header already validated by the caller).
    pub fn open(path: PathBuf, first: WalPos) -> Result<MappedSegment> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len() as usize;
        if len < SEGMENT_HEADER_LEN {
            return Err(Error::Corruption {
                tablet: "?".into(),
                file: path,
                offset: 0,
                reason: "segment shorter than its header".into(),
            });
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| Error::io("map", &path, e))?;
        Ok(MappedSegment {
            path,
            first,
            capacity: len - SEGMENT_HEADER_LEN,
            map,
        })
    }

    /// Logical position one past the last byte this segment can hold.
    pub fn limit(&self) -> WalPos {
        self.first.add(self.capacity as u64)
    }

    /// The record area `[off, off + len)` for writing.
    ///
    /// # Safety
    /// The caller is the only writer of this segment (the tablet lock and `&mut Writer`
    /// guarantee it) and does not hold two overlapping slices at once.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn data_mut(&self, off: usize, len: usize) -> &mut [u8] {
        assert!(
            off + len <= self.capacity,
            "write past the segment's capacity"
        );
        // SAFETY: bounds checked above; exclusivity is the caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(self.map.as_mut_ptr().add(SEGMENT_HEADER_LEN + off), len)
        }
    }

    /// msync(MS_SYNC) the record bytes `[from, to)` (offsets in the record area).
    pub fn sync_range(&self, from: usize, to: usize) -> Result<()> {
        if to <= from {
            return Ok(());
        }
        fail::fail_point!("wal::sync::err", |_| Err(Error::io(
            "msync",
            &self.path,
            std::io::Error::other("failpoint wal::sync::err")
        )));
        self.map
            .flush_range(SEGMENT_HEADER_LEN + from, to - from)
            .map_err(|e| Error::io("msync", &self.path, e))
    }
}
