//! A tablet's received log and its writer thread: frames staged in order (a frame that does
//! not continue the log, or whose records do not verify, is refused with the rest of its
//! stream), one sync per group, then the durable end published for the acks; a full disk
//! waits for space, any other failure stops the tablet's intake. Nothing is published as
//! durable before its sync.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use tidelog_proto::intake::Durable;
use tidelog_wal::{SyncPolicy, TabletId, WalOptions, Writer};
use tokio::sync::watch;

use super::options::{Hook, IntakeOptions};
use super::state::{IntakeActivity, TabletState, RECEIVED_CACHE_KEEP};
use super::tablet::{lock, TabletIntake, WriteReq};
use crate::frame_queue::FrameQueue;

/// What a writer thread takes from the intake it belongs to.
pub(super) struct WriterCtx {
    /// Told of each durable group (a catch-up is in progress while large frames arrive).
    pub(super) activity: Arc<IntakeActivity>,
    /// Segments begun during a catch-up are written with `O_DIRECT`.
    pub(super) direct_io_in_catch_up: bool,
    /// Called with each durable end.
    pub(super) hook: Arc<Mutex<Hook>>,
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
pub(super) struct ReceivedLog {
    pub(super) root: PathBuf,
    pub(super) tablet: TabletId,
    pub(super) opts: WalOptions,
}

impl ReceivedLog {
    pub(super) fn open(&self) -> tidelog_wal::Result<Writer> {
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
    pub(super) fn no_space(&self, e: &tidelog_wal::Error) -> Option<String> {
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
pub(super) fn writer_thread(
    w: Option<Writer>,
    log: ReceivedLog,
    queue: &FrameQueue<WriteReq>,
    out: watch::Sender<Durable>,
    ti: Arc<TabletIntake>,
    shared: WriterCtx,
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
