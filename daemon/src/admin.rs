//! The admin API server (`docs/operations.md`, "Admin API"): HTTP/1.1 + JSON on a Unix
//! socket, and the pieces every handler shares — the error body, the JSON 404, hybrid times
//! as decimal strings and keys and values as UTF-8 strings or `{"b64": …}`.
//!
//! A daemon builds its `axum::Router` of `/v1/…` routes and hands it to [`serve`], which adds
//! the JSON 404 fallback and holds every connection to [`Limits`]: a client that has not
//! sent a whole request head within [`HEADER_READ_TIMEOUT`] is disconnected (a slow or
//! stuck client, or an idle keep-alive one, holds nothing for long), and beyond
//! [`MAX_CONNECTIONS`] a new connection is answered 503 `too_many_connections` and closed.
//! A request that waits (`/v1/safe-time?wait-for=`, `/v1/trx/…?gtid=`) takes a place of
//! the applier's wait limit (`tidelog_applier::node::WaitLimit`; 503 `too_many_waiters`
//! when none is left) and waits as an async task: no wait holds a thread, so `status`
//! answers however many wait.
//!
//! ```no_run
//! # async fn f(shutdown: tokio::sync::oneshot::Receiver<()>) -> anyhow::Result<()> {
//! use axum::{routing::get, Json, Router};
//! let router = Router::new().route("/v1/status", get(|| async { Json(serde_json::json!({})) }));
//! tidelog::admin::serve(
//!     "/run/tidelog/applier.sock".as_ref(),
//!     router,
//!     async move { let _ = shutdown.await; },
//! )
//! .await
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use serde::de::DeserializeOwned;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// Mode of the admin socket: the daemon's user and group may connect.
pub const SOCKET_MODE: u32 = 0o660;

/// A connection that has not sent a whole request head within this long after it opened
/// (or after its last answer, when kept alive) is closed. Clients that keep a connection
/// open between requests (the benchmarks' samplers) send far more often than this; one
/// that idles longer reconnects, as with any HTTP server that closes idle connections.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// The most admin connections served at once (fewer when the open-files limit is low:
/// [`Limits::for_this_process`]); beyond it a new connection gets a 503
/// `too_many_connections` and is closed.
pub const MAX_CONNECTIONS: usize = 4096;

/// The most requests that may wait at once (`/v1/safe-time?wait-for=`, `/v1/trx/…?gtid=`);
/// beyond it a request that would wait gets a 503 `too_many_waiters`. The applier keeps
/// the places (`tidelog_applier::node::WaitLimit`).
pub use tidelog_applier::node::MAX_WAITERS;

/// How long a refused connection ([`MAX_CONNECTIONS`]) is given to take its answer.
const REFUSAL_DRAIN: Duration = Duration::from_secs(1);

/// What the admin server holds its connections to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once.
    pub max_connections: usize,
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
}

impl Limits {
    /// [`MAX_CONNECTIONS`], but at most a quarter of the open-files limit (raised to its
    /// hard limit first, [`raise_open_files_limit`]): the store, the received logs and the
    /// sockets need the rest. At least 16.
    pub fn for_this_process() -> Limits {
        let files = raise_open_files_limit();
        let by_files = usize::try_from(files / 4).unwrap_or(usize::MAX);
        Limits {
            max_connections: MAX_CONNECTIONS.min(by_files).max(16),
            header_read_timeout: HEADER_READ_TIMEOUT,
        }
    }
}

/// Raises the soft open-files limit (`RLIMIT_NOFILE`) to the hard one, as a server that
/// holds many connections and files should; returns the soft limit in force afterwards.
pub fn raise_open_files_limit() -> u64 {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local `rlimit`.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    lim.rlim_cur
}

/// Serves `router` (plus the JSON 404 fallback) on the Unix socket `socket` until `shutdown`
/// completes, then finishes the requests in flight and removes the socket file.
///
/// Before binding: creates the parent directory if missing; a leftover socket file from a
/// previous run is removed, but only if it is a socket nobody is listening on — a live one
/// (another daemon) or a file of another type is an error.
pub async fn serve(
    socket: &Path,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    let listener = bind(socket).await?;
    serve_bound(listener, socket, router, shutdown).await
}

/// [`serve`] on a socket already bound with [`bind`] (so a daemon can bind before it tells
/// systemd it is ready, and serve afterwards), with [`Limits::for_this_process`].
pub async fn serve_bound(
    listener: tokio::net::UnixListener,
    socket: &Path,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<()> {
    serve_limited(
        listener,
        socket,
        router,
        shutdown,
        Limits::for_this_process(),
    )
    .await
}

/// [`serve_bound`] with explicit [`Limits`].
pub async fn serve_limited(
    listener: tokio::net::UnixListener,
    socket: &Path,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) -> Result<()> {
    let ino = std::fs::symlink_metadata(socket)
        .map(|m| m.ino())
        .with_context(|| format!("admin socket {} vanished after bind", socket.display()))?;
    tracing::info!(
        socket = %socket.display(),
        max_connections = limits.max_connections,
        "admin API listening"
    );
    // A known path with another method is an unknown route too: the same JSON 404, not
    // axum's empty 405.
    let app = router
        .fallback(not_found)
        .method_not_allowed_fallback(not_found);
    serve_http(listener, app, shutdown, limits).await;
    // Remove the socket only if it is still ours (not replaced by a newer daemon).
    if std::fs::symlink_metadata(socket).is_ok_and(|m| m.ino() == ino) {
        if let Err(e) = std::fs::remove_file(socket) {
            tracing::warn!(socket = %socket.display(), error = %e, "cannot remove admin socket");
        }
    }
    Ok(())
}

/// Serves `app` on `listener` (the admin socket, or the TCP listener of `metrics-listen`)
/// until `shutdown`, holding every connection to `limits`; then lets each connection
/// finish the request it is serving and waits for them all. Accept errors are logged and
/// retried by the listener (a full open-files table pauses it for a second).
pub async fn serve_http<L: axum::serve::Listener>(
    mut listener: L,
    app: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
    limits: Limits,
) {
    let places = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let (closing_tx, closing_rx) = tokio::sync::watch::channel(false);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            () = &mut shutdown => break,
            (stream, _) = listener.accept() => stream,
        };
        let Ok(place) = places.clone().try_acquire_owned() else {
            tokio::spawn(refuse_connection(stream, limits.max_connections));
            continue;
        };
        let conn = http.serve_connection(
            hyper_util::rt::TokioIo::new(stream),
            hyper_util::service::TowerToHyperService::new(app.clone()),
        );
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let closed = async move {
                let _ = closing.wait_for(|c| *c).await;
            };
            let r = tokio::select! {
                r = conn.as_mut() => r,
                () = closed => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                // A client that went away or timed out sending its head: nothing to answer.
                tracing::debug!(error = %e, "admin connection ended");
            }
            drop(place);
        });
    }
    closing_tx.send_replace(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let _ = places.acquire_many(all).await;
}

/// Answers a connection beyond [`Limits::max_connections`] with a 503 and closes it.
async fn refuse_connection<S>(mut stream: S, max: usize)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = serde_json::json!({
        "error": "too_many_connections",
        "message": format!("this server serves {max} connections at once; retry later"),
    })
    .to_string();
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    // Then read what the client sent until it closes: closing a socket with unread data
    // resets it, and the client would lose the answer.
    let answer_and_drain = async {
        stream.write_all(answer.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        std::io::Result::Ok(())
    };
    let _ = tokio::time::timeout(REFUSAL_DRAIN, answer_and_drain).await;
}

/// The daemon-wide stop signal for the servers it runs: `stop()` ends every future that
/// `stopped()` handed out (the admin API, the metrics listener).
#[derive(Debug)]
pub struct StopSignal(tokio::sync::watch::Sender<bool>);

impl StopSignal {
    pub fn new() -> StopSignal {
        StopSignal(tokio::sync::watch::channel(false).0)
    }

    /// A future that completes once [`StopSignal::stop`] is called.
    pub fn stopped(&self) -> impl Future<Output = ()> + Send + 'static {
        let mut rx = self.0.subscribe();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    }

    pub fn stop(&self) {
        self.0.send_replace(true);
    }
}

impl Default for StopSignal {
    fn default() -> Self {
        StopSignal::new()
    }
}

/// What is at the admin socket's path before binding.
enum Leftover {
    Nothing,
    /// A socket nobody listens on (a previous run's): removed before binding.
    StaleSocket,
}

/// Looks at the admin socket's path: a live socket (another daemon) or a file of another
/// type is an error.
fn leftover(socket: &Path) -> Result<Leftover> {
    match std::fs::symlink_metadata(socket) {
        Ok(m) if m.file_type().is_socket() => {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                bail!(
                    "admin socket {} is in use by a running process",
                    socket.display()
                );
            }
            Ok(Leftover::StaleSocket)
        }
        Ok(_) => bail!(
            "admin socket path {} exists and is not a socket; refusing to remove it",
            socket.display()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Leftover::Nothing),
        Err(e) => Err(e).with_context(|| format!("cannot inspect {}", socket.display())),
    }
}

/// What [`bind`] would refuse, found without side effects (`--check`, and a start before
/// its first side effect): a live socket or another file at the path, a directory for it
/// that cannot be made. The error names the config key `admin-socket`.
pub fn check_bind(socket: &Path) -> Result<()> {
    if let Some(parent) = socket.parent().filter(|p| !p.as_os_str().is_empty()) {
        crate::preflight::writable_dir("admin-socket", parent)?;
    }
    leftover(socket).context("key \"admin-socket\"")?;
    Ok(())
}

/// Binds the admin socket (see [`serve`]) with mode [`SOCKET_MODE`].
pub async fn bind(socket: &Path) -> Result<tokio::net::UnixListener> {
    if let Some(parent) = socket.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| {
            format!(
                "cannot create the admin socket's directory {}",
                parent.display()
            )
        })?;
    }
    if let Leftover::StaleSocket = leftover(socket)? {
        std::fs::remove_file(socket)
            .with_context(|| format!("cannot remove stale admin socket {}", socket.display()))?;
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .with_context(|| format!("cannot bind admin socket {}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(SOCKET_MODE))
        .with_context(|| format!("cannot chmod admin socket {}", socket.display()))?;
    Ok(listener)
}

/// An error answer: `{"error": code, "message": text}` with an HTTP status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status: 400 bad request, 404 unknown route or object, 409 conflicting state,
    /// 503 unavailable (e.g. `stale_safe_time`), 500 internal.
    pub status: StatusCode,
    /// A stable snake_case code, e.g. `bad_request`, `stale_safe_time`.
    pub code: String,
    /// Text for a human; names what is wrong (the key, the lagging tablet).
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code: code.into(),
            message: message.into(),
        }
    }
    /// 400 `bad_request`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    /// 404 `not_found`.
    pub fn not_found(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }
    /// 409 with a code saying which state conflicts (e.g. `promoted`).
    pub fn conflict(code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::CONFLICT, code, message)
    }
    /// 503 with a code such as `stale_safe_time` or `safe_time_uninitialized`.
    pub fn unavailable(code: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }
    /// 500 `internal`; the message is the error chain.
    pub fn internal(err: &anyhow::Error) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{err:#}"),
        )
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The JSON error body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(ErrorBody {
                error: self.code,
                message: self.message,
            }),
        )
            .into_response()
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        ApiError::internal(&e)
    }
}

/// The fallback for unknown routes: 404 `{"error":"not_found","message":"no route GET /x"}`.
/// [`serve`] installs it; call it from a custom fallback if you replace that.
pub async fn not_found(method: axum::http::Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route {method} {}", uri.path()))
}

/// `axum::extract::Query` whose rejection is the API's JSON 400 (`bad_request`, naming the
/// field) instead of axum's plain-text one. Hybrid-time fields: `#[serde(with = "opt_ht",
/// default)]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ApiQuery<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiQuery<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        match axum::extract::Query::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Query(v)) => Ok(ApiQuery(v)),
            Err(e) => Err(ApiError::bad_request(e.body_text())),
        }
    }
}

/// A Prometheus text exposition answer (`GET /metrics`).
pub fn prometheus(text: String) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A `?tablet=T` parameter (`None`: all tablets); a malformed id is a 400 naming it.
pub fn parse_tablet(tablet: Option<&str>) -> Result<Option<tidelog_wal::TabletId>, ApiError> {
    tablet
        .map(|t| {
            t.parse::<tidelog_wal::TabletId>()
                .map_err(|e| ApiError::bad_request(format!("tablet: {e}")))
        })
        .transpose()
}

/// The end of a daemon's graceful stop, once its data path stopped: stops the admin
/// server, lets it finish its requests and remove the socket (5 s at most), and returns
/// the admin server's own failure, if it was what ended the daemon.
pub async fn wind_down(
    stop: &StopSignal,
    admin_failed: Option<anyhow::Error>,
    admin_task: tokio::task::JoinHandle<Result<()>>,
) -> Result<()> {
    stop.stop();
    if let Some(e) = admin_failed {
        return Err(e);
    }
    if let Ok(Ok(Err(e))) = tokio::time::timeout(Duration::from_secs(5), admin_task).await {
        tracing::warn!("admin API: {e:#}");
    }
    Ok(())
}

/// Parses a query or path value the API takes as a hybrid time (decimal u64).
pub fn parse_ht(field: &str, s: &str) -> Result<u64, ApiError> {
    s.trim().parse::<u64>().map_err(|_| {
        ApiError::bad_request(format!(
            "{field}: {s:?} is not a hybrid time (a decimal u64)"
        ))
    })
}

/// Percent-decodes `s` to bytes (keys need not be UTF-8: `/v1/kv/%00%FF` names the key
/// `00 FF`); in a query value `+` is a space, as in forms. A `%` without two hex digits after
/// it is a 400 naming `field` and the offset.
pub fn percent_decode(field: &str, s: &str, plus_is_space: bool) -> Result<Vec<u8>, ApiError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' => {
                // Two hex digits (`from_str_radix` alone would take a sign: `%+1`).
                let hex = b
                    .get(i + 1..i + 3)
                    .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
                    .and_then(|h| std::str::from_utf8(h).ok());
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(v) => out.push(v),
                    None => {
                        return Err(ApiError::bad_request(format!(
                            "{field}: bad percent-encoding at byte {i} of {s:?}"
                        )))
                    }
                }
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(out)
}

/// The raw (percent-decoded) bytes of query parameter `name`, if present; the last one
/// wins, as with the typed query.
pub fn query_bytes(uri: &Uri, name: &str) -> Result<Option<Vec<u8>>, ApiError> {
    let mut found = None;
    for pair in uri.query().unwrap_or("").split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if percent_decode("query", k, true)? == name.as_bytes() {
            found = Some(percent_decode(name, v, true)?);
        }
    }
    Ok(found)
}

/// Parses a query value the API takes as a duration (`"5s"`, `"250ms"`).
pub fn parse_wait(field: &str, s: &str) -> Result<std::time::Duration, ApiError> {
    humantime::parse_duration(s.trim())
        .map_err(|e| ApiError::bad_request(format!("{field}: {s:?} is not a duration: {e}")))
}

/// `#[serde(with = "tidelog::admin::ht")]` for a `u64` hybrid time: written as a decimal
/// string, read from a decimal string or a non-negative integer.
pub mod ht {
    use super::*;

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        d.deserialize_any(HtVisitor)
    }

    pub(super) struct HtVisitor;

    impl Visitor<'_> for HtVisitor {
        type Value = u64;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a hybrid time as a decimal string or a non-negative integer")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("hybrid time {v} is negative")))
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            Err(E::custom(format!(
                "hybrid time {v} is not an integer; send it as a decimal string"
            )))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            v.trim()
                .parse()
                .map_err(|_| E::custom(format!("hybrid time {v:?} is not a decimal u64")))
        }
    }
}

/// `#[serde(with = "tidelog::admin::opt_ht", default)]` for an `Option<u64>` hybrid time;
/// `None` is `null`.
pub mod opt_ht {
    use super::*;

    pub fn serialize<S: Serializer>(v: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.collect_str(v),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Option<u64>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("null or a hybrid time")
            }
            fn visit_none<E: de::Error>(self) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_unit<E: de::Error>(self) -> Result<Option<u64>, E> {
                Ok(None)
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<u64>, D::Error> {
                super::ht::deserialize(d).map(Some)
            }
        }
        d.deserialize_option(V)
    }
}

/// A key or value in the API's JSON form: a string when the bytes are UTF-8, else
/// `{"b64": "<standard base64>"}`. Both forms are accepted on input.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct JsonBytes(pub Vec<u8>);

impl From<Vec<u8>> for JsonBytes {
    fn from(v: Vec<u8>) -> Self {
        JsonBytes(v)
    }
}

impl From<&[u8]> for JsonBytes {
    fn from(v: &[u8]) -> Self {
        JsonBytes(v.to_vec())
    }
}

impl From<&str> for JsonBytes {
    fn from(v: &str) -> Self {
        JsonBytes(v.as_bytes().to_vec())
    }
}

impl Serialize for JsonBytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => s.serialize_str(text),
            Err(_) => {
                let mut m = s.serialize_map(Some(1))?;
                m.serialize_entry("b64", &BASE64.encode(&self.0))?;
                m.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for JsonBytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = JsonBytes;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or {\"b64\": \"...\"}")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<JsonBytes, E> {
                Ok(JsonBytes(v.as_bytes().to_vec()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonBytes, A::Error> {
                let mut out = None;
                while let Some(k) = map.next_key::<String>()? {
                    if k != "b64" {
                        return Err(de::Error::custom(format!(
                            "unknown field `{k}` in bytes; expected only `b64`"
                        )));
                    }
                    if out.is_some() {
                        return Err(de::Error::custom("duplicate field `b64`"));
                    }
                    let text: String = map.next_value()?;
                    out = Some(BASE64.decode(text.as_bytes()).map_err(|e| {
                        de::Error::custom(format!("`b64` is not standard base64: {e}"))
                    })?);
                }
                out.map(JsonBytes)
                    .ok_or_else(|| de::Error::custom("missing field `b64`"))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct T {
        #[serde(with = "ht")]
        a: u64,
        #[serde(with = "opt_ht", default)]
        b: Option<u64>,
        k: JsonBytes,
        v: Option<JsonBytes>,
    }

    #[test]
    fn hybrid_times_are_strings_and_bytes_utf8_or_b64() {
        let t = T {
            a: u64::MAX,
            b: Some(7),
            k: JsonBytes::from("k"),
            v: Some(JsonBytes(vec![0, 0xff])),
        };
        let s = serde_json::to_string(&t).unwrap();
        assert_eq!(
            s,
            r#"{"a":"18446744073709551615","b":"7","k":"k","v":{"b64":"AP8="}}"#
        );
        assert_eq!(serde_json::from_str::<T>(&s).unwrap(), t);
        let t2: T = serde_json::from_str(r#"{"a":5,"k":{"b64":"aGk="},"v":null}"#).unwrap();
        assert_eq!(t2.a, 5);
        assert_eq!(t2.b, None);
        assert_eq!(t2.k.0, b"hi");
        assert_eq!(t2.v, None);
        assert!(serde_json::from_str::<T>(r#"{"a":-1,"k":"x","v":null}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"a":"x1","k":"x","v":null}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"a":1,"k":{"b64":"!!"},"v":null}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"a":1,"k":{"hex":"00"},"v":null}"#).is_err());
        assert!(serde_json::from_str::<T>(r#"{"a":1,"k":5,"v":null}"#).is_err());
    }

    #[test]
    fn percent_decoding_gives_raw_bytes() {
        assert_eq!(
            percent_decode("key", "a%00%FFb", false).unwrap(),
            b"a\0\xffb"
        );
        assert_eq!(percent_decode("key", "a+b", false).unwrap(), b"a+b");
        assert_eq!(percent_decode("prefix", "a+b%2B", true).unwrap(), b"a b+");
        for bad in ["%", "%F", "%GG", "ab%zz", "%+1", "a%+F"] {
            let e = percent_decode("key", bad, false).unwrap_err().to_string();
            assert!(e.contains("key: bad percent-encoding"), "{bad}: {e}");
        }
        let u: Uri = "/v1/scan?mode=latest&prefix=%00%FF&limit=2"
            .parse()
            .unwrap();
        assert_eq!(query_bytes(&u, "prefix").unwrap(), Some(vec![0, 0xff]));
        assert_eq!(query_bytes(&u, "at").unwrap(), None);
    }

    #[test]
    fn api_error_body() {
        let e = ApiError::unavailable("stale_safe_time", "tablet t3 lags by 20m");
        assert_eq!(e.to_string(), "stale_safe_time: tablet t3 lags by 20m");
        let r = e.into_response();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(parse_ht("at", "12x").is_err());
        assert_eq!(parse_ht("at", "12").unwrap(), 12);
        assert!(parse_wait("wait", "5 parsecs").is_err());
    }

    /// A router with `GET /v1/status` only.
    fn status_only() -> Router {
        Router::new().route(
            "/v1/status",
            axum::routing::get(|| async { axum::Json(serde_json::json!({"ok": true})) }),
        )
    }

    /// `req` ("GET /v1/status") on a new connection; the whole answer.
    async fn ask(p: &Path, req: &str) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut c = tokio::net::UnixStream::connect(p).await.unwrap();
        let head =
            format!("{req} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
        c.write_all(head.as_bytes()).await.unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).await.unwrap();
        out
    }

    /// Unknown paths and known paths with another method both get the JSON 404.
    #[tokio::test]
    async fn unknown_routes_and_methods_get_the_json_404() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.sock");
        let l = bind(&p).await.unwrap();
        let stop = StopSignal::new();
        let server = serve_bound(l, &p, status_only(), stop.stopped());
        let client = async {
            let mut answers = Vec::new();
            for req in [
                "GET /v1/status",
                "POST /v1/status",
                "DELETE /v1/status",
                "GET /v1/nope",
            ] {
                answers.push((req, ask(&p, req).await));
            }
            stop.stop();
            answers
        };
        let (served, answers) = tokio::join!(server, client);
        served.unwrap();
        assert!(answers[0].1.starts_with("HTTP/1.1 200"), "{}", answers[0].1);
        for (req, r) in &answers[1..] {
            assert!(r.starts_with("HTTP/1.1 404"), "{req}: {r}");
            let body = &r[r.find("\r\n\r\n").unwrap() + 4..];
            let v: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(v["error"], "not_found", "{req}: {body}");
            assert_eq!(v["message"], format!("no route {req}"), "{req}: {body}");
        }
    }

    /// Beyond `max_connections` a connection gets a 503 `too_many_connections`; connections
    /// that send no request are closed after the header timeout, which frees their places.
    #[tokio::test]
    async fn connections_are_capped_and_idle_ones_closed() {
        use tokio::io::AsyncReadExt;
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("admin.sock");
        let l = bind(&p).await.unwrap();
        let router = status_only();
        let stop = StopSignal::new();
        let limits = Limits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(2),
        };
        let server = tokio::spawn({
            let p = p.clone();
            let stopped = stop.stopped();
            async move { serve_limited(l, &p, router, stopped, limits).await }
        });
        let t0 = std::time::Instant::now();
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(tokio::net::UnixStream::connect(&p).await.unwrap());
        }
        let refused = ask(&p, "GET /v1/status").await;
        assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
        assert!(refused.contains("\"too_many_connections\""), "{refused}");
        if t0.elapsed() < limits.header_read_timeout {
            // The idle ones are closed at their timeout; then the places are free.
            for mut c in idle {
                let mut b = [0u8; 16];
                let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut b))
                    .await
                    .expect("an idle connection is closed");
                assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
            }
            assert!(t0.elapsed() >= limits.header_read_timeout);
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let a = ask(&p, "GET /v1/status").await;
            if a.starts_with("HTTP/1.1 200") {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "{a}");
        }
        stop.stop();
        server.await.unwrap().unwrap();
        assert!(!p.exists());
    }

    #[tokio::test]
    async fn refuses_live_socket_and_non_socket_files() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/admin.sock");
        let l = bind(&p).await.unwrap();
        let mode = std::fs::metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, SOCKET_MODE);
        let e = format!("{:#}", bind(&p).await.unwrap_err());
        assert!(e.contains("in use"), "{e}");
        drop(l);
        // Stale now: nobody listens.
        let _l = bind(&p).await.unwrap();
        let f = dir.path().join("plain");
        std::fs::write(&f, "keep me").unwrap();
        let e = format!("{:#}", bind(&f).await.unwrap_err());
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(std::fs::read(&f).unwrap(), b"keep me");
    }
}
