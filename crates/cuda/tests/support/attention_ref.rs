//! Decode attention in float64, computed independently of the crate: the reference of the
//! attention kernels (shared by the host backend's unit tests and the integration tests).

/// One query's grouped-query attention over positions `first..n_pos` of the caches `k`, `v`
/// (rows of `n_kv · hd` values, as f64): for each of the `q.len() / hd` query heads h (reading
/// KV head `h / (heads / n_kv)`), scores `s_p = (q[h] · k[p]) · scale`, soft-capped to
/// `c · tanh(s_p / c)` with `cap = Some(c)`, then softmax and the weighted sum of the values;
/// with `sinks`, head h's sink logit `sinks[h]` is one more score of the softmax, without a
/// value (`Σ_p e^(s_p) v_p / (e^(sink) + Σ_p e^(s_p))`).
#[allow(clippy::too_many_arguments)]
pub fn attention_ref(
    q: &[f32],
    k: impl Fn(usize) -> f64,
    v: impl Fn(usize) -> f64,
    (n_kv, hd): (usize, usize),
    first: usize,
    n_pos: usize,
    scale: f64,
    cap: Option<f64>,
    sinks: Option<&[f32]>,
) -> Vec<f64> {
    let nh = q.len() / hd;
    let kv_dim = n_kv * hd;
    let mut want = vec![0f64; nh * hd];
    for h in 0..nh {
        let g = h / (nh / n_kv);
        let s: Vec<f64> = (first..n_pos)
            .map(|p| {
                let s = (0..hd)
                    .map(|i| q[h * hd + i] as f64 * k(p * kv_dim + g * hd + i))
                    .sum::<f64>()
                    * scale;
                cap.map_or(s, |c| c * (s / c).tanh())
            })
            .collect();
        let sink = sinks.map(|v| v[h] as f64);
        let m = s.iter().cloned().chain(sink).fold(f64::MIN, f64::max);
        let z: f64 =
            s.iter().map(|x| (x - m).exp()).sum::<f64>() + sink.map_or(0.0, |v| (v - m).exp());
        for i in 0..hd {
            want[h * hd + i] = (first..n_pos)
                .zip(&s)
                .map(|(p, s)| (s - m).exp() / z * v(p * kv_dim + g * hd + i))
                .sum();
        }
    }
    want
}
