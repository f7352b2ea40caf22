//! Order-preserving encoding of MVCC keys: `escape(key) ‖ 00 01 ‖ BE(!ht)`.
//!
//! ```text
//! user key bytes, 0x00 → 00 FF     terminator   inverted hybrid time
//! ├──────────────────────────────┼────────────┼──────────────────────┤
//! │ escape(key)                  │ 00 01      │ !ht, 8 bytes BE      │
//! ```
//!
//! Properties (tested in `tests` below with proptest):
//!
//! * For one user key, versions sort newest first (`!ht` big-endian).
//! * All versions of `K` sort before any version of `K' > K`, and are not interleaved with
//!   keys that have `K` as a prefix: after `escape(K)` the terminator `00 01` is smaller
//!   than any continuation (`00 FF` for a 0x00 byte, or a non-zero byte).
//! * `escape(P ‖ X) = escape(P) ‖ escape(X)`, so the encoded keys of all user keys that
//!   start with `P` are exactly the encoded keys that start with `escape(P)`: a prefix scan
//!   is a byte-range scan ([`prefix_range`]).
//!
//! Big-endian here (and only here) because the bytes must sort as numbers; values stored
//! by the applier are little-endian like every other tidelog format.

use std::ops::Bound;

use tidelog_wal::HybridTime;

/// Bytes of the inverted hybrid time suffix.
pub const HT_LEN: usize = 8;

/// Longest encoded key the store takes (fjall keys are at most `u16::MAX` bytes). A user
/// key fits when `len + (its 0x00 bytes) + 10 ≤` this: 65 525 bytes without a NUL, 32 762
/// if every byte is one ([`encoded_len`]).
pub const MAX_ENCODED_LEN: usize = tidelog_wal::format::STORE_MAX_KEY_LEN;

const ESC: u8 = 0x00;
const ESC_ZERO: u8 = 0xFF;
const TERM: u8 = 0x01;

/// Why an encoded key does not decode.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("encoded key of {len} bytes has no 00 01 terminator")]
    NoTerminator { len: usize },
    #[error(
        "encoded key has 0x00 followed by 0x{byte:02x} at offset {offset} (expected FF or 01)"
    )]
    BadEscape { offset: usize, byte: u8 },
    #[error("encoded key has {got} bytes after its terminator at offset {offset}, expected 8")]
    BadSuffix { offset: usize, got: usize },
}

/// Length of the encoding of any version of `key`: each 0x00 byte takes two, then the
/// terminator and the hybrid time.
pub fn encoded_len(key: &[u8]) -> usize {
    key.len() + key.iter().filter(|&&b| b == ESC).count() + 2 + HT_LEN
}

/// Appends `escape(key)` (no terminator) to `out`.
pub fn escape_into(out: &mut Vec<u8>, key: &[u8]) {
    out.reserve(key.len() + 2 + HT_LEN);
    for &b in key {
        out.push(b);
        if b == ESC {
            out.push(ESC_ZERO);
        }
    }
}

/// `escape(key) ‖ 00 01`: the common prefix of every version of `key`.
pub fn encode_user_key(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2 + HT_LEN);
    escape_into(&mut out, key);
    out.extend_from_slice(&[ESC, TERM]);
    out
}

/// Appends the encoding of `(key, ht)` to `out`.
pub fn encode_into(out: &mut Vec<u8>, key: &[u8], ht: HybridTime) {
    escape_into(out, key);
    out.extend_from_slice(&[ESC, TERM]);
    out.extend_from_slice(&(!ht.0).to_be_bytes());
}

/// The encoding of version `ht` of `key`.
pub fn encode(key: &[u8], ht: HybridTime) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2 + HT_LEN);
    encode_into(&mut out, key, ht);
    out
}

/// Exclusive upper bound of all versions of `key`: `escape(key) ‖ 00 02`.
pub fn key_end(key: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + 2);
    escape_into(&mut out, key);
    out.extend_from_slice(&[ESC, TERM + 1]);
    out
}

/// The encoded versions of `key` visible at `at` (ht ≤ at), newest first:
/// `[encode(key, at), key_end(key))`.
pub fn visible_range(key: &[u8], at: HybridTime) -> (Vec<u8>, Vec<u8>) {
    (encode(key, at), key_end(key))
}

/// Byte range holding every version of every user key that starts with `prefix`.
pub fn prefix_range(prefix: &[u8]) -> (Bound<Vec<u8>>, Bound<Vec<u8>>) {
    let mut start = Vec::with_capacity(prefix.len() + 1);
    escape_into(&mut start, prefix);
    let end = match successor(&start) {
        Some(e) => Bound::Excluded(e),
        None => Bound::Unbounded,
    };
    (Bound::Included(start), end)
}

/// The smallest byte string greater than every string with prefix `p`, if any.
fn successor(p: &[u8]) -> Option<Vec<u8>> {
    let mut s = p.to_vec();
    while let Some(last) = s.pop() {
        if last != 0xFF {
            s.push(last + 1);
            return Some(s);
        }
    }
    None
}

/// Splits an encoded key into its encoded user key (`escape(key) ‖ 00 01`, which compares
/// like the user key) and its hybrid time, validating the whole layout.
pub fn split(enc: &[u8]) -> Result<(&[u8], HybridTime), KeyError> {
    let term = find_terminator(enc)?;
    let user = enc
        .get(..term + 2)
        .ok_or(KeyError::NoTerminator { len: enc.len() })?;
    Ok((user, suffix_ht(enc, term + 2)?))
}

/// Decodes an encoded key into the user key and the version's hybrid time.
pub fn decode(enc: &[u8]) -> Result<(Vec<u8>, HybridTime), KeyError> {
    let term = find_terminator(enc)?;
    let ht = suffix_ht(enc, term + 2)?;
    let mut key = Vec::with_capacity(term);
    let mut i = 0;
    while i < term {
        let b = enc[i];
        key.push(b);
        i += if b == ESC { 2 } else { 1 };
    }
    Ok((key, ht))
}

/// Offset of the `00 01` terminator, checking every escape before it.
fn find_terminator(enc: &[u8]) -> Result<usize, KeyError> {
    let mut i = 0;
    while i < enc.len() {
        if enc[i] == ESC {
            match enc.get(i + 1) {
                Some(&ESC_ZERO) => i += 2,
                Some(&TERM) => return Ok(i),
                Some(&byte) => {
                    return Err(KeyError::BadEscape {
                        offset: i + 1,
                        byte,
                    })
                }
                None => break,
            }
        } else {
            i += 1;
        }
    }
    Err(KeyError::NoTerminator { len: enc.len() })
}

fn suffix_ht(enc: &[u8], offset: usize) -> Result<HybridTime, KeyError> {
    let rest = enc.get(offset..).unwrap_or_default();
    let b: [u8; HT_LEN] = rest.try_into().map_err(|_| KeyError::BadSuffix {
        offset,
        got: rest.len(),
    })?;
    Ok(HybridTime(!u64::from_be_bytes(b)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        // Small alphabet rich in 0x00, 0x01 and 0xFF so escapes and prefixes collide often.
        prop::collection::vec(
            prop_oneof![
                Just(0u8),
                Just(1),
                Just(2),
                Just(0xFE),
                Just(0xFF),
                any::<u8>()
            ],
            0..8,
        )
    }

    fn ht() -> impl Strategy<Value = HybridTime> {
        prop_oneof![
            Just(HybridTime(0)),
            Just(HybridTime(1)),
            Just(HybridTime(u64::MAX)),
            Just(HybridTime(u64::MAX - 1)),
            any::<u64>().prop_map(HybridTime),
        ]
    }

    fn in_range(k: &[u8], r: &(Bound<Vec<u8>>, Bound<Vec<u8>>)) -> bool {
        use std::ops::RangeBounds;
        r.contains(&k.to_vec())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn order_is_key_asc_ht_desc(a in key(), ha in ht(), b in key(), hb in ht()) {
            let want = a.cmp(&b).then(hb.cmp(&ha));
            prop_assert_eq!(encode(&a, ha).cmp(&encode(&b, hb)), want);
        }

        #[test]
        fn encoded_len_is_the_length_of_the_encoding(k in key(), h in ht()) {
            prop_assert_eq!(encoded_len(&k), encode(&k, h).len());
        }

        #[test]
        fn roundtrip(k in key(), h in ht()) {
            let e = encode(&k, h);
            prop_assert_eq!(decode(&e), Ok((k.clone(), h)));
            let (user, h2) = split(&e).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(user, &encode_user_key(&k)[..]);
            prop_assert_eq!(h2, h);
        }

        #[test]
        fn prefix_range_is_exactly_the_keys_with_the_prefix(p in key(), k in key(), h in ht()) {
            let r = prefix_range(&p);
            prop_assert_eq!(in_range(&encode(&k, h), &r), k.starts_with(&p));
        }

        #[test]
        fn visible_range_holds_versions_at_or_below(k in key(), h in ht(), other in key(), at in ht()) {
            let (lo, hi) = visible_range(&k, at);
            let e = encode(&other, h);
            let inside = e >= lo && e < hi;
            prop_assert_eq!(inside, other == k && h <= at);
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in prop::collection::vec(
            prop_oneof![Just(0u8), Just(1), Just(0xFF), any::<u8>()], 0..32)) {
            match decode(&b) {
                Ok((k, h)) => prop_assert_eq!(encode(&k, h), b.clone()),
                Err(_) => prop_assert!(split(&b).is_err()),
            }
        }
    }

    #[test]
    fn decode_errors_name_the_problem() {
        assert_eq!(decode(b"ab"), Err(KeyError::NoTerminator { len: 2 }));
        assert_eq!(
            decode(&[b'a', 0, 7]),
            Err(KeyError::BadEscape { offset: 2, byte: 7 })
        );
        assert_eq!(
            decode(&[b'a', 0, 1, 9]),
            Err(KeyError::BadSuffix { offset: 3, got: 1 })
        );
        assert_eq!(decode(&[0]), Err(KeyError::NoTerminator { len: 1 }));
    }

    #[test]
    fn newest_first_and_not_interleaved_with_longer_keys() {
        let a_new = encode(b"a", HybridTime(9));
        let a_old = encode(b"a", HybridTime(1));
        let a0 = encode(b"a\0", HybridTime(u64::MAX));
        let ab = encode(b"ab", HybridTime(u64::MAX));
        assert!(a_new < a_old && a_old < a0 && a0 < ab);
        assert!(a_old < key_end(b"a") && key_end(b"a") <= a0);
    }
}
