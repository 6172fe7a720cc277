//! The input-major copy of a weight matrix ([`InputMajor`]) that the input-sparse matvec
//! ([`crate::ops::input_major`]) reads, and the kept entries of an input vector
//! ([`ActiveInput`]) it reads them with: the layout both the op and its kernels
//! (`crate::kernels::cols`, `crate::kernels::avx2::cols`) work on.
//!
//! ## Layout ([`InputMajor`])
//! A block format stores `w = s·q + m` per row and group of G inputs (G = 32 for the 32-weight
//! formats, Q4_K and Q5_K; 16 for Q2_K, Q3_K and Q6_K), with an integer `q`. The copy keeps
//! those integers and those scales, rearranged so that one input column is one contiguous line
//! of every output row's `q`:
//!
//! ```text
//! for each group of G inputs (a "chunk"):
//!     scales [rows]  (f16 where every scale of the matrix is an f16, else f32)
//!     mins   [rows]  (only when some min is not 0; same type)
//!     G lines, one per input column: every row's q
//!        4-bit q (range within 16 values): two rows a byte
//!        wider q: one i8 a row
//! ```
//!
//! rows padded to a multiple of [`SUB`]. A skipped column is a whole line not read: lines of
//! one cache line (tiles of 128 rows, the first design) skipped 40% of the columns and read as
//! much memory as none, since the CPU's stream prefetcher fetched the lines between the kept
//! ones (Q4_1 5632 x 2048 on 2 threads: 276 µs at 0% skipped, 290 µs at 40%). Float formats
//! (F32, F16, BF16) keep their values, one line per column, no scales. Rows inside each 32-row
//! sub-tile are permuted (see [`line_pos`]) so that the AVX2 kernel's pairwise integer products
//! land in natural row order. The bytes: a Q4_1 matrix's copy is 4.5 + 0.5 (min) bits a weight
//! (the original: 5), a Q4_0's 4.5, Q8_0's 8.5; the 5- and 6-bit formats are stored as i8 (8
//! bits + scales), and the K-quants' scales as f32 (their `d·scale` products are not all f16).

use half::f16;
use powerinfer_core::{ensure, Buffer, DType, PageBuf, Result, Weight};
use rayon::prelude::*;

use crate::check;

/// Output rows per sub-tile: the unit of the kernels' register blocking and of row padding.
pub const SUB: usize = 32;

/// How one column line stores its values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lines {
    /// 4-bit `u = q − off`, two rows a byte.
    Nibble,
    /// i8 `q`, one row a byte.
    Byte,
    /// The float format's own values.
    F32,
    F16,
    BF16,
}

impl Lines {
    /// Bytes of one sub-tile (32 rows) of a column line.
    pub(crate) const fn sub_bytes(self) -> usize {
        match self {
            Lines::Nibble => SUB / 2,
            Lines::Byte => SUB,
            Lines::F32 => SUB * 4,
            Lines::F16 | Lines::BF16 => SUB * 2,
        }
    }

    pub(crate) fn is_float(self) -> bool {
        matches!(self, Lines::F32 | Lines::F16 | Lines::BF16)
    }
}

/// The type of the scale and min tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ScaleType {
    F16,
    F32,
}

impl ScaleType {
    const fn bytes(self) -> usize {
        match self {
            ScaleType::F16 => 2,
            ScaleType::F32 => 4,
        }
    }
}

/// An input-major copy of a weight matrix (see the module docs).
#[derive(Clone, Debug)]
pub struct InputMajor {
    /// The source format.
    pub dtype: DType,
    /// Output rows (the source's rows).
    pub rows: usize,
    /// Inputs (the source's columns).
    pub cols: usize,
    /// Rows padded to a whole number of sub-tiles.
    pub(crate) rows_pad: usize,
    pub(crate) lines: Lines,
    /// Bytes of one column line (all rows).
    pub(crate) line_bytes: usize,
    /// Quantized lines: the integer added back to a stored nibble (`q = u + off`).
    pub(crate) off: i32,
    /// Inputs per group (one scale per row and group).
    pub(crate) group: usize,
    pub(crate) scales: ScaleType,
    pub(crate) has_min: bool,
    pub(crate) n_groups: usize,
    pub(crate) chunk_bytes: usize,
    /// On huge pages where the OS grants them (scattered column reads cost few TLB misses).
    pub(crate) data: Buffer,
}

/// Where row `r` sits in a column line: (byte, high nibble) for 4-bit lines, (byte, false) for
/// i8 lines. Sub-tile `r / 32` takes 16 (4-bit) or 32 (i8) bytes; inside each 16 rows, rows
/// 4..8 and 8..12 trade places: the AVX2 kernel widens 16 bytes to 16 int16 and interleaves
/// two columns per 128-bit lane, which yields rows {0..4, 8..12} then {4..8, 12..16}.
pub(crate) const fn line_pos(lines: Lines, r: usize) -> (usize, bool) {
    let (sub, rr) = (r / SUB, r % SUB);
    let e = rr % 16;
    let swapped = match e {
        4..=7 => e + 4,
        8..=11 => e - 4,
        _ => e,
    };
    match lines {
        Lines::Nibble => (16 * sub + swapped, rr >= 16),
        _ => (32 * sub + 16 * (rr / 16) + swapped, false),
    }
}

/// One block's values as `s·q + m` per group: (group length, scales, mins, q).
struct Affine {
    group: usize,
    s: [f32; 16],
    m: [f32; 16],
    q: [i8; 256],
}

impl Default for Affine {
    fn default() -> Self {
        Affine {
            group: 32,
            s: [0.0; 16],
            m: [0.0; 16],
            q: [0; 256],
        }
    }
}

/// Split one block of `dtype` into [`Affine`] form, in the dequantizer's own float operations
/// (so `s·q + m` is the dequantized value bit for bit).
fn affine_block(dtype: DType, b: &[u8], a: &mut Affine) {
    use powerinfer_core::dequantize::{legacy_affine, unpack_k, unpack_table, SubScales};
    let f16_at = |at: usize| f16::from_le_bytes([b[at], b[at + 1]]).to_f32();
    match dtype {
        DType::Q8_0 => {
            a.group = 32;
            a.s[0] = f16_at(0);
            a.m[0] = 0.0;
            for (q, &v) in a.q.iter_mut().zip(&b[2..34]) {
                *q = v as i8;
            }
        }
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 => {
            let (d, m, q) = legacy_affine(dtype, b);
            a.group = 32;
            a.s[0] = d;
            a.m[0] = m.unwrap_or(0.0);
            a.q[..32].copy_from_slice(&q);
        }
        DType::IQ4_NL
        | DType::IQ4_XS
        | DType::MXFP4
        | DType::TQ1_0
        | DType::TQ2_0
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S => {
            // The table values (trits) are the integers, each 32-weight sub-block's scale the factor.
            let mut d = [0f32; 8];
            unpack_table(dtype, b, &mut d, &mut a.q);
            a.group = 32;
            a.s[..8].copy_from_slice(&d);
            a.m[..8].fill(0.0);
        }
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => {
            // The signed grid values are the integers, each 16-weight half's scale the factor.
            let mut d = [0f32; 16];
            powerinfer_core::dequantize_iq2::unpack_iq2(dtype, b, &mut d, &mut a.q);
            a.group = 16;
            a.s = d;
            a.m.fill(0.0);
        }
        DType::NVFP4 | DType::Q1_0 | DType::Q2_0 => {
            // The int8 values are the integers, each 16 weights' scale the factor.
            let (mut d, mut q) = ([0f32; 8], [0i8; 128]);
            powerinfer_core::lowbit::unpack_lowbit(dtype, b, &mut d, &mut q);
            a.group = 16;
            a.s[..8].copy_from_slice(&d);
            a.m[..8].fill(0.0);
            a.q[..128].copy_from_slice(&q);
        }
        _ => {
            let mut sub = SubScales::default();
            unpack_k(dtype, b, &mut sub, &mut a.q);
            a.group = 256 / sub.n;
            for s in 0..sub.n {
                a.s[s] = sub.d[s];
                // d·q − m as the dequantizer computes it is d·q + (−m) exactly.
                a.m[s] = -sub.m[s];
            }
        }
    }
}

impl InputMajor {
    /// The input-major copy of `w` (every format; [`Error::Shape`](powerinfer_core::Error) for
    /// a buffer of the wrong size).
    pub fn new(w: &Weight) -> Result<InputMajor> {
        check::weight_bytes(w)?;
        let float = match w.dtype {
            DType::F32 => Some(Lines::F32),
            DType::F16 => Some(Lines::F16),
            DType::BF16 => Some(Lines::BF16),
            _ => None,
        };
        let mut m = match float {
            Some(lines) => InputMajor::laid_out(w, lines, 0, 32, (ScaleType::F32, false)),
            None => InputMajor::surveyed(w)?,
        };
        let mut data = PageBuf::zeroed(m.n_groups * m.chunk_bytes);
        if m.lines.is_float() {
            m.fill_float(w, data.as_mut_slice());
        } else {
            m.fill_quantized(w, data.as_mut_slice());
        }
        m.data = data.freeze();
        Ok(m)
    }

    /// The layout of `w`'s copy in `lines` (quants less `off`, `group` inputs per group, its
    /// scales as `scales`, with or without mins), its data still empty: float lines take groups
    /// of 32 and no tables.
    fn laid_out(
        w: &Weight,
        lines: Lines,
        off: i32,
        group: usize,
        (scales, has_min): (ScaleType, bool),
    ) -> InputMajor {
        let rows_pad = w.rows.div_ceil(SUB).max(1) * SUB;
        let n_groups = match lines.is_float() {
            true => w.cols.div_ceil(group).max(1),
            false => w.cols / group,
        };
        let line_bytes = rows_pad / SUB * lines.sub_bytes();
        let mut m = InputMajor {
            dtype: w.dtype,
            rows: w.rows,
            cols: w.cols,
            rows_pad,
            lines,
            line_bytes,
            off,
            group,
            scales,
            has_min,
            n_groups,
            chunk_bytes: 0,
            data: Buffer::from_bytes(&[]),
        };
        m.chunk_bytes = m.table_bytes() + group * line_bytes;
        m
    }

    /// The layout of a quantized `w`'s copy from pass 1 over its blocks: the integer range (4-bit
    /// or byte lines), whether every scale and min is an f16, whether any min is not 0.
    fn surveyed(w: &Weight) -> Result<InputMajor> {
        let (dtype, cols) = (w.dtype, w.cols);
        let (bs, bb) = (dtype.block_size(), dtype.block_bytes());
        let survey = (0..w.rows)
            .into_par_iter()
            .map(|r| {
                let mut a = Affine::default();
                let mut st = Survey::default();
                for b in w.row(r).chunks_exact(bb) {
                    affine_block(dtype, b, &mut a);
                    st.add(&a, bs);
                }
                st
            })
            .reduce(Survey::default, Survey::merge);
        let group = survey.group;
        ensure!(
            group > 0 && cols % group == 0,
            Shape,
            "{dtype} rows of {cols} inputs"
        );
        let (lines, off) = match survey.qmax - survey.qmin < 16 {
            // Q4_0/Q3_K (−8..7, −4..3) and the unsigned 4-bit and 2-bit formats.
            true if survey.qmin < 0 => (Lines::Nibble, -8),
            true => (Lines::Nibble, 0),
            false => (Lines::Byte, 0),
        };
        let scales = if survey.all_f16 {
            ScaleType::F16
        } else {
            ScaleType::F32
        };
        let tables = (scales, survey.has_min);
        Ok(InputMajor::laid_out(w, lines, off, group, tables))
    }

    /// Copy the float `w` into `data` (this layout's zeroed bytes), one column line per task.
    fn fill_float(&self, w: &Weight, data: &mut [u8]) {
        let eb = self.dtype.block_bytes();
        data.par_chunks_mut(self.line_bytes)
            .enumerate()
            .filter(|(c, _)| *c < self.cols)
            .for_each(|(c, line)| {
                for r in 0..self.rows {
                    line[r * eb..(r + 1) * eb].copy_from_slice(&w.row(r)[c * eb..(c + 1) * eb]);
                }
            });
    }

    /// Pass 2 of a quantized `w` into `data` (this layout's zeroed bytes): one chunk (group) per
    /// task, each decoding the group's block of every row into its scales, mins and lines.
    fn fill_quantized(&self, w: &Weight, data: &mut [u8]) {
        let (dtype, lines, group, off) = (self.dtype, self.lines, self.group, self.off);
        let (bs, bb) = (dtype.block_size(), dtype.block_bytes());
        let (sb, table, has_min) = (self.scales.bytes(), self.scale_table_bytes(), self.has_min);
        let (line_bytes, lines_at) = (self.line_bytes, self.table_bytes());
        let put = |buf: &mut [u8], v: f32| match self.scales {
            ScaleType::F16 => buf[..2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
            ScaleType::F32 => buf[..4].copy_from_slice(&v.to_le_bytes()),
        };
        let per_block = bs / group;
        data.par_chunks_mut(self.chunk_bytes)
            .enumerate()
            .for_each(|(g, chunk)| {
                let mut a = Affine::default();
                let (bi, k) = (g / per_block, g % per_block);
                for r in 0..self.rows {
                    affine_block(dtype, &w.row(r)[bi * bb..(bi + 1) * bb], &mut a);
                    put(&mut chunk[r * sb..], a.s[k]);
                    if has_min {
                        put(&mut chunk[table + r * sb..], a.m[k]);
                    }
                    let (at, hi) = line_pos(lines, r);
                    let body = &mut chunk[lines_at..];
                    for i in 0..group {
                        let q = a.q[k * group + i] as i32;
                        let byte = &mut body[i * line_bytes + at];
                        match lines {
                            Lines::Nibble => {
                                let u = (q - off) as u8 & 15;
                                *byte |= if hi { u << 4 } else { u };
                            }
                            _ => *byte = q as i8 as u8,
                        }
                    }
                }
            });
    }

    /// Bytes this copy holds.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }

    /// Inputs per group: the group length [`ActiveInput`]s for this matrix are built with.
    pub fn group_len(&self) -> usize {
        self.group
    }

    /// Bytes a product reads when a share `kept` of the inputs is kept (spread over every
    /// group): every scale table and the kept columns' lines.
    pub fn bytes_read(&self, kept: f64) -> f64 {
        let lines = (self.chunk_bytes - self.table_bytes()) as f64;
        self.n_groups as f64 * (self.table_bytes() as f64 + kept * lines)
    }

    /// Group `g`'s chunk.
    pub(crate) fn chunk(&self, g: usize) -> &[u8] {
        &self.data.as_slice()[g * self.chunk_bytes..(g + 1) * self.chunk_bytes]
    }

    /// Bytes of one scale (or min) table.
    pub(crate) fn scale_table_bytes(&self) -> usize {
        self.rows_pad * self.scales.bytes()
    }

    /// Bytes of the scale and min tables at the head of each chunk.
    pub(crate) fn table_bytes(&self) -> usize {
        if self.lines.is_float() {
            0
        } else {
            self.scale_table_bytes() * (1 + self.has_min as usize)
        }
    }
}

/// What pass 1 of [`InputMajor::new`] learns of a matrix.
#[derive(Clone, Copy, Debug)]
struct Survey {
    group: usize,
    qmin: i32,
    qmax: i32,
    all_f16: bool,
    has_min: bool,
}

impl Default for Survey {
    fn default() -> Self {
        Survey {
            group: 0,
            qmin: 0,
            qmax: 0,
            all_f16: true,
            has_min: false,
        }
    }
}

impl Survey {
    fn add(&mut self, a: &Affine, block: usize) {
        self.group = a.group;
        for &q in &a.q[..block] {
            self.qmin = self.qmin.min(q as i32);
            self.qmax = self.qmax.max(q as i32);
        }
        let fits = |v: f32| f16::from_f32(v).to_f32() == v || v.is_nan();
        for k in 0..block / a.group {
            self.all_f16 &= fits(a.s[k]) && fits(a.m[k]);
            self.has_min |= a.m[k] != 0.0;
        }
    }

    fn merge(a: Survey, b: Survey) -> Survey {
        Survey {
            group: a.group.max(b.group),
            qmin: a.qmin.min(b.qmin),
            qmax: a.qmax.max(b.qmax),
            all_f16: a.all_f16 && b.all_f16,
            has_min: a.has_min || b.has_min,
        }
    }
}

/// One group's kept inputs.
#[derive(Clone, Copy, Debug)]
pub(crate) struct GroupInput {
    /// The group's index.
    pub g: u32,
    /// Its pairs in [`ActiveInput::pairs`] (quantized matrices).
    pub pairs: (u32, u32),
    /// Its columns in [`ActiveInput::cols`] / [`ActiveInput::x`] (float matrices).
    pub cols: (u32, u32),
    /// x's int16 scale over the group's kept entries.
    pub xs: f32,
    /// Σ of the kept entries' int16 values.
    pub sumq: i32,
}

/// Two kept columns of a group (the second may repeat the first with xq = 0) and their int16
/// inputs packed as `xq0 | xq1 << 16`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pair {
    pub c: [u16; 2],
    pub xq: i32,
}

/// The kept entries of one input vector for matrices of one group length: per active group,
/// its pairs of int16 inputs (quantized matrices) and its (column, value) list (floats).
#[derive(Clone, Debug, Default)]
pub struct ActiveInput {
    pub(crate) group: usize,
    pub(crate) len: usize,
    pub(crate) groups: Vec<GroupInput>,
    pub(crate) pairs: Vec<Pair>,
    /// Column within its group.
    pub(crate) cols: Vec<u16>,
    pub(crate) x: Vec<f32>,
    kept: usize,
}

impl ActiveInput {
    /// The entries of `x` that `keep(i, x_i)` keeps (entries equal to 0 are dropped: they add
    /// nothing), for matrices whose group length is `group`.
    pub fn new(x: &[f32], group: usize, keep: impl Fn(usize, f32) -> bool) -> ActiveInput {
        let mut a = ActiveInput::default();
        a.fill(x, group, keep);
        a
    }

    /// [`ActiveInput::new`] into this one's buffers.
    pub fn fill(&mut self, x: &[f32], group: usize, keep: impl Fn(usize, f32) -> bool) {
        let group = group.max(1);
        self.group = group;
        self.len = x.len();
        self.groups.clear();
        self.pairs.clear();
        self.cols.clear();
        self.x.clear();
        self.kept = 0;
        for (g, xg) in x.chunks(group).enumerate() {
            let (p0, c0) = (self.pairs.len() as u32, self.cols.len() as u32);
            let mut amax = 0.0f32;
            for (i, &v) in xg.iter().enumerate() {
                if v != 0.0 && keep(g * group + i, v) {
                    self.cols.push(i as u16);
                    self.x.push(v);
                    amax = amax.max(v.abs());
                }
            }
            let c1 = self.cols.len() as u32;
            if c1 == c0 {
                continue;
            }
            self.kept += (c1 - c0) as usize;
            let xs = amax / 32767.0;
            let inv = if xs > 0.0 { 1.0 / xs } else { 0.0 };
            let mut sumq = 0i32;
            let kept = &self.cols[c0 as usize..];
            let vals = &self.x[c0 as usize..];
            // Round half away from zero without a libm call (f32::round is one on x86-64
            // without SSE4.1); |v·inv| <= 32767.
            let q = |v: f32| {
                let t = v * inv;
                (t + 0.5f32.copysign(t)) as i32
            };
            for k in (0..kept.len()).step_by(2) {
                let q0 = q(vals[k]);
                let (c1i, q1) = match kept.get(k + 1) {
                    Some(&c) => (c, q(vals[k + 1])),
                    None => (kept[k], 0),
                };
                sumq += q0 + q1;
                self.pairs.push(Pair {
                    c: [kept[k], c1i],
                    xq: (q0 as i16 as u16 as u32 | ((q1 as i16 as u16 as u32) << 16)) as i32,
                });
            }
            self.groups.push(GroupInput {
                g: g as u32,
                pairs: (p0, self.pairs.len() as u32),
                cols: (c0, c1),
                xs,
                sumq,
            });
        }
    }

    /// Entries kept.
    pub fn kept(&self) -> usize {
        self.kept
    }
}
