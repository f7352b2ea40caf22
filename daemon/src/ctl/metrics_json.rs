//! `ctl metrics --json`: the Prometheus text exposition as JSON, one object per family
//! (parsed by the `prometheus-parse` crate):
//!
//! ```text
//! {"tidelog_applier_applied_records_total": {"type": "counter", "help": "…",
//!    "samples": [{"labels": {"tablet": "t1"}, "value": 50}]},
//!  "tidelog_applier_apply_batch_duration_seconds": {"type": "histogram", "help": "…",
//!    "samples": [{"labels": {}, "buckets": [{"le": "0.001", "count": 3}, …,
//!                 {"le": "+Inf", "count": 9}], "sum": 0.02, "count": 9}]}}
//! ```
//!
//! Families and samples are sorted (by name, then by labels); a value that JSON has no
//! number for (NaN, ±Inf) is a string.

use std::collections::BTreeMap;

use prometheus_parse::{Scrape, Value as PValue};
use serde_json::{json, Map, Value};

/// A number, or its text when JSON cannot hold it.
fn number(v: f64) -> Value {
    match serde_json::Number::from_f64(v) {
        Some(n) => Value::Number(n),
        None if v.is_nan() => json!("NaN"),
        None if v > 0.0 => json!("+Inf"),
        None => json!("-Inf"),
    }
}

fn labels(l: &prometheus_parse::Labels) -> Map<String, Value> {
    let sorted: BTreeMap<&String, &String> = l.iter().collect();
    sorted
        .into_iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect()
}

/// `text` (the answer to `GET /metrics`) as JSON; an error names what could not be read.
pub fn to_json(text: &str) -> std::io::Result<Value> {
    let scrape = Scrape::parse(text.lines().map(|l| Ok(l.to_string())))?;
    let mut families: BTreeMap<String, (&'static str, Vec<Value>)> = BTreeMap::new();
    // `_sum` and `_count` of histograms and summaries come as untyped samples: put them
    // into their sample, found by family and labels.
    let mut parts: Vec<(String, &'static str, Map<String, Value>, f64)> = Vec::new();
    for s in &scrape.samples {
        let l = labels(&s.labels);
        let (kind, sample) = match &s.value {
            PValue::Counter(v) => ("counter", json!({"labels": l, "value": number(*v)})),
            PValue::Gauge(v) => ("gauge", json!({"labels": l, "value": number(*v)})),
            PValue::Untyped(v) => {
                let part = ["_sum", "_count"]
                    .into_iter()
                    .find_map(|p| Some((s.metric.strip_suffix(p)?, p)));
                if let Some((family, p)) = part {
                    parts.push((family.to_string(), &p[1..], l, *v));
                    continue;
                }
                ("untyped", json!({"labels": l, "value": number(*v)}))
            }
            PValue::Histogram(b) => {
                let mut b = b.clone();
                b.sort_by(|x, y| x.less_than.total_cmp(&y.less_than));
                let buckets: Vec<Value> = b
                    .iter()
                    .map(|c| json!({"le": le(c.less_than), "count": number(c.count)}))
                    .collect();
                ("histogram", json!({"labels": l, "buckets": buckets}))
            }
            PValue::Summary(q) => {
                let quantiles: Vec<Value> = q
                    .iter()
                    .map(|c| json!({"quantile": number(c.quantile), "value": number(c.count)}))
                    .collect();
                ("summary", json!({"labels": l, "quantiles": quantiles}))
            }
        };
        families
            .entry(s.metric.clone())
            .or_insert((kind, Vec::new()))
            .1
            .push(sample);
    }
    for (family, part, l, v) in parts {
        let target = families.get_mut(&family).and_then(|(_, samples)| {
            samples
                .iter_mut()
                .find(|s| s["labels"].as_object() == Some(&l))
        });
        match target {
            Some(sample) => {
                sample[part] = number(v);
            }
            None => families
                .entry(format!("{family}_{part}"))
                .or_insert(("untyped", Vec::new()))
                .1
                .push(json!({"labels": l, "value": number(v)})),
        }
    }
    let mut out = Map::new();
    for (name, (kind, mut samples)) in families {
        samples.sort_by_key(|s| s["labels"].to_string());
        let help = scrape.docs.get(&name).cloned().unwrap_or_default();
        out.insert(
            name,
            json!({"type": kind, "help": help, "samples": samples}),
        );
    }
    Ok(Value::Object(out))
}

/// A bucket bound as Prometheus writes it (`+Inf` for the last).
fn le(v: f64) -> String {
    if v == f64::INFINITY {
        "+Inf".into()
    } else {
        v.to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn families_with_types_help_labels_and_histograms() {
        let text = "# HELP tidelog_applier_x_total Things done.\n\
                    # TYPE tidelog_applier_x_total counter\n\
                    tidelog_applier_x_total{tablet=\"t2\"} 5\n\
                    tidelog_applier_x_total{tablet=\"t1\"} 3\n\
                    # HELP tidelog_applier_role The role.\n\
                    # TYPE tidelog_applier_role gauge\n\
                    tidelog_applier_role{role=\"replica\"} 1\n\
                    # HELP tidelog_applier_d_seconds Durations.\n\
                    # TYPE tidelog_applier_d_seconds histogram\n\
                    tidelog_applier_d_seconds_bucket{le=\"0.5\"} 1\n\
                    tidelog_applier_d_seconds_bucket{le=\"+Inf\"} 2\n\
                    tidelog_applier_d_seconds_sum 0.75\n\
                    tidelog_applier_d_seconds_count 2\n";
        let v = to_json(text).unwrap();
        assert_eq!(
            v["tidelog_applier_x_total"],
            json!({"type": "counter", "help": "Things done.", "samples": [
                {"labels": {"tablet": "t1"}, "value": 3.0},
                {"labels": {"tablet": "t2"}, "value": 5.0}]})
        );
        assert_eq!(v["tidelog_applier_role"]["type"], "gauge");
        assert_eq!(
            v["tidelog_applier_d_seconds"],
            json!({"type": "histogram", "help": "Durations.", "samples": [
                {"labels": {}, "buckets": [{"le": "0.5", "count": 1.0}, {"le": "+Inf", "count": 2.0}],
                 "sum": 0.75, "count": 2.0}]})
        );
        assert_eq!(v.as_object().unwrap().len(), 3, "{v}");
        assert_eq!(number(f64::NAN), json!("NaN"));
    }
}
