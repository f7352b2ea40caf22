//! Checks of a run of encoded records, walked by their headers: the bytes a shipper reads
//! from a tablet's segment and sends as they are, and that the target's received log takes
//! verbatim ([`crate::Writer::append_encoded`]). The wire protocol (`tidelog-proto`) carries
//! such runs in its data frames; the checks are the log's own, so they live here.
//!
//! I/O-free: arbitrary bytes never panic them; a damaged record is named by its position
//! ([`BadRecord`]).

use zerocopy::FromBytes;

use crate::format::{record_checksum, RecordHeader, RECORD_HEADER_LEN};
use crate::ids::TabletId;
use crate::pos::WalPos;
use crate::record::header_problem;
use crate::time::HybridTime;

/// A record of a run that is not what it must be: where it is and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad record at position {pos} in a frame for tablet {tablet}: {reason}")]
pub struct BadRecord {
    pub tablet: TabletId,
    pub pos: WalPos,
    pub reason: String,
}

/// What [`verify_records`] found in a payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordsSummary {
    pub count: u32,
    pub first_ht: Option<HybridTime>,
    pub last_ht: Option<HybridTime>,
}

/// Checks that `payload` is whole, checksummed records at consecutive positions from
/// `first`, with ht strictly increasing and above `after_ht`. Does not decode bodies.
pub fn verify_records(
    tablet: &TabletId,
    payload: &[u8],
    first: WalPos,
    after_ht: Option<HybridTime>,
) -> Result<RecordsSummary, BadRecord> {
    let mut off = 0usize;
    let mut sum = RecordsSummary {
        count: 0,
        first_ht: None,
        last_ht: None,
    };
    while off < payload.len() {
        let pos = first.add(off as u64);
        let rest = &payload[off..];
        let h = RecordHeader::read_from_prefix(rest)
            .map_err(|_| BadRecord {
                tablet: tablet.clone(),
                pos,
                reason: format!("{} bytes left, too short for a record header", rest.len()),
            })?
            .0;
        let (total, ht) = check_record(tablet, &h, rest, pos, sum.last_ht.or(after_ht))?;
        sum.first_ht.get_or_insert(ht);
        sum.last_ht = Some(ht);
        sum.count += 1;
        off += total;
    }
    Ok(sum)
}

/// Checks the record with header `h` at the front of `rest` (at `pos`): header, kind,
/// checksum, and ht above `last`. Returns its whole length and its ht.
#[inline]
fn check_record(
    tablet: &TabletId,
    h: &RecordHeader,
    rest: &[u8],
    pos: WalPos,
    last: Option<HybridTime>,
) -> Result<(usize, HybridTime), BadRecord> {
    let err = |reason: String| BadRecord {
        tablet: tablet.clone(),
        pos,
        reason,
    };
    // The kind is among the header's checks.
    if let Some(reason) = header_problem(h, pos.0, rest.len()) {
        return Err(err(reason));
    }
    let total = RECORD_HEADER_LEN + h.len.get() as usize;
    if record_checksum(&rest[..total]) != h.checksum.get() {
        return Err(err("record checksum mismatch".into()));
    }
    let ht = HybridTime(h.ht.get());
    if let Some(l) = last {
        if ht <= l {
            return Err(err(format!(
                "record ht {ht} is not greater than the previous ht {l}"
            )));
        }
    }
    Ok((total, ht))
}

/// The whole, checked records at the front of a read: see [`take_records`].
#[derive(Debug)]
pub struct Taken {
    /// Bytes of whole, good records at the front.
    pub len: usize,
    pub summary: RecordsSummary,
    /// The damaged record right after them, if one stopped the walk.
    pub bad: Option<BadRecord>,
}

/// [`whole_records_prefix`] and [`verify_records`] in one walk, for a sender that checks
/// what it is about to send: takes the whole records at the front of `bytes` (records from
/// `first`) up to `max` bytes, checking each as [`verify_records`] does, and stops at the
/// first damaged one, which it reports in [`Taken::bad`]. One pass reads each record once,
/// header and body together, so the next header is already on its way into the cache
/// while a body is hashed; the two passes chased the headers through memory first.
pub fn take_records(tablet: &TabletId, bytes: &[u8], first: WalPos, max: usize) -> Taken {
    let mut off = 0usize;
    let mut summary = RecordsSummary {
        count: 0,
        first_ht: None,
        last_ht: None,
    };
    let mut bad = None;
    while let Ok((h, _)) = RecordHeader::read_from_prefix(&bytes[off..]) {
        if h.len.get() == 0 && h.checksum.get() == 0 && h.kind == 0 {
            break;
        }
        let total = RECORD_HEADER_LEN + h.len.get() as usize;
        if off + total > bytes.len() || off + total > max {
            break;
        }
        let pos = first.add(off as u64);
        match check_record(tablet, &h, &bytes[off..off + total], pos, summary.last_ht) {
            Ok((_, ht)) => {
                summary.first_ht.get_or_insert(ht);
                summary.last_ht = Some(ht);
                summary.count += 1;
                off += total;
            }
            Err(e) => {
                bad = Some(e);
                break;
            }
        }
    }
    Taken {
        len: off,
        summary,
        bad,
    }
}

/// Splits `bytes` (records from `first`) at the last record boundary at or below `max`
/// bytes, reading only headers. Returns the length of the whole-record prefix and the
/// count and last ht of its records; `0` if the first record alone exceeds `max` (the
/// caller then sends that one record alone) or `bytes` holds no whole record.
pub fn whole_records_prefix(bytes: &[u8], max: usize) -> (usize, u32, Option<HybridTime>) {
    let mut off = 0usize;
    let mut n = 0u32;
    let mut ht = None;
    while let Ok((h, _)) = RecordHeader::read_from_prefix(&bytes[off..]) {
        let total = RECORD_HEADER_LEN + h.len.get() as usize;
        if h.len.get() == 0 && h.checksum.get() == 0 && h.kind == 0 {
            break;
        }
        if off + total > bytes.len() || off + total > max {
            break;
        }
        off += total;
        n += 1;
        ht = Some(HybridTime(h.ht.get()));
    }
    (off, n, ht)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{Body, Op, Record};

    fn t(s: &str) -> TabletId {
        s.parse().unwrap()
    }

    fn records(first: WalPos, n: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for i in 0..n {
            let r = Record::new(
                HybridTime(100 + i as u64),
                Body::Write {
                    ops: vec![Op::put(format!("k{i}"), vec![i as u8; i * 7])],
                    trx_id: None,
                    gtid: None,
                },
            );
            out.extend(r.encode(first.add(out.len() as u64)).unwrap());
        }
        out
    }

    #[test]
    fn prefix_split_stops_at_a_record_boundary() {
        let payload = records(WalPos(0), 10);
        let (n, c, _) = whole_records_prefix(&payload, payload.len());
        assert_eq!((n, c), (payload.len(), 10));
        let (n, c, _) = whole_records_prefix(&payload, payload.len() - 1);
        assert_eq!(c, 9);
        assert!(verify_records(&t("a"), &payload[..n], WalPos(0), None).is_ok());
        assert_eq!(whole_records_prefix(&payload, 10).0, 0);
        let mut zeros = payload.clone();
        zeros.extend([0u8; 64]);
        assert_eq!(whole_records_prefix(&zeros, usize::MAX).1, 10);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let _ = verify_records(&t("x"), &bytes, WalPos(0), None);
                let _ = whole_records_prefix(&bytes, 256);
                let _ = take_records(&t("x"), &bytes, WalPos(0), 256);
            }

            /// The one-pass walk takes exactly what the two passes it replaces took: the
            /// whole-record prefix, cut short at the first damaged record, which it names.
            #[test]
            fn take_records_is_prefix_then_verify(
                n in 1usize..8,
                flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
                max in any::<prop::sample::Index>(),
                zero_tail in 0usize..80,
            ) {
                let first = WalPos(4096);
                let mut bytes = records(first, n);
                for (i, v) in &flips {
                    let at = i.index(bytes.len());
                    bytes[at] = *v;
                }
                bytes.extend(std::iter::repeat_n(0u8, zero_tail));
                let max = max.index(bytes.len() + 1);
                let taken = take_records(&t("p"), &bytes, first, max);
                let (len, count, last) = whole_records_prefix(&bytes, max);
                match verify_records(&t("p"), &bytes[..len], first, None) {
                    Ok(sum) => {
                        prop_assert!(taken.bad.is_none(), "{:?}", taken.bad);
                        prop_assert_eq!(taken.len, len);
                        prop_assert_eq!(taken.summary, sum);
                        prop_assert_eq!((sum.count, sum.last_ht), (count, last));
                    }
                    Err(e) => {
                        prop_assert_eq!(taken.len as u64, e.pos.since(first));
                        prop_assert_eq!(taken.bad.as_ref().map(|b| b.to_string()), Some(e.to_string()));
                        let good = verify_records(&t("p"), &bytes[..taken.len], first, None).unwrap();
                        prop_assert_eq!(taken.summary, good);
                    }
                }
            }
        }
    }
}
