//! systemd integration (`docs/operations.md`, "systemd"): `READY=1` once recovery is done,
//! `STATUS=` lines, `STOPPING=1` on shutdown and `WATCHDOG=1` pings. Every function is a
//! no-op when `NOTIFY_SOCKET` is unset (not started by systemd, or `Type=` other than
//! `notify`), and a failure to notify is logged, never fatal.

use std::time::Duration;

use sd_notify::NotifyState;

fn send(states: &[NotifyState<'_>]) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "systemd notify failed");
    }
}

/// `READY=1`: start-up (recovery, binding) is complete.
pub fn ready() {
    send(&[NotifyState::Ready]);
}

/// `STATUS=<text>`: one line shown by `systemctl status`.
pub fn status(text: &str) {
    // A newline would end the STATUS= assignment early.
    let line = text.replace('\n', " ");
    send(&[NotifyState::Status(&line)]);
}

/// `STOPPING=1`: shutdown has begun.
pub fn stopping() {
    send(&[NotifyState::Stopping]);
}

/// The watchdog ping interval: half of `WATCHDOG_USEC`, if systemd asked for pings
/// (`WatchdogSec=`); see [`watchdog_interval_from`] for how `WATCHDOG_PID` counts.
pub fn watchdog_interval() -> Option<Duration> {
    std::env::var_os("NOTIFY_SOCKET")?;
    let usec = std::env::var("WATCHDOG_USEC").ok();
    let pid = std::env::var("WATCHDOG_PID").ok();
    watchdog_interval_from(usec.as_deref(), pid.as_deref(), std::process::id())
}

/// The rules of libsystemd's `sd_watchdog_enabled`, for the values of `WATCHDOG_USEC` and
/// `WATCHDOG_PID` and this process's pid `me`: pings are wanted when `WATCHDOG_USEC` is a
/// positive number of microseconds and `WATCHDOG_PID` is either unset (meaning this
/// process) or `me`; a `WATCHDOG_PID` naming another process, or one that is not a pid,
/// means the pings are someone else's business. Returns half the interval.
pub fn watchdog_interval_from(usec: Option<&str>, pid: Option<&str>, me: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    if let Some(pid) = pid {
        let pid: u32 = pid.trim().parse().ok().filter(|&p| p > 0)?;
        if pid != me {
            return None;
        }
    }
    Some(Duration::from_micros(usec / 2))
}

/// The shortest silence of a worker taken for a hang, whatever `WATCHDOG_USEC` says: one slow
/// fsync on a busy disk (hundreds of milliseconds) is not a hang, and a hang is still caught
/// within seconds.
pub const MIN_STALL: Duration = Duration::from_secs(5);

/// Spawns a task on the current tokio runtime that sends `WATCHDOG=1` every
/// [`watchdog_interval`] (half of `WATCHDOG_USEC`), but only while `liveness` vouches for the
/// threads that do the real work; `None` (nothing spawned) when the watchdog is off.
///
/// `liveness(limit)` is called before each ping with `limit` = `WATCHDOG_USEC`, but at least
/// [`MIN_STALL`]; it returns `Err(what)` naming a worker that has shown no sign of life for
/// longer (see `tidelog_wal::Heartbeat`). The ping is then withheld (logged once per stall) and systemd,
/// after `WatchdogSec=` without a ping, kills and restarts the service. A stalled runtime
/// stops the pings as well, since this task runs on it. Abort the handle (or drop the
/// runtime) to stop pinging.
pub fn spawn_watchdog<F>(liveness: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn(Duration) -> Result<(), String> + Send + 'static,
{
    let every = watchdog_interval()?;
    let limit = (every * 2).max(MIN_STALL);
    tracing::debug!(interval = ?every, "systemd watchdog enabled");
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stalled = false;
        loop {
            tick.tick().await;
            match liveness(limit) {
                Ok(()) => {
                    if stalled {
                        tracing::warn!("workers alive again: resuming systemd watchdog pings");
                        stalled = false;
                    }
                    send(&[NotifyState::Watchdog]);
                }
                Err(what) => {
                    if !stalled {
                        tracing::error!(
                            "{what}: withholding systemd watchdog pings (systemd restarts the \
                             service after WatchdogSec)"
                        );
                        stalled = true;
                    }
                }
            }
        }
    }))
}

/// Spawns a task that sends `STATUS=<text()>` now and then every `every`; `None` when not
/// started by systemd. Abort the handle to stop it.
pub fn spawn_status<F>(every: Duration, text: F) -> Option<tokio::task::JoinHandle<()>>
where
    F: Fn() -> String + Send + 'static,
{
    std::env::var_os("NOTIFY_SOCKET")?;
    Some(tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            status(&text());
        }
    }))
}

#[cfg(test)]
mod tests {
    use std::os::unix::net::UnixDatagram;

    use super::*;

    #[test]
    fn watchdog_pid_unset_means_this_process() {
        let me = 4242;
        let half = Some(Duration::from_millis(500));
        // systemd sets both; WATCHDOG_PID unset is this process too (sd_watchdog_enabled).
        assert_eq!(
            watchdog_interval_from(Some("1000000"), Some("4242"), me),
            half
        );
        assert_eq!(watchdog_interval_from(Some("1000000"), None, me), half);
        // Another process's watchdog, or a WATCHDOG_PID that is not a pid: no pings.
        assert_eq!(watchdog_interval_from(Some("1000000"), Some("1"), me), None);
        assert_eq!(watchdog_interval_from(Some("1000000"), Some("x"), me), None);
        assert_eq!(watchdog_interval_from(Some("1000000"), Some("0"), me), None);
        // No watchdog asked for.
        assert_eq!(watchdog_interval_from(None, None, me), None);
        assert_eq!(watchdog_interval_from(None, Some("4242"), me), None);
        assert_eq!(watchdog_interval_from(Some("0"), None, me), None);
        assert_eq!(watchdog_interval_from(Some("soon"), None, me), None);
    }

    /// One test touches the environment (tests in this binary run in parallel; no other test
    /// reads NOTIFY_SOCKET).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sends_states_to_notify_socket_and_pings_the_watchdog() {
        std::env::remove_var("NOTIFY_SOCKET");
        ready(); // no socket: a no-op
        assert!(watchdog_interval().is_none());
        assert!(spawn_watchdog(|_| Ok(())).is_none());
        assert!(spawn_status(Duration::from_secs(1), String::new).is_none());

        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        std::env::set_var("NOTIFY_SOCKET", &path);
        std::env::set_var("WATCHDOG_USEC", "20000");
        std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
        // Everything already queued on the socket, which must be watchdog pings.
        let drain = |sock: &UnixDatagram| {
            let mut b = [0u8; 256];
            sock.set_nonblocking(true).unwrap();
            while let Ok(n) = sock.recv(&mut b) {
                assert_eq!(String::from_utf8_lossy(&b[..n]).trim(), "WATCHDOG=1");
            }
            sock.set_nonblocking(false).unwrap();
        };
        let mut buf = [0u8; 256];
        let mut recv = || {
            let n = sock.recv(&mut buf).unwrap();
            String::from_utf8_lossy(&buf[..n]).into_owned()
        };
        ready();
        assert_eq!(recv().trim(), "READY=1");
        status("applying\nsafe time 5");
        assert_eq!(recv().trim(), "STATUS=applying safe time 5");
        stopping();
        assert_eq!(recv().trim(), "STOPPING=1");
        assert_eq!(watchdog_interval(), Some(Duration::from_millis(10)));
        std::env::remove_var("WATCHDOG_PID");
        assert_eq!(watchdog_interval(), Some(Duration::from_millis(10)));
        std::env::set_var("WATCHDOG_PID", "1");
        assert_eq!(watchdog_interval(), None, "another process's watchdog");
        std::env::set_var("WATCHDOG_PID", std::process::id().to_string());
        let alive = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let failed_checks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (a2, f2) = (alive.clone(), failed_checks.clone());
        let h = spawn_watchdog(move |limit| {
            assert_eq!(limit, MIN_STALL);
            if a2.load(std::sync::atomic::Ordering::SeqCst) {
                Ok(())
            } else {
                f2.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                Err("worker x is stuck".into())
            }
        })
        .unwrap();
        assert_eq!(recv().trim(), "WATCHDOG=1");
        assert_eq!(recv().trim(), "WATCHDOG=1");
        // A stuck worker: no ping for many intervals. Once a check has failed, every ping
        // of an earlier check is already queued (one task checks, then pings): drain them.
        alive.store(false, std::sync::atomic::Ordering::SeqCst);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while failed_checks.load(std::sync::atomic::Ordering::SeqCst) == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the liveness check was not called"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        drain(&sock);
        sock.set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        assert!(
            sock.recv(&mut buf).is_err(),
            "a ping arrived although the liveness check failed"
        );
        alive.store(true, std::sync::atomic::Ordering::SeqCst);
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "WATCHDOG=1");
        h.abort();
        // Stopped for sure once awaited; pings it sent before that may still be queued.
        let _ = h.await;
        drain(&sock);
        let st = spawn_status(Duration::from_secs(60), || "lag 3s".into()).unwrap();
        let n = sock.recv(&mut buf).unwrap();
        assert_eq!(String::from_utf8_lossy(&buf[..n]).trim(), "STATUS=lag 3s");
        st.abort();
        std::env::remove_var("NOTIFY_SOCKET");
        std::env::remove_var("WATCHDOG_USEC");
        std::env::remove_var("WATCHDOG_PID");
    }
}
