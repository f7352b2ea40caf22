//! A small tmpfs for disk-full tests: mounted on a fresh temporary directory, unmounted when
//! dropped. Mounting needs root (or a user namespace); where it is refused, `mount` returns
//! `None` after printing a note, and the test skips.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::Path;
use std::process::Command;

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// A tmpfs of `bytes` bytes (rounded up to pages by the kernel), or `None` with a note
    /// on stdout when mounting is not allowed here.
    pub fn mount(bytes: u64) -> Option<Tmpfs> {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs { dir }),
            Ok(o) => {
                println!(
                    "SKIPPED: cannot mount a tmpfs here ({}); this disk-full test needs root",
                    String::from_utf8_lossy(&o.stderr).trim()
                );
                None
            }
            Err(e) => {
                println!("SKIPPED: cannot run mount ({e}); this disk-full test needs root");
                None
            }
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Grows (or shrinks) the file system to `bytes`, as freeing space on a disk would.
    pub fn resize(&self, bytes: u64) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={bytes}")])
            .arg(self.dir.path())
            .status()
            .unwrap();
        assert!(st.success(), "remounting the tmpfs with size {bytes}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: a file still open (a writer dropped later) must not keep it mounted.
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
