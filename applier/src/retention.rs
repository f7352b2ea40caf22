//! Received-log retention: releases the parts of each tablet's received log that applying
//! will never read again, so that the log's writer deletes them (DESIGN §5; drawn in
//! `applier/STORE.md`, "Received-log retention").
//!
//! Applying reads a received log twice: once in order up to the tablet's apply position,
//! and again by position for the intents of a transaction whose commit makes that tablet's
//! part ready later (`apply.rs`, `apply_ready_parts`). A restart resumes at the stored apply
//! position and applies again the parts of the transactions `pending` lists. So everything
//! below
//!
//! ```text
//!  released(t) = min( applied_pos(t)                       ── durable: persisted first
//!                   , first intent on t of every transaction whose part on t may still be
//!                     applied: undecided, or committed with that part not applied )
//! ```
//!
//! can go. The transactions come from the store's cache of unresolved transactions
//! ([`Store::retention_floors`]) and — for intents applied before this process started,
//! which the cache holds only once touched again — from one read of each tablet's retained
//! log at the first round, remembering the first intent of every transaction whose part is
//! still needed ([`Store::parts_needed`]); those are checked again every round and dropped once
//! resolved. The release is the log's `acked` file (the format the shipper uses for source
//! WALs, [`tidelog_wal::retention`]); the received log's writer deletes whole sealed segments
//! at or below it when it next rotates. A release never moves back, and is written only after
//! the store is persisted, so that the apply positions and resolutions it rests on survive a
//! crash.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tidelog_wal::{Body, ReadLimit, Reader, TabletId, TxnId, WalPos};

use crate::error::{Error, Result};
use crate::periodic::Periodic;
use crate::store::Store;

/// Transactions classified at once while reading a log at the first round.
const SCAN_CHUNK: usize = 65_536;

/// How often the daemon's retention thread runs a round.
pub const RETENTION_INTERVAL: Duration = Duration::from_secs(2);

/// Reads `t`'s received log under `root` from `from` (or its oldest record) up to `to` and
/// hands the first intent of each transaction to `chunk`, in chunks of at most
/// [`SCAN_CHUNK`] (memory bounded by the chunk; a transaction spanning chunks may be handed
/// twice). Returns where the read started, or `None` when there was nothing to read.
fn first_intents(
    root: &Path,
    t: &TabletId,
    from: WalPos,
    to: WalPos,
    mut chunk: impl FnMut(&[(WalPos, TxnId)]) -> Result<()>,
) -> Result<Option<WalPos>> {
    let wal = |source| Error::Wal {
        tablet: t.clone(),
        source,
    };
    if to <= from {
        return Ok(None);
    }
    let mut r = Reader::open(root, t, ReadLimit::Durable).map_err(wal)?;
    let start = from.max(r.oldest());
    if start >= to {
        return Ok(None);
    }
    r.seek(start).map_err(wal)?;
    let mut seen: BTreeSet<TxnId> = BTreeSet::new();
    let mut firsts: Vec<(WalPos, TxnId)> = Vec::new();
    loop {
        let rec = r.next().map_err(wal)?.filter(|(pos, _)| *pos < to);
        let done = rec.is_none();
        if let Some((pos, rec)) = rec {
            if let Body::Intent { txn, .. } = rec.body {
                if seen.insert(txn) {
                    firsts.push((pos, txn));
                }
            }
        }
        if done || firsts.len() >= SCAN_CHUNK {
            chunk(&firsts)?;
            firsts.clear();
            seen.clear();
        }
        if done {
            return Ok(Some(start));
        }
    }
}

/// Tablet `t`'s release as its `acked` file in `dir` says (0: none written yet).
fn read_release(t: &TabletId, dir: &Path) -> Result<WalPos> {
    Ok(tidelog_wal::retention::read_acked(dir)
        .map_err(|source| Error::Wal {
            tablet: t.clone(),
            source,
        })?
        .unwrap_or(WalPos::ZERO))
}

/// Computes and writes the releases of every tablet's received log (see the module doc).
#[derive(Debug)]
pub struct Releaser {
    store: Arc<Store>,
    root: PathBuf,
    /// Per tablet: first intent position → transaction, for transactions found by reading
    /// the log (applied before this process started) whose part there is still needed.
    pinned: BTreeMap<TabletId, BTreeMap<WalPos, TxnId>>,
    /// Each tablet's release as last written (read from its `acked` file the first time the
    /// tablet shows up, then kept here: this releaser is that file's only writer). A tablet
    /// in here also had its retained log read for the transactions above.
    released: BTreeMap<TabletId, WalPos>,
    /// Each tablet's apply position when the releaser was made: the intents below it may
    /// belong to transactions the cache does not hold; those above it went through the
    /// cache. Tablets the store did not know then have nothing to read.
    applied_at_start: BTreeMap<TabletId, WalPos>,
    /// Whether the last round found the store's cache untrustworthy (logged once).
    warned: bool,
}

impl Releaser {
    /// A releaser of the received logs under `received_dir` (one directory per tablet).
    /// Make it before or after the apply workers start, not later: it reads the apply
    /// positions as of now as the end of what applied before this process.
    pub fn new(store: Arc<Store>, received_dir: &Path) -> Result<Releaser> {
        let applied_at_start = store
            .tablets()?
            .into_iter()
            .map(|(t, m)| (t, m.applied_pos))
            .collect();
        Ok(Releaser {
            store,
            root: received_dir.to_path_buf(),
            pinned: BTreeMap::new(),
            released: BTreeMap::new(),
            applied_at_start,
            warned: false,
        })
    }

    /// [`Releaser::new`] for a starting applier, before any apply worker runs: reads every
    /// tablet's retained log at once (from its release up to its apply position) instead of
    /// at the first round, and the same pass puts back the store's in-memory pending
    /// `trx_open` entries ([`Store::recover_parts_needed`]) — every undecided transaction's
    /// first intent is there, the release never passes it. Returns the releaser and how
    /// many entries it put back.
    pub fn recover(store: Arc<Store>, received_dir: &Path) -> Result<(Releaser, usize)> {
        let mut rel = Releaser::new(store, received_dir)?;
        let mut restored = 0;
        for (t, upto) in rel.applied_at_start.clone() {
            let dir = rel.root.join(t.as_str());
            if upto == WalPos::ZERO || !dir.is_dir() {
                continue;
            }
            let released = read_release(&t, &dir)?;
            rel.scan(&t, released, upto, Some(&mut restored))?;
            rel.released.insert(t, released);
        }
        if restored > 0 {
            tracing::info!(
                undecided = restored,
                "pending trx ids of undecided transactions restored from the received logs"
            );
        }
        Ok((rel, restored))
    }

    /// One round: returns the tablets whose release moved, with the new release.
    pub fn round(&mut self) -> Result<BTreeMap<TabletId, WalPos>> {
        let Some(floors) = self.store.retention_floors()? else {
            if !self.warned {
                tracing::warn!(
                    "received-log retention paused: an apply batch failed, so the cache of \
                     unresolved transactions is incomplete until a restart"
                );
                self.warned = true;
            }
            return Ok(BTreeMap::new());
        };
        let mut bounds = BTreeMap::new();
        for (t, f) in floors {
            let floor = f.pos();
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
                    let upto = self
                        .applied_at_start
                        .get(&t)
                        .copied()
                        .unwrap_or(WalPos::ZERO);
                    self.scan(&t, r, upto, None)?;
                    self.released.insert(t.clone(), r);
                    r
                }
            };
            let mut bound = floor;
            let mut held_by = f.intent.filter(|(p, _)| *p < f.applied_pos).map(|(_, x)| x);
            if let Some(pins) = self.pinned.get_mut(&t) {
                let txns: Vec<TxnId> = pins.values().copied().collect();
                let needed = self.store.parts_needed(&t, &txns)?;
                let mut it = needed.into_iter();
                pins.retain(|_, _| it.next().unwrap_or(true));
                if let Some((pos, txn)) = pins.first_key_value() {
                    if *pos < bound {
                        bound = *pos;
                        held_by = Some(*txn);
                    }
                }
            }
            if let Some(txn) = held_by {
                tracing::debug!(tablet = %t, applied_pos = %f.applied_pos, held_at = %bound,
                    %txn, "received log held by a transaction whose part is not applied");
            }
            if bound > released {
                bounds.insert(t, (dir, bound));
            }
        }
        if bounds.is_empty() {
            return Ok(BTreeMap::new());
        }
        // The apply positions and resolutions read above must survive a crash before the
        // log below them goes.
        self.store.persist()?;
        let mut moved = BTreeMap::new();
        for (t, (dir, bound)) in bounds {
            tidelog_wal::retention::write_acked(&dir, bound).map_err(|source| Error::Wal {
                tablet: t.clone(),
                source,
            })?;
            tracing::debug!(tablet = %t, released = %bound, "received log released");
            self.released.insert(t.clone(), bound);
            moved.insert(t, bound);
        }
        Ok(moved)
    }

    /// Reads `t`'s received log from `from` (its current release) up to `to` (its apply
    /// position when the releaser was made) once, pinning the first intent of each
    /// transaction whose part on `t` is still needed; with `restored`, also puts back the
    /// pending entries of undecided transactions and counts them (see [`Releaser::recover`]).
    fn scan(
        &mut self,
        t: &TabletId,
        from: WalPos,
        to: WalPos,
        mut restored: Option<&mut usize>,
    ) -> Result<()> {
        let start = first_intents(&self.root, t, from, to, |firsts| {
            let txns: Vec<TxnId> = firsts.iter().map(|(_, x)| *x).collect();
            let needed = match restored.as_deref_mut() {
                Some(n) => {
                    let (needed, k) = self.store.recover_parts_needed(t, &txns)?;
                    *n += k;
                    needed
                }
                None => self.store.parts_needed(t, &txns)?,
            };
            let pins = self.pinned.entry(t.clone()).or_default();
            for ((pos, txn), n) in firsts.iter().zip(needed) {
                if n {
                    pins.insert(*pos, *txn);
                }
            }
            Ok(())
        })?;
        let Some(start) = start else { return Ok(()) };
        let pinned = self.pinned.get(t).map_or(0, BTreeMap::len);
        tracing::info!(tablet = %t, from = %start, to = %to, pinned,
            "received log read for transactions applied before this start");
        Ok(())
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
    pub fn start(mut rel: Releaser, every: Duration) -> Result<ReceivedRetention> {
        let dir = rel.root.clone();
        let p = Periodic::start("recv-retention", every, move || {
            let started = std::time::Instant::now();
            match rel.round() {
                Ok(moved) => tracing::debug!(moved = moved.len(), took = ?started.elapsed(),
                    "received-log retention round"),
                Err(e) => tracing::error!("received-log retention: {e}"),
            }
        })
        .map_err(|source| Error::Io {
            op: "spawn the received-log retention thread",
            path: dir,
            source,
        })?;
        Ok(ReceivedRetention { _thread: p })
    }
}
