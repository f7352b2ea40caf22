//! Process-wide memory settings.

// mimalloc (the global allocator of `tidelog` and `tidelog-bench`) — its option interface,
// by its C enum; linked in through the `mimalloc` crate, also where it is not the allocator.
use mimalloc as _;

/// Both settings below, as the daemons and the bench start: freed memory kept, then
/// transparent huge pages off (its error returned for the caller to log; the process goes
/// on without it).
pub fn set_up() -> std::io::Result<()> {
    keep_freed_memory();
    disable_transparent_huge_pages()
}

/// Turns transparent huge pages off for this process and the processes it starts
/// (`prctl(PR_SET_THP_DISABLE)`, inherited across fork and exec).
///
/// mimalloc advises its arenas for huge pages and returns freed memory to the kernel after a
/// delay; the next allocation there faults in a whole 2 MiB page and zeroes it. The apply
/// workers allocate per batch (maps of transactions, record vectors), so under load they spent
/// 40 % of their time in that zeroing, in bursts that held the store lock for 0.1–0.4 s: the
/// safe time stalled for 0.3–1 s every few seconds (`BENCHMARKS.md`). With 4 KiB pages only
/// the touched pages are zeroed.
pub fn disable_transparent_huge_pages() -> std::io::Result<()> {
    // SAFETY: PR_SET_THP_DISABLE takes an integer flag and no pointers.
    let r = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (the 16th option): how long freed
/// memory stays before it goes back to the kernel (ms; −1: never; default 1000).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// Keeps memory the process freed for its own next allocations instead of returning it to
/// the kernel after a second unused (mimalloc's purge). The applier's allocations churn at the write
/// rate — memtables filled and flushed, per-batch record and transaction state — so purged
/// memory came straight back as fresh pages, each faulted in and zeroed again: on this
/// project's VM (whose freed memory the host reclaims) a third of the applier's samples at
/// the maximum rate were in that zeroing (`BENCHMARKS.md`). The cost is that the resident
/// size stays at its peak.
pub fn keep_freed_memory() {
    // SAFETY: plain integer arguments; mimalloc's option table is process-global and
    // read atomically.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
}

/// mimalloc's purge delay as it is now (see [`keep_freed_memory`]).
pub fn purge_delay() -> std::ffi::c_long {
    // SAFETY: as above.
    unsafe { mi_option_get(MI_OPTION_PURGE_DELAY) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_flag_is_set_and_reads_back() {
        super::disable_transparent_huge_pages().unwrap();
        // SAFETY: PR_GET_THP_DISABLE takes no arguments.
        let r = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(r, 1);
    }

    #[test]
    fn freed_memory_is_kept() {
        // The option at this index has the purge delay's documented default (tests run
        // without MIMALLOC_PURGE_DELAY in the environment), then the value set.
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            assert_eq!(super::purge_delay(), 1000, "not mimalloc's purge delay");
        }
        super::keep_freed_memory();
        assert_eq!(super::purge_delay(), -1);
    }
}
