//! The admin server: its Unix socket (a leftover one replaced, a live one refused), the
//! connection limits, the JSON 404 fallback and the graceful stop.

use std::future::Future;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use axum::Router;

use super::error::not_found;

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
