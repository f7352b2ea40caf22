//! Loading a daemon's `[tls]` files ([`TlsFiles`]) into [`TlsMaterial`], the way start-up
//! and `--check` use them: every file read with a cap ([`small_file`]) and parsed, the CA
//! usable as a trust anchor, the key the certificate's; an error names the config key and
//! the file. [`key_mode_warning`] reports a private key others can read.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use anyhow::{anyhow, bail, Result};
use rustls::sign::CertifiedKey;
use rustls::InconsistentKeys;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::{provider, TlsFiles, TlsMaterial};
use crate::small_file;

/// A PEM file's bytes, at most [`small_file::PEM_MAX`].
fn read_pem(path: &Path) -> Result<Vec<u8>> {
    small_file::read(path, small_file::PEM_MAX, "a PEM file")
}

/// Every certificate in a PEM file (at least one).
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| anyhow!("{}: bad PEM: {e}", path.display()))?;
    if certs.is_empty() {
        bail!(
            "{}: no certificate (BEGIN CERTIFICATE) found",
            path.display()
        );
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>> {
    let pem = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => {
            anyhow!("{}: no private key found", path.display())
        }
        e => anyhow!("{}: {e}", path.display()),
    })
}

impl TlsMaterial {
    /// Loads `tls.ca`, `tls.cert` and `tls.key` and checks what the TLS configurations will
    /// need: each CA certificate usable as a trust anchor, the key a supported private key,
    /// the certificate parseable and its public key the private key's. Reads the files only.
    /// Errors name the key and the file: `key "tls.key": /etc/tidelog/tls/applier.key: no
    /// private key found`; callers add the config file.
    pub fn load(tls: &TlsFiles) -> Result<TlsMaterial> {
        let named = |key: &str, e: anyhow::Error| anyhow!("key \"tls.{key}\": {e:#}");
        let ca = load_certs(&tls.ca).map_err(|e| named("ca", e))?;
        let path = tls.ca.display();
        super::root_store(&ca, || format!("{path}: not a usable CA certificate"))
            .map_err(|e| named("ca", e))?;
        let chain = load_certs(&tls.cert).map_err(|e| named("cert", e))?;
        let key = load_key(&tls.key).map_err(|e| named("key", e))?;
        let signer = provider()
            .key_provider
            .load_private_key(key.clone_key())
            .map_err(|e| {
                anyhow!(
                    "key \"tls.key\": {}: not a usable private key: {e}",
                    tls.key.display()
                )
            })?;
        match CertifiedKey::new(chain.clone(), signer).keys_match() {
            // `Unknown`: the key cannot say its public key; rustls accepts it the same way.
            Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => bail!(
                "key \"tls.key\": {} is not the private key of the certificate in {} \
                 (tls.cert)",
                tls.key.display(),
                tls.cert.display()
            ),
            Err(e) => bail!(
                "key \"tls.cert\": {}: not a usable certificate: {e}",
                tls.cert.display()
            ),
        }
        Ok(TlsMaterial { ca, chain, key })
    }

    /// [`TlsMaterial::load`], then what a start should know about the files: a private key
    /// others can read ([`key_mode_warning`]) and the certificates' validity
    /// ([`TlsMaterial::check_validity`], now), as warnings — or an error for a certificate
    /// outside its validity.
    pub fn load_checked(tls: &TlsFiles) -> Result<(TlsMaterial, Vec<String>)> {
        let m = TlsMaterial::load(tls)?;
        let mut warnings: Vec<String> = key_mode_warning(&tls.key).into_iter().collect();
        warnings.extend(m.check_validity(tls, super::unix_now())?);
        Ok((m, warnings))
    }
}

/// Why `key` (the `tls.key` file) can be read by others than the daemon, if it can: any
/// group or other permission bit (`mode & 0o077`), except group read when the file's group
/// is the daemon's own (the README's `chgrp tidelog *.key && chmod 0640 *.key`, for keys
/// owned by root and read by the `tidelog` user). `None` also when the file cannot be
/// stat-ed (loading it reports that).
pub fn key_mode_warning(key: &Path) -> Option<String> {
    let meta = std::fs::metadata(key).ok()?;
    let mode = meta.mode() & 0o7777;
    let loose = mode & 0o077;
    // SAFETY: getegid(2) takes no arguments and cannot fail.
    let own_group = meta.gid() == unsafe { libc::getegid() };
    if loose == 0 || (loose == 0o040 && own_group) {
        return None;
    }
    Some(format!(
        "key \"tls.key\": {} is accessible by group or others (mode {mode:04o}); a private \
         key should be mode 0600, or 0640 with the daemon's own group",
        key.display()
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::pki;

    #[test]
    fn load_errors_name_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("empty.pem");
        std::fs::write(&p, "nothing here\n").unwrap();
        let e = format!("{:#}", load_certs(&p).unwrap_err());
        assert!(
            e.contains("empty.pem") && e.contains("no certificate"),
            "{e}"
        );
        let e = format!("{:#}", load_key(&p).unwrap_err());
        assert!(
            e.contains("empty.pem") && e.contains("no private key"),
            "{e}"
        );
        let e = format!(
            "{:#}",
            load_certs(&dir.path().join("gone.pem")).unwrap_err()
        );
        assert!(e.contains("gone.pem"), "{e}");
        pki::init(dir.path(), &[], false).unwrap();
        assert_eq!(
            load_certs(&dir.path().join("applier.pem")).unwrap().len(),
            1
        );
        load_key(&dir.path().join("shipper.key")).unwrap();
    }
}
