//! The GPU side of a placed model: exactly what the plan puts on the device (per layer the
//! attention weights with the family's biases and norms and an f16 KV cache, the predictor, the
//! hot-neuron slabs with the FFN's biases and norms; the output head; the shared scratch
//! buffers), each allocation registered by name and size so the registry can be compared with
//! the plan's accounting (`alloc_plan`, `planning/accounting.py`), name for name and byte for
//! byte. A layer's vectors are uploaded in the order of its layer program's steps.

use powerinfer_core::{bail, ensure, DType, KvPrecision, ModelConfig, PlanFile, Result, Weight};
use powerinfer_cpu::Matrix;
use powerinfer_cuda::layout::{align, att_part_len};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{
    Allocation, Backend, Compacted, DeviceSlice, DeviceWeight, Elem, HotFfn, RowSpace,
};

use crate::hybrid::quantized_x::QuantizedX;
use crate::layer_weights::LayerWeights;
use crate::placement::Placement;
use crate::sparsity::LayerPredictor;
use crate::weights::ModelWeights;

/// Every allocation made, in order: `(name, bytes rounded up to 256)`.
#[derive(Debug, Default)]
pub struct Registry {
    pub allocations: Vec<Allocation>,
}

impl Registry {
    /// A zero-filled buffer of `len` elements, registered as `name`.
    fn zeros<B: Backend, T: Elem>(&mut self, dev: &B, name: &str, len: usize) -> Result<B::Buf<T>> {
        let buf = dev.zeros::<T>(len)?;
        self.note(name, len * std::mem::size_of::<T>());
        Ok(buf)
    }

    /// A buffer holding `host`, registered as `name`.
    fn upload<B: Backend, T: Elem>(
        &mut self,
        dev: &B,
        name: &str,
        host: &[T],
    ) -> Result<B::Buf<T>> {
        let buf = dev.upload(host)?;
        self.note(name, std::mem::size_of_val(host));
        Ok(buf)
    }

    /// A whole weight matrix, registered as `name` (an interleaved one gathered back to the
    /// file's rows first: the device repacks rows its own way).
    fn weight<B: Backend>(&mut self, dev: &B, name: &str, w: &Matrix) -> Result<DeviceWeight<B>> {
        let dw = dev.upload_weight(&*w.to_rows()?)?;
        self.note(name, dw.n_bytes());
        Ok(dw)
    }

    /// [`Registry::upload`] of an f32 vector the family may not have.
    fn maybe<B: Backend>(
        &mut self,
        dev: &B,
        name: &str,
        host: Option<&[f32]>,
    ) -> Result<Option<B::Buf<f32>>> {
        host.map(|h| self.upload(dev, name, h)).transpose()
    }

    fn note(&mut self, name: &str, bytes: usize) {
        self.allocations.push((name.to_string(), align(bytes)));
    }
}

/// The rows of `ws` then `s`, one row space.
fn space<'a>(ws: &'a [Weight], s: Option<&'a Weight>) -> Result<RowSpace<'a>> {
    RowSpace::new(ws.iter().chain(s).collect())
}

/// A layer's attention on the GPU (the family's vectors where its program has their steps).
pub struct GpuAttention<B: Backend> {
    pub norm: B::Buf<f32>,
    /// LayerNorm's bias.
    pub norm_bias: Option<B::Buf<f32>>,
    pub wq: DeviceWeight<B>,
    pub wk: DeviceWeight<B>,
    pub wv: DeviceWeight<B>,
    pub qkv_bias: Option<[B::Buf<f32>; 3]>,
    pub qk_norm: Option<[B::Buf<f32>; 2]>,
    /// gpt-oss's sink logit per query head (`attn_sinks`).
    pub sinks: Option<B::Buf<f32>>,
    pub wo: DeviceWeight<B>,
    pub out_bias: Option<B::Buf<f32>>,
    pub post_norm: Option<B::Buf<f32>>,
    pub cache: KvBufs<B>,
    /// Values per cache row (n_kv_heads · head_dim).
    pub kv_dim: usize,
}

/// A layer's K and V caches on the device, at the plan's precision (f16 bits or f32).
pub enum KvBufs<B: Backend> {
    F16(B::Buf<u16>, B::Buf<u16>),
    F32(B::Buf<f32>, B::Buf<f32>),
}

/// A layer's predictor buffers on the GPU: reserved at the plan's sizes, filled when predictor
/// mode is set ([`GpuPredictor::fill`]).
pub struct GpuPredictor<B: Backend> {
    /// `[rank, dim]` once filled (rows 0 until then).
    pub fc1: DeviceWeight<B>,
    /// `[rank, ffn]` once filled.
    pub fc2_t: DeviceWeight<B>,
    pub threshold: f32,
    /// Whether a predictor was written into the buffers.
    pub filled: bool,
}

impl<B: Backend> GpuPredictor<B> {
    fn reserve(reg: &mut Registry, dev: &B, layer: usize, sizes: &[usize]) -> Result<Self> {
        let [fc1, fc2] = sizes else {
            bail!(
                Plan,
                "the plan gives layer {layer}'s predictor one allocation of {:?} bytes; the GPU \
                 executor needs its fc1 and fc2 sizes: plan again with --predictors FILE",
                sizes
            );
        };
        let layout = powerinfer_cuda::RowLayout::dense(0, 0)?;
        let empty = |data| DeviceWeight {
            dtype: DType::F32,
            rows: 0,
            cols: 0,
            layout,
            data,
        };
        let fc1 = reg.zeros::<B, u8>(dev, &format!("blk.{layer}.pred_fc1"), *fc1)?;
        let fc2 = reg.zeros::<B, u8>(dev, &format!("blk.{layer}.pred_fc2"), *fc2)?;
        Ok(GpuPredictor {
            fc1: empty(fc1),
            fc2_t: empty(fc2),
            threshold: 0.0,
            filled: false,
        })
    }

    /// Write `p` into the reserved buffers; `Error::Plan` when it is larger than the plan
    /// reserved (the plan was made for other predictors).
    pub fn fill(&mut self, dev: &B, layer: usize, p: &LayerPredictor) -> Result<()> {
        for (what, w, dst) in [
            ("fc1", &p.fc1, &mut self.fc1),
            ("fc2", &p.fc2_t, &mut self.fc2_t),
        ] {
            let rb = w.dtype.row_bytes(w.cols)?;
            let bytes = powerinfer_cuda::repack_rows(w.dtype, w.cols, w.bytes())?;
            ensure!(
                bytes.len() <= dst.data.len(),
                Plan,
                "layer {layer}'s predictor {what} needs {} bytes on the GPU but the plan reserved \
                 {}: plan again with --predictors for these predictors",
                bytes.len(),
                dst.data.len()
            );
            dev.write(&bytes, &mut dst.data, 0)?;
            dst.dtype = w.dtype;
            dst.rows = w.rows;
            dst.cols = w.cols;
            dst.layout = powerinfer_cuda::RowLayout::dense(w.rows, rb)?;
        }
        self.threshold = p.threshold;
        self.filled = true;
        Ok(())
    }
}

/// A layer's hot neurons on the GPU, with the FFN block's norm, biases and post-norm.
pub struct GpuFfn<B: Backend> {
    pub norm: B::Buf<f32>,
    pub norm_bias: Option<B::Buf<f32>>,
    /// The activated input projection's bias, one per neuron (indexed by neuron id).
    pub in_bias: Option<B::Buf<f32>>,
    pub down_bias: Option<B::Buf<f32>>,
    pub post_norm: Option<B::Buf<f32>>,
    /// gpt-oss's experts' gate and up biases over the layer's flattened neurons (indexed by
    /// neuron id; the shared expert's, if any, 0); their down biases stay on the CPU side.
    pub expert_bias: Option<[B::Buf<f32>; 2]>,
    pub hot: HotFfn<B>,
}

/// One decoder layer's GPU part (each piece present when the plan places it).
pub struct GpuLayer<B: Backend> {
    pub attention: Option<GpuAttention<B>>,
    pub predictor: Option<GpuPredictor<B>>,
    pub ffn: Option<GpuFfn<B>>,
}

/// The output head on the GPU.
pub struct GpuOutput<B: Backend> {
    pub norm: B::Buf<f32>,
    pub norm_bias: Option<B::Buf<f32>>,
    pub w: DeviceWeight<B>,
    pub logits: B::Buf<f32>,
}

/// The scratch buffers every layer shares (names as in `alloc_plan::scratch_allocations`).
pub struct GpuScratch<B: Backend> {
    pub x: B::Buf<f32>,
    pub xb: B::Buf<f32>,
    pub xb2: B::Buf<f32>,
    pub q: B::Buf<f32>,
    pub k: B::Buf<f32>,
    pub v: B::Buf<f32>,
    pub att: B::Buf<f32>,
    pub hb: B::Buf<f32>,
    pub active: B::Buf<i32>,
    pub pred: B::Buf<f32>,
    pub xfer: B::Buf<f32>,
    /// The hot down pass's split sums (`powerinfer_cuda::part_len`).
    pub part: B::Buf<f32>,
    /// The decode attention's chunk states (flash-decoding;
    /// [`powerinfer_cuda::layout::att_part_len`]).
    pub attp: B::Buf<f32>,
    /// The normed keys (q/k-norm families).
    pub kn: Option<B::Buf<f32>>,
    /// The residual before a parallel block's attention (its FFN's input).
    pub saved: Option<B::Buf<f32>>,
    /// A mixture of experts' weights for the token (n_expert + 1: each expert's, 0 where not
    /// routed, then the shared expert's scale).
    pub expert_w: Option<B::Buf<f32>>,
    /// The input of the quantized row kernels: a vector quantized (`RowOps::quantize_x`, or by
    /// the norm that wrote `xb`), for the longer of dim and q_dim, tagged with its source.
    pub xq: QuantizedX<B>,
    /// The hot slots predictor mode's gate/up pass computes (`CompactOps::active_slots`).
    pub slots: Compacted<B>,
    /// The rows of the hot down pass, with their activations (`CompactOps::nonzero_rows`).
    pub rows: Compacted<B>,
}

/// Everything the plan puts on one device.
pub struct GpuModel<B: Backend> {
    pub layers: Vec<GpuLayer<B>>,
    pub output: Option<GpuOutput<B>>,
    pub scratch: Option<GpuScratch<B>>,
    pub registry: Registry,
}

impl<B: Backend> GpuModel<B> {
    /// Upload what `placement` puts on the GPU of `model` to `dev`, in the order of the plan's
    /// accounting. Builds the transposed down projections when a layer has hot neurons.
    pub fn upload(dev: &B, model: &ModelWeights, placement: &Placement) -> Result<GpuModel<B>> {
        let c = &model.config;
        let plan = &placement.file;
        let mut reg = Registry::default();
        let downs = HotDowns::build(model, plan)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        for (i, lw) in model.layers.iter().enumerate() {
            let attention = match plan.attention[i] {
                true => Some(GpuAttention::upload(&mut reg, dev, c, plan, i, lw)?),
                false => None,
            };
            let predictor = match plan.predictor[i] {
                true => Some(GpuPredictor::reserve(
                    &mut reg,
                    dev,
                    i,
                    &plan.predictor_allocations[i],
                )?),
                false => None,
            };
            let ffn = match plan.n_slabs(i) {
                n if n > 0 => Some(GpuFfn::upload(&mut reg, dev, model, plan, i, &downs)?),
                _ => None,
            };
            layers.push(GpuLayer {
                attention,
                predictor,
                ffn,
            });
        }
        let output = match plan.output {
            true => Some(GpuOutput::upload(&mut reg, dev, model)?),
            false => None,
        };
        let scratch = match plan.uses_gpu() {
            true => Some(GpuScratch::allocate(&mut reg, dev, c, plan)?),
            false => None,
        };
        Ok(GpuModel {
            layers,
            output,
            scratch,
            registry: reg,
        })
    }
}

/// The transposed down rows the hot slabs hold: the dense layers', and each expert's (with the
/// shared expert's) in a mixture of experts; each built only when some layer of its kind has
/// hot neurons.
struct HotDowns<'m> {
    dense: Option<&'m [Weight]>,
    experts: Option<&'m [Vec<Weight>]>,
}

impl<'m> HotDowns<'m> {
    /// The rows `plan`'s hot slabs of `model` need (built once, by the model).
    fn build(model: &'m ModelWeights, plan: &PlanFile) -> Result<HotDowns<'m>> {
        let hot = |moe: bool| {
            (0..model.config.n_layers)
                .any(|i| plan.n_slabs(i) > 0 && model.layers[i].moe.is_some() == moe)
        };
        let dense = match hot(false) {
            true => Some(model.down_t()?),
            false => None,
        };
        let experts = match hot(true) {
            true => Some(model.expert_down_t()?),
            false => None,
        };
        Ok(HotDowns { dense, experts })
    }
}

impl<B: Backend> GpuAttention<B> {
    /// Layer `i`'s attention block (`lw`'s weights, norms and biases, in its program's order)
    /// and its KV caches for the plan's context.
    fn upload(
        reg: &mut Registry,
        dev: &B,
        c: &ModelConfig,
        plan: &PlanFile,
        i: usize,
        lw: &LayerWeights,
    ) -> Result<GpuAttention<B>> {
        let name = |t: &str| format!("blk.{i}.{t}");
        let kv = plan.context * c.kv_dim();
        let norm = reg.upload(dev, &name("attn_norm"), &lw.attn_norm)?;
        let norm_bias = match &lw.norm_bias {
            Some([b, _]) => Some(reg.upload(dev, &name("attn_norm.bias"), b)?),
            None => None,
        };
        let wq = reg.weight(dev, &name("attn_q"), &lw.wq)?;
        let wk = reg.weight(dev, &name("attn_k"), &lw.wk)?;
        let wv = reg.weight(dev, &name("attn_v"), &lw.wv)?;
        let qkv_bias = match &lw.qkv_bias {
            Some([q, k, v]) => Some([
                reg.upload(dev, &name("attn_q.bias"), q)?,
                reg.upload(dev, &name("attn_k.bias"), k)?,
                reg.upload(dev, &name("attn_v.bias"), v)?,
            ]),
            None => None,
        };
        let qk_norm = match &lw.qk_norm {
            Some([q, k]) => Some([
                reg.upload(dev, &name("attn_q_norm"), q)?,
                reg.upload(dev, &name("attn_k_norm"), k)?,
            ]),
            None => None,
        };
        let sinks = reg.maybe(dev, &name("attn_sinks"), lw.attn_sinks.as_deref())?;
        let wo = reg.weight(dev, &name("attn_output"), &lw.wo)?;
        let out_bias = reg.maybe(dev, &name("attn_output.bias"), lw.out_bias.as_deref())?;
        let post = lw.post_norms.as_ref().map(|[a, _]| &a[..]);
        let post_norm = reg.maybe(dev, &name("post_attention_norm"), post)?;
        // Quantized caches were refused when the executor was opened (`hybrid::open`).
        let cache = match plan.kv_cache.k {
            KvPrecision::F16 => KvBufs::F16(
                reg.zeros(dev, &name("cache_k"), kv)?,
                reg.zeros(dev, &name("cache_v"), kv)?,
            ),
            KvPrecision::F32 => KvBufs::F32(
                reg.zeros(dev, &name("cache_k"), kv)?,
                reg.zeros(dev, &name("cache_v"), kv)?,
            ),
            p => bail!(Unsupported, "a {} KV cache on the GPU", p.name()),
        };
        Ok(GpuAttention {
            norm,
            norm_bias,
            wq,
            wk,
            wv,
            qkv_bias,
            qk_norm,
            sinks,
            wo,
            out_bias,
            post_norm,
            cache,
            kv_dim: c.kv_dim(),
        })
    }
}

impl<B: Backend> GpuFfn<B> {
    /// Layer `i`'s FFN block on the GPU: its norm and biases (in its program's order), then
    /// the plan's hot neurons in slabs ([`upload_hot`]).
    fn upload(
        reg: &mut Registry,
        dev: &B,
        model: &ModelWeights,
        plan: &PlanFile,
        i: usize,
        downs: &HotDowns<'_>,
    ) -> Result<GpuFfn<B>> {
        let lw = &model.layers[i];
        let name = |t: &str| format!("blk.{i}.{t}");
        let norm = reg.upload(dev, &name("ffn_norm"), &lw.ffn_norm)?;
        let nb = lw.norm_bias.as_ref().map(|[_, b]| &b[..]);
        let norm_bias = reg.maybe(dev, &name("ffn_norm.bias"), nb)?;
        let (inb, downb) = match &lw.ffn_bias {
            Some([i, d]) => (Some(&i[..]), Some(&d[..])),
            None => (None, None),
        };
        let in_bias = reg.maybe(dev, &name("ffn_up.bias"), inb)?;
        let down_bias = reg.maybe(dev, &name("ffn_down.bias"), downb)?;
        let post = lw.post_norms.as_ref().map(|[_, f]| &f[..]);
        let post_norm = reg.maybe(dev, &name("post_ffw_norm"), post)?;
        let expert_bias = match lw.moe.as_ref().and_then(|m| m.expert_bias.as_ref()) {
            Some(b) => {
                let n = model.config.layer_neurons(i);
                let mut flat = |v: &[f32], t: &str| {
                    let mut all = v.to_vec();
                    all.resize(n, 0.0);
                    reg.upload(dev, &name(t), &all)
                };
                Some([
                    flat(&b.gate, "ffn_gate_exps.bias")?,
                    flat(&b.up, "ffn_up_exps.bias")?,
                ])
            }
            None => None,
        };
        let hot = upload_hot(dev, model, plan, i, downs)?;
        reg.note(&name("ffn_hot"), hot.n_bytes());
        Ok(GpuFfn {
            norm,
            norm_bias,
            in_bias,
            down_bias,
            post_norm,
            expert_bias,
            hot,
        })
    }
}

/// Layer `i`'s hot neurons (the plan's table) in slabs of the plan's bucket: gate, up (where
/// the FFN is gated) and transposed down rows; a mixture of experts' from its flattened
/// neurons, each expert's rows then the shared expert's, read in place.
fn upload_hot<B: Backend>(
    dev: &B,
    model: &ModelWeights,
    plan: &PlanFile,
    i: usize,
    downs: &HotDowns<'_>,
) -> Result<HotFfn<B>> {
    let lw = &model.layers[i];
    let ids = &plan.table.layers[i].hot;
    let gated = model.program.layers[i].ffn_kind().gated;
    match (&lw.moe, downs.dense, downs.experts) {
        (None, Some(down_t), _) => {
            // Hot rows by index (an interleaved FFN's gathered back: the device packs its own).
            let up = gated.then(|| lw.w_up.indexed()).transpose()?;
            dev.upload_hot_ffn(lw.w_gate.indexed()?, up, &down_t[i], ids, plan.bucket)
        }
        (Some(m), _, Some(edt)) => {
            let shared = m.shared.as_ref();
            let gate = space(&m.gate, shared.map(|s| &s.gate))?;
            let up = space(&m.up, shared.map(|s| &s.up))?;
            let down = space(&edt[i], None)?;
            let up = gated.then_some(&up);
            dev.upload_hot_rows(&gate, up, &down, ids, plan.bucket)
        }
        _ => bail!(Other, "layer {i}: no transposed down rows for its slabs"),
    }
}

impl<B: Backend> GpuOutput<B> {
    /// The output steps' weights (final norm, its bias, the head) and the logits buffer.
    fn upload(reg: &mut Registry, dev: &B, model: &ModelWeights) -> Result<GpuOutput<B>> {
        Ok(GpuOutput {
            norm: reg.upload(dev, "output_norm", &model.output_norm)?,
            norm_bias: reg.maybe(dev, "output_norm.bias", model.output_norm_bias.as_deref())?,
            w: reg.weight(dev, "output", &model.output)?,
            logits: reg.zeros(dev, "output.logits", model.config.vocab_size)?,
        })
    }
}

impl<B: Backend> GpuScratch<B> {
    /// The decode step's shared buffers, sized for the model and the plan (its context, its
    /// largest predictor), in the accounting's order.
    fn allocate(reg: &mut Registry, dev: &B, c: &ModelConfig, plan: &PlanFile) -> Result<Self> {
        let max_rank = plan.predictor_ranks.iter().copied().max().unwrap_or(0);
        let mut z = |n: &str, len: usize| reg.zeros::<B, f32>(dev, &format!("scratch.{n}"), len);
        let (x, xb, xb2) = (z("x", c.dim)?, z("xb", c.dim)?, z("xb2", c.dim)?);
        let (q, k, v) = (z("q", c.q_dim())?, z("k", c.kv_dim())?, z("v", c.kv_dim())?);
        let ffn = c.max_neurons();
        let (att, hb) = (z("att", c.q_dim())?, z("hb", ffn)?);
        let active = reg.zeros::<B, i32>(dev, "scratch.active", ffn)?;
        let mut z = |n: &str, len: usize| reg.zeros::<B, f32>(dev, &format!("scratch.{n}"), len);
        let (pred, xfer) = (z("pred", max_rank)?, z("xfer", c.dim)?);
        let part = z("part", powerinfer_cuda::part_len(c.dim, ffn))?;
        let attp = z("attp", att_part_len(c.n_heads, c.head_dim, plan.context))?;
        let kn = match c.arch.qk_norm {
            true => Some(z("kn", c.kv_dim())?),
            false => None,
        };
        let saved = match c.arch.parallel {
            true => Some(z("saved", c.dim)?),
            false => None,
        };
        let expert_w = match c.moe.is_moe() {
            true => Some(z("expert_w", c.moe.n_expert + 1)?),
            false => None,
        };
        let xq_len = powerinfer_cuda::layout::xq_bytes(c.dim.max(c.q_dim()));
        let xq = reg.zeros::<B, u8>(dev, "scratch.xq", xq_len)?;
        let mut list = |name: &str, coefficients: bool| -> Result<Compacted<B>> {
            Ok(Compacted {
                idx: reg.zeros(dev, &format!("scratch.{name}"), ffn)?,
                a: match coefficients {
                    true => Some(reg.zeros(dev, &format!("scratch.{name}_a"), ffn)?),
                    false => None,
                },
                count: reg.zeros(dev, &format!("scratch.{name}_n"), 1)?,
            })
        };
        let (slots, rows) = (list("slots", false)?, list("rows", true)?);
        Ok(GpuScratch {
            x,
            xb,
            xb2,
            q,
            k,
            v,
            att,
            hb,
            active,
            pred,
            xfer,
            part,
            attp,
            kn,
            saved,
            expert_w,
            xq: QuantizedX::new(xq),
            slots,
            rows,
        })
    }

    /// A block's post-norm: `xb2 = rms_norm(xb2)`, through `xb` (which then holds the block's
    /// output before the norm, so a quantized copy of the norm's `xb` is no longer current).
    pub fn post_norm(&mut self, dev: &B, w: &B::Buf<f32>, eps: f32) -> Result<()> {
        self.xq.xb_changed();
        dev.rms_norm(&self.xb2, w, 1, eps, &mut self.xb)?;
        std::mem::swap(&mut self.xb, &mut self.xb2);
        Ok(())
    }
}
