//! What the intake is started with: its options, the hook it calls as received logs
//! become durable, and the default clock-skew bound.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use tidelog_wal::{SyncPolicy, TabletId, WalOptions, WalPos};

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

/// The hook, as the intake and its writer threads share it.
pub(super) struct Hook(pub(super) Option<DurableHook>);

impl std::fmt::Debug for Hook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Hook(set)"
        } else {
            "Hook(none)"
        })
    }
}
