//! The bound on the store's memtables (`write-buffer-size`).
//!
//! fjall seals a keyspace's memtable once it passes that keyspace's own maximum (64 MiB by
//! default) and has no working limit over all of them (its `max_write_buffer_size` is
//! deprecated and unused in fjall 3). A keyspace written slowly — the binlog's indexes, a
//! few dozen bytes per commit — then fills a 64 MiB memtable over minutes, and nine of
//! them held 200–300 MB of the applier's memory under a steady load (`BENCHMARKS.md`,
//! "Soak"). This module keeps them all within one bound, as RocksDB's `db_write_buffer_size`
//! does:
//!
//! ```text
//!  active memtables (all keyspaces)  > limit / 2  →  seal the largest one; fjall flushes it
//!  active + sealed (fjall's count)   > limit      →  apply waits for the flushes (a stall,
//!                                                     at most MAX_STALL per batch)
//! ```
//!
//! So the memtables hold at most `limit` plus the batches being committed while it is
//! checked. The counts are fjall's (key + value + a fixed per-entry overhead); the heap a
//! memtable takes is about twice that (skip-list nodes, allocator size classes).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use fjall::{AbstractTree, Database, Keyspace};

/// The default bound: 64 MiB.
pub const DEFAULT_WRITE_BUFFER_SIZE: u64 = 64 << 20;

/// The smallest bound accepted (fjall's own floor for a write buffer is 1 MiB; below a few
/// MiB every batch would seal a memtable).
pub const MIN_WRITE_BUFFER_SIZE: u64 = 4 << 20;

/// The longest one batch waits for flushes; then it goes on (logged), leaving fjall's own
/// per-keyspace halt (4 sealed memtables) as the limit.
const MAX_STALL: Duration = Duration::from_secs(5);

/// How often a stalled batch looks again.
const STALL_POLL: Duration = Duration::from_millis(1);

/// The bound and what enforcing it cost.
#[derive(Debug)]
pub(crate) struct WriteBuffer {
    limit: u64,
    /// Held by the thread choosing a memtable to seal (others go on).
    sealing: Mutex<()>,
    seals: AtomicU64,
    stalls: AtomicU64,
    stalled_us: AtomicU64,
}

/// What `WriteBuffer` did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriteBufferStats {
    /// The bound (`write-buffer-size`).
    pub limit: u64,
    /// Memtables sealed to keep within it.
    pub seals: u64,
    /// Batches that waited for flushes, and how long in all.
    pub stalls: u64,
    pub stalled: Duration,
}

impl WriteBuffer {
    pub(crate) fn new(limit: u64) -> WriteBuffer {
        WriteBuffer {
            limit: limit.max(MIN_WRITE_BUFFER_SIZE),
            sealing: Mutex::new(()),
            seals: AtomicU64::new(0),
            stalls: AtomicU64::new(0),
            stalled_us: AtomicU64::new(0),
        }
    }

    pub(crate) fn stats(&self) -> WriteBufferStats {
        WriteBufferStats {
            limit: self.limit,
            seals: self.seals.load(Ordering::Relaxed),
            stalls: self.stalls.load(Ordering::Relaxed),
            stalled: Duration::from_micros(self.stalled_us.load(Ordering::Relaxed)),
        }
    }

    /// After a commit: seals the largest active memtable when the active ones together
    /// exceed half the bound. One atomic load when below it.
    pub(crate) fn after_commit(&self, db: &Database, keyspaces: &[(&'static str, &Keyspace)]) {
        if db.write_buffer_size() <= self.limit / 2 {
            return;
        }
        // Another thread is choosing: the memtable it seals is the one this one would.
        let Ok(_g) = self.sealing.try_lock() else {
            return;
        };
        let mut active = 0;
        let mut largest: Option<(&'static str, u64, &Keyspace)> = None;
        for &(name, ks) in keyspaces {
            let size = ks.tree.active_memtable().size();
            active += size;
            if largest.is_none_or(|(_, s, _)| size > s) {
                largest = Some((name, size, ks));
            }
        }
        if active <= self.limit / 2 {
            return;
        }
        if let Some((name, size, ks)) = largest {
            match ks.rotate_memtable() {
                Ok(true) => {
                    self.seals.fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(
                        keyspace = name,
                        memtable_bytes = size,
                        active_bytes = active,
                        limit = self.limit,
                        "memtable sealed to keep within write-buffer-size"
                    );
                }
                Ok(false) => {}
                // The next commit fails the same way and reports it; nothing is lost here.
                Err(e) => tracing::warn!(keyspace = name, error = %e, "sealing a memtable failed"),
            }
        }
    }

    /// Before a batch: waits while the memtables (active and sealed, fjall's count) exceed
    /// the bound — their flushes are behind — for at most [`MAX_STALL`].
    pub(crate) fn stall(&self, db: &Database, keyspaces: &[(&'static str, &Keyspace)]) {
        if db.write_buffer_size() <= self.limit {
            return;
        }
        let started = Instant::now();
        loop {
            // The active ones may be what is above it (several batches at once).
            self.after_commit(db, keyspaces);
            std::thread::sleep(STALL_POLL);
            if db.write_buffer_size() <= self.limit {
                break;
            }
            if started.elapsed() >= MAX_STALL {
                tracing::warn!(
                    write_buffer_bytes = db.write_buffer_size(),
                    limit = self.limit,
                    waited_ms = started.elapsed().as_millis() as u64,
                    "memtable flushes are behind; applying on above write-buffer-size"
                );
                break;
            }
        }
        let waited = started.elapsed();
        self.stalls.fetch_add(1, Ordering::Relaxed);
        self.stalled_us.fetch_add(
            u64::try_from(waited.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}
