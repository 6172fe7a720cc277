//! Routes each kernel to the implementation of a SIMD [`Level`]: the only place that looks at
//! the level. The ops pass the level chosen once by [`crate::simd::level`], tests pass every
//! level the CPU has.

#[cfg(target_arch = "x86_64")]
use crate::kernels::avx2;
use crate::kernels::kv_blocks;
use crate::kernels::scalar;
use crate::numerics::{int8_always, numerics, Numerics};
use crate::operands::attention::{Head, KvHead, KvScratch, ScoreBlock, ValueBlock};
use crate::simd::Level;
use powerinfer_core::DType;

/// `$avx2` on the AVX2 level (x86-64 only), `$scalar` on the portable one.
macro_rules! by_level {
    ($level:expr, avx2 => $avx2:expr, scalar => $scalar:expr $(,)?) => {
        match $level {
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 | Level::Avx512 => $avx2,
            Level::Scalar => $scalar,
        }
    };
}

/// Whether `level` takes the 512-bit form of a kernel where it has one (the AVX-512 level).
#[cfg(target_arch = "x86_64")]
#[inline]
fn wide(level: Level) -> bool {
    level == Level::Avx512
}

/// Rows handed to one group kernel call (y is read and written once per group).
#[cfg(target_arch = "x86_64")]
pub(crate) const GROUP: usize = avx2::GROUP;
/// Rows handed to one group kernel call (y is read and written once per group).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const GROUP: usize = 8;

/// out[i] = dot(row i, x) over consecutive rows of `row_bytes` bytes.
pub(crate) fn rows_dot(
    level: Level,
    dtype: DType,
    rows: &[u8],
    row_bytes: usize,
    x: &[f32],
    out: &mut [f32],
) {
    debug_assert_eq!(rows.len(), out.len() * row_bytes);
    by_level!(level,
        avx2 => avx2::rows_dot(dtype, rows, row_bytes, x, out, wide(level)),
        scalar => scalar::rows_dot(dtype, rows, row_bytes, x, out),
    )
}

/// Dequantise one row (sizes already checked).
pub(crate) fn dequantize_row(level: Level, dtype: DType, row: &[u8], out: &mut [f32]) {
    by_level!(level,
        avx2 => avx2::dequantize_row(dtype, row, out),
        scalar => scalar::dequantize_row(dtype, row, out),
    )
}

/// Matmul tile: out[t·r + i] = dot(w row i, x token t) for the `r` f32 rows in `w`.
pub(crate) fn tile_dot(level: Level, w: &[f32], cols: usize, x: &[f32], out: &mut [f32]) {
    by_level!(level,
        avx2 => avx2::tile_dot(w, cols, x, out, wide(level)),
        scalar => scalar::tile_dot(w, cols, x, out),
    )
}

/// y += Σ_i a[i] · rows[i], each row holding `y.len()` weights of `dtype` (sizes checked by the
/// caller); `rows.len() <= GROUP`. `next` (at most GROUP rows, read next by the caller) is
/// fetched into the cache alongside, where the level can.
pub(crate) fn axpy_group(
    level: Level,
    dtype: DType,
    rows: &[&[u8]],
    next: &[&[u8]],
    a: &[f32],
    y: &mut [f32],
) {
    debug_assert!(rows.len() == a.len() && rows.len() <= GROUP && next.len() <= GROUP);
    by_level!(level,
        avx2 => avx2::axpy_group(dtype, rows, next, a, y, wide(level)),
        scalar => scalar::axpy_group(dtype, rows, a, y),
    )
}

/// Tokens of a matmul quantized for the integer tile of one weight format (see
/// `kernels::avx2::int_tile`): taken on the AVX-512 level for every quantized format.
pub(crate) struct TileTokens {
    #[cfg(target_arch = "x86_64")]
    x: avx2::XTile,
}

/// Weight rows per integer tile: the row ranges given to [`TileTokens::rows_times_tokens`]
/// are best multiples of it.
#[cfg(target_arch = "x86_64")]
pub(crate) const INT_TILE_ROWS: usize = avx2::INT_TILE_ROWS;
/// Weight rows per integer tile (no integer tile on this architecture).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) const INT_TILE_ROWS: usize = 8;

/// Whether quantized matmuls take the integer tile on the AVX-512 level; `false` makes them
/// dequantize to f32 tiles as the other levels do.
const INT_TILE: bool = true;

impl TileTokens {
    /// `n` tokens of `cols` values prepared for rows of `dtype`, where `level` takes the integer
    /// tile for `dtype` (and x is finite); `None` otherwise.
    #[allow(unused_variables)]
    pub(crate) fn new(
        level: Level,
        dtype: DType,
        x: &[f32],
        n: usize,
        cols: usize,
    ) -> Option<TileTokens> {
        #[cfg(target_arch = "x86_64")]
        if INT_TILE && level == Level::Avx512 && dtype.is_quantized() {
            return avx2::XTile::new(dtype, x, n, cols).map(|x| TileTokens { x });
        }
        None
    }

    /// Whether one token's `x` takes the integer tile for rows of `dtype` on `level` (see
    /// `kernels::avx2::int_tile::token_fits`); always false where there is no integer tile.
    #[allow(unused_variables)]
    pub(crate) fn fits(level: Level, dtype: DType, x: &[f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        if INT_TILE && level == Level::Avx512 && dtype.is_quantized() {
            return avx2::int_tile_fits(dtype, x);
        }
        false
    }

    /// out[t·count + i] = dot(row i, x token t) for `count` rows starting at `rows`,
    /// `row_bytes` apart (rows of the format the tokens were prepared for).
    #[allow(unused_variables)]
    pub(crate) fn rows_times_tokens(
        &self,
        rows: &[u8],
        row_bytes: usize,
        count: usize,
        out: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        avx2::int_tile_rows(rows, row_bytes, count, &self.x, out);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("no integer tile on this architecture");
    }
}

/// `$wide` on the AVX-512 level (x86-64 only), `$scalar` on every other: for kernels with no
/// AVX2 form.
macro_rules! wide_or_scalar {
    ($level:expr, wide => $wide:expr, scalar => $scalar:expr $(,)?) => {
        match $level {
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => $wide,
            _ => $scalar,
        }
    };
}

/// Scores of a query sub-block (see `crate::ops::attend_block`).
pub(crate) fn block_scores(level: Level, sb: &ScoreBlock<'_>, s: &mut [f32]) {
    wide_or_scalar!(level,
        wide => avx2::block_scores(sb, s),
        scalar => scalar::block_scores(sb, s),
    )
}

/// The masked softmax of one score row; returns its sum.
pub(crate) fn block_softmax_row(level: Level, row: &mut [f32], lo: usize, hi: usize) -> f32 {
    wide_or_scalar!(level,
        wide => avx2::block_softmax_row(row, lo, hi),
        scalar => scalar::block_softmax_row(row, lo, hi),
    )
}

/// Weighted value sums of a query sub-block.
pub(crate) fn block_values(level: Level, vb: &ValueBlock<'_>, out: &mut [f32], out_stride: usize) {
    wide_or_scalar!(level,
        wide => avx2::block_values(vb, out, out_stride),
        scalar => scalar::block_values(vb, out, out_stride),
    )
}

/// One attention head (sizes checked by [`Head::check`]).
pub(crate) fn attend_head(level: Level, head: &Head<'_>, scores: &mut Vec<f32>, out: &mut [f32]) {
    by_level!(level,
        avx2 => avx2::attend_head(head, scores, out),
        scalar => scalar::attend_head(head, scores, out),
    )
}

/// One head over a cache with block-format keys or values (sizes checked by the op).
pub(crate) fn attend_head_kv(
    level: Level,
    head: &KvHead<'_>,
    scratch: &mut KvScratch,
    out: &mut [f32],
) {
    by_level!(level,
        avx2 => avx2::attend_head_kv(head, scratch, out),
        scalar => kv_blocks::attend_head_kv_portable(head, scratch, out),
    )
}

/// Wrapping sum of every word of `data` (the bandwidth probe's read).
pub(crate) fn read_sum(level: Level, data: &[u64]) -> u64 {
    by_level!(level,
        avx2 => avx2::read_sum(data),
        scalar => scalar::read_sum(data),
    )
}

/// One x prepared for dot products with weight rows on a level: on the x86 levels, quantized
/// rows take the quantized-x kernels of the process's [`Numerics`] (int16 x, or int8 x of
/// `kernels::avx2::int8_rows`), x quantized once (when it is finite and whole 32-blocks) and
/// shared by every product that reads it; other rows are dotted with x itself. The low-bit
/// formats and the fused IQ3/IQ1 lattice ones ([`int8_always`]) take the int8 x whatever the
/// numerics, quantized on their first product; the formats of the int8 x per 256
/// (`kernels::avx2::takes_x8k`: the 2-bit lattice i-quants) take that one whatever the
/// numerics, quantized on their first product too.
pub(crate) struct Activations<'a> {
    level: Level,
    x: &'a [f32],
    #[cfg(target_arch = "x86_64")]
    xq: Option<avx2::XQuant>,
    #[cfg(target_arch = "x86_64")]
    x8: Option<avx2::X8>,
    /// The int8 x of [`int8_always`] formats' products where the numerics made none (`None`
    /// inside where x is not finite or not whole 32-blocks, or the level is not x86).
    #[cfg(target_arch = "x86_64")]
    x8_lowbit: std::sync::OnceLock<Option<avx2::X8>>,
    /// The int8 x per 256 of the formats that take it (`None` inside where x is not finite
    /// or not whole 256-blocks, or the level is not x86).
    #[cfg(target_arch = "x86_64")]
    x8k: std::sync::OnceLock<Option<avx2::X8K>>,
}

impl<'a> Activations<'a> {
    /// `x` prepared for rows of some formats (`quantized`: whether any of them is quantized).
    pub(crate) fn new(level: Level, x: &'a [f32], quantized: bool) -> Activations<'a> {
        Self::with_numerics(level, numerics(), x, quantized)
    }

    /// As [`Activations::new`], with the given numerics.
    pub(crate) fn with_numerics(
        level: Level,
        numerics: Numerics,
        x: &'a [f32],
        quantized: bool,
    ) -> Activations<'a> {
        let whole = quantized && x.len().is_multiple_of(32);
        let (int16, int8) = match numerics {
            Numerics::Int16 => (whole, false),
            Numerics::Int8 => (false, whole),
        };
        Activations {
            level,
            x,
            #[cfg(target_arch = "x86_64")]
            xq: by_level!(level,
                avx2 => int16.then(|| avx2::XQuant::new(x)).flatten(),
                scalar => None,
            ),
            #[cfg(target_arch = "x86_64")]
            x8: by_level!(level,
                avx2 => int8.then(|| avx2::X8::new(x)).flatten(),
                scalar => None,
            ),
            #[cfg(target_arch = "x86_64")]
            x8_lowbit: std::sync::OnceLock::new(),
            #[cfg(target_arch = "x86_64")]
            x8k: std::sync::OnceLock::new(),
        }
    }

    /// Whether the 512-bit kernels run (the AVX-512 level).
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn wide(&self) -> bool {
        wide(self.level)
    }

    /// The int16 x, where quantized rows of `dtype` take the int16-x kernel.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn int16(&self, dtype: DType) -> Option<&avx2::XQuant> {
        self.xq
            .as_ref()
            .filter(|_| dtype.is_quantized() && !dtype.is_lowbit())
    }

    /// The int8 x, where quantized rows of `dtype` take the int8-x kernels.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn int8(&self, dtype: DType) -> Option<&avx2::X8> {
        if !dtype.is_quantized() {
            return None;
        }
        if self.x8.is_some() || !int8_always(dtype) {
            return self.x8.as_ref();
        }
        let whole = self.level.is_x86_simd() && self.x.len().is_multiple_of(32);
        self.x8_lowbit
            .get_or_init(|| whole.then(|| avx2::X8::new(self.x)).flatten())
            .as_ref()
    }

    /// The int8 x per 256, where rows of `dtype` take it.
    #[cfg(target_arch = "x86_64")]
    #[inline]
    fn int8k(&self, dtype: DType) -> Option<&avx2::X8K> {
        if !self.level.is_x86_simd() || !avx2::takes_x8k(dtype) {
            return None;
        }
        let whole = self.x.len().is_multiple_of(256);
        self.x8k
            .get_or_init(|| whole.then(|| avx2::X8K::new(self.x)).flatten())
            .as_ref()
    }

    /// out[i] = dot(row i, x) over consecutive rows of `row_bytes` bytes.
    pub(crate) fn rows_dot(&self, dtype: DType, rows: &[u8], row_bytes: usize, out: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if let Some(x8k) = self.int8k(dtype) {
            return avx2::rows_dot_x8k(dtype, rows, row_bytes, &[x8k], &mut [out]);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(x8) = self.int8(dtype) {
            return avx2::rows_dot_x8(dtype, rows, row_bytes, &[x8], &mut [out], self.wide());
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(xq) = self.int16(dtype) {
            return avx2::rows_dot_i16(dtype, rows, row_bytes, xq, out, self.wide());
        }
        rows_dot(self.level, dtype, rows, row_bytes, self.x, out)
    }

    /// out[i] = dot(rows[i], x) for up to [`GROUP`] scattered rows of `dtype`, fetching the
    /// `next` rows into the cache alongside where the level can.
    #[inline]
    pub(crate) fn group_dot(&self, dtype: DType, rows: &[&[u8]], next: &[&[u8]], out: &mut [f32]) {
        debug_assert!(rows.len() == out.len() && rows.len() <= GROUP && next.len() <= GROUP);
        #[cfg(target_arch = "x86_64")]
        if let Some(x8k) = self.int8k(dtype) {
            return avx2::scattered_dot_x8k(dtype, rows, next, x8k, out);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(x8) = self.int8(dtype) {
            return avx2::scattered_dot_x8(dtype, rows, next, x8, out, self.wide());
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(xq) = self.int16(dtype) {
            return avx2::scattered_dot_i16(dtype, rows, next, xq, out, self.wide());
        }
        by_level!(self.level,
            avx2 => avx2::dot_group(dtype, rows, next, self.x, out, self.wide()),
            scalar => scalar::dot_group(dtype, rows, self.x, out),
        )
    }
}

impl Activations<'_> {
    /// out[k·8 + i] = dot(row i of group `g0 + k`, x) for the groups `g0..g0 + out.len() / 8`
    /// of an interleaved weight (`crate::operands::interleaved`); where the level has no
    /// quantized x (the scalar level, a non-finite x) each group's rows are gathered back and
    /// dotted one by one.
    pub(crate) fn interleaved_groups(
        &self,
        w: &crate::operands::interleaved::Interleaved,
        g0: usize,
        out: &mut [f32],
    ) {
        use crate::operands::interleaved::GROUP_ROWS;
        assert!(out.len().is_multiple_of(GROUP_ROWS) && g0 + out.len() / GROUP_ROWS <= w.groups());
        #[cfg(target_arch = "x86_64")]
        {
            use avx2::interleaved::{kernel_i16, kernel_i8, Starts};
            if let Some((x8, kernel)) = self.int8(w.dtype).zip(kernel_i8::<1>(w.dtype, self.wide()))
            {
                let st = Starts::of_int8(x8);
                // SAFETY: the assert keeps every group given inside the weight (nb blocks of
                // eight rows); x holds nb blocks (the weight's columns); the level's features
                // were detected (VNNI where wide).
                return unsafe { groups_of_tokens(w, g0, &mut [out], kernel, [x8], [&st]) };
            }
            if let Some((xq, kernel)) = self
                .int16(w.dtype)
                .zip(kernel_i16::<1>(w.dtype, self.wide()))
            {
                let st = Starts::of_int16(xq);
                // SAFETY: as above, for the int16 x.
                return unsafe { groups_of_tokens(w, g0, &mut [out], kernel, [xq], [&st]) };
            }
        }
        let rb = w.dtype.row_bytes(w.cols).unwrap_or(0);
        for (i, o) in out.iter_mut().enumerate() {
            let row = w.row(g0 * GROUP_ROWS + i);
            rows_dot(
                self.level,
                w.dtype,
                &row,
                rb,
                self.x,
                std::slice::from_mut(o),
            );
        }
    }
}

/// Several tokens' x prepared for dot products with the same weight rows (speculative
/// verification): each token's [`Activations`]; on the AVX-512 level the split-byte formats
/// take the several-token kernel (`kernels::avx2::split8_tokens`), which unpacks each block's
/// quants once for all the tokens. Every token's dots are bit-identical to its own
/// [`Activations::rows_dot`].
pub(crate) struct Tokens<'a> {
    acts: Vec<Activations<'a>>,
    /// Every token's int16 x in the several-token kernel's lane order, where every token has
    /// its int16 x and the level the kernel (else empty).
    #[cfg(target_arch = "x86_64")]
    lanes: Vec<avx2::XLanes>,
}

/// Take the several-token kernel where it exists; `false` dots every token on its own.
const TOKENS_TOGETHER: bool = true;

impl<'a> Tokens<'a> {
    /// The tokens of `x` (rows of `cols` values) prepared for rows of some formats
    /// (`quantized`: whether any of them is quantized).
    pub(crate) fn new(level: Level, x: &'a [f32], cols: usize, quantized: bool) -> Tokens<'a> {
        Self::new_with(level, numerics(), x, cols, quantized)
    }

    /// As [`Tokens::new`], with the given numerics.
    pub(crate) fn new_with(
        level: Level,
        numerics: Numerics,
        x: &'a [f32],
        cols: usize,
        quantized: bool,
    ) -> Tokens<'a> {
        let acts: Vec<Activations<'a>> = x
            .chunks_exact(cols.max(1))
            .map(|t| Activations::with_numerics(level, numerics, t, quantized))
            .collect();
        #[cfg(target_arch = "x86_64")]
        let lanes = match TOKENS_TOGETHER && wide(level) && acts.len() > 1 {
            true => acts
                .iter()
                .map(|a| a.xq.as_ref().map(avx2::XLanes::new))
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default(),
            false => Vec::new(),
        };
        Tokens {
            acts,
            #[cfg(target_arch = "x86_64")]
            lanes,
        }
    }

    /// `outs[t][i]` = dot(row i, token t) over consecutive rows of `row_bytes` bytes
    /// (`outs[t].len()` of them).
    pub(crate) fn rows_dot(
        &self,
        dtype: DType,
        rows: &[u8],
        row_bytes: usize,
        outs: &mut [&mut [f32]],
    ) {
        debug_assert_eq!(outs.len(), self.acts.len());
        #[cfg(target_arch = "x86_64")]
        if let Some(xs) = self
            .acts
            .iter()
            .map(|a| a.int8k(dtype))
            .collect::<Option<Vec<_>>>()
        {
            // Every token at once, each row's block decoded once for them all.
            return avx2::rows_dot_x8k(dtype, rows, row_bytes, &xs, outs);
        }
        #[cfg(target_arch = "x86_64")]
        if let Some(xs) = self
            .acts
            .iter()
            .map(|a| a.int8(dtype))
            .collect::<Option<Vec<_>>>()
        {
            // The int8 kernel takes every token at once, each row decoded once for them all.
            let wide = self.acts.first().is_some_and(|a| a.wide());
            return avx2::rows_dot_x8(dtype, rows, row_bytes, &xs, outs, wide);
        }
        #[cfg(target_arch = "x86_64")]
        if !self.lanes.is_empty() && dtype.is_quantized() {
            let xs: Vec<&avx2::XQuant> = self.acts.iter().filter_map(|a| a.xq.as_ref()).collect();
            let lanes: Vec<&avx2::XLanes> = self.lanes.iter().collect();
            if avx2::rows_dot_tokens(dtype, rows, row_bytes, &xs, &lanes, outs) {
                return;
            }
        }
        for (a, out) in self.acts.iter().zip(outs.iter_mut()) {
            a.rows_dot(dtype, rows, row_bytes, out);
        }
    }
}

impl Tokens<'_> {
    /// `outs[t][k·8 + i]` = dot(row i of group `g0 + k`, token t) for the groups
    /// `g0..g0 + outs[t].len() / 8` of an interleaved weight: tokens in runs of up to four
    /// share each block's unpacking where all of them have their quantized x (each token's
    /// values the bits of [`Activations::interleaved_groups`] alone); else token by token.
    pub(crate) fn interleaved_groups(
        &self,
        w: &crate::operands::interleaved::Interleaved,
        g0: usize,
        outs: &mut [&mut [f32]],
    ) {
        debug_assert_eq!(outs.len(), self.acts.len());
        #[cfg(target_arch = "x86_64")]
        {
            use avx2::interleaved::{kernel_i16, kernel_i8, Starts};
            let wide = self.acts.first().is_some_and(|t| t.wide());
            // Every token's x of one kind (`$X`, from `$of`), its starts (`$starts`) and the
            // group kernel from the table `$table` for runs of up to four tokens.
            macro_rules! runs {
                ($of:ident, $X:ty, $starts:ident, $table:ident) => {
                    let xs: Option<Vec<&$X>> = self.acts.iter().map(|t| t.$of(w.dtype)).collect();
                    if let Some(xs) = xs.filter(|_| $table::<1>(w.dtype, wide).is_some()) {
                        let st: Vec<Starts> = xs.iter().map(|x| Starts::$starts(x)).collect();
                        for (c, outs) in outs.chunks_mut(4).enumerate() {
                            let (xs, st) = (&xs[4 * c..], &st[4 * c..]);
                            by_tokens!(outs.len(), T => {
                                let xt: [&$X; T] = std::array::from_fn(|i| xs[i]);
                                let stt: [&Starts; T] = std::array::from_fn(|i| &st[i]);
                                let kernel = $table::<T>(w.dtype, wide).expect("checked above");
                                // SAFETY: as in `Activations::interleaved_groups` (the sizes
                                // checked by `groups_of_tokens`), for every token of the run.
                                unsafe { groups_of_tokens(w, g0, outs, kernel, xt, stt) };
                            });
                        }
                        return;
                    }
                };
            }
            runs!(int8, avx2::X8, of_int8, kernel_i8);
            runs!(int16, avx2::XQuant, of_int16, kernel_i16);
        }
        for (t, out) in self.acts.iter().zip(outs.iter_mut()) {
            t.interleaved_groups(w, g0, out);
        }
    }
}

/// `$body` with the constant `$T` set to the token count `$n` (1..=4).
#[cfg(target_arch = "x86_64")]
macro_rules! by_tokens {
    ($n:expr, $T:ident => $body:expr) => {
        match $n {
            1 => {
                const $T: usize = 1;
                $body
            }
            2 => {
                const $T: usize = 2;
                $body
            }
            3 => {
                const $T: usize = 3;
                $body
            }
            _ => {
                const $T: usize = 4;
                $body
            }
        }
    };
}
#[cfg(target_arch = "x86_64")]
use by_tokens;

/// The rows of the groups `g0..g0 + outs[t].len() / 8` for `T` tokens by the group kernel
/// `kernel`, into `outs[t]`: batch by batch of the store's layout, each batch's groups column
/// tile by column tile (their accumulators live across the tiles), so the store is read front
/// to back while x's tile stays in the L1 (`crate::operands::interleaved`).
///
/// # Safety
/// Every `xs[t]` and `st[t]` of the weight's blocks; the CPU has what `kernel` needs.
#[cfg(target_arch = "x86_64")]
unsafe fn groups_of_tokens<X, const T: usize>(
    w: &crate::operands::interleaved::Interleaved,
    g0: usize,
    outs: &mut [&mut [f32]],
    kernel: avx2::interleaved::GroupKernel<X, T>,
    xs: [&X; T],
    st: [&avx2::interleaved::Starts; T],
) {
    use crate::operands::interleaved::{BATCH_GROUPS, GROUP_ROWS};
    use avx2::interleaved::{finish, Acc};
    let groups = outs.first().map_or(0, |o| o.len() / GROUP_ROWS);
    assert!(outs.len() == T && outs.iter().all(|o| o.len() == groups * GROUP_ROWS));
    assert!(g0 + groups <= w.groups());
    let (nb, tile, base) = (w.blocks(), w.tile_blocks(), w.data.as_ptr());
    let (mut g, end) = (g0, g0 + groups);
    while g < end {
        let n = ((g / BATCH_GROUPS + 1) * BATCH_GROUPS).min(end) - g;
        // SAFETY: all-zero bits are +0.0 in every lane.
        let mut accs: [[Acc; T]; BATCH_GROUPS] = unsafe { std::mem::zeroed() };
        for b0 in (0..nb).step_by(tile) {
            for (k, acc) in accs[..n].iter_mut().enumerate() {
                let at = base.wrapping_add(w.block_offset(g + k, b0));
                // SAFETY: group g + k is inside the weight (the asserts), its blocks
                // b0..b0 + tile follow one another from `at` in the store; the rest per the
                // caller.
                unsafe { kernel(at, (b0, (b0 + tile).min(nb)), xs, st, acc) };
            }
        }
        for (k, acc) in accs[..n].iter().enumerate() {
            let r = (g + k - g0) * GROUP_ROWS;
            for (o, a) in outs.iter_mut().zip(acc) {
                // SAFETY: the CPU has AVX2 (the kernel's level, per the caller).
                o[r..r + GROUP_ROWS].copy_from_slice(&unsafe { finish(a) });
            }
        }
        g += n;
    }
}

/// Rows `rows.0..rows.1` (whole sub-tiles) of the input-sparse matvec
/// ([`crate::ops::input_major`]): `out` = Σ over `groups` of their kept columns times their
/// inputs.
pub(crate) fn cols_tile(
    level: Level,
    m: &crate::operands::input_major::InputMajor,
    t: (usize, usize),
    a: &crate::operands::input_major::ActiveInput,
    groups: &[crate::operands::input_major::GroupInput],
    out: &mut [f32],
) {
    by_level!(level,
        avx2 => avx2::cols::cols_tile(m, t, a, groups, out),
        scalar => crate::kernels::cols::cols_tile(m, t, a, groups, out),
    )
}
