//! Weight formats and their block layouts (the GGUF/ggml layouts, bit for bit).
//!
//! A row of `cols` weights is `cols / block_size` blocks of `block_bytes` bytes each:
//! - `F32`, `F16`, `BF16`: one value per block, little-endian.
//! - `Q8_0`: 32 weights = f16 scale `d`, then 32 × i8 `q`; w = d·q.
//! - `Q4_0`: 32 weights = f16 `d`, then 16 bytes; byte j holds q[j] (low nibble) and q[j+16]
//!   (high nibble); w = d·(q − 8).
//! - `Q4_1`: 32 weights = f16 `d`, f16 `m`, then 16 bytes as in Q4_0; w = d·q + m.

use crate::error::{Error, Result};

/// A weight storage format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
}

impl DType {
    /// Every supported format, for tests and tables.
    pub const ALL: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
    ];

    /// Weights per block.
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => 32,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
        }
    }

    /// True for the block-quantized formats.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of one row of `cols` weights; an error when `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize> {
        if !cols.is_multiple_of(self.block_size()) {
            return Err(Error::Shape(format!(
                "{} rows need a multiple of {} columns, got {}",
                self.name(),
                self.block_size(),
                cols
            )));
        }
        Ok(cols / self.block_size() * self.block_bytes())
    }

    /// The canonical (GGUF) name: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1".
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
        }
    }

    /// Parse a name, case-insensitively.
    pub fn from_name(name: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::Unsupported(format!("weight format {name:?}")))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
            assert_eq!(DType::from_name(&d.name().to_lowercase()).unwrap(), d);
        }
        assert!(matches!(
            DType::from_name("Q5_K"),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn row_bytes_checks_block_multiple() {
        assert_eq!(DType::Q4_1.row_bytes(64).unwrap(), 40);
        assert_eq!(DType::F16.row_bytes(7).unwrap(), 14);
        assert!(matches!(DType::Q8_0.row_bytes(33), Err(Error::Shape(_))));
    }
}
