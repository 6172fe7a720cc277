//! The raw launch of every kernel (feature `cuda`): for each [`Launch`] variant, the grid,
//! block and shared memory its `.cu` file asks for, and its arguments pushed in the kernel's
//! parameter order. The shapes were checked by [`crate::ops`] (the [`Checked`](crate::Checked)
//! token [`Backend::launch`](crate::Backend::launch) takes); lengths are converted to the
//! kernels' `int` here. Nothing here waits for the GPU.
//!
//! Every launch is written in one pattern — the function looked up from a `kernels::` source
//! (an entry name, or a per-format `format!` name on the line before), the stream's launch
//! builder, one push per argument (`arg` calls and the `arg_opt` macro), then the unsafe launch
//! of `b` — which tests/nvrtc_ptx.rs scans, line by line, to check that each pushes as many
//! arguments as its kernel's PTX takes and that every kernel is launched. Keep those patterns
//! out of comments here.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use powerinfer_core::{ensure, Result};

use crate::backend::Launch;
use crate::device::{driver_err, CudaDevice};
use crate::kernels::{self, dtype_suffix};
use crate::layout::{to_i32, RowLayout, MAX_X_COLS};
use crate::ops::MAX_ROPE_PAIRS;

/// A null device pointer for the kernels' optional arguments.
static NULL: u64 = 0;
/// Threads per block of the row kernels (8 warps).
const ROW_THREADS: u32 = 256;
/// Output rows per block of sparse_matvec / gate_up (`ROWS_PER_BLOCK` in sparse_matvec.cu).
const ROWS_PER_BLOCK: usize = 32;
/// Threads per block of the thread-per-element kernels.
const ELEM_THREADS: u32 = 256;
/// Threads of rms_norm's one block per row (32 warps fill its 32-entry partial sums).
const NORM_THREADS: u32 = 1024;
/// Threads of compact_flags' one block (`COMPACT_THREADS` in predictor.cu).
const COMPACT_THREADS: u32 = 1024;
/// Warps per block of attention_decode (`ATT_WARPS` in attention.cu), as threads.
const ATT_THREADS: u32 = 4 * 32;

/// RoPE's angles per position, passed by value as norm_rope.cu's `RopeFreqs` (2 KiB of the
/// 4 KiB of kernel parameters).
#[repr(C)]
struct RopeFreqs {
    f: [f64; MAX_ROPE_PAIRS],
}

// SAFETY: plain old data laid out as the kernel's `struct RopeFreqs { double f[256]; }`.
unsafe impl cudarc::driver::DeviceRepr for RopeFreqs {}

impl RopeFreqs {
    fn new(inv_freqs: &[f64]) -> Result<RopeFreqs> {
        ensure!(
            inv_freqs.len() <= MAX_ROPE_PAIRS,
            Unsupported,
            "rope: {} rotated pairs, the kernel takes at most {MAX_ROPE_PAIRS}",
            inv_freqs.len()
        );
        let mut f = [0.0; MAX_ROPE_PAIRS];
        f[..inv_freqs.len()].copy_from_slice(inv_freqs);
        Ok(RopeFreqs { f })
    }
}

/// Push an optional buffer, or a null pointer.
macro_rules! arg_opt {
    ($b:expr, $opt:expr) => {
        match $opt {
            Some(buf) => $b.arg(&buf.data),
            None => $b.arg(&NULL),
        }
    };
    ($b:expr, mut $opt:expr) => {
        match $opt {
            Some(buf) => $b.arg(&mut buf.data),
            None => $b.arg(&NULL),
        }
    };
}

/// Dynamic shared memory of the row kernels: x staged when it fits (`stage_x` in
/// sparse_matvec.cu), none for longer rows, which read x from global memory.
fn x_smem(cols: usize) -> usize {
    if cols <= MAX_X_COLS {
        cols * 4
    } else {
        0
    }
}

/// Blocks of `per` covering `n` (at least one).
fn grid(n: usize, per: usize) -> Result<u32> {
    Ok(to_i32(n.div_ceil(per).max(1), "grid size")? as u32)
}

fn cfg(blocks: u32, threads: u32, smem: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: smem as u32,
    }
}

impl CudaDevice {
    /// Queue `launch` on this device's stream (the body of [`Backend::launch`]).
    ///
    /// [`Backend::launch`]: crate::Backend::launch
    pub(crate) fn launch_kernel(&self, launch: Launch<'_, CudaDevice>) -> Result<()> {
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
                y,
            } => {
                ensure!(
                    flags.is_none() || ids.is_some(),
                    Unsupported,
                    "sparse_matvec: flags without neuron ids"
                );
                let entry = format!("sparse_matvec_{}", dtype_suffix(dtype));
                let f = self.function(&kernels::SPARSE_MATVEC, &entry)?;
                let (cols32, n32, act) = (to_i32(cols, "cols")?, to_i32(n, "rows")?, act as i32);
                let ids_l = match ids {
                    Some((_, l)) => l,
                    None => RowLayout::dense(1, 4)?,
                };
                let ids_base = ids.map(|(buf, _)| buf);
                let mut b = self.stream().launch_builder(&f);
                b.arg(&w.data).arg(&l).arg(&x.data).arg(&cols32);
                arg_opt!(b, idx);
                b.arg(&n32);
                arg_opt!(b, ids_base);
                b.arg(&ids_l);
                arg_opt!(b, flags);
                b.arg(&act).arg(&mut y.data);
                // SAFETY: the arguments match sparse_matvec_<dtype>(w, l, x, cols, idx, n,
                // ids_base, ids_l, flags, act, y) in sparse_matvec.cu; x holds `cols` floats
                // (checked by ops), staged in the x_smem(cols) bytes of shared memory stage_x
                // expects (cols·4 up to MAX_X_COLS, else none: read in place); y holds n floats;
                // rows 0..n (or the caller's indices) lie inside w per `l`; flags (when given)
                // come with the ids they are indexed by (checked above).
                unsafe { b.launch(cfg(grid(n, ROWS_PER_BLOCK)?, ROW_THREADS, x_smem(cols))) }
                    .map_err(driver_err("launching sparse_matvec"))?;
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
                act,
                h,
            } => {
                let entry = format!("gate_up_{}", dtype_suffix(dtype));
                let f = self.function(&kernels::SPARSE_MATVEC, &entry)?;
                let (cols32, n32, act) = (to_i32(cols, "dim")?, to_i32(n, "hot")?, act as i32);
                let mut b = self.stream().launch_builder(&f);
                b.arg(&w.data).arg(&gate_l).arg(&up_l).arg(&x.data);
                b.arg(&cols32);
                arg_opt!(b, idx);
                b.arg(&n32).arg(&ids_l);
                arg_opt!(b, flags);
                b.arg(&act).arg(&mut h.data);
                // SAFETY: matches gate_up_<dtype>(w, gate_l, up_l, x, cols, idx, n, ids_l,
                // flags, act, h); the slab layouts come from pack_hot_slabs for exactly this
                // buffer, slots 0..n are inside it, their ids are < ffn or −1, and `flags` (when
                // given) is indexed by those ids — one flag per FFN neuron; h holds n floats; x
                // (cols floats, checked) gets the x_smem(cols) bytes stage_x expects.
                unsafe { b.launch(cfg(grid(n, ROWS_PER_BLOCK)?, ROW_THREADS, x_smem(cols))) }
                    .map_err(driver_err("launching gate_up"))?;
            }
            Launch::AxpyRows {
                dtype,
                w,
                l,
                cols,
                idx,
                a,
                n,
                y,
                splits,
            } => {
                let entry = format!("axpy_rows_{}", dtype_suffix(dtype));
                let f = self.function(&kernels::AXPY_DOWN, &entry)?;
                let (cols32, n32) = (to_i32(cols, "cols")?, to_i32(n, "rows")?);
                let c = LaunchConfig {
                    grid_dim: (grid(cols, ROW_THREADS as usize)?, splits as u32, 1),
                    block_dim: (ROW_THREADS, 1, 1),
                    shared_mem_bytes: 0,
                };
                let mut b = self.stream().launch_builder(&f);
                b.arg(&w.data).arg(&l).arg(&cols32);
                arg_opt!(b, idx);
                b.arg(&a.data).arg(&n32).arg(&mut y.data);
                // SAFETY: matches axpy_rows_<dtype>(w, l, cols, idx, a, n, y) in axpy_down.cu;
                // a holds n floats, y holds `cols` floats (checked by ops), rows 0..n (or the
                // caller's indices) lie inside w per `l`; splits is 1..=min(n, 65,535) (ops
                // clamps it); threads past `cols` return before any access.
                unsafe { b.launch(c) }.map_err(driver_err("launching axpy_rows"))?;
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
                let entry = format!("predictor_fc2_{}", dtype_suffix(dtype));
                let f = self.function(&kernels::PREDICTOR, &entry)?;
                let (rank32, ffn32) = (to_i32(rank, "rank")?, to_i32(ffn, "ffn")?);
                let mut b = self.stream().launch_builder(&f);
                b.arg(&fc2_t.data).arg(&l).arg(&hidden.data);
                b.arg(&rank32).arg(&ffn32).arg(&threshold);
                b.arg(&mut flags.data);
                arg_opt!(b, mut logits);
                // SAFETY: matches predictor_fc2_<dtype>(fc2_t, l, hidden, rank, ffn, threshold,
                // flags, logits); hidden holds `rank` floats (rank <= MAX_RANK, checked), staged
                // in rank·4 bytes of shared memory; flags/logits hold ffn values; threads past
                // ffn return.
                unsafe { b.launch(cfg(grid(ffn, 256)?, ELEM_THREADS, rank * 4)) }
                    .map_err(driver_err("launching predictor_fc2"))?;
            }
            Launch::CompactFlags {
                flags,
                n,
                out,
                count,
            } => {
                let f = self.function(&kernels::PREDICTOR, "compact_flags")?;
                let n32 = to_i32(n, "n")?;
                let mut b = self.stream().launch_builder(&f);
                b.arg(&flags.data).arg(&n32);
                b.arg(&mut out.data).arg(&mut count.data);
                // SAFETY: matches compact_flags(flags, n, out, count) in predictor.cu, launched
                // as its one block of COMPACT_THREADS threads; flags and out hold >= n i32,
                // count >= 1 (checked by ops).
                unsafe { b.launch(cfg(1, COMPACT_THREADS, 0)) }
                    .map_err(driver_err("launching compact_flags"))?;
            }
            Launch::SplitHotFlags {
                ids_base,
                ids_l,
                n,
                flags,
                slot_flags,
            } => {
                let f = self.function(&kernels::PREDICTOR, "split_hot_flags")?;
                let n32 = to_i32(n, "hot")?;
                let mut b = self.stream().launch_builder(&f);
                b.arg(&ids_base.data).arg(&ids_l).arg(&n32);
                b.arg(&mut flags.data).arg(&mut slot_flags.data);
                // SAFETY: matches split_hot_flags(ids_base, ids_l, n, flags, slot_flags) in
                // predictor.cu; slots 0..n hold distinct ids < ffn or −1 padding
                // (pack_hot_slabs checks), so each thread owns flags[id]; flags has one entry per
                // FFN neuron (the caller's contract) and slot_flags >= n (checked by ops).
                unsafe { b.launch(cfg(grid(n, 256)?, ELEM_THREADS, 0)) }
                    .map_err(driver_err("launching split_hot_flags"))?;
            }
            Launch::RmsNorm {
                x,
                w,
                rows,
                n,
                eps,
                out,
            } => {
                let f = self.function(&kernels::NORM_ROPE, "rms_norm")?;
                let (rows32, n32) = (to_i32(rows, "rows")?, to_i32(n, "n")?);
                let mut b = self.stream().launch_builder(&f);
                b.arg(&x.data).arg(&w.data).arg(&n32).arg(&eps);
                b.arg(&mut out.data);
                // SAFETY: matches rms_norm(x, w, n, eps, out) in norm_rope.cu; block b reads row b
                // of x and writes row b of out (rows·n floats each, checked by ops); 1024
                // threads = 32 warps fill the 32-entry partial-sum array.
                unsafe { b.launch(cfg(rows32 as u32, NORM_THREADS, 0)) }
                    .map_err(driver_err("launching rms_norm"))?;
            }
            Launch::Rope {
                x,
                n_heads,
                head_dim,
                pos,
                inv_freqs,
                neox,
            } => {
                let f = self.function(&kernels::NORM_ROPE, "rope")?;
                let (nh, hd) = (to_i32(n_heads, "heads")?, to_i32(head_dim, "head_dim")?);
                let (p, neox) = (to_i32(pos, "pos")?, i32::from(neox));
                let pairs = to_i32(inv_freqs.len(), "rope pairs")?;
                let inv = RopeFreqs::new(inv_freqs)?;
                let blocks = grid(n_heads * inv_freqs.len(), 256)?;
                let mut b = self.stream().launch_builder(&f);
                b.arg(&mut x.data).arg(&nh).arg(&hd).arg(&pairs);
                b.arg(&p).arg(&inv).arg(&neox);
                // SAFETY: matches rope(x, n_heads, head_dim, n_pairs, pos, inv, neox), `inv`
                // the kernel's RopeFreqs by value (repr(C), the same 256 doubles); threads
                // past n_heads·n_pairs return, the rest touch two elements of their own head
                // inside x (n_heads·head_dim floats, 2·n_pairs <= head_dim, checked by ops).
                unsafe { b.launch(cfg(blocks, ELEM_THREADS, 0)) }
                    .map_err(driver_err("launching rope"))?;
            }
            Launch::KvStore {
                k,
                v,
                kv_dim,
                pos,
                cache_k,
                cache_v,
            } => {
                let f = self.function(&kernels::ATTENTION, "kv_store")?;
                let (d, p) = (to_i32(kv_dim, "kv_dim")?, to_i32(pos, "pos")?);
                let mut b = self.stream().launch_builder(&f);
                b.arg(&k.data).arg(&v.data).arg(&d).arg(&p);
                b.arg(&mut cache_k.data).arg(&mut cache_v.data);
                // SAFETY: matches kv_store(k, v, kv_dim, pos, cache_k, cache_v); k and v hold
                // kv_dim floats and row `pos` of both caches is inside them (checked by ops);
                // threads past kv_dim return.
                unsafe { b.launch(cfg(grid(kv_dim, 256)?, ELEM_THREADS, 0)) }
                    .map_err(driver_err("launching kv_store"))?;
            }
            Launch::AttentionDecode {
                q,
                cache_k,
                cache_v,
                n_pos,
                n_heads,
                n_kv_heads,
                head_dim,
                scale,
                out,
            } => {
                let f = self.function(&kernels::ATTENTION, "attention_decode")?;
                let (np, nh) = (to_i32(n_pos, "positions")?, to_i32(n_heads, "heads")?);
                let nkv = to_i32(n_kv_heads, "kv heads")?;
                let hd = to_i32(head_dim, "head_dim")?;
                let mut b = self.stream().launch_builder(&f);
                b.arg(&q.data).arg(&cache_k.data).arg(&cache_v.data);
                b.arg(&np).arg(&nh).arg(&nkv).arg(&hd).arg(&scale);
                b.arg(&mut out.data);
                // SAFETY: matches attention_decode(q, cache_k, cache_v, n_pos, n_heads,
                // n_kv_heads, head_dim, scale, out); one block of ATT_WARPS warps per head;
                // head_dim <= MAX_HEAD_DIM fits the kernel's static shared arrays; positions
                // 0..n_pos are inside both caches, q and out hold n_heads·head_dim floats
                // (checked by ops).
                unsafe { b.launch(cfg(nh as u32, ATT_THREADS, 0)) }
                    .map_err(driver_err("launching attention_decode"))?;
            }
            Launch::ActMul { g, u, n, act } => {
                let f = self.function(&kernels::ELEMENTWISE, "act_mul")?;
                let (n32, act) = (to_i32(n, "n")?, act as i32);
                let mut b = self.stream().launch_builder(&f);
                b.arg(&mut g.data).arg(&u.data).arg(&n32).arg(&act);
                // SAFETY: matches act_mul(g, u, n, act); both hold n floats (checked by ops);
                // threads past n return.
                unsafe { b.launch(cfg(grid(n, 256)?, ELEM_THREADS, 0)) }
                    .map_err(driver_err("launching act_mul"))?;
            }
            Launch::Add { y, x, n } => {
                let f = self.function(&kernels::ELEMENTWISE, "add")?;
                let n32 = to_i32(n, "n")?;
                let mut b = self.stream().launch_builder(&f);
                b.arg(&mut y.data).arg(&x.data).arg(&n32);
                // SAFETY: matches add(y, x, n); both hold n floats (checked by ops); threads past
                // n return.
                unsafe { b.launch(cfg(grid(n, 256)?, ELEM_THREADS, 0)) }
                    .map_err(driver_err("launching add"))?;
            }
            Launch::ThresholdMask { h, n, t } => {
                let f = self.function(&kernels::ELEMENTWISE, "threshold_mask")?;
                let n32 = to_i32(n, "n")?;
                let mut b = self.stream().launch_builder(&f);
                b.arg(&mut h.data).arg(&n32).arg(&t);
                // SAFETY: matches threshold_mask(h, n, t); h holds >= n floats (checked by
                // ops); threads past n return.
                unsafe { b.launch(cfg(grid(n, 256)?, ELEM_THREADS, 0)) }
                    .map_err(driver_err("launching threshold_mask"))?;
            }
        }
        Ok(())
    }
}
