//! Typed launches of every kernel (feature `cuda`): shapes are checked on the host, then the
//! kernel is queued on the device's stream. Nothing here waits for the GPU; `download` and
//! `synchronize` do.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use powerinfer_core::{ensure, Result, RopeStyle};

use crate::device::{driver_err, CudaDevice, DeviceBuffer, DeviceWeight, HotFfn};
use crate::kernels::{self, dtype_suffix};
use crate::layout::{to_i32, Act, RowLayout, MAX_HEAD_DIM, MAX_RANK, MAX_X_COLS};

/// A null device pointer for the kernels' optional arguments.
static NULL: u64 = 0;
/// Threads per block of the row kernels (8 warps).
const ROW_THREADS: u32 = 256;
/// Output rows per block of sparse_matvec / gate_up (`ROWS_PER_BLOCK` in sparse_matvec.cu).
const ROWS_PER_BLOCK: usize = 32;
/// Warps per block of attention_decode (`ATT_WARPS`).
const ATT_THREADS: u32 = 4 * 32;

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

/// Error unless every index of `idx` (when given) has `n` entries.
/// The rows a launch reads: `n` indices when `idx` is given, else rows 0..n of `rows`.
fn check_rows(rows: usize, idx: Option<&DeviceBuffer<i32>>, n: usize, what: &str) -> Result<()> {
    match idx {
        Some(i) => ensure!(
            i.len() >= n,
            Shape,
            "{what}: {} indices for {n} rows",
            i.len()
        ),
        None => ensure!(n <= rows, Shape, "{what}: {n} of {rows} rows"),
    }
    Ok(())
}

impl CudaDevice {
    /// `y[k] = act(dot(W[row k], x))` for k in 0..n, row k = `idx[k]` or k. The indices must be
    /// rows of `w` (the kernel does not check them). A dense matvec is `idx = None, n = rows`.
    pub fn matvec_rows(
        &self,
        w: &DeviceWeight,
        x: &DeviceBuffer<f32>,
        idx: Option<&DeviceBuffer<i32>>,
        n: usize,
        act: Act,
        y: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        ensure!(
            x.len() == w.cols,
            Shape,
            "matvec_rows: x {} for {} cols",
            x.len(),
            w.cols
        );
        ensure!(
            y.len() >= n,
            Shape,
            "matvec_rows: y {} for {n} rows",
            y.len()
        );
        check_rows(w.rows, idx, n, "matvec_rows")?;
        if n == 0 {
            return Ok(());
        }
        let entry = format!("sparse_matvec_{}", dtype_suffix(w.dtype));
        let f = self.function(&kernels::SPARSE_MATVEC, &entry)?;
        let (cols, n32, act) = (to_i32(w.cols, "cols")?, to_i32(n, "rows")?, act as i32);
        let ids_l = RowLayout::dense(1, 4)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&w.data.data).arg(&w.layout).arg(&x.data).arg(&cols);
        arg_opt!(b, idx);
        b.arg(&n32)
            .arg(&NULL)
            .arg(&ids_l)
            .arg(&NULL)
            .arg(&act)
            .arg(&mut y.data);
        // SAFETY: the argument list matches sparse_matvec_<dtype>(w, l, x, cols, idx, n, ids_base,
        // ids_l, flags, act, y) in sparse_matvec.cu; x holds `cols` floats (checked), staged in
        // the x_smem(cols) bytes of shared memory the kernel's stage_x expects (cols·4 up to
        // MAX_X_COLS, else none: read in place); y holds n floats; rows 0..n (or the caller's
        // indices) lie inside w's buffer per its layout; flags is null so ids are never read.
        unsafe { b.launch(cfg(grid(n, ROWS_PER_BLOCK)?, ROW_THREADS, x_smem(w.cols))) }
            .map_err(driver_err("launching sparse_matvec"))?;
        Ok(())
    }

    /// The hot neurons' gate/up pass: `h[r] = act(dot(gate[r], x)) · dot(up[r], x)` for every
    /// hot slot r in 0..n_hot; with `flags` (one i32 per FFN neuron, nonzero = active) an
    /// inactive neuron's rows are not read and h[r] = 0.
    pub fn hot_gate_up(
        &self,
        ffn: &HotFfn,
        x: &DeviceBuffer<f32>,
        flags: Option<&DeviceBuffer<i32>>,
        act: Act,
        h: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let l = &ffn.layout;
        ensure!(
            x.len() == l.dim,
            Shape,
            "hot_gate_up: x {} for dim {}",
            x.len(),
            l.dim
        );
        ensure!(
            h.len() >= l.n_hot,
            Shape,
            "hot_gate_up: h {} for {} hot",
            h.len(),
            l.n_hot
        );
        ensure!(
            l.gate_dtype == l.up_dtype,
            Unsupported,
            "hot_gate_up: gate {} and up {} differ",
            l.gate_dtype,
            l.up_dtype
        );
        if l.n_hot == 0 {
            return Ok(());
        }
        let entry = format!("gate_up_{}", dtype_suffix(l.gate_dtype));
        let f = self.function(&kernels::SPARSE_MATVEC, &entry)?;
        let (cols, n, act) = (to_i32(l.dim, "dim")?, to_i32(l.n_hot, "hot")?, act as i32);
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ffn.data.data)
            .arg(&l.gate)
            .arg(&l.up)
            .arg(&x.data)
            .arg(&cols);
        b.arg(&NULL).arg(&n).arg(&l.ids);
        arg_opt!(b, flags);
        b.arg(&act).arg(&mut h.data);
        // SAFETY: matches gate_up_<dtype>(w, gate_l, up_l, x, cols, idx, n, ids_l, flags, act, h);
        // the slab layouts come from pack_hot_slabs for exactly this buffer, slots 0..n_hot are
        // inside it, their ids are < ffn or −1, and `flags` (when given) is indexed by those ids —
        // the caller passes one flag per FFN neuron; h holds n_hot floats; x (dim floats,
        // checked) gets the x_smem(dim) bytes of shared memory stage_x expects.
        unsafe {
            b.launch(cfg(
                grid(l.n_hot, ROWS_PER_BLOCK)?,
                ROW_THREADS,
                x_smem(l.dim),
            ))
        }
        .map_err(driver_err("launching gate_up"))?;
        Ok(())
    }

    /// `y[c] += Σ_k a[k] · W[row k][c]` for k in 0..n (row k = idx[k] or k); rows with a zero
    /// coefficient are not read. `splits` > 1 splits the rows over more blocks and adds their
    /// partial sums atomically (faster for long lists, summation order not fixed).
    #[allow(clippy::too_many_arguments)]
    pub fn axpy_rows(
        &self,
        w: &DeviceWeight,
        idx: Option<&DeviceBuffer<i32>>,
        a: &DeviceBuffer<f32>,
        n: usize,
        y: &mut DeviceBuffer<f32>,
        splits: usize,
    ) -> Result<()> {
        ensure!(
            y.len() == w.cols,
            Shape,
            "axpy_rows: y {} for {} cols",
            y.len(),
            w.cols
        );
        ensure!(
            a.len() >= n,
            Shape,
            "axpy_rows: {} coefficients for {n} rows",
            a.len()
        );
        check_rows(w.rows, idx, n, "axpy_rows")?;
        self.axpy_launch(w.dtype, &w.data, &w.layout, w.cols, idx, a, n, y, splits)
    }

    /// The hot neurons' down pass: `y += Σ_r h[r] · down_t[r]` over the hot slots.
    pub fn hot_down(
        &self,
        ffn: &HotFfn,
        h: &DeviceBuffer<f32>,
        y: &mut DeviceBuffer<f32>,
        splits: usize,
    ) -> Result<()> {
        let l = &ffn.layout;
        ensure!(
            y.len() == l.dim,
            Shape,
            "hot_down: y {} for dim {}",
            y.len(),
            l.dim
        );
        ensure!(
            h.len() >= l.n_hot,
            Shape,
            "hot_down: h {} for {} hot",
            h.len(),
            l.n_hot
        );
        self.axpy_launch(
            l.down_dtype,
            &ffn.data,
            &l.down,
            l.dim,
            None,
            h,
            l.n_hot,
            y,
            splits,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn axpy_launch(
        &self,
        dtype: powerinfer_core::DType,
        data: &DeviceBuffer<u8>,
        layout: &RowLayout,
        cols: usize,
        idx: Option<&DeviceBuffer<i32>>,
        a: &DeviceBuffer<f32>,
        n: usize,
        y: &mut DeviceBuffer<f32>,
        splits: usize,
    ) -> Result<()> {
        if n == 0 || cols == 0 {
            return Ok(());
        }
        let entry = format!("axpy_rows_{}", dtype_suffix(dtype));
        let f = self.function(&kernels::AXPY_DOWN, &entry)?;
        let (cols32, n32) = (to_i32(cols, "cols")?, to_i32(n, "rows")?);
        let splits = splits.clamp(1, n.min(65_535)) as u32;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&data.data).arg(layout).arg(&cols32);
        arg_opt!(b, idx);
        b.arg(&a.data).arg(&n32).arg(&mut y.data);
        let c = LaunchConfig {
            grid_dim: (grid(cols, ROW_THREADS as usize)?, splits, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches axpy_rows_<dtype>(w, l, cols, idx, a, n, y) in axpy_down.cu; a holds n
        // floats, y holds `cols` floats (checked by the callers), rows 0..n (or the caller's
        // indices) lie inside `data` per `layout`; threads past `cols` return before any access.
        unsafe { b.launch(c) }.map_err(driver_err("launching axpy_rows"))?;
        Ok(())
    }

    /// The predictor of one layer: `hidden = ReLU(fc1 · x)`, `logits = fc2 · hidden` over the
    /// nonzero hidden units (`fc2_t` is `[rank, ffn]`), `flags[j] = logits[j] >= threshold`.
    #[allow(clippy::too_many_arguments)]
    pub fn predictor(
        &self,
        fc1: &DeviceWeight,
        fc2_t: &DeviceWeight,
        threshold: f32,
        x: &DeviceBuffer<f32>,
        hidden: &mut DeviceBuffer<f32>,
        flags: &mut DeviceBuffer<i32>,
        logits: Option<&mut DeviceBuffer<f32>>,
    ) -> Result<()> {
        let (rank, ffn) = (fc1.rows, fc2_t.cols);
        ensure!(
            fc2_t.rows == rank,
            Shape,
            "predictor: fc1 rank {rank}, fc2_t {}",
            fc2_t.rows
        );
        ensure!(
            rank <= MAX_RANK,
            Unsupported,
            "predictor rank {rank} > {MAX_RANK}"
        );
        ensure!(
            flags.len() >= ffn,
            Shape,
            "predictor: {} flags for ffn {ffn}",
            flags.len()
        );
        if let Some(l) = &logits {
            ensure!(
                l.len() >= ffn,
                Shape,
                "predictor: {} logits for ffn {ffn}",
                l.len()
            );
        }
        self.matvec_rows(fc1, x, None, rank, Act::Relu, hidden)?;
        let entry = format!("predictor_fc2_{}", dtype_suffix(fc2_t.dtype));
        let f = self.function(&kernels::PREDICTOR, &entry)?;
        let (rank32, ffn32) = (to_i32(rank, "rank")?, to_i32(ffn, "ffn")?);
        let mut b = self.stream().launch_builder(&f);
        b.arg(&fc2_t.data.data).arg(&fc2_t.layout).arg(&hidden.data);
        b.arg(&rank32)
            .arg(&ffn32)
            .arg(&threshold)
            .arg(&mut flags.data);
        arg_opt!(b, mut logits);
        // SAFETY: matches predictor_fc2_<dtype>(fc2_t, l, hidden, rank, ffn, threshold, flags,
        // logits); hidden holds `rank` floats (written by the matvec above, same stream), staged
        // in rank·4 bytes of shared memory; flags/logits hold ffn values; threads past ffn return.
        unsafe { b.launch(cfg(grid(ffn, 256)?, 256, rank * 4)) }
            .map_err(driver_err("launching predictor_fc2"))?;
        Ok(())
    }

    /// `out[0..count) = the i < n with flags[i] != 0`, ascending; `count[0] = count`.
    pub fn compact_flags(
        &self,
        flags: &DeviceBuffer<i32>,
        n: usize,
        out: &mut DeviceBuffer<i32>,
        count: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        ensure!(
            flags.len() >= n && out.len() >= n,
            Shape,
            "compact_flags: buffers < {n}"
        );
        ensure!(
            !count.is_empty(),
            Shape,
            "compact_flags: empty count buffer"
        );
        let f = self.function(&kernels::PREDICTOR, "compact_flags")?;
        let n32 = to_i32(n, "n")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&flags.data)
            .arg(&n32)
            .arg(&mut out.data)
            .arg(&mut count.data);
        // SAFETY: matches compact_flags(flags, n, out, count) in predictor.cu, launched as its one
        // block of 1024 threads; flags and out hold >= n i32, count >= 1.
        unsafe { b.launch(cfg(1, 1024, 0)) }.map_err(driver_err("launching compact_flags"))?;
        Ok(())
    }

    /// Split a layer's active flags between the devices: `slot_flags[r] = flags[id(r)]` for the
    /// hot slots, and every hot neuron's flag cleared in `flags`, which is left holding the
    /// CPU's cold active set.
    pub fn split_hot_flags(
        &self,
        ffn: &HotFfn,
        flags: &mut DeviceBuffer<i32>,
        slot_flags: &mut DeviceBuffer<i32>,
    ) -> Result<()> {
        let l = &ffn.layout;
        ensure!(
            slot_flags.len() >= l.n_hot,
            Shape,
            "split_hot_flags: slot flags < {}",
            l.n_hot
        );
        if l.n_hot == 0 {
            return Ok(());
        }
        let f = self.function(&kernels::PREDICTOR, "split_hot_flags")?;
        let n = to_i32(l.n_hot, "hot")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&ffn.data.data)
            .arg(&l.ids)
            .arg(&n)
            .arg(&mut flags.data)
            .arg(&mut slot_flags.data);
        // SAFETY: matches split_hot_flags(ids_base, ids_l, n, flags, slot_flags) in predictor.cu
        // (the test every_launch_pushes_its_kernels_parameters checks the count); slots 0..n_hot
        // hold distinct ids < ffn or -1 padding (pack_hot_slabs checks), so each thread owns
        // flags[id]; the caller's flags has one entry per FFN neuron and slot_flags >= n_hot.
        unsafe { b.launch(cfg(grid(l.n_hot, 256)?, 256, 0)) }
            .map_err(driver_err("launching split_hot_flags"))?;
        Ok(())
    }

    /// RMSNorm of `rows` rows of `w.len()` values: `out = x / sqrt(mean(x²) + eps) · w`.
    pub fn rms_norm(
        &self,
        x: &DeviceBuffer<f32>,
        w: &DeviceBuffer<f32>,
        rows: usize,
        eps: f32,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        let n = w.len();
        ensure!(
            x.len() == rows * n && out.len() == rows * n,
            Shape,
            "rms_norm: x {}, out {} for {rows} rows of {n}",
            x.len(),
            out.len()
        );
        if rows == 0 {
            return Ok(());
        }
        let f = self.function(&kernels::NORM_ROPE, "rms_norm")?;
        let n32 = to_i32(n, "n")?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&x.data)
            .arg(&w.data)
            .arg(&n32)
            .arg(&eps)
            .arg(&mut out.data);
        // SAFETY: matches rms_norm(x, w, n, eps, out) in norm_rope.cu; block b reads row b of x
        // and writes row b of out (rows·n floats each, checked), 1024 threads = 32 warps fill the
        // 32-entry partial-sum array.
        unsafe { b.launch(cfg(to_i32(rows, "rows")? as u32, 1024, 0)) }
            .map_err(driver_err("launching rms_norm"))?;
        Ok(())
    }

    /// Rotate every head of `x` (n_heads × head_dim) in place for position `pos`.
    pub fn rope(
        &self,
        x: &mut DeviceBuffer<f32>,
        head_dim: usize,
        pos: usize,
        theta: f32,
        style: RopeStyle,
    ) -> Result<()> {
        ensure!(
            head_dim > 0 && head_dim.is_multiple_of(2) && x.len().is_multiple_of(head_dim),
            Shape,
            "rope: {} values are not heads of even head_dim {head_dim}",
            x.len()
        );
        let n_heads = x.len() / head_dim;
        let f = self.function(&kernels::NORM_ROPE, "rope")?;
        let (nh, hd, p) = (
            to_i32(n_heads, "heads")?,
            to_i32(head_dim, "head_dim")?,
            to_i32(pos, "pos")?,
        );
        let neox = i32::from(style == RopeStyle::Neox);
        let mut b = self.stream().launch_builder(&f);
        b.arg(&mut x.data)
            .arg(&nh)
            .arg(&hd)
            .arg(&p)
            .arg(&theta)
            .arg(&neox);
        // SAFETY: matches rope(x, n_heads, head_dim, pos, theta, neox); threads past
        // n_heads·head_dim/2 return, the rest touch two elements of their own head inside x.
        unsafe { b.launch(cfg(grid(n_heads * head_dim / 2, 256)?, 256, 0)) }
            .map_err(driver_err("launching rope"))?;
        Ok(())
    }

    /// Write position `pos`'s keys and values (kv_dim f32 each) into the f16 caches
    /// ([context, kv_dim] each).
    pub fn kv_store(
        &self,
        k: &DeviceBuffer<f32>,
        v: &DeviceBuffer<f32>,
        pos: usize,
        cache_k: &mut DeviceBuffer<u16>,
        cache_v: &mut DeviceBuffer<u16>,
    ) -> Result<()> {
        let kv_dim = k.len();
        ensure!(
            v.len() == kv_dim,
            Shape,
            "kv_store: k {} and v {}",
            kv_dim,
            v.len()
        );
        ensure!(
            (pos + 1) * kv_dim <= cache_k.len() && cache_k.len() == cache_v.len(),
            ContextOverflow,
            "kv_store: position {pos} does not fit a cache of {} values",
            cache_k.len()
        );
        let f = self.function(&kernels::ATTENTION, "kv_store")?;
        let (d, p) = (to_i32(kv_dim, "kv_dim")?, to_i32(pos, "pos")?);
        let mut b = self.stream().launch_builder(&f);
        b.arg(&k.data)
            .arg(&v.data)
            .arg(&d)
            .arg(&p)
            .arg(&mut cache_k.data)
            .arg(&mut cache_v.data);
        // SAFETY: matches kv_store(k, v, kv_dim, pos, cache_k, cache_v); row `pos` of both
        // caches is inside them (checked); threads past kv_dim return.
        unsafe { b.launch(cfg(grid(kv_dim, 256)?, 256, 0)) }
            .map_err(driver_err("launching kv_store"))?;
        Ok(())
    }

    /// Decode attention for one token: `q` is n_heads × head_dim, the caches hold positions
    /// 0..n_pos (rows of n_kv_heads × head_dim), `out` is n_heads × head_dim.
    #[allow(clippy::too_many_arguments)]
    pub fn attention(
        &self,
        q: &DeviceBuffer<f32>,
        cache_k: &DeviceBuffer<u16>,
        cache_v: &DeviceBuffer<u16>,
        n_pos: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        out: &mut DeviceBuffer<f32>,
    ) -> Result<()> {
        ensure!(
            n_heads > 0 && n_kv_heads > 0 && n_heads.is_multiple_of(n_kv_heads),
            Shape,
            "attention: {n_heads} heads, {n_kv_heads} kv heads"
        );
        ensure!(
            head_dim > 0 && head_dim <= MAX_HEAD_DIM,
            Unsupported,
            "head_dim {head_dim}"
        );
        ensure!(
            q.len() == n_heads * head_dim && out.len() == q.len(),
            Shape,
            "attention: q {} / out {} for {n_heads} x {head_dim}",
            q.len(),
            out.len()
        );
        let kv_dim = n_kv_heads * head_dim;
        ensure!(
            n_pos > 0 && n_pos * kv_dim <= cache_k.len() && n_pos * kv_dim <= cache_v.len(),
            Shape,
            "attention: {n_pos} positions do not fit the cache"
        );
        let f = self.function(&kernels::ATTENTION, "attention_decode")?;
        let scale = 1.0 / (head_dim as f32).sqrt();
        let (np, nh) = (to_i32(n_pos, "positions")?, to_i32(n_heads, "heads")?);
        let (nkv, hd) = (
            to_i32(n_kv_heads, "kv heads")?,
            to_i32(head_dim, "head_dim")?,
        );
        let mut b = self.stream().launch_builder(&f);
        b.arg(&q.data).arg(&cache_k.data).arg(&cache_v.data);
        b.arg(&np)
            .arg(&nh)
            .arg(&nkv)
            .arg(&hd)
            .arg(&scale)
            .arg(&mut out.data);
        // SAFETY: matches attention_decode(q, cache_k, cache_v, n_pos, n_heads, n_kv_heads,
        // head_dim, scale, out); one block of ATT_WARPS warps per head; head_dim <= 256 fits the
        // kernel's static shared arrays; positions 0..n_pos are inside both caches (checked).
        unsafe { b.launch(cfg(nh as u32, ATT_THREADS, 0)) }
            .map_err(driver_err("launching attention_decode"))?;
        Ok(())
    }

    /// `g[i] = act(g[i]) · u[i]`.
    pub fn act_mul(
        &self,
        g: &mut DeviceBuffer<f32>,
        u: &DeviceBuffer<f32>,
        act: Act,
    ) -> Result<()> {
        ensure!(
            g.len() == u.len(),
            Shape,
            "act_mul: {} and {}",
            g.len(),
            u.len()
        );
        let f = self.function(&kernels::ELEMENTWISE, "act_mul")?;
        let (n, a) = (to_i32(g.len(), "n")?, act as i32);
        let blocks = grid(g.len(), 256)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&mut g.data).arg(&u.data).arg(&n).arg(&a);
        // SAFETY: matches act_mul(g, u, n, act); both hold n floats; threads past n return.
        unsafe { b.launch(cfg(blocks, 256, 0)) }.map_err(driver_err("launching act_mul"))?;
        Ok(())
    }

    /// `y[i] += x[i]`.
    pub fn add(&self, y: &mut DeviceBuffer<f32>, x: &DeviceBuffer<f32>) -> Result<()> {
        ensure!(
            y.len() == x.len(),
            Shape,
            "add: {} and {}",
            y.len(),
            x.len()
        );
        let f = self.function(&kernels::ELEMENTWISE, "add")?;
        let n = to_i32(y.len(), "n")?;
        let blocks = grid(y.len(), 256)?;
        let mut b = self.stream().launch_builder(&f);
        b.arg(&mut y.data).arg(&x.data).arg(&n);
        // SAFETY: matches add(y, x, n); both hold n floats; threads past n return.
        unsafe { b.launch(cfg(blocks, 256, 0)) }.map_err(driver_err("launching add"))?;
        Ok(())
    }
}
