//! The generator's state and its rounds (the module doc of [`super`] describes what a round
//! writes): opening the tablets' writers and the sessions, the bank's initial balances,
//! heartbeats, and planning and writing each round's transactions.

use std::collections::{BTreeMap, HashSet};
use std::time::{Instant, SystemTime};

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tidelog_wal::{
    Body, Gtid, HybridClock, HybridTime, Op, Record, SyncPolicy, TabletId, TrxId, TxnId,
    WalOptions, WalPos, Writer,
};

use super::{
    bank_key, kv_key, ordered_keys, tablet_ids, CommitSample, LoadOptions, RecordCounts,
    SourceSafe, TxnKind, Workload, BANK_INITIAL_BALANCE, BANK_MAX_TRANSFER, CONNECT_SERVER_ID,
    DURABLE_TIMEOUT, GTID_DOMAIN, GTID_SERVER,
};
use crate::session::{recover_last_gtid_seq, ConnectIdGen, GtidGen, Session};

/// A transaction planned for the current round.
pub(super) struct Planned {
    session: usize,
    kind: &'static str,
    /// (tablet, ops); the first is the status tablet of a distributed transaction.
    parts: Vec<(usize, Vec<Op>)>,
    distributed: bool,
    abort: bool,
}

/// Per-workload state of the generator.
pub(super) enum State {
    Bank {
        balances: Vec<u64>,
    },
    Kv,
    Ordered {
        /// Next counter of each session (last committed + 1).
        next: Vec<u64>,
    },
}

pub(super) struct Gen {
    pub(super) opts: LoadOptions,
    pub(super) rng: StdRng,
    pub(super) clock: HybridClock,
    pub(super) gtids: GtidGen,
    pub(super) tablets: Vec<TabletId>,
    pub(super) writers: Vec<Writer>,
    pub(super) last_record: Vec<Instant>,
    /// Records appended to each tablet by this run.
    pub(super) appended: Vec<u64>,
    /// Per tablet: the ht of the last record committed.
    pub(super) committed_ht: Vec<HybridTime>,
    /// The lowest `committed_ht` last sent as a [`SourceSafe`].
    pub(super) source_safe: HybridTime,
    pub(super) start_pos: Vec<WalPos>,
    pub(super) sessions: Vec<Session>,
    /// Per session: the trx id of its last attempt if that attempt aborted.
    pub(super) last_abort: Vec<Option<TrxId>>,
    pub(super) last_commit: Option<(TrxId, Gtid)>,
    pub(super) state: State,
    pub(super) committed: u64,
    pub(super) aborted: u64,
    pub(super) attempted: u64,
    pub(super) by_kind: BTreeMap<String, u64>,
    pub(super) counts: RecordCounts,
    pub(super) rr: usize,
    pub(super) value_buf: Vec<u8>,
}

impl Gen {
    pub(super) fn open(opts: LoadOptions) -> Result<Gen> {
        std::fs::create_dir_all(&opts.wal_dir)
            .with_context(|| format!("creating {}", opts.wal_dir.display()))?;
        let last_seq = recover_last_gtid_seq(&opts.wal_dir, GTID_DOMAIN)
            .with_context(|| format!("recovering the last gtid in {}", opts.wal_dir.display()))?;
        let tablets = tablet_ids(opts.tablets)?;
        let wal_opts = WalOptions {
            segment_size: opts.segment_size,
            ..WalOptions::default()
        };
        let clock = HybridClock::new();
        let mut writers = Vec::with_capacity(tablets.len());
        for t in &tablets {
            let w = Writer::open(&opts.wal_dir, t, wal_opts.clone())
                .with_context(|| format!("opening the WAL of tablet {t}"))?;
            if let Some(ht) = w.last_ht() {
                if opts.workload != Workload::Kv {
                    bail!(
                        "tablet {t} under {} already has records: the {} workload needs an \
                         empty WAL directory (its state is not recovered)",
                        opts.wal_dir.display(),
                        opts.workload
                    );
                }
                clock.observe(ht);
            }
            writers.push(w);
        }
        let session_dir = opts
            .session_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("tidelog-load-sessions"));
        let ids = ConnectIdGen::open(&session_dir, CONNECT_SERVER_ID)
            .with_context(|| format!("opening connect ids in {}", session_dir.display()))?;
        let n_sessions = match opts.workload {
            Workload::Ordered => opts.sessions,
            _ => opts.connections,
        };
        let sessions = (0..n_sessions)
            .map(|_| Session::open(&ids).context("opening a session"))
            .collect::<Result<Vec<_>>>()?;
        let state = match opts.workload {
            Workload::Bank => State::Bank {
                balances: vec![BANK_INITIAL_BALANCE; opts.accounts as usize],
            },
            Workload::Kv => State::Kv,
            Workload::Ordered => State::Ordered {
                next: vec![1; opts.sessions],
            },
        };
        let now = Instant::now();
        Ok(Gen {
            rng: StdRng::seed_from_u64(opts.seed),
            clock,
            gtids: GtidGen::new(GTID_DOMAIN, GTID_SERVER, last_seq),
            last_record: vec![now; tablets.len()],
            appended: vec![0; tablets.len()],
            committed_ht: vec![HybridTime(0); tablets.len()],
            source_safe: HybridTime(0),
            start_pos: writers.iter().map(|w| w.written_pos()).collect(),
            tablets,
            writers,
            last_abort: vec![None; sessions.len()],
            last_commit: None,
            sessions,
            state,
            committed: 0,
            aborted: 0,
            attempted: 0,
            by_kind: BTreeMap::new(),
            counts: RecordCounts::default(),
            rr: 0,
            value_buf: Vec::new(),
            opts,
        })
    }

    pub(super) fn records(&self) -> u64 {
        let c = &self.counts;
        c.write + c.intent + c.commit + c.abort + c.heartbeat
    }

    pub(super) fn bytes(&self) -> u64 {
        self.writers
            .iter()
            .zip(&self.start_pos)
            .map(|(w, s)| w.written_pos().since(*s))
            .sum()
    }

    fn active_tablets(&self) -> usize {
        self.opts.tablets - self.opts.idle_tablets
    }

    fn append(&mut self, tablet: usize, body: Body) -> Result<HybridTime> {
        let ht = self.clock.now();
        match &body {
            Body::Write { .. } => self.counts.write += 1,
            Body::Intent { .. } => self.counts.intent += 1,
            Body::Commit { .. } => self.counts.commit += 1,
            Body::Abort { .. } => self.counts.abort += 1,
            Body::Heartbeat => self.counts.heartbeat += 1,
        }
        let w = &mut self.writers[tablet];
        w.append(&Record::new(ht, body))
            .with_context(|| format!("appending to tablet {}", w.tablet()))?;
        self.last_record[tablet] = Instant::now();
        self.appended[tablet] += 1;
        Ok(ht)
    }

    fn commit_writers(&mut self, touched: &[bool]) -> Result<Vec<(usize, WalPos)>> {
        let mut out = Vec::new();
        for (i, w) in self.writers.iter_mut().enumerate() {
            if touched[i] {
                let pos = w
                    .commit(self.opts.sync)
                    .with_context(|| format!("committing tablet {}", w.tablet()))?;
                out.push((i, pos));
                self.committed_ht[i] = w.last_ht().unwrap_or_default();
            }
        }
        if let Some(tx) = &self.opts.source_safe {
            let low = self
                .committed_ht
                .iter()
                .copied()
                .min()
                .unwrap_or(HybridTime(0));
            if low > self.source_safe {
                self.source_safe = low;
                // A receiver that went away just stops the events.
                let _ = tx.send(SourceSafe {
                    ht: low,
                    at: SystemTime::now(),
                });
            }
        }
        Ok(out)
    }

    fn count_commit(&mut self, kind: &str) {
        self.committed += 1;
        *self.by_kind.entry(kind.to_string()).or_default() += 1;
    }

    /// Session `s` commits its current transaction: its trx id and the next gtid; the
    /// session's last attempt is no longer an abort.
    /// Appends session `s`'s single-tablet transaction on tablet `t` as one `write` record
    /// with the session's trx id and the next gtid: its ht, trx id and gtid.
    fn append_local(
        &mut self,
        s: usize,
        t: usize,
        ops: Vec<Op>,
    ) -> Result<(HybridTime, TrxId, Gtid)> {
        let (trx_id, gtid) = self.commit_session(s);
        let ht = self.append(
            t,
            Body::Write {
                ops,
                trx_id: Some(trx_id),
                gtid: Some(gtid),
            },
        )?;
        Ok((ht, trx_id, gtid))
    }

    fn commit_session(&mut self, s: usize) -> (TrxId, Gtid) {
        let trx_id = self.sessions[s].commit();
        let gtid = self.gtids.next();
        self.note_commit(s, trx_id, gtid);
        (trx_id, gtid)
    }

    /// Session `s` committed `trx_id` as `gtid`.
    fn note_commit(&mut self, s: usize, trx_id: TrxId, gtid: Gtid) {
        self.last_abort[s] = None;
        self.last_commit = Some((trx_id, gtid));
    }

    fn sample(&self, ht: HybridTime, trx_id: TrxId, gtid: Gtid, kind: TxnKind, tablet: usize) {
        let Some(tx) = &self.opts.samples else {
            return;
        };
        if self.opts.sample_every == 0 || gtid.seq % self.opts.sample_every != 0 {
            return;
        }
        // A receiver that went away just stops the samples.
        let _ = tx.send(CommitSample {
            commit_ht: ht,
            trx_id,
            gtid,
            kind,
            tablet: self.tablets[tablet].clone(),
            committed_at: SystemTime::now(),
        });
    }

    /// bank: the initial balances, one `write` per tablet (chunked).
    pub(super) fn init(&mut self) -> Result<()> {
        let State::Bank { balances } = &self.state else {
            return Ok(());
        };
        let n = self.opts.tablets as u64;
        let max_bytes = (4usize << 20).min(self.opts.segment_size as usize / 4);
        let mut chunks: Vec<(usize, Vec<Op>)> = Vec::new();
        for t in 0..n {
            let mut ops = Vec::new();
            let mut size = 0;
            let mut a = t;
            while a < balances.len() as u64 {
                let op = Op::put(bank_key(a), balances[a as usize].to_string());
                size += 8 + op.key.len() + op.value.as_ref().map_or(0, |v| v.len());
                ops.push(op);
                if size >= max_bytes {
                    chunks.push((t as usize, std::mem::take(&mut ops)));
                    size = 0;
                }
                a += n;
            }
            if !ops.is_empty() {
                chunks.push((t as usize, ops));
            }
        }
        let mut touched = vec![false; self.opts.tablets];
        let mut done = Vec::new();
        for (k, (t, ops)) in chunks.into_iter().enumerate() {
            let s = k % self.sessions.len();
            let (ht, trx_id, gtid) = self.append_local(s, t, ops)?;
            touched[t] = true;
            done.push((ht, trx_id, gtid, t));
        }
        self.commit_writers(&touched)?;
        for (ht, trx_id, gtid, t) in done {
            self.count_commit("bank_init");
            self.sample(ht, trx_id, gtid, TxnKind::Local, t);
        }
        Ok(())
    }

    /// Heartbeats on tablets idle for `heartbeat_interval` (all tablets when `all`).
    pub(super) fn heartbeats(&mut self, all: bool) -> Result<()> {
        let now = Instant::now();
        let touched: Vec<bool> = self
            .last_record
            .iter()
            .map(|&last| all || now.duration_since(last) >= self.opts.heartbeat_interval)
            .collect();
        if !touched.contains(&true) {
            return Ok(());
        }
        for (t, &idle) in touched.iter().enumerate() {
            if idle {
                self.append(t, Body::Heartbeat)?;
            }
        }
        self.commit_writers(&touched)?;
        Ok(())
    }

    fn random_value(&mut self) -> Vec<u8> {
        let n = self.opts.value_size;
        self.value_buf.resize(n, 0);
        self.rng.fill(&mut self.value_buf[..]);
        self.value_buf.iter().map(|b| b'a' + b % 26).collect()
    }

    /// A random key index `k < keys` with `k % tablets == t`.
    fn kv_key_on(&mut self, t: usize) -> u64 {
        let n = self.opts.tablets as u64;
        let on_t = (self.opts.keys - t as u64).div_ceil(n);
        t as u64 + n * self.rng.random_range(0..on_t)
    }

    /// A random account on tablet `t`, if it has any.
    fn account_on(&mut self, t: usize) -> Option<u64> {
        let n = self.opts.tablets as u64;
        let on_t = self.opts.accounts.saturating_sub(t as u64).div_ceil(n);
        (on_t > 0).then(|| t as u64 + n * self.rng.random_range(0..on_t))
    }

    /// Another active tablet than `t` (requires at least 2 active tablets).
    fn other_tablet(&mut self, t: usize) -> usize {
        let active = self.active_tablets();
        (t + 1 + self.rng.random_range(0..active - 1)) % active
    }

    /// Plans the next transaction of session `s`; `None` when it cannot run this round
    /// (its keys are locked).
    fn plan(&mut self, s: usize, locked: &HashSet<Vec<u8>>) -> Option<Planned> {
        let active = self.active_tablets();
        let abort_rate = self.opts.abort_rate;
        match self.opts.workload {
            Workload::Bank => {
                let local = active < 2 || self.rng.random_bool(self.opts.local_rate);
                for _ in 0..8 {
                    let ta = self.rng.random_range(0..active);
                    let tb = if local { ta } else { self.other_tablet(ta) };
                    let (Some(a), Some(b)) = (self.account_on(ta), self.account_on(tb)) else {
                        continue;
                    };
                    let (ka, kb) = (bank_key(a), bank_key(b));
                    if a == b || locked.contains(ka.as_bytes()) || locked.contains(kb.as_bytes()) {
                        continue;
                    }
                    let State::Bank { balances } = &mut self.state else {
                        return None;
                    };
                    let amount = self
                        .rng
                        .random_range(0..=BANK_MAX_TRANSFER.min(balances[a as usize]));
                    let (na, nb) = (balances[a as usize] - amount, balances[b as usize] + amount);
                    let abort = !local && self.rng.random_bool(abort_rate);
                    if !abort {
                        balances[a as usize] = na;
                        balances[b as usize] = nb;
                    }
                    let (opa, opb) = (Op::put(ka, na.to_string()), Op::put(kb, nb.to_string()));
                    return Some(if local {
                        Planned {
                            session: s,
                            kind: "bank_local",
                            parts: vec![(ta, vec![opa, opb])],
                            distributed: false,
                            abort: false,
                        }
                    } else {
                        Planned {
                            session: s,
                            kind: "bank_distributed",
                            parts: vec![(ta, vec![opa]), (tb, vec![opb])],
                            distributed: true,
                            abort,
                        }
                    });
                }
                None
            }
            Workload::Kv => {
                let distributed = active >= 2 && self.rng.random_bool(0.2);
                let first = self.rng.random_range(0..active);
                let mut tablets = vec![first];
                if distributed {
                    let want = self.rng.random_range(2..=3usize.min(active));
                    while tablets.len() < want {
                        let t = self.other_tablet(first);
                        if !tablets.contains(&t) {
                            tablets.push(t);
                        }
                    }
                }
                let mut parts = Vec::new();
                let mut seen = HashSet::new();
                for t in tablets {
                    let n_ops = if distributed {
                        self.rng.random_range(1..=2)
                    } else {
                        self.rng.random_range(1..=4)
                    };
                    let mut ops = Vec::new();
                    for _ in 0..n_ops {
                        let key = kv_key(self.kv_key_on(t));
                        if locked.contains(key.as_bytes()) || !seen.insert(key.clone()) {
                            continue;
                        }
                        if self.rng.random_bool(0.05) {
                            ops.push(Op::delete(key));
                        } else {
                            let v = self.random_value();
                            ops.push(Op::put(key, v));
                        }
                    }
                    if ops.is_empty() {
                        return None;
                    }
                    parts.push((t, ops));
                }
                Some(Planned {
                    session: s,
                    kind: if distributed {
                        "kv_distributed"
                    } else {
                        "kv_local"
                    },
                    parts,
                    distributed,
                    abort: distributed && self.rng.random_bool(abort_rate),
                })
            }
            Workload::Ordered => {
                let State::Ordered { next } = &self.state else {
                    return None;
                };
                let c = next[s];
                let t = (s + c as usize) % active;
                let (key, xkey) = ordered_keys(s, c);
                let distributed = active >= 2 && self.rng.random_bool(0.2);
                let abort = distributed && self.rng.random_bool(abort_rate);
                let value = c.to_string();
                let mut parts = vec![(t, vec![Op::put(key, value.clone())])];
                if distributed {
                    let x = self.other_tablet(t);
                    parts.push((x, vec![Op::put(xkey, value)]));
                }
                if !abort {
                    if let State::Ordered { next } = &mut self.state {
                        next[s] += 1;
                    }
                }
                Some(Planned {
                    session: s,
                    kind: if distributed {
                        "ordered_distributed"
                    } else {
                        "ordered_local"
                    },
                    parts,
                    distributed,
                    abort,
                })
            }
        }
    }

    /// One round of up to `budget` transactions.
    pub(super) fn round(&mut self, budget: usize) -> Result<()> {
        let n_sessions = self.sessions.len();
        let mut busy = vec![false; n_sessions];
        let mut n_busy = 0;
        let mut locked: HashSet<Vec<u8>> = HashSet::new();
        let mut planned = Vec::with_capacity(budget);
        let mut misses = 0;
        while planned.len() < budget && n_busy < n_sessions && misses < 16 {
            let s = self.rr % n_sessions;
            self.rr = self.rr.wrapping_add(1);
            if busy[s] {
                continue;
            }
            let Some(p) = self.plan(s, &locked) else {
                misses += 1;
                continue;
            };
            if p.distributed {
                // The session waits for the decision: nothing more from it this round, and
                // nobody touches its keys until then.
                busy[s] = true;
                n_busy += 1;
                for (_, ops) in &p.parts {
                    locked.extend(ops.iter().map(|o| o.key.clone()));
                }
            }
            planned.push(p);
        }
        self.attempted += planned.len() as u64;

        // Phase 1: writes and intents, in plan order.
        let mut touched = vec![false; self.opts.tablets];
        let mut intent_tablets = vec![false; self.opts.tablets];
        let mut local_done = Vec::new();
        let mut decisions = Vec::new();
        for p in planned {
            if !p.distributed {
                let (t, ops) = p.parts.into_iter().next().context("empty transaction")?;
                let (ht, trx_id, gtid) = self.append_local(p.session, t, ops)?;
                touched[t] = true;
                local_done.push((p.kind, ht, trx_id, gtid, t));
                continue;
            }
            let mut dt = self.sessions[p.session].begin(TxnId::from_u128(self.rng.random()));
            // The first participant holds the decision.
            let status = p
                .parts
                .first()
                .map(|(t, _)| *t)
                .context("empty transaction")?;
            for (t, ops) in p.parts {
                let intent = dt.intent(&self.tablets[t], ops);
                self.append(t, intent)?;
                touched[t] = true;
                intent_tablets[t] = true;
            }
            decisions.push((p.kind, p.session, dt, status, p.abort));
        }
        let ends = self.commit_writers(&touched)?;
        for (kind, ht, trx_id, gtid, t) in local_done {
            self.count_commit(kind);
            self.sample(ht, trx_id, gtid, TxnKind::Local, t);
        }
        if decisions.is_empty() {
            return Ok(());
        }
        if self.opts.sync == SyncPolicy::Batch {
            for (t, pos) in ends {
                if intent_tablets[t] && !self.writers[t].wait_durable(pos, DURABLE_TIMEOUT) {
                    bail!(
                        "intents on tablet {} did not become durable within {:?}",
                        self.tablets[t],
                        DURABLE_TIMEOUT
                    );
                }
            }
        }

        // Phase 2: the decisions, on each transaction's status tablet.
        let mut touched = vec![false; self.opts.tablets];
        let mut commits = Vec::new();
        for (kind, s, dt, status, abort) in decisions {
            touched[status] = true;
            let trx_id = dt.trx_id();
            if abort {
                let body = dt.abort(&mut self.sessions[s])?;
                self.last_abort[s] = Some(trx_id);
                self.append(status, body)?;
                self.aborted += 1;
                continue;
            }
            let gtid = self.gtids.next();
            let body = dt.commit(&mut self.sessions[s], Some(gtid))?;
            self.note_commit(s, trx_id, gtid);
            let ht = self.append(status, body)?;
            commits.push((kind, ht, trx_id, gtid, status));
        }
        self.commit_writers(&touched)?;
        for (kind, ht, trx_id, gtid, t) in commits {
            self.count_commit(kind);
            self.sample(ht, trx_id, gtid, TxnKind::Distributed, t);
        }
        Ok(())
    }
}
