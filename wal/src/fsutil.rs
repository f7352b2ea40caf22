//! Small crash-safe file helpers.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// fsync a directory so a rename or unlink in it is durable.
pub fn fsync_dir(dir: &Path) -> Result<()> {
    let f = File::open(dir).map_err(|e| Error::io("open directory", dir, e))?;
    f.sync_all()
        .map_err(|e| Error::io("fsync directory", dir, e))
}

/// Replace `path` with `bytes` atomically: write `<path>.partial`, fsync, rename, fsync dir.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_mode(path, bytes, 0o666)
}

/// [`write_atomic`] for a secret: the file is created with mode 0600, so it is never
/// readable by others, not even before the rename (a leftover `.partial`, whose mode
/// could be wider, is removed first).
pub fn write_atomic_private(path: &Path, bytes: &[u8]) -> Result<()> {
    let partial = partial_of(path);
    match fs::remove_file(&partial) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io("remove", &partial, e)),
    }
    write_atomic_mode(path, bytes, 0o600)
}

fn partial_of(path: &Path) -> std::path::PathBuf {
    let mut partial = path.as_os_str().to_owned();
    partial.push(".partial");
    std::path::PathBuf::from(partial)
}

fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let partial = partial_of(path);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&partial)
            .map_err(|e| Error::io("create", &partial, e))?;
        f.write_all(bytes)
            .map_err(|e| Error::io("write", &partial, e))?;
        fail::fail_point!("wal::write_atomic::before_fsync", |_| Err(Error::io(
            "fsync",
            &partial,
            std::io::Error::other("failpoint")
        )));
        f.sync_all().map_err(|e| Error::io("fsync", &partial, e))?;
    }
    fs::rename(&partial, path).map_err(|e| Error::io("rename", &partial, e))?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(())
}

/// Read exactly `buf.len()` bytes at `offset`, or fewer at end of file; returns the count.
pub fn read_at_most(file: &File, path: &Path, buf: &mut [u8], offset: u64) -> Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("read", path, e)),
        }
    }
    Ok(done)
}

/// Preallocate `len` bytes of `file` (real blocks, not a sparse hole) so writes into the
/// mapping never fail for lack of space and fdatasync has no size change to journal.
pub fn preallocate(file: &File, path: &Path, len: u64) -> Result<()> {
    use std::os::fd::AsRawFd;
    file.set_len(len)
        .map_err(|e| Error::io("set length of", path, e))?;
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if rc != 0 && rc != libc::EOPNOTSUPP && rc != libc::EINVAL {
        return Err(Error::io(
            "preallocate",
            path,
            std::io::Error::from_raw_os_error(rc),
        ));
    }
    Ok(())
}

/// Take an exclusive, non-blocking `flock` on `file`. `Ok(false)` when someone else has it.
pub fn try_lock_exclusive(file: &File, path: &Path) -> Result<bool> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(Error::io("lock", path, e))
    }
}
