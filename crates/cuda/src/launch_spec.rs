//! The one launch description of every kernel: [`launch_spec`] turns a checked [`Launch`] into
//! its module, entry name, grid, block, dynamic shared bytes and packed arguments, the array of
//! pointers `cuLaunchKernel` receives. [`CudaDevice`](crate::CudaDevice) launches that spec on
//! the GPU and the emulator (`device="gpu-emu"`) calls the kernel's compiled C++ with the very
//! same array, checking the count and byte width of every argument against the kernel's
//! declared parameters, so argument order, widths, struct layouts and the grid and shared-memory
//! arithmetic here are exercised on every machine.
//!
//! Shapes were checked by [`crate::ops`] before a `Launch` exists; lengths are converted to the
//! kernels' `int` here. Each kernel's contract (what its arguments must hold) is the comment
//! above it in its `.cu` file and on its [`Launch`] variant.

use std::ffi::c_void;

use powerinfer_core::{ensure, DType, Result};

use crate::backend::{Backend, Launch};
use crate::kernels::{self, dtype_suffix, kv_entry, KernelSource};
use crate::layout::{to_i32, x_bytes, RowLayout, MAX_X_BYTES};
use crate::ops::MAX_ROPE_PAIRS;

/// Threads per block of the row kernels (8 warps).
pub const ROW_THREADS: u32 = 256;
/// Output rows per block of sparse_matvec / gate_up (`ROWS_PER_BLOCK` in sparse_matvec.cu).
pub const ROWS_PER_BLOCK: usize = 16;
/// Threads per block of the thread-per-element kernels.
pub const ELEM_THREADS: u32 = 256;
/// Threads of rms_norm's and layer_norm's one block per row (8 warps: a row of a few thousand values is a few
/// loads per thread; the kernel takes up to 32 warps).
pub const NORM_THREADS: u32 = 256;
/// Warps per block of attention_decode (`ATT_WARPS` in attention.cu), as threads.
pub const ATT_THREADS: u32 = 4 * 32;
/// Query heads per block of attention_decode (`ATT_GROUP` in attention.cu).
pub const ATT_GROUP: usize = 4;

/// A kernel's arguments packed as `cuLaunchKernel` takes them: each value in its own 8-byte
/// aligned slot, in the kernel's parameter order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelArgs {
    words: Vec<u64>,
    /// (first word, bytes) of each argument.
    slots: Vec<(usize, usize)>,
}

impl KernelArgs {
    /// Any value as its bytes (a struct passed by value), in a slot of its own.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let first = self.words.len();
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.words.push(u64::from_le_bytes(w));
        }
        self.slots.push((first, bytes.len()));
    }

    /// A device address (a kernel pointer parameter; 0 is the null pointer).
    pub fn ptr(&mut self, addr: u64) -> &mut Self {
        self.push_bytes(&addr.to_le_bytes());
        self
    }

    /// An `int`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push_bytes(&v.to_le_bytes());
        self
    }

    /// A `float`.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push_bytes(&v.to_le_bytes());
        self
    }

    /// A `RowLayout` by value, laid out as common.cuh's struct (i64, i64, i32, i32, u32, u32).
    pub fn layout(&mut self, l: &RowLayout) -> &mut Self {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(&l.group_stride.to_le_bytes());
        b.extend_from_slice(&l.offset.to_le_bytes());
        b.extend_from_slice(&l.group_rows.to_le_bytes());
        b.extend_from_slice(&l.row_bytes.to_le_bytes());
        b.extend_from_slice(&l.div_mul.to_le_bytes());
        b.extend_from_slice(&l.div_shr.to_le_bytes());
        self.push_bytes(&b);
        self
    }

    /// norm_rope.cu's `RopeAngles` by value for position `pos`: the cosine, then the sine, of
    /// `pos · inv[i]` for each pair, formed and evaluated in f64 here (as the CPU engine does;
    /// positions reach tens of thousands of radians, where f32 loses the phase) and rounded to
    /// f32; MAX_ROPE_PAIRS of each, the unused ones 0.
    pub fn rope_angles(&mut self, pos: usize, inv: &[f64]) -> Result<&mut Self> {
        ensure!(
            inv.len() <= MAX_ROPE_PAIRS,
            Unsupported,
            "rope: {} rotated pairs, the kernel takes at most {MAX_ROPE_PAIRS}",
            inv.len()
        );
        let (mut cos, mut sin) = (vec![0f32; MAX_ROPE_PAIRS], vec![0f32; MAX_ROPE_PAIRS]);
        for (i, f) in inv.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            (cos[i], sin[i]) = (c as f32, s as f32);
        }
        let b: Vec<u8> = cos
            .iter()
            .chain(&sin)
            .flat_map(|v| v.to_le_bytes())
            .collect();
        self.push_bytes(&b);
        Ok(self)
    }

    /// How many arguments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The byte width of each argument, in order.
    pub fn sizes(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.1).collect()
    }

    /// Argument `i`'s bytes.
    pub fn bytes(&self, i: usize) -> Vec<u8> {
        let (first, n) = self.slots[i];
        let words = &self.words[first..first + n.div_ceil(8)];
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(n);
        out
    }

    /// The pointer array of `cuLaunchKernel`: entry i points at argument i's slot. Valid while
    /// `self` is neither moved nor changed.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        let base = self.words.as_mut_ptr();
        self.slots
            .iter()
            // wrapping_add: pointer arithmetic inside the words vector, no dereference here.
            .map(|&(first, _)| base.wrapping_add(first).cast::<c_void>())
            .collect()
    }
}

/// Everything a launch needs: which kernel, its grid and block, its dynamic shared memory and
/// its arguments.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The module (`.cu` file) defining the kernel.
    pub module: &'static KernelSource,
    /// The kernel's `extern "C"` name.
    pub entry: String,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// The arguments, in the kernel's parameter order.
    pub args: KernelArgs,
}

/// Dynamic shared memory of the row kernels of `dtype`: x staged (`stage_x` in
/// sparse_matvec.cu: floats, or the quantized blocks) when it fits, none for longer rows, which
/// read x from global memory.
pub fn x_smem(dtype: DType, cols: usize) -> usize {
    match x_bytes(dtype, cols) {
        b if b <= MAX_X_BYTES => b,
        _ => 0,
    }
}

/// Values per thread of the tiled row-sum kernels (`ROW_TILE_*` in common.cuh: one 16-byte
/// unit of a float row, one 32-weight block of the quantized formats, 16 bytes of a K-quant
/// super-block's quants; the down pass and the predictor's fc2).
pub const fn row_tile(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 4,
        DType::F16 | DType::BF16 => 8,
        _ => 32,
    }
}

/// Units of a tiled kernel's block: one warp's worth, fewer for narrower rows.
const TILE_UNITS_PER_BLOCK: usize = 32;

/// `(gridDim.x, units_pb, dynamic shared bytes)` of a tiled row-sum kernel of `dtype` over
/// `cols` columns (axpy_down.cu, predictor.cu): a block holds `units_pb` units (32, or the row's
/// units rounded up to a power of two when fewer) and 256 / units_pb row lanes, whose sums meet
/// in 256 · tile floats of shared memory.
pub fn tile_geometry(dtype: DType, cols: usize) -> Result<(u32, usize, usize)> {
    let threads = ROW_THREADS as usize;
    let tile = row_tile(dtype);
    let units = cols.div_ceil(tile);
    let units_pb = units.next_power_of_two().min(TILE_UNITS_PER_BLOCK);
    let smem = if units_pb < threads {
        threads * tile * 4
    } else {
        0
    };
    Ok((grid(units, units_pb)?, units_pb, smem))
}

/// Blocks of `per` covering `n` (at least one).
fn grid(n: usize, per: usize) -> Result<u32> {
    Ok(to_i32(n.div_ceil(per).max(1), "grid size")? as u32)
}

fn spec(
    module: &'static KernelSource,
    entry: String,
    blocks: [u32; 2],
    threads: u32,
    smem: usize,
    args: KernelArgs,
) -> Result<LaunchSpec> {
    Ok(LaunchSpec {
        module,
        entry,
        grid: [blocks[0], blocks[1], 1],
        block: [threads, 1, 1],
        shared_bytes: u32::try_from(smem).unwrap_or(u32::MAX),
        args,
    })
}

/// A thread-per-element kernel: blocks of [`ELEM_THREADS`] covering `n` threads.
fn per_element(
    module: &'static KernelSource,
    entry: String,
    n: usize,
    smem: usize,
    args: KernelArgs,
) -> Result<LaunchSpec> {
    let blocks = [grid(n, ELEM_THREADS as usize)?, 1];
    spec(module, entry, blocks, ELEM_THREADS, smem, args)
}

/// The spec of `launch` on `dev` (buffers become `dev`'s addresses for them).
pub fn launch_spec<B: Backend>(dev: &B, launch: Launch<'_, B>) -> Result<LaunchSpec> {
    let opt = |b: Option<&B::Buf<i32>>| b.map_or(0, |b| dev.addr(b));
    let mut a = KernelArgs::default();
    match launch {
        Launch::SparseMatvec {
            dtype,
            w,
            l,
            x,
            cols,
            idx,
            n,
            ids,
            flags,
            act,
            accumulate,
            y,
        } => {
            ensure!(
                flags.is_none() || ids.is_some(),
                Unsupported,
                "sparse_matvec: flags without neuron ids"
            );
            x.check("sparse_matvec", dtype)?;
            let ids_l = match ids {
                Some((_, l)) => l,
                None => RowLayout::dense(1, 4)?,
            };
            // sparse_matvec_<dtype>(w, l, x, cols, idx, n, ids_base, ids_l, flags, act,
            // accumulate, y): x
            // holds `cols` values (floats or quantized blocks), staged in x_smem(dtype, cols)
            // bytes; y holds n floats; rows 0..n (or the indices) lie inside w per `l`; flags
            // come with the ids they are indexed by.
            a.ptr(dev.addr(w)).layout(&l).ptr(x.addr(dev));
            a.i32(to_i32(cols, "cols")?)
                .ptr(opt(idx))
                .i32(to_i32(n, "rows")?);
            a.ptr(ids.map_or(0, |(b, _)| dev.addr(b))).layout(&ids_l);
            a.ptr(opt(flags)).i32(act as i32).i32(i32::from(accumulate));
            a.ptr(dev.addr_mut(y));
            let entry = format!("sparse_matvec_{}", dtype_suffix(dtype));
            let blocks = [grid(n, ROWS_PER_BLOCK)?, 1];
            spec(
                &kernels::SPARSE_MATVEC,
                entry,
                blocks,
                ROW_THREADS,
                x_smem(dtype, cols),
                a,
            )
        }
        Launch::GateUp {
            dtype,
            w,
            gate_l,
            up_l,
            x,
            cols,
            idx,
            n,
            ids_l,
            flags,
            bias,
            act,
            count,
            h,
        } => {
            // gate_up_<dtype>(w, gate_l, up_l, x, cols, idx, n, ids_l, flags, bias, act, relu_t,
            // up_mode, count, h): the slab layouts come from pack_hot_slabs for this buffer,
            // slots 0..n hold ids < ffn or −1, flags and bias have one entry per FFN neuron; h
            // holds n floats; count (null: none) one int. Without up rows the kernel never
            // reads up_l (UP_NONE).
            x.check("gate_up", dtype)?;
            let up_mode = match (up_l, act.up_act) {
                (None, _) => 0,
                (Some(_), false) => 1,
                (Some(_), true) => 2,
            };
            let up_l = up_l.unwrap_or(gate_l);
            a.ptr(dev.addr(w))
                .layout(&gate_l)
                .layout(&up_l)
                .ptr(x.addr(dev));
            a.i32(to_i32(cols, "dim")?)
                .ptr(opt(idx))
                .i32(to_i32(n, "hot")?);
            a.layout(&ids_l)
                .ptr(opt(flags))
                .ptr(bias.map_or(0, |b| dev.addr(b)));
            a.i32(act.act as i32)
                .f32(act.relu_threshold)
                .i32(up_mode)
                .ptr(opt(count))
                .ptr(dev.addr_mut(h));
            let entry = format!("gate_up_{}", dtype_suffix(dtype));
            let blocks = [grid(n, ROWS_PER_BLOCK)?, 1];
            spec(
                &kernels::SPARSE_MATVEC,
                entry,
                blocks,
                ROW_THREADS,
                x_smem(dtype, cols),
                a,
            )
        }
        Launch::QuantizeX { x, cols, xq } => {
            // quantize_x(x, cols, xq): a warp per 32 values, 8 per block; cols a multiple of 32
            // (ops checks it), xq holds xq_bytes(cols).
            a.ptr(dev.addr(x))
                .i32(to_i32(cols, "cols")?)
                .ptr(dev.addr_mut(xq));
            let warps = (ROW_THREADS / 32) as usize;
            let blocks = [grid(cols / 32, warps)?, 1];
            spec(
                &kernels::SPARSE_MATVEC,
                "quantize_x".into(),
                blocks,
                ROW_THREADS,
                0,
                a,
            )
        }
        Launch::AxpyRows {
            dtype,
            w,
            l,
            cols,
            idx,
            a: coef,
            n,
            count,
            part,
            y,
            splits,
        } => {
            // axpy_rows_<dtype>(w, l, cols, idx, a, n, count, part, y, units_pb): a holds n
            // floats, y `cols`, part (null for one split) splits · cols, count (null: none)
            // one int; splits is 1..=min(n, 65,535) (ops clamps it), gridDim.y; the block
            // geometry from tile_geometry.
            a.ptr(dev.addr(w))
                .layout(&l)
                .i32(to_i32(cols, "cols")?)
                .ptr(opt(idx));
            a.ptr(dev.addr(coef))
                .i32(to_i32(n, "rows")?)
                .ptr(opt(count))
                .ptr(part.map_or(0, |p| dev.addr_mut(p)))
                .ptr(dev.addr_mut(y));
            let (gx, units_pb, smem) = tile_geometry(dtype, cols)?;
            a.i32(to_i32(units_pb, "units per block")?);
            let entry = format!("axpy_rows_{}", dtype_suffix(dtype));
            spec(
                &kernels::AXPY_DOWN,
                entry,
                [gx, splits as u32],
                ROW_THREADS,
                smem,
                a,
            )
        }
        Launch::PredictorFc2 {
            dtype,
            fc2_t,
            l,
            hidden,
            rank,
            ffn,
            threshold,
            flags,
            logits,
        } => {
            // predictor_fc2_<dtype>(fc2_t, l, hidden, rank, ffn, threshold, flags, logits,
            // units_pb): the geometry from tile_geometry.
            a.ptr(dev.addr(fc2_t)).layout(&l).ptr(dev.addr(hidden));
            a.i32(to_i32(rank, "rank")?)
                .i32(to_i32(ffn, "ffn")?)
                .f32(threshold);
            a.ptr(dev.addr_mut(flags));
            a.ptr(logits.map_or(0, |b| dev.addr_mut(b)));
            let entry = format!("predictor_fc2_{}", dtype_suffix(dtype));
            let (gx, units_pb, smem) = tile_geometry(dtype, ffn)?;
            a.i32(to_i32(units_pb, "units per block")?);
            spec(&kernels::PREDICTOR, entry, [gx, 1], ROW_THREADS, smem, a)
        }
        Launch::RmsNorm {
            x,
            w,
            rows,
            n,
            eps,
            out,
            xq,
        } => {
            // rms_norm(x, w, n, eps, out, xq): block b reads row b of x, writes row b of out
            // (and, xq not null, its blocks of quantized x; n a multiple of 32).
            a.ptr(dev.addr(x))
                .ptr(dev.addr(w))
                .i32(to_i32(n, "n")?)
                .f32(eps);
            a.ptr(dev.addr_mut(out))
                .ptr(xq.map_or(0, |q| dev.addr_mut(q)));
            let blocks = [to_i32(rows, "rows")? as u32, 1];
            let entry = "rms_norm".to_string();
            spec(&kernels::NORM_ROPE, entry, blocks, NORM_THREADS, 0, a)
        }
        Launch::LayerNorm {
            x,
            w,
            b,
            rows,
            n,
            eps,
            out,
            xq,
        } => {
            // layer_norm(x, w, b, n, eps, out, xq): block r reads row r of x, writes row r of
            // out (and its quantized blocks as rms_norm).
            a.ptr(dev.addr(x)).ptr(dev.addr(w)).ptr(dev.addr(b));
            a.i32(to_i32(n, "n")?).f32(eps).ptr(dev.addr_mut(out));
            a.ptr(xq.map_or(0, |q| dev.addr_mut(q)));
            let blocks = [to_i32(rows, "rows")? as u32, 1];
            let entry = "layer_norm".to_string();
            spec(&kernels::NORM_ROPE, entry, blocks, NORM_THREADS, 0, a)
        }
        Launch::Rope {
            x,
            n_heads,
            k,
            k_heads,
            head_dim,
            pos,
            inv_freqs,
            neox,
            x_norm,
            k_norm,
            eps,
        } => {
            // rope(q, nq, k, nk, head_dim, n_pairs, angles, neox, qn, kn, eps): a warp per
            // head of q then of k (k null when nk = 0; qn, kn null: no norm).
            let k_heads = if k.is_some() { k_heads } else { 0 };
            a.ptr(dev.addr_mut(x)).i32(to_i32(n_heads, "heads")?);
            a.ptr(k.map_or(0, |k| dev.addr_mut(k)))
                .i32(to_i32(k_heads, "key heads")?);
            a.i32(to_i32(head_dim, "head_dim")?);
            a.i32(to_i32(inv_freqs.len(), "rope pairs")?);
            a.rope_angles(pos, inv_freqs)?.i32(i32::from(neox));
            let norm = |w: Option<&B::Buf<f32>>| w.map_or(0, |w| dev.addr(w));
            a.ptr(norm(x_norm)).ptr(norm(k_norm)).f32(eps);
            let threads = (n_heads + k_heads)
                .checked_mul(32)
                .ok_or_else(|| powerinfer_core::Error::Shape("rope: too many heads".into()))?;
            per_element(&kernels::NORM_ROPE, "rope".into(), threads, 0, a)
        }
        Launch::KvStore {
            k,
            v,
            kv_dim,
            pos,
            mut caches,
        } => {
            // kv_store[_f32](k, v, kv_dim, pos, cache_k, cache_v): row `pos` lies inside both
            // caches.
            a.ptr(dev.addr(k))
                .ptr(dev.addr(v))
                .i32(to_i32(kv_dim, "kv_dim")?);
            a.i32(to_i32(pos, "pos")?);
            let [ck, cv] = caches.addrs_mut(dev);
            a.ptr(ck).ptr(cv);
            let entry = kv_entry("kv_store", caches.elem());
            per_element(&kernels::ATTENTION, entry, kv_dim, 0, a)
        }
        Launch::AttentionDecode {
            q,
            caches,
            first,
            n_pos,
            n_heads,
            n_kv_heads,
            head_dim,
            scale,
            softcap,
            chunk,
            part,
            out,
        } => {
            // attention_decode[_f32](q, cache_k, cache_v, first, n_pos, group, head_dim, kv_dim,
            // scale, softcap, chunk, part, out): block (x, y, z) = query heads x * ATT_GROUP.. of
            // the group of KV head y over chunk z; head_dim <= MAX_HEAD_DIM fits the kernel's
            // static shared arrays; first < n_pos.
            let [ck, cv] = caches.addrs(dev);
            a.ptr(dev.addr(q)).ptr(ck).ptr(cv);
            a.i32(to_i32(first, "first position")?)
                .i32(to_i32(n_pos, "positions")?)
                .i32(to_i32(n_heads / n_kv_heads.max(1), "group")?);
            a.i32(to_i32(head_dim, "head_dim")?)
                .i32(to_i32(n_kv_heads * head_dim, "kv_dim")?);
            a.f32(scale).f32(softcap).i32(to_i32(chunk, "chunk")?);
            a.ptr(dev.addr_mut(part)).ptr(dev.addr_mut(out));
            let group = n_heads / n_kv_heads.max(1);
            let chunks = grid(n_pos.saturating_sub(first), chunk.max(1))?;
            let blocks = [
                grid(group, ATT_GROUP)?,
                to_i32(n_kv_heads, "kv heads")? as u32,
            ];
            let entry = kv_entry("attention_decode", caches.elem());
            let mut s = spec(&kernels::ATTENTION, entry, blocks, ATT_THREADS, 0, a)?;
            s.grid[2] = chunks;
            Ok(s)
        }
        Launch::AttentionMerge {
            part,
            n_heads,
            head_dim,
            n_chunks,
            out,
        } => {
            // attention_merge(part, n_chunks, head_dim, out): a block per head.
            a.ptr(dev.addr(part)).i32(to_i32(n_chunks, "chunks")?);
            a.i32(to_i32(head_dim, "head_dim")?).ptr(dev.addr_mut(out));
            let blocks = [to_i32(n_heads, "heads")? as u32, 1];
            spec(
                &kernels::ATTENTION,
                "attention_merge".into(),
                blocks,
                ELEM_THREADS,
                0,
                a,
            )
        }
        Launch::Add { y, x, n } => {
            a.ptr(dev.addr_mut(y)).ptr(dev.addr(x)).i32(to_i32(n, "n")?);
            per_element(&kernels::ELEMENTWISE, "add".into(), n, 0, a)
        }
        Launch::ThresholdMask { h, n, t } => {
            a.ptr(dev.addr_mut(h)).i32(to_i32(n, "n")?).f32(t);
            let entry = "threshold_mask".to_string();
            per_element(&kernels::ELEMENTWISE, entry, n, 0, a)
        }
        Launch::Softcap { y, n, cap } => {
            a.ptr(dev.addr_mut(y)).i32(to_i32(n, "n")?).f32(cap);
            per_element(&kernels::ELEMENTWISE, "softcap".into(), n, 0, a)
        }
        Launch::AddSplits {
            part,
            splits,
            cols,
            count,
            n,
            y,
        } => {
            // add_splits(part, splits, cols, count, n, y)
            a.ptr(dev.addr(part))
                .i32(to_i32(splits, "splits")?)
                .i32(to_i32(cols, "cols")?)
                .ptr(opt(count))
                .i32(to_i32(n, "rows")?)
                .ptr(dev.addr_mut(y));
            per_element(&kernels::AXPY_DOWN, "add_splits".into(), cols, 0, a)
        }
        Launch::CompactNonzero {
            a: coef,
            idx,
            count_in,
            n,
            out_idx,
            out_a,
            count,
        } => {
            // compact_nonzero(a, idx, count_in, n, out_idx, out_a, count): a (and idx) hold
            // n entries, out_idx and out_a n each, count_in and count one int; one block.
            a.ptr(dev.addr(coef)).ptr(opt(idx)).ptr(opt(count_in));
            a.i32(to_i32(n, "entries")?)
                .ptr(dev.addr_mut(out_idx))
                .ptr(dev.addr_mut(out_a))
                .ptr(dev.addr_mut(count));
            let entry = "compact_nonzero".to_string();
            spec(&kernels::COMPACT, entry, [1, 1], ROW_THREADS, 0, a)
        }
        Launch::CompactFlags {
            slabs,
            ids_l,
            flags,
            n,
            out_idx,
            count,
        } => {
            // compact_flags(slabs, ids_l, flags, n, out_idx, count): slots 0..n of the slabs
            // hold ids < flags.len() or −1, out_idx holds n, count one int; one block.
            a.ptr(dev.addr(slabs)).layout(&ids_l).ptr(dev.addr(flags));
            a.i32(to_i32(n, "slots")?)
                .ptr(dev.addr_mut(out_idx))
                .ptr(dev.addr_mut(count));
            let entry = "compact_flags".to_string();
            spec(&kernels::COMPACT, entry, [1, 1], ROW_THREADS, 0, a)
        }
        Launch::Copy { dst, src, n } => {
            a.ptr(dev.addr_mut(dst))
                .ptr(dev.addr(src))
                .i32(to_i32(n, "n")?);
            per_element(&kernels::ELEMENTWISE, "copy".into(), n, 0, a)
        }
        Launch::Fill { y, n, v } => {
            a.ptr(dev.addr_mut(y)).i32(to_i32(n, "n")?).f32(v);
            per_element(&kernels::ELEMENTWISE, "fill".into(), n, 0, a)
        }
        Launch::ExpertFlags {
            w,
            expert_ffn,
            routed,
            n_expert,
            n,
            flags,
        } => {
            // expert_flags(w, expert_ffn, routed, n_expert, n, flags)
            a.ptr(dev.addr(w))
                .i32(to_i32(expert_ffn, "expert_ffn")?)
                .i32(to_i32(routed, "routed")?)
                .i32(to_i32(n_expert, "n_expert")?)
                .i32(to_i32(n, "n")?)
                .ptr(dev.addr_mut(flags));
            per_element(&kernels::ELEMENTWISE, "expert_flags".into(), n, 0, a)
        }
        Launch::ExpertScale {
            slabs,
            ids_l,
            w,
            expert_ffn,
            routed,
            n_expert,
            n,
            h,
        } => {
            // expert_scale(slabs, ids_l, w, expert_ffn, routed, n_expert, n, h)
            a.ptr(dev.addr(slabs)).layout(&ids_l).ptr(dev.addr(w));
            a.i32(to_i32(expert_ffn, "expert_ffn")?)
                .i32(to_i32(routed, "routed")?)
                .i32(to_i32(n_expert, "n_expert")?)
                .i32(to_i32(n, "n")?)
                .ptr(dev.addr_mut(h));
            per_element(&kernels::ELEMENTWISE, "expert_scale".into(), n, 0, a)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_pack_in_aligned_slots_with_their_widths() {
        let mut a = KernelArgs::default();
        let l = RowLayout::new(-2, 0x1122_3344_5566, 7, -9);
        a.ptr(0xdead_beef).i32(-3).f32(1.5).layout(&l);
        a.rope_angles(3, &[0.5, 2.0]).unwrap();
        assert_eq!(a.sizes(), [8, 4, 4, 32, 8 * MAX_ROPE_PAIRS]);
        assert_eq!(a.bytes(1), (-3i32).to_le_bytes());
        assert_eq!(a.bytes(2), 1.5f32.to_le_bytes());
        let lb = a.bytes(3);
        assert_eq!(lb[..8], (-2i64).to_le_bytes());
        assert_eq!(lb[16..20], 7i32.to_le_bytes());
        assert_eq!(lb[20..24], (-9i32).to_le_bytes());
        assert_eq!(lb[24..28], l.div_mul.to_le_bytes());
        let rb = a.bytes(4);
        let f = |at: usize| f32::from_le_bytes(rb[at..at + 4].try_into().unwrap());
        let sin_at = 4 * MAX_ROPE_PAIRS;
        assert_eq!(
            (f(4), f(sin_at + 4)),
            ((6.0f64).cos() as f32, (6.0f64).sin() as f32)
        );
        assert!(rb[8..sin_at].iter().all(|&b| b == 0));
        let p = a.pointers();
        // Every slot 8-byte aligned, one after the other.
        let d: Vec<usize> = p
            .windows(2)
            .map(|w| w[1] as usize - w[0] as usize)
            .collect();
        assert_eq!(d, [8, 8, 8, 32]);
        assert!(p.iter().all(|q| (*q as usize).is_multiple_of(8)));
        assert!(a.rope_angles(0, &[0.0; MAX_ROPE_PAIRS + 1]).is_err());
    }
}
