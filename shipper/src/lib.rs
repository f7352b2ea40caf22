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
//!
//! The protocol's rules are `tidelog-proto`'s I/O-free machines (`ShipControl`,
//! `ShipStream`, `Backoff`); this crate reads the WAL and moves bytes: `lane.rs` runs a
//! lane's connection and control stream, `stream.rs` a tablet's streams, `tail.rs` the WAL
//! reads, and this file the shipper's front door, its status and the scanner.

pub mod io;
mod lane;
pub mod metrics;
mod stream;
pub mod tail;
mod watch;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use tidelog_wal::control::ControlView;
use tidelog_wal::{Heartbeat, TabletId, WalPos};
use tokio::sync::{mpsc, Notify};

use crate::io::{IoChoice, IoEngine};
pub use crate::lane::client_endpoint;
use crate::lane::run_lane;
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
    pub quic: tidelog_net::QuicTuning,
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
            quic: tidelog_net::QuicTuning::default(),
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

pub(crate) fn tablet_state(shared: &Shared, t: &TabletId) -> Option<Arc<TabletShip>> {
    shared
        .tablets
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(t)
        .cloned()
}

/// The next bytes the applier sent on a stream; `None` at its end.
pub(crate) async fn read_bytes(recv: &mut quinn::RecvStream) -> Result<Option<bytes::Bytes>> {
    Ok(recv.read_chunk(usize::MAX, true).await?.map(|c| c.bytes))
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
