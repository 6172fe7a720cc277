//! Latent attention's per-head products for one token as one parallel pass: each head's own
//! small weight (`attn_k_b[h]`: `kv_lora_rank × qk_nope`, `attn_v_b[h]`: `v_head_dim ×
//! kv_lora_rank`) times its own slice of the token's values. One matvec per head costs a
//! fork-join of the pool each (10-25 µs on a 2-vCPU VM, see `powerinfer_cpu::in_pass`), two per
//! head and layer: at DeepSeek-V3's 128 heads and 61 layers that is some 15 000 fork-joins a
//! token. Here every thread takes its byte share of all the heads' rows at once
//! ([`powerinfer_cpu::Pass::share`]), each head's x prepared once
//! ([`powerinfer_cpu::PreparedX`]): the same kernel over the same prepared x as the matvec, so
//! the same bits.

use powerinfer_core::{ensure, Result, Weight};
use powerinfer_cpu::{in_pass, Disjoint, PreparedX};

/// Rows per piece of a thread's share (the matvec kernels' row groups).
const ALIGN: usize = 8;

/// For every head h: `out[h · stride + at..][..ws[h].rows] = ws[h] · x_of(h)`, one token.
pub(crate) fn heads_matvec<'x>(
    ws: &[Weight],
    x_of: impl Fn(usize) -> &'x [f32],
    out: &mut [f32],
    stride: usize,
    at: usize,
) -> Result<()> {
    let quantized = ws.iter().any(|w| w.dtype.is_quantized());
    let xs: Vec<PreparedX<'x>> = (0..ws.len())
        .map(|h| PreparedX::new(x_of(h), quantized))
        .collect();
    for (h, (w, x)) in ws.iter().zip(&xs).enumerate() {
        x.check(w)?;
        ensure!(
            at + w.rows <= stride && (h + 1) * stride <= out.len(),
            Shape,
            "head {h}'s {} outputs at {at} of {stride} a head, {} values in all",
            w.rows,
            out.len()
        );
    }
    let items: Vec<(usize, usize)> = ws.iter().map(|w| (w.rows, w.row_bytes())).collect();
    let mut bufs = [out];
    let d = Disjoint::new(&mut bufs);
    in_pass(|pass| {
        pass.share(&items, ALIGN, |h, rows| {
            let lo = h * stride + at;
            // SAFETY: the pass's shares are disjoint row ranges, and head h's rows land in its
            // own span `h·stride + at..h·stride + at + rows` (checked: at + rows <= stride), so
            // no two threads write the same values; nothing reads `out` until the pass ends.
            let o = unsafe { d.part(0, lo + rows.start..lo + rows.end) };
            xs[h].rows(&ws[h], rows, o);
        })
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::{quantize_row, Buffer, DType};
    use powerinfer_cpu::matvec;

    fn weight(dtype: DType, rows: usize, cols: usize, seed: usize) -> Weight {
        let rb = dtype.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rows * rb];
        for r in 0..rows {
            let src: Vec<f32> = (0..cols)
                .map(|c| ((r * 31 + c * 17 + seed * 7) % 97) as f32 / 48.0 - 1.0)
                .collect();
            quantize_row(dtype, &src, &mut bytes[r * rb..(r + 1) * rb]).unwrap();
        }
        Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
    }

    /// Every head's outputs are its matvec's bits, in its own span; the rest untouched.
    #[test]
    fn heads_give_their_matvecs_bits() {
        for (dtype, rows, cols, heads) in [
            (DType::Q8_0, 40, 96, 5),
            (DType::Q5_0, 64, 32, 3),
            (DType::F32, 13, 20, 7),
            (DType::Q4_K, 24, 256, 2),
        ] {
            let ws: Vec<Weight> = (0..heads).map(|h| weight(dtype, rows, cols, h)).collect();
            let x: Vec<f32> = (0..heads * cols)
                .map(|i| ((i * 13) % 29) as f32 / 9.0 - 1.5)
                .collect();
            let (stride, at) = (rows + 6, 4);
            let mut out = vec![f32::NAN; heads * stride];
            heads_matvec(&ws, |h| &x[h * cols..(h + 1) * cols], &mut out, stride, at).unwrap();
            for (h, w) in ws.iter().enumerate() {
                let mut want = vec![0f32; rows];
                matvec(w, &x[h * cols..(h + 1) * cols], &mut want).unwrap();
                let span = &out[h * stride..(h + 1) * stride];
                assert_eq!(&span[at..at + rows], &want[..], "{dtype} head {h}");
                assert!(span[..at]
                    .iter()
                    .chain(&span[at + rows..])
                    .all(|v| v.is_nan()));
            }
        }
    }

    #[test]
    fn a_head_wider_than_its_span_is_refused() {
        let ws = vec![weight(DType::F32, 8, 4, 0)];
        let x = [1.0f32; 4];
        let mut out = vec![0f32; 10];
        assert!(heads_matvec(&ws, |_| &x[..], &mut out, 10, 3).is_err());
        assert!(heads_matvec(&ws, |_| &x[..3], &mut out, 10, 0).is_err());
    }
}
