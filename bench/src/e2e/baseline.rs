//! The physical baseline of the same run: 4 KiB `pwrite` + `fdatasync` on the bench's
//! filesystem.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use hdrhistogram::Histogram;

use crate::stats::Latency;

pub(super) fn fdatasync_baseline(dir: &Path, d: Duration) -> Result<Latency> {
    use std::os::unix::io::AsRawFd;
    std::fs::create_dir_all(dir)?;
    let path = dir.join("fdatasync-baseline");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)?;
    let buf = vec![0xa5u8; 4096];
    let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3)?;
    let start = Instant::now();
    let mut off = 0u64;
    while start.elapsed() < d {
        let t = Instant::now();
        f.write_all_at(&buf, off)?;
        // SAFETY: fdatasync on an open file descriptor we own.
        if unsafe { libc::fdatasync(f.as_raw_fd()) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        h.saturating_record(crate::stats::nanos(t.elapsed()).max(1));
        off += 4096;
        if off >= 64 << 20 {
            off = 0;
        }
    }
    drop(f);
    let _ = std::fs::remove_file(&path);
    Ok(Latency::of_ticks(&h, 1.0))
}
