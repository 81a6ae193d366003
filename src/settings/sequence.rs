//! A sequence model's settings (Triton's `sequence_batching`, or
//! `model-settings.json`'s `sequence` object): the control inputs the server
//! fills in each request of a sequence, the state it keeps between them, how
//! long a sequence may go without a request, and how many may be live at once.

use std::time::Duration;

use serde_json::Value;

use super::walk::{get, Walker};
use crate::tensor::DataType;

/// How long a sequence may go without a request before it is ended
/// (Triton's `max_sequence_idle_microseconds` default).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// Most live sequences when the settings give no bound.
pub const DEFAULT_MAX_SEQUENCES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceSettings {
    /// Inputs the server fills, in each request of a sequence.
    pub controls: Vec<Control>,
    /// State the server keeps: each pair's output is the input's value in
    /// the sequence's next request.
    pub states: Vec<State>,
    /// A sequence with no request for this long is ended, its state freed.
    pub idle: Duration,
    /// Most sequences live at once; a start past it is refused (503).
    pub max_sequences: usize,
    /// The model has a batch dimension (Triton's `max_batch_size` > 0): a
    /// state's batch axis takes the request's rows. Without one, a state's
    /// shape is the whole of what the ONNX file and the configuration's
    /// `dims` say.
    pub batched: bool,
}

/// One implicit state: `output` of a request is `input` of the sequence's
/// next; its first request gets zeros, or the initial state read from
/// `initial` (raw little-endian values of one sequence's state). Its batch
/// axis is the model's (`batch_axes`, dim 0 by default).
#[derive(Debug, Clone, Default)]
pub struct State {
    pub input: String,
    pub output: String,
    /// The initial state's file, relative to the model folder.
    pub initial: Option<std::path::PathBuf>,
    /// Its bytes, read when the model loads.
    pub initial_bytes: Option<std::sync::Arc<Vec<u8>>>,
    /// One sequence's state shape as the configuration declares it
    /// (config.pbtxt `state.dims`, else its `initial_state.dims`; without
    /// the batch dimension when the model has one): fills the dimensions
    /// the ONNX file leaves open. Empty: none declared.
    pub dims: Vec<i64>,
}

/// Settings compare by what is written in them: the bytes a load read are
/// not a change of the folder.
impl PartialEq for State {
    fn eq(&self, other: &State) -> bool {
        (&self.input, &self.output, &self.initial) == (&other.input, &other.output, &other.initial)
    }
}

impl Eq for State {}

/// One control input: which of the sequence's facts it carries, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Control {
    pub input: String,
    pub kind: ControlKind,
    pub values: ControlValues,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// True in a sequence's first request.
    Start,
    /// True in its last.
    End,
    /// True in every request (a batch slot that holds a request).
    Ready,
    /// The sequence's id.
    CorrelationId,
}

/// The values a control input takes: false and true for the flags, or the
/// id's data type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlValues {
    Int32([i32; 2]),
    /// Stored as bits (`f32::to_bits`), so that settings compare exactly.
    Fp32([u32; 2]),
    Bool([bool; 2]),
    Id(DataType),
}

impl ControlKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlKind::Start => "CONTROL_SEQUENCE_START",
            ControlKind::End => "CONTROL_SEQUENCE_END",
            ControlKind::Ready => "CONTROL_SEQUENCE_READY",
            ControlKind::CorrelationId => "CONTROL_SEQUENCE_CORRID",
        }
    }
}

const SEQUENCE: &str = "controls state idle_timeout max_sequences";
const CONTROL: &str = "input kind false_true";
const STATE: &str = "input output initial_file";
const KINDS: &[(&str, ControlKind)] = &[
    ("start", ControlKind::Start),
    ("end", ControlKind::End),
    ("ready", ControlKind::Ready),
    ("correlation_id", ControlKind::CorrelationId),
];

impl Walker {
    /// `model-settings.json`'s `sequence` object.
    pub(super) fn sequence(&mut self, v: &Value) -> Option<SequenceSettings> {
        let obj = self.object(v, "sequence.", SEQUENCE)?;
        let mut out = SequenceSettings {
            controls: Vec::new(),
            states: Vec::new(),
            idle: DEFAULT_IDLE,
            max_sequences: DEFAULT_MAX_SEQUENCES,
            batched: true,
        };
        // Every field is checked, so that one message names every mistake.
        if let Some(v) = get(obj, "idle_timeout") {
            let expected = "a number of seconds above 0";
            if let Some(secs) = self.number(v, "sequence.idle_timeout", expected, |x| x > 0.0) {
                out.idle = Duration::from_secs_f64(secs);
            }
        }
        if let Some(v) = get(obj, "max_sequences") {
            if let Some(n) = self.int(v, "sequence.max_sequences", 1, 1 << 20) {
                out.max_sequences = n as usize;
            }
        }
        for (i, c) in self.array(obj, "controls").iter().enumerate() {
            let path = format!("sequence.controls[{i}]");
            let Some(c) = self.object(c, &format!("{path}."), CONTROL) else {
                continue;
            };
            let input =
                get(c, "input").and_then(|v| self.string(v, &format!("{path}.input"), "an input name"));
            let kind = get(c, "kind").and_then(|v| self.choice(v, &format!("{path}.kind"), KINDS, false));
            let (Some(input), Some(kind)) = (input, kind) else {
                self.push::<()>(format!("`{path}` needs `input` and `kind`"));
                continue;
            };
            let values = match (kind, get(c, "false_true")) {
                (ControlKind::CorrelationId, None) => ControlValues::Id(DataType::U64),
                (ControlKind::CorrelationId, Some(_)) => {
                    self.push::<()>(format!(
                        "`{path}.false_true`: a correlation id has no false and true values"
                    ));
                    continue;
                }
                (_, None) => ControlValues::Int32([0, 1]),
                (_, Some(v)) => match self.false_true(v, &format!("{path}.false_true")) {
                    Some(values) => values,
                    None => continue,
                },
            };
            out.controls.push(Control {
                input: input.to_string(),
                kind,
                values,
            });
        }
        for (i, st) in self.array(obj, "state").iter().enumerate() {
            let path = format!("sequence.state[{i}]");
            let Some(st) = self.object(st, &format!("{path}."), STATE) else {
                continue;
            };
            let name = |w: &mut Walker, key: &str| {
                get(st, key).and_then(|v| w.string(v, &format!("{path}.{key}"), "a tensor name"))
            };
            let initial = get(st, "initial_file").and_then(|v| {
                let expected =
                    "a file of the model folder holding the initial state (raw little-endian values)";
                let file = self.string(v, &format!("{path}.initial_file"), expected)?;
                match super::in_folder("initial_file", file) {
                    Ok(f) => Some(std::path::PathBuf::from(f)),
                    Err(_) => self.bad(&format!("{path}.initial_file"), expected, v),
                }
            });
            match (name(self, "input"), name(self, "output")) {
                (Some(input), Some(output)) => out.states.push(State {
                    input: input.to_string(),
                    output: output.to_string(),
                    initial,
                    initial_bytes: None,
                    dims: Vec::new(),
                }),
                _ => {
                    self.push::<()>(format!(
                        "`{path}` needs `input` (the state input) and `output` (its next value)"
                    ));
                }
            }
        }
        Some(out)
    }

    /// `obj[key]` as an array (absent: empty).
    fn array(&mut self, obj: &serde_json::Map<String, Value>, key: &str) -> Vec<Value> {
        match get(obj, key) {
            None => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(v) => self
                .bad(&format!("sequence.{key}"), "an array", v)
                .unwrap_or_default(),
        }
    }

    /// Two values, false then true: integers, numbers or booleans.
    fn false_true(&mut self, v: &Value, path: &str) -> Option<ControlValues> {
        let expected = "two values, false then true: [0, 1], [0.0, 1.0] or [false, true]";
        match v.as_array().map(Vec::as_slice) {
            Some([Value::Bool(f), Value::Bool(t)]) => Some(ControlValues::Bool([*f, *t])),
            Some([f, t]) if f.is_i64() && t.is_i64() => {
                let int = |x: &Value| i32::try_from(x.as_i64()?).ok();
                match (int(f), int(t)) {
                    (Some(f), Some(t)) => Some(ControlValues::Int32([f, t])),
                    _ => self.bad(path, expected, v),
                }
            }
            Some([f, t]) if f.is_number() && t.is_number() => {
                let (f, t) = (f.as_f64()? as f32, t.as_f64()? as f32);
                Some(ControlValues::Fp32([f.to_bits(), t.to_bits()]))
            }
            _ => self.bad(path, expected, v),
        }
    }
}
