//! inotify on the WAL directory, so the scanner finds a new tablet as soon as its writer
//! creates it rather than at the next rescan.
//!
//! ```text
//!  wal_dir            IN_CREATE | IN_MOVED_TO       a new tablet directory → watch it too
//!  wal_dir/<new>/     IN_CREATE | IN_MOVED_TO       its `control` file → the scanner rescans
//! ```
//!
//! A tablet directory is watched only until the scanner knows the tablet
//! ([`DirWatch::forget`]): after that its segment and `acked` writes are of no interest.
//! Events are only a prompt to rescan; what a rescan finds is the truth, so a lost or
//! overflowed event costs at most the rescan interval.

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bytes of `struct inotify_event` before its name.
const EVENT_HEADER: usize = 16;

#[derive(Debug)]
pub(crate) struct DirWatch {
    fd: OwnedFd,
    root: PathBuf,
    /// The root's watch descriptor.
    root_wd: i32,
    /// Watched tablet directories not known yet: descriptor → directory name.
    dirs: BTreeMap<i32, String>,
    buf: Vec<u8>,
}

impl DirWatch {
    /// Watches `root` and every directory already in it.
    pub(crate) fn new(root: &Path) -> std::io::Result<DirWatch> {
        // SAFETY: plain syscall; the descriptor is owned below.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a new descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let mut w = DirWatch {
            root_wd: -1,
            fd,
            root: root.to_path_buf(),
            dirs: BTreeMap::new(),
            buf: vec![0u8; 64 << 10],
        };
        w.root_wd = w.add(root)?;
        for ent in std::fs::read_dir(root)? {
            let ent = ent?;
            if ent.file_type()?.is_dir() {
                w.watch_dir(&ent.file_name().to_string_lossy());
            }
        }
        Ok(w)
    }

    fn add(&self, dir: &Path) -> std::io::Result<i32> {
        let c = CString::new(dir.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: valid descriptor and NUL-terminated path.
        let wd = unsafe {
            libc::inotify_add_watch(
                self.fd.as_raw_fd(),
                c.as_ptr(),
                libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_ONLYDIR,
            )
        };
        if wd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(wd)
    }

    fn watch_dir(&mut self, name: &str) {
        // A directory that vanished meanwhile needs no watch; the rescan decides.
        if let Ok(wd) = self.add(&self.root.join(name)) {
            self.dirs.insert(wd, name.to_string());
        }
    }

    /// Waits up to `timeout` for events; whether there were any (a rescan is due). New
    /// directories under the root are watched from here on.
    pub(crate) fn wait(&mut self, timeout: Duration) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n <= 0 {
            return false;
        }
        let mut new_dirs = Vec::new();
        let mut any = false;
        loop {
            // SAFETY: reads into our buffer, at most its length.
            let got = unsafe {
                libc::read(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                )
            };
            if got <= 0 {
                break;
            }
            let data = &self.buf[..got as usize];
            let mut off = 0;
            while off + EVENT_HEADER <= data.len() {
                let word = |at: usize| {
                    let b: [u8; 4] = data[off + at..off + at + 4].try_into().unwrap_or([0; 4]);
                    u32::from_ne_bytes(b)
                };
                let (wd, mask, len) = (word(0) as i32, word(4), word(12) as usize);
                // Creations prompt a rescan, and so does a lost event (queue overflow); the
                // IN_IGNORED of a removed watch does not.
                any |= mask & (libc::IN_CREATE | libc::IN_MOVED_TO | libc::IN_Q_OVERFLOW) != 0;
                let name_at = off + EVENT_HEADER;
                let name = data
                    .get(name_at..name_at + len)
                    .map(|n| n.split(|b| *b == 0).next().unwrap_or_default())
                    .unwrap_or_default();
                if wd == self.root_wd && mask & libc::IN_ISDIR != 0 && !name.is_empty() {
                    new_dirs.push(String::from_utf8_lossy(name).into_owned());
                }
                off = name_at + len;
            }
        }
        for d in new_dirs {
            self.watch_dir(&d);
        }
        any
    }

    /// Stops watching the tablet directories `known` says the scanner has found.
    pub(crate) fn forget(&mut self, known: impl Fn(&str) -> bool) {
        let done: Vec<i32> = self
            .dirs
            .iter()
            .filter(|(_, name)| known(name))
            .map(|(wd, _)| *wd)
            .collect();
        for wd in done {
            self.dirs.remove(&wd);
            // SAFETY: valid descriptors; a watch already gone is only an error code.
            unsafe { libc::inotify_rm_watch(self.fd.as_raw_fd(), wd) };
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn new_directories_and_their_files_prompt_a_rescan_until_forgotten() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("old")).unwrap();
        let mut w = DirWatch::new(root.path()).unwrap();
        let quiet = Duration::from_millis(100);
        let long = Duration::from_secs(10);
        assert!(!w.wait(quiet), "nothing happened yet");
        // A file in a directory that was there at the start.
        std::fs::write(root.path().join("old").join("control"), b"x").unwrap();
        assert!(w.wait(long));
        // A new directory, then its control file (made the writer's way: a rename).
        std::fs::create_dir(root.path().join("t9")).unwrap();
        assert!(w.wait(long));
        std::fs::write(root.path().join("t9").join("control.partial"), b"x").unwrap();
        std::fs::rename(
            root.path().join("t9").join("control.partial"),
            root.path().join("t9").join("control"),
        )
        .unwrap();
        assert!(w.wait(long));
        while w.wait(quiet) {}
        // Known tablets are no longer watched: their segment and acked writes are quiet.
        w.forget(|name| name == "t9" || name == "old");
        std::fs::write(root.path().join("t9").join("acked"), b"x").unwrap();
        std::fs::write(root.path().join("old").join("acked"), b"x").unwrap();
        assert!(!w.wait(quiet), "forgotten directories are not watched");
        // The root still is.
        std::fs::create_dir(root.path().join("t10")).unwrap();
        assert!(w.wait(long));
    }
}
