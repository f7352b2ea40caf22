//! The per-tablet control file: `written_pos`, `durable_pos` and `oldest_pos`, published by
//! the writer through a shared memory mapping so a tailer in another process reads them with
//! one atomic load and no system call.
//!
//! ```text
//! offset size field
//!      0    8 magic "TDLCTRL\0"
//!      8    4 version (1)
//!     12    4 writer pid (informational)
//!     16    8 written_pos   (atomic u64) end of the committed records
//!     24    8 durable_pos   (atomic u64) end of the records on stable storage
//!     32    8 oldest_pos    (atomic u64) first position still retained
//!     40   24 reserved (zero)
//! ```
//!
//! The file is 4096 bytes. It is derived state: recovery rewrites it from the segments, so a
//! lost or stale control file loses nothing. It is never ahead of the data: `durable_pos` is
//! stored only after the bytes below it were synced.

use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use memmap2::{Mmap, MmapRaw};

use crate::error::{Error, Result};
use crate::fsutil;
use crate::pos::WalPos;

pub const CONTROL_FILE: &str = "control";
pub const CONTROL_MAGIC: [u8; 8] = *b"TDLCTRL\0";
pub const CONTROL_VERSION: u32 = 1;
const CONTROL_SIZE: usize = 4096;
const OFF_WRITTEN: usize = 16;
const OFF_DURABLE: usize = 24;
const OFF_OLDEST: usize = 32;

fn initial_bytes(pos: WalPos) -> Vec<u8> {
    let mut b = vec![0u8; CONTROL_SIZE];
    b[..8].copy_from_slice(&CONTROL_MAGIC);
    b[8..12].copy_from_slice(&CONTROL_VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&std::process::id().to_le_bytes());
    for off in [OFF_WRITTEN, OFF_DURABLE, OFF_OLDEST] {
        b[off..off + 8].copy_from_slice(&pos.0.to_le_bytes());
    }
    b
}

fn validate(bytes: &[u8], path: &Path) -> Result<()> {
    let problem = if bytes.len() < CONTROL_SIZE {
        Some(format!(
            "control file is {} bytes, expected {CONTROL_SIZE}",
            bytes.len()
        ))
    } else if bytes[..8] != CONTROL_MAGIC {
        Some("bad control file magic".to_string())
    } else if bytes[8..12] != CONTROL_VERSION.to_le_bytes() {
        Some("unsupported control file version".to_string())
    } else {
        None
    };
    match problem {
        None => Ok(()),
        Some(reason) => Err(Error::Corruption {
            tablet: tablet_of(path),
            file: path.to_path_buf(),
            offset: 0,
            reason,
        }),
    }
}

fn tablet_of(path: &Path) -> String {
    path.parent()
        .and_then(|d| d.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "?".into())
}

/// Writer side: holds the file's exclusive lock for the life of the writer.
#[derive(Debug)]
pub struct ControlFile {
    map: MmapRaw,
    _file: File,
    path: PathBuf,
}

// The three words are only ever accessed through atomics.
impl ControlFile {
    /// Opens (creating if needed) and locks the control file of the tablet in `dir`.
    /// Returns the file and, when it was valid, the positions it held before.
    /// `Ok(None)` when another writer holds the lock.
    #[allow(clippy::type_complexity)]
    pub(crate) fn open_locked(
        dir: &Path,
    ) -> Result<Option<(ControlFile, Option<(WalPos, WalPos)>)>> {
        let path = dir.join(CONTROL_FILE);
        if !path.exists() {
            fsutil::write_atomic(&path, &initial_bytes(WalPos::ZERO))?;
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| Error::io("open", &path, e))?;
        if !fsutil::try_lock_exclusive(&file, &path)? {
            return Ok(None);
        }
        let len = file
            .metadata()
            .map_err(|e| Error::io("stat", &path, e))?
            .len();
        let mut head = vec![0u8; CONTROL_SIZE];
        let n = fsutil::read_at_most(&file, &path, &mut head, 0)?;
        head.truncate(n);
        let previous = if len as usize == CONTROL_SIZE && validate(&head, &path).is_ok() {
            let w = u64::from_le_bytes(
                head[OFF_WRITTEN..OFF_WRITTEN + 8]
                    .try_into()
                    .unwrap_or([0; 8]),
            );
            let d = u64::from_le_bytes(
                head[OFF_DURABLE..OFF_DURABLE + 8]
                    .try_into()
                    .unwrap_or([0; 8]),
            );
            Some((WalPos(w), WalPos(d)))
        } else {
            tracing::warn!(path = %path.display(), "control file invalid; rewriting it from the segments");
            use std::os::unix::fs::FileExt;
            file.set_len(CONTROL_SIZE as u64)
                .map_err(|e| Error::io("resize", &path, e))?;
            file.write_all_at(&initial_bytes(WalPos::ZERO), 0)
                .map_err(|e| Error::io("write", &path, e))?;
            None
        };
        let map = MmapRaw::map_raw(&file).map_err(|e| Error::io("map", &path, e))?;
        Ok(Some((
            ControlFile {
                map,
                _file: file,
                path,
            },
            previous,
        )))
    }

    fn word(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off + 8 <= self.map.len() && off % 8 == 0);
        // SAFETY: the mapping is page aligned and CONTROL_SIZE long (checked on open); the
        // word is 8-aligned and lives as long as `self`; all access to it is atomic.
        unsafe { &*(self.map.as_mut_ptr().add(off) as *const AtomicU64) }
    }

    /// Publish the end of committed records (Release: the bytes below are written).
    pub fn set_written(&self, p: WalPos) {
        self.word(OFF_WRITTEN).store(p.0, Ordering::Release);
    }
    /// Raise `durable_pos` to `p` (never lowers it).
    pub fn raise_durable(&self, p: WalPos) {
        self.word(OFF_DURABLE).fetch_max(p.0, Ordering::AcqRel);
    }
    /// `sync = none`: publish `p` as written and (unsynced) durable with two plain stores.
    /// Only the writer calls it, with `p` ≥ every position published before, so the store
    /// never lowers `durable_pos` (a concurrent `raise_durable` by the flusher targets a
    /// position ≤ `written_pos` ≤ `p`). `written_pos` is stored first, so a reader that
    /// loads `durable_pos` then `written_pos` never sees durable > written.
    pub fn publish_unsynced(&self, p: WalPos) {
        self.word(OFF_WRITTEN).store(p.0, Ordering::Release);
        self.word(OFF_DURABLE).store(p.0, Ordering::Release);
    }
    /// Set all three positions (recovery).
    pub(crate) fn reset(&self, oldest: WalPos, end: WalPos) {
        self.word(OFF_OLDEST).store(oldest.0, Ordering::Release);
        self.word(OFF_DURABLE).store(end.0, Ordering::Release);
        self.word(OFF_WRITTEN).store(end.0, Ordering::Release);
    }
    pub fn set_oldest(&self, p: WalPos) {
        self.word(OFF_OLDEST).store(p.0, Ordering::Release);
    }
    pub fn written(&self) -> WalPos {
        WalPos(self.word(OFF_WRITTEN).load(Ordering::Acquire))
    }
    pub fn durable(&self) -> WalPos {
        WalPos(self.word(OFF_DURABLE).load(Ordering::Acquire))
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Reader side: a read-only view another process can poll.
#[derive(Debug)]
pub struct ControlView {
    map: Mmap,
}

impl ControlView {
    /// `Ok(None)` when the tablet has no control file (a log copied without one).
    pub fn open(dir: &Path) -> Result<Option<ControlView>> {
        let path = dir.join(CONTROL_FILE);
        let file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(Error::io("open", &path, e)),
        };
        // SAFETY: the writer never truncates the control file; it only stores atomics.
        let map = unsafe { Mmap::map(&file) }.map_err(|e| Error::io("map", &path, e))?;
        validate(&map, &path)?;
        Ok(Some(ControlView { map }))
    }

    fn load(&self, off: usize) -> WalPos {
        // SAFETY: length checked in `open`; 8-aligned within a page-aligned mapping; the
        // writer only stores to these words atomically.
        let w = unsafe { &*(self.map.as_ptr().add(off) as *const AtomicU64) };
        WalPos(w.load(Ordering::Acquire))
    }
    pub fn written(&self) -> WalPos {
        self.load(OFF_WRITTEN)
    }
    pub fn durable(&self) -> WalPos {
        self.load(OFF_DURABLE)
    }
    pub fn oldest(&self) -> WalPos {
        self.load(OFF_OLDEST)
    }
}
