//! What an operator is told when TLS refuses the other end's certificate, instead of
//! "invalid peer certificate: BadSignature" or a "connection lost" for a connection that
//! never existed: the refusing end names the CA file it checked against, the refused end
//! hears that it was refused.

use std::path::Path;

pub use tidelog_wal::wire::CertRefusal;

/// The CA file as named in messages, or "the configured CA" when it is not known.
fn ca_name(ca: Option<&Path>) -> String {
    ca.map_or("the configured CA".to_string(), |p| p.display().to_string())
}

/// What the applier logs for a shipper's handshake that failed with `why` (rustls's text),
/// `ca` being the file of the CA shipper certificates must chain to.
pub fn client_refused(why: &str, ca: Option<&Path>) -> String {
    match CertRefusal::of(why) {
        Some(CertRefusal::OtherCa) => format!(
            "shipper refused: its certificate is not signed by the configured CA (ca = {}) ({why})",
            ca_name(ca)
        ),
        Some(_) => format!("shipper refused: its certificate is not acceptable ({why})"),
        None => format!("shipper handshake failed: {why}"),
    }
}

/// What the shipper says about a connection attempt that failed with `why` before the
/// connection existed: the applier's certificate refused here (`ca` the file it was checked
/// against, `server_name` the name it had to carry), or this shipper's refused there;
/// `why` as it is for any other failure.
pub fn server_refused(why: &str, ca: Option<&Path>, server_name: &str) -> String {
    match CertRefusal::of(why) {
        None => why.to_string(),
        // Our verifier refused the applier's certificate: a local `invalid peer
        // certificate`; the applier refusing ours comes back "aborted by peer".
        Some(r) if !why.contains("by peer") => match r {
            CertRefusal::OtherCa => format!(
                "the applier's certificate is not signed by the configured CA (ca = {}) ({why})",
                ca_name(ca)
            ),
            CertRefusal::WrongName => format!(
                "the applier's certificate does not name {server_name:?} (server-name) ({why})"
            ),
            CertRefusal::OutOfDate => {
                format!("the applier's certificate has expired or is not valid yet ({why})")
            }
            CertRefusal::Other => format!("the applier's certificate was refused ({why})"),
        },
        Some(_) => format!(
            "the applier refused this shipper's certificate: is it signed by the CA the \
             applier trusts? ({why})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_ca_and_the_side() {
        let ca = Path::new("/etc/tidelog/tls/ca.pem");
        let local =
            "the cryptographic handshake failed: error 42: invalid peer certificate: BadSignature";
        let remote = format!("aborted by peer: {local}");
        assert_eq!(
            client_refused(local, Some(ca)),
            format!("shipper refused: its certificate is not signed by the configured CA (ca = /etc/tidelog/tls/ca.pem) ({local})")
        );
        assert_eq!(
            client_refused("invalid peer certificate: Expired", None),
            "shipper refused: its certificate is not acceptable (invalid peer certificate: Expired)"
        );
        assert_eq!(
            client_refused("timed out", None),
            "shipper handshake failed: timed out"
        );
        assert_eq!(
            server_refused(local, None, "localhost"),
            format!("the applier's certificate is not signed by the configured CA (ca = the configured CA) ({local})")
        );
        assert!(server_refused(&remote, Some(ca), "localhost")
            .starts_with("the applier refused this shipper's certificate"));
        assert_eq!(
            server_refused(
                "invalid peer certificate: NotValidForNameContext { .. }",
                None,
                "db"
            ),
            "the applier's certificate does not name \"db\" (server-name) (invalid peer certificate: NotValidForNameContext { .. })"
        );
        assert!(
            server_refused("invalid peer certificate: Expired", None, "db")
                .starts_with("the applier's certificate has expired")
        );
        assert_eq!(server_refused("timed out", None, "db"), "timed out");
    }
}
