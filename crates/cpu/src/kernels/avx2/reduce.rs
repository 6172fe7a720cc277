//! Horizontal reductions of an 8-lane f32 vector ([`hsum`], [`hmax`]), the last step of the
//! AVX2 kernels' dot products and softmax maxima.

use std::arch::x86_64::*;

/// A horizontal reduction of the eight lanes of a vector with `$op` (packed) and `$op_ss`.
macro_rules! horizontal {
    ($(#[$doc:meta])* $name:ident, $op:ident, $op_ss:ident) => {
        $(#[$doc])*
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) fn $name(v: __m256) -> f32 {
            let s = $op(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let s = $op(s, _mm_movehl_ps(s, s));
            _mm_cvtss_f32($op_ss(s, _mm_movehdup_ps(s)))
        }
    };
}
horizontal!(
    /// Sum of the eight lanes.
    hsum, _mm_add_ps, _mm_add_ss
);
horizontal!(
    /// Largest of the eight lanes.
    hmax, _mm_max_ps, _mm_max_ss
);
