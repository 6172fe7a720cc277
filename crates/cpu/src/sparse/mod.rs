//! Sparse FFN kernels over an active neuron list: row-sparse matvec ([`matvec_rows`]),
//! column-sparse accumulation over rows of a transposed matrix ([`axpy_rows`]), and the fused
//! per-neuron passes ([`ffn_up_down_sparse`], [`ffn_gate_up_down_sparse`]).
//!
//! Parallel work is the active list cut into a few contiguous chunks per thread (by bytes
//! touched). Kernels that accumulate into y give every chunk its own partial sum (the first chunk
//! adds straight into y, the others into zeroed thread-local scratch), then add the partials
//! into y in chunk order: no two tasks write the same memory, and the result depends only on the
//! inputs and the thread count. Rows are read in list order, so a sorted list walks memory
//! forwards. Rows are handled eight at a time (float-format dots and every axpy read eight rows
//! side by side, sharing each x or y vector) while the rows read next (the next group, or the
//! same neurons' rows of the next matrix in the fused kernels) are fetched line by line in step;
//! quantized rows are dotted on the dense matvec's int16-x kernel (up to eight scattered rows at
//! once), other formats are decoded to f32 on the fly. 4-bit rows (Q4_0, Q4_1) are accumulated
//! on integer multiplies, with the group's per-block coefficients rounded to 8 bits on a shared
//! scale (error bound and reasoning in `avx2_q4_axpy`); every other accumulation is in f32.
//!
//! The fused kernels read each active neuron's rows together; on this design's CPUs separate
//! passes (matvec_rows over up, then axpy_rows over down_t) measured faster (`cargo bench -p
//! powerinfer-cpu --bench sparse`: F16 169 µs vs 201 µs, Q4_0 129 µs vs 153 µs for 10% of
//! ffn 5504 on 2 threads), so the engine decodes with separate passes.
//!
//! A neuron whose coefficient is exactly zero (a[k] in `axpy_rows`, g[k] or h in the fused
//! kernels) contributes nothing and its remaining rows are not read; the references in
//! [`reference`] follow the same rule.

#[cfg(target_arch = "x86_64")]
mod avx2_q4_axpy;
#[cfg(target_arch = "x86_64")]
mod avx2_rows;
mod axpy;
pub mod reference;
#[cfg(test)]
mod tests;

use crate::dispatch;
use crate::simd::{self, Level};
use powerinfer_core::{ensure, Activation, DType, Result, Weight};
use rayon::prelude::*;
use std::cell::Cell;
use std::ops::Range;

/// Smallest number of bytes worth a rayon task.
const MIN_TASK_BYTES: usize = 64 * 1024;
/// At most this many tasks per thread in [`matvec_rows`] (no reduction to pay for).
const MATVEC_TASKS_PER_THREAD: usize = 4;
/// At most this many tasks per thread in the accumulating kernels (each task's partial y is
/// read once more by the reduction).
const ACC_TASKS_PER_THREAD: usize = 2;
/// Reductions over at least this many partial values run in parallel over chunks of y.
const PAR_REDUCE_MIN: usize = 1 << 16;
/// y chunk of the parallel reduction (floats).
const REDUCE_CHUNK: usize = 1024;

/// y[k] = dot(W[idx[k]], x) for every k (row-sparse matvec over an active index list; idx need
/// not be sorted; out-of-range index -> Error::Shape). Parallel on the current rayon pool;
/// quantized rows use the int16-x kernel like matvec when on AVX2.
pub fn matvec_rows(w: &Weight, x: &[f32], idx: &[u32], y: &mut [f32]) -> Result<()> {
    matvec_rows_at(simd::level(), w, x, idx, y)
}

/// y += Σ_k a[k] · W[idx[k]]  (column-sparse accumulation over rows of a transposed matrix such
/// as down_t [ffn rows, dim cols]); y.len() == w.cols; per-thread partial sums reduced without
/// data races (deterministic result for a given thread count). On AVX2, Q4_0/Q4_1 rows take
/// coefficients rounded to 8 bits per block and group of 8 rows (error per column at most
/// Σ_i (max_i |a_i·d_i| / 254)·|q_i − 8| over the block's scales d and nibbles q).
pub fn axpy_rows(w: &Weight, idx: &[u32], a: &[f32], y: &mut [f32]) -> Result<()> {
    axpy_rows_at(simd::level(), w, idx, a, y)
}

/// The fused per-neuron-chunk FFN for a known active set (exact-relu / threshold modes, where the
/// gate was computed densely): for each k, h = g[k] · dot(up[idx[k]], x); y += h · down_t[idx[k]].
/// `g[k]` is the already-activated gate value act(gate_k(x)). One pass over each active neuron's
/// up row and down_t row in the same task (better locality than two passes). y is overwritten.
pub fn ffn_up_down_sparse(
    up: &Weight,
    down_t: &Weight,
    x: &[f32],
    idx: &[u32],
    g: &[f32],
    y: &mut [f32],
) -> Result<()> {
    ffn_up_down_at(simd::level(), up, down_t, x, idx, g, y)
}

/// Predictor-mode variant: the gate rows are read only for active neurons too:
/// h = act(dot(gate[idx[k]], x)) · dot(up[idx[k]], x); y = Σ h · down_t[idx[k]]. `act` as in
/// powerinfer_core::Activation (ReLU, SiLU, GELU).
pub fn ffn_gate_up_down_sparse(
    gate: &Weight,
    up: &Weight,
    down_t: &Weight,
    act: Activation,
    x: &[f32],
    idx: &[u32],
    y: &mut [f32],
) -> Result<()> {
    ffn_gate_up_down_at(simd::level(), gate, up, down_t, act, x, idx, y)
}

/// [`matvec_rows`] on a given SIMD level.
pub(crate) fn matvec_rows_at(
    level: Level,
    w: &Weight,
    x: &[f32],
    idx: &[u32],
    y: &mut [f32],
) -> Result<()> {
    ensure!(
        x.len() == w.cols,
        Shape,
        "matvec_rows: x has {} values, weight has {} cols",
        x.len(),
        w.cols
    );
    ensure!(
        y.len() == idx.len(),
        Shape,
        "matvec_rows: y has {} values for {} indices",
        y.len(),
        idx.len()
    );
    let rows = Rows::new(w, idx, "matvec_rows")?;
    if idx.is_empty() {
        return Ok(());
    }
    let dot = Dot::new(level, x, &[w.dtype]);
    let run = |(ic, yc): (&[u32], &mut [f32])| {
        let mut batch = [&[][..]; axpy::GROUP];
        let mut next = [&[][..]; axpy::GROUP];
        let groups = ic.chunks(axpy::GROUP).zip(yc.chunks_mut(axpy::GROUP));
        for (g, (ig, yg)) in groups.enumerate() {
            let upcoming = ic.iter().skip((g + 1) * axpy::GROUP).take(axpy::GROUP);
            let mut nn = 0;
            for (b, &i) in next.iter_mut().zip(upcoming) {
                *b = rows.get(i);
                nn += 1;
            }
            for (b, &i) in batch.iter_mut().zip(ig) {
                *b = rows.get(i);
            }
            dot.group(w.dtype, &batch[..ig.len()], &next[..nn], yg);
        }
    };
    let per = chunk_len(idx.len(), rows.bytes, MATVEC_TASKS_PER_THREAD);
    if per >= idx.len() {
        run((idx, y));
    } else {
        idx.par_chunks(per).zip(y.par_chunks_mut(per)).for_each(run);
    }
    Ok(())
}

/// [`axpy_rows`] on a given SIMD level.
pub(crate) fn axpy_rows_at(
    level: Level,
    w: &Weight,
    idx: &[u32],
    a: &[f32],
    y: &mut [f32],
) -> Result<()> {
    ensure!(
        y.len() == w.cols,
        Shape,
        "axpy_rows: y has {} values, weight has {} cols",
        y.len(),
        w.cols
    );
    ensure!(
        a.len() == idx.len(),
        Shape,
        "axpy_rows: {} coefficients for {} indices",
        a.len(),
        idx.len()
    );
    let rows = Rows::new(w, idx, "axpy_rows")?;
    accumulate(idx.len(), rows.bytes, y, |range, part| {
        let mut group = Group::new(level, w.dtype);
        for k in range {
            if a[k] != 0.0 {
                group.push(rows.get(idx[k]), a[k], part);
            }
        }
        group.flush(part);
    });
    Ok(())
}

/// [`ffn_up_down_sparse`] on a given SIMD level.
pub(crate) fn ffn_up_down_at(
    level: Level,
    up: &Weight,
    down_t: &Weight,
    x: &[f32],
    idx: &[u32],
    g: &[f32],
    y: &mut [f32],
) -> Result<()> {
    check_ffn(&[up, down_t], x, y, "ffn_up_down_sparse")?;
    ensure!(
        g.len() == idx.len(),
        Shape,
        "ffn_up_down_sparse: {} gate values for {} indices",
        g.len(),
        idx.len()
    );
    let ups = Rows::new(up, idx, "ffn_up_down_sparse")?;
    let downs = Rows::new(down_t, idx, "ffn_up_down_sparse")?;
    y.fill(0.0);
    if idx.is_empty() {
        return Ok(());
    }
    let dot = Dot::new(level, x, &[up.dtype]);
    accumulate(idx.len(), ups.bytes + downs.bytes, y, |range, part| {
        let mut group = Group::new(level, down_t.dtype);
        let mut batch = Batch::default();
        for k in range.filter(|&k| g[k] != 0.0) {
            batch.push(idx[k], g[k]);
            if batch.n == axpy::GROUP {
                batch.run(&dot, &ups, up.dtype, &downs, &mut group, part);
            }
        }
        batch.run(&dot, &ups, up.dtype, &downs, &mut group, part);
        group.flush(part);
    });
    Ok(())
}

/// [`ffn_gate_up_down_sparse`] on a given SIMD level.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ffn_gate_up_down_at(
    level: Level,
    gate: &Weight,
    up: &Weight,
    down_t: &Weight,
    act: Activation,
    x: &[f32],
    idx: &[u32],
    y: &mut [f32],
) -> Result<()> {
    check_ffn(&[gate, up, down_t], x, y, "ffn_gate_up_down_sparse")?;
    let gates = Rows::new(gate, idx, "ffn_gate_up_down_sparse")?;
    let ups = Rows::new(up, idx, "ffn_gate_up_down_sparse")?;
    let downs = Rows::new(down_t, idx, "ffn_gate_up_down_sparse")?;
    y.fill(0.0);
    if idx.is_empty() {
        return Ok(());
    }
    let dot = Dot::new(level, x, &[gate.dtype, up.dtype]);
    let bytes = gates.bytes + ups.bytes + downs.bytes;
    accumulate(idx.len(), bytes, y, |range, part| {
        let mut group = Group::new(level, down_t.dtype);
        let mut batch = Batch::default();
        let chunk = &idx[range];
        for ks in chunk.chunks(axpy::GROUP) {
            let mut gk = [0f32; axpy::GROUP];
            let mut gate_rows = [&[][..]; axpy::GROUP];
            for (r, &i) in gate_rows.iter_mut().zip(ks) {
                *r = gates.get(i);
            }
            // Fetch the up rows of these neurons while their gate rows are read.
            let mut up_rows = [&[][..]; axpy::GROUP];
            for (r, &i) in up_rows.iter_mut().zip(ks) {
                *r = ups.get(i);
            }
            let (rows, next) = (&gate_rows[..ks.len()], &up_rows[..ks.len()]);
            dot.group(gate.dtype, rows, next, &mut gk[..ks.len()]);
            for (&i, &gi) in ks.iter().zip(&gk) {
                let a = act.apply(gi);
                if a != 0.0 {
                    batch.push(i, a);
                    if batch.n == axpy::GROUP {
                        batch.run(&dot, &ups, up.dtype, &downs, &mut group, part);
                    }
                }
            }
        }
        batch.run(&dot, &ups, up.dtype, &downs, &mut group, part);
        group.flush(part);
    });
    Ok(())
}

/// Shapes shared by the fused kernels: all weights `[ffn, dim]` with one ffn, x and y of dim.
fn check_ffn(ws: &[&Weight], x: &[f32], y: &[f32], what: &str) -> Result<()> {
    for w in ws {
        ensure!(
            w.rows == ws[0].rows && w.cols == x.len(),
            Shape,
            "{what}: weight of {} x {} does not fit ffn {} and x of {}",
            w.rows,
            w.cols,
            ws[0].rows,
            x.len()
        );
    }
    ensure!(
        y.len() == x.len(),
        Shape,
        "{what}: y has {} values, x has {}",
        y.len(),
        x.len()
    );
    Ok(())
}

/// A weight's rows, checked against its shape and an index list.
struct Rows<'a> {
    data: &'a [u8],
    /// Bytes per row.
    bytes: usize,
}

impl<'a> Rows<'a> {
    /// Error unless the weight's bytes fit its shape and every index names one of its rows.
    fn new(w: &'a Weight, idx: &[u32], what: &str) -> Result<Rows<'a>> {
        crate::check_weight_bytes(w)?;
        if let Some(&bad) = idx.iter().find(|&&i| i as usize >= w.rows) {
            powerinfer_core::bail!(
                Shape,
                "{what}: index {bad} out of range for {} rows",
                w.rows
            );
        }
        Ok(Rows {
            data: w.bytes(),
            bytes: w.dtype.row_bytes(w.cols)?,
        })
    }

    /// Row `i` (checked in range by [`Rows::new`]).
    #[inline]
    fn get(&self, i: u32) -> &'a [u8] {
        &self.data[i as usize * self.bytes..][..self.bytes]
    }
}

/// Dot products of rows with one x on the level's kernels: quantized rows on the int16-x
/// kernel of the dense matvec (x quantized once per call) when on AVX2 and x is finite, other
/// rows decoded to f32.
struct Dot<'a> {
    level: Level,
    x: &'a [f32],
    #[cfg(target_arch = "x86_64")]
    xq: Option<crate::avx2::XQuant>,
}

impl<'a> Dot<'a> {
    /// Dots with `x` for rows of the given formats.
    fn new(level: Level, x: &'a [f32], dtypes: &[DType]) -> Dot<'a> {
        let quantized = dtypes.iter().any(|d| d.is_quantized());
        Dot {
            level,
            x,
            #[cfg(target_arch = "x86_64")]
            xq: match level == Level::Avx2 && quantized && x.len().is_multiple_of(32) {
                true => crate::avx2::XQuant::new(x),
                false => None,
            },
        }
    }

    /// out[i] = dot(rows[i], x) for up to [`axpy::GROUP`] rows of `dtype`, fetching the `next`
    /// rows into the cache alongside where the level can.
    #[inline]
    fn group(&self, dtype: DType, rows: &[&[u8]], next: &[&[u8]], out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let (Some(xq), true) = (&self.xq, dtype.is_quantized()) {
            crate::avx2::scattered_dot_i16(dtype, rows, next, xq, out);
            return;
        }
        if !axpy::dot_group(self.level, dtype, rows, next, self.x, out) {
            for (o, row) in out.iter_mut().zip(rows) {
                let mut one = [0f32];
                dispatch::rows_dot(self.level, dtype, row, row.len(), self.x, &mut one);
                *o = one[0];
            }
        }
    }
}

/// Rows waiting to be added into a partial sum, [`axpy::GROUP`] at a time (y read and written
/// once per group). Up to two groups are held: the first is added while the second's rows are
/// fetched into the cache alongside, so the rows after the current group are always in flight.
struct Group<'a> {
    level: Level,
    dtype: DType,
    rows: [&'a [u8]; 2 * axpy::GROUP],
    a: [f32; 2 * axpy::GROUP],
    n: usize,
}

impl<'a> Group<'a> {
    fn new(level: Level, dtype: DType) -> Group<'a> {
        Group {
            level,
            dtype,
            rows: [&[]; 2 * axpy::GROUP],
            a: [0.0; 2 * axpy::GROUP],
            n: 0,
        }
    }

    /// Queue `a · row`, adding the first group into `y` once a second one is full behind it.
    #[inline]
    fn push(&mut self, row: &'a [u8], a: f32, y: &mut [f32]) {
        self.rows[self.n] = row;
        self.a[self.n] = a;
        self.n += 1;
        if self.n == 2 * axpy::GROUP {
            self.add_first(y);
        }
    }

    /// Add the first queued group (up to [`axpy::GROUP`] rows) into `y`, fetching the rest, and
    /// move the rest to the front.
    fn add_first(&mut self, y: &mut [f32]) {
        let g = self.n.min(axpy::GROUP);
        let (rows, next) = self.rows[..self.n].split_at(g);
        axpy::axpy_group(self.level, self.dtype, rows, next, &self.a[..g], y);
        self.rows.copy_within(g..self.n, 0);
        self.a.copy_within(g..self.n, 0);
        self.n -= g;
    }

    /// Add every queued row into `y`.
    fn flush(&mut self, y: &mut [f32]) {
        while self.n > 0 {
            self.add_first(y);
        }
    }
}

/// Active neurons waiting for their up-row dot products, with their gate values.
#[derive(Default)]
struct Batch {
    idx: [u32; axpy::GROUP],
    g: [f32; axpy::GROUP],
    n: usize,
}

impl Batch {
    /// Queue neuron `i` with gate value `g` (room for it: callers run full batches).
    #[inline]
    fn push(&mut self, i: u32, g: f32) {
        self.idx[self.n] = i;
        self.g[self.n] = g;
        self.n += 1;
    }

    /// h = g · dot(up row, x) for the queued neurons, then queue h · down row into `group`.
    fn run<'a>(
        &mut self,
        dot: &Dot<'_>,
        ups: &Rows<'_>,
        up_dtype: DType,
        downs: &Rows<'a>,
        group: &mut Group<'a>,
        y: &mut [f32],
    ) {
        let n = std::mem::take(&mut self.n);
        if n == 0 {
            return;
        }
        let mut rows = [&[][..]; axpy::GROUP];
        for (r, &i) in rows.iter_mut().zip(&self.idx[..n]) {
            *r = ups.get(i);
        }
        // Fetch the down rows of these neurons while their up rows are read.
        let mut next = [&[][..]; axpy::GROUP];
        for (r, &i) in next.iter_mut().zip(&self.idx[..n]) {
            *r = downs.get(i);
        }
        let mut u = [0f32; axpy::GROUP];
        dot.group(up_dtype, &rows[..n], &next[..n], &mut u[..n]);
        for ((&i, &g), &u) in self.idx[..n].iter().zip(&self.g[..n]).zip(&u[..n]) {
            let h = g * u;
            if h != 0.0 {
                group.push(downs.get(i), h, y);
            }
        }
    }
}

/// Items per task when `n` items of `bytes` bytes each are shared by the current pool with at
/// most `per_thread` tasks per thread.
fn chunk_len(n: usize, bytes: usize, per_thread: usize) -> usize {
    let threads = rayon::current_num_threads();
    if threads <= 1 || n == 0 {
        return n.max(1);
    }
    let by_bytes = (n.saturating_mul(bytes) / MIN_TASK_BYTES).max(1);
    let tasks = by_bytes.min(threads * per_thread).min(n);
    n.div_ceil(tasks)
}

thread_local! {
    /// Partial sums of the accumulating kernels, reused across calls on this thread.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// Run `body(range, part)` over contiguous chunks of `0..n` (each item `bytes` bytes of rows),
/// in parallel, where `part` is `y` itself for the first chunk and a zeroed partial sum for the
/// others; then add the partials into y in chunk order.
fn accumulate<F>(n: usize, bytes: usize, y: &mut [f32], body: F)
where
    F: Fn(Range<usize>, &mut [f32]) + Sync,
{
    if n == 0 {
        return;
    }
    let per = chunk_len(n, bytes, ACC_TASKS_PER_THREAD);
    let tasks = n.div_ceil(per);
    if tasks == 1 || y.is_empty() {
        body(0..n, y);
        return;
    }
    let dim = y.len();
    // Taken, not borrowed: a nested call on this thread (work stealing) gets its own buffer.
    let mut scratch = SCRATCH.take();
    scratch.clear();
    scratch.resize((tasks - 1) * dim, 0.0);
    let mut parts: Vec<&mut [f32]> = Vec::with_capacity(tasks);
    parts.push(&mut *y);
    parts.extend(scratch.chunks_exact_mut(dim));
    parts
        .into_par_iter()
        .enumerate()
        .for_each(|(t, part)| body(t * per..((t + 1) * per).min(n), part));
    reduce(y, &scratch);
    SCRATCH.set(scratch);
}

/// y += Σ_t parts[t] over the consecutive `y.len()`-long partial sums in `parts`, in order;
/// parallel over chunks of y when there is enough to add.
fn reduce(y: &mut [f32], parts: &[f32]) {
    let dim = y.len();
    let add = |(c, yc): (usize, &mut [f32])| {
        let range = c * REDUCE_CHUNK..c * REDUCE_CHUNK + yc.len();
        for part in parts.chunks_exact(dim) {
            for (yk, pk) in yc.iter_mut().zip(&part[range.clone()]) {
                *yk += *pk;
            }
        }
    };
    if parts.len() >= PAR_REDUCE_MIN && dim > REDUCE_CHUNK {
        y.par_chunks_mut(REDUCE_CHUNK).enumerate().for_each(add);
    } else {
        y.chunks_mut(REDUCE_CHUNK).enumerate().for_each(add);
    }
}
