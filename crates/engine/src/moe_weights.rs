//! A mixture-of-experts layer's weights (the router, each expert's row views of the merged
//! tensors, the shared expert) and the two rules read off them for one token: the router's
//! top-k with its weights ([`route`]) and the shared expert's gate ([`shared_scale`]). Below
//! the FFN passes that compute the experts ([`crate::moe`], the one-pass decode) and the
//! weights that hold them.

use std::sync::Arc;

use powerinfer_core::{bail, ensure, Gating, MoeFeatures, Result, Weight};
use powerinfer_cpu::Interleaved;

/// A shared expert every token runs (Qwen2-MoE).
#[derive(Clone, Debug)]
pub struct SharedExpert {
    /// `ffn_gate_inp_shexp` (dim): the output is scaled by `sigmoid(gate_inp · x)`.
    pub gate_inp: Option<Vec<f32>>,
    pub gate: Weight,
    pub up: Weight,
    pub down: Weight,
}

/// gpt-oss's biases of one layer's router and experts ([`MoeFeatures::expert_bias`]).
#[derive(Clone, Debug)]
pub struct ExpertBias {
    /// Added to the router's logits (n_expert).
    pub router: Vec<f32>,
    /// Added to expert e's gate and up outputs: values `e·expert_ffn..(e+1)·expert_ffn`.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
    /// Added to expert e's down output (values `e·dim..(e+1)·dim`) before its route weight.
    pub down: Vec<f32>,
}

impl ExpertBias {
    /// Expert `e`'s part of `b` (one of this struct's per-expert vectors), `width` wide.
    pub fn of(b: &[f32], e: usize, width: usize) -> &[f32] {
        &b[e * width..(e + 1) * width]
    }
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
    /// The router's correction bias (`exp_probs_b.bias`, n_expert values): added to the
    /// probabilities to choose the experts, not to their weights ([`route`]).
    pub score_bias: Option<Vec<f32>>,
    /// The router's and the experts' biases (gpt-oss).
    pub expert_bias: Option<ExpertBias>,
    /// The experts interleaved for the one-token pass, where the engine decodes dense on the
    /// CPU ([`MoeWeights::pack`]); the row views above stay for everything else.
    pub packed: Option<PackedExperts>,
}

/// A layer's experts with their rows interleaved by eight, for the decode pass's whole
/// products (`crate::moe_pass`): the merged tensors whole, so expert e's rows are rows
/// `e·rows..(e + 1)·rows` of its tensor (whole groups: a tensor is packed only where an
/// expert's rows are a multiple of eight), and the shared expert's matrices. None where the
/// format's interleaved layout does not pay ([`Interleaved::pays`]).
#[derive(Clone, Debug)]
pub struct PackedExperts {
    /// `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`.
    pub experts: [Option<Arc<Interleaved>>; 3],
    /// The shared expert's gate, up and down.
    pub shared: [Option<Arc<Interleaved>>; 3],
}

/// Rows of a group of the interleaved layout.
const GROUP_ROWS: usize = 8;

/// `w` interleaved where its layout pays and `per` (rows of one expert) is whole groups.
fn packed(w: &Weight, per: usize) -> Result<Option<Arc<Interleaved>>> {
    match per.is_multiple_of(GROUP_ROWS) && Interleaved::pays(w.into()) {
        true => Ok(Some(Arc::new(Interleaved::new(w)?))),
        false => Ok(None),
    }
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
    /// The experts of the merged tensors `experts` (gate and up: n_expert·expert_ffn rows;
    /// down: n_expert·dim rows), and the router with its correction bias where it has one.
    pub fn new(
        m: &MoeFeatures,
        router: Weight,
        score_bias: Option<Vec<f32>>,
        [gate, up, down]: [&Weight; 3],
        shared: Option<SharedExpert>,
    ) -> Result<MoeWeights> {
        ensure!(
            router.rows == m.n_expert,
            Shape,
            "the router has {} rows for {} experts",
            router.rows,
            m.n_expert
        );
        ensure!(
            score_bias.as_ref().is_none_or(|b| b.len() == m.n_expert),
            Shape,
            "the router's correction bias has {:?} values for {} experts",
            score_bias.as_ref().map(Vec::len),
            m.n_expert
        );
        Ok(MoeWeights {
            score_bias,
            router,
            gate: row_blocks(gate, m.n_expert)?,
            up: row_blocks(up, m.n_expert)?,
            down: row_blocks(down, m.n_expert)?,
            shared,
            expert_bias: None,
            packed: None,
        })
    }

    /// Interleave the merged expert tensors `merged` (gate, up, down: the ones [`Self::new`]
    /// was given) and the shared expert's matrices for the decode pass, where their formats'
    /// layouts pay and [`powerinfer_cpu::interleaving`] allows. The copy is kept beside the row
    /// views (the file's rows, which the batched and row-by-index paths read).
    pub fn pack(&mut self, [gate, up, down]: [&Weight; 3]) -> Result<()> {
        if !powerinfer_cpu::interleaving() {
            return Ok(());
        }
        let (ef, dim) = (self.gate[0].rows, self.down[0].rows);
        ensure!(
            gate.rows == self.gate.len() * ef && down.rows == self.down.len() * dim,
            Shape,
            "merged expert tensors of {} and {} rows for {} experts of {ef} (dim {dim})",
            gate.rows,
            down.rows,
            self.gate.len()
        );
        let experts = [packed(gate, ef)?, packed(up, ef)?, packed(down, dim)?];
        let shared = match &self.shared {
            Some(s) => [
                packed(&s.gate, GROUP_ROWS)?,
                packed(&s.up, GROUP_ROWS)?,
                packed(&s.down, GROUP_ROWS)?,
            ],
            None => [None, None, None],
        };
        self.packed = Some(PackedExperts { experts, shared });
        Ok(())
    }

    /// Give the layer its router and expert biases, checked against the experts' shapes.
    pub fn set_expert_bias(&mut self, b: Option<ExpertBias>) -> Result<()> {
        if let Some(b) = &b {
            let (n, ef, dim) = (self.gate.len(), self.gate[0].rows, self.down[0].rows);
            ensure!(
                b.router.len() == n
                    && b.gate.len() == n * ef
                    && b.up.len() == n * ef
                    && b.down.len() == n * dim,
                Shape,
                "expert biases of {}, {}, {}, {} values for {n} experts of {ef} (dim {dim})",
                b.router.len(),
                b.gate.len(),
                b.up.len(),
                b.down.len()
            );
        }
        self.expert_bias = b;
        Ok(())
    }

    /// Add the router's bias (where the layer has one) to `n` rows of logits.
    pub fn bias_logits(&self, logits: &mut [f32]) {
        if let Some(b) = &self.expert_bias {
            for row in logits.chunks_exact_mut(b.router.len()) {
                row.iter_mut().zip(&b.router).for_each(|(l, b)| *l += b);
            }
        }
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
/// llama.cpp's `build_moe_ffn`): probabilities `p` by the gating; the selection scores `p + b`
/// with the correction bias `bias` where the layer has one; with expert groups, every expert
/// outside the `topk_group` groups of the largest group scores (the sum of a group's two
/// largest selection scores, ties to the lower group) out of the running; the
/// `n_expert_used` largest selection scores (ties to the lower index); their probabilities
/// `p` (for [`Gating::SoftmaxWeight`], the softmax over the chosen logits), divided by their sum (clamped to ≥ 6.1e-5) when `norm_weights`, times
/// `weights_scale`.
pub fn route(m: &MoeFeatures, bias: Option<&[f32]>, logits: &[f32], out: &mut Vec<(u32, f32)>) {
    let probs = gate_probs(m, logits);
    let mut select: Vec<f64> = match bias {
        Some(b) => probs.iter().zip(b).map(|(&p, &b)| p + b as f64).collect(),
        None => probs.clone(),
    };
    if m.grouped() {
        keep_best_groups(m, &mut select);
    }
    let mut order: Vec<u32> = (0..select.len() as u32).collect();
    let k = m.n_expert_used.min(order.len());
    // Largest first, NaN last, ties to the lower index.
    let rank = |i: u32| match select[i as usize] {
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
    match m.gating {
        // gpt-oss: the softmax over the chosen logits.
        Gating::SoftmaxWeight => {
            let max = order
                .iter()
                .map(|&i| probs[i as usize])
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = order
                .iter()
                .map(|&i| (probs[i as usize] - max).exp())
                .collect();
            let sum: f64 = e.iter().sum();
            out.extend(order.iter().zip(&e).map(|(&i, &v)| (i, (v / sum) as f32)));
        }
        _ => out.extend(order.into_iter().map(|i| (i, probs[i as usize] as f32))),
    }
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

/// Set the selection scores of every expert outside the `topk_group` best groups to -inf
/// (a group's score: the sum of its two largest, NaN counted as -inf).
fn keep_best_groups(m: &MoeFeatures, select: &mut [f64]) {
    let size = select.len() / m.n_group;
    let score = |g: &[f64]| {
        let (mut a, mut b) = (f64::NEG_INFINITY, f64::NEG_INFINITY);
        for v in g
            .iter()
            .map(|&v| if v.is_nan() { f64::NEG_INFINITY } else { v })
        {
            if v > a {
                (a, b) = (v, a);
            } else if v > b {
                b = v;
            }
        }
        match size {
            1 => a,
            _ => a + b,
        }
    };
    let scores: Vec<f64> = select.chunks_exact(size).map(score).collect();
    let mut groups: Vec<usize> = (0..m.n_group).collect();
    groups.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    for &g in &groups[m.topk_group.min(m.n_group)..] {
        select[g * size..(g + 1) * size].fill(f64::NEG_INFINITY);
    }
}

/// The gating's probabilities of the router's logits (softmax over all experts, or each
/// expert's sigmoid), in f64.
fn gate_probs(m: &MoeFeatures, logits: &[f32]) -> Vec<f64> {
    match m.gating {
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
        Gating::SoftmaxWeight => logits.iter().map(|&l| l as f64).collect(),
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
        route(&feats(Gating::Softmax, false, None), None, &logits, &mut r);
        let e: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
        let sum: f64 = e.iter().sum();
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3]);
        assert!((r[0].1 as f64 - e[1] / sum).abs() < 1e-7);
        assert!((r[1].1 as f64 - e[3] / sum).abs() < 1e-7);
        route(
            &feats(Gating::Softmax, true, Some(2.0)),
            None,
            &logits,
            &mut r,
        );
        let w1 = e[1] / (e[1] + e[3]);
        assert!((r[0].1 as f64 - 2.0 * w1).abs() < 1e-6);
        route(&feats(Gating::Sigmoid, false, None), None, &logits, &mut r);
        assert!((r[1].1 as f64 - 1.0 / (1.0 + (-1.5f64).exp())).abs() < 1e-7);
        // NaN never wins; ties keep both candidates.
        route(
            &feats(Gating::Sigmoid, false, None),
            None,
            &[f32::NAN, 1.0, 1.0, 0.0, 0.0],
            &mut r,
        );
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>().len(), 2);
        assert!(r.iter().all(|p| p.0 == 1 || p.0 == 2));
    }

    #[test]
    fn correction_bias_and_groups_choose_weights_do_not() {
        let logits = [0.5f32, 2.0, -1.0, 1.5, 0.0, 0.2];
        let sig = |l: f32| 1.0 / (1.0 + (-(l as f64)).exp());
        let mut m = MoeFeatures {
            n_expert: 6,
            ..feats(Gating::Sigmoid, false, Some(2.5))
        };
        let mut r = Vec::new();
        // The bias lifts experts 2 and 4 over 1 and 3; their weights stay their sigmoids.
        let bias = [0.0f32, 0.0, 2.0, 0.0, 1.0, 0.0];
        route(&m, Some(&bias), &logits, &mut r);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![2, 4]);
        assert!((r[0].1 as f64 - 2.5 * sig(-1.0)).abs() < 1e-6);
        m.norm_weights = true;
        route(&m, Some(&bias), &logits, &mut r);
        let w2 = sig(-1.0) / (sig(-1.0) + sig(0.0));
        assert!((r[0].1 as f64 - 2.5 * w2).abs() < 1e-6);
        // Three groups of two: scores {0.62+0.88, 0.27+0.82, 0.5+0.55} -> group 0 only.
        (m.n_group, m.topk_group) = (3, 1);
        route(&m, None, &logits, &mut r);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 0]);
        // Two groups kept: 0 and 1, so expert 3 (1.5) wins over 0 (0.5).
        m.topk_group = 2;
        route(&m, None, &logits, &mut r);
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), vec![1, 3]);
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
