//! The device allocation list: every buffer the GPU executor allocates to run a plan, with its
//! size in bytes, derived from the engine's own data (the loaded weights' formats, the neuron
//! table's hot counts, the plan's placement). Compiled in both the CUDA build and the stub.
//!
//! This is the engine's side of the VRAM contract; the planner's side is
//! `planning/accounting.py` (`gpu_allocation(plan, model)`), written independently, and the
//! Python tests check the two lists are equal name for name and byte for byte. Names, order and
//! rules match it (planner/README.md, "Exact byte accounting"):
//!
//! * per layer with attention on the GPU: `blk.{i}.attn_norm` (f32), `attn_q`, `attn_k`,
//!   `attn_v`, `attn_output` (stored formats), `cache_k`, `cache_v` (`context · kv_dim` values
//!   at the plan's `kv_cache` precisions, each f16, f32 or ggml's q8_0/q4_0/q4_1 blocks);
//! * with the predictor: `blk.{i}.pred_fc1`, `pred_fc2` (sizes recorded in the plan), or
//!   `blk.{i}.pred` when the plan gives one size;
//! * with hot neurons: `blk.{i}.ffn_norm` (f32) and `blk.{i}.ffn_hot`, `n_slabs` slabs of
//!   [`slab_geometry`]`.slab_bytes` (the same definition [`crate::pack_hot_slabs`] packs by;
//!   no up rows for a gate-less family, `arch.no_gate`); a mixture of experts' layer has the
//!   same two, its slabs holding rows of its flattened neuron space
//!   (`ModelConfig::n_neurons`: the routed experts', then the shared expert's);
//! * with the output head: `output_norm` (f32), `output` (stored format), `output.logits`
//!   (vocab f32);
//! * the family's f32 vectors, where its layer program has their steps, each after the tensor
//!   its step follows: `attn_norm.bias`; `attn_{q,k,v}.bias`, `attn_q_norm`, `attn_k_norm`
//!   (after `attn_v`), `attn_sinks` (n_heads); `attn_output.bias`, `post_attention_norm`; `ffn_norm.bias`,
//!   `ffn_up.bias` (ffn), `ffn_down.bias`, `post_ffw_norm`, `ffn_{gate,up}_exps.bias` (the
//!   layer's neurons, gpt-oss) (after `ffn_norm`);
//!   `output_norm.bias`;
//! * when anything is on the GPU: the shared `scratch.*` buffers.
//!
//! Each size is rounded up to [`ALIGN`](crate::layout::ALIGN) bytes.

use powerinfer_core::{ensure, DType, MatrixShape, ModelConfig, PlanFile, Result, Weight};

use crate::layout::{align, att_part_len, slab_geometry, xq_bytes};

/// One device allocation: its name and size in bytes (a multiple of 256).
pub type Allocation = (String, usize);

/// Bytes per element of an RMSNorm weight on the GPU: the engine keeps norms as f32 whatever
/// their stored format, and the `rms_norm` kernel reads f32.
pub const NORM_ELEMENT_BYTES: usize = 4;
/// Bytes per element of the f32 activations, logits and scratch buffers (and i32 indices).
pub const F32_BYTES: usize = 4;

/// One decoder layer's matrices as the GPU executor uploads them.
#[derive(Clone, Copy, Debug)]
pub struct LayerTensors<'a> {
    /// The attention's projections (their shapes: the CPU may keep them in another layout).
    pub wq: MatrixShape,
    pub wk: MatrixShape,
    pub wv: MatrixShape,
    pub wo: MatrixShape,
    /// The activated input projection (a gate-less family's one input projection).
    pub gate: MatrixShape,
    /// The up projection (not on the GPU for a gate-less family, `arch.no_gate`).
    pub up: MatrixShape,
    /// Format of the transposed down projection's rows (`ffn` rows of `dim` weights), as the
    /// engine builds it (`ffn_down`'s format, F16 when `dim` is no whole number of its blocks).
    pub down_t: DType,
    /// A mixture of experts' shared expert: its gate, up and the format of its transposed down
    /// rows. Its neurons follow the routed experts' in the layer's neuron space
    /// (`ModelConfig::n_neurons`) and share their slabs, so their formats must be the experts'.
    pub shared: Option<(&'a Weight, &'a Weight, DType)>,
}

/// The model as the GPU executor sees it: its config, each layer's matrices, the output head.
#[derive(Clone, Debug)]
pub struct ModelTensors<'a> {
    pub config: &'a ModelConfig,
    pub layers: Vec<LayerTensors<'a>>,
    /// The output matrix's shape (the embedding table when tied).
    pub output: MatrixShape,
}

/// Bytes of a whole matrix on the device: `rows · row_bytes` in its device format
/// ([`crate::convert::device_dtype`]), aligned. `Error::Unsupported`
/// for a format the GPU kernels do not take ([`crate::GPU_DTYPES`]): a plan putting such a
/// matrix on the GPU is refused when it is read, before anything is uploaded.
fn matrix_bytes(w: MatrixShape) -> Result<usize> {
    let dtype = crate::convert::device_dtype(w.dtype);
    crate::kernels::ensure_gpu_dtype(dtype)?;
    Ok(align(w.rows * dtype.row_bytes(w.cols)?))
}

/// Every device allocation of `plan` on `model`, layer by layer, then the output head, then
/// the scratch buffers (empty for a CPU-only plan). `Error::Plan` when the plan does not fit
/// the model; `Error::Shape`/`Unsupported` when a layer's hot rows cannot be packed in slabs
/// (a K-quant over a width that is no whole number of 256-weight super-blocks, a format without
/// GPU kernels) or a matrix placed on the GPU is in a format without GPU kernels.
pub fn gpu_allocations(model: &ModelTensors<'_>, plan: &PlanFile) -> Result<Vec<Allocation>> {
    let c = model.config;
    ensure!(
        model.layers.len() == c.n_layers,
        Shape,
        "{} layers of tensors for a {}-layer config",
        model.layers.len(),
        c.n_layers
    );
    plan.table.check_model(&c.neuron_counts())?;
    ensure!(
        plan.attention.len() == c.n_layers
            && plan.predictor.len() == c.n_layers
            && plan.predictor_allocations.len() == c.n_layers,
        Plan,
        "plan placement does not cover the model's {} layers",
        c.n_layers
    );
    let norm = align(NORM_ELEMENT_BYTES * c.dim);
    let mut out: Vec<Allocation> = Vec::new();
    for (i, l) in model.layers.iter().enumerate() {
        let layer = LayerAllocations { i, c, l, plan };
        if plan.attention[i] {
            layer.attention(&mut out)?;
        }
        if plan.predictor[i] {
            let sizes = &plan.predictor_allocations[i];
            let names: &[&str] = match sizes.len() {
                2 => &["pred_fc1", "pred_fc2"],
                _ => &["pred"],
            };
            for (t, &b) in names.iter().zip(sizes) {
                out.push((layer.name(t), align(b)));
            }
        }
        let n_slabs = plan.n_slabs(i);
        if n_slabs > 0 {
            layer.ffn(&mut out, n_slabs)?;
        }
    }
    if plan.output {
        out.push(("output_norm".into(), norm));
        if c.arch.layer_norm {
            out.push(("output_norm.bias".into(), norm));
        }
        out.push(("output".into(), matrix_bytes(model.output)?));
        out.push(("output.logits".into(), align(F32_BYTES * c.vocab_size)));
    }
    if plan.uses_gpu() {
        out.extend(scratch_allocations(c, plan));
    }
    Ok(out)
}

/// One layer's part of [`gpu_allocations`]: layer `i` of config `c`, its tensors `l`, the plan.
struct LayerAllocations<'a> {
    i: usize,
    c: &'a ModelConfig,
    l: &'a LayerTensors<'a>,
    plan: &'a PlanFile,
}

impl LayerAllocations<'_> {
    /// The layer's tensor `t` (`blk.{i}.{t}`).
    fn name(&self, t: &str) -> String {
        format!("blk.{}.{t}", self.i)
    }

    /// The layer's f32 vectors of the family among `items` (name, length, whether the family
    /// has it), in order, onto `out`.
    fn vectors(&self, out: &mut Vec<Allocation>, items: &[(&str, usize, bool)]) {
        for &(t, len, on) in items {
            if on {
                out.push((self.name(t), align(F32_BYTES * len)));
            }
        }
    }

    /// The layer's attention on the GPU onto `out`: its input norm, q/k/v and output matrices,
    /// the family's biases and norms, and the KV caches of the plan's context.
    fn attention(&self, out: &mut Vec<Allocation>) -> Result<()> {
        let (c, l) = (self.c, self.l);
        let a = &c.arch;
        out.push((self.name("attn_norm"), align(NORM_ELEMENT_BYTES * c.dim)));
        self.vectors(out, &[("attn_norm.bias", c.dim, a.layer_norm)]);
        for (t, w) in [("attn_q", l.wq), ("attn_k", l.wk), ("attn_v", l.wv)] {
            out.push((self.name(t), matrix_bytes(w)?));
        }
        let (q, kv) = (c.q_dim(), c.kv_dim());
        // Per-head q/k norms, or whole-vector ones (OLMoE).
        let (nq, nk) = match a.qk_norm_full {
            true => (q, kv),
            false => (c.head_dim, c.head_dim),
        };
        self.vectors(
            out,
            &[
                ("attn_q.bias", q, a.qkv_bias),
                ("attn_k.bias", kv, a.qkv_bias),
                ("attn_v.bias", kv, a.qkv_bias),
                ("attn_q_norm", nq, a.qk_norm),
                ("attn_k_norm", nk, a.qk_norm),
                ("attn_sinks", c.n_heads, a.attn_sinks),
            ],
        );
        out.push((self.name("attn_output"), matrix_bytes(l.wo)?));
        self.vectors(
            out,
            &[
                ("attn_output.bias", c.dim, a.out_bias),
                ("post_attention_norm", c.dim, a.post_norms),
            ],
        );
        let plan = self.plan;
        let kv = |p: powerinfer_core::KvPrecision| align(plan.context * p.row_bytes(c.kv_dim()));
        out.push((self.name("cache_k"), kv(plan.kv_cache.k)));
        out.push((self.name("cache_v"), kv(plan.kv_cache.v)));
        Ok(())
    }

    /// The layer's hot FFN of `n_slabs` slabs onto `out` (its norm, the family's FFN biases
    /// and norm, the slabs), after checking the gate's and up's shapes and the shared expert.
    fn ffn(&self, out: &mut Vec<Allocation>, n_slabs: usize) -> Result<()> {
        let (i, c, l) = (self.i, self.c, self.l);
        let a = &c.arch;
        // A gate-less FFN (OPT, Falcon) holds its one input projection as the gate; its
        // slabs carry no up rows (`neuron_read_bytes` of planning/model_shape.py).
        let up = (!a.no_gate).then_some(l.up);
        let rows = c.layer_routed_neurons(i);
        for (what, w) in [("gate", Some(l.gate)), ("up", up)] {
            let Some(w) = w else { continue };
            ensure!(
                w.rows == rows && w.cols == c.dim,
                Shape,
                "layer {i} {what} is {} x {}, expected {rows} x {}",
                w.rows,
                w.cols,
                c.dim
            );
        }
        check_shared(i, c, l)?;
        let up = up.map(|u| u.dtype);
        let slab = slab_geometry(l.gate.dtype, up, l.down_t, c.dim, self.plan.bucket)?;
        out.push((self.name("ffn_norm"), align(NORM_ELEMENT_BYTES * c.dim)));
        // gpt-oss: its experts' gate and up biases over the layer's neurons.
        let eb = c.moe.expert_bias && c.is_moe_layer(i);
        let n = c.layer_neurons(i);
        self.vectors(
            out,
            &[
                ("ffn_norm.bias", c.dim, a.layer_norm),
                ("ffn_up.bias", c.ffn_dim, a.ffn_bias),
                ("ffn_down.bias", c.dim, a.ffn_bias),
                ("post_ffw_norm", c.dim, a.post_norms),
                ("ffn_gate_exps.bias", n, eb),
                ("ffn_up_exps.bias", n, eb),
            ],
        );
        out.push((self.name("ffn_hot"), n_slabs * slab.slab_bytes));
        Ok(())
    }
}

/// `Error::Unsupported` when layer `i` is a mixture of experts whose shared expert's rows are in
/// other formats than its routed experts' (the slabs hold one format per row kind), and
/// `Error::Shape` when the shared expert is not the config's width.
fn check_shared(i: usize, c: &ModelConfig, l: &LayerTensors<'_>) -> Result<()> {
    let Some((gate, up, down_t)) = l.shared else {
        return Ok(());
    };
    let sf = c.moe.shared_ffn_dim;
    ensure!(
        gate.rows == sf && up.rows == sf,
        Shape,
        "layer {i}'s shared expert has {} and {} rows, expected {sf}",
        gate.rows,
        up.rows
    );
    let ours = [gate.dtype, up.dtype, down_t];
    let theirs = [l.gate.dtype, l.up.dtype, l.down_t];
    ensure!(
        ours == theirs,
        Unsupported,
        "layer {i}'s shared expert (gate, up, transposed down: {ours:?}) and routed experts \
         ({theirs:?}) differ in format; the GPU's slabs hold one format per row kind, so this \
         layer's experts stay on the CPU (the planner keeps them there)"
    );
    Ok(())
}

/// The scratch buffers shared by all layers (they run one after another), all f32 except
/// `active` (i32): the residual `x`, normed `xb` and projected `xb2` (dim each), `q` (q_dim),
/// `k`, `v` (kv_dim), the attention output `att` (q_dim; attention keeps no score buffer),
/// `hb` (ffn: the hot neurons' activations), `active` (ffn: one flag per neuron), `pred` (the
/// largest predictor rank), `xfer` (dim: the CPU's partial FFN sum, added on the GPU), `part`
/// (the hot down pass's split sums, [`crate::part_len`]), `attp` (the decode attention's chunk
/// states, [`crate::layout::att_part_len`] for the plan's context); for q/k-norm families `kn` (kv_dim:
/// the normed keys), for parallel blocks `saved` (dim: the residual before the attention, the
/// FFN's input); for a mixture of experts `expert_w` (n_expert + 1: each expert's routing
/// weight for the token, 0 where not routed, then the shared expert's scale). `hb`, `active`
/// and `part` count the widest layer's neurons (`ModelConfig::max_neurons`: experts
/// flattened). Then
/// `xq` (bytes, not floats): the input of the quantized row kernels, x quantized
/// ([`crate::layout::xq_bytes`] of the longer of dim and q_dim); the lists compacted on the GPU
/// ([`crate::Compacted`], a layer's neurons each): `slots` (i32: the active hot slots of
/// predictor mode) and its count `slots_n`, `rows`, `rows_a` (i32, f32: the down pass's rows and
/// their activations) and `rows_n`.
pub fn scratch_allocations(c: &ModelConfig, plan: &PlanFile) -> Vec<Allocation> {
    let max_rank = plan.predictor_ranks.iter().copied().max().unwrap_or(0);
    let kn = c.arch.qk_norm.then_some(("kn", c.kv_dim()));
    let saved = c.arch.parallel.then_some(("saved", c.dim));
    let experts = c.moe.is_moe().then_some(("expert_w", c.moe.n_expert + 1));
    let ffn = c.max_neurons();
    [
        ("x", c.dim),
        ("xb", c.dim),
        ("xb2", c.dim),
        ("q", c.q_dim()),
        ("k", c.kv_dim()),
        ("v", c.kv_dim()),
        ("att", c.q_dim()),
        ("hb", ffn),
        ("active", ffn),
        ("pred", max_rank),
        ("xfer", c.dim),
        ("part", crate::part_len(c.dim, ffn)),
        ("attp", att_part_len(c.n_heads, c.head_dim, plan.context)),
    ]
    .into_iter()
    .chain(kn)
    .chain(saved)
    .chain(experts)
    .map(|(n, len)| (format!("scratch.{n}"), align(F32_BYTES * len)))
    .chain(
        [
            ("xq", xq_bytes(c.dim.max(c.q_dim()))),
            ("slots", F32_BYTES * ffn),
            ("slots_n", F32_BYTES),
            ("rows", F32_BYTES * ffn),
            ("rows_a", F32_BYTES * ffn),
            ("rows_n", F32_BYTES),
        ]
        .map(|(n, bytes)| (format!("scratch.{n}"), align(bytes))),
    )
    .collect()
}

/// Sum of an allocation list.
pub fn total_bytes(allocations: &[Allocation]) -> usize {
    allocations.iter().map(|(_, b)| b).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::{Activation, Buffer, NeuronTable};

    /// dim 64, ffn 96, 4 heads of 16 over 2 KV heads, vocab 100, 2 layers.
    fn config() -> ModelConfig {
        powerinfer_core::testing::tiny_config(Activation::Relu)
    }

    fn zeros(dtype: DType, rows: usize, cols: usize) -> Weight {
        let bytes = vec![0u8; rows * dtype.row_bytes(cols).unwrap()];
        Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
    }

    struct Tiny {
        config: ModelConfig,
        q: Weight,
        kv: Weight,
        o: Weight,
        gate: Weight,
        up: Weight,
        out: Weight,
    }

    impl Tiny {
        fn new(up: DType) -> Tiny {
            Tiny {
                config: config(),
                q: zeros(DType::Q4_0, 64, 64),
                kv: zeros(DType::Q4_0, 32, 64),
                o: zeros(DType::Q4_0, 64, 64),
                gate: zeros(DType::Q8_0, 96, 64),
                up: zeros(up, 96, 64),
                out: zeros(DType::Q8_0, 100, 64),
            }
        }

        fn model(&self, down_t: DType) -> ModelTensors<'_> {
            let layer = LayerTensors {
                wq: (&self.q).into(),
                wk: (&self.kv).into(),
                wv: (&self.kv).into(),
                wo: (&self.o).into(),
                gate: (&self.gate).into(),
                up: (&self.up).into(),
                down_t,
                shared: None,
            };
            ModelTensors {
                config: &self.config,
                layers: vec![layer; 2],
                output: (&self.out).into(),
            }
        }
    }

    /// Layer 0: attention, predictor [fc1, fc2] and 11 hot neurons (2 slabs of 8); layer 1:
    /// nothing but one predictor size; output head on; context 32.
    fn plan(bucket: usize) -> PlanFile {
        let hot: Vec<u32> = (0..11).map(|i| i * 7).collect();
        PlanFile {
            table: NeuronTable::from_hot_lists(96, &[hot, vec![]]).unwrap(),
            model_fingerprint: String::new(),
            bucket,
            context: 32,
            kv_cache: powerinfer_core::KvTypes::default(),
            attention: vec![true, false],
            predictor: vec![true, true],
            ffn_buckets: vec![11usize.div_ceil(bucket), 0],
            output: true,
            predictor_allocations: vec![vec![2 * 64 * 64, 2 * 96 * 64], vec![1000]],
            predictor_ranks: vec![64, 40],
            budget_bytes: 0,
            gpu_bytes: 0,
        }
    }

    #[test]
    fn hand_computed_tiny_case() {
        let t = Tiny::new(DType::Q4_0);
        let got = gpu_allocations(&t.model(DType::F16), &plan(8)).unwrap();
        // Q4_0 rows of 64: 2 blocks x 18 = 36 B; Q8_0: 2 x 34 = 68 B; F16: 128 B.
        // One neuron: 68 (gate) + 36 (up) + 128 (down_t) + 4 (id) = 236; 8 x 236 = 1888 -> 2048.
        let want: Vec<(&str, usize)> = vec![
            ("blk.0.attn_norm", 256),    // 64 f32
            ("blk.0.attn_q", 2304),      // 64 x 36
            ("blk.0.attn_k", 1280),      // 32 x 36 = 1152
            ("blk.0.attn_v", 1280),      //
            ("blk.0.attn_output", 2304), //
            ("blk.0.cache_k", 2048),     // 32 x 32 x 2
            ("blk.0.cache_v", 2048),     //
            ("blk.0.pred_fc1", 8192),    // 2 x 64 x 64
            ("blk.0.pred_fc2", 12288),   // 2 x 96 x 64
            ("blk.0.ffn_norm", 256),     //
            ("blk.0.ffn_hot", 4096),     // 2 slabs of 2048
            ("blk.1.pred", 1024),        // 1000 -> 1024
            ("output_norm", 256),        //
            ("output", 6912),            // 100 x 68 = 6800
            ("output.logits", 512),      // 100 x 4 = 400
            ("scratch.x", 256),          //
            ("scratch.xb", 256),         //
            ("scratch.xb2", 256),        //
            ("scratch.q", 256),          //
            ("scratch.k", 256),          // 32 x 4 = 128
            ("scratch.v", 256),          //
            ("scratch.att", 256),        // q_dim 64
            ("scratch.hb", 512),         // 96 x 4 = 384
            ("scratch.active", 512),     //
            ("scratch.pred", 256),       // rank 64
            ("scratch.xfer", 256),       // 64 x 4
            ("scratch.part", 256),       // 64 x 1 split (ffn 96) x 4
            ("scratch.attp", 512),       // context 32: one chunk, 4 heads x (16 + 2) x 4
            ("scratch.xq", 256),         // 64 / 32 x 80 = 160
            ("scratch.slots", 512),      // 96 x 4
            ("scratch.slots_n", 256),    //
            ("scratch.rows", 512),       //
            ("scratch.rows_a", 512),     //
            ("scratch.rows_n", 256),     //
        ];
        let want: Vec<Allocation> = want.into_iter().map(|(n, b)| (n.into(), b)).collect();
        assert_eq!(got, want);
        assert_eq!(total_bytes(&got), want.iter().map(|a| a.1).sum::<usize>());
    }

    #[test]
    fn ffn_hot_is_what_pack_hot_slabs_uploads() {
        let t = Tiny::new(DType::Q4_0);
        assert_packs_as_counted(&t, Some(&t.up));
    }

    /// For every bucket, `ffn_hot` is exactly what `pack_hot_slabs` uploads with `up`.
    fn assert_packs_as_counted(t: &Tiny, up: Option<&Weight>) {
        let down_t = zeros(DType::F16, 96, 64);
        for bucket in [1, 3, 8, 32] {
            let p = plan(bucket);
            let got = gpu_allocations(&t.model(DType::F16), &p).unwrap();
            let hot = got.iter().find(|a| a.0 == "blk.0.ffn_hot").unwrap().1;
            let ids = &p.table.layers[0].hot;
            let (layout, bytes) = crate::pack_hot_slabs(&t.gate, up, &down_t, ids, bucket).unwrap();
            assert_eq!((hot, hot), (layout.total_bytes(), bytes.len()));
        }
    }

    #[test]
    fn gate_less_slabs_hold_no_up_rows() {
        let mut t = Tiny::new(DType::Q4_0);
        t.config.arch.no_gate = true;
        let got = gpu_allocations(&t.model(DType::F16), &plan(8)).unwrap();
        // One neuron: 68 (the Q8_0 input projection) + 128 (down_t) + 4 (id) = 200; 8 x 200 =
        // 1600 -> 1792 per slab, 2 slabs. Everything else as for the gated FFN.
        let hot = got.iter().find(|a| a.0 == "blk.0.ffn_hot").unwrap().1;
        assert_eq!(hot, 2 * 1792);
        let gated = gpu_allocations(&Tiny::new(DType::Q4_0).model(DType::F16), &plan(8)).unwrap();
        assert_eq!(total_bytes(&gated) - total_bytes(&got), 2 * (2048 - 1792));
        // What pack_hot_slabs uploads without the up matrix, for every bucket; an up matrix of
        // another shape is no concern of a gate-less model.
        t.up = zeros(DType::Q4_0, 3, 64);
        assert_packs_as_counted(&t, None);
        t.config.arch.no_gate = false;
        assert!(gpu_allocations(&t.model(DType::F16), &plan(8)).is_err());
    }

    /// Every family vector, in the order of the layer program's steps, with its size: OPT's
    /// LayerNorm and biases, Qwen's q/k biases and norms, Gemma's post-norms, Falcon's saved
    /// residual (all flags on at once: the list is the union of the families').
    #[test]
    fn family_vectors_follow_their_steps() {
        let t = Tiny::new(DType::Q4_0);
        let mut m = t.model(DType::F16);
        let mut c = config();
        let a = &mut c.arch;
        (a.layer_norm, a.qkv_bias, a.qk_norm, a.out_bias) = (true, true, true, true);
        (a.post_norms, a.ffn_bias, a.parallel) = (true, true, true);
        m.config = &c;
        let got = gpu_allocations(&m, &plan(8)).unwrap();
        let names: Vec<&str> = got.iter().map(|a| a.0.as_str()).collect();
        let layer0: Vec<&str> = names
            .iter()
            .filter_map(|n| n.strip_prefix("blk.0."))
            .collect();
        assert_eq!(
            layer0,
            [
                "attn_norm",
                "attn_norm.bias",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_q.bias",
                "attn_k.bias",
                "attn_v.bias",
                "attn_q_norm",
                "attn_k_norm",
                "attn_output",
                "attn_output.bias",
                "post_attention_norm",
                "cache_k",
                "cache_v",
                "pred_fc1",
                "pred_fc2",
                "ffn_norm",
                "ffn_norm.bias",
                "ffn_up.bias",
                "ffn_down.bias",
                "post_ffw_norm",
                "ffn_hot",
            ]
        );
        let bytes = |n: &str| got.iter().find(|a| a.0 == n).unwrap().1;
        // dim 64, q_dim 64, kv_dim 32, head_dim 16, ffn 96: f32 each, aligned to 256.
        assert_eq!(bytes("blk.0.attn_k.bias"), 256);
        assert_eq!(bytes("blk.0.attn_q_norm"), 256);
        assert_eq!(bytes("blk.0.ffn_up.bias"), 512);
        assert!(names.contains(&"output_norm.bias"));
        let tail = &names[names.len() - 8..names.len() - 5];
        assert_eq!(tail, ["scratch.kn", "scratch.saved", "scratch.xq"]);
        // Without the flags, none of them.
        let plain = gpu_allocations(&t.model(DType::F16), &plan(8)).unwrap();
        assert_eq!(got.len() - plain.len(), 8 + 4 + 1 + 2);
    }

    #[test]
    fn every_input_moves_the_report() {
        let t = Tiny::new(DType::Q4_0);
        let base = gpu_allocations(&t.model(DType::F16), &plan(8)).unwrap();
        let changed = [
            gpu_allocations(&t.model(DType::Q8_0), &plan(8)).unwrap(), // down_t format
            gpu_allocations(&Tiny::new(DType::F16).model(DType::F16), &plan(8)).unwrap(),
            gpu_allocations(&t.model(DType::F16), &plan(4)).unwrap(), // bucket
            gpu_allocations(
                &t.model(DType::F16),
                &PlanFile {
                    context: 64,
                    ..plan(8)
                },
            )
            .unwrap(),
        ];
        for c in &changed {
            assert_ne!(total_bytes(c), total_bytes(&base));
        }
    }

    /// A model of dim 256 (whole super-blocks) in the formats of a Q4_K_M file: Q4_K
    /// attention, gate, up; Q6_K down (so down_t) and output head.
    #[test]
    fn k_quant_rows_are_whole_super_blocks() {
        let c = ModelConfig {
            dim: 256,
            ffn_dim: 512,
            head_dim: 64,
            ..config()
        };
        let (q4k, q6k) = (DType::Q4_K, DType::Q6_K);
        let q = zeros(q4k, 256, 256);
        let kv = zeros(q4k, 128, 256);
        let g = zeros(q4k, 512, 256);
        let out = zeros(q6k, 100, 256);
        let layer = LayerTensors {
            wq: (&q).into(),
            wk: (&kv).into(),
            wv: (&kv).into(),
            wo: (&q).into(),
            gate: (&g).into(),
            up: (&g).into(),
            down_t: q6k,
            shared: None,
        };
        let m = ModelTensors {
            config: &c,
            layers: vec![layer; 2],
            output: (&out).into(),
        };
        let hot: Vec<u32> = (0..11).map(|i| i * 7).collect();
        let p = PlanFile {
            table: NeuronTable::from_hot_lists(512, &[hot, vec![]]).unwrap(),
            ..plan(8)
        };
        let got = gpu_allocations(&m, &p).unwrap();
        let bytes = |n: &str| got.iter().find(|a| a.0 == n).unwrap().1;
        // Q4_K rows of 256: one 144-byte super-block; Q6_K: 210 bytes.
        assert_eq!(bytes("blk.0.attn_q"), 256 * 144);
        assert_eq!(bytes("blk.0.attn_k"), align(128 * 144)); // 18432
        assert_eq!(bytes("output"), align(100 * 210)); // 21000 -> 21248
                                                       // One neuron: 144 (gate) + 144 (up) + 210 (down_t) + 4 (id) = 502; 8 x 502 = 4016 ->
                                                       // 4096 per slab, 2 slabs.
        assert_eq!(bytes("blk.0.ffn_hot"), 2 * 4096);
        let d = zeros(q6k, 512, 256);
        let (layout, packed) =
            crate::pack_hot_slabs(&g, Some(&g), &d, &p.table.layers[0].hot, 8).unwrap();
        assert_eq!((layout.total_bytes(), packed.len()), (8192, 8192));
        // A Q2_K or Q3_K matrix on the GPU has no kernels: refused when the plan is read.
        for dtype in [DType::Q2_K, DType::Q3_K] {
            let w = zeros(dtype, 256, 256);
            let refused = [
                ModelTensors {
                    layers: vec![
                        LayerTensors {
                            wo: (&w).into(),
                            ..layer
                        };
                        2
                    ],
                    ..m.clone()
                },
                ModelTensors {
                    output: (&w).into(),
                    ..m.clone()
                },
                ModelTensors {
                    layers: vec![
                        LayerTensors {
                            down_t: dtype,
                            ..layer
                        };
                        2
                    ],
                    ..m.clone()
                },
            ];
            for bad in &refused {
                let e = gpu_allocations(bad, &p).unwrap_err();
                assert!(
                    matches!(&e, powerinfer_core::Error::Unsupported(m) if m.contains(dtype.name())),
                    "{e}"
                );
            }
            // Kept on the CPU, they are no concern of the GPU.
            let cpu_side = PlanFile {
                attention: vec![false; 2],
                output: false,
                ..p.clone()
            };
            assert!(gpu_allocations(&refused[1], &cpu_side).is_ok());
            assert!(gpu_allocations(&refused[0], &cpu_side).is_ok());
        }
    }

    #[test]
    fn cpu_only_plans_allocate_nothing_and_mismatches_are_errors() {
        let t = Tiny::new(DType::Q4_0);
        let cpu = PlanFile {
            table: NeuronTable::all_cold(2, 96),
            attention: vec![false; 2],
            predictor: vec![false; 2],
            ffn_buckets: vec![0; 2],
            output: false,
            ..plan(8)
        };
        assert!(gpu_allocations(&t.model(DType::F16), &cpu)
            .unwrap()
            .is_empty());
        let wrong_ffn = PlanFile {
            table: NeuronTable::all_cold(2, 95),
            ..plan(8)
        };
        assert!(gpu_allocations(&t.model(DType::F16), &wrong_ffn).is_err());
        let mut one_layer = t.model(DType::F16);
        one_layer.layers.pop();
        assert!(gpu_allocations(&one_layer, &plan(8)).is_err());
        // A Q8_0 down_t over dim 48 is no whole number of blocks (F16 is what the engine builds).
        let mut c = config();
        c.dim = 48;
        let g = zeros(DType::F16, 96, 48);
        let layer = |down_t| LayerTensors {
            gate: (&g).into(),
            up: (&g).into(),
            down_t,
            ..t.model(down_t).layers[0]
        };
        let m = |down_t| ModelTensors {
            config: &c,
            layers: vec![layer(down_t); 2],
            output: (&t.out).into(),
        };
        assert!(gpu_allocations(&m(DType::F16), &plan(8)).is_ok());
        assert!(gpu_allocations(&m(DType::Q8_0), &plan(8)).is_err());
    }
}
