//! The Rust fuzz targets' bodies ([`checks`]); `fuzz_targets/*.rs` only hand them the bytes.

pub mod checks;
