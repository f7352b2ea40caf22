//! Resident set size of the daemons under test, sampled on a thread (`e2e --soak`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The resident set size of process `pid` (`VmRSS` in `/proc/<pid>/status`), in bytes;
/// `None` once it is gone.
pub(crate) fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One sample: seconds since the sampler started, then each process's RSS in bytes
/// (0 where it could not be read).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Sample {
    pub t_s: f64,
    pub applier: u64,
    pub shipper: u64,
}

/// Samples two processes every `every` until stopped.
pub(crate) struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<Vec<Sample>>,
}

impl Sampler {
    pub(crate) fn start(applier: u32, shipper: u32, every: Duration) -> std::io::Result<Sampler> {
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let handle = std::thread::Builder::new()
            .name("rss-sampler".into())
            .spawn(move || {
                let start = Instant::now();
                let mut out = Vec::new();
                let mut next = start;
                while !s2.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now >= next {
                        out.push(Sample {
                            t_s: start.elapsed().as_secs_f64(),
                            applier: rss_bytes(applier).unwrap_or(0),
                            shipper: rss_bytes(shipper).unwrap_or(0),
                        });
                        next += every;
                    }
                    // Short naps so that `stop` answers quickly.
                    std::thread::sleep(
                        (next - Instant::now().min(next)).min(Duration::from_millis(100)),
                    );
                }
                out
            })?;
        Ok(Sampler { stop, handle })
    }

    /// Stops the thread; the samples taken, oldest first.
    pub(crate) fn finish(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or_default()
    }
}

/// The last sample taken at or before `t_s` seconds (the first one if none was).
pub(crate) fn at(samples: &[Sample], t_s: f64) -> Option<Sample> {
    samples
        .iter()
        .rev()
        .find(|s| s.t_s <= t_s)
        .or(samples.first())
        .copied()
}

/// The largest applier RSS sampled in `[from_s, to_s]`, and the sample's time; `None` when
/// no sample lies there.
pub(crate) fn applier_max_between(samples: &[Sample], from_s: f64, to_s: f64) -> Option<Sample> {
    samples
        .iter()
        .filter(|s| s.t_s >= from_s && s.t_s <= to_s)
        .max_by_key(|s| s.applier)
        .copied()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_rss_is_read() {
        let rss = rss_bytes(std::process::id()).unwrap();
        // A running test binary is resident: more than a page, less than the machine.
        assert!(rss > 4096 && rss < 1 << 40, "{rss}");
        assert_eq!(rss_bytes(u32::MAX), None);
    }

    #[test]
    fn the_sample_at_a_time_is_the_last_one_before_it() {
        let s = |t_s, applier| Sample {
            t_s,
            applier,
            shipper: 0,
        };
        let v = [s(0.0, 1), s(5.0, 2), s(10.0, 3)];
        assert_eq!(at(&v, 7.0).unwrap().applier, 2);
        assert_eq!(at(&v, 10.0).unwrap().applier, 3);
        assert_eq!(at(&v, 99.0).unwrap().applier, 3);
        assert_eq!(at(&v, -1.0).unwrap().applier, 1);
        assert_eq!(at(&[], 1.0), None);
        let m = applier_max_between(&[s(0.0, 9), s(5.0, 4), s(10.0, 7), s(15.0, 8)], 4.0, 12.0);
        assert_eq!(m.map(|m| (m.t_s, m.applier)), Some((10.0, 7)));
        assert_eq!(applier_max_between(&v, 11.0, 12.0), None);
    }
}
