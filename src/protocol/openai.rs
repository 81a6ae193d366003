//! OpenAI's embeddings API (`POST /v1/embeddings`): the request's texts or
//! token ids, and the answer's vectors, as OpenAI's clients send and read them.

use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::error::{Error, Result};

/// A decoded embeddings request.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub input: Input,
    pub base64: bool,
    /// Keep this many leading dimensions of each vector.
    pub dimensions: Option<usize>,
}

/// What to embed: texts, or texts already tokenized.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Texts(Vec<String>),
    Tokens(Vec<Vec<i64>>),
}

impl Input {
    pub fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Tokens(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    model: Option<String>,
    input: Option<Value>,
    encoding_format: Option<String>,
    dimensions: Option<Value>,
    /// Accepted and not used (OpenAI's end-user id).
    #[allow(dead_code)]
    user: Option<Value>,
}

/// Most texts in one request (OpenAI's own bound).
pub const MAX_INPUTS: usize = 2048;

/// Decodes a request body; errors name the field.
pub fn decode(body: &[u8]) -> Result<EmbeddingsRequest> {
    let raw: Raw = serde_json::from_slice(body)
        .map_err(|e| Error::invalid(format!("the body is not an embeddings request: {e}")))?;
    let model = raw
        .model
        .ok_or_else(|| Error::invalid("`model` is missing: name the model to embed with"))?;
    let input = match raw.input {
        None => {
            return Err(Error::invalid(
                "`input` is missing: a string, an array of strings, or token ids",
            ))
        }
        Some(v) => input(v)?,
    };
    if input.is_empty() {
        return Err(Error::invalid("`input` is empty: give at least one text"));
    }
    if input.len() > MAX_INPUTS {
        return Err(Error::invalid(format!(
            "`input` holds {} items; at most {MAX_INPUTS} per request",
            input.len()
        )));
    }
    let base64 = match raw.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(Error::invalid(format!(
                "`encoding_format` is {other:?}: it must be \"float\" or \"base64\""
            )))
        }
    };
    let dimensions = match raw.dimensions {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Some(n as usize),
            _ => {
                return Err(Error::invalid(format!(
                    "`dimensions` must be a positive integer, got {v}"
                )))
            }
        },
    };
    Ok(EmbeddingsRequest {
        model,
        input,
        base64,
        dimensions,
    })
}

fn input(v: Value) -> Result<Input> {
    let bad = || {
        Error::invalid("`input` must be a string, an array of strings, an array of token ids, or an array of arrays of token ids")
    };
    let ids = |a: &[Value]| -> Result<Vec<i64>> {
        a.iter()
            .map(|x| x.as_i64().filter(|n| *n >= 0).ok_or_else(bad))
            .collect()
    };
    match v {
        Value::String(s) => Ok(Input::Texts(vec![s])),
        Value::Array(a) if a.is_empty() => Ok(Input::Texts(Vec::new())),
        Value::Array(a) => match &a[0] {
            Value::String(_) => a
                .into_iter()
                .map(|x| match x {
                    Value::String(s) => Ok(s),
                    _ => Err(bad()),
                })
                .collect::<Result<_>>()
                .map(Input::Texts),
            Value::Number(_) => Ok(Input::Tokens(vec![ids(&a)?])),
            Value::Array(_) => a
                .iter()
                .enumerate()
                .map(|(i, x)| match x.as_array() {
                    Some(x) if x.is_empty() => Err(Error::invalid(format!(
                        "`input[{i}]` is an empty list of token ids: give at least one token per input"
                    ))),
                    Some(x) => ids(x),
                    None => Err(bad()),
                })
                .collect::<Result<_>>()
                .map(Input::Tokens),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The answer: one vector per input, in order.
pub fn encode(model: &str, vectors: &[&[f32]], base64: bool, tokens: usize) -> Value {
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(index, v)| {
            let embedding = match base64 {
                true => Value::from(
                    base64::engine::general_purpose::STANDARD.encode(bytemuck::cast_slice::<f32, u8>(v)),
                ),
                false => json!(v),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })
}

/// OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`.
pub fn error_body(e: &Error, status: u16) -> Value {
    use crate::error::ErrorKind as K;
    let kind = e.kind();
    let (ty, code) = match kind {
        K::InvalidInput | K::PayloadTooLarge => ("invalid_request_error", Value::Null),
        K::ModelNotFound => ("invalid_request_error", json!("model_not_found")),
        K::Unauthenticated => ("authentication_error", json!("invalid_api_key")),
        K::PermissionDenied => ("permission_error", Value::Null),
        _ if status >= 500 => ("server_error", Value::Null),
        _ => ("invalid_request_error", Value::Null),
    };
    let param = match e.to_string() {
        m if m.starts_with("`input`") || m.starts_with("`input[") => json!("input"),
        m if m.starts_with("`dimensions`") => json!("dimensions"),
        m if m.starts_with("`encoding_format`") => json!("encoding_format"),
        m if m.starts_with("`model`") || kind == K::ModelNotFound => json!("model"),
        _ => Value::Null,
    };
    json!({"error": {"message": e.to_string(), "type": ty, "param": param, "code": code}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_of_every_shape() {
        let d = |s: &str| decode(s.as_bytes()).map(|r| r.input);
        assert_eq!(
            d(r#"{"model":"m","input":"hi"}"#).unwrap(),
            Input::Texts(vec!["hi".into()])
        );
        assert_eq!(
            d(r#"{"model":"m","input":["a","b"]}"#).unwrap(),
            Input::Texts(vec!["a".into(), "b".into()])
        );
        assert_eq!(
            d(r#"{"model":"m","input":[1,2]}"#).unwrap(),
            Input::Tokens(vec![vec![1, 2]])
        );
        assert_eq!(
            d(r#"{"model":"m","input":[[1],[2,3]]}"#).unwrap(),
            Input::Tokens(vec![vec![1], vec![2, 3]])
        );
        for bad in [
            r#"{"model":"m","input":["a",1]}"#,
            r#"{"model":"m","input":{}}"#,
            r#"{"model":"m","input":[-1]}"#,
        ] {
            assert!(d(bad).unwrap_err().to_string().starts_with("`input`"), "{bad}");
        }
        assert!(d(r#"{"model":"m","input":[]}"#)
            .unwrap_err()
            .to_string()
            .contains("empty"));
        let e = d(r#"{"model":"m","input":[[1],[]]}"#).unwrap_err();
        assert!(matches!(e, Error::InvalidInput(_)), "{e:?}");
        assert!(
            e.to_string().contains("`input[1]` is an empty list of token ids"),
            "{e}"
        );
    }

    #[test]
    fn fields_are_checked() {
        let e = |s: &str| decode(s.as_bytes()).unwrap_err().to_string();
        assert!(e(r#"{"input":"x"}"#).contains("`model` is missing"));
        assert!(e(r#"{"model":"m","input":"x","encoding_format":"hex"}"#).contains("\"float\" or \"base64\""));
        assert!(e(r#"{"model":"m","input":"x","dimensions":0}"#).contains("`dimensions`"));
        assert!(e(r#"{"model":"m","input":"x","extra":1}"#).contains("unknown field `extra`"));
        let r = decode(br#"{"model":"m","input":"x","encoding_format":"base64","dimensions":8,"user":"u"}"#)
            .unwrap();
        assert!(r.base64 && r.dimensions == Some(8));
    }

    #[test]
    fn base64_is_little_endian_f32() {
        let v = encode("m", &[&[1.0f32, -2.0]], true, 3);
        let text = v["data"][0]["embedding"].as_str().unwrap();
        let bytes = base64::engine::general_purpose::STANDARD.decode(text).unwrap();
        assert_eq!(bytes, [1.0f32.to_le_bytes(), (-2.0f32).to_le_bytes()].concat());
        assert_eq!(v["usage"]["prompt_tokens"], 3);
    }
}
