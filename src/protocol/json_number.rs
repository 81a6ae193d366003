//! The common JSON number tokens of tensor `data`, parsed in one pass and
//! exactly: a short decimal (at most 19 significant digits) whose value
//! ONNX Runtime's float types hold after one correctly rounded operation
//! (Clinger's fast path). Anything else (long decimals, huge exponents,
//! subnormals, the rare FP32 halfway case) returns `None`, and the caller
//! falls back to the standard library's parsers, which are exact for every
//! input but cost about three times as much on the short ones.
//!
//! The FP32 path computes an f64 within two f64 ulps of the decimal and
//! rounds that to f32: that gives the f32 nearest the decimal unless a point
//! halfway between two f32s lies within those ulps, a case it detects and
//! hands to the fallback (see [`Decimal::to_f32`]).

/// 10^0 ..= 10^22: every power of ten an f64 holds exactly.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18,
    1e19, 1e20, 1e21, 1e22,
];

/// 10^0 ..= 10^-22, each the f64 nearest it (within half an ulp). A
/// `static`, not a `const`: read by index from a `const`, the compiler
/// copies the whole table to the stack for each element of `v2_scan::f32_run`.
pub(super) static NEG_POW10: [f64; 23] = [
    1e0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13, 1e-14, 1e-15,
    1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22,
];

/// A JSON number token read from the front of a byte string: the value is
/// `(-1)^neg × m × 10^e`, and the token is `len` bytes long.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Decimal {
    pub neg: bool,
    pub m: u64,
    pub e: i32,
    pub len: usize,
    /// The token had a fraction or an exponent (`2.0`, `2e3`), not only digits.
    pub real: bool,
}

/// Reads the JSON number at the front of `b` (`-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?`,
/// leading zeros tolerated), or `None` when `b` does not start with one, it
/// has more than 19 significant digits, or the byte after it is not one that
/// may follow a number in an array (`,` `]` whitespace, or the end).
#[inline(always)]
pub(super) fn scan(b: &[u8]) -> Option<Decimal> {
    let neg = b.first() == Some(&b'-');
    let mut i = usize::from(neg);
    let mut acc = Digits::default();
    let start = i;
    i = acc.run(b, i, false)?;
    if i == start {
        return None;
    }
    let mut real = false;
    if b.get(i) == Some(&b'.') {
        let from = i + 1;
        i = acc.run(b, from, true)?;
        if i == from {
            return None;
        }
        real = true;
    }
    let Digits { m, mut e, .. } = acc;
    if matches!(b.get(i), Some(b'e' | b'E')) {
        i += 1;
        let sign = match b.get(i) {
            Some(b'-') => -1,
            Some(b'+') => 1,
            _ => 0,
        };
        i += usize::from(sign != 0);
        let from = i;
        let mut x = 0i32;
        while let Some(d) = b.get(i).and_then(|c| c.checked_sub(b'0')).filter(|d| *d < 10) {
            x = (x * 10 + i32::from(d)).min(1_000_000);
            i += 1;
        }
        if i == from {
            return None;
        }
        e += if sign < 0 { -x } else { x };
        real = true;
    }
    match b.get(i) {
        None | Some(b',' | b']' | b' ' | b'\n' | b'\r' | b'\t') => Some(Decimal {
            neg,
            m,
            e,
            len: i,
            real,
        }),
        _ => None,
    }
}

/// The significand being read: at most 19 significant digits (leading
/// zeros do not count), and the exponent that fraction digits lower.
#[derive(Default)]
struct Digits {
    m: u64,
    e: i32,
}

impl Digits {
    /// Reads the run of digits from `b[i..]`, eight at a time where it can;
    /// gives the index after it, or `None` past 19 significant digits. The
    /// significant digits read so far are those of `m` (leading zeros add
    /// none), so the limit is a bound on `m`.
    #[inline(always)]
    fn run(&mut self, b: &[u8], mut i: usize, frac: bool) -> Option<usize> {
        while let Some(chunk) = b.get(i..i + 8).and_then(eight_digits) {
            // 12 digits or more, and eight more: past 19.
            if self.m >= 100_000_000_000 {
                return None;
            }
            self.m = self.m * 100_000_000 + chunk;
            self.e -= 8 * i32::from(frac);
            i += 8;
        }
        while let Some(d) = b.get(i).map(|c| c.wrapping_sub(b'0')).filter(|d| *d < 10) {
            if self.m != 0 || d != 0 {
                // 19 digits already.
                if self.m >= 1_000_000_000_000_000_000 {
                    return None;
                }
                self.m = self.m * 10 + u64::from(d);
            }
            self.e -= i32::from(frac);
            i += 1;
        }
        Some(i)
    }
}

/// The value of eight ASCII digits (little-endian load, SWAR), or `None`
/// when any of the eight bytes is not a digit.
#[inline(always)]
fn eight_digits(b: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(b.try_into().ok()?);
    let high = 0xF0F0_F0F0_F0F0_F0F0u64;
    if (v & high) | (((v.wrapping_add(0x0606_0606_0606_0606)) & high) >> 4) != 0x3333_3333_3333_3333 {
        return None;
    }
    let v = v - 0x3030_3030_3030_3030;
    let v = v.wrapping_mul(10).wrapping_add(v >> 8);
    let mask = 0x0000_00FF_0000_00FFu64;
    let v = ((v & mask).wrapping_mul(100 + (1_000_000 << 32)))
        .wrapping_add(((v >> 16) & mask).wrapping_mul(1 + (10_000 << 32)))
        >> 32;
    Some(v)
}

impl Decimal {
    /// The f64 nearest the decimal when one IEEE operation on exact operands
    /// gives it (significand ≤ 2^53, |exponent| ≤ 22).
    #[inline(always)]
    pub fn to_f64(self) -> Option<f64> {
        let x = if self.m == 0 {
            0.0
        } else if self.m > 1 << 53 {
            return None;
        } else if (0..=22).contains(&self.e) {
            self.m as f64 * POW10[self.e as usize]
        } else if (-22..0).contains(&self.e) {
            self.m as f64 / POW10[-self.e as usize]
        } else {
            return None;
        };
        Some(if self.neg { -x } else { x })
    }

    /// The f32 nearest the decimal, from an f64 within three ulps of it: the
    /// significand as an f64 (rounded once when it has more than 53 bits,
    /// as the 17 digits that clients write for an f32 often do), times an
    /// exact power of ten or an f64 within half an ulp of a negative one
    /// (rounded again: three roundings of at most half an ulp each; a
    /// multiplication, because a division cost a third of the time of a
    /// 784-float body). An f32 is 29 f64 bits
    /// shorter, so unless that f64 lies within a few ulps of a point halfway
    /// between two f32s, the decimal and the f64 round to the same f32;
    /// near such a point (and outside f32's normal range) this gives `None`.
    #[inline(always)]
    pub fn to_f32(self) -> Option<f32> {
        if self.m == 0 {
            return Some(if self.neg { -0.0 } else { 0.0 });
        }
        // One instruction from i64 (x86 has no u64 conversion); the 19-digit
        // significands past i64::MAX take the longer way.
        let m = match i64::try_from(self.m) {
            Ok(m) => m as f64,
            Err(_) => self.m as f64,
        };
        let r = match self.e {
            0..=22 => m * POW10[self.e as usize],
            -22..=-1 => m * NEG_POW10[-self.e as usize],
            _ => return None,
        };
        if !(f64::from(f32::MIN_POSITIVE)..=f64::from(f32::MAX)).contains(&r) {
            return None;
        }
        let x = f32_unless_near_halfway(r, 4)?;
        Some(if self.neg { -x } else { x })
    }

    /// The integer when the token was digits only and fits an i64.
    pub fn to_i64(self) -> Option<i64> {
        if self.real || self.m > i64::MAX as u64 {
            return None;
        }
        let m = self.m as i64;
        Some(if self.neg { -m } else { m })
    }
}

/// `r` rounded to f32, unless `r` lies within `margin` f64 ulps of a point
/// halfway between two f32s (then the decimal `r` approximates may round
/// the other way: `None`). `r` must be zero or an f32 normal, so that
/// rounding drops exactly the f64's 29 low bits; halfway is 1 then 28
/// zeros in them. Every fast FP32 parser here ends with this check.
#[inline(always)]
pub(super) fn f32_unless_near_halfway(r: f64, margin: u64) -> Option<f32> {
    const HALF: i64 = 1 << 28;
    let low = (r.to_bits() & ((1 << 29) - 1)) as i64;
    if (low - HALF).unsigned_abs() <= margin {
        return None;
    }
    Some(r as f32)
}

/// A seeded xorshift generator for the tests of the number parsers.
#[cfg(test)]
pub(super) struct Rng(pub u64);

#[cfg(test)]
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_of(s: &str) -> Option<f32> {
        scan(s.as_bytes()).and_then(Decimal::to_f32)
    }

    fn f64_of(s: &str) -> Option<f64> {
        scan(s.as_bytes()).and_then(Decimal::to_f64)
    }

    /// The fast path agrees with the standard library bit for bit, wherever it answers.
    fn check(s: &str) -> (bool, bool) {
        let f = f32_of(s);
        if let Some(x) = f {
            let want: f32 = s.parse().unwrap();
            assert_eq!(x.to_bits(), want.to_bits(), "f32 {s}");
        }
        let d = f64_of(s);
        if let Some(x) = d {
            let want: f64 = s.parse().unwrap();
            assert_eq!(x.to_bits(), want.to_bits(), "f64 {s}");
        }
        (f.is_some(), d.is_some())
    }

    #[test]
    fn agrees_with_the_standard_library_on_random_floats_in_every_form() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let (mut fast32, mut fast64, mut total) = (0, 0, 0);
        for _ in 0..300_000 {
            let bits = rng.next();
            let x = f32::from_bits(bits as u32);
            let y = f64::from_bits(bits);
            let z = (bits >> 40) as f32 / (1u64 << 24) as f32;
            if !x.is_finite() || !y.is_finite() {
                continue;
            }
            let forms = [
                x.to_string(),
                format!("{x:e}"),
                format!("{x:.3}"),
                y.to_string(),
                format!("{y:e}"),
                format!("{:.17}", f64::from(x)),
                z.to_string(),
                format!("{:.12}", f64::from(z)),
                format!("{}", f64::from(z)),
                (bits as i64 >> (bits % 60)).to_string(),
            ];
            for s in &forms {
                let (a, b) = check(s);
                fast32 += usize::from(a);
                fast64 += usize::from(b);
                total += 1;
            }
        }
        // The forms real clients send mostly take the fast path.
        assert!(
            fast32 * 3 > total && fast64 * 3 > total,
            "{fast32} {fast64} of {total}"
        );
    }

    #[test]
    fn halfway_cases_go_to_the_fallback_and_short_ones_are_exact() {
        // 1 + 2^-24: exactly between 1 and the next f32; rounds to even (1.0).
        assert_eq!(f32_of("1.000000059604644775390625"), None);
        for s in [
            "16777217",
            "16777219",
            "3.4028235e38",
            "1.1754944e-38",
            "0.1",
            "-0",
            "0.000",
            "1e-7",
            // Eight digits at a time, with zeros before, inside and after.
            "0.00000000123456789012",
            "12345678.87654321",
            "00000000000000000000001",
            "1000000000000000000",
            "0.1000000000000000000",
            "9007199254740993",
            "9007199254740992e-22",
        ] {
            check(s);
        }
        for s in [
            "0.00000000123456789012",
            "12345678.87654321",
            "00000000000000000000001",
            "0.1",
        ] {
            assert_eq!(check(s), (true, true), "{s} took the slow path");
        }
        assert_eq!(scan(b"12345678901234567890123"), None);
        assert_eq!(
            scan(b"0.00000000123456789012").map(|d| (d.m, d.e)),
            Some((123456789012, -20))
        );
        // Decimals at, just below and just above points halfway between two
        // f32s, with up to 19 digits: never rounded the wrong way.
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for k in 0..20_000u64 {
            let a = match k < 2000 {
                true => 1.0f32 + k as f32 * f32::EPSILON,
                false => f32::from_bits((rng.next() as u32 >> 2) + (40 << 23)),
            };
            let mid = (f64::from(a) + f64::from(a.next_up())) / 2.0;
            for digits in [9, 12, 15, 16, 17, 18] {
                let s = format!("{mid:.digits$e}");
                let (mantissa, exp) = s.split_once('e').unwrap();
                let last = mantissa.as_bytes()[mantissa.len() - 1];
                for d in [last.saturating_sub(1).max(b'0'), last, (last + 1).min(b'9')] {
                    let t = format!("{}{}e{exp}", &mantissa[..mantissa.len() - 1], d as char);
                    if let Some(x) = f32_of(&t) {
                        assert_eq!(x.to_bits(), t.parse::<f32>().unwrap().to_bits(), "{t}");
                    }
                }
            }
        }
        assert_eq!(f32_of("-0").map(f32::to_bits), Some((-0.0f32).to_bits()));
        assert_eq!(f32_of("1e39"), None);
        assert_eq!(f32_of("1e-45"), None);
    }

    #[test]
    fn tokens_are_read_to_their_end_and_only_json_numbers_pass() {
        let d = scan(b"-12.50e+1, 3").unwrap();
        assert_eq!((d.neg, d.m, d.e, d.len, d.real), (true, 1250, -1, 9, true));
        assert_eq!(scan(b"7]").map(|d| (d.len, d.to_i64())), Some((1, Some(7))));
        assert_eq!(scan(b"2.0").and_then(Decimal::to_i64), None);
        assert_eq!(
            scan(b"-9223372036854775807").and_then(Decimal::to_i64),
            Some(-i64::MAX)
        );
        for bad in [
            "",
            "-",
            ".5",
            "1.",
            "1e",
            "1e+",
            "true",
            "\"1\"",
            "1x",
            "0x10",
            "NaN",
            "12345678901234567890",
        ] {
            assert_eq!(scan(bad.as_bytes()), None, "{bad}");
        }
    }
}
