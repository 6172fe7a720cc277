//! The family's kernels on the host backend against their contracts.

use powerinfer_core::testing::pseudo_random;
use powerinfer_core::DType;
use powerinfer_cpu::sparse_reference;

use super::launch::{AddSplits, AxpyRows};
use crate::host::HostBackend;
use crate::kernels::GPU_DTYPES;
use crate::layout::RowLayout;
use crate::ops::testutil::*;

const TOL: f32 = 1e-4;

/// axpy_rows, then add_splits for more than one split (what ops::hot_down queues).
fn axpy(be: &HostBackend, l: AxpyRows<'_, HostBackend>) -> powerinfer_core::Result<()> {
    let AxpyRows {
        dtype,
        w,
        l,
        cols,
        idx,
        a,
        n,
        y,
        splits,
        ..
    } = l;
    let mut part = upload(be, &vec![f32::NAN; splits * cols]);
    let first = AxpyRows {
        idx,
        part: (splits > 1).then_some(&mut part),
        splits,
        ..AxpyRows::rows(dtype, w, l, cols, a, n, &mut *y)
    };
    launch(be, first)?;
    if splits > 1 {
        let add = AddSplits {
            part: &part,
            splits,
            cols,
            count: None,
            n: 0,
            y,
        };
        launch(be, add)?;
    }
    Ok(())
}

#[test]
fn axpy_rows_accumulates_like_the_reference_on_every_format() {
    let be = HostBackend::new();
    for (i, dtype) in GPU_DTYPES.into_iter().enumerate() {
        let (rows, cols) = (41, odd_cols(dtype));
        let w = weight(dtype, rows, cols, 50 + i as u64);
        let idx: Vec<u32> = (0..29).map(|k| (k * 17 + 2) % rows as u32).collect();
        let mut a = pseudo_random(idx.len(), 60 + i as u64);
        a[3] = 0.0;
        a[10] = 0.0;
        let y0 = pseudo_random(cols, 70 + i as u64);
        let dw = upload_rows(&be, &w);
        let l = RowLayout::dense(rows, dtype.row_bytes(cols).unwrap()).unwrap();
        let didx = upload(&be, &idx.iter().map(|&v| v as i32).collect::<Vec<_>>());
        let da = upload(&be, &a);
        for splits in [1, 4] {
            let mut want = y0.clone();
            sparse_reference::axpy_rows(&w, &idx, &a, &mut want).unwrap();
            let mut y = upload(&be, &y0);
            axpy(
                &be,
                AxpyRows {
                    idx: Some(&didx),
                    splits,
                    ..AxpyRows::rows(dtype, &dw, l, cols, &da, idx.len(), &mut y)
                },
            )
            .unwrap();
            assert_close(&download(&be, &y), &want, TOL, &format!("{dtype} idx"));
        }
        // Without a list: rows 0..n.
        let all: Vec<u32> = (0..rows as u32).collect();
        let a = pseudo_random(rows, 80 + i as u64);
        let mut want = y0.clone();
        sparse_reference::axpy_rows(&w, &all, &a, &mut want).unwrap();
        let da = upload(&be, &a);
        let mut y = upload(&be, &y0);
        axpy(&be, AxpyRows::rows(dtype, &dw, l, cols, &da, rows, &mut y)).unwrap();
        assert_close(&download(&be, &y), &want, TOL, &format!("{dtype} dense"));
    }
}

#[test]
fn axpy_over_hot_down_slabs() {
    let be = HostBackend::new();
    for (i, down) in GPU_DTYPES.into_iter().enumerate() {
        let gate = GPU_DTYPES[(i + 3) % GPU_DTYPES.len()];
        let dim = hot_dim(down, gate);
        let hot = hot(&be, gate, down, dim, 90 + i as u64);
        // Coefficients for every slot, padding included (its rows are zero).
        let h = pseudo_random(hot.slots(), 95 + i as u64);
        let y0 = pseudo_random(dim, 96);
        let mut want = y0.clone();
        sparse_reference::axpy_rows(&hot.down, &hot.ids, &h[..hot.ids.len()], &mut want).unwrap();
        let dh = upload(&be, &h);
        let mut y = upload(&be, &y0);
        axpy(
            &be,
            AxpyRows {
                splits: 2,
                ..AxpyRows::rows(
                    down,
                    &hot.buf,
                    hot.layout.down,
                    dim,
                    &dh,
                    hot.slots(),
                    &mut y,
                )
            },
        )
        .unwrap();
        assert_close(&download(&be, &y), &want, TOL, &format!("{down}"));
    }
}

#[test]
fn zero_coefficients_skip_their_rows_and_bad_arguments_are_errors() {
    let be = HostBackend::new();
    let nan: Vec<u8> = [f32::NAN; 3].iter().flat_map(|v| v.to_le_bytes()).collect();
    let one: Vec<u8> = [1f32, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let dw = upload(&be, &[nan, one].concat());
    let l = RowLayout::dense(2, 12).unwrap();
    let run = |idx: Option<&[i32]>, a: &[f32], n: usize, y_len: usize, splits: usize| {
        let didx = idx.map(|i| upload(&be, i));
        let da = upload(&be, a);
        let mut y = upload(&be, &vec![1f32; y_len]);
        axpy(
            &be,
            AxpyRows {
                idx: didx.as_ref(),
                splits,
                ..AxpyRows::rows(DType::F32, &dw, l, 3, &da, n, &mut y)
            },
        )
        .map(|()| download(&be, &y))
    };
    assert_eq!(run(None, &[0.0, 2.0], 2, 3, 1).unwrap(), [3.0, 5.0, 7.0]);
    assert_eq!(
        run(Some(&[1, 0, 1]), &[1.0, 0.0, -1.0], 3, 3, 1).unwrap(),
        [1.0, 1.0, 1.0]
    );
    let shape = |r: powerinfer_core::Result<Vec<f32>>| is_shape(r.map(|_| ()));
    assert!(
        shape(run(Some(&[2]), &[1.0], 1, 3, 1)),
        "row past the matrix"
    );
    assert!(shape(run(Some(&[-3]), &[1.0], 1, 3, 1)), "negative index");
    assert!(shape(run(None, &[1.0], 2, 3, 1)), "short a");
    assert!(shape(run(None, &[1.0, 1.0], 2, 2, 1)), "short y");
    assert!(shape(run(None, &[1.0, 1.0], 2, 3, 0)), "no split");
}
