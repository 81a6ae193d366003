//! When a certificate expires: its `notAfter`, read from the DER by a walk of
//! the few elements before it (X.509's `TBSCertificate`: version, serial,
//! signature algorithm, issuer, validity), so that no X.509 parser is needed
//! for one field. rustls has already parsed the certificate when this runs.

/// The certificate's `notAfter` in seconds since the Unix epoch; `None` if
/// `der` is not a certificate this walk understands.
pub(crate) fn not_after(der: &[u8]) -> Option<i64> {
    let (0x30, certificate, _) = element(der)? else {
        return None;
    };
    let (0x30, tbs, _) = element(certificate)? else {
        return None;
    };
    let mut rest = tbs;
    // The version is explicit ([0]) and absent in a v1 certificate.
    if let (0xa0, _, after) = element(rest)? {
        rest = after;
    }
    // The serial number, the signature algorithm, the issuer.
    for _ in 0..3 {
        rest = element(rest)?.2;
    }
    let (0x30, validity, _) = element(rest)? else {
        return None;
    };
    let (_, _, after_not_before) = element(validity)?;
    let (tag, time, _) = element(after_not_before)?;
    time_seconds(tag, time)
}

/// One DER element at the start of `der`: its tag, its contents, what follows.
fn element(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |len, &b| len << 8 | usize::from(b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`), the two forms RFC 5280 allows, in Unix seconds.
fn time_seconds(tag: u8, time: &[u8]) -> Option<i64> {
    let digits = time.strip_suffix(b"Z")?;
    if !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let num = |from: usize, len: usize| -> Option<i64> {
        let s = std::str::from_utf8(digits.get(from..from + len)?).ok()?;
        s.parse().ok()
    };
    let (year, rest) = match (tag, digits.len()) {
        (0x17, 12) => {
            let yy = num(0, 2)?;
            (if yy < 50 { 2000 + yy } else { 1900 + yy }, 2)
        }
        (0x18, 14) => (num(0, 4)?, 4),
        _ => return None,
    };
    let (month, day) = (num(rest, 2)?, num(rest + 2, 2)?);
    let (hour, minute, second) = (num(rest + 4, 2)?, num(rest + 6, 2)?, num(rest + 8, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to the given date of the proleptic Gregorian
/// calendar (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let year_of_era = y - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
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
        // UTCTime (before 2050) and GeneralizedTime (from 2050).
        assert_eq!(not_after(&cert_expiring(2031, 7, 15)), Some(1_941_840_000));
        assert_eq!(not_after(&cert_expiring(2061, 2, 28)), Some(2_876_774_400));
    }

    #[test]
    fn dates_and_garbage() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        assert_eq!(time_seconds(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time_seconds(0x17, b"500101000000Z"), Some(-631_152_000));
        assert_eq!(time_seconds(0x17, b"5001010000+0Z"), None);
        assert_eq!(time_seconds(0x18, b"20311301000000Z"), None);
        assert_eq!(not_after(b"not a certificate"), None);
        assert_eq!(not_after(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]), None);
    }
}
