//! The listener: accepts TCP connections on `listen`, holds at most `max-connections`
//! (one more is answered with error 1040 and closed at once, costing nothing but the
//! accept), runs each as a task ([`crate::conn::serve`]), and stops them all on
//! [`SqlServer::shutdown`].

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tidelog_applier::node::Applier;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use crate::answer::SqlError;
use crate::auth::Password;
use crate::metrics::Metrics;
use crate::packets;

/// Everything [`SqlServer::start`] needs (the `[sql]` table, with the password read and
/// the TLS configuration built).
#[derive(Debug, Clone)]
pub struct SqlOptions {
    /// TCP address to listen on.
    pub listen: SocketAddr,
    /// The one user name clients log in with.
    pub user: String,
    pub password: Password,
    /// The server certificate's TLS configuration; `None`: TLS off.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Refuse clients that do not switch to TLS.
    pub tls_required: bool,
    /// Connections held at once.
    pub max_connections: usize,
    /// A connection idle (between commands) for this long is closed.
    pub idle_timeout: Duration,
}

/// What every connection reads.
pub(crate) struct Shared {
    pub applier: Applier,
    pub opts: SqlOptions,
    pub password: Password,
    pub tls: Option<TlsAcceptor>,
    pub metrics: Metrics,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("opts", &self.opts)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

/// The running endpoint.
#[derive(Debug)]
pub struct SqlServer {
    addr: SocketAddr,
    open: Arc<AtomicUsize>,
    metrics: Metrics,
    stop: watch::Sender<bool>,
    task: tokio::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SqlServer {
    /// Binds `opts.listen` and starts accepting (on the current tokio runtime).
    pub async fn start(applier: Applier, opts: SqlOptions) -> Result<SqlServer> {
        let listener = TcpListener::bind(opts.listen)
            .await
            .with_context(|| format!("binding the SQL endpoint to {}", opts.listen))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            applier,
            password: opts.password.clone(),
            tls: opts.tls.clone().map(TlsAcceptor::from),
            metrics: Metrics::default(),
            opts,
        });
        let open = Arc::new(AtomicUsize::new(0));
        let (stop, stopped) = watch::channel(false);
        let metrics = shared.metrics.clone();
        let task = tokio::spawn(accept_loop(listener, shared, open.clone(), stopped));
        tracing::info!(listen = %addr, "SQL endpoint listening");
        Ok(SqlServer {
            addr,
            open,
            metrics,
            stop,
            task: tokio::sync::Mutex::new(Some(task)),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections held now (authenticated or in their handshake).
    pub fn connections(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Registers the endpoint's metric families.
    pub fn metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics.register(registry);
    }

    /// Stops accepting and closes every connection (a wait in progress is dropped).
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        if let Some(t) = self.task.lock().await.take() {
            let _ = t.await;
        }
    }
}

async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    open: Arc<AtomicUsize>,
    mut stopped: watch::Receiver<bool>,
) {
    let places = Arc::new(Semaphore::new(shared.opts.max_connections));
    let ids = AtomicU32::new(1);
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            _ = stopped.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            r = listener.accept() => {
                let (stream, peer) = match r {
                    Ok(x) => x,
                    Err(e) => {
                        // Out of file descriptors and the like: the next accept may work.
                        tracing::warn!(error = %e, "SQL endpoint: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                shared.metrics.accepted.inc();
                let Ok(place) = places.clone().try_acquire_owned() else {
                    refuse_full(&stream, shared.opts.max_connections);
                    shared.metrics.refused("max_connections");
                    shared.metrics.error(1040);
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let id = ids.fetch_add(1, Ordering::Relaxed);
                let (shared, open) = (shared.clone(), open.clone());
                open.fetch_add(1, Ordering::Relaxed);
                shared.metrics.open.inc();
                conns.spawn(async move {
                    if let Err(e) = crate::conn::serve(stream, shared.clone(), id).await {
                        tracing::debug!(conn = id, %peer, error = %e, "SQL connection closed");
                    }
                    shared.metrics.open.dec();
                    open.fetch_sub(1, Ordering::Relaxed);
                    drop(place);
                });
            }
        }
    }
    conns.shutdown().await;
    open.store(0, Ordering::Relaxed);
    shared.metrics.open.set(0);
}

/// Error 1040 as the first packet, written without waiting (a fresh socket's buffer takes
/// it), then the connection is dropped.
fn refuse_full(stream: &tokio::net::TcpStream, max: usize) {
    let e = SqlError::new(
        1040,
        b"08004",
        format!("Too many connections (max-connections = {max})"),
    );
    let body = packets::err(&e);
    let mut p = (body.len() as u32).to_le_bytes()[..3].to_vec();
    p.push(0);
    p.extend_from_slice(&body);
    let _ = stream.try_write(&p);
}
