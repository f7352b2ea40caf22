//! XXH3-64 with seed 0: the checksum of every header, record and frame (`FORMAT.md`).
//!
//! Computed by twox-hash, which picks AVX2 or SSE2 when the process starts (`std` feature);
//! a build for the baseline x86-64 target would otherwise get SSE2 only. The values are
//! XXH3's whatever the CPU: a test checks them against a second implementation.

use std::hash::Hasher as _;

/// XXH3-64 of `bytes`.
#[inline]
pub fn xxh3_64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// XXH3-64 over bytes given in pieces; the same value as [`xxh3_64`] of them joined.
pub struct Xxh3(twox_hash::XxHash3_64);

impl Xxh3 {
    pub fn new() -> Xxh3 {
        Xxh3(twox_hash::XxHash3_64::new())
    }

    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.write(bytes);
    }

    pub fn digest(&self) -> u64 {
        self.0.finish()
    }
}

impl std::fmt::Debug for Xxh3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Xxh3").finish_non_exhaustive()
    }
}

impl Default for Xxh3 {
    fn default() -> Self {
        Xxh3::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every length up to a few stripes and blocks past XXH3's size classes (0–16, 17–128,
    /// 129–240, long), one-shot and streamed, against xxhash-rust's XXH3.
    #[test]
    fn values_are_xxh3s_at_every_size_class() {
        let data: Vec<u8> = (0..5000u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in (0..=1100).chain([1023, 1024, 1025, 4096, 4999, 5000]) {
            let b = &data[..len];
            let want = xxhash_rust::xxh3::xxh3_64(b);
            assert_eq!(xxh3_64(b), want, "one-shot, {len} bytes");
            let mut h = Xxh3::new();
            let (x, y) = b.split_at(len / 3);
            h.update(x);
            h.update(y);
            assert_eq!(h.digest(), want, "streamed, {len} bytes");
        }
    }

    proptest! {
        #[test]
        fn random_bytes_and_splits_agree(
            bytes in proptest::collection::vec(any::<u8>(), 0..9000),
            cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..6),
        ) {
            let want = xxhash_rust::xxh3::xxh3_64(&bytes);
            prop_assert_eq!(xxh3_64(&bytes), want);
            let mut at: Vec<usize> = cuts.iter().map(|c| c.index(bytes.len() + 1)).collect();
            at.sort_unstable();
            let mut h = Xxh3::new();
            let mut from = 0;
            for a in at.into_iter().chain([bytes.len()]) {
                h.update(&bytes[from..a]);
                from = a;
            }
            prop_assert_eq!(h.digest(), want);
        }
    }
}
