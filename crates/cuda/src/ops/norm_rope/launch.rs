//! The launches of `kernels/norm_rope.cu`: one struct per kernel, its fields the kernel's
//! parameters in order.

use powerinfer_core::{ensure, Result, RopeFreqs};

use super::host;
use crate::backend::kernel;
use crate::host::view::{prefix, prefix_mut, product};
use crate::kernels::KernelSource;
use crate::launch_spec::{KernelArgs, LaunchSpec};
use crate::layout::to_i32;

/// `kernels/norm_rope.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "norm_rope",
    include_str!("../../../kernels/norm_rope.cu"),
    &["rms_norm", "layer_norm", "rope"],
);

/// The most rotated pairs per head the `rope` kernel takes (`MAX_ROPE_PAIRS` in norm_rope.cu:
/// heads up to 512 values).
pub const MAX_ROPE_PAIRS: usize = 256;

/// Threads of rms_norm's and layer_norm's one block per row (8 warps: a row of a few thousand
/// values is a few loads per thread; the kernel takes up to 32 warps).
pub const NORM_THREADS: u32 = 256;

/// norm_rope.cu's `RopeAngles` by value for position `pos`, into `a`: the cosine, then the
/// sine, of `pos · inv[i]` for each pair times the magnitude, as [`RopeFreqs::cos_sin`] forms
/// them in f64 (the CPU engine's tables too; positions reach tens of thousands of radians,
/// where f32 loses the phase) and rounds them to f32; MAX_ROPE_PAIRS of each, the unused ones 0.
pub fn push_rope_angles(a: &mut KernelArgs, pos: usize, freqs: &RopeFreqs) -> Result<()> {
    ensure!(
        freqs.pairs() <= MAX_ROPE_PAIRS,
        Unsupported,
        "rope: {} rotated pairs, the kernel takes at most {MAX_ROPE_PAIRS}",
        freqs.pairs()
    );
    let (mut cos, mut sin) = (vec![0f32; MAX_ROPE_PAIRS], vec![0f32; MAX_ROPE_PAIRS]);
    for i in 0..freqs.pairs() {
        (cos[i], sin[i]) = freqs.cos_sin(pos, i);
    }
    let b: Vec<u8> = cos
        .iter()
        .chain(&sin)
        .flat_map(|v| v.to_le_bytes())
        .collect();
    a.push_bytes(&b);
    Ok(())
}

kernel! {
    /// `rms_norm` (`bias` None) or `layer_norm` (with the bias) over `rows` rows of `n`:
    /// `out = x / sqrt(mean(x²) + eps) · w`, or `out = (x − mean) / sqrt(var + eps) · w + b`
    /// (the biased variance); with `xq` also `out` quantized for the integer dots, the bytes
    /// `quantize_x` writes for it (row r's blocks after row r − 1's; `n` a multiple of 32).
    struct Norm<'a, B> {
        x: &'a B::Buf<f32>,
        w: &'a B::Buf<f32>,
        bias: Option<&'a B::Buf<f32>>,
        rows: usize,
        n: usize,
        eps: f32,
        out: &'a mut B::Buf<f32>,
        xq: Option<&'a mut B::Buf<u8>>,
    }
    entry(k) = match k.bias {
        None => "rms_norm",
        Some(_) => "layer_norm",
    };
    fused(k) k.xq.as_ref().map(|_| match k.bias {
        None => "quantize_x (in rms_norm)",
        Some(_) => "quantize_x (in layer_norm)",
    });
    spec(k, dev, a) {
        // rms_norm(x, w, n, eps, out, xq), layer_norm(x, w, b, n, eps, out, xq): block r reads
        // row r of x, writes row r of out (and, xq not null, its blocks of quantized x); one
        // block of NORM_THREADS per row.
        let entry = k.entry();
        a.ptr(dev.addr(k.x)).ptr(dev.addr(k.w));
        if let Some(b) = k.bias {
            a.ptr(dev.addr(b));
        }
        a.i32(to_i32(k.n, "n")?).f32(k.eps);
        a.ptr(dev.addr_mut(k.out))
            .ptr(k.xq.map_or(0, |q| dev.addr_mut(q)));
        let blocks = [to_i32(k.rows, "rows")? as u32, 1];
        Ok(LaunchSpec::new(&SOURCE, entry, blocks, NORM_THREADS, 0, a))
    }
    host(k) {
        let n = k.n;
        let total = product(k.rows, n, "rows × n")?;
        let x = prefix(B::data(k.x), total, "x")?;
        let w = prefix(B::data(k.w), n, "w")?;
        let out = prefix_mut(B::data_mut(k.out), total, "out")?;
        match k.bias {
            None => host::rms_norm(x, w, n, k.eps, out),
            Some(b) => host::layer_norm(x, [w, prefix(B::data(b), n, "b")?], k.eps, out),
        }
        host::quantize_rows(out, n, k.xq.map(|q| B::data_mut(q)))
    }
}

kernel! {
    /// `rope`: rotate the first `2 · freqs.pairs()` values of every head of `x` (`n_heads`
    /// heads) and of `k` (`k_heads`, the keys: one launch for both) in place for position `pos`,
    /// pair i by `pos · freqs.inv[i]` (in f64; at most [`MAX_ROPE_PAIRS`] pairs), the rotated
    /// values times `freqs.mscale` ([`RopeFreqs::cos_sin`]); `neox` pairs
    /// (i, i + n), else (2i, 2i + 1). With `x_norm` (`k_norm`) each head of `x` (`k`) is first
    /// RMS-normed over its `head_dim` values with that weight and `eps` (the per-head q/k norm).
    struct Rope<'a, B> {
        x: &'a mut B::Buf<f32>,
        n_heads: usize,
        k: Option<&'a mut B::Buf<f32>>,
        k_heads: usize,
        head_dim: usize,
        pos: usize,
        freqs: &'a RopeFreqs,
        neox: bool,
        x_norm: Option<&'a B::Buf<f32>>,
        k_norm: Option<&'a B::Buf<f32>>,
        eps: f32,
    }
    entry = "rope";
    fused(k) k.x_norm.map(|_| "rms_norm (in rope)");
    spec(k, dev, a) {
        // rope(q, nq, k, nk, head_dim, n_pairs, angles, neox, qn, kn, eps): a warp per head of q
        // then of k (k null when nk = 0; qn, kn null: no norm).
        let k_heads = if k.k.is_some() { k.k_heads } else { 0 };
        a.ptr(dev.addr_mut(k.x))
            .i32(to_i32(k.n_heads, "heads")?);
        a.ptr(k.k.map_or(0, |k| dev.addr_mut(k)))
            .i32(to_i32(k_heads, "key heads")?);
        a.i32(to_i32(k.head_dim, "head_dim")?);
        a.i32(to_i32(k.freqs.pairs(), "rope pairs")?);
        push_rope_angles(&mut a, k.pos, k.freqs)?;
        a.i32(i32::from(k.neox));
        let norm = |w: Option<&B::Buf<f32>>| w.map_or(0, |w| dev.addr(w));
        a.ptr(norm(k.x_norm))
            .ptr(norm(k.k_norm))
            .f32(k.eps);
        let threads = (k.n_heads + k_heads)
            .checked_mul(32)
            .ok_or_else(|| powerinfer_core::Error::Shape("rope: too many heads".into()))?;
        LaunchSpec::per_element(&SOURCE, "rope".into(), threads, a)
    }
    host(k) {
        let (head_dim, freqs) = (k.head_dim, k.freqs);
        ensure!(
            2 * freqs.pairs() <= head_dim,
            Shape,
            "rope: {} pairs in heads of {head_dim}",
            freqs.pairs()
        );
        let heads = [
            ("x", Some(k.x), k.n_heads, k.x_norm),
            ("k", k.k, k.k_heads, k.k_norm),
        ];
        for (what, buf, n, norm) in heads {
            let Some(buf) = buf else { continue };
            let total = product(n, head_dim, "heads × head_dim")?;
            let h = prefix_mut(B::data_mut(buf), total, what)?;
            if let Some(w) = norm {
                let w = prefix(B::data(w), head_dim, "norm weight")?;
                host::rms_norm_in_place(h, w, k.eps);
            }
            host::rope(h, head_dim, k.pos, freqs, k.neox);
        }
        Ok(())
    }
}
