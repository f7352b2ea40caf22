//! `tidelog ctl`: the admin API client (`docs/operations.md`, "Admin API"), HTTP/1.1 over
//! the daemon's Unix socket.
//!
//! | subcommand | request | daemon |
//! | --- | --- | --- |
//! | `status` | `GET /v1/status` (and `/v1/safe-time` for an applier's summary) | both |
//! | `safe-time` | `GET /v1/safe-time` | applier |
//! | `get KEY [--latest\|--at HT]` | `GET /v1/kv/{KEY}?mode=consistent\|latest[&at=HT]` | applier |
//! | `scan PREFIX [--latest\|--at HT] [--limit N]` | `GET /v1/scan?prefix=P&mode=…[&at=HT][&limit=N]` | applier |
//! | `trx-status TRX [--gtid G] [--wait D]` | `GET /v1/trx/{TRX}[?gtid=G][&wait=D]` | applier |
//! | `binlog [--from-gtid G] [--limit N]` | `GET /v1/binlog[?from-gtid=G][&limit=N]` | applier |
//! | `promote --yes` | `POST /v1/promote` | applier |
//! | `pause [--tablet T]`, `resume [--tablet T]` | `POST /v1/pause[?tablet=T]`, `POST /v1/resume[…]` | both |
//! | `metrics` | `GET /metrics` | both |
//!
//! Path segments and query values are percent-encoded.
//!
//! **Output.** Without `--json`, a human rendering ([`render`]): `status` and `safe-time`
//! give a health-first summary (role, safe time and lag, the laggiest tablet, errors, tablets
//! by state) and a compact table of the tablets that fits 100 columns; `--wide` shows every
//! field instead. The other answers list every field, the one they are about first (`state`
//! for `trx-status`, `found` for `get`). `metrics` prints the Prometheus text as is. With
//! `--json`, the API's JSON: pretty-printed when stdout is a terminal, one line per answer
//! otherwise (for `jq` and scripts); `metrics --json` is the exposition parsed into one object
//! per family ([`metrics_json`]).
//!
//! **Exit status** (also with `--json`):
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | success; `get` found the key; `trx-status` `COMMITTED` |
//! | 1 | error: the daemon answered with an error (printed as `error: <code>: <message>`), could not be reached, or a `promote` confirmation was not given |
//! | 2 | bad command line; `promote` without `--yes` where no terminal can confirm it |
//! | 3 | `get`: no such key (`found: false`); `trx-status`: `UNKNOWN` |
//! | 4 | `trx-status`: `IN_PROGRESS` |
//! | 5 | `trx-status`: `ABORTED` |
//!
//! **Waiting for the socket.** A daemon that has just been started may not have its socket
//! yet: while the socket is missing or refuses connections, `ctl` tries again for up to 5 s
//! (saying so once on stderr) before it fails.
//!
//! **The wrong daemon.** An applier command sent to a shipper's socket (or the other way)
//! says so, e.g. `… is a shipper's admin socket; \`get\` is an applier command`.
//!
//! **`promote`** is irreversible: it needs `--yes`, or, when stdin is a terminal, the word
//! `promote` typed at the prompt.

pub mod metrics_json;
pub mod render;

use std::fmt::Write as _;
use std::io::{BufRead, IsTerminal, Write as _};
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
    /// Print the API's JSON answer (pretty on a terminal, one line otherwise).
    #[arg(long, global = true)]
    pub json: bool,
    /// Every field of `status` and `safe-time`, not only the summary and compact table.
    #[arg(long, global = true, conflicts_with = "json")]
    pub wide: bool,
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
    /// Promote the target to primary at a clean cut (irreversible: needs --yes, or the
    /// word `promote` typed on a terminal).
    Promote {
        /// Promote without asking.
        #[arg(long)]
        yes: bool,
    },
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
    /// Prometheus metrics, as is (with --json: parsed, one object per family).
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
            CtlCommand::Promote { .. } => (Method::POST, "/v1/promote".to_string()),
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

/// The exit statuses, for `tidelog ctl --help` and the man page.
pub const EXIT_STATUS_HELP: &str = "\
Exit status (also with --json):
  0  success; `get` found the key; `trx-status` COMMITTED
  1  error: an error answer (printed as `error: <code>: <message>`), no daemon, or a
     `promote` confirmation not given
  2  bad command line; `promote` without --yes where no terminal can confirm it
  3  `get`: no such key; `trx-status`: UNKNOWN
  4  `trx-status`: IN_PROGRESS
  5  `trx-status`: ABORTED

Output: `status` and `safe-time` print a health summary and a table within 100 columns
(--wide: every field); --json prints the API's JSON, pretty on a terminal, one line
otherwise. A socket that is not there yet is waited for up to 5 s.";

/// Exit status: success, `get` found, `trx-status` `COMMITTED`.
pub const EXIT_OK: u8 = 0;
/// Exit status: an error (also an error answer of the daemon).
pub const EXIT_ERROR: u8 = 1;
/// Exit status: a bad command line (clap's), and `promote` without `--yes` off a terminal.
pub const EXIT_USAGE: u8 = 2;
/// Exit status: `get` found no such key; `trx-status` `UNKNOWN`.
pub const EXIT_NOT_FOUND: u8 = 3;
/// Exit status: `trx-status` `IN_PROGRESS`.
pub const EXIT_IN_PROGRESS: u8 = 4;
/// Exit status: `trx-status` `ABORTED`.
pub const EXIT_ABORTED: u8 = 5;

/// How long `ctl` waits for an admin socket that is missing or refuses connections: a
/// daemon that was just started binds it within that.
const SOCKET_WAIT: Duration = Duration::from_secs(5);

/// Tries connecting to `socket` every 100 ms while it is missing or refusing (saying so
/// once on stderr), for at most `limit`; returns as soon as a connection succeeds or the
/// time is up (the caller's own call then reports the error).
async fn wait_for_socket(socket: &Path, limit: Duration) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut said = false;
    loop {
        match tokio::net::UnixStream::connect(socket).await {
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused
                ) && tokio::time::Instant::now() < deadline =>
            {
                if !said {
                    eprintln!(
                        "admin socket {} not available yet ({e}); waiting up to {}",
                        socket.display(),
                        humantime::format_duration(limit)
                    );
                    said = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => return,
        }
    }
}

/// Which daemon a subcommand is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Daemon {
    Applier,
    Shipper,
}

impl Daemon {
    fn name(self) -> &'static str {
        match self {
            Daemon::Applier => "an applier",
            Daemon::Shipper => "a shipper",
        }
    }

    /// The daemon a `/v1/status` answer comes from.
    fn of_status(v: &Value) -> Option<Daemon> {
        if v.get("role").is_some() {
            Some(Daemon::Applier)
        } else if v.get("io_engine").is_some() {
            Some(Daemon::Shipper)
        } else {
            None
        }
    }
}

impl CtlCommand {
    /// The subcommand as typed.
    pub fn name(&self) -> &'static str {
        match self {
            CtlCommand::Status => "status",
            CtlCommand::SafeTime => "safe-time",
            CtlCommand::Get { .. } => "get",
            CtlCommand::Scan { .. } => "scan",
            CtlCommand::TrxStatus { .. } => "trx-status",
            CtlCommand::Binlog { .. } => "binlog",
            CtlCommand::Promote { .. } => "promote",
            CtlCommand::Pause { .. } => "pause",
            CtlCommand::Resume { .. } => "resume",
            CtlCommand::Metrics => "metrics",
        }
    }

    /// The one daemon that answers this subcommand (`None`: both do).
    fn only_for(&self) -> Option<Daemon> {
        match self {
            CtlCommand::Status
            | CtlCommand::Pause { .. }
            | CtlCommand::Resume { .. }
            | CtlCommand::Metrics => None,
            _ => Some(Daemon::Applier),
        }
    }

    /// The exit status for a successful answer `v` (see the module doc).
    pub fn exit_code(&self, v: &Value) -> u8 {
        match self {
            CtlCommand::Get { .. } if v["found"] == false => EXIT_NOT_FOUND,
            CtlCommand::TrxStatus { .. } => match v["state"].as_str() {
                Some("COMMITTED") => EXIT_OK,
                Some("IN_PROGRESS") => EXIT_IN_PROGRESS,
                Some("ABORTED") => EXIT_ABORTED,
                _ => EXIT_NOT_FOUND,
            },
            _ => EXIT_OK,
        }
    }
}

/// A call with the client's deadline.
async fn call_within(
    socket: &Path,
    method: Method,
    path: &str,
    timeout: Duration,
) -> Result<Answer> {
    tokio::time::timeout(timeout, call(socket, method.clone(), path))
        .await
        .map_err(|_| {
            anyhow!(
                "no answer to {method} {path} from {} within {}",
                socket.display(),
                humantime::format_duration(timeout)
            )
        })?
}

/// `promote` goes ahead: `--yes`, or `promote` typed on a terminal. `Err(code)` otherwise,
/// after saying why on stderr.
fn confirm_promote(socket: &Path, yes: bool) -> std::result::Result<(), u8> {
    if yes {
        return Ok(());
    }
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        eprintln!(
            "error: promote is irreversible: it stops intake for good and discards everything \
             above the cut. Add --yes to promote the applier at {} (or run it on a terminal \
             to confirm by typing)",
            socket.display()
        );
        return Err(EXIT_USAGE);
    }
    eprint!(
        "Promote the applier at {} to primary? Intake stops for good and everything above the \
         cut is discarded; this cannot be undone.\nType 'promote' to confirm: ",
        socket.display()
    );
    let _ = std::io::stderr().flush();
    let mut line = String::new();
    if stdin.lock().read_line(&mut line).is_err() || line.trim() != "promote" {
        eprintln!("not promoted");
        return Err(EXIT_ERROR);
    }
    Ok(())
}

/// Runs `tidelog ctl`: prints the answer and returns the exit status (module doc); an
/// error answer is printed as `error: <code>: <message>` and gives 1.
pub fn run(args: CtlArgs) -> Result<u8> {
    if let CtlCommand::Promote { yes } = args.command {
        if let Err(code) = confirm_promote(&args.socket, yes) {
            return Ok(code);
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let (method, path) = args.command.request();
    let mut timeout = args.timeout;
    if let CtlCommand::TrxStatus { wait: Some(w), .. } = &args.command {
        timeout = timeout.saturating_add(wait_allowance(w));
    }
    let socket = &args.socket;
    let answer = rt.block_on(async {
        wait_for_socket(socket, SOCKET_WAIT).await;
        call_within(socket, method.clone(), &path, timeout).await
    })?;
    if answer.status == StatusCode::NOT_FOUND {
        if let Some(wrong) = rt.block_on(wrong_daemon(socket, &args.command, timeout)) {
            bail!("{wrong}");
        }
    }
    let is_tty = std::io::stdout().is_terminal();
    let out = if matches!(args.command, CtlCommand::Metrics) && answer.status.is_success() {
        let text = String::from_utf8_lossy(&answer.body);
        if args.json {
            let v = metrics_json::to_json(&text).context("reading the daemon's Prometheus text")?;
            json_text(&v, is_tty)
        } else {
            let mut s = text.into_owned();
            if !s.ends_with('\n') {
                s.push('\n');
            }
            s
        }
    } else if args.json {
        match answer.json() {
            Ok(v) => json_text(&v, is_tty),
            Err(_) => format!("{}\n", String::from_utf8_lossy(&answer.body).trim_end()),
        }
    } else if answer.status.is_success() {
        let v = answer.json()?;
        human(&rt, &args, &v, timeout)
    } else {
        String::new()
    };
    if answer.status.is_success() || args.json {
        let mut stdout = std::io::stdout().lock();
        match stdout
            .write_all(out.as_bytes())
            .and_then(|()| stdout.flush())
        {
            Ok(()) => {}
            // Nobody reads the answer any more (`| head`): a quiet success.
            Err(e) if crate::output::reader_gone(&e) => return Ok(EXIT_OK),
            Err(e) => return Err(e.into()),
        }
    }
    if !answer.status.is_success() {
        eprintln!("error: {}", answer.error_text());
        return Ok(EXIT_ERROR);
    }
    Ok(match answer.json() {
        Ok(v) => args.command.exit_code(&v),
        Err(_) => EXIT_OK,
    })
}

/// JSON text: pretty on a terminal, one line otherwise.
fn json_text(v: &Value, pretty: bool) -> String {
    let s = if pretty {
        serde_json::to_string_pretty(v)
    } else {
        serde_json::to_string(v)
    };
    format!("{}\n", s.unwrap_or_default())
}

/// The human form of a successful answer `v` to `args.command` (module doc).
fn human(rt: &tokio::runtime::Runtime, args: &CtlArgs, v: &Value, timeout: Duration) -> String {
    if args.wide {
        return render::generic(v);
    }
    match (&args.command, Daemon::of_status(v)) {
        (CtlCommand::Status, Some(Daemon::Applier)) => {
            // The safe time's lag and laggiest tablet as the daemon computes them.
            let st = rt
                .block_on(call_within(
                    &args.socket,
                    Method::GET,
                    "/v1/safe-time",
                    timeout,
                ))
                .ok()
                .filter(|a| a.status.is_success())
                .and_then(|a| a.json().ok());
            render::applier_status(v, st.as_ref())
        }
        (CtlCommand::Status, Some(Daemon::Shipper)) => render::shipper_status(v),
        (CtlCommand::SafeTime, _) => render::safe_time(v),
        _ => render::generic(v),
    }
}

/// When `cmd` got a 404 for its route: the explanation if the socket is another kind of
/// daemon's (e.g. `get` sent to a shipper).
async fn wrong_daemon(socket: &Path, cmd: &CtlCommand, timeout: Duration) -> Option<String> {
    let want = cmd.only_for()?;
    let a = call_within(socket, Method::GET, "/v1/status", timeout)
        .await
        .ok()?;
    let is = Daemon::of_status(&a.json().ok()?)?;
    (is != want).then(|| {
        format!(
            "{} is {}'s admin socket; `{}` is {} command (the {} socket is /run/tidelog/{}.sock by default)",
            socket.display(),
            is.name(),
            cmd.name(),
            want.name(),
            match want {
                Daemon::Applier => "applier's",
                Daemon::Shipper => "shipper's",
            },
            match want {
                Daemon::Applier => "applier",
                Daemon::Shipper => "shipper",
            }
        )
    })
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
            (
                CtlCommand::Promote { yes: true },
                Method::POST,
                "/v1/promote",
            ),
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
    fn exit_codes_follow_the_answer() {
        let get = CtlCommand::Get {
            key: "k".into(),
            latest: false,
            at: None,
        };
        assert_eq!(get.exit_code(&serde_json::json!({"found": true})), EXIT_OK);
        assert_eq!(
            get.exit_code(&serde_json::json!({"found": false})),
            EXIT_NOT_FOUND
        );
        let trx = CtlCommand::TrxStatus {
            trx: "7:3".into(),
            gtid: None,
            wait: None,
        };
        for (state, code) in [
            ("COMMITTED", EXIT_OK),
            ("UNKNOWN", EXIT_NOT_FOUND),
            ("IN_PROGRESS", EXIT_IN_PROGRESS),
            ("ABORTED", EXIT_ABORTED),
        ] {
            assert_eq!(
                trx.exit_code(&serde_json::json!({"state": state})),
                code,
                "{state}"
            );
        }
        assert_eq!(
            CtlCommand::Status.exit_code(&serde_json::json!({})),
            EXIT_OK
        );
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
