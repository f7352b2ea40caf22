//! Fixed on-disk headers. The byte layouts are drawn in `wal/FORMAT.md`; every struct here is
//! `#[repr(C)]`, unaligned little-endian fields only (no padding), with a compile-time size
//! assertion.

use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::ids::{TabletId, MAX_TABLET_ID_LEN};
use crate::pos::WalPos;

/// First 8 bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 8] = *b"TIDEWAL\0";
/// Segment format version this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Segment header: 128 bytes at offset 0 of every segment file.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct SegmentHeader {
    pub magic: [u8; 8],
    pub version: U32,
    /// Length of this header; records start here.
    pub header_len: U32,
    /// Logical position of the first record in this segment.
    pub first_pos: U64,
    /// Size the file was preallocated to.
    pub segment_size: U64,
    pub tablet_len: U16,
    pub reserved0: [u8; 6],
    pub tablet: [u8; MAX_TABLET_ID_LEN],
    pub reserved1: [u8; 16],
    /// xxh3-64 of bytes 0..120.
    pub checksum: U64,
}
pub const SEGMENT_HEADER_LEN: usize = 128;
const _: () = assert!(size_of::<SegmentHeader>() == SEGMENT_HEADER_LEN);

impl SegmentHeader {
    pub fn new(tablet: &TabletId, first_pos: WalPos, segment_size: u64) -> SegmentHeader {
        let mut t = [0u8; MAX_TABLET_ID_LEN];
        let tb = tablet.as_str().as_bytes();
        t[..tb.len()].copy_from_slice(tb);
        let mut h = SegmentHeader {
            magic: SEGMENT_MAGIC,
            version: U32::new(FORMAT_VERSION),
            header_len: U32::new(SEGMENT_HEADER_LEN as u32),
            first_pos: U64::new(first_pos.0),
            segment_size: U64::new(segment_size),
            tablet_len: U16::new(tb.len() as u16),
            reserved0: [0; 6],
            tablet: t,
            reserved1: [0; 16],
            checksum: U64::new(0),
        };
        h.checksum = U64::new(h.compute_checksum());
        h
    }

    pub fn compute_checksum(&self) -> u64 {
        crate::hash::xxh3_64(&self.as_bytes()[..SEGMENT_HEADER_LEN - 8])
    }

    /// Checks magic, version, checksum and lengths; returns the reason it is invalid.
    pub fn validate(&self) -> Result<(), String> {
        if self.magic != SEGMENT_MAGIC {
            return Err(format!(
                "bad segment magic {:02x?}, expected {:02x?}",
                self.magic, SEGMENT_MAGIC
            ));
        }
        if self.version.get() != FORMAT_VERSION {
            return Err(format!(
                "unsupported segment format version {}, this build reads version {FORMAT_VERSION}",
                self.version.get()
            ));
        }
        if self.checksum.get() != self.compute_checksum() {
            return Err("segment header checksum mismatch".into());
        }
        if self.header_len.get() as usize != SEGMENT_HEADER_LEN {
            return Err(format!(
                "segment header length {} is not {SEGMENT_HEADER_LEN}",
                self.header_len.get()
            ));
        }
        if self.tablet_len.get() as usize > MAX_TABLET_ID_LEN || self.tablet_len.get() == 0 {
            return Err(format!(
                "tablet id length {} out of range",
                self.tablet_len.get()
            ));
        }
        Ok(())
    }

    pub fn tablet_str(&self) -> &[u8] {
        let n = (self.tablet_len.get() as usize).min(MAX_TABLET_ID_LEN);
        &self.tablet[..n]
    }
}

/// Record kinds (byte 12 of the record header).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, strum::FromRepr, strum::IntoStaticStr)]
#[strum(serialize_all = "snake_case")]
#[repr(u8)]
pub enum Kind {
    Write = 1,
    Intent = 2,
    Commit = 3,
    Abort = 4,
    Heartbeat = 5,
}

impl Kind {
    /// The kind numbered `b` (byte 12 of the record header), if there is one.
    pub fn from_u8(b: u8) -> Option<Kind> {
        Kind::from_repr(b)
    }

    /// `write`, `intent`, `commit`, `abort` or `heartbeat` (the JSON form's `kind`).
    pub fn name(self) -> &'static str {
        self.into()
    }
}

/// Record flag: the body carries a trx id.
pub const FLAG_TRX_ID: u8 = 1;
/// Record flag: the body carries a gtid.
pub const FLAG_GTID: u8 = 2;
pub const KNOWN_FLAGS: u8 = FLAG_TRX_ID | FLAG_GTID;

/// Record header: 32 bytes in front of every record body.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RecordHeader {
    /// xxh3-64 over header bytes 8..32 followed by the body.
    pub checksum: U64,
    /// Body length in bytes (the record occupies 32 + len bytes).
    pub len: U32,
    pub kind: u8,
    pub flags: u8,
    pub reserved: U16,
    pub ht: U64,
    /// The record's own logical position: catches misplaced or stale bytes.
    pub pos: U64,
}
pub const RECORD_HEADER_LEN: usize = 32;
const _: () = assert!(size_of::<RecordHeader>() == RECORD_HEADER_LEN);

/// The checksum a whole encoded record (header and body, contiguous) should carry: xxh3 of
/// its header's bytes 8..32 and its body, in one pass. (Hashed with xxh3's streaming
/// hasher, header and body apart, the value is the same; its state setup made verifying
/// 1 KiB records 2–3× dearer, BENCHMARKS.md.)
pub fn record_checksum(record: &[u8]) -> u64 {
    crate::hash::xxh3_64(record.get(8..).unwrap_or_default())
}

/// Longest key in an op: 32 752 bytes, one limit for the whole path (writer, `wal append`,
/// wire, the target's store). The target's store (fjall) takes keys of at most 65 535
/// bytes, and its MVCC encoding of a key doubles every NUL byte and adds 10 bytes
/// (`applier/STORE.md`): 2 × 32 752 + 10 = 65 514 fits, whatever the key's bytes.
pub const MAX_KEY_LEN: usize = 32_752;
/// The target store's longest key (fjall's limit).
pub const STORE_MAX_KEY_LEN: usize = 65_535;
const _: () = assert!(2 * MAX_KEY_LEN + 10 <= STORE_MAX_KEY_LEN);
/// Longest value in an op.
pub const MAX_VALUE_LEN: usize = 8 * 1024 * 1024;
/// Longest record body.
pub const MAX_BODY_LEN: usize = 16 * 1024 * 1024;
/// Most participants a commit may name.
pub const MAX_PARTICIPANTS: usize = 4096;
/// Value-length marker of a deleting op (tombstone).
pub const TOMBSTONE: u32 = u32::MAX;

/// Smallest segment size accepted.
pub const MIN_SEGMENT_SIZE: u64 = 4096;
/// Default segment size.
pub const DEFAULT_SEGMENT_SIZE: u64 = 64 * 1024 * 1024;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use zerocopy::FromBytes;

    /// The one-pass checksum of a whole record is the streaming one over its header and
    /// body, for bodies around the hasher's internal block and buffer sizes.
    #[test]
    fn one_pass_record_checksum_equals_the_streaming_one() {
        for len in [
            0usize, 1, 15, 16, 17, 64, 100, 128, 200, 239, 240, 241, 255, 256, 1000, 1024, 4096,
            100_000,
        ] {
            let mut rec: Vec<u8> = (0..RECORD_HEADER_LEN + len)
                .map(|i| (i.wrapping_mul(31) % 251) as u8)
                .collect();
            rec[..8].fill(0);
            let (h, body) = RecordHeader::read_from_prefix(&rec).unwrap();
            let mut streaming = crate::hash::Xxh3::new();
            streaming.update(&h.as_bytes()[8..]);
            streaming.update(body);
            assert_eq!(
                record_checksum(&rec),
                streaming.digest(),
                "body of {len} bytes"
            );
        }
    }
}
