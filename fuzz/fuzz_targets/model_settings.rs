#![no_main]

// The logic lives in the main crate (src/fuzz.rs), shared with tests/fuzz_corpus.rs.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice::fuzz::model_settings(data));
