//! What a call on the front door ([`super::Applier`]) can fail with: one variant per answer
//! a caller branches on. The admin API maps each to its HTTP status and error code
//! ([`Error::code`]); the message is the variant's `Display`.

use tidelog_wal::HybridTime;

/// Result alias of the front door.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the front door's calls fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request itself is wrong (a read mode, an `at` outside what can be read, an
    /// unknown tablet): the caller must change it.
    #[error("{0}")]
    Invalid(String),

    /// A consistent read before every registered tablet has reported (or while the store
    /// is being reopened): `reason` names the tablet and why.
    #[error("safe time is not initialized: {reason}")]
    SafeTimeUninitialized { reason: String },

    /// A consistent read while `now − safe time > max-staleness`: the message names the
    /// laggiest tablet and, if it stopped, why.
    #[error("{0}")]
    StaleSafeTime(String),

    /// Every place for a request that waits on the safe time is taken.
    #[error("{max} requests are waiting already, the most this daemon parks at once; retry later, or ask without waiting")]
    TooManyWaiters { max: usize },

    /// A promotion before the safe time is initialized: there is no clean cut.
    #[error("cannot promote: safe time is not initialized ({reason}), so there is no clean cut")]
    NoCleanCut { reason: String },

    /// A promotion whose safe time vanished between the check and the cut.
    #[error("safe time vanished")]
    SafeTimeVanished,

    /// Pausing or resuming intake on a promoted target, which takes no shipped logs.
    #[error("cannot {what}: this target was promoted to primary at the cut {cut} and accepts no shipped logs")]
    Promoted { what: &'static str, cut: HybridTime },

    /// A binlog read from a gtid that binlog retention removed.
    #[error("gtid {gtid} was removed by binlog retention; the oldest retained in domain {domain} is {oldest}")]
    GtidExpired {
        gtid: tidelog_wal::Gtid,
        domain: u32,
        oldest: tidelog_wal::Gtid,
    },

    /// A binlog read from a gtid that is not visible at the safe time (not yet, or never).
    #[error("gtid {gtid} is not in the visible binlog (safe time {safe_time})")]
    GtidNotVisible {
        gtid: tidelog_wal::Gtid,
        safe_time: HybridTime,
    },

    /// The store failed (a full disk and a store being reopened included:
    /// [`crate::error::Error::is_retryable`]).
    #[error(transparent)]
    Store(#[from] crate::error::Error),

    /// Anything else (a task that panicked, the intake failing to start).
    #[error("{0:#}")]
    Other(anyhow::Error),
}

impl Error {
    /// The stable snake_case code the admin API answers with (`{"error": code}`).
    pub fn code(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "bad_request",
            Error::SafeTimeUninitialized { .. }
            | Error::NoCleanCut { .. }
            | Error::SafeTimeVanished => "safe_time_uninitialized",
            Error::StaleSafeTime(_) => "stale_safe_time",
            Error::TooManyWaiters { .. } => "too_many_waiters",
            Error::Promoted { .. } => "promoted",
            Error::GtidExpired { .. } => "gtid_expired",
            Error::GtidNotVisible { .. } => "gtid_not_visible",
            Error::Store(crate::error::Error::DiskFull(_)) => "disk_full",
            Error::Store(crate::error::Error::Unavailable { .. }) => "store_unavailable",
            Error::Store(_) | Error::Other(_) => "internal",
        }
    }
}
