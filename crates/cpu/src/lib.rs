//! CPU kernels of powerinfer-rs: matrix-vector and matrix-matrix products over every weight
//! format in [`DType`](powerinfer_core::DType), parallel on the caller's rayon pool, with
//! runtime-dispatched AVX2/FMA/F16C paths and a portable scalar fallback.
//!
//! Quantized rows on the x86 levels are dotted with x quantized once per vector: int16 per
//! 32-block by default, int8 per 32-block (a scale per 16 values) where [`numerics`] says so;
//! other products take f32 x, and every product accumulates in f32. The [`reference`] module
//! holds plain f64 loops every fast path is tested against.
//!
//! Layout: `ops` holds the public operations (shape checks, the parallel split), `kernels` the
//! per-ISA kernels (`kernels::scalar`, `kernels::avx2`), `dispatch` the one place that picks
//! a kernel for the SIMD level, and `operands` what the ops hand to the kernels (so that ops
//! reach the kernels only through `dispatch`, and no kernel imports an op). SIMD selection
//! happens once per process; `POWERINFER_SIMD=scalar` forces the scalar path.

mod bandwidth;
mod check;
mod dispatch;
mod kernels;
pub mod layout;
pub mod numerics;
mod operands;
mod ops;
mod pool_start;
pub mod reference;
mod simd;
#[cfg(test)]
mod testutil;

pub use bandwidth::{
    measure_format_bandwidth, measure_read_bandwidth, measure_rows_bandwidth, pseudo_random_weight,
};
pub use layout::{interleaving, LAYOUT_ENV};
pub use numerics::{numerics, Numerics, NUMERICS_ENV};
pub use operands::attention::{HeadCache, KvHeadCache, KvRows, KvScratch, SoftmaxExtras};
pub use operands::input_major::{ActiveInput, InputMajor};
pub use operands::interleaved::Interleaved;
pub use operands::matrix::{Matrix, MatrixRef};
pub use ops::attend::attend_head;
pub use ops::attend_block::{attend_block, block_attention_is_fast, BlockScratch, QueryBlock};
pub use ops::attend_kv::{attend_head_kv, KV_BLOCK_FORMATS};
pub use ops::compact::compact_kept;
pub use ops::input_major::matvec_input;
pub use ops::interleaved::{
    matvec_interleaved, matvec_interleaved_many, matvec_interleaved_tokens,
};
pub use ops::matmul::matmul;
pub use ops::matrix::{matvec, matvec_matrices, matvec_matrices_tokens};
pub use ops::matvec::matvec_many;
pub use ops::matvec_tokens::matvec_tokens;
pub use ops::pass::{in_pass, Disjoint, Pass, PreparedX};
pub use ops::row::{dequantize_row, dot_row, dot_row_scalar};
pub use ops::sparse::{axpy_rows, axpy_rows_many, matvec_rows};
pub use ops::sparse_ffn::{sparse_ffn, sparse_ffn_many, GateRows, SparseFfn, SparsePart};
pub use pool_start::{measure_dispatch, take_dispatch, warm_pool};
pub use reference::sparse as sparse_reference;
pub use simd::{simd_level, SIMD_ENV};
