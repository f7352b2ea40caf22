//! The wire protocol between shipper and applier (docs/ARCHITECTURE.md, "The stream
//! handshake"): message framing, the handshake, data frames of WAL bytes as they are on
//! disk, and acks. I/O-free: encoders return bytes, decoders take bytes and return typed
//! messages or a typed [`WireError`]; arbitrary input never panics them. The byte layouts
//! are drawn in `wal/FORMAT.md`. The records a data frame carries are checked by the log's
//! own walks ([`tidelog_wal::verify`]).
//!
//! Streams of one QUIC connection (ALPN [`ALPN`]):
//!
//! ```text
//! control (first bidi stream, opened by the shipper)
//!   shipper → applier   Hello { shipper_id, lane, tablets: [{tablet, oldest, durable}],
//!                               all_tablets: [tablet] }
//!   applier → shipper   Welcome { tablets: [{tablet, resume | refused}] }
//!   either way          Error { code, message } and then the stream is closed
//! tablet (one bidi stream per accepted tablet, opened by the shipper)
//!   shipper → applier   Open { tablet, from }  then  Data | KeepAlive ...
//!   applier → shipper   Ack { durable } ...    or    Error { code, message }
//! ```

use serde::{Deserialize, Serialize};
use tidelog_wal::format::{RecordHeader, RECORD_HEADER_LEN};
use tidelog_wal::hash::xxh3_64;
use tidelog_wal::ids::{TabletId, MAX_TABLET_ID_LEN};
use tidelog_wal::{HybridTime, WalPos};
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The QUIC/TLS application protocol.
pub const ALPN: &[u8] = b"tidelog/1";
/// First 4 bytes of every message.
pub const MSG_MAGIC: [u8; 4] = *b"TDLW";
/// Wire protocol version this build speaks.
pub const WIRE_VERSION: u8 = 2;
/// Largest message body accepted (a data frame carries at most this many bytes).
pub const MAX_BODY: usize = 64 * 1024 * 1024;
/// Largest JSON (control) body accepted.
pub const MAX_CONTROL_BODY: usize = 4 * 1024 * 1024;

/// Message header: 32 bytes in front of every message.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct MsgHeader {
    pub magic: [u8; 4],
    pub version: u8,
    pub kind: u8,
    pub reserved0: U16,
    pub body_len: U32,
    pub reserved1: U32,
    /// xxh3-64 of the body.
    pub body_checksum: U64,
    /// xxh3-64 of header bytes 0..24.
    pub header_checksum: U64,
}
pub const MSG_HEADER_LEN: usize = 32;
const _: () = assert!(size_of::<MsgHeader>() == MSG_HEADER_LEN);

/// Fixed prefix of a `Data` or `KeepAlive` body: 96 bytes, then (Data) whole records.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct DataHeader {
    /// Position of the first record in the payload (for a keep-alive: the sender's next).
    pub first_pos: U64,
    /// Position just past the last record (= first_pos + payload length).
    pub end_pos: U64,
    /// Tablet safe time at `end_pos`: the ht of the last record shipped so far.
    pub safe_time: U64,
    pub record_count: U32,
    pub tablet_len: U16,
    pub reserved: U16,
    pub tablet: [u8; MAX_TABLET_ID_LEN],
}
pub const DATA_HEADER_LEN: usize = 96;
const _: () = assert!(size_of::<DataHeader>() == DATA_HEADER_LEN);

/// Ack body: 16 bytes.
#[derive(Clone, Copy, Debug, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct AckBody {
    /// Everything below is durable in the applier's received log.
    pub durable_pos: U64,
    /// Tablet safe time of what is durable.
    pub safe_time: U64,
}
pub const ACK_LEN: usize = 16;
const _: () = assert!(size_of::<AckBody>() == ACK_LEN);

/// Message kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, strum::FromRepr)]
#[repr(u8)]
pub enum MsgKind {
    Hello = 1,
    Welcome = 2,
    Open = 3,
    Data = 4,
    KeepAlive = 5,
    Ack = 6,
    Error = 7,
}

impl MsgKind {
    /// The kind numbered `b`, if there is one.
    pub fn from_u8(b: u8) -> Option<MsgKind> {
        MsgKind::from_repr(b)
    }

    fn max_body(self) -> usize {
        match self {
            MsgKind::Data => MAX_BODY,
            MsgKind::KeepAlive => DATA_HEADER_LEN,
            MsgKind::Ack => ACK_LEN,
            _ => MAX_CONTROL_BODY,
        }
    }
}

/// A tablet as announced in `Hello`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HelloTablet {
    pub tablet: TabletId,
    /// Oldest position the source still has.
    pub oldest: WalPos,
    /// The source's durable end.
    pub durable: WalPos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub shipper_id: String,
    pub lane: u32,
    /// The tablets this connection (lane) ships.
    pub tablets: Vec<HelloTablet>,
    /// Every tablet the shipper knows, on any of its lanes. Lanes connect one by one, so
    /// the applier registers all of them at the first `Hello`: a tablet of a lane not yet
    /// connected then holds the safe time instead of being left out of the minimum while
    /// the other lanes' tablets are applied. Empty from shippers that predate it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub all_tablets: Vec<TabletId>,
}

/// The applier's answer for one announced tablet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WelcomeTablet {
    pub tablet: TabletId,
    /// Where to resume: the received log's durable end. `None` when refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<WalPos>,
    /// Why the tablet was refused (claimed by another live shipper, intake paused, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Welcome {
    pub applier_id: String,
    pub tablets: Vec<WelcomeTablet>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Open {
    pub tablet: TabletId,
    pub from: WalPos,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorMsg {
    /// A stable code: `needs_bootstrap`, `claimed`, `corrupt_frame`, `bad_position`,
    /// `paused`, `io`, `protocol`, `shutdown`.
    pub code: String,
    pub message: String,
}

/// A decoded data frame header (the payload travels separately).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataFrame {
    pub tablet: TabletId,
    pub first_pos: WalPos,
    pub end_pos: WalPos,
    pub safe_time: HybridTime,
    pub record_count: u32,
}

/// A decoded message. `Data` carries the offset of its payload in the body it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    Hello(Hello),
    Welcome(Welcome),
    Open(Open),
    Data(DataFrame),
    KeepAlive(DataFrame),
    Ack {
        durable: WalPos,
        safe_time: HybridTime,
    },
    Error(ErrorMsg),
}

/// Everything a peer's bytes can be wrong with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("bad message magic {found:02x?} (expected \"TDLW\")")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported wire version {found} (this build speaks {WIRE_VERSION})")]
    BadVersion { found: u8 },
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    #[error("message header checksum mismatch")]
    HeaderChecksum,
    #[error("{kind:?} body of {len} bytes exceeds the limit {max}")]
    TooLong {
        kind: MsgKind,
        len: usize,
        max: usize,
    },
    #[error("{kind:?} body checksum mismatch")]
    BodyChecksum { kind: MsgKind },
    #[error("message truncated: {need} bytes needed, {have} available")]
    Truncated { need: usize, have: usize },
    #[error("malformed {kind:?} body: {reason}")]
    BadBody { kind: MsgKind, reason: String },
    #[error("unexpected {got:?} message: {expected}")]
    Unexpected {
        got: MsgKind,
        expected: &'static str,
    },
}

fn header_checksum(h: &MsgHeader) -> u64 {
    xxh3_64(&h.as_bytes()[..24])
}

fn make_header(kind: MsgKind, body_len: usize, body_checksum: u64) -> MsgHeader {
    let mut h = MsgHeader {
        magic: MSG_MAGIC,
        version: WIRE_VERSION,
        kind: kind as u8,
        reserved0: U16::new(0),
        body_len: U32::new(body_len as u32),
        reserved1: U32::new(0),
        body_checksum: U64::new(body_checksum),
        header_checksum: U64::new(0),
    };
    h.header_checksum = U64::new(header_checksum(&h));
    h
}

/// Validates a message header; returns the kind and the body length to read next.
pub fn decode_header(bytes: &[u8]) -> Result<(MsgKind, usize, u64), WireError> {
    let h = MsgHeader::read_from_prefix(bytes)
        .map_err(|_| WireError::Truncated {
            need: MSG_HEADER_LEN,
            have: bytes.len(),
        })?
        .0;
    if h.magic != MSG_MAGIC {
        return Err(WireError::BadMagic { found: h.magic });
    }
    if header_checksum(&h) != h.header_checksum.get() {
        return Err(WireError::HeaderChecksum);
    }
    if h.version != WIRE_VERSION {
        return Err(WireError::BadVersion { found: h.version });
    }
    let kind = MsgKind::from_u8(h.kind).ok_or(WireError::UnknownKind(h.kind))?;
    let len = h.body_len.get() as usize;
    if len > kind.max_body() {
        return Err(WireError::TooLong {
            kind,
            len,
            max: kind.max_body(),
        });
    }
    Ok((kind, len, h.body_checksum.get()))
}

fn bad(kind: MsgKind, reason: impl Into<String>) -> WireError {
    WireError::BadBody {
        kind,
        reason: reason.into(),
    }
}

fn decode_data_header(kind: MsgKind, body: &[u8]) -> Result<DataFrame, WireError> {
    let (h, rest) = DataHeader::read_from_prefix(body).map_err(|_| {
        bad(
            kind,
            format!("{} bytes, shorter than the data header", body.len()),
        )
    })?;
    let tl = h.tablet_len.get() as usize;
    let tb = h
        .tablet
        .get(..tl)
        .filter(|_| tl > 0)
        .ok_or_else(|| bad(kind, format!("tablet length {tl}")))?;
    let tablet = std::str::from_utf8(tb)
        .ok()
        .and_then(|s| s.parse::<TabletId>().ok())
        .ok_or_else(|| bad(kind, "tablet id is not valid"))?;
    let (first, end) = (h.first_pos.get(), h.end_pos.get());
    let payload = rest.len() as u64;
    if first.checked_add(payload) != Some(end) {
        return Err(bad(
            kind,
            format!("positions {first}..{end} do not match a payload of {payload} bytes"),
        ));
    }
    if kind == MsgKind::KeepAlive && (payload != 0 || h.record_count.get() != 0) {
        return Err(bad(kind, "a keep-alive carries no records"));
    }
    Ok(DataFrame {
        tablet,
        first_pos: WalPos(first),
        end_pos: WalPos(end),
        safe_time: HybridTime(h.safe_time.get()),
        record_count: h.record_count.get(),
    })
}

fn json<T: serde::de::DeserializeOwned>(kind: MsgKind, body: &[u8]) -> Result<T, WireError> {
    serde_json::from_slice(body).map_err(|e| bad(kind, e.to_string()))
}

/// Decodes a message body (after [`decode_header`]); checks the body checksum. For `Data`
/// the payload is `body[DATA_HEADER_LEN..]`; its records are checked by
/// [`tidelog_wal::verify::verify_records`].
pub fn decode_body(kind: MsgKind, body: &[u8], checksum: u64) -> Result<Message, WireError> {
    let computed = match kind {
        MsgKind::Data | MsgKind::KeepAlive => {
            let dh = body.get(..DATA_HEADER_LEN).ok_or_else(|| {
                bad(
                    kind,
                    format!("{} bytes, shorter than the data header", body.len()),
                )
            })?;
            data_checksum(dh, &body[DATA_HEADER_LEN..])
        }
        _ => xxh3_64(body),
    };
    decode_body_summed(kind, body, checksum, computed)
}

/// [`decode_body`] of a body whose checksum the caller took as it arrived (`computed`:
/// [`DataChecksum`] for Data and KeepAlive, xxh3-64 of the body otherwise).
pub fn decode_body_summed(
    kind: MsgKind,
    body: &[u8],
    checksum: u64,
    computed: u64,
) -> Result<Message, WireError> {
    if computed != checksum {
        return Err(WireError::BodyChecksum { kind });
    }
    Ok(match kind {
        MsgKind::Hello => Message::Hello(json(kind, body)?),
        MsgKind::Welcome => Message::Welcome(json(kind, body)?),
        MsgKind::Open => Message::Open(json(kind, body)?),
        MsgKind::Error => Message::Error(json(kind, body)?),
        MsgKind::Data => Message::Data(decode_data_header(kind, body)?),
        MsgKind::KeepAlive => Message::KeepAlive(decode_data_header(kind, body)?),
        MsgKind::Ack => {
            let a = AckBody::read_from_bytes(body)
                .map_err(|_| bad(kind, format!("{} bytes, expected {ACK_LEN}", body.len())))?;
            Message::Ack {
                durable: WalPos(a.durable_pos.get()),
                safe_time: HybridTime(a.safe_time.get()),
            }
        }
    })
}

/// Decodes one whole message at the start of `bytes`; returns it and the bytes it used.
pub fn decode(bytes: &[u8]) -> Result<(Message, usize), WireError> {
    let (kind, len, sum) = decode_header(bytes)?;
    let total = MSG_HEADER_LEN + len;
    let body = bytes
        .get(MSG_HEADER_LEN..total)
        .ok_or(WireError::Truncated {
            need: total,
            have: bytes.len(),
        })?;
    Ok((decode_body(kind, body, sum)?, total))
}

fn encode_json<T: Serialize>(kind: MsgKind, v: &T) -> Vec<u8> {
    // Serializing these plain structs cannot fail.
    let body = serde_json::to_vec(v).unwrap_or_default();
    let h = make_header(kind, body.len(), xxh3_64(&body));
    let mut out = Vec::with_capacity(MSG_HEADER_LEN + body.len());
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&body);
    out
}

pub fn encode_hello(m: &Hello) -> Vec<u8> {
    encode_json(MsgKind::Hello, m)
}
pub fn encode_welcome(m: &Welcome) -> Vec<u8> {
    encode_json(MsgKind::Welcome, m)
}
pub fn encode_open(m: &Open) -> Vec<u8> {
    encode_json(MsgKind::Open, m)
}
pub fn encode_error(code: &str, message: &str) -> Vec<u8> {
    encode_json(
        MsgKind::Error,
        &ErrorMsg {
            code: code.into(),
            message: message.into(),
        },
    )
}

pub fn encode_ack(durable: WalPos, safe_time: HybridTime) -> Vec<u8> {
    let body = AckBody {
        durable_pos: U64::new(durable.0),
        safe_time: U64::new(safe_time.0),
    };
    let h = make_header(MsgKind::Ack, ACK_LEN, xxh3_64(body.as_bytes()));
    let mut out = Vec::with_capacity(MSG_HEADER_LEN + ACK_LEN);
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(body.as_bytes());
    out
}

/// Header bytes (message header + data header) of a data frame carrying `payload`, which
/// holds whole records from `first_pos`. Send these, then the payload as it is.
pub fn encode_data_head(
    tablet: &TabletId,
    first_pos: WalPos,
    safe_time: HybridTime,
    record_count: u32,
    payload: &[u8],
) -> [u8; MSG_HEADER_LEN + DATA_HEADER_LEN] {
    data_head(
        MsgKind::Data,
        tablet,
        first_pos,
        safe_time,
        record_count,
        payload,
    )
}

/// A keep-alive: no records, the sender is at `pos` with tablet safe time `safe_time`.
pub fn encode_keepalive(
    tablet: &TabletId,
    pos: WalPos,
    safe_time: HybridTime,
) -> [u8; MSG_HEADER_LEN + DATA_HEADER_LEN] {
    data_head(MsgKind::KeepAlive, tablet, pos, safe_time, 0, &[])
}

fn data_head(
    kind: MsgKind,
    tablet: &TabletId,
    first_pos: WalPos,
    safe_time: HybridTime,
    record_count: u32,
    payload: &[u8],
) -> [u8; MSG_HEADER_LEN + DATA_HEADER_LEN] {
    let mut t = [0u8; MAX_TABLET_ID_LEN];
    let tb = tablet.as_str().as_bytes();
    t[..tb.len()].copy_from_slice(tb);
    let dh = DataHeader {
        first_pos: U64::new(first_pos.0),
        end_pos: U64::new(first_pos.0 + payload.len() as u64),
        safe_time: U64::new(safe_time.0),
        record_count: U32::new(record_count),
        tablet_len: U16::new(tb.len() as u16),
        reserved: U16::new(0),
        tablet: t,
    };
    let h = make_header(
        kind,
        DATA_HEADER_LEN + payload.len(),
        data_checksum(dh.as_bytes(), payload),
    );
    let mut out = [0u8; MSG_HEADER_LEN + DATA_HEADER_LEN];
    out[..MSG_HEADER_LEN].copy_from_slice(h.as_bytes());
    out[MSG_HEADER_LEN..].copy_from_slice(dh.as_bytes());
    out
}

/// The body checksum of a Data or KeepAlive message: xxh3-64 over the data header, then the
/// checksum field (8 bytes) of each whole record at the front of the payload, in order,
/// then whatever follows them verbatim (nothing, in a well-formed frame).
///
/// Each record's own checksum covers its bytes, and the receiver checks every record before
/// it writes any of the frame ([`tidelog_wal::verify::verify_records`]): hashing the payload a second time would
/// detect nothing more, and cost both ends a pass over every byte. Walking the headers of a
/// payload that was just read costs a small part of that. Corrupt bytes in a record body
/// pass this sum and fail the record's; corrupt headers or record sums fail this one.
pub fn data_checksum(data_header: &[u8], payload: &[u8]) -> u64 {
    DataChecksum::new(data_header).finish(payload)
}

/// [`data_checksum`] taken as the payload arrives: [`DataChecksum::advance`] after each
/// piece takes the sums of the record headers now in, while they are still in the cache
/// (a receiver that walked them once the whole frame was in found many evicted by the other
/// streams' data meanwhile).
pub struct DataChecksum {
    hasher: tidelog_wal::hash::Xxh3,
    /// Record sums not yet handed to the hasher, 8 bytes each.
    sums: [u8; 2048],
    n: usize,
    /// Payload offset of the next record header.
    off: usize,
    /// Still finding whole records (not yet at the tail).
    walking: bool,
}

impl std::fmt::Debug for DataChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DataChecksum")
            .field("off", &self.off)
            .field("walking", &self.walking)
            .finish_non_exhaustive()
    }
}

impl DataChecksum {
    pub fn new(data_header: &[u8]) -> DataChecksum {
        let mut hasher = tidelog_wal::hash::Xxh3::new();
        hasher.update(data_header);
        DataChecksum {
            hasher,
            sums: [0u8; 2048],
            n: 0,
            off: 0,
            walking: true,
        }
    }

    /// Takes the sums of the records whose headers are in `payload`, the payload received
    /// so far (a prefix of the whole one, of `total` bytes).
    pub fn advance(&mut self, payload: &[u8], total: usize) {
        while self.walking {
            let Some(Ok((h, _))) = payload.get(self.off..).map(RecordHeader::read_from_prefix)
            else {
                // Not in yet; or never, when the rest cannot hold a header.
                if total.saturating_sub(self.off) < RECORD_HEADER_LEN {
                    self.walking = false;
                }
                return;
            };
            let rec = RECORD_HEADER_LEN.saturating_add(h.len.get() as usize);
            if rec > total - self.off {
                self.walking = false;
                return;
            }
            if self.n == self.sums.len() {
                self.hasher.update(&self.sums);
                self.n = 0;
            }
            self.sums[self.n..self.n + 8].copy_from_slice(h.checksum.as_bytes());
            self.n += 8;
            self.off += rec;
        }
    }

    /// The checksum, once the whole `payload` is in.
    pub fn finish(mut self, payload: &[u8]) -> u64 {
        self.advance(payload, payload.len());
        self.hasher.update(&self.sums[..self.n]);
        self.hasher
            .update(payload.get(self.off..).unwrap_or_default());
        self.hasher.digest()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidelog_wal::verify::verify_records;
    use tidelog_wal::{Body, Op, Record};

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
    fn control_messages_round_trip() {
        let hello = Hello {
            shipper_id: "src-1".into(),
            lane: 1,
            tablets: vec![HelloTablet {
                tablet: t("t1"),
                oldest: WalPos(0),
                durable: WalPos(4096),
            }],
            all_tablets: vec![t("t1"), t("t2")],
        };
        let welcome = Welcome {
            applier_id: "dr".into(),
            tablets: vec![
                WelcomeTablet {
                    tablet: t("t1"),
                    resume: Some(WalPos(10)),
                    refused: None,
                },
                WelcomeTablet {
                    tablet: t("t2"),
                    resume: None,
                    refused: Some("claimed".into()),
                },
            ],
        };
        let open = Open {
            tablet: t("t1"),
            from: WalPos(77),
        };
        let cases = [
            (encode_hello(&hello), Message::Hello(hello)),
            (encode_welcome(&welcome), Message::Welcome(welcome)),
            (encode_open(&open), Message::Open(open)),
            (
                encode_ack(WalPos(99), HybridTime(5)),
                Message::Ack {
                    durable: WalPos(99),
                    safe_time: HybridTime(5),
                },
            ),
            (
                encode_error("claimed", "x"),
                Message::Error(ErrorMsg {
                    code: "claimed".into(),
                    message: "x".into(),
                }),
            ),
        ];
        for (bytes, want) in cases {
            let (got, used) = decode(&bytes).unwrap();
            assert_eq!(got, want);
            assert_eq!(used, bytes.len());
        }
    }

    #[test]
    fn data_frame_round_trips_and_records_verify() {
        let first = WalPos(4096);
        let payload = records(first, 5);
        let head = encode_data_head(&t("t7"), first, HybridTime(104), 5, &payload);
        let mut msg = head.to_vec();
        msg.extend_from_slice(&payload);
        let (m, used) = decode(&msg).unwrap();
        assert_eq!(used, msg.len());
        let Message::Data(f) = m else { panic!() };
        assert_eq!(f.first_pos, first);
        assert_eq!(f.end_pos, first.add(payload.len() as u64));
        let s = verify_records(&f.tablet, &payload, f.first_pos, None).unwrap();
        assert_eq!(s.count, 5);
        assert_eq!(s.last_ht, Some(HybridTime(104)));
        // At the wrong position the records are refused.
        assert!(verify_records(&f.tablet, &payload, WalPos(0), None).is_err());
        // Not above the previous ht: refused.
        assert!(verify_records(&f.tablet, &payload, first, Some(HybridTime(100))).is_err());
        // Every single bit flip in the message is caught by the checksums: the header's,
        // the body's (data header, record headers and record sums) or a record's (its body).
        let body_at = MSG_HEADER_LEN + DATA_HEADER_LEN;
        let mut by_record_sum_only = 0;
        for byte in 0..msg.len() {
            for bit in 0..8 {
                let mut m = msg.clone();
                m[byte] ^= 1 << bit;
                match decode(&m) {
                    Err(_) => {}
                    Ok((Message::Data(f), _)) => {
                        assert!(
                            verify_records(&f.tablet, &m[body_at..], f.first_pos, None).is_err(),
                            "flip {byte}.{bit} not detected"
                        );
                        by_record_sum_only += 1;
                    }
                    Ok(other) => panic!("flip {byte}.{bit} decoded as {other:?}"),
                }
            }
        }
        // Left to the record sums: every record byte but its sum and its length (which the
        // frame's sum covers, the length through the walk that finds the next record).
        let covered_by_records = payload.len() - 5 * (8 + 4);
        assert_eq!(by_record_sum_only, covered_by_records * 8);
    }

    /// The body checksum of a data frame: the data header, each whole record's sum, and any
    /// bytes after the last whole record, so that a frame of whole records is summed without
    /// hashing the records a second time, and any byte string still gets a sum.
    #[test]
    fn data_checksum_covers_the_record_sums_and_any_tail() {
        let payload = records(WalPos(0), 3);
        let dh = [7u8; DATA_HEADER_LEN];
        let base = data_checksum(&dh, &payload);
        let mut input = dh.to_vec();
        let mut off = 0;
        while off < payload.len() {
            let (h, _) = RecordHeader::read_from_prefix(&payload[off..]).unwrap();
            input.extend_from_slice(h.checksum.as_bytes());
            off += RECORD_HEADER_LEN + h.len.get() as usize;
        }
        assert_eq!(base, xxh3_64(&input));
        let mut dh2 = dh;
        dh2[5] ^= 1;
        assert_ne!(data_checksum(&dh2, &payload), base);
        // A cut record: the tail after the whole ones is hashed as it is.
        let cut = &payload[..payload.len() - 3];
        let mut whole = 0;
        let mut sums = dh.to_vec();
        while let Ok((h, _)) = RecordHeader::read_from_prefix(&cut[whole..]) {
            let total = RECORD_HEADER_LEN + h.len.get() as usize;
            if whole + total > cut.len() {
                break;
            }
            sums.extend_from_slice(h.checksum.as_bytes());
            whole += total;
        }
        assert!(whole < cut.len());
        sums.extend_from_slice(&cut[whole..]);
        assert_eq!(data_checksum(&dh, cut), xxh3_64(&sums));
        // A flipped byte anywhere in a tail changes the sum.
        let mut bad = cut.to_vec();
        *bad.last_mut().unwrap() ^= 1;
        assert_ne!(data_checksum(&dh, &bad), data_checksum(&dh, cut));
        // A changed record sum changes it; a changed record body does not.
        let mut m = payload.clone();
        m[0] ^= 1;
        assert_ne!(data_checksum(&dh, &m), base);
        let mut m = payload.clone();
        m[RECORD_HEADER_LEN + 1] ^= 1;
        assert_eq!(data_checksum(&dh, &m), base);
    }

    mod props {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
                let _ = decode(&bytes);
            }

            #[test]
            fn mutated_frames_are_refused_or_identical(
                n in 1usize..6,
                idx in any::<prop::sample::Index>(),
                val in any::<u8>(),
                cut in any::<prop::sample::Index>(),
            ) {
                let payload = records(WalPos(0), n);
                let head = encode_data_head(&t("m"), WalPos(0), HybridTime(1), n as u32, &payload);
                let mut msg = head.to_vec();
                msg.extend_from_slice(&payload);
                let orig = msg.clone();
                let i = idx.index(msg.len());
                msg[i] = val;
                match decode(&msg) {
                    Ok((Message::Data(f), _)) => {
                        // Only an unchanged byte leaves the frame and its records valid (a
                        // changed record body passes the frame's sum, not the record's).
                        let records_ok = verify_records(&f.tablet, &msg[MSG_HEADER_LEN + DATA_HEADER_LEN..], f.first_pos, None).is_ok();
                        prop_assert_eq!(records_ok, msg == orig);
                    }
                    Ok(_) => prop_assert!(false, "decoded as another kind"),
                    Err(_) => prop_assert!(msg != orig),
                }
                let c = cut.index(orig.len());
                prop_assert!(decode(&orig[..c]).is_err());
            }

            /// Taken piece by piece as a frame arrives, the data checksum is the one taken
            /// over the whole payload, for any split and any bytes (whole records, damaged,
            /// cut, or garbage).
            #[test]
            fn data_checksum_in_pieces_is_the_same(
                n in 0usize..6,
                flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..3),
                cut in any::<prop::sample::Index>(),
                garbage in proptest::collection::vec(any::<u8>(), 0..100),
                splits in proptest::collection::vec(any::<prop::sample::Index>(), 0..8),
            ) {
                let mut payload = records(WalPos(0), n);
                for (i, v) in &flips {
                    if !payload.is_empty() {
                        let at = i.index(payload.len());
                        payload[at] = *v;
                    }
                }
                payload.truncate(cut.index(payload.len() + 1));
                payload.extend_from_slice(&garbage);
                let dh = [3u8; DATA_HEADER_LEN];
                let want = data_checksum(&dh, &payload);
                let mut ends: Vec<usize> = splits.iter().map(|s| s.index(payload.len() + 1)).collect();
                ends.sort_unstable();
                let mut c = DataChecksum::new(&dh);
                for e in ends {
                    c.advance(&payload[..e], payload.len());
                }
                prop_assert_eq!(c.finish(&payload), want);
            }
        }
    }
}
