//! `padding`, `max_batch_tokens` and `max_padding_ratio`.

use super::*;

#[test]
fn padding_maps_inputs_to_pad_values() {
    let s = ok(
        r#"{"padding": {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0},
                   "max_batch_tokens": 4096, "max_padding_ratio": 0.3}"#,
    );
    assert_eq!(
        s.padding.keys().collect::<Vec<_>>(),
        ["attention_mask", "input_ids", "token_type_ids"]
    );
    assert_eq!(s.padding["input_ids"], serde_json::json!(0));
    assert_eq!(s.batching.max_batch_tokens, Some(4096));
    assert_eq!(s.batching.max_padding(), 0.3);
    assert_eq!(
        s.batching.on_device(true).max_padding(),
        0.3,
        "a ratio set holds on a GPU"
    );
    let none = ok("{}");
    assert!(none.padding.is_empty());
    assert_eq!(none.batching.max_batch_tokens, None);
    assert_eq!(none.batching.max_padding_ratio, None);
    assert_eq!(none.batching.max_padding(), DEFAULT_MAX_PADDING_RATIO);
    assert_eq!(
        none.batching.on_device(false).max_padding(),
        DEFAULT_MAX_PADDING_RATIO
    );
    assert_eq!(
        none.batching.on_device(true).max_padding(),
        DEFAULT_MAX_PADDING_RATIO_GPU
    );
}

#[test]
fn padding_problems_are_named() {
    let p = problems(r#"{"padding": [0], "max_batch_tokens": 0}"#);
    assert!(
        p[0].starts_with("`padding` must be an object of input name → pad value"),
        "{p:?}"
    );
    assert!(
        p.iter()
            .any(|m| m.contains("`max_batch_tokens` must be an integer between 1")),
        "{p:?}"
    );
    let p = problems(r#"{"padding": {"x": [1], "y": null}}"#);
    assert_eq!(
        p,
        vec![
            "`padding.x` must be a pad value (a number, true or false, or a string), got [1]",
            "`padding.y` must be a pad value (a number, true or false, or a string), got null",
        ]
    );
    assert_eq!(
        problems(r#"{"padding": {}}"#),
        vec!["`padding` is empty: name the inputs to pad, or leave it out"]
    );
    let p = problems(r#"{"max_batch_tokens": 100, "max_padding_ratio": 1.5}"#);
    assert!(
        p.iter()
            .any(|m| m.contains("`max_padding_ratio` must be a number between 0 and 1, got 1.5")),
        "{p:?}"
    );
    assert!(
        p.iter().any(|m| m
            .starts_with("`max_batch_tokens` bounds the padded tokens of a batch, but `padding` is not set")),
        "{p:?}"
    );
}

#[test]
fn padding_needs_new_sessions_and_its_bounds_do_not() {
    let base = ok(r#"{"padding": {"x": 0}}"#);
    assert!(base.requires_new_sessions(&ok(r#"{"padding": {"x": 1}}"#)));
    assert!(base.requires_new_sessions(&ok("{}")));
    assert!(!base.requires_new_sessions(&ok(
        r#"{"padding": {"x": 0}, "max_batch_tokens": 64, "max_padding_ratio": 0.1}"#
    )));
}
