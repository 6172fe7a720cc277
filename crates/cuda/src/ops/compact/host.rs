//! The contracts of `compact_nonzero` and `compact_flags` (compact.cu) on host memory: lists
//! gathered in entry order, their count written to a one-int buffer.

use powerinfer_core::Result;

use crate::host::view::{index, prefix, Rows};

/// The entries k < m with `a[k] != 0` (a NaN kept): `out_idx[j] = idx[k]` (k without a list),
/// `out_a[j] = a[k]`; returns how many.
pub(crate) fn compact_nonzero(
    a: &[f32],
    idx: Option<&[i32]>,
    m: usize,
    out_idx: &mut [i32],
    out_a: &mut [f32],
) -> Result<usize> {
    let a = prefix(a, m, "a")?;
    let idx = idx.map(|i| prefix(i, m, "idx")).transpose()?;
    let mut j = 0;
    for (k, &v) in a.iter().enumerate() {
        if v == 0.0 {
            continue;
        }
        out_idx[j] = idx.map_or(k as i32, |i| i[k]);
        out_a[j] = v;
        j += 1;
    }
    Ok(j)
}

/// The slots s < n whose id (read through `ids`) is not padding and whose flag is set, into
/// `out_idx`; returns how many. An id past the flags is a Shape error.
pub(crate) fn compact_flags(
    ids: &Rows<'_>,
    flags: &[i32],
    n: usize,
    out_idx: &mut [i32],
) -> Result<usize> {
    let mut j = 0;
    for s in 0..n {
        let id = ids.id(s)?;
        if id >= 0 && flags[index(id, flags.len(), "neuron id")?] != 0 {
            out_idx[j] = s as i32;
            j += 1;
        }
    }
    Ok(j)
}
