//! Fuzz the plan-file reader: see `powerinfer_fuzz::checks::plan_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| powerinfer_fuzz::checks::plan_file(data));
