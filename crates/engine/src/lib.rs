//! The powerinfer-rs executor: model weights laid out per layer, the KV cache, and the forward
//! pass (embeddings, RMSNorm, RoPE, grouped-query attention, gated FFN, output head) over the CPU
//! kernels. Prompts are prefilled in batches (matrix-matrix); decoding is one matvec per weight.

pub mod attention;
pub mod ffn;
pub mod forward;
pub mod kv_cache;
pub mod norm_rope;
pub mod profiler;
pub mod session;
pub mod sparsity;
pub mod transpose;
pub mod weights;

pub use kv_cache::KvCache;
pub use profiler::{Captured, Profiler};
pub use session::Session;
pub use sparsity::{LayerPredictor, PredictorInput, Sparsity};
pub use weights::{LayerWeights, ModelWeights};
