//! The streaming read behind [`crate::measure_read_bandwidth`]: 256 bytes per iteration into four
//! independent vector accumulators, so only the memory system limits it.

use std::arch::x86_64::*;

/// Wrapping sum of `data`, read with 32-byte loads.
///
/// # Safety
/// The CPU must have AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn read_sum(data: &[u64]) -> u64 {
    let mut acc = [_mm256_setzero_si256(); 4];
    let mut blocks = data.chunks_exact(32);
    for c in &mut blocks {
        let p = c.as_ptr() as *const __m256i;
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: c holds 32 u64 = 256 bytes; vectors k and k + 4 are inside it.
            let (v, w) = unsafe {
                (
                    _mm256_loadu_si256(p.add(k)),
                    _mm256_loadu_si256(p.add(k + 4)),
                )
            };
            *a = _mm256_add_epi64(*a, _mm256_add_epi64(v, w));
        }
    }
    let v = _mm256_add_epi64(
        _mm256_add_epi64(acc[0], acc[1]),
        _mm256_add_epi64(acc[2], acc[3]),
    );
    let mut lanes = [0u64; 4];
    // SAFETY: lanes is 32 bytes.
    unsafe { _mm256_storeu_si256(lanes.as_mut_ptr() as *mut __m256i, v) };
    let tail = blocks
        .remainder()
        .iter()
        .fold(0u64, |a, &x| a.wrapping_add(x));
    lanes.iter().fold(tail, |a, &x| a.wrapping_add(x))
}
