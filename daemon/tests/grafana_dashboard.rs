//! The Grafana dashboard shipped in `systemd/grafana/tidelog.json` queries only metrics the
//! daemons export: every PromQL expression in it (panel targets, annotations, the
//! `label_values` of its variables) is parsed, and each metric it selects must be a sample
//! of a running applier's or shipper's `GET /metrics` — a counter or gauge by its name, a
//! histogram by its `_bucket`, `_sum` or `_count` series. A misspelled or renamed metric
//! would leave its panel empty without any error in Grafana; here it fails the test.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use promql_parser::parser::{self, Expr};
use promql_parser::util::{walk_expr, ExprVisitor};
use serde_json::Value;

fn dashboard_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../systemd/grafana/tidelog.json")
}

/// Every PromQL expression of the dashboard, with where it was found: panel targets and
/// annotations (`expr`), and the metric selector inside the variables' `label_values(…)`.
fn expressions(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(v: &Value, at: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                let name = m
                    .get("title")
                    .or_else(|| m.get("name"))
                    .and_then(Value::as_str)
                    .map_or_else(|| at.to_string(), |t| format!("{at}/{t}"));
                if let Some(e) = m.get("expr").and_then(Value::as_str) {
                    out.push((name.clone(), e.to_string()));
                }
                // A query variable: `query` is a string or `{"query": …}`.
                if m.get("type").and_then(Value::as_str) == Some("query") {
                    let q = m.get("query").map(|q| q.get("query").unwrap_or(q));
                    if let Some(q) = q.and_then(Value::as_str) {
                        out.push((name.clone(), label_values_selector(q)));
                    }
                }
                for (k, child) in m {
                    if k != "query" {
                        walk(child, &name, out);
                    }
                }
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, at, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(dashboard, "dashboard", &mut out);
    out
}

/// `label_values(SELECTOR, label)` → `SELECTOR`; anything else as is (then parsed as
/// PromQL, so an unknown Grafana function fails the test rather than going unchecked).
fn label_values_selector(q: &str) -> String {
    q.trim()
        .strip_prefix("label_values(")
        .and_then(|rest| rest.rsplit_once(','))
        .map_or_else(|| q.to_string(), |(sel, _)| sel.trim().to_string())
}

/// The metric names an expression selects, parsed as PromQL. Grafana's interval variables
/// (`$__rate_interval`, …) are not PromQL: they are replaced by a duration first; the
/// dashboard's own variables (`$applier`) only appear inside label-matcher strings.
fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    struct Names(BTreeSet<String>);
    impl ExprVisitor for Names {
        type Error = String;
        fn pre_visit(&mut self, e: &Expr) -> Result<bool, String> {
            let vs = match e {
                Expr::VectorSelector(vs) => Some(vs),
                Expr::MatrixSelector(ms) => Some(&ms.vs),
                _ => None,
            };
            if let Some(vs) = vs {
                let by_matcher = vs
                    .matchers
                    .matchers
                    .iter()
                    .find(|m| m.name == "__name__")
                    .map(|m| m.value.clone());
                match vs.name.clone().or(by_matcher) {
                    Some(n) => {
                        self.0.insert(n);
                    }
                    None => return Err("a selector without a metric name".into()),
                }
            }
            Ok(true)
        }
    }
    let mut text = expr.to_string();
    for v in ["$__rate_interval", "$__interval", "$__range"] {
        text = text.replace(v, "5m");
    }
    let ast = parser::parse(&text).map_err(|e| format!("not PromQL: {e}"))?;
    let mut names = Names(BTreeSet::new());
    walk_expr(&mut names, &ast)?;
    Ok(names.0)
}

/// What one `/metrics` exposition offers: sample names, and each family's `# TYPE`.
#[derive(Default)]
struct Exposed {
    samples: BTreeSet<String>,
    types: BTreeMap<String, String>,
}

impl Exposed {
    fn add(&mut self, text: &str) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                if let Some((name, kind)) = rest.split_once(' ') {
                    self.types.insert(name.to_string(), kind.trim().to_string());
                }
            } else if !line.starts_with('#') && !line.trim().is_empty() {
                let end = line.find(['{', ' ']).unwrap_or(line.len());
                self.samples.insert(line[..end].to_string());
            }
        }
    }

    /// Why `name` cannot be queried, if it cannot: a sample must exist under that name and
    /// belong to its family — a counter or gauge of that name, or a histogram queried
    /// through one of its series.
    fn problem(&self, name: &str) -> Option<String> {
        if self.types.get(name).map(String::as_str) == Some("histogram") {
            return Some(format!(
                "{name} is a histogram: query its _bucket, _sum or _count"
            ));
        }
        if !self.samples.contains(name) {
            return Some(format!("{name} is not in /metrics"));
        }
        if self.types.contains_key(name) {
            return None;
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| self.types.get(*f).map(String::as_str) == Some("histogram"));
        family
            .is_none()
            .then(|| format!("{name} has no # TYPE of its own nor of a histogram family"))
    }
}

/// Each expression's metrics that `/metrics` lacks (or that cannot be parsed), as lines
/// naming the panel.
fn problems(dashboard: &Value, exposed: &Exposed) -> Vec<String> {
    let mut out = Vec::new();
    for (at, expr) in expressions(dashboard) {
        match metric_names(&expr) {
            Err(e) => out.push(format!("{at}: {expr:?}: {e}")),
            Ok(names) if names.is_empty() => {
                out.push(format!("{at}: {expr:?} queries no metric"));
            }
            Ok(names) => {
                for n in names {
                    if let Some(p) = exposed.problem(&n) {
                        out.push(format!("{at}: {p}"));
                    }
                }
            }
        }
    }
    out
}

#[test]
fn every_metric_the_dashboard_queries_is_exported_by_the_daemons() {
    let text = std::fs::read_to_string(dashboard_path()).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");

    // What an operator needs to see, by the families that carry it.
    let exprs = expressions(&dashboard);
    assert!(exprs.len() >= 20, "only {} expressions", exprs.len());
    let queried: BTreeSet<String> = exprs
        .iter()
        .flat_map(|(_, e)| metric_names(e).unwrap_or_default())
        .collect();
    for family in [
        "tidelog_applier_safe_time_lag_seconds",
        "tidelog_applier_tablet_safe_time_lag_seconds",
        "tidelog_applier_received_bytes_total",
        "tidelog_applier_applied_bytes_total",
        "tidelog_applier_apply_lag_bytes",
        "tidelog_applier_trx_status_lookups_total",
        "tidelog_applier_frame_errors_total",
        "tidelog_applier_tablet_state",
        "tidelog_shipper_tablet_state",
        "tidelog_applier_role",
        "tidelog_applier_stage_lag_seconds_bucket",
    ] {
        assert!(queried.contains(family), "no panel queries {family}");
    }
    // Every panel draws from the dashboard's data source variable, so an import binds it.
    let panels = dashboard["panels"].as_array().unwrap();
    for p in panels.iter().filter(|p| p["type"] != "row") {
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{}", p["title"]);
        assert!(
            !p["targets"].as_array().unwrap().is_empty(),
            "{}",
            p["title"]
        );
    }
    let ids: BTreeSet<u64> = panels.iter().map(|p| p["id"].as_u64().unwrap()).collect();
    assert_eq!(ids.len(), panels.len(), "panel ids are unique");

    // Real daemons with traffic on two tablets, so per-tablet series and the safe time
    // exist, and a trx_status look-up.
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), "batch", "lanes = 1\n");
    write_records(&c.wal, "t1", 20, |_| vec![b'x'; 64]);
    write_records(&c.wal, "t2", 10, |_| vec![b'y'; 64]);
    let _applier = c.start_applier();
    let _shipper = c.start_shipper();
    let exposed = || {
        let mut e = Exposed::default();
        for sock in [&c.applier_sock, &c.shipper_sock] {
            if let Some((200, text)) = scrape(sock) {
                e.add(&text);
            }
        }
        e
    };
    wait_for(
        "both tablets applied, the safe time published",
        Duration::from_secs(60),
        || {
            let e = exposed();
            e.samples.contains("tidelog_applier_safe_time_lag_seconds")
                && e.samples.contains("tidelog_shipper_lanes")
                && api(&c.applier_sock, "GET", "/v1/status").is_some_and(|(_, v)| {
                    v["tablets"]["t1"]["applied_records"] == 20
                        && v["tablets"]["t2"]["applied_records"] == 10
                })
        },
    );
    api(&c.applier_sock, "GET", "/v1/trx/7:1").expect("a trx_status answer");
    let exposed = exposed();
    let found = problems(&dashboard, &exposed);
    assert!(
        found.is_empty(),
        "the dashboard queries metrics the daemons do not export:\n{}",
        found.join("\n")
    );

    // The check catches a misspelled metric, a histogram queried by its family name, and a
    // Grafana expression that is not PromQL.
    for (from, to, expect) in [
        (
            "tidelog_applier_safe_time_lag_seconds{",
            "tidelog_applier_safe_time_lag_second{",
            "tidelog_applier_safe_time_lag_second is not in /metrics",
        ),
        (
            "tidelog_applier_stage_lag_seconds_bucket{",
            "tidelog_applier_stage_lag_seconds{",
            "tidelog_applier_stage_lag_seconds is a histogram",
        ),
        ("[$__rate_interval]", "[$__rate_intervall]", "not PromQL"),
    ] {
        assert!(text.contains(from), "{from}");
        let broken: Value = serde_json::from_str(&text.replacen(from, to, 1)).unwrap();
        let found = problems(&broken, &exposed);
        assert!(
            found.iter().any(|p| p.contains(expect)),
            "{from} → {to}: expected {expect:?} in {found:?}"
        );
    }
}
