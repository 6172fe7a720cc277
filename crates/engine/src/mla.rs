//! Multi-head latent attention (DeepSeek-V2/V3, llama.cpp's `deepseek2`) on the CPU, in the
//! latent space as llama.cpp runs it: the cache keeps per position and layer only the normed
//! latent `c_kv` (`kv_lora_rank` values) and the rotated shared key `k_pe` (the rope dims), one
//! row ([`crate::kv_cache::KvCache::latent`]); each head's `q_nope` is absorbed through
//! `attn_k_b` into the latent, so the attention is MQA over those rows with the latent part as
//! the value, and each head's latent output leaves through `attn_v_b`.
//!
//! Per token: `q = W_q xn` (or `W_q_b · rms(W_q_a xn)`), split per head into `q_nope, q_pe`;
//! `[c, k_pe] = W_kv_a xn`, `c = rms(c)`, RoPE on `q_pe` and `k_pe`; per head
//! `q_lat = K_b[h] q_nope` (`kv_lora_rank` values), scores `q_lat·c + q_pe·k_pe` scaled by
//! `1/sqrt(qk_nope + rope)`, `o_lat = Σ softmax · c`, `o_h = V_b[h] o_lat`; `out = W_o o`.
//! One token's per-head products run as one parallel pass over every head
//! ([`crate::mla_heads`]); several tokens' as one matrix product per head.

use powerinfer_core::{bail, ModelConfig, Result, RopeStyle};

use crate::attend_pass::attend_pass;
use crate::attention::AttnShape;
use crate::ffn::{project, Arith};
use crate::layer::AttendParams;
use crate::layer_weights::LayerWeights;
use crate::mla_heads::heads_matvec;
use crate::mla_weights::MlaWeights;
use crate::norm_rope::{apply_rope, rms_norm};
use crate::pass_rows::Kv;
use crate::pass_scratch::{Angles, Scratch};

/// Rows `t` of `src` (n rows of `stride`), values `at..at + w` of each, gathered into `dst`.
fn gather(src: &[f32], stride: usize, at: usize, w: usize, dst: &mut Vec<f32>) {
    dst.clear();
    dst.extend(src.chunks_exact(stride).flat_map(|r| &r[at..at + w]));
}

/// `src` (n rows of `w`) scattered into values `at..at + w` of each row of `dst` (`stride`).
fn scatter(src: &[f32], w: usize, dst: &mut [f32], stride: usize, at: usize) {
    for (d, s) in dst.chunks_exact_mut(stride).zip(src.chunks_exact(w)) {
        d[at..at + w].copy_from_slice(s);
    }
}

/// Layer `l`'s latent attention of the `n` normed rows in `s.xn` into `s.o` (the output
/// projection's result; the residual add is the program's next step), their cache rows written
/// into `kv` first.
#[allow(clippy::too_many_arguments)]
pub(crate) fn mla_attention(
    c: &ModelConfig,
    lw: &LayerWeights,
    l: usize,
    p: &AttendParams,
    kv: &mut Kv<'_, '_>,
    s: &mut Scratch,
    n: usize,
    angles: &Angles,
) -> Result<()> {
    let Some(mw) = &lw.mla else {
        bail!(Other, "a latent attention step without its weights");
    };
    let arith = s.arith;
    query(c, lw, mw, s, n, arith)?;
    latent_rows(c, lw, mw, s, n, angles, arith)?;
    absorb_query(c, mw, s, n, angles, arith)?;
    let shape = AttnShape {
        n_heads: c.n_heads,
        n_kv_heads: 1,
        head_dim: c.head_dim,
        window: p.window,
        scale: Some(p.scale),
        softcap: None,
        sinks: None,
    };
    // A latent cache takes the key rows alone; the slots' split reads v as wide as k.
    s.v.clone_from(&s.k);
    attend_pass(&shape, arith, kv, l, s, n);
    heads_out(c, mw, s, n, arith)?;
    project(&lw.wo, &s.mla.out, n, &mut s.o, arith)
}

/// `s.mla.q` = the projected query of every row (through the compression where it has one).
fn query(
    c: &ModelConfig,
    lw: &LayerWeights,
    mw: &MlaWeights,
    s: &mut Scratch,
    n: usize,
    arith: Arith,
) -> Result<()> {
    let m = &mut s.mla;
    match &mw.q_a {
        None => project(&lw.wq, &s.xn, n, &mut m.q, arith),
        Some((q_a, norm)) => {
            project(q_a, &s.xn, n, &mut m.qa, arith)?;
            crate::pass_scratch::norm_rows(&m.qa, norm, c.rms_eps, &mut m.qa_norm);
            project(&lw.wq, &m.qa_norm, n, &mut m.q, arith)
        }
    }
}

/// `s.k` = every row's cache row: `W_kv_a xn`, its latent part RMS-normed, its key part
/// rotated.
fn latent_rows(
    c: &ModelConfig,
    lw: &LayerWeights,
    mw: &MlaWeights,
    s: &mut Scratch,
    n: usize,
    angles: &Angles,
    arith: Arith,
) -> Result<()> {
    project(&lw.wk, &s.xn, n, &mut s.k, arith)?;
    let (r, rope) = (c.arch.mla.kv_lora_rank, c.rope_dims());
    let mut normed = vec![0.0f32; r];
    for (row, a) in s.k.chunks_exact_mut(r + rope).zip(angles.get(false)) {
        rms_norm(&row[..r], &mw.kv_norm, c.rms_eps, &mut normed);
        row[..r].copy_from_slice(&normed);
        apply_rope(&mut row[r..], rope, a, RopeStyle::Norm);
    }
    Ok(())
}

/// `s.q` = every row's absorbed query: per head `K_b[h] q_nope` then the rotated `q_pe`
/// (`kv_lora_rank + rope` values a head, as the cache rows).
fn absorb_query(
    c: &ModelConfig,
    mw: &MlaWeights,
    s: &mut Scratch,
    n: usize,
    angles: &Angles,
    arith: Arith,
) -> Result<()> {
    let mla = &c.arch.mla;
    let (r, rope, nope) = (mla.kv_lora_rank, c.rope_dims(), mla.qk_nope);
    let (qh, lat) = (nope + rope, r + rope);
    let (h, m) = (c.n_heads, &mut s.mla);
    for (row, a) in m.q.chunks_exact_mut(h * qh).zip(angles.get(false)) {
        for head in row.chunks_exact_mut(qh) {
            apply_rope(&mut head[nope..], rope, a, RopeStyle::Norm);
        }
    }
    s.q.resize(n * h * lat, 0.0);
    if n == 1 {
        let q = &s.mla.q;
        heads_matvec(&mw.k_b, |hd| &q[hd * qh..hd * qh + nope], &mut s.q, lat, 0)?;
        for (hd, row) in s.q.chunks_exact_mut(lat).enumerate() {
            row[r..].copy_from_slice(&q[hd * qh + nope..(hd + 1) * qh]);
        }
        return Ok(());
    }
    for (hd, k_b) in mw.k_b.iter().enumerate() {
        gather(&m.q, h * qh, hd * qh, nope, &mut m.head_in);
        project(k_b, &m.head_in, n, &mut m.head_out, arith)?;
        scatter(&m.head_out, r, &mut s.q, h * lat, hd * lat);
        gather(&m.q, h * qh, hd * qh + nope, rope, &mut m.head_in);
        scatter(&m.head_in, rope, &mut s.q, h * lat, hd * lat + r);
    }
    Ok(())
}

/// `s.mla.out` = every head's latent output (`s.att`, the first `kv_lora_rank` values of each
/// head's) through its `V_b[h]`.
fn heads_out(c: &ModelConfig, mw: &MlaWeights, s: &mut Scratch, n: usize, a: Arith) -> Result<()> {
    let mla = &c.arch.mla;
    let (r, lat, vd, h) = (mla.kv_lora_rank, c.head_dim, mla.v_head_dim, c.n_heads);
    let m = &mut s.mla;
    m.out.resize(n * h * vd, 0.0);
    if n == 1 {
        let att = &s.att;
        return heads_matvec(
            &mw.v_b,
            |hd| &att[hd * lat..hd * lat + r],
            &mut m.out,
            vd,
            0,
        );
    }
    for (hd, v_b) in mw.v_b.iter().enumerate() {
        gather(&s.att, h * lat, hd * lat, r, &mut m.head_in);
        project(v_b, &m.head_in, n, &mut m.head_out, a)?;
        scatter(&m.head_out, vd, &mut m.out, h * vd, hd * vd);
    }
    Ok(())
}
