//! The intake's state shared by its tasks: its tablets (each made with its received log and
//! writer thread on first use), the claims, the live connections, the hook.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use tidelog_proto::intake::{Claims, Durable};
use tidelog_wal::{Heartbeat, TabletId, WalPos, Writer};
use tokio::sync::watch;

use super::options::{Hook, IntakeOptions};
use super::state::{IntakeActivity, TabletState};
use super::tablet::{lock, TabletIntake};
use super::writer::{writer_thread, ReceivedLog, WriterCtx};
use crate::frame_queue::FrameQueue;
use crate::latency::LatencyHistogram;

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) opts: IntakeOptions,
    pub(super) tablets: Mutex<BTreeMap<TabletId, Arc<TabletIntake>>>,
    /// Which live connection ships each tablet (one shipper per tablet).
    pub(super) claims: Arc<Mutex<Claims>>,
    pub(super) conn_ids: AtomicU64,
    pub(super) stream_ids: AtomicU64,
    /// Intake stopped (pause of all, or promote): new connections are refused.
    pub(super) closed: AtomicBool,
    pub(super) paused_all: AtomicBool,
    pub(super) hook: Arc<Mutex<Hook>>,
    /// Set by a cutover: every tablet a shipper announces is refused with this reason.
    pub(super) refusal: Mutex<Option<String>>,
    /// Live shipper connections, so a cutover can close them.
    pub(super) conns: Mutex<BTreeMap<u64, quinn::Connection>>,
    pub(super) activity: Arc<IntakeActivity>,
    /// The received logs are written with `O_DIRECT`: asked for, and the file system takes
    /// it.
    pub(super) direct_io: bool,
    /// Their segments begun during a catch-up are (asked for, and the file system takes it).
    pub(super) direct_io_in_catch_up: bool,
}

impl Shared {
    /// The tablet's intake, creating it (and its received log) on first use.
    pub(super) fn tablet(self: &Arc<Self>, t: &TabletId) -> Result<Arc<TabletIntake>> {
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
        let ti2 = ti.clone();
        let shared = WriterCtx {
            activity: self.activity.clone(),
            direct_io_in_catch_up: self.direct_io_in_catch_up,
            hook: self.hook.clone(),
        };
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

    pub(super) fn owned_by(&self, ti: &TabletIntake, conn_id: u64) -> bool {
        lock(&self.claims).owned_by(&ti.tablet, conn_id)
    }

    /// Connection `conn_id` ended: its tablets are free, and no longer streaming.
    pub(super) fn release(&self, conn_id: u64) {
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
