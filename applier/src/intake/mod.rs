//! Intake (docs/ARCHITECTURE.md, "Intake"): the QUIC server that shippers connect to.
//!
//! ```text
//!  shipper ──QUIC/mTLS──► connection task ── control stream: Hello → claim tablets → Welcome
//!                           │
//!                           └─ tablet stream task (one per tablet): Open → Ack(resume)
//!                                 Data frames ──bounded queue──► tablet writer thread
//!                                                                  append_encoded (verifies
//!                                                                  position, checksum, ht)
//!                                                                  commit + sync per group
//!                                                                  publish received end
//!                                 ◄── Ack(durable end) ◄──── watch ───┘
//! ```
//!
//! A frame is acknowledged only after its records are durable in the tablet's received log
//! (`data_dir/received/<tablet>/`, the `wal` format), so nothing acknowledged is ever lost;
//! the resume position a shipper gets is the received log's durable end, so nothing is
//! received twice. A frame that fails any check closes its stream with an `Error` message and
//! nothing of it is written.
//!
//! The protocol's rules (claims, the answer to a Hello, the checks of each frame, acks of
//! durable positions only) are `tidelog-proto`'s I/O-free machines, which its simulation
//! checks. The files form a DAG, each naming only those after it: this file (the front
//! door, [`Intake`]) → `serve.rs` (a connection's control and tablet streams) → `shared.rs`
//! (the tablets, claims and connections its tasks share) → `writer.rs` (a tablet's received
//! log and its writer thread) → `tablet.rs` (one tablet's intake) → `options.rs`,
//! `state.rs`.
//!
//! # Clock skew
//!
//! A data frame whose header safe time or any record's ht lies beyond this host's clock
//! plus [`IntakeOptions::max_clock_skew`] is refused before it is queued (`clock_skew`):
//! the records before the first one beyond the bound are written, from it on nothing is
//! written or acknowledged, so the tablet's safe time cannot move to it
//! (an ht of `u64::MAX` would have set the safe time to the year 2112, for good, and made
//! its lag read 0). The tablet shows [`TabletState::ClockSkew`] with the reason until a
//! data frame passes the check. The condition is retried: the shipper resends from the
//! durable end on a new stream (with its reconnect backoff), and once the clocks agree
//! again — the record's ht is within the bound of a later clock, or NTP corrected either
//! side — the frame is taken and the state clears by itself. An ht that stays beyond
//! (a source clock set years ahead) keeps the tablet there: the source must be corrected
//! and the tablet re-bootstrapped. Keep-alives carry no data and are not checked.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tidelog_net::tls::{server_config, TlsMaterial};
use tidelog_wal::TabletId;
use tracing::Instrument;

mod options;
mod serve;
mod shared;
mod state;
mod tablet;
mod writer;

pub use options::{DurableHook, IntakeOptions, DEFAULT_MAX_CLOCK_SKEW};
pub use state::{IntakeActivity, TabletState, BACKLOG_FRAME, RECEIVED_CACHE_KEEP};
pub use tablet::{TabletIntake, TabletIntakeStatus};
pub use writer::recover_received_logs;

use options::Hook;
use serve::serve_connection;
use shared::Shared;
use tablet::lock;

/// A QUIC server endpoint on `listen`, its UDP socket's receive buffer sized to `rcvbuf`
/// bytes (`quic.udp-receive-buffer`, [`tidelog_net::bind_udp`]). Must run inside a
/// tokio runtime.
pub fn server_endpoint(
    listen: SocketAddr,
    ec: quinn::EndpointConfig,
    sc: quinn::ServerConfig,
    rcvbuf: u64,
) -> std::io::Result<(quinn::Endpoint, tidelog_net::UdpReceiveBuffer)> {
    let (socket, got) = tidelog_net::bind_udp(listen, rcvbuf)?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("no async runtime for the QUIC endpoint"))?;
    Ok((quinn::Endpoint::new(ec, Some(sc), socket, runtime)?, got))
}

/// The running intake.
#[derive(Debug, Clone)]
pub struct Intake {
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    rcvbuf: tidelog_net::UdpReceiveBuffer,
}

impl Intake {
    /// Opens the received logs already on disk and starts listening. Must run inside a
    /// tokio runtime.
    pub fn start(
        opts: IntakeOptions,
        tls: TlsMaterial,
        hook: Option<DurableHook>,
    ) -> Result<Intake> {
        opts.validate()?;
        let root = opts.data_dir.join("received");
        std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
        let sc = server_config(&tls, &opts.quic)?;
        let ec = crate::endpoint::endpoint_config(&opts.data_dir)?;
        let (endpoint, rcvbuf) = server_endpoint(opts.listen, ec, sc, opts.quic.udp_receive_buffer)
            .with_context(|| format!("listening on udp {}", opts.listen))?;
        let supported =
            (opts.direct_io || opts.direct_io_in_catch_up) && direct_io_supported(&root);
        let direct_io = opts.direct_io && supported;
        let direct_io_in_catch_up = !direct_io && opts.direct_io_in_catch_up && supported;
        let shared = Arc::new(Shared {
            opts,
            tablets: Mutex::new(BTreeMap::new()),
            claims: Arc::default(),
            conn_ids: AtomicU64::new(1),
            stream_ids: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            paused_all: AtomicBool::new(false),
            hook: Arc::new(Mutex::new(Hook(hook))),
            refusal: Mutex::new(None),
            conns: Mutex::new(BTreeMap::new()),
            activity: Arc::default(),
            direct_io,
            direct_io_in_catch_up,
        });
        for t in tidelog_wal::reader::list_tablets(&root)
            .with_context(|| format!("listing {}", root.display()))?
        {
            shared.tablet(&t)?;
        }
        let intake = Intake {
            shared,
            endpoint,
            rcvbuf,
        };
        let i2 = intake.clone();
        tokio::spawn(async move { i2.accept_loop().await });
        Ok(intake)
    }

    /// Whether the received logs are written with `O_DIRECT` (asked for with
    /// [`IntakeOptions::direct_io`] and taken by the file system).
    pub fn direct_io(&self) -> bool {
        self.shared.direct_io
    }

    /// Whether received-log segments begun during a catch-up are written with `O_DIRECT`
    /// ([`IntakeOptions::direct_io_in_catch_up`], and the file system takes it).
    pub fn direct_io_in_catch_up(&self) -> bool {
        self.shared.direct_io_in_catch_up
    }

    /// When the intake last made frames durable (see [`IntakeActivity`]).
    pub fn activity(&self) -> Arc<IntakeActivity> {
        self.shared.activity.clone()
    }

    /// The UDP socket's receive buffer: configured and granted (`quic.udp-receive-buffer`).
    pub fn udp_receive_buffer(&self) -> tidelog_net::UdpReceiveBuffer {
        self.rcvbuf
    }

    /// The bound UDP address (useful with port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.endpoint.local_addr()?)
    }

    /// Shipper connections accepted (handshake done) since start.
    pub fn connections_total(&self) -> u64 {
        self.shared
            .conn_ids
            .load(Ordering::Relaxed)
            .saturating_sub(1)
    }

    /// Tablets known to the intake and their state.
    pub fn tablets(&self) -> Vec<Arc<TabletIntake>> {
        lock(&self.shared.tablets).values().cloned().collect()
    }

    pub fn tablet(&self, t: &TabletId) -> Option<Arc<TabletIntake>> {
        lock(&self.shared.tablets).get(t).cloned()
    }

    pub fn set_hook(&self, hook: DurableHook) {
        *lock(&self.shared.hook) = Hook(Some(hook));
    }

    /// Stops (`true`) or restarts intake of one tablet or of all. A pause returns once
    /// a group the writer had begun is written: from then on the received log stays as it
    /// is (frames already read wait in memory, unacked).
    pub fn set_paused(&self, tablet: Option<&TabletId>, paused: bool) -> Result<()> {
        let affected = match tablet {
            Some(t) => vec![self
                .tablet(t)
                .with_context(|| format!("unknown tablet {t}"))?],
            None => {
                self.shared.paused_all.store(paused, Ordering::SeqCst);
                self.tablets()
            }
        };
        for ti in &affected {
            ti.paused.store(paused, Ordering::SeqCst);
        }
        if paused {
            for ti in &affected {
                drop(lock(&ti.write_gate));
            }
        }
        Ok(())
    }

    /// Refuses shipper connections from now on and closes the current ones (cutover,
    /// shutdown). Frames already queued are still written.
    pub fn close(&self, reason: &str) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.endpoint
            .close(quinn::VarInt::from_u32(1), reason.as_bytes());
    }

    /// Refuses every tablet to every shipper from now on, with `reason` (a cutover), and
    /// closes the live connections with it. Shippers keep a clear error in their status.
    pub fn refuse(&self, reason: &str) {
        *lock(&self.shared.refusal) = Some(reason.to_string());
        let conns: Vec<quinn::Connection> = lock(&self.shared.conns).values().cloned().collect();
        for c in conns {
            c.close(quinn::VarInt::from_u32(2), reason.as_bytes());
        }
    }

    /// The reason shippers are refused, after [`Intake::refuse`].
    pub fn refusal(&self) -> Option<String> {
        lock(&self.shared.refusal).clone()
    }

    /// Closes, waits for the writer threads to finish their queues and sync.
    pub async fn shutdown(&self) {
        self.close("applier shutting down");
        let _ = tokio::time::timeout(Duration::from_secs(5), self.endpoint.wait_idle()).await;
        let tablets = std::mem::take(&mut *lock(&self.shared.tablets));
        for t in tablets.values() {
            t.stop.store(true, Ordering::SeqCst);
        }
        let handles: Vec<_> = tablets
            .values()
            .filter_map(|t| lock(&t.thread).take())
            .collect();
        drop(tablets);
        let _ = tokio::task::spawn_blocking(move || {
            for h in handles {
                let _ = h.join();
            }
        })
        .await;
    }

    async fn accept_loop(self) {
        while let Some(incoming) = self.endpoint.accept().await {
            if self.shared.closed.load(Ordering::SeqCst) {
                incoming.refuse();
                continue;
            }
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let remote = incoming.remote_address();
                match incoming.await {
                    Ok(conn) => {
                        let id = shared.conn_ids.fetch_add(1, Ordering::Relaxed);
                        lock(&shared.conns).insert(id, conn.clone());
                        // Every line logged for this connection names it (and, once its
                        // Hello is read, its shipper).
                        let span = tracing::info_span!("conn", conn = id, %remote, shipper = tracing::field::Empty);
                        let served = serve_connection(shared.clone(), conn, id)
                            .instrument(span)
                            .await;
                        if let Err(e) = served {
                            tracing::info!(conn = id, %remote, "shipper connection ended: {e:#}");
                        }
                        lock(&shared.conns).remove(&id);
                        shared.release(id);
                    }
                    Err(e) => {
                        let why = e.to_string();
                        let ca = shared.opts.ca_file.as_deref();
                        let msg = tidelog_net::tls::refusal::client_refused(&why, ca);
                        tracing::warn!(%remote, "{msg}");
                    }
                }
            });
        }
    }
}

/// Whether the received logs' file system takes `O_DIRECT`; a warning when it does not.
fn direct_io_supported(root: &std::path::Path) -> bool {
    let ok = tidelog_wal::direct_io_supported(root);
    if !ok {
        tracing::warn!(dir = %root.display(), "the file system refuses O_DIRECT: received logs are written through the page cache");
    }
    ok
}
