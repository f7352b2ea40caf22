//! Scheduling priority of the stages consistent reads wait on (`apply-nice`).
//!
//! The safe time readers see is the minimum over tablets of what the apply threads have
//! applied, published by the safe-time thread. When those threads share CPUs with other
//! work (the intake, fjall's flushes and compactions, reads, or other processes on the
//! host), every preemption of them is added to the lag of every tablet they serve. A nice
//! value below the rest of the process gives them a larger share of a busy CPU.
//!
//! On Linux the nice value is a per-thread attribute: `setpriority(PRIO_PROCESS, 0, n)`
//! sets the calling thread's only.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Threads [`apply_stage_nice`] set, and threads whose value was refused, since start.
static SET: AtomicUsize = AtomicUsize::new(0);
static REFUSED: AtomicUsize = AtomicUsize::new(0);

/// How many threads got a non-zero nice value from [`apply_stage_nice`], and for how many
/// it was refused (`/v1/status` `apply_nice`).
pub fn stage_nice_counts() -> (usize, usize) {
    (SET.load(Ordering::Relaxed), REFUSED.load(Ordering::Relaxed))
}

/// Sets the calling thread's nice value. A value below the current one needs
/// `CAP_SYS_NICE` or an `RLIMIT_NICE` that allows it (systemd: `LimitNICE=`).
pub fn set_current_thread_nice(nice: i32) -> std::io::Result<()> {
    // SAFETY: setpriority takes plain integers and touches no memory of ours.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// [`set_current_thread_nice`] for a thread of `stage`, at start: logs (and otherwise
/// ignores) a refusal, so that a missing permission costs latency, not the daemon. `0`
/// leaves the thread at the process's nice value.
pub fn apply_stage_nice(stage: &str, nice: i32) {
    if nice == 0 {
        return;
    }
    match set_current_thread_nice(nice) {
        Ok(()) => {
            SET.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(stage, nice, "thread nice value set")
        }
        Err(e) => {
            REFUSED.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                stage,
                nice,
                error = %e,
                "cannot set the thread's nice value (apply-nice): below the process's it \
                 needs CAP_SYS_NICE or a LimitNICE= that allows it; running at the process's \
                 nice value"
            )
        }
    }
}

/// Sets the nice value of every thread of this process whose name is `comm` — threads a
/// library starts, such as the store's background workers — and returns how many it set.
/// Linux: the threads are listed in `/proc/self/task`; one that exits meanwhile is skipped.
/// An error names the thread it could not set (a value below the process's needs the same
/// permission as [`set_current_thread_nice`]).
pub fn set_threads_nice(comm: &str, nice: i32) -> std::io::Result<usize> {
    let tasks = std::path::Path::new("/proc/self/task");
    let mut set = 0;
    for e in std::fs::read_dir(tasks)? {
        let e = e?;
        let Ok(name) = std::fs::read_to_string(e.path().join("comm")) else {
            continue; // exited
        };
        if name.trim_end_matches('\n') != comm {
            continue;
        }
        let Ok(tid) = e.file_name().to_string_lossy().parse::<libc::id_t>() else {
            continue;
        };
        // SAFETY: setpriority takes plain integers and touches no memory of ours.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ESRCH) {
                continue; // exited
            }
            return Err(std::io::Error::new(
                err.kind(),
                format!("setting nice {nice} on thread {tid} ({comm}): {err}"),
            ));
        }
        set += 1;
    }
    Ok(set)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn own_nice() -> i32 {
        nice_of("/proc/thread-self/stat")
    }

    fn nice_of(stat: &str) -> i32 {
        // .../stat: field 19 is the nice value (after the parenthesized comm).
        let s = std::fs::read_to_string(stat).unwrap();
        let rest = &s[s.rfind(')').unwrap() + 2..];
        rest.split(' ').nth(16).unwrap().parse().unwrap()
    }

    /// This thread's nice value, if it can still be raised (raising needs no privilege).
    fn raisable() -> Option<i32> {
        let n = own_nice();
        if n >= 19 {
            eprintln!("skipped: already at nice {n}, nothing can be raised");
            return None;
        }
        Some(n)
    }

    /// Raising the nice value (always allowed) changes the calling thread only.
    #[test]
    fn nice_is_set_per_thread() {
        let Some(before) = raisable() else { return };
        let want = (before + 3).min(19);
        let got = std::thread::spawn(move || {
            set_current_thread_nice(want).unwrap();
            own_nice()
        })
        .join()
        .unwrap();
        assert_eq!(got, want);
        assert_eq!(
            own_nice(),
            before,
            "the spawning thread kept its nice value"
        );
    }

    /// Every thread with the name gets the value; threads with other names keep theirs.
    #[test]
    fn threads_are_set_by_name() {
        let Some(before) = raisable() else { return };
        let want = (before + 2).min(19);
        let stop = std::sync::Arc::new(std::sync::Barrier::new(4));
        let spawn = |name: &str| {
            let (stop, (tx, rx)) = (stop.clone(), std::sync::mpsc::channel());
            let h = std::thread::Builder::new()
                .name(name.to_string())
                .spawn(move || {
                    // SAFETY: gettid takes nothing and touches no memory.
                    tx.send(unsafe { libc::gettid() }).unwrap();
                    stop.wait();
                })
                .unwrap();
            (rx.recv().unwrap(), h)
        };
        let named = [spawn("xnice-worker"), spawn("xnice-worker")];
        let other = spawn("xnice-other");
        let n = set_threads_nice("xnice-worker", want).unwrap();
        for (tid, _) in &named {
            assert_eq!(nice_of(&format!("/proc/self/task/{tid}/stat")), want);
        }
        assert_eq!(n, 2, "exactly the two named threads");
        assert_eq!(
            nice_of(&format!("/proc/self/task/{}/stat", other.0)),
            before
        );
        assert_eq!(own_nice(), before);
        stop.wait();
        for (_, h) in named.into_iter().chain([other]) {
            h.join().unwrap();
        }
    }
}
