//! Segment files: naming, listing a tablet directory, creating and mapping a segment.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use memmap2::MmapRaw;
use zerocopy::{FromBytes, IntoBytes};

use crate::control::CONTROL_FILE;
use crate::error::{Error, Result};
use crate::format::{SegmentHeader, SEGMENT_HEADER_LEN};
use crate::fsutil;
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::retention::ACKED_FILE;

/// The acked file's write in progress (`fsutil::write_atomic` of [`ACKED_FILE`]).
const ACKED_PARTIAL: &str = "acked.partial";

pub(crate) const SEGMENT_SUFFIX: &str = ".seg";

/// The next segment, prepared ahead of a rotation (preallocated, mapped, no header yet).
/// A `*.partial` name, so recovery deletes it like any interrupted creation.
pub(crate) const SPARE_FILE: &str = "spare.seg.partial";

/// Bytes per `madvise(MADV_POPULATE_*)` call when pre-faulting a spare segment.
const POPULATE_CHUNK: usize = 2 << 20;

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
        // `acked.partial` is the acked file's atomic write in progress — the shipper's, in
        // another process: neither ours to delete (that broke its rename, or this open when
        // the rename won) nor a problem if left over (its next write truncates it).
        if name == CONTROL_FILE || name == ACKED_FILE || name == ACKED_PARTIAL {
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

/// Removes a `.partial` file whose creation failed; a failure to is only logged (recovery
/// deletes it at the next open).
fn remove_leftover(path: &Path) {
    if let Err(e) = fs::remove_file(path) {
        if e.kind() != std::io::ErrorKind::NotFound {
            tracing::warn!(file = %path.display(), error = %e, "cannot remove a segment whose creation failed; recovery will");
        }
    }
}

/// A segment mapped read-write by the writer.
#[derive(Debug)]
pub(crate) struct MappedSegment {
    pub path: PathBuf,
    pub first: WalPos,
    /// Bytes available for records (file size − header).
    pub capacity: usize,
    map: Arc<MmapRaw>,
    file: File,
    /// Some of it was written with `O_DIRECT`: synced with `fdatasync`, which also writes
    /// back what reached it through the page cache, not with `msync` of the mapping.
    direct: AtomicBool,
}

/// Asks the kernel to drop the clean, unmapped page-cache pages holding the record area's
/// `[from, to)` of segment file `file`, from the page of `from` up to the last whole page
/// before `to` (`posix_fadvise(DONTNEED)`).
pub fn drop_cached(file: &File, path: &Path, from: usize, to: usize) -> Result<()> {
    use std::os::fd::AsRawFd;
    let start = (SEGMENT_HEADER_LEN + from) / 4096 * 4096;
    let end = SEGMENT_HEADER_LEN + to;
    if end <= start {
        return Ok(());
    }
    let (start, len) = (start as i64, (end - start) as i64);
    // SAFETY: plain syscall on a valid fd.
    let rc =
        unsafe { libc::posix_fadvise(file.as_raw_fd(), start, len, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(Error::io(
            "drop cached pages of",
            path,
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(())
}

impl MappedSegment {
    /// Marks the segment as written (from now on) with `O_DIRECT`.
    pub fn mark_direct(&self) {
        self.direct.store(true, Ordering::Release);
    }

    pub fn is_direct(&self) -> bool {
        self.direct.load(Ordering::Acquire)
    }

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
        let made = (|| {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&partial)
                .map_err(|e| Error::io("create", &partial, e))?;
            fail::fail_point!("wal::segment::create::err", |_| Err(Error::io(
                "preallocate",
                &partial,
                std::io::Error::from_raw_os_error(libc::ENOSPC)
            )));
            fsutil::preallocate(&file, &partial, size)?;
            let h = SegmentHeader::new(tablet, first, size);
            use std::os::unix::fs::FileExt;
            file.write_all_at(h.as_bytes(), 0)
                .map_err(|e| Error::io("write", &partial, e))?;
            if durable {
                file.sync_data()
                    .map_err(|e| Error::io("fdatasync", &partial, e))?;
            }
            Ok(())
        })();
        if let Err(e) = made {
            // Give back what a failed preallocation took (on a full disk, it is what the
            // next try needs); recovery deletes a leftover `.partial` anyway.
            remove_leftover(&partial);
            return Err(e);
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
            map: Arc::new(map),
            file,
            direct: AtomicBool::new(false),
        })
    }

    /// Creates the spare segment file (`spare.seg.partial`, preallocated to `size`, no
    /// header) and maps it. It becomes a segment with [`MappedSegment::activate_spare`].
    pub fn create_spare(dir: &Path, size: u64) -> Result<MappedSegment> {
        let path = dir.join(SPARE_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| Error::io("create", &path, e))?;
        if let Err(e) = fsutil::preallocate(&file, &path, size) {
            remove_leftover(&path);
            return Err(e);
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| Error::io("map", &path, e))?;
        Ok(MappedSegment {
            path,
            first: WalPos::ZERO,
            capacity: size as usize - SEGMENT_HEADER_LEN,
            map: Arc::new(map),
            file,
            direct: AtomicBool::new(false),
        })
    }

    /// Turns a spare into the segment starting at `first`, with the same steps and
    /// durability as [`MappedSegment::create`]: header, fdatasync, rename, fsync directory
    /// (the syncs only when `durable`).
    pub fn activate_spare(
        mut self,
        dir: &Path,
        tablet: &TabletId,
        first: WalPos,
        durable: bool,
    ) -> Result<MappedSegment> {
        use std::os::unix::fs::FileExt;
        let size = (self.capacity + SEGMENT_HEADER_LEN) as u64;
        let h = SegmentHeader::new(tablet, first, size);
        self.file
            .write_all_at(h.as_bytes(), 0)
            .map_err(|e| Error::io("write", &self.path, e))?;
        if durable {
            self.file
                .sync_data()
                .map_err(|e| Error::io("fdatasync", &self.path, e))?;
        }
        let path = dir.join(segment_file_name(first));
        fs::rename(&self.path, &path).map_err(|e| Error::io("rename", &self.path, e))?;
        if durable {
            fsutil::fsync_dir(dir)?;
        }
        self.path = path;
        self.first = first;
        Ok(self)
    }

    /// A handle that pre-faults this segment's mapping from another thread.
    pub fn prefaulter(&self) -> Prefaulter {
        Prefaulter {
            map: self.map.clone(),
        }
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

    /// See [`drop_cached`].
    pub fn drop_cached(&self, from: usize, to: usize) -> Result<()> {
        drop_cached(&self.file, &self.path, from, to)
    }

    /// Writes `bytes` at offset `off` of the record area through the file (`pwrite`), not
    /// the mapping: the page cache is the same, so the mapping, readers and `sync_range`
    /// see them alike, but the writing thread takes no page faults, and pages it never
    /// mapped need no write-protecting (TLB shootdowns) when they are written back.
    pub fn write_at(&self, off: usize, bytes: &[u8]) -> Result<()> {
        assert!(
            off + bytes.len() <= self.capacity,
            "write past the segment's capacity"
        );
        std::os::unix::fs::FileExt::write_all_at(
            &self.file,
            bytes,
            (SEGMENT_HEADER_LEN + off) as u64,
        )
        .map_err(|e| Error::io("write", &self.path, e))
    }

    /// fdatasync the file (for segments written with `O_DIRECT`, whose bytes are not in
    /// the mapping's page cache).
    pub fn sync_data(&self) -> Result<()> {
        fail::fail_point!("wal::sync::err", |_| Err(Error::io(
            "fdatasync",
            &self.path,
            std::io::Error::other("failpoint wal::sync::err")
        )));
        self.file
            .sync_data()
            .map_err(|e| Error::io("fdatasync", &self.path, e))
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

/// Pre-faults a segment mapping (page cache populated and page tables filled) so that the
/// writer's appends do not take the page faults inline. Best effort: errors only stop it.
#[derive(Debug)]
pub(crate) struct Prefaulter {
    map: Arc<MmapRaw>,
}

impl Prefaulter {
    /// `madvise(MADV_POPULATE_WRITE)` (or `_READ` when `!write`) over the whole mapping in
    /// chunks, until done or `stop` is set. Populating for write makes the pages dirty (the
    /// writer then takes no fault at all); for read, pages are in the page cache and mapped
    /// read-only (the writer takes a cheap write-protect fault per page, no zeroing).
    pub fn run(&self, write: bool, stop: &AtomicBool) {
        let advice = if write {
            libc::MADV_POPULATE_WRITE
        } else {
            libc::MADV_POPULATE_READ
        };
        let len = self.map.len();
        let mut off = 0;
        while off < len && !stop.load(Ordering::Relaxed) {
            let n = POPULATE_CHUNK.min(len - off);
            // SAFETY: [off, off + n) lies inside the mapping, which `self.map` keeps alive;
            // MADV_POPULATE_* only faults pages in and never changes their contents.
            let rc = unsafe {
                libc::madvise(
                    self.map.as_mut_ptr().add(off).cast::<libc::c_void>(),
                    n,
                    advice,
                )
            };
            if rc != 0 {
                tracing::debug!(error = %std::io::Error::last_os_error(), "segment pre-fault stopped");
                return;
            }
            off += n;
        }
    }
}
