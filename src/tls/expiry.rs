//! When a certificate expires: its `notAfter`, read by `x509-parser`.
//! rustls has already parsed and accepted the certificate when this runs.

/// The certificate's `notAfter` in seconds since the Unix epoch; `None` if
/// `der` is not an X.509 certificate.
pub(crate) fn not_after(der: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert_expiring(year: i32, month: u8, day: u8) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_after = rcgen::date_time_ymd(year, month, day);
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_not_after_of_real_certificates() {
        // UTCTime (before 2050) and GeneralizedTime (from 2050); the
        // expected seconds are what `date -ud <that day> +%s` prints.
        assert_eq!(not_after(&cert_expiring(2031, 7, 15)), Some(1_941_840_000));
        assert_eq!(not_after(&cert_expiring(2061, 2, 28)), Some(2_876_774_400));
    }

    #[test]
    fn garbage_is_no_certificate() {
        assert_eq!(not_after(b"not a certificate"), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(not_after(&[]), None);
    }
}
