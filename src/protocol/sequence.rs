//! Triton's sequence extension: a request's `sequence_id` (a non-zero
//! integer or a non-empty string; 0 and "" mean none), `sequence_start` and
//! `sequence_end`, read the same way from every protocol's parameters.

use crate::error::Error;

/// A sequence's id, as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SequenceId {
    Number(u64),
    Text(String),
}

impl std::fmt::Display for SequenceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SequenceId::Number(n) => write!(f, "{n}"),
            SequenceId::Text(s) => write!(f, "\"{}\"", crate::error::clip(s)),
        }
    }
}

/// The longest string `sequence_id`, in bytes: an id is kept, with the
/// sequence's state, for as long as the sequence lives.
pub const MAX_ID_BYTES: usize = 256;

/// The sequence parameters of one request; present when the request
/// carries any of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    /// `None`: 0 or "" (a request outside any sequence).
    pub id: Option<SequenceId>,
    pub start: bool,
    pub end: bool,
    /// The first sequence parameter the request carried, for messages.
    pub named: &'static str,
}

/// One parameter's value as a protocol carries it.
pub enum Value<'a> {
    Unsigned(u64),
    Signed(i64),
    Text(&'a str),
    Bool(bool),
    /// Anything else, shown as the client sent it.
    Other(String),
}

/// Reads the sequence parameters from `get` (a parameter's value by key).
/// `Ok(None)`: the request carries none. A value of the wrong kind is a 400
/// naming the parameter and what it must be.
pub fn read<'a>(get: impl Fn(&str) -> Option<Value<'a>>) -> Result<Option<Sequence>, Error> {
    let id = get("sequence_id");
    let start = get("sequence_start");
    let end = get("sequence_end");
    let named = match (&id, &start, &end) {
        (Some(_), _, _) => "sequence_id",
        (None, Some(_), _) => "sequence_start",
        (None, None, Some(_)) => "sequence_end",
        (None, None, None) => return Ok(None),
    };
    let id = match id {
        None | Some(Value::Unsigned(0) | Value::Signed(0)) => None,
        Some(Value::Unsigned(n)) => Some(SequenceId::Number(n)),
        Some(Value::Signed(n)) if n > 0 => Some(SequenceId::Number(n as u64)),
        Some(Value::Text("")) => None,
        Some(Value::Text(s)) if s.len() > MAX_ID_BYTES => {
            return Err(Error::invalid(format!(
                "request: parameter `sequence_id` is a string of {} bytes; a string id is at most {MAX_ID_BYTES} bytes",
                s.len()
            )))
        }
        Some(Value::Text(s)) => Some(SequenceId::Text(s.to_string())),
        Some(other) => {
            return Err(Error::invalid(format!(
                "request: parameter `sequence_id` must be a non-negative integer or a string, got {}",
                show(&other)
            )))
        }
    };
    let flag = |key: &str, v: Option<Value>| match v {
        None => Ok(false),
        Some(Value::Bool(b)) => Ok(b),
        Some(other) => Err(Error::invalid(format!(
            "request: parameter `{key}` must be true or false, got {}",
            show(&other)
        ))),
    };
    Ok(Some(Sequence {
        id,
        start: flag("sequence_start", start)?,
        end: flag("sequence_end", end)?,
        named,
    }))
}

fn show(v: &Value) -> String {
    match v {
        Value::Unsigned(n) => n.to_string(),
        Value::Signed(n) => n.to_string(),
        Value::Text(s) => format!("\"{}\"", crate::error::clip(s)),
        Value::Bool(b) => b.to_string(),
        Value::Other(s) => s.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read_map(pairs: &[(&'static str, Value<'static>)]) -> Result<Option<Sequence>, Error> {
        let map: HashMap<&str, &Value> = pairs.iter().map(|(k, v)| (*k, v)).collect();
        read(|k| {
            map.get(k).map(|v| match v {
                Value::Unsigned(n) => Value::Unsigned(*n),
                Value::Signed(n) => Value::Signed(*n),
                Value::Text(s) => Value::Text(s),
                Value::Bool(b) => Value::Bool(*b),
                Value::Other(s) => Value::Other(s.clone()),
            })
        })
    }

    #[test]
    fn ids_and_flags_are_read_and_zero_means_none() {
        assert_eq!(read_map(&[]).unwrap(), None);
        let s = read_map(&[
            ("sequence_id", Value::Unsigned(7)),
            ("sequence_start", Value::Bool(true)),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            (s.id, s.start, s.end, s.named),
            (Some(SequenceId::Number(7)), true, false, "sequence_id")
        );
        let s = read_map(&[("sequence_id", Value::Text("abc"))]).unwrap().unwrap();
        assert_eq!(s.id, Some(SequenceId::Text("abc".into())));
        for zero in [Value::Unsigned(0), Value::Signed(0), Value::Text("")] {
            assert_eq!(read_map(&[("sequence_id", zero)]).unwrap().unwrap().id, None);
        }
        let s = read_map(&[("sequence_end", Value::Bool(true))]).unwrap().unwrap();
        assert_eq!((s.id, s.end, s.named), (None, true, "sequence_end"));
    }

    #[test]
    fn values_of_the_wrong_kind_are_named() {
        let e = read_map(&[("sequence_id", Value::Signed(-3))])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`sequence_id` must be a non-negative integer or a string, got -3"),
            "{e}"
        );
        let e = read_map(&[
            ("sequence_id", Value::Unsigned(1)),
            ("sequence_start", Value::Unsigned(1)),
        ])
        .unwrap_err()
        .to_string();
        assert!(e.contains("`sequence_start` must be true or false, got 1"), "{e}");
        // A string id is bounded: a 1 MB one would be kept as long as its sequence.
        let long = "x".repeat(MAX_ID_BYTES + 1);
        let long: &'static str = Box::leak(long.into_boxed_str());
        let e = read_map(&[("sequence_id", Value::Text(long))])
            .unwrap_err()
            .to_string();
        assert!(e.contains("257 bytes") && e.contains("at most 256 bytes"), "{e}");
        let ok: &'static str = Box::leak("y".repeat(MAX_ID_BYTES).into_boxed_str());
        assert!(read_map(&[("sequence_id", Value::Text(ok))]).is_ok());
    }
}
