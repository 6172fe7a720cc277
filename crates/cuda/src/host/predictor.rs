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
