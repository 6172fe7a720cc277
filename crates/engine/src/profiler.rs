//! Activation profiling inside the forward pass: per layer and neuron, how many tokens found the
//! neuron active, and optionally the (FFN input, activation) rows predictor training learns from.

use powerinfer_core::ModelConfig;

use crate::sparsity::is_active;

/// Rows captured for one layer since the last take: FFN inputs (after the FFN norm) and the
/// neurons' values h = act(gate)·up (what the down projection multiplies), both row-major, one
/// row per token.
#[derive(Clone, Debug, Default)]
pub struct Captured {
    pub x: Vec<f32>,
    pub act: Vec<f32>,
    /// A mixture of experts: each token's routed experts, in route order (n_expert_used per
    /// token, the order of its rows in `act`); empty for a dense model.
    pub routes: Vec<u32>,
}

/// Counters (and optional captures) filled by the forward pass.
#[derive(Clone, Debug)]
pub struct Profiler {
    /// `[layer][neuron]`: tokens in which the neuron was active.
    pub counts: Vec<Vec<u64>>,
    /// Tokens counted.
    pub tokens: u64,
    /// Threshold semantics per layer (|h| >= t); `None` = ReLU semantics (h != 0).
    pub thresholds: Option<Vec<f32>>,
    /// Keep the rows for predictor training.
    pub capture: bool,
    pub captured: Vec<Captured>,
    /// Keep the input mode's site inputs (calibration): per layer, per site of
    /// [`crate::input_sparse::SITES`], the rows each site's projections read, unmasked.
    pub capture_sites: bool,
    pub sites: Vec<[Vec<f32>; 4]>,
    /// The output head's input rows (with `capture_sites`).
    pub output_in: Vec<f32>,
    /// Mixture-of-experts models: `[layer][expert]`, tokens routed to the expert (empty for a
    /// dense model). `counts` then covers the flattened neuron space, neuron `e·expert_ffn +
    /// j` being neuron j of expert e, counted in the tokens routed to e.
    pub expert_counts: Vec<Vec<u64>>,
}

impl Profiler {
    /// A zeroed profiler for `n_layers` layers of `ffn` neurons.
    pub fn new(
        n_layers: usize,
        ffn: usize,
        thresholds: Option<Vec<f32>>,
        capture: bool,
    ) -> Profiler {
        Profiler::with_widths(vec![ffn; n_layers], thresholds, capture)
    }

    /// A zeroed profiler for layers of `widths[l]` neurons each.
    fn with_widths(widths: Vec<usize>, thresholds: Option<Vec<f32>>, capture: bool) -> Profiler {
        let n_layers = widths.len();
        Profiler {
            counts: widths.into_iter().map(|w| vec![0; w]).collect(),
            tokens: 0,
            thresholds,
            capture,
            captured: vec![Captured::default(); n_layers],
            capture_sites: false,
            sites: vec![Default::default(); n_layers],
            output_in: Vec::new(),
            expert_counts: Vec::new(),
        }
    }

    /// A zeroed profiler for the model of config `c`: layer l counts its own neurons
    /// ([`ModelConfig::layer_routed_neurons`]: a dense layer's `ffn_dim`, a layer of experts'
    /// flattened routed space of `n_expert × expert_ffn`). A mixture of experts also counts
    /// its routing per expert, `n_expert` per layer (zero in its leading dense layers, which
    /// route nothing); with `capture` each token's FFN input and its activations are kept (a
    /// layer of experts': its routed experts' in route order, `n_expert_used × expert_ffn` per
    /// token).
    pub fn for_model(c: &ModelConfig, thresholds: Option<Vec<f32>>, capture: bool) -> Profiler {
        let widths = (0..c.n_layers).map(|l| c.layer_routed_neurons(l)).collect();
        let expert_counts = match c.moe.is_moe() {
            true => vec![vec![0; c.moe.n_expert]; c.n_layers],
            false => Vec::new(),
        };
        Profiler {
            expert_counts,
            ..Profiler::with_widths(widths, thresholds, capture)
        }
    }

    /// Count expert `e` of `layer` routed for the `rows` (m × expert_ffn) of its neuron values
    /// h = act(gate)·up, and the neurons active in each (ReLU or threshold semantics; an MoE
    /// forward pass runs every token through its experts' dense products).
    pub fn record_expert(&mut self, layer: usize, e: usize, rows: &[f32], expert_ffn: usize) {
        let t = self.thresholds.as_ref().map(|t| t[layer]);
        let m = rows.len() / expert_ffn.max(1);
        if let Some(c) = self.expert_counts.get_mut(layer).and_then(|l| l.get_mut(e)) {
            *c += m as u64;
        }
        let counts = &mut self.counts[layer][e * expert_ffn..(e + 1) * expert_ffn];
        for row in rows.chunks_exact(expert_ffn) {
            for (c, &a) in counts.iter_mut().zip(row) {
                *c += is_active(a, t) as u64;
            }
        }
    }

    /// Keep the rows `x` that layer `layer`'s input site `site` reads (with `capture_sites`).
    pub fn record_site(&mut self, layer: usize, site: crate::input_sparse::Site, x: &[f32]) {
        if self.capture_sites {
            self.sites[layer][site as usize].extend_from_slice(x);
        }
    }

    /// Hand over the captured site rows (per layer four, then the output head's), leaving the
    /// buffers empty.
    pub fn take_sites(&mut self) -> (Vec<[Vec<f32>; 4]>, Vec<f32>) {
        let n = self.sites.len();
        (
            std::mem::replace(&mut self.sites, vec![Default::default(); n]),
            std::mem::take(&mut self.output_in),
        )
    }

    /// Count the active neurons of `n` rows of neuron values `act` (n × ffn) in `layer`, and
    /// keep the rows when capturing. The first `dense` rows were computed densely (threshold
    /// mode's first token of a context, `Sparsity::dense_rows`) and count every neuron as
    /// active when counting against thresholds.
    pub fn record(&mut self, layer: usize, x: &[f32], act: &[f32], ffn: usize, dense: usize) {
        let t = self.thresholds.as_ref().map(|t| t[layer]);
        let counts = &mut self.counts[layer];
        for (r, row) in act.chunks_exact(ffn).enumerate() {
            let all = r < dense && t.is_some();
            for (c, &a) in counts.iter_mut().zip(row) {
                *c += (all || is_active(a, t)) as u64;
            }
        }
        if self.capture {
            self.captured[layer].x.extend_from_slice(x);
            self.captured[layer].act.extend_from_slice(act);
        }
    }

    /// Keep `x` (FFN input rows) and `act` (their activation rows) as captured rows of `layer`
    /// (a mixture of experts: per token its routed experts' activations, in route order).
    pub fn capture_rows(&mut self, layer: usize, x: &[f32], act: &[f32]) {
        if self.capture {
            self.captured[layer].x.extend_from_slice(x);
            self.captured[layer].act.extend_from_slice(act);
        }
    }

    /// Keep the routed experts (`n_expert_used` per token, in route order) of the rows
    /// [`Profiler::capture_rows`] kept for `layer`.
    pub fn capture_routes(&mut self, layer: usize, routes: &[u32]) {
        if self.capture {
            self.captured[layer].routes.extend_from_slice(routes);
        }
    }

    /// Hand over the captured rows, leaving the buffers empty.
    pub fn take_captured(&mut self) -> Vec<Captured> {
        let n = self.captured.len();
        std::mem::replace(&mut self.captured, vec![Captured::default(); n])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_follow_the_semantics() {
        let mut relu = Profiler::new(1, 3, None, true);
        relu.record(0, &[1.0, 2.0], &[0.0, 0.5, -1.0, 2.0, 0.0, 0.1], 3, 1);
        assert_eq!(relu.counts[0], vec![1, 1, 2]);
        let mut thr = Profiler::new(1, 3, Some(vec![0.5]), false);
        thr.record(0, &[], &[0.0, 0.5, -1.0, 2.0, 0.0, 0.1], 3, 0);
        assert_eq!(thr.counts[0], vec![1, 1, 1]);
        thr.record(0, &[], &[0.4, -0.6, 0.0], 3, 0);
        assert_eq!(thr.counts[0], vec![1, 2, 1]);
        // A densely computed row counts every neuron under thresholds (ReLU semantics count
        // what is non-zero whatever `dense` says: relu above had dense = 1).
        thr.record(0, &[], &[0.0, 0.1, 0.2, 0.0, 0.1, 0.9], 3, 1);
        assert_eq!(thr.counts[0], vec![2, 3, 3]);
        assert!(thr.captured[0].act.is_empty());
        let got = relu.take_captured();
        assert_eq!(got[0].act.len(), 6);
        assert!(relu.captured[0].x.is_empty());
    }

    #[test]
    fn experts_count_routing_and_their_neurons() {
        let mut c = powerinfer_core::testing::tiny_config(powerinfer_core::Activation::Silu);
        (c.moe.n_expert, c.moe.n_expert_used, c.moe.expert_ffn_dim) = (3, 2, 2);
        let mut p = Profiler::for_model(&c, None, false);
        assert_eq!(p.counts[1].len(), 6);
        p.record_expert(1, 2, &[0.0, 1.0, 3.0, 0.0, 2.0, 2.0], 2);
        p.record_expert(1, 0, &[1.0, 0.0], 2);
        assert_eq!(p.expert_counts[1], vec![1, 0, 3]);
        assert_eq!(p.counts[1], vec![1, 0, 0, 0, 2, 2]);
        assert_eq!(p.expert_counts[0], vec![0, 0, 0]);
    }

    #[test]
    fn each_layer_counts_its_own_neurons() {
        // GLM-4.5: layer 0 a dense FFN of ffn_dim neurons, the others 3 experts of 2.
        let mut c = powerinfer_core::testing::tiny_config(powerinfer_core::Activation::Silu);
        (c.moe.n_expert, c.moe.n_expert_used, c.moe.expert_ffn_dim) = (3, 2, 2);
        c.moe.dense_lead = 1;
        let mut p = Profiler::for_model(&c, None, false);
        let widths: Vec<usize> = p.counts.iter().map(Vec::len).collect();
        assert_eq!(widths[0], c.ffn_dim);
        assert!(widths[1..].iter().all(|&w| w == 6));
        let row: Vec<f32> = (0..c.ffn_dim).map(|j| (j % 2) as f32).collect();
        p.record(0, &[], &row, c.ffn_dim, 0);
        assert_eq!(p.counts[0].iter().sum::<u64>(), (c.ffn_dim / 2) as u64);
        assert!(p.expert_counts.iter().all(|e| e.len() == 3));
    }
}
