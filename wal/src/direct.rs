//! Direct (`O_DIRECT`) writes of the active segment, for logs written in large verbatim runs
//! (the applier's received logs): the bytes go from an aligned staging buffer to the device
//! without being copied into the page cache and written back by the kernel later.
//!
//! ```text
//!  file:  … | block k | block k+1 | … | block m (partial) |
//!           ^ base                        ^ staged end = base + len
//!  buf:   [ bytes of blocks k..m, the last one padded with zeros ]
//! ```
//!
//! `O_DIRECT` wants block-aligned memory, file offsets and lengths. The stage therefore
//! holds the file's bytes from the start of the block of the first byte not yet written
//! whole. [`DirectStage::push`] copies bytes in and writes whole blocks out when the buffer
//! fills; [`DirectStage::write_out`] (at commit) also writes the partial last block, padded
//! with zeros, and keeps it: the next write-out rewrites it with more bytes after the same
//! prefix. A torn rewrite of that block can only leave old or new sectors, and both hold the
//! same committed prefix, so no committed byte is ever at risk.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use memmap2::MmapMut;

use crate::error::{Error, Result};

/// The alignment `O_DIRECT` needs on this project's file systems (ext4, xfs, tmpfs).
pub(crate) const BLOCK: usize = 4096;
/// Staging buffer size: whole blocks are written out in runs of up to this.
const STAGE: usize = 4 << 20;

/// The staged, not yet written-out tail of the active segment, and its `O_DIRECT` file.
#[derive(Debug)]
pub(crate) struct DirectStage {
    path: PathBuf,
    file: File,
    /// `STAGE + BLOCK` bytes, page-aligned (an anonymous mapping).
    buf: MmapMut,
    /// File offset of `buf[0]`, a multiple of `BLOCK`.
    base: u64,
    /// Bytes of the file in `buf`; what follows them is stale until padded at a write.
    len: usize,
}

fn open_direct(path: &Path) -> Result<File> {
    open(path, true).map_err(|e| Error::io("open (O_DIRECT)", path, e))
}

/// `path` opened with `O_DIRECT`, for reading, and for writing when `write`.
pub(crate) fn open(path: &Path, write: bool) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(path)
}

impl DirectStage {
    /// Opens `path` for direct writes, staging from its file offset `end` (where the next
    /// byte goes). Fails when the file system refuses `O_DIRECT`.
    pub fn open(path: &Path, end: u64) -> Result<DirectStage> {
        let file = open_direct(path)?;
        let buf = MmapMut::map_anon(STAGE + BLOCK).map_err(|e| Error::io("map", path, e))?;
        let mut stage = DirectStage {
            path: path.to_path_buf(),
            file,
            buf,
            base: 0,
            len: 0,
        };
        stage.load(end)?;
        Ok(stage)
    }

    /// Switches to another file (a new active segment, or the previous one after a
    /// rollback), staging from its offset `end`.
    pub fn retarget(&mut self, path: &Path, end: u64) -> Result<()> {
        self.file = open_direct(path)?;
        self.path = path.to_path_buf();
        self.load(end)
    }

    /// Reads the block holding `end` back from the file, so that rewriting it keeps the
    /// bytes before `end` (the header, committed records); the bytes after are zeroed.
    fn load(&mut self, end: u64) -> Result<()> {
        let block = BLOCK as u64;
        self.base = end / block * block;
        self.len = (end - self.base) as usize;
        self.buf[..BLOCK].fill(0);
        if self.len > 0 {
            let mut got = 0;
            while got < BLOCK {
                let k = self
                    .file
                    .read_at(&mut self.buf[got..BLOCK], self.base + got as u64)
                    .map_err(|e| Error::io("read (O_DIRECT)", &self.path, e))?;
                if k == 0 {
                    return Err(Error::io(
                        "read (O_DIRECT)",
                        &self.path,
                        std::io::Error::other(format!(
                            "the file ends before offset {}",
                            self.base + BLOCK as u64
                        )),
                    ));
                }
                got += k;
            }
            self.buf[self.len..BLOCK].fill(0);
        }
        Ok(())
    }

    /// File offset one past the last staged byte.
    pub fn end(&self) -> u64 {
        self.base + self.len as u64
    }

    /// Stages `bytes` at [`DirectStage::end`]; whole blocks are written out whenever the
    /// buffer fills.
    pub fn push(&mut self, mut bytes: &[u8]) -> Result<()> {
        while !bytes.is_empty() {
            let k = bytes.len().min(STAGE - self.len);
            self.buf[self.len..self.len + k].copy_from_slice(&bytes[..k]);
            self.len += k;
            bytes = &bytes[k..];
            if self.len == STAGE {
                self.write(false)?;
            }
        }
        Ok(())
    }

    /// Writes every staged byte to the file, the partial last block padded with zeros
    /// (and kept, to be rewritten with what follows).
    pub fn write_out(&mut self) -> Result<()> {
        self.write(true)
    }

    /// Writes the whole staged blocks, and the partial last one too when `tail`, then moves
    /// the partial last block to the front of the buffer.
    fn write(&mut self, tail: bool) -> Result<()> {
        let whole = self.len / BLOCK * BLOCK;
        let upto = if tail {
            self.len.next_multiple_of(BLOCK)
        } else {
            whole
        };
        if upto == 0 {
            return Ok(());
        }
        fail::fail_point!("wal::direct::write", |_| Err(Error::io(
            "write (O_DIRECT)",
            &self.path,
            std::io::Error::other("failpoint wal::direct::write")
        )));
        // The padding of the partial last block: zeros, whatever the buffer held there.
        self.buf[self.len..upto.max(self.len)].fill(0);
        self.file
            .write_all_at(&self.buf[..upto], self.base)
            .map_err(|e| Error::io("write (O_DIRECT)", &self.path, e))?;
        let rest = self.len - whole;
        if whole > 0 {
            self.buf.copy_within(whole..self.len, 0);
            self.base += whole as u64;
            self.len = rest;
        }
        Ok(())
    }
}

/// Whether `dir`'s file system takes `O_DIRECT` (probed with a temporary file).
pub fn supported(dir: &Path) -> bool {
    let probe = dir.join(".direct-probe");
    let ok = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = std::fs::remove_file(&probe);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_of(dir: &Path, len: usize, fill: u8) -> PathBuf {
        let p = dir.join("seg");
        std::fs::write(&p, vec![fill; len]).unwrap();
        p
    }

    #[test]
    fn keeps_the_bytes_before_the_start_and_pads_the_tail_with_zeros() {
        let d = tempfile::tempdir().unwrap();
        let p = file_of(d.path(), 4 * BLOCK, 7);
        let mut s = DirectStage::open(&p, 100).unwrap();
        s.push(&[1u8; 50]).unwrap();
        s.write_out().unwrap();
        let f = std::fs::read(&p).unwrap();
        assert!(f[..100].iter().all(|&b| b == 7), "bytes before the stage");
        assert!(f[100..150].iter().all(|&b| b == 1), "staged bytes");
        assert!(f[150..BLOCK].iter().all(|&b| b == 0), "padding of the tail");
        assert!(f[BLOCK..].iter().all(|&b| b == 7), "untouched blocks");
        // The kept tail block is rewritten with what follows, past a block boundary.
        s.push(&[2u8; BLOCK]).unwrap();
        s.write_out().unwrap();
        assert_eq!(s.end(), 150 + BLOCK as u64);
        let f = std::fs::read(&p).unwrap();
        assert!(f[100..150].iter().all(|&b| b == 1));
        assert!(f[150..150 + BLOCK].iter().all(|&b| b == 2));
        assert!(f[150 + BLOCK..2 * BLOCK].iter().all(|&b| b == 0));
    }

    #[test]
    fn runs_longer_than_the_buffer_are_written_whole() {
        let d = tempfile::tempdir().unwrap();
        let size = STAGE * 3;
        let p = file_of(d.path(), size, 0);
        let mut s = DirectStage::open(&p, 10).unwrap();
        let run: Vec<u8> = (0..STAGE * 2 + 12345).map(|i| (i % 251) as u8).collect();
        s.push(&run).unwrap();
        s.write_out().unwrap();
        let f = std::fs::read(&p).unwrap();
        assert_eq!(&f[10..10 + run.len()], &run[..]);
        assert!(f[10 + run.len()..].iter().all(|&b| b == 0));
        // Reopened in the middle of a block, it keeps what is there.
        let mut s = DirectStage::open(&p, 10 + run.len() as u64).unwrap();
        s.push(b"tail").unwrap();
        s.write_out().unwrap();
        let f = std::fs::read(&p).unwrap();
        assert_eq!(&f[10..10 + run.len()], &run[..]);
        assert_eq!(&f[10 + run.len()..14 + run.len()], b"tail");
    }
}
