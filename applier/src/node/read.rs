//! Reads and their time (docs/ARCHITECTURE.md, "Reads"): `latest`, an explicit `at`, or
//! the safe time for `consistent`, refused while the safe time is not initialized or
//! older than `max-staleness` (naming the laggiest tablet and, when it stopped, why),
//! never answered with silently stale data.

use std::time::Duration;

use tidelog_wal::{HybridTime, TabletId};

use super::applier::Applier;
use super::error::{Error, Result};
use crate::consistency::SafeTimeReport;
use crate::intake::TabletState;

/// At what time a read looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ReadMode {
    /// At the safe time (the default): atomic and ordered across tablets.
    #[default]
    Consistent,
    /// The newest applied data; may show part of a transaction.
    Latest,
    /// At an explicit time ≤ the safe time and within binlog retention.
    At(HybridTime),
}

impl ReadMode {
    /// The mode of a request's `mode` (`consistent`, the default, or `latest`) and `at`.
    pub fn parse(mode: Option<&str>, at: Option<HybridTime>) -> Result<ReadMode> {
        match (mode.unwrap_or("consistent"), at) {
            ("latest", Some(_)) => Err(Error::Invalid(
                "mode=latest and at=HT exclude each other".into(),
            )),
            ("latest", None) => Ok(ReadMode::Latest),
            ("consistent", Some(at)) => Ok(ReadMode::At(at)),
            ("consistent", None) => Ok(ReadMode::Consistent),
            (mode, _) => Err(Error::Invalid(format!(
                "mode {mode:?}: expected consistent or latest"
            ))),
        }
    }
}

/// One key as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Read {
    /// The value; `None` when the key is absent or deleted.
    pub value: Option<Vec<u8>>,
    /// The version read: its ht (a deletion's too); `None` when the key never existed.
    pub version_ht: Option<HybridTime>,
    /// The time read at.
    pub read_ht: HybridTime,
}

/// A prefix scan's page.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scan {
    /// (key, value, version ht), in key order.
    pub items: Vec<(Vec<u8>, Vec<u8>, HybridTime)>,
    /// More keys follow beyond `limit`.
    pub more: bool,
    pub read_ht: HybridTime,
}

fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl Applier {
    /// The time a read in `mode` looks at: `None` for `latest`, else a time no later than
    /// the safe time (see the module doc for what is refused).
    pub fn read_time(&self, mode: ReadMode) -> Result<Option<HybridTime>> {
        let at = match mode {
            ReadMode::Latest => return Ok(None),
            ReadMode::Consistent => None,
            ReadMode::At(at) => {
                // Versions older than the retention horizon may have been compacted away.
                let h = self.store().binlog_horizon()?;
                if at < h {
                    return Err(Error::Invalid(format!(
                        "at={at} is older than the retention horizon {h} (binlog-retention): the versions it would read may be gone"
                    )));
                }
                Some(at)
            }
        };
        let report = self.consistency().report();
        let Some(safe) = report.safe_time else {
            return Err(Error::SafeTimeUninitialized {
                reason: format!(
                    "{}{}",
                    self.uninitialized_reason(&report),
                    self.store_fault()
                ),
            });
        };
        if let Some(at) = at {
            if at > safe {
                return Err(Error::Invalid(format!(
                    "at={at} is above the safe time {safe}: not readable consistently yet"
                )));
            }
            return Ok(Some(at));
        }
        let lag = Duration::from_micros(now_micros().saturating_sub(safe.physical_micros()));
        let max = self.inner.opts.max_staleness;
        // A promoted target's safe time is its cut, final: never stale.
        if lag > max && self.consistency().cut().is_none() {
            let laggiest = match &report.laggiest {
                None => "?".to_string(),
                Some(t) => match self.tablet_stopped(t) {
                    Some(why) => format!("{t}, {why}"),
                    None => t.to_string(),
                },
            };
            return Err(Error::StaleSafeTime(format!(
                "safe time {safe} is {} behind now (max-staleness {}); laggiest tablet {laggiest}{}",
                humantime::format_duration(Duration::from_millis(lag.as_millis() as u64)),
                humantime::format_duration(max),
                self.store_fault()
            )));
        }
        Ok(Some(safe))
    }

    /// The time a `latest` read was at: the newest tablet safe time (the cut on a promoted
    /// target).
    fn latest_ht(&self) -> HybridTime {
        if let Some(c) = self.store().cut() {
            return c;
        }
        let w = self.inner.workers.workers();
        w.values().map(|w| w.safe_time()).max().unwrap_or_default()
    }

    /// Reads `key` in `mode`. Blocking (store reads): call it off an async runtime.
    pub fn read(&self, key: &[u8], mode: ReadMode) -> Result<Read> {
        let at = self.read_time(mode)?;
        let v = self.store().get(key, at)?;
        let read_ht = at.unwrap_or_else(|| self.latest_ht());
        let (value, version_ht) = match v {
            Some(v) => (v.value, Some(v.ht)),
            None => (None, None),
        };
        Ok(Read {
            value,
            version_ht,
            read_ht,
        })
    }

    /// Up to `limit` keys starting with `prefix`, in `mode`. Blocking.
    pub fn scan(&self, prefix: &[u8], mode: ReadMode, limit: usize) -> Result<Scan> {
        let at = self.read_time(mode)?;
        let (items, more) = self.store().scan(prefix, at, limit)?;
        let read_ht = at.unwrap_or_else(|| self.latest_ht());
        Ok(Scan {
            items,
            more,
            read_ht,
        })
    }

    /// `; the store takes no writes: <why>` while it does not (a full disk names the path),
    /// else nothing: what holds every tablet's apply stage and the safe time.
    fn store_fault(&self) -> String {
        match self.store().fault() {
            Some(e) => format!("; the store takes no writes until it is reopened: {e}"),
            None => String::new(),
        }
    }

    /// Why tablet `t` makes no progress when that is a fault rather than a wait: its apply
    /// stage stopped (`stopped (record_rejected): apply stopped at received-log position
    /// P: …`), waits for space (`disk_full`), or its intake refuses frames beyond the clock
    /// (`clock_skew`) or cannot write its received log. `None` for a tablet that is only
    /// behind or idle.
    pub fn tablet_stopped(&self, t: &TabletId) -> Option<String> {
        if let Some(f) = self.inner.workers.workers().get(t).and_then(|w| w.fault()) {
            let how = if f.error.is_retryable() {
                "waits"
            } else {
                "stopped"
            };
            return Some(format!("{how} ({}): {f}", f.state()));
        }
        let ti = self.intake().tablet(t)?;
        let why = ti.status().error.unwrap_or_default();
        match ti.state() {
            // Its received log cannot be written: nothing new reaches its apply stage.
            TabletState::DiskFull => Some(format!(
                "waits (disk_full): its intake waits for space: {why}"
            )),
            TabletState::Failed => Some(format!("stopped (failed): its intake stopped: {why}")),
            _ => ti
                .clock_skew()
                .map(|skew| format!("refusing its frames (clock_skew): {skew}")),
        }
    }

    /// Why the safe time is not initialized: a tablet that has not reported because it
    /// stopped before its first record was applied is named with its fault (a stopped
    /// tablet is preferred to one that is only waiting for its first record), else the
    /// core's reason.
    pub fn uninitialized_reason(&self, r: &SafeTimeReport) -> String {
        let unreported = r
            .tablets
            .iter()
            .filter(|(_, h)| **h == HybridTime::MIN)
            .map(|(t, _)| t);
        for t in unreported.chain(r.laggiest.as_ref()) {
            if let Some(why) = self.tablet_stopped(t) {
                return format!("tablet {t} has no record applied: it {why}");
            }
        }
        r.uninitialized_reason
            .clone()
            .unwrap_or_else(|| "no tablet has reported yet".into())
    }
}
