//! The kept neurons of a dense activation vector as (index, value) lists, for an axpy over
//! their rows ([`crate::axpy_rows`]).

/// `idx` and `vals` set to the positions i and values of `h` with |h\[i\]| >= `t`, in order;
/// branch-free (which neurons pass follows no predictable pattern): every position is written
/// at the next free slot and the slot advances only when it passes.
pub fn compact_kept(h: &[f32], t: f32, idx: &mut Vec<u32>, vals: &mut Vec<f32>) {
    idx.resize(h.len(), 0);
    vals.resize(h.len(), 0.0);
    let mut k = 0;
    for (i, &v) in h.iter().enumerate() {
        idx[k] = i as u32;
        vals[k] = v;
        k += usize::from(v.abs() >= t);
    }
    idx.truncate(k);
    vals.truncate(k);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_values_at_or_past_the_threshold_in_order() {
        let (mut idx, mut vals) = (vec![7; 9], vec![]);
        compact_kept(&[0.5, -2.0, 1.0, 0.0, -1.0, 0.99], 1.0, &mut idx, &mut vals);
        assert_eq!(idx, [1, 2, 4]);
        assert_eq!(vals, [-2.0, 1.0, -1.0]);
        compact_kept(&[], 1.0, &mut idx, &mut vals);
        assert!(idx.is_empty() && vals.is_empty());
    }
}
