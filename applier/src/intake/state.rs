//! What status shows of the intake: the states of a tablet's intake, and whether a
//! catch-up is in progress.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Tablet intake states, as shown in status (their names in snake_case).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, strum::FromRepr, strum::VariantArray, strum::IntoStaticStr,
)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum TabletState {
    /// Registered, no shipper connected.
    Disconnected = 0,
    /// A shipper streams it.
    Streaming = 1,
    /// The shipper reported that the source no longer has what we need.
    NeedsBootstrap = 2,
    /// The received log failed (I/O); intake for it stopped.
    Failed = 3,
    /// Intake paused by the operator.
    Paused = 4,
    /// Frames refused: their hts are beyond this host's clock plus `max-clock-skew`.
    ClockSkew = 5,
    /// The received log cannot be written for lack of space (the error names the path):
    /// intake stopped, nothing of the frames in question acked; it resumes on its own once
    /// space returns.
    DiskFull = 6,
}

impl TabletState {
    /// Every state, in their numbering order (the metrics export each).
    pub const ALL: &'static [TabletState] = <TabletState as strum::VariantArray>::VARIANTS;

    /// `disconnected`, `streaming`, `needs_bootstrap`, … as status shows it.
    pub fn name(self) -> &'static str {
        self.into()
    }

    /// The state stored as `v` (`disconnected` for anything unknown).
    pub(super) fn from_u8(v: u8) -> TabletState {
        TabletState::from_repr(v).unwrap_or(TabletState::Disconnected)
    }
}

#[cfg(test)]
#[test]
fn tablet_state_all_lists_every_state_once() {
    let all: Vec<_> = (0..TabletState::ALL.len() as u8)
        .map(TabletState::from_u8)
        .collect();
    assert_eq!(all, TabletState::ALL);
    // Past the last one, `from_u8` falls back to the first.
    assert_eq!(
        TabletState::from_u8(TabletState::ALL.len() as u8),
        TabletState::ALL[0]
    );
}

/// Only frames of a backlog's size count as a catch-up, and only for a while.
#[cfg(test)]
#[test]
fn small_frames_are_not_a_catch_up_and_a_large_one_is_for_a_while() {
    // An epoch well in the past, so that "long ago" can be set below.
    let a = IntakeActivity {
        epoch: Instant::now()
            .checked_sub(Duration::from_secs(10))
            .unwrap_or_else(Instant::now),
        last_backlog_ms: AtomicU64::new(0),
    };
    assert!(!a.catching_up(), "nothing received yet");
    a.group_durable(BACKLOG_FRAME - 1);
    assert!(!a.catching_up(), "a frame below the backlog size");
    a.group_durable(BACKLOG_FRAME);
    assert!(a.catching_up());
    // Moved back past the window, as if made durable long ago.
    a.last_backlog_ms
        .store(a.now_ms() - 1000, Ordering::Relaxed);
    assert!(!a.catching_up(), "a large frame long ago");
}

/// When the intake last made a large frame durable: one of at least [`BACKLOG_FRAME`]
/// bytes, which a shipper sends only when it has that much to send at once — a transfer
/// that is behind the source (a catch-up after an outage, a bulk load). A shipper that keeps
/// up sends what was made durable since its last read, frames of a few KiB at tens of
/// thousands of transactions a second. With the apply threads' own state (their last
/// batches were full) it tells a catch-up in progress, during which the apply threads can
/// be told to hold back ([`crate::apply::ApplyThreads::yield_to_intake`]): durable receipt
/// (what a disaster loses) goes before target freshness.
#[derive(Debug)]
pub struct IntakeActivity {
    epoch: Instant,
    /// Milliseconds since `epoch` (+1) of the last large durable frame; 0: none yet.
    last_backlog_ms: AtomicU64,
}

impl Default for IntakeActivity {
    fn default() -> Self {
        IntakeActivity {
            epoch: Instant::now(),
            last_backlog_ms: AtomicU64::new(0),
        }
    }
}

/// Bytes of each received log below its durable end kept in the page cache (with buffered
/// received logs); an apply stage further behind reads with `O_DIRECT`.
pub const RECEIVED_CACHE_KEEP: u64 = 64 << 20;

/// A frame this large shows a shipper sending a backlog (its default frame is 1 MiB).
pub const BACKLOG_FRAME: usize = 256 << 10;
/// A large frame made durable within this long counts as a catch-up in progress.
const BACKLOG_WINDOW: Duration = Duration::from_millis(100);

impl IntakeActivity {
    /// Whether a frame of at least [`BACKLOG_FRAME`] bytes was made durable within the
    /// last 100 ms.
    pub fn catching_up(&self) -> bool {
        let last = self.last_backlog_ms.load(Ordering::Relaxed);
        last > 0 && self.now_ms().saturating_sub(last) < BACKLOG_WINDOW.as_millis() as u64
    }

    fn now_ms(&self) -> u64 {
        // +1: 0 means "never".
        self.epoch.elapsed().as_millis() as u64 + 1
    }

    /// Records a durable group whose largest frame had `largest` payload bytes.
    pub(crate) fn group_durable(&self, largest: usize) {
        if largest >= BACKLOG_FRAME {
            self.last_backlog_ms.store(self.now_ms(), Ordering::Relaxed);
        }
    }
}
