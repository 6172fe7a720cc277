//! Fuzz the plan-file reader (`PlanFile::from_safetensors`, the neuron table inside it).
//!
//! Input: byte 0 = layer count (mod 8), byte 1 = neurons per layer, then the file's bytes.
//! Every input must end in a `Plan` error or a plan that passes its own invariants.
#![no_main]

use libfuzzer_sys::fuzz_target;
use powerinfer_core::{Error, PlanFile};

fuzz_target!(|data: &[u8]| {
    let [l, f, bytes @ ..] = data else { return };
    let (n_layers, ffn) = (usize::from(*l % 8), usize::from(*f));
    match PlanFile::from_safetensors(bytes, n_layers, ffn) {
        Ok(plan) => {
            assert_eq!(plan.table.layers.len(), n_layers);
            for (i, layer) in plan.table.layers.iter().enumerate() {
                assert_eq!(layer.hot.len() + layer.cold.len(), ffn);
                assert_eq!(plan.n_slabs(i), plan.ffn_buckets[i]);
            }
            let _ = plan.uses_gpu();
        }
        Err(Error::Plan(_)) => {}
        Err(e) => panic!("untyped plan-file error: {e:?}"),
    }
});
