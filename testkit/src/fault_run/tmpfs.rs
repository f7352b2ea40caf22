//! A small tmpfs for the full-disk fault: mounted (as root) on a fresh directory, filled by
//! a ballast file, the ballast removed to give the space back, unmounted when dropped.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// A mounted tmpfs; unmounted (lazily, if something still has it open) when dropped.
#[derive(Debug)]
pub struct Tmpfs {
    dir: PathBuf,
}

/// Name of the ballast file at the tmpfs' root.
const BALLAST: &str = "ballast";

impl Tmpfs {
    /// Mounts a tmpfs of `size` bytes on `dir` (created). An error says why where mounting
    /// is refused (not root, a container without `CAP_SYS_ADMIN`, no mount(8)).
    pub fn mount(dir: &Path, size: u64) -> Result<Tmpfs> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .context("running mount(8)")?;
        if !out.status.success() {
            bail!(
                "mount -t tmpfs -o size={size} tmpfs {}: {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(Tmpfs {
            dir: dir.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Bytes free.
    pub fn free(&self) -> Result<u64> {
        let st = rustix::fs::statvfs(&self.dir)
            .with_context(|| format!("statvfs {}", self.dir.display()))?;
        Ok(st.f_bavail.saturating_mul(st.f_frsize))
    }

    /// Grows the ballast until at most `leave` bytes are free (or a write fails for want of
    /// space); returns the ballast's size. Called again, it tops the ballast up.
    pub fn fill(&self, leave: u64) -> Result<u64> {
        let path = self.dir.join(BALLAST);
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let chunk = vec![0xa5u8; 1 << 20];
        loop {
            let free = self.free()?;
            if free <= leave {
                break;
            }
            let n = usize::try_from(free - leave).map_or(chunk.len(), |n| n.min(chunk.len()));
            if f.write_all(&chunk[..n]).is_err() {
                // ENOSPC: someone else took the rest meanwhile; full is what we want.
                break;
            }
        }
        Ok(f.metadata()?.len())
    }

    /// Removes the ballast: the space returns.
    pub fn drain(&self) -> Result<()> {
        let path = self.dir.join(BALLAST);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(&self.dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
        }
    }
}
