//! The applier store's error type: one enum whose variants callers branch on.

use std::path::PathBuf;

use tidelog_wal::{TabletId, WalPos};

use crate::disk::DiskFull;
use crate::keys::KeyError;

/// Result alias for the store and the apply stage.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the store and the apply stage can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The store under `path` does not open: `detail` says what failed, with what fjall
    /// found and, for its journal, the journal files.
    #[error("opening the store at {path}: {detail}")]
    Open { path: PathBuf, detail: String },

    /// fjall failed doing `op`.
    #[error("store {op}: {source}")]
    Store {
        op: &'static str,
        #[source]
        source: fjall::Error,
    },

    /// A value or key read back from the store is not in the documented layout
    /// (`applier/STORE.md`). Never skipped.
    #[error("corrupt store value for {key} in keyspace {keyspace}: {reason}")]
    Corrupt {
        keyspace: &'static str,
        key: String,
        reason: String,
    },

    /// A key in the `mvcc` keyspace does not decode.
    #[error("corrupt key in keyspace mvcc: {0}")]
    Key(#[from] KeyError),

    /// Records handed to `apply` do not continue the tablet's apply position, or a record
    /// position does not follow the previous record: applying them would skip or repeat.
    #[error("tablet {tablet}: records do not continue the apply position: expected a record at {expected}, got {got}")]
    Gap {
        tablet: TabletId,
        expected: WalPos,
        got: WalPos,
    },

    /// A caller passed something the store cannot accept.
    #[error("invalid argument: {0}")]
    Invalid(String),

    /// A record that passed its checksum cannot be applied: a key too long for the store's
    /// encoding, a commit that contradicts an earlier one, an ht that does not move the
    /// tablet forward. The tablet stops at it (state [`RECORD_REJECTED`]); nothing of it is
    /// applied, and the same record is refused again after a restart.
    #[error(
        "tablet {tablet}: the record at received-log position {pos} cannot be applied: {reason}"
    )]
    Rejected {
        tablet: TabletId,
        pos: WalPos,
        reason: String,
    },

    /// Applying panicked (a bug): caught, so that only this tablet stops.
    #[error("tablet {tablet}: applying the received log from position {from} panicked: {message}")]
    Panicked {
        tablet: TabletId,
        from: WalPos,
        message: String,
    },

    /// Reading the received log failed (corruption names tablet, file and offset).
    #[error("tablet {tablet}: received log: {source}")]
    Wal {
        tablet: TabletId,
        #[source]
        source: tidelog_wal::Error,
    },

    /// An operating-system call failed on `path`.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The worker was stopped or its thread died.
    #[error("apply worker for tablet {0} is shut down")]
    Shutdown(TabletId),

    /// The device is full: a write failed and nothing of it took effect. Retried once space
    /// returns, with no restart (the store is reopened if it has to be).
    #[error("{0}")]
    DiskFull(DiskFull),

    /// The store takes no writes for now: a write failed (fjall then refuses every later
    /// one) or it is being reopened. Retried.
    #[error("store {path} is unavailable: {reason}")]
    Unavailable { path: PathBuf, reason: String },
}

/// The state of a tablet whose apply stage stopped on a record it cannot apply
/// ([`Error::Rejected`]).
pub const RECORD_REJECTED: &str = "record_rejected";
/// The state of a tablet whose apply stage stopped with any other error.
pub const APPLY_FAILED: &str = "apply_failed";
/// The state of a tablet whose apply stage waits for space ([`Error::DiskFull`]); it
/// applies again on its own once there is.
pub const DISK_FULL: &str = "disk_full";
/// The state of a tablet whose apply stage waits for the store to be reopened after a
/// failed write that was not for lack of space ([`Error::Unavailable`]).
pub const STORE_UNAVAILABLE: &str = "store_unavailable";
/// Every state [`Error::tablet_state`] names (the metrics export each).
pub const APPLY_STATES: [&str; 4] = [RECORD_REJECTED, APPLY_FAILED, DISK_FULL, STORE_UNAVAILABLE];

impl Error {
    /// A full disk or a store that is being reopened: the work is retried later, nothing
    /// was lost.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Error::DiskFull(_) | Error::Unavailable { .. })
    }

    /// The operating-system error this one comes from, where the store, the received log
    /// or a file failed on I/O.
    pub fn io_cause(&self) -> Option<&std::io::Error> {
        match self {
            Error::Io { source, .. }
            | Error::Wal {
                source: tidelog_wal::Error::Io { source, .. },
                ..
            }
            | Error::Store {
                source:
                    fjall::Error::Io(source) | fjall::Error::Storage(fjall::LsmError::Io(source)),
                ..
            } => Some(source),
            _ => None,
        }
    }

    /// Whether this error comes from an I/O error saying "no space left"
    /// ([`crate::disk::is_no_space`]).
    pub fn is_no_space(&self) -> bool {
        self.io_cause().is_some_and(crate::disk::is_no_space)
    }

    /// The full disk this error reports, if it does.
    pub fn disk_full(&self) -> Option<&DiskFull> {
        match self {
            Error::DiskFull(d) => Some(d),
            _ => None,
        }
    }

    /// The state a tablet shows in status and metrics once its apply stage stopped (or
    /// holds) with this error: one of [`APPLY_STATES`].
    pub fn tablet_state(&self) -> &'static str {
        match self {
            Error::Rejected { .. } => RECORD_REJECTED,
            Error::DiskFull(_) => DISK_FULL,
            Error::Unavailable { .. } => STORE_UNAVAILABLE,
            _ => APPLY_FAILED,
        }
    }

    /// The text of a caught panic's payload.
    pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
        match payload.downcast_ref::<&str>() {
            Some(s) => (*s).to_string(),
            None => match payload.downcast_ref::<String>() {
                Some(s) => s.clone(),
                None => "a panic without a message".to_string(),
            },
        }
    }

    pub(crate) fn store(op: &'static str) -> impl FnOnce(fjall::Error) -> Error {
        move |source| Error::Store { op, source }
    }

    pub(crate) fn corrupt(
        keyspace: &'static str,
        key: impl Into<String>,
        reason: impl Into<String>,
    ) -> Error {
        Error::Corrupt {
            keyspace,
            key: key.into(),
            reason: reason.into(),
        }
    }
}
