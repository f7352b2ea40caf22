//! The applier's own lag breakdown, `tidelog_applier_stage_lag_seconds{stage=…}`: how old
//! the newest data was when a group of frames became durable (`received`), when an apply
//! batch was in the store (`applied`) and when a safe time was published (`visible`).
//!
//! `e2e` scrapes `GET /metrics` when the timed load starts and once the target has caught
//! up, and prints per stage the quantiles of the difference, interpolated linearly inside
//! the Prometheus buckets. They are per event (group, batch, publish), not per
//! transaction, and as coarse as the buckets (0.5, 1, 2.5, 5, 10, 25 ms, …): they show
//! which stage the lag grows in, beside the sampler's exact per-transaction figure.

use serde::Serialize;

const FAMILY: &str = "tidelog_applier_stage_lag_seconds_bucket{";
/// The stages in pipeline order.
pub const STAGES: [&str; 3] = ["received", "applied", "visible"];

/// Cumulative bucket counts of each stage, as scraped: `(upper bound in seconds, count)`,
/// `+Inf` as `f64::INFINITY`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape(pub Vec<(String, Vec<(f64, u64)>)>);

/// One stage's quantiles between two scrapes, in milliseconds (`None`: above the last
/// finite bucket).
#[derive(Clone, Debug, Serialize)]
pub struct StageLag {
    pub stage: String,
    pub count: u64,
    pub p50_ms: Option<f64>,
    pub p90_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

/// Parses the family's bucket lines out of a Prometheus text exposition.
pub fn parse(text: &str) -> Scrape {
    let mut out: Vec<(String, Vec<(f64, u64)>)> = Vec::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(FAMILY) else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let (mut stage, mut le) = (None, None);
        for kv in labels.split(',') {
            match kv.split_once('=') {
                Some(("stage", v)) => stage = Some(v.trim_matches('"')),
                Some(("le", v)) => le = Some(v.trim_matches('"')),
                _ => {}
            }
        }
        let (Some(stage), Some(le), Ok(n)) = (stage, le, value.trim().parse::<u64>()) else {
            continue;
        };
        let le = if le == "+Inf" {
            f64::INFINITY
        } else {
            match le.parse::<f64>() {
                Ok(v) => v,
                Err(_) => continue,
            }
        };
        match out.iter_mut().find(|(s, _)| s == stage) {
            Some((_, b)) => b.push((le, n)),
            None => out.push((stage.to_string(), vec![(le, n)])),
        }
    }
    for (_, b) in &mut out {
        b.sort_by(|x, y| x.0.total_cmp(&y.0));
    }
    Scrape(out)
}

/// Each stage's quantiles over the observations between `before` and `after`.
pub fn between(before: &Scrape, after: &Scrape) -> Vec<StageLag> {
    STAGES
        .iter()
        .filter_map(|stage| {
            let a = &after.0.iter().find(|(s, _)| s == stage)?.1;
            let b = before.0.iter().find(|(s, _)| s == stage).map(|(_, b)| b);
            let delta: Vec<(f64, u64)> = a
                .iter()
                .map(|&(le, n)| {
                    let was = b
                        .and_then(|b| b.iter().find(|(l, _)| *l == le))
                        .map_or(0, |&(_, n)| n);
                    (le, n.saturating_sub(was))
                })
                .collect();
            let count = delta.last().map_or(0, |&(_, n)| n);
            let q = |q: f64| quantile(&delta, q).map(|s| s * 1e3);
            Some(StageLag {
                stage: stage.to_string(),
                count,
                p50_ms: q(0.5),
                p90_ms: q(0.9),
                p99_ms: q(0.99),
            })
        })
        .collect()
}

/// The `q` quantile of cumulative buckets, linear inside the bucket it falls in (from the
/// bucket below's bound, 0 for the first); `None` when it falls in `+Inf` or there are no
/// observations.
fn quantile(cumulative: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = cumulative.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let (mut lo, mut below) = (0.0, 0u64);
    for &(le, n) in cumulative {
        if n as f64 >= rank {
            if le.is_infinite() {
                return None;
            }
            let inside = (n - below) as f64;
            let frac = if inside > 0.0 {
                (rank - below as f64) / inside
            } else {
                1.0
            };
            return Some(lo + (le - lo) * frac.clamp(0.0, 1.0));
        }
        (lo, below) = (le, n);
    }
    None
}

/// `received p50 ≈ 2.1 p90 ≈ 4.0 p99 ≈ 9.5 ms (1,234); applied …`.
pub fn describe(stages: &[StageLag]) -> String {
    // `None`: above the last finite bucket the applier exports.
    let top = tidelog_applier::latency::BUCKETS_SECONDS
        .last()
        .copied()
        .unwrap_or(0.0);
    let ms = |v: Option<f64>| v.map_or(format!(">{top} s"), |v| format!("{v:.1}"));
    stages
        .iter()
        .map(|s| {
            format!(
                "{} p50 ≈ {} p90 ≈ {} p99 ≈ {} ms ({})",
                s.stage,
                ms(s.p50_ms),
                ms(s.p90_ms),
                ms(s.p99_ms),
                crate::stats::fmt_int(s.count)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn text(received: [u64; 3], visible_inf: u64) -> String {
        format!(
            "# TYPE tidelog_applier_stage_lag_seconds histogram\n\
             tidelog_applier_stage_lag_seconds_bucket{{stage=\"received\",le=\"0.001\"}} {}\n\
             tidelog_applier_stage_lag_seconds_bucket{{stage=\"received\",le=\"0.005\"}} {}\n\
             tidelog_applier_stage_lag_seconds_bucket{{stage=\"received\",le=\"+Inf\"}} {}\n\
             tidelog_applier_stage_lag_seconds_sum{{stage=\"received\"}} 1.5\n\
             tidelog_applier_stage_lag_seconds_bucket{{stage=\"visible\",le=\"0.001\"}} 0\n\
             tidelog_applier_stage_lag_seconds_bucket{{stage=\"visible\",le=\"+Inf\"}} {visible_inf}\n\
             tidelog_applier_apply_batch_duration_seconds_bucket{{le=\"0.001\"}} 99\n",
            received[0], received[1], received[2]
        )
    }

    #[test]
    fn quantiles_come_from_the_difference_between_scrapes() {
        let before = parse(&text([10, 10, 10], 0));
        let after = parse(&text([10, 110, 110], 5));
        assert_eq!(after.0.len(), 2, "{after:?}");
        let s = between(&before, &after);
        assert_eq!(s.len(), 2);
        // All 100 new observations are in (1 ms, 5 ms]: the median half way.
        assert_eq!((s[0].stage.as_str(), s[0].count), ("received", 100));
        let p50 = s[0].p50_ms.unwrap();
        assert!((p50 - 3.0).abs() < 1e-9, "{p50}");
        let p99 = s[0].p99_ms.unwrap();
        assert!((p99 - 4.96).abs() < 1e-9, "{p99}");
        // Everything above the last finite bound: no figure.
        assert_eq!((s[1].stage.as_str(), s[1].count), ("visible", 5));
        assert_eq!(s[1].p50_ms, None);
        assert!(describe(&s).contains("visible p50 ≈ >10 s"));
    }

    #[test]
    fn nothing_observed_gives_no_quantiles() {
        let t = parse(&text([3, 3, 3], 0));
        let s = between(&t, &t);
        assert_eq!(s[0].count, 0);
        assert_eq!(s[0].p50_ms, None);
        assert!(between(&Scrape::default(), &Scrape::default()).is_empty());
    }
}
