//! Fuzz the neuron store's header reader: see `powerinfer_fuzz::checks::neuron_store_header`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| powerinfer_fuzz::checks::neuron_store_header(data));
