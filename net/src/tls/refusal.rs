//! What an operator is told when TLS refuses the other end's certificate, instead of
//! "invalid peer certificate: BadSignature" or a "connection lost" for a connection that
//! never existed: the refusing end names the CA file it checked against, the refused end
//! hears that it was refused.

use std::path::Path;

/// Why TLS refused a peer's certificate, read from the error text rustls gives (which QUIC
/// carries as a connection's close reason): what an operator is told instead of
/// "invalid peer certificate: BadSignature".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CertRefusal {
    /// Not signed by the CA configured on the refusing end (`BadSignature`, `UnknownIssuer`).
    OtherCa,
    /// Valid, but for other names than the one asked for (`NotValidForName…`).
    WrongName,
    /// Expired, or not valid yet.
    OutOfDate,
    /// Refused for another reason (the text says which).
    Other,
}

impl CertRefusal {
    /// The refusal `text` describes, if it is one.
    pub fn of(text: &str) -> Option<CertRefusal> {
        let cert = text.contains("invalid peer certificate")
            || text.contains("peer sent no certificates")
            || text.contains("BadCertificate")
            || text.contains("UnknownCA")
            || text.contains("unknown ca")
            || text.contains("bad certificate")
            || text.contains("CertificateRequired");
        if !cert {
            return None;
        }
        Some(
            if ["BadSignature", "UnknownIssuer", "UnknownCA", "unknown ca"]
                .iter()
                .any(|w| text.contains(w))
            {
                CertRefusal::OtherCa
            } else if text.contains("NotValidForName") {
                CertRefusal::WrongName
            } else if text.contains("Expired") || text.contains("NotValidYet") {
                CertRefusal::OutOfDate
            } else {
                CertRefusal::Other
            },
        )
    }
}

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
    fn cert_refusals_are_read_from_rustls_texts() {
        let r = |t: &str| CertRefusal::of(t);
        assert_eq!(
            r("aborted by peer: the cryptographic handshake failed: error 42: invalid peer certificate: BadSignature"),
            Some(CertRefusal::OtherCa)
        );
        assert_eq!(
            r("invalid peer certificate: UnknownIssuer"),
            Some(CertRefusal::OtherCa)
        );
        assert_eq!(
            r("invalid peer certificate: NotValidForNameContext { expected: .. }"),
            Some(CertRefusal::WrongName)
        );
        assert_eq!(
            r("invalid peer certificate: Expired"),
            Some(CertRefusal::OutOfDate)
        );
        assert_eq!(r("timed out"), None);
    }

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
