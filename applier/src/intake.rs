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
use tidelog_net::tls::{server_config, TlsMaterial};
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::wire::{self, Message, MsgKind, WelcomeTablet, MSG_HEADER_LEN};
use tidelog_wal::{Heartbeat, HybridTime, SyncPolicy, TabletId, WalOptions, WalPos, Writer};
use tokio::sync::watch;
use tracing::Instrument;

use crate::frame_queue::{FrameQueue, PushError};
use crate::latency::{HistogramSnapshot, LatencyHistogram};

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
    pub quic: wire::QuicTuning,
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
            quic: wire::QuicTuning::default(),
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

/// Tablet intake states, as shown in status (their names in snake_case).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::FromRepr, strum::VariantArray, strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum TabletState {
    /// Registered, no shipper connected.
    Disconnected = 0,
    /// A shipper streams it.
    Streaming = 1,
    /// The shipper reported that the source no longer has what we need.
    NeedsBootstrap = 2,
    /// The received log failed (I/O); intake for it stopped.
    Failed = 3,
    /// Intake paused by the operator.
    Paused = 4,
    /// Frames refused: their hts are beyond this host's clock plus `max-clock-skew`.
    ClockSkew = 5,
    /// The received log cannot be written for lack of space (the error names the path):
    /// intake stopped, nothing of the frames in question acked; it resumes on its own once
    /// space returns.
    DiskFull = 6,
}

impl TabletState {
    /// Every state, in their numbering order (the metrics export each).
    pub const ALL: &'static [TabletState] = <TabletState as strum::VariantArray>::VARIANTS;

    /// `disconnected`, `streaming`, `needs_bootstrap`, … as status shows it.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The state stored as `v` (`disconnected` for anything unknown).
    fn from_u8(v: u8) -> TabletState {
        TabletState::from_repr(v).unwrap_or(TabletState::Disconnected)
    }
}

#[cfg(test)]
#[test]
fn tablet_state_all_lists_every_state_once() {
    let all: Vec<_> = (0..TabletState::ALL.len() as u8)
        .map(TabletState::from_u8)
        .collect();
    assert_eq!(all, TabletState::ALL);
    // Past the last one, `from_u8` falls back to the first.
    assert_eq!(
        TabletState::from_u8(TabletState::ALL.len() as u8),
        TabletState::ALL[0]
    );
}

/// Only frames of a backlog's size count as a catch-up, and only for a while.
#[cfg(test)]
#[test]
fn small_frames_are_not_a_catch_up_and_a_large_one_is_for_a_while() {
    // An epoch well in the past, so that "long ago" can be set below.
    let a = IntakeActivity {
        epoch: Instant::now()
            .checked_sub(Duration::from_secs(10))
            .unwrap_or_else(Instant::now),
        last_backlog_ms: AtomicU64::new(0),
    };
    assert!(!a.catching_up(), "nothing received yet");
    a.group_durable(BACKLOG_FRAME - 1);
    assert!(!a.catching_up(), "a frame below the backlog size");
    a.group_durable(BACKLOG_FRAME);
    assert!(a.catching_up());
    // Moved back past the window, as if made durable long ago.
    a.last_backlog_ms
        .store(a.now_ms() - 1000, Ordering::Relaxed);
    assert!(!a.catching_up(), "a large frame long ago");
}

#[derive(Clone, Debug)]
struct Owner {
    shipper_id: String,
    conn_id: u64,
    remote: SocketAddr,
}

/// When the intake last made a large frame durable: one of at least [`BACKLOG_FRAME`]
/// bytes, which a shipper sends only when it has that much to send at once — a transfer
/// that is behind the source (a catch-up after an outage, a bulk load). A shipper that keeps
/// up sends what was made durable since its last read, frames of a few KiB at tens of
/// thousands of transactions a second. With the apply threads' own state (their last
/// batches were full) it tells a catch-up in progress, during which the apply threads can
/// be told to hold back ([`crate::apply::ApplyThreads::yield_to_intake`]): durable receipt
/// (what a disaster loses) goes before target freshness.
#[derive(Debug)]
pub struct IntakeActivity {
    epoch: Instant,
    /// Milliseconds since `epoch` (+1) of the last large durable frame; 0: none yet.
    last_backlog_ms: AtomicU64,
}

impl Default for IntakeActivity {
    fn default() -> Self {
        IntakeActivity {
            epoch: Instant::now(),
            last_backlog_ms: AtomicU64::new(0),
        }
    }
}

/// Bytes of each received log below its durable end kept in the page cache (with buffered
/// received logs); an apply stage further behind reads with `O_DIRECT`.
pub const RECEIVED_CACHE_KEEP: u64 = 64 << 20;

/// A frame this large shows a shipper sending a backlog (its default frame is 1 MiB).
pub const BACKLOG_FRAME: usize = 256 << 10;
/// A large frame made durable within this long counts as a catch-up in progress.
const BACKLOG_WINDOW: Duration = Duration::from_millis(100);

impl IntakeActivity {
    /// Whether a frame of at least [`BACKLOG_FRAME`] bytes was made durable within the
    /// last 100 ms.
    pub fn catching_up(&self) -> bool {
        let last = self.last_backlog_ms.load(Ordering::Relaxed);
        last > 0 && self.now_ms().saturating_sub(last) < BACKLOG_WINDOW.as_millis() as u64
    }

    fn now_ms(&self) -> u64 {
        // +1: 0 means "never".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Records a durable group whose largest frame had `largest` payload bytes.
    pub(crate) fn group_durable(&self, largest: usize) {
        if largest >= BACKLOG_FRAME {
            self.last_backlog_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }
}

/// One frame on its way to the writer thread.
struct WriteReq {
    stream: u64,
    first: WalPos,
    payload: Bytes,
}

/// What the writer thread publishes after each group.
#[derive(Clone, Debug, Default)]
struct Durable {
    pos: WalPos,
    safe_time: HybridTime,
    /// The last refused frame: (stream id, code, reason).
    error: Option<(u64, &'static str, String)>,
}

/// The intake side of one tablet.
#[derive(Debug)]
pub struct TabletIntake {
    pub tablet: TabletId,
    /// The received log's end when this process opened it: `records` and `bytes` count
    /// what was written after it.
    opened_at: WalPos,
    owner: Mutex<Option<Owner>>,
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
            shipper: lock(&self.owner).as_ref().map(|o| o.shipper_id.clone()),
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
/// bytes (`quic.udp-receive-buffer`, [`tidelog_wal::wire::bind_udp`]). Must run inside a
/// tokio runtime.
pub fn server_endpoint(
    listen: SocketAddr,
    ec: quinn::EndpointConfig,
    sc: quinn::ServerConfig,
    rcvbuf: u64,
) -> std::io::Result<(quinn::Endpoint, tidelog_wal::wire::UdpReceiveBuffer)> {
    let (socket, got) = tidelog_wal::wire::bind_udp(listen, rcvbuf)?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| std::io::Error::other("no async runtime for the QUIC endpoint"))?;
    Ok((quinn::Endpoint::new(ec, Some(sc), socket, runtime)?, got))
}

/// The running intake.
#[derive(Debug, Clone)]
pub struct Intake {
    shared: Arc<Shared>,
    endpoint: quinn::Endpoint,
    rcvbuf: tidelog_wal::wire::UdpReceiveBuffer,
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
    pub fn udp_receive_buffer(&self) -> tidelog_wal::wire::UdpReceiveBuffer {
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
            owner: Mutex::new(None),
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

    /// Claims `t` for a connection; an error names the live owner.
    fn claim(
        &self,
        ti: &TabletIntake,
        shipper_id: &str,
        conn_id: u64,
        remote: SocketAddr,
    ) -> Result<(), String> {
        let mut o = lock(&ti.owner);
        if let Some(cur) = o.as_ref() {
            if cur.conn_id != conn_id && cur.shipper_id != shipper_id {
                return Err(format!(
                    "tablet {} is already shipped by live shipper {:?} from {}; refused for shipper {:?}",
                    ti.tablet, cur.shipper_id, cur.remote, shipper_id
                ));
            }
        }
        // The same shipper reconnecting takes over from its old (maybe half-dead) connection.
        *o = Some(Owner {
            shipper_id: shipper_id.to_string(),
            conn_id,
            remote,
        });
        Ok(())
    }

    fn owned_by(&self, ti: &TabletIntake, conn_id: u64) -> bool {
        lock(&ti.owner)
            .as_ref()
            .is_some_and(|o| o.conn_id == conn_id)
    }

    fn release(&self, conn_id: u64) {
        for ti in lock(&self.tablets).values() {
            let mut o = lock(&ti.owner);
            if o.as_ref().is_some_and(|o| o.conn_id == conn_id) {
                *o = None;
                let _ = ti.state.compare_exchange(
                    TabletState::Streaming as u8,
                    TabletState::Disconnected as u8,
                    Ordering::SeqCst,
                    Ordering::SeqCst,
                );
            }
        }
    }
}

/// Recovers every received log under `data_dir/received/` as opening it for writing does
/// (a torn tail, e.g. a segment truncated while the applier was down, is cut at its last
/// valid record; `wal/FORMAT.md`), before anything reads them: the store rebuilds what it
/// keeps in memory from them when it opens, and must see them as the intake will write on.
/// A log that cannot be opened for lack of space is left to the intake (its tablet shows
/// `disk_full`).
pub fn recover_received_logs(opts: &IntakeOptions) -> Result<()> {
    let root = opts.data_dir.join("received");
    if !root.is_dir() {
        return Ok(());
    }
    let wopts = opts.wal_options(false);
    for t in tidelog_wal::reader::list_tablets(&root)
        .with_context(|| format!("listing {}", root.display()))?
    {
        let log = ReceivedLog {
            root: root.clone(),
            tablet: t.clone(),
            opts: wopts.clone(),
        };
        match log.open() {
            Ok(w) => {
                let cut = w.recovery_report().dropped_bytes;
                w.close()
                    .with_context(|| format!("closing the received log of tablet {t}"))?;
                if cut > 0 {
                    tracing::warn!(tablet = %t, dropped_bytes = cut,
                        "received log: a torn tail was cut at the last valid record; the shipper sends it again");
                }
            }
            Err(e) if log.no_space(&e).is_some() => {}
            Err(e) => {
                return Err(anyhow::Error::from(e)
                    .context(format!("recovering the received log of tablet {t}")))
            }
        }
    }
    Ok(())
}

/// One tablet's received log: where it lives and how it is opened.
#[derive(Debug)]
struct ReceivedLog {
    root: PathBuf,
    tablet: TabletId,
    opts: WalOptions,
}

impl ReceivedLog {
    fn open(&self) -> tidelog_wal::Result<Writer> {
        Writer::open(&self.root, &self.tablet, self.opts.clone())
    }

    fn dir(&self) -> PathBuf {
        self.root.join(self.tablet.as_str())
    }

    /// Bytes that must be free before writing is tried again: a whole segment (the next
    /// write may have to preallocate one).
    fn space_needed(&self) -> u64 {
        self.opts.segment_size
    }

    /// The message of `e` when it failed for lack of space ("no space left on device at
    /// <path>: …"); `None` for any other failure.
    fn no_space(&self, e: &tidelog_wal::Error) -> Option<String> {
        let path = crate::disk::wal_no_space(e)?;
        let dir = path.parent().unwrap_or(path);
        let op = match e {
            tidelog_wal::Error::Io { op, .. } => *op,
            _ => "write",
        };
        Some(match op {
            "preallocate" | "set length of" => {
                let free = crate::disk::free_bytes(dir)
                    .map_or_else(|_| "?".to_string(), |f| f.to_string());
                format!(
                    "no space left on device at {}: segment cannot be preallocated: needs {} bytes, {free} free at {}",
                    path.display(),
                    self.space_needed(),
                    dir.display()
                )
            }
            op => crate::disk::no_space_message(path, &format!("{op} of the received log")),
        })
    }
}

/// Why a group of frames could not be made durable.
enum Failure {
    /// The device is full: retried once space returns.
    NoSpace(String),
    Other(String),
}

/// Stops the tablet's intake for a full disk: every stream of the tablet is ended with
/// `disk_full` and `msg` (nothing unacked is lost: the shipper resends it), status shows
/// the state and the message.
fn disk_full(ti: &TabletIntake, out: &watch::Sender<Durable>, msg: String) {
    let was = ti.state.swap(TabletState::DiskFull as u8, Ordering::SeqCst);
    if was != TabletState::DiskFull as u8 {
        tracing::error!(tablet = %ti.tablet, "received log: {msg}; intake stopped until space returns");
    }
    ti.set_error(msg.clone());
    out.send_modify(|d| d.error = Some((0, "disk_full", msg)));
}

/// Waits until [`ReceivedLog::space_needed`] bytes are free, with backoff, dropping the
/// frames that arrive meanwhile (never acked: the shipper sends them again). `false` when
/// the intake stops first.
fn wait_for_space(ti: &TabletIntake, queue: &FrameQueue<WriteReq>, log: &ReceivedLog) -> bool {
    let mut backoff = crate::disk::Backoff::default();
    let dir = log.dir();
    let mut dropped = Vec::new();
    loop {
        if crate::disk::free_bytes(&dir).is_ok_and(|f| f >= log.space_needed()) {
            return true;
        }
        let until = Instant::now() + backoff.failed();
        loop {
            ti.heartbeat.beat();
            if ti.stop.load(Ordering::SeqCst) {
                return false;
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            dropped.clear();
            queue.pop_into(left.min(Duration::from_millis(50)), &mut dropped, |_| true);
        }
    }
}

/// Space returned: the tablet takes streams again.
fn space_back(ti: &TabletIntake, out: &watch::Sender<Durable>) {
    let _ = ti.state.compare_exchange(
        TabletState::DiskFull as u8,
        TabletState::Disconnected as u8,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    ti.clear_error();
    out.send_modify(|d| d.error = None);
    tracing::info!(tablet = %ti.tablet, "received log writable again: intake resumes");
}

/// Opens the received log of a tablet created without one (no space for its first
/// segment) once there is space. `None` when the intake stops first or the log fails
/// for another reason (the tablet is then `failed`).
fn open_when_space(
    ti: &TabletIntake,
    queue: &FrameQueue<WriteReq>,
    out: &watch::Sender<Durable>,
    log: &ReceivedLog,
) -> Option<Writer> {
    loop {
        if !wait_for_space(ti, queue, log) {
            return None;
        }
        match log.open() {
            Ok(w) => {
                let (pos, ht) = (w.written_pos(), w.last_ht().unwrap_or_default());
                ti.received_pos.store(pos.0, Ordering::Release);
                ti.safe_time.store(ht.0, Ordering::Release);
                out.send_modify(|d| {
                    d.pos = pos;
                    d.safe_time = ht;
                });
                space_back(ti, out);
                return Some(w);
            }
            Err(e) => match log.no_space(&e) {
                Some(msg) => disk_full(ti, out, msg),
                None => {
                    let e = format!("opening the received log: {e}");
                    tracing::error!(tablet = %ti.tablet, "{e}; intake stopped");
                    ti.state.store(TabletState::Failed as u8, Ordering::SeqCst);
                    ti.set_error(e.clone());
                    out.send_modify(|d| d.error = Some((0, "io", e)));
                    return None;
                }
            },
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn writer_thread(
    w: Option<Writer>,
    log: ReceivedLog,
    queue: &FrameQueue<WriteReq>,
    out: watch::Sender<Durable>,
    ti: Arc<TabletIntake>,
    shared: Arc<Shared>,
    sync: SyncPolicy,
) {
    let tablet = ti.tablet.clone();
    let _span = tracing::info_span!("intake", tablet = %tablet).entered();
    let mut w = match w {
        Some(w) => w,
        None => match open_when_space(&ti, queue, &out, &log) {
            Some(w) => w,
            None => {
                queue.close();
                return;
            }
        },
    };
    let mut group: Vec<WriteReq> = Vec::new();
    // The stream whose frame was last refused: its stream is closed with that error, and
    // the frames it had queued behind the refused one are dropped unread (the shipper
    // resends from the durable end on a new stream).
    let mut refused: Option<u64> = None;
    'run: loop {
        ti.heartbeat.beat();
        group.clear();
        // `always`: one frame per sync; otherwise every frame queued meanwhile (up to 64 MiB).
        let mut bytes = 0usize;
        let taken = queue.pop_into(Duration::from_millis(50), &mut group, |r| {
            bytes += r.payload.len();
            sync != SyncPolicy::Always && bytes < (64 << 20)
        });
        if taken == 0 {
            if ti.stop.load(Ordering::SeqCst) {
                break;
            }
            continue;
        }
        // Frames read just before a pause are held here until it ends (or shutdown).
        let gate = loop {
            let g = lock(&ti.write_gate);
            if !ti.paused.load(Ordering::SeqCst) || ti.stop.load(Ordering::SeqCst) {
                break g;
            }
            drop(g);
            ti.heartbeat.beat();
            std::thread::sleep(Duration::from_millis(20));
        };
        if shared.direct_io_in_catch_up {
            if let Err(e) = w.set_direct_io(shared.activity.catching_up()) {
                tracing::warn!(tablet = %tablet, "received log: staying in the page cache: {e}");
            }
        }
        let mut error = None;
        // An I/O error while staging: nothing of the group may be committed or acked.
        let mut failure: Option<Failure> = None;
        let mut n_records = 0u64;
        let mut n_bytes = 0u64;
        let mut largest = 0usize;
        for req in group.drain(..) {
            if failure.is_some() {
                continue;
            }
            if refused == Some(req.stream) {
                continue;
            }
            if req.first != w.staged_pos() {
                ti.count_frame_error(false);
                refused = Some(req.stream);
                error = Some((
                    req.stream,
                    "bad_position",
                    format!(
                        "frame starts at {} but the received log of tablet {tablet} ends at {}; resume from there",
                        req.first,
                        w.staged_pos()
                    ),
                ));
                continue;
            }
            let appended = (|| {
                fail::fail_point!("intake::append", |_| Err(tidelog_wal::Error::Io {
                    op: "write",
                    path: w.dir().to_path_buf(),
                    source: std::io::Error::other("failpoint intake::append"),
                }));
                w.append_encoded(&req.payload)
            })();
            match appended {
                Ok((n, _)) => {
                    n_records += u64::from(n);
                    n_bytes += req.payload.len() as u64;
                    largest = largest.max(req.payload.len());
                }
                Err(
                    e
                    @ (tidelog_wal::Error::InvalidRecord(_) | tidelog_wal::Error::TooLarge { .. }),
                ) => {
                    // Refused by verification: nothing of the frame is staged. (Damage inside
                    // a record body passes the frame's sum and is caught here.)
                    ti.count_frame_error(e.to_string().contains("checksum"));
                    refused = Some(req.stream);
                    error = Some((
                        req.stream,
                        "corrupt_frame",
                        format!("corrupt frame on tablet {tablet}: {e}"),
                    ));
                }
                Err(e) => {
                    // I/O (e.g. rotating the segment): part of the frame may be staged.
                    failure = Some(match log.no_space(&e) {
                        Some(msg) => Failure::NoSpace(msg),
                        None => Failure::Other(format!("appending to the received log: {e}")),
                    });
                }
            }
        }
        let policy = match sync {
            SyncPolicy::None => SyncPolicy::None,
            _ => SyncPolicy::Always,
        };
        let res = (|| -> std::result::Result<(), Failure> {
            if let Some(f) = failure.take() {
                return Err(f);
            }
            // `return(MS)`: a sync that fails after MS milliseconds (a slow, failing disk).
            fail::fail_point!("intake::sync", |ms: Option<String>| {
                if let Some(ms) = ms.and_then(|m| m.parse::<u64>().ok()) {
                    std::thread::sleep(Duration::from_millis(ms));
                }
                Err(Failure::Other("failpoint intake::sync".to_string()))
            });
            w.commit(policy)
                .map(|_| ())
                .map_err(|e| match log.no_space(&e) {
                    Some(msg) => Failure::NoSpace(msg),
                    None => Failure::Other(e.to_string()),
                })
        })();
        match res {
            Ok(()) => {}
            Err(Failure::NoSpace(msg)) => {
                // Nothing of the group is acked; the streams end and the shipper resends
                // from the durable end once the tablet takes streams again.
                let _ = w.rollback();
                disk_full(&ti, &out, msg);
                // Nothing is written while waiting: a pause need not wait for the space.
                drop(gate);
                if !wait_for_space(&ti, queue, &log) {
                    break 'run;
                }
                space_back(&ti, &out);
                refused = None;
                continue 'run;
            }
            Err(Failure::Other(e)) => {
                // Never ack what is not durable: stop this tablet's intake.
                tracing::error!(tablet = %tablet, "received log write failed, intake stopped: {e}");
                let _ = w.rollback();
                ti.state.store(TabletState::Failed as u8, Ordering::SeqCst);
                ti.set_error(e.clone());
                out.send_modify(|d| d.error = Some((0, "io", e)));
                break 'run;
            }
        }
        // What apply reads soon stays in the page cache; what lies further back was applied,
        // or is read in bulk around the cache (`ApplyConfig::direct_backlog_reads`), and its
        // pages go to the next writes instead of fresh ones.
        if let Err(e) = w.drop_cached_below(RECEIVED_CACHE_KEEP) {
            tracing::debug!(tablet = %tablet, "dropping received bytes from the page cache: {e}");
        }
        let pos = w.written_pos();
        let ht = w.last_ht().unwrap_or_default();
        shared.activity.group_durable(largest);
        ti.received_pos.store(pos.0, Ordering::Release);
        ti.safe_time.store(ht.0, Ordering::Release);
        ti.records.fetch_add(n_records, Ordering::Relaxed);
        ti.bytes.fetch_add(n_bytes, Ordering::Relaxed);
        if n_records > 0 {
            ti.received_age.record_age(ht);
        }
        if let Some((_, _, e)) = &error {
            ti.set_error(e.clone());
        }
        out.send_modify(|d| {
            d.pos = pos;
            d.safe_time = ht;
            if error.is_some() {
                d.error = error.take();
            }
        });
        let hook = lock(&shared.hook).0.clone();
        if let Some(h) = hook {
            h(&tablet, pos);
        }
    }
    // Nothing more is written: a stream blocked on a full queue gets its frame back.
    queue.close();
    if let Err(e) = w.close() {
        tracing::warn!(tablet = %tablet, "closing the received log: {e}");
    }
}

/// Whether data frame `f` (records `payload`) is beyond this host's clock plus `max`: the
/// first record whose ht is, or else the frame's safe time, as the bytes of the payload
/// before it (whole records within the bound) and the reason; `None` when all are within.
/// The payload's checksum was verified; its records are walked by their headers only (a
/// malformed one ends the walk, and the writer refuses the frame for it).
fn beyond_clock(f: &wire::DataFrame, payload: &[u8], max: Duration) -> Option<(usize, String)> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let limit = now.saturating_add(max.as_micros() as u64);
    let describe = |what: String, ht: HybridTime| {
        let ahead = Duration::from_micros(ht.physical_micros().saturating_sub(now));
        let when = humantime::format_rfc3339_seconds(ht.to_system_time());
        format!(
            "tablet {}: {what} has ht {ht} ({when}), {} ahead of this applier's clock, beyond \
             max-clock-skew {}: refused, nothing of it written or acknowledged",
            f.tablet,
            fmt_duration(ahead),
            fmt_duration(max)
        )
    };
    let mut off = 0usize;
    while let Some(head) = payload.get(off..off + RECORD_HEADER_LEN) {
        let len = head
            .get(8..12)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)?;
        let ht = head
            .get(16..24)
            .and_then(|b| b.try_into().ok())
            .map(|b| HybridTime(u64::from_le_bytes(b)))?;
        if ht.physical_micros() > limit {
            let pos = f.first_pos.add(off as u64);
            let why = describe(format!("the record at received-log position {pos}"), ht);
            return Some((off, why));
        }
        off = off.checked_add(RECORD_HEADER_LEN + len as usize)?;
    }
    (f.safe_time.physical_micros() > limit).then(|| {
        let why = describe(
            format!("the frame at received-log position {}", f.first_pos),
            f.safe_time,
        );
        (0, why)
    })
}

/// `d` rounded to milliseconds, as humantime shows it (`86years 5months …`, `3s 500ms`).
fn fmt_duration(d: Duration) -> String {
    let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    humantime::format_duration(Duration::from_millis(ms)).to_string()
}

/// Reads one message from a QUIC stream. `Ok(None)` at a clean end of stream.
async fn read_msg(recv: &mut quinn::RecvStream) -> Result<Option<(Message, Bytes)>> {
    let mut head = [0u8; MSG_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let (kind, len, sum) = wire::decode_header(&head)?;
    // One copy out of quinn's buffers, no zeroing first (frames are up to a few MiB), and
    // as many of its chunks per call as have arrived: each call takes the connection's lock,
    // which its driver, on the other runtime thread, holds while it decrypts packets.
    let mut body = bytes::BytesMut::with_capacity(len);
    // A data frame's checksum is taken from its record headers as they arrive, while they
    // are in the cache (`wire::DataChecksum`).
    let data = matches!(kind, MsgKind::Data | MsgKind::KeepAlive) && len >= wire::DATA_HEADER_LEN;
    let mut summing: Option<wire::DataChecksum> = None;
    while body.len() < len {
        use bytes::BufMut;
        use tokio::io::AsyncReadExt;
        let want = len - body.len();
        let n = recv
            .read_buf(&mut (&mut body).limit(want))
            .await
            .map_err(read_error)?;
        if n == 0 {
            anyhow::bail!(
                "the stream ended {} bytes into a {len}-byte {kind:?} message body",
                body.len()
            );
        }
        if data && body.len() >= wire::DATA_HEADER_LEN {
            let (head, payload) = body.split_at(wire::DATA_HEADER_LEN);
            summing
                .get_or_insert_with(|| wire::DataChecksum::new(head))
                .advance(payload, len - wire::DATA_HEADER_LEN);
        }
    }
    let msg = match summing {
        Some(c) => {
            let computed = c.finish(&body[wire::DATA_HEADER_LEN..]);
            wire::decode_body_summed(kind, &body, sum, computed)?
        }
        None => wire::decode_body(kind, &body, sum)?,
    };
    let body = body.freeze();
    let payload = if kind == MsgKind::Data {
        body.slice(wire::DATA_HEADER_LEN..)
    } else {
        Bytes::new()
    };
    Ok(Some((msg, payload)))
}

/// quinn's read error back out of the `std::io::Error` its `AsyncRead` wraps it in, so a
/// stream or connection that ended is told apart from a bad frame.
fn read_error(e: std::io::Error) -> anyhow::Error {
    match e.downcast::<quinn::ReadError>() {
        Ok(r) => r.into(),
        Err(e) => anyhow::Error::from(e).context("reading the stream"),
    }
}

/// The clock-skew check finds the first record beyond the clock plus the bound, by its
/// position (the records before it are within), else a frame safe time beyond it; hts
/// within pass.
#[cfg(test)]
#[test]
fn frames_beyond_the_clock_plus_the_skew_bound_are_named_by_position() {
    use tidelog_wal::{Body, Record};
    let now = HybridTime::from_system_time(SystemTime::now());
    let skew = Duration::from_millis(500);
    let ahead = |d: Duration| HybridTime(now.0 + ((d.as_micros() as u64) << 12));
    let frame = |hts: &[HybridTime], safe: HybridTime| {
        let mut payload = Vec::new();
        let first = WalPos(4096);
        for ht in hts {
            let rec = Record::new(*ht, Body::Heartbeat);
            payload.extend(
                rec.encode(first.add(payload.len() as u64))
                    .unwrap_or_default(),
            );
        }
        let f = wire::DataFrame {
            tablet: "e1".parse().unwrap_or_else(|_| unreachable!()),
            first_pos: first,
            end_pos: first.add(payload.len() as u64),
            safe_time: safe,
            record_count: hts.len() as u32,
        };
        (f, payload)
    };
    let (f, p) = frame(&[now, ahead(Duration::from_millis(100))], now);
    assert_eq!(beyond_clock(&f, &p, skew), None);
    let (f, p) = frame(&[now, ahead(Duration::from_secs(5)), HybridTime::MAX], now);
    let (within, why) = beyond_clock(&f, &p, skew).unwrap_or_default();
    assert_eq!(within, 32, "the first record is within the bound");
    assert!(
        why.contains("tablet e1")
            && why.contains("record at received-log position 4128")
            && why.contains("max-clock-skew 500ms"),
        "{why}"
    );
    let (f, p) = frame(&[now], HybridTime::MAX);
    let (within, why) = beyond_clock(&f, &p, skew).unwrap_or_default();
    assert_eq!(within, 0);
    assert!(
        why.contains("frame at received-log position 4096")
            && why.contains("18446744073709551615")
            && why.contains("2112-"),
        "{why}"
    );
}

#[cfg(test)]
#[test]
fn a_stream_that_ended_is_still_told_apart_through_async_read() {
    let io: std::io::Error = quinn::ReadError::Reset(quinn::VarInt::from_u32(7)).into();
    let e = read_error(io);
    assert!(matches!(
        e.downcast_ref::<quinn::ReadError>(),
        Some(quinn::ReadError::Reset(_))
    ));
    let e = read_error(std::io::Error::other("something else"));
    assert!(e.downcast_ref::<quinn::ReadError>().is_none());
    assert!(format!("{e:#}").contains("something else"));
}

async fn serve_connection(
    shared: Arc<Shared>,
    conn: quinn::Connection,
    conn_id: u64,
) -> Result<()> {
    let (csend, crecv) = conn
        .accept_bi()
        .await
        .context("waiting for the control stream")?;
    tokio::select! {
        r = serve_control(shared.clone(), &conn, csend, crecv, conn_id) => r,
        r = accept_tablet_streams(shared.clone(), &conn, conn_id) => r,
        r = watch_silence(&conn, shared.opts.quic.silence_limit) => r,
    }
}

/// Ends a connection that has received nothing for `limit` (a SIGKILLed shipper's, whose
/// tablets would otherwise stay claimed and shown as streaming until the idle timeout).
async fn watch_silence(conn: &quinn::Connection, limit: Duration) -> Result<()> {
    let mut silence = wire::Silence::new(conn.stats().udp_rx.datagrams);
    let mut look = tokio::time::interval(wire::Silence::look_every(limit));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        look.tick().await;
        if let Some(quiet) = silence.exceeded(conn.stats().udp_rx.datagrams, limit) {
            conn.close(quinn::VarInt::from_u32(1), b"no packet from the shipper");
            anyhow::bail!(
                "no packet from the shipper for {:.1} s (limit {limit:?})",
                quiet.as_secs_f64()
            );
        }
    }
}

/// The control stream: Hello messages (the first, and any later one for new tablets).
async fn serve_control(
    shared: Arc<Shared>,
    conn: &quinn::Connection,
    mut csend: quinn::SendStream,
    mut crecv: quinn::RecvStream,
    conn_id: u64,
) -> Result<()> {
    let remote = conn.remote_address();
    let mut first = true;
    loop {
        let Some((msg, _)) = read_msg(&mut crecv).await? else {
            return Ok(());
        };
        let Message::Hello(h) = msg else {
            let e = wire::encode_error("protocol", "expected Hello on the control stream");
            let _ = csend.write_all(&e).await;
            anyhow::bail!("protocol: expected Hello on the control stream");
        };
        if first {
            tracing::Span::current().record("shipper", h.shipper_id.as_str());
            tracing::info!(conn = conn_id, %remote, shipper = %h.shipper_id, lane = h.lane,
                tablets = h.tablets.len(), "shipper connected");
            first = false;
        }
        let refusal = lock(&shared.refusal).clone();
        let hook = lock(&shared.hook).0.clone();
        if let (None, Some(hook)) = (&refusal, hook) {
            // Registering is a durable store write: off the runtime's threads.
            let mut announced: Vec<TabletId> = h.tablets.iter().map(|t| t.tablet.clone()).collect();
            announced.extend(h.all_tablets.iter().cloned());
            announced.sort();
            announced.dedup();
            let sh = shared.clone();
            tokio::task::spawn_blocking(move || {
                for t in &announced {
                    let pos = lock(&sh.tablets)
                        .get(t)
                        .map_or(WalPos::ZERO, |ti| ti.received_pos());
                    hook(t, pos);
                }
            })
            .await
            .context("registering the announced tablets")?;
        }
        let mut answer = Vec::new();
        for ht in &h.tablets {
            let claimed = match &refusal {
                Some(r) => Err(r.clone()),
                None => Ok(()),
            }
            .and_then(|()| shared.tablet(&ht.tablet).map_err(|e| format!("{e:#}")))
            .and_then(|ti| {
                shared
                    .claim(&ti, &h.shipper_id, conn_id, remote)
                    .map(|()| ti.received_pos())
            });
            answer.push(match claimed {
                Ok(resume) => WelcomeTablet {
                    tablet: ht.tablet.clone(),
                    resume: Some(resume),
                    refused: None,
                },
                Err(reason) => {
                    tracing::warn!(conn = conn_id, "{reason}");
                    WelcomeTablet {
                        tablet: ht.tablet.clone(),
                        resume: None,
                        refused: Some(reason),
                    }
                }
            });
        }
        let w = wire::Welcome {
            applier_id: shared.opts.applier_id.clone(),
            tablets: answer,
        };
        csend.write_all(&wire::encode_welcome(&w)).await?;
    }
}

async fn accept_tablet_streams(
    shared: Arc<Shared>,
    conn: &quinn::Connection,
    conn_id: u64,
) -> Result<()> {
    loop {
        let (send, recv) = conn.accept_bi().await?;
        let shared = shared.clone();
        tokio::spawn(
            async move {
                if let Err(e) = serve_tablet_stream(shared, send, recv, conn_id).await {
                    tracing::info!(conn = conn_id, "tablet stream ended: {e:#}");
                }
            }
            .in_current_span(),
        );
    }
}

async fn serve_tablet_stream(
    shared: Arc<Shared>,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    conn_id: u64,
) -> Result<()> {
    let Some((Message::Open(open), _)) = read_msg(&mut recv).await? else {
        let _ = send
            .write_all(&wire::encode_error("protocol", "expected Open"))
            .await;
        anyhow::bail!("protocol: a tablet stream must start with Open");
    };
    let tablet = open.tablet.clone();
    let ti = lock(&shared.tablets).get(&tablet).cloned();
    let Some(ti) = ti.filter(|ti| shared.owned_by(ti, conn_id)) else {
        let msg = format!("tablet {tablet} is not claimed by this connection (send Hello first)");
        let _ = send.write_all(&wire::encode_error("claimed", &msg)).await;
        anyhow::bail!("{msg}");
    };
    let stream_id = shared.stream_ids.fetch_add(1, Ordering::Relaxed);
    // A failed tablet stays failed (its writer thread is gone), and one whose disk is full
    // takes no stream until space returns: refuse the stream.
    let revived = ti
        .state
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
            (s != TabletState::Failed as u8 && s != TabletState::DiskFull as u8)
                .then_some(TabletState::Streaming as u8)
        });
    if let Err(was) = revived {
        let error = lock(&ti.last_error).clone().unwrap_or_default();
        let (code, reason) = if was == TabletState::DiskFull as u8 {
            (
                "disk_full",
                format!(
                    "the target's disk is full, intake of tablet {tablet} waits for space: {error}"
                ),
            )
        } else {
            (
                "io",
                format!("the received log of tablet {tablet} failed, intake stopped: {error}"),
            )
        };
        let _ = send.write_all(&wire::encode_error(code, &reason)).await;
        let _ = send.finish();
        let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
        anyhow::bail!("{reason}");
    }
    // The first Ack is the resume position.
    let mut durable = ti.durable.clone();
    let start = durable.borrow_and_update().clone();
    send.write_all(&wire::encode_ack(start.pos, start.safe_time))
        .await?;
    tracing::debug!(tablet = %tablet, conn = conn_id, from = %start.pos, "tablet stream open");
    let (etx, erx) = tokio::sync::mpsc::channel::<(&'static str, String)>(1);
    let r = async {
        tokio::select! {
            r = send_acks(&tablet, send, durable, start.pos, stream_id, erx) => r,
            r = receive_frames(&shared, &ti, recv, start.pos, stream_id, conn_id, etx) => r,
        }
    }
    .instrument(tracing::info_span!("stream", tablet = %tablet))
    .await;
    // Unless a newer connection (the shipper reconnected) has the tablet streaming by now.
    if ti.state() == TabletState::Streaming && shared.owned_by(&ti, conn_id) {
        ti.state
            .store(TabletState::Disconnected as u8, Ordering::SeqCst);
    }
    r
}

/// Sends one Ack per published durable end (batched by the watch channel), or the Error
/// that ends the stream.
async fn send_acks(
    tablet: &TabletId,
    mut send: quinn::SendStream,
    mut durable: watch::Receiver<Durable>,
    mut last: WalPos,
    stream_id: u64,
    mut errors: tokio::sync::mpsc::Receiver<(&'static str, String)>,
) -> Result<()> {
    loop {
        tokio::select! {
            changed = durable.changed() => {
                if changed.is_err() {
                    anyhow::bail!("intake of tablet {tablet} stopped");
                }
            }
            e = errors.recv() => {
                if let Some((code, reason)) = e {
                    let _ = send.write_all(&wire::encode_error(code, &reason)).await;
                    let _ = send.finish();
                    // Let the error reach the shipper before the stream is dropped.
                    let _ = tokio::time::timeout(Duration::from_secs(1), send.stopped()).await;
                    anyhow::bail!("{code}: {reason}");
                }
                // The receiving side ended cleanly.
                return Ok(());
            }
        }
        let d = durable.borrow_and_update().clone();
        if let Some((sid, code, reason)) = &d.error {
            if *sid == stream_id || *sid == 0 {
                let _ = send.write_all(&wire::encode_error(code, reason)).await;
                let _ = send.finish();
                anyhow::bail!("{code}: {reason}");
            }
        }
        if d.pos > last {
            send.write_all(&wire::encode_ack(d.pos, d.safe_time))
                .await?;
            last = d.pos;
        }
    }
}

/// Reads frames and queues them for the tablet's writer thread; a bad frame is reported
/// through `errors` and ends the stream (nothing of it is written).
async fn receive_frames(
    shared: &Arc<Shared>,
    ti: &Arc<TabletIntake>,
    mut recv: quinn::RecvStream,
    mut expect: WalPos,
    stream_id: u64,
    conn_id: u64,
    errors: tokio::sync::mpsc::Sender<(&'static str, String)>,
) -> Result<()> {
    let tablet = &ti.tablet;
    loop {
        while ti.paused.load(Ordering::Relaxed) {
            // Paused: stop reading; QUIC flow control holds the shipper back.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let msg = match read_msg(&mut recv).await {
            Ok(Some(m)) => m,
            Ok(None) => {
                // Keep acking what is queued until the shipper goes away.
                std::future::pending::<()>().await;
                return Ok(());
            }
            Err(e) => {
                // The stream or connection ended under us (a shipper stopping, a network
                // failure): not the frame's fault, and nobody to tell. A stream that ends
                // inside a message is a bad frame, below.
                let ended = e.downcast_ref::<quinn::ReadError>().is_some()
                    || matches!(
                        e.downcast_ref::<quinn::ReadExactError>(),
                        Some(quinn::ReadExactError::ReadError(_))
                    );
                if ended {
                    return Err(e.context(format!("tablet {tablet}: stream ended")));
                }
                if let Some(w) = e.downcast_ref::<wire::WireError>() {
                    ti.count_frame_error(matches!(
                        w,
                        wire::WireError::HeaderChecksum | wire::WireError::BodyChecksum { .. }
                    ));
                }
                let reason = format!("corrupt frame on tablet {tablet}: {e:#}");
                tracing::warn!(
                    conn = conn_id,
                    "{reason}; stream closed, nothing of it written"
                );
                ti.set_error(reason.clone());
                let _ = errors.send(("corrupt_frame", reason.clone())).await;
                std::future::pending::<()>().await;
                return Ok(());
            }
        };
        if !shared.owned_by(ti, conn_id) {
            let _ = errors
                .send((
                    "claimed",
                    format!("tablet {tablet} was taken over by another connection"),
                ))
                .await;
            std::future::pending::<()>().await;
        }
        match msg {
            (Message::Data(f), payload) => {
                if &f.tablet != tablet || f.first_pos != expect {
                    ti.count_frame_error(false);
                    let reason = format!(
                        "frame for tablet {} at {} on the stream of tablet {tablet} expecting {expect}",
                        f.tablet, f.first_pos
                    );
                    ti.set_error(reason.clone());
                    let _ = errors.send(("bad_position", reason)).await;
                    std::future::pending::<()>().await;
                }
                let mut refused = None;
                let mut payload = payload;
                if let Some((within, reason)) =
                    beyond_clock(&f, &payload, shared.opts.max_clock_skew)
                {
                    // The records before the first one beyond the bound are written (and
                    // acked); from it on nothing is: the shipper resends from the durable end
                    // on a new stream, and it is taken once it is within the bound.
                    ti.set_clock_skew(Some(reason.clone()));
                    refused = Some(reason);
                    payload = payload.slice(..within);
                } else {
                    ti.set_clock_skew(None);
                }
                expect = f.end_pos;
                ti.last_frame_ms.store(now_ms(), Ordering::Relaxed);
                if payload.is_empty() {
                    if let Some(reason) = refused {
                        let _ = errors.send(("clock_skew", reason)).await;
                        std::future::pending::<()>().await;
                    }
                    continue;
                }
                ti.shipping_again();
                let req = WriteReq {
                    stream: stream_id,
                    first: f.first_pos,
                    payload,
                };
                // Bounded queue: back-pressure onto the QUIC stream.
                let queued = match ti.queue.try_push(req) {
                    Ok(()) => true,
                    Err(PushError::Full(req)) => {
                        let q = ti.queue.clone();
                        matches!(
                            tokio::task::spawn_blocking(move || q.push(req)).await,
                            Ok(Ok(()))
                        )
                    }
                    Err(PushError::Closed(_)) => false,
                };
                if !queued {
                    anyhow::bail!("intake of tablet {tablet} stopped");
                }
                if let Some(reason) = refused {
                    let _ = errors.send(("clock_skew", reason)).await;
                    std::future::pending::<()>().await;
                }
            }
            (Message::KeepAlive(_), _) => {
                ti.last_frame_ms.store(now_ms(), Ordering::Relaxed);
                ti.shipping_again();
            }
            (Message::Error(e), _) => {
                if e.code == "needs_bootstrap" {
                    ti.state
                        .store(TabletState::NeedsBootstrap as u8, Ordering::SeqCst);
                }
                ti.set_error(format!("{}: {}", e.code, e.message));
                tracing::warn!(tablet = %tablet, code = %e.code, "shipper reports: {}", e.message);
            }
            (other, _) => {
                let reason =
                    format!("unexpected message on the stream of tablet {tablet}: {other:?}");
                ti.set_error(reason.clone());
                let _ = errors.send(("protocol", reason)).await;
                std::future::pending::<()>().await;
            }
        }
    }
}
