//! The endpoint's credentials: the password file (its first line; refused when group or
//! others may read it) and the `mysql_native_password` check of a client's answer to the
//! connection's nonce.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{bail, Context, Result};

/// The largest password file read.
const MAX_FILE: u64 = 64 * 1024;

/// A password, never printed.
#[derive(Clone)]
pub struct Password(Vec<u8>);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(…)")
    }
}

impl Password {
    /// A password given as is (tests).
    pub fn new(p: impl Into<Vec<u8>>) -> Password {
        Password(p.into())
    }

    /// Reads `path`: a regular file, not readable by group or others (mode 0600 or
    /// stricter), whose first line (without its newline or `\r\n`) is a non-empty password.
    pub fn read(path: &Path) -> Result<Password> {
        let meta =
            std::fs::metadata(path).with_context(|| format!("password file {}", path.display()))?;
        if !meta.is_file() {
            bail!("password file {} is not a regular file", path.display());
        }
        let mode = meta.mode() & 0o777;
        if mode & 0o044 != 0 {
            bail!(
                "password file {} has mode {mode:04o}: group or others can read it; \
                 `chmod 600 {}`",
                path.display(),
                path.display()
            );
        }
        if meta.len() > MAX_FILE {
            bail!(
                "password file {} is {} bytes, more than {MAX_FILE}",
                path.display(),
                meta.len()
            );
        }
        let bytes = std::fs::read(path)
            .with_context(|| format!("reading password file {}", path.display()))?;
        let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            bail!(
                "password file {}: its first line (the password) is empty",
                path.display()
            );
        }
        Ok(Password(line.to_vec()))
    }

    /// Whether `answer` is `mysql_native_password`'s scramble of this password with
    /// `nonce`, compared in constant time.
    pub fn matches(&self, nonce: &[u8; 20], answer: &[u8]) -> bool {
        let Some(want) = mysql_common::scramble::scramble_native(nonce, &self.0) else {
            return false;
        };
        answer.len() == want.len()
            && want
                .iter()
                .zip(answer)
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_file_is_read_once_private() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "s3cret\r\nignored\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        let pw = Password::read(&p).unwrap();
        let nonce = [7u8; 20];
        let answer = mysql_common::scramble::scramble_native(&nonce, b"s3cret").unwrap();
        assert!(pw.matches(&nonce, &answer));
        assert!(!pw.matches(&nonce, &answer[..19]));
        assert!(!pw.matches(&[8u8; 20], &answer));
        assert!(!pw.matches(&nonce, b""));
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = Password::read(&p).unwrap_err().to_string();
            assert!(e.contains("group or others can read it"), "{mode:o}: {e}");
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(Password::read(&p).is_ok());
        std::fs::write(&p, "\nx").unwrap();
        assert!(Password::read(&p)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        assert!(Password::read(&dir.path().join("missing")).is_err());
    }
}
