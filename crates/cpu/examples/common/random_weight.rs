//! Pseudo-random weights for the examples' throughput runs (shared by `format_matvec` and
//! `interleaved_matvec`).

use powerinfer_core::{Buffer, DType, Weight};

/// A weight of pseudo-random bytes in `dtype` (its f16 fields kept small and finite).
pub fn weight(dtype: DType, rows: usize, cols: usize, seed: u64) -> Weight {
    let mut bytes = vec![0u8; rows * dtype.row_bytes(cols).unwrap()];
    let mut s = 0x2545_F491_4F6C_DD1Du64 ^ seed;
    for b in bytes.iter_mut() {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        *b = s as u8;
    }
    for blk in bytes.chunks_exact_mut(dtype.block_bytes()) {
        for &f in dtype.f16_fields() {
            blk[f + 1] &= 0x3F;
        }
    }
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}
