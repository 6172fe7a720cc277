//! Host-side layouts shared by the CUDA build and the stub: how rows are addressed on the device
//! ([`RowLayout`]), the hot-neuron slabs the VRAM plan accounts for ([`slab_geometry`], the one
//! definition of a slab's size and offsets, and [`pack_hot_slabs`]), the activation codes the
//! kernels understand ([`Act`], and the FFN's whole activation, [`FfnAct`]), the parameters of
//! decode attention ([`AttnParams`]). Device names are parsed in `powerinfer_core` (its
//! `Device` grammar).
//!
//! A slab (planner/README.md, `planning/accounting.py`) holds one bucket of `B` hot neurons:
//! their `B` gate rows, `B` up rows (none for a gate-less FFN: OPT, Falcon), `B` down_t rows
//! and `B` i32 neuron ids, padded to 256 bytes; a layer's `ffn_hot` is `n_slabs` slabs, exactly
//! `n_slabs · slab_bytes` bytes. A partial last bucket is padded with zero rows whose id is −1
//! (never active).

use crate::convert::{device_dtype, device_rows};
use powerinfer_core::{bail, ensure, Activation, DType, Result, Weight};

/// Every device allocation is rounded up to this many bytes (cudaMalloc's alignment).
pub const ALIGN: usize = 256;
/// Bytes of one neuron id in a slab (i32).
pub const NEURON_ID_BYTES: usize = 4;
/// Most bytes of x the row kernels stage in shared memory (48 KiB; `MAX_X_BYTES` in
/// sparse_matvec.cu): floats take 4 bytes each, quantized x [`XQ_BLOCK`] per 32 values.
pub const MAX_X_BYTES: usize = 48 * 1024;

/// Bytes of x quantized for the integer dots per 32 values (`XQ_BLOCK` in common.cuh):
/// 32 high and 32 low bytes of the int16 values, then the scale, the two half sums and Σq.
pub const XQ_BLOCK: usize = 80;

/// Bytes of x quantized for the integer dots (`quantize_x`): [`XQ_BLOCK`] per 32 values, the
/// values rounded up to a whole block.
pub const fn xq_bytes(len: usize) -> usize {
    len.div_ceil(32) * XQ_BLOCK
}

/// Bytes of x the row kernels of `dtype` read for rows of `cols` weights: floats for the float
/// formats, quantized blocks for the others.
pub const fn x_bytes(dtype: DType, cols: usize) -> usize {
    match dtype.is_quantized() {
        true => xq_bytes(cols),
        false => 4 * cols,
    }
}
/// Largest head_dim of attention_decode (`ATT_MAX_HEAD_DIM` in attention.cu).
pub const MAX_HEAD_DIM: usize = 256;
/// Fewest positions per chunk of the GPU's decode attention (flash-decoding): contexts up to
/// this run as one chunk, with no merge.
pub const ATT_MIN_CHUNK: usize = 64;
/// Most chunks the attention scratch is sized for (`scratch.attp`, [`att_part_len`]).
pub const ATT_MAX_CHUNKS: usize = 64;

/// Chunks of the attention scratch for a plan's `context`: one per [`ATT_MIN_CHUNK`]
/// positions, at most [`ATT_MAX_CHUNKS`] (accounting.py's `att_chunks`).
pub fn att_chunks(context: usize) -> usize {
    context.div_ceil(ATT_MIN_CHUNK).clamp(1, ATT_MAX_CHUNKS)
}

/// f32 values of the attention scratch (`scratch.attp`): per query head and chunk, the chunk's
/// unnormalised output (head_dim), max and normaliser (with one chunk the scratch goes unused,
/// but every allocation of a plan holds bytes).
pub fn att_part_len(n_heads: usize, head_dim: usize, context: usize) -> usize {
    n_heads * att_chunks(context) * (head_dim + 2)
}

/// `(chunks, positions per chunk)` of one attention launch over `n_active` positions, with a
/// scratch of `part_len` values: chunks of at least [`ATT_MIN_CHUNK`] positions, as many as
/// the scratch holds, every chunk non-empty.
pub fn att_chunking(
    n_active: usize,
    part_len: usize,
    n_heads: usize,
    head_dim: usize,
) -> (usize, usize) {
    let fits = part_len / (n_heads * (head_dim + 2)).max(1);
    let want = n_active.div_ceil(ATT_MIN_CHUNK).min(fits).max(1);
    let chunk = n_active.div_ceil(want).max(1);
    (n_active.div_ceil(chunk).max(1), chunk)
}
/// Largest predictor rank the GPU side takes (12,288 hidden units, far above what training
/// chooses; the tiled fc2 kernel itself reads them from global memory).
pub const MAX_RANK: usize = 48 * 1024 / 4;

/// `x` rounded up to [`ALIGN`].
pub const fn align(x: usize) -> usize {
    x.div_ceil(ALIGN) * ALIGN
}

/// Where row `r` of a matrix lives in a device buffer (mirrors `RowLayout` in common.cuh):
/// group `r / group_rows` starts at `group · group_stride`; inside it this matrix's rows start at
/// `offset` and are `row_bytes` apart.
///
/// The kernels find the group without dividing: `r / group_rows` is
/// `umulhi(r, div_mul) >> div_shr`, the multiplier and shift computed here once
/// ([`RowLayout::new`]; exact for every `r` and `group_rows` below 2^31, see
/// [`fast_div`]). Build a layout with [`RowLayout::new`] or [`RowLayout::dense`], so the two
/// always match `group_rows`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowLayout {
    pub group_stride: i64,
    pub offset: i64,
    pub group_rows: i32,
    pub row_bytes: i32,
    /// See [`fast_div`] (0 when `group_rows` is 1 or not positive).
    pub div_mul: u32,
    /// See [`fast_div`].
    pub div_shr: u32,
}

/// The multiplier and shift that divide by `d` (1..2^31) without a division:
/// `n / d == umulhi(n, mul) >> shr` for every `n` in 0..2^31 (the round-up method of Granlund
/// and Montgomery, as CUTLASS's `FastDivmod`): with `l = ceil(log2 d)`, `mul = ceil(2^(31+l) /
/// d)` and `shr = l − 1`. `d` = 1 (and anything not positive) gives `(0, 0)`: the kernels take
/// the group as `n` itself then.
pub fn fast_div(d: i32) -> (u32, u32) {
    if d <= 1 {
        return (0, 0);
    }
    let l = 32 - (d as u32 - 1).leading_zeros(); // ceil(log2 d), >= 1
    let p = 31 + l;
    let mul = (1u64 << p).div_ceil(d as u64);
    (mul as u32, l - 1)
}

impl RowLayout {
    /// A layout of groups of `group_rows` rows, `group_stride` bytes apart, this matrix's rows
    /// `offset` bytes into each and `row_bytes` apart.
    pub fn new(group_stride: i64, offset: i64, group_rows: i32, row_bytes: i32) -> RowLayout {
        let (div_mul, div_shr) = fast_div(group_rows);
        RowLayout {
            group_stride,
            offset,
            group_rows,
            row_bytes,
            div_mul,
            div_shr,
        }
    }

    /// A plain row-major matrix of `rows` rows.
    pub fn dense(rows: usize, row_bytes: usize) -> Result<RowLayout> {
        Ok(RowLayout::new(
            0,
            0,
            to_i32(rows.max(1), "rows")?,
            to_i32(row_bytes, "row bytes")?,
        ))
    }

    /// The group of row `r` (< 2^31), as the kernels compute it (`group_of` in common.cuh).
    pub fn group_of(&self, r: usize) -> usize {
        match self.group_rows {
            1 => r,
            _ => ((r as u64 * self.div_mul as u64) >> 32 >> self.div_shr) as usize,
        }
    }

    /// Byte offset of row `r` (the host mirror of `row_ptr`).
    pub fn byte_offset(&self, r: usize) -> usize {
        let g = self.group_of(r);
        let i = r - g * self.group_rows as usize;
        g * self.group_stride as usize + self.offset as usize + i * self.row_bytes as usize
    }
}

/// `v` as an i32 kernel argument, or a Shape error naming `what`.
pub fn to_i32(v: usize, what: &str) -> Result<i32> {
    i32::try_from(v).map_err(|_| powerinfer_core::Error::Shape(format!("{what} {v} > i32::MAX")))
}

/// The activation code a kernel applies (common.cuh `ACT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Act {
    None = 0,
    Relu = 1,
    Silu = 2,
    Gelu = 3,
    GeluErf = 4,
}

impl From<Activation> for Act {
    fn from(a: Activation) -> Act {
        match a {
            Activation::Relu => Act::Relu,
            Activation::Silu => Act::Silu,
            Activation::Gelu => Act::Gelu,
            Activation::GeluErf => Act::GeluErf,
        }
    }
}

/// The FFN's activation as the hot neurons' gate/up pass applies it (the CPU engine's
/// `FfnKind::apply` and `times_up`): `h = act(g)·u`, or `act(g)·act(u)` with `up_act`
/// (Bamboo), or `act(g)` for a gate-less FFN; `act` with a FATReLU threshold `t > 0`
/// (ProSparse, ReLU only) is `x` where `x > t`, else 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FfnAct {
    pub act: Act,
    /// FATReLU's threshold (0: plain ReLU); non-negative, and nonzero only with [`Act::Relu`].
    pub relu_threshold: f32,
    /// The up value passes through the activation too (Bamboo).
    pub up_act: bool,
    /// gpt-oss's clamped SwiGLU with this limit (0: none): `h = swiglu_oai(g + b_g, u + b_u,
    /// limit)` over the biased gate and up values instead of `act(g)·u`
    /// (`powerinfer_core::swiglu_oai`); the gate/up pass with up rows only.
    pub swiglu_limit: f32,
}

impl From<Act> for FfnAct {
    /// `act(g)·u`: no threshold, the up value as it is (Llama's SwiGLU, ReluLLaMA).
    fn from(act: Act) -> FfnAct {
        FfnAct {
            act,
            relu_threshold: 0.0,
            up_act: false,
            swiglu_limit: 0.0,
        }
    }
}

/// One query's decode attention: `n_heads` query heads over `n_kv_heads` KV heads of
/// `head_dim` (grouped-query), over the last `window` positions (None: all), scores
/// `(q·k)·scale`, soft-capped to `c · tanh(s / c)` with `softcap` (Gemma 2), then softmax.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Sliding window: the query at position `n_pos − 1` attends to positions
    /// `n_pos.saturating_sub(w)..n_pos` (at least 1; None: from 0).
    pub window: Option<usize>,
    /// The query scale (1/√head_dim unless the family sets one: [`AttnParams::new`]).
    pub scale: f32,
    /// Scores soft-capped to `c · tanh(s / c)` before the softmax (`c > 0`).
    pub softcap: Option<f32>,
}

impl AttnParams {
    /// Plain causal attention (Llama's): no window, scale 1/√head_dim, no cap.
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize) -> AttnParams {
        AttnParams {
            n_heads,
            n_kv_heads,
            head_dim,
            window: None,
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
        }
    }

    /// The first position the query at `n_pos − 1` attends to.
    pub fn first(&self, n_pos: usize) -> usize {
        self.window.map_or(0, |w| n_pos.saturating_sub(w))
    }
}

/// Layout of one layer's hot neurons in their slabs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlabLayout {
    /// Neurons per slab (the plan's bucket).
    pub bucket: usize,
    /// Hot neurons (slots `0..n_hot` hold them, in the order given).
    pub n_hot: usize,
    pub n_slabs: usize,
    /// Bytes per slab: `align(bucket · (gate + up + down_t row bytes + 4))`.
    pub slab_bytes: usize,
    /// Model width (columns of gate/up/down_t).
    pub dim: usize,
    /// The FFN's neurons (every id is below it: the length of flags and biases indexed by id).
    pub ffn: usize,
    pub gate_dtype: DType,
    /// None for a gate-less FFN (no up rows).
    pub up_dtype: Option<DType>,
    pub down_dtype: DType,
    pub gate: RowLayout,
    /// None for a gate-less FFN.
    pub up: Option<RowLayout>,
    pub down: RowLayout,
    /// The i32 neuron ids, as 4-byte rows.
    pub ids: RowLayout,
}

impl SlabLayout {
    /// Total bytes (`n_slabs · slab_bytes`: the plan's `ffn_hot` allocation).
    pub fn total_bytes(&self) -> usize {
        self.n_slabs * self.slab_bytes
    }
}

/// Bytes of one slab: `bucket` neurons of `neuron_bytes` (gate + up + down_t row bytes) plus
/// their i32 ids, rounded up to [`ALIGN`] (`accounting.slab_bytes`).
pub const fn slab_bytes(neuron_bytes: usize, bucket: usize) -> usize {
    align(bucket * (neuron_bytes + NEURON_ID_BYTES))
}

/// Where one slab's parts start: the row bytes of gate, up and down_t, the byte offsets of the
/// gate, up, down_t rows and the ids inside a slab, and the slab's size. The one definition
/// both the upload ([`pack_hot_slabs`]) and the allocation list
/// ([`crate::alloc_plan::gpu_allocations`]) use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlabGeometry {
    /// Bytes of one gate, up and down_t row (`dim` weights each, in their formats; 0 for the up
    /// row of a gate-less FFN, whose up part is empty).
    pub row_bytes: [usize; 3],
    /// Offsets inside a slab of the gate rows, up rows, down_t rows and the i32 ids.
    pub offsets: [usize; 4],
    /// [`slab_bytes`] of one neuron's rows.
    pub slab_bytes: usize,
}

/// The slab geometry for `bucket` neurons whose gate, up (None: a gate-less FFN, no up rows)
/// and down_t rows of `dim` weights are stored as `gate`, `up`, `down_t` (on the device: as
/// [`device_dtype`], the table formats converted to Q8_0). `Error::Unsupported`
/// when a matrix's rows would not be aligned for its element loads (f32: 4 bytes, the rest: 2),
/// the ids not to 4 bytes or a format has no GPU kernels; `Error::Plan` for a zero bucket;
/// `Error::Shape` when `dim` is no whole number of a format's blocks.
pub fn slab_geometry(
    gate: DType,
    up: Option<DType>,
    down_t: DType,
    dim: usize,
    bucket: usize,
) -> Result<SlabGeometry> {
    ensure!(bucket > 0, Plan, "bucket must be > 0");
    let parts = [Some(gate), up, Some(down_t)];
    let mut row_bytes = [0usize; 3];
    for (rb, d) in row_bytes.iter_mut().zip(parts) {
        if let Some(d) = d.map(device_dtype) {
            crate::kernels::ensure_gpu_dtype(d)?;
            *rb = d.row_bytes(dim)?;
        }
    }
    let [g_rb, u_rb, d_rb] = row_bytes;
    let offsets = [
        0,
        bucket * g_rb,
        bucket * (g_rb + u_rb),
        bucket * (g_rb + u_rb + d_rb),
    ];
    // Each matrix's rows must be aligned for its element loads (f32: 4, the rest: 2).
    for ((dtype, off), rb) in parts.into_iter().zip(offsets).zip(row_bytes) {
        let Some(dtype) = dtype else { continue };
        let need = if dtype == DType::F32 { 4 } else { 2 };
        if !off.is_multiple_of(need) || !rb.is_multiple_of(need) {
            bail!(
                Unsupported,
                "{dtype} rows at slab offset {off} are not {need}-byte aligned"
            );
        }
    }
    ensure!(
        offsets[3].is_multiple_of(4),
        Unsupported,
        "slab ids at offset {} are not 4-aligned",
        offsets[3]
    );
    Ok(SlabGeometry {
        row_bytes,
        offsets,
        slab_bytes: slab_bytes(g_rb + u_rb + d_rb, bucket),
    })
}

/// The rows of one kind (gate, up or transposed down) of a layer's neurons, read in place: one
/// matrix, or several of one format and width one after another (a mixture of experts: each
/// expert's block of rows, then the shared expert's), so neuron `i` is row `i` of the whole.
#[derive(Clone, Debug)]
pub struct RowSpace<'a> {
    parts: Vec<&'a Weight>,
    rows: usize,
}

impl<'a> RowSpace<'a> {
    /// The rows of `parts`, in order; `Error::Shape` when there are none or they differ in
    /// format or width.
    pub fn new(parts: Vec<&'a Weight>) -> Result<RowSpace<'a>> {
        let Some(first) = parts.first() else {
            bail!(Shape, "a row space of no matrices");
        };
        for w in &parts[1..] {
            ensure!(
                w.dtype == first.dtype && w.cols == first.cols,
                Shape,
                "a row space of {} x {} and {} x {} rows",
                first.dtype,
                first.cols,
                w.dtype,
                w.cols
            );
        }
        let rows = parts.iter().map(|w| w.rows).sum();
        Ok(RowSpace { parts, rows })
    }

    /// The rows of one matrix.
    pub fn one(w: &'a Weight) -> RowSpace<'a> {
        RowSpace {
            parts: vec![w],
            rows: w.rows,
        }
    }

    /// The rows' format.
    pub fn dtype(&self) -> DType {
        self.parts[0].dtype
    }

    /// Weights per row.
    pub fn cols(&self) -> usize {
        self.parts[0].cols
    }

    /// Rows in all.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Row `i`: the stored bytes of the part that holds it (None past the end).
    pub fn row(&self, mut i: usize) -> Option<&'a [u8]> {
        for w in &self.parts {
            if i < w.rows {
                return Some(w.row(i));
            }
            i -= w.rows;
        }
        None
    }
}

/// Pack the hot neurons `ids` (slot order) of one layer into slabs of `bucket` neurons:
/// gate/up are `[ffn, dim]` (no up for a gate-less FFN), down_t is `[ffn, dim]` (the down
/// projection transposed). Returns the layout and the bytes to upload (exactly
/// [`SlabLayout::total_bytes`]), rows of the table formats converted to Q8_0
/// ([`crate::convert`]), of the 32-weight quantized formats repacked ([`crate::repack`]).
/// [`pack_hot_rows`] over one matrix of each kind.
pub fn pack_hot_slabs(
    gate: &Weight,
    up: Option<&Weight>,
    down_t: &Weight,
    ids: &[u32],
    bucket: usize,
) -> Result<(SlabLayout, Vec<u8>)> {
    let up = up.map(RowSpace::one);
    pack_hot_rows(
        &RowSpace::one(gate),
        up.as_ref(),
        &RowSpace::one(down_t),
        ids,
        bucket,
    )
}

/// [`pack_hot_slabs`] over row spaces (a mixture of experts' flattened neurons).
pub fn pack_hot_rows(
    gate: &RowSpace<'_>,
    up: Option<&RowSpace<'_>>,
    down_t: &RowSpace<'_>,
    ids: &[u32],
    bucket: usize,
) -> Result<(SlabLayout, Vec<u8>)> {
    let (ffn, dim) = (gate.rows(), gate.cols());
    for (name, w) in [("up", up), ("down_t", Some(down_t))] {
        let Some(w) = w else { continue };
        ensure!(
            w.rows() == ffn && w.cols() == dim,
            Shape,
            "{name} is {} x {}, gate is {ffn} x {dim}",
            w.rows(),
            w.cols()
        );
    }
    ensure!(bucket > 0, Plan, "bucket must be > 0");
    let mut seen = vec![false; ffn];
    for &i in ids {
        ensure!(
            (i as usize) < ffn,
            Plan,
            "hot neuron {i} out of range for ffn {ffn}"
        );
        ensure!(!seen[i as usize], Plan, "hot neuron {i} listed twice");
        seen[i as usize] = true;
    }
    let SlabGeometry {
        row_bytes: [g_rb, u_rb, d_rb],
        offsets,
        slab_bytes: slab,
    } = slab_geometry(
        device_dtype(gate.dtype()),
        up.map(|u| device_dtype(u.dtype())),
        device_dtype(down_t.dtype()),
        dim,
        bucket,
    )?;
    let n_slabs = ids.len().div_ceil(bucket);
    let stride = slab as i64;
    let group = to_i32(bucket, "bucket")?;
    let mk = |offset: usize, row_bytes: usize| -> Result<RowLayout> {
        Ok(RowLayout::new(
            stride,
            offset as i64,
            group,
            to_i32(row_bytes, "row bytes")?,
        ))
    };
    let layout = SlabLayout {
        bucket,
        n_hot: ids.len(),
        n_slabs,
        slab_bytes: slab,
        dim,
        ffn,
        gate_dtype: device_dtype(gate.dtype()),
        up_dtype: up.map(|u| device_dtype(u.dtype())),
        down_dtype: device_dtype(down_t.dtype()),
        gate: mk(offsets[0], g_rb)?,
        up: up.map(|_| mk(offsets[1], u_rb)).transpose()?,
        down: mk(offsets[2], d_rb)?,
        ids: mk(offsets[3], NEURON_ID_BYTES)?,
    };
    let mut bytes = vec![0u8; layout.total_bytes()];
    let parts = [
        Some((gate, layout.gate)),
        up.zip(layout.up),
        Some((down_t, layout.down)),
    ];
    for slot in 0..n_slabs * bucket {
        let id = ids.get(slot).map_or(-1, |&i| i as i32);
        let at = layout.ids.byte_offset(slot);
        bytes[at..at + 4].copy_from_slice(&id.to_le_bytes());
        if id < 0 {
            continue; // padding: zero rows
        }
        for (w, l) in parts.iter().flatten() {
            let Some(row) = w.row(id as usize) else {
                bail!(Plan, "hot neuron {id} out of range for ffn {ffn}");
            };
            let row = device_rows(w.dtype(), w.cols(), row)?;
            let dtype = device_dtype(w.dtype());
            let at = l.byte_offset(slot);
            let dst = &mut bytes[at..at + row.len()];
            dst.copy_from_slice(&crate::repack::repack_rows(dtype, w.cols(), &row)?);
        }
    }
    Ok((layout, bytes))
}

#[cfg(test)]
mod tests {

    #[test]
    fn fast_div_is_exact_division() {
        let mut ds: Vec<i32> = (1..=4100).collect();
        ds.extend([
            65_535,
            65_536,
            65_537,
            1 << 20,
            (1 << 24) + 3,
            i32::MAX - 1,
            i32::MAX,
        ]);
        let mut ns: Vec<u32> = (0..5000).collect();
        ns.extend((0..31).flat_map(|b| [(1u32 << b) - 1, 1 << b, (1 << b) + 1]));
        ns.extend([i32::MAX as u32 - 1, i32::MAX as u32]);
        let mut x = 0x2545_f491_4f6c_dd1du64; // odd values across the whole range
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ns.push((x as u32) >> 1);
        }
        for &d in &ds {
            let l = RowLayout::new(0, 0, d, 1);
            for &n in &ns {
                let want = n as usize / d as usize;
                assert_eq!(l.group_of(n as usize), want, "{n} / {d}");
            }
            if d > 1 {
                // Every multiple's neighbourhood, where a bad multiplier fails first.
                for k in [1u64, 2, 3, 1000, (i32::MAX as u64) / d as u64] {
                    for n in [k * d as u64 - 1, k * d as u64] {
                        if n <= i32::MAX as u64 {
                            assert_eq!(l.group_of(n as usize) as u64, n / d as u64, "{n} / {d}");
                        }
                    }
                }
            }
        }
    }
    use super::*;
    use powerinfer_core::testing::quantized_weight;

    fn weight(dtype: DType, rows: usize, cols: usize, seed: f32) -> Weight {
        let vals: Vec<f32> = (0..rows * cols)
            .map(|i| ((i / cols * 31 + i % cols) as f32 * seed).sin())
            .collect();
        quantized_weight(dtype, rows, cols, &vals)
    }

    #[test]
    fn slabs_match_the_plan_accounting_and_hold_the_rows() {
        let (ffn, dim, bucket) = (50, 64, 8);
        let gate = weight(DType::Q4_0, ffn, dim, 0.1);
        let up = weight(DType::Q8_0, ffn, dim, 0.2);
        let down = weight(DType::F16, ffn, dim, 0.3);
        let ids: Vec<u32> = vec![7, 3, 49, 0, 12, 30, 31, 2, 5, 44, 18]; // 11: a partial slab
        let (l, bytes) = pack_hot_slabs(&gate, Some(&up), &down, &ids, bucket).unwrap();
        // accounting.slab_bytes: align(bucket * (neuron_read_bytes + 4)).
        let neuron = 2 * 18 + 2 * 34 + dim * 2;
        assert_eq!(l.slab_bytes, (bucket * (neuron + 4)).div_ceil(256) * 256);
        assert_eq!(l.n_slabs, 2);
        assert_eq!(bytes.len(), 2 * l.slab_bytes);
        // The quantized rows are stored repacked (quants, then headers: crate::repack).
        let dev_row = |w: &Weight, id: u32| {
            crate::repack::repack_rows(w.dtype, w.cols, w.row(id as usize)).unwrap()
        };
        for (slot, &id) in ids.iter().enumerate() {
            let at = l.gate.byte_offset(slot);
            assert_eq!(bytes[at..at + 36], dev_row(&gate, id));
            let at = l.up.unwrap().byte_offset(slot);
            assert_eq!(bytes[at..at + 68], dev_row(&up, id));
            let at = l.down.byte_offset(slot);
            assert_eq!(&bytes[at..at + 128], down.row(id as usize));
            let at = l.ids.byte_offset(slot);
            assert_eq!(
                i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()),
                id as i32
            );
        }
        for slot in ids.len()..16 {
            let at = l.ids.byte_offset(slot);
            assert_eq!(
                i32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()),
                -1
            );
        }
    }

    #[test]
    fn gate_less_slabs_hold_gate_down_t_and_ids_only() {
        let (ffn, dim, bucket) = (50, 64, 8);
        let gate = weight(DType::Q8_0, ffn, dim, 0.4);
        let down = weight(DType::F16, ffn, dim, 0.5);
        let ids: Vec<u32> = vec![9, 1, 40, 33, 2, 17, 48, 0, 21]; // 9: a partial slab
        let (l, bytes) = pack_hot_slabs(&gate, None, &down, &ids, bucket).unwrap();
        // accounting.slab_bytes of a gate-less family: one input row + down_t row + id.
        let neuron = 2 * 34 + dim * 2;
        assert_eq!(l.slab_bytes, (bucket * (neuron + 4)).div_ceil(256) * 256);
        assert_eq!((l.up, l.up_dtype, l.ffn), (None, None, ffn));
        assert_eq!(l.down.offset as usize, bucket * 68);
        assert_eq!(bytes.len(), 2 * l.slab_bytes);
        for (slot, &id) in ids.iter().enumerate() {
            let at = l.gate.byte_offset(slot);
            let want = crate::repack::repack_rows(DType::Q8_0, dim, gate.row(id as usize));
            assert_eq!(bytes[at..at + 68], want.unwrap());
            let at = l.down.byte_offset(slot);
            assert_eq!(&bytes[at..at + 128], down.row(id as usize));
        }
        let g = slab_geometry(DType::Q8_0, None, DType::F16, dim, bucket).unwrap();
        assert_eq!(g.row_bytes, [68, 0, 128]);
        assert_eq!(g.offsets, [0, 8 * 68, 8 * 68, 8 * (68 + 128)]);
        assert_eq!(g.slab_bytes, l.slab_bytes);
    }

    #[test]
    fn bad_hot_lists_are_errors() {
        let w = weight(DType::F16, 4, 8, 0.1);
        assert!(pack_hot_slabs(&w, Some(&w), &w, &[1, 1], 2).is_err());
        assert!(pack_hot_slabs(&w, Some(&w), &w, &[4], 2).is_err());
        assert!(pack_hot_slabs(&w, None, &w, &[4], 2).is_err());
        assert!(pack_hot_slabs(&w, Some(&w), &w, &[0], 0).is_err());
        let other = weight(DType::F16, 4, 16, 0.1);
        assert!(pack_hot_slabs(&w, Some(&other), &w, &[0], 2).is_err());
        assert!(pack_hot_slabs(&w, None, &other, &[0], 2).is_err());
    }

    #[test]
    fn attention_windows_start_where_the_cpu_starts() {
        let mut p = AttnParams::new(4, 2, 64);
        assert_eq!(p.scale, 0.125);
        assert_eq!(p.first(10), 0);
        p.window = Some(3);
        assert_eq!((p.first(10), p.first(3), p.first(2)), (7, 0, 0));
        let a = FfnAct::from(Act::Silu);
        assert_eq!((a.act, a.relu_threshold, a.up_act), (Act::Silu, 0.0, false));
    }
}
