//! Texts (or token ids) in, one vector per input out: what `/v1/embeddings`
//! asks of a text-embedding model, a pipeline with a tokenizer step and one
//! FP32 `[texts, dim]` output.

use std::time::Instant;

use super::ModelHandle;
use crate::error::{Error, Result};
use crate::protocol::openai::Input;
use crate::protocol::{InferRequest, Schedule};
use crate::tensor::{DataType, Strings, Tensor, TensorData};

/// The vectors of one embeddings request.
pub struct Embeddings {
    /// `[inputs, dim]`, in the inputs' order.
    pub vectors: Vec<f32>,
    pub dim: usize,
    /// Tokens of every input, special tokens included.
    pub tokens: usize,
}

impl ModelHandle {
    /// Embeds `input`, keeping the first `dimensions` of each vector (scaled
    /// back to length 1 when the model's vectors are).
    pub async fn embed(
        &self,
        input: Input,
        dimensions: Option<usize>,
        schedule: Schedule,
        arrival: Instant,
    ) -> Result<Embeddings> {
        let not_text = |why: String| {
            Error::invalid(format!(
                "model `{}` is not a text embedding model ({why}); call /v2/models/{}/infer with its tensors",
                self.name, self.name
            ))
        };
        let p = self
            .pipeline()
            .ok_or_else(|| not_text("it takes tensors, not text".into()))?;
        let (tokenizer, names) = p
            .tokenizer()
            .ok_or_else(|| not_text("it has no tokenizer step".into()))?;
        let out = match p.signature.outputs.as_slice() {
            [o] if o.dtype == DataType::F32 && o.shape.len() == 2 => o.name.clone(),
            _ => return Err(not_text("its output is not one FP32 vector per text".into())),
        };
        let mask = names.get("attention_mask").map(|m| m.to_string());
        let n = input.len();
        tokenizer.check_count(n, "input")?;
        let mut outputs = vec![out];
        outputs.extend(mask.clone());
        let (tokenized, inputs) = match input {
            Input::Texts(texts) => {
                let [text] = p.signature.inputs.as_slice() else {
                    return Err(not_text("it takes more than text".into()));
                };
                let strings: Strings = texts.iter().collect();
                (
                    false,
                    vec![Tensor::new(&text.name, vec![n], TensorData::Bytes(strings))
                        .map_err(Error::Internal)?],
                )
            }
            Input::Tokens(ids) => (true, token_tensors(&ids, tokenizer, &names)),
        };
        let req = InferRequest {
            id: None,
            inputs,
            outputs: Some(outputs),
            schedule,
            classify: Vec::new(),
            sequence: None,
        };
        let resp = self
            .counted(arrival, self.run_pipeline(p, req, arrival, tokenized))
            .await?;
        let mut it = resp.outputs.into_iter();
        let vectors = it
            .next()
            .ok_or_else(|| Error::Internal("the pipeline answered no vectors".into()))?;
        let tokens = match it.next().map(|m| m.data) {
            Some(TensorData::I64(m)) => m.iter().filter(|x| **x != 0).count(),
            Some(TensorData::I32(m)) => m.iter().filter(|x| **x != 0).count(),
            _ => 0,
        };
        let (TensorData::F32(mut v), [rows, dim]) = (vectors.data, vectors.shape.as_slice()) else {
            return Err(Error::Internal(
                "the pipeline's vectors are not FP32 [texts, dim]".into(),
            ));
        };
        let (rows, dim) = (*rows, *dim);
        let Some(keep) = dimensions.filter(|d| *d != dim) else {
            return Ok(Embeddings {
                vectors: v,
                dim,
                tokens,
            });
        };
        if keep > dim {
            return Err(Error::invalid(format!(
                "`dimensions` is {keep}: model `{}` makes vectors of {dim}; ask for {dim} or fewer",
                self.name
            )));
        }
        let mut cut = Vec::with_capacity(rows * keep);
        for row in v.chunks_exact_mut(dim) {
            let start = cut.len();
            cut.extend_from_slice(&row[..keep]);
            if p.normalizes() {
                super::pipeline::pool::normalize(&mut cut[start..]);
            }
        }
        Ok(Embeddings {
            vectors: cut,
            dim: keep,
            tokens,
        })
    }
}

/// Token ids as the tokenizer step would make them, named as the
/// pipeline names its tokenizer's outputs.
fn token_tensors(
    ids: &[Vec<i64>],
    tokenizer: &super::pipeline::tokenize::Tokenize,
    names: &std::collections::HashMap<&str, &str>,
) -> Vec<Tensor> {
    let t = tokenizer.from_ids(ids);
    [t.input_ids, t.attention_mask, t.token_type_ids]
        .into_iter()
        .filter_map(|mut tensor| {
            tensor.name = names.get(tensor.name.as_str())?.to_string();
            Some(tensor)
        })
        .collect()
}
