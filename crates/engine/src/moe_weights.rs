//! A mixture-of-experts layer's weights (the router, each expert's row views of the merged
//! tensors, the shared expert) and the two rules read off them for one token: the router's
//! top-k with its weights ([`route`]) and the shared expert's gate ([`shared_scale`]). Below
//! the FFN passes that compute the experts ([`crate::moe`], the one-pass decode) and the
//! weights that hold them.

use powerinfer_core::{bail, ensure, Gating, MoeFeatures, Result, Weight};

/// A shared expert every token runs (Qwen2-MoE).
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// `ffn_gate_inp_shexp` (dim): the output is scaled by `sigmoid(gate_inp · x)`.
    pub gate_inp: Option<Vec<f32>>,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// One layer's experts.
#[derive(Clone, Debug)]
pub struct MoeWeights {
    /// `ffn_gate_inp`: n_expert rows of dim.
    pub router: Weight,
    /// Expert `e`'s gate, up (expert_ffn rows of dim) and down (dim rows of expert_ffn): row
    /// views of the merged tensors.
    pub gate: Vec<Weight>,
    pub up: Vec<Weight>,
    pub down: Vec<Weight>,
    pub shared: Option<SharedExpert>,
}

/// `w`'s rows as `n` equal consecutive blocks, each a weight of its own (no copy).
fn row_blocks(w: &Weight, n: usize) -> Result<Vec<Weight>> {
    ensure!(
        n > 0 && w.rows.is_multiple_of(n),
        Shape,
        "{} rows do not split into {n} experts",
        w.rows
    );
    let rows = w.rows / n;
    let bytes = rows * w.row_bytes();
    (0..n)
        .map(|e| match w.data.slice(e * bytes..(e + 1) * bytes) {
            Some(b) => Weight::new(w.dtype, rows, w.cols, b),
            None => bail!(Shape, "expert {e} lies outside its tensor"),
        })
        .collect()
}

impl MoeWeights {
    /// The experts of the merged tensors `gate`, `up` (n_expert·expert_ffn rows) and `down`
    /// (n_expert·dim rows), and the router.
    pub fn new(
        m: &MoeFeatures,
        router: Weight,
        gate: &Weight,
        up: &Weight,
        down: &Weight,
        shared: Option<SharedExpert>,
    ) -> Result<MoeWeights> {
        ensure!(
            router.rows == m.n_expert,
            Shape,
            "the router has {} rows for {} experts",
            router.rows,
            m.n_expert
        );
        Ok(MoeWeights {
            router,
            gate: row_blocks(gate, m.n_expert)?,
            up: row_blocks(up, m.n_expert)?,
            down: row_blocks(down, m.n_expert)?,
            shared,
        })
    }

    /// Weight bytes one token reads: the router, `k` experts and the shared expert.
    pub fn bytes_per_token(&self, k: usize) -> usize {
        let expert = self.gate[0].n_bytes() + self.up[0].n_bytes() + self.down[0].n_bytes();
        let shared = self.shared.as_ref().map_or(0, |s| {
            let gate = s.gate_inp.as_ref().map_or(0, |g| 4 * g.len());
            s.gate.n_bytes() + s.up.n_bytes() + s.down.n_bytes() + gate
        });
        self.router.n_bytes() + k * expert + shared
    }
}

/// The experts one token is routed to, with their weights, from the router's `logits` (as
/// llama.cpp: probabilities by the gating, the `n_expert_used` largest (ties to the lower
/// index), their probabilities, divided by their sum (clamped to ≥ 6.1e-5) when
/// `norm_weights`, times `weights_scale`).
pub fn route(m: &MoeFeatures, logits: &[f32], out: &mut Vec<(u32, f32)>) {
    let probs: Vec<f64> = match m.gating {
        Gating::Softmax => {
            let max = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
            let e: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
            let sum: f64 = e.iter().sum();
            e.into_iter().map(|v| v / sum).collect()
        }
        Gating::Sigmoid => logits
            .iter()
            .map(|&l| 1.0 / (1.0 + (-(l as f64)).exp()))
            .collect(),
    };
    let mut order: Vec<u32> = (0..probs.len() as u32).collect();
    let k = m.n_expert_used.min(order.len());
    // Largest first, NaN last, ties to the lower index.
    let rank = |i: u32| match probs[i as usize] {
        p if p.is_nan() => f64::NEG_INFINITY,
        p => p,
    };
    let cmp = |a: &u32, b: &u32| rank(*b).total_cmp(&rank(*a)).then(a.cmp(b));
    if k < order.len() {
        order.select_nth_unstable_by(k, cmp);
        order.truncate(k);
    }
    order.sort_by(cmp);
    out.clear();
    out.extend(order.into_iter().map(|i| (i, probs[i as usize] as f32)));
    if m.norm_weights {
        let sum: f64 = out
            .iter()
            .map(|&(_, w)| w as f64)
            .sum::<f64>()
            .max(6.103_515_625e-5);
        out.iter_mut()
            .for_each(|(_, w)| *w = (*w as f64 / sum) as f32);
    }
    if let Some(s) = m.weights_scale {
        out.iter_mut().for_each(|(_, w)| *w *= s);
    }
}

/// The shared expert's scale for one token's FFN input `x`: `sigmoid(gate_inp · x)` where it
/// has that gate, else 1.
pub fn shared_scale(sh: &SharedExpert, x: &[f32]) -> f32 {
    match &sh.gate_inp {
        Some(g) => {
            let z: f64 = g.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
            (1.0 / (1.0 + (-z).exp())) as f32
        }
        None => 1.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn feats(gating: Gating, norm: bool, scale: Option<f32>) -> MoeFeatures {
        MoeFeatures {
            n_expert: 5,
            n_expert_used: 2,
            gating,
            norm_weights: norm,
            weights_scale: scale,
            ..Default::default()
        }
    }

    #[test]
    fn routing_follows_llama_cpp() {
        let logits = [0.5f32, 2.0, -1.0, 1.5, 0.0];
        let mut r = Vec::new();
        route(&feats(Gating::Softmax, false, None), &logits, &mut r);
        let e: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
        let sum: f64 = e.iter().sum();
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0].1 as f64 - e[1] / sum).abs() < 1e-7);
        assert!((r[1].1 as f64 - e[3] / sum).abs() < 1e-7);
        route(&feats(Gating::Softmax, true, Some(2.0)), &logits, &mut r);
        let w1 = e[1] / (e[1] + e[3]);
        assert!((r[0].1 as f64 - 2.0 * w1).abs() < 1e-6);
        route(&feats(Gating::Sigmoid, false, None), &logits, &mut r);
        assert!((r[1].1 as f64 - 1.0 / (1.0 + (-1.5f64).exp())).abs() < 1e-7);
        // NaN never wins; ties keep both candidates.
        route(
            &feats(Gating::Sigmoid, false, None),
            &[f32::NAN, 1.0, 1.0, 0.0, 0.0],
            &mut r,
        );
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>().len(), 2);
        assert!(r.iter().all(|p| p.0 == 1 || p.0 == 2));
    }

    #[test]
    fn experts_are_row_views() {
        let w = Weight::from_f32(
            6,
            2,
            &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0],
        )
        .unwrap();
        let b = row_blocks(&w, 3).unwrap();
        assert_eq!(b[2].rows, 2);
        assert_eq!(b[1].bytes().as_ptr(), w.row(2).as_ptr());
        assert!(row_blocks(&w, 4).is_err());
    }
}
