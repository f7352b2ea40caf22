//! The validity period of a certificate, read by a small DER reader: `--check` and a start
//! refuse a certificate that expired or is not valid yet and warn about one that expires
//! within [`EXPIRY_WARNING`] ([`TlsMaterial::check_validity`]).

use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Result};

use super::{TlsFiles, TlsMaterial};

/// How long before a certificate expires `--check` and the start begin to warn.
pub const EXPIRY_WARNING: std::time::Duration = std::time::Duration::from_secs(30 * 86400);

impl TlsMaterial {
    /// Checks the validity period of this end's certificate (`tls.cert`) and of each CA
    /// certificate (`tls.ca`) at `now` (Unix seconds): one that has expired or is not valid
    /// yet fails (every handshake would), naming the key, the file and the date; one that
    /// expires within [`EXPIRY_WARNING`] is a warning. A validity this reader cannot find
    /// is a warning too (rustls parsed the certificate; only the dates are unknown).
    pub fn check_validity(&self, tls: &TlsFiles, now: i64) -> Result<Vec<String>> {
        let mut warnings = Vec::new();
        let own = self.chain.first().map(|c| ("cert", &tls.cert, c));
        for (key, path, cert) in own
            .into_iter()
            .chain(self.ca.iter().map(|c| ("ca", &tls.ca, c)))
        {
            match validity(cert) {
                Err(e) => warnings.push(format!(
                    "key \"tls.{key}\": {}: cannot read the certificate's validity ({e})",
                    path.display()
                )),
                Ok((from, until)) => {
                    if now > until {
                        bail!(
                            "key \"tls.{key}\": {}: the certificate expired on {}",
                            path.display(),
                            format_unix_date(until)
                        );
                    }
                    if now < from {
                        bail!(
                            "key \"tls.{key}\": {}: the certificate is not valid before {} \
                             (is the clock right?)",
                            path.display(),
                            format_unix_date(from)
                        );
                    }
                    let left = until - now;
                    if left < EXPIRY_WARNING.as_secs() as i64 {
                        warnings.push(format!(
                            "key \"tls.{key}\": {}: the certificate expires on {} (in {} days)",
                            path.display(),
                            format_unix_date(until),
                            left / 86400
                        ));
                    }
                }
            }
        }
        Ok(warnings)
    }
}

/// The current time as Unix seconds.
pub fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One DER element: its tag, its contents and what follows it.
fn der(buf: &[u8]) -> std::result::Result<(u8, &[u8], &[u8]), String> {
    let (&tag, rest) = buf.split_first().ok_or("truncated DER: no tag")?;
    let (&first, mut rest) = rest.split_first().ok_or("truncated DER: no length")?;
    let len = if first < 0x80 {
        usize::from(first)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(format!("bad DER length form 0x{first:02x}"));
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, &b| (a << 8) | usize::from(b));
        rest = &rest[n..];
        len
    };
    if rest.len() < len {
        return Err(format!(
            "truncated DER: element of {len} bytes, {} left",
            rest.len()
        ));
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// `notBefore` and `notAfter` of an X.509 certificate, as Unix seconds:
/// Certificate ::= SEQUENCE { tbsCertificate SEQUENCE { [0] version OPTIONAL, serialNumber,
/// signature, issuer, validity SEQUENCE { notBefore, notAfter }, … }, … }.
fn validity(cert: &[u8]) -> std::result::Result<(i64, i64), String> {
    const SEQUENCE: u8 = 0x30;
    let (tag, certificate, _) = der(cert)?;
    if tag != SEQUENCE {
        return Err(format!("certificate: tag 0x{tag:02x}, expected a SEQUENCE"));
    }
    let (tag, tbs, _) = der(certificate)?;
    if tag != SEQUENCE {
        return Err(format!(
            "tbsCertificate: tag 0x{tag:02x}, expected a SEQUENCE"
        ));
    }
    let mut rest = tbs;
    let (tag, _, after) = der(rest)?;
    if tag == 0xa0 {
        rest = after; // version
    }
    for field in ["serialNumber", "signature", "issuer"] {
        let (_, _, after) = der(rest).map_err(|e| format!("{field}: {e}"))?;
        rest = after;
    }
    let (tag, validity, _) = der(rest)?;
    if tag != SEQUENCE {
        return Err(format!("validity: tag 0x{tag:02x}, expected a SEQUENCE"));
    }
    let (t1, from, rest) = der(validity)?;
    let (t2, until, _) = der(rest)?;
    Ok((der_time(t1, from)?, der_time(t2, until)?))
}

/// A DER UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) as Unix seconds.
fn der_time(tag: u8, v: &[u8]) -> std::result::Result<i64, String> {
    let text = std::str::from_utf8(v).map_err(|_| "a time that is not ASCII".to_string())?;
    let digits = text
        .strip_suffix('Z')
        .filter(|d| d.bytes().all(|b| b.is_ascii_digit()))
        .ok_or_else(|| format!("time {text:?}: expected digits and Z"))?;
    let num = |r: std::ops::Range<usize>| -> i64 { digits[r].parse().unwrap_or(0) };
    let (year, at) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy = num(0..2);
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (0x18, 14) => (num(0..4), 4),
        _ => return Err(format!("time {text:?} with tag 0x{tag:02x}")),
    };
    let (month, day) = (num(at..at + 2), num(at + 2..at + 4));
    let (h, m, sec) = (
        num(at + 4..at + 6),
        num(at + 6..at + 8),
        num(at + 8..at + 10),
    );
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || sec > 60 {
        return Err(format!("time {text:?} out of range"));
    }
    Ok(days_from_civil(year, month, day) * 86400 + h * 3600 + m * 60 + sec)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Unix seconds as `YYYY-MM-DD` (UTC).
fn format_unix_date(t: i64) -> String {
    let z = t.div_euclid(86400) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::pki;

    #[test]
    fn dates_convert_both_ways() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(format_unix_date(951_868_800), "2000-03-01");
        assert_eq!(format_unix_date(0), "1970-01-01");
        // Every day of four centuries round-trips (leap years, 2000 and 2100 included).
        for day in (-1_000..146_097).step_by(7) {
            let t = day * 86400;
            let f = format_unix_date(t);
            let (y, m, d) = (&f[0..4], &f[5..7], &f[8..10]);
            let back = days_from_civil(y.parse().unwrap(), m.parse().unwrap(), d.parse().unwrap());
            assert_eq!(back, day, "{f}");
        }
        assert_eq!(der_time(0x17, b"491231235959Z").unwrap(), 2_524_607_999);
        assert_eq!(der_time(0x17, b"500101000000Z").unwrap(), -631_152_000);
        assert_eq!(der_time(0x18, b"20491231235959Z").unwrap(), 2_524_607_999);
        for (tag, bad) in [
            (0x17, &b"4912312359Z"[..]),
            (0x18, b"491231235959Z"),
            (0x17, b"491331235959Z"),
            (0x17, b"49123123595aZ"),
            (0x17, b"491231235959"),
            (0x17, b"\xff\xfe"),
        ] {
            assert!(der_time(tag, bad).is_err(), "{bad:?}");
        }
    }

    /// `certs init` certificates are valid from the start of this year for ten years:
    /// nothing to say today, a warning within 30 days of the end, an error past it or
    /// before the start — each naming the key, the file and the date.
    #[test]
    fn certificate_validity_is_checked_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tls");
        pki::init(&d, &[], false).unwrap();
        let cfg = TlsFiles::in_dir(&d, "shipper");
        let m = TlsMaterial::load(&cfg).unwrap();
        assert_eq!(
            m.check_validity(&cfg, unix_now()).unwrap(),
            Vec::<String>::new()
        );
        let (from, until) = validity(&m.chain[0]).unwrap();
        let year = format_unix_date(unix_now())[..4].parse::<i64>().unwrap();
        assert_eq!(format_unix_date(from), format!("{year:04}-01-01"));
        assert_eq!(format_unix_date(until), format!("{:04}-01-01", year + 10));
        assert_eq!(validity(&m.ca[0]).unwrap(), (from, until));

        let w = m.check_validity(&cfg, until - 10 * 86400).unwrap();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with("key \"tls.cert\"")
                && w[0].contains("shipper.pem")
                && w[0].contains(&format!("expires on {}-01-01 (in 10 days)", year + 10)),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("key \"tls.ca\"") && w[1].contains("ca.pem"),
            "{w:?}"
        );

        let e = format!("{:#}", m.check_validity(&cfg, until + 1).unwrap_err());
        assert!(
            e.starts_with("key \"tls.cert\"")
                && e.contains(&format!("expired on {}-01-01", year + 10)),
            "{e}"
        );
        let e = format!("{:#}", m.check_validity(&cfg, from - 1).unwrap_err());
        assert!(
            e.contains(&format!("not valid before {year:04}-01-01")),
            "{e}"
        );
    }

    /// Damaged or truncated DER gives an error, never a panic.
    #[test]
    fn validity_of_damaged_der_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("tls");
        pki::init(&d, &[], false).unwrap();
        let cert = super::super::load_certs(&d.join("applier.pem"))
            .unwrap()
            .remove(0);
        let bytes = cert.as_ref();
        for n in 0..bytes.len().min(400) {
            let _ = validity(&bytes[..n]);
        }
        assert!(validity(&bytes[..60]).is_err());
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..2000 {
            let mut b = bytes.to_vec();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % b.len();
                b[i] = (x >> 32) as u8;
            }
            let _ = validity(&b);
        }
        assert!(validity(b"").is_err());
        assert!(validity(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
    }
}
