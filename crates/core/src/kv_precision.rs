//! The precision of the KV cache: one setting for the CPU and the GPU layers (the engine's
//! `KvCache` rounds to it, the GPU caches hold it), recorded in a plan (its caches' bytes).
//!
//! Keys and values each have one ([`KvTypes`], as llama.cpp's `-ctk`/`-ctv`): f16 (the
//! default), f32, or one of ggml's 32-value block formats q8_0, q4_0 and q4_1, quantized along
//! `head_dim` when a position is written (ggml's reference rounding,
//! [`crate::quantize::quantize_row`]) and stored in ggml's block layout.

use crate::dtype::DType;
use crate::error::Result;

/// The precision of the keys (or the values) a KV cache holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvPrecision {
    /// Rounded to f16 (llama.cpp's default `--cache-type-k f16`).
    #[default]
    F16,
    /// Kept as computed.
    F32,
    /// ggml's Q8_0 blocks: an f16 scale and 32 int8 (34 bytes per 32 values).
    Q8_0,
    /// ggml's Q4_0 blocks: an f16 scale and 32 nibbles (18 bytes per 32 values).
    Q4_0,
    /// ggml's Q4_1 blocks: f16 scale and min and 32 nibbles (20 bytes per 32 values).
    Q4_1,
}

impl KvPrecision {
    /// Every precision, in the order the names list them.
    pub const ALL: [KvPrecision; 5] = [
        KvPrecision::F16,
        KvPrecision::F32,
        KvPrecision::Q8_0,
        KvPrecision::Q4_0,
        KvPrecision::Q4_1,
    ];

    /// Parse "f16", "f32", "q8_0", "q4_0" or "q4_1" (any case).
    pub fn from_name(name: &str) -> Result<KvPrecision> {
        let lower = name.to_ascii_lowercase();
        match KvPrecision::ALL.into_iter().find(|p| p.name() == lower) {
            Some(p) => Ok(p),
            None => crate::bail!(
                Unsupported,
                "KV cache type {name:?}: expected one of f16, f32, q8_0, q4_0, q4_1"
            ),
        }
    }

    /// The name `from_name` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F16 => "f16",
            KvPrecision::F32 => "f32",
            KvPrecision::Q8_0 => "q8_0",
            KvPrecision::Q4_0 => "q4_0",
            KvPrecision::Q4_1 => "q4_1",
        }
    }

    /// The weight format of the same bytes (the block formats' ggml layout).
    pub fn dtype(self) -> DType {
        match self {
            KvPrecision::F16 => DType::F16,
            KvPrecision::F32 => DType::F32,
            KvPrecision::Q8_0 => DType::Q8_0,
            KvPrecision::Q4_0 => DType::Q4_0,
            KvPrecision::Q4_1 => DType::Q4_1,
        }
    }

    /// True for the block formats (q8_0, q4_0, q4_1).
    pub fn is_quantized(self) -> bool {
        self.dtype().is_quantized()
    }

    /// Values per block (32 for the block formats, 1 otherwise): `head_dim` must be a multiple.
    pub fn block_size(self) -> usize {
        self.dtype().block_size()
    }

    /// Bytes of `width` cached values (a multiple of [`KvPrecision::block_size`]).
    pub fn row_bytes(self, width: usize) -> usize {
        width / self.block_size() * self.dtype().block_bytes()
    }
}

/// The precisions of the keys and of the values (llama.cpp's `-ctk` and `-ctv`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KvTypes {
    pub k: KvPrecision,
    pub v: KvPrecision,
}

impl KvTypes {
    /// Keys and values both at `p`.
    pub const fn both(p: KvPrecision) -> KvTypes {
        KvTypes { k: p, v: p }
    }

    /// Parse one precision for both ("q8_0") or keys/values ("q8_0/f16").
    pub fn from_name(name: &str) -> Result<KvTypes> {
        match name.split_once('/') {
            None => Ok(KvTypes::both(KvPrecision::from_name(name)?)),
            Some((k, v)) => Ok(KvTypes {
                k: KvPrecision::from_name(k)?,
                v: KvPrecision::from_name(v)?,
            }),
        }
    }

    /// The name `from_name` takes: one precision where both are the same, else "k/v".
    pub fn name(self) -> String {
        if self.k == self.v {
            self.k.name().to_string()
        } else {
            format!("{}/{}", self.k.name(), self.v.name())
        }
    }

    /// True when either side is a block format.
    pub fn is_quantized(self) -> bool {
        self.k.is_quantized() || self.v.is_quantized()
    }

    /// Bytes of one position's keys and values of one layer of width `kv_dim`.
    pub fn position_bytes(self, kv_dim: usize) -> usize {
        self.k.row_bytes(kv_dim) + self.v.row_bytes(kv_dim)
    }

    /// [`crate::Error::Unsupported`] unless every head's `head_dim` values fill whole blocks.
    pub fn check_head_dim(self, head_dim: usize) -> Result<()> {
        for (side, p) in [("K", self.k), ("V", self.v)] {
            crate::ensure!(
                head_dim.is_multiple_of(p.block_size()),
                Unsupported,
                "a {} {side} cache needs head_dim a multiple of {} (this model's is {head_dim})",
                p.name(),
                p.block_size()
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in KvPrecision::ALL {
            assert_eq!(KvPrecision::from_name(p.name()).unwrap(), p);
            assert_eq!(KvTypes::from_name(p.name()).unwrap(), KvTypes::both(p));
        }
        assert_eq!(KvPrecision::from_name("Q8_0").unwrap(), KvPrecision::Q8_0);
        assert!(matches!(
            KvPrecision::from_name("q5_1"),
            Err(crate::Error::Unsupported(_))
        ));
        let t = KvTypes::from_name("q8_0/F16").unwrap();
        assert_eq!((t.k, t.v), (KvPrecision::Q8_0, KvPrecision::F16));
        assert_eq!(t.name(), "q8_0/f16");
        assert!(KvTypes::from_name("q8_0/x").is_err());
    }

    #[test]
    fn bytes_are_ggml_blocks() {
        let row = |p: KvPrecision| p.row_bytes(64);
        assert_eq!(row(KvPrecision::F32), 256);
        assert_eq!(row(KvPrecision::F16), 128);
        assert_eq!(row(KvPrecision::Q8_0), 68);
        assert_eq!(row(KvPrecision::Q4_0), 36);
        assert_eq!(row(KvPrecision::Q4_1), 40);
        let t = KvTypes::from_name("q4_0/q8_0").unwrap();
        assert_eq!(t.position_bytes(64), 36 + 68);
        assert!(t.check_head_dim(64).is_ok());
        assert!(matches!(
            t.check_head_dim(48),
            Err(crate::Error::Unsupported(_))
        ));
        assert!(KvTypes::default().check_head_dim(48).is_ok());
    }
}
