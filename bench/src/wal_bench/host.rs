//! The machine a benchmark runs on: its block devices settled before a sync phase, the file
//! system and kernel named in the output.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// Waits (at most 15 s) until the block devices are idle: no request in flight and no
/// write, discard or flush completed across two 250 ms samples of /proc/diskstats. Deleting
/// gigabytes of files on a filesystem mounted with `discard` keeps the device busy (and
/// the journal's commits slow) for seconds after `sync`, which would otherwise land in the
/// p99 of whichever sync phase runs next.
pub(crate) fn settle_device() {
    fn sample() -> Option<Vec<u64>> {
        let s = std::fs::read_to_string("/proc/diskstats").ok()?;
        let mut v = Vec::new();
        for l in s.lines() {
            let f: Vec<u64> = l
                .split_whitespace()
                .skip(3)
                .filter_map(|x| x.parse().ok())
                .collect();
            // writes completed, in flight, discards completed, flushes completed
            for i in [4, 8, 11, 15] {
                v.push(f.get(i).copied().unwrap_or(0));
            }
        }
        Some(v)
    }
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut prev = sample();
    let mut quiet = 0;
    while quiet < 2 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
        let cur = sample();
        let idle = cur.is_some()
            && cur == prev
            && cur
                .as_ref()
                .is_some_and(|v| v.chunks(4).all(|c| c.get(1) == Some(&0)));
        quiet = if idle { quiet + 1 } else { 0 };
        prev = cur;
    }
}

pub(crate) fn sync_all() {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
}

pub(super) fn count_files(dir: &Path, suffix: &str) -> Result<usize> {
    let mut n = 0;
    for e in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
        if e?.file_name().to_string_lossy().ends_with(suffix) {
            n += 1;
        }
    }
    Ok(n)
}

pub(crate) fn filesystem_of(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return "unknown".into();
    };
    // SAFETY: statfs fills the zeroed struct; `c` is a valid NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unknown".into();
    }
    #[allow(clippy::unnecessary_cast)]
    let magic = st.f_type as u64 & 0xffff_ffff;
    match magic {
        0xEF53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683E => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x8584_58F6 => "ramfs".into(),
        0x794C_7630 => "overlayfs".into(),
        0x2FC1_2FC1 => "zfs".into(),
        0xF2F5_2010 => "f2fs".into(),
        0x6969 => "nfs".into(),
        m => format!("fs magic {m:#x}"),
    }
}

pub(crate) fn kernel_release() -> String {
    // SAFETY: uname fills the zeroed struct; its fields are NUL-terminated.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    if unsafe { libc::uname(&mut u) } != 0 {
        return "unknown".into();
    }
    // SAFETY: `release` is NUL-terminated by uname.
    unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}
