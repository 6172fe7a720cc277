//! What a CUDA C source is ([`KernelSource`]: one `kernels/<family>.cu` per op family, declared
//! by its family in `crate::ops::<family>::launch`, listed in [`crate::ops::SOURCES`]), the
//! helpers every module is compiled after (`common.cuh`), and the names kernels are instantiated
//! under: once per GPU weight format ([`GPU_DTYPES`]) or per KV-cache element type
//! ([`KV_ELEMS`]). Every source is compiled on its own (NVRTC: one program per module).

use powerinfer_core::{ensure, DType, Result};

/// Every weight format the GPU kernels take: each per-format kernel is instantiated once for
/// each (`<prefix>_<suffix>`, see [`dtype_suffix`]). The rest (Q2_K, Q3_K and the decoded
/// formats IQ4_NL, IQ4_XS, MXFP4, TQ1_0, TQ2_0, the lattice i-quants and the low-bit NVFP4,
/// Q1_0, Q2_0, which `crate::convert` turns into Q8_0 or F16 at upload)
/// have no kernels of their own;
/// [`crate::ops`] refuses them with `Error::Unsupported` before anything is uploaded.
pub const GPU_DTYPES: [DType; 11] = DType::join(&[
    &DType::BASIC,
    &[
        DType::Q5_0,
        DType::Q5_1,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ],
]);

/// The f16 KV cache's element name (the default cache).
pub const KV_F16: &str = "f16";
/// The f32 KV cache's element name.
pub const KV_F32: &str = "f32";
/// The element types of the device KV cache (`KvElem::NAME`): the KV-cache kernels are
/// defined once for each (see [`kv_entry`]).
pub const KV_ELEMS: [&str; 2] = [KV_F16, KV_F32];

/// The entry name of KV-cache kernel `prefix` for caches of `elem` ([`KV_ELEMS`]): the bare
/// prefix for f16 (the default cache), `<prefix>_<elem>` otherwise ("kv_store_f32").
pub fn kv_entry(prefix: &str, elem: &str) -> String {
    if elem == KV_F16 {
        prefix.to_string()
    } else {
        format!("{prefix}_{elem}")
    }
}

/// Whether the GPU kernels take weights stored as `dtype` ([`GPU_DTYPES`]).
pub fn is_gpu_dtype(dtype: DType) -> bool {
    GPU_DTYPES.contains(&dtype)
}

/// `Error::Unsupported` unless the GPU kernels take `dtype` ([`GPU_DTYPES`]; Q2_K, Q3_K and the
/// table formats run on the CPU only, so far).
pub fn ensure_gpu_dtype(dtype: DType) -> Result<()> {
    ensure!(
        is_gpu_dtype(dtype),
        Unsupported,
        "{dtype} weights have no GPU kernels yet (supported on the GPU: {}); keep them on the \
         CPU (plan them with the planner, which does) or run this model on device=\"cpu\"",
        GPU_DTYPES.map(DType::name).join(", ")
    );
    Ok(())
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
    /// Module `name` (the file stem) with its text and the kernels it defines once; add the
    /// others with [`KernelSource::per_dtype`], [`KernelSource::per_kv_elem`] and its header with
    /// [`KernelSource::header`].
    pub const fn new(
        name: &'static str,
        source: &'static str,
        single: &'static [&'static str],
    ) -> KernelSource {
        KernelSource {
            name,
            source,
            header: "",
            per_dtype: &[],
            per_kv_elem: &[],
            single,
        }
    }

    /// With the kernels defined once per weight format, as `<prefix>_<dtype>`.
    pub const fn per_dtype(self, per_dtype: &'static [&'static str]) -> KernelSource {
        KernelSource { per_dtype, ..self }
    }

    /// With the kernels defined once per KV-cache element type.
    pub const fn per_kv_elem(self, per_kv_elem: &'static [&'static str]) -> KernelSource {
        KernelSource {
            per_kv_elem,
            ..self
        }
    }

    /// With its own header's text.
    pub const fn header(self, header: &'static str) -> KernelSource {
        KernelSource { header, ..self }
    }

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
        DType::IQ4_NL => "iq4_nl",
        DType::IQ4_XS => "iq4_xs",
        DType::MXFP4 => "mxfp4",
        DType::TQ1_0 => "tq1_0",
        DType::TQ2_0 => "tq2_0",
        DType::NVFP4 => "nvfp4",
        DType::Q1_0 => "q1_0",
        DType::Q2_0 => "q2_0",
        DType::IQ2_XXS => "iq2_xxs",
        DType::IQ2_XS => "iq2_xs",
        DType::IQ2_S => "iq2_s",
        DType::IQ3_XXS => "iq3_xxs",
        DType::IQ3_S => "iq3_s",
        DType::IQ1_S => "iq1_s",
        DType::IQ1_M => "iq1_m",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gpu_formats_are_the_basic_ones_and_all_but_two_of_the_rest() {
        for d in DType::BASIC {
            assert!(is_gpu_dtype(d), "{d}");
        }
        let off: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|d| !is_gpu_dtype(*d))
            .collect();
        let decoded = [
            &DType::TABLE[..],
            &DType::TERNARY,
            &DType::LOWBIT,
            &DType::LATTICE_IQ2,
            &DType::LATTICE_IQ3_IQ1,
        ]
        .concat();
        assert_eq!(off, [&[DType::Q2_K, DType::Q3_K][..], &decoded].concat());
        // Every block size is even: the kernels need 2-byte aligned rows only.
        for d in GPU_DTYPES {
            assert!(d.block_bytes().is_multiple_of(2), "{d}");
        }
    }
}
