//! The family's kernels on the host backend against their contracts.

use powerinfer_core::testing::pseudo_random;
use powerinfer_core::DType;
use powerinfer_cpu::{reference, sparse_reference};

use super::host::XSlice;
use super::launch::{GateUp, QuantizeX, SparseMatvec, XArg};
use crate::backend::Backend;
use crate::host::{HostBackend, HostBuf};
use crate::kernels::GPU_DTYPES;
use crate::layout::{Act, FfnAct, RowLayout, XQ_BLOCK};
use crate::ops::testutil::*;

const TOL: f32 = 1e-4;

#[test]
fn sparse_matvec_matches_the_reference_on_every_format() {
    let be = HostBackend::new();
    for (i, dtype) in GPU_DTYPES.into_iter().enumerate() {
        let (rows, cols) = (45, odd_cols(dtype));
        let w = weight(dtype, rows, cols, i as u64);
        // x as uploaded, and the x the kernels multiply (int16 for the quantized formats).
        let x0 = pseudo_random(cols, 100 + i as u64);
        let x = x_hat(dtype, &x0);
        let idx: Vec<u32> = (0..37).map(|k| (k * 13 + i as u32) % rows as u32).collect();
        let dw = upload_rows(&be, &w);
        let dx = HostX::new(&be, dtype, &x0);
        let didx = upload(&be, &idx.iter().map(|&v| v as i32).collect::<Vec<_>>());
        let l = RowLayout::dense(rows, dtype.row_bytes(cols).unwrap()).unwrap();
        for act in ACTS {
            // With an index list (y longer than n: the rest untouched).
            let mut want = vec![0f32; idx.len()];
            sparse_reference::matvec_rows(&w, &x, &idx, &mut want).unwrap();
            want.iter_mut().for_each(|v| *v = act_ref(act, *v));
            let mut y = upload(&be, &vec![7f32; idx.len() + 2]);
            launch(
                &be,
                SparseMatvec {
                    idx: Some(&didx),
                    act,
                    ..SparseMatvec::rows(dtype, &dw, l, dx.arg(), cols, idx.len(), &mut y)
                },
            )
            .unwrap();
            let got = download(&be, &y);
            assert_close(&got[..idx.len()], &want, TOL, &format!("{dtype} {act:?}"));
            assert_eq!(got[idx.len()..], [7.0, 7.0]);

            // Without: every row.
            let mut want = vec![0f32; rows];
            reference::matvec(&w, &x, &mut want).unwrap();
            want.iter_mut().for_each(|v| *v = act_ref(act, *v));
            let mut y = be.zeros::<f32>(rows).unwrap();
            launch(
                &be,
                SparseMatvec {
                    act,
                    ..SparseMatvec::rows(dtype, &dw, l, dx.arg(), cols, rows, &mut y)
                },
            )
            .unwrap();
            assert_close(&download(&be, &y), &want, TOL, &format!("{dtype} dense"));
        }
    }
}

#[test]
fn sparse_matvec_over_slabs_skips_inactive_and_padding_neurons() {
    let be = HostBackend::new();
    for (i, dtype) in GPU_DTYPES.into_iter().enumerate() {
        let case = SlabCase::new(&be, i, 2, [10 * i as u64, 7 + i as u64, i as u64]);
        let (dim, hot) = (case.hot.gate.cols, &case.hot);
        let (x0, x, f) = (&case.x0, &case.x, &case.flags);
        let (dx, df) = (HostX::new(&be, dtype, x0), upload(&be, f));
        let n = hot.slots();
        let mut y = upload(&be, &vec![9f32; n]);
        launch(
            &be,
            SparseMatvec {
                ids: Some((&hot.buf, hot.layout.ids)),
                flags: Some(&df),
                act: Act::Silu,
                ..SparseMatvec::rows(dtype, &hot.buf, hot.layout.gate, dx.arg(), dim, n, &mut y)
            },
        )
        .unwrap();
        let want: Vec<f32> = (0..n)
            .map(|r| match hot.id(r) {
                Some(id) if f[id] != 0 => {
                    act_ref(Act::Silu, reference::dot_row(dtype, hot.gate.row(id), x))
                }
                _ => 0.0,
            })
            .collect();
        assert_close(&download(&be, &y), &want, TOL, &format!("{dtype}"));
        // 3 padding slots and some inactive neurons.
        assert!(want.iter().filter(|&&v| v == 0.0).count() > 3);
    }
}

#[test]
fn gate_up_over_slabs_matches_the_reference() {
    let be = HostBackend::new();
    for (i, dtype) in GPU_DTYPES.into_iter().enumerate() {
        let seeds = [20 + i as u64, 30 + i as u64, 40 + i as u64];
        let case = SlabCase::new(&be, i, 1, seeds);
        let (dim, hot) = (case.hot.gate.cols, &case.hot);
        let (x0, x, f) = (&case.x0, &case.x, &case.flags);
        let (dx, df) = (HostX::new(&be, dtype, x0), upload(&be, f));
        // A list of slots, padding included.
        let slots: Vec<i32> = vec![23, 0, 5, 20, 21, 7, 7, 16];
        let didx = upload(&be, &slots);
        for act in [Act::Relu, Act::Gelu] {
            for (with_flags, with_idx) in [(true, false), (false, false), (true, true)] {
                let n = if with_idx { slots.len() } else { hot.slots() };
                let mut h = upload(&be, &vec![5f32; n]);
                launch(
                    &be,
                    GateUp {
                        dtype,
                        w: &hot.buf,
                        gate_l: hot.layout.gate,
                        up_l: hot.layout.up,
                        x: dx.arg(),
                        cols: dim,
                        idx: with_idx.then_some(&didx),
                        n,
                        ids_l: hot.layout.ids,
                        flags: with_flags.then_some(&df),
                        bias: None,
                        up_bias: None,
                        act: FfnAct::from(act),
                        count: None,
                        h: &mut h,
                    },
                )
                .unwrap();
                let want: Vec<f32> = (0..n)
                    .map(|k| {
                        let r = if with_idx { slots[k] as usize } else { k };
                        match hot.id(r) {
                            Some(id) if !with_flags || f[id] != 0 => {
                                let g = reference::dot_row(dtype, hot.gate.row(id), x);
                                let u = reference::dot_row(dtype, hot.up.row(id), x);
                                act_ref(act, g) * u
                            }
                            _ => 0.0,
                        }
                    })
                    .collect();
                let what = format!("{dtype} {act:?} flags {with_flags} idx {with_idx}");
                assert_close(&download(&be, &h), &want, TOL, &what);
            }
        }
    }
}

#[test]
fn gate_up_with_the_clamped_swiglu_adds_both_biases() {
    // gpt-oss's experts: h = swiglu_oai(g + b_g[id], u + b_u[id], 7) over the active slots,
    // with gate and up values past the clamp (x scaled up); inactive and padding slots 0.
    let be = HostBackend::new();
    let lim = 7.0f32;
    for dtype in [DType::F32, DType::Q8_0] {
        let i = GPU_DTYPES.iter().position(|&d| d == dtype).unwrap();
        let case = SlabCase::new(&be, i, 1, [50, 51, 52 + i as u64]);
        let (dim, hot) = (case.hot.gate.cols, &case.hot);
        let x0: Vec<f32> = case.x0.iter().map(|v| 6.0 * v).collect();
        let x = x_hat(dtype, &x0);
        let (dx, df) = (HostX::new(&be, dtype, &x0), upload(&be, &case.flags));
        let (bg, bu) = (pseudo_random(FFN, 53), pseudo_random(FFN, 54));
        let (dbg, dbu) = (upload(&be, &bg), upload(&be, &bu));
        let act = FfnAct {
            swiglu_limit: lim,
            ..FfnAct::from(Act::Silu)
        };
        let n = hot.slots();
        let mut h = upload(&be, &vec![5f32; n]);
        let k = GateUp {
            dtype,
            w: &hot.buf,
            gate_l: hot.layout.gate,
            up_l: hot.layout.up,
            x: dx.arg(),
            cols: dim,
            idx: None,
            n,
            ids_l: hot.layout.ids,
            flags: Some(&df),
            bias: Some(&dbg),
            up_bias: Some(&dbu),
            act,
            count: None,
            h: &mut h,
        };
        launch(&be, k).unwrap();
        let mut clamped = 0;
        let want: Vec<f32> = (0..n)
            .map(|r| match hot.id(r) {
                Some(id) if case.flags[id] != 0 => {
                    let g = reference::dot_row(dtype, hot.gate.row(id), &x) + bg[id];
                    let u = reference::dot_row(dtype, hot.up.row(id), &x) + bu[id];
                    clamped += usize::from(g > lim || u.abs() > lim);
                    powerinfer_core::swiglu_oai(g, u, lim)
                }
                _ => 0.0,
            })
            .collect();
        assert!(clamped > 0, "{dtype}: no value past the clamp");
        assert_close(
            &download(&be, &h),
            &want,
            TOL,
            &format!("{dtype} swiglu_oai"),
        );
    }
}

/// F32 bytes of `v`.
fn bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn rows_that_need_not_be_read_are_not_read() {
    // Rows 0..3 of gate, then of up, then the ids: row 0's gate is negative (ReLU gives 0)
    // and its up row NaN; row 2 is inactive with NaN rows; row 1 is computed.
    let cols = 5;
    let rb = 4 * cols;
    let nan = vec![f32::NAN; cols];
    let mut w = bytes(&[vec![-1.0; cols], vec![1.0; cols], nan.clone()].concat());
    w.extend(bytes(&[nan.clone(), vec![2.0; cols], nan.clone()].concat()));
    w.extend([0i32, 1, 2].iter().flat_map(|i| i.to_le_bytes()));
    let l = |offset: usize, row_bytes: usize| RowLayout::new(0, offset as i64, 3, row_bytes as i32);
    let be = HostBackend::new();
    let (dw, dx) = (upload(&be, &w), upload(&be, &[1f32; 5]));
    let df = upload(&be, &[1i32, 1, 0]);
    // The f32 gate/up launch over these rows, with or without up rows and a bias.
    let gate_up = |up_l: Option<RowLayout>, bias: Option<&HostBuf<f32>>, h: &mut HostBuf<f32>| {
        let k = GateUp {
            dtype: DType::F32,
            w: &dw,
            gate_l: l(0, rb),
            up_l,
            x: XArg::F32(&dx),
            cols,
            idx: None,
            n: 3,
            ids_l: l(6 * rb, 4),
            flags: Some(&df),
            bias,
            up_bias: None,
            act: FfnAct::from(Act::Relu),
            count: None,
            h,
        };
        launch(&be, k)
    };
    let mut h = be.zeros::<f32>(3).unwrap();
    gate_up(Some(l(3 * rb, rb)), None, &mut h).unwrap();
    assert_eq!(download(&be, &h), [0.0, 50.0, 0.0]);
    // Gate-less with a bias by neuron id: the NaN up rows are never read; a bias past the
    // ids' range is a Shape error.
    for (bias, want) in [
        (vec![10f32, 1.0, 7.0], Some([5.0, 6.0, 0.0])),
        (vec![1.0; 1], None),
    ] {
        let db = upload(&be, &bias);
        let r = gate_up(None, Some(&db), &mut h);
        match want {
            Some(want) => {
                r.unwrap();
                assert_eq!(download(&be, &h), want);
            }
            None => assert!(is_shape(r)),
        }
    }
    let mut y = be.zeros::<f32>(3).unwrap();
    launch(
        &be,
        SparseMatvec {
            ids: Some((&dw, l(6 * rb, 4))),
            flags: Some(&df),
            ..SparseMatvec::rows(DType::F32, &dw, l(0, rb), XArg::F32(&dx), cols, 3, &mut y)
        },
    )
    .unwrap();
    assert_eq!(download(&be, &y), [-5.0, 5.0, 0.0]);
}

#[test]
fn bad_rows_indices_and_ids_are_shape_errors() {
    let be = HostBackend::new();
    let (rows, cols) = (4, 32);
    let w = weight(DType::Q8_0, rows, cols, 1);
    let dw = upload_rows(&be, &w);
    let l = RowLayout::dense(rows, 34).unwrap();
    let run = |idx: Option<&[i32]>,
               n: usize,
               ids: Option<i32>,
               flags: Option<&[i32]>,
               x_len: usize,
               y_len: usize,
               cols: usize| {
        let didx = idx.map(|i| upload(&be, i));
        let dids = ids.map(|id| upload(&be, &id.to_le_bytes()));
        let df = flags.map(|f| upload(&be, f));
        // Q8_0 reads x quantized: 80 bytes per whole 32 values, a partial block short.
        let dx = upload(&be, &vec![0u8; x_len / 32 * XQ_BLOCK + x_len % 32]);
        let mut y = be.zeros::<f32>(y_len).unwrap();
        launch(
            &be,
            SparseMatvec {
                idx: didx.as_ref(),
                // Every row reads the id at byte 0 (one 4-byte row per group).
                ids: dids.as_ref().map(|d| (d, RowLayout::new(0, 0, 1 << 20, 0))),
                flags: df.as_ref(),
                ..SparseMatvec::rows(DType::Q8_0, &dw, l, XArg::Quant(&dx), cols, n, &mut y)
            },
        )
    };
    assert!(run(Some(&[0, 3, 1]), 3, None, None, cols, 3, cols).is_ok());
    assert!(
        is_shape(run(Some(&[0, 4]), 2, None, None, cols, 2, cols)),
        "row past a dense matrix"
    );
    assert!(
        is_shape(run(Some(&[0, -1]), 2, None, None, cols, 2, cols)),
        "negative index"
    );
    assert!(
        is_shape(run(Some(&[0]), 2, None, None, cols, 2, cols)),
        "short idx"
    );
    assert!(
        is_shape(run(None, 5, None, None, cols, 5, cols)),
        "n past the rows"
    );
    assert!(
        is_shape(run(None, 2, None, None, cols - 1, 2, cols)),
        "short x"
    );
    assert!(is_shape(run(None, 2, None, None, cols, 1, cols)), "short y");
    assert!(
        is_shape(run(None, 2, None, None, 40, 2, 40)),
        "cols not whole blocks"
    );
    assert!(
        is_shape(run(None, 2, Some(2), Some(&[1, 1]), cols, 2, cols)),
        "id past the flags"
    );
    assert!(
        is_shape(run(None, 2, None, Some(&[1, 1]), cols, 2, cols)),
        "flags without ids"
    );
    assert!(
        run(None, 2, Some(-1), Some(&[1, 1]), cols, 2, cols).is_ok(),
        "padding"
    );
    assert!(run(None, 2, Some(1), Some(&[1, 1]), cols, 2, cols).is_ok());
    // Floats where the format reads x quantized: refused.
    let mut y = be.zeros::<f32>(1).unwrap();
    let floats = upload(&be, &pseudo_random(cols, 2));
    let r = launch(
        &be,
        SparseMatvec::rows(DType::Q8_0, &dw, l, XArg::F32(&floats), cols, 1, &mut y),
    );
    assert!(
        matches!(r, Err(powerinfer_core::Error::Unsupported(_))),
        "{r:?}"
    );
    // A row layout the kernel would divide by zero with.
    let mut y = be.zeros::<f32>(1).unwrap();
    let bad = RowLayout::new(l.group_stride, l.offset, 0, l.row_bytes);
    let r = launch(
        &be,
        SparseMatvec::rows(
            DType::Q8_0,
            &dw,
            bad,
            XArg::Quant(&upload(&be, &[0u8; XQ_BLOCK])),
            cols,
            1,
            &mut y,
        ),
    );
    assert!(is_shape(r));
    // A slab layout whose rows run past the buffer.
    let slab = RowLayout::new(34 * 2, 0, 2, 34);
    let mut y = be.zeros::<f32>(5).unwrap();
    let r = launch(
        &be,
        SparseMatvec::rows(
            DType::Q8_0,
            &dw,
            slab,
            XArg::Quant(&upload(&be, &[0u8; XQ_BLOCK])),
            cols,
            5,
            &mut y,
        ),
    );
    let Err(powerinfer_core::Error::Shape(msg)) = r else {
        panic!("{r:?}")
    };
    assert!(
        msg.contains("sparse_matvec_q8_0") && msg.contains("row 4"),
        "{msg}"
    );
}

/// The host's quantize_x keeps its rule (q within ±32639, the block's largest |x| at the
/// end of the range, NaN blocks NaN) and a matvec over the quantized x equals one over the
/// floats it stands for.
#[test]
fn quantized_x_stands_for_its_dequantized_floats() {
    let be = HostBackend::new();
    let cols = 32 * 5;
    let mut x = pseudo_random(cols, 9);
    x[70] = f32::NAN;
    let dx = upload(&be, &x);
    let mut xq = be.zeros::<u8>(crate::layout::xq_bytes(cols)).unwrap();
    launch(
        &be,
        QuantizeX {
            x: &dx,
            cols,
            xq: &mut xq,
        },
    )
    .unwrap();
    let hat = super::host::x_values(XSlice::Quant(xq.as_slice()), cols)
        .unwrap()
        .into_owned();
    for (b, (v, h)) in x.chunks(32).zip(hat.chunks(32)).enumerate() {
        if b == 2 {
            assert!(h.iter().all(|v| v.is_nan()), "the NaN block");
            continue;
        }
        let amax = v.iter().fold(0f32, |m, a| m.max(a.abs()));
        for (a, e) in v.iter().zip(h) {
            assert!((a - e).abs() <= amax / 32639.0, "{a} vs {e}");
        }
        assert!(h.iter().any(|e| e.abs() == amax / 32639.0 * 32639.0));
    }
    // The matvec over finite x: block 2 quantized again without its NaN.
    let mut x2 = x.clone();
    x2[70] = 0.5;
    let dx2 = upload(&be, &x2);
    let quantize = QuantizeX {
        x: &dx2,
        cols,
        xq: &mut xq,
    };
    launch(&be, quantize).unwrap();
    let hat = super::host::x_values(XSlice::Quant(xq.as_slice()), cols)
        .unwrap()
        .into_owned();
    assert!(hat.iter().all(|v| v.is_finite()));
    let (rows, w) = (3, weight(DType::Q4_0, 3, cols, 4));
    let dw = upload_rows(&be, &w);
    let l = RowLayout::dense(rows, DType::Q4_0.row_bytes(cols).unwrap()).unwrap();
    let mut dy = be.zeros::<f32>(rows).unwrap();
    let matvec = SparseMatvec::rows(DType::Q4_0, &dw, l, XArg::Quant(&xq), cols, rows, &mut dy);
    launch(&be, matvec).unwrap();
    let got = download(&be, &dy);
    for (r, g) in got.iter().enumerate() {
        let want = powerinfer_cpu::dot_row(DType::Q4_0, w.row(r), &hat);
        assert_eq!(g.to_bits(), want.to_bits(), "row {r}");
    }
}
