//! An in-memory, growable Bloom filter over transaction ids: what lets the apply path tell
//! a new transaction from an aborted one without searching the `aborted` keyspace.
//!
//! ```text
//!  filters:  [ 64 Ki ids ][ 128 Ki ids ][ 256 Ki ids ] …    each 10 bits per id, 7 probes
//!             full          full          filling        ← inserts go to the last one
//!  may_contain(id) = any filter has all 7 bits of id set
//! ```
//!
//! No false negatives: every inserted id answers `true`. A false positive (each filter
//! about 0.8 % when full) only costs the store search the filter exists to avoid. Ids are
//! never removed (the keyspace's retention deletes keys the filter still holds: more false
//! positives until the next restart rebuilds it).

use std::hash::{BuildHasher, RandomState};

/// Ids the first filter holds before a second (twice as large) is added.
const FIRST_CAPACITY: usize = 64 << 10;
const BITS_PER_ID: usize = 10;
const PROBES: usize = 7;

struct Filter {
    bits: Vec<u64>,
    capacity: usize,
    len: usize,
}

impl Filter {
    fn new(capacity: usize) -> Filter {
        Filter {
            bits: vec![0; (capacity * BITS_PER_ID).div_ceil(64)],
            capacity,
            len: 0,
        }
    }

    /// Bit positions of `h` (double hashing: h1 + i·h2).
    fn positions(&self, h: u64) -> [usize; PROBES] {
        let n = (self.bits.len() * 64) as u64;
        let (h1, h2) = (h, h.rotate_left(32) | 1);
        std::array::from_fn(|i| (h1.wrapping_add((i as u64).wrapping_mul(h2)) % n) as usize)
    }

    fn insert(&mut self, h: u64) {
        for p in self.positions(h) {
            self.bits[p / 64] |= 1 << (p % 64);
        }
        self.len += 1;
    }

    fn may_contain(&self, h: u64) -> bool {
        self.positions(h)
            .iter()
            .all(|p| self.bits[p / 64] & (1 << (p % 64)) != 0)
    }
}

/// See the module documentation.
pub struct IdFilter {
    filters: Vec<Filter>,
    hasher: RandomState,
}

impl Default for IdFilter {
    fn default() -> Self {
        IdFilter {
            filters: vec![Filter::new(FIRST_CAPACITY)],
            hasher: RandomState::new(),
        }
    }
}

impl IdFilter {
    fn hash(&self, id: &[u8]) -> u64 {
        self.hasher.hash_one(id)
    }

    pub fn insert(&mut self, id: &[u8]) {
        let h = self.hash(id);
        if self.filters.last().is_none_or(|f| f.len >= f.capacity) {
            let cap = self
                .filters
                .last()
                .map_or(FIRST_CAPACITY, |f| f.capacity * 2);
            self.filters.push(Filter::new(cap));
        }
        if let Some(f) = self.filters.last_mut() {
            f.insert(h);
        }
    }

    /// False: `id` was never inserted. True: it may have been.
    pub fn may_contain(&self, id: &[u8]) -> bool {
        let h = self.hash(id);
        self.filters.iter().any(|f| f.may_contain(h))
    }

    /// Ids inserted.
    pub fn len(&self) -> usize {
        self.filters.iter().map(|f| f.len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of bit arrays.
    pub fn memory(&self) -> usize {
        self.filters.iter().map(|f| f.bits.len() * 8).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u64) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&i.to_be_bytes());
        b
    }

    /// Every inserted id is found, across several filter growths; ids never inserted are
    /// mostly not (the false-positive rate stays near the design's).
    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let mut f = IdFilter::default();
        let n = FIRST_CAPACITY as u64 * 5;
        for i in 0..n {
            f.insert(&id(i * 2));
        }
        assert_eq!(f.len() as u64, n);
        assert!(f.filters.len() >= 3, "never grew: {}", f.filters.len());
        for i in 0..n {
            assert!(f.may_contain(&id(i * 2)), "inserted id {} not found", i * 2);
        }
        let probes = 200_000u64;
        let fp = (0..probes)
            .filter(|i| f.may_contain(&id(i * 2 + 1)))
            .count();
        let rate = fp as f64 / probes as f64;
        assert!(rate < 0.03, "false-positive rate {rate}");
        let empty = IdFilter::default();
        assert!(empty.is_empty());
        assert!((0..1000).all(|i| !empty.may_contain(&id(i))));
    }
}
