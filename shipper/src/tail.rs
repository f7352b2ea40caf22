//! Tails one tablet's WAL as raw bytes: from a record position, whole records up to the
//! control file's `durable_pos` (or `written_pos` with `ship-unsynced`), cut at a record
//! boundary, read through the [`SegFile`] seam. Records are shipped as they are on disk.
//!
//! A segment's records occupy `[first, next segment's first)`; the last segment's end is
//! the published end. The tailer keeps the segment list it saw and looks again only when a
//! position is not where it expects (rotation, retention).

use std::path::{Path, PathBuf};

use tidelog_wal::control::ControlView;
use tidelog_wal::format::{RecordHeader, RECORD_HEADER_LEN};
use tidelog_wal::reader::{list_segments, SEGMENT_DATA_OFFSET};
use tidelog_wal::verify::{take_records, BadRecord};
use tidelog_wal::{HybridTime, TabletId, WalPos};
use zerocopy::FromBytes;

use crate::io::{IoEngine, SegFile};

/// Why the tailer cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum TailError {
    #[error("tablet {tablet}: position {requested} is no longer at the source (oldest retained {oldest}); needs bootstrap")]
    NeedsBootstrap {
        tablet: TabletId,
        requested: WalPos,
        oldest: WalPos,
    },
    #[error(
        "tablet {tablet}: the applier asks for position {requested}, beyond the source's end {end}"
    )]
    Beyond {
        tablet: TabletId,
        requested: WalPos,
        end: WalPos,
    },
    #[error("tablet {tablet}: {reason} (file {file}, position {pos})")]
    Corrupt {
        tablet: TabletId,
        file: PathBuf,
        pos: WalPos,
        reason: String,
    },
    #[error("tablet {tablet}: {0}", tablet = .1)]
    Wal(tidelog_wal::Error, TabletId),
    #[error("tablet {tablet}: reading {file}: {source}")]
    Io {
        tablet: TabletId,
        file: PathBuf,
        source: std::io::Error,
    },
}

/// A chunk of whole records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    pub len: usize,
    pub count: u32,
    pub last_ht: HybridTime,
}

#[derive(Debug)]
struct Cur {
    first: WalPos,
    path: PathBuf,
    file: SegFile,
}

/// The raw-byte tailer of one tablet.
#[derive(Debug)]
pub struct Tail {
    pub tablet: TabletId,
    dir: PathBuf,
    engine: IoEngine,
    control: ControlView,
    unsynced: bool,
    segs: Vec<WalPos>,
    paths: Vec<PathBuf>,
    cur: Option<Cur>,
}

impl Tail {
    pub fn open(
        wal_dir: &Path,
        tablet: &TabletId,
        engine: IoEngine,
        unsynced: bool,
    ) -> Result<Tail, TailError> {
        let dir = wal_dir.join(tablet.as_str());
        let control = ControlView::open(&dir)
            .map_err(|e| TailError::Wal(e, tablet.clone()))?
            .ok_or_else(|| TailError::Corrupt {
                tablet: tablet.clone(),
                file: dir.join("control"),
                pos: WalPos::ZERO,
                reason: "no control file (the writer has never opened this log)".into(),
            })?;
        let mut t = Tail {
            tablet: tablet.clone(),
            dir,
            engine,
            control,
            unsynced,
            segs: Vec::new(),
            paths: Vec::new(),
            cur: None,
        };
        t.refresh()?;
        Ok(t)
    }

    fn refresh(&mut self) -> Result<(), TailError> {
        let l = list_segments(&self.dir).map_err(|e| TailError::Wal(e, self.tablet.clone()))?;
        (self.segs, self.paths) = l.into_iter().unzip();
        Ok(())
    }

    /// The published end this tailer ships up to.
    pub fn end(&self) -> WalPos {
        if self.unsynced {
            self.control.written()
        } else {
            self.control.durable()
        }
    }

    /// The oldest position the source still has.
    pub fn oldest(&self) -> WalPos {
        self.control
            .oldest()
            .max(self.segs.first().copied().unwrap_or_default())
    }

    /// Checks that `pos` can be shipped from (not deleted, not beyond the end).
    pub fn check_start(&mut self, pos: WalPos) -> Result<(), TailError> {
        self.refresh()?;
        let (oldest, end) = (self.oldest(), self.end());
        if self.segs.is_empty() && pos == oldest && pos >= end {
            // No segment yet (the writer could not create its first one, e.g. for lack of
            // space): an empty log, not one that lost its records. Nothing to ship until
            // the writer makes the segment.
            return Ok(());
        }
        if pos < oldest || self.segs.is_empty() {
            return Err(TailError::NeedsBootstrap {
                tablet: self.tablet.clone(),
                requested: pos,
                oldest,
            });
        }
        if pos > end {
            return Err(TailError::Beyond {
                tablet: self.tablet.clone(),
                requested: pos,
                end,
            });
        }
        Ok(())
    }

    /// Reads whole records from `pos` (a record boundary), at most `max` bytes unless a
    /// single record is larger, into `buf`. `Ok(None)`: nothing new below the end.
    pub async fn read(
        &mut self,
        pos: WalPos,
        buf: &mut Vec<u8>,
        max: usize,
    ) -> Result<Option<Chunk>, TailError> {
        let end = self.end();
        if pos >= end {
            return Ok(None);
        }
        for attempt in 0..3 {
            let idx = match self.segs.binary_search(&pos) {
                Ok(i) => i,
                Err(0) => {
                    // Below the first segment listed, or none listed yet: look again (a
                    // log that had no segment may have one now) before calling it gone.
                    self.refresh()?;
                    if attempt < 2 && self.segs.first().is_some_and(|f| *f <= pos) {
                        continue;
                    }
                    return Err(TailError::NeedsBootstrap {
                        tablet: self.tablet.clone(),
                        requested: pos,
                        oldest: self.oldest(),
                    });
                }
                Err(i) => i - 1,
            };
            let first = self.segs[idx];
            let limit = self.segs.get(idx + 1).copied().unwrap_or(end).min(end);
            if limit <= pos {
                self.refresh()?;
                continue;
            }
            if self.cur.as_ref().is_none_or(|c| c.first != first) {
                let path = self.paths[idx].clone();
                match SegFile::open(self.engine, &path).await {
                    Ok(file) => self.cur = Some(Cur { first, path, file }),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        // Deleted by retention since we listed it.
                        self.cur = None;
                        self.refresh()?;
                        if pos < self.oldest() {
                            return Err(TailError::NeedsBootstrap {
                                tablet: self.tablet.clone(),
                                requested: pos,
                                oldest: self.oldest(),
                            });
                        }
                        continue;
                    }
                    Err(source) => {
                        return Err(TailError::Io {
                            tablet: self.tablet.clone(),
                            file: path,
                            source,
                        })
                    }
                }
            }
            let Some(cur) = &self.cur else { continue };
            let mut want = (limit.since(pos) as usize).min(max.max(RECORD_HEADER_LEN));
            let off = SEGMENT_DATA_OFFSET + pos.since(first);
            let mut b = std::mem::take(buf);
            loop {
                let (res, nb) = cur.file.read_at(b, want, off).await;
                b = nb;
                let got = match res {
                    Ok(n) => n,
                    Err(source) => {
                        *buf = b;
                        return Err(TailError::Io {
                            tablet: self.tablet.clone(),
                            file: cur.path.clone(),
                            source,
                        });
                    }
                };
                // Records are shipped as they are on disk: check them here, so a record
                // damaged at the source stops this tablet with an error naming the file
                // instead of having the applier refuse the frame and the shipper resend it
                // forever. The good records in front of it still go.
                let taken = take_records(&self.tablet, &b[..got], pos, got);
                if taken.summary.count > 0 {
                    *buf = b;
                    return Ok(Some(Chunk {
                        len: taken.len,
                        count: taken.summary.count,
                        last_ht: taken.summary.last_ht.unwrap_or_default(),
                    }));
                }
                if let Some(BadRecord {
                    pos: bad, reason, ..
                }) = taken.bad
                {
                    let file = cur.path.clone();
                    *buf = b;
                    return Err(TailError::Corrupt {
                        tablet: self.tablet.clone(),
                        file,
                        pos: bad,
                        reason: format!(
                            "damaged record at the source: {reason} at byte offset {} of the segment",
                            SEGMENT_DATA_OFFSET + bad.since(first)
                        ),
                    });
                }
                // A first record larger than `max`: read it alone.
                let rec_len = RecordHeader::read_from_prefix(&b[..got])
                    .ok()
                    .map(|(h, _)| (h, RECORD_HEADER_LEN + h.len.get() as usize));
                match rec_len {
                    Some((h, n))
                        if h.pos.get() == pos.0 && n > want && n as u64 <= limit.since(pos) =>
                    {
                        want = n;
                        continue;
                    }
                    _ => break,
                }
            }
            *buf = b;
            // Nothing at `pos` in this segment: the writer rotated; look again.
            if attempt < 2 {
                self.refresh()?;
                if self.segs.binary_search(&pos).is_ok() || pos < self.oldest() {
                    continue;
                }
            }
            let path = self
                .cur
                .as_ref()
                .map(|c| c.path.clone())
                .unwrap_or_default();
            return Err(TailError::Corrupt {
                tablet: self.tablet.clone(),
                file: path,
                pos,
                reason: format!("no valid record at position {pos} below the published end {end}"),
            });
        }
        Err(TailError::Corrupt {
            tablet: self.tablet.clone(),
            file: self.dir.clone(),
            pos,
            reason: "the segment list keeps changing under the tailer".into(),
        })
    }

    /// The tablet's directory (where the `acked` file lives).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}
