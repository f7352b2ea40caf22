//! `trx_status(trx_id, gtid_hint?, wait?)` (docs/ARCHITECTURE.md, "Binlog and trx_status"):
//! did a commit land on the target?
//!
//! ```text
//!  parse trx_id ──malformed──► UNKNOWN (reason)
//!      │
//!  gtid hint? ──malformed / foreign domain──► UNKNOWN (reason)
//!      │ visible at safe time, or below its domain's first entry once that entry is
//!      │ visible (removed by retention: the target is past it)     → caught_up
//!      │   (no gtid read when this trx's visible commit or an earlier look-up's visible
//!      │    seq of the domain is at or above it: seq grows in commit order)
//!      │ not yet: wait for safe time to pass it, up to `wait`       → else caught_up = false
//!      ▼
//!  trx index (point read) ── commit ≤ safe time ──► COMMITTED {gtid, commit_ht}
//!      │                  └─ commit > safe time ──► IN_PROGRESS (waits for parts / safe time)
//!  trx_open (newest first) ── aborted ──► ABORTED (aborted at source)
//!      │                   └─ pending ──► IN_PROGRESS (waits for the decision)
//!      ▼
//!  nothing ──► UNKNOWN (never seen, or older than retention)
//! ```
//!
//! A target that is behind the client (`caught_up: false`) never answers a definitive
//! `UNKNOWN` or `ABORTED` (a retry of an aborted id may have committed after it): it says
//! `IN_PROGRESS`, waiting for the hint. After a cutover every answer is final: commits above
//! the cut and undecided transactions are `ABORTED` (discarded by cutover) — also for a
//! look-up that was waiting when the cutover came: it answers again as the promoted target.

use std::time::{Duration, Instant, SystemTime};

use tidelog_wal::{Gtid, HybridTime, TabletId, TrxId, TxnId};

use crate::binlog::OpenKind;
use crate::consistency::Consistency;
use crate::error::Result;
use crate::store::Store;

/// The four answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TrxState {
    Committed,
    Aborted,
    InProgress,
    Unknown,
}

impl TrxState {
    pub const ALL: [TrxState; 4] = [
        TrxState::Committed,
        TrxState::Aborted,
        TrxState::InProgress,
        TrxState::Unknown,
    ];

    /// The API's name: `COMMITTED`, `ABORTED`, `IN_PROGRESS`, `UNKNOWN`.
    pub fn name(self) -> &'static str {
        match self {
            TrxState::Committed => "COMMITTED",
            TrxState::Aborted => "ABORTED",
            TrxState::InProgress => "IN_PROGRESS",
            TrxState::Unknown => "UNKNOWN",
        }
    }
}

/// One answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrxStatus {
    /// The id as asked.
    pub trx_id: String,
    pub state: TrxState,
    /// Why (for every state but `COMMITTED`).
    pub reason: Option<String>,
    pub gtid: Option<Gtid>,
    pub commit_ht: Option<HybridTime>,
    pub connect_id: Option<u64>,
    /// The distributed transaction, when one is involved.
    pub txn: Option<TxnId>,
    /// For `IN_PROGRESS`: what the answer waits for.
    pub waits_for: Option<String>,
    /// The published safe time the answer was given at.
    pub safe_time: Option<HybridTime>,
    /// Whether the target has seen everything the client has: the hint is visible, or
    /// (without a hint) safe time is initialized and within `max-staleness`; always true
    /// on a promoted target, whose answers are final.
    pub caught_up: bool,
}

/// What a look-up needs from the running applier.
pub trait SafeTimeView {
    /// The published global safe time (`None`: not initialized).
    fn safe_time(&self) -> Option<HybridTime>;
    /// Blocks until safe time ≥ `ht` or `deadline`; whether it got there.
    fn wait_for(&self, ht: HybridTime, deadline: Instant) -> bool;
    /// The tablet holding safe time back, and its safe time.
    fn laggiest(&self) -> Option<(TabletId, HybridTime)> {
        None
    }
    /// The cutover's cut, on a promoted target.
    fn cut(&self) -> Option<HybridTime> {
        None
    }
}

impl SafeTimeView for Consistency {
    fn safe_time(&self) -> Option<HybridTime> {
        Consistency::safe_time(self)
    }
    fn wait_for(&self, ht: HybridTime, deadline: Instant) -> bool {
        Consistency::wait_for(self, ht, deadline)
    }
    fn cut(&self) -> Option<HybridTime> {
        Consistency::cut(self)
    }
    fn laggiest(&self) -> Option<(TabletId, HybridTime)> {
        let r = self.report();
        let t = r.laggiest?;
        let s = r.tablets.get(&t).copied().unwrap_or_default();
        Some((t, s))
    }
}

/// A `trx_status` question.
#[derive(Clone, Debug)]
pub struct TrxQuery<'a> {
    pub trx_id: &'a str,
    pub gtid_hint: Option<&'a str>,
    /// How long to wait for a hint that is not visible yet.
    pub wait: Duration,
    /// Without a hint, the target counts as caught up while `now − safe_time` is within this.
    pub max_staleness: Duration,
}

/// The default `wait` of a look-up with a gtid hint.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(5);

enum Hint {
    Visible,
    Behind(Gtid),
    Foreign(Gtid),
}

fn fmt_ht(ht: HybridTime) -> String {
    let t = ht.to_system_time();
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    format!("{ht} ({secs:.6} s since the epoch)")
}

fn fresh(safe: Option<HybridTime>, max_staleness: Duration) -> bool {
    let Some(s) = safe else { return false };
    let now = HybridTime::from_system_time(SystemTime::now()).physical_micros();
    now.saturating_sub(s.physical_micros()) <= max_staleness.as_micros() as u64
}

/// Answers one `trx_status` question, waiting up to `q.wait` on this thread for a hint that
/// is not visible yet. Malformed input is an `UNKNOWN` answer with a reason, never an
/// error; errors are store failures only. An async caller asks [`trx_status_now`] instead
/// and waits between two asks without holding a thread.
pub fn trx_status(store: &Store, view: &impl SafeTimeView, q: &TrxQuery<'_>) -> Result<TrxStatus> {
    let deadline = Instant::now() + q.wait;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let (a, wanted) = trx_status_now(
            store,
            view,
            &TrxQuery {
                wait: left,
                ..q.clone()
            },
        )?;
        let Some(wanted) = wanted else {
            return Ok(a);
        };
        if !view.wait_for(wanted, deadline) {
            // The wait is over (or nothing will move the safe time now): answer as it is.
            let q = TrxQuery {
                wait: Duration::ZERO,
                ..q.clone()
            };
            return Ok(trx_status_now(store, view, &q)?.0);
        }
    }
}

/// One `trx_status` look-up that never waits: the answer as things stand, and, when the
/// client's hint is not visible yet and `q.wait` is not zero, the safe time whose
/// publication may change it (the hint's `commit_ht`, or the next safe time while the hint
/// is not in the binlog yet). The caller waits for that safe time (up to `q.wait` in all)
/// and asks again; see [`trx_status`].
pub fn trx_status_now(
    store: &Store,
    view: &impl SafeTimeView,
    q: &TrxQuery<'_>,
) -> Result<(TrxStatus, Option<HybridTime>)> {
    let probe = Probe {
        view,
        wanted: std::cell::Cell::new(None),
    };
    let a = answer(store, &probe, q)?;
    let wanted = probe
        .wanted
        .get()
        .filter(|_| !a.caught_up && !q.wait.is_zero());
    Ok((a, wanted))
}

/// A [`SafeTimeView`] whose `wait_for` does not wait: it notes the lowest safe time asked
/// for ([`trx_status_now`]).
struct Probe<'a, V> {
    view: &'a V,
    wanted: std::cell::Cell<Option<HybridTime>>,
}

impl<V: SafeTimeView> SafeTimeView for Probe<'_, V> {
    fn safe_time(&self) -> Option<HybridTime> {
        self.view.safe_time()
    }
    fn wait_for(&self, ht: HybridTime, _deadline: Instant) -> bool {
        if self.view.safe_time().is_some_and(|s| s >= ht) {
            return true;
        }
        let w = self.wanted.get().map_or(ht, |w| w.min(ht));
        self.wanted.set(Some(w));
        false
    }
    fn laggiest(&self) -> Option<(TabletId, HybridTime)> {
        self.view.laggiest()
    }
    fn cut(&self) -> Option<HybridTime> {
        self.view.cut()
    }
}

/// One answer without waiting (the view's `wait_for` is a [`Probe`]'s).
fn answer(store: &Store, view: &impl SafeTimeView, q: &TrxQuery<'_>) -> Result<TrxStatus> {
    let cut = view.cut();
    let a = answer_at(store, view, q, cut)?;
    if let (None, Some(now)) = (cut, view.cut()) {
        // A cutover happened while this look-up waited: every answer on a promoted target
        // is final, so answer again as the promoted target (which never waits).
        let q = TrxQuery {
            wait: Duration::ZERO,
            ..q.clone()
        };
        return answer_at(store, view, &q, Some(now));
    }
    Ok(a)
}

fn answer_at(
    store: &Store,
    view: &impl SafeTimeView,
    q: &TrxQuery<'_>,
    cut: Option<HybridTime>,
) -> Result<TrxStatus> {
    let deadline = Instant::now() + q.wait;
    let mut a = TrxStatus {
        trx_id: q.trx_id.to_string(),
        state: TrxState::Unknown,
        reason: None,
        gtid: None,
        commit_ht: None,
        connect_id: None,
        txn: None,
        waits_for: None,
        safe_time: view.safe_time(),
        caught_up: cut.is_some() || fresh(view.safe_time(), q.max_staleness),
    };
    let trx = match q.trx_id.parse::<TrxId>() {
        Ok(t) => t,
        Err(e) => {
            a.reason = Some(format!("malformed trx_id: {e}"));
            return Ok(a);
        }
    };
    a.connect_id = Some(trx.connect_id);
    let bl = store.binlog();
    let hint_gtid = match q.gtid_hint.map(str::parse::<Gtid>).transpose() {
        Ok(g) => g,
        Err(e) => {
            a.reason = Some(format!("malformed gtid hint: {e}"));
            return Ok(a);
        }
    };
    // A hint known visible before the trx index is read was visible at `safe_at_read`, so
    // that read saw the client's commit (at or before the hint in commit order).
    let known_visible = hint_gtid.is_some_and(|g| bl.known_visible(g));
    // Safe time is published only after every commit at or below it is in the store.
    let safe_at_read = view.safe_time();
    let mut commit = bl.trx_commit(trx)?;
    // On a promoted target: the hint, when the client saw a commit above the cut.
    let mut hint_after_cut = None;
    // The client's hint is not visible here yet: the target is behind the client.
    let mut behind_hint = false;
    if let Some(g) = hint_gtid {
        // A visible commit of this trx at or after the hint in its domain, or a seq at or
        // above it that an earlier look-up found visible: the hint is visible too (gtid seq
        // grows in commit order), no gtid read needed.
        let covered = commit.as_ref().is_some_and(|c| {
            view.safe_time().is_some_and(|s| s >= c.commit_ht)
                && c.gtid
                    .is_some_and(|cg| cg.domain == g.domain && g.seq <= cg.seq)
        });
        if cut.is_none() && covered {
            if let Some(cg) = commit.as_ref().and_then(|c| c.gtid) {
                bl.note_visible(cg);
            }
            a.caught_up = true;
        } else if cut.is_none() && known_visible {
            // At or below a seq of its domain found visible before: no gtid read.
            a.caught_up = true;
        } else if cut.is_none() {
            let (outcome, read_at) = hint(store, view, g, deadline)?;
            // Unless safe time covered the hint already when the trx index was read, the
            // commit may have arrived since (while the hint was waited for, or between the
            // two reads): read it again.
            if !(read_at.is_some() && read_at <= safe_at_read) {
                commit = bl.trx_commit(trx)?;
            }
            match outcome {
                Hint::Visible => a.caught_up = true,
                // A trx id names a connection of one source: with a hint from a domain
                // this target holds nothing of, the id may be another source's, so the
                // target cannot vouch for it either way.
                Hint::Foreign(g) => {
                    a.reason = Some(format!(
                        "gtid hint {g} is from domain {}, which this target does not replicate",
                        g.domain
                    ));
                    return Ok(a);
                }
                Hint::Behind(g) => {
                    a.caught_up = false;
                    behind_hint = true;
                    a.waits_for = Some(format!(
                        "gtid {g} (the client's last commit) to become visible"
                    ));
                }
            }
        } else {
            a.caught_up = true;
            if let Some(cut) = cut {
                hint_after_cut = hint_beyond(store, g, cut)?.then_some(g);
            }
        }
        a.safe_time = view.safe_time();
    }
    let safe = a.safe_time;
    if let Some(c) = commit {
        a.commit_ht = Some(c.commit_ht);
        a.gtid = c.gtid;
        a.txn = c.txn;
        if let Some(cut) = cut.filter(|cut| c.commit_ht > *cut) {
            a.state = TrxState::Aborted;
            a.reason = Some(format!(
                "discarded by cutover: committed at {} above the cut {}",
                c.commit_ht, cut
            ));
        } else if safe.is_some_and(|s| s >= c.commit_ht) {
            a.state = TrxState::Committed;
            a.reason = None;
            a.waits_for = None;
        } else {
            a.state = TrxState::InProgress;
            a.reason = Some("commit received, not yet visible at safe time".into());
            a.waits_for = Some(commit_waits_for(store, view, c.txn, c.commit_ht, safe)?);
        }
        return Ok(a);
    }
    if let Some(o) = store.open_trx(trx)? {
        a.txn = Some(o.txn);
        match (o.kind, cut) {
            (OpenKind::Aborted, _) if !behind_hint => {
                a.state = TrxState::Aborted;
                a.reason = Some(format!(
                    "aborted at source (abort of txn {} at {} in tablet {})",
                    o.txn, o.ht, o.tablet
                ));
            }
            (OpenKind::Aborted, _) => {
                a.state = TrxState::InProgress;
                a.reason = Some(format!(
                    "aborted at source at {}, but the target is behind the client: a retry may have committed",
                    o.ht
                ));
            }
            (OpenKind::Pending, Some(cut)) => {
                a.state = TrxState::Aborted;
                a.reason = Some(format!(
                    "discarded by cutover: txn {} had no decision at the cut {cut}",
                    o.txn
                ));
            }
            (OpenKind::Pending, None) => {
                a.state = TrxState::InProgress;
                a.reason = Some("intents received, no decision yet".into());
                a.waits_for.get_or_insert_with(|| {
                    format!(
                        "the commit or abort of txn {} (intents since {} in tablet {})",
                        o.txn, o.ht, o.tablet
                    )
                });
            }
        }
        return Ok(a);
    }
    if behind_hint {
        a.state = TrxState::InProgress;
        a.reason = Some(format!(
            "the target is behind the client: its gtid hint is not visible yet (safe time {})",
            safe.map_or_else(|| "not initialized".to_string(), |s| s.to_string())
        ));
        return Ok(a);
    }
    if let Some(cut) = cut {
        // Every answer on a promoted target is final. The client saw a commit above the cut,
        // or an earlier transaction of its connection is still held here (so this one is
        // not older than retention; a connection's commits are in commit order): it did
        // not land and never will.
        let lost = match hint_after_cut {
            Some(g) => Some(format!("the client saw gtid {g}, committed after the cut")),
            None => bl
                .counter_before(trx.connect_id, trx.commit_counter)?
                .map(|prev| {
                    format!(
                        "connection {} is held here up to {}:{prev} and no further",
                        trx.connect_id, trx.connect_id
                    )
                }),
        };
        if let Some(why) = lost {
            a.state = TrxState::Aborted;
            a.reason = Some(format!(
                "discarded by cutover: not committed at or below the cut {cut} ({why})"
            ));
            return Ok(a);
        }
    }
    a.state = TrxState::Unknown;
    let horizon = store.binlog_horizon()?;
    let mut why = match cut {
        Some(cut) => format!("never seen by this target up to its cut {cut}"),
        None => "never seen by this target".to_string(),
    };
    if horizon > HybridTime::MIN {
        why = format!(
            "{why}, or older than the binlog retention (entries committed before {} were removed)",
            fmt_ht(horizon)
        );
    }
    a.reason = Some(why);
    Ok(a)
}

/// Where hint `g` stands, waiting up to `deadline` for it to become visible; with the
/// hint's `commit_ht` when it was found in the binlog.
fn hint(
    store: &Store,
    view: &impl SafeTimeView,
    g: Gtid,
    deadline: Instant,
) -> Result<(Hint, Option<HybridTime>)> {
    let bl = store.binlog();
    loop {
        let safe = view.safe_time();
        if let Some(e) = bl.gtid(g.domain, g.seq)? {
            let visible =
                safe.is_some_and(|s| s >= e.commit_ht) || view.wait_for(e.commit_ht, deadline);
            let h = if visible {
                bl.note_visible(g);
                Hint::Visible
            } else {
                Hint::Behind(g)
            };
            return Ok((h, Some(e.commit_ht)));
        }
        match bl.first_in_domain(g.domain)? {
            // Below the domain's first entry, which is visible: had the hint's commit been
            // received (its seq is lower, so its commit_ht is not higher) the safe time could
            // not have passed it — so it was removed by retention (or the seq was never
            // used), and the target is past it. While that entry is not visible yet the
            // hint's commit may just be on a lagging tablet: wait for the safe time.
            Some(first) if g.seq < first.gtid.seq && safe.is_some_and(|s| s >= first.commit_ht) => {
                return Ok((Hint::Visible, None))
            }
            Some(_) => {}
            None if bl.has_gtids()? => return Ok((Hint::Foreign(g), None)),
            // An empty binlog: the target has just not received anything yet.
            None => {}
        }
        let next = safe.map_or(HybridTime(1), HybridTime::next);
        if Instant::now() >= deadline || !view.wait_for(next, deadline) {
            return Ok((Hint::Behind(g), None));
        }
    }
}

/// On a promoted target: whether hint `g` lies above the cut (not in the binlog at or below
/// it, and not older than what it retains).
fn hint_beyond(store: &Store, g: Gtid, cut: HybridTime) -> Result<bool> {
    let bl = store.binlog();
    if let Some(e) = bl.gtid(g.domain, g.seq)? {
        return Ok(e.commit_ht > cut);
    }
    Ok(match bl.first_in_domain(g.domain)? {
        Some(first) => g.seq > first.gtid.seq,
        None => false,
    })
}

fn commit_waits_for(
    store: &Store,
    view: &impl SafeTimeView,
    txn: Option<TxnId>,
    commit_ht: HybridTime,
    safe: Option<HybridTime>,
) -> Result<String> {
    if let Some(txn) = txn {
        if let Some(st) = store.txn_state(&txn)? {
            if let Some(c) = &st.commit {
                let missing: Vec<&str> = c
                    .participants
                    .iter()
                    .filter(|p| !st.applied_parts.contains(*p))
                    .map(TabletId::as_str)
                    .collect();
                if !missing.is_empty() {
                    return Ok(format!(
                        "the intents of txn {txn} on tablets {} to be applied (each tablet's safe time must reach {commit_ht})",
                        missing.join(",")
                    ));
                }
            }
        }
    }
    let safe = safe.map_or_else(|| "not initialized".to_string(), |s| s.to_string());
    Ok(match view.laggiest() {
        Some((t, s)) => format!(
            "safe time ({safe}) to reach commit_ht {commit_ht}; laggiest tablet {t} is at {s}"
        ),
        None => format!("safe time ({safe}) to reach commit_ht {commit_ht}"),
    })
}
