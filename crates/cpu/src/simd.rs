//! Which SIMD path the kernels take: CPU features detected once per process (cached in a
//! `OnceLock`), overridable with `POWERINFER_SIMD=scalar` or `POWERINFER_SIMD=avx2` (read once,
//! at the first kernel call). The AVX-512 level runs the AVX2 kernels everywhere except the hot
//! products that have a 512-bit form: the int16-x dot of the 32-block formats
//! (`kernels::avx2::wide`), the float-format row kernels (`kernels::avx2::wide_float`) and the
//! matmul tile (`kernels::avx2::wide_tile`).

use std::sync::OnceLock;

/// The instruction-set level the dispatched kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// x86-64 with AVX-512 F/BW/VL/VNNI besides AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx512,
    /// x86-64 with AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable Rust, any CPU.
    Scalar,
}

impl Level {
    /// Whether this is one of the x86-64 SIMD levels (which share the AVX2 kernels).
    pub(crate) const fn is_x86_simd(self) -> bool {
        !matches!(self, Level::Scalar)
    }

    /// Human-readable name for logs and benches.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => "avx512+vnni",
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2+fma+f16c",
            Level::Scalar => "scalar",
        }
    }
}

/// The environment variable that caps the level: `scalar` (portable Rust) or `avx2` (no 512-bit
/// kernels even where the CPU has them).
pub const SIMD_ENV: &str = "POWERINFER_SIMD";

/// The active SIMD path: `"avx512+vnni"`, `"avx2+fma+f16c"` or `"scalar"`.
pub fn simd_level() -> &'static str {
    level().name()
}

/// The level the dispatched kernels use: detected once, then cached.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let cap = std::env::var(SIMD_ENV).unwrap_or_default();
        match (cap.to_ascii_lowercase().as_str(), detect()) {
            ("scalar", _) => Level::Scalar,
            #[cfg(target_arch = "x86_64")]
            ("avx2", Level::Avx512) => Level::Avx2,
            (_, best) => best,
        }
    })
}

/// Panic unless this CPU really has the AVX-512 level (a debug-build guard for the AVX2
/// kernels' `wide` calls).
#[cfg(target_arch = "x86_64")]
pub(crate) fn debug_check_wide(wide: bool) {
    debug_assert!(!wide || detect() == Level::Avx512);
}

/// Panic unless this CPU really has the AVX2/FMA/F16C features (a debug-build guard of the AVX2
/// kernels).
#[cfg(target_arch = "x86_64")]
pub(crate) fn debug_check_level() {
    debug_assert!(detect().is_x86_simd());
}

/// Every level this CPU can run, best first (tests run each kernel on all of them).
#[cfg(test)]
pub(crate) fn available() -> Vec<Level> {
    let mut levels = vec![detect()];
    #[cfg(target_arch = "x86_64")]
    if levels[0] == Level::Avx512 {
        levels.push(Level::Avx2);
    }
    if levels[0] != Level::Scalar {
        levels.push(Level::Scalar);
    }
    levels
}

/// The best level this CPU supports (ignoring the environment override).
pub(crate) fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx2") && has!("fma") && has!("f16c") {
            if has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512vnni") {
                return Level::Avx512;
            }
            return Level::Avx2;
        }
    }
    Level::Scalar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn level_is_cached_and_named() {
        let a = level();
        assert_eq!(a, level());
        assert!(!a.name().is_empty());
        if std::env::var(SIMD_ENV).is_err() {
            assert_eq!(a, detect());
        }
    }

    #[test]
    fn simd_level_is_named() {
        assert!(["avx512+vnni", "avx2+fma+f16c", "scalar"].contains(&simd_level()));
    }
}
