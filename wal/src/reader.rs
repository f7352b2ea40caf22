//! `Reader`: reads a tablet's log from any record position, validating every record, up to
//! `durable_pos` (or `written_pos` on request). Uses positional reads on the segment files,
//! so it works from another process while the writer runs.
//!
//! A log written with `O_DIRECT` (`WalOptions::direct_io`) is best read so too
//! ([`Reader::set_direct_io`]): its bytes are not in the page cache, and a buffered read
//! would bring each one into it from the device and then copy it out. A direct read puts
//! the blocks straight into a page-aligned buffer:
//!
//! ```text
//!  file:   … | block k         | …  | block m         | …
//!                 ^ pos's offset              ^ pos + want (or the readable end)
//!  buf:      [ lead | bytes from pos …              | rest of block m ]
//! ```
//!
//! Bytes after the readable end in the last block are read but never looked at (a live
//! writer may still be rewriting that block; the committed prefix is the same in every
//! version of it).

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::control::ControlView;
use crate::error::{Error, Result};
use crate::format::{RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::fsutil;
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::record::{header_problem, parse_record, Parsed, Record};
use crate::recovery::corruption;
use crate::segment;
use crate::time::HybridTime;

/// How far a reader may read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadLimit {
    /// Up to the control file's `durable_pos` (what the source would recover).
    #[default]
    Durable,
    /// Up to the control file's `written_pos` (committed, maybe not yet durable).
    Written,
    /// No control file: every valid record up to the end of the last segment.
    Scan,
}

#[derive(Debug)]
struct OpenSeg {
    first: WalPos,
    path: PathBuf,
    file: File,
    /// The same file opened with `O_DIRECT`, when reading so ([`Reader::set_direct_io`]) and
    /// the file system takes it.
    direct: Option<File>,
    /// Record-area bytes in the file.
    capacity: u64,
}

/// The read buffer: heap memory, or page-aligned memory (an anonymous mapping) for direct
/// reads.
#[derive(Debug)]
enum ReadBuf {
    Heap(Vec<u8>),
    Aligned(memmap2::MmapMut),
}

impl ReadBuf {
    fn bytes(&self) -> &[u8] {
        match self {
            ReadBuf::Heap(v) => v,
            ReadBuf::Aligned(m) => m,
        }
    }

    /// At least `len` bytes, page-aligned when `aligned`; the contents are not kept.
    fn reserve(&mut self, len: usize, aligned: bool, path: &Path) -> Result<&mut [u8]> {
        match self {
            ReadBuf::Heap(v) if !aligned => {
                if v.len() < len {
                    v.resize(len, 0);
                }
            }
            // Aligned memory serves buffered reads as well.
            ReadBuf::Aligned(m) if m.len() >= len => {}
            _ if aligned => {
                // Room for a whole direct read-ahead at any lead: mapped once.
                let m = memmap2::MmapMut::map_anon(len.max(DIRECT_BUF + crate::direct::BLOCK))
                    .map_err(|e| Error::io("map a read buffer for", path, e))?;
                *self = ReadBuf::Aligned(m);
            }
            _ => *self = ReadBuf::Heap(vec![0; len]),
        }
        Ok(match self {
            ReadBuf::Heap(v) => v,
            ReadBuf::Aligned(m) => m,
        })
    }
}

const BUF: usize = 1 << 20;
/// Read-ahead of a scan with direct reads.
const DIRECT_BUF: usize = 4 << 20;
/// Read-ahead of [`Reader::read_at`]: random reads of single records should not each pull
/// a megabyte of the log into the buffer.
const RANDOM_BUF: usize = 16 << 10;

/// Reads records of one tablet in order.
#[derive(Debug)]
pub struct Reader {
    tablet: TabletId,
    dir: PathBuf,
    limit: ReadLimit,
    control: Option<ControlView>,
    segments: Vec<WalPos>,
    cur: Option<OpenSeg>,
    pos: WalPos,
    last_ht: Option<HybridTime>,
    buf: ReadBuf,
    /// Logical position of the buffered bytes, where they start in `buf`, and how many.
    buf_pos: WalPos,
    buf_off: usize,
    buf_len: usize,
    /// Read segments with `O_DIRECT` ([`Reader::set_direct_io`]).
    direct_io: bool,
    /// Read with `O_DIRECT` at least this far behind the readable end
    /// ([`Reader::set_direct_backlog_reads`]).
    direct_backlogs: Option<u64>,
    scan_done: bool,
    /// Read-ahead size of the next fill: `BUF` when scanning, `RANDOM_BUF` for `read_at`.
    window: usize,
}

impl Reader {
    /// Opens the log of `tablet` under `wal_dir/<tablet>/`, positioned at its oldest record.
    pub fn open(wal_dir: &Path, tablet: &TabletId, limit: ReadLimit) -> Result<Reader> {
        let dir = wal_dir.join(tablet.as_str());
        if !dir.is_dir() {
            return Err(Error::NoTablet {
                tablet: tablet.clone(),
                path: dir,
            });
        }
        let control = match limit {
            ReadLimit::Scan => None,
            _ => match ControlView::open(&dir)? {
                Some(c) => Some(c),
                None => {
                    return Err(Error::Corruption {
                        tablet: tablet.to_string(),
                        file: dir.join(crate::control::CONTROL_FILE),
                        offset: 0,
                        reason: "no control file; read with ReadLimit::Scan".into(),
                    })
                }
            },
        };
        let mut r = Reader {
            tablet: tablet.clone(),
            dir,
            limit,
            control,
            segments: Vec::new(),
            cur: None,
            pos: WalPos::ZERO,
            last_ht: None,
            buf: ReadBuf::Heap(Vec::new()),
            buf_pos: WalPos::ZERO,
            buf_off: 0,
            buf_len: 0,
            direct_io: false,
            direct_backlogs: None,
            scan_done: false,
            window: BUF,
        };
        r.refresh_segments()?;
        let oldest = r.oldest();
        r.seek(oldest)?;
        Ok(r)
    }

    pub fn tablet(&self) -> &TabletId {
        &self.tablet
    }

    /// Reads the segments with `O_DIRECT` from now on (`on`), or through the page cache: for
    /// a log written with `WalOptions::direct_io`, whose bytes are not in the page cache. A
    /// segment whose file system refuses `O_DIRECT` is read through the page cache.
    pub fn set_direct_io(&mut self, on: bool) {
        self.direct_io = on;
        self.reopen_direct();
    }

    /// Reads with `O_DIRECT` while at least `behind` bytes behind the readable end, and
    /// through the page cache closer to it: for a log written through the page cache whose
    /// writer drops from it what lies that far below its end (`Writer::drop_cached_below`),
    /// so a reader that keeps up finds what was just written in the cache. `None`: off.
    pub fn set_direct_backlog_reads(&mut self, behind: Option<u64>) {
        self.direct_backlogs = behind;
        self.reopen_direct();
    }

    fn reopen_direct(&mut self) {
        let want = self.direct_io || self.direct_backlogs.is_some();
        self.buf_len = 0;
        if let Some(seg) = &mut self.cur {
            if want != seg.direct.is_some() {
                seg.direct = if want { open_direct(&seg.path) } else { None };
            }
        }
    }

    /// Whether the current segment is open for `O_DIRECT` reads.
    pub fn direct_io_in_use(&self) -> bool {
        self.cur.as_ref().is_some_and(|s| s.direct.is_some())
    }

    /// Position of the next record `next` returns.
    pub fn position(&self) -> WalPos {
        self.pos
    }

    /// First retained position.
    pub fn oldest(&self) -> WalPos {
        let from_dir = self.segments.first().copied().unwrap_or_default();
        match &self.control {
            Some(c) => c.oldest().max(from_dir),
            None => from_dir,
        }
    }

    /// First positions of the retained segments, ascending (as of the last directory look).
    pub fn segment_starts(&self) -> &[WalPos] {
        &self.segments
    }

    /// Current readable end, or `None` in scan mode.
    pub fn end(&self) -> Option<WalPos> {
        match (&self.control, self.limit) {
            (Some(c), ReadLimit::Durable) => Some(c.durable()),
            (Some(c), ReadLimit::Written) => Some(c.written()),
            _ => None,
        }
    }

    fn refresh_segments(&mut self) -> Result<()> {
        let l = segment::list_dir(&self.dir)?;
        self.segments = l.segments.into_iter().map(|(p, _)| p).collect();
        Ok(())
    }

    /// Positions the reader at `pos`, which must be a record boundary (checked on the next
    /// read) at or above the oldest retained position and at or below the end.
    pub fn seek(&mut self, pos: WalPos) -> Result<()> {
        self.refresh_segments()?;
        let oldest = self.oldest();
        if self.segments.is_empty() && pos == oldest && self.end().is_none_or(|e| e <= pos) {
            // A log without a segment yet, e.g. its first one could not be created (no
            // space): empty, not truncated. Its records are read once the writer has
            // created the segment.
            self.pos = pos;
            self.last_ht = None;
            self.buf_len = 0;
            self.scan_done = false;
            self.cur = None;
            return Ok(());
        }
        if pos < oldest || self.segments.is_empty() {
            return Err(Error::Truncated {
                tablet: self.tablet.clone(),
                requested: pos,
                oldest,
            });
        }
        if let Some(end) = self.end() {
            if pos > end {
                return Err(Error::BadPosition {
                    tablet: self.tablet.clone(),
                    pos,
                    reason: format!("beyond the readable end {end}"),
                });
            }
        }
        self.pos = pos;
        self.last_ht = None;
        self.buf_len = 0;
        self.scan_done = false;
        self.open_segment_for(pos)?;
        Ok(())
    }

    /// Reads the record at `pos` (a record boundary; checked), keeping the read buffer when
    /// `pos` lies in it, so random reads of recent records are cheap. The reader is left
    /// positioned after that record.
    pub fn read_at(&mut self, pos: WalPos) -> Result<Record> {
        if self.segments.first().is_none_or(|f| pos < *f) {
            self.refresh_segments()?;
        }
        match self.try_read_at(pos) {
            Ok(r) => Ok(r),
            // The segment list may predate a rotation (the position lies in a segment this
            // reader has not listed yet): look again once.
            Err(_) => {
                self.refresh_segments()?;
                self.cur = None;
                self.buf_len = 0;
                self.try_read_at(pos)
            }
        }
    }

    fn try_read_at(&mut self, pos: WalPos) -> Result<Record> {
        self.window = RANDOM_BUF;
        let r = self.try_read_at_inner(pos);
        self.window = BUF;
        r
    }

    fn try_read_at_inner(&mut self, pos: WalPos) -> Result<Record> {
        self.pos = pos;
        self.last_ht = None;
        self.scan_done = false;
        self.open_segment_for(pos)?;
        match self.next()? {
            Some((_, r)) => Ok(r),
            None => Err(Error::BadPosition {
                tablet: self.tablet.clone(),
                pos,
                reason: "no record there below the readable end".into(),
            }),
        }
    }

    fn open_segment_for(&mut self, pos: WalPos) -> Result<()> {
        let idx = match self.segments.binary_search(&pos) {
            Ok(i) => i,
            Err(0) => {
                return Err(Error::Truncated {
                    tablet: self.tablet.clone(),
                    requested: pos,
                    oldest: self.oldest(),
                })
            }
            Err(i) => i - 1,
        };
        let first = self.segments[idx];
        if self.cur.as_ref().is_some_and(|c| c.first == first) {
            return Ok(());
        }
        let path = self.dir.join(segment::segment_file_name(first));
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::Truncated {
                    tablet: self.tablet.clone(),
                    requested: pos,
                    oldest: self.oldest(),
                })
            }
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        let header = segment::read_header(&file, &path, &self.tablet, first)?;
        if header.is_none() {
            return Err(corruption(
                &self.tablet,
                &path,
                0,
                "segment shorter than its header",
            ));
        }
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len();
        let direct = if self.direct_io || self.direct_backlogs.is_some() {
            open_direct(&path)
        } else {
            None
        };
        self.cur = Some(OpenSeg {
            first,
            path,
            file,
            direct,
            capacity: len.saturating_sub(SEGMENT_HEADER_LEN as u64),
        });
        self.buf_len = 0;
        Ok(())
    }

    /// Makes `[pos, pos + n)` available in the buffer (fewer bytes at the segment's end).
    fn fill(&mut self, n: usize) -> Result<usize> {
        let Some(seg) = &self.cur else { return Ok(0) };
        let in_buf_from = self.pos.since(self.buf_pos) as usize;
        if self.pos >= self.buf_pos && in_buf_from + n <= self.buf_len {
            return Ok(n);
        }
        let off = self.pos.since(seg.first);
        let mut avail = seg.capacity.saturating_sub(off) as usize;
        // Never buffer bytes past the published end: they may still change (a live writer).
        if let Some(end) = self.end() {
            avail = avail.min((end.since(self.pos) as usize).max(n));
        }
        let scan = self.window == BUF;
        let behind = self.end().map(|e| e.since(self.pos));
        let backlog = matches!((self.direct_backlogs, behind), (Some(b), Some(n)) if n >= b);
        let direct = seg
            .direct
            .as_ref()
            .filter(|_| self.direct_io || (backlog && scan && avail >= BUF));
        // Each direct read waits on the device: fewer, larger ones.
        let window = if direct.is_some() && scan {
            DIRECT_BUF
        } else {
            self.window
        };
        let want = n.max(window).min(avail.max(n));
        let len = want.min(avail);
        let at = SEGMENT_HEADER_LEN as u64 + off;
        let (lead, got) = match direct {
            Some(direct) => {
                // Whole blocks from the one holding `at`.
                let block = crate::direct::BLOCK as u64;
                let lead = (at % block) as usize;
                let span = (lead + len).next_multiple_of(crate::direct::BLOCK);
                let buf = self.buf.reserve(span, true, &seg.path)?;
                let got = read_direct(direct, &seg.path, &mut buf[..span], at - lead as u64)?;
                (lead, got.saturating_sub(lead).min(len))
            }
            None => {
                let buf = self.buf.reserve(want, false, &seg.path)?;
                (
                    0,
                    fsutil::read_at_most(&seg.file, &seg.path, &mut buf[..len], at)?,
                )
            }
        };
        self.buf_pos = self.pos;
        self.buf_off = lead;
        self.buf_len = got;
        Ok(got.min(n))
    }

    /// The next record and its position, or `None` at the readable end.
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> Result<Option<(WalPos, Record)>> {
        loop {
            let end = self.end();
            if let Some(end) = end {
                if self.pos >= end {
                    return Ok(None);
                }
            } else if self.scan_done {
                return Ok(None);
            }
            let Some(seg) = &self.cur else {
                // A log that had no segment yet: its first one may have been made since.
                self.refresh_segments()?;
                if self.segments.is_empty() {
                    if end.is_none() {
                        self.scan_done = true;
                        return Ok(None);
                    }
                    return Err(Error::Corruption {
                        tablet: self.tablet.to_string(),
                        file: self.dir.join(crate::control::CONTROL_FILE),
                        offset: 0,
                        reason: format!(
                            "the control file says the log reaches position {} but there are no segments",
                            end.unwrap_or_default()
                        ),
                    });
                }
                self.open_segment_for(self.pos)?;
                continue;
            };
            let (seg_first, path) = (seg.first, seg.path.clone());
            // A segment's records end where the next one begins, whatever bytes follow them
            // in its file (recovery and the shipper's tailer take it so too).
            if seg_first != self.pos && self.segments.binary_search(&self.pos).is_ok() {
                self.open_segment_for(self.pos)?;
                continue;
            }
            let have = self.fill(RECORD_HEADER_LEN)?;
            let start = self.buf_off + self.pos.since(self.buf_pos) as usize;
            let head = &self.buf.bytes()[start..start + have];
            if have < RECORD_HEADER_LEN || head.iter().all(|&b| b == 0) {
                // Nothing here: the writer moved on to the next segment at this position.
                if self.segments.binary_search(&self.pos).is_err() {
                    self.refresh_segments()?;
                }
                // A later segment that starts here: move on to it. (The current segment's
                // own first position holding nothing is not "moving on": it is an empty
                // segment, which ends a scan and is corruption below the published end.)
                if seg_first != self.pos && self.segments.binary_search(&self.pos).is_ok() {
                    self.open_segment_for(self.pos)?;
                    continue;
                }
                // Retention deleted what this reader was about to read.
                let oldest = self.oldest();
                if self.pos < oldest {
                    return Err(Error::Truncated {
                        tablet: self.tablet.clone(),
                        requested: self.pos,
                        oldest,
                    });
                }
                if end.is_none() {
                    self.scan_done = true;
                    return Ok(None);
                }
                return Err(corruption(
                    &self.tablet,
                    &path,
                    self.pos.since(seg_first) as usize,
                    format!(
                        "no record at position {} although the log reaches {}",
                        self.pos,
                        end.unwrap_or_default()
                    ),
                ));
            }
            let mut hb = [0u8; RECORD_HEADER_LEN];
            hb.copy_from_slice(&head[..RECORD_HEADER_LEN]);
            let total = {
                use zerocopy::FromBytes;
                let h = crate::format::RecordHeader::read_from_bytes(&hb[..])
                    .map_err(|_| corruption(&self.tablet, &path, 0, "unreadable header"))?;
                let seg_left = self.cur.as_ref().map_or(0, |c| {
                    c.capacity.saturating_sub(self.pos.since(c.first)) as usize
                });
                if let Some(reason) = header_problem(&h, self.pos.0, seg_left) {
                    return Err(self.bad_record(&path, seg_first, reason));
                }
                RECORD_HEADER_LEN + h.len.get() as usize
            };
            if let Some(end) = end {
                if self.pos.add(total as u64) > end {
                    return Err(self.bad_record(
                        &path,
                        seg_first,
                        format!("record runs past the readable end {end}"),
                    ));
                }
            }
            let got = self.fill(total)?;
            let start = self.buf_off + self.pos.since(self.buf_pos) as usize;
            let bytes = &self.buf.bytes()[start..start + got];
            match parse_record(bytes, self.pos.0) {
                Parsed::Record { record, len } => {
                    if let Some(l) = self.last_ht {
                        if record.ht <= l {
                            return Err(self.bad_record(
                                &path,
                                seg_first,
                                format!(
                                    "record ht {} is not greater than the previous ht {l}",
                                    record.ht
                                ),
                            ));
                        }
                    }
                    let at = self.pos;
                    self.pos = self.pos.add(len as u64);
                    self.last_ht = Some(record.ht);
                    return Ok(Some((at, record)));
                }
                Parsed::End => {
                    return Err(self.bad_record(&path, seg_first, "record vanished".into()))
                }
                Parsed::Invalid(reason) => return Err(self.bad_record(&path, seg_first, reason)),
                Parsed::Undecodable { reason, .. } => {
                    let reason = format!(
                        "a whole record (its checksum matches) whose body does not decode: {reason}"
                    );
                    return Err(self.bad_record(&path, seg_first, reason));
                }
            }
        }
    }

    fn bad_record(&mut self, path: &Path, seg_first: WalPos, reason: String) -> Error {
        if self.end().is_none() {
            // Scan mode: an invalid tail ends the scan only if nothing valid could follow;
            // report it as corruption so the caller sees where.
            self.scan_done = true;
        }
        corruption(
            &self.tablet,
            path,
            self.pos.since(seg_first) as usize,
            reason,
        )
    }
}

impl Iterator for Reader {
    type Item = Result<(WalPos, Record)>;
    fn next(&mut self) -> Option<Self::Item> {
        Reader::next(self).transpose()
    }
}

/// The tablets (sub-directories with valid tablet names) under `wal_dir`, sorted; any other
/// entry is an error naming it (the WAL tools check a directory, and say what does not
/// belong there).
pub fn list_tablets(wal_dir: &Path) -> Result<Vec<TabletId>> {
    let (tablets, mut others) = scan_tablets(wal_dir)?;
    match others.pop() {
        Some(e) => Err(e),
        None => Ok(tablets),
    }
}

/// The tablets under `wal_dir`, sorted, and — instead of failing on them — the entries that
/// are not tablet directories (e.g. a file system's `lost+found`), each as the error
/// [`list_tablets`] would give. For tailers, which skip such entries and keep going.
pub fn scan_tablets(wal_dir: &Path) -> Result<(Vec<TabletId>, Vec<Error>)> {
    let mut out = Vec::new();
    let mut others = Vec::new();
    let rd = std::fs::read_dir(wal_dir).map_err(|e| Error::io("list", wal_dir, e))?;
    for ent in rd {
        let ent = ent.map_err(|e| Error::io("list", wal_dir, e))?;
        let path = ent.path();
        if !ent
            .file_type()
            .map_err(|e| Error::io("stat", &path, e))?
            .is_dir()
        {
            others.push(Error::UnexpectedFile {
                path,
                reason: "only tablet directories belong in a WAL directory".into(),
            });
            continue;
        }
        let name = ent.file_name();
        let Some(name) = name.to_str() else {
            others.push(Error::UnexpectedFile {
                path,
                reason: "directory name is not UTF-8".into(),
            });
            continue;
        };
        match name.parse::<TabletId>() {
            Ok(t) => out.push(t),
            Err(e) => others.push(Error::UnexpectedFile {
                path,
                reason: e.to_string(),
            }),
        }
    }
    out.sort();
    Ok((out, others))
}

/// The segments of the tablet directory `tablet_dir`: first position and path, ascending.
/// For tailers that read raw bytes (the shipper). A segment's records occupy
/// `[first, next segment's first)`; the last one's end is the control file's published end.
pub fn list_segments(tablet_dir: &Path) -> Result<Vec<(WalPos, PathBuf)>> {
    Ok(segment::list_dir(tablet_dir)?.segments)
}

/// File offset of the record area in every segment.
pub const SEGMENT_DATA_OFFSET: u64 = SEGMENT_HEADER_LEN as u64;

/// `path` opened read-only with `O_DIRECT`; `None` where the file system refuses it.
fn open_direct(path: &Path) -> Option<File> {
    crate::direct::open(path, false).ok()
}

/// Fills `buf` (block-aligned memory and length) from the block-aligned file offset `at`
/// with direct reads; fewer bytes only at the end of the file.
fn read_direct(file: &File, path: &Path, buf: &mut [u8], at: u64) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], at + done as u64) {
            Ok(0) => break,
            // A short read ends the file; past an unaligned end no direct read may follow.
            Ok(n) if n % crate::direct::BLOCK != 0 => return Ok(done + n),
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read (O_DIRECT)", path, e)),
        }
    }
    Ok(done)
}
