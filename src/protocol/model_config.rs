//! Triton's model-configuration extension: `GET /v2/models/{name}/config`
//! and the `ModelConfig` RPC. The JSON shape is Triton's (`name`,
//! `platform`, `backend`, `max_batch_size`, `input`, `output`,
//! `dynamic_batching`), which perf_analyzer reads to shape its requests. As
//! in Triton, when `max_batch_size > 0` the tensors' `dims` leave out the
//! batch dimension. Pure: no I/O.

use serde::{Deserialize, Serialize};

use super::grpc::inference;
use crate::tensor::{DataType, Signature, TensorSpec};

/// A model's configuration, in Triton's JSON shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub name: String,
    /// Always `"onnxruntime_onnx"`.
    pub platform: String,
    /// Always `"onnxruntime"`.
    pub backend: String,
    /// Most rows (dim 0) in one batch; 0 when the model has no batch dimension.
    pub max_batch_size: usize,
    pub input: Vec<ConfigTensor>,
    pub output: Vec<ConfigTensor>,
    /// Present when the model batches requests together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatching>,
}

/// An input or output in a [`ModelConfig`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConfigTensor {
    pub name: String,
    /// `TYPE_FP32`, `TYPE_STRING` (BYTES), ...
    pub data_type: String,
    /// Dimensions without the batch dimension when `max_batch_size > 0`; -1 = any size.
    pub dims: Vec<i64>,
}

/// How the model's batcher groups requests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DynamicBatching {
    /// `max_batch_time`: longest a request waits for its batch to fill.
    pub max_queue_delay_microseconds: u64,
    pub default_queue_policy: QueuePolicy,
}

/// Queue limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuePolicy {
    /// `max_queue_size`.
    pub max_queue_size: usize,
    /// `timeout`: how long a request may take, queue included.
    pub default_timeout_microseconds: u64,
}

/// Triton's name of a datatype in model configurations (BYTES is `TYPE_STRING`).
pub fn config_datatype(d: DataType) -> &'static str {
    match d {
        DataType::Bool => "TYPE_BOOL",
        DataType::U8 => "TYPE_UINT8",
        DataType::U16 => "TYPE_UINT16",
        DataType::U32 => "TYPE_UINT32",
        DataType::U64 => "TYPE_UINT64",
        DataType::I8 => "TYPE_INT8",
        DataType::I16 => "TYPE_INT16",
        DataType::I32 => "TYPE_INT32",
        DataType::I64 => "TYPE_INT64",
        DataType::F16 => "TYPE_FP16",
        DataType::Bf16 => "TYPE_BF16",
        DataType::F32 => "TYPE_FP32",
        DataType::F64 => "TYPE_FP64",
        DataType::Bytes => "TYPE_STRING",
    }
}

impl ModelConfig {
    /// The configuration of a model with `sig`. `max_batch_size > 0` declares
    /// a batch dimension (dim 0 of every tensor), which `dims` then leave out.
    pub fn new(
        name: &str,
        sig: &Signature,
        max_batch_size: usize,
        dynamic_batching: Option<DynamicBatching>,
    ) -> ModelConfig {
        let tensor = |t: &TensorSpec| ConfigTensor {
            name: t.name.clone(),
            data_type: config_datatype(t.dtype).to_string(),
            dims: t
                .shape
                .iter()
                .skip(usize::from(max_batch_size > 0))
                .copied()
                .collect(),
        };
        ModelConfig {
            name: name.to_string(),
            platform: "onnxruntime_onnx".to_string(),
            backend: "onnxruntime".to_string(),
            max_batch_size,
            input: sig.inputs.iter().map(tensor).collect(),
            output: sig.outputs.iter().map(tensor).collect(),
            dynamic_batching,
        }
    }
}

fn proto_datatype(name: &str) -> i32 {
    inference::DataType::from_str_name(name).unwrap_or(inference::DataType::TypeInvalid) as i32
}

impl From<&ModelConfig> for inference::ModelConfig {
    fn from(c: &ModelConfig) -> Self {
        use inference::model_config::SchedulingChoice;
        inference::ModelConfig {
            name: c.name.clone(),
            platform: c.platform.clone(),
            backend: c.backend.clone(),
            max_batch_size: i32::try_from(c.max_batch_size).unwrap_or(i32::MAX),
            input: c
                .input
                .iter()
                .map(|t| inference::ModelInput {
                    name: t.name.clone(),
                    data_type: proto_datatype(&t.data_type),
                    dims: t.dims.clone(),
                    ..Default::default()
                })
                .collect(),
            output: c
                .output
                .iter()
                .map(|t| inference::ModelOutput {
                    name: t.name.clone(),
                    data_type: proto_datatype(&t.data_type),
                    dims: t.dims.clone(),
                    ..Default::default()
                })
                .collect(),
            instance_group: Vec::new(),
            scheduling_choice: c.dynamic_batching.as_ref().map(|d| {
                SchedulingChoice::DynamicBatching(inference::ModelDynamicBatching {
                    preferred_batch_size: Vec::new(),
                    max_queue_delay_microseconds: d.max_queue_delay_microseconds,
                    default_queue_policy: Some(inference::ModelQueuePolicy {
                        default_timeout_microseconds: d.default_queue_policy.default_timeout_microseconds,
                        max_queue_size: u32::try_from(d.default_queue_policy.max_queue_size)
                            .unwrap_or(u32::MAX),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            }),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sig() -> Signature {
        let spec = |name: &str, dtype, shape: &[i64]| TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            dim_names: vec![],
        };
        Signature {
            inputs: vec![
                spec("x", DataType::F32, &[-1, 784]),
                spec("s", DataType::Bytes, &[-1]),
            ],
            outputs: vec![spec("y", DataType::I64, &[-1, 10])],
        }
    }

    #[test]
    fn batching_models_leave_out_the_batch_dim() {
        let batching = DynamicBatching {
            max_queue_delay_microseconds: 2000,
            default_queue_policy: QueuePolicy {
                max_queue_size: 1024,
                default_timeout_microseconds: 60_000_000,
            },
        };
        let c = serde_json::to_value(ModelConfig::new("mlp", &sig(), 64, Some(batching))).unwrap();
        assert_eq!(
            c,
            json!({"name": "mlp", "platform": "onnxruntime_onnx", "backend": "onnxruntime",
                "max_batch_size": 64,
                "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [784]},
                          {"name": "s", "data_type": "TYPE_STRING", "dims": []}],
                "output": [{"name": "y", "data_type": "TYPE_INT64", "dims": [10]}],
                "dynamic_batching": {"max_queue_delay_microseconds": 2000,
                    "default_queue_policy": {"max_queue_size": 1024, "default_timeout_microseconds": 60000000}}})
        );
    }

    #[test]
    fn models_without_a_batch_dim_keep_every_dim() {
        let c = ModelConfig::new("fixed", &sig(), 0, None);
        assert_eq!(c.input[0].dims, vec![-1, 784]);
        assert!(serde_json::to_value(&c)
            .unwrap()
            .get("dynamic_batching")
            .is_none());
        let p = inference::ModelConfig::from(&c);
        assert_eq!(p.input[0].data_type, inference::DataType::TypeFp32 as i32);
        assert_eq!(p.input[1].data_type, inference::DataType::TypeString as i32);
        assert!(p.scheduling_choice.is_none());
    }

    #[test]
    fn every_datatype_has_a_proto_enum_value() {
        for d in DataType::ALL {
            assert_ne!(proto_datatype(config_datatype(d)), 0, "{d}");
        }
    }
}
