//! The raw baselines the WAL is measured against: memcpy into preallocated, pre-faulted
//! mapped files (`sync=none`), and `pwrite` + `fdatasync` per record (`always`, `batch`).

use std::fs::{File, OpenOptions};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;
use memmap2::MmapRaw;
use tidelog_wal::format::SEGMENT_HEADER_LEN;

use super::{deadline_ticks, BaselineResult, Throughput};
use crate::stats::{new_histogram, ns_per_tick, Clock, Latency};

/// A preallocated segment-sized file.
fn create_prealloc(dir: &Path, k: usize, size: u64) -> Result<File> {
    let path = dir.join(format!("{k:08}.seg"));
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .with_context(|| format!("create {}", path.display()))?;
    file.set_len(size)?;
    let len = libc::off_t::try_from(size).context("segment size")?;
    // SAFETY: plain syscall on a valid fd.
    let rc = unsafe { libc::posix_fallocate(std::os::fd::AsRawFd::as_raw_fd(&file), 0, len) };
    if rc != 0 && rc != libc::EOPNOTSUPP && rc != libc::EINVAL {
        return Err(std::io::Error::from_raw_os_error(rc))
            .with_context(|| format!("posix_fallocate {}", path.display()));
    }
    Ok(file)
}

fn map_segment(file: &File) -> Result<Arc<MmapRaw>> {
    // No madvise(MADV_SEQUENTIAL): the WAL does not use it either.
    Ok(Arc::new(MmapRaw::map_raw(file).context("mmap")?))
}

/// The next baseline file, prepared like the WAL prepares its next segment: created,
/// preallocated and mapped by a background thread once the current file is a quarter full,
/// handed over as soon as it is mapped; the same thread then waits for the previous file's
/// pre-fault to finish and pre-faults this one with `MADV_POPULATE_WRITE` (the writer may
/// overtake it).
struct NextFile {
    rx: mpsc::Receiver<Result<Arc<MmapRaw>>>,
    handle: std::thread::JoinHandle<()>,
}

impl NextFile {
    fn start(
        dir: &Path,
        k: usize,
        segment_size: u64,
        prev: Option<std::thread::JoinHandle<()>>,
        stop: &Arc<AtomicBool>,
    ) -> NextFile {
        let (tx, rx) = mpsc::sync_channel(1);
        let stop = stop.clone();
        let dir = dir.to_path_buf();
        let handle = std::thread::spawn(move || {
            let map = create_prealloc(&dir, k, segment_size).and_then(|f| map_segment(&f));
            let pf = map.as_ref().ok().cloned();
            let sent = tx.send(map).is_ok();
            if let Some(p) = prev {
                let _ = p.join();
            }
            if let (true, Some(m)) = (sent, pf) {
                populate_write(&m, &stop);
            }
        });
        NextFile { rx, handle }
    }
}

/// `MADV_POPULATE_WRITE` over `map` in 2 MiB chunks (as the WAL's spare thread does).
fn populate_write(map: &MmapRaw, stop: &AtomicBool) {
    const CHUNK: usize = 2 << 20;
    let mut off = 0;
    while off < map.len() && !stop.load(Ordering::Relaxed) {
        let n = CHUNK.min(map.len() - off);
        // SAFETY: inside the live mapping; populating does not change its contents.
        let rc = unsafe {
            libc::madvise(
                map.as_mut_ptr().add(off).cast::<libc::c_void>(),
                n,
                libc::MADV_POPULATE_WRITE,
            )
        };
        if rc != 0 {
            return;
        }
        off += n;
    }
}

/// `sync=none` baseline: memcpy `n` copies of `bytes` into mapped, preallocated files, or
/// as many as fit before `until` (and at least its byte count). Files after the first are
/// prepared and pre-faulted in the background exactly like the WAL's segments
/// ([`NextFile`]); the first is not, like the WAL's first segment.
pub(super) fn baseline_memcpy(
    bytes: &[u8],
    n: u64,
    until: Option<(Instant, u64)>,
    segment_size: u64,
    dir: &Path,
) -> Result<BaselineResult> {
    let cap = segment_size as usize - SEGMENT_HEADER_LEN;
    let len = bytes.len();
    let mut files = 0usize;
    // The WAL's first segment exists before its clock starts; so does this one.
    let mut map = map_segment(&create_prealloc(dir, files, segment_size)?)?;
    files += 1;
    let mut next: Option<NextFile> = None;
    let mut populating: Option<std::thread::JoinHandle<()>> = None;
    let stop = Arc::new(AtomicBool::new(false));
    let mut off = 0usize;
    let start = Instant::now();
    let mut done = 0u64;
    while done < n {
        if done % 4096 == 0
            && until.is_some_and(|(t, min)| done * len as u64 >= min && Instant::now() >= t)
        {
            break;
        }
        done += 1;
        if off + len > cap {
            map = match next.take() {
                Some(nf) => {
                    let m = nf.rx.recv().context("baseline file thread")??;
                    populating = Some(nf.handle);
                    m
                }
                None => map_segment(&create_prealloc(dir, files, segment_size)?)?,
            };
            files += 1;
            off = 0;
        }
        let at = SEGMENT_HEADER_LEN + off;
        // SAFETY: `at + len ≤ segment_size` (checked above); this thread is the only writer.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), map.as_mut_ptr().add(at), len) };
        off += len;
        if next.is_none() && off >= cap / 4 {
            next = Some(NextFile::start(
                dir,
                files,
                segment_size,
                populating.take(),
                &stop,
            ));
        }
    }
    let elapsed = start.elapsed();
    std::hint::black_box(&map);
    stop.store(true, Ordering::Relaxed);
    for h in [next.map(|n| n.handle), populating].into_iter().flatten() {
        let _ = h.join();
    }
    drop(map);
    Ok(BaselineResult {
        kind: "mmap_memcpy",
        throughput: Throughput::new(done, done * len as u64, elapsed),
        latency: None,
        files,
    })
}

/// `sync=always` baseline: pwrite + fdatasync of `bytes` at increasing offsets for `duration`.
pub(super) fn baseline_fdatasync(
    bytes: &[u8],
    duration: Duration,
    segment_size: u64,
    dir: &Path,
    (clock, clock_tpn): (&Clock, f64),
) -> Result<BaselineResult> {
    use std::os::unix::fs::FileExt;
    let cap = segment_size as usize - SEGMENT_HEADER_LEN;
    let len = bytes.len();
    let mut h: Histogram<u64> = new_histogram()?;
    let mut files = 0usize;
    let mut file = create_prealloc(dir, files, segment_size)?;
    files += 1;
    let mut off = 0usize;
    let mut n = 0u64;
    let start = clock.mark();
    let deadline = start.ticks + deadline_ticks(duration, clock_tpn);
    let mut prev = start.ticks;
    loop {
        if off + len > cap {
            file = create_prealloc(dir, files, segment_size)?;
            files += 1;
            off = 0;
        }
        file.write_all_at(bytes, (SEGMENT_HEADER_LEN + off) as u64)
            .context("pwrite")?;
        file.sync_data().context("fdatasync")?;
        off += len;
        n += 1;
        let now = clock.now();
        h.saturating_record(now.wrapping_sub(prev));
        prev = now;
        if now >= deadline {
            break;
        }
    }
    let stop = clock.mark();
    Ok(BaselineResult {
        kind: "pwrite_fdatasync",
        throughput: Throughput::new(n, n * len as u64, stop.instant - start.instant),
        latency: Some(Latency::of_ticks(&h, ns_per_tick(start, stop))),
        files,
    })
}

/// `MemAvailable` from /proc/meminfo in bytes (u64::MAX when unknown).
pub(super) fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemAvailable:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(u64::MAX, |kb| kb * 1024)
}
