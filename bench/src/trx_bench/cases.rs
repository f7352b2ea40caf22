//! The look-up cases (hit/miss, with/without a gtid hint), their queries, the answers'
//! checks, the results table, and the library case.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use serde::Serialize;
use tidelog_applier::store::Store;
use tidelog_applier::trx::{trx_status, SafeTimeView, TrxQuery, TrxState};
use tidelog_wal::{Gtid, HybridTime};

use crate::stats::{fmt_int, new_histogram, ns_per_tick, Clock, Latency};

use super::*;

// ---- the look-up sets ----

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Case {
    Hit,
    HitWithHint,
    Miss,
    MissWithHint,
}

impl Case {
    pub(super) const ALL: [Case; 4] =
        [Case::Hit, Case::HitWithHint, Case::Miss, Case::MissWithHint];
    pub(super) fn name(self) -> &'static str {
        match self {
            Case::Hit => "hit, no hint",
            Case::HitWithHint => "hit, hint",
            Case::Miss => "miss, no hint",
            Case::MissWithHint => "miss, hint",
        }
    }
    pub(super) fn hit(self) -> bool {
        matches!(self, Case::Hit | Case::HitWithHint)
    }
}

pub(super) struct Query {
    pub(super) trx: String,
    pub(super) hint: Option<String>,
    /// For hits: the commit's gtid.
    pub(super) gtid: Option<Gtid>,
}

pub(super) fn queries(case: Case, n: u64, m: &Manifest, gen: &Gen, rng: &mut Rng) -> Vec<Query> {
    (0..n)
        .map(|_| {
            let any_gtid = |rng: &mut Rng| format!("0-1-{}", rng.below(m.commits) + 1);
            if case.hit() {
                let i = rng.below(m.commits);
                let (s, c) = gen.table[i as usize];
                let g = Gtid::new(0, 1, i + 1);
                Query {
                    trx: format!("{}:{c}", m.connect_base + s as u64),
                    hint: (case == Case::HitWithHint).then(|| g.to_string()),
                    gtid: Some(g),
                }
            } else {
                let trx = if rng.below(2) == 0 {
                    // A known session, a counter it has not reached.
                    let s = rng.below(m.sessions as u64) as usize;
                    let next = gen.sessions[s].trx_id();
                    format!(
                        "{}:{}",
                        next.connect_id,
                        next.commit_counter + 1 + rng.below(1_000_000)
                    )
                } else {
                    // A connect id no session used.
                    format!(
                        "{}:{}",
                        m.connect_base + m.sessions as u64 + rng.below(1 << 20),
                        1 + rng.below(1000)
                    )
                };
                Query {
                    trx,
                    hint: (case == Case::MissWithHint).then(|| any_gtid(rng)),
                    gtid: None,
                }
            }
        })
        .collect()
}

// ---- results ----

#[derive(Clone, Debug, Serialize)]
pub(super) struct CaseResult {
    pub(super) path: &'static str,
    pub(super) case: String,
    #[serde(flatten)]
    pub(super) latency: Latency,
}

pub(super) fn us(ns: u64) -> String {
    format!("{:.2}", ns as f64 / 1000.0)
}

pub(super) fn print_table(rows: &[CaseResult]) {
    println!(
        "{:<64} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "case (µs)", "count", "p50", "p99", "p999", "max", "mean"
    );
    for r in rows {
        let l = &r.latency;
        println!(
            "{:<64} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9.2}",
            format!("{} {}", r.path, r.case),
            fmt_int(l.count),
            us(l.p50_ns),
            us(l.p99_ns),
            us(l.p999_ns),
            us(l.max_ns),
            l.mean_ns / 1000.0
        );
    }
}

// ---- library ----

/// A safe time past every commit.
pub(super) struct FixedSafeTime(pub(super) HybridTime);

impl SafeTimeView for FixedSafeTime {
    fn safe_time(&self) -> Option<HybridTime> {
        Some(self.0)
    }
    fn wait_for(&self, ht: HybridTime, _deadline: Instant) -> bool {
        ht <= self.0
    }
}

pub(super) fn check_answer(
    what: &str,
    case: Case,
    q: &Query,
    state: &str,
    gtid: Option<&str>,
) -> Result<()> {
    let want = if case.hit() { "COMMITTED" } else { "UNKNOWN" };
    if state != want {
        bail!(
            "{what} {}: trx {} (hint {:?}) answered {state}, expected {want}",
            case.name(),
            q.trx,
            q.hint
        );
    }
    if let Some(g) = q.gtid {
        if gtid != Some(g.to_string().as_str()) {
            bail!(
                "{what} {}: trx {} answered gtid {gtid:?}, expected {g}",
                case.name(),
                q.trx
            );
        }
    }
    Ok(())
}

pub(super) fn library_case(
    store: &Store,
    view: &FixedSafeTime,
    case: Case,
    warm: &[Query],
    timed: &[Query],
    clock: &Clock,
) -> Result<Latency> {
    let ask = |q: &Query| {
        trx_status(
            store,
            view,
            &TrxQuery {
                trx_id: &q.trx,
                gtid_hint: q.hint.as_deref(),
                wait: Duration::ZERO,
                max_staleness: Duration::from_secs(365 * 86_400),
            },
        )
    };
    for q in warm {
        let a = ask(q)?;
        check_answer(
            "library",
            case,
            q,
            a.state.name(),
            a.gtid.map(|g| g.to_string()).as_deref(),
        )?;
    }
    let mut h = new_histogram()?;
    let mut answers = Vec::with_capacity(timed.len());
    let m0 = clock.mark();
    for q in timed {
        let t0 = clock.now();
        let a = ask(q);
        let t1 = clock.now();
        h.saturating_record(t1.wrapping_sub(t0).max(1));
        answers.push(a.map(|a| (a.state, a.gtid)));
    }
    let m1 = clock.mark();
    for (q, a) in timed.iter().zip(answers) {
        let (state, gtid) = a?;
        debug_assert!(TrxState::ALL.contains(&state));
        check_answer(
            "library",
            case,
            q,
            state.name(),
            gtid.map(|g| g.to_string()).as_deref(),
        )?;
    }
    Ok(Latency::of_ticks(&h, ns_per_tick(m0, m1)))
}

// ---- admin API ----
