//! The output steps on the GPU (final norm, head, soft-cap) from the residual `sc.x`: the
//! logits, downloaded once.

use powerinfer_core::{ModelConfig, Result};
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{Act, Backend};

use crate::hybrid::gpu_model::{GpuOutput, GpuScratch};
use crate::hybrid::quantized_x::{Block, NormWeights, XbSite};
use crate::hybrid::transfers::Link;
use crate::layer::OutputProgram;

/// The logits of the residual in `sc.x` (current on the device) by the output head `o`, their
/// download charged to the output's slot (`n_layers`).
pub fn gpu_output<B: Backend>(
    c: &ModelConfig,
    p: &OutputProgram,
    sc: &mut GpuScratch<B>,
    o: &mut GpuOutput<B>,
    link: &mut Link<'_, B>,
) -> Result<Vec<f32>> {
    let dev = link.dev();
    let quant = o.w.dtype.is_quantized();
    let site = XbSite {
        layer: c.n_layers,
        block: Block::Output,
    };
    let norm = NormWeights {
        kind: p.norm,
        w: &o.norm,
        bias: o.norm_bias.as_ref(),
        eps: c.rms_eps,
    };
    sc.xq
        .norm_into(dev, site, &norm, &sc.x, &mut sc.xb, quant)?;
    let x = sc.xq.xb(dev, quant, site, &sc.xb)?;
    dev.matvec_rows(&o.w, x, None, c.vocab_size, Act::None, &mut o.logits)?;
    if let Some(cap) = p.softcap {
        dev.softcap(&mut o.logits, c.vocab_size, cap)?;
    }
    let mut logits = vec![0.0f32; c.vocab_size];
    link.down(c.n_layers, &o.logits, 0, &mut logits)?;
    Ok(logits)
}
