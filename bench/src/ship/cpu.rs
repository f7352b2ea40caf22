//! CPU seconds per process and per thread, from `/proc/<pid>/stat` and
//! `/proc/<pid>/task/<tid>/stat` (utime + stime, in clock ticks).

use std::collections::BTreeMap;

/// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
pub fn ticks_per_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// (comm, utime + stime) of one `stat` file.
fn parse_stat(text: &str) -> Option<(String, u64)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let comm = text.get(open + 1..close)?.to_string();
    // After ") ": state(3) ppid(4) ... utime(14) stime(15); index 0 here is field 3.
    let rest: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    let utime: u64 = rest.get(11)?.parse().ok()?;
    let stime: u64 = rest.get(12)?.parse().ok()?;
    Some((comm, utime + stime))
}

/// A snapshot of one process: its total and each live thread's ticks.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub total: u64,
    /// tid → (thread name, ticks)
    pub threads: BTreeMap<u64, (String, u64)>,
}

/// Snapshot of `pid` (`None`: this process).
pub fn snapshot(pid: Option<u32>) -> Snapshot {
    let base = match pid {
        Some(p) => format!("/proc/{p}"),
        None => "/proc/self".to_string(),
    };
    let total = std::fs::read_to_string(format!("{base}/stat"))
        .ok()
        .and_then(|t| parse_stat(&t))
        .map_or(0, |(_, t)| t);
    let mut threads = BTreeMap::new();
    if let Ok(rd) = std::fs::read_dir(format!("{base}/task")) {
        for ent in rd.flatten() {
            let Some(tid) = ent.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            if let Some(v) = std::fs::read_to_string(ent.path().join("stat"))
                .ok()
                .and_then(|t| parse_stat(&t))
            {
                threads.insert(tid, v);
            }
        }
    }
    Snapshot { total, threads }
}

/// A thread name without its instance number: `recv-tablet-3` → `recv-tablet-*`.
fn group_of(name: &str) -> String {
    let stripped: String = name.chars().filter(|c| !c.is_ascii_digit()).collect();
    if stripped.len() == name.len() {
        name.to_string()
    } else {
        format!("{}-*", stripped.trim_end_matches(['-', '_', ' ']))
    }
}

/// CPU seconds between two snapshots: the process total and by thread group, largest
/// first (threads that exited in between only count in the total).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Usage {
    pub total_s: f64,
    pub by_thread: Vec<(String, f64)>,
}

pub fn usage(a: &Snapshot, b: &Snapshot) -> Usage {
    let hz = ticks_per_s();
    let mut groups: BTreeMap<String, u64> = BTreeMap::new();
    for (tid, (name, t)) in &b.threads {
        let before = a.threads.get(tid).map_or(0, |(_, t)| *t);
        *groups.entry(group_of(name)).or_default() += t.saturating_sub(before);
    }
    let mut by_thread: Vec<(String, f64)> = groups
        .into_iter()
        .filter(|(_, t)| *t > 0)
        .map(|(n, t)| (n, t as f64 / hz))
        .collect();
    by_thread.sort_by(|x, y| y.1.total_cmp(&x.1));
    Usage {
        total_s: b.total.saturating_sub(a.total) as f64 / hz,
        by_thread,
    }
}

impl Usage {
    /// `4.12 s (recv-tablet-* 1.50, tokio-runtime-w 1.20, ...)`, the top `n` groups.
    pub fn describe(&self, n: usize) -> String {
        let parts: Vec<String> = self
            .by_thread
            .iter()
            .take(n)
            .map(|(g, s)| format!("{g} {s:.2}"))
            .collect();
        format!("{:.2} s ({})", self.total_s, parts.join(", "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parses() {
        let s = "123 (ship lane) 0) S 1 2 3 4 5 6 7 8 9 10 17 5 0 0";
        assert_eq!(parse_stat(s), Some(("ship lane) 0".to_string(), 22)));
        assert_eq!(group_of("recv-tablet-3"), "recv-tablet-*");
        assert_eq!(group_of("tokio-runtime-w"), "tokio-runtime-w");
    }
}
