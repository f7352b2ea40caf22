//! The binlog the bench looks up: a seeded generator of commits over the tablets, built
//! into a store once and kept with a manifest, and its replay.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use tidelog_applier::store::{Durability, Store};
use tidelog_testkit::Session;
use tidelog_wal::format::RECORD_HEADER_LEN;
use tidelog_wal::{Body, Gtid, HybridTime, Op, Record, TabletId, TxnId, WalPos};

use crate::stats::fmt_int;

use super::*;

// ---- the commit generator ----

/// splitmix64: small, fast and deterministic; the generator replays from the seed.
#[derive(Debug, Clone)]
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub(super) fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

/// What a built store holds (written next to it; a later run reuses the store only if its
/// own parameters match).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct Manifest {
    pub(super) version: u32,
    pub(super) commits: u64,
    pub(super) tablets: usize,
    pub(super) sessions: usize,
    pub(super) distributed_pct: f64,
    pub(super) abort_pct: f64,
    pub(super) seed: u64,
    /// Connect id of session 0 (session n has `connect_base + n`).
    pub(super) connect_base: u64,
    pub(super) first_ht: u64,
    pub(super) last_ht: u64,
    pub(super) records: u64,
    pub(super) aborts: u64,
    pub(super) distributed: u64,
    pub(super) build_s: f64,
}

impl Manifest {
    pub(super) fn same_plan(&self, o: &Manifest) -> bool {
        (
            self.version,
            self.commits,
            self.tablets,
            self.sessions,
            self.seed,
        ) == (o.version, o.commits, o.tablets, o.sessions, o.seed)
            && self.distributed_pct == o.distributed_pct
            && self.abort_pct == o.abort_pct
    }
}

/// One step of the source: an aborted attempt or a commit, as records per tablet.
pub(super) enum Step {
    Abort,
    Commit { distributed: bool },
}

pub(super) struct Gen {
    pub(super) rng: Rng,
    pub(super) sessions: Vec<Session>,
    pub(super) tablets: usize,
    /// Per million: aborts, then distributed commits.
    pub(super) abort_ppm: u64,
    pub(super) dist_ppm: u64,
    pub(super) txn_seq: u128,
    pub(super) gtid_seq: u64,
    /// Per commit (gtid seq − 1): session index and commit counter.
    pub(super) table: Vec<(u32, u32)>,
}

impl Gen {
    pub(super) fn new(m: &Manifest) -> Gen {
        let ppm = |pct: f64| (pct * 10_000.0).round().clamp(0.0, 1_000_000.0) as u64;
        Gen {
            rng: Rng(m.seed),
            sessions: (0..m.sessions as u64)
                .map(|i| Session::new(m.connect_base + i))
                .collect(),
            tablets: m.tablets,
            abort_ppm: ppm(m.abort_pct),
            dist_ppm: ppm(m.distributed_pct),
            txn_seq: 0,
            gtid_seq: 0,
            table: Vec::with_capacity(m.commits as usize),
        }
    }

    pub(super) fn ops(&mut self) -> Vec<Op> {
        let k = self.rng.below(1_000_000);
        vec![Op {
            key: format!("acct/{k:07}").into_bytes(),
            value: Some(self.rng.next().to_le_bytes().to_vec()),
        }]
    }

    pub(super) fn txn(&mut self) -> TxnId {
        self.txn_seq += 1;
        TxnId::from_u128(self.txn_seq)
    }

    /// Appends the records of the next attempt to `recs` as (tablet index, body).
    pub(super) fn step(&mut self, recs: &mut Vec<(usize, Body)>) -> Step {
        let s = self.rng.below(self.sessions.len() as u64) as usize;
        let roll = self.rng.below(1_000_000);
        let t = self.rng.below(self.tablets as u64) as usize;
        if roll < self.abort_ppm {
            let trx = self.sessions[s].abort();
            let txn = self.txn();
            let ops = self.ops();
            recs.push((
                t,
                Body::Intent {
                    txn,
                    trx_id: Some(trx),
                    ops,
                },
            ));
            recs.push((
                t,
                Body::Abort {
                    txn,
                    trx_id: Some(trx),
                },
            ));
            return Step::Abort;
        }
        let trx = self.sessions[s].commit();
        self.gtid_seq += 1;
        let gtid = Gtid::new(0, 1, self.gtid_seq);
        self.table.push((
            s as u32,
            u32::try_from(trx.commit_counter).unwrap_or(u32::MAX),
        ));
        if roll < self.abort_ppm + self.dist_ppm && self.tablets >= 2 {
            let b = (t + 1 + self.rng.below(self.tablets as u64 - 1) as usize) % self.tablets;
            let txn = self.txn();
            for p in [t, b] {
                let ops = self.ops();
                recs.push((
                    p,
                    Body::Intent {
                        txn,
                        trx_id: Some(trx),
                        ops,
                    },
                ));
            }
            recs.push((
                t,
                Body::Commit {
                    txn,
                    participants: vec![tablet_id(t), tablet_id(b)],
                    trx_id: Some(trx),
                    gtid: Some(gtid),
                },
            ));
            Step::Commit { distributed: true }
        } else {
            let ops = self.ops();
            recs.push((
                t,
                Body::Write {
                    ops,
                    trx_id: Some(trx),
                    gtid: Some(gtid),
                },
            ));
            Step::Commit { distributed: false }
        }
    }
}

pub(super) fn tablet_id(i: usize) -> TabletId {
    // "t<n>" is always a valid tablet id.
    format!("t{i}")
        .parse()
        .unwrap_or_else(|_| unreachable!("t{i} is a valid tablet id"))
}

/// A distributed commit's part, applied with `Store::apply_part` after its round.
pub(super) struct Part {
    pub(super) txn: TxnId,
    pub(super) tablet: usize,
    pub(super) commit_ht: HybridTime,
    pub(super) ops: Vec<(Vec<u8>, Option<Vec<u8>>)>,
}

/// Builds the store by the apply path; returns the manifest and the generator's tables.
pub(super) fn build(store: &Store, args: &TrxArgs) -> Result<(Manifest, Gen)> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH)?;
    let first_ht = HybridTime::from_system_time(SystemTime::now());
    let mut m = Manifest {
        version: MANIFEST_VERSION,
        commits: args.commits,
        tablets: args.tablets,
        sessions: args.sessions,
        distributed_pct: args.distributed_pct,
        abort_pct: args.abort_pct,
        seed: args.seed,
        connect_base: (1u64 << 56) | (now.as_secs() << 24),
        first_ht: first_ht.0,
        last_ht: 0,
        records: 0,
        aborts: 0,
        distributed: 0,
        build_s: 0.0,
    };
    let tablets: Vec<TabletId> = (0..args.tablets).map(tablet_id).collect();
    let mut gen = Gen::new(&m);
    let mut bufs: Vec<Vec<(WalPos, Record)>> = vec![Vec::new(); args.tablets];
    let mut pos = vec![WalPos(0); args.tablets];
    let mut parts: Vec<Part> = Vec::new();
    let mut recs = Vec::new();
    let mut ht = first_ht.0;
    let mut buffered = 0usize;
    let round = args.batch * args.tablets;
    let start = Instant::now();
    let mut next_report = 1_000_000u64;

    let flush = |bufs: &mut Vec<Vec<(WalPos, Record)>>,
                 pos: &[WalPos],
                 parts: &mut Vec<Part>|
     -> Result<()> {
        for (i, b) in bufs.iter_mut().enumerate() {
            if b.is_empty() {
                continue;
            }
            store
                .apply(&tablets[i], b, pos[i], Durability::Buffered)
                .with_context(|| {
                    format!("applying {} records of tablet {}", b.len(), tablets[i])
                })?;
            b.clear();
        }
        for p in parts.drain(..) {
            store
                .apply_part(
                    &tablets[p.tablet],
                    &p.txn,
                    p.commit_ht,
                    &p.ops,
                    Durability::Buffered,
                )
                .with_context(|| {
                    format!(
                        "applying the part of txn {} on {}",
                        p.txn, tablets[p.tablet]
                    )
                })?;
        }
        Ok(())
    };

    while (gen.table.len() as u64) < args.commits {
        let step = gen.step(&mut recs);
        let first_part = parts.len();
        for (t, body) in recs.drain(..) {
            ht += 1;
            if let (Step::Commit { distributed: true }, Body::Intent { txn, ops, .. }) =
                (&step, &body)
            {
                parts.push(Part {
                    txn: *txn,
                    tablet: t,
                    commit_ht: HybridTime::MIN,
                    ops: ops
                        .iter()
                        .map(|o| (o.key.clone(), o.value.clone()))
                        .collect(),
                });
            }
            let r = Record::new(HybridTime(ht), body);
            let len = RECORD_HEADER_LEN + r.encoded_body_len()?;
            bufs[t].push((pos[t], r));
            pos[t] = pos[t].add(len as u64);
            buffered += 1;
            m.records += 1;
        }
        match step {
            Step::Abort => m.aborts += 1,
            Step::Commit { distributed } => {
                if distributed {
                    m.distributed += 1;
                    for p in &mut parts[first_part..] {
                        p.commit_ht = HybridTime(ht);
                    }
                }
            }
        }
        if buffered >= round {
            flush(&mut bufs, &pos, &mut parts)?;
            buffered = 0;
        }
        let done = gen.table.len() as u64;
        if done >= next_report {
            let s = start.elapsed().as_secs_f64();
            println!(
                "  built {:>11} commits in {s:6.1} s ({:.0} commits/s)",
                fmt_int(done),
                done as f64 / s
            );
            next_report += 1_000_000;
        }
    }
    // Heartbeats: every tablet's safe time reaches the last ht.
    ht += 1;
    for (t, b) in bufs.iter_mut().enumerate() {
        let r = Record::new(HybridTime(ht), Body::Heartbeat);
        let len = RECORD_HEADER_LEN + r.encoded_body_len()?;
        b.push((pos[t], r));
        pos[t] = pos[t].add(len as u64);
        m.records += 1;
    }
    flush(&mut bufs, &pos, &mut parts)?;
    store.raise_global_safe_time(HybridTime(ht), Durability::Buffered)?;
    store.persist()?;
    m.last_ht = ht;
    m.build_s = start.elapsed().as_secs_f64();
    Ok((m, gen))
}

/// Replays the generator of a built store (no store writes) to get its tables back.
pub(super) fn replay(m: &Manifest) -> Gen {
    let mut gen = Gen::new(m);
    let mut recs = Vec::new();
    while (gen.table.len() as u64) < m.commits {
        gen.step(&mut recs);
        recs.clear();
    }
    gen
}
