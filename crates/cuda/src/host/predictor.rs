//! The predictor kernels (predictor.cu): fc2 with its threshold, the ordered compaction of
//! flags into an index list, and the split of a layer's flags into hot slots and cold neurons.

use powerinfer_core::Result;

use super::view::{index, shape, Rows};

/// `logit[j] = Σ_{h : hidden[h] > 0} hidden[h] · fc2_t[h][j]` (summed in h order),
/// `flags[j] = logit[j] >= threshold`, `logits[j] = logit[j]` when given; `fc2_t` has `ffn`
/// columns, `flags` and `logits` hold ffn values, `hidden` the rank.
pub(super) fn predictor_fc2(
    fc2_t: &Rows<'_>,
    hidden: &[f32],
    threshold: f32,
    flags: &mut [i32],
    logits: Option<&mut [f32]>,
) -> Result<()> {
    let mut sum = vec![0f32; fc2_t.cols];
    let mut row = vec![0f32; fc2_t.cols];
    for (h, &v) in hidden.iter().enumerate() {
        if v > 0.0 {
            fc2_t.decode(h, &mut row)?;
            for (s, &w) in sum.iter_mut().zip(&row) {
                *s += v * w;
            }
        }
    }
    for (f, &s) in flags.iter_mut().zip(&sum) {
        *f = i32::from(s >= threshold);
    }
    if let Some(logits) = logits {
        logits.copy_from_slice(&sum);
    }
    Ok(())
}

/// `out[0..count) = the i with flags[i] != 0`, ascending; `count` = how many. `out` must hold
/// them all.
pub(super) fn compact_flags(flags: &[i32], out: &mut [i32], count: &mut i32) -> Result<()> {
    let mut at = 0;
    for (i, _) in flags.iter().enumerate().filter(|(_, &f)| f != 0) {
        let slot = out
            .get_mut(at)
            .ok_or_else(|| shape(format!("out holds {} indices, more flags are set", at)))?;
        *slot = i as i32;
        at += 1;
    }
    *count = at as i32;
    Ok(())
}

/// For the hot slots r in 0..n (`slot_flags` holds n): `slot_flags[r] = flags[id(r)]` and
/// `flags[id(r)] = 0`, or `slot_flags[r] = 0` for a padding slot (id < 0).
pub(super) fn split_hot_flags(
    ids: &Rows<'_>,
    flags: &mut [i32],
    slot_flags: &mut [i32],
) -> Result<()> {
    for (r, slot) in slot_flags.iter_mut().enumerate() {
        let id = ids.id(r)?;
        *slot = 0;
        if id >= 0 {
            let i = index(id, flags.len(), "neuron id")?;
            *slot = flags[i];
            flags[i] = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use powerinfer_core::testing::pseudo_random;
    use powerinfer_core::DType;
    use powerinfer_cpu::reference;

    use super::super::testutil::*;
    use crate::backend::{Backend, Launch};
    use crate::kernels::GPU_DTYPES;
    use crate::layout::RowLayout;
    use crate::{HostBackend, HostBuf};

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
        launch(
            be,
            Launch::PredictorFc2 {
                dtype,
                fc2_t: w,
                l,
                hidden: &dh,
                rank: hidden.len(),
                ffn,
                threshold,
                flags: &mut flags,
                logits: Some(&mut logits),
            },
        )
        .unwrap();
        let mut flags_only = upload(be, &vec![7i32; ffn]);
        launch(
            be,
            Launch::PredictorFc2 {
                dtype,
                fc2_t: w,
                l,
                hidden: &dh,
                rank: hidden.len(),
                ffn,
                threshold,
                flags: &mut flags_only,
                logits: None,
            },
        )
        .unwrap();
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
            let dw = upload(&be, w.bytes());
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
        // A hidden unit past fc2_t's rows, and short outputs, are errors.
        let dh = upload(&be, &[1f32; 4]);
        let mut f = be.zeros::<i32>(3).unwrap();
        let r = launch(
            &be,
            Launch::PredictorFc2 {
                dtype: DType::F32,
                fc2_t: &dw,
                l,
                hidden: &dh,
                rank: 4,
                ffn: 3,
                threshold: 0.0,
                flags: &mut f,
                logits: None,
            },
        );
        assert!(is_shape(r));
        let mut short = be.zeros::<f32>(2).unwrap();
        let r = launch(
            &be,
            Launch::PredictorFc2 {
                dtype: DType::F32,
                fc2_t: &dw,
                l,
                hidden: &dh,
                rank: 3,
                ffn: 3,
                threshold: 0.0,
                flags: &mut f,
                logits: Some(&mut short),
            },
        );
        assert!(is_shape(r));
    }

    #[test]
    fn compact_flags_lists_the_set_flags_in_order() {
        let be = HostBackend::new();
        let n = 1000;
        let mut f = flags(n + 3, 130);
        f[n..].fill(1); // past n: ignored
        f[0] = 0;
        f[n - 1] = -2; // any nonzero
        let want: Vec<i32> = (0..n as i32).filter(|&i| f[i as usize] != 0).collect();
        let df = upload(&be, &f);
        let mut out = upload(&be, &vec![-9i32; n]);
        let mut count = be.zeros::<i32>(1).unwrap();
        launch(
            &be,
            Launch::CompactFlags {
                flags: &df,
                n,
                out: &mut out,
                count: &mut count,
            },
        )
        .unwrap();
        let c = download(&be, &count)[0] as usize;
        assert_eq!(c, want.len());
        let out = download(&be, &out);
        assert_eq!(out[..c], want[..]);
        assert!(out[c..].iter().all(|&v| v == -9));
        assert_eq!(*want.last().unwrap(), n as i32 - 1);
        // An output too short for the set flags.
        let mut out = be.zeros::<i32>(want.len() - 1).unwrap();
        let r = launch(
            &be,
            Launch::CompactFlags {
                flags: &df,
                n,
                out: &mut out,
                count: &mut count,
            },
        );
        assert!(is_shape(r));
        // n = 0: nothing.
        let mut out = be.zeros::<i32>(0).unwrap();
        let mut count = upload(&be, &[5i32]);
        launch(
            &be,
            Launch::CompactFlags {
                flags: &df,
                n: 0,
                out: &mut out,
                count: &mut count,
            },
        )
        .unwrap();
        assert_eq!(download(&be, &count), [0]);
    }

    #[test]
    fn split_hot_flags_moves_the_hot_flags_to_their_slots() {
        let be = HostBackend::new();
        let hot = hot(&be, DType::Q4_1, DType::F16, 64, 140);
        let f = flags(FFN, 141);
        let mut df = upload(&be, &f);
        let n = hot.slots();
        let mut slots = upload(&be, &vec![9i32; n + 1]);
        launch(
            &be,
            Launch::SplitHotFlags {
                ids_base: &hot.buf,
                ids_l: hot.layout.ids,
                n,
                flags: &mut df,
                slot_flags: &mut slots,
            },
        )
        .unwrap();
        let slots = download(&be, &slots);
        for (r, &got) in slots[..n].iter().enumerate() {
            assert_eq!(got, hot.id(r).map_or(0, |id| f[id]), "slot {r}");
        }
        assert_eq!(slots[n], 9);
        let left = download(&be, &df);
        for (j, (&got, &was)) in left.iter().zip(&f).enumerate() {
            let hot_neuron = hot.ids.contains(&(j as u32));
            assert_eq!(got, if hot_neuron { 0 } else { was }, "neuron {j}");
        }
        // Flags too short for the ids, or slots past the slabs.
        let mut short = be.zeros::<i32>(10).unwrap();
        let mut slots = be.zeros::<i32>(n + 8).unwrap();
        for (flags, n) in [(&mut short, n), (&mut df, n + 8)] {
            let r = launch(
                &be,
                Launch::SplitHotFlags {
                    ids_base: &hot.buf,
                    ids_l: hot.layout.ids,
                    n,
                    flags,
                    slot_flags: &mut slots,
                },
            );
            assert!(is_shape(r));
        }
    }
}
