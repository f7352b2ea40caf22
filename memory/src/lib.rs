//! Process-wide memory settings both binaries (`tidelog`, `tidelog-bench`) apply as they
//! start — mimalloc's purge delay, transparent huge pages off — and the process's resident
//! size.
//!
//! A crate of its own, with only `libc` and `mimalloc` below it: the daemon and the bench
//! both need it, and neither the configuration (`tidelog-config`), the network set-up
//! (`tidelog-net`) nor the test kit (which the daemon must not link) is where an allocator
//! setting belongs.

// mimalloc (the global allocator of `tidelog` and `tidelog-bench`) — its option interface,
// by its C enum; linked in through the `mimalloc` crate, also where it is not the allocator.
use mimalloc as _;

/// Both settings below, as the daemons and the bench start: freed memory kept a while, then
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

/// The resident set size of this process (`/proc/self/statm`), in bytes; `None` where it
/// cannot be read.
pub fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf takes an integer and touches no memory of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    Some(pages * u64::try_from(page).ok()?)
}

extern "C" {
    fn mi_option_set(option: std::ffi::c_int, value: std::ffi::c_long);
    fn mi_option_get(option: std::ffi::c_int) -> std::ffi::c_long;
}

/// `mi_option_purge_delay` in mimalloc 3's `mi_option_e` (the 16th option): how long freed
/// memory stays before it goes back to the kernel (ms; −1: never; default 1000).
const MI_OPTION_PURGE_DELAY: std::ffi::c_int = 15;

/// How long memory the process freed stays mapped for its own next allocations before
/// mimalloc returns it to the kernel (its purge; mimalloc's default is 1 s).
///
/// The applier's allocations churn at the write rate — memtables filled and flushed, per-batch
/// record and transaction state — and memory purged after a second came straight back as
/// fresh pages, each faulted in and zeroed again: on this project's VM (whose freed memory
/// the host reclaims) a third of the applier's samples at the maximum rate were in that
/// zeroing (`BENCHMARKS.md`). Ten seconds spans the churn (a 64 MiB write buffer turns over
/// in about a second at the maximum rate, in about ten at 10 000 txn/s). Never purging, as
/// before, kept every peak for good: a catch-up's transaction state, once, and the resident
/// size never came down again (`BENCHMARKS.md`, "Soak").
pub const PURGE_DELAY_MS: std::ffi::c_long = 10_000;

/// Sets mimalloc's purge delay to [`PURGE_DELAY_MS`], unless the environment sets
/// `MIMALLOC_PURGE_DELAY` (read by mimalloc at start; an operator's value wins).
pub fn keep_freed_memory() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: plain integer arguments; mimalloc's option table is process-global and
    // read atomically.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, PURGE_DELAY_MS) };
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
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
            // The operator's value wins (see `keep_freed_memory`).
            let before = super::purge_delay();
            super::keep_freed_memory();
            assert_eq!(super::purge_delay(), before);
            return;
        }
        assert_eq!(super::purge_delay(), 1000, "not mimalloc's purge delay");
        super::keep_freed_memory();
        assert_eq!(super::purge_delay(), super::PURGE_DELAY_MS);
    }
}
