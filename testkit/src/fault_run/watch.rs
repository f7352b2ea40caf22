//! What the fault run watches while it runs, each on a thread of its own, through the
//! applier's admin socket (whichever applier process answers there):
//!
//! * the **safe time**, every 20 ms: every value seen, and each time one was below an
//!   earlier one (across restarts too);
//! * **consistent reads** of every bank balance, back to back: each one served must hold
//!   every account and the bank's total, and its `read_ht` never goes back; reads that
//!   cannot be served (a 503 during a fault, no answer while the applier is down) are
//!   counted, and any other answer is a failure.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Result;
use tidelog_wal::HybridTime;

use crate::api::{bank_sum, Api, BANK_SCAN};

/// Between two safe-time polls.
const SAFE_TIME_EVERY: Duration = Duration::from_millis(20);
/// Between two consistent reads.
const READ_EVERY: Duration = Duration::from_millis(10);
/// Failures kept word for word (the rest are counted).
const KEEP: usize = 10;

/// One safe time seen: when (wall clock) and the value.
#[derive(Clone, Copy, Debug)]
pub struct SafeSample {
    pub at: Instant,
    pub wall: SystemTime,
    pub safe: HybridTime,
}

impl SafeSample {
    /// How far the safe time was behind the wall clock then.
    pub fn lag(&self) -> Duration {
        self.wall
            .duration_since(self.safe.to_system_time())
            .unwrap_or_default()
    }
}

/// The safe time as followed so far.
#[derive(Debug, Default)]
pub struct SafeTimes {
    pub samples: Vec<SafeSample>,
    /// Polls with no answer (the applier down or busy).
    pub unanswered: u64,
    /// A value below one seen before: (before, after).
    pub regressions: Vec<(HybridTime, HybridTime)>,
    pub regression_count: u64,
    pub max: HybridTime,
}

impl SafeTimes {
    /// Takes a value seen now; a value below the highest seen before is a regression.
    pub fn note(&mut self, s: SafeSample) {
        if s.safe < self.max {
            self.regression_count += 1;
            if self.regressions.len() < KEEP {
                self.regressions.push((self.max, s.safe));
            }
        }
        self.max = self.max.max(s.safe);
        self.samples.push(s);
    }

    /// The newest value seen.
    pub fn latest(&self) -> Option<SafeSample> {
        self.samples.last().copied()
    }

    /// The largest lag seen between `from` and `to`.
    pub fn max_lag(&self, from: Instant, to: Instant) -> Duration {
        self.samples
            .iter()
            .filter(|s| s.at >= from && s.at <= to)
            .map(SafeSample::lag)
            .max()
            .unwrap_or_default()
    }
}

/// The consistent reads so far.
#[derive(Debug, Default)]
pub struct Reads {
    /// Served (200), each checked.
    pub served: u64,
    /// 503: the safe time could not be served (during a fault).
    pub unavailable: u64,
    /// No answer (the applier down).
    pub unanswered: u64,
    /// Served with the wrong total or accounts, a `read_ht` below an earlier one, or an
    /// answer other than 200 or 503.
    pub failures: Vec<String>,
    pub failure_count: u64,
    last_read_ht: u64,
}

impl Reads {
    fn fail(&mut self, what: String) {
        self.failure_count += 1;
        if self.failures.len() < KEEP {
            self.failures.push(what);
        }
    }

    /// Checks one answer to [`BANK_SCAN`]: `accounts` balances summing to `total`, at a
    /// `read_ht` not below an earlier one.
    pub fn check(&mut self, status: u16, v: &serde_json::Value, accounts: u64, total: u64) {
        match status {
            200 => {
                self.served += 1;
                match bank_sum(v) {
                    Ok((sum, n, read_ht)) => {
                        let ht: u64 = read_ht.parse().unwrap_or(0);
                        if sum != total || n as u64 != accounts {
                            self.fail(format!(
                                "read at {read_ht}: {n} accounts summing to {sum} (expected {accounts} summing to {total})"
                            ));
                        }
                        if ht < self.last_read_ht {
                            self.fail(format!(
                                "read_ht went back: {} then {ht}",
                                self.last_read_ht
                            ));
                        }
                        self.last_read_ht = self.last_read_ht.max(ht);
                    }
                    Err(e) => self.fail(format!("unreadable answer: {e:#}")),
                }
            }
            503 => self.unavailable += 1,
            _ => self.fail(format!("answer {status}: {v}")),
        }
    }
}

/// The watching threads; stopped and joined by [`Watch::stop`] or when dropped.
pub struct Watch {
    pub safe: Arc<Mutex<SafeTimes>>,
    pub reads: Arc<Mutex<Reads>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Watch {
    /// Starts following the applier on `socket`; the bank has `accounts` accounts holding
    /// `total` between them.
    pub fn start(socket: &Path, accounts: u64, total: u64) -> Result<Watch> {
        let stop = Arc::new(AtomicBool::new(false));
        let safe: Arc<Mutex<SafeTimes>> = Arc::default();
        let reads: Arc<Mutex<Reads>> = Arc::default();
        let mut threads = Vec::new();
        {
            let (api, stop, safe) = (Api::new(socket), stop.clone(), safe.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("watch-safe-time".into())
                    .spawn(move || follow_safe_time(&api, &stop, &safe))?,
            );
        }
        {
            let (api, stop, reads) = (Api::new(socket), stop.clone(), reads.clone());
            threads.push(
                std::thread::Builder::new()
                    .name("watch-reads".into())
                    .spawn(move || read_bank(&api, &stop, &reads, accounts, total))?,
            );
        }
        Ok(Watch {
            safe,
            reads,
            stop,
            threads,
        })
    }

    /// Waits until the safe time seen reaches `ht`, or `timeout` passes; the sample that
    /// reached it.
    pub fn wait_safe_time(&self, ht: HybridTime, timeout: Duration) -> Option<SafeSample> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(s) = lock(&self.safe).latest().filter(|s| s.safe >= ht) {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(SAFE_TIME_EVERY / 2);
        }
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

fn follow_safe_time(api: &Api, stop: &AtomicBool, safe: &Mutex<SafeTimes>) {
    while !stop.load(Ordering::Relaxed) {
        match api.get("/v1/safe-time") {
            Ok((200, v)) if v["initialized"] == true => {
                let ht = v["safe_time"].as_str().and_then(|s| s.parse().ok());
                if let Some(ht) = ht {
                    lock(safe).note(SafeSample {
                        at: Instant::now(),
                        wall: SystemTime::now(),
                        safe: HybridTime(ht),
                    });
                }
            }
            Ok(_) => {}
            Err(_) => lock(safe).unanswered += 1,
        }
        std::thread::sleep(SAFE_TIME_EVERY);
    }
}

fn read_bank(api: &Api, stop: &AtomicBool, reads: &Mutex<Reads>, accounts: u64, total: u64) {
    while !stop.load(Ordering::Relaxed) {
        match api.get(BANK_SCAN) {
            Ok((status, v)) => lock(reads).check(status, &v, accounts, total),
            Err(_) => lock(reads).unanswered += 1,
        }
        std::thread::sleep(READ_EVERY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn answer(read_ht: u64, balances: &[u64]) -> serde_json::Value {
        let items: Vec<_> = balances
            .iter()
            .enumerate()
            .map(|(i, b)| json!({"key": format!("acct/{i}"), "value": b.to_string()}))
            .collect();
        json!({"read_ht": read_ht.to_string(), "items": items, "more": false})
    }

    #[test]
    fn a_wrong_total_a_missing_account_or_a_read_back_in_time_is_a_failure() {
        let mut r = Reads::default();
        r.check(200, &answer(10, &[500, 1500]), 2, 2000);
        r.check(503, &json!({"error": "stale_safe_time"}), 2, 2000);
        assert_eq!((r.served, r.unavailable, r.failure_count), (1, 1, 0));
        r.check(200, &answer(11, &[500, 1499]), 2, 2000);
        r.check(200, &answer(12, &[2000]), 2, 2000);
        r.check(200, &answer(9, &[1000, 1000]), 2, 2000);
        r.check(500, &json!({"error": "internal"}), 2, 2000);
        assert_eq!(r.failure_count, 4, "{:?}", r.failures);
        assert!(
            r.failures[2].contains("read_ht went back"),
            "{:?}",
            r.failures
        );
    }

    #[test]
    fn a_safe_time_below_an_earlier_one_is_a_regression() {
        let mut s = SafeTimes::default();
        let at = |ht| SafeSample {
            at: Instant::now(),
            wall: SystemTime::now(),
            safe: HybridTime(ht),
        };
        s.note(at(5));
        s.note(at(5));
        s.note(at(7));
        assert_eq!(s.regression_count, 0);
        s.note(at(6));
        assert_eq!(s.regression_count, 1);
        assert_eq!(s.regressions, vec![(HybridTime(7), HybridTime(6))]);
        assert_eq!(s.max, HybridTime(7));
    }
}
