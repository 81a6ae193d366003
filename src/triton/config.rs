//! Triton's model configuration read with its own schema: `config.pbtxt`
//! (protobuf text format) and the JSON a model-control `load` carries, both
//! against `model_config.proto`'s descriptor (built by `build.rs`), then
//! transcoded to the generated `ModelConfig`. Back to JSON in Triton's shape
//! (proto field names, enum names, integers as numbers) for
//! `GET /v2/models/{m}/config`. Pure: no I/O.

use std::sync::OnceLock;

use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions,
};

use crate::protocol::grpc::inference::ModelConfig;

static DESCRIPTORS: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/model_config.bin"));

fn descriptor() -> MessageDescriptor {
    static POOL: OnceLock<DescriptorPool> = OnceLock::new();
    POOL.get_or_init(|| DescriptorPool::decode(DESCRIPTORS).expect("build.rs wrote a valid descriptor set"))
        .get_message_by_name("inference.ModelConfig")
        .expect("model_config.proto defines inference.ModelConfig")
}

/// Reads a `config.pbtxt`. The error says what is wrong and where
/// (`line 12, column 5: field 'dim' not found for message 'inference.ModelInput'`).
pub fn from_text(text: &str) -> Result<ModelConfig, String> {
    let text = &list_colons(text);
    let message = DynamicMessage::parse_text_format(descriptor(), text).map_err(|e| {
        use miette::Diagnostic;
        let at = e
            .labels()
            .and_then(|mut l| l.next())
            .map(|l| position(text, l.offset()))
            .unwrap_or_default();
        format!("{at}{e}")
    })?;
    transcode(&message)
}

/// Reads a model configuration written as JSON (Triton's model-control
/// `load` with a `config` parameter). Unknown fields are errors.
pub fn from_json(text: &str) -> Result<ModelConfig, String> {
    let mut de = serde_json::Deserializer::from_str(text);
    let options = DeserializeOptions::new().deny_unknown_fields(true);
    let message = DynamicMessage::deserialize_with_options(descriptor(), &mut de, &options)
        .and_then(|m| de.end().map(|_| m))
        .map_err(|e| e.to_string())?;
    transcode(&message)
}

/// A configuration [`to_json`] wrote (what settings keep): read back without
/// going through its text.
pub fn from_value(value: &serde_json::Value) -> Result<ModelConfig, String> {
    let message = DynamicMessage::deserialize(descriptor(), value).map_err(|e| e.to_string())?;
    transcode(&message)
}

/// The configuration as Triton's HTTP API writes it.
pub fn to_json(config: &ModelConfig) -> serde_json::Value {
    let mut message = DynamicMessage::new(descriptor());
    message
        .transcode_from(config)
        .expect("the generated type and the descriptor come from the same proto");
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a protobuf message serializes to JSON")
}

fn transcode(message: &DynamicMessage) -> Result<ModelConfig, String> {
    message
        .transcode_to()
        .map_err(|e| format!("cannot read the configuration: {e}"))
}

/// `text` with a `:` between a field name and a `[` that opens its list of
/// messages (`input [ { ... } ]`, as every Triton config writes it). The text
/// format's grammar makes that colon optional; prost-reflect's parser requires
/// it. The whitespace before the `[` becomes the colon, so the positions in
/// parse errors stay those of the file. Strings and `#` comments are skipped.
fn list_colons(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut chars = text.char_indices().peekable();
    // Whether the last significant token was an identifier (a field name).
    let mut after_ident = false;
    // Where, in `out`, the whitespace after that identifier starts.
    let mut gap: Option<usize> = None;
    while let Some((_, c)) = chars.next() {
        match c {
            '#' => {
                out.push(c);
                for (_, c) in chars.by_ref() {
                    out.push(c);
                    if c == '\n' {
                        break;
                    }
                }
                continue;
            }
            '"' | '\'' => {
                out.push(c);
                while let Some((_, d)) = chars.next() {
                    out.push(d);
                    if d == '\\' {
                        if let Some((_, e)) = chars.next() {
                            out.push(e);
                        }
                    } else if d == c {
                        break;
                    }
                }
                after_ident = false;
                continue;
            }
            '[' if after_ident => match gap {
                Some(at) => out.replace_range(at..at + 1, ":"),
                None => out.push(':'),
            },
            _ => {}
        }
        if c.is_whitespace() {
            if after_ident && gap.is_none() && c == ' ' {
                gap = Some(out.len());
            }
        } else {
            after_ident = c.is_alphanumeric() || c == '_';
            gap = None;
        }
        out.push(c);
    }
    out
}

/// `line L, column C: ` of a byte offset.
fn position(text: &str, offset: usize) -> String {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("line {line}, column {column}: ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tritons_example_config() {
        let text = include_str!("../../tests/fixtures/triton/model_repository/simple/config.pbtxt");
        let c = from_text(text).unwrap();
        assert_eq!(c.name, "simple");
        assert_eq!(c.platform, "onnxruntime_onnx");
        assert_eq!(c.max_batch_size, 8);
        assert_eq!(c.input.len(), 2);
        assert_eq!(c.input[1].name, "INPUT1");
        assert_eq!(c.input[1].dims, vec![16]);
        assert_eq!(c.output[0].data_type, 8, "TYPE_INT32");
    }

    #[test]
    fn the_colon_before_a_list_of_messages_is_optional() {
        assert_eq!(list_colons("input [ {"), "input:[ {");
        assert_eq!(list_colons("input[{"), "input:[{");
        assert_eq!(list_colons("dims: [ 16 ]"), "dims: [ 16 ]");
        assert_eq!(
            list_colons("name: \"a [\" # x [\ninput\n["),
            "name: \"a [\" # x [\ninput\n:["
        );
    }

    #[test]
    fn a_mistake_is_named_with_its_line() {
        let e = from_text("name: \"m\"\ninput [ { name: \"x\"\n dim: [ 3 ] } ]").unwrap_err();
        assert!(e.starts_with("line 3, column 2: "), "{e}");
        assert!(e.contains("field 'dim' not found"), "{e}");
        let e = from_text("max_batch_size: \"eight\"").unwrap_err();
        assert!(e.starts_with("line 1, column 17: "), "{e}");
    }

    #[test]
    fn json_round_trip_and_unknown_fields() {
        let c =
            from_json(r#"{"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 100}}"#)
                .unwrap();
        assert_eq!(c.max_batch_size, 16);
        let back = to_json(&c);
        assert_eq!(back["max_batch_size"], 16);
        assert_eq!(back["dynamic_batching"]["max_queue_delay_microseconds"], 100);
        assert!(from_json(r#"{"max_batch_sise": 16}"#)
            .unwrap_err()
            .contains("max_batch_sise"));
        assert!(from_json("{").is_err());
    }
}
