//! A `tidelog apply|ship` child process ([`Daemon`]), the way systemd runs one: started
//! with `--config`, its stderr appended to a log, stopped with SIGTERM (or killed), and
//! SIGTERMed by the kernel if the process that started it dies.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// A `tidelog apply|ship` child process (the demo's, the fault run's, the benchmarks'),
/// SIGKILLed if still running when dropped.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    what: &'static str,
    log: PathBuf,
}

impl Daemon {
    /// Starts `exe what --config config` with stderr appended to `log` and
    /// `RUST_LOG=rust_log`.
    pub fn spawn(
        exe: &Path,
        what: &'static str,
        config: &Path,
        log: &Path,
        rust_log: &str,
    ) -> Result<Daemon> {
        // Appended: a daemon restarted with the same config goes on in the same log.
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let mut cmd = Command::new(exe);
        cmd.arg(what)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(f);
        // The daemon gets SIGTERM (a graceful stop) when the process that started it dies,
        // however it dies (a SIGTERM or SIGKILL of the demo would otherwise leave it running).
        // SAFETY: prctl(2) with integer arguments only, between fork and exec (async-signal-safe).
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {} {what}", exe.display()))?;
        Ok(Daemon {
            child: Some(child),
            what,
            log: log.to_path_buf(),
        })
    }

    /// The child's pid (0 once stopped).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// SIGTERM and wait for a clean exit (SIGKILL after `timeout`, an error then).
    pub fn stop(&mut self, timeout: Duration) -> Result<()> {
        let Some(mut c) = self.child.take() else {
            return Ok(());
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = c.try_wait()? {
                if !st.success() {
                    bail!(
                        "tidelog {} exited with {st}; see {}",
                        self.what,
                        self.log.display()
                    );
                }
                return Ok(());
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                bail!(
                    "tidelog {} did not stop within {timeout:?} of SIGTERM",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and reaps it (a crash, as far as the daemon can tell).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Polls `ready` every 20 ms until it holds; an error if the child exits first or
    /// `timeout` passes (`what` names the condition).
    pub fn wait_until(
        &mut self,
        what: &str,
        timeout: Duration,
        mut ready: impl FnMut() -> Result<bool>,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if ready()? {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!("{what}: not within {timeout:?}; see {}", self.log.display());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// An error if the child has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        if let Some(c) = &mut self.child {
            if let Some(st) = c.try_wait()? {
                bail!(
                    "tidelog {} exited early with {st}; see {}",
                    self.what,
                    self.log.display()
                );
            }
        }
        Ok(())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill();
    }
}
