//! `WalPos`: a byte position in a tablet's log, and its atomic twin for published watermarks.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::error::ParseError;

/// A byte offset in a tablet's logical log (the concatenation of all its records; segment
/// headers are not counted). Record boundaries are the only valid read positions.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct WalPos(pub u64);

impl WalPos {
    pub const ZERO: WalPos = WalPos(0);

    pub fn get(self) -> u64 {
        self.0
    }

    /// `self + n`; panics on overflow only in debug (positions never come near 2^64).
    #[allow(clippy::should_implement_trait)]
    pub fn add(self, n: u64) -> WalPos {
        WalPos(self.0 + n)
    }

    /// Bytes from `earlier` to `self`, zero when `earlier` is ahead.
    pub fn since(self, earlier: WalPos) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for WalPos {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for WalPos {
    type Err = ParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        let parsed = if let Some(hex) = t.strip_prefix("0x") {
            u64::from_str_radix(hex, 16)
        } else {
            t.parse::<u64>()
        };
        parsed.map(WalPos).map_err(|e| {
            ParseError::new(
                "WAL position",
                s,
                format!("expected a decimal (or 0x hex) u64: {e}"),
            )
        })
    }
}

/// A `WalPos` published by one thread and read by others.
#[derive(Debug, Default)]
pub struct AtomicWalPos(AtomicU64);

impl AtomicWalPos {
    pub fn new(p: WalPos) -> Self {
        AtomicWalPos(AtomicU64::new(p.0))
    }
    /// Acquire: a reader that sees position p also sees the bytes below p.
    pub fn load(&self) -> WalPos {
        WalPos(self.0.load(Ordering::Acquire))
    }
    /// Release: publish p after the bytes below p are written.
    pub fn store(&self, p: WalPos) {
        self.0.store(p.0, Ordering::Release)
    }
    /// Raise to `p` if it is higher; returns the previous value.
    pub fn fetch_max(&self, p: WalPos) -> WalPos {
        WalPos(self.0.fetch_max(p.0, Ordering::AcqRel))
    }
}
