//! Shared vocabulary of powerinfer-rs: weight formats and their block layouts, borrowed weight
//! buffers, model configuration and the error type every crate returns.

pub mod buffer;
pub mod config;
pub mod dtype;
pub mod error;
pub mod neuron_table;
pub mod pages;
pub mod quantize;
pub mod weight;

pub use buffer::Buffer;
pub use config::{Activation, ModelConfig, RopeStyle};
pub use dtype::DType;
pub use error::{Error, Result};
pub use neuron_table::{LayerTable, NeuronTable, Side};
pub use pages::PageBuf;
pub use quantize::quantize_row;
pub use weight::Weight;
