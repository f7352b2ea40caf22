//! Latency histograms and number formatting shared by the benchmarks.

use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency a histogram tracks (larger values saturate): an hour of ticks at 10 GHz.
const MAX_TRACKED_TICKS: u64 = 3_600 * 10_000_000_000;

/// A latency histogram (of [`Clock`] ticks), 3 significant digits.
pub fn new_histogram() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, MAX_TRACKED_TICKS, 3)?)
}

/// Nanoseconds of `d`, clamped to u64.
#[inline]
pub fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Percentiles of a latency histogram, in nanoseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub count: u64,
    pub mean_ns: f64,
    pub p50_ns: u64,
    pub p99_ns: u64,
    pub p999_ns: u64,
    pub max_ns: u64,
}

impl Latency {
    /// The percentiles of a histogram of ticks, `ns_per_tick` nanoseconds each.
    pub fn of_ticks(h: &Histogram<u64>, ns_per_tick: f64) -> Latency {
        let ns = |t: u64| (t as f64 * ns_per_tick).round() as u64;
        Latency {
            count: h.len(),
            mean_ns: h.mean() * ns_per_tick,
            p50_ns: ns(h.value_at_quantile(0.50)),
            p99_ns: ns(h.value_at_quantile(0.99)),
            p999_ns: ns(h.value_at_quantile(0.999)),
            max_ns: ns(h.max()),
        }
    }
}

/// The per-record clock of the timed loops: the TSC (`rdtsc`, ~10 ns) where the kernel
/// reports it constant and non-stop, otherwise the monotonic clock (`Instant`, ~30–40 ns on
/// a VM). Histograms record raw ticks; [`ns_per_tick`] turns ticks into nanoseconds
/// from the monotonic clock over the same interval.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    tsc: bool,
    origin: Instant,
}

impl Clock {
    pub fn new() -> Clock {
        Clock {
            tsc: tsc_usable(),
            origin: Instant::now(),
        }
    }

    pub fn source(&self) -> &'static str {
        if self.tsc {
            "rdtsc"
        } else {
            "clock_gettime(CLOCK_MONOTONIC)"
        }
    }

    /// The current tick count.
    #[inline(always)]
    pub fn now(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        if self.tsc {
            // SAFETY: rdtsc has no preconditions; `tsc_usable` checked the CPU has it.
            return unsafe { core::arch::x86_64::_rdtsc() };
        }
        nanos(self.origin.elapsed())
    }

    /// Ticks per nanosecond, measured over ~`d` (used to turn a duration into a tick deadline).
    pub fn ticks_per_ns(&self, d: Duration) -> f64 {
        let (i0, t0) = (Instant::now(), self.now());
        while i0.elapsed() < d {
            std::hint::spin_loop();
        }
        let (i1, t1) = (Instant::now(), self.now());
        (t1.wrapping_sub(t0)) as f64 / (nanos(i1 - i0).max(1)) as f64
    }

    /// A pair of readings to calibrate ticks against the monotonic clock later.
    pub fn mark(&self) -> Mark {
        Mark {
            instant: Instant::now(),
            ticks: self.now(),
        }
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// A tick reading taken together with a monotonic-clock reading.
#[derive(Clone, Copy, Debug)]
pub struct Mark {
    pub instant: Instant,
    pub ticks: u64,
}

/// Nanoseconds per tick between two marks.
pub fn ns_per_tick(a: Mark, b: Mark) -> f64 {
    let ticks = b.ticks.wrapping_sub(a.ticks).max(1);
    nanos(b.instant - a.instant) as f64 / ticks as f64
}

fn tsc_usable() -> bool {
    if !cfg!(target_arch = "x86_64") {
        return false;
    }
    let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") else {
        return false;
    };
    let Some(flags) = info.lines().find(|l| l.starts_with("flags")) else {
        return false;
    };
    let has = |f: &str| flags.split_whitespace().any(|w| w == f);
    has("tsc") && has("constant_tsc") && has("nonstop_tsc")
}

/// What one clock read plus one histogram record cost, per record, in nanoseconds: the
/// instrumentation every timed loop pays once per record.
pub fn instrumentation_overhead_ns(clock: &Clock) -> anyhow::Result<f64> {
    const N: u64 = 2_000_000;
    let mut h = new_histogram()?;
    let start = Instant::now();
    let mut prev = clock.now();
    for _ in 0..N {
        let now = clock.now();
        h.saturating_record(now.wrapping_sub(prev));
        prev = now;
    }
    std::hint::black_box(&h);
    Ok(nanos(start.elapsed()) as f64 / N as f64)
}

/// `1234` → `1.23µs`, `850` → `850ns`, `3_400_000` → `3.40ms`.
pub fn fmt_ns(ns: u64) -> String {
    let f = ns as f64;
    if ns < 1_000 {
        format!("{ns}ns")
    } else if ns < 1_000_000 {
        format!("{:.2}µs", f / 1e3)
    } else if ns < 1_000_000_000 {
        format!("{:.2}ms", f / 1e6)
    } else {
        format!("{:.2}s", f / 1e9)
    }
}

/// An integer with thousands separators: `1234567` → `1,234,567`.
pub fn fmt_int(v: u64) -> String {
    let s = v.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A byte count in binary units where exact-ish: `67108864` → `64 MiB`.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (name, size) in UNITS {
        if b >= size && b % size == 0 {
            return format!("{} {name}", b / size);
        }
    }
    for (name, size) in UNITS {
        if b >= size {
            return format!("{:.1} {name}", b as f64 / size as f64);
        }
    }
    format!("{b} B")
}

/// Parses `65536`, `64KiB`, `64K`, `64MiB`, `1G`, `1GB` (all binary multiples).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num
        .parse()
        .map_err(|_| format!("`{s}`: expected a byte count such as 67108864 or 64MiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        other => return Err(format!("`{s}`: unknown size unit `{other}`")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("`{s}`: size out of range"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12x").is_err());
        assert!(parse_size("").is_err());
    }

    #[test]
    fn numbers_format() {
        assert_eq!(fmt_int(1_234_567), "1,234,567");
        assert_eq!(fmt_int(12), "12");
        assert_eq!(fmt_ns(850), "850ns");
        assert_eq!(fmt_ns(1_234), "1.23µs");
        assert_eq!(fmt_bytes(64 << 20), "64 MiB");
    }
}
