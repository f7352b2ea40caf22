//! What a TLS refusal of a peer's certificate means, read from the text rustls gives.

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
}
