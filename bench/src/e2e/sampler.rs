//! The lag sampler: resolves sampled commits against the target's published safe time
//! (the module docs of `e2e`), and the source's part of each lag.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Result;
use hdrhistogram::Histogram;
use serde::Serialize;
use tidelog_testkit::load::{CommitSample, SourceSafe};
use tidelog_testkit::Api;

use super::admin::AdminExt;

pub(super) fn micros_since_epoch(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

pub(super) fn lag_histogram() -> Result<Histogram<u64>> {
    // 1 µs .. 1 h, 3 significant digits.
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

pub(super) struct SamplerOut {
    pub(super) hist: Histogram<u64>,
    /// The source's part of each lag: commit → the source's safe time at or past it.
    pub(super) source_hist: Histogram<u64>,
    pub(super) polls: u64,
    pub(super) poll_busy: Duration,
    pub(super) skipped_warmup: u64,
    pub(super) unresolved: u64,
    pub(super) poll_errors: u64,
}

/// The source's part of the lag: each (post-warm-up) sample is matched with the first
/// [`SourceSafe`] at or past its `commit_ht`. The two arrive on different channels, so a
/// sample may find its event already here (kept, ht ascending) or wait for it.
pub(super) struct SourceSplit {
    events: std::collections::VecDeque<(u64, u64)>,
    waiting: BinaryHeap<Reverse<(u64, u64)>>,
}

impl SourceSplit {
    /// Events kept for samples that arrive after them (about 10 s of advances).
    const KEEP: usize = 20_000;

    fn sample(&mut self, ht: u64, at: u64, hist: &mut Histogram<u64>) {
        let i = self.events.partition_point(|&(e, _)| e < ht);
        match self.events.get(i) {
            Some(&(_, e_at)) => hist.saturating_record(e_at.saturating_sub(at).max(1)),
            None => self.waiting.push(Reverse((ht, at))),
        }
    }

    fn event(&mut self, e: SourceSafe, hist: &mut Histogram<u64>) {
        let (ht, e_at) = (e.ht.0, micros_since_epoch(e.at));
        while let Some(Reverse((s_ht, s_at))) = self.waiting.peek().copied() {
            if s_ht > ht {
                break;
            }
            self.waiting.pop();
            hist.saturating_record(e_at.saturating_sub(s_at).max(1));
        }
        if self.events.len() == Self::KEEP {
            self.events.pop_front();
        }
        self.events.push_back((ht, e_at));
    }
}

/// Resolves samples against the published safe time (see the module docs).
pub(super) fn sampler(
    socket: PathBuf,
    rx: mpsc::Receiver<CommitSample>,
    source_rx: mpsc::Receiver<SourceSafe>,
    warmup: Duration,
    probe: LagProbe,
    poll: Duration,
    give_up: Arc<AtomicBool>,
) -> Result<SamplerOut> {
    // The warm-up counts from the first sampled commit.
    let warmup_us = u64::try_from(warmup.as_micros()).unwrap_or(u64::MAX);
    let mut warm_us: Option<u64> = None;
    let admin = Api::new(&socket);
    let mut heap: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut out = SamplerOut {
        hist: lag_histogram()?,
        source_hist: lag_histogram()?,
        polls: 0,
        poll_busy: Duration::ZERO,
        skipped_warmup: 0,
        unresolved: 0,
        poll_errors: 0,
    };
    let mut disconnected = false;
    let mut split = SourceSplit {
        events: std::collections::VecDeque::new(),
        waiting: BinaryHeap::new(),
    };
    let mut push = |s: CommitSample,
                    heap: &mut BinaryHeap<Reverse<(u64, u64)>>,
                    split: &mut SourceSplit,
                    o: &mut SamplerOut| {
        let at = micros_since_epoch(s.committed_at);
        let until = *warm_us.get_or_insert(at.saturating_add(warmup_us));
        if at < until {
            o.skipped_warmup += 1;
        } else {
            heap.push(Reverse((s.commit_ht.0, at)));
            split.sample(s.commit_ht.0, at, &mut o.source_hist);
        }
    };
    loop {
        // Source events first: a sample pushed below then finds the events sent before it.
        while let Ok(e) = source_rx.try_recv() {
            split.event(e, &mut out.source_hist);
        }
        loop {
            match rx.try_recv() {
                Ok(s) => push(s, &mut heap, &mut split, &mut out),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    disconnected = true;
                    break;
                }
            }
        }
        if heap.is_empty() {
            if disconnected {
                break;
            }
            match rx.recv_timeout(Duration::from_millis(5)) {
                Ok(s) => push(s, &mut heap, &mut split, &mut out),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => disconnected = true,
            }
            continue;
        }
        if give_up.load(Ordering::Relaxed) {
            out.unresolved = heap.len() as u64;
            break;
        }
        let t0 = Instant::now();
        let safe = match (probe, heap.peek()) {
            (LagProbe::Wait, Some(Reverse((oldest, _)))) => {
                admin.safe_time_at(&format!("/v1/safe-time?wait-for={oldest}&wait=50ms"))
            }
            _ => admin.safe_time(),
        };
        let seen = micros_since_epoch(SystemTime::now());
        out.poll_busy += t0.elapsed();
        out.polls += 1;
        match safe {
            Ok(safe) => {
                while let Some(Reverse((ht, at))) = heap.peek().copied() {
                    if ht > safe {
                        break;
                    }
                    heap.pop();
                    out.hist.saturating_record(seen.saturating_sub(at).max(1));
                }
            }
            Err(_) => {
                out.poll_errors += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if probe == LagProbe::Poll {
            std::thread::sleep(poll);
        }
    }
    Ok(out)
}

/// How the lag sampler follows the safe time (`--lag-probe`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LagProbe {
    /// `GET /v1/safe-time?wait-for=HT`: answered when the safe time reaches HT.
    Wait,
    /// `GET /v1/safe-time` every `--poll-us`.
    Poll,
}
