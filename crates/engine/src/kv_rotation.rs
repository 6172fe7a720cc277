//! The Walsh-Hadamard rotation of a quantized KV cache, as llama.cpp applies it (its
//! `attn_rot_k`/`attn_rot_v`, on by default for a quantized cache whose heads are a multiple of
//! 64 values): keys are rotated before they are quantized and the queries with them (an
//! orthonormal R keeps q·k: (Rq)·(Rk) = q·k), values are rotated before they are quantized and
//! each head's attention output is rotated back (R is its own inverse). The rotation spreads a
//! head's outliers over its block, so the 32-value blocks quantize with less error.
//!
//! R is the Sylvester Hadamard matrix of `n` (a power of two) over √n, applied to each run of
//! `n` values of a head by the fast transform (n·log n additions, then one scale): for the keys
//! the largest power of two dividing `head_dim`, for the values 64, as llama.cpp chooses.

use powerinfer_core::KvTypes;

/// Values per rotated block of the values (llama.cpp's fixed 64).
const V_BLOCK: usize = 64;

/// Which sides of a cache are rotated, and by blocks of how many values (None: not rotated).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvRotation {
    pub(crate) k: Option<usize>,
    pub(crate) v: Option<usize>,
}

impl KvRotation {
    /// The rotation of caches of `types` over heads of `head_dim`: a quantized side whose heads
    /// are a multiple of 64 values.
    pub(crate) fn of(types: KvTypes, head_dim: usize) -> KvRotation {
        let fits = head_dim > 0 && head_dim.is_multiple_of(V_BLOCK);
        let k_block = 1 << head_dim.trailing_zeros().min(usize::BITS - 1);
        KvRotation {
            k: (fits && types.k.is_quantized()).then_some(k_block),
            v: (fits && types.v.is_quantized()).then_some(V_BLOCK),
        }
    }
}

/// Every run of `n` values of `x` (a power of two; `x.len()` a multiple) times R.
pub(crate) fn rotate(x: &mut [f32], n: usize) {
    let scale = 1.0 / (n as f32).sqrt();
    for block in x.chunks_exact_mut(n) {
        let mut h = 1;
        while h < n {
            for i in (0..n).step_by(2 * h) {
                for j in i..i + h {
                    let (a, b) = (block[j], block[j + h]);
                    block[j] = a + b;
                    block[j + h] = a - b;
                }
            }
            h *= 2;
        }
        block.iter_mut().for_each(|v| *v *= scale);
    }
}

/// `x` rotated when `block` is set: a copy, or `x` itself.
pub(crate) fn rotated(x: &[f32], block: Option<usize>) -> std::borrow::Cow<'_, [f32]> {
    match block {
        None => std::borrow::Cow::Borrowed(x),
        Some(n) => {
            let mut v = x.to_vec();
            rotate(&mut v, n);
            std::borrow::Cow::Owned(v)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::KvPrecision;

    /// The Sylvester Hadamard matrix of `n` over √n, entry (i, j) = (−1)^popcount(i & j) / √n.
    fn matrix(n: usize) -> Vec<f64> {
        let s = 1.0 / (n as f64).sqrt();
        (0..n * n)
            .map(|ij| {
                let (i, j) = (ij / n, ij % n);
                if (i & j).count_ones() % 2 == 0 {
                    s
                } else {
                    -s
                }
            })
            .collect()
    }

    #[test]
    fn the_fast_transform_is_the_matrix_and_its_own_inverse() {
        for n in [64, 128, 256] {
            let x: Vec<f32> = (0..3 * n).map(|i| ((i * 37) % 19) as f32 - 9.0).collect();
            let mut y = x.clone();
            rotate(&mut y, n);
            let h = matrix(n);
            for (b, (xb, yb)) in x.chunks(n).zip(y.chunks(n)).enumerate() {
                for i in 0..n {
                    let want: f64 = (0..n).map(|j| h[i * n + j] * xb[j] as f64).sum();
                    assert!((yb[i] as f64 - want).abs() < 1e-4, "n {n} block {b} [{i}]");
                }
            }
            rotate(&mut y, n);
            for (a, b) in x.iter().zip(&y) {
                assert!((a - b).abs() < 1e-4, "n {n}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn only_quantized_sides_of_whole_64_blocks_rotate() {
        let t = |k, v| KvTypes { k, v };
        let (q8, f16) = (KvPrecision::Q8_0, KvPrecision::F16);
        assert_eq!(
            KvRotation::of(t(q8, q8), 64),
            KvRotation {
                k: Some(64),
                v: Some(64)
            }
        );
        assert_eq!(KvRotation::of(t(q8, f16), 128).k, Some(128));
        assert_eq!(KvRotation::of(t(q8, f16), 192).k, Some(64));
        assert_eq!(KvRotation::of(t(q8, f16), 128).v, None);
        assert_eq!(
            KvRotation::of(t(q8, q8), 96),
            KvRotation { k: None, v: None }
        );
        assert_eq!(
            KvRotation::of(t(f16, f16), 64),
            KvRotation { k: None, v: None }
        );
    }
}
