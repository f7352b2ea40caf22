//! What the applier reports about itself: its status (role, cutover, store, per-tablet
//! pipeline positions and states) and the liveness of the threads that do the work.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tidelog_net::UdpReceiveBuffer;
use tidelog_wal::{HybridTime, TabletId};

use super::applier::Applier;
use super::error::Result;
use super::warm::WarmState;
use crate::apply::YieldStatus;
use crate::store::{Role, StoreMemory};

/// One tablet through the pipeline: received, applied, visible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TabletStatus {
    /// Durable end of its received log (acknowledged to the shipper).
    pub received_pos: u64,
    pub applied_pos: u64,
    /// Its safe time as applied, and as received.
    pub safe_time: HybridTime,
    pub received_safe_time: HybridTime,
    /// Its intake state, or its apply stage's when that stopped or holds.
    pub state: &'static str,
    /// Totals over the target's life.
    pub received_records: u64,
    pub applied_records: u64,
    /// The shipper streaming it.
    pub shipper: Option<String>,
    pub last_frame_ms_ago: Option<u64>,
    /// Why it stopped or holds (its apply stage's fault first).
    pub error: Option<String>,
}

/// The store: where it lives, whether it takes writes, how often it was reopened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreStatus {
    pub path: std::path::PathBuf,
    /// `None` while it takes writes; else why not.
    pub fault: Option<String>,
    /// A full disk (`disk_full`) rather than another failed write (`unavailable`).
    pub disk_full: bool,
    pub reopened: u64,
}

/// A promoted target's cutover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CutoverStatus {
    pub cut: HybridTime,
    pub cut_time_us: u64,
    pub cleanup_done: bool,
    /// Versions above the cut removed so far (over all runs of the clean-up).
    pub removed_versions: u64,
}

/// A nice value as configured and whether the threads got it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NiceStatus {
    pub configured: i32,
    /// Threads it was set on; `Err`: why it could not be.
    pub set: std::result::Result<usize, String>,
    /// Threads that refused it (logged).
    pub refused: usize,
}

/// A setting as configured and as in effect (the file system may refuse `O_DIRECT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    pub configured: bool,
    pub in_use: bool,
}

/// The answer of [`Applier::status`].
#[derive(Clone, Debug)]
pub struct Status {
    pub role: Role,
    pub cutover: Option<CutoverStatus>,
    pub store: StoreStatus,
    pub safe_time: Option<HybridTime>,
    /// Where shippers connect.
    pub listen: Option<SocketAddr>,
    pub udp_receive_buffer: UdpReceiveBuffer,
    pub lookup_cache: WarmState,
    pub lookup_index_bytes: u64,
    pub cache_size: u64,
    pub memory: StoreMemory,
    pub apply_nice: NiceStatus,
    pub store_nice: NiceStatus,
    pub apply_yield: YieldStatus,
    pub received_direct_io: Setting,
    pub received_direct_io_in_catch_up: Setting,
    /// Requests parked on the safe time, and the most that may be.
    pub waiters: (usize, usize),
    pub tablets: BTreeMap<TabletId, TabletStatus>,
}

impl Applier {
    /// Every tablet the intake knows, through the pipeline. Blocking (one store read per
    /// tablet).
    pub fn tablets(&self) -> BTreeMap<TabletId, TabletStatus> {
        let workers = self.inner.workers.workers();
        let base = self.inner.workers.base_records();
        let mut rows = BTreeMap::new();
        for ti in self.intake().tablets() {
            let st = ti.status();
            let t = &ti.tablet;
            let meta = self.store().tablet(t).ok().flatten().unwrap_or_default();
            // Without a worker (a promoted target, or before it starts): as the store has it.
            let (applied, safe, fault, before_start) = match workers.get(t) {
                Some(w) => (
                    w.applied_pos().0,
                    w.safe_time(),
                    w.fault(),
                    w.records_below(),
                ),
                None => (meta.applied_pos.0, meta.safe_time, None, 0),
            };
            let applied_records = meta.applied_records;
            // Totals over the target's life, both: applied as stored; received = applied
            // when the worker started + applied since from before the intake opened the
            // log + what the intake received since.
            let received_records =
                base.get(t).copied().unwrap_or(applied_records) + before_start + st.records;
            rows.insert(
                t.clone(),
                TabletStatus {
                    received_pos: st.received_pos,
                    applied_pos: applied,
                    safe_time: safe,
                    received_safe_time: HybridTime(st.safe_time),
                    state: fault.as_ref().map_or(st.state, |f| f.state()),
                    received_records,
                    applied_records,
                    shipper: st.shipper,
                    last_frame_ms_ago: st.last_frame_ms_ago,
                    error: fault.map(|f| f.to_string()).or(st.error),
                },
            );
        }
        rows
    }

    /// The applier's status. Blocking (store reads). While the store is being reopened
    /// (after a full disk) it still answers: the role from the safe time's state, no
    /// cutover details.
    pub fn status(&self) -> Result<Status> {
        let store = self.store();
        let role = match store.role() {
            Ok(r) => r,
            Err(e) if e.is_retryable() && self.consistency().cut().is_some() => Role::Primary,
            Err(e) if e.is_retryable() => Role::Standby,
            Err(e) => return Err(e.into()),
        };
        let cutover = match store.cutover() {
            Ok(c) => c,
            Err(e) if e.is_retryable() => None,
            Err(e) => return Err(e.into()),
        };
        let cutover = match cutover {
            None => None,
            Some(c) => {
                // The running clean-up's count, else the total its runs persisted.
                let running = self
                    .inner
                    .cleanup
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .as_ref()
                    .map(|c| c.progress.removed.load(Ordering::Relaxed));
                let removed_versions = match running {
                    Some(n) => n,
                    None => store.cutover_removed()?,
                };
                Some(CutoverStatus {
                    cut: c.cut,
                    cut_time_us: c.cut_time_us,
                    cleanup_done: c.cleaned,
                    removed_versions,
                })
            }
        };
        let fault = store.fault();
        let intake = self.intake();
        let (set, refused) = crate::priority::stage_nice_counts();
        let o = &self.inner.opts;
        Ok(Status {
            role,
            cutover,
            store: StoreStatus {
                path: store.path().to_path_buf(),
                disk_full: fault.as_ref().is_some_and(|e| e.disk_full().is_some()),
                fault: fault.map(|e| e.to_string()),
                reopened: store.generation(),
            },
            safe_time: self.consistency().safe_time(),
            listen: intake.local_addr().ok(),
            udp_receive_buffer: intake.udp_receive_buffer(),
            lookup_cache: WarmState::load(&self.inner.lookup_cache),
            lookup_index_bytes: store.lookup_index_bytes(),
            cache_size: o.store.cache_size,
            memory: store.memory(),
            apply_nice: NiceStatus {
                configured: o.apply_nice,
                set: Ok(set),
                refused,
            },
            store_nice: NiceStatus {
                configured: o.store_nice,
                set: self.inner.store_nice.clone(),
                refused: 0,
            },
            apply_yield: self.inner.workers.threads.yield_status(),
            received_direct_io: Setting {
                configured: o.intake.direct_io,
                in_use: intake.direct_io(),
            },
            received_direct_io_in_catch_up: Setting {
                configured: o.intake.direct_io_in_catch_up,
                in_use: intake.direct_io_in_catch_up(),
            },
            waiters: (self.inner.waiters.waiting(), self.inner.waiters.max()),
            tablets: self.tablets(),
        })
    }

    /// `Some` names a thread that does the work and has shown no sign of life for longer
    /// than `limit`: an apply worker, a received-log writer, the safe-time publisher. One
    /// that ended on an error (a failed tablet) is reported by status and metrics instead:
    /// restarting would not mend a corrupt log.
    pub fn stalled(&self, limit: Duration) -> Option<String> {
        for (t, w) in self.inner.workers.workers().iter() {
            let age = w.last_progress().elapsed();
            if w.is_running() && age > limit {
                return Some(format!(
                    "the apply worker of tablet {t} has shown no progress for {age:?}"
                ));
            }
        }
        for ti in self.intake().tablets() {
            let age = ti.last_progress().elapsed();
            if ti.writer_running() && age > limit {
                return Some(format!(
                    "the received-log writer of tablet {} has shown no progress for {age:?}",
                    ti.tablet
                ));
            }
        }
        let age = self.consistency().last_progress()?.elapsed();
        (age > limit).then(|| format!("the safe-time publisher has shown no progress for {age:?}"))
    }
}
