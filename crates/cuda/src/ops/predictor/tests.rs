//! The family's kernels on the host backend against their contracts.

use powerinfer_core::testing::pseudo_random;
use powerinfer_core::DType;
use powerinfer_cpu::reference;

use super::launch::PredictorFc2;
use crate::backend::Backend;
use crate::host::{HostBackend, HostBuf};
use crate::kernels::GPU_DTYPES;
use crate::layout::RowLayout;
use crate::ops::testutil::*;

/// Run predictor_fc2 over `fc2_t` ([rank, ffn] in `dtype`): (flags, logits).
fn fc2(
    be: &HostBackend,
    dtype: DType,
    w: &HostBuf<u8>,
    l: RowLayout,
    hidden: &[f32],
    ffn: usize,
    threshold: f32,
) -> (Vec<i32>, Vec<f32>) {
    let dh = upload(be, hidden);
    let mut flags = upload(be, &vec![7i32; ffn]);
    let mut logits = be.zeros::<f32>(ffn + 1).unwrap();
    let mut flags_only = upload(be, &vec![7i32; ffn]);
    // With the logits kept, and without.
    for (flags, logits) in [(&mut flags, Some(&mut logits)), (&mut flags_only, None)] {
        let (fc2_t, hidden, rank) = (w, &dh, hidden.len());
        let launched = PredictorFc2 {
            dtype,
            fc2_t,
            l,
            hidden,
            rank,
            ffn,
            threshold,
            flags,
            logits,
        };
        launch(be, launched).unwrap();
    }
    let flags = download(be, &flags);
    assert_eq!(flags, download(be, &flags_only));
    let logits = download(be, &logits);
    assert_eq!(logits[ffn], 0.0);
    (flags, logits[..ffn].to_vec())
}

#[test]
fn predictor_fc2_sums_positive_hidden_units_and_thresholds() {
    let be = HostBackend::new();
    for (i, dtype) in GPU_DTYPES.into_iter().enumerate() {
        let (rank, ffn) = (37, odd_cols(dtype));
        let w = weight(dtype, rank, ffn, 110 + i as u64);
        let mut hidden = pseudo_random(rank, 120 + i as u64);
        hidden[4] = 0.0;
        let dw = upload_rows(&be, &w);
        let l = RowLayout::dense(rank, dtype.row_bytes(ffn).unwrap()).unwrap();
        let threshold = 0.1;
        let (flags, logits) = fc2(&be, dtype, &dw, l, &hidden, ffn, threshold);
        let mut row = vec![0f32; ffn];
        let mut want = vec![0f64; ffn];
        for (h, &v) in hidden.iter().enumerate() {
            if v > 0.0 {
                reference::dequantize_row(dtype, w.row(h), &mut row).unwrap();
                for (s, &x) in want.iter_mut().zip(&row) {
                    *s += v as f64 * x as f64;
                }
            }
        }
        let want: Vec<f32> = want.iter().map(|&v| v as f32).collect();
        assert_close(&logits, &want, 1e-4, &format!("{dtype} logits"));
        for j in 0..ffn {
            assert_eq!(flags[j], i32::from(logits[j] >= threshold), "{dtype} {j}");
            if (want[j] - threshold).abs() > 1e-3 {
                assert_eq!(flags[j], i32::from(want[j] >= threshold), "{dtype} {j}");
            }
        }
        assert!(flags.contains(&0) && flags.contains(&1));
        // The threshold is inclusive.
        let j = 5;
        let (flags, _) = fc2(&be, dtype, &dw, l, &hidden, ffn, logits[j]);
        assert_eq!(flags[j], 1);
        let (flags, _) = fc2(&be, dtype, &dw, l, &hidden, ffn, logits[j].next_up());
        assert_eq!(flags[j], 0);
    }
}

#[test]
fn rows_of_non_positive_hidden_units_are_not_read() {
    let be = HostBackend::new();
    let rows: Vec<f32> = [[f32::NAN; 3], [1.0, -2.0, 0.5], [f32::NAN; 3]].concat();
    let bytes: Vec<u8> = rows.iter().flat_map(|v| v.to_le_bytes()).collect();
    let dw = upload(&be, &bytes);
    let l = RowLayout::dense(3, 12).unwrap();
    let (flags, logits) = fc2(&be, DType::F32, &dw, l, &[0.0, 2.0, -1.0], 3, 1.0);
    assert_eq!(logits, [2.0, -4.0, 1.0]);
    assert_eq!(flags, [1, 0, 1]);
    // A hidden unit past fc2_t's rows (rank 4), and short logits, are errors.
    let dh = upload(&be, &[1f32; 4]);
    let mut f = be.zeros::<i32>(3).unwrap();
    let mut short = be.zeros::<f32>(2).unwrap();
    for (rank, logits) in [(4, None), (3, Some(&mut short))] {
        let (dtype, hidden, threshold) = (DType::F32, &dh, 0.0);
        let flags = &mut f;
        let bad = PredictorFc2 {
            dtype,
            fc2_t: &dw,
            l,
            hidden,
            rank,
            ffn: 3,
            threshold,
            flags,
            logits,
        };
        assert!(is_shape(launch(&be, bad)), "rank {rank}");
    }
}
