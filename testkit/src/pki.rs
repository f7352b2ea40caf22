//! PKI for tests and benchmarks: the certificates `tidelog certs init` makes
//! (`tidelog_net::pki`), in memory for a test that runs both ends in one process
//! ([`in_memory`]), or written to a directory for ends that load their `[tls]` files
//! ([`write`], [`load`]).

use std::path::Path;

use anyhow::Result;
pub use tidelog_net::pki::Pki;
use tidelog_net::tls::{TlsFiles, TlsMaterial};

/// A new CA and both ends' certificates (`localhost`, `127.0.0.1`), never written.
pub fn in_memory() -> Result<Pki> {
    Pki::generate(&[])
}

/// `tidelog certs init --dir dir`, in this process: `ca.pem`, `applier.pem`,
/// `shipper.pem` and their keys.
pub fn write(dir: &Path) -> Result<()> {
    tidelog_net::pki::init(dir, &[], false).map(drop)
}

/// The material `role` (`applier` or `shipper`) loads from a directory [`write`] filled,
/// as its daemon loads its `[tls]` files.
pub fn load(dir: &Path, role: &str) -> Result<TlsMaterial> {
    TlsMaterial::load(&TlsFiles::in_dir(dir, role))
}
