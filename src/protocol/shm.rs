//! Triton's shared-memory extension as the protocols carry it: an input or
//! requested output whose parameters name a registered region
//! (`shared_memory_region`, `shared_memory_byte_size`, and
//! `shared_memory_offset`) has its bytes there instead of in the request or
//! response. The decoders read a region through [`Regions`], implemented by
//! the server's region registry (`crate::shm`), a layer above. Pure: no I/O.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::grpc::inference::{infer_parameter::ParameterChoice, InferParameter};
use crate::error::Error;
use crate::tensor::{Tensor, TensorData};

/// Where a tensor's bytes are: `byte_size` bytes at `offset` of `region`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmRef {
    pub region: String,
    pub offset: usize,
    pub byte_size: usize,
}

/// Read access to the registered regions.
pub trait Regions: Send + Sync {
    /// Decodes the bytes `at` names with `decode` (`what`: the input, for
    /// errors). A region that is not registered, or a range past its end, is
    /// a 400 naming the region and the sizes.
    fn read(
        &self,
        at: &ShmRef,
        what: &str,
        decode: &mut dyn FnMut(&[u8]) -> Result<TensorData, Error>,
    ) -> Result<TensorData, Error>;
}

/// No region is registered (the unit tests' and fuzzers' decoders).
pub struct NoRegions;

impl Regions for NoRegions {
    fn read(
        &self,
        at: &ShmRef,
        what: &str,
        _: &mut dyn FnMut(&[u8]) -> Result<TensorData, Error>,
    ) -> Result<TensorData, Error> {
        Err(not_registered(&at.region, what))
    }
}

/// An input whose bytes are `at`, in a region: its datatype and shape as
/// the request gives them, its elements read through `regions` as the
/// binary extension encodes them.
pub fn read_input(
    name: String,
    datatype: &str,
    shape: &[i64],
    at: &ShmRef,
    regions: &dyn Regions,
) -> Result<Tensor, Error> {
    let what = format!("input `{name}`");
    let dtype = super::v2::parse_datatype(&what, datatype)?;
    let (shape, _) = super::v2::parse_shape(&what, shape)?;
    let data = regions.read(at, &what, &mut |b| super::binary::decode(&what, dtype, &shape, b))?;
    Ok(Tensor { name, shape, data })
}

/// The error for a region that is not registered.
pub fn not_registered(region: &str, what: &str) -> Error {
    Error::invalid(format!(
        "{what}: shared memory region '{}' is not registered; register it first \
         (POST /v2/systemsharedmemory/region/{}/register)",
        crate::error::clip(region),
        crate::error::clip(region)
    ))
}

/// One parameter's value, from either protocol.
enum Param<'a> {
    Int(Option<u64>),
    Text(Option<&'a str>),
}

/// The shared-memory parameters of a V2 JSON input or output, if it has them.
pub fn from_json(params: Option<&Map<String, Value>>, what: &str) -> Result<Option<ShmRef>, Error> {
    let Some(params) = params else { return Ok(None) };
    build(
        |key| {
            params.get(key).map(|v| match key {
                "shared_memory_region" => Param::Text(v.as_str()),
                _ => Param::Int(v.as_u64()),
            })
        },
        what,
    )
}

/// The shared-memory parameters of a gRPC input or output, if it has them.
pub fn from_grpc(params: &HashMap<String, InferParameter>, what: &str) -> Result<Option<ShmRef>, Error> {
    build(
        |key| {
            let choice = params.get(key)?.parameter_choice.as_ref();
            Some(match (key, choice) {
                ("shared_memory_region", Some(ParameterChoice::StringParam(s))) => Param::Text(Some(s)),
                ("shared_memory_region", _) => Param::Text(None),
                (_, Some(ParameterChoice::Int64Param(v))) => Param::Int(u64::try_from(*v).ok()),
                (_, Some(ParameterChoice::Uint64Param(v))) => Param::Int(Some(*v)),
                _ => Param::Int(None),
            })
        },
        what,
    )
}

fn build<'a>(get: impl Fn(&str) -> Option<Param<'a>>, what: &str) -> Result<Option<ShmRef>, Error> {
    let int = |key: &str| -> Result<Option<usize>, Error> {
        match get(key) {
            None => Ok(None),
            Some(Param::Int(Some(n))) => usize::try_from(n).map(Some).map_err(|_| bad(key, what)),
            Some(_) => Err(bad(key, what)),
        }
    };
    let size = int("shared_memory_byte_size")?;
    let offset = int("shared_memory_offset")?;
    let region = match get("shared_memory_region") {
        None => {
            return match (size, offset) {
                (None, None) => Ok(None),
                _ => Err(Error::invalid(format!(
                    "{what}: `shared_memory_byte_size` or `shared_memory_offset` is set without `shared_memory_region`"
                ))),
            }
        }
        Some(Param::Text(Some(r))) if !r.is_empty() => r.to_string(),
        Some(_) => {
            return Err(Error::invalid(format!(
                "{what}: parameter `shared_memory_region` must be a region name (a string)"
            )))
        }
    };
    let Some(byte_size) = size else {
        return Err(Error::invalid(format!(
            "{what}: `shared_memory_region` is set without `shared_memory_byte_size`"
        )));
    };
    Ok(Some(ShmRef {
        region,
        offset: offset.unwrap_or(0),
        byte_size,
    }))
}

fn bad(key: &str, what: &str) -> Error {
    Error::invalid(format!(
        "{what}: parameter `{key}` must be a non-negative integer"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn json_ref(v: Value) -> Result<Option<ShmRef>, Error> {
        from_json(v.as_object(), "input `x`")
    }

    #[test]
    fn parameters_name_a_range_of_a_region() {
        assert_eq!(json_ref(json!({"binary_data_size": 4})).unwrap(), None);
        let r = json_ref(
            json!({"shared_memory_region": "in", "shared_memory_byte_size": 64, "shared_memory_offset": 8}),
        );
        assert_eq!(
            r.unwrap(),
            Some(ShmRef {
                region: "in".into(),
                offset: 8,
                byte_size: 64
            })
        );
        let r = json_ref(json!({"shared_memory_region": "in", "shared_memory_byte_size": 64}));
        assert_eq!(r.unwrap().unwrap().offset, 0);
        for (params, says) in [
            (
                json!({"shared_memory_region": "in"}),
                "without `shared_memory_byte_size`",
            ),
            (
                json!({"shared_memory_byte_size": 4}),
                "without `shared_memory_region`",
            ),
            (
                json!({"shared_memory_region": 3, "shared_memory_byte_size": 4}),
                "must be a region name",
            ),
            (
                json!({"shared_memory_region": "in", "shared_memory_byte_size": -4}),
                "non-negative integer",
            ),
        ] {
            let e = json_ref(params.clone()).unwrap_err().to_string();
            assert!(e.starts_with("input `x`: ") && e.contains(says), "{params}: {e}");
        }
    }

    #[test]
    fn grpc_parameters_read_alike() {
        let p = |c| InferParameter {
            parameter_choice: Some(c),
        };
        let params = HashMap::from([
            (
                "shared_memory_region".to_string(),
                p(ParameterChoice::StringParam("out".into())),
            ),
            (
                "shared_memory_byte_size".to_string(),
                p(ParameterChoice::Int64Param(16)),
            ),
            (
                "shared_memory_offset".to_string(),
                p(ParameterChoice::Int64Param(4)),
            ),
        ]);
        let r = from_grpc(&params, "output `y`").unwrap().unwrap();
        assert_eq!((r.region.as_str(), r.offset, r.byte_size), ("out", 4, 16));
        let e = NoRegions
            .read(&r, "output `y`", &mut |_| unreachable!())
            .unwrap_err();
        assert!(e.to_string().contains("region 'out' is not registered"), "{e}");
    }
}
