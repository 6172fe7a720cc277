//! One attention head over a quantized KV cache: keys or values (or both) in ggml's q8_0, q4_0
//! or q4_1 blocks along `head_dim`, the other side f32 rows. q·k is an integer dot against the
//! query quantized to q8_0 (as llama.cpp's CPU attention over a quantized cache), the softmax is
//! f32, and the values are accumulated from their blocks dequantized on the fly (the kernel:
//! `crate::kernels::kv_blocks`). The same bits on every SIMD level, whatever the caller batches.

use powerinfer_core::DType;

use crate::dispatch;
use crate::operands::attention::{KvHead, KvHeadCache, KvRows, KvScratch, SoftmaxExtras};
use crate::simd;

/// The block formats a KV cache side may hold.
pub const KV_BLOCK_FORMATS: [DType; 3] = [DType::Q8_0, DType::Q4_0, DType::Q4_1];

/// `out = Σ_p softmax_p(capped (q·k_p)·scale) · v_p` over positions `0..n_pos` of `cache`, with
/// `scratch` reused across calls; `extras` the soft-cap and the sink logit, if any.
/// `hd = q.len() = out.len()`.
///
/// # Panics
/// When `n_pos == 0`, a side's format is no KV block format, `hd` or the stride of a block side
/// is not a multiple of 32, or the cache holds fewer than `n_pos` positions.
pub fn attend_head_kv(
    q: &[f32],
    cache: KvHeadCache<'_>,
    n_pos: usize,
    scale: f32,
    extras: SoftmaxExtras,
    scratch: &mut KvScratch,
    out: &mut [f32],
) {
    let head = KvHead {
        q,
        cache,
        n_pos,
        scale,
        extras,
    };
    check(&head, out);
    dispatch::attend_head_kv(simd::level(), &head, scratch, out);
}

/// Panic unless the sizes fit (see [`attend_head_kv`]).
fn check(head: &KvHead<'_>, out: &[f32]) {
    let hd = head.q.len();
    let stride = head.cache.stride;
    assert!(
        head.n_pos > 0 && out.len() == hd,
        "attend_head_kv: bad sizes"
    );
    for side in [head.cache.keys, head.cache.values] {
        if let KvRows::Blocks(dt, _) = side {
            assert!(
                KV_BLOCK_FORMATS.contains(&dt)
                    && hd.is_multiple_of(32)
                    && stride.is_multiple_of(32),
                "attend_head_kv: {dt} rows of head_dim {hd}, stride {stride}"
            );
        }
        assert!(
            side.values() >= (head.n_pos - 1) * stride + hd,
            "attend_head_kv: the cache holds fewer than {} positions",
            head.n_pos
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::available;
    use crate::testutil::Rng;
    use powerinfer_core::{dequantize_row, quantize::quantize_row};

    /// One side as the kernel reads it and as f64 values (the same quantized data decoded).
    struct Side {
        f32s: Vec<f32>,
        bytes: Vec<u8>,
        dtype: DType,
        decoded: Vec<f64>,
    }

    impl Side {
        fn new(dtype: DType, values: &[f32]) -> Side {
            let (mut bytes, mut decoded) = (Vec::new(), values.to_vec());
            if dtype.is_quantized() {
                bytes = vec![0u8; dtype.row_bytes(values.len()).unwrap()];
                quantize_row(dtype, values, &mut bytes).unwrap();
                dequantize_row(dtype, &bytes, &mut decoded).unwrap();
            }
            Side {
                f32s: values.to_vec(),
                bytes,
                dtype,
                decoded: decoded.iter().map(|&v| v as f64).collect(),
            }
        }

        fn rows(&self) -> KvRows<'_> {
            if self.dtype.is_quantized() {
                KvRows::Blocks(self.dtype, &self.bytes)
            } else {
                KvRows::F32(&self.f32s)
            }
        }
    }

    /// f64 loops over the definition on the same quantized data (and, where the keys are
    /// blocks, the query as its q8_0 blocks decode).
    fn reference(
        q: &[f32],
        (k, v): (&Side, &Side),
        n_pos: usize,
        stride: usize,
        (cap, sink): (f64, Option<f32>),
    ) -> Vec<f64> {
        let hd = q.len();
        let mut qd: Vec<f32> = q.to_vec();
        if k.dtype.is_quantized() {
            let mut b = vec![0u8; DType::Q8_0.row_bytes(hd).unwrap()];
            quantize_row(DType::Q8_0, q, &mut b).unwrap();
            dequantize_row(DType::Q8_0, &b, &mut qd).unwrap();
        }
        let s: Vec<f64> = (0..n_pos)
            .map(|p| {
                let kp = &k.decoded[p * stride..];
                let s = (0..hd).map(|i| qd[i] as f64 * kp[i]).sum::<f64>() * 0.3;
                if cap > 0.0 {
                    cap * (s / cap).tanh()
                } else {
                    s
                }
            })
            .collect();
        let sink = sink.map(f64::from);
        let m = s
            .iter()
            .cloned()
            .fold(sink.unwrap_or(f64::NEG_INFINITY), f64::max);
        let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
        let z: f64 = e.iter().sum::<f64>() + sink.map_or(0.0, |s| (s - m).exp());
        (0..hd)
            .map(|i| {
                (0..n_pos)
                    .map(|p| e[p] / z * v.decoded[p * stride + i])
                    .sum()
            })
            .collect()
    }

    #[test]
    fn every_side_and_level_matches_the_f64_reference_on_odd_sizes() {
        let mut rng = Rng::new(41);
        let formats = [DType::F32, DType::Q8_0, DType::Q4_0, DType::Q4_1];
        for &(hd, n_pos, extra) in &[(32, 1, 0), (96, 7, 64), (64, 129, 128), (160, 33, 32)] {
            let stride = hd + extra;
            let keys: Vec<f32> = rng.vec(n_pos * stride).iter().map(|v| v * 3.0).collect();
            let values = rng.vec(n_pos * stride);
            let q = rng.vec(hd);
            for kt in formats {
                for vt in formats {
                    let (k, v) = (Side::new(kt, &keys), Side::new(vt, &values));
                    let cache = KvHeadCache {
                        keys: k.rows(),
                        values: v.rows(),
                        stride,
                    };
                    let sink = (kt == vt).then_some(1.5);
                    let want = reference(&q, (&k, &v), n_pos, stride, (0.0, sink));
                    let head = KvHead {
                        q: &q,
                        cache,
                        n_pos,
                        scale: 0.3,
                        extras: SoftmaxExtras {
                            softcap: None,
                            sink,
                        },
                    };
                    let mut first: Option<Vec<f32>> = None;
                    for level in available() {
                        let mut out = vec![f32::NAN; hd];
                        let mut scratch = KvScratch::default();
                        dispatch::attend_head_kv(level, &head, &mut scratch, &mut out);
                        for (i, (&g, &w)) in out.iter().zip(&want).enumerate() {
                            assert!(
                                (g as f64 - w).abs() <= 2e-5 * (1.0 + w.abs()),
                                "{level:?} K {kt} V {vt} hd {hd} n_pos {n_pos} [{i}]: {g} vs {w}"
                            );
                        }
                        let first = first.get_or_insert_with(|| out.clone());
                        assert_eq!(first, &out, "{level:?} K {kt} V {vt}: other bits");
                    }
                }
            }
        }
    }

    #[test]
    fn the_op_checks_and_runs_with_a_softcap() {
        let mut rng = Rng::new(42);
        let (hd, n_pos) = (64, 5);
        let kv = rng.vec(n_pos * hd);
        let k = Side::new(DType::Q8_0, &kv);
        let cache = KvHeadCache {
            keys: k.rows(),
            values: k.rows(),
            stride: hd,
        };
        let q = rng.vec(hd);
        let (mut a, mut b) = (vec![0f32; hd], vec![0f32; hd]);
        let mut scratch = KvScratch::default();
        let capped = SoftmaxExtras {
            softcap: Some(0.01),
            sink: None,
        };
        let sunk = SoftmaxExtras {
            softcap: None,
            sink: Some(3.0),
        };
        let mut c = vec![0f32; hd];
        attend_head_kv(
            &q,
            cache,
            n_pos,
            0.3,
            SoftmaxExtras::default(),
            &mut scratch,
            &mut a,
        );
        attend_head_kv(&q, cache, n_pos, 0.3, capped, &mut scratch, &mut b);
        attend_head_kv(&q, cache, n_pos, 0.3, sunk, &mut scratch, &mut c);
        assert_ne!(a, b, "a tight cap flattens the weights");
        assert_ne!(a, c, "a sink takes weight");
        for (out, cap, sink) in [(&a, 0.0, None), (&b, 0.01, None), (&c, 0.0, Some(3.0))] {
            let want = reference(&q, (&k, &k), n_pos, hd, (cap, sink));
            for (&g, &w) in out.iter().zip(&want) {
                assert!(
                    (g as f64 - w).abs() <= 2e-5 * (1.0 + w.abs()),
                    "cap {cap}: {g} vs {w}"
                );
            }
        }
        let short = std::panic::catch_unwind(|| {
            let mut o = vec![0f32; hd];
            attend_head_kv(
                &q,
                cache,
                n_pos + 1,
                0.3,
                SoftmaxExtras::default(),
                &mut KvScratch::default(),
                &mut o,
            );
        });
        assert!(short.is_err(), "a short cache is refused");
    }
}
