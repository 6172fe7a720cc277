//! `rms_norm` and `rope` (norm_rope.cu) on f32 rows.

/// `out = x / sqrt(mean(x²) + eps) · w` for every row of `n` values of `x` (the sum of
/// squares in f64, as the CPU engine's RMSNorm).
pub(super) fn rms_norm(x: &[f32], w: &[f32], n: usize, eps: f32, out: &mut [f32]) {
    if n == 0 {
        return;
    }
    for (xr, o) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let ss: f64 = xr.iter().map(|&v| v as f64 * v as f64).sum();
        let scale = (1.0 / (ss / n as f64 + eps as f64).sqrt()) as f32;
        for ((o, &v), &g) in o.iter_mut().zip(xr).zip(w) {
            *o = v * scale * g;
        }
    }
}

/// Rotate every head of `x` (heads of `head_dim`, contiguous) in place for position `pos`:
/// pair i turns by `pos · theta^(−2i/head_dim)` (in f64); `neox` pairs (i, i + d/2), else
/// (2i, 2i + 1).
pub(super) fn rope(x: &mut [f32], head_dim: usize, pos: usize, theta: f32, neox: bool) {
    let half = head_dim / 2;
    if half == 0 {
        return;
    }
    let angles: Vec<(f32, f32)> = (0..half)
        .map(|i| {
            let inv_freq = (theta as f64).powf(-2.0 * i as f64 / head_dim as f64);
            let (s, c) = (pos as f64 * inv_freq).sin_cos();
            (c as f32, s as f32)
        })
        .collect();
    for head in x.chunks_exact_mut(head_dim) {
        for (i, &(c, s)) in angles.iter().enumerate() {
            let (a, b) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * c - x1 * s;
            head[b] = x0 * s + x1 * c;
        }
    }
}
