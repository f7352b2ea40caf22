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
//! checks. Here: `serve.rs` runs a connection's streams, `writer.rs` a tablet's received
//! log and its writer thread, `state.rs` what status shows; this file the intake's front
//! door and its tablets.
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
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use bytes::Bytes;
use tidelog_proto::intake::{Claims, Durable};
use tidelog_wal::{Heartbeat, HybridTime, SyncPolicy, TabletId, WalOptions, WalPos, Writer};
use tokio::sync::watch;
use tracing::Instrument;

use crate::frame_queue::FrameQueue;
use crate::latency::{HistogramSnapshot, LatencyHistogram};
use crate::tls::{server_config, TlsMaterial};

mod serve;
mod state;
mod writer;

use serve::serve_connection;
pub use state::{IntakeActivity, TabletState, BACKLOG_FRAME, RECEIVED_CACHE_KEEP};
pub use writer::recover_received_logs;
use writer::{writer_thread, ReceivedLog};

/// What the intake needs to run.
#[derive(Clone, Debug)]
pub struct IntakeOptions {
    pub listen: SocketAddr,
    pub data_dir: PathBuf,
    /// `always`: sync every frame before its ack; `batch`: one sync per group of queued
    /// frames (group commit); `none`: ack once written (a machine crash may lose acked data).
    pub sync: SyncPolicy,
    pub segment_size: u64,
    pub applier_id: String,
    pub quic: tidelog_net::QuicTuning,
    /// Frames queued per tablet between the stream and its writer thread.
    pub queue_frames: usize,
    /// Write the received logs with `O_DIRECT` (`WalOptions::direct_io`). Where the file
    /// system refuses it, the logs are written through the page cache, with a warning.
    pub direct_io: bool,
    /// Without `direct_io`: while a shipper catches up ([`IntakeActivity::catching_up`]),
    /// the received-log segments begun are written with `O_DIRECT`, and through the page
    /// cache again once the catch-up is over (`Writer::set_direct_io`). A live stream's
    /// small frames keep the page cache, where apply reads them back at once.
    pub direct_io_in_catch_up: bool,
    /// A data frame whose safe time or record ht is further ahead of this host's clock is
    /// refused (see the module doc). Default 500 ms.
    pub max_clock_skew: Duration,
    /// The file the CA of the TLS material came from, named when a shipper's certificate
    /// is refused (default none).
    pub ca_file: Option<PathBuf>,
}

impl IntakeOptions {
    pub fn new(listen: SocketAddr, data_dir: PathBuf) -> IntakeOptions {
        IntakeOptions {
            listen,
            data_dir,
            sync: SyncPolicy::Batch,
            segment_size: 64 << 20,
            applier_id: "tidelog-applier".into(),
            quic: tidelog_net::QuicTuning::default(),
            queue_frames: 64,
            direct_io: false,
            direct_io_in_catch_up: false,
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            ca_file: None,
        }
    }

    /// The options of each received log's writer (`direct_io` as the file system allows).
    pub fn wal_options(&self, direct_io: bool) -> WalOptions {
        WalOptions {
            segment_size: self.segment_size,
            // Written with `append_encoded` only (through the file): nothing to pre-fault.
            prefault: false,
            direct_io,
            ..WalOptions::default()
        }
    }

    /// What [`Intake::start`], or the writer of a tablet's received log later, would
    /// refuse in these options (a segment size outside the WAL's limits).
    pub fn validate(&self) -> Result<()> {
        self.wal_options(self.direct_io)
            .validate()
            .map_err(anyhow::Error::from)
    }
}

/// Called after each durable append to a tablet's received log (wakes the apply stage),
/// and for every tablet a shipper announces in a `Hello` (its own lane's and the others',
/// `all_tablets`) before the intake answers, with the received log's durable end (the
/// intake's own tablets) or zero: the tablet exists and must count for the safe time from
/// now on, before any announced tablet's data is applied.
pub type DurableHook = Arc<dyn Fn(&TabletId, WalPos) + Send + Sync>;

/// Default of [`IntakeOptions::max_clock_skew`].
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_millis(500);

/// One frame on its way to the writer thread.
struct WriteReq {
    stream: u64,
    first: WalPos,
    payload: Bytes,
}

/// The intake side of one tablet.
#[derive(Debug)]
pub struct TabletIntake {
    pub tablet: TabletId,
    /// The received log's end when this process opened it: `records` and `bytes` count
    /// what was written after it.
    opened_at: WalPos,
    /// Which connection owns which tablet (the intake's, shared by its tablets).
    claims: Arc<Mutex<Claims>>,
    state: AtomicU8,
    paused: AtomicBool,
    received_pos: AtomicU64,
    safe_time: AtomicU64,
    records: AtomicU64,
    bytes: AtomicU64,
    last_frame_ms: AtomicU64,
    queue: Arc<FrameQueue<WriteReq>>,
    durable: watch::Receiver<Durable>,
    thread: Mutex<Option<JoinHandle<()>>>,
    last_error: Mutex<Option<String>>,
    /// `last_error` is set (read on every frame without taking its lock).
    has_error: AtomicBool,
    /// Why the last data frame was refused for clock skew, until one passes the check.
    skew: Mutex<Option<String>>,
    /// Set at shutdown: the writer thread finishes its queue and exits.
    stop: AtomicBool,
    /// Held by the writer thread from its check of `paused` until its group is written and
    /// published, so that [`Intake::set_paused`] can wait out a group in progress: once a
    /// pause answers, nothing more reaches the received log.
    write_gate: Mutex<()>,
    /// Beats once per writer-thread iteration (at least every 50 ms while idle).
    heartbeat: Heartbeat,
    /// Frames refused as malformed (bad header or body, bad record, wrong position).
    frame_errors: AtomicU64,
    /// Of those, frames whose message or record checksum did not match.
    checksum_errors: AtomicU64,
    /// Age of the newest record of each group when it became durable (the `received` lag
    /// stage).
    received_age: LatencyHistogram,
}

impl std::fmt::Debug for WriteReq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WriteReq({}, {} bytes)", self.first, self.payload.len())
    }
}

/// A snapshot of one tablet for status.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TabletIntakeStatus {
    pub received_pos: u64,
    pub safe_time: u64,
    pub records: u64,
    pub bytes: u64,
    pub state: &'static str,
    pub shipper: Option<String>,
    pub last_frame_ms_ago: Option<u64>,
    pub error: Option<String>,
}

impl TabletIntake {
    /// The received log's end when this process opened it; the record and byte counts of
    /// [`TabletIntake::status`] are of what was received after it.
    pub fn opened_at(&self) -> WalPos {
        self.opened_at
    }

    pub fn received_pos(&self) -> WalPos {
        WalPos(self.received_pos.load(Ordering::Acquire))
    }
    pub fn safe_time(&self) -> HybridTime {
        HybridTime(self.safe_time.load(Ordering::Acquire))
    }
    pub fn state(&self) -> TabletState {
        if self.paused.load(Ordering::Relaxed) {
            return TabletState::Paused;
        }
        let st = TabletState::from_u8(self.state.load(Ordering::Relaxed));
        if !matches!(st, TabletState::Failed | TabletState::DiskFull) && lock(&self.skew).is_some()
        {
            return TabletState::ClockSkew;
        }
        st
    }

    /// Why the tablet's frames are refused for clock skew, if the last data frame was.
    pub fn clock_skew(&self) -> Option<String> {
        lock(&self.skew).clone()
    }

    /// Records the outcome of a data frame's clock-skew check (`None`: it passed).
    fn set_clock_skew(&self, reason: Option<String>) {
        let mut g = lock(&self.skew);
        match (&*g, &reason) {
            (Some(_), None) => {
                tracing::info!(tablet = %self.tablet, "a data frame is within max-clock-skew again: clock_skew cleared");
            }
            (None, Some(r)) => tracing::warn!(tablet = %self.tablet, "{r}"),
            _ => {}
        }
        *g = reason;
    }
    /// When the tablet's writer thread last went round its loop (it waits at most 50 ms for
    /// a frame, so a healthy idle writer beats at least that often).
    pub fn last_progress(&self) -> Instant {
        self.heartbeat.last()
    }

    /// Whether the writer thread still runs (false once the received log failed, or after
    /// shutdown).
    pub fn writer_running(&self) -> bool {
        lock(&self.thread)
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Frames refused as malformed since start: (all of them, those with a bad checksum).
    pub fn frame_errors(&self) -> (u64, u64) {
        (
            self.frame_errors.load(Ordering::Relaxed),
            self.checksum_errors.load(Ordering::Relaxed),
        )
    }

    /// How old each durable group's newest record was when it became durable.
    pub fn received_age(&self) -> HistogramSnapshot {
        self.received_age.snapshot()
    }

    /// Records `e` as the tablet's error (status shows it until the condition ends).
    fn set_error(&self, e: impl Into<String>) {
        *lock(&self.last_error) = Some(e.into());
        self.has_error.store(true, Ordering::Release);
    }

    /// The error shown so far no longer holds.
    fn clear_error(&self) {
        if self.has_error.swap(false, Ordering::AcqRel) {
            *lock(&self.last_error) = None;
        }
    }

    /// A stream delivered a frame or keep-alive: the shipper ships again, so what it
    /// reported before (`needs_bootstrap`) or a stream that was refused is over. A failed or
    /// full received log keeps its error: that ends only on the writer's side.
    fn shipping_again(&self) {
        let st = TabletState::from_u8(self.state.load(Ordering::Relaxed));
        if matches!(st, TabletState::Failed | TabletState::DiskFull) {
            return;
        }
        if st == TabletState::NeedsBootstrap {
            let _ = self.state.compare_exchange(
                TabletState::NeedsBootstrap as u8,
                TabletState::Streaming as u8,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
        if self.has_error.load(Ordering::Acquire) {
            tracing::info!(tablet = %self.tablet, "shipping again: earlier error cleared");
            self.clear_error();
        }
    }

    /// Counts a refused frame; `checksum` when a checksum did not match.
    fn count_frame_error(&self, checksum: bool) {
        self.frame_errors.fetch_add(1, Ordering::Relaxed);
        if checksum {
            self.checksum_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub fn status(&self) -> TabletIntakeStatus {
        let last = self.last_frame_ms.load(Ordering::Relaxed);
        TabletIntakeStatus {
            received_pos: self.received_pos().0,
            safe_time: self.safe_time().0,
            records: self.records.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            state: self.state().name(),
            shipper: lock(&self.claims)
                .owner(&self.tablet)
                .map(|o| o.shipper_id.clone()),
            last_frame_ms_ago: (last > 0).then(|| now_ms().saturating_sub(last)),
            error: self.clock_skew().or_else(|| lock(&self.last_error).clone()),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[derive(Debug)]
struct Shared {
    opts: IntakeOptions,
    tablets: Mutex<BTreeMap<TabletId, Arc<TabletIntake>>>,
    /// Which live connection ships each tablet (one shipper per tablet).
    claims: Arc<Mutex<Claims>>,
    conn_ids: AtomicU64,
    stream_ids: AtomicU64,
    /// Intake stopped (pause of all, or promote): new connections are refused.
    closed: AtomicBool,
    paused_all: AtomicBool,
    hook: Mutex<Hook>,
    /// Set by a cutover: every tablet a shipper announces is refused with this reason.
    refusal: Mutex<Option<String>>,
    /// Live shipper connections, so a cutover can close them.
    conns: Mutex<BTreeMap<u64, quinn::Connection>>,
    activity: Arc<IntakeActivity>,
    /// The received logs are written with `O_DIRECT`: asked for, and the file system takes
    /// it.
    direct_io: bool,
    /// Their segments begun during a catch-up are (asked for, and the file system takes it).
    direct_io_in_catch_up: bool,
}

struct Hook(Option<DurableHook>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Hook(set)"
        } else {
            "Hook(none)"
        })
    }
}

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
        let sc = server_config(tls, &opts.quic)?;
        let ec = crate::tls::endpoint_config(&opts.data_dir)?;
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
            hook: Mutex::new(Hook(hook)),
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
                        let ca = shared
                            .opts
                            .ca_file
                            .as_ref()
                            .map_or("the configured CA".to_string(), |p| p.display().to_string());
                        match tidelog_net::CertRefusal::of(&why) {
                            Some(tidelog_net::CertRefusal::OtherCa) => tracing::warn!(
                                %remote,
                                "shipper refused: its certificate is not signed by the configured CA (ca = {ca}) ({why})"
                            ),
                            Some(_) => tracing::warn!(
                                %remote,
                                "shipper refused: its certificate is not acceptable ({why})"
                            ),
                            None => tracing::warn!(%remote, "shipper handshake failed: {why}"),
                        }
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

impl Shared {
    /// The tablet's intake, creating it (and its received log) on first use.
    fn tablet(self: &Arc<Self>, t: &TabletId) -> Result<Arc<TabletIntake>> {
        let mut map = lock(&self.tablets);
        if let Some(ti) = map.get(t) {
            return Ok(ti.clone());
        }
        let log = ReceivedLog {
            root: self.opts.data_dir.join("received"),
            tablet: t.clone(),
            opts: self.opts.wal_options(self.direct_io),
        };
        // A log that cannot be created for lack of space still makes a tablet, shown with
        // the path and the space it needs; its writer thread opens the log once there is.
        let (writer, initial_error) = match log.open() {
            Ok(w) => (Some(w), None),
            Err(e) => match log.no_space(&e) {
                Some(msg) => {
                    tracing::error!(tablet = %t, "received log: {msg}; intake waits for space");
                    (None, Some(msg))
                }
                None => {
                    return Err(anyhow::Error::from(e)
                        .context(format!("opening the received log of tablet {t}")))
                }
            },
        };
        let start = writer.as_ref().map_or(WalPos::ZERO, Writer::written_pos);
        let start_ht = writer
            .as_ref()
            .and_then(Writer::last_ht)
            .unwrap_or_default();
        let state = match writer {
            Some(_) => TabletState::Disconnected,
            None => TabletState::DiskFull,
        };
        let queue = Arc::new(FrameQueue::new(self.opts.queue_frames));
        let (dtx, drx) = watch::channel(Durable {
            pos: start,
            safe_time: start_ht,
            error: None,
        });
        let ti = Arc::new(TabletIntake {
            tablet: t.clone(),
            opened_at: start,
            claims: self.claims.clone(),
            state: AtomicU8::new(state as u8),
            paused: AtomicBool::new(self.paused_all.load(Ordering::SeqCst)),
            received_pos: AtomicU64::new(start.0),
            safe_time: AtomicU64::new(start_ht.0),
            records: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            last_frame_ms: AtomicU64::new(0),
            queue: queue.clone(),
            durable: drx,
            thread: Mutex::new(None),
            last_error: Mutex::new(initial_error.clone()),
            has_error: AtomicBool::new(initial_error.is_some()),
            skew: Mutex::new(None),
            stop: AtomicBool::new(false),
            heartbeat: Heartbeat::new(),
            write_gate: Mutex::new(()),
            frame_errors: AtomicU64::new(0),
            checksum_errors: AtomicU64::new(0),
            received_age: LatencyHistogram::new(),
        });
        let (ti2, shared) = (ti.clone(), self.clone());
        let sync = self.opts.sync;
        let h = std::thread::Builder::new()
            .name(format!("recv-{t}"))
            .spawn(move || writer_thread(writer, log, &queue, dtx, ti2, shared, sync))
            .context("spawning a writer thread")?;
        *lock(&ti.thread) = Some(h);
        map.insert(t.clone(), ti.clone());
        tracing::info!(tablet = %t, received = %start, "tablet intake ready");
        Ok(ti)
    }

    fn owned_by(&self, ti: &TabletIntake, conn_id: u64) -> bool {
        lock(&self.claims).owned_by(&ti.tablet, conn_id)
    }

    /// Connection `conn_id` ended: its tablets are free, and no longer streaming.
    fn release(&self, conn_id: u64) {
        let freed = lock(&self.claims).release(conn_id);
        let tablets = lock(&self.tablets);
        for ti in freed.iter().filter_map(|t| tablets.get(t)) {
            let _ = ti.state.compare_exchange(
                TabletState::Streaming as u8,
                TabletState::Disconnected as u8,
                Ordering::SeqCst,
                Ordering::SeqCst,
            );
        }
    }
}
