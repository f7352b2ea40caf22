//! `tidelog-shipper`: tails every tablet WAL under `wal_dir` and ships the bytes, as they
//! are on disk, over QUIC with mutual TLS to the applier (docs/ARCHITECTURE.md,
//! "Shipping").
//!
//! ```text
//!  Shipper ── lane 0 thread: runtime (tokio-uring | tokio+std), own endpoint + connection
//!         │      control stream: Hello(tablets) → Welcome(resume | refused)
//!         │      tablet task × n: Open → Ack(resume) → Data/KeepAlive ... ← Ack(durable)
//!         ├── lane 1 thread ...
//!         └── scanner thread: new tablet directories → their lane
//! ```
//!
//! The applier is the source of truth for where to resume: a restarted shipper keeps no
//! state. Acked positions are written to the source's `acked` files (for retention).
//! In-flight bytes per tablet are bounded by `window_bytes` on top of QUIC flow control.

pub mod io;
pub mod metrics;
pub mod tail;
mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rand::Rng;
use tidelog_wal::control::ControlView;
use tidelog_wal::wire::{self, HelloTablet, Message, MSG_HEADER_LEN};
use tidelog_wal::{Heartbeat, TabletId, WalPos};
use tokio::sync::{mpsc, Notify};

use crate::io::{IoChoice, IoEngine};
use crate::tail::{Tail, TailError};
pub use tidelog_net::tls::TlsMaterial;

/// What the shipper needs to run (the daemon maps `shipper.toml` onto this).
#[derive(Clone, Debug)]
pub struct ShipperOptions {
    pub wal_dir: PathBuf,
    pub applier: SocketAddr,
    pub server_name: String,
    pub shipper_id: String,
    pub io_engine: IoChoice,
    /// Lane threads (each with its own QUIC endpoint and connection); 0 = number of cores.
    pub lanes: usize,
    pub max_frame_bytes: usize,
    /// Bytes shipped but not yet acked, per tablet.
    pub window_bytes: u64,
    pub keepalive_interval: Duration,
    /// Longest wait between looks at an idle tablet's published end.
    pub poll_interval: Duration,
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
    /// Ship up to `written_pos` instead of `durable_pos`.
    pub ship_unsynced: bool,
    pub quic: wire::QuicTuning,
    /// How often `wal_dir` is scanned for new tablets anyway (inotify finds them at once
    /// where it is available).
    pub rescan_interval: Duration,
    /// How often the source's `acked` files are rewritten (each write is two fsyncs).
    pub acked_interval: Duration,
    /// The file the CA in [`TlsMaterial::ca`] came from, named when the applier's
    /// certificate is refused (default none).
    pub ca_file: Option<PathBuf>,
}

impl ShipperOptions {
    pub fn new(wal_dir: PathBuf, applier: SocketAddr) -> ShipperOptions {
        ShipperOptions {
            wal_dir,
            applier,
            server_name: "localhost".into(),
            shipper_id: "tidelog-shipper".into(),
            io_engine: IoChoice::Auto,
            lanes: 0,
            max_frame_bytes: 1 << 20,
            window_bytes: 16 << 20,
            keepalive_interval: Duration::from_millis(200),
            poll_interval: Duration::from_millis(1),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
            ship_unsynced: false,
            quic: wire::QuicTuning::default(),
            rescan_interval: Duration::from_secs(1),
            acked_interval: Duration::from_millis(500),
            ca_file: None,
        }
    }
}

/// How often a tablet stopped by a source it cannot read looks again.
const SOURCE_RETRY: Duration = Duration::from_secs(1);

/// Shipping states of a tablet, as shown in status.
///
/// | state | meaning |
/// | --- | --- |
/// | `connecting` | no stream to the applier yet (connecting, or reopening after an error) |
/// | `streaming` | shipping; what is not acknowledged yet fits in one window |
/// | `catching_up` | a backlog: more than one window not acknowledged, or bytes shipped and not acknowledged while nothing new was written |
/// | `idle` | everything written is acknowledged; keep-alives carry the tablet's safe time |
/// | `needs_bootstrap` | the applier asks for a position the source already deleted |
/// | `refused` | the applier gives the tablet to another live shipper (or was promoted) |
/// | `target_error` | the applier cannot take the tablet: its disk or the tablet's received log failed; the reason is the applier's, and the shipper retries |
/// | `paused` | stopped by `pause` |
/// | `error` | the source cannot be read at the position to ship (retried) |
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::FromRepr, strum::VariantArray, strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum ShipState {
    Connecting = 0,
    Streaming = 1,
    Idle = 2,
    NeedsBootstrap = 3,
    Refused = 4,
    Paused = 5,
    Error = 6,
    CatchingUp = 7,
    TargetError = 8,
}

impl ShipState {
    /// Every state, in their numbering order (the metrics export each).
    pub const ALL: &'static [ShipState] = <ShipState as strum::VariantArray>::VARIANTS;

    /// `connecting`, `streaming`, `catching_up`, … as status shows it.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The state stored as `v` (`connecting` for anything unknown).
    fn from_u8(v: u8) -> ShipState {
        ShipState::from_repr(v).unwrap_or(ShipState::Connecting)
    }

    /// The state shown for a tablet whose lane last set `self`, with `lag` bytes written and
    /// not acknowledged and `window` the in-flight limit: a lane only says whether it found
    /// something to ship (`streaming`) or not (`idle`); how far behind the tablet is decides
    /// between `idle`, `streaming` and `catching_up`.
    pub fn shown(self, lag: u64, window: u64) -> ShipState {
        match self {
            ShipState::Idle if lag > 0 => ShipState::CatchingUp,
            ShipState::Streaming if lag > window => ShipState::CatchingUp,
            other => other,
        }
    }
}

/// The state a refusal in the applier's Welcome puts a tablet in: `refused` when the
/// applier gives it to another live shipper or takes no shipped logs any more (promoted);
/// `target_error` for anything else the applier reports (it could not open the tablet's
/// received log: its disk is full or failed). The reason text is the applier's, unchanged.
pub fn refusal_state(reason: &str) -> ShipState {
    if reason.contains("already shipped by live shipper") || reason.contains("promot") {
        ShipState::Refused
    } else {
        ShipState::TargetError
    }
}

/// The state an applier's Error on a tablet stream puts the tablet in, by its code:
/// `target_error` when the applier's side of the tablet failed (`io`: its received log
/// could not be written; any code this shipper does not know of is taken so too), else
/// `connecting` (the stream is reopened: `corrupt_frame`, `bad_position`, `claimed`,
/// `protocol`, `needs_bootstrap`).
pub fn stream_error_state(code: &str) -> ShipState {
    match code {
        "corrupt_frame" | "bad_position" | "claimed" | "protocol" | "needs_bootstrap" => {
            ShipState::Connecting
        }
        _ => ShipState::TargetError,
    }
}

#[cfg(test)]
#[test]
fn states_say_how_far_behind_a_tablet_is_and_whose_fault_a_refusal_is() {
    let w = 16 << 20;
    assert_eq!(ShipState::Idle.shown(0, w), ShipState::Idle);
    // Everything shipped, megabytes not acknowledged: not idle.
    assert_eq!(ShipState::Idle.shown(5 << 20, w), ShipState::CatchingUp);
    assert_eq!(ShipState::Streaming.shown(0, w), ShipState::Streaming);
    assert_eq!(ShipState::Streaming.shown(w, w), ShipState::Streaming);
    assert_eq!(ShipState::Streaming.shown(w + 1, w), ShipState::CatchingUp);
    assert_eq!(ShipState::Paused.shown(w + 1, w), ShipState::Paused);
    assert_eq!(
        refusal_state(
            "tablet t0 is already shipped by live shipper \"a\" from 127.0.0.1:1; refused for shipper \"b\""
        ),
        ShipState::Refused
    );
    assert_eq!(
        refusal_state("this target was promoted to primary at ht 5; it accepts no shipped logs"),
        ShipState::Refused
    );
    assert_eq!(
        refusal_state("opening the received log of tablet t0: preallocate …: No space left on device (os error 28)"),
        ShipState::TargetError
    );
    assert_eq!(stream_error_state("io"), ShipState::TargetError);
    assert_eq!(stream_error_state("disk_full"), ShipState::TargetError);
    assert_eq!(stream_error_state("bad_position"), ShipState::Connecting);
}

#[cfg(test)]
#[test]
fn ship_state_all_lists_every_state_once() {
    let all: Vec<_> = (0..ShipState::ALL.len() as u8)
        .map(ShipState::from_u8)
        .collect();
    assert_eq!(all, ShipState::ALL);
    // Past the last one, `from_u8` falls back to the first.
    assert_eq!(
        ShipState::from_u8(ShipState::ALL.len() as u8),
        ShipState::ALL[0]
    );
}

/// Live counters of one tablet (atomics shared with its lane).
#[derive(Debug, Default)]
pub struct TabletShip {
    /// The tablet's control file, mapped once: status reads `durable_pos` (and
    /// `written_pos`) live from it, whatever the tablet's shipping state.
    control: OnceLock<ControlView>,
    shipped: AtomicU64,
    acked: AtomicU64,
    records_shipped: AtomicU64,
    records_acked: AtomicU64,
    /// Records of the frames on the current stream not acked yet (reset when a stream
    /// opens: a new stream resends from the acked position, so the old stream's unacked
    /// frames are shipped again and must not count twice).
    records_in_flight: AtomicU64,
    frames: AtomicU64,
    /// Payload bytes shipped (frames written to the stream) since start.
    bytes_shipped: AtomicU64,
    /// Times the tablet's stream was reopened after an error.
    reopens: AtomicU64,
    state: AtomicU8,
    paused: AtomicBool,
    lane: AtomicU64,
    error: Mutex<Option<String>>,
    acked_changed: Notify,
    resume: Notify,
    /// The one writer of the tablet's `acked` file (the stream, its flusher and the lane's
    /// shutdown all write it).
    acked_file: Arc<AckedFile>,
}

/// Writes a tablet's `acked` file, one write at a time, each with the acknowledged position
/// as it is when the write starts.
///
/// The file is written `acked.partial` → fsync → rename (FORMAT.md): two writes at once
/// share the `.partial`, and one's rename finds it gone (`rename …/acked.partial: No such
/// file or directory`) or renames the other's bytes. The stream's periodic flush, its last
/// write and the lane's write at shutdown all go through here. A writer that waited for
/// another writes the position of now, not the one it was called with, so an older value
/// never lands after a newer one.
#[derive(Debug, Default)]
pub struct AckedFile {
    /// The position last written (`None`: none yet by this process).
    written: Mutex<Option<WalPos>>,
}

impl AckedFile {
    /// Records `acked` (read now, under this file's lock) in the `acked` file of the
    /// tablet in `dir`, unless that is what was last written; blocks while another write
    /// is in progress. Returns the position the file holds.
    pub fn write(&self, dir: &Path, acked: &AtomicU64) -> tidelog_wal::Result<WalPos> {
        let mut written = self.written.lock().unwrap_or_else(|p| p.into_inner());
        let pos = WalPos(acked.load(Ordering::Acquire));
        if *written != Some(pos) {
            tidelog_wal::retention::write_acked(dir, pos)?;
            *written = Some(pos);
        }
        Ok(pos)
    }
}

impl TabletShip {
    /// The mapped control file of the tablet in `dir`, mapping it on first use; `None`
    /// while it cannot be opened.
    fn control(&self, dir: &Path) -> Option<&ControlView> {
        if let Some(c) = self.control.get() {
            return Some(c);
        }
        if let Ok(Some(c)) = ControlView::open(dir) {
            let _ = self.control.set(c);
        }
        self.control.get()
    }
    fn set_state(&self, s: ShipState) {
        self.state.store(s as u8, Ordering::Relaxed);
    }
    fn set_error(&self, e: Option<String>) {
        *self.error.lock().unwrap_or_else(|p| p.into_inner()) = e;
    }
}

/// A status snapshot of one tablet.
#[derive(Clone, Debug, serde::Serialize)]
pub struct TabletShipStatus {
    pub durable_pos: u64,
    pub shipped_pos: u64,
    pub acked_pos: u64,
    pub lag_bytes: u64,
    pub lag_records: u64,
    pub records_shipped: u64,
    pub records_acked: u64,
    pub frames: u64,
    pub bytes_shipped: u64,
    pub stream_reopens: u64,
    pub state: &'static str,
    pub lane: u64,
    pub error: Option<String>,
}

#[derive(Debug)]
struct Shared {
    opts: ShipperOptions,
    engine: IoEngine,
    engine_note: Option<String>,
    tls: TlsMaterial,
    tablets: Mutex<BTreeMap<TabletId, Arc<TabletShip>>>,
    shutdown: AtomicBool,
    connected_lanes: AtomicU64,
    /// Connections to the applier lost (each followed by a reconnect attempt).
    reconnects: AtomicU64,
    /// Entries of `wal_dir` that are not tablets, already warned about.
    skipped: Mutex<std::collections::HashSet<String>>,
    /// One per lane: beaten by a task on the lane's own thread every 100 ms, so a lane
    /// thread that blocks (a stuck read, a deadlock) stops beating.
    lane_beats: Vec<Heartbeat>,
    /// Per lane: its first connection attempt has ended (connected or failed), or it has
    /// no tablets to connect for.
    lane_started: Vec<AtomicBool>,
    scanner_beat: Heartbeat,
}

impl Shared {
    fn lane_settled(&self, lane: u32) {
        if let Some(f) = self.lane_started.get(lane as usize) {
            f.store(true, Ordering::Release);
        }
    }
}

/// The running shipper.
#[derive(Debug)]
pub struct Shipper {
    shared: Arc<Shared>,
    senders: Vec<mpsc::UnboundedSender<LaneCmd>>,
    threads: Mutex<Vec<JoinHandle<()>>>,
}

#[derive(Debug)]
enum LaneCmd {
    Add(TabletId),
    Shutdown,
}

fn lane_of(t: &TabletId, lanes: usize) -> usize {
    // FNV-1a: stable across restarts and builds.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in t.as_str().bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    (h % lanes.max(1) as u64) as usize
}

impl Shipper {
    /// Picks the I/O engine, starts the lanes and the scanner. The tablets found under
    /// `wal_dir` are announced at once; later ones as soon as inotify reports them (else
    /// within `rescan_interval`).
    pub fn start(mut opts: ShipperOptions, tls: TlsMaterial) -> Result<Shipper> {
        let (engine, note) = io::choose(opts.io_engine).map_err(anyhow::Error::msg)?;
        if let Some(n) = &note {
            tracing::warn!("io_uring unavailable ({n}); reading WAL files with the std engine");
        }
        if opts.lanes == 0 {
            opts.lanes = std::thread::available_parallelism().map_or(1, |n| n.get());
        }
        // Fail early on an unusable TLS setup rather than in every lane.
        tidelog_net::tls::client_config(&tls, &opts.quic)?;
        let lanes = opts.lanes;
        let shared = Arc::new(Shared {
            opts,
            engine,
            engine_note: note,
            tls,
            tablets: Mutex::new(BTreeMap::new()),
            shutdown: AtomicBool::new(false),
            connected_lanes: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            skipped: Mutex::new(Default::default()),
            lane_beats: (0..lanes).map(|_| Heartbeat::new()).collect(),
            lane_started: (0..lanes).map(|_| AtomicBool::new(false)).collect(),
            scanner_beat: Heartbeat::new(),
        });
        let (senders, receivers): (Vec<_>, Vec<_>) =
            (0..lanes).map(|_| mpsc::unbounded_channel()).unzip();
        // The tablets present now are queued before the lanes start, so each lane's first
        // look sees them (and its first connection attempt includes them).
        scan_once(&shared, &senders)?;
        let mut threads = Vec::new();
        for (i, rx) in receivers.into_iter().enumerate() {
            let sh = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ship-lane-{i}"))
                .spawn(move || run_lane(sh, i as u32, rx))
                .context("spawning a lane thread");
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    let s = Shipper {
                        shared,
                        senders,
                        threads: Mutex::new(threads),
                    };
                    s.shutdown();
                    return Err(e);
                }
            }
        }
        let s = Shipper {
            shared,
            senders,
            threads: Mutex::new(threads),
        };
        let (sh, tx) = (s.shared.clone(), s.senders.clone());
        let h = std::thread::Builder::new()
            .name("ship-scan".into())
            .spawn(move || scanner(sh, tx))
            .context("spawning the scanner thread")?;
        s.threads.lock().unwrap_or_else(|p| p.into_inner()).push(h);
        Ok(s)
    }

    pub fn io_engine(&self) -> IoEngine {
        self.shared.engine
    }

    /// Why `auto` fell back to `std`, if it did.
    pub fn io_engine_note(&self) -> Option<&str> {
        self.shared.engine_note.as_deref()
    }

    pub fn lanes(&self) -> usize {
        self.shared.opts.lanes
    }

    pub fn connected_lanes(&self) -> u64 {
        self.shared.connected_lanes.load(Ordering::Relaxed)
    }

    /// Connections to the applier lost since start (each followed by reconnect attempts).
    pub fn reconnects(&self) -> u64 {
        self.shared.reconnects.load(Ordering::Relaxed)
    }

    /// Whether every lane has finished its first connection attempt (connected or failed)
    /// or has no tablet to connect for.
    pub fn started(&self) -> bool {
        self.shared
            .lane_started
            .iter()
            .all(|f| f.load(Ordering::Acquire))
    }

    /// Blocks until [`started`](Self::started) or `timeout`; returns whether it started.
    pub fn wait_started(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.started() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// The oldest sign of life of the shipper's threads (the lanes and the scanner).
    pub fn last_progress(&self) -> Instant {
        self.shared
            .lane_beats
            .iter()
            .chain(std::iter::once(&self.shared.scanner_beat))
            .map(Heartbeat::last)
            .min()
            .unwrap_or_else(Instant::now)
    }

    /// A thread that has shown no sign of life for longer than `limit`, named (`None`: all
    /// alive). A lane beats every 100 ms from its own thread and the scanner every 50 ms,
    /// so a healthy shipper never comes close to a limit of seconds.
    pub fn stalled(&self, limit: Duration) -> Option<String> {
        for (i, b) in self.shared.lane_beats.iter().enumerate() {
            let age = b.age();
            if age > limit {
                return Some(format!(
                    "shipper lane {i} has shown no progress for {age:?}"
                ));
            }
        }
        let age = self.shared.scanner_beat.age();
        (age > limit)
            .then(|| format!("the WAL directory scanner has shown no progress for {age:?}"))
    }

    /// Per-tablet status.
    pub fn status(&self) -> BTreeMap<TabletId, TabletShipStatus> {
        let map = self
            .shared
            .tablets
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let wal_dir = &self.shared.opts.wal_dir;
        map.iter()
            .map(|(t, s)| {
                let acked = s.acked.load(Ordering::Relaxed);
                // Live from the control file (one atomic load once mapped), not what the
                // lane last saw: a paused or unconnected tablet's log still grows.
                let (durable, end) = match s.control(&wal_dir.join(t.as_str())) {
                    Some(c) => {
                        let d = c.durable().0;
                        // Lag is counted to where the tablet ships up to.
                        let end = if self.shared.opts.ship_unsynced {
                            c.written().0.max(d)
                        } else {
                            d
                        };
                        (d, end)
                    }
                    None => (0, 0),
                };
                let rs = s.records_shipped.load(Ordering::Relaxed);
                let ra = s.records_acked.load(Ordering::Relaxed);
                let lag = end.saturating_sub(acked);
                let state = if s.paused.load(Ordering::Relaxed) {
                    ShipState::Paused
                } else {
                    ShipState::from_u8(s.state.load(Ordering::Relaxed))
                        .shown(lag, self.shared.opts.window_bytes)
                };
                (
                    t.clone(),
                    TabletShipStatus {
                        durable_pos: durable,
                        shipped_pos: s.shipped.load(Ordering::Relaxed),
                        acked_pos: acked,
                        lag_bytes: lag,
                        lag_records: s.records_in_flight.load(Ordering::Relaxed),
                        records_shipped: rs,
                        records_acked: ra,
                        frames: s.frames.load(Ordering::Relaxed),
                        bytes_shipped: s.bytes_shipped.load(Ordering::Relaxed),
                        stream_reopens: s.reopens.load(Ordering::Relaxed),
                        state: state.name(),
                        lane: s.lane.load(Ordering::Relaxed),
                        error: s.error.lock().unwrap_or_else(|p| p.into_inner()).clone(),
                    },
                )
            })
            .collect()
    }

    /// Stops (`true`) or restarts shipping of one tablet or all.
    pub fn set_paused(&self, tablet: Option<&TabletId>, paused: bool) -> Result<()> {
        let map = self
            .shared
            .tablets
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let targets: Vec<_> = match tablet {
            Some(t) => vec![map
                .get(t)
                .with_context(|| format!("unknown tablet {t}"))?
                .clone()],
            None => map.values().cloned().collect(),
        };
        for s in targets {
            s.paused.store(paused, Ordering::SeqCst);
            s.resume.notify_waiters();
        }
        Ok(())
    }

    /// Stops shipping: each lane records the acked positions and closes its QUIC
    /// connection gracefully. Blocks until the lanes have ended. Idempotent.
    pub fn shutdown(&self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for tx in &self.senders {
            let _ = tx.send(LaneCmd::Shutdown);
        }
        let threads = std::mem::take(&mut *self.threads.lock().unwrap_or_else(|p| p.into_inner()));
        for h in threads {
            let _ = h.join();
        }
    }
}

impl Drop for Shipper {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn scan_once(shared: &Arc<Shared>, lanes: &[mpsc::UnboundedSender<LaneCmd>]) -> Result<()> {
    if !shared.opts.wal_dir.exists() {
        // Not created yet: the scanner waits for it.
        return Ok(());
    }
    let (found, others) = tidelog_wal::reader::scan_tablets(&shared.opts.wal_dir)
        .with_context(|| format!("scanning {}", shared.opts.wal_dir.display()))?;
    // Entries that are not tablets (a file system's `lost+found`, a note left by an
    // operator) are skipped, with a warning the first time each is seen; they must not stop
    // the tablets beside them from shipping.
    for e in others {
        let text = e.to_string();
        let mut seen = shared.skipped.lock().unwrap_or_else(|p| p.into_inner());
        if seen.insert(text.clone()) {
            tracing::warn!("{text}; skipped");
        }
    }
    let mut map = shared.tablets.lock().unwrap_or_else(|p| p.into_inner());
    for t in found {
        if map.contains_key(&t) {
            continue;
        }
        // Only tablets whose writer has created the control file can be tailed.
        if !shared
            .opts
            .wal_dir
            .join(t.as_str())
            .join("control")
            .exists()
        {
            continue;
        }
        let lane = lane_of(&t, lanes.len());
        let st = Arc::new(TabletShip::default());
        st.lane.store(lane as u64, Ordering::Relaxed);
        st.control(&shared.opts.wal_dir.join(t.as_str()));
        map.insert(t.clone(), st);
        tracing::info!(tablet = %t, lane, "tablet found");
        let _ = lanes[lane].send(LaneCmd::Add(t));
    }
    Ok(())
}

/// Finds tablets that appear under `wal_dir`: at once through inotify (a new directory, then
/// its `control` file — the writer creates that before its first record), and by a rescan
/// every `rescan_interval` in any case (and only so where inotify is unavailable). A tablet
/// counts for the target's safe time from its announcement on, so the sooner the better:
/// found a second later, its first records may already be below the safe time.
fn scanner(shared: Arc<Shared>, lanes: Vec<mpsc::UnboundedSender<LaneCmd>>) {
    let step = Duration::from_millis(50);
    // A `wal_dir` the source has not created yet: wait for it (the daemon has logged that),
    // then scan it as soon as it is watched.
    let mut next = Instant::now() + shared.opts.rescan_interval;
    if !shared.opts.wal_dir.exists() {
        while !shared.opts.wal_dir.exists() {
            if shared.shutdown.load(Ordering::SeqCst) {
                return;
            }
            shared.scanner_beat.beat();
            std::thread::sleep(step);
        }
        tracing::info!(wal_dir = %shared.opts.wal_dir.display(), "wal-dir appeared; shipping its tablets");
        next = Instant::now();
    }
    let mut watch = match watch::DirWatch::new(&shared.opts.wal_dir) {
        Ok(w) => Some(w),
        Err(e) => {
            tracing::warn!(
                "watching {} for new tablets: {e}; finding them by rescans every {:?}",
                shared.opts.wal_dir.display(),
                shared.opts.rescan_interval
            );
            None
        }
    };
    while !shared.shutdown.load(Ordering::SeqCst) {
        shared.scanner_beat.beat();
        let changed = match &mut watch {
            Some(w) => w.wait(step),
            None => {
                std::thread::sleep(step);
                false
            }
        };
        if !changed && Instant::now() < next {
            continue;
        }
        next = Instant::now() + shared.opts.rescan_interval;
        if let Err(e) = scan_once(&shared, &lanes) {
            tracing::warn!("{e:#}");
        }
        if let Some(w) = &mut watch {
            let known = shared.tablets.lock().unwrap_or_else(|p| p.into_inner());
            w.forget(|name| {
                name.parse::<TabletId>()
                    .is_ok_and(|t| known.contains_key(&t))
            });
        }
    }
}

fn run_lane(shared: Arc<Shared>, lane: u32, rx: mpsc::UnboundedReceiver<LaneCmd>) {
    let fut = lane_main(shared.clone(), lane, rx);
    match shared.engine {
        IoEngine::Uring => match tokio_uring::Runtime::new(&tokio_uring::builder()) {
            Ok(rt) => rt.block_on(fut),
            Err(e) => tracing::error!(lane, "lane runtime: {e}"),
        },
        IoEngine::Std => {
            let rt = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    tracing::error!(lane, "lane runtime: {e}");
                    return;
                }
            };
            let local = tokio::task::LocalSet::new();
            local.block_on(&rt, fut);
        }
    }
}

/// A QUIC client endpoint bound to `bind`, its UDP socket's receive buffer sized to `rcvbuf`
/// bytes (`quic.udp-receive-buffer`, [`wire::bind_udp`]). Must run inside a tokio runtime.
pub fn client_endpoint(bind: SocketAddr, rcvbuf: u64) -> Result<quinn::Endpoint> {
    let (socket, _) =
        wire::bind_udp(bind, rcvbuf).with_context(|| format!("binding udp {bind}"))?;
    let runtime = quinn::default_runtime().context("no async runtime for the QUIC endpoint")?;
    Ok(quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        None,
        socket,
        runtime,
    )?)
}

async fn lane_main(shared: Arc<Shared>, lane: u32, mut rx: mpsc::UnboundedReceiver<LaneCmd>) {
    let bind: SocketAddr = if shared.opts.applier.is_ipv6() {
        "[::]:0".parse().unwrap_or(SocketAddr::from(([0u8; 16], 0)))
    } else {
        SocketAddr::from(([0, 0, 0, 0], 0))
    };
    let endpoint = match client_endpoint(bind, shared.opts.quic.udp_receive_buffer) {
        Ok(e) => e,
        Err(e) => {
            tracing::error!(lane, "binding a UDP socket: {e:#}");
            return;
        }
    };
    // The lane's heartbeat, beaten from this thread: it stops if anything blocks the thread.
    let beat = {
        let sh = shared.clone();
        tokio::task::spawn_local(async move {
            loop {
                if let Some(b) = sh.lane_beats.get(lane as usize) {
                    b.beat();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let _beat = AbortOnDrop(beat);
    let mut tablets: Vec<TabletId> = Vec::new();
    let mut backoff = shared.opts.reconnect_min;
    loop {
        // Take in tablets assigned while disconnected.
        while let Ok(cmd) = rx.try_recv() {
            match cmd {
                LaneCmd::Add(t) => tablets.push(t),
                LaneCmd::Shutdown => return close(endpoint).await,
            }
        }
        if shared.shutdown.load(Ordering::SeqCst) {
            return close(endpoint).await;
        }
        if tablets.is_empty() {
            // Nothing to connect for: this lane is as started as it gets.
            shared.lane_settled(lane);
            match rx.recv().await {
                Some(LaneCmd::Add(t)) => tablets.push(t),
                _ => return close(endpoint).await,
            }
            continue;
        }
        let started = Instant::now();
        match connection(&shared, lane, &endpoint, &mut tablets, &mut rx).await {
            Ok(()) => return close(endpoint).await,
            Err(e) => {
                shared.lane_settled(lane);
                shared.reconnects.fetch_add(1, Ordering::Relaxed);
                // With TLS 1.3 the applier checks this shipper's certificate after the
                // handshake looked done here: its refusal ends a "connection" that never was.
                let text = format!("{e:#}");
                let e = match tidelog_net::tls::CertRefusal::of(&text) {
                    Some(_) if e.downcast_ref::<NotConnected>().is_none() => {
                        anyhow::Error::new(NotConnected::new(&shared.opts, &text))
                    }
                    _ => e,
                };
                if e.downcast_ref::<NotConnected>().is_some() {
                    tracing::warn!(lane, "{e:#}");
                } else {
                    tracing::warn!(
                        lane,
                        "connection to the applier at {} lost: {e:#}",
                        shared.opts.applier
                    );
                }
                for t in &tablets {
                    if let Some(s) = tablet_state(&shared, t) {
                        if ShipState::from_u8(s.state.load(Ordering::Relaxed))
                            != ShipState::NeedsBootstrap
                        {
                            s.set_state(ShipState::Connecting);
                        }
                        s.set_error(Some(format!("{e:#}")));
                    }
                }
            }
        }
        if started.elapsed() > shared.opts.reconnect_max * 2 {
            backoff = shared.opts.reconnect_min;
        }
        // Capped exponential backoff with full jitter in [backoff/2, backoff].
        let jitter = rand::rng().random_range(0.5..=1.0);
        let wait = backoff.mul_f64(jitter);
        backoff = (backoff * 2).min(shared.opts.reconnect_max);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            cmd = rx.recv() => match cmd {
                Some(LaneCmd::Add(t)) => tablets.push(t),
                _ => return close(endpoint).await,
            }
        }
    }
}

async fn close(endpoint: quinn::Endpoint) {
    endpoint.close(quinn::VarInt::from_u32(0), b"shipper shutting down");
    let _ = tokio::time::timeout(Duration::from_secs(3), endpoint.wait_idle()).await;
}

fn tablet_state(shared: &Shared, t: &TabletId) -> Option<Arc<TabletShip>> {
    shared
        .tablets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(t)
        .cloned()
}

async fn read_msg(recv: &mut quinn::RecvStream) -> Result<Option<Message>> {
    let mut head = [0u8; MSG_HEADER_LEN];
    match recv.read_exact(&mut head).await {
        Ok(()) => {}
        Err(quinn::ReadExactError::FinishedEarly(0)) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let (kind, len, sum) = wire::decode_header(&head)?;
    let mut body = vec![0u8; len];
    recv.read_exact(&mut body).await?;
    Ok(Some(wire::decode_body(kind, &body, sum)?))
}

fn hello_tablets(shared: &Shared, tablets: &[TabletId]) -> Vec<HelloTablet> {
    tablets
        .iter()
        .map(|t| {
            // The tablet's control file, mapped once (status reads it too).
            let dir = shared.opts.wal_dir.join(t.as_str());
            let (oldest, durable) = tablet_state(shared, t)
                .and_then(|st| st.control(&dir).map(|c| (c.oldest(), c.durable())))
                .unwrap_or((WalPos::ZERO, WalPos::ZERO));
            HelloTablet {
                tablet: t.clone(),
                oldest,
                durable,
            }
        })
        .collect()
}

/// One connection's life: handshake, tablet tasks, new tablets; `Ok` on shutdown.
/// A connection attempt that ended before the connection existed (so it was not "lost"),
/// with what a refused certificate means for the operator.
#[derive(Debug)]
struct NotConnected(String);

impl NotConnected {
    fn new(opts: &ShipperOptions, why: &str) -> NotConnected {
        let meaning = tidelog_net::tls::refusal::server_refused(
            why,
            opts.ca_file.as_deref(),
            &opts.server_name,
        );
        NotConnected(format!(
            "cannot connect to the applier at {}: {meaning}",
            opts.applier
        ))
    }
}

impl std::fmt::Display for NotConnected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for NotConnected {}

async fn connection(
    shared: &Arc<Shared>,
    lane: u32,
    endpoint: &quinn::Endpoint,
    tablets: &mut Vec<TabletId>,
    rx: &mut mpsc::UnboundedReceiver<LaneCmd>,
) -> Result<()> {
    // Tests hold one lane back (`FAILPOINTS=shipper::lane_<n>_connect=return`).
    fail::fail_point!(&format!("shipper::lane_{lane}_connect"), |_| Err(
        anyhow::anyhow!("failpoint: lane {lane} does not connect")
    ));
    let cc = tidelog_net::tls::client_config(&shared.tls, &shared.opts.quic)?;
    let connecting = endpoint.connect_with(cc, shared.opts.applier, &shared.opts.server_name)?;
    tokio::pin!(connecting);
    // An unreachable applier would hold the handshake until the idle timeout: give up
    // after the silence limit (the lane retries with backoff), and keep taking commands
    // meanwhile, so a shutdown does not wait for it.
    let limit = shared.opts.quic.silence_limit;
    let give_up = tokio::time::sleep(limit);
    tokio::pin!(give_up);
    let conn = loop {
        tokio::select! {
            c = &mut connecting => {
                break c.map_err(|e| NotConnected::new(&shared.opts, &e.to_string()))?;
            }
            () = &mut give_up => {
                return Err(NotConnected::new(&shared.opts, &format!("no answer within {limit:?}")).into());
            }
            cmd = rx.recv() => match cmd {
                Some(LaneCmd::Add(t)) => tablets.push(t),
                _ => return Ok(()),
            },
        }
    };
    let (mut csend, mut crecv) = conn.open_bi().await?;
    let conn = Rc::new(conn);
    // Control messages arrive through a channel: reading a QUIC stream is not cancel-safe,
    // the select below is.
    let (ctx, mut crx) = mpsc::unbounded_channel::<Result<Option<Message>>>();
    let reader = tokio::task::spawn_local(async move {
        loop {
            let m = read_msg(&mut crecv).await;
            let end = !matches!(m, Ok(Some(_)));
            if ctx.send(m).is_err() || end {
                return;
            }
        }
    });
    let _reader = AbortOnDrop(reader);
    let mut announce = tablets.clone();
    // Tablets refused (claimed by another live shipper): asked for again every 5 s.
    let mut refused: Vec<(TabletId, Instant)> = Vec::new();
    shared.connected_lanes.fetch_add(1, Ordering::Relaxed);
    let _connected = scopeguard(shared.clone());
    shared.lane_settled(lane);
    let mut heard = wire::Silence::new(conn.stats().udp_rx.datagrams);
    // One timer for both periodic looks (a second one re-made in the select below would
    // never fire: this one always ends the select first).
    let mut look = tokio::time::interval(wire::Silence::look_every(limit));
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        if !announce.is_empty() {
            let hello = wire::Hello {
                shipper_id: shared.opts.shipper_id.clone(),
                lane,
                tablets: hello_tablets(shared, &announce),
                all_tablets: shared
                    .tablets
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .keys()
                    .cloned()
                    .collect(),
            };
            csend.write_all(&wire::encode_hello(&hello)).await?;
            let answer = tokio::time::timeout(limit, crx.recv())
                .await
                .map_err(|_| anyhow::anyhow!("no Welcome from the applier within {limit:?}"))?;
            let welcome = match answer.unwrap_or(Ok(None))? {
                Some(Message::Welcome(w)) => w,
                Some(Message::Error(e)) => {
                    anyhow::bail!("applier refused: {}: {}", e.code, e.message)
                }
                other => anyhow::bail!("expected Welcome, got {other:?}"),
            };
            for wt in welcome.tablets {
                let Some(st) = tablet_state(shared, &wt.tablet) else {
                    continue;
                };
                match (wt.resume, wt.refused) {
                    (Some(_), _) => {
                        // Where to resume comes again as the first Ack of the tablet stream.
                        // A refusal (or a target error) of before is over.
                        st.set_error(None);
                        if matches!(
                            ShipState::from_u8(st.state.load(Ordering::Relaxed)),
                            ShipState::Refused | ShipState::TargetError
                        ) {
                            st.set_state(ShipState::Connecting);
                        }
                        tokio::task::spawn_local(tablet_task(
                            shared.clone(),
                            conn.clone(),
                            wt.tablet.clone(),
                            st,
                        ));
                    }
                    (None, reason) => {
                        let reason = reason.unwrap_or_else(|| "refused".into());
                        let state = refusal_state(&reason);
                        tracing::error!(tablet = %wt.tablet, state = state.name(),
                            "applier refused the tablet: {reason}; asking again in 5 s");
                        st.set_state(state);
                        st.set_error(Some(format!("applier: {reason}")));
                        refused.push((wt.tablet.clone(), Instant::now()));
                    }
                }
            }
            announce.clear();
        }
        tokio::select! {
            cmd = rx.recv() => match cmd {
                Some(LaneCmd::Add(t)) => {
                    tablets.push(t.clone());
                    announce.push(t);
                }
                _ => {
                    // Record what the applier has acknowledged before going away.
                    for t in tablets.iter() {
                        if let Some(st) = tablet_state(shared, t) {
                            if st.acked.load(Ordering::Relaxed) > 0 {
                                write_acked(&st, shared.opts.wal_dir.join(t.as_str())).await;
                            }
                        }
                    }
                    conn.close(quinn::VarInt::from_u32(0), b"shipper shutting down");
                    return Ok(());
                }
            },
            e = conn.closed() => {
                anyhow::bail!("{e}");
            }
            _ = look.tick() => {
                // Refused tablets are asked for again 5 s after the refusal.
                let due = Instant::now() - Duration::from_secs(5);
                refused.retain(|(t, at)| {
                    if *at <= due {
                        announce.push(t.clone());
                        false
                    } else {
                        true
                    }
                });
                if let Some(quiet) = heard.exceeded(conn.stats().udp_rx.datagrams, limit) {
                    conn.close(quinn::VarInt::from_u32(1), b"no packet from the applier");
                    anyhow::bail!(
                        "no packet from the applier for {:.1} s (limit {limit:?}); reconnecting",
                        quiet.as_secs_f64()
                    );
                }
            }
            m = crx.recv() => {
                match m.unwrap_or(Ok(None))? {
                    Some(Message::Error(e)) => anyhow::bail!("applier: {}: {}", e.code, e.message),
                    None => anyhow::bail!("the applier closed the control stream"),
                    Some(other) => anyhow::bail!("unexpected control message {other:?}"),
                }
            }
        }
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);
impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Connected(Arc<Shared>);
impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connected_lanes.fetch_sub(1, Ordering::Relaxed);
    }
}
fn scopeguard(s: Arc<Shared>) -> Connected {
    Connected(s)
}

/// Ships one tablet over this connection until it closes; re-opens its stream after a
/// stream-level error (the applier's first Ack says where to resume).
async fn tablet_task(
    shared: Arc<Shared>,
    conn: Rc<quinn::Connection>,
    tablet: TabletId,
    st: Arc<TabletShip>,
) {
    // A source that cannot be opened now (a control file being replaced, an I/O error) is
    // looked at again every SOURCE_RETRY while the connection lasts: the error state ends
    // with its cause, without a reconnect.
    let mut tail = loop {
        match Tail::open(
            &shared.opts.wal_dir,
            &tablet,
            shared.engine,
            shared.opts.ship_unsynced,
        ) {
            Ok(t) => {
                if ShipState::from_u8(st.state.load(Ordering::Relaxed)) == ShipState::Error {
                    tracing::info!(tablet = %tablet, "the source opens again");
                    st.set_error(None);
                    st.set_state(ShipState::Connecting);
                }
                break t;
            }
            Err(e) => {
                if ShipState::from_u8(st.state.load(Ordering::Relaxed)) != ShipState::Error {
                    tracing::error!("{e}; retrying every {SOURCE_RETRY:?}");
                }
                st.set_state(ShipState::Error);
                st.set_error(Some(e.to_string()));
            }
        }
        if conn.close_reason().is_some() || shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let notified = st.resume.notified();
        tokio::select! {
            _ = notified => {}
            _ = tokio::time::sleep(SOURCE_RETRY) => {}
        }
    };
    let mut backoff = shared.opts.reconnect_min;
    while conn.close_reason().is_none() && !shared.shutdown.load(Ordering::SeqCst) {
        let started = Instant::now();
        match ship_stream(&shared, &conn, &mut tail, &st).await {
            Ok(()) => return,
            Err(e) => {
                if conn.close_reason().is_some() {
                    return;
                }
                tracing::warn!(tablet = %tablet, "tablet stream: {e:#}; reopening");
                st.reopens.fetch_add(1, Ordering::Relaxed);
                st.set_error(Some(format!("{e:#}")));
                // These say why better than `connecting` until a stream opens again.
                if !matches!(
                    ShipState::from_u8(st.state.load(Ordering::Relaxed)),
                    ShipState::NeedsBootstrap | ShipState::TargetError
                ) {
                    st.set_state(ShipState::Connecting);
                }
            }
        }
        if started.elapsed() > Duration::from_secs(10) {
            backoff = shared.opts.reconnect_min;
        }
        let wait = backoff.mul_f64(rand::rng().random_range(0.5..=1.0));
        backoff = (backoff * 2).min(shared.opts.reconnect_max);
        tokio::time::sleep(wait).await;
    }
}

/// After a read that succeeded: a tablet in `error` (its source could not be read) leaves
/// it, and its error is cleared. Whether it was in `error`.
fn source_reads_again(st: &TabletShip, tablet: &TabletId, pos: WalPos) -> bool {
    if ShipState::from_u8(st.state.load(Ordering::Relaxed)) != ShipState::Error {
        return false;
    }
    tracing::info!(tablet = %tablet, at = %pos, "the source reads again");
    st.set_error(None);
    true
}

/// Writes the tablet's acknowledged position (as it is when the write starts) to its
/// `acked` file, through the tablet's one writer.
async fn write_acked(st: &Arc<TabletShip>, dir: PathBuf) {
    let st = st.clone();
    let r = tokio::task::spawn_blocking(move || st.acked_file.write(&dir, &st.acked)).await;
    match r {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => tracing::warn!("writing the acked file: {e}"),
        Err(e) => tracing::warn!("writing the acked file: {e}"),
    }
}

/// The first `len` bytes of the read buffer as a frame's payload for quinn's send queue
/// (`write_chunk`). A frame of at least half the largest size takes the buffer itself, so
/// its bytes are not copied once more on their way to the packets, and `buf` gets a fresh
/// one; a smaller frame is copied out, so that a frame never holds more than twice its size
/// in memory while it waits for its ack.
fn frame_payload(buf: &mut Vec<u8>, len: usize, max: usize) -> bytes::Bytes {
    if len >= max / 2 {
        let mut p = bytes::Bytes::from(std::mem::replace(buf, Vec::with_capacity(max)));
        p.truncate(len);
        p
    } else {
        bytes::Bytes::copy_from_slice(&buf[..len])
    }
}

/// Writers of one tablet's `acked` file (the stream's flush, its last write, the lane's
/// write at shutdown) never run into each other (`rename …/acked.partial: No such file or
/// directory`), and the file ends with the latest position: a writer that waited writes
/// the position of now, not an older one. A position that moved back (the target was
/// bootstrapped again) is written too.
#[cfg(test)]
#[test]
#[allow(clippy::unwrap_used)]
fn acked_writes_of_one_tablet_are_serialised_and_end_with_the_latest() {
    let d = tempfile::tempdir().unwrap();
    let file = Arc::new(AckedFile::default());
    let acked = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let (file, acked, dir) = (file.clone(), acked.clone(), d.path().to_path_buf());
            std::thread::spawn(move || {
                for i in 0..100u64 {
                    acked.fetch_max(1 + i * 4 + k, Ordering::AcqRel);
                    file.write(&dir, &acked).unwrap();
                }
            })
        })
        .collect();
    for h in threads {
        h.join().unwrap();
    }
    let read = || tidelog_wal::retention::read_acked(d.path()).unwrap();
    assert_eq!(read(), Some(WalPos(400)));
    assert!(!d.path().join("acked.partial").exists());
    acked.store(7, Ordering::Release);
    assert_eq!(file.write(d.path(), &acked).unwrap(), WalPos(7));
    assert_eq!(read(), Some(WalPos(7)));
}

#[test]
fn large_frames_take_the_read_buffer_and_small_ones_are_copied() {
    let max = 1 << 20;
    let mut buf = vec![7u8; max];
    let ptr = buf.as_ptr();
    let p = frame_payload(&mut buf, max - 10, max);
    assert_eq!(
        p.as_ptr(),
        ptr,
        "a large frame is the read buffer, not a copy"
    );
    assert_eq!(p.len(), max - 10);
    assert_ne!(buf.as_ptr(), ptr);
    assert!(buf.capacity() >= max && buf.is_empty());
    buf.resize(max, 9);
    let ptr = buf.as_ptr();
    let p = frame_payload(&mut buf, 100, max);
    assert_ne!(p.as_ptr(), ptr, "a small frame is copied out");
    assert_eq!(&p[..], &[9u8; 100][..]);
    assert_eq!(buf.as_ptr(), ptr, "and the read buffer is kept");
}

/// One stream: Open, the resume Ack, then frames until an error or shutdown.
async fn ship_stream(
    shared: &Arc<Shared>,
    conn: &quinn::Connection,
    tail: &mut Tail,
    st: &Arc<TabletShip>,
) -> Result<()> {
    let tablet = tail.tablet.clone();
    let (mut send, mut recv) = conn.open_bi().await?;
    let from = WalPos(st.acked.load(Ordering::Relaxed));
    send.write_all(&wire::encode_open(&wire::Open {
        tablet: tablet.clone(),
        from,
    }))
    .await?;
    let (mut pos, mut safe) = match read_msg(&mut recv).await? {
        Some(Message::Ack { durable, safe_time }) => (durable, safe_time),
        Some(Message::Error(e)) => {
            st.set_state(stream_error_state(&e.code));
            anyhow::bail!("applier refused the stream: {}: {}", e.code, e.message)
        }
        other => anyhow::bail!("expected the resume Ack, got {other:?}"),
    };
    st.acked.store(pos.0, Ordering::Relaxed);
    st.shipped.store(pos.0, Ordering::Relaxed);
    if let Err(e) = tail.check_start(pos) {
        if let TailError::NeedsBootstrap { .. } = e {
            st.set_state(ShipState::NeedsBootstrap);
            let _ = send
                .write_all(&wire::encode_error("needs_bootstrap", &e.to_string()))
                .await;
            tracing::error!("{e}");
            st.set_error(Some(e.to_string()));
            // Stay connected and look again later (an operator may bootstrap the target).
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
        anyhow::bail!("{e}");
    }
    st.set_error(None);
    st.set_state(ShipState::Streaming);
    tracing::info!(tablet = %tablet, from = %pos, "shipping");

    // Acks: in-flight accounting and the stream's errors.
    st.records_in_flight.store(0, Ordering::Relaxed);
    let frames: Rc<std::cell::RefCell<std::collections::VecDeque<(WalPos, u32)>>> = Rc::default();
    let acks = {
        let st = st.clone();
        let frames = frames.clone();
        async move {
            loop {
                match read_msg(&mut recv).await? {
                    Some(Message::Ack { durable, .. }) => {
                        st.acked.fetch_max(durable.0, Ordering::Relaxed);
                        let mut n = 0u64;
                        {
                            let mut f = frames.borrow_mut();
                            while f.front().is_some_and(|(end, _)| *end <= durable) {
                                n += f.pop_front().map_or(0, |(_, c)| u64::from(c));
                            }
                        }
                        st.records_acked.fetch_add(n, Ordering::Relaxed);
                        st.records_in_flight.fetch_sub(n, Ordering::Relaxed);
                        st.acked_changed.notify_waiters();
                    }
                    Some(Message::Error(e)) => {
                        st.set_state(stream_error_state(&e.code));
                        anyhow::bail!("applier: {}: {}", e.code, e.message)
                    }
                    Some(other) => anyhow::bail!("unexpected message {other:?}"),
                    None => anyhow::bail!("the applier closed the stream"),
                }
            }
        }
    };
    // The source's `acked` file, rewritten at most every `acked_interval` (two fsyncs each).
    let dir = tail.dir().to_path_buf();
    let written = Rc::new(std::cell::Cell::new(WalPos(0)));
    let flusher = {
        let (st, dir, written) = (st.clone(), dir.clone(), written.clone());
        let every = shared.opts.acked_interval;
        async move {
            loop {
                tokio::time::sleep(every).await;
                let a = WalPos(st.acked.load(Ordering::Relaxed));
                if a > written.get() {
                    write_acked(&st, dir.clone()).await;
                    written.set(a);
                }
            }
        }
    };
    let sender = async {
        let max = shared.opts.max_frame_bytes;
        let mut buf: Vec<u8> = Vec::with_capacity(max);
        let mut last_send = Instant::now();
        let mut idle_wait = Duration::from_micros(50);
        loop {
            if shared.shutdown.load(Ordering::SeqCst) {
                let _ = send.finish();
                return Ok::<(), anyhow::Error>(());
            }
            if st.paused.load(Ordering::Relaxed) {
                let notified = st.resume.notified();
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
                continue;
            }
            let in_flight = pos.since(WalPos(st.acked.load(Ordering::Relaxed)));
            if in_flight >= shared.opts.window_bytes {
                let notified = st.acked_changed.notified();
                tokio::select! {
                    _ = notified => {}
                    _ = tokio::time::sleep(Duration::from_millis(10)) => {}
                }
                continue;
            }
            match tail.read(pos, &mut buf, max).await {
                Ok(Some(chunk)) => {
                    let payload = frame_payload(&mut buf, chunk.len, max);
                    let head =
                        wire::encode_data_head(&tablet, pos, chunk.last_ht, chunk.count, &payload);
                    // Test hook: one frame whose payload does not match its checksum.
                    let corrupt = (|| {
                        fail::fail_point!("shipper::corrupt_frame", |_| true);
                        false
                    })();
                    send.write_all(&head).await?;
                    if corrupt {
                        let mut bad = payload.to_vec();
                        if let Some(b) = bad.last_mut() {
                            *b ^= 0x40;
                        }
                        send.write_all(&bad).await?;
                    } else {
                        send.write_chunk(payload).await?;
                    }
                    frames
                        .borrow_mut()
                        .push_back((pos.add(chunk.len as u64), chunk.count));
                    pos = pos.add(chunk.len as u64);
                    safe = chunk.last_ht;
                    st.shipped.store(pos.0, Ordering::Relaxed);
                    st.records_shipped
                        .fetch_add(u64::from(chunk.count), Ordering::Relaxed);
                    st.records_in_flight
                        .fetch_add(u64::from(chunk.count), Ordering::Relaxed);
                    st.bytes_shipped
                        .fetch_add(chunk.len as u64, Ordering::Relaxed);
                    st.frames.fetch_add(1, Ordering::Relaxed);
                    source_reads_again(st, &tablet, pos);
                    st.set_state(ShipState::Streaming);
                    last_send = Instant::now();
                    idle_wait = Duration::from_micros(50);
                }
                Ok(None) => {
                    // Nothing new, and no error: a source error of before is over.
                    if source_reads_again(st, &tablet, pos) {
                        st.set_state(ShipState::Streaming);
                    }
                    if last_send.elapsed() >= shared.opts.keepalive_interval {
                        send.write_all(&wire::encode_keepalive(&tablet, pos, safe))
                            .await?;
                        last_send = Instant::now();
                        st.set_state(ShipState::Idle);
                    }
                    // Adaptive wait: quick right after data, then up to poll_interval.
                    tokio::time::sleep(idle_wait).await;
                    idle_wait = (idle_wait * 2)
                        .min(shared.opts.poll_interval.max(Duration::from_micros(50)));
                }
                Err(e @ TailError::NeedsBootstrap { .. }) => {
                    st.set_state(ShipState::NeedsBootstrap);
                    let _ = send
                        .write_all(&wire::encode_error("needs_bootstrap", &e.to_string()))
                        .await;
                    st.set_error(Some(e.to_string()));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    anyhow::bail!("{e}");
                }
                Err(e) => {
                    // The source cannot be read at `pos` (a damaged record, an I/O error):
                    // reconnecting would not help. The tablet stays in `error`, its stream
                    // open and kept alive at what was shipped, and the read is retried now
                    // and then (an operator may repair the source).
                    if ShipState::from_u8(st.state.load(Ordering::Relaxed)) != ShipState::Error {
                        tracing::error!(tablet = %tablet, "{e}; shipping of this tablet stopped");
                    }
                    st.set_state(ShipState::Error);
                    st.set_error(Some(e.to_string()));
                    send.write_all(&wire::encode_keepalive(&tablet, pos, safe))
                        .await?;
                    last_send = Instant::now();
                    let notified = st.resume.notified();
                    tokio::select! {
                        _ = notified => {}
                        _ = tokio::time::sleep(SOURCE_RETRY) => {}
                    }
                }
            }
        }
    };
    let r = tokio::select! {
        r = acks => r,
        r = sender => r,
        () = flusher => Ok(()),
    };
    let a = WalPos(st.acked.load(Ordering::Relaxed));
    if a > written.get() {
        write_acked(st, dir).await;
    }
    r
}
