//! Staging records already encoded: another log's bytes of the same tablet, verbatim.

use super::Writer;
use crate::error::{Error, Result};
use crate::format::{RECORD_HEADER_LEN, SEGMENT_HEADER_LEN};
use crate::time::HybridTime;

impl Writer {
    /// Stages already-encoded records verbatim — the bytes of another log of the same
    /// tablet, as a shipper sends them. `bytes` must be whole records at consecutive
    /// positions starting at [`Writer::staged_pos`], with ht above the last staged record.
    /// Everything is checked (header, position, checksum, ht order, size) before anything
    /// is written; on refusal nothing is staged. Records never span segments: a record that
    /// does not fit in the active segment starts the next one at the same logical position.
    /// Returns the number of records and the last ht. On an I/O error (rotation) part of the
    /// records may be staged: `rollback` drops them.
    pub fn append_encoded(&mut self, bytes: &[u8]) -> Result<(u32, Option<HybridTime>)> {
        let start = self.staged_pos();
        let sum = crate::verify::verify_records(&self.tablet, bytes, start, self.staged_ht)
            .map_err(|e| Error::InvalidRecord(e.to_string()))?;
        let max = self.opts.segment_size as usize - SEGMENT_HEADER_LEN;
        let mut off = 0usize;
        while off < bytes.len() {
            let room = self.active.capacity - self.off;
            // Checked whole records above: when the rest fits, no need to walk the headers
            // again (the common case, a frame well inside a segment).
            let n = if bytes.len() - off <= room {
                bytes.len() - off
            } else {
                crate::verify::whole_records_prefix(&bytes[off..], room).0
            };
            if n == 0 {
                use zerocopy::FromBytes;
                let first = crate::format::RecordHeader::read_from_prefix(&bytes[off..])
                    .map_or(usize::MAX, |(h, _)| {
                        RECORD_HEADER_LEN + h.len.get() as usize
                    });
                if first > max || self.off == 0 {
                    return Err(Error::TooLarge {
                        tablet: Some(self.tablet.clone()),
                        what: "record (for this segment size)",
                        len: first,
                        max,
                    });
                }
                self.rotate()?;
                continue;
            }
            // Through the file: verbatim bytes are large runs (a shipper's frames), where
            // faulting the mapping in and write-protecting it for writeback cost more than
            // the copy (BENCHMARKS.md, changelog).
            match self.direct.as_mut() {
                Some(stage) => stage.push(&bytes[off..off + n])?,
                None => self.active.write_at(self.off, &bytes[off..off + n])?,
            }
            self.off += n;
            debug_assert!(self
                .direct
                .as_ref()
                .is_none_or(|s| s.end() == (SEGMENT_HEADER_LEN + self.off) as u64));
            off += n;
        }
        if sum.last_ht.is_some() {
            self.staged_ht = sum.last_ht;
        }
        Ok((sum.count, sum.last_ht))
    }
}
