//! The fuzz runner and the generators shared by the crates' `tests/fuzz.rs` (the applier's
//! includes this file by path) and the WAL's property tests.
//!
//! Each property is a function of its case count, run by [`check`] on a proptest
//! [`TestRunner`]; [`fuzz_tests!`] makes two tests of each: `short::<name>` with a small
//! count (CI) and `long::<name>`, ignored, with [`LONG_CASES`]. `FUZZ_CASES=N` sets the count
//! of both; `FUZZ_SEED=S` replays a run (every run prints its seed, a failure prints how to
//! replay it and the smallest failing input proptest shrank it to).
#![allow(dead_code, clippy::unwrap_used)]

use std::fmt::Debug;
use std::time::Instant;

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestRunner};
use tidelog_wal::{Body, Gtid, HybridTime, Op, Record, TabletId, TrxId, TxnId, WalPos};

/// Cases of the long (ignored) form of each property.
pub const LONG_CASES: u32 = 100_000;

/// `FUZZ_CASES` if set, else `default`.
pub fn cases(default: u32) -> u32 {
    match std::env::var("FUZZ_CASES") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("FUZZ_CASES={s:?}: {e}")),
        Err(_) => default,
    }
}

fn seed() -> u64 {
    match std::env::var("FUZZ_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("FUZZ_SEED={s:?}: {e}")),
        Err(_) => {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new()
                .build_hasher()
                .finish()
        }
    }
}

/// Runs `test` on `cases` inputs drawn from `strategy`; a failing case (an `Err` or a
/// panic) is shrunk and reported with the seed that replays the run.
pub fn check<S>(
    name: &str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S: Strategy,
    S::Value: Debug,
{
    let seed = seed();
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..Config::default()
    });
    let t0 = Instant::now();
    match runner.run(&strategy, test) {
        Ok(()) => eprintln!(
            "fuzz {name}: {cases} cases passed in {:.2?} (FUZZ_SEED={seed})",
            t0.elapsed()
        ),
        Err(e) => panic!(
            "fuzz {name}: {e}\nreplay: FUZZ_SEED={seed} FUZZ_CASES={cases} cargo test --test fuzz {name}"
        ),
    }
}

/// `short::<name>` (the given case count) and ignored `long::<name>` ([`LONG_CASES`], or
/// the second count given) tests for each property `fn <name>(cases: u32)` of the enclosing
/// module.
#[macro_export]
macro_rules! fuzz_tests {
    ($($name:ident: $short:expr $(, $long:expr)?;)*) => {
        /// The CI form of each property: a short run.
        mod short {
            $(#[test]
            fn $name() {
                super::$name(super::cases($short))
            })*
        }
        /// The long form: `cargo test --release --test fuzz -- --ignored`.
        mod long {
            $(#[test]
            #[ignore = "long fuzz run"]
            fn $name() {
                super::$name(super::cases([$($long,)? super::LONG_CASES][0]))
            })*
        }
    };
}

// ---- mutations of a valid encoding ----

/// One change to a byte string.
#[derive(Clone, Debug)]
pub enum Mutation {
    Set(Index, u8),
    Flip(Index, u8),
    Insert(Index, u8),
    Remove(Index),
    Truncate(Index),
    Append(Vec<u8>),
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Set(i, b)),
        4 => (any::<Index>(), 0u8..8).prop_map(|(i, b)| Mutation::Flip(i, b)),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => any::<Index>().prop_map(Mutation::Remove),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => prop::collection::vec(any::<u8>(), 1..16).prop_map(Mutation::Append),
    ]
}

/// One to four mutations.
pub fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    prop::collection::vec(mutation(), 1..5)
}

/// `bytes` with `ms` applied in order (a change at an index of an empty string is skipped).
pub fn mutate(bytes: &[u8], ms: &[Mutation]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    for m in ms {
        let n = b.len();
        match m {
            Mutation::Set(i, v) if n > 0 => b[i.index(n)] = *v,
            Mutation::Flip(i, bit) if n > 0 => b[i.index(n)] ^= 1 << bit,
            Mutation::Insert(i, v) => b.insert(i.index(n + 1), *v),
            Mutation::Remove(i) if n > 0 => {
                b.remove(i.index(n));
            }
            Mutation::Truncate(i) => b.truncate(i.index(n + 1)),
            Mutation::Append(tail) => b.extend_from_slice(tail),
            _ => {}
        }
    }
    b
}

/// A decoder's input: the valid encoding it came from (`None` for random bytes) and the
/// bytes to decode — random bytes (one case in four) or the valid encoding mutated.
pub fn random_or_mutated(
    valid: impl Strategy<Value = Vec<u8>>,
    max_random: usize,
) -> impl Strategy<Value = (Option<Vec<u8>>, Vec<u8>)> {
    prop_oneof![
        1 => prop::collection::vec(any::<u8>(), 0..max_random).prop_map(|b| (None, b)),
        3 => (valid, mutations()).prop_map(|(v, ms)| {
            let m = mutate(&v, &ms);
            (Some(v), m)
        }),
    ]
}

// ---- ids and records ----

/// Key bytes: binary, zeros, and text rich in what JSON escapes.
pub fn key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => Just(Vec::new()),
        5 => prop::collection::vec(any::<u8>(), 0..48),
        1 => prop::collection::vec(Just(0u8), 1..8),
        1 => any::<String>().prop_map(String::into_bytes),
        1 => "[\"\\\\\x00-\x1f a-z\u{e9}\u{2028}\u{1F600}]{0,16}".prop_map(String::into_bytes),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    (
        key(),
        prop_oneof![
            1 => Just(None),
            1 => Just(Some(Vec::new())),
            4 => prop::collection::vec(any::<u8>(), 0..300).prop_map(Some),
        ],
    )
        .prop_map(|(key, value)| Op { key, value })
}

pub fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 0..6)
}

pub fn trx() -> impl Strategy<Value = Option<TrxId>> {
    prop::option::of((any::<u64>(), 1..=u64::MAX).prop_map(|(c, n)| TrxId::new(c, n)))
}

pub fn gtid() -> impl Strategy<Value = Option<Gtid>> {
    prop::option::of(
        (any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(d, s, q)| Gtid::new(d, s, q)),
    )
}

pub fn txn() -> impl Strategy<Value = TxnId> {
    any::<u128>().prop_map(TxnId::from_u128)
}

/// A tablet id, short ones more often (cheaper to generate than from a regex).
pub fn tablet_id() -> impl Strategy<Value = TabletId> {
    const CHARS: &[u8] = b"ABCXYZabcxyz0189_.-";
    let len = prop_oneof![3 => 1usize..6, 1 => 1usize..=64];
    len.prop_flat_map(|n| prop::collection::vec(prop::sample::select(CHARS), n))
        .prop_filter("not . or ..", |b| b != b"." && b != b"..")
        .prop_map(|b| String::from_utf8(b).unwrap().parse().unwrap())
}

/// A record body as a writer takes it (a commit names at least one participant).
pub fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        (ops(), trx(), gtid()).prop_map(|(ops, trx_id, gtid)| Body::Write { ops, trx_id, gtid }),
        (txn(), trx(), ops()).prop_map(|(txn, trx_id, ops)| Body::Intent { txn, trx_id, ops }),
        (
            txn(),
            prop::collection::vec(tablet_id(), 1..6),
            trx(),
            gtid()
        )
            .prop_map(|(txn, participants, trx_id, gtid)| Body::Commit {
                txn,
                participants,
                trx_id,
                gtid
            }),
        (txn(), trx()).prop_map(|(txn, trx_id)| Body::Abort { txn, trx_id }),
        Just(Body::Heartbeat),
    ]
}

/// A record of any kind at any hybrid time.
pub fn record() -> impl Strategy<Value = Record> {
    (any::<u64>(), body()).prop_map(|(ht, body)| Record::new(HybridTime(ht), body))
}

// ---- helpers of the properties ----

/// Records placed one after another from `first`, with strictly increasing hts from `ht`.
pub fn place(first: u64, ht: u64, bodies: Vec<Body>) -> (Vec<Record>, Vec<u8>) {
    let mut out = Vec::new();
    let mut recs = Vec::new();
    for (i, body) in bodies.into_iter().enumerate() {
        let r = Record::new(HybridTime(ht + i as u64), body);
        out.extend(r.encode(WalPos(first + out.len() as u64)).unwrap());
        recs.push(r);
    }
    (recs, out)
}

/// The text of an error, which must say something.
pub fn message_text(e: &impl std::fmt::Display) -> Result<String, TestCaseError> {
    let s = e.to_string();
    prop_assert!(!s.trim().is_empty(), "an error without a message");
    Ok(s)
}
