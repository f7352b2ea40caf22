//! Full disks: telling "no space left on device" apart from other write failures, the free
//! space of a file system, and the schedule of retries while a disk stays full.
//!
//! A full disk stops a stage (the intake of one tablet, or every store write) cleanly and
//! names the path; the stage retries on its own once space returns, with no restart. The
//! retries back off ([`Backoff`]) and are logged once per change of state, never per try.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Whether an I/O error says the device (or the user's quota) is out of space.
pub fn is_no_space(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
        || matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// The path of a WAL error that says "no space left" (the received log's segment or file
/// that could not be written).
pub fn wal_no_space(e: &tidelog_wal::Error) -> Option<&Path> {
    match e {
        tidelog_wal::Error::Io { path, source, .. } if is_no_space(source) => Some(path),
        _ => None,
    }
}

/// Bytes an unprivileged writer can still allocate on the file system holding `path` (or
/// its nearest existing ancestor).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let mut p = path;
    while !p.exists() {
        p = match p.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if p == Path::new(".") {
            break;
        }
    }
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other(format!("path {} contains a NUL byte", p.display())))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a valid NUL-terminated path and `st` points to writable memory of the
    // size statvfs(3) fills.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The message of a full disk at `path`: "no space left on device at <path>", what failed,
/// and the bytes free there now.
pub fn no_space_message(path: &Path, what: &str) -> String {
    match free_bytes(path) {
        Ok(free) => format!(
            "no space left on device at {}: {what} ({free} bytes free)",
            path.display()
        ),
        Err(_) => format!("no space left on device at {}: {what}", path.display()),
    }
}

/// A full disk seen by a stage: where, and what failed there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskFull {
    pub path: PathBuf,
    /// The whole message, starting "no space left on device at <path>".
    pub message: String,
}

impl std::fmt::Display for DiskFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Bounded exponential backoff between retries: from `min`, doubling after each failed
/// try, at most `max`.
#[derive(Clone, Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
    due: Instant,
}

/// First retry after a full disk.
pub const RETRY_MIN: Duration = Duration::from_millis(100);
/// Longest wait between two retries while a disk stays full.
pub const RETRY_MAX: Duration = Duration::from_secs(2);

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(RETRY_MIN, RETRY_MAX)
    }
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max: max.max(min),
            next: min,
            due: Instant::now() + min,
        }
    }

    /// Whether the next try is due.
    pub fn due(&self) -> bool {
        Instant::now() >= self.due
    }

    /// How long until the next try is due (zero when it is).
    pub fn left(&self) -> Duration {
        self.due.saturating_duration_since(Instant::now())
    }

    /// A try failed: the next one is due after a longer wait (at most `max`), returned.
    pub fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.due = Instant::now() + wait;
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Back to the shortest wait.
    pub fn reset(&mut self) {
        self.next = self.min;
        self.due = Instant::now();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn no_space_is_found_through_wrapping_errors() {
        let io = std::io::Error::from_raw_os_error(libc::ENOSPC);
        assert!(is_no_space(&io));
        let store = crate::error::Error::Store {
            op: "commit batch",
            source: fjall::Error::Io(io),
        };
        assert!(store.is_no_space());
        let other = crate::error::Error::Store {
            op: "commit batch",
            source: fjall::Error::Io(std::io::Error::from_raw_os_error(libc::EIO)),
        };
        assert!(!other.is_no_space());
        let tree = crate::error::Error::Store {
            op: "flush",
            source: fjall::Error::Storage(fjall::LsmError::Io(std::io::Error::from_raw_os_error(
                libc::EDQUOT,
            ))),
        };
        assert!(tree.is_no_space());
        let received = crate::error::Error::Wal {
            tablet: "t1".parse().unwrap(),
            source: tidelog_wal::Error::Io {
                op: "write",
                path: "/x".into(),
                source: std::io::Error::from_raw_os_error(libc::ENOSPC),
            },
        };
        assert!(received.is_no_space());
        let wal = tidelog_wal::Error::Io {
            op: "preallocate",
            path: "/x/y.seg.partial".into(),
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        assert_eq!(wal_no_space(&wal), Some(Path::new("/x/y.seg.partial")));
    }

    #[test]
    fn free_bytes_of_a_missing_path_is_its_ancestors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("a/b/c");
        let free = free_bytes(&missing).unwrap();
        assert_eq!(
            free_bytes(dir.path()).unwrap() / (1 << 20),
            free / (1 << 20)
        );
    }

    #[test]
    fn backoff_doubles_up_to_its_bound() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(40));
        let waits: Vec<u128> = (0..5).map(|_| b.failed().as_millis()).collect();
        assert_eq!(waits, [10, 20, 40, 40, 40]);
        assert!(!b.due());
        b.reset();
        assert!(b.due());
    }
}
