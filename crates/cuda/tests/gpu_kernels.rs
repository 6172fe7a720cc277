//! Every kernel against the CPU crate's scalar references on random odd-sized data, every weight
//! format the GPU takes ([`GPU_DTYPES`]: the float formats, Q8_0, the Q4/Q5 32-weight formats and
//! the K-quants Q4_K, Q5_K, Q6_K), on every backend: each test body is generic over [`Backend`]
//! and [`on_each_backend!`] runs it on the host backend (always) and on every CUDA device there
//! is (with the `cuda` feature), printing "skipped: no CUDA device" for the CUDA part where there
//! is none — as in CI. The per-format tests print "<test> <format>: ok on <device>" for each
//! format they checked; benchmarks/gpu/check.sh looks for those lines of every format on the
//! CUDA device.

#[path = "support/attention_ref.rs"]
mod attention_ref;
use attention_ref::attention_ref;
#[path = "support/predictor_run.rs"]
mod predictor_run;
use predictor_run::run_predictor;
#[path = "support/x_hat.rs"]
mod x_hat;

use half::f16;
use powerinfer_core::{Activation, Buffer, DType, Error, RopeFreqs, RopeStyle, Weight};
use powerinfer_cpu::{reference, sparse_reference};
use powerinfer_cuda::layout::att_part_len;
use powerinfer_cuda::ops::prelude::*;
use powerinfer_cuda::{
    pack_hot_rows, pack_hot_slabs, Act, AttnParams, Backend, Compacted, DeviceWeight, FfnAct,
    HostBackend, HotFfn, KvElem, RowLayout, RowSpace, XIn, GPU_DTYPES,
};
use x_hat::x_hat;

/// Relative tolerance of GPU f32 sums against the f64 references (different summation order).
const REL_TOL: f32 = 2e-4;
/// Absolute floor of the tolerance.
const ABS_TOL: f32 = 1e-4;
/// Tolerance of attention over an f16 cache, against a reference reading the same f16 keys and
/// values.
const ATT_TOL: f32 = 2e-3;
/// Absolute tolerance of attention over an f32 cache against the reference on the exact keys
/// and values (outputs are averages of values in [-1, 1)): tighter than the f16 cache's rounding
/// moves the output.
const ATT_TOL_F32: f32 = 5e-6;

/// Run the generic test body `$body::<B>(&B)` on the host backend, on the emulator (feature
/// `emu`: the kernels' own code on the CPU), then on every CUDA device.
macro_rules! on_each_backend {
    ($body:ident) => {{
        if sanitized() {
            // The host backend's Rust is not instrumented: its plain run covers it.
            println!("skipped: the host backend (a sanitized build of the emulator)");
        } else {
            let host = HostBackend::new();
            println!("running on {}", host.describe());
            $body(&host);
        }
        on_the_emulator!($body);
        on_each_cuda_device!($body);
    }};
}

/// Whether the emulator's kernels were built under a sanitizer (`benchmarks/gpu/emu.sh
/// --sanitize`): the tests then skip what only the plain run needs.
fn sanitized() -> bool {
    powerinfer_cuda::EMU_SANITIZER.is_some()
}

/// The emulator part of [`on_each_backend!`].
#[cfg(feature = "emu")]
macro_rules! on_the_emulator {
    ($body:ident) => {{
        let emu = powerinfer_cuda::EmuBackend::default();
        println!("running on {}", emu.describe());
        $body(&emu);
    }};
}

/// The emulator part of [`on_each_backend!`] in a build without the `emu` feature.
#[cfg(not(feature = "emu"))]
macro_rules! on_the_emulator {
    ($body:ident) => {{
        println!("skipped: gpu-emu (built without the emu feature)");
    }};
}

/// The CUDA part of [`on_each_backend!`]: every device, or a printed skip.
#[cfg(feature = "cuda")]
macro_rules! on_each_cuda_device {
    ($body:ident) => {{
        let n = powerinfer_cuda::device_count();
        if n == 0 {
            println!("skipped: no CUDA device");
        }
        for ordinal in 0..n {
            let dev = powerinfer_cuda::CudaDevice::new(ordinal)
                .expect("opening a CUDA device that was counted");
            println!("running on {}", dev.describe());
            $body(&dev);
        }
    }};
}

/// The CUDA part of [`on_each_backend!`] in a build without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
macro_rules! on_each_cuda_device {
    ($body:ident) => {{
        println!("skipped: no CUDA device (built without the cuda feature)");
    }};
}

/// The bit patterns of `v` (NaNs compared as bits).
fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Deterministic pseudo-random values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    powerinfer_core::testing::pseudo_random(n, seed)
}

fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    powerinfer_core::testing::random_weight(dtype, rows, cols, seed)
}

/// Columns for a format: odd where the format allows it, else an odd number of blocks (of 32
/// weights, or 256-weight super-blocks for the K-quants).
fn cols_for(dtype: DType) -> usize {
    if dtype.is_super_block() {
        256 * 5
    } else if dtype.is_quantized() {
        32 * 13
    } else {
        301
    }
}

/// `x` on the device, with its quantized copy (`quantize_x`, on the device) for weights of a
/// quantized `dtype`: what the row operations of that format read.
struct DevX<B: Backend> {
    x: B::Buf<f32>,
    q: Option<B::Buf<u8>>,
}

impl<B: Backend> DevX<B> {
    fn new(dev: &B, dtype: DType, x: &[f32]) -> DevX<B> {
        let dx = dev.upload(x).unwrap();
        let q = dtype.is_quantized().then(|| {
            let mut q = dev
                .zeros::<u8>(powerinfer_cuda::layout::xq_bytes(x.len()))
                .unwrap();
            dev.quantize_x(&dx, &mut q).unwrap();
            q
        });
        DevX { x: dx, q }
    }

    fn arg(&self) -> XIn<'_, B> {
        XIn {
            x: &self.x,
            q: self.q.as_ref(),
        }
    }
}

/// The line check.sh looks for: test `test` passed on format `dtype` on `dev`.
fn ok<B: Backend>(dev: &B, test: &str, dtype: DType) {
    println!("{test} {dtype}: ok on {}", dev.describe());
}

fn assert_close(got: &[f32], want: &[f32], scale: f32, tol: f32, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let bound = tol * scale.max(w.abs()) + ABS_TOL;
        assert!((g - w).abs() <= bound, "{what}[{i}]: gpu {g} vs cpu {w}");
    }
}

#[test]
fn sparse_matvec_matches_reference_every_dtype() {
    on_each_backend!(sparse_matvec);
}

fn sparse_matvec<B: Backend>(dev: &B) {
    for dtype in GPU_DTYPES {
        let (rows, cols) = (157, cols_for(dtype));
        let w = weight(dtype, rows, cols, 1);
        // x as uploaded, and the x the kernels multiply (int16 for the quantized formats).
        let x0 = values(cols, 2);
        let x = x_hat(dtype, &x0);
        let idx: Vec<u32> = (0..rows as u32).filter(|i| i % 3 != 1).rev().collect();
        let mut want = vec![0f32; idx.len()];
        sparse_reference::matvec_rows(&w, &x, &idx, &mut want).unwrap();
        let dw = dev.upload_weight(&w).unwrap();
        let dx = DevX::new(dev, dtype, &x0);
        let didx = dev
            .upload(&idx.iter().map(|&i| i as i32).collect::<Vec<_>>())
            .unwrap();
        let mut dy = dev.zeros::<f32>(idx.len()).unwrap();
        dev.matvec_rows(&dw, dx.arg(), Some(&didx), idx.len(), Act::None, &mut dy)
            .unwrap();
        let got = dev.download(&dy).unwrap();
        assert_close(
            &got,
            &want,
            (cols as f32).sqrt(),
            REL_TOL,
            &format!("{dtype}"),
        );
        // Dense (no index list) with ReLU.
        let mut dense = dev.zeros::<f32>(rows).unwrap();
        dev.matvec_rows(&dw, dx.arg(), None, rows, Act::Relu, &mut dense)
            .unwrap();
        let mut all = vec![0f32; rows];
        reference::matvec(&w, &x, &mut all).unwrap();
        let relu: Vec<f32> = all.iter().map(|v| v.max(0.0)).collect();
        let got = dev.download(&dense).unwrap();
        assert_close(
            &got,
            &relu,
            (cols as f32).sqrt(),
            REL_TOL,
            &format!("{dtype} dense"),
        );
        ok(dev, "sparse_matvec", dtype);
    }
}

#[test]
fn rows_longer_than_shared_memory_read_x_in_place() {
    on_each_backend!(long_rows);
}

// ffn 14,336 (Llama-3-8B: quantized x staged, 35,840 bytes) and 28,672 (70B) as the columns
// of a dense down projection, and the longest rows still staged in shared memory: 12,288 of F16
// (48 KiB of floats), and 19,648 of Q4_0 (614 quantized blocks of 80 bytes: 49,120), then
// 19,680 (49,200) and 20,480 in every other quantized format: x read in place, and every lane
// through many load groups.
fn long_rows<B: Backend>(dev: &B) {
    for (cols, dtype) in [
        (powerinfer_cuda::MAX_X_BYTES / 4, DType::F16),
        (19648, DType::Q4_0),
        (19680, DType::Q8_0),
        (14336, DType::Q4_0),
        (28672, DType::F16),
        (28672, DType::Q4_K),
        (20480, DType::Q4_1),
        (20480, DType::Q5_0),
        (20480, DType::Q5_1),
        (20480, DType::Q5_K),
        (20480, DType::Q6_K),
    ] {
        let rows = 37;
        let w = weight(dtype, rows, cols, 3);
        // x as uploaded, and the x the kernels multiply (int16 for the quantized formats).
        let x0 = values(cols, 4);
        let x = x_hat(dtype, &x0);
        let mut want = vec![0f32; rows];
        reference::matvec(&w, &x, &mut want).unwrap();
        let (dw, dx) = (dev.upload_weight(&w).unwrap(), DevX::new(dev, dtype, &x0));
        let mut dy = dev.zeros::<f32>(rows).unwrap();
        dev.matvec_rows(&dw, dx.arg(), None, rows, Act::None, &mut dy)
            .unwrap();
        let got = dev.download(&dy).unwrap();
        let what = format!("{dtype} x {cols}");
        assert_close(&got, &want, (cols as f32).sqrt(), REL_TOL, &what);
    }
}

#[test]
fn axpy_rows_matches_reference_every_dtype() {
    on_each_backend!(axpy_rows);
}

/// The accumulation kernel (axpy_rows_<dtype>) as the hot down pass runs it: down_t rows in
/// every format in gate-less slabs of 16 (a partial last slab), coefficients given, one split
/// (in row order) and four (split sums added in split order: the same bits on a second run).
fn axpy_rows<B: Backend>(dev: &B) {
    for dtype in GPU_DTYPES {
        let (rows, cols) = (91, cols_for(dtype));
        let w = weight(dtype, rows, cols, 3);
        let idx: Vec<u32> = (0..rows as u32).step_by(2).collect();
        let mut a = values(idx.len(), 4);
        a[3] = 0.0;
        let y0 = values(cols, 5);
        let mut want = y0.clone();
        sparse_reference::axpy_rows(&w, &idx, &a, &mut want).unwrap();
        let hf = dev.upload_hot_ffn(&w, None, &w, &idx, 16).unwrap();
        assert!(hf.layout.n_slabs * 16 > idx.len(), "a partial slab");
        let da = dev.upload(&a).unwrap();
        let mut part = dev.upload(&vec![f32::NAN; 4 * cols]).unwrap();
        for splits in [1, 4] {
            let mut runs = Vec::new();
            for _ in 0..2 {
                let mut dy = dev.upload(&y0).unwrap();
                dev.hot_down(&hf, &da, &mut part, &mut dy, splits).unwrap();
                runs.push(dev.download(&dy).unwrap());
            }
            let what = format!("{dtype} splits {splits}");
            assert_close(&runs[0], &want, (idx.len() as f32).sqrt(), REL_TOL, &what);
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&runs[0]), bits(&runs[1]), "{what}: two runs differ");
        }
        let mut dy = dev.upload(&y0).unwrap();
        let mut short = dev.zeros::<f32>(4 * cols - 1).unwrap();
        let err = dev.hot_down(&hf, &da, &mut short, &mut dy, 4).unwrap_err();
        assert!(matches!(err, Error::Shape(_)), "{dtype}: short part: {err}");
        ok(dev, "axpy_rows", dtype);
    }
}

#[test]
fn hot_ffn_slabs_match_the_fused_cpu_reference() {
    on_each_backend!(hot_ffn);
}

fn hot_ffn<B: Backend>(dev: &B) {
    // Gate/up and down_t in one format each, then the mixes of a Q4_K_M file: Q4_K gate/up
    // with Q6_K or Q4_K down_t rows (dim a whole number of super-blocks), and with the Q5_0 /
    // Q8_0 down_t a K-quant down projection falls back to.
    let mixes = GPU_DTYPES
        .into_iter()
        .filter(|&d| d != DType::F32)
        .map(|d| (d, d))
        .chain([
            (DType::Q4_K, DType::Q6_K),
            (DType::Q6_K, DType::Q4_K),
            (DType::Q4_K, DType::Q5_0),
            (DType::Q4_K, DType::Q8_0),
        ]);
    for (dtype, down) in mixes {
        let ffn = 203;
        let dim = if dtype.is_super_block() || down.is_super_block() {
            256 * 3
        } else {
            32 * 7
        };
        let gate = weight(dtype, ffn, dim, 6);
        let up = weight(dtype, ffn, dim, 7);
        let down_t = weight(down, ffn, dim, 8);
        // x as uploaded, and the x the kernels multiply (int16 for the quantized formats).
        let x0 = values(dim, 9);
        let x = x_hat(dtype, &x0);
        let hot: Vec<u32> = (0..ffn as u32).filter(|i| i % 5 != 0).collect(); // partial slab
        let mut flags = vec![0i32; ffn];
        hot.iter()
            .filter(|&&i| i % 2 == 0)
            .for_each(|&i| flags[i as usize] = 1);
        let active: Vec<u32> = hot
            .iter()
            .copied()
            .filter(|&i| flags[i as usize] != 0)
            .collect();
        let mut want = vec![0f32; dim];
        sparse_reference::ffn_gate_up_down_sparse(
            &gate,
            &up,
            &down_t,
            Activation::Silu,
            &x,
            &active,
            &mut want,
        )
        .unwrap();
        let hf = dev
            .upload_hot_ffn(&gate, Some(&up), &down_t, &hot, 32)
            .unwrap();
        assert_eq!(hf.n_bytes(), hf.layout.total_bytes());
        let dx = DevX::new(dev, dtype, &x0);
        let dflags = dev.upload(&flags).unwrap();
        let mut h = dev.zeros::<f32>(hot.len()).unwrap();
        let silu = FfnAct::from(Act::Silu);
        dev.hot_gate_up(&hf, dx.arg(), Some(&dflags), silu, None, &mut h)
            .unwrap();
        let mut y = dev.zeros::<f32>(dim).unwrap();
        let mut part = dev.zeros::<f32>(0).unwrap();
        dev.hot_down(&hf, &h, &mut part, &mut y, 1).unwrap();
        let got = dev.download(&y).unwrap();
        assert_close(&got, &want, 4.0, 1e-3, &format!("hot ffn {dtype}/{down}"));
        // Predictor mode's path: the active slots and then the nonzero rows gathered on the
        // device, gate/up and down over those lists only (four splits at most, live ones by
        // the count).
        let mut slots = Compacted::zeros(dev, hf.layout.n_hot, false).unwrap();
        dev.active_slots(&hf, &dflags, &mut slots).unwrap();
        let mut hl = dev.zeros::<f32>(hot.len()).unwrap();
        dev.hot_gate_up_listed(&hf, dx.arg(), &slots, silu, None, &mut hl)
            .unwrap();
        let mut rows = Compacted::zeros(dev, hf.layout.n_hot, true).unwrap();
        dev.nonzero_rows(&hf, &hl, Some(&slots), &mut rows).unwrap();
        let (mut y2, mut part4) = (dev.zeros::<f32>(dim).unwrap(), dev.zeros(4 * dim).unwrap());
        dev.hot_down_listed(&hf, &rows, &mut part4, &mut y2, 4)
            .unwrap();
        let listed = dev.download(&y2).unwrap();
        let what = format!("hot ffn {dtype}/{down} over the gathered lists");
        assert_close(&listed, &want, 4.0, 1e-3, &what);
        if dtype == down {
            ok(dev, "hot_ffn", dtype);
        }
    }
}

#[test]
fn hot_gate_up_applies_every_ffn_activation() {
    on_each_backend!(ffn_activations);
}

/// Every row of `w` decoded by the core crate's scalar decoder.
fn decoded(w: &Weight) -> Vec<Vec<f32>> {
    (0..w.rows)
        .map(|r| {
            let mut out = vec![0f32; w.cols];
            powerinfer_core::dequantize_row(w.dtype, w.row(r), &mut out).unwrap();
            out
        })
        .collect()
}

/// `dot(row, x)` in f64.
fn dot64(row: &[f32], x: &[f32]) -> f64 {
    row.iter().zip(x).map(|(a, b)| *a as f64 * *b as f64).sum()
}

/// The families' FFN activations over hot slabs, each against an f64 reference in every GPU
/// format: OPT (gate-less, ReLU, an fc1 bias by neuron id, with flags), Falcon's gate-less GELU
/// (here with a bias and no flags: the ids are read for the bias alone), Bamboo (ReLU on gate
/// and up), ProSparse (FATReLU on the gate). Each case also proves its feature changed the
/// result (a test that cannot fail proves nothing).
fn ffn_activations<B: Backend>(dev: &B) {
    for dtype in GPU_DTYPES {
        let (ffn, dim) = (77, cols_for(dtype));
        let (gate, up) = (weight(dtype, ffn, dim, 40), weight(dtype, ffn, dim, 41));
        let down_t = weight(DType::F16, ffn, dim, 42);
        let (gate_rows, up_rows) = (decoded(&gate), decoded(&up));
        // x as uploaded, and the x the kernels multiply (int16 for the quantized formats).
        let x0 = values(dim, 43);
        let x = x_hat(dtype, &x0);
        let scale = (dim as f32).sqrt();
        let bias: Vec<f32> = values(ffn, 44).iter().map(|v| v * scale / 2.0).collect();
        let hot: Vec<u32> = (0..ffn as u32).rev().filter(|i| i % 4 != 1).collect();
        let flags: Vec<i32> = (0..ffn as i32).map(|i| i32::from(i % 5 != 0)).collect();
        // Gate and up dots in f64, per neuron.
        let g_dot: Vec<f64> = gate_rows.iter().map(|r| dot64(r, &x)).collect();
        let u_dot: Vec<f64> = up_rows.iter().map(|r| dot64(r, &x)).collect();
        // FATReLU's threshold: the median positive gate, so some positive gates fall below it.
        let mut pos: Vec<f64> = g_dot.iter().copied().filter(|g| *g > 0.0).collect();
        pos.sort_by(f64::total_cmp);
        let t = pos[pos.len() / 2] as f32;
        let (dx, dflags, dbias) = (
            DevX::new(dev, dtype, &x0),
            dev.upload(&flags).unwrap(),
            dev.upload(&bias).unwrap(),
        );
        let gated = dev
            .upload_hot_ffn(&gate, Some(&up), &down_t, &hot, 16)
            .unwrap();
        let gate_less = dev.upload_hot_ffn(&gate, None, &down_t, &hot, 16).unwrap();
        assert_eq!(gate_less.layout.up, None);
        assert!(gate_less.n_bytes() < gated.n_bytes());
        let relu = FfnAct::from(Act::Relu);
        let cases: [(&str, &HotFfn<B>, FfnAct, bool, bool); 5] = [
            ("opt", &gate_less, relu, true, true),
            ("falcon", &gate_less, FfnAct::from(Act::Gelu), false, true),
            (
                "bamboo",
                &gated,
                FfnAct {
                    up_act: true,
                    ..relu
                },
                true,
                false,
            ),
            (
                "prosparse",
                &gated,
                FfnAct {
                    relu_threshold: t,
                    ..relu
                },
                true,
                false,
            ),
            ("plain", &gated, relu, true, false),
        ];
        let mut results = Vec::new();
        for (name, hf, act, with_flags, with_bias) in cases {
            // ReLU, with FATReLU's threshold t (0: plain), and GELU's tanh form, in f64.
            let f = |v: f64| -> f64 {
                match act.act {
                    Act::Relu if v > act.relu_threshold as f64 => v,
                    Act::Relu => 0.0,
                    Act::Gelu => {
                        let c = (2.0 / std::f64::consts::PI).sqrt();
                        0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())
                    }
                    a => unreachable!("{a:?}"),
                }
            };
            let mut h = dev.upload(&vec![9f32; hot.len() + 1]).unwrap();
            dev.hot_gate_up(
                hf,
                dx.arg(),
                with_flags.then_some(&dflags),
                act,
                with_bias.then_some(&dbias),
                &mut h,
            )
            .unwrap();
            let got = dev.download(&h).unwrap();
            assert_eq!(got[hot.len()], 9.0, "{name}: past the hot slots");
            let mut want = Vec::new();
            let (mut g_near, mut kept) = (Vec::new(), Vec::new());
            for &i in &hot {
                let i = i as usize;
                let gd = g_dot[i] + if with_bias { bias[i] as f64 } else { 0.0 };
                let g = f(gd);
                let h = if with_flags && flags[i] == 0 {
                    0.0
                } else if hf.layout.up.is_none() || g == 0.0 {
                    g
                } else if act.up_act {
                    g * f(u_dot[i])
                } else {
                    g * u_dot[i]
                };
                want.push(h as f32);
                // FATReLU is discontinuous at t (and ReLU's derivative at 0): an f32 sum within
                // rounding of it may fall either way.
                let edge = act.relu_threshold as f64;
                g_near.push((gd - edge).abs() < 1e-3 || (act.up_act && u_dot[i].abs() < 1e-3));
                kept.push(gd > 0.0 && gd <= edge);
            }
            for (k, (g, w)) in got[..hot.len()].iter().zip(&want).enumerate() {
                if g_near[k] {
                    continue;
                }
                let bound = REL_TOL * (scale * scale).max(w.abs()) + ABS_TOL;
                assert!(
                    (g - w).abs() <= bound,
                    "{name} {dtype}[{k}]: gpu {g} vs f64 {w}"
                );
            }
            if name == "prosparse" {
                assert!(kept.contains(&true), "{dtype}: no gate below the threshold");
            }
            results.push(got);
        }
        // Each feature moved the output: the up activation and the threshold against plain
        // ReLU·up, the bias against the same gate-less pass without it.
        let plain = &results[4];
        for (k, name) in [(2, "up_act"), (3, "relu_threshold")] {
            assert_ne!(&results[k], plain, "{dtype}: {name} changed nothing");
        }
        let mut h = dev.zeros::<f32>(hot.len()).unwrap();
        dev.hot_gate_up(&gate_less, dx.arg(), Some(&dflags), relu, None, &mut h)
            .unwrap();
        assert_ne!(
            dev.download(&h).unwrap(),
            results[0][..hot.len()],
            "{dtype}: bias"
        );
        ok(dev, "ffn_activations", dtype);
    }
}

#[test]
fn k_quant_rows_need_whole_super_blocks_and_q2_k_q3_k_are_refused() {
    on_each_backend!(k_quant_refusals);
}

/// Rows of a K-quant are whole 256-weight super-blocks (a slab over a width of 32·k is a Shape
/// error before anything is uploaded); formats without kernels are `Error::Unsupported`, on
/// every backend, naming the format.
fn k_quant_refusals<B: Backend>(dev: &B) {
    let q4k = weight(DType::Q4_K, 10, 256, 1);
    // A width of 288 is 9 blocks of 32 but no whole number of super-blocks.
    let (k4, k6) = (DType::Q4_K, DType::Q6_K);
    let e = powerinfer_cuda::slab_geometry(k4, Some(k4), k6, 288, 8);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let g = powerinfer_cuda::slab_geometry(k4, Some(k4), k6, 512, 3).unwrap();
    assert_eq!(g.row_bytes, [2 * 144, 2 * 144, 2 * 210]);
    assert_eq!(g.offsets, [0, 3 * 288, 6 * 288, 6 * 288 + 3 * 420]);
    for dtype in [DType::Q2_K, DType::Q3_K] {
        let w = weight(dtype, 10, 256, 3);
        let Err(Error::Unsupported(msg)) = dev.upload_weight(&w).map(|_| ()) else {
            panic!("{dtype}: uploaded");
        };
        assert!(msg.contains(dtype.name()) && msg.contains("Q4_K"), "{msg}");
        let e = dev
            .upload_hot_ffn(&q4k, Some(&q4k), &w, &[0], 4)
            .map(|_| ());
        assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
        let e = dev
            .upload_hot_ffn(&q4k, Some(&w), &q4k, &[0], 4)
            .map(|_| ());
        assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
        let e = powerinfer_cuda::slab_geometry(dtype, Some(dtype), DType::F16, 256, 8);
        assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
        let e = powerinfer_cuda::slab_geometry(dtype, None, DType::F16, 256, 8);
        assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
    }
}

#[test]
fn predictor_flags() {
    on_each_backend!(predictor);
}

fn predictor<B: Backend>(dev: &B) {
    let (dim, rank, ffn) = (96, 37, 301);
    let fc1 = weight(DType::F16, rank, dim, 10);
    let fc2_t = weight(DType::F16, rank, ffn, 11);
    let x = values(dim, 12);
    let mut hidden = vec![0f32; rank];
    reference::matvec(&fc1, &x, &mut hidden).unwrap();
    let (idx, vals): (Vec<u32>, Vec<f32>) = hidden
        .iter()
        .enumerate()
        .filter(|(_, h)| **h > 0.0)
        .map(|(i, h)| (i as u32, *h))
        .unzip();
    let mut logits = vec![0f32; ffn];
    sparse_reference::axpy_rows(&fc2_t, &idx, &vals, &mut logits).unwrap();
    let threshold = 0.1;
    let (got, flags) = run_predictor(dev, &fc1, &fc2_t, &x, threshold);
    assert_close(&got, &logits, 2.0, REL_TOL, "predictor logits");
    for j in 0..ffn {
        // Logits within rounding of the threshold may go either way.
        if (logits[j] - threshold).abs() > 1e-3 {
            assert_eq!(flags[j] != 0, logits[j] >= threshold, "flag {j}");
        }
    }
}

#[test]
fn norms_quantize_their_output_as_quantize_x() {
    on_each_backend!(norms_quantize);
}

/// A norm with `xq` writes the same floats as without, and exactly the bytes `quantize_x` writes
/// for them (on gpu-sim both are the host's code; on the emulator and a GPU, the kernels'):
/// rows of 13 blocks (one round of the kernel's output loop, most warps idle) and of 4,160
/// values (three rounds of 256 threads × 8), an RMSNorm block 1e30 times smaller than the
/// rest, a row with a NaN.
fn norms_quantize<B: Backend>(dev: &B) {
    use powerinfer_cuda::layout::xq_bytes;
    for (n, rows) in [(32 * 13, 3), (4160, 2)] {
        let mut x = values(rows * n, 31 + n as u64);
        // Row 0's block 1 far smaller than the rest (each block is scaled by its own max).
        for v in &mut x[32..64] {
            *v *= 1e-30;
        }
        // The last row with a NaN: all of its values and blocks NaN (q = 0, NaN scales).
        x[rows * n - 5] = f32::NAN;
        let (w, b) = (values(n, 32), values(n, 33));
        let (dx, dw, db) = (
            dev.upload(&x).unwrap(),
            dev.upload(&w).unwrap(),
            dev.upload(&b).unwrap(),
        );
        for layer in [false, true] {
            let (mut plain, mut fused) = (
                dev.zeros::<f32>(rows * n).unwrap(),
                dev.zeros::<f32>(rows * n).unwrap(),
            );
            // Prefilled with 0xff bytes: every byte must be written.
            let mut xq = dev.upload(&vec![0xffu8; rows * xq_bytes(n)]).unwrap();
            let bias = layer.then_some(&db);
            dev.norm(&dx, &dw, bias, rows, 1e-5, &mut plain, None)
                .unwrap();
            dev.norm(&dx, &dw, bias, rows, 1e-5, &mut fused, Some(&mut xq))
                .unwrap();
            let what = format!("{} n {n}", if layer { "layer_norm" } else { "rms_norm" });
            let out = dev.download(&fused).unwrap();
            assert_eq!(bits(&out), bits(&dev.download(&plain).unwrap()), "{what}");
            let got = dev.download(&xq).unwrap();
            let mut want = Vec::new();
            for row in out.chunks_exact(n) {
                let dr = dev.upload(row).unwrap();
                let mut q = dev.zeros::<u8>(xq_bytes(n)).unwrap();
                dev.quantize_x(&dr, &mut q).unwrap();
                want.extend(dev.download(&q).unwrap());
            }
            assert_eq!(got, want, "{what}: the quantized bytes");
            // Row 0's quants mostly nonzero: a fused path that wrote nothing of use would show.
            let row0 = &got[..xq_bytes(n)];
            assert!(
                row0.iter().filter(|&&b| b != 0).count() > row0.len() / 2,
                "{what}"
            );
        }
        // Too few bytes are refused.
        let mut short = dev.zeros::<u8>(rows * xq_bytes(n) - 1).unwrap();
        let mut out = dev.zeros::<f32>(rows * n).unwrap();
        let err = dev.norm(&dx, &dw, None, rows, 1e-5, &mut out, Some(&mut short));
        assert!(matches!(err, Err(Error::Shape(_))), "{err:?}");
        let err = dev.norm(&dx, &dw, Some(&db), rows, 1e-5, &mut out, Some(&mut short));
        assert!(matches!(err, Err(Error::Shape(_))), "{err:?}");
    }
    let odd = 33;
    let (dx, dw) = (
        dev.upload(&values(odd, 1)).unwrap(),
        dev.upload(&values(odd, 2)).unwrap(),
    );
    let (mut out, mut q) = (
        dev.zeros::<f32>(odd).unwrap(),
        dev.zeros::<u8>(160).unwrap(),
    );
    let err = dev.norm(&dx, &dw, None, 1, 1e-5, &mut out, Some(&mut q));
    assert!(matches!(err, Err(Error::Shape(_))), "{err:?}");
}

#[test]
fn rms_norm_and_rope() {
    on_each_backend!(norm_rope);
}

fn norm_rope<B: Backend>(dev: &B) {
    // RMSNorm over 3 rows of 333.
    let n = 333;
    let (x, w) = (values(3 * n, 13), values(n, 14));
    let mut want = vec![0f32; 3 * n];
    for r in 0..3 {
        let row = &x[r * n..(r + 1) * n];
        let ss: f64 = row.iter().map(|v| (*v as f64).powi(2)).sum();
        let s = 1.0 / (ss / n as f64 + 1e-5).sqrt();
        for i in 0..n {
            want[r * n + i] = (row[i] as f64 * s * w[i] as f64) as f32;
        }
    }
    let (dx, dw) = (dev.upload(&x).unwrap(), dev.upload(&w).unwrap());
    let mut out = dev.zeros::<f32>(3 * n).unwrap();
    dev.rms_norm(&dx, &dw, 3, 1e-5, &mut out).unwrap();
    assert_close(
        &dev.download(&out).unwrap(),
        &want,
        1.0,
        REL_TOL,
        "rms_norm",
    );

    // LayerNorm over 5 rows of 333 around a mean of 0.6 (a missing centring would show), with
    // the CPU engine's own layer_norm as the reference.
    let rows = 5;
    let x: Vec<f32> = values(rows * n, 23).iter().map(|v| v + 0.6).collect();
    let (w, b) = (values(n, 24), values(n, 25));
    let mut want = vec![0f32; rows * n];
    for (xr, o) in x.chunks_exact(n).zip(want.chunks_exact_mut(n)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n as f64;
        for i in 0..n {
            let v = (xr[i] as f64 - mean) / (var + 1e-5).sqrt();
            o[i] = (v * w[i] as f64 + b[i] as f64) as f32;
        }
    }
    let (dx, dw, db) = (
        dev.upload(&x).unwrap(),
        dev.upload(&w).unwrap(),
        dev.upload(&b).unwrap(),
    );
    let mut out = dev.zeros::<f32>(rows * n).unwrap();
    dev.norm(&dx, &dw, Some(&db), rows, 1e-5, &mut out, None)
        .unwrap();
    let got = dev.download(&out).unwrap();
    assert_close(&got, &want, 1.0, REL_TOL, "layer_norm");
    // Not RMSNorm: the mean matters.
    let mut rms = dev.zeros::<f32>(rows * n).unwrap();
    dev.rms_norm(&dx, &dw, rows, 1e-5, &mut rms).unwrap();
    let rms = dev.download(&rms).unwrap();
    assert!(got.iter().zip(&rms).any(|(a, b)| (a - b).abs() > 0.1));

    // RoPE, both styles, at a large position: the whole head, and the first half of it (partial
    // RoPE) with per-pair frequency divisors (Llama 3.1's factors) and linear scaling, its
    // rotated values times a magnitude (YaRN's attention factor).
    let (hd, heads, pos, theta) = (64, 5, 12_345, 10000.0f64);
    for rot in [hd, hd / 2] {
        let div = |i: usize| {
            if rot == hd {
                1.0
            } else {
                4.0 * (1.0 + i as f64 / 8.0)
            }
        };
        let inv: Vec<f64> = (0..rot / 2)
            .map(|i| theta.powf(-2.0 * i as f64 / rot as f64) / div(i))
            .collect();
        let mscale = if rot == hd { 1.0 } else { 1.2 };
        let freqs = RopeFreqs {
            inv: inv.clone(),
            mscale,
        };
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            let q = values(hd * heads, 15);
            let mut want = q.clone();
            for head in want.chunks_exact_mut(hd) {
                for (i, f) in inv.iter().enumerate() {
                    let a = pos as f64 * f;
                    let (s, c) = ((a.sin() * mscale) as f32, (a.cos() * mscale) as f32);
                    let (ia, ib) = match style {
                        RopeStyle::Norm => (2 * i, 2 * i + 1),
                        RopeStyle::Neox => (i, i + rot / 2),
                    };
                    let (x0, x1) = (head[ia], head[ib]);
                    head[ia] = x0 * c - x1 * s;
                    head[ib] = x0 * s + x1 * c;
                }
            }
            let mut dq = dev.upload(&q).unwrap();
            dev.rope(&mut dq, None, hd, pos, &freqs, style, None)
                .unwrap();
            assert_close(
                &dev.download(&dq).unwrap(),
                &want,
                1.0,
                1e-5,
                &format!("{style:?} rotating {rot} of {hd}"),
            );
        }
    }
}

#[test]
fn rope_of_queries_and_keys_with_their_norms_in_one_launch() {
    on_each_backend!(rope_qk);
}

/// `rope_qk`: 7 query heads and 3 key heads (a warp per head: the grid's last block part
/// empty) rotated in one launch, with and without the per-head RMSNorm first (its own weight
/// for each side), whole and partial rotation (the unrotated part normed too), head_dim 64 and
/// 256 (4 pairs a lane), both styles, an eps of 1e-6 and one of 0.25 (the heads' mean square
/// is ~1/3: a lost or misplaced eps would show); against a float64 reference.
fn rope_qk<B: Backend>(dev: &B) {
    let (nq, nk, pos) = (7, 3, 4_321);
    for (hd, rot, eps) in [
        (64, 64, 1e-6f32),
        (64, 32, 0.25),
        (256, 256, 1e-6),
        (128, 96, 0.25),
    ] {
        let inv: Vec<f64> = (0..rot / 2)
            .map(|i| 10000f64.powf(-2.0 * i as f64 / rot as f64))
            .collect();
        let freqs = RopeFreqs::plain(inv.clone());
        let (qn, kn) = (values(hd, 41), values(hd, 42));
        for style in [RopeStyle::Norm, RopeStyle::Neox] {
            for normed in [false, true] {
                // Each head at its own scale: a norm that mixed heads would show.
                let scaled = |n: usize, seed: u64| -> Vec<f32> {
                    let v = values(n * hd, seed);
                    v.chunks(hd)
                        .enumerate()
                        .flat_map(|(h, c)| c.iter().map(move |x| x * (1.0 + h as f32)))
                        .collect()
                };
                let (q, k) = (scaled(nq, 43), scaled(nk, 44));
                let reference = |x: &[f32], w: &[f32]| -> Vec<f32> {
                    let mut out = vec![0f32; x.len()];
                    for (h, o) in x.chunks_exact(hd).zip(out.chunks_exact_mut(hd)) {
                        let ss: f64 = h.iter().map(|&v| (v as f64).powi(2)).sum();
                        let s = 1.0 / (ss / hd as f64 + eps as f64).sqrt();
                        let v: Vec<f64> = (0..hd)
                            .map(|j| match normed {
                                true => h[j] as f64 * s * w[j] as f64,
                                false => h[j] as f64,
                            })
                            .collect();
                        for j in 0..hd {
                            o[j] = v[j] as f32;
                        }
                        for (i, f) in inv.iter().enumerate() {
                            let a = pos as f64 * f;
                            let (ia, ib) = match style {
                                RopeStyle::Norm => (2 * i, 2 * i + 1),
                                RopeStyle::Neox => (i, i + rot / 2),
                            };
                            o[ia] = (v[ia] * a.cos() - v[ib] * a.sin()) as f32;
                            o[ib] = (v[ia] * a.sin() + v[ib] * a.cos()) as f32;
                        }
                    }
                    out
                };
                let (mut dq, mut dk) = (dev.upload(&q).unwrap(), dev.upload(&k).unwrap());
                let (dqn, dkn) = (dev.upload(&qn).unwrap(), dev.upload(&kn).unwrap());
                let norms = normed.then_some((&dqn, &dkn, eps));
                dev.rope(&mut dq, Some(&mut dk), hd, pos, &freqs, style, norms)
                    .unwrap();
                let what = format!("{style:?} {rot} of {hd}, normed {normed}");
                let scale = if normed { 4.0 } else { 1.0 + nq as f32 };
                let got = dev.download(&dq).unwrap();
                assert_close(&got, &reference(&q, &qn), scale, 2e-5, &format!("q {what}"));
                let got = dev.download(&dk).unwrap();
                assert_close(&got, &reference(&k, &kn), scale, 2e-5, &format!("k {what}"));
            }
        }
    }
    // Keys not of whole heads, or norm weights of another length, are refused.
    let mut dq = dev.upload(&values(64, 1)).unwrap();
    let mut odd = dev.upload(&values(65, 2)).unwrap();
    let inv = RopeFreqs::plain(vec![1.0f64; 8]);
    let err = dev.rope(&mut dq, Some(&mut odd), 32, 1, &inv, RopeStyle::Neox, None);
    assert!(matches!(err, Err(Error::Shape(_))), "{err:?}");
    let mut dk = dev.upload(&values(32, 2)).unwrap();
    let short = dev.upload(&values(31, 3)).unwrap();
    let err = dev.rope(
        &mut dq,
        Some(&mut dk),
        32,
        1,
        &inv,
        RopeStyle::Neox,
        Some((&short, &short, 1e-6)),
    );
    assert!(matches!(err, Err(Error::Shape(_))), "{err:?}");
}

#[test]
fn matvec_add_is_the_matvec_then_the_add() {
    on_each_backend!(matvec_add);
}

/// `matvec_add` (the o projection added into the residual in its own launch) gives the bits of
/// `matvec_rows` followed by `add`, in a float and a quantized format, over 37 rows (the last
/// block of rows part empty).
fn matvec_add<B: Backend>(dev: &B) {
    for dtype in [DType::F16, DType::Q4_0] {
        let (rows, cols) = (37, cols_for(dtype));
        let w = dev.upload_weight(&weight(dtype, rows, cols, 51)).unwrap();
        let x = DevX::new(dev, dtype, &values(cols, 52));
        let y0 = values(rows, 53);
        let mut fused = dev.upload(&y0).unwrap();
        dev.matvec_add(&w, x.arg(), rows, &mut fused).unwrap();
        let (mut sep, mut prod) = (dev.upload(&y0).unwrap(), dev.zeros::<f32>(rows).unwrap());
        dev.matvec_rows(&w, x.arg(), None, rows, Act::None, &mut prod)
            .unwrap();
        dev.add(&mut sep, &prod).unwrap();
        let (f, p) = (dev.download(&fused).unwrap(), dev.download(&prod).unwrap());
        assert_eq!(bits(&f), bits(&dev.download(&sep).unwrap()), "{dtype}");
        // It added: the product alone is not the result.
        assert!(
            f.iter().zip(&p).any(|(a, b)| (a - b).abs() > 1e-3),
            "{dtype}"
        );
    }
}

#[test]
fn attention_every_head_dim() {
    on_each_backend!(attention_head_dims);
}

/// Decode attention, grouped-query, over a partly filled cache: head_dim 64, 80, 128 and 256
/// (the kernel's largest), 36 and 100 (not whole 16-byte pieces of f16: read element by
/// element), one query head per kv head and groups of 5 and 12 (more than a block's 4), one
/// chunk (45 positions) and many (up to 700: flash-decoding's chunks merged), over f16 and f32
/// caches. The f32
/// cache keeps what the f16 one rounds: its output is the exact reference's within
/// [`ATT_TOL_F32`], the f16 cache's is not (and the two differ).
fn attention_head_dims<B: Backend>(dev: &B) {
    for (nh, nkv, hd, n_pos) in [
        (6, 2, 80, 517),
        (8, 2, 64, 300),
        (4, 4, 128, 257),
        (4, 1, 256, 131),
        (12, 1, 36, 45),
        (10, 2, 100, 700),
    ] {
        let p = AttnParams::new(nh, nkv, hd);
        let (f16_out, _) = attention_case::<B, u16>(dev, &p, n_pos, 1.0);
        let (f32_out, exact) = attention_case::<B, f32>(dev, &p, n_pos, 1.0);
        let what = format!("{nh}/{nkv} x {hd}, {n_pos} positions");
        let f16_err = max_err(&f16_out, &exact);
        assert!(
            f16_err > 2.0 * ATT_TOL_F32,
            "{what}: f16 off by {f16_err:e}"
        );
        assert!(
            max_err(&f16_out, &f32_out) > ATT_TOL_F32,
            "{what}: f16 = f32"
        );
    }
}

/// The largest |a − b|.
fn max_err(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max)
}

#[test]
fn attention_with_window_scale_and_softcap() {
    on_each_backend!(attention_variants);
}

/// [`attention_variants_at`] over f16 and f32 caches.
fn attention_variants<B: Backend>(dev: &B) {
    attention_variants_at::<B, u16>(dev);
    attention_variants_at::<B, f32>(dev);
}

/// Sliding windows (Mistral, Gemma 2/3's local layers: shorter than the context, one position,
/// longer than the context), an explicit query scale (Gemma's query_pre_attn_scalar) and score
/// soft-capping (Gemma 2), alone and together, on queries large enough that the cap bends the
/// scores; each changes the output against plain attention unless it cannot (a window past the
/// context).
fn attention_variants_at<B: Backend, T: KvElem>(dev: &B) {
    let (nh, nkv, hd, n_pos) = (6, 2, 80, 203);
    let plain = AttnParams::new(nh, nkv, hd);
    let (base, _) = attention_case::<B, T>(dev, &plain, n_pos, 6.0);
    let with = |window, scale, softcap| AttnParams {
        window,
        scale,
        softcap,
        ..plain
    };
    let s = plain.scale;
    for (p, same) in [
        (with(Some(37), s, None), false),
        (with(Some(1), s, None), false),
        (with(Some(n_pos + 5), s, None), true),
        (with(None, 0.05, None), false),
        (with(None, s, Some(1.5)), false),
        (with(Some(64), 0.3, Some(2.5)), false),
    ] {
        let (got, _) = attention_case::<B, T>(dev, &p, n_pos, 6.0);
        let moved = got.iter().zip(&base).any(|(a, b)| (a - b).abs() > 1e-3);
        assert_eq!(moved, !same, "{} {p:?} against plain attention", T::NAME);
    }
}

/// One attention case: `n_pos` positions stored through kv_store into a cache of `T` of
/// `n_pos + 83` (queries `q_scale` times the keys' range), against an f64 reference reading the
/// same keys and values as the cache holds them (f16: rounded) with the same window, scale and
/// soft-cap, within [`ATT_TOL`] (f16) or [`ATT_TOL_F32`]. Returns the output and the reference.
fn attention_case<B: Backend, T: KvElem>(
    dev: &B,
    p: &AttnParams,
    n_pos: usize,
    q_scale: f32,
) -> (Vec<f32>, Vec<f32>) {
    let (nh, nkv, hd) = (p.n_heads, p.n_kv_heads, p.head_dim);
    let seed = hd as u64;
    let kv_dim = nkv * hd;
    let q: Vec<f32> = values(nh * hd, 16 + seed)
        .iter()
        .map(|v| v * q_scale)
        .collect();
    let (k, v) = (
        values(n_pos * kv_dim, 17 + seed),
        values(n_pos * kv_dim, 18 + seed),
    );
    let context = n_pos + 83;
    // Under a sanitizer, positions before the last three are written straight into the caches
    // (as kv_store rounds them: `kv_store_exact` checks that), not by a launch each: what the
    // sanitizers look at here is the attention kernel, and a launch per position was most of
    // this test's time under ThreadSanitizer.
    let stored = if sanitized() {
        n_pos.saturating_sub(3)
    } else {
        0
    };
    let direct = |x: &[f32]| -> Vec<T> {
        let mut c: Vec<T> = x[..stored * kv_dim]
            .iter()
            .map(|v| T::from_f32(*v))
            .collect();
        c.resize(context * kv_dim, T::from_f32(0.0));
        c
    };
    let mut ck = dev.upload(&direct(&k)).unwrap();
    let mut cv = dev.upload(&direct(&v)).unwrap();
    for p in stored..n_pos {
        let dk = dev.upload(&k[p * kv_dim..(p + 1) * kv_dim]).unwrap();
        let dv = dev.upload(&v[p * kv_dim..(p + 1) * kv_dim]).unwrap();
        dev.kv_store(&dk, &dv, p, &mut ck, &mut cv).unwrap();
    }
    // The reference reads the keys and values as the cache holds them.
    let round = |v: &[f32]| -> Vec<f32> { v.iter().map(|x| T::from_f32(*x).to_f32()).collect() };
    let (kr, vr) = (round(&k), round(&v));
    let first = p.window.map_or(0, |w| n_pos.saturating_sub(w));
    let (kf, vf) = (|i: usize| kr[i] as f64, |i: usize| vr[i] as f64);
    let cap = p.softcap.map(f64::from);
    let scale = p.scale as f64;
    let want: Vec<f32> = attention_ref(&q, kf, vf, (nkv, hd), first, n_pos, scale, cap, None)
        .iter()
        .map(|&w| w as f32)
        .collect();
    let dq = dev.upload(&q).unwrap();
    let mut out = dev.zeros::<f32>(nh * hd).unwrap();
    // The flash-decoding scratch as the plan sizes it for this context.
    let mut part = dev.zeros::<f32>(att_part_len(nh, hd, context)).unwrap();
    dev.attention(&dq, &ck, &cv, n_pos, p, None, &mut part, &mut out)
        .unwrap();
    let got = dev.download(&out).unwrap();
    let what = format!("attention over {} caches {p:?}, {n_pos} positions", T::NAME);
    if T::NAME == f32::NAME {
        let err = max_err(&got, &want);
        assert!(err <= ATT_TOL_F32, "{what}: off by {err:e}");
    } else {
        assert_close(&got, &want, 1.0, ATT_TOL, &what);
    }
    (got, want)
}

#[test]
fn elementwise() {
    on_each_backend!(elementwise_ops);
}

fn elementwise_ops<B: Backend>(dev: &B) {
    let n = 1001;
    let (g, u) = (values(n, 19), values(n, 20));
    let (dg, du) = (dev.upload(&g).unwrap(), dev.upload(&u).unwrap());
    // copy into a longer buffer (the rest kept), then add onto the copy.
    let tail = [7.0f32, -7.0];
    let mut dy = dev.upload(&[vec![0.5; n], tail.to_vec()].concat()).unwrap();
    dev.copy(&mut dy, &dg).unwrap();
    let got = dev.download(&dy).unwrap();
    assert_eq!(got[..n], g[..], "copy");
    assert_eq!(got[n..], tail, "copy: past the source");
    dev.fill(&mut dy, 0.0).unwrap();
    assert_eq!(
        dev.download(&dy).unwrap(),
        vec![0.0; n + tail.len()],
        "fill"
    );
    let mut dsum = dev.upload(&g).unwrap();
    dev.add(&mut dsum, &du).unwrap();
    let want: Vec<f32> = g.iter().zip(&u).map(|(a, b)| a + b).collect();
    assert_close(&dev.download(&dsum).unwrap(), &want, 1.0, 1e-5, "add");

    // softcap over the first n - 2 of n logits reaching ±40 (cap 30: the large ones bend).
    let (cap, m) = (30.0f32, n - 2);
    let y: Vec<f32> = g.iter().map(|v| 40.0 * v).collect();
    let mut dy = dev.upload(&y).unwrap();
    dev.softcap(&mut dy, m, cap).unwrap();
    let want: Vec<f32> = y
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            if i < m {
                (cap as f64 * (v as f64 / cap as f64).tanh()) as f32
            } else {
                v
            }
        })
        .collect();
    let got = dev.download(&dy).unwrap();
    assert_close(&got, &want, 1.0, 1e-5, "softcap");
    assert!(got[..m].iter().all(|v| v.abs() < cap));
    assert!(y[..m].iter().any(|v| v.abs() > cap), "nothing to cap");
    assert_eq!(got[m..], y[m..], "softcap: past n");
}

#[test]
fn threshold_mask_zeroes_small_values() {
    on_each_backend!(threshold_mask);
}

/// `h[i] = 0` where `|h[i]| < t` over the first n values; the rest of the buffer untouched.
fn threshold_mask<B: Backend>(dev: &B) {
    let (len, n, t) = (1003, 997, 0.3f32);
    let mut h = values(len, 21);
    h[5] = t; // exactly the threshold: kept
    h[6] = -t;
    h[7] = 0.0;
    let mut dh = dev.upload(&h).unwrap();
    dev.threshold_mask(&mut dh, n, t).unwrap();
    let want: Vec<f32> = h
        .iter()
        .enumerate()
        .map(|(i, &v)| if i < n && v.abs() < t { 0.0 } else { v })
        .collect();
    assert_eq!(dev.download(&dh).unwrap(), want);
    assert!(want[..n].contains(&0.0) && want[..n].iter().any(|v| *v != 0.0));
}

/// Compaction past one round (2,048 entries a round): 5,003 coefficients, a NaN kept, a list
/// bounded by an input count; the hot slots of 3,001 flagged neurons.
#[test]
fn compaction_keeps_order_over_many_rounds() {
    on_each_backend!(compaction);
}

fn compaction<B: Backend>(dev: &B) {
    let n = 5003;
    let mut a = values(n, 50);
    for (k, v) in a.iter_mut().enumerate() {
        if k % 7 < 4 {
            *v = 0.0;
        }
    }
    a[4100] = f32::NAN;
    let w = weight(DType::F16, n, 32, 51);
    let hot: Vec<u32> = (0..n as u32).collect();
    let hf = dev.upload_hot_ffn(&w, None, &w, &hot, 64).unwrap();
    let da = dev
        .upload(&[a.clone(), vec![0.0; hf.layout.n_hot - n]].concat())
        .unwrap();
    let mut out = Compacted::zeros(dev, hf.layout.n_hot, true).unwrap();
    dev.nonzero_rows(&hf, &da, None, &mut out).unwrap();
    let want: Vec<i32> = (0..n).filter(|&k| a[k] != 0.0).map(|k| k as i32).collect();
    assert_eq!(dev.download(&out.count).unwrap(), [want.len() as i32]);
    assert_eq!(dev.download(&out.idx).unwrap()[..want.len()], want[..]);
    // The flagged slots: every third neuron, over slabs of 64 (the last one partial: padding).
    let flags: Vec<i32> = (0..n as i32).map(|i| i32::from(i % 3 == 0)).collect();
    let mut slots = Compacted::zeros(dev, hf.layout.n_hot, false).unwrap();
    dev.active_slots(&hf, &dev.upload(&flags).unwrap(), &mut slots)
        .unwrap();
    let on: Vec<i32> = (0..n as i32).filter(|i| i % 3 == 0).collect();
    assert_eq!(dev.download(&slots.count).unwrap(), [on.len() as i32]);
    assert_eq!(dev.download(&slots.idx).unwrap()[..on.len()], on[..]);
    // A list bounded by that count: the coefficients of the first |on| entries only.
    dev.nonzero_rows(&hf, &da, Some(&slots), &mut out).unwrap();
    let want: Vec<i32> = (0..on.len())
        .filter(|&k| a[k] != 0.0)
        .map(|k| on[k])
        .collect();
    assert_eq!(dev.download(&out.count).unwrap(), [want.len() as i32]);
    assert_eq!(dev.download(&out.idx).unwrap()[..want.len()], want[..]);
}

#[test]
fn checks_come_before_any_launch() {
    on_each_backend!(checked_errors);
}

/// Bad shapes are the same errors on every backend, found before anything is queued, and empty
/// work queues nothing (uses only `zeros`, so no copy or launch runs).
fn checked_errors<B: Backend>(dev: &B) {
    let zeros_f32 = |n| dev.zeros::<f32>(n).unwrap();
    let w = DeviceWeight::<B> {
        dtype: DType::F16,
        rows: 8,
        cols: 64,
        layout: RowLayout::dense(8, 128).unwrap(),
        data: dev.zeros::<u8>(8 * 128).unwrap(),
    };
    let (x, mut y) = (zeros_f32(63), zeros_f32(8));
    let e = dev.matvec_rows(&w, XIn::floats(&x), None, 8, Act::None, &mut y);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let x = zeros_f32(64);
    let e = dev.matvec_rows(&w, XIn::floats(&x), None, 9, Act::None, &mut y);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    // No rows: nothing to do.
    dev.matvec_rows(&w, XIn::floats(&x), None, 0, Act::None, &mut y)
        .unwrap();
    let mut empty = zeros_f32(0);
    dev.add(&mut empty, &zeros_f32(0)).unwrap();
    dev.copy(&mut empty, &zeros_f32(0)).unwrap();
    dev.softcap(&mut y, 0, 30.0).unwrap();
    let e = dev.copy(&mut y, &zeros_f32(9));
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let e = dev.softcap(&mut y, 9, 30.0);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    for cap in [0.0, -1.0, f32::NAN] {
        let e = dev.softcap(&mut y, 8, cap);
        assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
    }
    // LayerNorm: a bias of another length; no rows.
    let (w64, b63) = (zeros_f32(64), zeros_f32(63));
    let (x2, mut out2) = (zeros_f32(128), zeros_f32(128));
    let e = dev.norm(&x2, &w64, Some(&b63), 2, 1e-5, &mut out2, None);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let e = dev.norm(&x2, &w64, Some(&w64), 3, 1e-5, &mut out2, None);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    dev.norm(&empty, &w64, Some(&w64), 0, 1e-5, &mut zeros_f32(0), None)
        .unwrap();

    // hot_gate_up: flags or a bias shorter than the FFN, FATReLU's threshold with SiLU or
    // negative; no hot neurons: nothing. (Slabs of zeros: the layout is all the checks read.)
    let f16w = |rows| powerinfer_core::testing::random_weight(DType::F16, rows, 64, 1);
    let (layout, bytes) =
        powerinfer_cuda::pack_hot_slabs(&f16w(10), None, &f16w(10), &[3, 1], 4).unwrap();
    let hf = HotFfn::<B> {
        layout,
        data: dev.zeros::<u8>(bytes.len()).unwrap(),
    };
    let (hx, mut hh) = (zeros_f32(64), zeros_f32(2));
    let (flags9, flags10) = (dev.zeros::<i32>(9).unwrap(), dev.zeros::<i32>(10).unwrap());
    let relu = FfnAct::from(Act::Relu);
    let e = dev.hot_gate_up(&hf, XIn::floats(&hx), Some(&flags9), relu, None, &mut hh);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let e = dev.hot_gate_up(
        &hf,
        XIn::floats(&hx),
        Some(&flags10),
        relu,
        Some(&zeros_f32(9)),
        &mut hh,
    );
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    for act in [
        FfnAct {
            relu_threshold: 0.5,
            ..FfnAct::from(Act::Silu)
        },
        FfnAct {
            relu_threshold: -0.5,
            ..relu
        },
    ] {
        let e = dev.hot_gate_up(&hf, XIn::floats(&hx), None, act, None, &mut hh);
        assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
    }
    let (layout, _) = powerinfer_cuda::pack_hot_slabs(&f16w(10), None, &f16w(10), &[], 4).unwrap();
    let none = HotFfn::<B> {
        layout,
        data: dev.zeros::<u8>(0).unwrap(),
    };
    dev.hot_gate_up(
        &none,
        XIn::floats(&hx),
        None,
        relu,
        Some(&zeros_f32(10)),
        &mut empty,
    )
    .unwrap();
    dev.threshold_mask(&mut y, 0, 0.5).unwrap();
    let e = dev.threshold_mask(&mut y, 9, 0.5);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let e = dev.add(&mut y, &zeros_f32(7));
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");

    kv_checked_errors::<B, u16>(dev);
    kv_checked_errors::<B, f32>(dev);
    // RoPE over a length that is no whole number of heads.
    let inv = RopeFreqs::plain(vec![1.0f64; 32]);
    let mut odd = zeros_f32(65);
    let e = dev.rope(&mut odd, None, 64, 0, &inv, RopeStyle::Norm, None);
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    // More rotated pairs than a head holds; more than the kernel takes.
    let mut x = zeros_f32(64);
    let e = dev.rope(
        &mut x,
        None,
        64,
        0,
        &RopeFreqs::plain(vec![1.0; 33]),
        RopeStyle::Norm,
        None,
    );
    assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
    let mut x = zeros_f32(1024);
    let e = dev.rope(
        &mut x,
        None,
        1024,
        0,
        &RopeFreqs::plain(vec![1.0; 257]),
        RopeStyle::Neox,
        None,
    );
    assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
}

/// The attention and kv_store checks of [`checked_errors`], over caches of `T`.
fn kv_checked_errors<B: Backend, T: KvElem>(dev: &B) {
    let zeros_f32 = |n| dev.zeros::<f32>(n).unwrap();
    // head_dim past the kernel's limit.
    let hd = powerinfer_cuda::MAX_HEAD_DIM * 2;
    let (q, mut out) = (zeros_f32(hd), zeros_f32(hd));
    let (ck, cv) = (
        dev.zeros::<T>(4 * hd).unwrap(),
        dev.zeros::<T>(4 * hd).unwrap(),
    );
    let mut part = zeros_f32(0);
    let e = dev.attention(
        &q,
        &ck,
        &cv,
        4,
        &AttnParams::new(1, 1, hd),
        None,
        &mut part,
        &mut out,
    );
    assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}");
    // A window of no position; a cap or a scale that is no (positive) number.
    let (q, mut out) = (zeros_f32(64), zeros_f32(64));
    let p = AttnParams::new(1, 1, 64);
    let bad = [
        (
            AttnParams {
                window: Some(0),
                ..p
            },
            true,
        ),
        (
            AttnParams {
                softcap: Some(0.0),
                ..p
            },
            false,
        ),
        (
            AttnParams {
                softcap: Some(-2.0),
                ..p
            },
            false,
        ),
        (
            AttnParams {
                scale: f32::NAN,
                ..p
            },
            false,
        ),
    ];
    for (p, shape) in bad {
        let e = dev.attention(&q, &ck, &cv, 4, &p, None, &mut part, &mut out);
        match shape {
            true => assert!(matches!(e, Err(Error::Shape(_))), "{e:?}"),
            false => assert!(matches!(e, Err(Error::Unsupported(_))), "{e:?}"),
        }
    }
    // A position past the cache.
    let (k, v) = (zeros_f32(16), zeros_f32(16));
    let (mut ck, mut cv) = (
        dev.zeros::<T>(4 * 16).unwrap(),
        dev.zeros::<T>(4 * 16).unwrap(),
    );
    let e = dev.kv_store(&k, &v, 4, &mut ck, &mut cv);
    assert!(matches!(e, Err(Error::ContextOverflow(_))), "{e:?}");
}

#[test]
fn f16_conversions_are_exact_both_ways() {
    on_each_backend!(f16_conversions);
}

/// Every f16 bit pattern decoded (one F16 row of all 65,536, read by axpy_rows, the hot down
/// pass, with a coefficient of 1: y = 0 + 1·w exactly), and f32 → f16 in kv_store rounding to nearest even at
/// every tie between neighbouring f16 values, one f32 step either side of them, past the largest
/// finite f16, below the smallest subnormal, and on infinities and NaN — bit for bit as `half`
/// (IEEE 754) rounds; the same values through kv_store_f32 kept as they are. On a GPU this
/// checks the cvt instructions, on the emulator its own conversions.
fn f16_conversions<B: Backend>(dev: &B) {
    let bits: Vec<u16> = (0..=u16::MAX).collect();
    let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
    let w = Weight::new(DType::F16, 1, bits.len(), Buffer::from_bytes(&bytes)).unwrap();
    // One gate-less hot neuron whose down_t row is that row.
    let hf = dev.upload_hot_ffn(&w, None, &w, &[0], 1).unwrap();
    let (da, mut dy) = (
        dev.upload(&[1.0f32]).unwrap(),
        dev.zeros::<f32>(bits.len()).unwrap(),
    );
    let mut part = dev.zeros::<f32>(0).unwrap();
    dev.hot_down(&hf, &da, &mut part, &mut dy, 1).unwrap();
    for (b, got) in bits.iter().zip(dev.download(&dy).unwrap()) {
        let want = f16::from_bits(*b).to_f32();
        if want.is_nan() {
            assert!(got.is_nan(), "f16 {b:#06x}: {got}");
        } else {
            // 0 + 1·(−0) is +0.
            assert_eq!(got, want + 0.0, "f16 {b:#06x}");
        }
    }

    let mut x: Vec<f32> = Vec::new();
    // Every 7th pair of neighbours (all exponents, varied mantissas), both signs.
    for b in (0..0x7bffu16).step_by(7) {
        let (lo, hi) = (f16::from_bits(b).to_f64(), f16::from_bits(b + 1).to_f64());
        let mid = ((lo + hi) / 2.0) as f32; // exact: 12 significant bits
        for v in [
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ] {
            x.extend([v, -v]);
        }
    }
    x.extend([
        65504.0,
        65519.996,
        65520.0,
        1e6,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        2.9e-8,
        2.98e-8,
        -0.0,
        f32::MIN_POSITIVE / 4.0,
    ]);
    let dx = dev.upload(&x).unwrap();
    kv_store_exact::<B, u16>(dev, &dx, &x);
    kv_store_exact::<B, f32>(dev, &dx, &x);
}

/// kv_store of `x` (uploaded as `dx`) into caches of `T` holds `T::from_f32(x)` bit for bit in
/// both caches (f16: rounded to nearest even as `half` rounds; f32: x itself), NaN as a NaN.
fn kv_store_exact<B: Backend, T: KvElem>(dev: &B, dx: &B::Buf<f32>, x: &[f32]) {
    let n = x.len();
    let (mut ck, mut cv) = (dev.zeros::<T>(n).unwrap(), dev.zeros::<T>(n).unwrap());
    dev.kv_store(dx, dx, 0, &mut ck, &mut cv).unwrap();
    // Through f32, which every f16 value (NaN payloads included) converts to exactly.
    let bits = |c: Vec<T>| -> Vec<u32> { c.into_iter().map(|e| e.to_f32().to_bits()).collect() };
    let got = bits(dev.download(&ck).unwrap());
    for (v, g) in x.iter().zip(&got) {
        let want = T::from_f32(*v).to_f32();
        let what = format!("{} {v:e} ({:#010x}): {g:#010x}", T::NAME, v.to_bits());
        if want.is_nan() {
            assert!(f32::from_bits(*g).is_nan(), "{what}");
        } else {
            assert_eq!(*g, want.to_bits(), "{what}");
        }
    }
    assert_eq!(bits(dev.download(&cv).unwrap()), got);
}

/// A mixture of experts' flattened neurons: 5 experts of 7 rows, then a shared expert of 3.
const EXPERTS: (usize, usize, usize) = (5, 7, 3);

/// The expert of flattened neuron `id` (the shared expert is `n_expert`).
fn expert_of(id: usize) -> usize {
    let (n, ef, _) = EXPERTS;
    if id < n * ef {
        id / ef
    } else {
        n
    }
}

#[test]
fn expert_rows_pack_as_one_matrix() {
    // Each expert's rows and the shared expert's, packed in place, are the slabs of the one
    // matrix that holds them all in that order.
    let (n, ef, sf) = EXPERTS;
    let dim = 64;
    for dtype in [DType::F32, DType::F16, DType::Q8_0, DType::Q4_K] {
        let dim = if dtype == DType::Q4_K { 256 } else { dim };
        let whole = weight(dtype, n * ef + sf, dim, 5);
        let rb = dtype.row_bytes(dim).unwrap();
        let part = |from: usize, rows: usize| {
            let bytes = &whole.bytes()[from * rb..(from + rows) * rb];
            Weight::new(dtype, rows, dim, Buffer::from_bytes(bytes)).unwrap()
        };
        let mut parts: Vec<Weight> = (0..n).map(|e| part(e * ef, ef)).collect();
        parts.push(part(n * ef, sf));
        let space = RowSpace::new(parts.iter().collect()).unwrap();
        assert_eq!(space.rows(), n * ef + sf);
        let ids = [0u32, 6, 7, 20, 34, 35, 36, 37];
        let (l1, b1) = pack_hot_rows(&space, Some(&space), &space, &ids, 3).unwrap();
        let (l2, b2) = pack_hot_slabs(&whole, Some(&whole), &whole, &ids, 3).unwrap();
        assert_eq!((l1.total_bytes(), &b1), (l2.total_bytes(), &b2), "{dtype}");
        assert!(pack_hot_rows(&space, None, &space, &[38], 3).is_err());
    }
    let (a, b) = (weight(DType::F16, 3, 64, 1), weight(DType::F32, 3, 64, 1));
    assert!(RowSpace::new(vec![&a, &b]).is_err());
    assert!(RowSpace::new(vec![]).is_err());
}

#[test]
fn experts_route_hot_slots() {
    on_each_backend!(expert_flags_and_scales);
}

/// `expert_flags` sets one flag per flattened neuron from its expert's weight; `expert_scale`
/// multiplies each hot slot's value by its neuron's expert weight, padding slots untouched.
fn expert_flags_and_scales<B: Backend>(dev: &B) {
    let (n, ef, sf) = EXPERTS;
    let all = n * ef + sf;
    let w = [0.5f32, 0.0, -0.25, 0.0, 0.0, 1.5];
    let dw = dev.upload(&w).unwrap();
    let mut flags = dev.upload(&vec![7i32; all]).unwrap();
    dev.expert_flags(&dw, ef, n * ef, &mut flags).unwrap();
    let want: Vec<i32> = (0..all)
        .map(|j| i32::from(w[expert_of(j)] != 0.0))
        .collect();
    assert_eq!(dev.download(&flags).unwrap(), want);

    let g = weight(DType::F16, all, 32, 3);
    let ids = [1u32, 8, 14, 15, 21, 33, 35, 37];
    let hot = dev.upload_hot_ffn(&g, None, &g, &ids, 3).unwrap(); // 3 slabs, one padding slot
    let h0 = values(ids.len() + 4, 9);
    let mut h = dev.upload(&h0).unwrap();
    dev.expert_scale(&hot, &dw, ef, n * ef, &mut h).unwrap();
    let mut want = h0.clone();
    for (s, &id) in ids.iter().enumerate() {
        want[s] *= w[expert_of(id as usize)];
    }
    assert_eq!(dev.download(&h).unwrap(), want);
    // Weights that do not describe the experts: refused before any launch.
    assert!(dev.expert_flags(&dw, ef + 1, n * ef, &mut flags).is_err());
    assert!(dev.expert_scale(&hot, &dw, ef, n * ef + 1, &mut h).is_err());
}
