//! One parallel region run in steps ([`in_pass`]): every thread of the pool runs the same body
//! at once, the steps separated by a spin barrier ([`Pass::sync`]), each thread taking its own
//! share of each step's rows ([`Pass::share`]). A chain of short dependent products (a mixture
//! of experts' router, then the routed experts' gate and up, then their down rows) costs one
//! fork-join instead of one per product: a fork-join of the pool costs 10-25 µs on a 2-vCPU VM
//! (matvecs of 150 KB-2.4 MB of Q4_K: fixed cost per call from a fit of time against size),
//! a barrier between two running threads about a microsecond.
//!
//! Outputs the threads write in disjoint parts go through [`Disjoint`]; the share of rows a
//! thread takes depends only on the items, the thread count and the thread's index, so two
//! threads never write the same rows, and a row's value is the one a [`crate::matvec`] of its
//! weight gives (the same kernel over the same prepared x, [`PreparedX`]): the same bits.

use super::sparse::listed_dot;
use crate::check::{self, Rows};
use crate::dispatch::Activations;
use crate::operands::interleaved::Interleaved;
use crate::simd;
use powerinfer_core::{Result, Weight};
use std::marker::PhantomData;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Spins before a waiting thread starts yielding its core (a preempted peer on a busy machine).
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// A sense-counting spin barrier for the threads of one pass; poisoned when a thread's body
/// panicked, after which waits return at once (the pass then re-raises the panic).
struct Barrier {
    threads: usize,
    arrived: AtomicUsize,
    generation: AtomicUsize,
    poisoned: AtomicBool,
}

impl Barrier {
    fn new(threads: usize) -> Barrier {
        Barrier {
            threads,
            arrived: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
        }
    }

    fn wait(&self) {
        let gen = self.generation.load(Ordering::Acquire);
        if self.arrived.fetch_add(1, Ordering::AcqRel) + 1 == self.threads {
            self.arrived.store(0, Ordering::Relaxed);
            self.generation.fetch_add(1, Ordering::Release);
            return;
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            if self.poisoned.load(Ordering::Relaxed) {
                return;
            }
            if spins < SPINS_BEFORE_YIELD {
                spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// One thread's view of a stepped region: its index, the thread count, the barrier.
pub struct Pass<'a> {
    index: usize,
    threads: usize,
    barrier: &'a Barrier,
}

impl Pass<'_> {
    /// This thread's index in the pass (0..threads).
    pub fn index(&self) -> usize {
        self.index
    }

    /// Threads in the pass.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Wait until every thread of the pass got here: what any thread wrote before is then
    /// visible to all.
    pub fn sync(&self) {
        if self.threads > 1 {
            self.barrier.wait();
        }
    }

    /// This thread's share of the rows of `items` (each `(rows, bytes per row)`): the items'
    /// rows laid end to end and cut into `threads` spans of equal bytes, each cut moved down to
    /// a multiple of `align` rows within its item; `f(item, rows)` for each piece of this
    /// thread's span, in order. Every thread computes the same cuts, so the spans are disjoint
    /// and cover every row.
    pub fn share(
        &self,
        items: &[(usize, usize)],
        align: usize,
        mut f: impl FnMut(usize, Range<usize>),
    ) {
        let total: usize = items.iter().map(|&(r, b)| r * b).sum();
        let cut = |t: usize| -> (usize, usize) {
            // The position (item, row) where span t starts.
            if t >= self.threads {
                return (items.len(), 0);
            }
            let target = (total as u128 * t as u128 / self.threads as u128) as usize;
            let mut at = 0;
            for (i, &(rows, bytes)) in items.iter().enumerate() {
                let size = rows * bytes;
                if target < at + size {
                    let row = (target - at) / bytes.max(1);
                    return (i, row / align.max(1) * align.max(1));
                }
                at += size;
            }
            (items.len(), 0)
        };
        let (start, end) = (cut(self.index), cut(self.index + 1));
        for (i, &(rows, _)) in items.iter().enumerate().take(end.0 + 1).skip(start.0) {
            let lo = if i == start.0 { start.1 } else { 0 };
            let hi = if i == end.0 { end.1 } else { rows };
            if lo < hi {
                f(i, lo..hi);
            }
        }
    }

    /// This thread's share of `0..n` in contiguous equal spans, each boundary a multiple of
    /// `align` (the columns of an elementwise step).
    pub fn span(&self, n: usize, align: usize) -> Range<usize> {
        let a = align.max(1);
        let at = |t: usize| match t >= self.threads {
            true => n,
            false => (n * t / self.threads) / a * a,
        };
        at(self.index)..at(self.index + 1)
    }
}

thread_local! {
    /// Whether this thread is running a pass's body (a pass inside it runs on this thread
    /// alone: its pool's threads are all inside the outer pass).
    static IN_PASS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `body` on every thread of the current rayon pool at once (one fork-join), each with its
/// [`Pass`]; on a pool of one thread, or from inside a pass's body, on this thread alone. A
/// panic in any thread's body is raised here once every thread has left its body.
///
/// At most one pass may run on a pool at a time (a session's forward pass is one caller): two
/// at once could each hold a thread at a barrier waiting for a thread that runs the other.
pub fn in_pass<F>(body: F)
where
    F: Fn(&Pass<'_>) + Sync,
{
    let nested = IN_PASS.with(|f| f.get());
    let threads = match nested {
        true => 1,
        false => rayon::current_num_threads().max(1),
    };
    let barrier = Barrier::new(threads);
    if threads == 1 {
        return body(&Pass {
            index: 0,
            threads: 1,
            barrier: &barrier,
        });
    }
    let panics: Vec<Option<Box<dyn std::any::Any + Send>>> = rayon::broadcast(|ctx| {
        let pass = Pass {
            index: ctx.index(),
            threads: ctx.num_threads(),
            barrier: &barrier,
        };
        IN_PASS.with(|f| f.set(true));
        let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&pass)));
        IN_PASS.with(|f| f.set(false));
        run.err()
            .inspect(|_| barrier.poisoned.store(true, Ordering::Relaxed))
    });
    if let Some(p) = panics.into_iter().flatten().next() {
        std::panic::resume_unwind(p);
    }
}

/// An activation vector prepared once for dot products with weight rows of any format (on
/// AVX2, quantized rows take the int16-x kernel), as the crate's matvecs prepare theirs: rows
/// dotted with it in a [`Pass`] get the bits [`crate::matvec`] gives.
pub struct PreparedX<'a> {
    act: Activations<'a>,
    len: usize,
}

impl<'a> PreparedX<'a> {
    /// `x` prepared for rows of some formats (`quantized`: whether any is quantized).
    pub fn new(x: &'a [f32], quantized: bool) -> PreparedX<'a> {
        PreparedX {
            act: Activations::new(simd::level(), x, quantized),
            len: x.len(),
        }
    }

    /// Error unless rows of `w` can be dotted with this x (as [`crate::matvec`] checks).
    pub fn check(&self, w: &Weight) -> Result<()> {
        check::len("pass", "x", self.len, w.cols, "the weight's cols")?;
        check::weight_bytes(w)
    }

    /// Error unless rows of `w` can be dotted with this x and every index of `ids` names one.
    pub fn check_listed(&self, w: &Weight, ids: &[u32]) -> Result<()> {
        self.check(w)?;
        Rows::new(w, ids, "pass").map(|_| ())
    }

    /// `out[k] = dot(row ids[k] of w, x)`, on this thread, the next rows fetched in step.
    /// `w` and `ids` passed [`Self::check_listed`].
    ///
    /// # Panics
    /// If an index is outside `w` or `out` is not `ids.len()` long.
    pub fn rows_listed(&self, w: &Weight, ids: &[u32], out: &mut [f32]) {
        assert!(out.len() == ids.len() && self.len == w.cols);
        let rows = Rows::new(w, &[], "pass").expect("a checked weight");
        listed_dot(&self.act, w.dtype, &rows, ids, out);
    }

    /// `out[k] = dot(row rows.start + k of w, x)`, on this thread. `w` passed [`Self::check`].
    ///
    /// # Panics
    /// If `rows` is outside `w` or `out` is not `rows.len()` long.
    pub fn rows(&self, w: &Weight, rows: Range<usize>, out: &mut [f32]) {
        assert!(rows.end <= w.rows && out.len() == rows.len() && self.len == w.cols);
        let rb = w.row_bytes();
        self.act
            .rows_dot(w.dtype, &w.bytes()[rows.start * rb..rows.end * rb], rb, out);
    }

    /// `out[k] = dot(row rows.start + k of w, x)` of an interleaved weight, on this thread: the
    /// bits [`crate::matvec_interleaved`] gives those rows. `rows.start` is a multiple of eight
    /// and so is `rows.end` unless it is `w.rows` (the row-major tail rows then join in).
    ///
    /// # Panics
    /// If `rows` is outside `w`, not so aligned, `out` is not `rows.len()` long or x is not
    /// `w.cols` long.
    pub fn rows_interleaved(&self, w: &Interleaved, rows: Range<usize>, out: &mut [f32]) {
        use crate::operands::interleaved::GROUP_ROWS;
        let grouped = w.groups() * GROUP_ROWS;
        assert!(
            rows.start <= rows.end
                && rows.end <= w.rows
                && out.len() == rows.len()
                && self.len == w.cols
                && rows.start.is_multiple_of(GROUP_ROWS)
                && (rows.end.is_multiple_of(GROUP_ROWS) || rows.end == w.rows)
        );
        let split = rows.end.min(grouped).max(rows.start);
        let (head, tail_out) = out.split_at_mut(split - rows.start);
        if !head.is_empty() {
            self.act
                .interleaved_groups(w, rows.start / GROUP_ROWS, head);
        }
        if !tail_out.is_empty() {
            let (tail, rb) = w.tail();
            let from = split - grouped;
            let bytes = &tail[from * rb..(from + tail_out.len()) * rb];
            self.act.rows_dot(w.dtype, bytes, rb, tail_out);
        }
    }
}

/// Buffers the threads of a [`Pass`] write in disjoint parts and read after a sync. Holds the
/// buffers' exclusive borrow for its lifetime.
pub struct Disjoint<'a> {
    bufs: Vec<(*mut f32, usize)>,
    _borrow: PhantomData<&'a mut [f32]>,
}

// SAFETY: the pointers come from exclusive borrows held for 'a; which thread touches which
// elements is the callers' contract on `part` and `read` (disjoint writes, reads after a sync).
unsafe impl Send for Disjoint<'_> {}
// SAFETY: as above.
unsafe impl Sync for Disjoint<'_> {}

impl<'a> Disjoint<'a> {
    /// The buffers, borrowed exclusively while this lives.
    pub fn new(bufs: &'a mut [&mut [f32]]) -> Disjoint<'a> {
        Disjoint {
            bufs: bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len())).collect(),
            _borrow: PhantomData,
        }
    }

    /// Buffers held.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// Whether no buffer is held.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// Elements `range` of buffer `i`, to write.
    ///
    /// # Safety
    /// No other thread reads or writes any of these elements until the next sync of the pass,
    /// and this thread holds no other reference to them.
    ///
    /// # Panics
    /// If `range` is outside the buffer.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn part(&self, i: usize, range: Range<usize>) -> &mut [f32] {
        let (p, len) = self.bufs[i];
        assert!(range.start <= range.end && range.end <= len);
        // SAFETY: inside the buffer (asserted); exclusive per the caller's contract.
        unsafe { std::slice::from_raw_parts_mut(p.add(range.start), range.len()) }
    }

    /// Buffer `i` whole, to read.
    ///
    /// # Safety
    /// No thread writes any of it while the returned slice lives (a sync separates this read
    /// from the writes before it and the writes after it).
    pub unsafe fn read(&self, i: usize) -> &[f32] {
        let (p, len) = self.bufs[i];
        // SAFETY: the whole buffer; nobody writes it meanwhile per the caller's contract.
        unsafe { std::slice::from_raw_parts(p, len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{pool, random_weight, Rng};
    use powerinfer_core::DType;

    #[test]
    fn shares_are_disjoint_aligned_and_cover_every_row() {
        let items = [
            (37usize, 20usize),
            (512, 144),
            (8, 4096),
            (0, 10),
            (1001, 18),
        ];
        for threads in [1, 2, 3, 7, 16] {
            let barrier = Barrier::new(threads);
            let mut seen: Vec<Vec<u32>> = items.iter().map(|&(r, _)| vec![0; r]).collect();
            for index in 0..threads {
                let p = Pass {
                    index,
                    threads,
                    barrier: &barrier,
                };
                p.share(&items, 8, |i, rows| {
                    assert!(rows.start.is_multiple_of(8), "{rows:?}");
                    rows.for_each(|r| seen[i][r] += 1);
                });
                let cols = p.span(1000, 16);
                assert!(cols.start.is_multiple_of(16));
            }
            assert!(seen.iter().flatten().all(|&c| c == 1), "{threads} threads");
        }
    }

    /// Pieces of an interleaved weight's rows (eight-aligned, the last one into the row-major
    /// tail) give the bits of the whole matvec, in every format with a layout.
    #[test]
    fn interleaved_rows_in_pieces_are_the_matvec_bits() {
        let mut rng = Rng::new(43);
        for (dtype, rows, cols) in [
            (DType::Q4_K, 45, 512),
            (DType::Q4_0, 27, 96),
            (DType::Q8_0, 16, 64),
            (DType::Q5_K, 19, 256),
            (DType::Q6_K, 33, 256),
        ] {
            let w = random_weight(&mut rng, dtype, rows, cols);
            let il = Interleaved::new(&w).unwrap();
            let x = rng.vec(cols);
            let mut want = vec![0f32; rows];
            crate::matvec_interleaved(&il, &x, &mut want).unwrap();
            let xp = PreparedX::new(&x, true);
            let mut got = vec![f32::NAN; rows];
            let mut at = 0;
            for len in [8, 0, 16].into_iter().chain(std::iter::repeat(8)) {
                let end = (at + len).min(rows);
                let end = if rows - end < 8 { rows } else { end };
                xp.rows_interleaved(&il, at..end, &mut got[at..end]);
                at = end;
                if at == rows {
                    break;
                }
            }
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&want), bits(&got), "{dtype} {rows} x {cols}");
        }
    }

    #[test]
    fn a_pass_computes_matvec_bits_in_steps_and_raises_panics() {
        let mut rng = Rng::new(41);
        let cols = 256 * 3;
        let ws = [
            random_weight(&mut rng, DType::Q4_K, 301, cols),
            random_weight(&mut rng, DType::F32, 45, cols),
            random_weight(&mut rng, DType::Q8_0, 130, cols),
        ];
        let x = rng.vec(cols);
        for n in [1, 2, 3] {
            let pool = pool(n);
            let mut outs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; w.rows]).collect();
            let mut doubled = vec![f32::NAN; ws[0].rows];
            pool.install(|| {
                let xp = PreparedX::new(&x, true);
                ws.iter().for_each(|w| xp.check(w).unwrap());
                let mut bufs: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                bufs.push(&mut doubled);
                let d = Disjoint::new(&mut bufs);
                let items: Vec<(usize, usize)> =
                    ws.iter().map(|w| (w.rows, w.row_bytes())).collect();
                in_pass(|p| {
                    p.share(&items, 8, |i, rows| {
                        // SAFETY: shares are disjoint; nobody reads before the sync.
                        let out = unsafe { d.part(i, rows.clone()) };
                        xp.rows(&ws[i], rows, out);
                    });
                    p.sync();
                    // A step that reads what other threads wrote.
                    let span = p.span(ws[0].rows, 1);
                    // SAFETY: buffer 0 is only read after the sync; buffer 3 written in spans.
                    let (src, dst) = unsafe { (d.read(0), d.part(3, span.clone())) };
                    dst.iter_mut()
                        .zip(&src[span])
                        .for_each(|(o, v)| *o = 2.0 * v);
                });
            });
            for (w, got) in ws.iter().zip(&outs) {
                let mut want = vec![0f32; w.rows];
                pool.install(|| crate::matvec(w, &x, &mut want)).unwrap();
                assert_eq!(&want, got, "{n} threads");
            }
            let twice: Vec<f32> = outs[0].iter().map(|v| 2.0 * v).collect();
            assert_eq!(doubled, twice);
            // A pass inside a pass runs on the calling thread alone (no deadlock).
            let inner = AtomicUsize::new(0);
            pool.install(|| {
                in_pass(|_| {
                    in_pass(|q| {
                        assert_eq!(q.threads(), 1);
                        q.sync();
                        inner.fetch_add(1, Ordering::Relaxed);
                    })
                })
            });
            assert_eq!(inner.into_inner(), n);
            let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                pool.install(|| {
                    in_pass(|p| {
                        if p.index() == p.threads() - 1 {
                            panic!("boom");
                        }
                        p.sync();
                    })
                })
            }));
            assert!(err.is_err(), "{n} threads");
        }
    }
}
