//! The contracts of `quantize_x`, `sparse_matvec_<dtype>` and `gate_up_<dtype>`
//! (sparse_matvec.cu) on host memory: one output per picked row, rows addressed through their
//! layout (plain matrices and hot-neuron slabs), inactive or padding neurons yielding 0 without
//! their rows being read; gate_up with the FFN's whole activation (gate bias, FATReLU, gate-less
//! or activated up).

use std::borrow::Cow;

use powerinfer_core::Result;

use crate::host::view::{prefix, prefix_mut, shape, Active, Neurons, Picks, Rows};
use crate::layout::{xq_bytes, Act, FfnAct, XQ_BLOCK};
use crate::ops::elementwise::host::{apply_act, apply_ffn_act};
use powerinfer_core::swiglu_oai;

/// Largest |q| of quantized x (`XQ_MAX` in common.cuh).
const XQ_MAX: f32 = 32639.0;

/// `quantize_x` (sparse_matvec.cu): the first `cols` values of `x` (a multiple of 32) as int16
/// blocks into `xq`: per 32 values h[32], l[32], then the f32 scale, the f32 sums of each half
/// and the i32 Σq, with q = round-to-nearest-even(x · (XQ_MAX / max|x|)) (0 where that factor
/// overflows), h = (q + 128) >> 8, l = q − 256·h; a block holding a NaN or an infinity gets NaN
/// scale and sums and q = 0.
pub(crate) fn quantize_x(x: &[f32], cols: usize, xq: &mut [u8]) -> Result<()> {
    if !cols.is_multiple_of(32) {
        return Err(shape(format!(
            "quantize_x: {cols} values, not whole blocks of 32"
        )));
    }
    let x = prefix(x, cols, "x")?;
    let xq = prefix_mut(xq, xq_bytes(cols), "xq")?;
    for (v, out) in x.chunks_exact(32).zip(xq.chunks_exact_mut(XQ_BLOCK)) {
        let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
        let (lo, hi) = (v[..16].iter().sum::<f32>(), v[16..].iter().sum::<f32>());
        let finite = amax.is_finite() && (lo + hi).is_finite();
        let inv = match XQ_MAX / amax {
            inv if amax > 0.0 && inv.is_finite() => inv,
            _ => 0.0, // zeros, or max|x| below ~1e-34
        };
        let mut qsum = 0i32;
        for (j, &a) in v.iter().enumerate() {
            let q = if finite {
                (a * inv).round_ties_even() as i32
            } else {
                0
            };
            let h = (q + 128) >> 8;
            out[j] = h as i8 as u8;
            out[32 + j] = (q - 256 * h) as i8 as u8;
            qsum += q;
        }
        let (scale, lo, hi) = match finite {
            true => (amax / XQ_MAX, lo, hi),
            false => (f32::NAN, f32::NAN, f32::NAN),
        };
        out[64..68].copy_from_slice(&scale.to_le_bytes());
        out[68..72].copy_from_slice(&lo.to_le_bytes());
        out[72..76].copy_from_slice(&hi.to_le_bytes());
        out[76..80].copy_from_slice(&qsum.to_le_bytes());
    }
    Ok(())
}

/// The x a row kernel reads, in host memory: floats, or the quantized blocks.
pub(crate) enum XSlice<'a> {
    F32(&'a [f32]),
    Quant(&'a [u8]),
}

/// The `cols` values x stands for: floats as given, quantized blocks as scale · (256·h + l) (the
/// x̂ the integer dots multiply; the host then takes Q4_1/Q5_1's and the K-quants' min terms
/// over x̂ where the kernels use the blocks' sums of x, a difference within x̂'s rounding).
pub(crate) fn x_values(x: XSlice<'_>, cols: usize) -> Result<Cow<'_, [f32]>> {
    let bytes = match x {
        XSlice::F32(x) => return prefix(x, cols, "x").map(Cow::Borrowed),
        XSlice::Quant(q) => prefix(q, xq_bytes(cols), "xq")?,
    };
    let mut out = Vec::with_capacity(cols);
    for b in bytes.chunks_exact(XQ_BLOCK) {
        let scale = f32::from_le_bytes([b[64], b[65], b[66], b[67]]);
        let q = |j: usize| 256 * i32::from(b[j] as i8) + i32::from(b[32 + j] as i8);
        out.extend((0..32).map(|j| scale * q(j) as f32));
    }
    out.truncate(cols);
    Ok(Cow::Owned(out))
}

/// `y[k] = act(dot(W[row k], x))` for k in 0..n (`y` holds n, `x` holds the row's cols).
pub(crate) fn sparse_matvec(
    w: &Rows<'_>,
    x: &[f32],
    picks: &Picks<'_>,
    active: Option<&Active<'_>>,
    act: Act,
    accumulate: bool,
    y: &mut [f32],
) -> Result<()> {
    for (k, out) in y.iter_mut().enumerate().take(picks.n) {
        let r = picks.row(k)?;
        let v = if is_active(active, r)? {
            apply_act(act, w.dot(r, x)?)
        } else {
            0.0
        };
        *out = if accumulate { *out + v } else { v };
    }
    Ok(())
}

/// `h[k] = g · u'` for k in 0..n with `g = act(dot(gate[row k], x) + bias)` and
/// `u' = dot(up[row k], x)`, `act` of it with `act.up_act`, or 1 without up rows (a gate-less
/// FFN); `act` with its FATReLU threshold. The up row is not read when `g` is exactly 0, nor
/// any row of a neuron `neurons` says yields 0. With `act.swiglu_limit` > 0 and up rows
/// (gpt-oss) `h[k] = swiglu_oai(dot(gate, x) + bias, dot(up, x) + up bias, limit)`.
pub(crate) fn gate_up(
    (gate, up): (&Rows<'_>, Option<&Rows<'_>>),
    x: &[f32],
    picks: &Picks<'_>,
    neurons: &Neurons<'_>,
    act: FfnAct,
    h: &mut [f32],
) -> Result<()> {
    for (k, out) in h.iter_mut().enumerate().take(picks.n) {
        let r = picks.row(k)?;
        *out = 0.0;
        let Some(bias) = neurons.gate_bias(r)? else {
            continue;
        };
        if let (Some(up), true) = (up, act.swiglu_limit > 0.0) {
            let u = up.dot(r, x)? + neurons.up_bias(r)?;
            *out = swiglu_oai(gate.dot(r, x)? + bias, u, act.swiglu_limit);
            continue;
        }
        let g = apply_ffn_act(act, gate.dot(r, x)? + bias);
        *out = g;
        if let (Some(up), true) = (up, g != 0.0) {
            let u = up.dot(r, x)?;
            *out = g * if act.up_act { apply_ffn_act(act, u) } else { u };
        }
    }
    Ok(())
}

/// Whether row `r` is computed (always, without flags).
fn is_active(active: Option<&Active<'_>>, r: usize) -> Result<bool> {
    active.map_or(Ok(true), |a| a.is_active(r))
}
