//! The human form of the admin API's answers.
//!
//! * [`applier_status`], [`shipper_status`] and [`safe_time`]: health first — the daemon's
//!   role, the safe time and its lag, the laggiest tablet, the errors, the tablets counted by
//!   state — then a compact table of the tablets that fits 100 columns.
//! * [`generic`] (every other answer, and everything with `--wide`): every field, on its own
//!   line in a meaningful order ([`FIELD_ORDER`]: what the answer is about first, e.g.
//!   `state` first for a `trx-status`), then every per-tablet map and list of objects as a
//!   table with all its columns. Hybrid times are shown with their UTC wall-clock time.

use std::fmt::Write as _;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};

/// Field order of [`generic`]: these first, in this order; the others after them by name.
/// Table columns follow the same order.
pub const FIELD_ORDER: &[&str] = &[
    "state",
    "role",
    "found",
    "initialized",
    "ok",
    "key",
    "value",
    "version_ht",
    "trx_id",
    "reason",
    "gtid",
    "commit_ht",
    "connect_id",
    "txn",
    "waits_for",
    "cut_ht",
    "cut_time",
    "lost_commits",
    "lost_window_ms",
    "read_ht",
    "safe_time",
    "safe_time_initialized",
    "lag_ms",
    "laggiest_tablet",
    "skew_ms",
    "caught_up",
    "more",
    "io_engine",
    "io_engine_note",
    "lanes",
    "connected_lanes",
    "listen",
    "received_pos",
    "applied_pos",
    "durable_pos",
    "shipped_pos",
    "acked_pos",
    "lag_bytes",
    "lag_records",
    "tablets",
];

/// How wide the compact tables may be.
pub const MAX_WIDTH: usize = 100;

fn rank(k: &str) -> (usize, &str) {
    (
        FIELD_ORDER
            .iter()
            .position(|o| *o == k)
            .unwrap_or(FIELD_ORDER.len()),
        k,
    )
}

/// The keys of `m` in [`FIELD_ORDER`].
fn ordered(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut v: Vec<(&String, &Value)> = m.iter().collect();
    v.sort_by(|a, b| rank(a.0).cmp(&rank(b.0)));
    v
}

/// Every field of an answer: scalars as aligned `name  value` lines, then tables.
pub fn generic(v: &Value) -> String {
    let Value::Object(map) = v else {
        return format!("{}\n", cell(v));
    };
    if map.len() == 1 && map.get("ok") == Some(&Value::Bool(true)) {
        return "ok\n".to_string();
    }
    let mut scalars = Vec::new();
    let mut tables = Vec::new();
    for (k, val) in ordered(map) {
        match val {
            Value::Object(m) if !m.is_empty() && m.values().all(Value::is_object) => {
                let rows: Vec<(String, &Map<String, Value>)> = m
                    .iter()
                    .filter_map(|(id, r)| r.as_object().map(|o| (id.clone(), o)))
                    .collect();
                tables.push(table(k, singular(k), &rows));
            }
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object) => {
                let rows: Vec<(String, &Map<String, Value>)> = a
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| r.as_object().map(|o| (i.to_string(), o)))
                    .collect();
                tables.push(table(k, "#", &rows));
            }
            _ => scalars.push((k.as_str(), scalar(k, val))),
        }
    }
    let mut out = lines(&scalars);
    for t in tables {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&t);
    }
    out
}

/// `name  value` lines, the values aligned.
fn lines(rows: &[(&str, String)]) -> String {
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{k:width$}  {v}");
    }
    out
}

fn singular(k: &str) -> &str {
    match k {
        "tablets" => "tablet",
        other => other.strip_suffix('s').unwrap_or(other),
    }
}

/// A top-level value on its own line; hybrid times (`*_ht`, `safe_time`) get their
/// wall-clock time too, an empty list or map reads `(none)` and a map of scalars (e.g. the
/// applier's `lookup_cache`) reads `name: value, …` (nested the same way).
fn scalar(name: &str, v: &Value) -> String {
    match v {
        Value::Array(a) if a.is_empty() => return "(none)".to_string(),
        Value::Object(m) if m.is_empty() => return "(none)".to_string(),
        Value::Object(m) if !is_b64(m) => {
            return ordered(m)
                .into_iter()
                .map(|(k, v)| {
                    let inner = match v {
                        Value::Object(o) if !o.is_empty() && !is_b64(o) => {
                            format!("{{{}}}", scalar(k, v))
                        }
                        _ => scalar(k, v),
                    };
                    format!("{k}: {inner}")
                })
                .collect::<Vec<_>>()
                .join(", ");
        }
        _ => {}
    }
    let text = cell(v);
    let is_ht = name.ends_with("_ht") || name == "safe_time";
    match (is_ht, v) {
        (true, Value::String(s)) => match wall_clock(s) {
            Some(t) => format!("{text} ({t})"),
            None => text,
        },
        _ => text,
    }
}

/// The UTC time of a hybrid time given as a decimal string (`None` for 0 or not a number).
fn wall_clock(ht: &str) -> Option<String> {
    let micros = ht.parse::<u64>().ok()? >> 12;
    (micros > 0).then(|| {
        humantime::format_rfc3339_micros(UNIX_EPOCH + Duration::from_micros(micros)).to_string()
    })
}

/// A value in one cell or line: strings bare, `{"b64": x}` as `b64:x`, null as `-`, arrays
/// comma-joined.
fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().map(cell).collect::<Vec<_>>().join(","),
        Value::Object(m) if is_b64(m) => {
            format!("b64:{}", m.get("b64").map(cell).unwrap_or_default())
        }
        other => other.to_string(),
    }
}

/// `{"b64": "..."}`: a key or value that is not UTF-8.
fn is_b64(m: &Map<String, Value>) -> bool {
    m.len() == 1 && m.contains_key("b64")
}

/// A table of every column the rows have, titled `title:`.
fn table(title: &str, first: &str, rows: &[(String, &Map<String, Value>)]) -> String {
    let mut cols: Vec<&str> = Vec::new();
    for (_, r) in rows {
        for k in r.keys() {
            if !cols.contains(&k.as_str()) {
                cols.push(k);
            }
        }
    }
    cols.sort_by(|a, b| rank(a).cmp(&rank(b)));
    let index = first != "#";
    let mut grid: Vec<Vec<String>> = Vec::with_capacity(rows.len() + 1);
    let mut header: Vec<String> = Vec::new();
    if index {
        header.push(first.to_uppercase());
    }
    header.extend(cols.iter().map(|c| c.to_uppercase()));
    grid.push(header);
    for (id, r) in rows {
        let mut line = Vec::new();
        if index {
            line.push(id.clone());
        }
        line.extend(cols.iter().map(|c| r.get(*c).map(cell).unwrap_or_default()));
        grid.push(line);
    }
    format!("{title}:\n{}", grid_text(&grid))
}

/// Rows of cells as aligned columns two spaces apart, no trailing blanks.
fn grid_text(grid: &[Vec<String>]) -> String {
    let n = grid.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|i| grid.iter().map(|l| l[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in grid {
        let mut s = String::new();
        for (i, c) in line.iter().enumerate() {
            if i + 1 == n {
                s.push_str(c);
            } else {
                let _ = write!(s, "{c:w$}  ", w = widths[i]);
            }
        }
        out.push_str(s.trim_end());
        out.push('\n');
    }
    out
}

/// `s` cut to `max` characters, the last one an ellipsis when cut.
fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    let mut t: String = s.chars().take(max.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// A byte count the way `ls -h` shows it (binary units).
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Milliseconds as `12 ms`, `3.4 s`, or `5m 3s` from a minute on.
pub fn millis(ms: u64) -> String {
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=59_999 => format!("{:.1} s", ms as f64 / 1000.0),
        _ => humantime::format_duration(Duration::from_secs(ms / 1000)).to_string(),
    }
}

fn now_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// How far the hybrid time `ht` (a decimal string) trails this host's clock, in ms.
fn lag_of(ht: &Value) -> Option<u64> {
    let micros = ht.as_str()?.parse::<u64>().ok()? >> 12;
    (micros > 0).then(|| now_micros().saturating_sub(micros) / 1000)
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

fn s(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

/// Tablet states that need an operator.
const BAD_STATES: &[&str] = &[
    "needs_bootstrap",
    "failed",
    "apply_failed",
    "error",
    "refused",
];

/// `errors` lines: each tablet with an error or a bad state, tablets with the same text
/// together; `none` when there is nothing.
fn errors(tablets: &Map<String, Value>) -> Vec<String> {
    let mut by_text: Vec<(String, Vec<&str>)> = Vec::new();
    for (id, t) in tablets {
        let state = s(&t["state"]);
        let text = match (&t["error"], BAD_STATES.contains(&state)) {
            (Value::String(e), _) => format!("{state}: {e}"),
            (_, true) => state.to_string(),
            _ => continue,
        };
        match by_text.iter_mut().find(|(t, _)| *t == text) {
            Some((_, ids)) => ids.push(id),
            None => by_text.push((text, vec![id])),
        }
    }
    if by_text.is_empty() {
        return vec!["none".into()];
    }
    by_text
        .into_iter()
        .map(|(text, ids)| {
            let who = match ids.len() {
                1..=3 => ids.join(", "),
                n => format!("{n} tablets ({}, …)", ids[..2].join(", ")),
            };
            format!("{who}: {text}")
        })
        .collect()
}

/// `8: 7 streaming, 1 needs_bootstrap`.
fn state_counts(tablets: &Map<String, Value>) -> String {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for t in tablets.values() {
        let st = s(&t["state"]);
        match counts.iter_mut().find(|(k, _)| *k == st) {
            Some((_, n)) => *n += 1,
            None => counts.push((st, 1)),
        }
    }
    counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let parts: Vec<String> = counts.iter().map(|(k, n)| format!("{n} {k}")).collect();
    if parts.is_empty() {
        "none yet".into()
    } else {
        format!("{}: {}", tablets.len(), parts.join(", "))
    }
}

/// The `errors` lines (the first one titled) and the `tablets` line of a summary.
fn errors_and_states(head: &mut Vec<(&str, String)>, tablets: &Map<String, Value>) {
    for (i, e) in errors(tablets).into_iter().enumerate() {
        head.push((if i == 0 { "errors" } else { "" }, e));
    }
    head.push(("tablets", state_counts(tablets)));
}

/// A table's first row.
fn header(cols: &[&str]) -> Vec<Vec<String>> {
    vec![cols.iter().map(|c| c.to_string()).collect()]
}

/// Head lines, a blank line and the table (when there are rows).
fn summary(head: &[(&str, String)], grid: Vec<Vec<String>>) -> String {
    let mut out = lines(head);
    if grid.len() > 1 {
        out.push('\n');
        out.push_str(&grid_text(&grid));
    }
    out
}

/// The safe time, its lag and wall-clock time, from a `/v1/safe-time` answer (or the
/// status's safe time when there is none).
fn safe_time_line(initialized: bool, ht: &Value, lag_ms: Option<u64>) -> String {
    if !initialized {
        return "not initialized (waiting for every tablet to report)".into();
    }
    let when = ht
        .as_str()
        .and_then(wall_clock)
        .unwrap_or_else(|| "-".into());
    match lag_ms {
        Some(l) => format!("{when}, lag {}", millis(l)),
        None => when,
    }
}

/// `ctl status` against an applier; `st` is its `/v1/safe-time` answer when it gave one.
pub fn applier_status(v: &Value, st: Option<&Value>) -> String {
    let empty = Map::new();
    let tablets = v["tablets"].as_object().unwrap_or(&empty);
    let mut role = s(&v["role"]).to_string();
    if let Some(l) = v["listen"].as_str().filter(|l| !l.is_empty()) {
        let _ = write!(role, ", QUIC on udp {l}");
    }
    if let Some(l) = v["sql"]["listen"].as_str() {
        let _ = write!(
            role,
            ", SQL on tcp {l} ({} connections)",
            u(&v["sql"]["connections"])
        );
    }
    if let Value::Object(c) = &v["cutover"] {
        let _ = write!(
            role,
            "; promoted at cut {} ({})",
            s(&c["cut_time"]),
            if c["cleanup_done"] == true {
                "cleanup done"
            } else {
                "cleanup running"
            }
        );
    }
    let initialized = v["safe_time_initialized"] == true;
    let lag = st.and_then(|st| st["lag_ms"].as_u64());
    let mut head = vec![
        ("applier", role),
        (
            "safe time",
            safe_time_line(
                initialized,
                &v["safe_time"],
                lag.or_else(|| lag_of(&v["safe_time"])),
            ),
        ),
    ];
    let tablet_lag = |id: &str| -> Option<u64> {
        st.and_then(|st| st["tablets"][id]["lag_ms"].as_u64())
            .or_else(|| lag_of(&tablets.get(id)?["safe_time"]))
    };
    let laggiest = st
        .and_then(|st| st["laggiest_tablet"].as_str().map(str::to_string))
        .or_else(|| {
            tablets
                .keys()
                .filter_map(|id| Some((tablet_lag(id)?, id)))
                .max()
                .map(|(_, id)| id.clone())
        });
    if let Some(id) = laggiest {
        let l = tablet_lag(&id).map_or("-".into(), millis);
        head.push(("laggiest", format!("{id}, lag {l}")));
    }
    errors_and_states(&mut head, tablets);
    // RECEIVED: the received log's durable end; BEHIND: what apply has still to do there;
    // IDLE: since the last frame. (`--wide` has every field.)
    let mut grid = header(&[
        "TABLET", "STATE", "LAG", "RECEIVED", "BEHIND", "SHIPPER", "IDLE",
    ]);
    for (id, t) in tablets {
        grid.push(vec![
            fit(id, 20),
            fit(s(&t["state"]), 15),
            tablet_lag(id).map_or("-".into(), millis),
            bytes(u(&t["received_pos"])),
            bytes(u(&t["lag_bytes"])),
            fit(s(&t["shipper"]), 12),
            t["last_frame_ms_ago"].as_u64().map_or("-".into(), millis),
        ]);
    }
    summary(&head, grid)
}

/// `ctl status` against a shipper.
pub fn shipper_status(v: &Value) -> String {
    let empty = Map::new();
    let tablets = v["tablets"].as_object().unwrap_or(&empty);
    let mut engine = format!(
        "io engine {}, {}/{} lanes connected",
        s(&v["io_engine"]),
        u(&v["connected_lanes"]),
        u(&v["lanes"])
    );
    if let Some(n) = v["io_engine_note"].as_str() {
        let _ = write!(engine, " ({n})");
    }
    let total: u64 = tablets.values().map(|t| u(&t["lag_bytes"])).sum();
    let worst = tablets
        .iter()
        .map(|(id, t)| (u(&t["lag_bytes"]), id))
        .max()
        .filter(|(b, _)| *b > 0);
    let lag = match worst {
        Some((b, id)) => format!(
            "{} durable and not acked yet (most: {id}, {})",
            bytes(total),
            bytes(b)
        ),
        None => "none: everything durable is acked".into(),
    };
    let mut head = vec![("shipper", engine), ("lag", lag)];
    errors_and_states(&mut head, tablets);
    // DURABLE: the source's durable end; ACKED: what the applier has durably; LAG: between
    // the two. (`--wide` has every field.)
    let mut grid = header(&[
        "TABLET", "STATE", "LANE", "DURABLE", "ACKED", "LAG", "RECORDS",
    ]);
    for (id, t) in tablets {
        grid.push(vec![
            fit(id, 20),
            fit(s(&t["state"]), 15),
            u(&t["lane"]).to_string(),
            bytes(u(&t["durable_pos"])),
            bytes(u(&t["acked_pos"])),
            bytes(u(&t["lag_bytes"])),
            u(&t["records_acked"]).to_string(),
        ]);
    }
    summary(&head, grid)
}

/// `ctl safe-time`.
pub fn safe_time(v: &Value) -> String {
    let empty = Map::new();
    let tablets = v["tablets"].as_object().unwrap_or(&empty);
    let mut head = vec![(
        "safe time",
        safe_time_line(
            v["initialized"] == true,
            &v["safe_time"],
            v["lag_ms"].as_u64(),
        ),
    )];
    if let Some(id) = v["laggiest_tablet"].as_str() {
        let l = tablets
            .get(id)
            .and_then(|t| t["lag_ms"].as_u64())
            .map_or("-".into(), millis);
        head.push(("laggiest", format!("{id}, lag {l}")));
    }
    head.push((
        "skew",
        format!("{} between tablets", millis(u(&v["skew_ms"]))),
    ));
    let unreported: Vec<&str> = tablets
        .iter()
        .filter(|(_, t)| t["lag_ms"].is_null())
        .map(|(id, _)| id.as_str())
        .collect();
    if !unreported.is_empty() {
        head.push(("not reported", fit(&unreported.join(", "), MAX_WIDTH - 14)));
    }
    let mut grid = header(&["TABLET", "SAFE TIME", "LAG"]);
    for (id, t) in tablets {
        grid.push(vec![
            fit(id, 20),
            t["safe_time"]
                .as_str()
                .and_then(wall_clock)
                .unwrap_or_else(|| "-".into()),
            t["lag_ms"].as_u64().map_or("-".into(), millis),
        ]);
    }
    summary(&head, grid)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn generic_puts_what_the_answer_is_about_first() {
        let v = json!({"caught_up": true, "commit_ht": "7300000000000000000", "connect_id": "7",
            "gtid": "0-1-9", "reason": null, "safe_time": "7300000000000000001",
            "state": "COMMITTED", "trx_id": "7:3"});
        let s = generic(&v);
        let first: Vec<&str> = s
            .lines()
            .map(|l| l.split_whitespace().next().unwrap())
            .collect();
        assert_eq!(
            first,
            [
                "state",
                "trx_id",
                "reason",
                "gtid",
                "commit_ht",
                "connect_id",
                "safe_time",
                "caught_up"
            ]
        );
        assert!(s.contains("commit_ht   7300000000000000000 (2026-"), "{s}");
    }

    #[test]
    fn generic_tables_and_nested_maps() {
        let v: Value = serde_json::from_str(
            r#"{"role":"replica","safe_time":"7300000000000000000",
                "tablets":{"t1":{"received_pos":4096,"applied_pos":4096,"safe_time":"5","state":"streaming"},
                           "tablet-22":{"received_pos":10,"applied_pos":0,"safe_time":"6","state":"needs_bootstrap"}}}"#,
        )
        .unwrap();
        let s = generic(&v);
        assert!(
            s.starts_with("role       replica\nsafe_time  7300000000000000000 ("),
            "{s}"
        );
        let lines: Vec<&str> = s.lines().collect();
        let head = lines.iter().position(|l| l.starts_with("TABLET")).unwrap();
        assert_eq!(
            lines[head],
            "TABLET     STATE            SAFE_TIME  RECEIVED_POS  APPLIED_POS"
        );
        assert_eq!(
            lines[head + 1],
            "t1         streaming        5          4096          4096"
        );
        assert_eq!(generic(&json!({"ok": true})), "ok\n");
        let v = json!({"read_ht":"9","more":false,"items":[]});
        assert_eq!(generic(&v), "read_ht  9\nmore     false\nitems    (none)\n");
        let v = json!({"lookup_cache":{"state":"warm","index_bytes":10,"nested":{"a":1}},
            "value":{"b64":"AP8="}});
        let s = generic(&v);
        assert!(
            s.contains("lookup_cache  state: warm, index_bytes: 10, nested: {a: 1}\n"),
            "{s}"
        );
        assert!(s.contains("value         b64:AP8=\n"), "{s}");
    }

    #[test]
    fn units() {
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1023 B");
        assert_eq!(bytes(1536), "1.5 KiB");
        assert_eq!(bytes(3 << 30), "3.0 GiB");
        assert_eq!(millis(12), "12 ms");
        assert_eq!(millis(3400), "3.4 s");
        assert_eq!(millis(303_000), "5m 3s");
        assert_eq!(fit("abcdef", 4), "abc…");
        assert_eq!(fit("abc", 4), "abc");
    }

    fn applier_answer(n: usize) -> (Value, Value) {
        let now = (now_micros() - 20_000) << 12;
        let mut tablets = Map::new();
        let mut st_tablets = Map::new();
        for i in 0..n {
            let id = format!("orders-shard-{i:04}");
            let state = if i == 3 {
                "needs_bootstrap"
            } else {
                "streaming"
            };
            tablets.insert(
                id.clone(),
                json!({"received_pos": 123_456_789_u64 + i as u64, "applied_pos": 123_000_000,
                    "safe_time": now.to_string(), "received_safe_time": now.to_string(),
                    "state": state, "lag_bytes": 456_789, "lag_records": 12,
                    "received_records": 1_000_000, "applied_records": 999_988,
                    "received_bytes": 123_456_789, "shipper": "source-host-with-a-long-name",
                    "last_frame_ms_ago": 3, "error": null}),
            );
            st_tablets.insert(id, json!({"safe_time": now.to_string(), "lag_ms": 20 + i}));
        }
        let status = json!({"role": "replica", "cutover": null, "safe_time": now.to_string(),
            "safe_time_initialized": true, "listen": "127.0.0.1:7400", "tablets": tablets,
            "lookup_cache": {"state": "loaded"}});
        let st = json!({"initialized": true, "safe_time": now.to_string(), "lag_ms": 25,
            "laggiest_tablet": format!("orders-shard-{:04}", n - 1), "skew_ms": 0,
            "tablets": st_tablets});
        (status, st)
    }

    #[test]
    fn applier_status_is_health_first_and_fits_100_columns() {
        let (status, st) = applier_answer(8);
        let s = applier_status(&status, Some(&st));
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(
            lines[0], "applier    replica, QUIC on udp 127.0.0.1:7400",
            "{s}"
        );
        assert!(
            lines[1].starts_with("safe time  20") && lines[1].ends_with(", lag 25 ms"),
            "{s}"
        );
        assert_eq!(lines[2], "laggiest   orders-shard-0007, lag 27 ms", "{s}");
        assert_eq!(
            lines[3], "errors     orders-shard-0003: needs_bootstrap",
            "{s}"
        );
        assert_eq!(
            lines[4], "tablets    8: 7 streaming, 1 needs_bootstrap",
            "{s}"
        );
        assert!(lines[6].starts_with("TABLET"), "{s}");
        assert_eq!(lines.len(), 7 + 8, "{s}");
        for l in &lines {
            assert!(
                l.chars().count() <= MAX_WIDTH,
                "{} columns: {l}",
                l.chars().count()
            );
        }
        assert!(!s.contains("lookup_cache"), "{s}");
        assert!(s.contains("117.7 MiB"), "{s}");
        // With the SQL endpoint on, the first line says where and how busy.
        let mut with_sql = status.clone();
        with_sql["sql"] = json!({"listen": "127.0.0.1:3307", "connections": 3});
        let s = applier_status(&with_sql, Some(&st));
        assert_eq!(
            s.lines().next().unwrap(),
            "applier    replica, QUIC on udp 127.0.0.1:7400, SQL on tcp 127.0.0.1:3307 (3 connections)",
            "{s}"
        );
    }

    #[test]
    fn errors_are_grouped_and_name_the_tablets() {
        let mut t = Map::new();
        for i in 0..5 {
            t.insert(
                format!("t{i}"),
                json!({"state": "connecting", "error": "connecting to 127.0.0.1:7400: timed out"}),
            );
        }
        t.insert("t9".into(), json!({"state": "idle", "error": null}));
        assert_eq!(
            errors(&t),
            ["5 tablets (t0, t1, …): connecting: connecting to 127.0.0.1:7400: timed out"]
        );
        t.clear();
        t.insert("t9".into(), json!({"state": "idle", "error": null}));
        assert_eq!(errors(&t), ["none"]);
    }

    #[test]
    fn shipper_status_and_safe_time_summaries() {
        let v = json!({"io_engine": "uring", "io_engine_note": null, "lanes": 2,
            "connected_lanes": 1, "tablets": {
                "t1": {"durable_pos": 4096, "shipped_pos": 4096, "acked_pos": 2048,
                       "lag_bytes": 2048, "lag_records": 1, "records_acked": 9, "state": "streaming",
                       "lane": 0, "error": null},
                "t2": {"durable_pos": 0, "shipped_pos": 0, "acked_pos": 0, "lag_bytes": 0,
                       "records_acked": 0, "state": "refused", "lane": 1,
                       "error": "claimed by shipper other"}}});
        let s = shipper_status(&v);
        assert!(
            s.starts_with("shipper  io engine uring, 1/2 lanes connected\n"),
            "{s}"
        );
        assert!(
            s.contains("lag      2.0 KiB durable and not acked yet (most: t1, 2.0 KiB)\n"),
            "{s}"
        );
        assert!(
            s.contains("errors   t2: refused: claimed by shipper other\n"),
            "{s}"
        );
        assert!(s.contains("tablets  2: 1 refused, 1 streaming\n"), "{s}");
        assert!(
            s.contains("TABLET  STATE      LANE  DURABLE  ACKED    LAG      RECORDS"),
            "{s}"
        );

        let (_, st) = applier_answer(2);
        let s = safe_time(&st);
        assert!(
            s.contains("laggiest   orders-shard-0001, lag 21 ms\n"),
            "{s}"
        );
        assert!(s.contains("skew       0 ms between tablets\n"), "{s}");
        let s = safe_time(
            &json!({"initialized": false, "safe_time": null, "lag_ms": null,
            "laggiest_tablet": null, "skew_ms": 0, "tablets": {"t1": {"safe_time": "0", "lag_ms": null}}}),
        );
        assert!(s.starts_with("safe time     not initialized"), "{s}");
        assert!(s.contains("not reported  t1\n"), "{s}");
    }
}
