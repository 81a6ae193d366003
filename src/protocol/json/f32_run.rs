//! Runs of FP32 array elements read 32 bytes at a time: the `data` of
//! a usual V2 JSON body is hundreds of plain decimals such as
//! `0.4523795545101166,` (what clients write for an f32 printed as an
//! f64), and reading them digit by digit was the largest cost of the
//! request path on an MLP after ONNX Runtime itself (see benches/README.md).
//!
//! For each `-?(0|[1-9][0-9]*)(\.[0-9]+)?` followed by a comma (and at most
//! one space), on x86-64 with AVX2 (and BMI1, BMI2, LZCNT):
//! - where each element ends comes from a 64-byte block's comma bits, so the
//!   next element's loads do not wait for this one's digits;
//! - one 32-byte load and compare finds the integer digits, the dot and the
//!   fraction digits (bit masks, no loop over the bytes);
//! - one shuffle drops the dot, and four multiply-adds turn the first 15 or
//!   16 digits into an integer `m`, so the value is about `m × 10^(a − 16)`
//!   (`a`: the integer digits);
//! - that is one multiplication in f64, and rounding it to f32 gives the f32
//!   nearest the decimal unless a point halfway between two f32s lies
//!   within the error. The error is at most a few f64 ulps, plus, when
//!   digits past the 15th were dropped, less than 10/m of the value (`m`
//!   at least 2^37: 11 or 12 significant digits kept; fewer stops the run).
//!   Within that margin of a halfway point (about 1 in 10^6 numbers with
//!   long fractions in [0.1, 1), 1 in 1,000 to 10,000 in [0.001, 0.01), 1
//!   in 10^8 short ones) the run stops.
//!
//! The usual element, `d.ddd…` (one integer digit: data in [0, 10)), takes
//! a shorter path (fewer instructions per element; benches/README.md has
//! the figures): the bytes up to the comma are checked
//! in one mask test, the dot is weighted 0 instead of shuffled out, the
//! value is `m × 10^-14` whatever the length, and the halfway margin comes
//! from `m`'s leading zeros without branches. Every path writes to the
//! vector's spare room and sets its sign without a branch (random signs
//! were a mispredicted branch each).
//!
//! Where the run stops (another token form, an exponent, whitespace other
//! than one space after the comma, the last element, the end of the body
//! within 128 bytes), the caller reads the element the usual way; so every
//! element gets the same f32, correctly rounded, and every body the same
//! answer or refusal as without this module. Other CPUs read every
//! element the usual way.

/// 10^0 ..= 10^-16, each the f64 nearest it (within half an ulp). A
/// `static`, not a `const`: read by index from a `const`, the compiler
/// copies the whole table to the stack for each element.
static NEG_POW10: [f64; 17] = [
    1e0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10, 1e-11, 1e-12, 1e-13, 1e-14, 1e-15,
    1e-16,
];

/// `r` rounded to f32, unless `r` lies within `margin` f64 ulps of a point
/// halfway between two f32s (then the decimal `r` approximates may round
/// the other way: `None`). `r` must be zero or an f32 normal, so that
/// rounding drops exactly the f64's 29 low bits; halfway is 1 then 28
/// zeros in them.
#[inline(always)]
fn f32_unless_near_halfway(r: f64, margin: u64) -> Option<f32> {
    const HALF: i64 = 1 << 28;
    let low = (r.to_bits() & ((1 << 29) - 1)) as i64;
    if (low - HALF).unsigned_abs() <= margin {
        return None;
    }
    Some(r as f32)
}

/// Reads elements `number,` from the front of `b` while it can (see the
/// module doc), at most `room` of them, appending their values to `out`.
/// Returns the bytes read: 0, or up to just after a comma (and one space),
/// where the next element starts.
#[inline]
pub(super) fn run(b: &[u8], out: &mut Vec<f32>, room: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("bmi1")
            && std::arch::is_x86_feature_detected!("bmi2")
            && std::arch::is_x86_feature_detected!("lzcnt")
        {
            // SAFETY: this CPU has AVX2 (and so SSSE3), BMI1, BMI2 and
            // LZCNT, the features `x86::run` needs beyond x86-64's SSE2.
            return unsafe { x86::run(b, out, room) };
        }
    }
    let _ = (b, out, room);
    0
}

/// The f32 nearest `m × 10^(a − 16)`, `a` in 1..=15, `m` < 10^16, from one
/// f64 multiplication; `truncated` when nonzero digits may follow those of
/// `m` (then the decimal is below `(m + 10) × 10^(a − 16)`). `None` where
/// that is not sure (see the module doc).
#[inline(always)]
fn to_f32(m: u64, a: usize, truncated: bool) -> Option<f32> {
    if m == 0 {
        return (!truncated).then_some(0.0);
    }
    // The digits dropped add less than 10/m of the value: under
    // 2^53 × 16/m ulps of the f64 (r below is in [2^E, 2^(E+1)), an ulp is
    // 2^(E − 52)). With 13 significant digits kept or more (m >= 10^13)
    // that is under 2^14 ulps; with 11 or 12 (m >= 2^37), under 2^20.
    let margin = match (truncated, m >= 10_000_000_000_000) {
        (false, _) => 4,
        (true, true) => (1 << 14) + 4,
        (true, false) if m >= 1 << 37 => (1 << 20) + 4,
        _ => return None,
    };
    // Exact but for three roundings of half an ulp: m (above 2^53 only just),
    // 10^-k, and the product. The value is at least 10^-14 and below 10^15:
    // an f32 normal, so rounding to f32 drops the f64's 29 low bits.
    let r = (m as i64) as f64 * NEG_POW10[16 - a];
    f32_unless_near_halfway(r, margin)
}

/// The f32 nearest `m × 10^-14` (`m` < 10^15: the digits of `d.ddd…`
/// with the dot dropped, 15 kept), or `None` where that is not sure;
/// `truncated` when digits past the 15th were dropped (then the decimal is
/// below `(m + 1) × 10^-14`). Branch-free but for its result: zero needs no
/// case (0.0 is far from any halfway point), and the margin grows with
/// the relative size of what was dropped.
#[inline(always)]
fn to_f32_units(m: u64, truncated: bool) -> Option<f32> {
    // Exact but for two roundings of half an ulp (10^-14 and the product;
    // m < 2^50 is exact). Dropped digits add less than 1/m of the value:
    // under 2^53/m ulps of the f64, and m >= 2^(63 - lz) makes that under
    // 2^(lz - 10). With m under 2^37 (fewer than 12 significant digits
    // kept, or zero) the margin passes the limit and the caller reads the
    // element the usual way.
    let lz = m.leading_zeros().min(63);
    let margin = 4 + (u64::from(truncated) << (lz - 10));
    // Past the limit, a margin that no `r` escapes (one branch, at the end).
    let margin = if margin > (1 << 16) + 4 { u64::MAX } else { margin };
    f32_unless_near_halfway((m as i64) as f64 * 1e-14, margin)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Shuffles that drop byte `a` (the dot) of 16: lanes before it stay,
    /// later ones move down one, and the last lane becomes zero. A `static`:
    /// a `const` table read by index may be copied to the stack at each use.
    static DROP: [[u8; 16]; 16] = {
        let mut t = [[0u8; 16]; 16];
        let mut a = 0;
        while a < 16 {
            let mut j = 0;
            while j < 16 {
                t[a][j] = if j < a {
                    j as u8
                } else if j < 15 {
                    j as u8 + 1
                } else {
                    0x80
                };
                j += 1;
            }
            a += 1;
        }
        t
    };
    const LANES: [i8; 16] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15];
    const W10: [i8; 16] = [10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1];
    const W100: [i16; 8] = [100, 1, 100, 1, 100, 1, 100, 1];
    const W10K: [i16; 8] = [10000, 1, 10000, 1, 10000, 1, 10000, 1];

    /// Bytes after an element's start that its loads may read (32) and
    /// that a block of commas covers (64), whichever is further.
    const READ_AHEAD: usize = 64;

    /// The commas of `b[at..at + 64]` as bits (bit k: byte `at + k`).
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn commas(b: &[u8], at: usize) -> u64 {
        let comma = _mm256_set1_epi8(b',' as i8);
        let mut bits = 0u64;
        for k in 0..2 {
            // SAFETY: the caller checked at + 64 <= b.len().
            let x = _mm256_loadu_si256(b.as_ptr().add(at + 32 * k).cast());
            bits |= u64::from(_mm256_movemask_epi8(_mm256_cmpeq_epi8(x, comma)) as u32) << (32 * k);
        }
        bits
    }

    /// Digit weights of `d.ddd…` (a dot at lane 1): lane 0 pairs with the
    /// dot at weight 0, so the eight pairs are the digit `d` and seven
    /// two-digit numbers, and the multiply-adds below give the 15 digits
    /// without moving the dot out first.
    const W10_DOT1: [i8; 16] = [1, 0, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1];

    /// Eight pairs of digits (as `_mm_maddubs_epi16` gives them) as the
    /// number they spell, 16 digits: 8 pairs → 4 groups of four → 2 of eight.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn spell(pairs: __m128i) -> u64 {
        let fours = _mm_madd_epi16(pairs, _mm_loadu_si128(W100.as_ptr().cast()));
        let eights = _mm_madd_epi16(
            _mm_packs_epi32(fours, fours),
            _mm_loadu_si128(W10K.as_ptr().cast()),
        );
        let hi = _mm_cvtsi128_si32(eights) as u32 as u64;
        let lo = _mm_cvtsi128_si32(_mm_srli_si128::<4>(eights)) as u32 as u64;
        hi * 100_000_000 + lo
    }

    /// See the module doc. Where each element ends comes from a block of
    /// comma bits, not from reading the element before it: the CPU works on
    /// several elements at once. Elements of the form `d.ddd…` (one integer
    /// digit: the usual data in [0, 10)) take a shorter path, checked
    /// against the comma in one mask test.
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt")]
    pub(super) unsafe fn run(b: &[u8], out: &mut Vec<f32>, room: usize) -> usize {
        let zero = _mm256_set1_epi8(b'0' as i8);
        let nine = _mm256_set1_epi8(9);
        let lanes = _mm_loadu_si128(LANES.as_ptr().cast());
        let w10 = _mm_loadu_si128(W10.as_ptr().cast());
        let w10_dot1 = _mm_loadu_si128(W10_DOT1.as_ptr().cast());
        let mut i = 0;
        // Elements are written to `out`'s spare capacity through `dst`,
        // and its length set once at the end. Each takes two bytes at
        // least (a digit and a comma): no more than that is reserved (the
        // caller has, usually).
        out.reserve(room.min(b.len() / 2));
        let len0 = out.len();
        let mut left = room.min(out.capacity() - len0);
        let dst = out.as_mut_ptr().add(len0);
        let mut n_out = 0;
        // Commas of the block from `base`, those before `i` cleared.
        let (mut base, mut pending) = (0, 0u64);
        while left > 0 {
            if pending == 0 {
                if i + 2 * READ_AHEAD > b.len() {
                    break;
                }
                (base, pending) = (i, commas(b, i));
                if pending == 0 {
                    break;
                }
            }
            let comma = base + pending.trailing_zeros() as usize;
            pending &= pending - 1;
            // SAFETY (this and every read below): the element starts within
            // the block or just after one of its commas and a space, so
            // i <= base + 65, and no read reaches s + 33 <= i + 34 <= base + 99
            // < base + 2 * READ_AHEAD <= b.len().
            let neg = *b.get_unchecked(i) == b'-';
            let s = i + usize::from(neg);
            let d = _mm256_sub_epi8(_mm256_loadu_si256(b.as_ptr().add(s).cast()), zero);
            // Digits are the bytes that became 0..=9.
            let digits = _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_min_epu8(d, nine), d)) as u32;
            let d0 = _mm256_castsi256_si128(d);
            // The element's bytes, up to the comma (wraps past it when the
            // comma comes first: then it is no element).
            let len = comma.wrapping_sub(s);
            let x = if *b.get_unchecked(s + 1) == b'.' && len.wrapping_sub(3) < 29 {
                // `d.` and 1 to 29 digits, and nothing else before the comma.
                let full = _bzhi_u32(u32::MAX, len as u32);
                if (digits | 2) & full != full {
                    break;
                }
                let live = _mm_cmpgt_epi8(_mm_set1_epi8(len.min(16) as i8), lanes);
                let pairs = _mm_maddubs_epi16(_mm_and_si128(d0, live), w10_dot1);
                super::to_f32_units(spell(pairs), len > 16)
            } else {
                general(b, s, digits, d0, comma, lanes, w10)
            };
            let Some(x) = x else {
                break;
            };
            // The sign without a branch: data in [-1, 1) has random signs.
            dst.add(n_out)
                .write(f32::from_bits(x.to_bits() | (u32::from(neg) << 31)));
            n_out += 1;
            left -= 1;
            i = comma + 1;
            if *b.get_unchecked(i) == b' ' {
                // One space after the comma (Python's `json.dumps`); the
                // block's bits past it stay valid.
                i += 1;
            }
        }
        // SAFETY: the `n_out` elements after `len0` were written above,
        // within the capacity (`left` started at most at the spare room).
        out.set_len(len0 + n_out);
        i
    }

    /// Any other element: `a` integer digits (1 to 15, no leading zero),
    /// then optionally a dot and digits, ending at `comma`; `d0` its first
    /// 16 bytes less `'0'`, `digits` the digit bits of its first 32.
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn general(
        b: &[u8],
        s: usize,
        digits: u32,
        d0: __m128i,
        comma: usize,
        lanes: __m128i,
        w10: __m128i,
    ) -> Option<f32> {
        let a = (!digits).trailing_zeros() as usize;
        // No digit, a leading zero (JSON has none), or 16 integer digits.
        if a == 0 || a >= 16 || (a > 1 && *b.get_unchecked(s) == b'0') {
            return None;
        }
        let (end, frac) = if *b.get_unchecked(s + a) == b'.' {
            let frac = (!(digits >> (a + 1))).trailing_zeros() as usize;
            // "1." is no JSON number.
            if frac == 0 {
                return None;
            }
            (a + 1 + frac, frac)
        } else {
            (a, 0)
        };
        // The element is exactly the bytes up to the comma ("1 ," ends
        // before it).
        if s + end != comma {
            return None;
        }
        let n = a + frac;
        let (kept, y) = match frac {
            0 => (n, d0),
            _ => (
                n.min(15),
                _mm_shuffle_epi8(d0, _mm_loadu_si128(DROP[a].as_ptr().cast())),
            ),
        };
        let y = _mm_and_si128(y, _mm_cmpgt_epi8(_mm_set1_epi8(kept as i8), lanes));
        super::to_f32(spell(_mm_maddubs_epi16(y, w10)), a, n > kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::json::Rng;

    /// Reads `texts` as one array (elements joined by `sep`) the way
    /// `leaves` does: `run` from each element start, and where it stops,
    /// that element skipped as the usual path would read it. Every element
    /// `run` reads must be the standard library's f32 of its text, and it
    /// must stop exactly after a separator. Returns how many it read.
    fn check(texts: &[String], sep: &str) -> usize {
        let mut body = texts.join(sep);
        body.push_str(&format!("]{}", " ".repeat(130)));
        let b = body.as_bytes();
        let (mut at, mut next, mut read) = (0, 0, 0);
        let mut out = Vec::new();
        while next < texts.len() {
            let n = run(&b[at..], &mut out, texts.len() - next);
            let from = at;
            for x in out.drain(..) {
                let t = &texts[next];
                let want: f32 = t.parse().unwrap();
                assert_eq!(x.to_bits(), want.to_bits(), "{t}: {x} vs {want}");
                assert_eq!(&body[at..at + t.len() + sep.len()], format!("{t}{sep}"));
                at += t.len() + sep.len();
                next += 1;
                read += 1;
            }
            assert_eq!(from + n, at, "it read up to the next element");
            if n == 0 {
                // Stopped here: the usual path reads this element.
                at += texts[next].len() + sep.len();
                next += 1;
            }
        }
        read
    }

    #[test]
    fn every_element_read_is_the_nearest_f32() {
        let mut rng = Rng(0x5eed);
        let mut texts = Vec::new();
        for _ in 0..200_000 {
            let bits = rng.next();
            let x = f32::from_bits(bits as u32);
            let t = match bits >> 60 {
                // f32 values as f64 text (what serde_json writes for an f32).
                0..=5 => format!("{}", f64::from((bits as u32 >> 9) as f32 / (1u32 << 23) as f32)),
                6 | 7 => format!("{}", f64::from(x)),
                8 => format!("{x}"),
                9 => format!("{:.20}", (bits % 1_000_000) as f64 / 1e6),
                10 => format!("{}", (bits % 100_000) as i64 - 50_000),
                11 => format!("{:.3}", (bits % 10_000_000) as f64 / 97.0),
                12 => format!("0.{:019}", bits % 10u64.pow(19)),
                13 => format!("-0.00{}", bits % 1_000_000_000_000),
                _ => format!("{}", f64::from_bits(bits)),
            };
            if t.parse::<f32>().is_ok_and(f32::is_finite) {
                texts.push(t);
            }
        }
        for sep in [",", ", "] {
            let read = check(&texts, sep);
            // Most of them are read here (the rest: exponents, long integers).
            if cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("bmi2") {
                assert!(read > texts.len() / 2, "read {read} of {}", texts.len());
            }
        }
    }

    #[test]
    fn one_digit_then_a_dot_at_every_length() {
        // `d.` and 1 to 29 digits (3 to 31 bytes: the short path; 32 bytes
        // and more go the general way and stop), fractions with runs of
        // zeros (few significant digits kept: the margin grows, or the
        // element goes the usual way), signs, and halfway points.
        let mut rng = Rng(0xd07);
        let mut texts = Vec::new();
        for _ in 0..20_000 {
            let digits = 1 + rng.below(32);
            let zeros = rng.below(digits + 1);
            let mut t = String::new();
            if rng.below(3) == 0 {
                t.push('-');
            }
            t.push(char::from(
                b'0' + rng.below(10) as u8 * u8::from(rng.below(2) == 0),
            ));
            t.push('.');
            for k in 0..digits {
                let d = if k < zeros { 0 } else { rng.below(10) as u8 };
                t.push(char::from(b'0' + d));
            }
            texts.push(t);
        }
        for t in [
            "0.0",
            "-0.0",
            "0.00000000000000000000",
            "9.999999999999999999",
            "1.00000005960464477539",
        ] {
            texts.push(t.to_string());
        }
        for sep in [",", ", "] {
            let read = check(&texts, sep);
            if cfg!(target_arch = "x86_64") && std::arch::is_x86_feature_detected!("bmi2") {
                assert!(read > texts.len() / 2, "read {read} of {}", texts.len());
            }
        }
    }

    #[test]
    fn halfway_and_edge_values() {
        let texts: Vec<String> = [
            // Exactly halfway between two f32s (1 + 2^-24), and just beside it.
            "1.000000059604644775390625",
            "1.0000000596046448",
            "1.0000000596046447",
            "0.5",
            "-0",
            "-0.0",
            "0",
            "0.0000000000000000000001",
            "0.00000000000001",
            "999999999999999.9",
            "123456789012345",
            "16777217",
            "16777216.5",
            "3.4028234",
            "0.1",
            "-7",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        check(&texts, ",");
    }

    #[test]
    fn only_json_numbers_followed_by_a_comma_are_read() {
        for bad in [
            "01,", "-,", ".5,", "1.,", "1e5,", "1 ,", "1]", "+1,", "--1,", "1.5.5,", "00.5,", "-01,", "1\n,",
        ] {
            let body = format!("{bad}{}", " ".repeat(48));
            let mut out = Vec::new();
            assert_eq!(run(body.as_bytes(), &mut out, 10), 0, "{bad}");
            assert!(out.is_empty());
        }
        // At most `room` elements, and nothing within 40 bytes of the end.
        let body = format!("1,2,3,4,{}", " ".repeat(40));
        let mut out = Vec::new();
        let n = run(body.as_bytes(), &mut out, 2);
        if !out.is_empty() {
            assert_eq!((n, &out[..]), (4, &[1.0, 2.0][..]));
        }
        assert_eq!(run(b"1,2,3", &mut out, 9), 0);
    }

    /// Every f32 of [2^k, 2^(k+1)) for the binades that clients' data sits
    /// in most, as serde_json writes an f32 (its f64's shortest text) and as
    /// its own shortest text, and negated: about 330 million numbers, so run by hand:
    /// `cargo test --release --lib f32_run -- --ignored`.
    #[test]
    #[ignore]
    fn every_f32_of_the_usual_binades_as_clients_write_it() {
        let mut read = 0;
        for k in -12..1 {
            let lo = (2f32).powi(k).to_bits();
            let texts: Vec<String> = (lo..lo + (1 << 23))
                .flat_map(|bits| {
                    let x = f32::from_bits(bits);
                    [format!("{}", f64::from(x)), format!("{x}"), format!("-{x}")]
                })
                .collect();
            read += check(&texts, ",");
        }
        eprintln!("read {read} numbers");
    }
}
