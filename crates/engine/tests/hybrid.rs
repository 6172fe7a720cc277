//! The hybrid executor against the CPU engine, one test body per device: always `gpu-sim` (the
//! host backend), and `cuda` where a GPU is present ("skipped" printed otherwise). Synthetic
//! ReLU and SiLU models in every weight format; placements from nothing on the GPU to
//! everything, alternating layers, partial slabs and predictors on either side; every sparsity
//! mode; greedy decoding compared step by step, long contexts, truncation, rollback and prefill
//! after decode; the device allocations against the plan's accounting.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{add_layers, config, no_check, values};
use powerinfer_core::testing::quantized_weight;
use powerinfer_core::{Activation, DType, NeuronTable, PlanFile, RopeScaling, RopeStyle, Weight};
use powerinfer_engine::forward::Logits;
use powerinfer_engine::{
    LayerPredictor, ModelWeights, Placement, PredictorInput, Session, Sparsity,
};

/// Largest allowed |hybrid − cpu| of a logit, relative to the largest |cpu| logit (at least 1).
const TOL: f32 = 1e-3;
/// The same for Q4_0/Q4_1 models: the CPU's 4-bit row accumulation rounds its coefficients to
/// 8 bits (about 1/254 per row, llama.cpp's precision; cpu/kernels/avx2/q4_axpy.rs), which
/// the GPU kernels do not, so the two differ by up to ~1.2e-3 of the largest logit per step.
const TOL_Q4: f32 = 3e-3;

/// The tolerance for a model whose matrices are `dtype`.
fn tol(dtype: DType) -> f32 {
    match dtype {
        DType::Q4_0 | DType::Q4_1 => TOL_Q4,
        _ => TOL,
    }
}

/// The devices every test body runs on: gpu-sim, gpu-emu (the real kernels on the CPU, with the
/// `emu` feature: `benchmarks/gpu/emu.sh`), and cuda where there is a GPU.
fn devices() -> Vec<&'static str> {
    let mut d = vec!["gpu-sim"];
    if powerinfer_cuda::BUILT_WITH_EMU {
        d.push("gpu-emu");
    } else {
        println!("gpu-emu: skipped (built without the emu feature)");
    }
    if powerinfer_cuda::is_available() {
        d.push("cuda");
    } else {
        println!("cuda: skipped (no CUDA device)");
    }
    d
}

/// Formats whose models the slow emulator decodes in the tests that loop over formats (every
/// format's kernels are checked on it in crates/cuda/tests: here it checks the executor's use
/// of them): a float format, a 32-weight block format and a K-quant.
const EMU_FORMATS: [DType; 3] = [DType::F16, DType::Q4_0, DType::Q4_K];

/// [`devices`] for a test of a model in `dtype`: without gpu-emu outside [`EMU_FORMATS`].
fn devices_for(dtype: DType) -> Vec<&'static str> {
    let mut d = devices();
    if !EMU_FORMATS.contains(&dtype) {
        d.retain(|&x| x != "gpu-emu");
    }
    d
}

/// The tiny random model (dim 64, ffn 96, 4 heads of 16 over 2 KV heads, 2 layers) with every
/// matrix stored as `dtype`, context `ctx`.
fn model(act: Activation, dtype: DType, ctx: usize) -> Arc<ModelWeights> {
    let c = powerinfer_core::ModelConfig {
        max_context: ctx,
        ..config(act)
    };
    model_with(c, |_, _| dtype)
}

/// A random model of config `c`: matrix `name` (rows of `cols` weights) stored as
/// `dtype_of(name, cols)`, norms as F32.
fn model_with(
    c: powerinfer_core::ModelConfig,
    dtype_of: impl Fn(&str, usize) -> DType,
) -> Arc<ModelWeights> {
    let mut t = HashMap::new();
    let mut seed = 100;
    let mut add = |name: String, rows: usize, cols: usize, scale: f32| {
        seed += 1;
        let dt = if rows == 1 {
            DType::F32
        } else {
            dtype_of(&name, cols)
        };
        t.insert(
            name,
            quantized_weight(dt, rows, cols, &values(rows * cols, seed, scale)),
        );
    };
    add("token_embd".into(), c.vocab_size, c.dim, 1.0);
    add("output_norm".into(), 1, c.dim, 1.0);
    add("output".into(), c.vocab_size, c.dim, 0.5);
    add_layers(&c, add);
    Arc::new(ModelWeights::from_tensors(c, t).unwrap())
}

/// A random model of config `c` in Q4_K but for the matrices `part` picks, in `dtype`.
fn q4_k_but(
    c: powerinfer_core::ModelConfig,
    part: impl Fn(&str) -> bool,
    dtype: DType,
) -> Arc<ModelWeights> {
    model_with(c, |name, _| if part(name) { dtype } else { DType::Q4_K })
}

/// Assert `r` failed with `Error::Unsupported` naming `what`.
fn assert_unsupported<T>(r: powerinfer_core::Result<T>, what: &str) {
    match r {
        Err(powerinfer_core::Error::Unsupported(msg)) if msg.contains(what) => {}
        Err(e) => panic!("not Unsupported naming {what}: {e}"),
        Ok(_) => panic!("not refused (expected Unsupported naming {what})"),
    }
}

/// The format of matrix `name` with rows of `cols` weights in a Q4_K_M file, llama.cpp's recipe
/// in its main lines (as `powerinfer_rs.testing.synth_types`): Q6_K for the output head and
/// layer 0's attn_v and ffn_down, Q4_K elsewhere; rows that are no whole number of 256-weight
/// super-blocks take llama.cpp's fallbacks, Q8_0 for Q6_K and Q5_0 for Q4_K.
fn q4_k_m(name: &str, cols: usize) -> DType {
    let six = matches!(name, "output" | "blk.0.attn_v" | "blk.0.ffn_down");
    match (six, cols.is_multiple_of(256)) {
        (true, true) => DType::Q6_K,
        (true, false) => DType::Q8_0,
        (false, true) => DType::Q4_K,
        (false, false) => DType::Q5_0,
    }
}

/// Random predictors of rank 24 (f32), threshold 0: about half the neurons active.
fn predictors(m: &ModelWeights) -> Vec<LayerPredictor> {
    let (dim, ffn, rank) = (m.config.dim, m.config.ffn_dim, 24);
    (0..m.config.n_layers)
        .map(|i| {
            let fc1 =
                Weight::from_f32(rank, dim, &values(rank * dim, 900 + i as u64, 0.3)).unwrap();
            let fc2 =
                Weight::from_f32(ffn, rank, &values(ffn * rank, 950 + i as u64, 0.3)).unwrap();
            LayerPredictor::new(fc1, fc2, 0.0).unwrap()
        })
        .collect()
}

/// Where things go.
#[derive(Clone)]
struct Layout {
    hot: Vec<Vec<u32>>,
    attention: Vec<bool>,
    predictor: Vec<bool>,
    output: bool,
    bucket: usize,
}

impl Layout {
    fn cpu(n_layers: usize) -> Layout {
        Layout {
            hot: vec![vec![]; n_layers],
            attention: vec![false; n_layers],
            predictor: vec![false; n_layers],
            output: false,
            bucket: 8,
        }
    }

    fn all_gpu(n_layers: usize, ffn: usize) -> Layout {
        Layout {
            hot: vec![(0..ffn as u32).collect(); n_layers],
            attention: vec![true; n_layers],
            predictor: vec![true; n_layers],
            output: true,
            bucket: 8,
        }
    }

    fn placement(&self, m: &ModelWeights) -> Arc<Placement> {
        self.try_placement(m).unwrap()
    }

    fn try_placement(&self, m: &ModelWeights) -> powerinfer_core::Result<Arc<Placement>> {
        let c = &m.config;
        let rank = 24;
        let pred_sizes = vec![rank * c.dim * 4, rank * c.ffn_dim * 4];
        let mut file = PlanFile {
            table: NeuronTable::from_hot_lists(c.ffn_dim, &self.hot).unwrap(),
            model_fingerprint: String::new(),
            bucket: self.bucket,
            context: c.max_context,
            kv_cache: powerinfer_core::KvTypes::default(),
            attention: self.attention.clone(),
            predictor: self.predictor.clone(),
            ffn_buckets: self
                .hot
                .iter()
                .map(|h| h.len().div_ceil(self.bucket))
                .collect(),
            output: self.output,
            predictor_allocations: vec![pred_sizes; c.n_layers],
            predictor_ranks: vec![rank; c.n_layers],
            budget_bytes: 0,
            gpu_bytes: 0,
        };
        let p = Placement::new(m, file.clone())?;
        file.gpu_bytes = p.allocations.iter().map(|a| a.1).sum();
        Ok(Arc::new(Placement::new(m, file)?))
    }
}

/// Greedy decoding of `steps` tokens after `prompt`: every step's logits and the tokens.
fn greedy(s: &mut Session, prompt: &[u32], steps: usize) -> (Vec<Vec<f32>>, Vec<u32>) {
    let mut logits = s.feed(prompt, Logits::Last, no_check).unwrap();
    let (mut all, mut toks) = (vec![], vec![]);
    for _ in 0..steps {
        let t = argmax(&logits);
        all.push(logits);
        toks.push(t);
        logits = s.feed(&[t], Logits::Last, no_check).unwrap();
    }
    all.push(logits);
    (all, toks)
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(i, _)| i as u32)
        .unwrap()
}

fn assert_close(got: &[f32], want: &[f32], tol: f32, what: &str) {
    let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    assert!(
        worst <= tol * scale,
        "{what}: max |diff| {worst} (scale {scale})"
    );
}

fn session(
    m: &Arc<ModelWeights>,
    mode: &Sparsity,
    p: Option<Arc<Placement>>,
    dev: &str,
) -> Session {
    let mut s = Session::new(m.clone(), 2, 0).unwrap();
    s.set_sparsity(mode.clone()).unwrap();
    s.set_placement(p).unwrap();
    s.set_device(dev, None).unwrap();
    s
}

/// Tolerance of dense mode on a Q4_0/Q4_1 model: the hot neurons' down rows come from the
/// transposed down projection, which a 4-bit model re-quantizes (DESIGN.md, "Data flow"), while
/// the CPU's dense decode reads the original; measured up to 7e-3 of the largest logit.
const TOL_Q4_DENSE: f32 = 1.5e-2;

/// Hybrid on `dev` against the CPU engine in the same mode: logits at every step within `tol`
/// of the largest logit, the same greedy tokens.
fn check_tol(
    m: &Arc<ModelWeights>,
    mode: &Sparsity,
    layout: &Layout,
    dev: &str,
    steps: usize,
    tol: f32,
) {
    let prompt = [3u32, 17, 5, 42, 8];
    let mut cpu = session(m, mode, None, "cpu");
    let (want, want_toks) = greedy(&mut cpu, &prompt, steps);
    let mut gpu = session(m, mode, Some(layout.placement(m)), dev);
    let (got, got_toks) = greedy(&mut gpu, &prompt, steps);
    // The hybrid executor ran: open on `dev`, with the plan's device allocations made.
    let h = gpu.hybrid().expect("the plan opened no hybrid executor");
    assert!(!h.allocations().is_empty(), "{dev}: no device allocation");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_close(g, w, tol, &format!("{dev} {} step {i}", mode.name()));
    }
    assert_eq!(got_toks, want_toks, "{dev} {}: greedy tokens", mode.name());
}

/// [`check_tol`] with the tolerance of the model's format.
fn check(m: &Arc<ModelWeights>, mode: &Sparsity, layout: &Layout, dev: &str, steps: usize) {
    check_tol(m, mode, layout, dev, steps, tol(m.layers[0].w_gate.dtype()));
}

fn half_hot(ffn: usize, n_layers: usize) -> Vec<Vec<u32>> {
    (0..n_layers)
        .map(|l| {
            (0..ffn as u32)
                .filter(|i| (i * 7 + l as u32).is_multiple_of(2))
                .collect()
        })
        .collect()
}

#[test]
fn placements_match_the_cpu_engine_in_every_format() {
    for dtype in DType::BASIC {
        let m = model(Activation::Relu, dtype, 256);
        let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
        let mut alternating = Layout::cpu(n);
        alternating.attention[0] = true;
        alternating.hot[1] = half_hot(ffn, n)[1].clone();
        let mut partial = Layout::cpu(n);
        partial.hot = vec![(0..11).map(|i| i * 7).collect(); n]; // 2 slabs of 8, one partial
        partial.output = true;
        let mut halves = Layout::all_gpu(n, ffn);
        halves.hot = half_hot(ffn, n);
        for dev in devices_for(dtype) {
            for (name, layout) in [
                ("all on the GPU", Layout::all_gpu(n, ffn)),
                ("alternating", alternating.clone()),
                ("partial slabs", partial.clone()),
                ("half hot", halves.clone()),
            ] {
                println!("{dtype} {dev} {name}");
                let dense_tol = match dtype {
                    DType::Q4_0 | DType::Q4_1 => TOL_Q4_DENSE,
                    _ => TOL,
                };
                check_tol(&m, &Sparsity::Dense, &layout, dev, 12, dense_tol);
                check(&m, &Sparsity::ExactRelu, &layout, dev, 12);
            }
        }
    }
}

#[test]
fn scaled_and_partial_rope_match_the_cpu_engine() {
    // Llama 3.1-style frequency factors and linear scaling over the first half of each head
    // (partial RoPE), in both pairings, with a low base so the angles differ a lot per step.
    for style in [RopeStyle::Norm, RopeStyle::Neox] {
        let mut c = powerinfer_core::ModelConfig {
            max_context: 64,
            rope_theta: 50.0,
            rope_style: style,
            ..config(Activation::Silu)
        };
        let plain = model_with(c.clone(), |_, _| DType::F32);
        c.rope = RopeScaling {
            dims: 8,
            linear_factor: Some(1.5),
            freq_factors: vec![1.0, 1.7, 5.0, 8.0],
            attn_factor: Some(1.3),
            ..RopeScaling::default()
        };
        let m = model_with(c, |_, _| DType::F32);
        let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
        let mut alternating = Layout::cpu(n);
        alternating.attention[1] = true;
        alternating.hot[0] = half_hot(ffn, n)[0].clone();
        for dev in devices() {
            for layout in [Layout::all_gpu(n, ffn), alternating.clone()] {
                check(&m, &Sparsity::Dense, &layout, dev, 12);
            }
        }
        // The scaling is not a no-op here.
        let prompt = [3u32, 17, 5, 42, 8, 9, 1];
        let a = session(&m, &Sparsity::Dense, None, "cpu")
            .feed(&prompt, Logits::Last, no_check)
            .unwrap();
        let b = session(&plain, &Sparsity::Dense, None, "cpu")
            .feed(&prompt, Logits::Last, no_check)
            .unwrap();
        let diff = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(
            diff > 1e-2,
            "{style:?}: scaled RoPE changed the logits by only {diff}"
        );
    }
}

/// Largest allowed |hybrid − cpu| of a K-quant model's logit (relative to the largest |cpu|
/// logit), sparse modes: both sides read the same rows (down_t too).
const TOL_K: f32 = 1e-3;
/// The same in dense mode: the hot neurons' down rows come from the transposed down
/// projection, re-quantized in its K-quant (or fallback) format, where the CPU's dense decode
/// reads the original, as for Q4_0 ([`TOL_Q4_DENSE`]).
const TOL_K_DENSE: f32 = 1.5e-2;

#[test]
fn q4_k_m_models_match_the_cpu_engine() {
    // dim 256: every matrix a K-quant (Q4_K gate/up/attention, Q6_K down_t in layer 0 and the
    // output head, Q4_K down_t in layer 1); dim 64, ffn 256: the 32-weight fallbacks (Q5_0
    // gate/up/attention, Q8_0 attn_v and output head) with K-quant ffn_down, whose down_t rows
    // of 64 fall back to Q8_0 (layer 0) and Q5_0 (layer 1).
    let base = powerinfer_core::ModelConfig {
        max_context: 256,
        ..config(Activation::Relu)
    };
    let whole = powerinfer_core::ModelConfig {
        dim: 256,
        ffn_dim: 512,
        head_dim: 64,
        ..base.clone()
    };
    let fallback = powerinfer_core::ModelConfig {
        ffn_dim: 256,
        ..base
    };
    for (c, down_t) in [
        (whole, [DType::Q6_K, DType::Q4_K]),
        (fallback, [DType::Q8_0, DType::Q5_0]),
    ] {
        let m = model_with(c, q4_k_m);
        let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
        assert_eq!([m.down_t_dtype(0), m.down_t_dtype(1)], down_t);
        let mut halves = Layout::all_gpu(n, ffn);
        halves.hot = half_hot(ffn, n);
        let mut partial = Layout::cpu(n);
        partial.hot = vec![(0..11).map(|i| i * 7).collect(); n]; // 2 slabs of 8, one partial
        partial.output = true;
        partial.attention[1] = true;
        for dev in devices_for(DType::Q4_K) {
            for (name, layout) in [
                ("all on the GPU", Layout::all_gpu(n, ffn)),
                ("half hot", halves.clone()),
                ("partial slabs", partial.clone()),
            ] {
                println!("Q4_K_M dim {} {dev} {name}", m.config.dim);
                check_tol(&m, &Sparsity::Dense, &layout, dev, 10, TOL_K_DENSE);
                check_tol(&m, &Sparsity::ExactRelu, &layout, dev, 10, TOL_K);
            }
        }
    }
}

#[test]
fn formats_without_gpu_kernels_stay_on_the_cpu_or_the_plan_is_refused() {
    let c = powerinfer_core::ModelConfig {
        dim: 256,
        ffn_dim: 512,
        head_dim: 64,
        max_context: 256,
        ..config(Activation::Relu)
    };
    let n = c.n_layers;
    // Q3_K FFN matrices (no GPU kernels), Q4_K attention and output head.
    let m = q4_k_but(c.clone(), |name| name.contains(".ffn_"), DType::Q3_K);
    let mut hot = Layout::cpu(n);
    hot.hot[1] = (0..40).collect();
    assert_unsupported(hot.try_placement(&m), "Q3_K");
    // Attention and the output head on the GPU, the FFN on the CPU: runs, as the CPU does.
    let mut attn = Layout::cpu(n);
    attn.attention = vec![true; n];
    attn.output = true;
    for dev in devices() {
        check_tol(&m, &Sparsity::ExactRelu, &attn, dev, 6, TOL_K);
    }
    // Q2_K attention on the GPU is refused the same way.
    let q2 = q4_k_but(c.clone(), |name| name.contains(".attn_"), DType::Q2_K);
    assert_unsupported(attn.try_placement(&q2), "Q2_K");
    // Gate and up in different formats: the fused gate/up kernel reads one.
    let mixed = q4_k_but(c, |name| name.ends_with("ffn_up"), DType::Q6_K);
    assert_unsupported(hot.try_placement(&mixed), "gate");
    assert!(attn.try_placement(&mixed).is_ok());
}

#[test]
fn hot_share_zero_half_and_all_of_a_layer() {
    let m = model(Activation::Relu, DType::Q4_0, 256);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    for dev in devices() {
        for share in [0, ffn / 2, ffn] {
            let mut l = Layout::cpu(n);
            l.attention = vec![true; n];
            l.hot = vec![(0..share as u32).collect(); n];
            check(&m, &Sparsity::ExactRelu, &l, dev, 10);
        }
    }
}

#[test]
fn predictor_mode_on_either_side() {
    let m = model(Activation::Relu, DType::Q8_0, 256);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    for input in [PredictorInput::FfnNorm, PredictorInput::FfnInp] {
        let mode = Sparsity::Predictor {
            layers: predictors(&m),
            input,
            experts: Vec::new(),
        };
        for dev in devices() {
            let mut gpu_pred = Layout::all_gpu(n, ffn);
            gpu_pred.hot = half_hot(ffn, n);
            let mut cpu_pred = gpu_pred.clone();
            cpu_pred.predictor = vec![false; n];
            let mut mixed = cpu_pred.clone();
            mixed.predictor[1] = true;
            // A layer all hot after one with cold neurons, both predicted on the GPU: the
            // second has no cold neurons to compute (none left over from the first).
            let mut uneven = gpu_pred.clone();
            uneven.hot[n - 1] = (0..ffn as u32).collect();
            for l in [gpu_pred, cpu_pred, mixed, uneven, Layout::all_gpu(n, ffn)] {
                check(&m, &mode, &l, dev, 12);
            }
        }
    }
}

#[test]
fn threshold_mode_on_a_silu_model() {
    let m = model(Activation::Silu, DType::F16, 256);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    let mode = Sparsity::Threshold(vec![0.02; n]);
    for dev in devices() {
        let mut l = Layout::all_gpu(n, ffn);
        l.hot = half_hot(ffn, n);
        l.predictor = vec![false; n];
        check(&m, &mode, &l, dev, 12);
        check(&m, &Sparsity::Dense, &l, dev, 12);
    }
}

#[test]
fn a_plan_with_nothing_on_the_gpu_is_the_cpu_path_exactly() {
    let m = model(Activation::Relu, DType::Q4_1, 256);
    let p = Layout::cpu(m.config.n_layers).placement(&m);
    for dev in devices() {
        let prompt = [1u32, 2, 3];
        let mut cpu = session(&m, &Sparsity::ExactRelu, None, "cpu");
        let mut gpu = session(&m, &Sparsity::ExactRelu, Some(p.clone()), dev);
        assert!(gpu.hybrid().is_none());
        assert_eq!(greedy(&mut gpu, &prompt, 8), greedy(&mut cpu, &prompt, 8));
    }
}

#[test]
fn long_contexts() {
    let m = model(Activation::Relu, DType::F16, 2100);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    let mut l = Layout::all_gpu(n, ffn);
    l.hot = half_hot(ffn, n);
    for dev in devices() {
        let prompt: Vec<u32> = (0..2040).map(|i| (i * 13 % 50) as u32).collect();
        let mut cpu = session(&m, &Sparsity::ExactRelu, None, "cpu");
        let (want, wt) = greedy(&mut cpu, &prompt, 20);
        let mut gpu = session(&m, &Sparsity::ExactRelu, Some(l.placement(&m)), dev);
        let (got, gt) = greedy(&mut gpu, &prompt, 20);
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_close(g, w, TOL, &format!("{dev} position {}", 2040 + i));
        }
        assert_eq!(gt, wt);
        assert_eq!(gpu.n_past(), 2060);
    }
}

#[test]
fn truncation_rollback_and_prefill_after_decode_keep_the_caches_consistent() {
    let m = model(Activation::Relu, DType::Q4_0, 256);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    let mut l = Layout::all_gpu(n, ffn);
    l.hot = half_hot(ffn, n);
    l.attention = vec![true, false];
    for dev in devices() {
        let mut cpu = session(&m, &Sparsity::ExactRelu, None, "cpu");
        let mut gpu = session(&m, &Sparsity::ExactRelu, Some(l.placement(&m)), dev);
        let script: &[&[u32]] = &[&[1, 2, 3], &[4], &[5], &[6, 7, 8, 9], &[10], &[11]];
        for s in [&mut cpu, &mut gpu] {
            for t in script {
                s.feed(t, Logits::Last, no_check).unwrap();
            }
            s.truncate(7); // back into the batched part
            s.feed(&[12], Logits::Last, no_check).unwrap();
            // A failed feed (a bad token after a good one) rolls back.
            assert!(s.feed(&[13, 999], Logits::Last, no_check).is_err());
            assert_eq!(s.n_past(), 8);
        }
        let want = cpu.feed(&[14, 15], Logits::All, no_check).unwrap();
        let got = gpu.feed(&[14, 15], Logits::All, no_check).unwrap();
        assert_close(&got, &want, TOL_Q4, &format!("{dev}: prefill after decode"));
        let want = greedy(&mut cpu, &[16], 10);
        let got = greedy(&mut gpu, &[16], 10);
        for (g, w) in got.0.iter().zip(&want.0) {
            assert_close(g, w, TOL_Q4, &format!("{dev}: decode after truncation"));
        }
        assert_eq!(got.1, want.1);
        gpu.reset();
        cpu.reset();
        let (g, w) = (
            greedy(&mut gpu, &[20, 21], 5),
            greedy(&mut cpu, &[20, 21], 5),
        );
        assert_eq!(g.1, w.1);
    }
}

#[test]
fn allocations_are_the_plans_and_nothing_else() {
    let m = model(Activation::Relu, DType::Q4_0, 256);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    let mut l = Layout::all_gpu(n, ffn);
    l.hot = vec![(0..11).collect(), (0..40).collect()];
    l.attention = vec![true, false];
    let p = l.placement(&m);
    let s = session(&m, &Sparsity::Dense, Some(p.clone()), "gpu-sim");
    let h = s.hybrid().unwrap();
    assert_eq!(h.allocations(), p.allocations.as_slice());
    let total: usize = p.allocations.iter().map(|a| a.1).sum();
    assert_eq!(total, p.file.gpu_bytes);
    assert_eq!(h.allocated_bytes(), Some(total));
    // A budget below the plan's bytes is refused before anything is uploaded.
    let mut s = Session::new(m.clone(), 1, 0).unwrap();
    s.set_placement(Some(p.clone())).unwrap();
    let err = s.set_device("gpu-sim", Some(total - 1)).unwrap_err();
    assert!(
        matches!(err, powerinfer_core::Error::VramBudget(_)),
        "{err}"
    );
    assert_eq!(s.device(), powerinfer_core::Device::Cpu);
    assert!(s.set_device("gpu-sim", Some(total)).is_ok());
    // No plan, no GPU device; unknown names are refused.
    let mut s = Session::new(m.clone(), 1, 0).unwrap();
    assert!(matches!(
        s.set_device("gpu-sim", None),
        Err(powerinfer_core::Error::Plan(_))
    ));
    assert!(s.set_device("tpu", None).is_err());
}

#[test]
fn transfers_are_counted_per_layer() {
    let m = model(Activation::Relu, DType::F16, 256);
    let (n, ffn) = (m.config.n_layers, m.config.ffn_dim);
    // Layer 0 wholly on the GPU, layer 1 wholly on the CPU, output on the GPU.
    let mut l = Layout::cpu(n);
    l.attention[0] = true;
    l.hot[0] = (0..ffn as u32).collect();
    l.output = true;
    let mut s = session(&m, &Sparsity::ExactRelu, Some(l.placement(&m)), "gpu-sim");
    s.feed(&[1, 2, 3], Logits::Last, no_check).unwrap();
    s.feed(&[4], Logits::Last, no_check).unwrap(); // uploads the prompt's K/V
    s.hybrid_mut().unwrap().reset_transfers();
    for t in 5..9 {
        s.feed(&[t], Logits::Last, no_check).unwrap();
    }
    let st = s.hybrid().unwrap().transfers().clone();
    assert_eq!(st.steps, 4);
    // Per step: the embedding row up (layer 0), x down for layer 1 (charged to it), x up and
    // the logits down for the output head.
    assert_eq!((st.layers[0].uploads, st.layers[0].downloads), (4, 0));
    assert_eq!((st.layers[1].uploads, st.layers[1].downloads), (0, 4));
    assert_eq!((st.layers[2].uploads, st.layers[2].downloads), (4, 4));
}

/// Whether two logit rows are the same bits.
fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Dense, exact-relu, threshold and predictor mode (synthetic predictors) for `m`.
fn every_mode(m: &ModelWeights) -> Vec<Sparsity> {
    vec![
        Sparsity::Dense,
        Sparsity::ExactRelu,
        Sparsity::Threshold(vec![0.02; m.config.n_layers]),
        Sparsity::Predictor {
            layers: predictors(m),
            input: PredictorInput::FfnInp,
            experts: Vec::new(),
        },
    ]
}

/// Speculative verification: [`Logits::Steps`] gives every token's logits bit-identical to
/// one-token decode steps, in every mode and format, on the CPU (one pass, the products
/// shared) and on the hybrid executor (one of its steps per token); cutting a rejected tail
/// off leaves a context whose next step is the one-token session's, GPU cache included.
#[test]
fn steps_equal_one_token_decode_in_every_mode() {
    for dtype in [DType::Q4_1, DType::Q4_0, DType::Q8_0, DType::F16] {
        let m = model(Activation::Relu, dtype, 256);
        let (n, ffn, vocab) = (m.config.n_layers, m.config.ffn_dim, m.config.vocab_size);
        let modes = every_mode(&m);
        let mut layout = Layout::all_gpu(n, ffn);
        layout.hot = half_hot(ffn, n);
        let mut devs = vec!["cpu"];
        if dtype == DType::Q4_0 {
            devs.extend(devices_for(dtype));
        }
        for mode in &modes {
            for &dev in &devs {
                let plan = (dev != "cpu").then(|| layout.placement(&m));
                let prompt = [3u32, 17, 5, 42, 8];
                let what = format!("{dev} {dtype:?} {}", mode.name());
                let mut one = session(&m, mode, plan.clone(), dev);
                let (want, toks) = greedy(&mut one, &prompt, 7);
                let mut spec = session(&m, mode, plan, dev);
                spec.feed(&prompt, Logits::Last, no_check).unwrap();
                let got = spec.feed(&toks, Logits::Steps, no_check).unwrap();
                assert_eq!(got.len(), toks.len() * vocab);
                for (i, row) in got.chunks_exact(vocab).enumerate() {
                    assert!(same_bits(row, &want[i + 1]), "{what}: step {i}");
                }
                if dev != "cpu" {
                    assert!(spec.hybrid().is_some(), "{what}: no hybrid executor");
                }
                // The last four rejected: cut back, then the fourth again as a one-token step.
                spec.truncate(prompt.len() + 3);
                let next = spec.feed(&toks[3..4], Logits::Last, no_check).unwrap();
                assert!(same_bits(&next, &want[4]), "{what}: after the rollback");
                assert_eq!(spec.n_past(), prompt.len() + 4);
            }
        }
    }
}

/// The server's parallel slots: decode steps of several sessions in one pass give every
/// session exactly its own one-token steps, whatever else is in the pass (contexts of
/// different lengths, different modes per slot, a slot verifying several tokens, a slot on the
/// hybrid executor), and a refused pass changes no context.
#[test]
fn slots_decode_as_their_sessions_alone() {
    for dtype in [DType::Q4_1, DType::Q8_0] {
        let m = model(Activation::Relu, dtype, 256);
        let (n, ffn, vocab) = (m.config.n_layers, m.config.ffn_dim, m.config.vocab_size);
        // Two dense slots, then one in each mode.
        let modes: Vec<Sparsity> = [Sparsity::Dense]
            .into_iter()
            .chain(every_mode(&m))
            .collect();
        let mut layout = Layout::all_gpu(n, ffn);
        layout.hot = half_hot(ffn, n);
        let prompts: [&[u32]; 5] = [
            &[3, 17, 5],
            &[9, 1, 2, 4, 6, 8, 10],
            &[7],
            &[11, 12],
            &[5, 5],
        ];
        // Each slot alone: its prompt, then 6 greedy one-token steps.
        let alone: Vec<(Vec<Vec<f32>>, Vec<u32>)> = modes
            .iter()
            .zip(prompts)
            .map(|(mode, p)| greedy(&mut session(&m, mode, None, "cpu"), p, 6))
            .collect();
        // Passes: the two dense slots (one batched FFN), then all five in mixed modes, then a
        // pass where slot 1 verifies three tokens at once, and one with a hybrid slot.
        let groups: [&[usize]; 2] = [&[0, 1], &[0, 1, 2, 3, 4]];
        for (g, group) in groups.iter().enumerate() {
            let mut ss: Vec<Session> = group
                .iter()
                .map(|&i| {
                    let mut s = session(&m, &modes[i], None, "cpu");
                    s.feed(prompts[i], Logits::Last, no_check).unwrap();
                    s
                })
                .collect();
            let mut step = vec![0usize; group.len()];
            for pass in 0..3 {
                let toks: Vec<Vec<u32>> = group
                    .iter()
                    .zip(&step)
                    .map(|(&i, &k)| {
                        let take = if pass == 1 && i == 1 { 3 } else { 1 };
                        alone[i].1[k..k + take].to_vec()
                    })
                    .collect();
                let mut refs: Vec<&mut Session> = ss.iter_mut().collect();
                let out = Session::decode_slots(&mut refs, &toks).unwrap();
                for (j, &i) in group.iter().enumerate() {
                    assert_eq!(out[j].len(), toks[j].len() * vocab);
                    for (r, row) in out[j].chunks_exact(vocab).enumerate() {
                        let what = format!("{dtype:?} group {g} pass {pass} slot {i} row {r}");
                        assert!(same_bits(row, &alone[i].0[step[j] + r + 1]), "{what}");
                    }
                    step[j] += toks[j].len();
                    assert_eq!(ss[j].n_past(), prompts[i].len() + step[j]);
                }
            }
            // A bad token in the last slot: refused, no context moved.
            let before: Vec<usize> = ss.iter().map(Session::n_past).collect();
            let mut toks: Vec<Vec<u32>> = vec![vec![1]; ss.len()];
            *toks.last_mut().unwrap() = vec![vocab as u32];
            let mut refs: Vec<&mut Session> = ss.iter_mut().collect();
            assert!(Session::decode_slots(&mut refs, &toks).is_err());
            let after: Vec<usize> = ss.iter().map(Session::n_past).collect();
            assert_eq!(
                before, after,
                "{dtype:?} group {g}: a refused pass moved a context"
            );
        }
        // A slot on the hybrid executor beside a CPU slot: each as alone.
        if dtype == DType::Q4_1 {
            for dev in devices_for(DType::Q4_0).into_iter().take(1) {
                let mut cpu = session(&m, &modes[0], None, "cpu");
                let mut gpu = session(&m, &modes[0], Some(layout.placement(&m)), dev);
                let (want_gpu, toks) = greedy(
                    &mut session(&m, &modes[0], Some(layout.placement(&m)), dev),
                    prompts[1],
                    2,
                );
                cpu.feed(prompts[0], Logits::Last, no_check).unwrap();
                gpu.feed(prompts[1], Logits::Last, no_check).unwrap();
                assert!(gpu.hybrid().is_some(), "{dev}: no hybrid executor");
                let ts = vec![vec![alone[0].1[0]], vec![toks[0]]];
                let out = Session::decode_slots(&mut [&mut cpu, &mut gpu], &ts).unwrap();
                assert!(same_bits(&out[0], &alone[0].0[1]), "{dev}: the CPU slot");
                assert!(same_bits(&out[1], &want_gpu[1]), "{dev}: the hybrid slot");
            }
        }
    }
}

/// [`Logits::Hidden`] on the hybrid executor runs the CPU pass (one token too, never the
/// executor's decode step, which gives logits): the rows are the CPU engine's, dim wide, and
/// decoding after them agrees, so the GPU layers' caches were kept in step.
#[test]
fn hidden_states_on_the_hybrid_executor_are_the_cpus() {
    let m = model(Activation::Relu, DType::Q4_0, 256);
    let (n, ffn, dim) = (m.config.n_layers, m.config.ffn_dim, m.config.dim);
    let mut l = Layout::all_gpu(n, ffn);
    l.hot = half_hot(ffn, n);
    l.attention = vec![true, false];
    for dev in devices() {
        let mut cpu = session(&m, &Sparsity::ExactRelu, None, "cpu");
        let mut gpu = session(&m, &Sparsity::ExactRelu, Some(l.placement(&m)), dev);
        assert!(gpu.hybrid().is_some(), "{dev}: no hybrid executor");
        for s in [&mut cpu, &mut gpu] {
            s.feed(&[1, 2, 3], Logits::Last, no_check).unwrap();
            s.feed(&[4], Logits::Last, no_check).unwrap();
        }
        for tokens in [&[5u32][..], &[6, 7, 8]] {
            let want = cpu.feed(tokens, Logits::Hidden, no_check).unwrap();
            let got = gpu.feed(tokens, Logits::Hidden, no_check).unwrap();
            assert_eq!(got.len(), tokens.len() * dim, "{dev}: hidden rows");
            assert_close(&got, &want, TOL_Q4, &format!("{dev}: hidden states"));
        }
        let (g, w) = (greedy(&mut gpu, &[9], 4), greedy(&mut cpu, &[9], 4));
        for (a, b) in g.0.iter().zip(&w.0) {
            assert_close(a, b, TOL_Q4, &format!("{dev}: decode after hidden states"));
        }
        assert_eq!(g.1, w.1);
    }
}
