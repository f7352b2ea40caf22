//! The record model (docs/ARCHITECTURE.md, "Concepts") and its body encoding.
//!
//! Body layout, after the 32-byte [`RecordHeader`](crate::format::RecordHeader), all
//! little-endian, fields in this order and present only where the kind has them:
//!
//! ```text
//! txn            16 bytes               intent, commit, abort
//! trx_id         u64 connect, u64 count if FLAG_TRX_ID
//! gtid           u32 dom, u32 srv, u64 seq  if FLAG_GTID (write, commit)
//! participants   u16 n, n × (u8 len, len bytes)   commit
//! ops            u32 n, n × (u32 klen, u32 vlen | 0xFFFFFFFF, key, value)   write, intent
//! ```

use crate::error::{Error, Result};
use crate::format::*;
use crate::ids::{Gtid, TabletId, TrxId, TxnId};
use crate::time::HybridTime;

/// One key write: `value: None` deletes the key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Op {
    pub key: Vec<u8>,
    pub value: Option<Vec<u8>>,
}

impl Op {
    pub fn put(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Op {
        Op {
            key: key.into(),
            value: Some(value.into()),
        }
    }
    pub fn delete(key: impl Into<Vec<u8>>) -> Op {
        Op {
            key: key.into(),
            value: None,
        }
    }
}

/// What a record says, by kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Body {
    /// A transaction confined to this tablet, committed at the record's ht.
    Write {
        ops: Vec<Op>,
        trx_id: Option<TrxId>,
        gtid: Option<Gtid>,
    },
    /// Provisional writes of distributed transaction `txn`.
    Intent {
        txn: TxnId,
        trx_id: Option<TrxId>,
        ops: Vec<Op>,
    },
    /// The commit decision for `txn`; the record's ht is the commit_ht.
    Commit {
        txn: TxnId,
        participants: Vec<TabletId>,
        trx_id: Option<TrxId>,
        gtid: Option<Gtid>,
    },
    /// `txn` will never commit.
    Abort { txn: TxnId, trx_id: Option<TrxId> },
    /// Nothing with ht ≤ this will follow in this tablet.
    Heartbeat,
}

/// A record: a hybrid time and a body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    pub ht: HybridTime,
    pub body: Body,
}

impl Record {
    pub fn new(ht: HybridTime, body: Body) -> Record {
        Record { ht, body }
    }

    pub fn kind(&self) -> Kind {
        match self.body {
            Body::Write { .. } => Kind::Write,
            Body::Intent { .. } => Kind::Intent,
            Body::Commit { .. } => Kind::Commit,
            Body::Abort { .. } => Kind::Abort,
            Body::Heartbeat => Kind::Heartbeat,
        }
    }

    pub fn trx_id(&self) -> Option<TrxId> {
        match &self.body {
            Body::Write { trx_id, .. }
            | Body::Intent { trx_id, .. }
            | Body::Commit { trx_id, .. }
            | Body::Abort { trx_id, .. } => *trx_id,
            Body::Heartbeat => None,
        }
    }

    pub fn gtid(&self) -> Option<Gtid> {
        match &self.body {
            Body::Write { gtid, .. } | Body::Commit { gtid, .. } => *gtid,
            _ => None,
        }
    }

    pub fn txn(&self) -> Option<TxnId> {
        match &self.body {
            Body::Intent { txn, .. } | Body::Commit { txn, .. } | Body::Abort { txn, .. } => {
                Some(*txn)
            }
            _ => None,
        }
    }

    pub fn ops(&self) -> &[Op] {
        match &self.body {
            Body::Write { ops, .. } | Body::Intent { ops, .. } => ops,
            _ => &[],
        }
    }

    pub(crate) fn flags(&self) -> u8 {
        let mut f = 0;
        if self.trx_id().is_some() {
            f |= FLAG_TRX_ID;
        }
        if self.gtid().is_some() {
            f |= FLAG_GTID;
        }
        f
    }

    /// Body length in bytes, after checking every format limit.
    pub fn encoded_body_len(&self) -> Result<usize> {
        let mut n = 0usize;
        if self.txn().is_some() {
            n += 16;
        }
        if self.trx_id().is_some() {
            n += 16;
        }
        if self.gtid().is_some() {
            n += 16;
        }
        if let Body::Commit { participants, .. } = &self.body {
            if participants.len() > MAX_PARTICIPANTS {
                return Err(Error::too_large(
                    "participant list",
                    participants.len(),
                    MAX_PARTICIPANTS,
                ));
            }
            n += 2 + participants
                .iter()
                .map(|p| 1 + p.as_str().len())
                .sum::<usize>();
        }
        if matches!(self.body, Body::Write { .. } | Body::Intent { .. }) {
            n += 4;
            for op in self.ops() {
                if op.key.len() > MAX_KEY_LEN {
                    return Err(Error::too_large("key", op.key.len(), MAX_KEY_LEN));
                }
                let vlen = op.value.as_ref().map_or(0, |v| v.len());
                if vlen > MAX_VALUE_LEN {
                    return Err(Error::too_large("value", vlen, MAX_VALUE_LEN));
                }
                n += 8 + op.key.len() + vlen;
                if n > MAX_BODY_LEN {
                    break;
                }
            }
        }
        if n > MAX_BODY_LEN {
            return Err(Error::too_large("record body", n, MAX_BODY_LEN));
        }
        Ok(n)
    }

    /// What a writer asks of a new record beyond the size limits that
    /// [`Record::encoded_body_len`] checks: a `commit` names at least one participant (the
    /// tablets holding its intents). Records already in a log are not held to it: the
    /// decoder accepts what older writers wrote, and the target decides what to do with it.
    pub fn check_new(&self) -> Result<()> {
        if let Body::Commit {
            txn, participants, ..
        } = &self.body
        {
            if participants.is_empty() {
                return Err(Error::InvalidRecord(format!(
                    "the commit of txn {txn} names no participant; a commit names the tablets that hold its intents"
                )));
            }
        }
        Ok(())
    }

    /// Writes the body into `out`, which must be exactly `encoded_body_len()` long.
    pub fn encode_body(&self, out: &mut [u8]) {
        let mut w = Cursor { buf: out, at: 0 };
        if let Some(txn) = self.txn() {
            w.put(&txn.0);
        }
        if let Some(t) = self.trx_id() {
            w.put(&t.connect_id.to_le_bytes());
            w.put(&t.commit_counter.to_le_bytes());
        }
        if let Some(g) = self.gtid() {
            w.put(&g.domain.to_le_bytes());
            w.put(&g.server.to_le_bytes());
            w.put(&g.seq.to_le_bytes());
        }
        if let Body::Commit { participants, .. } = &self.body {
            w.put(&(participants.len() as u16).to_le_bytes());
            for p in participants {
                w.put(&[p.as_str().len() as u8]);
                w.put(p.as_str().as_bytes());
            }
        }
        if let Body::Write { ops, .. } | Body::Intent { ops, .. } = &self.body {
            w.put(&(ops.len() as u32).to_le_bytes());
            for op in ops {
                w.put(&(op.key.len() as u32).to_le_bytes());
                match &op.value {
                    Some(v) => w.put(&(v.len() as u32).to_le_bytes()),
                    None => w.put(&TOMBSTONE.to_le_bytes()),
                }
                w.put(&op.key);
                if let Some(v) = &op.value {
                    w.put(v);
                }
            }
        }
        debug_assert_eq!(
            w.at,
            w.buf.len(),
            "encoded_body_len disagrees with encode_body"
        );
    }

    /// The whole record (header + body) as it would be written at `pos`.
    pub fn encode(&self, pos: crate::pos::WalPos) -> Result<Vec<u8>> {
        let body_len = self.encoded_body_len()?;
        let mut out = vec![0u8; RECORD_HEADER_LEN + body_len];
        self.encode_at(pos, &mut out);
        Ok(out)
    }

    /// Encodes header and body into `out` (exactly 32 + body len bytes).
    pub(crate) fn encode_at(&self, pos: crate::pos::WalPos, out: &mut [u8]) {
        use zerocopy::little_endian::{U16, U32, U64};
        use zerocopy::IntoBytes;
        let (head, body) = out.split_at_mut(RECORD_HEADER_LEN);
        self.encode_body(body);
        let h = RecordHeader {
            checksum: U64::new(0),
            len: U32::new(body.len() as u32),
            kind: self.kind() as u8,
            flags: self.flags(),
            reserved: U16::new(0),
            ht: U64::new(self.ht.0),
            pos: U64::new(pos.0),
        };
        head.copy_from_slice(h.as_bytes());
        // Header bytes 8..32 and the body are contiguous in `out`.
        let sum = crate::format::record_checksum(out);
        out[..8].copy_from_slice(&sum.to_le_bytes());
    }

    /// Decodes a body of `kind` with `flags` at `ht`; the reason on failure.
    pub fn decode_body(
        kind: Kind,
        flags: u8,
        ht: HybridTime,
        body: &[u8],
    ) -> Result<Record, String> {
        if flags & !KNOWN_FLAGS != 0 {
            return Err(format!("unknown record flags {flags:#04x}"));
        }
        let mut r = Reader { buf: body, at: 0 };
        let txn = match kind {
            Kind::Intent | Kind::Commit | Kind::Abort => Some(TxnId(r.array::<16>("txn")?)),
            _ => None,
        };
        let trx_id = if flags & FLAG_TRX_ID != 0 {
            if kind == Kind::Heartbeat {
                return Err("a heartbeat carries no trx id".into());
            }
            let c = r.u64("trx_id.connect_id")?;
            let n = r.u64("trx_id.commit_counter")?;
            if n == 0 {
                return Err("trx_id commit_counter is 0".into());
            }
            Some(TrxId::new(c, n))
        } else {
            None
        };
        let gtid = if flags & FLAG_GTID != 0 {
            if !matches!(kind, Kind::Write | Kind::Commit) {
                return Err(format!("a {} record carries no gtid", kind.name()));
            }
            let d = r.u32("gtid.domain")?;
            let s = r.u32("gtid.server")?;
            let q = r.u64("gtid.seq")?;
            Some(Gtid::new(d, s, q))
        } else {
            None
        };
        let body = match kind {
            Kind::Write | Kind::Intent => {
                let n = r.u32("op count")? as usize;
                // Each op takes at least 8 bytes: bound the allocation by what is there.
                if n > r.remaining() / 8 {
                    return Err(format!(
                        "op count {n} exceeds what {} bytes can hold",
                        r.remaining()
                    ));
                }
                let mut ops = Vec::with_capacity(n);
                for i in 0..n {
                    let klen = r.u32("key length")? as usize;
                    let vlen = r.u32("value length")?;
                    if klen > MAX_KEY_LEN {
                        return Err(format!("op {i}: key length {klen} exceeds {MAX_KEY_LEN}"));
                    }
                    let key = r.bytes(klen, "key")?.to_vec();
                    let value = if vlen == TOMBSTONE {
                        None
                    } else {
                        if vlen as usize > MAX_VALUE_LEN {
                            return Err(format!(
                                "op {i}: value length {vlen} exceeds {MAX_VALUE_LEN}"
                            ));
                        }
                        Some(r.bytes(vlen as usize, "value")?.to_vec())
                    };
                    ops.push(Op { key, value });
                }
                match (kind, txn) {
                    (Kind::Intent, Some(txn)) => Body::Intent { txn, trx_id, ops },
                    _ => Body::Write { ops, trx_id, gtid },
                }
            }
            Kind::Commit => {
                let n = r.u16("participant count")? as usize;
                if n > MAX_PARTICIPANTS {
                    return Err(format!("participant count {n} exceeds {MAX_PARTICIPANTS}"));
                }
                let mut participants = Vec::with_capacity(n.min(r.remaining()));
                for i in 0..n {
                    let len = r.array::<1>("participant length")?[0] as usize;
                    let b = r.bytes(len, "participant")?;
                    let s = std::str::from_utf8(b)
                        .map_err(|_| format!("participant {i} is not UTF-8"))?;
                    let t = s
                        .parse::<TabletId>()
                        .map_err(|e| format!("participant {i}: {e}"))?;
                    participants.push(t);
                }
                Body::Commit {
                    txn: txn.unwrap_or_default(),
                    participants,
                    trx_id,
                    gtid,
                }
            }
            Kind::Abort => Body::Abort {
                txn: txn.unwrap_or_default(),
                trx_id,
            },
            Kind::Heartbeat => Body::Heartbeat,
        };
        if r.remaining() != 0 {
            return Err(format!(
                "{} trailing bytes after the {} body",
                r.remaining(),
                kind.name()
            ));
        }
        Ok(Record { ht, body })
    }
}

struct Cursor<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Cursor<'_> {
    #[inline]
    fn put(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
}

struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.at
    }
    fn bytes(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.remaining() < n {
            return Err(format!(
                "body ends inside {what}: needs {n} bytes at body offset {}, {} left",
                self.at,
                self.remaining()
            ));
        }
        let b = &self.buf[self.at..self.at + n];
        self.at += n;
        Ok(b)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N, what)?);
        Ok(a)
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
}

/// Outcome of checking the bytes at one position.
#[derive(Debug)]
pub enum Parsed {
    /// A whole valid record of `len` total bytes.
    Record { record: Record, len: usize },
    /// 32 zero bytes (or fewer than 32 bytes left): nothing was written here.
    End,
    /// Bytes that are not a valid record at this position; the reason.
    Invalid(String),
    /// A whole record — header valid, checksum matching — whose body does not decode with
    /// this build's limits (a key longer than `MAX_KEY_LEN`, say, from a source built with
    /// other limits): not a torn write, so recovery keeps it (a log is neither cut nor
    /// refused for it), and a reader refuses it naming it. `len` is its whole length.
    Undecodable {
        ht: HybridTime,
        len: usize,
        reason: String,
    },
}

/// Validates the record at the start of `buf`, which must be at logical position `pos`.
/// Checks header fields, position, length, checksum and body.
pub fn parse_record(buf: &[u8], pos: u64) -> Parsed {
    use zerocopy::FromBytes;
    let Some(head) = buf.get(..RECORD_HEADER_LEN) else {
        return if buf.iter().all(|&b| b == 0) {
            Parsed::End
        } else {
            Parsed::Invalid(format!(
                "{} bytes left, too short for a record header",
                buf.len()
            ))
        };
    };
    if head.iter().all(|&b| b == 0) {
        return Parsed::End;
    }
    let Ok(h) = RecordHeader::read_from_bytes(head) else {
        return Parsed::Invalid("unreadable record header".into());
    };
    if let Some(reason) = header_problem(&h, pos, buf.len()) {
        return Parsed::Invalid(reason);
    }
    let len = h.len.get() as usize;
    let body = &buf[RECORD_HEADER_LEN..RECORD_HEADER_LEN + len];
    if crate::format::record_checksum(&buf[..RECORD_HEADER_LEN + len]) != h.checksum.get() {
        return Parsed::Invalid("record checksum mismatch".into());
    }
    let Some(kind) = Kind::from_u8(h.kind) else {
        return Parsed::Invalid(format!("unknown record kind {}", h.kind));
    };
    match Record::decode_body(kind, h.flags, HybridTime(h.ht.get()), body) {
        Ok(record) => Parsed::Record {
            record,
            len: RECORD_HEADER_LEN + len,
        },
        Err(reason) => Parsed::Undecodable {
            ht: HybridTime(h.ht.get()),
            len: RECORD_HEADER_LEN + len,
            reason,
        },
    }
}

/// Cheap header checks (no checksum): the reason the header cannot start a record at `pos`
/// with `avail` bytes available.
pub fn header_problem(h: &RecordHeader, pos: u64, avail: usize) -> Option<String> {
    if h.pos.get() != pos {
        return Some(format!(
            "record header says position {}, but it is at position {pos}",
            h.pos.get()
        ));
    }
    if Kind::from_u8(h.kind).is_none() {
        return Some(format!("unknown record kind {}", h.kind));
    }
    if h.reserved.get() != 0 {
        return Some("reserved header bytes are not zero".into());
    }
    let len = h.len.get() as usize;
    if len > MAX_BODY_LEN {
        return Some(format!("record length {len} exceeds {MAX_BODY_LEN}"));
    }
    if RECORD_HEADER_LEN + len > avail {
        return Some(format!(
            "record of {} bytes runs past the end of the data ({avail} bytes left)",
            RECORD_HEADER_LEN + len
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pos::WalPos;

    #[test]
    fn every_kind_round_trips() {
        let t1: TabletId = "t1".parse().unwrap();
        let recs = [
            Record::new(HybridTime(1), Body::Heartbeat),
            Record::new(
                HybridTime(2),
                Body::Write {
                    ops: vec![Op::put("k", "v"), Op::delete(vec![0xff, 0])],
                    trx_id: Some(TrxId::new(7, 3)),
                    gtid: Some(Gtid::new(0, 1, 9)),
                },
            ),
            Record::new(
                HybridTime(3),
                Body::Intent {
                    txn: TxnId::from_u128(5),
                    trx_id: None,
                    ops: vec![Op::put("", "")],
                },
            ),
            Record::new(
                HybridTime(4),
                Body::Commit {
                    txn: TxnId::from_u128(5),
                    participants: vec![t1.clone()],
                    trx_id: Some(TrxId::new(1, 1)),
                    gtid: None,
                },
            ),
            Record::new(
                HybridTime(5),
                Body::Abort {
                    txn: TxnId::from_u128(6),
                    trx_id: None,
                },
            ),
        ];
        for (i, r) in recs.iter().enumerate() {
            let bytes = r.encode(WalPos(i as u64 * 100)).unwrap();
            match parse_record(&bytes, i as u64 * 100) {
                Parsed::Record { record, len } => {
                    assert_eq!(&record, r);
                    assert_eq!(len, bytes.len());
                }
                other => panic!("{other:?}"),
            }
            // Wrong position is refused.
            assert!(matches!(
                parse_record(&bytes, i as u64 * 100 + 1),
                Parsed::Invalid(_)
            ));
        }
    }

    #[test]
    fn oversized_parts_are_refused() {
        let r = Record::new(
            HybridTime(1),
            Body::Write {
                ops: vec![Op::put(vec![0u8; MAX_KEY_LEN + 1], "")],
                trx_id: None,
                gtid: None,
            },
        );
        assert!(matches!(
            r.encoded_body_len(),
            Err(Error::TooLarge { what: "key", .. })
        ));
    }
}
