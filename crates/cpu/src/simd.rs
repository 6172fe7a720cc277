//! Which SIMD path the kernels take: CPU features detected once per process (cached in a
//! `OnceLock`), overridable with `POWERINFER_SIMD=scalar` (read once, at the first kernel call).

use std::sync::OnceLock;

/// The instruction-set level the dispatched kernels use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Level {
    /// x86-64 with AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// Portable Rust, any CPU.
    Scalar,
}

impl Level {
    /// Human-readable name for logs and benches.
    pub(crate) const fn name(self) -> &'static str {
        match self {
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => "avx2+fma+f16c",
            Level::Scalar => "scalar",
        }
    }
}

/// The environment variable that forces the scalar path when set to `scalar`.
pub const SIMD_ENV: &str = "POWERINFER_SIMD";

/// The active SIMD path: `"avx2+fma+f16c"` or `"scalar"`.
pub fn simd_level() -> &'static str {
    level().name()
}

/// The level the dispatched kernels use: detected once, then cached.
pub(crate) fn level() -> Level {
    static LEVEL: OnceLock<Level> = OnceLock::new();
    *LEVEL.get_or_init(|| {
        let forced_scalar = std::env::var(SIMD_ENV)
            .map(|v| v.eq_ignore_ascii_case("scalar"))
            .unwrap_or(false);
        if forced_scalar {
            Level::Scalar
        } else {
            detect()
        }
    })
}

/// Every level this CPU can run, best first (tests run each kernel on all of them).
#[cfg(test)]
pub(crate) fn available() -> Vec<Level> {
    let mut levels = vec![detect()];
    if levels[0] != Level::Scalar {
        levels.push(Level::Scalar);
    }
    levels
}

/// The best level this CPU supports (ignoring the environment override).
pub(crate) fn detect() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("f16c")
        {
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
        assert!(["avx2+fma+f16c", "scalar"].contains(&simd_level()));
    }
}
