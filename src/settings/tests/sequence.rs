//! `model-settings.json`'s `sequence` object.

use super::*;

#[test]
fn a_sequence_object_gives_state_controls_and_bounds() {
    use crate::settings::sequence::{ControlKind, ControlValues};
    let s = ok(r#"{"sequence": {
        "state": [{"input": "state", "output": "stateN"}],
        "controls": [
            {"input": "START", "kind": "start"},
            {"input": "READY", "kind": "ready", "false_true": [0.0, 1.5]},
            {"input": "END", "kind": "end", "false_true": [false, true]},
            {"input": "CORRID", "kind": "correlation_id"}
        ],
        "idle_timeout": 2.5, "max_sequences": 8}}"#);
    let q = s.sequence.unwrap();
    assert_eq!(
        (q.states[0].input.as_str(), q.states[0].output.as_str()),
        ("state", "stateN")
    );
    assert_eq!(q.idle, std::time::Duration::from_millis(2500));
    assert_eq!(q.max_sequences, 8);
    let kinds: Vec<ControlKind> = q.controls.iter().map(|c| c.kind).collect();
    assert_eq!(
        kinds,
        [
            ControlKind::Start,
            ControlKind::Ready,
            ControlKind::End,
            ControlKind::CorrelationId
        ]
    );
    assert_eq!(q.controls[0].values, ControlValues::Int32([0, 1]));
    assert_eq!(
        q.controls[1].values,
        ControlValues::Fp32([0f32.to_bits(), 1.5f32.to_bits()])
    );
    assert_eq!(q.controls[2].values, ControlValues::Bool([false, true]));
    // Defaults.
    let q = ok(r#"{"sequence": {}}"#).sequence.unwrap();
    assert_eq!(
        (q.idle, q.max_sequences),
        (
            crate::settings::sequence::DEFAULT_IDLE,
            crate::settings::sequence::DEFAULT_MAX_SEQUENCES
        )
    );
}

#[test]
fn sequence_mistakes_are_named_by_field() {
    let p = problems(
        r#"{"sequence": {"state": [{"input": "s"}], "controls": [{"input": "S", "kind": "begin"},
            {"input": "C", "kind": "correlation_id", "false_true": [0, 1]}], "idle_timeout": 0, "maxsequences": 3}}"#,
    )
    .join("\n");
    for says in [
        "`sequence.maxsequences` is an unknown field (did you mean `sequence.max_sequences`?)",
        "`sequence.idle_timeout` must be a number of seconds above 0",
        "`sequence.controls[0].kind` must be one of",
        "`sequence.controls[1].false_true`: a correlation id has no false and true values",
        "`sequence.state[0]` needs `input` (the state input) and `output` (its next value)",
    ] {
        assert!(p.contains(says), "{says:?} not in:\n{p}");
    }
}
