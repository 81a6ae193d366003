//! The checkers of `model-settings.json`'s own fields, each on the
//! [`Walker`] so that every problem is recorded with its field path: the
//! model's name and version, the batcher's limits (MLServer's top-level
//! names and their KServe `batcher` twins), padding and device ids.
//! `ModelSettings::parse_with_uri` calls them in the file's order.

use std::collections::BTreeMap;

use serde_json::{Map, Value};

use super::walk::{get, Walker};
use super::{validate_model_name, BATCHER};

/// The batcher's limits as given (`None`: not set, or set wrong and
/// recorded), each reconciled with its KServe twin under `batcher`.
pub(super) struct Batcher {
    /// `max_batch_size` / `batcher.maxBatchSize`, in rows.
    pub max_batch_size: Option<f64>,
    /// `max_batch_time` / `batcher.maxLatency`, in seconds.
    pub max_batch_time: Option<f64>,
    /// `timeout` / `batcher.timeout`, in seconds.
    pub timeout: Option<f64>,
}

impl Walker {
    /// `name`, else the folder's name; either must be a valid model name.
    pub(super) fn model_name(&mut self, top: &Map<String, Value>, folder_name: &str) -> Option<String> {
        match get(top, "name") {
            Some(v) => self
                .string(v, "name", "a string")
                .and_then(|n| match validate_model_name(n) {
                    Ok(()) => Some(n.to_owned()),
                    Err(e) => self.push(format!("`name`: {e}")),
                }),
            None => match validate_model_name(folder_name) {
                Ok(()) => Some(folder_name.to_owned()),
                Err(e) => self.push(format!(
                    "`name` is not set and the folder name cannot be used: {e}"
                )),
            },
        }
    }

    /// `parameters.version`: 1 to 64 characters of `[A-Za-z0-9_.-]`.
    pub(super) fn version(&mut self, v: &Value) -> Option<String> {
        let expected = "1 to 64 characters of [A-Za-z0-9_.-]";
        let s = self.string(v, "parameters.version", expected)?;
        let ok = (1..=64).contains(&s.len())
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'));
        if ok {
            Some(s.to_owned())
        } else {
            self.bad("parameters.version", expected, v)
        }
    }

    /// The batcher's limits, each given by its MLServer name, its KServe
    /// twin under `batcher` (milliseconds for `maxLatency`), or both if
    /// they agree.
    pub(super) fn batcher_fields(&mut self, top: &Map<String, Value>) -> Batcher {
        let batcher = get(top, "batcher").and_then(|v| self.object(v, "batcher.", BATCHER));
        let kserve = |key: &str| batcher.and_then(|b| get(b, key));
        let max_batch_size = {
            let ml = get(top, "max_batch_size").and_then(|v| self.int(v, "max_batch_size", 0, 65536));
            let ks = kserve("maxBatchSize").and_then(|v| self.int(v, "batcher.maxBatchSize", 0, 65536));
            self.merge(
                ("max_batch_size", ml.map(|n| n as f64)),
                ("batcher.maxBatchSize", ks.map(|n| n as f64)),
                "",
            )
        };
        let max_batch_time = {
            let ml = get(top, "max_batch_time").and_then(|v| {
                self.number(v, "max_batch_time", "a number of seconds between 0 and 60", |x| {
                    (0.0..=60.0).contains(&x)
                })
            });
            let ks = kserve("maxLatency").and_then(|v| {
                let expected = "a number of milliseconds between 0 and 60000";
                self.number(v, "batcher.maxLatency", expected, |x| {
                    (0.0..=60_000.0).contains(&x)
                })
            });
            self.merge(
                ("max_batch_time", ml),
                ("batcher.maxLatency", ks.map(|ms| ms / 1000.0)),
                " s",
            )
        };
        let timeout = {
            let expected = "a number of seconds greater than 0 and at most 86400";
            let in_range = |x: f64| x > 0.0 && x <= 86_400.0;
            let ml = get(top, "timeout").and_then(|v| self.number(v, "timeout", expected, in_range));
            let ks = kserve("timeout").and_then(|v| self.number(v, "batcher.timeout", expected, in_range));
            self.merge(("timeout", ml), ("batcher.timeout", ks), " s")
        };
        Batcher {
            max_batch_size,
            max_batch_time,
            timeout,
        }
    }

    /// `padding`, `max_batch_tokens` and `max_padding_ratio` (the two bounds need `padding`).
    pub(super) fn padding_fields(
        &mut self,
        top: &Map<String, Value>,
    ) -> (BTreeMap<String, Value>, Option<usize>, Option<f64>) {
        let padding = get(top, "padding").map(|v| self.padding(v)).unwrap_or_default();
        let max_batch_tokens = get(top, "max_batch_tokens")
            .and_then(|v| self.int(v, "max_batch_tokens", 1, 1 << 40))
            .map(|n| n as usize);
        let max_padding_ratio = get(top, "max_padding_ratio").and_then(|v| {
            self.number(v, "max_padding_ratio", "a number between 0 and 1", |x| {
                (0.0..=1.0).contains(&x)
            })
        });
        for (field, given) in [
            ("max_batch_tokens", max_batch_tokens.is_some()),
            ("max_padding_ratio", max_padding_ratio.is_some()),
        ] {
            if given && padding.is_empty() {
                self.problems.push(format!(
                    "`{field}` bounds the padded tokens of a batch, but `padding` is not set; \
                     set `padding` too, or remove `{field}`"
                ));
            }
        }
        (padding, max_batch_tokens, max_padding_ratio)
    }

    /// `padding`: a non-empty object of input name → pad value (a number, boolean or string;
    /// the datatype is checked against the ONNX file at load time).
    pub(super) fn padding(&mut self, v: &Value) -> BTreeMap<String, Value> {
        let expected = "an object of input name → pad value, e.g. {\"input_ids\": 0, \"attention_mask\": 0}";
        let Some(obj) = v.as_object() else {
            return self.bad("padding", expected, v).unwrap_or_default();
        };
        if obj.is_empty() {
            self.push::<()>("`padding` is empty: name the inputs to pad, or leave it out".into());
        }
        let mut out = BTreeMap::new();
        for (name, value) in obj {
            match value {
                Value::Number(_) | Value::Bool(_) | Value::String(_) => {
                    out.insert(name.clone(), value.clone());
                }
                _ => self
                    .bad::<()>(
                        &format!("padding.{name}"),
                        "a pad value (a number, true or false, or a string)",
                        value,
                    )
                    .unwrap_or_default(),
            }
        }
        out
    }

    /// `batch_axes`: tensor name → the axis its batch is on (0 to 31), for a
    /// model whose batch is not dim 0 of every tensor (a recurrent state
    /// `[layers, batch, hidden]`: 1). Checked against the ONNX file at load time.
    pub(super) fn batch_axes(&mut self, v: &Value) -> BTreeMap<String, usize> {
        let expected = "an object of input or output name → batch axis, e.g. {\"state\": 1, \"stateN\": 1}";
        let Some(obj) = v.as_object() else {
            return self.bad("batch_axes", expected, v).unwrap_or_default();
        };
        let mut out = BTreeMap::new();
        for (name, axis) in obj {
            if let Some(a) = self.int(axis, &format!("batch_axes.{name}"), 0, 31) {
                out.insert(name.clone(), a as usize);
            }
        }
        out
    }

    pub(super) fn device_ids(&mut self, v: &Value) -> Vec<u32> {
        let expected = "a non-empty array of GPU indices (integers between 0 and 63)";
        let ids = match v.as_array() {
            Some(a) if !a.is_empty() => a,
            _ => return self.bad("device_ids", expected, v).unwrap_or_default(),
        };
        let mut out: Vec<u32> = Vec::with_capacity(ids.len());
        for (i, id) in ids.iter().enumerate() {
            match self.int(id, &format!("device_ids[{i}]"), 0, 63) {
                Some(n) if out.contains(&(n as u32)) => {
                    self.problems
                        .push(format!("`device_ids` lists device {n} more than once"));
                }
                Some(n) => out.push(n as u32),
                None => {}
            }
        }
        out
    }
}
