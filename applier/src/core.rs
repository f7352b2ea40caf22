//! The consistency core (docs/ARCHITECTURE.md, "Safe time"): which committed transaction
//! parts may be applied now, and the global safe time. I/O-free: callers report what the
//! store durably holds and get back decisions; the apply workers do the reading and
//! writing.
//!
//! ```text
//!  tablet X's worker applied a batch (writes, intents recorded, commits recorded)
//!      │ commit(T, c, participants)            │ advance(X, safe_X)
//!      ▼                                       ▼
//!   pending T: waiting on {P : safe_P < c}   parts of X with c ≤ safe_X become ready
//!              ready      {P : safe_P ≥ c} ──► ready queue of P ──► P's worker applies T's
//!                                                                  intents on P at c, then
//!                                              part_applied(T, P) ◄┘
//!   T leaves pending when every participant's part is applied.
//!
//!   safe time = min( min over tablets of safe_X , min over pending T of (c_T − 1) )
//!               (uninitialized until every expected tablet has reported)
//! ```
//!
//! A part is ready once its tablet's safe time reaches `commit_ht`: the log is ht-ordered
//! and every intent has ht < commit_ht, so all of the transaction's intents on that tablet
//! have been recorded. Applying parts independently lets `latest` reads show a transaction
//! partially; reads at safe time never do, because safe time stays below `commit_ht` until
//! every part is applied.

use std::collections::{BTreeMap, BTreeSet};

use tidelog_wal::{HybridTime, TabletId, TxnId};

/// A part of a committed transaction that a tablet's worker must apply.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Part {
    pub commit_ht: HybridTime,
    pub txn: TxnId,
    pub tablet: TabletId,
}

#[derive(Clone, Debug)]
struct Pending {
    commit_ht: HybridTime,
    /// Participants whose part is not ready yet (their safe time is below commit_ht).
    waiting: BTreeSet<TabletId>,
    /// Parts handed out, not yet reported applied.
    in_flight: BTreeSet<TabletId>,
}

#[derive(Clone, Debug, Default)]
struct TabletView {
    safe: HybridTime,
    /// Pending transactions waiting on this tablet, by commit ht.
    waiting: BTreeSet<(HybridTime, TxnId)>,
    /// Parts ready for this tablet's worker.
    ready: Vec<Part>,
}

/// The global safe time, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SafeTime {
    /// Not every expected tablet has reported (no record applied yet).
    Uninitialized { missing: TabletId },
    /// No tablets at all.
    NoTablets,
    At {
        ht: HybridTime,
        /// The tablet (or the pending transaction's lagging participant) holding it back.
        laggiest: TabletId,
    },
}

/// The consistency state machine.
#[derive(Clone, Debug, Default)]
pub struct Core {
    tablets: BTreeMap<TabletId, TabletView>,
    expected: BTreeSet<TabletId>,
    pending: BTreeMap<TxnId, Pending>,
    by_ht: BTreeSet<(HybridTime, TxnId)>,
}

impl Core {
    pub fn new(expected: impl IntoIterator<Item = TabletId>) -> Core {
        let expected: BTreeSet<TabletId> = expected.into_iter().collect();
        let mut c = Core::default();
        for t in &expected {
            c.tablets.entry(t.clone()).or_default();
        }
        c.expected = expected;
        c
    }

    /// Makes `t` known (registered by a shipper or found on disk) with its applied safe time.
    pub fn register(&mut self, t: &TabletId, safe: HybridTime) {
        let v = self.tablets.entry(t.clone()).or_default();
        if safe > v.safe {
            v.safe = safe;
        }
    }

    pub fn tablets(&self) -> impl Iterator<Item = (&TabletId, HybridTime)> {
        self.tablets.iter().map(|(t, v)| (t, v.safe))
    }

    pub fn tablet_safe(&self, t: &TabletId) -> Option<HybridTime> {
        self.tablets.get(t).map(|v| v.safe)
    }

    /// Transactions committed but not yet applied on every participant.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// A commit of `txn` at `commit_ht` is durably recorded. `applied` lists participants
    /// whose part is already applied (after a restart). Idempotent.
    pub fn commit(
        &mut self,
        txn: TxnId,
        commit_ht: HybridTime,
        participants: &[TabletId],
        applied: &BTreeSet<TabletId>,
    ) {
        if self.pending.contains_key(&txn) {
            return;
        }
        let mut p = Pending {
            commit_ht,
            waiting: BTreeSet::new(),
            in_flight: BTreeSet::new(),
        };
        for t in participants {
            if applied.contains(t) || p.in_flight.contains(t) || p.waiting.contains(t) {
                continue;
            }
            let v = self.tablets.entry(t.clone()).or_default();
            if v.safe >= commit_ht {
                v.ready.push(Part {
                    commit_ht,
                    txn,
                    tablet: t.clone(),
                });
                p.in_flight.insert(t.clone());
            } else {
                v.waiting.insert((commit_ht, txn));
                p.waiting.insert(t.clone());
            }
        }
        if p.waiting.is_empty() && p.in_flight.is_empty() {
            return;
        }
        self.by_ht.insert((commit_ht, txn));
        self.pending.insert(txn, p);
    }

    /// Tablet `t` durably applied everything up to `safe`.
    pub fn advance(&mut self, t: &TabletId, safe: HybridTime) {
        let v = self.tablets.entry(t.clone()).or_default();
        if safe <= v.safe {
            return;
        }
        v.safe = safe;
        while let Some(&(c, txn)) = v.waiting.first() {
            if c > safe {
                break;
            }
            v.waiting.pop_first();
            if let Some(p) = self.pending.get_mut(&txn) {
                p.waiting.remove(t);
                p.in_flight.insert(t.clone());
                v.ready.push(Part {
                    commit_ht: c,
                    txn,
                    tablet: t.clone(),
                });
            }
        }
    }

    /// The parts tablet `t`'s worker must apply now (each handed out once).
    pub fn take_ready(&mut self, t: &TabletId) -> Vec<Part> {
        self.tablets
            .get_mut(t)
            .map(|v| std::mem::take(&mut v.ready))
            .unwrap_or_default()
    }

    /// Whether `t` has parts waiting to be taken.
    pub fn has_ready(&self, t: &TabletId) -> bool {
        self.tablets.get(t).is_some_and(|v| !v.ready.is_empty())
    }

    /// `part` is durably applied.
    pub fn part_applied(&mut self, part: &Part) {
        let Some(p) = self.pending.get_mut(&part.txn) else {
            return;
        };
        p.in_flight.remove(&part.tablet);
        if p.in_flight.is_empty() && p.waiting.is_empty() {
            self.by_ht.remove(&(p.commit_ht, part.txn));
            self.pending.remove(&part.txn);
        }
    }

    /// The global safe time from what has been reported.
    pub fn safe_time(&self) -> SafeTime {
        for t in &self.expected {
            if self
                .tablets
                .get(t)
                .is_none_or(|v| v.safe == HybridTime::MIN)
            {
                return SafeTime::Uninitialized { missing: t.clone() };
            }
        }
        let Some((t, v)) = self.tablets.iter().min_by_key(|(_, v)| v.safe) else {
            return SafeTime::NoTablets;
        };
        if v.safe == HybridTime::MIN {
            return SafeTime::Uninitialized { missing: t.clone() };
        }
        let (mut ht, mut laggiest) = (v.safe, t.clone());
        if let Some(&(c, txn)) = self.by_ht.first() {
            let cap = HybridTime(c.0.saturating_sub(1));
            if cap < ht {
                ht = cap;
                // Name a participant the transaction still waits for.
                laggiest = self
                    .pending
                    .get(&txn)
                    .and_then(|p| p.waiting.first().or(p.in_flight.first()).cloned())
                    .unwrap_or(laggiest);
            }
        }
        SafeTime::At { ht, laggiest }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> TabletId {
        s.parse().unwrap()
    }
    fn txn(n: u128) -> TxnId {
        TxnId::from_u128(n)
    }

    #[test]
    fn a_commit_holds_safe_time_until_every_part_is_applied() {
        let mut c = Core::new([t("a"), t("b")]);
        assert!(matches!(c.safe_time(), SafeTime::Uninitialized { .. }));
        c.advance(&t("a"), HybridTime(10));
        assert_eq!(c.safe_time(), SafeTime::Uninitialized { missing: t("b") });
        c.advance(&t("b"), HybridTime(5));
        // T commits at 8 on a; b is behind.
        c.advance(&t("a"), HybridTime(12));
        c.commit(txn(1), HybridTime(8), &[t("a"), t("b")], &BTreeSet::new());
        let ready = c.take_ready(&t("a"));
        assert_eq!(ready.len(), 1);
        assert!(c.take_ready(&t("b")).is_empty());
        c.part_applied(&ready[0]);
        assert_eq!(
            c.safe_time(),
            SafeTime::At {
                ht: HybridTime(5),
                laggiest: t("b")
            }
        );
        c.advance(&t("b"), HybridTime(20));
        // b caught up but its part is not applied: held at 7.
        assert_eq!(
            c.safe_time(),
            SafeTime::At {
                ht: HybridTime(7),
                laggiest: t("b")
            }
        );
        let rb = c.take_ready(&t("b"));
        assert_eq!(rb.len(), 1);
        assert!(c.take_ready(&t("b")).is_empty(), "handed out once");
        c.part_applied(&rb[0]);
        assert_eq!(
            c.safe_time(),
            SafeTime::At {
                ht: HybridTime(12),
                laggiest: t("a")
            }
        );
        assert_eq!(c.pending_len(), 0);
    }

    #[test]
    fn restart_skips_parts_already_applied() {
        let mut c = Core::new([]);
        c.register(&t("a"), HybridTime(50));
        c.register(&t("b"), HybridTime(50));
        let applied: BTreeSet<_> = [t("a")].into();
        c.commit(txn(2), HybridTime(40), &[t("a"), t("b")], &applied);
        assert!(c.take_ready(&t("a")).is_empty());
        let rb = c.take_ready(&t("b"));
        assert_eq!(rb.len(), 1);
        assert_eq!(
            c.safe_time(),
            SafeTime::At {
                ht: HybridTime(39),
                laggiest: t("b")
            }
        );
        c.part_applied(&rb[0]);
        assert_eq!(
            c.safe_time(),
            SafeTime::At {
                ht: HybridTime(50),
                laggiest: t("a")
            }
        );
        // Committing again (a replay) changes nothing.
        c.commit(
            txn(2),
            HybridTime(40),
            &[t("a"), t("b")],
            &[t("a"), t("b")].into(),
        );
        assert_eq!(c.pending_len(), 0);
    }
}
