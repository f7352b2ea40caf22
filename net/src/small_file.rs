//! Reading the small files a daemon is pointed at — its config, its PEM files — with a cap
//! on how much is read, so that a wrong path (`/dev/zero`, a log file, a disk image) is a
//! clear error naming the file and the cap, not an allocation of gigabytes.

use std::io::Read;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The most a PEM file (`tls.ca`, `tls.cert`, `tls.key`) may hold: a CA bundle of a few
/// hundred certificates fits.
pub const PEM_MAX: u64 = 1 << 20;

/// Reads `path`, which must hold at most `max` bytes (`what` says what the file is, e.g.
/// "a PEM file"). A larger regular file is refused before it is read; any other file
/// (a device, a pipe) is read up to `max + 1` bytes at most.
pub fn read(path: &Path, max: u64, what: &str) -> Result<Vec<u8>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    let meta = file
        .metadata()
        .with_context(|| format!("cannot read {}", path.display()))?;
    if meta.is_dir() {
        bail!("{} is a directory, not {what}", path.display());
    }
    if meta.is_file() && meta.len() > max {
        bail!(
            "{} holds {} bytes, more than {} may ({})",
            path.display(),
            meta.len(),
            what,
            size(max)
        );
    }
    let mut out = Vec::with_capacity(usize::try_from(meta.len().min(max)).unwrap_or(0));
    file.take(max + 1)
        .read_to_end(&mut out)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if out.len() as u64 > max {
        bail!(
            "{} holds more than {} may ({}); read stopped there",
            path.display(),
            what,
            size(max)
        );
    }
    Ok(out)
}

/// `1 MiB`, `16 MiB`, `512 bytes`.
fn size(n: u64) -> String {
    if n >= 1 << 20 && n % (1 << 20) == 0 {
        format!("{} MiB", n >> 20)
    } else if n >= 1 << 10 && n % (1 << 10) == 0 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} bytes")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn caps_regular_files_and_devices() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read(&p, 5, "a test file").unwrap(), b"hello");
        let e = format!("{:#}", read(&p, 4, "a test file").unwrap_err());
        assert!(
            e.contains(&p.display().to_string())
                && e.contains("more than a test file may (4 bytes)"),
            "{e}"
        );
        // Sparse and large: refused from its size, not read.
        let big = dir.path().join("big");
        std::fs::File::create(&big)
            .unwrap()
            .set_len(1 << 40)
            .unwrap();
        let e = format!("{:#}", read(&big, PEM_MAX, "a PEM file").unwrap_err());
        assert!(
            e.contains("1099511627776 bytes") && e.contains("(1 MiB)"),
            "{e}"
        );
        // A device without a size: read up to the cap, then refused.
        let e = format!(
            "{:#}",
            read(Path::new("/dev/zero"), PEM_MAX, "a PEM file").unwrap_err()
        );
        assert!(
            e.contains("/dev/zero holds more than a PEM file may (1 MiB)"),
            "{e}"
        );
        let e = format!("{:#}", read(dir.path(), PEM_MAX, "a PEM file").unwrap_err());
        assert!(e.contains("is a directory"), "{e}");
    }
}
