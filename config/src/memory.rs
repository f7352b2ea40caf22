//! The bound on the applier's resident memory that a configuration implies
//! (`applier/STORE.md`, "Memory"): what the admin API reports as `bound_bytes` and what
//! `tidelog-bench e2e --soak` holds the applier to.

use crate::ApplierConfig;

/// What bounds the applier's resident memory, part by part, for a configuration and a
/// number of tablets (`applier/STORE.md`, "Memory", explains each part; `tidelog-bench e2e
/// --soak` checks the applier stays below it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ApplierBound {
    /// (what, bytes)
    pub parts: Vec<(String, u64)>,
}

/// The process without its data: code, the runtime and its threads, TLS and QUIC state,
/// the admin API, the allocator's own structures (15 MiB measured at start).
pub const APPLIER_BASE: u64 = 64 << 20;

/// The store's memtables and the pinned filter and index blocks of its level-0 tables, per
/// byte of `write-buffer-size`, in tenths: the memtables within the bound, one flushed
/// memtable (at most half of it) until fjall's next version clean-up, the heap 1.3 times
/// fjall's count (skip-list nodes, key and value copies; heap profile in `BENCHMARKS.md`),
/// and level-0 filters and indexes (a few MiB).
pub const MEMTABLE_TENTHS: u64 = 25;

/// Per tablet besides its frames in flight: the transactions its last batch left waiting on
/// other tablets (up to a batch of 10 000 records' worth, ~2 KiB each), its received-log
/// readers' buffers (up to 5 MiB), its intake thread.
pub const APPLIER_PER_TABLET: u64 = 16 << 20;

impl ApplierBound {
    pub fn of(cfg: &ApplierConfig, tablets: usize) -> ApplierBound {
        let tablets = tablets as u64;
        ApplierBound {
            parts: vec![
                (
                    "process (code, runtime, threads, QUIC, admin API)".into(),
                    APPLIER_BASE,
                ),
                ("block cache: cache-size".into(), cfg.cache_size),
                (
                    "memtables, level-0 filters: 2.5 x write-buffer-size".into(),
                    cfg.write_buffer_size * MEMTABLE_TENTHS / 10,
                ),
                (
                    format!("{tablets} tablets x (quic.stream-receive-window + 16 MiB)"),
                    tablets * (cfg.quic.stream_receive_window + APPLIER_PER_TABLET),
                ),
            ],
        }
    }

    /// The bound, in bytes.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|(_, b)| b).sum()
    }
}

#[cfg(test)]
mod tests {
    /// The figure README.md and applier/STORE.md quote for the defaults with 8 tablets, and
    /// each configured size counted once.
    #[test]
    fn the_bound_at_the_defaults_is_the_documented_one() {
        let mut cfg = crate::ApplierConfig::default();
        let b = super::ApplierBound::of(&cfg, 8);
        assert_eq!(b.total(), 736 << 20, "{b:?}");
        cfg.cache_size += 1 << 20;
        cfg.write_buffer_size += 2 << 20;
        cfg.quic.stream_receive_window += 1 << 20;
        let b2 = super::ApplierBound::of(&cfg, 9);
        assert_eq!(
            b2.total() - b.total(),
            (1 + 5 + 8 + 16 + 16 + 1) << 20,
            "{b2:?}"
        );
    }
}
