//! Weight formats and their block layouts (the GGUF/ggml layouts, bit for bit).
//!
//! A row of `cols` weights is `cols / block_size` blocks of `block_bytes` bytes each:
//! - `F32`, `F16`, `BF16`: one value per block, little-endian.
//! - `Q8_0`: 32 weights = f16 scale `d`, then 32 × i8 `q`; w = d·q.
//! - `Q4_0`: 32 weights = f16 `d`, then 16 bytes; byte j holds q[j] (low nibble) and q[j+16]
//!   (high nibble); w = d·(q − 8).
//! - `Q4_1`: 32 weights = f16 `d`, f16 `m`, then 16 bytes as in Q4_0; w = d·q + m.
//! - `Q5_0`: 32 weights = f16 `d`, 4 bytes `qh` (a little-endian u32 whose bit j is bit 4 of
//!   q[j]), then 16 bytes of low nibbles as in Q4_0; w = d·(q − 16).
//! - `Q5_1`: 32 weights = f16 `d`, f16 `m`, `qh` and nibbles as in Q5_0; w = d·q + m.
//!
//! The K-quants pack 256 weights in one super-block of sub-blocks (16 of 16 weights or 8 of 32),
//! each sub-block with a small integer scale (and min) relative to the super-block's f16 `d`
//! (and `dmin`). Weight i lies in sub-block i / 16 (16-weight sub-blocks) or i / 32.
//! - `Q2_K` (84 bytes): 16 bytes `scales` (sub-block s: scale `scales[s] & 15`, min
//!   `scales[s] >> 4`), 64 bytes `qs`, f16 `d`, f16 `dmin`. Weight i = 128n + 32j + l (n < 2,
//!   j < 4, l < 32) has q = (qs[32n + l] >> 2j) & 3; w = d·scale·q − dmin·min.
//! - `Q3_K` (110 bytes): 32 bytes `hmask`, 64 bytes `qs`, 12 bytes of 6-bit scales, f16 `d`.
//!   Weight i = 128n + 32j + l has low bits (qs[32n + l] >> 2j) & 3 and high bit
//!   (hmask[l] >> (4n + j)) & 1; q = low − 4 when the high bit is 0, else low. Scale s has low
//!   4 bits `scales[s] & 15` (s < 8) or `scales[s − 8] >> 4`, high 2 bits
//!   `(scales[8 + s % 4] >> 2(s / 4)) & 3`, and stands for that 6-bit value − 32; w = d·scale·q.
//! - `Q4_K` (144 bytes): f16 `d`, f16 `dmin`, 12 bytes of 6-bit scales and mins, 128 bytes `qs`.
//!   Weight i = 64c + 32h + l has q = qs[32c + l] low nibble (h = 0) or high nibble (h = 1),
//!   sub-block s = 2c + h. Scale and min of s < 4: `sm[s] & 63`, `sm[s + 4] & 63`; of s >= 4:
//!   `(sm[s + 4] & 15) | (sm[s − 4] >> 6) << 4`, `(sm[s + 4] >> 4) | (sm[s] >> 6) << 4`;
//!   w = d·scale·q − dmin·min.
//! - `Q5_K` (176 bytes): as Q4_K with 32 bytes `qh` between the scales and `qs`; bit s of
//!   qh[l] is bit 4 of q for weight 32s + l.
//! - `Q6_K` (210 bytes): 128 bytes `ql`, 64 bytes `qh`, 16 × i8 `scales`, f16 `d`. Weight
//!   i = 128n + 32k + l has low 4 bits from ql[64n + 32(k % 2) + l] (low nibble for k < 2, high
//!   nibble for k >= 2), high 2 bits (qh[32n + l] >> 2k) & 3; w = d·scales[i / 16]·(q − 32).
//!
//! The table formats store 4-bit indices into a fixed table of 16 non-linear values
//! ([`crate::dequantize::IQ4NL_VALUES`], [`crate::dequantize::MXFP4_VALUES`]), in Q4_0's nibble
//! order (byte j: index of weight j low, of weight j + 16 high):
//! - `IQ4_NL` (18 bytes per 32): f16 `d`, 16 bytes of indices; w = d·table[idx].
//! - `MXFP4` (17 bytes per 32): one E8M0 exponent byte `e`, 16 bytes of indices into the e2m1
//!   values doubled; w = 2^(e − 128)·table[idx] (half of the OCP scale 2^(e − 127), undoing
//!   the doubling; ggml's `GGML_E8M0_TO_FP32_HALF`, exponents 0 and 1 subnormal).
//! - `IQ4_XS` (136 bytes per 256): f16 `d`, u16 `scales_h`, 4 bytes `scales_l`, then 8 × 16
//!   bytes of indices, one 32-weight sub-block each. Sub-block s has the 6-bit scale
//!   `(scales_l[s / 2] >> 4(s % 2)) & 15 | ((scales_h >> 2s) & 3) << 4`, standing for that
//!   value − 32; w = (d·scale)·table[idx] with IQ4_NL's table.
//!
//! The ternary formats store weights in {−1, 0, 1} (TQ2_0 also takes 2) times one f16 `d` per
//! 256 (ggml's `block_tq1_0`, `block_tq2_0`):
//! - `TQ2_0` (66 bytes): 64 bytes `qs`, f16 `d`. Weight i = 128j + 32l + m is
//!   ((qs[32j + m] >> 2l) & 3) − 1.
//! - `TQ1_0` (54 bytes): 48 bytes `qs`, 4 bytes `qh`, f16 `d`; five trits per byte as a base-3
//!   fraction of 256 (trit n of byte b: ((b·3^n mod 256)·3) >> 8, then − 1). Weights 0..160 are
//!   trit i / 32 of qs[i % 32]; 160..240 trit (i − 160) / 16 of qs[32 + (i − 160) % 16];
//!   240..256 trit (i − 240) / 4 of qh[(i − 240) % 4].
//!
//! The 2-bit lattice i-quants code 8 weights at a time as a point of a lattice codebook
//! (`crate::lattice_grids`: values 8, 25, 43) and 8 sign bits, in 256-weight blocks led by an
//! f16 `d`; a 32-weight sub-block s (four points) has a 4-bit scale `ls` (IQ2_XS, IQ2_S: one
//! per 16-weight half), standing for db = d·(0.5 + ls)·0.25, and w = db·grid[j]·(±1), in f32 as
//! ggml computes it (ggml's `block_iq2_xxs`, `block_iq2_xs`, `block_iq2_s`):
//! - `IQ2_XXS` (66 bytes): f16 d, then per sub-block two u32: the first the four points' 8-bit
//!   grid indices (into `IQ2XXS_GRID`), the second four 7-bit sign indices (into `KSIGNS`, bits
//!   7l..7l + 7 for point l) and `ls` in bits 28..32.
//! - `IQ2_XS` (74 bytes): f16 d, 32 u16 (point p: grid index `& 511` into `IQ2XS_GRID`, sign
//!   index `>> 9` into `KSIGNS`), 8 bytes of scales (sub-block s: low nibble for weights
//!   32s..32s + 16, high nibble for the rest).
//! - `IQ2_S` (82 bytes): f16 d, 32 bytes of grid index low bits, 32 sign bytes (bit j of byte p
//!   negates weight 8p + j), 8 bytes qh (bits 2l..2l + 2 of qh[s] are the index's bits 8..10
//!   for point 4s + l, into `IQ2S_GRID`), 8 bytes of scales as IQ2_XS's.
//!
//! The 3- and 1-bit lattice i-quants ([`DType::LATTICE_IQ3_IQ1`]; ggml's `block_iq3_xxs`,
//! `block_iq3_s`, `block_iq1_s`, `block_iq1_m`) store 256 weights as indices into fixed
//! codebooks of 4 or 8 weights (`crate::lattice_grids`), a scale per 32-weight sub-block (IQ1_M:
//! per 16) relative to one f16 `d`:
//! - `IQ3_XXS` (98 bytes): f16 `d`, 64 bytes `qs` (a 4-weight point of `IQ3XXS_GRID` each:
//!   weights 4k..4k + 4 take point qs[k]), then per sub-block s a u32 at 66 + 4s: four 7-bit
//!   sign indices (bits 7l.., into `KSIGNS`: bit j negates weight 8l + j of the sub-block) and a
//!   4-bit `ls` on top; w = (d·(0.5 + ls)·0.5)·(±grid).
//! - `IQ3_S` (110 bytes): f16 `d`, 64 bytes `qs` (low 8 bits of point indices into the 512 of
//!   `IQ3S_GRID`), 8 bytes `qh` (bit k of qh[s]: bit 8 of sub-block s's index k), 32 bytes
//!   `signs` (byte 4s + l, bit j: weight 8l + j of sub-block s negated), 4 bytes of 4-bit
//!   scales (sub-block s: nibble s % 2 of byte s / 2); w = (d·(1 + 2·sc))·(±grid).
//! - `IQ1_S` (50 bytes): f16 `d`, 32 bytes `qs` (low 8 bits of indices into the 2,048 8-weight
//!   points of `IQ1S_GRID`, values −1, 0, 1), 8 × u16 `qh` (sub-block s: bits 3l..3l + 3 the
//!   high bits of group l's index, bits 12..15 the scale k, bit 15 the sign of δ = ±1/8);
//!   w = (d·(2k + 1))·(g + δ).
//! - `IQ1_M` (56 bytes): 32 bytes `qs` (low index bits, as IQ1_S), 16 bytes `qh` (group l of
//!   sub-block s: nibble l % 2 of qh[2s + l / 2], bits 0..3 the index's high bits, bit 3 the
//!   sign of its own δ), 8 bytes of four u16 scale words: a 3-bit k per 16 weights (half j of
//!   sub-block s: bits 6(s % 2) + 3j of word s / 2) and the f16 `d` in the words' top nibbles
//!   (word i: bits 4i..4i + 4 of d); w = (d·(2k + 1))·(g + δ).
//!
//! The table, ternary and lattice formats are the "decoded" ones ([`DType::is_decoded`]): a
//! block unpacks into int8 values with one f32 scale per 32 weights (per 16 for IQ2_XS, IQ2_S
//! and IQ1_M) and no mins (`crate::dequantize::unpack_table`, `crate::dequantize_iq2::unpack_iq2`,
//! IQ1_M through `crate::dequantize::unpack_k`). The lattice formats have no encoder of ours
//! ([`DType::has_encoder`]).
//!
//! The low-bit formats ([`DType::LOWBIT`]; ggml's `block_nvfp4`, `block_q1_0`, `block_q2_0`)
//! unpack into int8 values with one f32 scale per 16 weights (`crate::lowbit::unpack_lowbit`):
//! - `NVFP4` (36 bytes per 64): 4 UE4M3 scale bytes (one per 16 weights), then 32 bytes of
//!   E2M1 indices into MXFP4's doubled values, 8 bytes per 16 weights: weight 16s + j is the
//!   low nibble of qs[8s + j] (j < 8) or the high nibble of qs[8s + j − 8];
//!   w = ue4m3_half(d[s])·table[idx] (`crate::lowbit::ue4m3_half`: half the UE4M3 value,
//!   undoing the doubling; ggml's `ggml_ue4m3_to_fp32`).
//! - `Q1_0` (18 bytes per 128): f16 `d`, 16 bytes of sign bits; weight j is bit j % 8 of
//!   qs[j / 8]: w = d where it is set, else −d.
//! - `Q2_0` (18 bytes per 64): f16 `d`, 16 bytes of 2-bit codes; weight j is bits 2(j % 4) of
//!   qs[j / 4]: w = (q − 1)·d, q in 0..4.

use crate::error::{Error, Result};

/// A weight storage format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)]
pub enum DType {
    F32,
    F16,
    BF16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K,
    Q4_K,
    Q5_K,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    MXFP4,
    TQ1_0,
    TQ2_0,
    NVFP4,
    Q1_0,
    Q2_0,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ3_XXS,
    IQ3_S,
    IQ1_S,
    IQ1_M,
}

impl DType {
    /// Every supported format, for tests and tables: [`DType::BASIC`], Q5_0, Q5_1,
    /// [`DType::K_QUANTS`], [`DType::TABLE`], [`DType::TERNARY`], [`DType::LOWBIT`],
    /// [`DType::LATTICE_IQ2`], then [`DType::LATTICE_IQ3_IQ1`]. A format's index here is its id
    /// in the files we write (neuron store, down_t): new formats are appended.
    pub const ALL: [DType; 28] = DType::join(&[
        &DType::BASIC,
        &[DType::Q5_0, DType::Q5_1],
        &DType::K_QUANTS,
        &DType::TABLE,
        &DType::TERNARY,
        &DType::LOWBIT,
        &DType::LATTICE_IQ2,
        &DType::LATTICE_IQ3_IQ1,
    ]);

    /// The formats of one value or 32 weights per block that every backend (the GPU kernels
    /// included) takes.
    pub const BASIC: [DType; 6] = [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q4_1,
    ];

    /// The K-quants (256-weight super-blocks).
    pub const K_QUANTS: [DType; 5] = [
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];

    /// The table formats: 4-bit indices into 16 non-linear values (see the module docs).
    pub const TABLE: [DType; 3] = [DType::IQ4_NL, DType::IQ4_XS, DType::MXFP4];

    /// The ternary formats (see the module docs).
    pub const TERNARY: [DType; 2] = [DType::TQ1_0, DType::TQ2_0];

    /// The low-bit formats of a scale per 16 weights once unpacked (see the module docs).
    pub const LOWBIT: [DType; 3] = [DType::NVFP4, DType::Q1_0, DType::Q2_0];
    /// The 2-bit lattice i-quants (see the module docs).
    pub const LATTICE_IQ2: [DType; 3] = [DType::IQ2_XXS, DType::IQ2_XS, DType::IQ2_S];
    /// The 3- and 1-bit lattice i-quants (see the module docs).
    pub const LATTICE_IQ3_IQ1: [DType; 4] =
        [DType::IQ3_XXS, DType::IQ3_S, DType::IQ1_S, DType::IQ1_M];

    /// `parts` one after the other, in order (for the format lists above, built at compile
    /// time); `N` must be their total length.
    pub const fn join<const N: usize>(parts: &[&[DType]]) -> [DType; N] {
        let mut out = [DType::F32; N];
        let (mut n, mut p) = (0, 0);
        while p < parts.len() {
            let mut i = 0;
            while i < parts[p].len() {
                out[n] = parts[p][i];
                n += 1;
                i += 1;
            }
            p += 1;
        }
        assert!(n == N, "DType::join: the parts' total length is not N");
        out
    }

    /// `Error::Shape` unless a row of `values` weights in this format is `bytes` bytes (or
    /// `values` is no whole number of blocks).
    pub fn check_row(self, values: usize, bytes: usize) -> Result<()> {
        let want = self.row_bytes(values)?;
        crate::ensure!(
            bytes == want,
            Shape,
            "{self} row of {values} values needs {want} bytes, got {bytes}"
        );
        Ok(())
    }

    /// Weights per block.
    pub const fn block_size(self) -> usize {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => 1,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => 32,
            DType::IQ4_NL | DType::MXFP4 => 32,
            DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => 256,
            DType::IQ4_XS | DType::TQ1_0 | DType::TQ2_0 => 256,
            DType::NVFP4 | DType::Q2_0 => 64,
            DType::Q1_0 => 128,
            DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => 256,
            DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S | DType::IQ1_M => 256,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::Q8_0 => 34,
            DType::Q4_0 => 18,
            DType::Q4_1 => 20,
            DType::Q5_0 => 22,
            DType::Q5_1 => 24,
            DType::Q2_K => 84,
            DType::Q3_K => 110,
            DType::Q4_K => 144,
            DType::Q5_K => 176,
            DType::Q6_K => 210,
            DType::IQ4_NL => 18,
            DType::IQ4_XS => 136,
            DType::MXFP4 => 17,
            DType::TQ1_0 => 54,
            DType::TQ2_0 => 66,
            DType::NVFP4 => 36,
            DType::Q1_0 | DType::Q2_0 => 18,
            DType::IQ2_XXS => 66,
            DType::IQ2_XS => 74,
            DType::IQ2_S => 82,
            DType::IQ3_XXS => 98,
            DType::IQ3_S => 110,
            DType::IQ1_S => 50,
            DType::IQ1_M => 56,
        }
    }

    /// True for the block-quantized formats.
    pub const fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Byte offsets of a block's f16 fields (scales, mins); empty for the float formats, whose
    /// every value is a float, for MXFP4, whose E8M0 scale is finite whatever its bits
    /// (2^(e − 128), as ggml decodes it; the load-time check tests the weights its largest
    /// exponents overflow instead), and for NVFP4, whose UE4M3 scales are all finite (at most
    /// 240, so every weight at most 2,880). The load-time NaN/infinity check reads these.
    pub const fn f16_fields(self) -> &'static [usize] {
        match self {
            DType::F32 | DType::F16 | DType::BF16 => &[],
            DType::Q8_0 | DType::Q4_0 | DType::Q5_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
            DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => &[0],
            DType::MXFP4 | DType::NVFP4 => &[],
            DType::Q1_0 | DType::Q2_0 => &[0],
            DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
            DType::Q2_K => &[80, 82],
            DType::Q3_K => &[108],
            DType::Q6_K => &[208],
            DType::TQ1_0 => &[52],
            DType::TQ2_0 => &[64],
            DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S => &[0],
            // d spread over the scale words' top nibbles (`crate::dequantize_iq1::iq1m_d`):
            // the load-time check assembles it.
            DType::IQ1_M => &[],
        }
    }

    /// True for the formats of 256-weight super-blocks (the K-quants, IQ4_XS, the ternary ones).
    pub const fn is_super_block(self) -> bool {
        self.block_size() == 256
    }

    /// True for the decoded formats, [`DType::TABLE`], [`DType::TERNARY`] and
    /// [`DType::LATTICE_IQ2`], [`DType::LATTICE_IQ3_IQ1`]: a block unpacks into int8 values
    /// with a scale per 32 weights (`crate::dequantize::unpack_table`; per 16 for IQ2_XS and
    /// IQ2_S, `crate::dequantize_iq2::unpack_iq2`, and IQ1_M, `crate::dequantize::unpack_k`).
    /// They have no GPU kernels of their own (converted to Q8_0 at upload) and no integer tile.
    pub const fn is_decoded(self) -> bool {
        matches!(
            self,
            DType::IQ4_NL | DType::IQ4_XS | DType::MXFP4 | DType::TQ1_0 | DType::TQ2_0
        ) || self.is_lattice()
    }

    /// True for the lattice i-quants, [`DType::LATTICE_IQ2`] and [`DType::LATTICE_IQ3_IQ1`].
    pub const fn is_lattice(self) -> bool {
        matches!(
            self,
            DType::IQ2_XXS
                | DType::IQ2_XS
                | DType::IQ2_S
                | DType::IQ3_XXS
                | DType::IQ3_S
                | DType::IQ1_S
                | DType::IQ1_M
        )
    }

    /// Whether [`crate::quantize_row`] encodes this format (all but the lattice i-quants).
    pub const fn has_encoder(self) -> bool {
        !self.is_lattice()
    }

    /// True for the low-bit formats, [`DType::LOWBIT`]: a block unpacks into int8 values with a
    /// scale per 16 weights (`crate::lowbit::unpack_lowbit`). Like the decoded formats they have
    /// no GPU kernels of their own (converted at upload) and no integer tile.
    pub const fn is_lowbit(self) -> bool {
        matches!(self, DType::NVFP4 | DType::Q1_0 | DType::Q2_0)
    }

    /// Bytes of one row of `cols` weights; an error when `cols` is not a whole number of blocks.
    pub fn row_bytes(self, cols: usize) -> Result<usize> {
        if !cols.is_multiple_of(self.block_size()) {
            return Err(Error::Shape(format!(
                "{} rows need a multiple of {} columns, got {}",
                self.name(),
                self.block_size(),
                cols
            )));
        }
        Ok(cols / self.block_size() * self.block_bytes())
    }

    /// The canonical (GGUF) name: "F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", ...
    pub const fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::F16 => "F16",
            DType::BF16 => "BF16",
            DType::Q8_0 => "Q8_0",
            DType::Q4_0 => "Q4_0",
            DType::Q4_1 => "Q4_1",
            DType::Q5_0 => "Q5_0",
            DType::Q5_1 => "Q5_1",
            DType::Q2_K => "Q2_K",
            DType::Q3_K => "Q3_K",
            DType::Q4_K => "Q4_K",
            DType::Q5_K => "Q5_K",
            DType::Q6_K => "Q6_K",
            DType::IQ4_NL => "IQ4_NL",
            DType::IQ4_XS => "IQ4_XS",
            DType::MXFP4 => "MXFP4",
            DType::TQ1_0 => "TQ1_0",
            DType::TQ2_0 => "TQ2_0",
            DType::NVFP4 => "NVFP4",
            DType::Q1_0 => "Q1_0",
            DType::Q2_0 => "Q2_0",
            DType::IQ2_XXS => "IQ2_XXS",
            DType::IQ2_XS => "IQ2_XS",
            DType::IQ2_S => "IQ2_S",
            DType::IQ3_XXS => "IQ3_XXS",
            DType::IQ3_S => "IQ3_S",
            DType::IQ1_S => "IQ1_S",
            DType::IQ1_M => "IQ1_M",
        }
    }

    /// Parse a name, case-insensitively.
    pub fn from_name(name: &str) -> Result<DType> {
        DType::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| Error::Unsupported(format!("weight format {name:?}")))
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()).unwrap(), d);
            assert_eq!(DType::from_name(&d.name().to_lowercase()).unwrap(), d);
        }
        assert!(matches!(
            DType::from_name("Q8_K"),
            Err(Error::Unsupported(_))
        ));
    }

    #[test]
    fn row_bytes_checks_block_multiple() {
        assert_eq!(DType::Q4_1.row_bytes(64).unwrap(), 40);
        assert_eq!(DType::F16.row_bytes(7).unwrap(), 14);
        assert!(matches!(DType::Q8_0.row_bytes(33), Err(Error::Shape(_))));
        assert_eq!(DType::Q6_K.row_bytes(512).unwrap(), 420);
        assert!(matches!(DType::Q4_K.row_bytes(576), Err(Error::Shape(_))));
        assert_eq!(DType::IQ4_XS.row_bytes(512).unwrap(), 272);
        assert_eq!(DType::MXFP4.row_bytes(64).unwrap(), 34);
        assert_eq!(DType::IQ4_NL.row_bytes(64).unwrap(), 36);
        assert_eq!(DType::TQ1_0.row_bytes(512).unwrap(), 108);
        assert_eq!(DType::TQ2_0.row_bytes(256).unwrap(), 66);
        assert_eq!(DType::IQ2_XXS.row_bytes(512).unwrap(), 132);
        assert_eq!(DType::IQ2_XS.row_bytes(256).unwrap(), 74);
        assert_eq!(DType::IQ2_S.row_bytes(256).unwrap(), 82);
        assert!(matches!(DType::TQ2_0.row_bytes(32), Err(Error::Shape(_))));
        assert_eq!(DType::NVFP4.row_bytes(576).unwrap(), 324);
        assert_eq!(DType::Q2_0.row_bytes(576).unwrap(), 162);
        assert_eq!(DType::Q1_0.row_bytes(512).unwrap(), 72);
        assert!(matches!(DType::Q1_0.row_bytes(576), Err(Error::Shape(_))));
        assert_eq!(DType::IQ3_XXS.row_bytes(512).unwrap(), 196);
        assert_eq!(DType::IQ3_S.row_bytes(256).unwrap(), 110);
        assert_eq!(DType::IQ1_S.row_bytes(768).unwrap(), 150);
        assert_eq!(DType::IQ1_M.row_bytes(512).unwrap(), 112);
    }
}
