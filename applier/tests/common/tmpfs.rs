//! A small tmpfs for disk-full tests (shared by the applier's and the daemon's test kits):
//! mounted on a fresh directory and unmounted when dropped; a ballast file fills it, and
//! removing the ballast gives the space back.
#![allow(dead_code, clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs; unmounted (lazily, if something still has it open) when dropped.
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// A tmpfs of `size` (`mount -o size=`, e.g. `48m`) on a fresh directory, or `None`
    /// with a printed note where mounting is refused (not root, a container without
    /// `CAP_SYS_ADMIN`): the caller skips its test.
    pub fn mount(size: &str, test: &str) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                eprintln!(
                    "SKIPPED {test}: cannot mount a {size} tmpfs for the disk-full test: {}",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                eprintln!("SKIPPED {test}: cannot run mount(8) for the disk-full test: {e}");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Bytes free on the tmpfs.
    pub fn free(&self) -> u64 {
        tidelog_applier::disk::free_bytes(self.path()).unwrap()
    }

    /// Writes a ballast file until at most `leave` bytes are free; returns its path.
    pub fn fill(&self, leave: u64) -> PathBuf {
        let path = self.path().join("ballast");
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .unwrap();
        let chunk = vec![0xa5u8; 64 << 10];
        loop {
            let free = self.free();
            if free <= leave {
                break;
            }
            let n = chunk.len().min((free - leave) as usize);
            if f.write_all(&chunk[..n]).is_err() {
                break;
            }
        }
        f.sync_all().unwrap();
        path
    }

    /// Grows (or shrinks) the tmpfs to `size` in place (`mount -o remount,size=`).
    pub fn resize(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(st.success(), "remounting the tmpfs with size={size}");
    }

    /// Removes the ballast: the space returns.
    pub fn drain(&self) {
        std::fs::remove_file(self.path().join("ballast")).unwrap();
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}
