//! Fuzz the weight layout checks and row decoding: see `powerinfer_fuzz::checks::weight_rows`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| powerinfer_fuzz::checks::weight_rows(data));
