//! The public operations. Each checks its shapes (an `Error::Shape`, or a panic where the
//! signature has no `Result`), splits the work over the current rayon pool and hands every part
//! to a kernel through [`crate::dispatch`].

pub(crate) mod attend;
pub(crate) mod attend_block;
pub(crate) mod attend_kv;
pub(crate) mod compact;
pub(crate) mod input_major;
pub(crate) mod interleaved;
pub(crate) mod matmul;
pub(crate) mod matrix;
pub(crate) mod matvec;
pub(crate) mod matvec_tokens;
pub(crate) mod pass;
pub(crate) mod row;
pub(crate) mod sparse;
pub(crate) mod sparse_ffn;
mod split;
