//! The crate's error type: one enum whose variants callers branch on.

use std::path::PathBuf;

use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::time::HybridTime;

/// Result alias for the WAL crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything the WAL can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// An operating-system call failed on `path`.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// Bytes on disk are not what the format says they must be. Never skipped.
    #[error("corruption in tablet {tablet}, file {file}, offset {offset}: {reason}")]
    Corruption {
        tablet: String,
        file: PathBuf,
        offset: u64,
        reason: String,
    },

    /// A file that does not belong in a tablet directory.
    #[error("unexpected file {path} in WAL directory: {reason}")]
    UnexpectedFile { path: PathBuf, reason: String },

    /// The record's hybrid time does not move the tablet's time forward.
    #[error("tablet {tablet}: record ht {ht} is not greater than the last ht {last}; refused, nothing written")]
    NonMonotonicHt {
        tablet: TabletId,
        ht: HybridTime,
        last: HybridTime,
    },

    /// A record or one of its parts exceeds a format limit. `tablet` names the log a
    /// writer refused it for (`None` where no tablet is known, e.g. [`Record::encode`]).
    ///
    /// [`Record::encode`]: crate::Record::encode
    #[error("{}record too large: {what} is {len} bytes, limit {max}", tablet_prefix(.tablet))]
    TooLarge {
        tablet: Option<TabletId>,
        what: &'static str,
        len: usize,
        max: usize,
    },

    /// A record's hybrid time lies further ahead of this host's wall clock than the
    /// writer's allowed clock skew ([`WalOptions::max_clock_skew`]): appended, it would
    /// hold the target's safe time in the future. Nothing is written.
    ///
    /// [`WalOptions::max_clock_skew`]: crate::WalOptions::max_clock_skew
    #[error("tablet {tablet}: record ht {ht} is {ahead_ms} ms ahead of this host's clock (now {now}), more than the allowed clock skew of {max_ms} ms; refused, nothing written")]
    HtAhead {
        tablet: TabletId,
        ht: HybridTime,
        now: HybridTime,
        ahead_ms: u64,
        max_ms: u64,
    },

    /// A record is well-formed bytes but not a valid record (bad field).
    #[error("invalid record: {0}")]
    InvalidRecord(String),

    /// The position asked for has been removed by retention: the reader needs a bootstrap.
    #[error("tablet {tablet}: position {requested} was removed by retention (oldest retained {oldest}); needs bootstrap")]
    Truncated {
        tablet: TabletId,
        requested: WalPos,
        oldest: WalPos,
    },

    /// A position that is beyond the readable end, or not on a record boundary.
    #[error("tablet {tablet}: bad position {pos}: {reason}")]
    BadPosition {
        tablet: TabletId,
        pos: WalPos,
        reason: String,
    },

    /// Another writer holds the tablet.
    #[error("tablet {tablet} at {path} is locked by another writer")]
    Locked { tablet: TabletId, path: PathBuf },

    /// A configuration value is out of range.
    #[error("bad configuration: {0}")]
    Config(String),

    /// The tablet does not exist (no directory).
    #[error("tablet {tablet} not found under {path}")]
    NoTablet { tablet: TabletId, path: PathBuf },
}

fn tablet_prefix(tablet: &Option<TabletId>) -> String {
    match tablet {
        Some(t) => format!("tablet {t}: "),
        None => String::new(),
    }
}

impl Error {
    /// `TooLarge { what, len, max }` without a tablet.
    pub(crate) fn too_large(what: &'static str, len: usize, max: usize) -> Self {
        Error::TooLarge {
            tablet: None,
            what,
            len,
            max,
        }
    }

    /// The error, naming `tablet` where it says which record was refused.
    pub(crate) fn in_tablet(self, t: &TabletId) -> Self {
        match self {
            Error::TooLarge {
                tablet: None,
                what,
                len,
                max,
            } => Error::TooLarge {
                tablet: Some(t.clone()),
                what,
                len,
                max,
            },
            Error::InvalidRecord(reason) => Error::InvalidRecord(format!("tablet {t}: {reason}")),
            other => other,
        }
    }

    /// An I/O error of `op` on `path`.
    pub fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }

    /// True when the error is the "needs bootstrap" case.
    pub fn is_truncated(&self) -> bool {
        matches!(self, Error::Truncated { .. })
    }

    /// True for on-disk corruption.
    pub fn is_corruption(&self) -> bool {
        matches!(self, Error::Corruption { .. })
    }
}

/// Error from parsing one of the id or time types out of text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {what} {input:?}: {reason}")]
pub struct ParseError {
    pub what: &'static str,
    pub input: String,
    pub reason: String,
}

impl ParseError {
    pub(crate) fn new(what: &'static str, input: &str, reason: impl Into<String>) -> Self {
        // Keep error messages bounded even for huge inputs.
        let input = if input.len() > 80 {
            let mut end = 80;
            while !input.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}…", &input[..end])
        } else {
            input.to_string()
        };
        ParseError {
            what,
            input,
            reason: reason.into(),
        }
    }
}
