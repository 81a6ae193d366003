//! Triton's `model_warmup` samples (a `config.pbtxt`'s), made into warm-up
//! requests: each sample is written as a V2 binary request body and read by
//! the same decoder and checks as a client's request, so a sample that does
//! not fit the model is refused with the request's own message.

use std::path::Path;

use serde_json::json;

use crate::protocol::grpc::inference::model_warmup::input::InputDataType;
use crate::protocol::grpc::inference::{ModelConfig, ModelWarmup};
use crate::protocol::{self, v2_binary};
use crate::tensor::{DataType, Signature, Tensor};
use crate::triton::mapping;

/// Most runs of one sample (its `count`): a load stays bounded.
const MOST_RUNS: u32 = 8;

/// The inputs of each of `config`'s `model_warmup` samples, each repeated
/// its `count` (at least once, at most [`MOST_RUNS`]). `dir`: the model's
/// folder (an `input_data_file` is read from its `warmup/`).
pub fn samples(
    dir: &Path,
    model: &str,
    config: &ModelConfig,
    sig: &Signature,
) -> Result<Vec<Vec<Tensor>>, String> {
    let mut out = Vec::new();
    for w in &config.model_warmup {
        let what = format!("`model_warmup` sample `{}`", w.name);
        let (body, header) = body(dir, config.max_batch_size > 0, w).map_err(|e| format!("{what}: {e}"))?;
        let header = header.to_string();
        let regions = protocol::shm::NoRegions;
        let mut req = v2_binary::decode_request(&body, Some(header.as_bytes()), &regions)
            .map_err(|e| format!("{what}: {e}"))?
            .request;
        protocol::validate(&mut req, model, sig)
            .map_err(|e| format!("{what} does not fit the model: {e}"))?;
        for _ in 0..w.count.clamp(1, MOST_RUNS) {
            out.push(req.inputs.clone());
        }
    }
    Ok(out)
}

/// Sample `w` as a V2 binary request body, and its JSON header's length.
/// `batched`: the config's `max_batch_size` is above 0, so the sample's
/// `batch_size` rows lead each input's `dims`.
fn body(dir: &Path, batched: bool, w: &ModelWarmup) -> Result<(Vec<u8>, usize), String> {
    let rows = w.batch_size.max(1) as usize;
    let mut names: Vec<&String> = w.inputs.keys().collect();
    names.sort();
    let (mut inputs, mut data) = (Vec::new(), Vec::new());
    for (n, name) in names.into_iter().enumerate() {
        let input = &w.inputs[name];
        let datatype = mapping::datatype(input.data_type)
            .ok_or_else(|| format!("input `{name}`: `data_type` is not set"))?;
        let dtype = DataType::parse(datatype)
            .ok_or_else(|| format!("input `{name}`: {datatype} is not supported"))?;
        let mut shape = Vec::with_capacity(input.dims.len() + 1);
        if batched {
            shape.push(rows);
        }
        for d in &input.dims {
            let d = usize::try_from(*d).map_err(|_| {
                format!("input `{name}`: `dims` must be sizes (no -1) in a warm-up sample, got {d}")
            })?;
            shape.push(d);
        }
        let elements: usize = shape.iter().product();
        let bytes = match &input.input_data_type {
            None | Some(InputDataType::ZeroData(_)) => zeros(dtype, elements),
            Some(InputDataType::RandomData(_)) => random(dtype, elements, n as u64 + 1),
            Some(InputDataType::InputDataFile(file)) => {
                let per_row = if batched { elements / rows.max(1) } else { elements };
                from_file(dir, file, dtype, elements, per_row).map_err(|e| format!("input `{name}`: {e}"))?
            }
        };
        inputs.push(json!({
            "name": name,
            "datatype": datatype,
            "shape": shape,
            "parameters": {"binary_data_size": bytes.len()},
        }));
        data.extend(bytes);
    }
    let mut body = serde_json::to_vec(&json!({ "inputs": inputs })).expect("JSON of plain values");
    let header = body.len();
    body.extend(data);
    Ok((body, header))
}

/// `elements` zeros (empty strings for BYTES: a 4-byte length of 0 each).
fn zeros(dtype: DataType, elements: usize) -> Vec<u8> {
    vec![0; elements * dtype.size_of().unwrap_or(4)]
}

/// `elements` random values: floats in [0, 1), integers in [0, 8) (valid
/// indices of any table of 8 or more), booleans, empty strings for BYTES.
/// Seeded, so that a load warms up the same way each time.
fn random(dtype: DataType, elements: usize, seed: u64) -> Vec<u8> {
    // SplitMix64: a few lines instead of a crate for warm-up values.
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = move || {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let mut out = Vec::with_capacity(elements * dtype.size_of().unwrap_or(4));
    for _ in 0..elements {
        let r = next();
        let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
        let small = r % 8;
        match dtype {
            DataType::F32 => out.extend((unit as f32).to_le_bytes()),
            DataType::F64 => out.extend(unit.to_le_bytes()),
            DataType::F16 => out.extend(half::f16::from_f64(unit).to_le_bytes()),
            DataType::Bf16 => out.extend(half::bf16::from_f64(unit).to_le_bytes()),
            DataType::Bool => out.push((r & 1) as u8),
            DataType::Bytes => out.extend(0u32.to_le_bytes()),
            other => {
                let size = other.size_of().expect("fixed-size type");
                out.extend(&small.to_le_bytes()[..size]);
            }
        }
    }
    out
}

/// The bytes of `warmup/<file>`: the whole sample (`elements` values), or
/// one row (`per_row` values) repeated for every row. BYTES: elements as
/// the binary extension writes them (a 4-byte length, then the bytes).
fn from_file(
    dir: &Path,
    file: &str,
    dtype: DataType,
    elements: usize,
    per_row: usize,
) -> Result<Vec<u8>, String> {
    let relative = Path::new(file);
    if relative.is_absolute()
        || relative
            .components()
            .any(|c| c == std::path::Component::ParentDir)
    {
        return Err(format!(
            "`input_data_file` `{file}` must be a file of the folder's `warmup/`"
        ));
    }
    let path = dir.join(super::SAMPLES_DIR).join(relative);
    let bytes = std::fs::read(&path).map_err(|e| format!("`input_data_file` warmup/{file}: {e}"))?;
    let Some(size) = dtype.size_of() else {
        // Strings: no size check here; the decoder counts the elements.
        return Ok(bytes);
    };
    let rows = elements / per_row.max(1);
    match bytes.len() {
        n if n == elements * size => Ok(bytes),
        n if n == per_row * size => Ok(bytes.repeat(rows)),
        n => Err(format!(
            "`input_data_file` warmup/{file} holds {n} bytes: the sample needs {} ({elements} × {size}), or one row of {}",
            elements * size,
            per_row * size
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorSpec;

    fn sig() -> Signature {
        let spec = |name: &str, dtype, shape: &[i64]| TensorSpec {
            name: name.into(),
            dtype,
            shape: shape.to_vec(),
            dim_names: Default::default(),
        };
        Signature {
            inputs: vec![
                spec("x", DataType::F32, &[-1, 4]),
                spec("ids", DataType::I64, &[-1, 2]),
            ],
            outputs: vec![spec("y", DataType::F32, &[-1, 1])],
        }
    }

    fn config(text: &str) -> ModelConfig {
        crate::triton::config::from_text(text).unwrap()
    }

    #[test]
    fn zero_random_and_file_samples_become_requests() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("warmup")).unwrap();
        // One row of `x`, repeated for each of the 3 rows.
        let row: Vec<u8> = [1f32, 2., 3., 4.].iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(dir.path().join("warmup/x.bin"), row).unwrap();
        let c = config(
            r#"max_batch_size: 8
            model_warmup [
              { name: "zeros" batch_size: 2 count: 3
                inputs { key: "x" value: { data_type: TYPE_FP32 dims: [4] zero_data: true } }
                inputs { key: "ids" value: { data_type: TYPE_INT64 dims: [2] random_data: true } } },
              { name: "file" batch_size: 3
                inputs { key: "x" value: { data_type: TYPE_FP32 dims: [4] input_data_file: "x.bin" } }
                inputs { key: "ids" value: { data_type: TYPE_INT64 dims: [2] zero_data: true } } }
            ]"#,
        );
        let s = samples(dir.path(), "m", &c, &sig()).unwrap();
        assert_eq!(s.len(), 4, "count 3, then 1");
        let x = s[0].iter().find(|t| t.name == "x").unwrap();
        assert_eq!(x.shape, [2, 4]);
        let ids = s[0].iter().find(|t| t.name == "ids").unwrap();
        match &ids.data {
            crate::tensor::TensorData::I64(v) => assert!(v.iter().all(|i| (0..8).contains(i)), "{v:?}"),
            other => panic!("{other:?}"),
        }
        let x = s[3].iter().find(|t| t.name == "x").unwrap();
        assert_eq!(x.shape, [3, 4]);
        match &x.data {
            crate::tensor::TensorData::F32(v) => assert_eq!(v, &[1., 2., 3., 4.].repeat(3)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_sample_that_does_not_fit_names_the_sample_and_why() {
        let dir = tempfile::tempdir().unwrap();
        let bad = |text: &str| samples(dir.path(), "m", &config(text), &sig()).unwrap_err();
        let e = bad(r#"max_batch_size: 8
            model_warmup { name: "w" batch_size: 1
              inputs { key: "x" value: { data_type: TYPE_FP32 dims: [5] zero_data: true } }
              inputs { key: "ids" value: { data_type: TYPE_INT64 dims: [2] zero_data: true } } }"#);
        assert!(
            e.contains("`model_warmup` sample `w` does not fit the model"),
            "{e}"
        );
        let e = bad(r#"max_batch_size: 8
            model_warmup { name: "w" batch_size: 1
              inputs { key: "x" value: { data_type: TYPE_FP32 dims: [4] input_data_file: "../x" } } }"#);
        assert!(e.contains("must be a file of the folder's `warmup/`"), "{e}");
        let e = bad(r#"max_batch_size: 8
            model_warmup { name: "w" batch_size: 1
              inputs { key: "x" value: { data_type: TYPE_FP32 dims: [-1] zero_data: true } } }"#);
        assert!(e.contains("no -1"), "{e}");
    }
}
