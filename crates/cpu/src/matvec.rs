//! Dense matrix-vector product: rows split into a few rayon chunks per thread, each chunk handed
//! to the dispatched multi-row kernel.

use crate::dispatch;
use crate::simd::{self, Level};
use powerinfer_core::{Result, Weight};
use rayon::prelude::*;

/// Smallest chunk of weight bytes worth a rayon task (tasks cost about a microsecond).
const MIN_CHUNK_BYTES: usize = 32 * 1024;
/// At most this many chunks per thread (a little slack for load balancing, no more).
const CHUNKS_PER_THREAD: usize = 4;
/// Chunk boundaries fall on multiples of this many rows (the kernels' row-group width).
const ROW_ALIGN: usize = 8;

/// Rows per parallel chunk for a matrix of `rows` rows of `row_bytes` bytes on `threads` threads.
pub(crate) fn chunk_rows(rows: usize, row_bytes: usize, threads: usize) -> usize {
    if threads <= 1 {
        return rows.max(1);
    }
    let total = rows.saturating_mul(row_bytes);
    let by_size = (total / MIN_CHUNK_BYTES).max(1);
    let chunks = if by_size >= threads {
        threads * (by_size / threads).min(CHUNKS_PER_THREAD)
    } else {
        by_size
    };
    rows.div_ceil(chunks.max(1))
        .next_multiple_of(ROW_ALIGN)
        .max(1)
}

/// y[r] = Σ_c W[r,c]·x[c] for every row, in parallel on the current rayon pool.
pub fn matvec(w: &Weight, x: &[f32], y: &mut [f32]) -> Result<()> {
    matvec_at(simd::level(), w, x, y)
}

/// [`matvec`] on a given SIMD level.
pub(crate) fn matvec_at(level: Level, w: &Weight, x: &[f32], y: &mut [f32]) -> Result<()> {
    crate::check_matvec_shapes(w, x, y)?;
    let row_bytes = w.dtype.row_bytes(w.cols)?;
    #[cfg(target_arch = "x86_64")]
    if level == Level::Avx2 && w.dtype.is_quantized() && INT16_ACTIVATIONS {
        if let Some(xq) = crate::avx2::XQuant::new(x) {
            for_row_chunks(w, row_bytes, y, |rows, out| {
                crate::avx2::rows_dot_i16(w.dtype, rows, row_bytes, &xq, out)
            });
            return Ok(());
        }
    }
    for_row_chunks(w, row_bytes, y, |rows, out| {
        dispatch::rows_dot(level, w.dtype, rows, row_bytes, x, out)
    });
    Ok(())
}

/// Use the int16-activation path for quantized weights on AVX2 (see `avx2::int16`); `false`
/// makes every format accumulate f32 products of f32 activations.
const INT16_ACTIVATIONS: bool = true;

/// Run `kernel(rows' bytes, their outputs)` over parallel chunks of the weight's rows.
fn for_row_chunks<K>(w: &Weight, row_bytes: usize, y: &mut [f32], kernel: K)
where
    K: Fn(&[u8], &mut [f32]) + Sync,
{
    let bytes = w.bytes();
    let per_chunk = chunk_rows(w.rows, row_bytes, rayon::current_num_threads());
    if per_chunk >= w.rows {
        kernel(bytes, y);
        return;
    }
    y.par_chunks_mut(per_chunk)
        .enumerate()
        .for_each(|(i, out)| {
            let start = i * per_chunk * row_bytes;
            kernel(&bytes[start..start + out.len() * row_bytes], out);
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunking_is_coarse_for_small_matrices() {
        // 576 x 576 Q4_1 is ~200 KB: a few chunks per thread, never one per row.
        let rb = 576 / 32 * 20;
        let per = chunk_rows(576, rb, 2);
        assert!(
            per >= 576 / (2 * CHUNKS_PER_THREAD) && per.next_multiple_of(ROW_ALIGN) == per,
            "{per}"
        );
        // Tiny matrices run as one chunk.
        assert_eq!(chunk_rows(3, 64, 8), 8);
        assert!(chunk_rows(4096, 8192, 2) * 8 >= 4096);
        assert!(chunk_rows(0, 10, 4) >= 1);
    }
}
