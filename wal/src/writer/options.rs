//! The writer's options: the sync policy of a commit and [`WalOptions`].

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::format::{DEFAULT_SEGMENT_SIZE, MIN_SEGMENT_SIZE};

/// When a commit becomes durable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SyncPolicy {
    /// msync before `commit` returns.
    Always,
    /// Group commit: synced by a flusher within `batch_interval`, or once `batch_bytes` pend.
    #[default]
    Batch,
    /// Never synced by the writer; `durable_pos` follows `written_pos`.
    None,
}

impl fmt::Display for SyncPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SyncPolicy::Always => "always",
            SyncPolicy::Batch => "batch",
            SyncPolicy::None => "none",
        })
    }
}

impl FromStr for SyncPolicy {
    type Err = crate::ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(SyncPolicy::Always),
            "batch" => Ok(SyncPolicy::Batch),
            "none" => Ok(SyncPolicy::None),
            _ => Err(crate::ParseError::new(
                "sync policy",
                s,
                "expected always, batch or none",
            )),
        }
    }
}

/// Writer options.
#[derive(Clone, Debug)]
pub struct WalOptions {
    /// Size each segment file is preallocated to. Default 64 MiB.
    pub segment_size: u64,
    /// Group-commit interval for [`SyncPolicy::Batch`]. Default 5 ms.
    pub batch_interval: Duration,
    /// Pending bytes that make a batch commit sync at once. Default 4 MiB.
    pub batch_bytes: u64,
    /// Oldest segments go past this many retained bytes even when not acked; readers that
    /// want them get [`Error::Truncated`]. Default: no limit.
    pub max_retained_bytes: Option<u64>,
    /// Verify every sealed segment on open, not only the last one. Default false.
    pub verify_on_open: bool,
    /// Pre-fault each spare segment's mapping in the background, so that appends through
    /// the mapping ([`Writer::append`]) take no page faults. Default true. A log written
    /// only with [`Writer::append_encoded`] (through the file) gains nothing from it: the
    /// applier's received logs turn it off.
    pub prefault: bool,
    /// Write the active segment with `O_DIRECT` from an aligned staging buffer, around the
    /// page cache, and sync with `fdatasync` (module `direct`). For logs written in large
    /// verbatim runs: the copy into the page cache and its writeback are the cost it saves;
    /// readers then read from the device. Needs a segment size that is a multiple of
    /// 4 KiB (an active segment made earlier with another size is finished through the
    /// page cache); a file system that refuses `O_DIRECT` makes [`Writer::open`] fail.
    /// Default false.
    pub direct_io: bool,
    /// How far ahead of this host's wall clock a record's ht may be: [`Writer::append`]
    /// refuses one beyond `now + max_clock_skew` ([`Error::HtAhead`]), since a record from
    /// the future holds the target's safe time there and no later record can bring it back.
    /// The same bound as the applier's `max-clock-skew`. `None`: no bound (a log replayed
    /// from elsewhere). Records staged verbatim with [`Writer::append_encoded`] (another
    /// log's bytes: the receiving end applies its own bound) are not checked. Default
    /// 500 ms.
    pub max_clock_skew: Option<Duration>,
}

/// Default of [`WalOptions::max_clock_skew`].
pub const DEFAULT_MAX_CLOCK_SKEW: Duration = Duration::from_millis(500);

impl Default for WalOptions {
    fn default() -> Self {
        WalOptions {
            segment_size: DEFAULT_SEGMENT_SIZE,
            batch_interval: Duration::from_millis(5),
            batch_bytes: 4 << 20,
            max_retained_bytes: None,
            verify_on_open: false,
            prefault: true,
            direct_io: false,
            max_clock_skew: Some(DEFAULT_MAX_CLOCK_SKEW),
        }
    }
}

impl WalOptions {
    pub fn validate(&self) -> Result<()> {
        if self.segment_size < MIN_SEGMENT_SIZE {
            return Err(Error::Config(format!(
                "segment size {} is below the minimum {MIN_SEGMENT_SIZE}",
                self.segment_size
            )));
        }
        if self.segment_size > (1 << 40) {
            return Err(Error::Config(format!(
                "segment size {} is above 1 TiB",
                self.segment_size
            )));
        }
        if self.direct_io && self.segment_size % crate::direct::BLOCK as u64 != 0 {
            return Err(Error::Config(format!(
                "segment size {} is not a multiple of {} bytes, which direct I/O needs",
                self.segment_size,
                crate::direct::BLOCK
            )));
        }
        if self.batch_interval.is_zero() {
            return Err(Error::Config("batch interval must be positive".into()));
        }
        Ok(())
    }
}
