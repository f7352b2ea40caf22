//! One tablet's intake: what its stream tasks and its writer thread share, and what status
//! shows of it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use tidelog_proto::intake::{Claims, Durable};
use tidelog_wal::{Heartbeat, HybridTime, TabletId, WalPos};
use tokio::sync::watch;

use super::state::TabletState;
use crate::frame_queue::FrameQueue;
use crate::latency::{HistogramSnapshot, LatencyHistogram};

/// One frame on its way to the writer thread.
pub(super) struct WriteReq {
    pub(super) stream: u64,
    pub(super) first: WalPos,
    pub(super) payload: Bytes,
}

/// The intake side of one tablet.
#[derive(Debug)]
pub struct TabletIntake {
    pub tablet: TabletId,
    /// The received log's end when this process opened it: `records` and `bytes` count
    /// what was written after it.
    pub(super) opened_at: WalPos,
    /// Which connection owns which tablet (the intake's, shared by its tablets).
    pub(super) claims: Arc<Mutex<Claims>>,
    pub(super) state: AtomicU8,
    pub(super) paused: AtomicBool,
    pub(super) received_pos: AtomicU64,
    pub(super) safe_time: AtomicU64,
    pub(super) records: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) last_frame_ms: AtomicU64,
    pub(super) queue: Arc<FrameQueue<WriteReq>>,
    pub(super) durable: watch::Receiver<Durable>,
    pub(super) thread: Mutex<Option<JoinHandle<()>>>,
    pub(super) last_error: Mutex<Option<String>>,
    /// `last_error` is set (read on every frame without taking its lock).
    pub(super) has_error: AtomicBool,
    /// Why the last data frame was refused for clock skew, until one passes the check.
    pub(super) skew: Mutex<Option<String>>,
    /// Set at shutdown: the writer thread finishes its queue and exits.
    pub(super) stop: AtomicBool,
    /// Held by the writer thread from its check of `paused` until its group is written and
    /// published, so that [`Intake::set_paused`] can wait out a group in progress: once a
    /// pause answers, nothing more reaches the received log.
    pub(super) write_gate: Mutex<()>,
    /// Beats once per writer-thread iteration (at least every 50 ms while idle).
    pub(super) heartbeat: Heartbeat,
    /// Frames refused as malformed (bad header or body, bad record, wrong position).
    pub(super) frame_errors: AtomicU64,
    /// Of those, frames whose message or record checksum did not match.
    pub(super) checksum_errors: AtomicU64,
    /// Age of the newest record of each group when it became durable (the `received` lag
    /// stage).
    pub(super) received_age: LatencyHistogram,
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
    pub(super) fn set_clock_skew(&self, reason: Option<String>) {
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
    pub(super) fn set_error(&self, e: impl Into<String>) {
        *lock(&self.last_error) = Some(e.into());
        self.has_error.store(true, Ordering::Release);
    }

    /// The error shown so far no longer holds.
    pub(super) fn clear_error(&self) {
        if self.has_error.swap(false, Ordering::AcqRel) {
            *lock(&self.last_error) = None;
        }
    }

    /// A stream delivered a frame or keep-alive: the shipper ships again, so what it
    /// reported before (`needs_bootstrap`) or a stream that was refused is over. A failed or
    /// full received log keeps its error: that ends only on the writer's side.
    pub(super) fn shipping_again(&self) {
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
    pub(super) fn count_frame_error(&self, checksum: bool) {
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

pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

pub(super) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
