//! Retention: the shipper's `acked` file and which segments may go.
//!
//! `acked` (24 bytes): magic `TDLACKD\0`, acked position (u64 LE), xxh3-64 of the first 16
//! bytes. Written atomically (`acked.partial`, fsync, rename, fsync directory) by the
//! shipper; read by the writer when it rotates or is asked to enforce retention.
//!
//! A sealed segment is deleted only when its whole extent lies at or below the acked
//! position. Past `max_retained_bytes` the oldest sealed segments go anyway (logged), and a
//! reader asking for them gets [`Error::Truncated`](crate::Error::Truncated). The active
//! segment is never deleted.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::fsutil;
use crate::pos::WalPos;

pub const ACKED_FILE: &str = "acked";
const ACKED_MAGIC: [u8; 8] = *b"TDLACKD\0";
const ACKED_LEN: usize = 24;

/// Atomically records that everything below `pos` of the tablet in `tablet_dir` is safely
/// at the target.
pub fn write_acked(tablet_dir: &Path, pos: WalPos) -> Result<()> {
    let mut b = [0u8; ACKED_LEN];
    b[..8].copy_from_slice(&ACKED_MAGIC);
    b[8..16].copy_from_slice(&pos.0.to_le_bytes());
    let sum = crate::hash::xxh3_64(&b[..16]);
    b[16..].copy_from_slice(&sum.to_le_bytes());
    fsutil::write_atomic(&tablet_dir.join(ACKED_FILE), &b)
}

/// The acked position, `None` when nothing was ever acked.
pub fn read_acked(tablet_dir: &Path) -> Result<Option<WalPos>> {
    let path = tablet_dir.join(ACKED_FILE);
    let b = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io("read", &path, e)),
    };
    let corrupt = |reason: &str| Error::Corruption {
        tablet: tablet_dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        file: path.clone(),
        offset: 0,
        reason: reason.to_string(),
    };
    if b.len() != ACKED_LEN {
        return Err(corrupt(&format!(
            "acked file is {} bytes, expected {ACKED_LEN}",
            b.len()
        )));
    }
    if b[..8] != ACKED_MAGIC {
        return Err(corrupt("bad acked file magic"));
    }
    let mut sum = [0u8; 8];
    sum.copy_from_slice(&b[16..24]);
    if u64::from_le_bytes(sum) != crate::hash::xxh3_64(&b[..16]) {
        return Err(corrupt("acked file checksum mismatch"));
    }
    let mut p = [0u8; 8];
    p.copy_from_slice(&b[8..16]);
    Ok(Some(WalPos(u64::from_le_bytes(p))))
}

/// Which of the oldest segments to delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Plan {
    /// Number of oldest segments to delete.
    pub delete: usize,
    /// Of those, how many are wholly acked (the rest are forced by the byte limit).
    pub acked_whole: usize,
}

/// `segments`: first positions ascending, the last one active; `end`: the log's end.
pub(crate) fn plan(
    segments: &[WalPos],
    end: WalPos,
    acked: Option<WalPos>,
    max_retained: Option<u64>,
) -> Plan {
    let sealed = segments.len().saturating_sub(1);
    let acked_whole = match acked {
        // Segment k spans [segments[k], segments[k+1]).
        Some(a) => (0..sealed).take_while(|&k| segments[k + 1] <= a).count(),
        None => 0,
    };
    let mut delete = acked_whole;
    if let Some(max) = max_retained {
        while delete < sealed && end.since(segments[delete]) > max {
            delete += 1;
        }
    }
    Plan {
        delete,
        acked_whole,
    }
}

/// What a retention pass did.
#[derive(Debug, Default, Clone)]
pub struct RetentionReport {
    /// Acked segments deleted.
    pub deleted: Vec<PathBuf>,
    /// Unacked segments deleted because `max_retained_bytes` was exceeded.
    pub forced: Vec<PathBuf>,
    /// Bytes of log still retained.
    pub retained_bytes: u64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(v: &[u64]) -> Vec<WalPos> {
        v.iter().map(|&x| WalPos(x)).collect()
    }

    #[test]
    fn only_wholly_acked_sealed_segments_go() {
        let segs = p(&[0, 100, 200, 300]);
        assert_eq!(plan(&segs, WalPos(350), None, None).delete, 0);
        assert_eq!(plan(&segs, WalPos(350), Some(WalPos(99)), None).delete, 0);
        assert_eq!(plan(&segs, WalPos(350), Some(WalPos(100)), None).delete, 1);
        assert_eq!(plan(&segs, WalPos(350), Some(WalPos(299)), None).delete, 2);
        // Never the active one, even fully acked.
        assert_eq!(plan(&segs, WalPos(350), Some(WalPos(350)), None).delete, 3);
    }

    #[test]
    fn byte_limit_forces_oldest() {
        let segs = p(&[0, 100, 200, 300]);
        let pl = plan(&segs, WalPos(350), None, Some(160));
        assert_eq!(
            pl,
            Plan {
                delete: 2,
                acked_whole: 0
            }
        );
        let pl = plan(&segs, WalPos(350), Some(WalPos(100)), Some(10));
        assert_eq!(
            pl,
            Plan {
                delete: 3,
                acked_whole: 1
            }
        );
    }

    #[test]
    fn acked_file_round_trips_and_detects_damage() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(read_acked(d.path()).unwrap(), None);
        write_acked(d.path(), WalPos(12345)).unwrap();
        assert_eq!(read_acked(d.path()).unwrap(), Some(WalPos(12345)));
        let path = d.path().join(ACKED_FILE);
        let mut b = std::fs::read(&path).unwrap();
        b[9] ^= 1;
        std::fs::write(&path, &b).unwrap();
        let e = read_acked(d.path()).unwrap_err();
        assert!(e.to_string().contains("checksum"), "{e}");
        assert!(!d.path().join("acked.partial").exists());
    }
}
