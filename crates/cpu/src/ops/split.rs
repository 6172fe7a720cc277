//! The parallel split of the sparse ops: an active list cut into a few contiguous chunks per
//! thread (by bytes touched), and for the accumulating ops one partial sum per chunk (the first
//! chunk adds straight into y, the others into zeroed thread-local scratch), added into y in
//! chunk order: no two tasks write the same memory. The accumulating split is cut by the bytes
//! touched up to [`ACC_TASKS`] tasks whatever the pool's size, so the result depends on the
//! inputs alone: the same bits at 1 thread and at 16. Each parallel region is timed for the
//! delay until its last thread starts ([`crate::pool_start`]).

use rayon::prelude::*;

use crate::pool_start::Region;
use std::cell::Cell;
use std::ops::Range;

/// Smallest number of bytes worth a rayon task.
const MIN_TASK_BYTES: usize = 64 * 1024;
/// At most this many tasks per thread in [`chunks`] (no reduction to pay for).
const MATVEC_TASKS_PER_THREAD: usize = 4;
/// The most tasks an accumulating kernel's work is cut into, whatever the pool's size (each
/// task's partial y is read once more by the reduction). Fixed, not per thread: the cut decides
/// the order of the partial sums, so a cut that followed the thread count gave other bits at
/// 1 thread than at 2. Pools wider than this leave threads idle in these kernels.
pub(crate) const ACC_TASKS: usize = 16;
/// Bytes of rows an accumulating task reads at least, per byte of its partial sum (y's length
/// in f32, zeroed, then read by the reduction), and at least [`MIN_TASK_BYTES`]. Measured on 2
/// threads: tasks of 8 times their partial (64 KiB at dim 2048) made the F16 axpy up to a fifth
/// slower than a cut by the thread count, 32 times was at parity; a fixed 256 KiB left
/// SmolLM2's down pass (277 KB at dim 576) one task and its threshold decode slower.
const ACC_BYTES_PER_PARTIAL_BYTE: usize = 32;
/// Reductions over at least this many partial values run in parallel over chunks of y.
const PAR_REDUCE_MIN: usize = 1 << 16;
/// y chunk of the parallel reduction (floats).
const REDUCE_CHUNK: usize = 1024;

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

/// Run `body(idx chunk, y chunk)` over matching contiguous chunks of `idx` and `y` (each item
/// `bytes` bytes of rows), in parallel where there is enough work.
pub(crate) fn chunks<F>(idx: &[u32], y: &mut [f32], bytes: usize, body: F)
where
    F: Fn((&[u32], &mut [f32])) + Sync + Send,
{
    let per = chunk_len(idx.len(), bytes, MATVEC_TASKS_PER_THREAD);
    if per >= idx.len() {
        body((idx, y));
    } else {
        let region = Region::begin();
        idx.par_chunks(per)
            .zip(y.par_chunks_mut(per))
            .for_each(|c| {
                region.task();
                body(c)
            });
        region.end();
    }
}

thread_local! {
    /// Partial sums of the accumulating kernels, reused across calls on this thread.
    static SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// One accumulating problem's cut: its items per task and its number of tasks (1 when the work
/// is too small to split or `dim` is 0).
fn acc_cut(n: usize, bytes: usize, align: usize, dim: usize) -> (usize, usize) {
    let min_task = MIN_TASK_BYTES.max(ACC_BYTES_PER_PARTIAL_BYTE * 4 * dim);
    let tasks = (n.saturating_mul(bytes) / min_task).clamp(1, ACC_TASKS.min(n.max(1)));
    let per = n.div_ceil(tasks).next_multiple_of(align.max(1)).max(1);
    match dim {
        0 => (n.max(1), 1),
        _ => (per, n.div_ceil(per).max(1)),
    }
}

/// Run `body(p, range, part)` over contiguous chunks of `0..n_p` for every problem `p`
/// (`probs[p]` = (n_p items, bytes per item); chunk boundaries on multiples of `align`), all
/// in one parallel region, where `part` is `ys[p]` itself for a problem's first chunk and a
/// zeroed partial sum for its others; then add each problem's partials into its y in chunk
/// order. A problem is cut by its own size alone, so each `ys[p]` gets the same bits whether it
/// is summed alone or beside others: only the fork-join is shared (the routed experts of a
/// mixture-of-experts layer: one region for all of them, not one per expert).
pub(crate) fn accumulate_many<F>(
    probs: &[(usize, usize)],
    align: usize,
    ys: &mut [&mut [f32]],
    body: F,
) where
    F: Fn(usize, Range<usize>, &mut [f32]) + Sync,
{
    debug_assert_eq!(probs.len(), ys.len());
    let cuts: Vec<(usize, usize)> = probs
        .iter()
        .zip(ys.iter())
        .map(|(&(n, bytes), y)| acc_cut(n, bytes, align, y.len()))
        .collect();
    let live = |p: usize| probs[p].0 > 0;
    let tasks: usize = (0..probs.len())
        .filter(|&p| live(p))
        .map(|p| cuts[p].1)
        .sum();
    if tasks <= 1 {
        for (p, y) in ys.iter_mut().enumerate().filter(|&(p, _)| live(p)) {
            body(p, 0..probs[p].0, y);
        }
        return;
    }
    // Taken, not borrowed: a nested call on this thread (work stealing) gets its own buffer.
    let mut scratch = SCRATCH.take();
    scratch.clear();
    let extra: usize = (0..probs.len())
        .filter(|&p| live(p))
        .map(|p| (cuts[p].1 - 1) * ys[p].len())
        .sum();
    scratch.resize(extra, 0.0);
    let mut work: Vec<(usize, Range<usize>, &mut [f32])> = Vec::with_capacity(tasks);
    let mut rest = &mut scratch[..];
    for (p, y) in ys.iter_mut().enumerate().filter(|&(p, _)| live(p)) {
        let (n, (per, count)) = (probs[p].0, cuts[p]);
        let dim = y.len();
        let (mine, tail) = rest.split_at_mut((count - 1) * dim);
        rest = tail;
        work.push((p, 0..per.min(n), &mut **y));
        for (t, part) in mine.chunks_exact_mut(dim.max(1)).enumerate() {
            let t = t + 1;
            work.push((p, t * per..((t + 1) * per).min(n), part));
        }
    }
    let region = Region::begin();
    work.into_par_iter().for_each(|(p, range, part)| {
        region.task();
        body(p, range, part)
    });
    region.end();
    let mut at = 0;
    for (p, y) in ys.iter_mut().enumerate().filter(|&(p, _)| live(p)) {
        let len = (cuts[p].1 - 1) * y.len();
        reduce(y, &scratch[at..at + len]);
        at += len;
    }
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
