//! The emulator (feature `emu`): every kernel entry of `ops::SOURCES` run from its `.cu` source on
//! the CPU against float64 references that decode weights with the core crate's scalar
//! `dequantize_row` (never the CPU crate's SIMD kernels), on shapes at the kernels' edges: odd
//! row counts and partial blocks, padding slots of a partial slab, the split down pass (partial
//! sums added in a fixed order), norms longer than a block, a long context (f16 and f32 caches)
//! under a sliding window and a soft-cap, attention sinks below, near and above the scores. One backend runs it all, and the set of entries it launched must equal the modules'
//! entries. Also: the emulator holds exactly the compiled kernels, and refuses launches CUDA
//! would refuse.
//!
//! `bash benchmarks/gpu/emu.sh [--sanitize address|thread]` runs these under the sanitizers.

#![cfg(feature = "emu")]

#[path = "support/attention_ref.rs"]
mod attention_ref;
use attention_ref::attention_ref;
#[path = "support/predictor_run.rs"]
mod predictor_run;
use predictor_run::run_predictor;
#[path = "support/x_hat.rs"]
mod x_hat;

use std::collections::BTreeSet;

use powerinfer_core::{dequantize_row, DType, Error, Weight};

use powerinfer_cuda::launch_spec::{KernelArgs, LaunchSpec};
use powerinfer_cuda::ops;
use powerinfer_cuda::ops::elementwise::launch::{Pair, PairKernel};
use powerinfer_cuda::ops::norm_rope::launch::Norm;
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::ops::rows::launch::SparseMatvec;
use powerinfer_cuda::{
    emu_entries, Act, AttnParams, Backend, Compacted, EmuBackend, FfnAct, HostBuf, Kernel, KvElem,
    XArg, XIn, GPU_DTYPES, MAX_X_BYTES, XQ_BLOCK,
};
use x_hat::x_hat;

/// Relative tolerance of f32 sums against float64 (summation order differs).
const REL_TOL: f64 = 2e-5;
/// Absolute floor, per unit of the sum's scale.
const ABS_TOL: f64 = 1e-5;

fn values(n: usize, seed: u64) -> Vec<f32> {
    powerinfer_core::testing::pseudo_random(n, seed)
}

fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    powerinfer_core::testing::random_weight(dtype, rows, cols, seed)
}

/// Every row of `w` decoded by the core crate's scalar decoder, in f64.
fn decoded(w: &Weight) -> Vec<Vec<f64>> {
    (0..w.rows)
        .map(|r| {
            let mut out = vec![0f32; w.cols];
            dequantize_row(w.dtype, w.row(r), &mut out).unwrap();
            out.into_iter().map(f64::from).collect()
        })
        .collect()
}

fn dot(a: &[f64], x: &[f32]) -> f64 {
    a.iter().zip(x).map(|(a, x)| a * *x as f64).sum()
}

fn act(a: Act, v: f64) -> f64 {
    match a {
        Act::None => v,
        Act::Relu => v.max(0.0),
        Act::Silu => v / (1.0 + (-v).exp()),
        Act::Gelu => {
            let c = (2.0 / std::f64::consts::PI).sqrt();
            0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
        }
        Act::GeluErf => 0.5 * v * (1.0 + libm::erf(v / std::f64::consts::SQRT_2)),
    }
}

/// |got − want| within REL_TOL of `scale` (the size of the terms summed) for every element.
fn assert_close(got: &[f32], want: &[f64], scale: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = REL_TOL * scale.max(w.abs()) + ABS_TOL * scale;
        assert!(
            (*g as f64 - w).abs() <= bound,
            "{what}[{i}]: emulator {g} vs float64 {w} (bound {bound:.2e})"
        );
    }
}

/// `x` uploaded, and quantized on the device when `dtype` is a quantized format.
fn upload_x(dev: &EmuBackend, dtype: DType, x: &[f32]) -> (HostBuf<f32>, Option<HostBuf<u8>>) {
    let dx = dev.upload(x).unwrap();
    let dq = dtype.is_quantized().then(|| {
        let mut q = dev.zeros::<u8>(x.len() / 32 * XQ_BLOCK).unwrap();
        dev.quantize_x(&dx, &mut q).unwrap();
        q
    });
    (dx, dq)
}

/// The down pass's float64 reference: `y0 + Σ_k h[k] · down_t[hot[k]]` (`dd`: down_t decoded).
fn down_reference(dd: &[Vec<f64>], hot: &[u32], h: &[f32], y0: &[f32]) -> Vec<f64> {
    (0..y0.len())
        .map(|c| {
            let s: f64 = hot
                .iter()
                .zip(h)
                .map(|(&i, &a)| a as f64 * dd[i as usize][c])
                .sum();
            y0[c] as f64 + s
        })
        .collect()
}

/// Columns for a format: odd for float formats, an odd number of blocks otherwise.
fn cols_for(dtype: DType) -> usize {
    if dtype.is_super_block() {
        256 * 3
    } else if dtype.is_quantized() {
        32 * 11
    } else {
        203
    }
}

/// Every entry the kernel modules define (`ops::SOURCES`).
fn all_entries() -> BTreeSet<String> {
    ops::SOURCES.iter().flat_map(|m| m.entries()).collect()
}

#[test]
fn the_emulator_holds_exactly_the_modules_kernels_and_its_selftests() {
    let have = emu_entries();
    let selftests: BTreeSet<String> = have
        .iter()
        .filter(|e| e.starts_with("emu_selftest_"))
        .cloned()
        .collect();
    assert_eq!(selftests.len(), 2, "{selftests:?}");
    let kernels: BTreeSet<String> = have.difference(&selftests).cloned().collect();
    assert_eq!(kernels, all_entries());
}

/// Row kernels: sparse_matvec (index list, dense, and the flags read through slab ids),
/// gate_up and axpy_rows over the slabs of a partial last slab, split 1 and 3 ways.
fn row_kernels(dev: &EmuBackend, dtype: DType) {
    let (rows, cols) = (45, cols_for(dtype));
    let w = weight(dtype, rows, cols, 1);
    let wd = decoded(&w);
    let x0 = values(cols, 2);
    // The reference multiplies the x the kernels do (int16 for the quantized formats).
    let x = x_hat(dtype, &x0);
    let scale = (cols as f64).sqrt();
    let idx: Vec<i32> = (0..rows as i32).rev().filter(|i| i % 4 != 1).collect();
    let dw = dev.upload_weight(&w).unwrap();
    let (dx, dq) = upload_x(dev, dtype, &x0);
    let xin = XIn {
        x: &dx,
        q: dq.as_ref(),
    };
    let didx = dev.upload(&idx).unwrap();
    let mut dy = dev.zeros::<f32>(idx.len()).unwrap();
    dev.matvec_rows(&dw, xin, Some(&didx), idx.len(), Act::Silu, &mut dy)
        .unwrap();
    let want: Vec<f64> = idx
        .iter()
        .map(|&r| act(Act::Silu, dot(&wd[r as usize], &x)))
        .collect();
    assert_close(
        &dev.download(&dy).unwrap(),
        &want,
        scale,
        &format!("sparse_matvec {dtype}"),
    );

    // Gate/up/down_t slabs of 8 over 29 hot neurons of 45 (a partial last slab: padding ids
    // −1), every third hot neuron inactive.
    let (ffn, dim) = (rows, cols);
    let (gate, up, down_t) = (
        w.clone(),
        weight(dtype, ffn, dim, 3),
        weight(dtype, ffn, dim, 4),
    );
    let (ud, dd) = (decoded(&up), decoded(&down_t));
    let hot: Vec<u32> = (0..ffn as u32).filter(|i| i % 3 != 2).collect();
    let flags: Vec<i32> = (0..ffn as i32).map(|i| i32::from(i % 3 != 0)).collect();
    let hf = dev
        .upload_hot_ffn(&gate, Some(&up), &down_t, &hot, 8)
        .unwrap();
    assert!(hf.layout.n_slabs * 8 > hot.len(), "a partial slab");
    let dflags = dev.upload(&flags).unwrap();
    let mut h = dev.zeros::<f32>(hot.len()).unwrap();
    let relu = FfnAct::from(Act::Relu);
    dev.hot_gate_up(&hf, xin, Some(&dflags), relu, None, &mut h)
        .unwrap();
    let want_h: Vec<f64> = hot
        .iter()
        .map(|&i| {
            let i = i as usize;
            if flags[i] == 0 {
                return 0.0;
            }
            act(Act::Relu, dot(&wd[i], &x)) * dot(&ud[i], &x)
        })
        .collect();
    let got_h = dev.download(&h).unwrap();
    assert_close(&got_h, &want_h, scale * scale, &format!("gate_up {dtype}"));
    let mut part = dev.zeros::<f32>(3 * dim).unwrap();
    for splits in [1, 3] {
        let y0 = values(dim, 5);
        let mut dy = dev.upload(&y0).unwrap();
        dev.hot_down(&hf, &h, &mut part, &mut dy, splits).unwrap();
        let want = down_reference(&dd, &hot, &got_h, &y0);
        let amax = got_h.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
        let what = format!("axpy_rows {dtype} in {splits} splits");
        assert_close(
            &dev.download(&dy).unwrap(),
            &want,
            amax * (hot.len() as f64).sqrt(),
            &what,
        );
    }

    // Predictor mode's path: the active slots gathered on the GPU, gate_up over them (the
    // same bits as over every slot with flags), the nonzero activations gathered, and the
    // down pass over those rows.
    let mut slots = Compacted::zeros(dev, hf.layout.n_hot, false).unwrap();
    dev.active_slots(&hf, &dflags, &mut slots).unwrap();
    let active: Vec<usize> = (0..hot.len())
        .filter(|&s| flags[hot[s] as usize] != 0)
        .collect();
    assert_eq!(dev.download(&slots.count).unwrap(), [active.len() as i32]);
    let got_slots = dev.download(&slots.idx).unwrap();
    assert_eq!(
        got_slots[..active.len()],
        active.iter().map(|&s| s as i32).collect::<Vec<_>>()
    );
    let mut hl = dev.upload(&vec![7f32; hot.len()]).unwrap();
    dev.hot_gate_up_listed(&hf, xin, &slots, relu, None, &mut hl)
        .unwrap();
    let got_hl = dev.download(&hl).unwrap();
    for (k, &s) in active.iter().enumerate() {
        assert_eq!(
            got_hl[k].to_bits(),
            got_h[s].to_bits(),
            "gate_up listed {dtype}[{k}]"
        );
    }
    assert!(
        got_hl[active.len()..].iter().all(|&v| v == 7.0),
        "{dtype}: past the count"
    );
    let mut rows = Compacted::zeros(dev, hf.layout.n_hot, true).unwrap();
    dev.nonzero_rows(&hf, &hl, Some(&slots), &mut rows).unwrap();
    let nonzero: Vec<usize> = active
        .iter()
        .copied()
        .filter(|&s| got_h[s] != 0.0)
        .collect();
    assert_eq!(dev.download(&rows.count).unwrap(), [nonzero.len() as i32]);
    let y0 = values(dim, 6);
    let mut dy = dev.upload(&y0).unwrap();
    dev.hot_down_listed(&hf, &rows, &mut part, &mut dy, 3)
        .unwrap();
    let want = down_reference(&dd, &hot, &got_h, &y0);
    let amax = got_h.iter().fold(1f32, |m, v| m.max(v.abs())) as f64;
    let what = format!("axpy_rows {dtype} over the nonzero rows");
    let scale = amax * (hot.len() as f64).sqrt();
    assert_close(&dev.download(&dy).unwrap(), &want, scale, &what);

    // sparse_matvec's flag path (ids read through the slabs' id rows), launched directly:
    // the gate rows of the slabs, inactive and padding slots 0.
    let n_slots = hf.layout.n_slabs * 8;
    let mut out = dev.zeros::<f32>(n_slots).unwrap();
    let launch = SparseMatvec {
        dtype,
        w: &hf.data,
        l: hf.layout.gate,
        x: match &dq {
            Some(q) => XArg::Quant(q),
            None => XArg::F32(&dx),
        },
        cols,
        idx: None,
        n: n_slots,
        ids: Some((&hf.data, hf.layout.ids)),
        flags: Some(&dflags),
        act: Act::None,
        accumulate: false,
        y: &mut out,
    };
    dev.run(launch.spec(dev).unwrap()).unwrap();
    let want: Vec<f64> = (0..n_slots)
        .map(|r| match hot.get(r) {
            Some(&i) if flags[i as usize] != 0 => dot(&wd[i as usize], &x),
            _ => 0.0,
        })
        .collect();
    let what = format!("sparse_matvec {dtype} with flags");
    assert_close(&dev.download(&out).unwrap(), &want, scale, &what);
}

/// The predictor: fc1 (F16, a sparse_matvec launch with ReLU), then fc2_t in `dtype`.
fn predictor(dev: &EmuBackend, dtype: DType) {
    let (dim, rank) = (96, 37);
    let ffn = if dtype.is_super_block() { 512 } else { 32 * 9 };
    let fc1 = weight(DType::F16, rank, dim, 10);
    let fc2_t = weight(dtype, rank, ffn, 11);
    let (f1, f2) = (decoded(&fc1), decoded(&fc2_t));
    let x = values(dim, 12);
    let hidden: Vec<f64> = f1.iter().map(|r| dot(r, &x).max(0.0)).collect();
    let logits: Vec<f64> = (0..ffn)
        .map(|j| (0..rank).map(|h| hidden[h] * f2[h][j]).sum())
        .collect();
    let t = 0.05;
    let (got, flags) = run_predictor(dev, &fc1, &fc2_t, &x, t);
    assert_close(&got, &logits, 4.0, &format!("predictor {dtype}"));
    for (j, l) in logits.iter().enumerate() {
        if (l - t as f64).abs() > 1e-3 {
            assert_eq!(flags[j] != 0, *l >= t as f64, "{dtype} flag {j}");
        }
    }
}

/// The elementwise kernels past one block: add, threshold_mask, softcap, copy, fill, and the
/// routing kernels of a mixture of experts.
fn elementwise(dev: &EmuBackend) {
    let n = 1999;
    let (g, u) = (values(n, 15), values(n, 16));
    let du = dev.upload(&u).unwrap();
    let mut dg = dev.upload(&g).unwrap();
    dev.add(&mut dg, &du).unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(g, u)| *g as f64 + *u as f64)
        .collect();
    assert_close(&dev.download(&dg).unwrap(), &want, 1.0, "add");
    dev.threshold_mask(&mut dg, n - 2, 0.5).unwrap();
    let got = dev.download(&dg).unwrap();
    for (i, (v, w)) in got.iter().zip(&want).enumerate() {
        let w = if i < n - 2 && w.abs() < 0.5 { 0.0 } else { *w };
        assert!((*v as f64 - w).abs() < 1e-6, "threshold_mask[{i}]");
    }
    // softcap (cap 1.5 over sums reaching ±2) over n − 3 values, then a copy of the result.
    let mut dg = dev.upload(&got).unwrap();
    dev.softcap(&mut dg, n - 3, 1.5).unwrap();
    let want: Vec<f64> = got
        .iter()
        .enumerate()
        .map(|(i, &v)| match i < n - 3 {
            true => 1.5 * (v as f64 / 1.5).tanh(),
            false => v as f64,
        })
        .collect();
    assert_close(&dev.download(&dg).unwrap(), &want, 1.0, "softcap");
    let mut dst = dev.upload(&vec![3f32; n + 2]).unwrap();
    dev.copy(&mut dst, &dg).unwrap();
    let copied = dev.download(&dst).unwrap();
    assert_eq!(copied[..n], dev.download(&dg).unwrap()[..]);
    assert_eq!(copied[n..], [3.0, 3.0]);
    dev.fill(&mut dst, -0.25).unwrap();
    assert_eq!(dev.download(&dst).unwrap(), vec![-0.25; n + 2], "fill");
    experts(dev);
}

/// A mixture of experts' routing kernels past one block: 37 experts of 23 neurons and a shared
/// expert of 40 (891 flags); the weights of every third expert nonzero.
fn experts(dev: &EmuBackend) {
    let (n, ef, sf) = (37usize, 23usize, 40usize);
    let (routed, all) = (n * ef, n * ef + sf);
    let w: Vec<f32> = (0..=n)
        .map(|e| {
            if e % 3 == 0 {
                0.1 + e as f32 / 10.0
            } else {
                0.0
            }
        })
        .collect();
    let expert = |id: usize| if id < routed { id / ef } else { n };
    let dw = dev.upload(&w).unwrap();
    let mut flags = dev.upload(&vec![9i32; all]).unwrap();
    dev.expert_flags(&dw, ef, routed, &mut flags).unwrap();
    let want: Vec<i32> = (0..all).map(|j| i32::from(w[expert(j)] != 0.0)).collect();
    assert_eq!(dev.download(&flags).unwrap(), want, "expert_flags");
    let g = powerinfer_core::testing::random_weight(DType::F16, all, 32, 4);
    let ids: Vec<u32> = (0..all as u32).filter(|i| i % 2 == 1).collect();
    let hot = dev.upload_hot_ffn(&g, None, &g, &ids, 16).unwrap();
    let h0 = values(ids.len() + 5, 19);
    let mut dh = dev.upload(&h0).unwrap();
    dev.expert_scale(&hot, &dw, ef, routed, &mut dh).unwrap();
    let want: Vec<f64> = h0
        .iter()
        .enumerate()
        .map(|(s, &v)| match ids.get(s) {
            Some(&id) => v as f64 * w[expert(id as usize)] as f64,
            None => v as f64,
        })
        .collect();
    assert_close(&dev.download(&dh).unwrap(), &want, 1.0, "expert_scale");
}

/// RMSNorm over rows longer than the block (4097 > 1024 threads), RoPE with an odd number of
/// pairs, and attention over a long context in f16 and f32 caches.
fn norm_rope_attention(dev: &EmuBackend) {
    let n = 4097;
    let (x, w) = (values(2 * n, 17), values(n, 18));
    let (dx, dw) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
    let mut out = dev.zeros::<f32>(2 * n).unwrap();
    dev.rms_norm(&dx, &dw, 2, 1e-6, &mut out).unwrap();
    let mut want = vec![0f64; 2 * n];
    for r in 0..2 {
        let row = &x[r * n..(r + 1) * n];
        let ms: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            want[r * n + i] = row[i] as f64 / (ms + 1e-6).sqrt() * w[i] as f64;
        }
    }
    assert_close(&dev.download(&out).unwrap(), &want, 1.0, "rms_norm 4097");
    let b = values(n, 25);
    let db = dev.upload(&b).unwrap();
    dev.norm(&dx, &dw, Some(&db), 2, 1e-5, &mut out, None)
        .unwrap();
    for r in 0..2 {
        let row = &x[r * n..(r + 1) * n];
        let m = row.iter().map(|v| *v as f64).sum::<f64>() / n as f64;
        let var = row.iter().map(|v| (*v as f64 - m).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            let v = (row[i] as f64 - m) / (var + 1e-5).sqrt();
            want[r * n + i] = v * w[i] as f64 + b[i] as f64;
        }
    }
    assert_close(&dev.download(&out).unwrap(), &want, 1.0, "layer_norm 4097");

    let (hd, heads, pos) = (80, 3, 40_001);
    let inv: Vec<f64> = (0..hd / 2)
        .map(|i| 500_000f64.powf(-2.0 * i as f64 / hd as f64))
        .collect();
    // The magnitude (YaRN's attention factor) scales the rotated values.
    let mscale = 1.25;
    let freqs = powerinfer_core::RopeFreqs {
        inv: inv.clone(),
        mscale,
    };
    for style in [
        powerinfer_core::RopeStyle::Norm,
        powerinfer_core::RopeStyle::Neox,
    ] {
        let q = values(hd * heads, 19);
        let mut dq = dev.upload(&q).unwrap();
        dev.rope(&mut dq, None, hd, pos, &freqs, style, None)
            .unwrap();
        let mut want: Vec<f64> = q.iter().map(|v| *v as f64).collect();
        for head in want.chunks_exact_mut(hd) {
            for (i, f) in inv.iter().enumerate() {
                let (s, c) = (pos as f64 * f).sin_cos();
                let (s, c) = (s * mscale, c * mscale);
                let (a, b) = match style {
                    powerinfer_core::RopeStyle::Norm => (2 * i, 2 * i + 1),
                    powerinfer_core::RopeStyle::Neox => (i, i + hd / 2),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
        assert_close(
            &dev.download(&dq).unwrap(),
            &want,
            1.0,
            &format!("rope {style:?}"),
        );
    }

    long_attention::<u16>(dev);
    long_attention::<f32>(dev);
    sink_attention(dev);
}

/// Attention with a sink logit per head (gpt-oss) below, near and above the head's scores, in
/// one chunk (the decode kernel adds the sink) and in three (attention_merge adds it), over a
/// sliding window of an f16 cache.
fn sink_attention(dev: &EmuBackend) {
    let (nh, nkv, hd, n_pos) = (6, 2, 64, 150);
    let p = AttnParams {
        window: Some(140),
        ..AttnParams::new(nh, nkv, hd)
    };
    let (first, kv) = (n_pos - 140, nkv * hd);
    let kb: Vec<u16> = values(n_pos * kv, 30)
        .iter()
        .map(|v| u16::from_f32(2.0 * v))
        .collect();
    let vb: Vec<u16> = values(n_pos * kv, 31)
        .iter()
        .map(|&v| u16::from_f32(v))
        .collect();
    let (ck, cv) = (dev.upload(&kb).unwrap(), dev.upload(&vb).unwrap());
    let q: Vec<f32> = values(nh * hd, 32).iter().map(|v| 4.0 * v).collect();
    let dq = dev.upload(&q).unwrap();
    let f = |b: u16| b.to_f32() as f64;
    let (kf, vf) = (|i: usize| f(kb[i]), |i: usize| f(vb[i]));
    let scale = 1.0 / (hd as f64).sqrt();
    // Each head's highest and lowest score over the window.
    let scores: Vec<(f64, f64)> = (0..nh)
        .map(|h| {
            let g = h / (nh / nkv);
            (first..n_pos)
                .map(|t| {
                    (0..hd)
                        .map(|i| q[h * hd + i] as f64 * kf(t * kv + g * hd + i))
                        .sum::<f64>()
                        * scale
                })
                .fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)))
        })
        .collect();
    let plain = attention_ref(&q, kf, vf, (nkv, hd), first, n_pos, scale, None, None);
    for (place, at) in [("below", 0usize), ("near", 1), ("above", 2)] {
        let sinks: Vec<f32> = scores
            .iter()
            .map(|&(lo, hi)| [lo - 20.0, hi - 0.1, hi + 12.0][at] as f32)
            .collect();
        let ds = dev.upload(&sinks).unwrap();
        let want = attention_ref(
            &q,
            kf,
            vf,
            (nkv, hd),
            first,
            n_pos,
            scale,
            None,
            Some(&sinks),
        );
        if at > 0 {
            let moved = plain
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(
                moved > 1e-2,
                "a sink {place} the scores changes the output ({moved})"
            );
        }
        for parts in [0, 3] {
            let mut part = dev.zeros::<f32>(parts * nh * (hd + 2)).unwrap();
            let mut out = dev.zeros::<f32>(nh * hd).unwrap();
            dev.attention(&dq, &ck, &cv, n_pos, &p, Some(&ds), &mut part, &mut out)
                .unwrap();
            let what = format!("attention with sinks {place} the scores, {parts} partial states");
            assert_close(&dev.download(&out).unwrap(), &want, 1.0, &what);
        }
    }
}

/// Attention over a long context in caches of `T` (written straight into the caches), and
/// kv_store into them.
fn long_attention<T: KvElem>(dev: &EmuBackend) {
    // 6 query heads over 2 kv heads of 128, 3001 positions of a 3100-position cache: the last
    // 2049 of them (a sliding window), scores soft-capped at 4.
    let (nh, nkv, hd, n_pos, ctx) = (6, 2, 128, 3001, 3100);
    let (first, cap) = (3001 - 2049, 4.0);
    let p = AttnParams {
        window: Some(2049),
        softcap: Some(cap as f32),
        ..AttnParams::new(nh, nkv, hd)
    };
    let kv = nkv * hd;
    let bits = |seed| -> Vec<T> {
        values(ctx * kv, seed)
            .iter()
            .map(|v| T::from_f32(2.0 * v))
            .collect()
    };
    let (kb, vb) = (bits(20), bits(21));
    let (ck, cv) = (dev.upload(&kb).unwrap(), dev.upload(&vb).unwrap());
    let q = values(nh * hd, 22);
    let dq = dev.upload(&q).unwrap();
    let mut out = dev.zeros::<f32>(nh * hd).unwrap();
    let mut part = dev
        .zeros::<f32>(powerinfer_cuda::layout::att_part_len(nh, hd, ctx))
        .unwrap();
    dev.attention(&dq, &ck, &cv, n_pos, &p, None, &mut part, &mut out)
        .unwrap();
    let f = |b: T| b.to_f32() as f64;
    let (kf, vf) = (|i: usize| f(kb[i]), |i: usize| f(vb[i]));
    let scale = 1.0 / (hd as f64).sqrt();
    let want = attention_ref(&q, kf, vf, (nkv, hd), first, n_pos, scale, Some(cap), None);
    assert_close(
        &dev.download(&out).unwrap(),
        &want,
        1.0,
        &format!(
            "attention over the last 2049 of 3001 positions of {}, soft-capped",
            T::NAME
        ),
    );

    // kv_store: one position's k and v as the cache stores them (f16: rounded), in place.
    let (k, v) = (values(kv, 23), values(kv, 24));
    let (dk, dv) = (dev.upload(&k).unwrap(), dev.upload(&v).unwrap());
    let (mut ck, mut cv) = (dev.upload(&kb).unwrap(), dev.upload(&vb).unwrap());
    dev.kv_store(&dk, &dv, ctx - 1, &mut ck, &mut cv).unwrap();
    let got = dev.download(&ck).unwrap();
    let want: Vec<T> = k.iter().map(|x| T::from_f32(*x)).collect();
    assert_eq!(got[(ctx - 1) * kv..], want[..]);
    assert_eq!(got[..(ctx - 1) * kv], kb[..(ctx - 1) * kv]);
}

/// The tiled down pass over rows wider than one block's 32 units (9 blocks along the row, the
/// last partial), against float64, in one split and in two.
fn wide_down(dev: &EmuBackend, dtype: DType) {
    use powerinfer_cuda::launch_spec::{row_tile, tile_geometry};
    let tile = row_tile(dtype);
    // 257 units (F32: the last one partial); the K-quants' rows are whole super-blocks: 33
    // of them, 264 units.
    let dim = match dtype {
        DType::F32 => 256 * tile + 3,
        d if d.block_size() == 256 => 33 * 256,
        _ => 257 * tile,
    };
    let geometry = tile_geometry(dtype, dim).unwrap();
    let want = (dim.div_ceil(tile).div_ceil(32) as u32, 32, 256 * tile * 4);
    assert_eq!(geometry, want, "{dtype}: 8 row lanes of 32 units");
    let ffn = 11;
    let down_t = weight(dtype, ffn, dim, 21);
    let dd = decoded(&down_t);
    let hot: Vec<u32> = vec![3, 0, 9, 4, 10, 1, 7];
    let mut h = values(hot.len(), 22);
    h[2] = 0.0;
    let hf = dev.upload_hot_ffn(&down_t, None, &down_t, &hot, 4).unwrap();
    let dh = dev.upload(&[h.clone(), vec![0.0; 1]].concat()).unwrap();
    let mut part = dev.zeros::<f32>(2 * dim).unwrap();
    for splits in [1, 2] {
        let y0 = values(dim, 23);
        let mut dy = dev.upload(&y0).unwrap();
        dev.hot_down(&hf, &dh, &mut part, &mut dy, splits).unwrap();
        let want = down_reference(&dd, &hot, &h, &y0);
        let what = format!("wide axpy_rows {dtype} in {splits} splits");
        assert_close(&dev.download(&dy).unwrap(), &want, 4.0, &what);
    }
}

/// The down pass over splits longer than the block's coefficient chunk (256 rows): one split of
/// 601 hot rows (three chunks, the last partial), then two of 301 and 300; a third of the
/// coefficients zero (every third, a run of ten, the last), rows 255 and 511 (the chunks' last)
/// nonzero, the hot ids out of order; against float64, and the same bits on a second run.
fn long_splits(dev: &EmuBackend, dtype: DType) {
    let (ffn, dim) = (640, cols_for(dtype));
    let down_t = weight(dtype, ffn, dim, 31);
    let dd = decoded(&down_t);
    let hot: Vec<u32> = (0..601u32).map(|i| (i * 37 + 11) % ffn as u32).collect();
    let mut h = values(hot.len(), 32);
    for (i, v) in h.iter_mut().enumerate() {
        if i % 3 == 2 || (240..250).contains(&i) || i == 600 {
            *v = 0.0;
        }
    }
    let hf = dev
        .upload_hot_ffn(&down_t, None, &down_t, &hot, 16)
        .unwrap();
    let dh = dev.upload(&[h.clone(), vec![0.0; 15]].concat()).unwrap();
    let mut part = dev.zeros::<f32>(2 * dim).unwrap();
    for splits in [1, 2] {
        let y0 = values(dim, 33);
        let want = down_reference(&dd, &hot, &h, &y0);
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut dy = dev.upload(&y0).unwrap();
            dev.hot_down(&hf, &dh, &mut part, &mut dy, splits).unwrap();
            runs.push(dev.download(&dy).unwrap());
        }
        let what = format!("axpy_rows {dtype}, 601 rows in {splits} splits");
        assert_close(&runs[0], &want, 4.0 * (hot.len() as f64).sqrt(), &what);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&runs[0]), bits(&runs[1]), "{what}: two runs differ");
    }
    // The same rows gathered on the GPU (391 nonzero of 601: one round of 2,048 entries, 4 live
    // splits of 128 rows at most), then summed over the list, twice.
    let mut rows = Compacted::zeros(dev, hf.layout.n_hot, true).unwrap();
    dev.nonzero_rows(&hf, &dh, None, &mut rows).unwrap();
    let nz: Vec<usize> = (0..h.len()).filter(|&k| h[k] != 0.0).collect();
    assert_eq!(dev.download(&rows.count).unwrap(), [nz.len() as i32]);
    let idx = dev.download(&rows.idx).unwrap();
    let a = dev.download(rows.a.as_ref().unwrap()).unwrap();
    assert_eq!(
        idx[..nz.len()],
        nz.iter().map(|&k| k as i32).collect::<Vec<_>>()
    );
    assert!(nz
        .iter()
        .zip(&a)
        .all(|(&k, &v)| v.to_bits() == h[k].to_bits()));
    let mut part = dev.zeros::<f32>(8 * dim).unwrap();
    for splits in [1, 2, 8] {
        let y0 = values(dim, 34);
        let want = down_reference(&dd, &hot, &h, &y0);
        let mut runs = Vec::new();
        for _ in 0..2 {
            let mut dy = dev.upload(&y0).unwrap();
            dev.hot_down_listed(&hf, &rows, &mut part, &mut dy, splits)
                .unwrap();
            runs.push(dev.download(&dy).unwrap());
        }
        let what = format!(
            "listed axpy_rows {dtype}, {} rows, {splits} splits",
            nz.len()
        );
        assert_close(&runs[0], &want, 4.0 * (hot.len() as f64).sqrt(), &what);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&runs[0]), bits(&runs[1]), "{what}: two runs differ");
    }
}

/// quantize_x against its rule computed here: per 32 values the high and low bytes of
/// q = round(x · 32639 / max|x|) (ties to even), the scale, each half's sum and Σq; a block of
/// zeros gives zeros, one holding a NaN or an infinity a NaN scale and sums; 13 blocks, past one
/// CUDA block of 8 warps.
#[test]
fn quantize_x_writes_the_int16_blocks_of_its_rule() {
    let dev = EmuBackend::default();
    let mut x = values(13 * 32, 40);
    // Ties: 32639 / 2 · k / 32639 ... a block whose max is 2, with values at exact halves of a
    // step (q = v · 32639 / 2 = 0.5, 1.5, 2.5: ties to even 0, 2, 2).
    x[32..64].fill(0.0);
    x[64] = 2.0;
    for (k, v) in [0.5f32, 1.5, 2.5].iter().enumerate() {
        x[65 + k] = v * 2.0 / 32639.0;
    }
    x[96..128].fill(0.0);
    x[100] = f32::NAN;
    x[160] = f32::INFINITY;
    // A block so small that 32639 / max|x| overflows: zeros.
    x[224..256].fill(-3e-36);
    let dx = dev.upload(&x).unwrap();
    let mut dq = dev.zeros::<u8>(13 * XQ_BLOCK).unwrap();
    dev.quantize_x(&dx, &mut dq).unwrap();
    let q = dev.download(&dq).unwrap();
    let f = |b: &[u8], at: usize| f32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    for (i, (v, b)) in x.chunks(32).zip(q.chunks(XQ_BLOCK)).enumerate() {
        let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
        let finite = v.iter().all(|a| a.is_finite());
        let inv = match 32639.0 / amax {
            inv if amax > 0.0 && inv.is_finite() => inv,
            _ => 0.0,
        };
        let mut qsum = 0;
        for (j, a) in v.iter().enumerate() {
            let want = if finite {
                (a * inv).round_ties_even() as i32
            } else {
                0
            };
            let got = 256 * i32::from(b[j] as i8) + i32::from(b[32 + j] as i8);
            assert_eq!(got, want, "block {i} value {j} ({a})");
            assert_ne!(b[j] as i8, i8::MIN, "h stays within a signed byte");
            qsum += want;
        }
        let sums = (f(b, 68), f(b, 72));
        if !finite {
            assert!(
                f(b, 64).is_nan() && sums.0.is_nan() && sums.1.is_nan(),
                "block {i}"
            );
            continue;
        }
        assert_eq!(f(b, 64), amax / 32639.0, "block {i} scale");
        let (lo, hi): (f64, f64) = (
            v[..16].iter().map(|&a| a as f64).sum(),
            v[16..].iter().map(|&a| a as f64).sum(),
        );
        assert!((sums.0 as f64 - lo).abs() < 1e-5 && (sums.1 as f64 - hi).abs() < 1e-5);
        assert_eq!(
            i32::from_le_bytes(b[76..80].try_into().unwrap()),
            qsum,
            "block {i}"
        );
    }
    // The ties of block 2.
    let q2 = |j: usize| {
        256 * i32::from(q[2 * XQ_BLOCK + j] as i8) + i32::from(q[2 * XQ_BLOCK + 32 + j] as i8)
    };
    assert_eq!([q2(0), q2(1), q2(2), q2(3)], [32639, 0, 2, 2]);
    // Not whole blocks, or too few bytes: refused before a launch.
    let d33 = dev.upload(&values(33, 1)).unwrap();
    assert!(matches!(
        dev.quantize_x(&d33, &mut dq),
        Err(Error::Shape(_))
    ));
    let mut short = dev.zeros::<u8>(13 * XQ_BLOCK - 1).unwrap();
    assert!(matches!(
        dev.quantize_x(&dx, &mut short),
        Err(Error::Shape(_))
    ));
}

#[test]
fn down_pass_splits_longer_than_one_chunk() {
    let dev = EmuBackend::default();
    for dtype in [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q5_1,
        DType::Q6_K,
    ] {
        long_splits(&dev, dtype);
    }
}

#[test]
fn every_entry_runs_against_float64_references_and_the_set_is_kernels_all() {
    let dev = EmuBackend::default();
    for dtype in GPU_DTYPES {
        row_kernels(&dev, dtype);
        predictor(&dev, dtype);
        wide_down(&dev, dtype);
        println!("{dtype}: ok on {}", dev.describe());
    }
    elementwise(&dev);
    norm_rope_attention(&dev);
    assert_eq!(dev.launched(), all_entries());
}

/// A spec for `add` over `n` floats (the simplest launch), to break in the tests below.
fn add_spec(dev: &EmuBackend, y: &mut <EmuBackend as Backend>::Buf<f32>, n: usize) -> LaunchSpec {
    let x = dev.zeros::<f32>(n).unwrap();
    let launch = PairKernel {
        op: Pair::Add,
        y,
        x: &x,
        n,
    };
    launch.spec(dev).unwrap()
}

fn emu_error(dev: &EmuBackend, spec: LaunchSpec) -> String {
    match dev.run(spec) {
        Err(Error::Cuda(m)) => m,
        other => panic!("expected a gpu-emu error, got {other:?}"),
    }
}

#[test]
fn launches_cuda_would_refuse_are_errors() {
    let dev = EmuBackend::default();
    let mut y = dev.zeros::<f32>(10).unwrap();

    let mut s = add_spec(&dev, &mut y, 10);
    s.entry = "no_such_kernel".into();
    assert!(emu_error(&dev, s).contains("no kernel no_such_kernel"));

    // One argument short, and an int where the kernel takes a pointer (two swapped arguments
    // of different widths).
    let mut s = add_spec(&dev, &mut y, 10);
    let mut a = KernelArgs::default();
    a.ptr(0).ptr(0);
    s.args = a;
    let m = emu_error(&dev, s);
    assert!(m.contains("2 arguments, the kernel takes 3"), "{m}");
    let mut s = add_spec(&dev, &mut y, 10);
    let mut a = KernelArgs::default();
    a.ptr(0).i32(10).ptr(0);
    s.args = a;
    let m = emu_error(&dev, s);
    assert!(
        m.contains("argument 1 is 4 bytes, the kernel's parameter 8"),
        "{m}"
    );

    let mut s = add_spec(&dev, &mut y, 10);
    s.block = [2048, 1, 1];
    assert!(emu_error(&dev, s).contains("invalid launch"));
    let mut s = add_spec(&dev, &mut y, 10);
    s.grid = [1, 70_000, 1];
    assert!(emu_error(&dev, s).contains("invalid launch"));
    let mut s = add_spec(&dev, &mut y, 10);
    s.shared_bytes = 48 * 1024 + 4;
    assert!(emu_error(&dev, s).contains("exceed 48 KiB"));

    // x of 12,288 F16 columns is staged in exactly 48 KiB of dynamic shared memory, the most a
    // block may have; the static arrays of rms_norm plus 48 KiB would not fit.
    let x_smem = powerinfer_cuda::launch_spec::x_smem;
    assert_eq!(x_smem(DType::F16, MAX_X_BYTES / 4), 48 * 1024);
    assert_eq!(x_smem(DType::F16, MAX_X_BYTES / 4 + 1), 0);
    // Quantized x takes 80 bytes per 32 values: 19,648 columns stage 49,120 bytes; 19,680 do
    // not.
    assert_eq!(x_smem(DType::Q4_0, 19648), 49120);
    assert_eq!(x_smem(DType::Q4_0, 19680), 0);
    let (x, w) = (dev.zeros::<f32>(64).unwrap(), dev.zeros::<f32>(64).unwrap());
    let mut out = dev.zeros::<f32>(64).unwrap();
    let launch = Norm {
        x: &x,
        w: &w,
        bias: None,
        rows: 1,
        n: 64,
        eps: 1e-5,
        out: &mut out,
        xq: None,
    };
    let mut s = launch.spec(&dev).unwrap();
    s.shared_bytes = 48 * 1024;
    let m = emu_error(&dev, s);
    assert!(m.contains("static") && m.contains("exceed 48 KiB"), "{m}");
}

/// A shuffle reading lanes that returned (emu/selftest.cu); the barrier deadlock is
/// tests/emu_deadlock.rs (it needs a short barrier timeout, set for its whole process).
#[test]
fn kernels_that_break_the_rules_are_reported() {
    let dev = EmuBackend::default();
    let mut out = dev.zeros::<f32>(2).unwrap();
    let mut a = KernelArgs::default();
    a.ptr(dev.addr_mut(&mut out));
    let entry = "emu_selftest_shuffle_after_return".into();
    let spec = LaunchSpec::new(&ops::elementwise::launch::SOURCE, entry, [1, 1], 64, 0, a);
    let m = emu_error(&dev, spec);
    assert!(m.contains("returned before the shuffle"), "{m}");
}
