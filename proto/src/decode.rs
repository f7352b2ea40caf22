//! Whole messages out of a stream's bytes, as they arrive in pieces of any size.

use crate::wire::{self, Message, MsgKind, WireError, DATA_HEADER_LEN, MSG_HEADER_LEN};

/// Collects the bytes a stream delivers and hands out each whole message once it is in.
///
/// The header is checked as soon as its 32 bytes are in (magic, checksum, version, kind and
/// the kind's length limit), so a peer cannot make it hold more than one message of the
/// largest allowed size.
#[derive(Debug, Default)]
pub struct Decoder {
    buf: Vec<u8>,
    /// Bytes of `buf` already handed out (dropped at the next [`Decoder::feed`]).
    used: usize,
}

impl Decoder {
    pub fn new() -> Decoder {
        Decoder::default()
    }

    /// Takes the next bytes of the stream.
    pub fn feed(&mut self, bytes: &[u8]) {
        if self.used > 0 {
            self.buf.drain(..self.used);
            self.used = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole message and, for `Data`, its payload; `None` until one is in. An
    /// error is final: the stream's bytes can no longer be framed.
    pub fn next_message(&mut self) -> Result<Option<(Message, Vec<u8>)>, WireError> {
        let rest = &self.buf[self.used..];
        if rest.len() < MSG_HEADER_LEN {
            return Ok(None);
        }
        let (kind, len, sum) = wire::decode_header(rest)?;
        let Some(body) = rest.get(MSG_HEADER_LEN..MSG_HEADER_LEN + len) else {
            return Ok(None);
        };
        let msg = wire::decode_body(kind, body, sum)?;
        let payload = match kind {
            MsgKind::Data => body[DATA_HEADER_LEN..].to_vec(),
            _ => Vec::new(),
        };
        self.used += MSG_HEADER_LEN + len;
        Ok(Some((msg, payload)))
    }

    /// Bytes received and not yet handed out as a message: a stream that ends with some
    /// ended inside a message.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.used
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tidelog_wal::{HybridTime, WalPos};

    /// Messages cut into pieces of every size come out whole, in order, each once.
    #[test]
    fn messages_in_pieces_of_any_size_come_out_whole() {
        let t: tidelog_wal::TabletId = "d1".parse().unwrap_or_else(|_| unreachable!());
        let mut stream = Vec::new();
        stream.extend(wire::encode_ack(WalPos(7), HybridTime(9)));
        stream.extend(wire::encode_keepalive(&t, WalPos(7), HybridTime(9)));
        stream.extend(wire::encode_error("protocol", "x"));
        let want = [
            Message::Ack {
                durable: WalPos(7),
                safe_time: HybridTime(9),
            },
            Message::KeepAlive(wire::DataFrame {
                tablet: t.clone(),
                first_pos: WalPos(7),
                end_pos: WalPos(7),
                safe_time: HybridTime(9),
                record_count: 0,
            }),
            Message::Error(wire::ErrorMsg {
                code: "protocol".into(),
                message: "x".into(),
            }),
        ];
        for piece in [1, 2, 7, 31, 32, 33, 100, stream.len()] {
            let mut d = Decoder::new();
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                d.feed(chunk);
                while let Some((m, _)) = d.next_message().unwrap_or_else(|e| panic!("{e}")) {
                    got.push(m);
                }
            }
            assert_eq!(got, want, "pieces of {piece}");
            assert_eq!(d.pending(), 0);
        }
    }

    /// A damaged header is refused as soon as it is in, before its body.
    #[test]
    fn a_bad_header_is_refused_before_its_body() {
        let mut bytes = wire::encode_error("protocol", "a message of some length");
        bytes[0] ^= 1;
        let mut d = Decoder::new();
        d.feed(&bytes[..MSG_HEADER_LEN]);
        assert!(matches!(d.next_message(), Err(WireError::BadMagic { .. })));
        let mut d = Decoder::new();
        d.feed(&bytes[..MSG_HEADER_LEN - 1]);
        assert!(matches!(d.next_message(), Ok(None)));
        assert_eq!(d.pending(), MSG_HEADER_LEN - 1);
    }
}
