//! The powerinfer-rs executor: model weights laid out per layer, the KV cache, and the forward
//! pass (embeddings, RMSNorm, RoPE, grouped-query attention, gated FFN, output head) over the CPU
//! kernels. Prompts are prefilled in batches (matrix-matrix); decoding is one matvec per weight.

mod attend_pass;
pub mod attention;
mod attention_block;
pub mod device;
pub mod down_t_file;
mod env;
pub mod ffn;
mod ffn_block;
mod finite;
pub mod forward;
pub mod hybrid;
mod input_ffn;
pub mod input_sparse;
pub mod kv_cache;
mod kv_rotation;
pub mod layer;
pub mod layer_weights;
pub mod mla;
mod mla_heads;
pub mod mla_weights;
pub mod modes;
pub mod moe;
mod moe_pass;
mod moe_step;
pub mod moe_weights;
pub mod neuron_store;
pub mod norm_rope;
mod pass_rows;
mod pass_scratch;
pub mod phases;
pub mod placement;
pub mod profiler;
mod project_site;
pub mod session;
pub mod slots;
pub mod sparsity;
pub mod transpose;
pub mod weights;

pub use forward::token_ids;
pub use input_sparse::{InputScore, InputSparsity, SITES as INPUT_SITES};
pub use kv_cache::{KvCache, KvPrecision, KvTypes};
pub use layer::ModelProgram;
pub use layer_weights::{LayerWeights, Layouts};
pub use phases::{Phase, PhaseTimes};
pub use placement::Placement;
pub use profiler::{Captured, Profiler};
pub use session::Session;
pub use sparsity::{
    ExpertPredictors, LayerPredictor, PredictorInput, Predictors, Sparsity, SparsityMode,
};
pub use weights::ModelWeights;
