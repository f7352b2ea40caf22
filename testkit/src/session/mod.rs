//! The source-side session: hands out [`TrxId`]s and assigns [`Gtid`]s the way a real
//! database would (docs/ARCHITECTURE.md, "Concepts").
//!
//! * [`ConnectIdGen`] gives every source connection a `connect_id` that is unique across
//!   threads, processes and restarts for one server id, uuid_short style:
//!   `connect_id = (server_id & 0xFF) << 56 | counter`. The 56-bit counter comes from a
//!   high-water mark persisted in `<state_dir>/connect-id.<server_id>` and is never below
//!   `unix_seconds << 24`, so ids stay unique even if the state file is lost, provided the
//!   clock does not go back, at least a second has passed since the last reservation, and
//!   fewer than 2^24 ids a second were used on average. Ids are reserved in blocks under an
//!   exclusive `flock`, and each block is made durable before any id in it is handed out.
//! * [`Session`] is one source connection: its trx id is `connect_id:commit_counter`. The
//!   counter starts at 1 and moves only on commit, so an aborted transaction's retry reuses
//!   its id (as in MariaDB and Oracle's LTXID).
//! * [`GtidGen`] assigns `domain-server-seq` gtids, `seq` growing by exactly one per commit
//!   within a domain.
//! * [`DistributedTxn`] is a transaction that spans tablets, begun on a session: it makes the
//!   `intent` bodies, remembers the tablets they went to, and makes the `commit` that names
//!   exactly those tablets. A commit of a transaction that wrote no intent is refused: it
//!   would commit nothing, and its participant list would be made up.
//!
//! State file layout (24 bytes, little-endian):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `TDLCONID` |
//! | 8 | 8 | next counter (u64; everything below it may have been handed out) |
//! | 16 | 8 | xxh3-64 of bytes 0..16 |
//!
//! The lock is taken on a separate file, `<state_dir>/connect-id.<server_id>.lock`, which is
//! never replaced: the state file itself is replaced by rename on every reservation, and a
//! lock held on a file that has just been renamed over would exclude nobody.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use tidelog_wal::{Body, Error, Gtid, Op, Result, TabletId, TrxId, TxnId};

/// Magic at the start of a connect-id state file.
pub const CONNECT_ID_MAGIC: [u8; 8] = *b"TDLCONID";

/// Size of a connect-id state file.
pub const CONNECT_ID_STATE_LEN: usize = 24;

/// Highest server id that fits in the top byte of a connect id.
pub const MAX_SERVER_ID: u32 = 0xFF;

/// Bits of a connect id below the server id.
const COUNTER_BITS: u32 = 56;

/// One past the largest counter value.
const COUNTER_LIMIT: u64 = 1 << COUNTER_BITS;

/// Ids reserved per state-file update.
const DEFAULT_BLOCK: u64 = 4096;

/// Name of the state file for `server_id` inside the state directory.
pub fn connect_id_state_file_name(server_id: u32) -> String {
    format!("connect-id.{server_id}")
}

/// Hands out `connect_id`s unique across threads, processes sharing the state directory, and
/// restarts, for one server id. Thread-safe; share it by reference or in an `Arc`.
#[derive(Debug)]
pub struct ConnectIdGen {
    server_id: u32,
    state_path: PathBuf,
    lock_path: PathBuf,
    block: u64,
    /// The ids `next..end` (counters) are reserved for this generator and not handed out yet.
    range: Mutex<Range>,
}

#[derive(Debug)]
struct Range {
    next: u64,
    end: u64,
}

impl ConnectIdGen {
    /// Opens (creating if needed) the generator for `server_id` in `state_dir`, and reserves
    /// its first block of ids, so a corrupt or unwritable state file is reported here.
    ///
    /// `server_id` must be at most 255 (it is the top byte of every connect id).
    pub fn open(state_dir: &Path, server_id: u32) -> Result<Self> {
        Self::open_with_block(state_dir, server_id, DEFAULT_BLOCK)
    }

    fn open_with_block(state_dir: &Path, server_id: u32, block: u64) -> Result<Self> {
        if server_id > MAX_SERVER_ID {
            return Err(Error::Config(format!(
                "server id {server_id} is out of range for connect ids: at most {MAX_SERVER_ID}"
            )));
        }
        if block == 0 || block >= COUNTER_LIMIT {
            return Err(Error::Config(format!(
                "connect id block size {block} is out of range"
            )));
        }
        // An empty path means the current directory (and keeps `parent()` meaningful).
        let state_dir = if state_dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            state_dir
        };
        std::fs::create_dir_all(state_dir)
            .map_err(|e| Error::io("create directory", state_dir, e))?;
        let name = connect_id_state_file_name(server_id);
        let gen = ConnectIdGen {
            server_id,
            state_path: state_dir.join(&name),
            lock_path: state_dir.join(format!("{name}.lock")),
            block,
            range: Mutex::new(Range { next: 0, end: 0 }),
        };
        {
            let mut range = gen.lock_range();
            *range = gen.reserve()?;
        }
        Ok(gen)
    }

    /// The server id in the top byte of every id this generator hands out.
    pub fn server_id(&self) -> u32 {
        self.server_id
    }

    /// The state file holding the persisted high-water mark.
    pub fn state_path(&self) -> &Path {
        &self.state_path
    }

    /// The next connect id. Only touches the disk (and the cross-process lock) when the
    /// current block is used up.
    pub fn next(&self) -> Result<u64> {
        let mut range = self.lock_range();
        if range.next >= range.end {
            *range = self.reserve()?;
        }
        let counter = range.next;
        range.next += 1;
        Ok(u64::from(self.server_id) << COUNTER_BITS | counter)
    }

    fn lock_range(&self) -> MutexGuard<'_, Range> {
        // The range is only replaced after a successful reservation, so it is consistent
        // even if a holder panicked.
        self.range
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Reserves a new block under the cross-process lock and makes it durable.
    fn reserve(&self) -> Result<Range> {
        let _lock = FileLock::exclusive(&self.lock_path)?;
        let hwm = read_state(&self.state_path)?.unwrap_or(0);
        let start = hwm.max(clock_seed());
        let end = start
            .checked_add(self.block)
            .filter(|&end| end <= COUNTER_LIMIT)
            .ok_or_else(|| {
                Error::Config(format!(
                    "connect ids for server {} are exhausted (high-water mark {start} in {})",
                    self.server_id,
                    self.state_path.display()
                ))
            })?;
        tidelog_wal::write_atomic(&self.state_path, &encode_state(end))?;
        tracing::debug!(
            server_id = self.server_id,
            start,
            end,
            "reserved connect id block"
        );
        Ok(Range { next: start, end })
    }
}

/// `unix_seconds << 24`, the lowest counter a new block may start at.
fn clock_seed() -> u64 {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    // Year 2106 and later would overflow the 56 bits; the persisted mark carries on then.
    secs.min((1 << (COUNTER_BITS - 24)) - 1) << 24
}

fn encode_state(next: u64) -> [u8; CONNECT_ID_STATE_LEN] {
    let mut out = [0u8; CONNECT_ID_STATE_LEN];
    out[0..8].copy_from_slice(&CONNECT_ID_MAGIC);
    out[8..16].copy_from_slice(&next.to_le_bytes());
    let sum = tidelog_wal::hash::xxh3_64(&out[0..16]);
    out[16..24].copy_from_slice(&sum.to_le_bytes());
    out
}

fn corrupt(path: &Path, offset: u64, reason: impl Into<String>) -> Error {
    Error::Corruption {
        tablet: "-".to_string(),
        file: path.to_path_buf(),
        offset,
        reason: reason.into(),
    }
}

fn le_u64(bytes: &[u8]) -> Option<u64> {
    bytes.try_into().ok().map(u64::from_le_bytes)
}

/// Decodes a state file's bytes into the persisted next counter.
fn decode_state(bytes: &[u8], path: &Path) -> Result<u64> {
    if bytes.len() != CONNECT_ID_STATE_LEN {
        return Err(corrupt(
            path,
            0,
            format!(
                "connect id state file is {} bytes long; expected {CONNECT_ID_STATE_LEN}",
                bytes.len()
            ),
        ));
    }
    if bytes[0..8] != CONNECT_ID_MAGIC {
        return Err(corrupt(path, 0, "not a connect id state file (bad magic)"));
    }
    let (Some(next), Some(stored)) = (le_u64(&bytes[8..16]), le_u64(&bytes[16..24])) else {
        return Err(corrupt(path, 8, "connect id state file is cut short"));
    };
    let computed = tidelog_wal::hash::xxh3_64(&bytes[0..16]);
    if stored != computed {
        return Err(corrupt(
            path,
            16,
            format!("checksum mismatch: stored {stored:#018x}, computed {computed:#018x}"),
        ));
    }
    if next > COUNTER_LIMIT {
        return Err(corrupt(
            path,
            8,
            format!("next counter {next} does not fit in 56 bits"),
        ));
    }
    Ok(next)
}

/// The persisted next counter, or `None` when there is no state file yet.
fn read_state(path: &Path) -> Result<Option<u64>> {
    match std::fs::read(path) {
        Ok(bytes) => decode_state(&bytes, path).map(Some),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::io("read", path, e)),
    }
}

/// An exclusive `flock` on a file of its own, released when dropped (the file is closed).
/// `flock` locks belong to the open file description, so two opens of the same file contend
/// even inside one process.
#[derive(Debug)]
struct FileLock {
    _file: File,
}

impl FileLock {
    /// Blocks until the lock is ours.
    fn exclusive(path: &Path) -> Result<FileLock> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| Error::io("open lock file", path, e))?;
        loop {
            // SAFETY: plain syscall on a valid fd that `file` owns for the whole call.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) };
            if rc == 0 {
                return Ok(FileLock { _file: file });
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(Error::io("lock", path, e));
            }
        }
    }
}

/// One source connection: a `connect_id` and a commit counter that starts at 1 and moves
/// only on commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    connect_id: u64,
    commit_counter: u64,
}

impl Session {
    /// A session with the given connect id; its first trx id is `connect_id:1`.
    pub fn new(connect_id: u64) -> Session {
        Session {
            connect_id,
            commit_counter: 1,
        }
    }

    /// A session with a fresh connect id from `gen`.
    pub fn open(gen: &ConnectIdGen) -> Result<Session> {
        Ok(Session::new(gen.next()?))
    }

    pub fn connect_id(&self) -> u64 {
        self.connect_id
    }

    /// The id of the transaction currently open (or about to be) on this session.
    pub fn trx_id(&self) -> TrxId {
        TrxId::new(self.connect_id, self.commit_counter)
    }

    /// The current transaction committed: returns its id and moves on to the next one.
    pub fn commit(&mut self) -> TrxId {
        let id = self.trx_id();
        // 2^64 commits on one connection cannot happen; wrapping to 0 would make an
        // invalid trx id, so refuse loudly instead.
        self.commit_counter = self
            .commit_counter
            .checked_add(1)
            .expect("commit counter overflowed u64");
        id
    }

    /// The current transaction aborted: returns its id. The counter does not move, so the
    /// retry carries the same id.
    pub fn abort(&mut self) -> TrxId {
        self.trx_id()
    }
}

impl Session {
    /// Begins the distributed transaction `txn` under this session's current trx id.
    pub fn begin(&self, txn: TxnId) -> DistributedTxn {
        DistributedTxn {
            txn,
            trx_id: self.trx_id(),
            participants: Vec::new(),
        }
    }
}

/// A transaction that spans tablets, begun with [`Session::begin`]: its `intent` records
/// name where it wrote, and its `commit` names exactly those tablets as participants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DistributedTxn {
    txn: TxnId,
    trx_id: TrxId,
    /// Tablets that got an intent, in first-write order, each once.
    participants: Vec<TabletId>,
}

impl DistributedTxn {
    pub fn txn(&self) -> TxnId {
        self.txn
    }

    pub fn trx_id(&self) -> TrxId {
        self.trx_id
    }

    /// The tablets this transaction wrote intents to so far.
    pub fn participants(&self) -> &[TabletId] {
        &self.participants
    }

    /// The body of this transaction's `intent` on `tablet` (append it to that tablet's
    /// log); `tablet` becomes a participant.
    pub fn intent(&mut self, tablet: &TabletId, ops: Vec<Op>) -> Body {
        if !self.participants.contains(tablet) {
            self.participants.push(tablet.clone());
        }
        Body::Intent {
            txn: self.txn,
            trx_id: Some(self.trx_id),
            ops,
        }
    }

    /// The `commit` body (append it to the status tablet's log, after the intents are
    /// durable), naming every tablet that got an intent; the session moves on to its next
    /// trx id. Refused, with the session unchanged, when the transaction wrote no intent
    /// (nothing to commit) or the session has moved on since [`Session::begin`].
    pub fn commit(self, session: &mut Session, gtid: Option<Gtid>) -> Result<Body> {
        self.check_session(session)?;
        if self.participants.is_empty() {
            return Err(Error::InvalidRecord(format!(
                "transaction {} (trx id {}) wrote no intent: there is nothing to commit",
                self.txn, self.trx_id
            )));
        }
        session.commit();
        Ok(Body::Commit {
            txn: self.txn,
            participants: self.participants,
            trx_id: Some(self.trx_id),
            gtid,
        })
    }

    /// The `abort` body; the session keeps its trx id for the retry.
    pub fn abort(self, session: &mut Session) -> Result<Body> {
        self.check_session(session)?;
        Ok(Body::Abort {
            txn: self.txn,
            trx_id: Some(session.abort()),
        })
    }

    fn check_session(&self, session: &Session) -> Result<()> {
        if session.trx_id() != self.trx_id {
            return Err(Error::InvalidRecord(format!(
                "transaction {} began as trx id {}, but its session is at {} now",
                self.txn,
                self.trx_id,
                session.trx_id()
            )));
        }
        Ok(())
    }
}

/// Assigns gtids in one domain: `seq` grows by exactly one per call to [`GtidGen::next`].
///
/// After a restart, a `GtidGen` is restarted from the highest `seq` found in the log for its
/// domain (pass it as `last_seq`), so sequence numbers continue without gaps or repeats.
#[derive(Debug)]
pub struct GtidGen {
    domain: u32,
    server: u32,
    last_seq: AtomicU64,
}

impl GtidGen {
    /// A generator whose first gtid has `seq = last_seq + 1`; pass 0 for a fresh domain.
    pub fn new(domain: u32, server: u32, last_seq: u64) -> GtidGen {
        GtidGen {
            domain,
            server,
            last_seq: AtomicU64::new(last_seq),
        }
    }

    pub fn domain(&self) -> u32 {
        self.domain
    }

    pub fn server(&self) -> u32 {
        self.server
    }

    /// The next gtid. Thread-safe; concurrent callers get distinct, consecutive seqs.
    pub fn next(&self) -> Gtid {
        let seq = self.last_seq.fetch_add(1, Ordering::AcqRel).wrapping_add(1);
        Gtid::new(self.domain, self.server, seq)
    }

    /// The last gtid assigned (or recovered), `None` in a fresh domain.
    pub fn last(&self) -> Option<Gtid> {
        match self.last_seq.load(Ordering::Acquire) {
            0 => None,
            seq => Some(Gtid::new(self.domain, self.server, seq)),
        }
    }
}

/// The highest gtid `seq` of `domain` found in any tablet of the log under `wal_dir` (read up
/// to `written_pos`), so a restarted source continues the domain's sequence with
/// `GtidGen::new(domain, server, last)`. Scans each tablet's segments newest first and stops
/// at the first segment holding a gtid of the domain. `Ok(0)` when the domain never appears.
pub fn recover_last_gtid_seq(wal_dir: &Path, domain: u32) -> Result<u64> {
    use tidelog_wal::reader::{list_tablets, ReadLimit, Reader};
    let mut best = 0u64;
    if !wal_dir.exists() {
        return Ok(0);
    }
    for tablet in list_tablets(wal_dir)? {
        let dir = wal_dir.join(tablet.as_str());
        let limit = if tidelog_wal::control::ControlView::open(&dir)?.is_some() {
            ReadLimit::Written
        } else {
            ReadLimit::Scan
        };
        let mut r = Reader::open(wal_dir, &tablet, limit)?;
        let starts = r.segment_starts().to_vec();
        for (k, &start) in starts.iter().enumerate().rev() {
            if r.end().is_some_and(|e| start > e) {
                continue;
            }
            r.seek(start)?;
            let stop = starts.get(k + 1).copied();
            let mut found = false;
            while let Some((pos, rec)) = r.next()? {
                if stop.is_some_and(|s| pos >= s) {
                    break;
                }
                if let Some(g) = rec.gtid().filter(|g| g.domain == domain) {
                    best = best.max(g.seq);
                    found = true;
                }
            }
            if found {
                break;
            }
        }
    }
    Ok(best)
}

#[cfg(test)]
mod tests;
