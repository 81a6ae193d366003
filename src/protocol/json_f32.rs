//! FP32 values written as JSON text, the same bytes sluice has always sent
//! (Rust's shortest `Display` of the f32, read back as an f64 and written by
//! serde_json) at a quarter of the cost: zmij's shortest f32 text, which
//! differs from Rust's only where two shortest decimals are equally near the
//! f32 (Rust takes the larger, zmij the even one: 1.06640625 is "1.0664063"
//! in Rust and "1.0664062" in zmij), and in where it switches to exponent
//! notation. Ties are detected exactly, and they and magnitudes outside
//! [1.1e-5, 9e11) (zero aside) are written the old way. `examples/f32_text_exhaustive.rs` checks every finite
//! f32 against the old way; unit tests check a sample and every tie in a
//! band of binades.
//!
//! Everything else about the text is serde_json's compact formatting: a
//! value is written as JSON with [`to_writer`], whose formatter this is.

use std::io;

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter};

/// serde_json's compact formatter, with FP32 numbers as described above.
/// NaN and infinities never reach it (serde_json writes `null` for them).
pub(crate) struct F32Text;

impl Formatter for F32Text {
    #[inline]
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, x: f32) -> io::Result<()> {
        // zmij writes f32s in plain decimals for exponents -6..=12 and f64s
        // for -5..=15; inside both (with a margin) the layouts agree.
        let a = x.abs();
        if (1.1e-5..9e11).contains(&a) || a == 0.0 {
            let mut buf = zmij::Buffer::new();
            let text = buf.format_finite(x);
            if !may_tie(x, text) {
                return w.write_all(text.as_bytes());
            }
        }
        CompactFormatter.write_f64(w, wide(x))
    }
}

/// Writes `value` as compact JSON, FP32 numbers by [`F32Text`].
pub(crate) fn to_writer<W: io::Write, T: ?Sized + Serialize>(w: W, value: &T) -> serde_json::Result<()> {
    value.serialize(&mut serde_json::Serializer::with_formatter(w, F32Text))
}

/// The f64 that an f32 has always been written as: the f64 nearest Rust's
/// shortest decimal for it (0.1, not 0.10000000149011612).
pub(crate) fn wide(x: f32) -> f64 {
    // Rust's shortest form written to the stack: no allocation.
    struct Stack([u8; 64], usize);
    impl std::fmt::Write for Stack {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            let end = self.1 + s.len();
            self.0
                .get_mut(self.1..end)
                .ok_or(std::fmt::Error)?
                .copy_from_slice(s.as_bytes());
            self.1 = end;
            Ok(())
        }
    }
    let mut buf = Stack([0; 64], 0);
    if std::fmt::Write::write_fmt(&mut buf, format_args!("{x}")).is_err() {
        return f64::from(x);
    }
    std::str::from_utf8(&buf.0[..buf.1])
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::from(x))
}

/// Whether two shortest decimals may be equally near `x`, so that Rust and
/// zmij may pick different ones. That needs `x` to be a decimal with one
/// digit more than the shortest text (`text`, zmij's), ending in 5: so this
/// is true when `x`'s exact decimal expansion has at most 10 significant
/// digits (a shortest f32 text has at most 9) and more than `text` has.
/// Exact: `x = odd × 2^e`; for `e < 0` its expansion is `odd × 5^-e`
/// shifted, for `e ≥ 0` the integer `odd × 2^e`.
#[inline]
fn may_tie(x: f32, text: &str) -> bool {
    match exact_digits(x) {
        Some(d) => d > significant_digits(text),
        None => false,
    }
}

/// The number of significant decimal digits of `x`'s exact value, when it
/// is at most 10; `None` for more (and for zero).
fn exact_digits(x: f32) -> Option<u32> {
    let bits = x.to_bits();
    let exp = ((bits >> 23) & 0xff) as i32;
    let frac = bits & 0x7f_ffff;
    let (mant, e) = match exp {
        0 => (frac, -149),
        _ => (frac | 0x80_0000, exp - 150),
    };
    if mant == 0 {
        return None;
    }
    let tz = mant.trailing_zeros();
    let (odd, e) = (u128::from(mant >> tz), e + tz as i32);
    // Over 10 significant digits, a fortiori over 10^10 once decimal
    // trailing zeros are gone: odd × 5^k ≥ 5^k, and 2^e / 10^(its 5s) ≥ 2^e / 5^10.
    let mut v = if e < 0 {
        let k = e.unsigned_abs();
        if k > 14 {
            return None;
        }
        odd * 5u128.pow(k)
    } else {
        if e > 60 {
            return None;
        }
        odd << e
    };
    while v % 10 == 0 {
        v /= 10;
    }
    (v < 10_000_000_000).then(|| v.checked_ilog10().map_or(1, |l| l + 1))
}

/// Significant digits in a decimal text such as `1.0664062`, `100.0`,
/// `0.001`, `1.5e-7`: the digits of its significand without leading or
/// trailing zeros.
fn significant_digits(text: &str) -> u32 {
    let sig = text.split(['e', 'E']).next().unwrap_or(text);
    let digits = || sig.bytes().filter(u8::is_ascii_digit);
    let lead = digits().take_while(|&d| d == b'0').count();
    let trail = digits().rev().take_while(|&d| d == b'0').count();
    digits().count().saturating_sub(lead + trail) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text sluice has always written for an f32.
    fn old(x: f32) -> String {
        serde_json::to_string(&x.to_string().parse::<f64>().unwrap()).unwrap()
    }

    fn new(x: f32) -> String {
        let mut out = Vec::new();
        to_writer(&mut out, &x).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn ties_are_written_as_rust_writes_them() {
        for (x, text) in [
            (f32::from_bits(0x3f88_8000), "1.0664063"),
            (f32::from_bits(0x3f8a_8000), "1.0820313"),
            (f32::from_bits(0x4a00_d289), "2110626.3"),
            (0.5, "0.5"),
            (1.0, "1.0"),
            (0.0, "0.0"),
            (-0.0, "-0.0"),
            (100.0, "100.0"),
            (16_777_216.0, "16777216.0"),
        ] {
            assert_eq!(new(x), text, "{x}");
            assert_eq!(old(x), text, "{x}");
        }
    }

    #[test]
    fn every_f32_in_a_band_of_binades_and_a_random_sample_match_the_old_text() {
        // Every f32 in [1, 2) with the low 10 bits zero (all of that band's
        // short exact values, the ties among them), and 8 low-bit patterns
        // of every binade's values; a random sample over all bits.
        let band = (0x3f80_0000u32..0x4000_0000).step_by(1 << 10);
        let binades = (0u32..0x7f80_0000)
            .step_by(1 << 20)
            .flat_map(|b| (0..8).map(move |i| b | (i << 17)));
        let mut s = 0x2545_f491u32;
        let random = (0..300_000).map(move |_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        });
        for bits in band.chain(binades).chain(random) {
            let x = f32::from_bits(bits);
            if x.is_finite() {
                assert_eq!(new(x), old(x), "{x:e} ({bits:#x})");
            }
        }
    }

    #[test]
    fn exact_digits_counts_the_exact_expansion() {
        assert_eq!(exact_digits(0.5), Some(1));
        assert_eq!(exact_digits(f32::from_bits(0x3f88_8000)), Some(9));
        assert_eq!(exact_digits(1000.0), Some(1));
        assert_eq!(exact_digits(0.1), None);
        assert_eq!(exact_digits(0.0), None);
        assert_eq!(exact_digits(1.5e30), None);
        assert_eq!(significant_digits("1.0664062"), 8);
        assert_eq!(significant_digits("100.0"), 1);
        assert_eq!(significant_digits("0.00105"), 3);
        assert_eq!(significant_digits("1.5e-7"), 2);
    }
}
