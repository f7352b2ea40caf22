//! The Prometheus text exposition checked without promtool: parsed by a strict parser of the
//! format (`openmetrics-parser`: grammar, escapes, one label set per family, histograms
//! cumulative with a `+Inf` bucket, no family twice), then linted with the rules of
//! `promtool check metrics` that apply to this project (HELP on every family, `_total` on
//! counters and only on counters, base units, snake case) and the house naming
//! `tidelog_<component>_<thing>_<unit>`. Where promtool is on PATH it checks the same text
//! too ([`super::tool`]: required under `.ci/run`).
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use openmetrics_parser::{prometheus::parse_prometheus, PrometheusType, PrometheusValue};

/// Units that are not base units (promtool: "use base unit …").
const NON_BASE_UNITS: &[&str] = &[
    "milliseconds",
    "microseconds",
    "nanoseconds",
    "millis",
    "ms",
    "us",
    "ns",
    "minutes",
    "hours",
    "days",
    "kilobytes",
    "megabytes",
    "gigabytes",
    "kib",
    "mib",
    "gib",
    "percent",
];

/// Everything wrong with `text`, one line each; empty when it is valid.
pub fn problems(text: &str) -> Vec<String> {
    let exposition = match parse_prometheus(text) {
        Ok(e) => e,
        Err(e) => return vec![format!("does not parse: {e:?}")],
    };
    let mut out = Vec::new();
    let mut names: Vec<&String> = exposition.families.keys().collect();
    names.sort();
    for name in names {
        let f = &exposition.families[name];
        let words: Vec<&str> = name.split('_').collect();
        let snake = name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !snake || words.iter().any(|w| w.is_empty()) {
            out.push(format!("{name}: not snake_case"));
        }
        if !(name.starts_with("tidelog_applier_") || name.starts_with("tidelog_shipper_")) {
            out.push(format!("{name}: not tidelog_<component>_…"));
        }
        if f.help.trim().is_empty() {
            out.push(format!("{name}: no HELP text"));
        }
        if let Some(u) = words.iter().find(|w| NON_BASE_UNITS.contains(w)) {
            out.push(format!("{name}: {u} is not a base unit (seconds, bytes)"));
        }
        let total = name.ends_with("_total");
        match f.family_type {
            PrometheusType::Counter if !total => {
                out.push(format!("{name}: a counter's name ends in _total"))
            }
            PrometheusType::Unknown => out.push(format!("{name}: no TYPE")),
            PrometheusType::Counter => {}
            _ if total => out.push(format!("{name}: _total on a non-counter")),
            _ => {}
        }
        if !matches!(
            f.family_type,
            PrometheusType::Histogram | PrometheusType::Summary
        ) && ["_bucket", "_count", "_sum"]
            .iter()
            .any(|s| name.ends_with(s))
        {
            out.push(format!("{name}: a histogram suffix on a {}", f.family_type));
        }
        for s in f.iter_samples() {
            let labels: Vec<String> = s
                .get_labelset()
                .map(|l| l.iter().map(|(k, v)| format!("{k}={v:?}")).collect())
                .unwrap_or_default();
            let series = format!("{name}{{{}}}", labels.join(","));
            match &s.value {
                PrometheusValue::Histogram(h) => {
                    let bounds: Vec<f64> = h.buckets.iter().map(|b| b.upper_bound).collect();
                    if bounds.windows(2).any(|w| w[0] >= w[1]) {
                        out.push(format!(
                            "{series}: bucket bounds not increasing: {bounds:?}"
                        ));
                    }
                    let inf = h.buckets.last().filter(|b| b.upper_bound == f64::INFINITY);
                    match (inf, h.count) {
                        (Some(b), Some(c)) if b.count.as_f64() == c as f64 => {}
                        (b, c) => out.push(format!(
                            "{series}: the +Inf bucket {:?} is not the count {c:?}",
                            b.map(|b| b.count.as_f64())
                        )),
                    }
                    if h.sum.as_ref().is_some_and(|s| s.as_f64() < 0.0) {
                        out.push(format!("{series}: negative sum"));
                    }
                }
                PrometheusValue::Counter(c) if c.value.as_f64() < 0.0 => {
                    out.push(format!("{series}: negative counter"))
                }
                _ => {}
            }
        }
    }
    out
}

/// Panics naming every problem of `text` (the `what` daemon's metrics), and what promtool
/// said about it where promtool is there.
pub fn assert_valid(what: &str, text: &str) {
    let p = problems(text);
    assert!(
        p.is_empty(),
        "the {what}'s metrics:\n  {}\n{text}",
        p.join("\n  ")
    );
    let Some(promtool) = super::tool("promtool", "`promtool check metrics`") else {
        return;
    };
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = super::output_text(&out);
    assert!(
        out.status.success() && said.trim().is_empty(),
        "promtool check metrics on the {what}'s metrics: {said}\n{text}"
    );
}
