//! `sequence_batching` onto [`SequenceSettings`]: the control inputs, the
//! idle timeout, and the `oldest` strategy's bound on live sequences and
//! its wait for a batch across sequences.

use serde_json::{json, Map, Value};

use crate::protocol::grpc::inference::model_sequence_batching::{control::Kind, StrategyChoice};
use crate::protocol::grpc::inference::ModelSequenceBatching;
use crate::settings::sequence::{
    Control, ControlKind, ControlValues, SequenceSettings, State, DEFAULT_IDLE, DEFAULT_MAX_SEQUENCES,
};
use crate::tensor::DataType;

/// The batching fields `sequence_batching` sets: requests of different
/// sequences share batches, waiting at most the strategy's
/// `max_queue_delay_microseconds` for one to fill.
pub fn batching(s: &ModelSequenceBatching, top: &mut Map<String, Value>, ignored: &mut Vec<String>) {
    let delay_us = match &s.strategy_choice {
        Some(StrategyChoice::Oldest(o)) => o.max_queue_delay_microseconds,
        Some(StrategyChoice::Direct(d)) => d.max_queue_delay_microseconds,
        None => 0,
    };
    top.insert("max_batch_time".into(), json!(delay_us as f64 / 1e6));
    for (i, st) in s.state.iter().enumerate() {
        if st.initial_state.len() > 1 {
            ignored.push(format!(
                "`sequence_batching.state[{i}].initial_state`: only the first initial state is used"
            ));
        }
    }
    if s.iterative_sequence {
        ignored.push("`sequence_batching.iterative_sequence`: not supported".into());
    }
}

/// The sequence settings of `s`; a control that names no kind sluice knows,
/// or gives no values, is refused naming it.
/// `batched`: the model has a batch dimension (`max_batch_size` > 0).
pub fn settings(s: &ModelSequenceBatching, batched: bool) -> Result<SequenceSettings, String> {
    let mut controls = Vec::new();
    for input in &s.control_input {
        for c in &input.control {
            let what = format!("`sequence_batching.control_input` `{}`", input.name);
            let kind = match Kind::try_from(c.kind) {
                Ok(Kind::ControlSequenceStart) => ControlKind::Start,
                Ok(Kind::ControlSequenceEnd) => ControlKind::End,
                Ok(Kind::ControlSequenceReady) => ControlKind::Ready,
                Ok(Kind::ControlSequenceCorrid) => ControlKind::CorrelationId,
                Err(_) => return Err(format!("{what}: unknown control kind {}", c.kind)),
            };
            let values = match kind {
                ControlKind::CorrelationId => {
                    let dtype = super::datatype(c.data_type)
                        .and_then(DataType::parse)
                        .ok_or_else(|| format!("{what}: CONTROL_SEQUENCE_CORRID needs `data_type` (TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING)"))?;
                    ControlValues::Id(dtype)
                }
                _ => flag_values(c).ok_or_else(|| {
                    format!(
                        "{what}: {} needs its false and true values: `int32_false_true`, `fp32_false_true` or `bool_false_true`, two each",
                        kind.as_str()
                    )
                })?,
            };
            controls.push(Control {
                input: input.name.clone(),
                kind,
                values,
            });
        }
    }
    let idle = match s.max_sequence_idle_microseconds {
        0 => DEFAULT_IDLE,
        us => std::time::Duration::from_micros(us),
    };
    let max_sequences = match &s.strategy_choice {
        Some(StrategyChoice::Oldest(o)) if o.max_candidate_sequences > 0 => {
            o.max_candidate_sequences as usize
        }
        _ => DEFAULT_MAX_SEQUENCES,
    };
    let states = s
        .state
        .iter()
        .map(|st| {
            use crate::protocol::grpc::inference::model_sequence_batching::initial_state::StateData;
            // Triton reads a `data_file` from the model folder's `initial_state/`.
            let initial = match st.initial_state.first().and_then(|i| i.state_data.as_ref()) {
                Some(StateData::DataFile(f)) => {
                    let field = format!("state `{}`: initial_state data_file", st.input_name);
                    Some(std::path::Path::new("initial_state").join(crate::settings::in_folder(&field, f)?))
                }
                _ => None,
            };
            let dims = match (st.dims.is_empty(), st.initial_state.first()) {
                (true, Some(i)) => i.dims.clone(),
                _ => st.dims.clone(),
            };
            Ok(State {
                input: st.input_name.clone(),
                output: st.output_name.clone(),
                initial,
                initial_bytes: None,
                dims,
            })
        })
        .collect::<Result<_, String>>()?;
    Ok(SequenceSettings {
        controls,
        states,
        idle,
        max_sequences,
        batched,
    })
}

fn flag_values(
    c: &crate::protocol::grpc::inference::model_sequence_batching::Control,
) -> Option<ControlValues> {
    if let [f, t] = c.int32_false_true[..] {
        return Some(ControlValues::Int32([f, t]));
    }
    if let [f, t] = c.fp32_false_true[..] {
        return Some(ControlValues::Fp32([f.to_bits(), t.to_bits()]));
    }
    if let [f, t] = c.bool_false_true[..] {
        return Some(ControlValues::Bool([f, t]));
    }
    None
}
