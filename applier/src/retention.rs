//! Received-log retention: releases the parts of each tablet's received log that applying
//! will never read again, so that the log's writer deletes them (docs/ARCHITECTURE.md,
//! "Apply"; drawn in `applier/STORE.md`, "Received-log retention").
//!
//! Applying reads a received log twice: once in order up to the tablet's apply position,
//! and again by position for the intents of a transaction whose commit makes that tablet's
//! part ready later (`apply/tablet.rs`, `apply_ready_parts`). And opening the store reads the
//! retained part again, to rebuild the unresolved transactions, whose intents are stored
//! nowhere else (`Store::rebuild_unresolved`). So everything below
//!
//! ```text
//!  released(t) = min( applied_pos(t)                       ── durable: persisted first
//!                   , first intent on t of every transaction whose part on t may still be
//!                     applied: undecided, or committed with that part not applied )
//! ```
//!
//! can go. The transactions come from the store's cache of unresolved transactions
//! ([`Store::retention_floors`]), which holds all of them. The release is the log's `acked`
//! file (the format the shipper uses for source WALs, [`tidelog_wal::retention`]); the
//! received log's writer deletes whole sealed segments at or below it when it next rotates.
//! A release never moves back, and is written only after the store is persisted, so that
//! the apply positions and resolutions it rests on survive a crash.
//!
//! Each round then tells the store the lowest ht still retained on any tablet
//! ([`Store::set_prune_floor`]): binlog retention keeps the `txns` record of a transaction
//! decided at or after it, so that a restart never reads intents whose transaction's
//! decision is gone (it would look undecided).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tidelog_wal::{HybridTime, TabletId, WalPos};

use crate::error::{Error, Result};
use crate::periodic::Periodic;
use crate::store::{read_release, Store};

/// How often the daemon's retention thread runs a round.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(2);

/// Computes and writes the releases of every tablet's received log (see the module doc).
#[derive(Debug)]
pub struct Releaser {
    store: Arc<Store>,
    root: PathBuf,
    /// Each tablet's release as last written (read from its `acked` file the first time the
    /// tablet shows up, then kept here: this releaser is that file's only writer).
    released: BTreeMap<TabletId, WalPos>,
    /// Whether the last round found the store's cache untrustworthy (logged once).
    warned: bool,
}

impl Releaser {
    /// A releaser of the received logs under `received_dir` (one directory per tablet).
    pub fn new(store: Arc<Store>, received_dir: &Path) -> Releaser {
        Releaser {
            store,
            root: received_dir.to_path_buf(),
            released: BTreeMap::new(),
            warned: false,
        }
    }

    /// One round: returns the tablets whose release moved, with the new release.
    pub fn round(&mut self) -> Result<BTreeMap<TabletId, WalPos>> {
        let Some(floors) = self.store.retention_floors()? else {
            if !self.warned {
                tracing::warn!(
                    "received-log retention paused: an apply batch failed, so the cache of \
                     unresolved transactions is incomplete until it is rebuilt (a restart, or \
                     a reopen of the store after a failed write)"
                );
                self.warned = true;
            }
            return Ok(BTreeMap::new());
        };
        self.warned = false;
        let mut bounds = BTreeMap::new();
        let mut floor_ht = HybridTime::MAX;
        for (t, f) in floors {
            if f.applied_pos == WalPos::ZERO {
                continue; // nothing applied yet
            }
            let dir = self.root.join(t.as_str());
            if !dir.is_dir() {
                continue;
            }
            let released = match self.released.get(&t) {
                Some(r) => *r,
                None => {
                    let r = read_release(&t, &dir)?;
                    self.released.insert(t.clone(), r);
                    r
                }
            };
            // What stays retained starts at the release or later: at `f.pos()` or later
            // once written below (a release never moves back).
            floor_ht = floor_ht.min(f.ht());
            let bound = f.pos();
            if let Some((i, txn)) = f.intent.filter(|(i, _)| i.pos < f.applied_pos) {
                tracing::debug!(tablet = %t, applied_pos = %f.applied_pos, held_at = %i.pos,
                    %txn, "received log held by a transaction whose part is not applied");
            }
            if bound > released {
                bounds.insert(t, (dir, bound));
            }
        }
        let mut moved = BTreeMap::new();
        if !bounds.is_empty() {
            // The apply positions and resolutions read above must survive a crash before
            // the log below them goes.
            self.store.persist()?;
            for (t, (dir, bound)) in bounds {
                tidelog_wal::retention::write_acked(&dir, bound).map_err(|source| Error::Wal {
                    tablet: t.clone(),
                    source,
                })?;
                tracing::debug!(tablet = %t, released = %bound, "received log released");
                self.released.insert(t.clone(), bound);
                moved.insert(t, bound);
            }
        }
        // Every release is written (durably) at or past the floors just computed.
        if floor_ht != HybridTime::MAX {
            self.store.set_prune_floor(floor_ht);
        }
        Ok(moved)
    }
}

/// The daemon's retention thread: a [`Releaser`] round at start and every `every` after,
/// until dropped.
#[derive(Debug)]
pub struct ReceivedRetention {
    /// Held for its `Drop`: stops and joins the thread.
    _thread: Periodic,
}

impl ReceivedRetention {
    pub fn start(
        store: Arc<Store>,
        received_dir: &Path,
        every: Duration,
    ) -> Result<ReceivedRetention> {
        let mut rel = Releaser::new(store, received_dir);
        // The last failure logged: a full disk fails every round until space returns, and is
        // logged once.
        let mut failing: Option<String> = None;
        let p = Periodic::start("recv-retention", every, move || {
            let started = std::time::Instant::now();
            match rel.round() {
                Ok(moved) => {
                    if failing.take().is_some() {
                        tracing::info!("received-log retention works again");
                    }
                    tracing::debug!(moved = moved.len(), took = ?started.elapsed(),
                        "received-log retention round")
                }
                Err(e) => {
                    let e = e.to_string();
                    if failing.as_deref() != Some(e.as_str()) {
                        tracing::error!("received-log retention: {e}; retried every round");
                        failing = Some(e);
                    }
                }
            }
        })
        .map_err(|source| Error::Io {
            op: "spawn the received-log retention thread",
            path: received_dir.to_path_buf(),
            source,
        })?;
        Ok(ReceivedRetention { _thread: p })
    }
}
