//! `tidelog ctl`: the admin API client (`docs/operations.md`, "Admin API"), HTTP/1.1 over
//! the daemon's Unix socket.
//!
//! | subcommand | request |
//! | --- | --- |
//! | `status` | `GET /v1/status` |
//! | `safe-time` | `GET /v1/safe-time` |
//! | `get KEY [--latest\|--at HT]` | `GET /v1/kv/{KEY}?mode=consistent\|latest[&at=HT]` |
//! | `scan PREFIX [--latest\|--at HT] [--limit N]` | `GET /v1/scan?prefix=P&mode=…[&at=HT][&limit=N]` |
//! | `trx-status TRX [--gtid G] [--wait D]` | `GET /v1/trx/{TRX}[?gtid=G][&wait=D]` |
//! | `binlog [--from-gtid G] [--limit N]` | `GET /v1/binlog[?from-gtid=G][&limit=N]` |
//! | `promote` | `POST /v1/promote` |
//! | `pause [--tablet T]`, `resume [--tablet T]` | `POST /v1/pause[?tablet=T]`, `POST /v1/resume[…]` |
//! | `metrics` | `GET /metrics` (printed as is) |
//!
//! Path segments and query values are percent-encoded. With `--json` the answer's body is
//! printed as is (errors too); without it, a human rendering: scalar fields as aligned
//! `name value` lines (hybrid times also as UTC wall-clock time, a map of scalars as
//! `key: value, …`, an empty list or map as `(none)`), per-tablet maps and lists of objects
//! as aligned tables. An error answer (`{"error", "message"}`) fails the command with
//! `error: <code>: <message>` on stderr and exit status 1.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use clap::{Args, Subcommand};
use http_body_util::{BodyExt, Empty};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

/// `tidelog ctl …`
#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The daemon's admin socket.
    #[arg(
        long,
        value_name = "PATH",
        global = true,
        default_value = "/run/tidelog/applier.sock"
    )]
    pub socket: PathBuf,
    /// Print the API's JSON answer as is.
    #[arg(long, global = true)]
    pub json: bool,
    /// Give up on an answer after this long (added to `--wait` for `trx-status`).
    #[arg(long, value_name = "DURATION", global = true, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// One admin API call.
#[derive(Debug, Clone, Subcommand)]
pub enum CtlCommand {
    /// Role, safe time and per-tablet positions and state.
    Status,
    /// Global and per-tablet safe time and lag.
    SafeTime,
    /// Read one key (consistent at safe time by default).
    Get {
        key: String,
        /// Read the newest applied data (may show partial transactions).
        #[arg(long, conflicts_with = "at")]
        latest: bool,
        /// Read at this hybrid time (≤ safe time, within retention).
        #[arg(long, value_name = "HT")]
        at: Option<u64>,
    },
    /// Read the keys starting with PREFIX.
    Scan {
        prefix: String,
        /// Read the newest applied data.
        #[arg(long, conflicts_with = "at")]
        latest: bool,
        /// Read at this hybrid time.
        #[arg(long, value_name = "HT")]
        at: Option<u64>,
        /// At most this many items.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// Did transaction TRX (`connect_id:counter`) commit?
    TrxStatus {
        trx: String,
        /// The gtid the client saw for its commit; the target waits for it to become visible.
        #[arg(long, value_name = "GTID")]
        gtid: Option<String>,
        /// How long the target may wait for --gtid (e.g. 5s).
        #[arg(long, value_name = "DURATION", value_parser = parse_wait, allow_hyphen_values = true)]
        wait: Option<String>,
    },
    /// Commits in commit order.
    Binlog {
        /// Start at this gtid.
        #[arg(long, value_name = "GTID")]
        from_gtid: Option<String>,
        /// At most this many entries.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// Promote the target to primary at a clean cut (irreversible).
    Promote,
    /// Stop shipping (shipper) or intake (applier), for all tablets or one.
    Pause {
        #[arg(long, value_name = "TABLET")]
        tablet: Option<String>,
    },
    /// Undo `pause`.
    Resume {
        #[arg(long, value_name = "TABLET")]
        tablet: Option<String>,
    },
    /// Prometheus metrics, as is.
    Metrics,
}

/// `--wait`: a humantime duration (`5s`, `250ms`), checked here with the parser the daemon
/// uses for `?wait=` ([`crate::admin::parse_wait`]: humantime, surrounding blanks ignored)
/// so that a value the daemon would refuse (`1`, `-1s`) is a command-line error (exit 2);
/// passed to the daemon as written.
fn parse_wait(s: &str) -> std::result::Result<String, String> {
    crate::admin::parse_wait("--wait", s)
        .map(|_| s.to_string())
        .map_err(|e| format!("{e}: give a duration with a unit, e.g. 5s, 250ms or 1m"))
}

/// How long `--wait` may make the daemon wait, for the client's own deadline.
fn wait_allowance(w: &str) -> Duration {
    crate::admin::parse_wait("--wait", w).unwrap_or_default()
}

impl CtlCommand {
    /// The HTTP method and path-and-query of the call.
    pub fn request(&self) -> (Method, String) {
        fn mode(latest: bool) -> &'static str {
            if latest {
                "latest"
            } else {
                "consistent"
            }
        }
        let mut q = Query::default();
        let (method, path) = match self {
            CtlCommand::Status => (Method::GET, "/v1/status".to_string()),
            CtlCommand::SafeTime => (Method::GET, "/v1/safe-time".to_string()),
            CtlCommand::Get { key, latest, at } => {
                q.push("mode", mode(*latest));
                if let Some(at) = at {
                    q.push("at", &at.to_string());
                }
                (Method::GET, format!("/v1/kv/{}", encode(key)))
            }
            CtlCommand::Scan {
                prefix,
                latest,
                at,
                limit,
            } => {
                q.push("prefix", prefix);
                q.push("mode", mode(*latest));
                if let Some(at) = at {
                    q.push("at", &at.to_string());
                }
                if let Some(n) = limit {
                    q.push("limit", &n.to_string());
                }
                (Method::GET, "/v1/scan".to_string())
            }
            CtlCommand::TrxStatus { trx, gtid, wait } => {
                if let Some(g) = gtid {
                    q.push("gtid", g);
                }
                if let Some(w) = wait {
                    q.push("wait", w);
                }
                (Method::GET, format!("/v1/trx/{}", encode(trx)))
            }
            CtlCommand::Binlog { from_gtid, limit } => {
                if let Some(g) = from_gtid {
                    q.push("from-gtid", g);
                }
                if let Some(n) = limit {
                    q.push("limit", &n.to_string());
                }
                (Method::GET, "/v1/binlog".to_string())
            }
            CtlCommand::Promote => (Method::POST, "/v1/promote".to_string()),
            CtlCommand::Pause { tablet } | CtlCommand::Resume { tablet } => {
                if let Some(t) = tablet {
                    q.push("tablet", t);
                }
                let verb = if matches!(self, CtlCommand::Pause { .. }) {
                    "pause"
                } else {
                    "resume"
                };
                (Method::POST, format!("/v1/{verb}"))
            }
            CtlCommand::Metrics => (Method::GET, "/metrics".to_string()),
        };
        (method, path + &q.0)
    }
}

#[derive(Default)]
struct Query(String);

impl Query {
    fn push(&mut self, name: &str, value: &str) {
        self.0.push(if self.0.is_empty() { '?' } else { '&' });
        self.0.push_str(&encode(name));
        self.0.push('=');
        self.0.push_str(&encode(value));
    }
}

/// Percent-encodes everything but RFC 3986 unreserved characters, so the result is safe as a
/// path segment and as a query value.
pub fn encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// An answer from the admin API.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub body: Bytes,
}

impl Answer {
    /// The body as JSON.
    pub fn json(&self) -> Result<Value> {
        serde_json::from_slice(&self.body).with_context(|| {
            format!(
                "the daemon answered {} with a body that is not JSON: {:?}",
                self.status,
                String::from_utf8_lossy(&self.body[..self.body.len().min(200)])
            )
        })
    }

    /// For an error status: `<code>: <message>` from the error body (or the status and raw
    /// body if it is not the API's error form).
    pub fn error_text(&self) -> String {
        match serde_json::from_slice::<crate::admin::ErrorBody>(&self.body) {
            Ok(e) => format!("{}: {}", e.error, e.message),
            Err(_) => format!(
                "HTTP {}: {}",
                self.status,
                String::from_utf8_lossy(&self.body).trim()
            ),
        }
    }
}

/// Sends one request to the admin socket and reads the whole answer.
pub async fn call(socket: &Path, method: Method, path_and_query: &str) -> Result<Answer> {
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                " (is the daemon running?)"
            }
            std::io::ErrorKind::PermissionDenied => {
                " (the socket is mode 0660: run as the daemon's user or group)"
            }
            _ => "",
        };
        anyhow!(
            "cannot connect to admin socket {}: {e}{hint}",
            socket.display()
        )
    })?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .with_context(|| format!("HTTP handshake on {}", socket.display()))?;
    let driver = tokio::spawn(conn);
    let req = Request::builder()
        .method(method.clone())
        .uri(path_and_query)
        .header(hyper::header::HOST, "localhost")
        .header(hyper::header::ACCEPT, "application/json")
        .body(Empty::<Bytes>::new())
        .with_context(|| format!("bad request {method} {path_and_query}"))?;
    let resp = sender
        .send_request(req)
        .await
        .with_context(|| format!("{method} {path_and_query} on {}", socket.display()))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .with_context(|| format!("reading the answer to {method} {path_and_query}"))?
        .to_bytes();
    driver.abort();
    Ok(Answer { status, body })
}

/// Connection attempts `trx-status` makes, with backoff from 100 ms doubling (about 6 s in
/// all), while the admin socket is missing or refuses connections.
const SOCKET_RETRIES: u32 = 6;

/// Retries connecting to `socket` with capped exponential backoff while it is missing or
/// refusing; returns as soon as a connection succeeds or the attempts are used up (the
/// caller's own call then reports the error).
async fn wait_for_socket(socket: &Path, attempts: u32) {
    let mut delay = Duration::from_millis(100);
    for i in 0..attempts {
        match tokio::net::UnixStream::connect(socket).await {
            Ok(_) => return,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && i + 1 < attempts =>
            {
                eprintln!(
                    "admin socket {} not available ({e}); retrying in {} ms",
                    socket.display(),
                    delay.as_millis()
                );
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
            Err(_) => return,
        }
    }
}

/// Runs `tidelog ctl`: prints the answer; an error answer becomes the returned error.
pub fn run(args: CtlArgs) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let (method, path) = args.command.request();
    let mut timeout = args.timeout;
    if let CtlCommand::TrxStatus { wait: Some(w), .. } = &args.command {
        timeout = timeout.saturating_add(wait_allowance(w));
    }
    if matches!(args.command, CtlCommand::TrxStatus { .. }) {
        // Typically asked while the daemon restarts: give its socket a few seconds.
        rt.block_on(wait_for_socket(&args.socket, SOCKET_RETRIES));
    }
    let answer = rt.block_on(async {
        tokio::time::timeout(timeout, call(&args.socket, method.clone(), &path))
            .await
            .map_err(|_| {
                anyhow!(
                    "no answer to {method} {path} from {} within {}",
                    args.socket.display(),
                    humantime::format_duration(timeout)
                )
            })?
    })?;
    let out = if args.json || matches!(args.command, CtlCommand::Metrics) {
        let mut s = String::from_utf8_lossy(&answer.body).into_owned();
        if !s.ends_with('\n') {
            s.push('\n');
        }
        s
    } else if answer.status.is_success() {
        render(&answer.json()?)
    } else {
        String::new()
    };
    if answer.status.is_success() || args.json {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(out.as_bytes())?;
        stdout.flush()?;
    }
    if !answer.status.is_success() {
        bail!("{}", answer.error_text());
    }
    Ok(())
}

/// Preferred column order in tables; other columns follow in name order.
const COLUMN_ORDER: &[&str] = &[
    "gtid",
    "trx_id",
    "commit_ht",
    "key",
    "value",
    "version_ht",
    "received_pos",
    "applied_pos",
    "durable_pos",
    "shipped_pos",
    "acked_pos",
    "safe_time",
    "lag_ms",
    "state",
];

/// The human form of an answer (see the module doc).
pub fn render(v: &Value) -> String {
    let Value::Object(map) = v else {
        return format!("{}\n", cell(v));
    };
    if map.len() == 1 && map.get("ok") == Some(&Value::Bool(true)) {
        return "ok\n".to_string();
    }
    let mut scalars = Vec::new();
    let mut tables = Vec::new();
    for (k, val) in map {
        match val {
            Value::Object(m) if !m.is_empty() && m.values().all(Value::is_object) => {
                let rows: Vec<(String, &serde_json::Map<String, Value>)> = m
                    .iter()
                    .filter_map(|(id, r)| r.as_object().map(|o| (id.clone(), o)))
                    .collect();
                tables.push(table(k, singular(k), &rows));
            }
            Value::Array(a) if !a.is_empty() && a.iter().all(Value::is_object) => {
                let rows: Vec<(String, &serde_json::Map<String, Value>)> = a
                    .iter()
                    .enumerate()
                    .filter_map(|(i, r)| r.as_object().map(|o| (i.to_string(), o)))
                    .collect();
                tables.push(table(k, "#", &rows));
            }
            _ => scalars.push((k.as_str(), scalar(k, val))),
        }
    }
    let width = scalars.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut out = String::new();
    for (k, v) in scalars {
        let _ = writeln!(out, "{k:width$}  {v}");
    }
    for t in tables {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&t);
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
            return m
                .iter()
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
    if let (true, Value::String(s)) = (is_ht, v) {
        if let Ok(ht) = s.parse::<u64>() {
            let micros = ht >> 12;
            if micros > 0 {
                let t = std::time::UNIX_EPOCH + Duration::from_micros(micros);
                return format!("{text} ({})", humantime::format_rfc3339_micros(t));
            }
        }
    }
    text
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
fn is_b64(m: &serde_json::Map<String, Value>) -> bool {
    m.len() == 1 && m.contains_key("b64")
}

fn table(title: &str, first: &str, rows: &[(String, &serde_json::Map<String, Value>)]) -> String {
    let mut cols: Vec<&str> = Vec::new();
    for (_, r) in rows {
        for k in r.keys() {
            if !cols.contains(&k.as_str()) {
                cols.push(k);
            }
        }
    }
    cols.sort_by_key(|c| {
        (
            COLUMN_ORDER
                .iter()
                .position(|o| o == c)
                .unwrap_or(COLUMN_ORDER.len()),
            c.to_string(),
        )
    });
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
    let n = grid.first().map_or(0, Vec::len);
    let widths: Vec<usize> = (0..n)
        .map(|i| grid.iter().map(|l| l[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = format!("{title}:\n");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subcommands_map_to_routes() {
        let cases: Vec<(CtlCommand, Method, &str)> = vec![
            (CtlCommand::Status, Method::GET, "/v1/status"),
            (CtlCommand::SafeTime, Method::GET, "/v1/safe-time"),
            (
                CtlCommand::Get {
                    key: "a b/c?d".into(),
                    latest: false,
                    at: None,
                },
                Method::GET,
                "/v1/kv/a%20b%2Fc%3Fd?mode=consistent",
            ),
            (
                CtlCommand::Get {
                    key: "k".into(),
                    latest: true,
                    at: None,
                },
                Method::GET,
                "/v1/kv/k?mode=latest",
            ),
            (
                CtlCommand::Get {
                    key: "k".into(),
                    latest: false,
                    at: Some(123),
                },
                Method::GET,
                "/v1/kv/k?mode=consistent&at=123",
            ),
            (
                CtlCommand::Scan {
                    prefix: "acct&1".into(),
                    latest: false,
                    at: None,
                    limit: Some(10),
                },
                Method::GET,
                "/v1/scan?prefix=acct%261&mode=consistent&limit=10",
            ),
            (
                CtlCommand::TrxStatus {
                    trx: "7:3".into(),
                    gtid: Some("0-1-9".into()),
                    wait: Some("2s".into()),
                },
                Method::GET,
                "/v1/trx/7%3A3?gtid=0-1-9&wait=2s",
            ),
            (
                CtlCommand::Binlog {
                    from_gtid: Some("0-1-5".into()),
                    limit: Some(3),
                },
                Method::GET,
                "/v1/binlog?from-gtid=0-1-5&limit=3",
            ),
            (
                CtlCommand::Binlog {
                    from_gtid: None,
                    limit: None,
                },
                Method::GET,
                "/v1/binlog",
            ),
            (CtlCommand::Promote, Method::POST, "/v1/promote"),
            (
                CtlCommand::Pause {
                    tablet: Some("t1".into()),
                },
                Method::POST,
                "/v1/pause?tablet=t1",
            ),
            (
                CtlCommand::Resume { tablet: None },
                Method::POST,
                "/v1/resume",
            ),
            (CtlCommand::Metrics, Method::GET, "/metrics"),
        ];
        for (cmd, m, p) in cases {
            assert_eq!(cmd.request(), (m, p.to_string()), "{cmd:?}");
        }
        assert_eq!(encode("é"), "%C3%A9");
    }

    #[test]
    fn human_rendering() {
        let v: Value = serde_json::from_str(
            r#"{"role":"replica","safe_time":"7300000000000000000",
                "tablets":{"t1":{"received_pos":4096,"applied_pos":4096,"safe_time":"5","state":"streaming"},
                           "tablet-22":{"received_pos":10,"applied_pos":0,"safe_time":"6","state":"needs_bootstrap"}}}"#,
        )
        .unwrap();
        let s = render(&v);
        assert!(
            s.starts_with("role       replica\nsafe_time  7300000000000000000 ("),
            "{s}"
        );
        let lines: Vec<&str> = s.lines().collect();
        let head = lines.iter().position(|l| l.starts_with("TABLET")).unwrap();
        assert_eq!(
            lines[head],
            "TABLET     RECEIVED_POS  APPLIED_POS  SAFE_TIME  STATE"
        );
        assert_eq!(
            lines[head + 1],
            "t1         4096          4096         5          streaming"
        );
        assert_eq!(render(&serde_json::json!({"ok": true})), "ok\n");
        let v = serde_json::json!({"read_ht":"9","more":false,
            "items":[{"key":"k","value":{"b64":"AP8="},"version_ht":"3"}]});
        let s = render(&v);
        assert!(s.contains("KEY  VALUE     VERSION_HT"), "{s}");
        assert!(s.contains("k    b64:AP8=  3"), "{s}");
    }

    #[test]
    fn nested_maps_and_empty_lists_read_as_text() {
        let v = serde_json::json!({"read_ht":"9","more":false,"items":[]});
        assert_eq!(render(&v), "items    (none)\nmore     false\nread_ht  9\n");
        let v = serde_json::json!({"role":"primary","tablets":{},
            "lookup_cache":{"state":"warm","index_bytes":10,"nested":{"a":1}},
            "cutover":{"cut_ht":"7300000000000000000","cleanup_done":false},
            "value":{"b64":"AP8="}});
        let s = render(&v);
        assert!(
            s.contains("lookup_cache  index_bytes: 10, nested: {a: 1}, state: warm\n"),
            "{s}"
        );
        assert!(
            s.contains("cutover       cleanup_done: false, cut_ht: 7300000000000000000 (20"),
            "{s}"
        );
        assert!(s.contains("tablets       (none)\n"), "{s}");
        assert!(s.contains("value         b64:AP8=\n"), "{s}");
    }

    #[test]
    fn wait_is_checked_with_the_daemons_parser() {
        for w in ["5s", "250ms", " 1m ", "1h 30m", "0s", "1.5s"] {
            assert!(parse_wait(w).is_ok(), "{w:?}");
        }
        for w in ["1", "-1s", "abc", ""] {
            assert!(parse_wait(w).is_err(), "{w:?}");
        }
        assert_eq!(parse_wait("5s").unwrap(), "5s");
        assert!(parse_wait("1").unwrap_err().contains("e.g. 5s"));
        assert_eq!(wait_allowance("2s"), Duration::from_secs(2));
    }
}
