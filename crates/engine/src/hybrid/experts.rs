//! A mixture-of-experts layer split between the GPU and the CPU. The layer's neurons are one
//! flattened space (`ModelConfig::n_neurons`: expert `e`'s rows `e · expert_ffn ..`, then the
//! shared expert's); the plan puts the hot ones in the GPU's slabs, the shared expert whole with
//! them. Per token the CPU routes (the router is small and the CPU needs the FFN input for its
//! cold neurons anyway), uploads one weight per expert, and computes the cold neurons of the
//! routed experts while the GPU computes the hot ones, each scaled by its expert's weight.

use powerinfer_core::{MoeFeatures, Result, Weight};
use powerinfer_cpu::{axpy_rows, matvec_rows, sparse_ffn_many, GateRows, SparseFfn, SparsePart};

use crate::layer::FfnKind;
use crate::moe_pass::{experts_pass, ExpertsPass};
use crate::moe_weights::{shared_scale, ExpertBias, MoeWeights};

/// Each expert's cold neurons (rows of the expert, ascending) given the layer's hot neurons
/// (flattened ids, ascending): what the CPU computes when the expert is routed.
pub fn cold_by_expert(hot: &[u32], n_expert: usize, expert_ffn: usize) -> Vec<Vec<u32>> {
    let mut is_hot = vec![false; n_expert * expert_ffn];
    for &i in hot {
        if let Some(h) = is_hot.get_mut(i as usize) {
            *h = true;
        }
    }
    is_hot
        .chunks(expert_ffn)
        .map(|e| (0..expert_ffn as u32).filter(|&j| !e[j as usize]).collect())
        .collect()
}

/// The token's weight of every expert (0 where not routed) and, last, the shared expert's
/// scale (0 without one): what the GPU's `expert_flags` and `expert_scale` read.
pub fn token_weights(
    m: &MoeFeatures,
    w: &MoeWeights,
    routes: &[(u32, f32)],
    xn: &[f32],
    out: &mut Vec<f32>,
) {
    out.clear();
    out.resize(m.n_expert + 1, 0.0);
    for &(e, wt) in routes {
        out[e as usize] = wt;
    }
    out[m.n_expert] = w.shared.as_ref().map_or(0.0, |s| shared_scale(s, xn));
}

/// The CPU's part of one token: for every routed expert its `cold` neurons (all of them for an
/// expert with none on the GPU). `dense` (dense mode): their gate and up rows, then the
/// expert's whole down product over the activations with the hot neurons' at zero, every
/// routed expert in one pass ([`experts_pass`], the CPU engine's dense decode). Otherwise gate
/// rows, then the up and transposed down rows of those that fire, every routed expert's tasks in
/// one parallel region ([`sparse_ffn_many`], as the CPU engine's sparse experts); with
/// `threshold`, per expert its gate and up rows, then the down rows of those with
/// |act(gate)·up| >= t. Biased experts (gpt-oss) add their gate and up biases to the cold rows
/// (the clamped SwiGLU of them), and the CPU adds every routed expert's down bias, hot or cold
/// (the GPU's hot part has none). Each expert's output times its weight,
/// summed into `out` (dim, overwritten); `bufs` is scratch reused across tokens. Returns the
/// bytes of expert rows read, or None when no routed expert has cold neurons and none has a
/// down bias (nothing to add).
#[allow(clippy::too_many_arguments)]
pub fn cold_experts(
    m: &MoeFeatures,
    w: &MoeWeights,
    down_t: &[Weight],
    act: FfnKind,
    threshold: Option<f32>,
    dense: bool,
    xn: &[f32],
    routes: &[(u32, f32)],
    cold: &[Vec<u32>],
    bufs: &mut Vec<Vec<f32>>,
    out: &mut [f32],
) -> Result<Option<u64>> {
    out.fill(0.0);
    let dim = out.len();
    if dense && threshold.is_none() {
        // Dense mode: the cold rows' gate and up, then each routed expert's whole down product
        // over its activations (the hot neurons' at zero), in one pass.
        let pass = ExpertsPass {
            m,
            w,
            act,
            xn,
            dim,
            early: None,
            routes: Some(routes),
            rows: Some(cold),
            shared: false,
        };
        // (A biased expert's down bias comes in the pass, whether it has cold rows or none.)
        experts_pass(&pass, bufs, out)?;
        let mut bytes = 0;
        for &(e, _) in routes {
            let e = e as usize;
            if !cold[e].is_empty() {
                bytes += cold[e].len() * (w.gate[e].row_bytes() + w.up[e].row_bytes())
                    + w.down[e].n_bytes();
            }
        }
        let biased = w.expert_bias.is_some() && !routes.is_empty();
        return Ok((bytes > 0 || biased).then_some(bytes as u64));
    }
    let work: Vec<(usize, f32)> = routes
        .iter()
        .map(|&(e, wt)| (e as usize, wt))
        .filter(|&(e, _)| !cold[e].is_empty())
        .collect();
    let ffn = |e: usize| SparseFfn {
        gate: &w.gate[e],
        up: Some(&w.up[e]),
        down_t: &down_t[e],
    };
    bufs.resize_with(work.len().max(bufs.len()), Vec::new);
    let mut ys: Vec<&mut [f32]> = bufs[..work.len()]
        .iter_mut()
        .map(|b| {
            b.resize(dim, 0.0);
            b.as_mut_slice()
        })
        .collect();
    let mut bytes = 0usize;
    match threshold {
        None => {
            let parts: Vec<SparsePart<'_>> = work
                .iter()
                .map(|&(e, _)| SparsePart {
                    ffn: ffn(e),
                    rows: match cold[e].len() == w.gate[e].rows {
                        true => GateRows::All,
                        false => GateRows::Listed(&cold[e]),
                    },
                })
                .collect();
            let fire = |_: usize, _: u32, g: f32| act.apply(g);
            let fired = sparse_ffn_many(&parts, xn, fire, |a, u| act.times_up(a, u), &mut ys)?;
            // Every listed gate row, then the up and transposed down rows of those that fired.
            for &(e, _) in &work {
                bytes += cold[e].len() * w.gate[e].row_bytes();
            }
            if let Some(&(e, _)) = work.first() {
                bytes += fired * (w.up[e].row_bytes() + down_t[e].row_bytes());
            }
        }
        Some(t) => {
            for (&(e, _), y) in work.iter().zip(ys.iter_mut()) {
                y.fill(0.0);
                let bias = w.expert_bias.as_ref().map(|b| (b, e));
                let passed = threshold_rows(&ffn(e), act, bias, t, xn, &cold[e], y)?;
                bytes += cold[e].len() * (w.gate[e].row_bytes() + w.up[e].row_bytes())
                    + passed * down_t[e].row_bytes();
            }
        }
    }
    for (y, &(_, wt)) in bufs.iter().zip(&work) {
        out.iter_mut().zip(y).for_each(|(o, v)| *o += wt * v);
    }
    // Every routed expert's down bias, on the CPU side only.
    if let Some(b) = &w.expert_bias {
        for &(e, wt) in routes {
            let bd = ExpertBias::of(&b.down, e as usize, dim);
            out.iter_mut().zip(bd).for_each(|(o, v)| *o += wt * v);
        }
    }
    let biased = w.expert_bias.is_some() && !routes.is_empty();
    Ok((!work.is_empty() || biased).then_some(bytes as u64))
}

/// Threshold mode over the rows `ids` of one expert: their gate and up rows (with expert `e`'s
/// gate and up biases where `bias` gives them), then the transposed down rows of the neurons
/// with |act(gate)·up| >= `t` (the clamped SwiGLU's value for gpt-oss), into `y`. Returns how
/// many passed.
fn threshold_rows(
    ffn: &SparseFfn<'_>,
    act: FfnKind,
    bias: Option<(&ExpertBias, usize)>,
    t: f32,
    xn: &[f32],
    ids: &[u32],
    y: &mut [f32],
) -> Result<usize> {
    let (mut g, mut u) = (vec![0.0f32; ids.len()], vec![0.0f32; ids.len()]);
    matvec_rows(ffn.gate, xn, ids, &mut g)?;
    if let Some(up) = ffn.up {
        matvec_rows(up, xn, ids, &mut u)?;
    }
    if let Some((b, e)) = bias {
        let ef = ffn.gate.rows;
        let (bg, bu) = (ExpertBias::of(&b.gate, e, ef), ExpertBias::of(&b.up, e, ef));
        for ((&i, g), u) in ids.iter().zip(&mut g).zip(&mut u) {
            *g += bg[i as usize];
            *u += bu[i as usize];
        }
    }
    let (mut idx, mut vals) = (Vec::new(), Vec::new());
    for ((&i, &g), &u) in ids.iter().zip(&g).zip(&u) {
        let h = match act.swiglu_limit {
            Some(limit) => powerinfer_core::swiglu_oai(g, u, limit),
            None => act.times_up(act.apply(g), u),
        };
        if h.abs() >= t {
            idx.push(i);
            vals.push(h);
        }
    }
    axpy_rows(ffn.down_t, &idx, &vals, y)?;
    Ok(idx.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cold_neurons_per_expert() {
        // 3 experts of 4; hot: expert 0 rows 1, 3; expert 2 all; shared ids (12..) ignored.
        let cold = cold_by_expert(&[1, 3, 8, 9, 10, 11, 12, 13], 3, 4);
        assert_eq!(cold, vec![vec![0, 2], vec![0, 1, 2, 3], vec![]]);
    }
}
