//! Signals of the daemons (`tidelog apply`, `tidelog ship`).
//!
//! | signal | effect | exit code |
//! | --- | --- | --- |
//! | first SIGTERM or SIGINT | graceful stop: finish the in-flight batch, write and sync queued frames, record acked positions, close QUIC | 0 |
//! | second SIGTERM or SIGINT during the stop | exit at once | 143 (SIGTERM), 130 (SIGINT) |
//! | SIGQUIT, at any time after start-up | exit at once | 131 |
//! | graceful stop longer than its bound | exit at once, logged | 1 |
//!
//! Exiting at once loses nothing acknowledged: a frame is acked only once durable, and
//! recovery after any crash resumes from the received log's durable end. The handlers are
//! installed before `READY=1`, so a SIGTERM that follows readiness is never the default
//! (kill) action; the loop keeps listening after the first signal.

use std::time::Duration;

use anyhow::{Context, Result};
use tokio::signal::unix::{signal, Signal, SignalKind};

/// Exit code of a second SIGTERM (128 + 15).
pub const EXIT_SECOND_SIGTERM: i32 = 143;
/// Exit code of a second SIGINT (128 + 2).
pub const EXIT_SECOND_SIGINT: i32 = 130;
/// Exit code of SIGQUIT (128 + 3).
pub const EXIT_SIGQUIT: i32 = 131;

/// The daemon's signal handlers.
#[derive(Debug)]
pub struct Signals {
    term: Signal,
    int: Signal,
    quit: Signal,
}

fn exit_now(code: i32, why: &str) -> ! {
    tracing::warn!(code, "{why}: exiting at once");
    std::process::exit(code)
}

impl Signals {
    /// Installs the handlers (inside a tokio runtime). Call it before `READY=1`.
    pub fn install() -> Result<Signals> {
        Ok(Signals {
            term: signal(SignalKind::terminate()).context("SIGTERM handler")?,
            int: signal(SignalKind::interrupt()).context("SIGINT handler")?,
            quit: signal(SignalKind::quit()).context("SIGQUIT handler")?,
        })
    }

    /// Waits for the first SIGTERM or SIGINT, or for the admin server to fail (returned as
    /// `Some`). A SIGQUIT exits the process at once. `admin_task` stays the caller's, to
    /// await after the stop (it removes the socket).
    pub async fn first(
        &mut self,
        admin_task: &mut tokio::task::JoinHandle<Result<()>>,
    ) -> Result<Option<anyhow::Error>> {
        tokio::select! {
            _ = self.term.recv() => { tracing::info!("SIGTERM: stopping"); Ok(None) }
            _ = self.int.recv() => { tracing::info!("SIGINT: stopping"); Ok(None) }
            _ = self.quit.recv() => exit_now(EXIT_SIGQUIT, "SIGQUIT"),
            r = admin_task => Ok(Some(match r {
                Ok(Ok(())) => anyhow::anyhow!("the admin API stopped"),
                Ok(Err(e)) => e,
                Err(e) => anyhow::anyhow!("the admin API task failed: {e}"),
            })),
        }
    }

    /// Runs `work` unless a SIGTERM or SIGINT comes first (`None`); a SIGQUIT exits the
    /// process at once. For start-up steps that may take a while.
    pub async fn unless_stopped<F: std::future::Future>(&mut self, work: F) -> Option<F::Output> {
        tokio::select! {
            _ = self.term.recv() => { tracing::info!("SIGTERM during start-up: stopping"); None }
            _ = self.int.recv() => { tracing::info!("SIGINT during start-up: stopping"); None }
            _ = self.quit.recv() => exit_now(EXIT_SIGQUIT, "SIGQUIT"),
            r = work => Some(r),
        }
    }

    /// From now on (the graceful stop), a second SIGTERM or SIGINT, a SIGQUIT, or the stop
    /// taking longer than `bound` exits the process at once. Runs on its own thread with
    /// its own runtime, so a stop that blocks the daemon's runtime cannot hold it up.
    pub fn during_stop(self, bound: Duration) {
        let spawned = std::thread::Builder::new()
            .name("stop-signals".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        tracing::warn!("no runtime for the stop signals: {e}");
                        return;
                    }
                };
                let Signals {
                    mut term,
                    mut int,
                    mut quit,
                } = self;
                rt.block_on(async move {
                    tokio::select! {
                        _ = term.recv() => exit_now(EXIT_SECOND_SIGTERM, "second SIGTERM"),
                        _ = int.recv() => exit_now(EXIT_SECOND_SIGINT, "second SIGINT"),
                        _ = quit.recv() => exit_now(EXIT_SIGQUIT, "SIGQUIT"),
                        () = tokio::time::sleep(bound) => {
                            tracing::error!(bound = ?bound, "the graceful stop takes too long");
                            exit_now(1, "stop bound exceeded")
                        }
                    }
                });
            });
        if let Err(e) = spawned {
            tracing::warn!("no thread for the stop signals: {e}");
        }
    }
}
