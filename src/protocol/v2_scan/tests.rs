//! The one-pass reader against the serde path: on every body it accepts it
//! must give what `decode_request_serde` gives, bit for bit (compared through
//! `Debug`, so that -0.0 and 0.0 differ); on bodies it is meant for, it must
//! accept; and it must refuse (leave to serde) whatever it is not meant for.

use super::decode;
use crate::protocol::json::Rng;
use crate::protocol::v2_binary::decode_request_serde;

/// The serde path's request, as text for exact comparison.
fn serde(body: &str) -> Result<String, String> {
    decode_request_serde(body.as_bytes(), None, &crate::protocol::shm::NoRegions)
        .map(|d| format!("{:?}", d.request))
        .map_err(|e| e.to_string())
}

/// Asserts that the reader takes `body` and agrees with serde.
fn takes(body: &str) {
    let fast = decode(body.as_bytes()).unwrap_or_else(|| panic!("one-pass reader refused {body}"));
    assert_eq!(Ok(format!("{fast:?}")), serde(body), "{body}");
}

/// Asserts that the reader leaves `body` to serde.
fn leaves(body: &str) {
    assert!(decode(body.as_bytes()).is_none(), "one-pass reader took {body}");
}

/// A float's text in one of the forms clients write.
fn float_text(rng: &mut Rng) -> String {
    let x = f32::from_bits(rng.next() as u32 & 0x3fff_ffff) * if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
    let x = if x.is_finite() { x } else { 0.5 };
    match rng.below(7) {
        0 => format!("{x}"),
        1 => format!("{}", f64::from(x)),
        2 => format!("{:e}", f64::from(x)),
        3 => format!("{:.25}", f64::from(x) * 1e-3),
        4 => format!("{:.3E}", x),
        5 => format!("{}", rng.below(1000) as f32 / 64.0),
        _ => "-0.0".to_string(),
    }
}

/// A valid body with `rows` × `cols` elements of `datatype`, nested or flat,
/// with the keys and whitespace in one of several arrangements.
fn body(rng: &mut Rng, datatype: &str, rows: usize, cols: usize) -> String {
    let elem = |rng: &mut Rng| match datatype {
        "FP32" | "FP64" => float_text(rng),
        "UINT8" => rng.below(256).to_string(),
        "INT8" => (rng.below(256) as i64 - 128).to_string(),
        "INT64" => (rng.next() as i64).to_string(),
        "UINT64" => (rng.next() >> 1).to_string(),
        _ => (rng.below(60000) as i64 - 30000).to_string(),
    };
    let sep = [",", ", ", " ,\n "][rng.below(3)];
    let data = if rng.next() & 1 == 0 {
        let all: Vec<String> = (0..rows * cols).map(|_| elem(rng)).collect();
        format!("[{}]", all.join(sep))
    } else {
        let rows: Vec<String> = (0..rows)
            .map(|_| {
                let row: Vec<String> = (0..cols).map(|_| elem(rng)).collect();
                format!("[{}]", row.join(sep))
            })
            .collect();
        format!("[ {} ]", rows.join(sep))
    };
    let mut fields = vec![
        format!("\"name\": \"x\""),
        format!("\"shape\":[{rows},{cols}]"),
        format!("\"datatype\" : \"{datatype}\""),
    ];
    fields.rotate_left(rng.below(3));
    // `data` anywhere: last as tritonclient writes it, first as sorted keys put it.
    let at = rng.below(4);
    fields.insert(at, format!("\"data\":{data}"));
    let input = format!("{{{}}}", fields.join(sep));
    match rng.below(4) {
        0 => format!("{{\"inputs\":[{input}]}}"),
        1 => format!("{{\"id\":\"req-1\",\"inputs\":[{input}],\"outputs\":[{{\"name\":\"y\"}}]}}"),
        2 => format!(" {{ \"outputs\" : [ ] , \"inputs\" : [ {input} , {input} ] , \"id\" : \"é\" }} \n"),
        _ => format!("{{\"inputs\":[{input}],\"id\":\"\"}}"),
    }
}

#[test]
fn usual_bodies_are_read_in_one_pass_and_agree_with_serde() {
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    for datatype in [
        "FP32", "FP64", "INT64", "INT32", "INT16", "INT8", "UINT64", "UINT8",
    ] {
        for _ in 0..300 {
            let (rows, cols) = (rng.below(4), rng.below(6));
            takes(&body(&mut rng, datatype, rows, cols));
        }
    }
    takes(r#"{"inputs":[{"name":"x","shape":[2,0],"datatype":"FP32","data":[[],[]]}]}"#);
    takes(r#"{"inputs":[]}"#);
    takes(r#"{"inputs":[{"data":[1.5,-2],"datatype":"FP32","name":"x","shape":[1,2]}]}"#);
    takes(r#"{"inputs":[{"name":"x","shape":[],"datatype":"FP64","data":[7]}]}"#);
    // Every datatype, and integers written as integral floats: the element
    // reader is the serde path's own.
    let with = |input: &str| format!(r#"{{"inputs":[{{{input}}}]}}"#);
    takes(&with(
        r#""name":"x","shape":[2],"datatype":"BOOL","data":[true,false]"#,
    ));
    takes(&with(
        r#""name":"x","shape":[3],"datatype":"BYTES","data":["a","\u00e9[","é"]"#,
    ));
    takes(&with(r#""name":"x","shape":[1],"datatype":"FP16","data":[1.5]"#));
    takes(&with(r#""name":"x","shape":[1],"datatype":"BF16","data":[-2]"#));
    takes(&with(
        r#""name":"x","shape":[2],"datatype":"INT32","data":[2.0, 3e2]"#,
    ));
    let deep = format!("{}1{}", "[".repeat(40), "]".repeat(40));
    takes(&with(&format!(
        r#""name":"x","shape":[1],"datatype":"FP32","data":{deep}"#
    )));
    // More than 19 significant digits, subnormals, huge exponents: the
    // standard library's parse.
    takes(
        r#"{"inputs":[{"name":"x","shape":[4],"datatype":"FP32","data":[0.1234567890123456789012,1e-40,3.4e38,-0]}]}"#,
    );
    takes(
        r#"{"inputs":[{"name":"x","shape":[3],"datatype":"FP64","data":[1e-320,1.7976931348623157e308,12345678901234567890123]}]}"#,
    );
}

#[test]
fn unusual_bodies_are_left_to_serde() {
    let with = |input: &str| format!(r#"{{"inputs":[{{{input}}}]}}"#);
    let base = r#""name":"x","shape":[2],"datatype":"FP32""#;
    for body in [
        // Keys it does not read.
        with(&format!(r#"{base},"data":[1,2],"parameters":{{}}"#)),
        format!(r#"{{"inputs":[{{{base},"data":[1,2]}}],"parameters":{{"binary_data_output":true}}}}"#),
        with(&format!(r#"{base},"data":[1,2],"extra":1"#)),
        format!(r#"{{"inputs":[{{{base},"data":[1,2]}}],"outputs":[{{"name":"y","parameters":{{}}}}]}}"#),
        // A repeated key, escapes, null.
        with(&format!(r#"{base},"data":[1,2],"data":[1,2]"#)),
        with(r#""data":[1,2],"name":"x","data":[1,2],"shape":[2],"datatype":"FP32""#),
        with(r#""name":"x\u0031","shape":[2],"datatype":"FP32","data":[1,2]"#),
        format!(r#"{{"id":null,"inputs":[{{{base},"data":[1,2]}}]}}"#),
        // A datatype that does not exist; elements out of range.
        with(r#""name":"x","shape":[1],"datatype":"FLOAT","data":[1]"#),
        with(r#""name":"x","shape":[1],"datatype":"UINT8","data":[256]"#),
        with(r#""name":"x","shape":[1],"datatype":"UINT8","data":[-1]"#),
        // Not JSON, or not the declared element count.
        with(&format!(r#"{base},"data":[01,2]"#)),
        // A lone minus sign, which lexical-core's integer parser reads as 0.
        with(r#""name":"x","shape":[-],"datatype":"INT16","data":[]"#),
        // `-0` as a dim: serde_json reads a float there.
        with(r#""name":"x","shape":[-0,2],"datatype":"FP32","data":[]"#),
        with(r#""name":"x","shape":[2],"datatype":"INT64","data":[-,1]"#),
        with(&format!(r#"{base},"data":[1,2,]"#)),
        with(&format!(r#"{base},"data":[1 2]"#)),
        with(&format!(r#"{base},"data":[1,2]]"#)),
        with(&format!(r#"{base},"data":[.5,2]"#)),
        with(&format!(r#"{base},"data":[1.,2]"#)),
        with(&format!(r#"{base},"data":[1,1e400]"#)),
        with(&format!(r#"{base},"data":[1,2,3]"#)),
        with(&format!(r#"{base},"data":[1]"#)),
        with(&format!(r#"{base},"data":[[1,2]"#)),
        // The same, with `data` first (checked, then read at the end).
        with(r#""data":[01,2],"name":"x","shape":[2],"datatype":"FP32""#),
        with(r#""data":[1,2,],"name":"x","shape":[2],"datatype":"FP32""#),
        with(r#""data":[1,2,3],"name":"x","shape":[2],"datatype":"FP32""#),
        with(r#""data":[1,true],"name":"x","shape":[2],"datatype":"FP32""#),
        with(r#""data":[1,2.5],"name":"x","shape":[2],"datatype":"INT32""#),
        with(r#""data":[1,2],"name":"x","shape":[2]"#),
        with(r#""name":"x","shape":[-2],"datatype":"FP32","data":[1,2]"#),
        format!(r#"{{"inputs":[{{{base},"data":[1,2]}}]}} x"#),
        format!(r#"{{"inputs":[{{{base},"data":[1,2]}}],}}"#),
        r#"{"id":"a"}"#.to_string(),
    ] {
        leaves(&body);
    }
    let deep = format!("{}1{}", "[".repeat(129), "]".repeat(129));
    leaves(&with(&format!(
        r#""name":"x","shape":[1],"datatype":"FP32","data":{deep}"#
    )));
    // Not UTF-8.
    let mut bad = br#"{"inputs":[{"name":"x","shape":[1],"datatype":"FP32","data":[1]}]}"#.to_vec();
    bad[22] = 0xff;
    assert!(decode(&bad).is_none());
}

/// Mangled bodies: one or two bytes deleted, inserted or replaced. Whatever
/// the reader still takes, serde must take too, with the same result.
#[test]
fn on_mangled_bodies_it_never_disagrees_with_serde() {
    let mut rng = Rng(0x0dd_ba11_cafe_f00d);
    let alphabet = b"[]{},:\" -.0123456789eE+\\tnulfasx\n";
    let (mut taken, mut tried) = (0, 0);
    for _ in 0..20_000 {
        let datatype = ["FP32", "FP64", "INT64", "UINT8"][rng.below(4)];
        let (rows, cols) = (1 + rng.below(2), 1 + rng.below(3));
        let mut b = body(&mut rng, datatype, rows, cols).into_bytes();
        for _ in 0..1 + rng.below(2) {
            let at = rng.below(b.len());
            match rng.below(3) {
                0 => {
                    b.remove(at);
                }
                1 => b.insert(at, alphabet[rng.below(alphabet.len())]),
                _ => b[at] = alphabet[rng.below(alphabet.len())],
            }
        }
        tried += 1;
        if let Some(fast) = decode(&b) {
            taken += 1;
            let text = String::from_utf8_lossy(&b);
            assert_eq!(Ok(format!("{fast:?}")), serde(&text), "{text}");
        }
    }
    // Many mangled bodies are still valid (a digit changed, a space added).
    assert!(
        taken > tried / 10,
        "only {taken} of {tried} mangled bodies were taken"
    );
}
