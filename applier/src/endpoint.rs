//! The applier's QUIC endpoint configuration: connection ids and the stateless-reset key
//! kept in `data_dir`, so that a restarted applier ends the connections of the process
//! before it at once. The TLS and transport set-up is `tidelog_net::tls`.

use std::sync::Arc;

use anyhow::{Context, Result};

/// The file under `data_dir` holding the key of the QUIC stateless-reset tokens.
pub const RESET_KEY_FILE: &str = "quic-reset.key";
const RESET_KEY_LEN: usize = 64;

/// The QUIC endpoint config, with the stateless-reset key kept in `data_dir`
/// ([`RESET_KEY_FILE`], 64 random bytes, mode 0600, made on first start).
///
/// A restarted applier must be able to reset the connections of the process before it: a
/// shipper whose applier was SIGKILLed keeps sending on its old connection, and only a
/// stateless reset carrying the token the old process gave out — an HMAC of the connection
/// id under this key — ends it at once. With a key made anew at each start (quinn's
/// default) the shipper ignored the resets and waited out the idle timeout (30 s) before it
/// reconnected, while the safe time stood still.
///
/// Connection ids are random (quinn's default signs them with a key made at start, and a
/// new process dropped the old connections' packets as invalid before it could reset them).
pub fn endpoint_config(data_dir: &std::path::Path) -> Result<quinn::EndpointConfig> {
    let key = reset_key(data_dir)?;
    let hmac = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key);
    let mut c = quinn::EndpointConfig::new(Arc::new(hmac));
    c.cid_generator(|| Box::new(RandomCids));
    Ok(c)
}

/// 8 random bytes per connection id; every id is taken as possibly ours (the trait's
/// `validate`), so a packet for a connection of a previous process gets a stateless reset.
struct RandomCids;

impl quinn::ConnectionIdGenerator for RandomCids {
    fn generate_cid(&mut self) -> quinn::ConnectionId {
        quinn::ConnectionId::new(&rand::random::<[u8; 8]>())
    }

    fn cid_len(&self) -> usize {
        8
    }

    fn cid_lifetime(&self) -> Option<std::time::Duration> {
        None
    }
}

/// The reset key kept in `data_dir`, if there is one; an error names the file when it
/// cannot be read or is not a key (at most one byte more than a key is read).
fn stored_reset_key(data_dir: &std::path::Path) -> Result<Option<[u8; RESET_KEY_LEN]>> {
    use std::io::Read;
    let path = data_dir.join(RESET_KEY_FILE);
    let mut b = Vec::with_capacity(RESET_KEY_LEN + 1);
    match std::fs::File::open(&path) {
        Ok(f) => f
            .take(RESET_KEY_LEN as u64 + 1)
            .read_to_end(&mut b)
            .with_context(|| format!("reading {}", path.display()))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let key = b.as_slice().try_into().map_err(|_| {
        let found = if b.len() > RESET_KEY_LEN {
            "more".to_string()
        } else {
            b.len().to_string()
        };
        anyhow::anyhow!(
            "{}: the QUIC reset key must be {RESET_KEY_LEN} bytes, found {found} (delete the file to make a new one)",
            path.display(),
        )
    })?;
    Ok(Some(key))
}

/// What [`endpoint_config`] would refuse in `data_dir`, without writing anything: a reset
/// key file that cannot be read or is not a key.
pub fn check_reset_key(data_dir: &std::path::Path) -> Result<()> {
    stored_reset_key(data_dir).map(|_| ())
}

fn reset_key(data_dir: &std::path::Path) -> Result<[u8; RESET_KEY_LEN]> {
    if let Some(key) = stored_reset_key(data_dir)? {
        return Ok(key);
    }
    let path = data_dir.join(RESET_KEY_FILE);
    // rand's thread generator: a CSPRNG seeded from the operating system.
    let key: [u8; RESET_KEY_LEN] = rand::random();
    tidelog_wal::write_atomic_private(&path, &key)?;
    Ok(key)
}
