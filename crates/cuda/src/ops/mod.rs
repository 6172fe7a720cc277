//! The kernel families, one folder each as in `kernels/<family>.cu`: `rows` (sparse_matvec.cu),
//! `axpy` (axpy_down.cu), `compact`, `predictor`, `norm_rope`, `attention`, `elementwise` and
//! `moe`. Each folder holds its family's checked operations (a `*Ops` trait every backend gets,
//! in `mod.rs`: shapes checked on the host, then the launch queued; empty work returns `Ok`
//! without one; each check returns the same `Error` kind on every backend), its launches
//! (`launch.rs`: a struct per kernel, or per group of kernels with the same parameters told
//! apart by a field, implementing [`Kernel`](crate::backend::Kernel), with the module's
//! [`KernelSource`]) and its contract on host memory (`host.rs`, what gpu-sim runs).
//! [`upload`] holds the copies and weight uploads. Nothing here waits for the device except
//! `download`. A new kernel is one `.cu` (or a few lines in one), its family's three files, and
//! its tests; a new family adds its folder here, to [`SOURCES`] and to [`prelude`].

use crate::kernels::KernelSource;

pub mod attention;
pub mod axpy;
pub mod compact;
pub mod elementwise;
pub mod moe;
pub mod norm_rope;
pub mod predictor;
pub mod rows;
pub mod upload;

#[cfg(test)]
pub(crate) mod testutil;

/// Every kernel module (`kernels/*.cu`), as its family declares it.
pub const SOURCES: [KernelSource; 8] = [
    rows::launch::SOURCE,
    axpy::launch::SOURCE,
    compact::launch::SOURCE,
    predictor::launch::SOURCE,
    norm_rope::launch::SOURCE,
    attention::launch::SOURCE,
    elementwise::launch::SOURCE,
    moe::launch::SOURCE,
];

/// Every family's operations: `use powerinfer_cuda::ops::prelude::*` gives a backend all of
/// them.
pub mod prelude {
    pub use super::attention::AttentionOps;
    pub use super::axpy::AxpyOps;
    pub use super::compact::CompactOps;
    pub use super::elementwise::ElementwiseOps;
    pub use super::moe::MoeOps;
    pub use super::norm_rope::NormRopeOps;
    pub use super::predictor::PredictorOps;
    pub use super::rows::RowOps;
    pub use super::upload::UploadOps;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::{dtype_suffix, kv_entry, GPU_DTYPES, KV_ELEMS};

    #[test]
    fn every_listed_kernel_is_defined_in_its_source() {
        for src in SOURCES {
            for p in src.per_dtype {
                // Per-dtype kernels come from one macro instantiated per format.
                for d in GPU_DTYPES {
                    let call = format!("({})", dtype_suffix(d));
                    assert!(src.source.contains(&call), "{}: {p}{call}", src.name);
                }
            }
            // Per-KV-element kernels come from one macro instantiated per element type, which
            // takes the entry names.
            for p in src.per_kv_elem {
                for e in KV_ELEMS {
                    let name = kv_entry(p, e);
                    let arg = [format!("({name},"), format!(" {name},")];
                    assert!(arg.iter().any(|a| src.source.contains(a)), "{name}");
                }
            }
            for s in src.single {
                let def = format!("KERNEL {s}(");
                assert!(src.source.contains(&def), "{}: {s}", src.name);
            }
        }
        assert_eq!(rows::launch::SOURCE.entries().len(), 23);
        assert!(rows::launch::SOURCE
            .entries()
            .contains(&"gate_up_q6_k".to_string()));
        assert_eq!(
            attention::launch::SOURCE.entries(),
            [
                "kv_store",
                "kv_store_f32",
                "attention_decode",
                "attention_decode_f32",
                "attention_merge"
            ]
        );
    }

    #[test]
    fn every_kernel_file_is_a_listed_module() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/kernels");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let p = e.unwrap().path();
                let stem = p.file_stem()?.to_str()?.to_string();
                (p.extension()? == "cu").then_some(stem)
            })
            .collect();
        files.sort();
        let mut listed: Vec<String> = SOURCES.iter().map(|s| s.name.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed);
    }
}
