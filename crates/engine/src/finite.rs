//! The check that weights hold no NaN or infinity, run once at load: which bits of each format
//! can be non-finite, and the first tensor and row that are.

use std::collections::HashMap;

use powerinfer_core::{bail, DType, Result, Weight};
use rayon::prelude::*;

/// True when a row holds a NaN or an infinity: every value of the float formats, the f16
/// scale (and min) fields of the block formats (their quantized integers are always finite),
/// for MXFP4 the weights its largest exponents make infinite ([`mxfp4_overflows`]), and for
/// IQ1_M its d, assembled from the scale words' top nibbles (NVFP4's UE4M3 scales are finite
/// for every byte: no field to test). Bit tests on all-ones exponents, folded without early exit so the loops vectorise.
fn row_has_non_finite(dtype: DType, row: &[u8]) -> bool {
    let u16_at = |b: &[u8], i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    match dtype {
        DType::F32 => row.chunks_exact(4).fold(false, |bad, b| {
            let bits = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            bad | (bits & 0x7f80_0000 == 0x7f80_0000)
        }),
        DType::F16 => row
            .chunks_exact(2)
            .fold(false, |bad, b| bad | (u16_at(b, 0) & 0x7c00 == 0x7c00)),
        DType::BF16 => row
            .chunks_exact(2)
            .fold(false, |bad, b| bad | (u16_at(b, 0) & 0x7f80 == 0x7f80)),
        DType::MXFP4 => row
            .chunks_exact(dtype.block_bytes())
            .fold(false, |bad, b| bad | mxfp4_overflows(b)),
        DType::IQ1_M => row.chunks_exact(56).fold(false, |bad, b| {
            bad | !powerinfer_core::dequantize_iq1::iq1m_d(b).is_finite()
        }),
        _ => row.chunks_exact(dtype.block_bytes()).fold(false, |bad, b| {
            let fields = dtype.f16_fields().iter();
            bad | fields.fold(false, |f, &at| f | (u16_at(b, at) & 0x7c00 == 0x7c00))
        }),
    }
}

/// Whether an MXFP4 block decodes to an infinity: its scale 2^(e − 128) is finite for every
/// exponent byte, but times a table value (at most 12) it leaves f32's range from e = 253 up.
fn mxfp4_overflows(b: &[u8]) -> bool {
    use powerinfer_core::dequantize::{e8m0_half, MXFP4_VALUES};
    if b[0] < 253 {
        return false;
    }
    let d = e8m0_half(b[0]);
    let inf = |i: u8| (d * MXFP4_VALUES[i as usize] as f32).is_infinite();
    b[1..17].iter().any(|&q| inf(q & 15) || inf(q >> 4))
}

/// The first row of `w` holding a NaN or an infinity (see `row_has_non_finite`).
pub fn first_non_finite_row(w: &Weight) -> Option<usize> {
    (0..w.rows)
        .into_par_iter()
        .with_min_len(16)
        .find_first(|&r| row_has_non_finite(w.dtype, w.row(r)))
}

/// Refuse weights holding NaN or infinity, naming the tensor (the first by name when several
/// do) and its first bad row. Reads every tensor once, in parallel on the current rayon pool.
pub fn check_finite(tensors: &HashMap<String, Weight>) -> Result<()> {
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let bad = names
        .par_iter()
        .map(|&name| first_non_finite_row(&tensors[name]).map(|r| (name, r)))
        .find_first(Option::is_some)
        .flatten();
    if let Some((name, row)) = bad {
        bail!(
            ModelFile,
            "tensor {name} holds non-finite values (first at row {row})"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::{bf16, f16};
    use powerinfer_core::{quantize_row, Buffer};

    use super::*;

    /// A 4 x 512 weight in `dtype` from finite values, then `poison` applied to its bytes.
    fn weight(dtype: DType, poison: impl Fn(&mut [u8], usize)) -> Weight {
        let (rows, cols) = (4, 512);
        let rb = dtype.row_bytes(cols).unwrap();
        let mut bytes = vec![0u8; rows * rb];
        for r in 0..rows {
            let src: Vec<f32> = (0..cols)
                .map(|c| (r * cols + c) as f32 / 800.0 - 1.0)
                .collect();
            quantize_row(dtype, &src, &mut bytes[r * rb..(r + 1) * rb]).unwrap();
        }
        poison(&mut bytes, rb);
        Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
    }

    #[test]
    fn non_finite_values_are_found_in_every_format() {
        let nan16 = f16::NAN.to_le_bytes();
        let inf16 = f16::NEG_INFINITY.to_le_bytes();
        // The formats we encode (the lattice ones: tests/test_lattice_iq3_iq1.py's files).
        for dtype in DType::ALL.into_iter().filter(|d| d.has_encoder()) {
            assert_eq!(
                first_non_finite_row(&weight(dtype, |_, _| {})),
                None,
                "{dtype:?}"
            );
            if dtype == DType::NVFP4 {
                // Every UE4M3 scale byte is finite (ggml's ggml_ue4m3_to_fp32), and so is
                // every weight: nothing to find even in all-ones bytes.
                let w = weight(dtype, |b, _| b.fill(0xff));
                assert_eq!(first_non_finite_row(&w), None);
                continue;
            }
            // Row 2: its last value (float formats) or the scale of its second block.
            // (MXFP4: the exponent of its second block, 2^127, times its first weight's 12.)
            let at = |rb: usize| match dtype {
                DType::F32 => 2 * rb + rb - 4,
                DType::F16 | DType::BF16 => 2 * rb + rb - 2,
                DType::MXFP4 => 2 * rb + dtype.block_bytes(),
                _ => 2 * rb + dtype.block_bytes() + dtype.f16_fields()[0],
            };
            let bad: Vec<u8> = match dtype {
                DType::F32 => f32::NAN.to_le_bytes().to_vec(),
                DType::BF16 => bf16::INFINITY.to_le_bytes().to_vec(),
                DType::MXFP4 => vec![255, 0x07],
                _ => nan16.to_vec(),
            };
            let w = weight(dtype, |b, rb| {
                let i = at(rb);
                b[i..i + bad.len()].copy_from_slice(&bad);
            });
            assert_eq!(first_non_finite_row(&w), Some(2), "{dtype:?}");
        }
        // MXFP4's largest exponents are finite scales; only the weights they overflow count.
        // (2^124·12, 2^127·1, 2^125·6; 2^125·8 would be 2^128.)
        let finite = [[252u8, 0x77], [255, 0x10], [253, 0x55]];
        for [e, q] in finite {
            let w = weight(DType::MXFP4, |b, _| {
                b[0] = e;
                b[1..17].fill(q);
            });
            assert_eq!(first_non_finite_row(&w), None, "e {e} q {q:#x}");
        }
        // The min (dmin) fields count too.
        for dtype in DType::ALL.into_iter().filter(|d| d.f16_fields().len() == 2) {
            let at = dtype.f16_fields()[1];
            let w = weight(dtype, |b, rb| {
                b[rb + at..rb + at + 2].copy_from_slice(&inf16)
            });
            assert_eq!(first_non_finite_row(&w), Some(1), "{dtype}");
        }
    }

    /// IQ1_M's d spread over its scale words' top nibbles: an infinite one (0x7c00) is found,
    /// the same nibbles under other scale bits too, a finite d is not.
    #[test]
    fn iq1_m_assembles_its_d_for_the_check() {
        let block = |d: u16, low: u8| {
            let mut b = vec![low; 56];
            for i in 0..4 {
                b[49 + 2 * i] = (low & 0x0f) | (((d >> (4 * i)) & 15) as u8) << 4;
            }
            b
        };
        let w = |b: Vec<u8>| Weight::new(DType::IQ1_M, 1, 256, Buffer::from_bytes(&b)).unwrap();
        assert_eq!(first_non_finite_row(&w(block(0x7c00, 0))), Some(0));
        assert_eq!(first_non_finite_row(&w(block(0x7e01, 0xff))), Some(0));
        assert_eq!(first_non_finite_row(&w(block(0x3800, 0xff))), None);
    }

    #[test]
    fn check_finite_names_the_first_bad_tensor_and_row() {
        let mut t = HashMap::new();
        t.insert("blk.0.ffn_up".to_string(), weight(DType::F16, |_, _| {}));
        t.insert(
            "blk.3.ffn_up".to_string(),
            weight(DType::Q8_0, |b, rb| {
                b[3 * rb..3 * rb + 2].copy_from_slice(&[0, 0x7c])
            }),
        );
        t.insert(
            "blk.9.attn_q".to_string(),
            weight(DType::F32, |b, _| {
                b[0..4].copy_from_slice(&f32::INFINITY.to_le_bytes())
            }),
        );
        let err = check_finite(&t).unwrap_err().to_string();
        assert!(
            err.contains("tensor blk.3.ffn_up holds non-finite values (first at row 3)"),
            "{err}"
        );
        t.remove("blk.3.ffn_up");
        t.remove("blk.9.attn_q");
        check_finite(&t).unwrap();
    }
}
