//! The `meta` keyspace's per-tablet records and global words ([`Meta`]): each tablet's
//! apply position, safe time, registration and owner; the persisted global safe time and
//! the role (layouts in `applier/STORE.md`, "`meta`"). The cutover's records are
//! `cutover.rs`'s, the binlog horizon `prune.rs`'s.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use fjall::{Keyspace, OwnedWriteBatch};
use tidelog_wal::{HybridTime, TabletId};

use super::codec::{decode_tablet_meta, decode_word, encode_tablet_meta};
use super::db::Tables;
use super::schema::{tablet_key, GLOBAL_ROLE, GLOBAL_SAFE_TIME, META, TABLET_PREFIX};
use super::txns::Txns;
use super::types::{Durability, Role, TabletMeta};
use crate::error::{Error, Result};

/// Reads and writes of `meta`'s tablet records and global words.
pub(super) struct Meta {
    ks: Keyspace,
    /// Every tablet with a `meta` record. `tablets()` reads each by a point read instead of
    /// scanning the `tablet/` prefix: every apply batch rewrites its tablet's record, so the
    /// prefix holds thousands of versions per tablet until a flush, and a scan steps over all
    /// of them (20 ms after a few seconds of load, growing with the memtable) — under the
    /// store lock when retention asks.
    tablet_ids: Mutex<BTreeSet<TabletId>>,
    /// The global safe time as last raised ([`Meta::raise_global_safe_time`]). Every
    /// transaction committed at or below it was applied everywhere and persisted before it
    /// was raised; the distributed commits above it are the ones that may still be pending
    /// (`rebuild.rs`, read from the binlog).
    pending_floor: AtomicU64,
    /// Serializes [`Meta::raise_global_safe_time`] (read, compare, write).
    global_lock: Mutex<()>,
}

impl Meta {
    /// The records of the `meta` keyspace `ks`: every tablet record is read (and checked)
    /// once, here.
    pub(super) fn open(ks: Keyspace) -> Result<Meta> {
        let mut m = Meta {
            ks,
            tablet_ids: Mutex::new(BTreeSet::new()),
            pending_floor: AtomicU64::new(0),
            global_lock: Mutex::new(()),
        };
        let ids = m.scan_tablets()?.into_keys().collect();
        *m.tablet_ids.get_mut().unwrap_or_else(|p| p.into_inner()) = ids;
        if let Some(g) = m.global_safe_time()? {
            m.pending_floor.store(g.0, Ordering::Release);
        }
        Ok(m)
    }

    /// The stored state of one tablet, if any.
    pub(super) fn tablet(&self, tablet: &TabletId) -> Result<Option<TabletMeta>> {
        let key = tablet_key(tablet);
        match self.ks.get(&key).map_err(Error::store("read meta"))? {
            None => Ok(None),
            Some(v) => decode_tablet_meta(&v)
                .map(Some)
                .map_err(|r| Error::corrupt(META, format!("tablet {tablet}"), r)),
        }
    }

    /// Every tablet the store knows (registered or applied), by id.
    pub(super) fn tablets(&self) -> Result<BTreeMap<TabletId, TabletMeta>> {
        let ids: Vec<TabletId> = self
            .tablet_ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .cloned()
            .collect();
        let mut out = BTreeMap::new();
        for id in ids {
            if let Some(m) = self.tablet(&id)? {
                out.insert(id, m);
            }
        }
        Ok(out)
    }

    /// Puts `tablet`'s record into `batch`; [`Meta::note_tablet`] once it is committed.
    pub(super) fn put_tablet(
        &self,
        batch: &mut OwnedWriteBatch,
        tablet: &TabletId,
        m: &TabletMeta,
    ) -> Result<()> {
        batch.insert(&self.ks, tablet_key(tablet), encode_tablet_meta(m)?);
        Ok(())
    }

    /// `tablet` has a `meta` record now (called after the batch that wrote it).
    pub(super) fn note_tablet(&self, tablet: &TabletId) {
        let mut ids = self.tablet_ids.lock().unwrap_or_else(|p| p.into_inner());
        if !ids.contains(tablet) {
            ids.insert(tablet.clone());
        }
    }

    /// Every tablet record in `meta`, by a scan of the `tablet/` prefix (at open).
    fn scan_tablets(&self) -> Result<BTreeMap<TabletId, TabletMeta>> {
        let mut out = BTreeMap::new();
        for g in self.ks.prefix(TABLET_PREFIX) {
            let (k, v) = g.into_inner().map_err(Error::store("scan meta"))?;
            let name = k.get(TABLET_PREFIX.len()..).unwrap_or_default();
            let id = std::str::from_utf8(name)
                .ok()
                .and_then(|s| s.parse::<TabletId>().ok())
                .ok_or_else(|| {
                    Error::corrupt(
                        META,
                        format!("key {}", name.escape_ascii()),
                        "not a valid tablet id",
                    )
                })?;
            let m = decode_tablet_meta(&v)
                .map_err(|r| Error::corrupt(META, format!("tablet {id}"), r))?;
            out.insert(id, m);
        }
        Ok(out)
    }

    /// Changes `tablet`'s record by `f` under the store lock, durably.
    pub(super) fn update_tablet(
        &self,
        t: &Tables,
        txns: &Txns,
        tablet: &TabletId,
        f: impl FnOnce(&mut TabletMeta),
    ) -> Result<()> {
        let _g = txns.lock();
        let mut m = self.tablet(tablet)?.unwrap_or_default();
        f(&mut m);
        let mut b = t.batch();
        self.put_tablet(&mut b, tablet, &m)?;
        t.commit(b, Durability::Sync)?;
        self.note_tablet(tablet);
        Ok(())
    }

    /// The global word stored under `key` (`None`: absent), or the corruption error that
    /// names it.
    pub(super) fn word(&self, key: &[u8]) -> Result<Option<u64>> {
        match self.ks.get(key).map_err(Error::store("read meta"))? {
            None => Ok(None),
            Some(v) => decode_word(&v).map(Some).ok_or_else(|| {
                Error::corrupt(
                    META,
                    String::from_utf8_lossy(key),
                    format!("{} bytes, expected 8", v.len()),
                )
            }),
        }
    }

    /// Puts the global word `key` into `batch`.
    pub(super) fn put_word(&self, batch: &mut OwnedWriteBatch, key: &'static [u8], v: u64) {
        batch.insert(&self.ks, key, v.to_le_bytes().to_vec());
    }

    /// The persisted global safe time, if one was ever stored.
    pub(super) fn global_safe_time(&self) -> Result<Option<HybridTime>> {
        Ok(self.word(GLOBAL_SAFE_TIME)?.map(HybridTime))
    }

    /// Raises the persisted global safe time to `ht` (never lowers it); returns the stored
    /// value afterwards.
    ///
    /// Only its own lock, not the store's: it touches neither the transaction cache nor
    /// anything an apply batch reads, and the batches a safe time covers finished their
    /// commit before it was computed, so its record follows them in the journal whatever
    /// batch is being prepared or committed meanwhile (taking the store lock made the
    /// publisher wait for that batch before each fsync).
    pub(super) fn raise_global_safe_time(
        &self,
        t: &Tables,
        ht: HybridTime,
        durability: Durability,
    ) -> Result<HybridTime> {
        let _g = self.global_lock.lock().unwrap_or_else(|p| p.into_inner());
        let cur = self.global_safe_time()?;
        if cur.is_some_and(|c| c >= ht) {
            return Ok(cur.unwrap_or(ht));
        }
        let mut b = t.batch();
        self.put_word(&mut b, GLOBAL_SAFE_TIME, ht.0);
        t.commit(b, durability)?;
        self.pending_floor.fetch_max(ht.0, Ordering::Release);
        Ok(ht)
    }

    /// See the `pending_floor` field.
    pub(super) fn pending_floor(&self) -> HybridTime {
        HybridTime(self.pending_floor.load(Ordering::Acquire))
    }

    /// The persisted role (standby until a cutover stores another).
    pub(super) fn role(&self) -> Result<Role> {
        match self
            .ks
            .get(GLOBAL_ROLE)
            .map_err(Error::store("read meta"))?
        {
            None => Ok(Role::Standby),
            Some(v) => match &v[..] {
                [0] => Ok(Role::Standby),
                [1] => Ok(Role::Primary),
                other => Err(Error::corrupt(
                    META,
                    "global/role",
                    format!("unknown role bytes {:02x?}", other),
                )),
            },
        }
    }

    /// Puts `role` into `batch`.
    pub(super) fn put_role(&self, batch: &mut OwnedWriteBatch, role: Role) {
        let v: u8 = match role {
            Role::Standby => 0,
            Role::Primary => 1,
        };
        batch.insert(&self.ks, GLOBAL_ROLE, vec![v]);
    }

    /// Stores the role durably, under the store lock.
    pub(super) fn set_role(&self, t: &Tables, txns: &Txns, role: Role) -> Result<()> {
        let _g = txns.lock();
        let mut b = t.batch();
        self.put_role(&mut b, role);
        t.commit(b, Durability::Sync)
    }

    /// The value under `key`, raw (the cutover's cursor).
    pub(super) fn raw(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self
            .ks
            .get(key)
            .map_err(Error::store("read meta"))?
            .map(|v| v.to_vec()))
    }

    /// Puts `v` under `key` into `batch`, or removes `key` for `None`.
    pub(super) fn put_raw(
        &self,
        batch: &mut OwnedWriteBatch,
        key: &'static [u8],
        v: Option<Vec<u8>>,
    ) {
        match v {
            Some(v) => batch.insert(&self.ks, key, v),
            None => batch.remove(&self.ks, key),
        }
    }
}
