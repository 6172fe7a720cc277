//! The GPU's row layout of the quantized formats with GPU kernels (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1
//! and the K-quants Q4_K, Q5_K, Q6_K).
//!
//! GGUF stores each block as a header (scales, mins, the fifth bits of the 32-weight formats)
//! and its quants, so a row is blocks of 18–34 bytes (144–210 for the K-quants): only 2-byte
//! aligned, which keeps a GPU warp to byte and u16 loads. On the device a row of `nb` blocks
//! holds the same bytes permuted: first the `nb` blocks' quants (16, 32, 128, 160 or 192 bytes
//! each), then the `nb` headers (in block order, each as GGUF lays it out). The row's size is
//! unchanged, so slabs, layouts and the plan's accounting are too, and a row that starts 16-byte
//! aligned has every block's quants at a 16-byte boundary: 16-byte loads (`lane_dot_q*` and the
//! tiles in common.cuh).
//!
//! Every upload of weights to a device (`UploadOps::upload_weight`, [`crate::pack_hot_slabs`])
//! repacks rows of these formats; the kernels and the host backend read them so. The other formats keep GGUF's layout.

use powerinfer_core::{ensure, DType, Result};

/// How a format's block splits into quants and header (scales, mins, the scalar fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSplit {
    /// Bytes of the quants (low bits and high bits, as GGUF orders them).
    pub quants: usize,
    /// Bytes of the header.
    pub header: usize,
    /// Whether GGUF puts the header before the quants (all but Q6_K, whose scales and d end
    /// its block).
    pub header_first: bool,
}

/// The block split of a format stored repacked on a device (None: the format keeps GGUF's
/// layout). The 32-weight formats' header is the f16 scale, min and the u32 of fifth bits; the
/// K-quants' is d, dmin and the 12 packed scale bytes (Q4_K, Q5_K: the quants are Q5_K's qh
/// then qs) or the 16 i8 scales and d (Q6_K: the quants are ql then qh).
pub const fn repacked_split(dtype: DType) -> Option<BlockSplit> {
    let (quants, header, header_first) = match dtype {
        DType::Q8_0 => (32, 2, true),
        DType::Q4_0 => (16, 2, true),
        DType::Q4_1 => (16, 4, true),
        DType::Q5_0 => (16, 6, true),
        DType::Q5_1 => (16, 8, true),
        DType::Q4_K => (128, 16, true),
        DType::Q5_K => (160, 16, true),
        DType::Q6_K => (192, 18, false),
        _ => return None,
    };
    Some(BlockSplit {
        quants,
        header,
        header_first,
    })
}

/// Whether `dtype`'s rows are repacked on a device.
pub const fn is_repacked(dtype: DType) -> bool {
    repacked_split(dtype).is_some()
}

/// Rows of `row_bytes` bytes from `src` (GGUF layout) to `dst` (device layout), or back
/// (`to_device` false). Both hold whole rows of the same length.
fn permute(dtype: DType, row_bytes: usize, src: &[u8], dst: &mut [u8], to_device: bool) {
    let Some(BlockSplit {
        quants: q,
        header: h,
        header_first,
    }) = repacked_split(dtype)
    else {
        dst.copy_from_slice(src);
        return;
    };
    // Where a GGUF block's header and quants lie inside it.
    let (hs, qs) = if header_first { (0, h) } else { (q, 0) };
    let nb = row_bytes / (q + h);
    for (s, d) in src
        .chunks_exact(row_bytes)
        .zip(dst.chunks_exact_mut(row_bytes))
    {
        if to_device {
            let (quants, headers) = d.split_at_mut(nb * q);
            for (b, blk) in s.chunks_exact(q + h).enumerate() {
                headers[b * h..(b + 1) * h].copy_from_slice(&blk[hs..hs + h]);
                quants[b * q..(b + 1) * q].copy_from_slice(&blk[qs..qs + q]);
            }
        } else {
            let (quants, headers) = s.split_at(nb * q);
            for (b, blk) in d.chunks_exact_mut(q + h).enumerate() {
                blk[hs..hs + h].copy_from_slice(&headers[b * h..(b + 1) * h]);
                blk[qs..qs + q].copy_from_slice(&quants[b * q..(b + 1) * q]);
            }
        }
    }
}

/// `rows` (GGUF layout, whole rows of `cols` weights of `dtype`) in the device layout.
/// `Error::Shape` when the bytes are no whole number of rows.
pub fn repack_rows(dtype: DType, cols: usize, rows: &[u8]) -> Result<Vec<u8>> {
    let rb = dtype.row_bytes(cols)?;
    ensure!(
        rb > 0 && rows.len().is_multiple_of(rb),
        Shape,
        "{} bytes are no whole number of {dtype} rows of {cols} weights",
        rows.len()
    );
    let mut out = vec![0u8; rows.len()];
    permute(dtype, rb, rows, &mut out, true);
    Ok(out)
}

/// One row of the device layout back in GGUF's layout, into `out` (the same length).
pub fn unpack_row(dtype: DType, row: &[u8], out: &mut [u8]) {
    permute(dtype, row.len(), row, out, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use powerinfer_core::quantize_row;
    use powerinfer_core::testing::pseudo_random;

    #[test]
    fn rows_round_trip_and_quants_come_first() {
        // The quantized formats the GPU takes.
        let quantized = crate::kernels::GPU_DTYPES
            .into_iter()
            .filter(|d| d.is_quantized());
        for dtype in quantized {
            let BlockSplit {
                quants: q,
                header: h,
                header_first,
            } = repacked_split(dtype).unwrap();
            let (hs, qs) = if header_first { (0, h) } else { (q, 0) };
            let cols = 3 * dtype.block_size();
            let rb = dtype.row_bytes(cols).unwrap();
            assert_eq!(rb, 3 * (q + h), "{dtype}");
            assert_eq!(q % 16, 0, "{dtype}: quants keep 16-byte alignment");
            let mut rows = vec![0u8; 5 * rb];
            for (r, dst) in rows.chunks_exact_mut(rb).enumerate() {
                quantize_row(dtype, &pseudo_random(cols, r as u64), dst).unwrap();
            }
            let dev = repack_rows(dtype, cols, &rows).unwrap();
            assert_eq!(dev.len(), rows.len());
            for (r, (g, d)) in rows.chunks(rb).zip(dev.chunks(rb)).enumerate() {
                for b in 0..3 {
                    let blk = &g[b * (q + h)..(b + 1) * (q + h)];
                    assert_eq!(
                        d[b * q..(b + 1) * q],
                        blk[qs..qs + q],
                        "{dtype} {r} quants {b}"
                    );
                    let hd = &d[3 * q + b * h..3 * q + (b + 1) * h];
                    assert_eq!(hd, &blk[hs..hs + h], "{dtype} row {r} header {b}");
                }
                let mut back = vec![0u8; rb];
                unpack_row(dtype, d, &mut back);
                assert_eq!(back, g, "{dtype} row {r}");
            }
        }
    }

    #[test]
    fn other_formats_are_copied_and_partial_rows_refused() {
        for dtype in [
            DType::F32,
            DType::F16,
            DType::BF16,
            DType::Q2_K,
            DType::Q3_K,
        ] {
            assert!(!is_repacked(dtype));
            let rb = dtype.row_bytes(256).unwrap();
            let bytes: Vec<u8> = (0..2 * rb).map(|i| i as u8).collect();
            assert_eq!(repack_rows(dtype, 256, &bytes).unwrap(), bytes);
        }
        assert!(repack_rows(DType::Q4_0, 32, &[0u8; 17]).is_err());
    }
}
