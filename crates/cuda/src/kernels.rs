//! The CUDA C sources, one per op family, and the `extern "C"` entry points each one defines.
//! Every source is compiled on its own (NVRTC: one program per module) after `common.cuh`, which
//! holds the shared decoding helpers; the registry and the PTX test both read this table.

use powerinfer_core::DType;

use crate::backend::KvElem;

/// Every weight format the GPU kernels take: each per-format kernel is instantiated once for
/// each (`<prefix>_<suffix>`, see [`dtype_suffix`]). The rest (Q2_K, Q3_K) run on the CPU only;
/// [`crate::ops`] refuses them with `Error::Unsupported` before anything is uploaded.
pub const GPU_DTYPES: [DType; 11] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
];

/// The element types of the device KV cache ([`KvElem::NAME`]): the KV-cache kernels are
/// defined once for each (see [`kv_entry`]).
pub const KV_ELEMS: [&str; 2] = [<u16 as KvElem>::NAME, <f32 as KvElem>::NAME];

/// The entry name of KV-cache kernel `prefix` for caches of `elem` ([`KV_ELEMS`]): the bare
/// prefix for f16 (the default cache), `<prefix>_<elem>` otherwise ("kv_store_f32").
pub fn kv_entry(prefix: &str, elem: &str) -> String {
    if elem == <u16 as KvElem>::NAME {
        prefix.to_string()
    } else {
        format!("{prefix}_{elem}")
    }
}

/// Whether the GPU kernels take weights stored as `dtype` ([`GPU_DTYPES`]).
pub fn is_gpu_dtype(dtype: DType) -> bool {
    GPU_DTYPES.contains(&dtype)
}

/// Helpers prepended to every module (types, f16/bf16 decoding, GGUF blocks, warp sums).
pub const COMMON: &str = include_str!("../kernels/common.cuh");

/// One `.cu` file: its module name, source, and the kernels it must export.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// Module name (the file stem).
    pub name: &'static str,
    /// The file's text (without [`COMMON`]).
    pub source: &'static str,
    /// The text of its own header `<name>.cuh`, "" when it has none: prepended to the file after
    /// [`COMMON`] (NVRTC has no include path; the emulator's build includes the file).
    pub header: &'static str,
    /// Kernels defined once per weight format, as `<prefix>_<dtype>` (see [`dtype_suffix`]).
    pub per_dtype: &'static [&'static str],
    /// Kernels defined once per KV-cache element type, as [`kv_entry`] names them.
    pub per_kv_elem: &'static [&'static str],
    /// Kernels defined once.
    pub single: &'static [&'static str],
}

impl KernelSource {
    /// The full program text handed to NVRTC: [`COMMON`], the module's header, then the file.
    pub fn program(&self) -> String {
        let name = self.name;
        let header = match self.header {
            "" => String::new(),
            h => format!("\n// ---- {name}.cuh ----\n{h}"),
        };
        format!("{COMMON}{header}\n// ---- {name}.cu ----\n{}", self.source)
    }

    /// Every kernel name the compiled module must contain.
    pub fn entries(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .per_dtype
            .iter()
            .flat_map(|p| {
                GPU_DTYPES
                    .iter()
                    .map(move |d| format!("{p}_{}", dtype_suffix(*d)))
            })
            .collect();
        out.extend(
            self.per_kv_elem
                .iter()
                .flat_map(|p| KV_ELEMS.iter().map(move |e| kv_entry(p, e))),
        );
        out.extend(self.single.iter().map(|s| s.to_string()));
        out
    }
}

/// Row-sparse matvec over compact gate/up rows, and the fused gate·up pass.
pub const SPARSE_MATVEC: KernelSource = KernelSource {
    name: "sparse_matvec",
    source: include_str!("../kernels/sparse_matvec.cu"),
    header: include_str!("../kernels/sparse_matvec.cuh"),
    per_dtype: &["sparse_matvec", "gate_up"],
    per_kv_elem: &[],
    single: &["quantize_x"],
};

/// Accumulation over rows of a transposed matrix (the hot down_t rows), and the fixed-order sum
/// of its splits' partial sums.
pub const AXPY_DOWN: KernelSource = KernelSource {
    name: "axpy_down",
    source: include_str!("../kernels/axpy_down.cu"),
    header: "",
    per_dtype: &["axpy_rows"],
    per_kv_elem: &[],
    single: &["add_splits"],
};

/// `compact.cu`: the hot slots and the down pass's rows gathered into lists on the GPU.
pub const COMPACT: KernelSource = KernelSource {
    name: "compact",
    source: include_str!("../kernels/compact.cu"),
    header: "",
    per_dtype: &[],
    per_kv_elem: &[],
    single: &["compact_nonzero", "compact_flags"],
};

/// Predictor fc2 + threshold.
pub const PREDICTOR: KernelSource = KernelSource {
    name: "predictor",
    source: include_str!("../kernels/predictor.cu"),
    header: "",
    per_dtype: &["predictor_fc2"],
    per_kv_elem: &[],
    single: &[],
};

/// RMSNorm, LayerNorm and RoPE.
pub const NORM_ROPE: KernelSource = KernelSource {
    name: "norm_rope",
    source: include_str!("../kernels/norm_rope.cu"),
    header: "",
    per_dtype: &[],
    per_kv_elem: &[],
    single: &["rms_norm", "layer_norm", "rope"],
};

/// Decode attention over the KV cache, f16 or f32.
pub const ATTENTION: KernelSource = KernelSource {
    name: "attention",
    source: include_str!("../kernels/attention.cu"),
    header: "",
    per_dtype: &[],
    per_kv_elem: &["kv_store", "attention_decode"],
    single: &["attention_merge"],
};

/// Residual adds, the threshold mask, the logits' soft-cap, copies, and a mixture of experts'
/// routing on the hot neurons (flags and weights per expert).
pub const ELEMENTWISE: KernelSource = KernelSource {
    name: "elementwise",
    source: include_str!("../kernels/elementwise.cu"),
    header: "",
    per_dtype: &[],
    per_kv_elem: &[],
    single: &[
        "add",
        "threshold_mask",
        "softcap",
        "copy",
        "fill",
        "expert_flags",
        "expert_scale",
    ],
};

/// Every module.
pub const ALL: [KernelSource; 7] = [
    SPARSE_MATVEC,
    AXPY_DOWN,
    COMPACT,
    PREDICTOR,
    NORM_ROPE,
    ATTENTION,
    ELEMENTWISE,
];

/// The kernel-name suffix of a weight format: "f32", "f16", "bf16", "q8_0", "q4_0", ..., "q6_k".
pub const fn dtype_suffix(d: DType) -> &'static str {
    match d {
        DType::F32 => "f32",
        DType::F16 => "f16",
        DType::BF16 => "bf16",
        DType::Q8_0 => "q8_0",
        DType::Q4_0 => "q4_0",
        DType::Q4_1 => "q4_1",
        DType::Q5_0 => "q5_0",
        DType::Q5_1 => "q5_1",
        DType::Q2_K => "q2_k",
        DType::Q3_K => "q3_k",
        DType::Q4_K => "q4_k",
        DType::Q5_K => "q5_k",
        DType::Q6_K => "q6_k",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_kernel_is_defined_in_its_source() {
        for src in ALL {
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
        assert_eq!(SPARSE_MATVEC.entries().len(), 23);
        assert!(SPARSE_MATVEC
            .entries()
            .contains(&"gate_up_q6_k".to_string()));
        assert_eq!(
            ATTENTION.entries(),
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
    fn the_gpu_formats_are_the_basic_ones_and_all_but_two_of_the_rest() {
        for d in DType::BASIC {
            assert!(is_gpu_dtype(d), "{d}");
        }
        let off: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| !is_gpu_dtype(*d))
            .collect();
        assert_eq!(off, [DType::Q2_K, DType::Q3_K]);
        // Every block size is even: the kernels need 2-byte aligned rows only.
        for d in GPU_DTYPES {
            assert!(d.block_bytes().is_multiple_of(2), "{d}");
        }
    }
}
