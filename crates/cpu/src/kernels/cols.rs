//! Portable kernel of the input-sparse matvec ([`crate::ops::input_major`]): a range of output
//! rows over the kept columns of some groups, integer group sums as the AVX2 kernel forms them.

use half::{bf16, f16};

use crate::operands::input_major::{
    line_pos, ActiveInput, GroupInput, InputMajor, Lines, ScaleType,
};

/// The stored value of row `r` in a quantized column line (`q`, offset added back).
#[inline]
pub(crate) fn quant_at(m: &InputMajor, line: &[u8], r: usize) -> i32 {
    let (at, hi) = line_pos(m.lines, r);
    match m.lines {
        Lines::Nibble => (if hi { line[at] >> 4 } else { line[at] & 15 }) as i32 + m.off,
        _ => line[at] as i8 as i32,
    }
}

/// Entry `r` of a scale or min table.
#[inline]
pub(crate) fn table_at(m: &InputMajor, table: &[u8], r: usize) -> f32 {
    match m.scales {
        ScaleType::F16 => f16::from_le_bytes([table[2 * r], table[2 * r + 1]]).to_f32(),
        ScaleType::F32 => f32::from_le_bytes(table[4 * r..4 * r + 4].try_into().unwrap()),
    }
}

/// Row `r` of a float column line.
#[inline]
pub(crate) fn float_at(m: &InputMajor, line: &[u8], r: usize) -> f32 {
    match m.lines {
        Lines::F32 => f32::from_le_bytes(line[4 * r..4 * r + 4].try_into().unwrap()),
        Lines::F16 => f16::from_le_bytes([line[2 * r], line[2 * r + 1]]).to_f32(),
        _ => bf16::from_le_bytes([line[2 * r], line[2 * r + 1]]).to_f32(),
    }
}

/// `out` (rows `rows.0..rows.1`) = Σ over `groups` of their kept columns times their inputs.
pub(crate) fn cols_tile(
    m: &InputMajor,
    rows: (usize, usize),
    a: &ActiveInput,
    groups: &[GroupInput],
    out: &mut [f32],
) {
    let (r0, n) = (rows.0, rows.1 - rows.0);
    let out = &mut out[..n];
    out.fill(0.0);
    let lb = m.line_bytes;
    let table = m.table_bytes();
    let mut acc = vec![0i32; n];
    for gi in groups {
        let chunk = m.chunk(gi.g as usize);
        let body = &chunk[table..];
        if m.lines.is_float() {
            for k in gi.cols.0 as usize..gi.cols.1 as usize {
                let (c, x) = (a.cols[k] as usize, a.x[k]);
                let line = &body[c * lb..(c + 1) * lb];
                for (r, o) in out.iter_mut().enumerate() {
                    *o += x * float_at(m, line, r0 + r);
                }
            }
            continue;
        }
        acc.fill(0);
        for p in &a.pairs[gi.pairs.0 as usize..gi.pairs.1 as usize] {
            let (x0, x1) = (p.xq as i16 as i32, (p.xq >> 16) as i16 as i32);
            let l0 = &body[p.c[0] as usize * lb..][..lb];
            let l1 = &body[p.c[1] as usize * lb..][..lb];
            for (r, v) in acc.iter_mut().enumerate() {
                *v += x0 * quant_at(m, l0, r0 + r) + x1 * quant_at(m, l1, r0 + r);
            }
        }
        let mins = &chunk[m.scale_table_bytes()..];
        for (r, o) in out.iter_mut().enumerate() {
            let s = table_at(m, chunk, r0 + r);
            let mut v = s * (gi.xs * acc[r] as f32);
            if m.has_min {
                v += table_at(m, mins, r0 + r) * (gi.xs * gi.sumq as f32);
            }
            *o += v;
        }
    }
}
