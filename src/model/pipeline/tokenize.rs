//! The built-in tokenizer step: a Hugging Face `tokenizer.json` (the
//! `tokenizers` crate, as TEI uses it) turns a request's texts into token
//! ids. The request's texts are padded to its longest; padding across
//! requests is the encoder's batcher's job (its `padding` settings).

use std::path::Path;

use tokenizers::{Tokenizer, TruncationParams};

use crate::error::{Error, Result};
use crate::settings::pipeline::TokenizerStep;
use crate::tensor::{DataType, Tensor, TensorData, TensorSpec};

/// A loaded tokenizer, shared by every request of the pipeline.
pub struct Tokenize {
    tokenizer: Tokenizer,
    /// Tokens kept per text, special tokens included (`None`: no truncation).
    pub max_length: Option<usize>,
    pad_id: i64,
    /// Ids and masks as INT32 (else INT64).
    pub int32: bool,
    /// The step's `max_texts` and `max_text_bytes`, checked before any text is tokenized.
    max_texts: usize,
    max_text_bytes: usize,
}

/// A request's texts as token ids: `[texts, longest]` each.
pub struct Tokens {
    pub input_ids: Tensor,
    pub attention_mask: Tensor,
    pub token_type_ids: Tensor,
    /// Tokens of every text, special tokens included, padding not (OpenAI's `usage`).
    pub count: usize,
}

impl Tokenize {
    /// Reads `file`; the step's `max_length` replaces the file's own
    /// truncation. The file's padding is turned off (a request is padded to
    /// its longest text).
    pub fn load(file: &Path, step: &TokenizerStep) -> std::result::Result<Tokenize, String> {
        let (max_length, int32) = (step.max_length, step.int32);
        let mut tokenizer = Tokenizer::from_file(file)
            .map_err(|e| format!("{}: not a tokenizer.json: {e}", file.display()))?;
        let pad_id = tokenizer.get_padding().map_or(0, |p| i64::from(p.pad_id));
        tokenizer.with_padding(None);
        let truncation = match max_length {
            Some(n) => Some(TruncationParams {
                max_length: n,
                ..Default::default()
            }),
            None => tokenizer.get_truncation().cloned(),
        };
        let max_length = truncation.as_ref().map(|t| t.max_length);
        tokenizer
            .with_truncation(truncation)
            .map_err(|e| format!("{}: truncation: {e}", file.display()))?;
        Ok(Tokenize {
            tokenizer,
            max_length,
            pad_id,
            int32,
            max_texts: step.max_texts,
            max_text_bytes: step.max_text_bytes,
        })
    }

    /// The step's tensors: `text` in, token ids out.
    pub fn specs(&self) -> (Vec<TensorSpec>, Vec<TensorSpec>) {
        let ids = if self.int32 { DataType::I32 } else { DataType::I64 };
        let spec = |name: &str, dtype, rank| TensorSpec {
            name: name.into(),
            dtype,
            shape: vec![-1; rank],
            dim_names: Vec::new(),
        };
        (
            vec![spec("text", DataType::Bytes, 1)],
            ["input_ids", "attention_mask", "token_type_ids"]
                .iter()
                .map(|n| spec(n, ids, 2))
                .collect(),
        )
    }

    /// Tokenizes every element of `text` (BYTES, any shape: one text each).
    pub fn run(&self, text: &Tensor) -> Result<Tokens> {
        let TensorData::Bytes(strings) = &text.data else {
            return Err(Error::invalid(format!(
                "`{}` must be BYTES (texts), got {}",
                text.name,
                text.dtype().as_str()
            )));
        };
        self.check_count(strings.len(), &text.name)?;
        if let Some((i, s)) = strings
            .iter()
            .enumerate()
            .find(|(_, s)| s.len() > self.max_text_bytes)
        {
            return Err(Error::invalid(format!(
                "text {i} of `{}` is {} bytes, more than the tokenizer's `max_text_bytes` of {}; \
                 split it, or raise the pipeline's tokenizer `max_text_bytes`",
                text.name,
                s.len(),
                self.max_text_bytes
            )));
        }
        let mut encodings = Vec::with_capacity(strings.len());
        for (i, s) in strings.iter().enumerate() {
            let s = std::str::from_utf8(s)
                .map_err(|e| Error::invalid(format!("text {i} of `{}` is not UTF-8: {e}", text.name)))?;
            let enc = self.tokenizer.encode_fast(s, true).map_err(|e| {
                Error::invalid(format!("text {i} of `{}` cannot be tokenized: {e}", text.name))
            })?;
            encodings.push(enc);
        }
        let rows = encodings.iter().map(|e| {
            let (ids, mask, types) = (e.get_ids(), e.get_attention_mask(), e.get_type_ids());
            ids.iter()
                .zip(mask)
                .zip(types)
                .map(|((i, m), t)| (i64::from(*i), i64::from(*m), i64::from(*t)))
        });
        Ok(self.pack(rows.collect()))
    }

    /// Refuses more than `max_texts` texts in one request, before any is tokenized.
    pub fn check_count(&self, texts: usize, name: &str) -> Result<()> {
        match texts > self.max_texts {
            true => Err(Error::invalid(format!(
                "`{name}` holds {texts} texts, more than the tokenizer's `max_texts` of {}; \
                 send them in several requests, or raise the pipeline's tokenizer `max_texts`",
                self.max_texts
            ))),
            false => Ok(()),
        }
    }

    /// Token ids a client tokenized itself, as [`Tokenize::run`] would give
    /// them: truncated to `max_length`, a mask of 1 and type 0 on each token.
    pub fn from_ids(&self, ids: &[Vec<i64>]) -> Tokens {
        let kept = |t: &[i64]| self.max_length.map_or(t.len(), |m| t.len().min(m));
        let rows = ids.iter().map(|t| t[..kept(t)].iter().map(|id| (*id, 1, 0)));
        self.pack(rows.collect())
    }

    /// Rows of (id, mask, type) per token as `[rows, longest]` tensors, the
    /// shorter rows padded with the pad id and a mask of 0.
    fn pack<R: ExactSizeIterator<Item = (i64, i64, i64)>>(&self, rows: Vec<R>) -> Tokens {
        let n = rows.len();
        let longest = rows.iter().map(ExactSizeIterator::len).max().unwrap_or(0);
        let mut ids = vec![self.pad_id; n * longest];
        let mut mask = vec![0i64; n * longest];
        let mut types = vec![0i64; n * longest];
        let mut count = 0;
        for (row, tokens) in rows.into_iter().enumerate() {
            count += tokens.len();
            for (j, (id, m, t)) in tokens.enumerate() {
                let at = row * longest + j;
                (ids[at], mask[at], types[at]) = (id, m, t);
            }
        }
        let int32 = self.int32;
        let make = |name: &str, v: Vec<i64>| Tensor {
            name: name.into(),
            shape: vec![n, longest],
            // Token ids and masks fit INT32 (vocabularies are far smaller).
            data: match int32 {
                true => TensorData::I32(v.into_iter().map(|x| x as i32).collect()),
                false => TensorData::I64(v),
            },
        };
        Tokens {
            input_ids: make("input_ids", ids),
            attention_mask: make("attention_mask", mask),
            token_type_ids: make("token_type_ids", types),
            count,
        }
    }
}
