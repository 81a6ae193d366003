//! The JSON tensor codec. [`read`] reads a tensor's elements from JSON
//! bytes, for V1 `instances`, V2 `data` (the all-JSON body, in one pass or
//! through serde_json, and the binary extension's JSON header); the element
//! errors are written once, in [`element`]. [`JsonElements`] writes them
//! back for every JSON response.
//!
//! - `decode`: the walk over flat or nested arrays, and V1's row shapes;
//! - `element`: one leaf as the tensor's datatype (numbers by `lexical-core`);
//! - `f32_run`: runs of plain FP32 decimals read 32 bytes at a time (AVX2),
//!   ahead of `element` where it can;
//! - `encode`: typed vectors written as (nested) JSON arrays.

mod decode;
mod element;
mod encode;
mod f32_run;

pub(crate) use decode::{after_ws, read, Layout};
pub(crate) use element::number;
pub(crate) use encode::{JsonElement, JsonElements};

/// JSON text for an error message, cut short when long.
pub(crate) fn show(text: &str) -> String {
    match text.char_indices().nth(40) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// A seeded xorshift generator for the codec's tests.
#[cfg(test)]
pub(crate) struct Rng(pub u64);

#[cfg(test)]
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform-ish in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}
