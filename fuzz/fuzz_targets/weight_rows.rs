//! Fuzz the weight layout checks and row decoding of every weight format: `Weight::new` (size
//! against dtype and shape), the non-finite scan the engine runs on load
//! (`weights::first_non_finite_row`) and `dequantize_row` (dispatched SIMD and the scalar
//! reference).
//!
//! Input: byte 0 = dtype, byte 1 = rows (mod 5), byte 2 = columns (in blocks, mod 9), then the
//! weight bytes. A weight the scan passes must decode to finite values only (no silent NaN).
#![no_main]

use libfuzzer_sys::fuzz_target;
use powerinfer_core::{Buffer, DType, Error, Weight};
use powerinfer_engine::weights::first_non_finite_row;

const DTYPES: [DType; 6] = [
    DType::F32,
    DType::F16,
    DType::BF16,
    DType::Q8_0,
    DType::Q4_0,
    DType::Q4_1,
];

fuzz_target!(|data: &[u8]| {
    let [d, r, c, bytes @ ..] = data else { return };
    let dtype = DTYPES[usize::from(*d) % DTYPES.len()];
    let rows = usize::from(*r % 5);
    let cols = usize::from(*c % 9) * dtype.block_size() + usize::from(*c >= 128);
    let w = match Weight::new(dtype, rows, cols, Buffer::from_bytes(bytes)) {
        Ok(w) => w,
        Err(Error::Shape(_)) => return,
        Err(e) => panic!("untyped weight error: {e:?}"),
    };
    let bad_row = first_non_finite_row(&w);
    let mut fast = vec![0.0f32; cols];
    let mut slow = vec![0.0f32; cols];
    for row in 0..rows {
        let dequantized = powerinfer_cpu::dequantize_row(dtype, w.row(row), &mut fast)
            .and_then(|()| {
                powerinfer_cpu::reference::dequantize_row(dtype, w.row(row), &mut slow)
            });
        if let Err(e) = dequantized {
            panic!("a checked weight's row does not decode: {e:?}");
        }
        if bad_row.is_none_or(|b| row < b) {
            assert!(
                fast.iter().chain(&slow).all(|v| v.is_finite()),
                "row {row} of a {dtype} weight passed the scan but decodes to non-finite values"
            );
        }
    }
});
