//! A sequence model's settings (Triton's `sequence_batching`): the control
//! inputs the server fills in each request of a sequence, how long a
//! sequence may go without a request, and how many may be live at once.

use std::time::Duration;

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
    /// A sequence with no request for this long is ended, its state freed.
    pub idle: Duration,
    /// Most sequences live at once; a start past it is refused (503).
    pub max_sequences: usize,
}

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
