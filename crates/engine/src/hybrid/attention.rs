//! A layer's attention block on the GPU: its program's steps ([`AttnStep`]), each one kernel or
//! a few, from the residual `sc.x` (current on the device) back into it.

use powerinfer_core::{bail, ModelConfig, Result, RopeFreqs};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{Act, AttnParams, Backend, KvElem};

use crate::hybrid::gpu_model::{GpuAttention, GpuScratch, KvBufs};
use crate::hybrid::quantized_x::{Block, NormWeights, XbSite};
use crate::layer::{AttendParams, AttnStep};

/// One layer's attention block for one token: its inputs and the buffers its steps work in.
pub struct AttnPass<'a, B: Backend> {
    pub dev: &'a B,
    pub c: &'a ModelConfig,
    pub l: usize,
    /// The token's position (its row in the KV caches).
    pub pos: usize,
    pub sc: &'a mut GpuScratch<B>,
    pub a: &'a mut GpuAttention<B>,
    /// RoPE's angles: the global layers' and the sliding layers' (see `Executor`).
    pub inv_freqs: &'a [RopeFreqs; 2],
}

/// Store the position's keys and values in a layer's caches (of element `T`) and attend over
/// them: `sc.att` from `sc.q`.
fn attend<B: Backend, T: KvElem>(
    dev: &B,
    sc: &mut GpuScratch<B>,
    [cache_k, cache_v]: [&mut B::Buf<T>; 2],
    pos: usize,
    p: &AttnParams,
    sinks: Option<&B::Buf<f32>>,
) -> Result<()> {
    dev.kv_store(&sc.k, &sc.v, pos, cache_k, cache_v)?;
    dev.attention(
        &sc.q,
        cache_k,
        cache_v,
        pos + 1,
        p,
        sinks,
        &mut sc.attp,
        &mut sc.att,
    )
}

impl<B: Backend> AttnPass<'_, B> {
    /// Where this block's norm writes `xb`.
    fn site(&self) -> XbSite {
        XbSite {
            layer: self.l,
            block: Block::Attention,
        }
    }

    /// Whether a weight of the q/k/v projections is quantized (then the norm quantizes `xb`).
    fn qkv_quantized(&self) -> bool {
        let a = &*self.a;
        [&a.wq, &a.wk, &a.wv].iter().any(|w| w.dtype.is_quantized())
    }

    /// Run `steps`, the layer's attention program.
    pub fn run(&mut self, steps: &[AttnStep]) -> Result<()> {
        let (c, l) = (self.c, self.l);
        // A per-head q/k norm right before RoPE runs inside RoPE's launch.
        let mut qk_norm_pending = false;
        // The o projection added itself into the residual (the Residual step then adds nothing).
        let mut residual_added = false;
        for (i, step) in steps.iter().enumerate() {
            let next = steps.get(i + 1);
            match step {
                AttnStep::Norm(kind) => {
                    let (site, quant) = (self.site(), self.qkv_quantized());
                    let (sc, a) = (&mut *self.sc, &*self.a);
                    let norm = NormWeights {
                        kind: *kind,
                        w: &a.norm,
                        bias: a.norm_bias.as_ref(),
                        eps: c.rms_eps,
                    };
                    sc.xq
                        .norm_into(self.dev, site, &norm, &sc.x, &mut sc.xb, quant)?;
                }
                AttnStep::Qkv { bias } => self.qkv(*bias)?,
                AttnStep::QkNorm
                    if !c.arch.qk_norm_full && matches!(next, Some(AttnStep::Rope { .. })) =>
                {
                    qk_norm_pending = true;
                }
                AttnStep::QkNorm => self.qk_norm()?,
                AttnStep::Rope { local } => {
                    self.rope(*local, qk_norm_pending)?;
                    qk_norm_pending = false;
                }
                AttnStep::Attend(p) => self.attend(p)?,
                AttnStep::Mla(_) => bail!(Unsupported, "layer {l}: latent attention on the GPU"),
                AttnStep::Output { bias } => {
                    let into_residual = !bias && matches!(next, Some(AttnStep::Residual));
                    self.output(*bias, into_residual)?;
                    residual_added |= into_residual;
                }
                AttnStep::PostNorm => {
                    let Some(post) = &self.a.post_norm else {
                        bail!(Other, "layer {l}: no GPU post-attention norm");
                    };
                    self.sc.post_norm(self.dev, post, c.rms_eps)?;
                }
                AttnStep::Residual if residual_added => {}
                AttnStep::Residual => self.dev.add(&mut self.sc.x, &self.sc.xb2)?,
            }
        }
        Ok(())
    }

    /// The q, k and v projections of `xb` (with their biases when `bias`).
    fn qkv(&mut self, bias: bool) -> Result<()> {
        let (dev, c) = (self.dev, self.c);
        let (site, quant) = (self.site(), self.qkv_quantized());
        let (sc, a) = (&mut *self.sc, &*self.a);
        let x = sc.xq.xb(dev, quant, site, &sc.xb)?;
        dev.matvec_rows(&a.wq, x, None, c.q_dim(), Act::None, &mut sc.q)?;
        dev.matvec_rows(&a.wk, x, None, c.kv_dim(), Act::None, &mut sc.k)?;
        dev.matvec_rows(&a.wv, x, None, c.kv_dim(), Act::None, &mut sc.v)?;
        if let (true, Some([bq, bk, bv])) = (bias, &a.qkv_bias) {
            dev.add(&mut sc.q, bq)?;
            dev.add(&mut sc.k, bk)?;
            dev.add(&mut sc.v, bv)?;
        }
        Ok(())
    }

    /// The q/k norm as its own launches: per head, or over the whole vector (OLMoE).
    fn qk_norm(&mut self) -> Result<()> {
        let (dev, c, l) = (self.dev, self.c, self.l);
        let (sc, a) = (&mut *self.sc, &*self.a);
        let (Some([nq, nk]), Some(kn)) = (&a.qk_norm, sc.kn.as_mut()) else {
            bail!(Other, "layer {l}: no GPU q/k norm buffers");
        };
        let (hq, hk) = match c.arch.qk_norm_full {
            true => (1, 1),
            false => (c.n_heads, c.n_kv_heads),
        };
        dev.rms_norm(&sc.q, nq, hq, c.rms_eps, &mut sc.att)?;
        std::mem::swap(&mut sc.q, &mut sc.att);
        dev.rms_norm(&sc.k, nk, hk, c.rms_eps, kn)?;
        std::mem::swap(&mut sc.k, kn);
        Ok(())
    }

    /// RoPE on queries and keys in one launch, each head normed first when the q/k norm was
    /// left for it (`qk_norm`).
    fn rope(&mut self, local: bool, qk_norm: bool) -> Result<()> {
        let (c, l) = (self.c, self.l);
        let inv = &self.inv_freqs[usize::from(local)];
        let norms = match (qk_norm, &self.a.qk_norm) {
            (false, _) => None,
            (true, Some([nq, nk])) => Some((nq, nk, c.rms_eps)),
            (true, None) => bail!(Other, "layer {l}: no GPU q/k norm buffers"),
        };
        let (hd, style, sc) = (c.head_dim, c.rope_style, &mut *self.sc);
        self.dev
            .rope(&mut sc.q, Some(&mut sc.k), hd, self.pos, inv, style, norms)
    }

    /// Store the position's keys and values and attend over the cache (with the layer's sinks,
    /// gpt-oss): `sc.att`.
    fn attend(&mut self, p: &AttendParams) -> Result<()> {
        let c = self.c;
        let params = AttnParams {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            window: p.window,
            scale: p.scale,
            softcap: p.softcap,
        };
        let (dev, sc, pos) = (self.dev, &mut *self.sc, self.pos);
        let a = &mut *self.a;
        let sinks = a.sinks.as_ref();
        match &mut a.cache {
            KvBufs::F16(k, v) => attend(dev, sc, [k, v], pos, &params, sinks),
            KvBufs::F32(k, v) => attend(dev, sc, [k, v], pos, &params, sinks),
        }
    }

    /// The o projection of `sc.att`: straight into the residual in its launch when
    /// `into_residual`, else into `xb2` (with its bias when `bias`).
    fn output(&mut self, bias: bool, into_residual: bool) -> Result<()> {
        let (dev, c) = (self.dev, self.c);
        let (sc, a) = (&mut *self.sc, &*self.a);
        let x = sc.xq.row(dev, a.wo.dtype.is_quantized(), &sc.att)?;
        if into_residual {
            return dev.matvec_add(&a.wo, x, c.dim, &mut sc.x);
        }
        dev.matvec_rows(&a.wo, x, None, c.dim, Act::None, &mut sc.xb2)?;
        if let (true, Some(b)) = (bias, &a.out_bias) {
            dev.add(&mut sc.xb2, b)?;
        }
        Ok(())
    }
}
