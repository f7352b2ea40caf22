//! The values the store keeps and answers with: a tablet's meta record, a transaction's
//! state, the cutover, the binlog's entries, and what an apply call did. Plain data, no
//! I/O: every other file of the store, and the stages above it, share these (their byte
//! forms are in `codec.rs`, drawn in `applier/STORE.md`).

use std::collections::{BTreeMap, BTreeSet};

use tidelog_wal::{Gtid, HybridTime, TabletId, TrxId, TxnId, WalPos};

/// When an apply batch is on stable storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Durability {
    /// fsync (fdatasync) the journal before `apply` returns.
    Sync,
    /// Written to OS buffers; made durable by a later [`super::Store::persist`] (or a later
    /// `Sync` batch: the journal is one sequential file).
    #[default]
    Buffered,
}

/// The target's role (docs/ARCHITECTURE.md, "Cutover").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Role {
    /// Receiving and applying shipped logs.
    #[default]
    Standby,
    /// Promoted by a cutover; every answer is final.
    Primary,
}

/// Per-tablet state kept in `meta`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TabletMeta {
    /// End of the last record applied from the received log (0: nothing applied yet).
    pub applied_pos: WalPos,
    /// ht of the last applied record or heartbeat (0 if none).
    pub safe_time: HybridTime,
    /// Announced by a shipper (persisted).
    pub registered: bool,
    /// Identity of the shipper that owns the tablet, if recorded.
    pub owner: Option<String>,
    /// Records applied from the received log, ever (each exactly once; a replay skipped by
    /// the apply position does not count).
    pub applied_records: u64,
}

/// One version of a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    /// `None`: the key was deleted at `ht`.
    pub value: Option<Vec<u8>>,
    pub ht: HybridTime,
}

/// Where one intent record of a transaction lies in a tablet's received log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct IntentRef {
    pub pos: WalPos,
    pub ht: HybridTime,
}

/// A commit record seen for a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitInfo {
    pub commit_ht: HybridTime,
    /// The (status) tablet whose log carried the commit, and its position there.
    pub tablet: TabletId,
    pub pos: WalPos,
    pub participants: Vec<TabletId>,
}

/// What the store knows about a distributed transaction.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TxnState {
    /// Per participant tablet, its intent records, ascending by position.
    pub intents: BTreeMap<TabletId, Vec<IntentRef>>,
    pub commit: Option<CommitInfo>,
    pub aborted: bool,
    pub trx_id: Option<TrxId>,
    pub gtid: Option<Gtid>,
    /// Participants whose part (intents applied at commit_ht) is in `mvcc`.
    pub applied_parts: BTreeSet<TabletId>,
    /// The `trx_open` entry (ht, tablet of the intent) that marks this undecided
    /// transaction under its trx id; removed when the decision arrives.
    pub open: Option<(HybridTime, TabletId)>,
    /// In memory only: an intent of this transaction was seen without its trx id (or with
    /// another one), so after a restart the `trx` index cannot tell that it committed; its
    /// commit is then recorded in `txns` (see `batch.rs`).
    pub untraceable: bool,
}

/// What keeps one tablet's received log (see [`super::Store::retention_floors`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RetentionFloor {
    /// The tablet's apply position.
    pub applied_pos: WalPos,
    /// The tablet's safe time: the ht of the last record applied (every later one is
    /// higher).
    pub safe_time: HybridTime,
    /// The lowest first intent on the tablet of a cached transaction whose part there is
    /// not applied yet, and that transaction.
    pub intent: Option<(IntentRef, TxnId)>,
}

impl RetentionFloor {
    /// The lowest position still needed.
    pub fn pos(&self) -> WalPos {
        self.intent
            .map_or(self.applied_pos, |(i, _)| i.pos.min(self.applied_pos))
    }

    /// A lower bound of the ht of every record at or after [`RetentionFloor::pos`]: the
    /// intent's there, else just above the safe time (records not applied yet are newer).
    pub fn ht(&self) -> HybridTime {
        match self.intent {
            Some((i, _)) if i.pos < self.applied_pos => i.ht.min(self.safe_time),
            _ => self.safe_time.next(),
        }
    }
}

/// One participant's part of a committed transaction: its intents' ops on one tablet, to be
/// written at `commit_ht`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Part {
    pub txn: TxnId,
    pub commit_ht: HybridTime,
    pub ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// What one `apply` call did.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ApplyOutcome {
    /// Records applied by this call.
    pub records: u64,
    /// Records skipped because they lie below the stored apply position (a replay).
    pub skipped: u64,
    /// `write` records and their ops written to `mvcc`.
    pub writes: u64,
    pub ops: u64,
    pub intents: u64,
    pub commits: u64,
    pub aborts: u64,
    pub heartbeats: u64,
    /// Received-log bytes covered by the applied records.
    pub bytes: u64,
    /// The tablet's apply position and safe time after the call.
    pub applied_pos: WalPos,
    pub safe_time: HybridTime,
    /// Commit records applied by this call: the transaction and its commit.
    pub new_commits: Vec<(TxnId, CommitInfo)>,
    /// Binlog entries written (commits: `write`s with a trx_id or gtid, and `commit`s).
    pub binlog: u64,
}

/// A cutover (docs/ARCHITECTURE.md, "Cutover") as persisted in `meta` under
/// `global/cutover`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cutover {
    pub cut: HybridTime,
    /// Wall-clock time of the promotion, microseconds since the epoch.
    pub cut_time_us: u64,
    /// Phase 2: the report, once computed (a restart computes it if missing).
    pub report: Option<CutoverReport>,
    /// Phase 3: versions above the cut are gone.
    pub cleaned: bool,
}

/// What a cutover lost, as returned by `POST /v1/promote`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CutoverReport {
    /// Commits above the cut (by gtid sequence, so commits never received count too).
    pub lost_commits: u64,
    /// From the cut to the newest commit received, in milliseconds.
    pub lost_window_ms: u64,
    /// Per tablet: its safe time at the cut and how far it lagged the wall clock then (ms).
    pub tablets: BTreeMap<TabletId, (HybridTime, u64)>,
}

/// One commit in the binlog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BinlogEntry {
    pub commit_ht: HybridTime,
    /// The tablet whose log carried the commit (`write` or `commit` record).
    pub tablet: TabletId,
    pub trx_id: Option<TrxId>,
    pub gtid: Option<Gtid>,
    /// The distributed transaction, for a `commit`; `None` for a single-tablet `write`.
    pub txn: Option<TxnId>,
    /// The tablets the commit wrote: the participants, or the carrier for a `write`.
    pub tablets: Vec<TabletId>,
}

/// What the `trx` index says about a committed trx id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrxCommit {
    pub commit_ht: HybridTime,
    pub tablet: TabletId,
    pub gtid: Option<Gtid>,
    pub txn: Option<TxnId>,
}

/// An undecided or aborted transaction of a trx id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenKind {
    /// Intents received, no decision yet.
    Pending,
    /// An `abort` was received.
    Aborted,
}

/// The newest `trx_open` entry of a trx id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrxOpen {
    pub ht: HybridTime,
    pub kind: OpenKind,
    pub txn: TxnId,
    pub tablet: TabletId,
}

/// What the `gtid` index says about one gtid.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GtidEntry {
    pub gtid: Gtid,
    pub commit_ht: HybridTime,
    pub tablet: TabletId,
    pub trx_id: Option<TrxId>,
}
