//! Shared vocabulary of powerinfer-rs: weight formats and their block layouts, borrowed weight
//! buffers, model configuration, neuron tables and plan files, and the error type every crate
//! returns.

mod block_values;
pub mod buffer;
pub mod config;
mod config_rope;
pub mod dequantize;
pub mod dequantize_iq1;
pub mod dequantize_iq2;
pub mod dequantize_iq3;
pub mod device;
pub mod dtype;
pub mod error;
pub mod files;
pub mod kv_precision;
pub mod lattice_grids;
mod lattice_grids_data;
pub mod lowbit;
pub mod mla_config;
pub mod moe_config;
pub mod neuron_table;
pub mod pages;
pub mod plan_file;
pub mod plan_record;
pub mod quantize;
mod quantize_k;
mod quantize_lowbit;
mod quantize_table;
mod quantize_ternary;
pub mod rope;
pub mod testing;
pub mod weight;

pub use buffer::Buffer;
pub use config::{Activation, ArchFeatures, ModelConfig, RopeStyle, TensorShape};
pub use dequantize::dequantize_row;
pub use device::{Device, DEVICE_NAMES};
pub use dtype::DType;
pub use error::{Error, Result};
pub use kv_precision::{KvPrecision, KvTypes};
pub use mla_config::MlaFeatures;
pub use moe_config::{swiglu_oai, Gating, MoeFeatures};
pub use neuron_table::{LayerTable, NeuronTable, Side};
pub use pages::PageBuf;
pub use plan_file::{PlanFile, MAX_PLAN_BYTES, MAX_PLAN_COUNT, PLAN_FORMAT};
pub use plan_record::PlanRecord;
pub use quantize::quantize_row;
pub use rope::{RopeFreqs, RopeScaling};
pub use weight::{MatrixShape, Weight};
