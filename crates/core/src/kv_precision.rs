//! The precision of the KV cache: one setting for the CPU and the GPU layers (the engine's
//! `KvCache` rounds to it, the GPU caches hold it), recorded in a plan (its caches' bytes).

use crate::error::Result;

/// The precision of the keys and values a KV cache holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KvPrecision {
    /// Rounded to f16 (llama.cpp's default `--cache-type-k f16`).
    #[default]
    F16,
    /// Kept as computed.
    F32,
}

impl KvPrecision {
    /// Parse "f16" or "f32" (any case).
    pub fn from_name(name: &str) -> Result<KvPrecision> {
        match name.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvPrecision::F16),
            "f32" => Ok(KvPrecision::F32),
            _ => crate::bail!(
                Unsupported,
                "KV cache precision {name:?}: expected \"f16\" or \"f32\""
            ),
        }
    }

    /// The name `from_name` takes.
    pub fn name(self) -> &'static str {
        match self {
            KvPrecision::F16 => "f16",
            KvPrecision::F32 => "f32",
        }
    }

    /// Bytes of one cached value.
    pub fn element_bytes(self) -> usize {
        match self {
            KvPrecision::F16 => 2,
            KvPrecision::F32 => 4,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in [KvPrecision::F16, KvPrecision::F32] {
            assert_eq!(KvPrecision::from_name(p.name()).unwrap(), p);
        }
        assert_eq!(KvPrecision::from_name("F32").unwrap().element_bytes(), 4);
        assert!(matches!(
            KvPrecision::from_name("q8_0"),
            Err(crate::Error::Unsupported(_))
        ));
    }
}
