//! Process-wide memory settings.

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

#[cfg(test)]
mod tests {
    #[test]
    fn the_flag_is_set_and_reads_back() {
        super::disable_transparent_huge_pages().unwrap();
        // SAFETY: PR_GET_THP_DISABLE takes no arguments.
        let r = unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(r, 1);
    }
}
