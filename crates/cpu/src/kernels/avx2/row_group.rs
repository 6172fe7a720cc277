//! Where a kernel of this ISA reads: a group of up to [`GROUP`] rows read together, each
//! anywhere in memory (the sparse kernels' scattered rows, or consecutive rows of a dense
//! matrix), with the rows its caller reads next ([`RowGroup`]), and the cache hint that fetches
//! those next rows line by line in step with the reads ([`fetch_lines`]).

use powerinfer_core::DType;
use std::arch::x86_64::*;

/// Rows accumulated together.
pub(crate) const GROUP: usize = 8;

/// Start addresses of up to [`GROUP`] rows read together (`p`), and of the rows to fetch while
/// reading them (`q`): the rows the caller reads next, each fetched line by line in step with
/// this group's reads, so the memory system always has the following rows in flight.
pub(super) struct RowGroup {
    pub(super) p: [*const u8; GROUP],
    pub(super) q: [*const u8; GROUP],
}

impl RowGroup {
    /// The group `rows`, fetching `next`. Slots without a next row repeat this group's own
    /// rows, whose lines are cached by then.
    fn scattered(rows: &[&[u8]], next: &[&[u8]]) -> RowGroup {
        let mut p = [std::ptr::null::<u8>(); GROUP];
        for (pi, r) in p.iter_mut().zip(rows) {
            *pi = r.as_ptr();
        }
        let mut q = p;
        for (qi, r) in q.iter_mut().zip(next) {
            *qi = r.as_ptr();
        }
        RowGroup { p, q }
    }

    /// Rows `first..` of the matrix at `base` (rows `row_bytes` apart), fetching rows `next..`.
    /// The addresses are only computed (past the matrix for its last group, harmless for a
    /// fetch); the kernels read as many rows as they are told.
    pub(super) fn strided(base: *const u8, row_bytes: usize, first: usize, next: usize) -> Self {
        RowGroup {
            p: std::array::from_fn(|i| base.wrapping_add((first + i) * row_bytes)),
            q: std::array::from_fn(|i| base.wrapping_add((next + i) * row_bytes)),
        }
    }

    /// The group `rows` (fetching `next`), after checking each row holds `weights` weights of
    /// `dtype` and there are `coefs` coefficients or outputs for them.
    pub(super) fn checked(
        dtype: DType,
        rows: &[&[u8]],
        next: &[&[u8]],
        weights: usize,
        coefs: usize,
    ) -> Self {
        debug_assert!(crate::simd::detect().is_x86_simd());
        let want = dtype.row_bytes(weights).unwrap_or(usize::MAX);
        assert!(rows.len() == coefs && rows.len() <= GROUP && rows.iter().all(|r| r.len() >= want));
        RowGroup::scattered(rows, next)
    }
}

/// Hint the cache to fetch the line at byte `off` of each of the first `R` rows in `q`.
#[inline(always)]
pub(super) fn fetch_lines<const R: usize>(q: &[*const u8; GROUP], off: usize) {
    for qi in q.iter().take(R) {
        // SAFETY: prefetch is a hint that never faults, whatever the address; SSE is baseline
        // on x86-64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(qi.wrapping_add(off) as *const i8) };
    }
}
