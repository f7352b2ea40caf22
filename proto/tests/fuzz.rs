//! Fuzz-style property tests of the wire codec: every message (Hello, Welcome, Open, Error,
//! Ack, Data, KeepAlive), the message and data headers, and the data checksum taken as a
//! frame arrives. The records a data frame carries go through the log's own walks, fuzzed by
//! `wal/tests/fuzz.rs`.
//!
//! Each decoder never panics on arbitrary bytes and answers a clear error; what it accepts
//! re-encodes to the bytes it was given, so a mutated encoding either decodes to the value
//! it encoded or is refused (changed bytes never pass a checksum); and
//! `decode(encode(x)) == x` for arbitrary `x`.
//!
//! CI runs the short form (`cargo test -p tidelog-proto --test fuzz`); the long form runs
//! 100 000 cases of each property:
//!
//! ```text
//! cargo test --release -p tidelog-proto --test fuzz -- --ignored --nocapture
//! ```
//!
//! `FUZZ_CASES=N` sets the case count of either form and `FUZZ_SEED=S` replays a run: each
//! property prints its seed and time.
#![allow(clippy::unwrap_used)]

#[path = "../../wal/tests/common/fuzzkit.rs"]
mod fuzzkit;

use fuzzkit::*;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::TestCaseError;
use tidelog_proto::wire::{self, Message, MsgHeader, MsgKind, WireError};
use tidelog_wal::verify::verify_records;
use tidelog_wal::{hash, HybridTime, WalPos};
use zerocopy::IntoBytes;

fuzz_tests! {
    wire_arbitrary_bytes: 1000;
    wire_sealed_arbitrary_bodies: 500;
    wire_round_trip: 300;
    wire_mutated_messages: 500;
    wire_data_checksum_in_pieces: 300;
}

// ---- wire ----------------------------------------------------------------------------------

/// The bytes of `m` as its encoder writes them (`payload`: a data frame's records).
fn encode_msg(m: &Message, payload: &[u8]) -> Vec<u8> {
    match m {
        Message::Hello(h) => wire::encode_hello(h),
        Message::Welcome(w) => wire::encode_welcome(w),
        Message::Open(o) => wire::encode_open(o),
        Message::Error(e) => wire::encode_error(&e.code, &e.message),
        Message::Ack { durable, safe_time } => wire::encode_ack(*durable, *safe_time),
        Message::Data(f) => {
            let mut out = wire::encode_data_head(
                &f.tablet,
                f.first_pos,
                f.safe_time,
                f.record_count,
                payload,
            )
            .to_vec();
            out.extend_from_slice(payload);
            out
        }
        Message::KeepAlive(f) => {
            wire::encode_keepalive(&f.tablet, f.first_pos, f.safe_time).to_vec()
        }
    }
}

/// A message header with correct checksums in front of `body`, for kind byte `kind`.
fn seal(kind: u8, body: &[u8]) -> Vec<u8> {
    use zerocopy::little_endian::{U16, U32, U64};
    let body_checksum = if matches!(kind, 4 | 5) && body.len() >= wire::DATA_HEADER_LEN {
        let (dh, payload) = body.split_at(wire::DATA_HEADER_LEN);
        wire::data_checksum(dh, payload)
    } else {
        hash::xxh3_64(body)
    };
    let mut h = MsgHeader {
        magic: wire::MSG_MAGIC,
        version: wire::WIRE_VERSION,
        kind,
        reserved0: U16::new(0),
        body_len: U32::new(body.len() as u32),
        reserved1: U32::new(0),
        body_checksum: U64::new(body_checksum),
        header_checksum: U64::new(0),
    };
    h.header_checksum = U64::new(hash::xxh3_64(&h.as_bytes()[..24]));
    let mut out = h.as_bytes().to_vec();
    out.extend_from_slice(body);
    out
}

fn short_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9_.:-]{0,12}",
        any::<String>().prop_map(|s| s.chars().take(24).collect()),
    ]
}

fn wal_pos() -> impl Strategy<Value = WalPos> {
    prop_oneof![any::<u64>(), 0u64..1 << 20].prop_map(WalPos)
}

/// A data frame: its message and payload (whole records from its first position).
fn data_frame() -> impl Strategy<Value = (Message, Vec<u8>)> {
    (
        tablet_id(),
        0u64..u64::MAX / 2,
        any::<u64>(),
        prop::collection::vec(body(), 0..5),
    )
        .prop_map(|(tablet, first, ht, bodies)| {
            let (recs, payload) = place(first, ht / 2, bodies);
            let f = wire::DataFrame {
                tablet,
                first_pos: WalPos(first),
                end_pos: WalPos(first + payload.len() as u64),
                safe_time: recs.last().map_or(HybridTime(ht), |r| r.ht),
                record_count: recs.len() as u32,
            };
            (Message::Data(f), payload)
        })
}

/// Any message, with the payload of a data frame.
fn message() -> impl Strategy<Value = (Message, Vec<u8>)> {
    let hello_tablet = (tablet_id(), wal_pos(), wal_pos()).prop_map(|(tablet, oldest, durable)| {
        wire::HelloTablet {
            tablet,
            oldest,
            durable,
        }
    });
    let hello = (
        short_text(),
        any::<u32>(),
        prop::collection::vec(hello_tablet, 0..4),
        prop::collection::vec(tablet_id(), 0..4),
    )
        .prop_map(|(shipper_id, lane, tablets, all_tablets)| {
            Message::Hello(wire::Hello {
                shipper_id,
                lane,
                tablets,
                all_tablets,
            })
        });
    let welcome_tablet = (
        tablet_id(),
        prop::option::of(wal_pos()),
        prop::option::of(short_text()),
    )
        .prop_map(|(tablet, resume, refused)| wire::WelcomeTablet {
            tablet,
            resume,
            refused,
        });
    let welcome = (short_text(), prop::collection::vec(welcome_tablet, 0..4)).prop_map(
        |(applier_id, tablets)| {
            Message::Welcome(wire::Welcome {
                applier_id,
                tablets,
            })
        },
    );
    let open = (tablet_id(), wal_pos())
        .prop_map(|(tablet, from)| Message::Open(wire::Open { tablet, from }));
    let error = (short_text(), short_text())
        .prop_map(|(code, message)| Message::Error(wire::ErrorMsg { code, message }));
    let ack = (wal_pos(), any::<u64>()).prop_map(|(durable, ht)| Message::Ack {
        durable,
        safe_time: HybridTime(ht),
    });
    let keepalive = (tablet_id(), wal_pos(), any::<u64>()).prop_map(|(tablet, pos, ht)| {
        Message::KeepAlive(wire::DataFrame {
            tablet,
            first_pos: pos,
            end_pos: pos,
            safe_time: HybridTime(ht),
            record_count: 0,
        })
    });
    prop_oneof![
        1 => hello.prop_map(|m| (m, Vec::new())),
        1 => welcome.prop_map(|m| (m, Vec::new())),
        1 => open.prop_map(|m| (m, Vec::new())),
        1 => error.prop_map(|m| (m, Vec::new())),
        1 => ack.prop_map(|m| (m, Vec::new())),
        1 => keepalive.prop_map(|m| (m, Vec::new())),
        2 => data_frame(),
    ]
}

/// Arbitrary bytes, many of them starting like a message.
fn wire_arbitrary_bytes(cases: u32) {
    let bytes = prop_oneof![
        prop::collection::vec(any::<u8>(), 0..300),
        (any::<u8>(), prop::collection::vec(any::<u8>(), 0..300)).prop_map(|(kind, rest)| {
            let mut b = wire::MSG_MAGIC.to_vec();
            b.extend([wire::WIRE_VERSION, kind]);
            b.extend(rest);
            b
        }),
    ];
    check("wire_arbitrary_bytes", cases, bytes, |b| {
        match wire::decode(&b) {
            // Only a checksum collision gets through.
            Ok((m, _)) => prop_assert!(false, "random bytes decoded as {m:?}"),
            Err(e) => {
                message_text(&e)?;
                if b.len() < wire::MSG_HEADER_LEN {
                    prop_assert_eq!(
                        e,
                        WireError::Truncated {
                            need: wire::MSG_HEADER_LEN,
                            have: b.len()
                        }
                    );
                } else if b[..4] != wire::MSG_MAGIC {
                    prop_assert!(matches!(e, WireError::BadMagic { .. }), "{e}");
                }
            }
        }
        Ok(())
    });
}

/// Bodies of every kind (arbitrary, or a valid body mutated) behind a header whose
/// checksums are right, so that the body decoders see them: whatever decodes re-encodes to
/// a message that decodes the same.
fn wire_sealed_arbitrary_bodies(cases: u32) {
    let valid = message().prop_map(|(m, payload)| {
        let b = encode_msg(&m, &payload);
        b[wire::MSG_HEADER_LEN..].to_vec()
    });
    let input = (
        prop_oneof![0u8..9, any::<u8>()],
        random_or_mutated(valid, 400),
    );
    check(
        "wire_sealed_arbitrary_bodies",
        cases,
        input,
        |(kind, (_, body))| {
            let msg = seal(kind, &body);
            match wire::decode(&msg) {
                Ok((m, used)) => {
                    prop_assert_eq!(used, msg.len());
                    let payload = match &m {
                        Message::Data(_) => &body[wire::DATA_HEADER_LEN..],
                        _ => &[][..],
                    };
                    let again = encode_msg(&m, payload);
                    let (m2, used2) = wire::decode(&again).map_err(|e| {
                        TestCaseError::fail(format!("{m:?} re-encoded does not decode: {e}"))
                    })?;
                    prop_assert_eq!(&m2, &m);
                    prop_assert_eq!(used2, again.len());
                    if matches!(m, Message::Ack { .. }) {
                        prop_assert_eq!(again, msg);
                    }
                }
                Err(e) => {
                    message_text(&e)?;
                    match MsgKind::from_u8(kind) {
                        None => prop_assert_eq!(e, WireError::UnknownKind(kind)),
                        Some(k) => prop_assert!(
                            matches!(e, WireError::BadBody { kind, .. } | WireError::TooLong { kind, .. } if kind == k),
                            "{e}"
                        ),
                    }
                }
            }
            Ok(())
        },
    );
}

/// Every message decodes from its encoding to itself, using all of it; a data frame's
/// payload verifies as its records.
fn wire_round_trip(cases: u32) {
    check("wire_round_trip", cases, message(), |(m, payload)| {
        let b = encode_msg(&m, &payload);
        let (got, used) = wire::decode(&b).map_err(|e| TestCaseError::fail(e.to_string()))?;
        prop_assert_eq!(&got, &m);
        prop_assert_eq!(used, b.len());
        // A stream of two: the first ends where the second begins.
        let mut two = b.clone();
        two.extend_from_slice(&b);
        prop_assert_eq!(wire::decode(&two).map(|(_, n)| n), Ok(b.len()));
        if let Message::Data(f) = &m {
            let s = verify_records(&f.tablet, &payload, f.first_pos, None)
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(s.count, f.record_count);
        }
        Ok(())
    });
}

/// A mutated message is refused, or is exactly the original: for a data frame, whose sum
/// leaves record bodies to the records' own sums, the records then fail to verify.
fn wire_mutated_messages(cases: u32) {
    check(
        "wire_mutated_messages",
        cases,
        (message(), mutations()),
        |((m, payload), ms)| {
            let orig = encode_msg(&m, &payload);
            let b = mutate(&orig, &ms);
            match wire::decode(&b) {
                Ok((got, used)) => {
                    let records_ok = match &got {
                        Message::Data(f) => verify_records(
                            &f.tablet,
                            &b[wire::MSG_HEADER_LEN + wire::DATA_HEADER_LEN..used],
                            f.first_pos,
                            None,
                        )
                        .is_ok(),
                        _ => true,
                    };
                    prop_assert_eq!(
                        b[..used] == orig[..],
                        records_ok,
                        "{:?} decoded from changed bytes",
                        got
                    );
                    if records_ok {
                        prop_assert_eq!(&got, &m);
                    }
                }
                Err(e) => {
                    message_text(&e)?;
                    prop_assert!(b != orig, "the valid message was refused: {e}");
                }
            }
            Ok(())
        },
    );
}

/// A data frame's checksum taken as its pieces arrive is the one taken over the whole
/// payload, for any data header, any payload and any split.
fn wire_data_checksum_in_pieces(cases: u32) {
    let valid = prop::collection::vec(body(), 0..5).prop_map(|b| place(0, 1, b).1);
    let input = (
        prop::collection::vec(any::<u8>(), wire::DATA_HEADER_LEN),
        random_or_mutated(valid, 600),
        prop::collection::vec(any::<Index>(), 0..8),
    );
    check(
        "wire_data_checksum_in_pieces",
        cases,
        input,
        |(dh, (_, payload), splits)| {
            let want = wire::data_checksum(&dh, &payload);
            let mut ends: Vec<usize> = splits.iter().map(|s| s.index(payload.len() + 1)).collect();
            ends.sort_unstable();
            let mut c = wire::DataChecksum::new(&dh);
            for e in ends {
                c.advance(&payload[..e], payload.len());
            }
            prop_assert_eq!(c.finish(&payload), want);
            Ok(())
        },
    );
}
