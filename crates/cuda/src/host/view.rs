//! Checked views of the host backend's buffers, shared by the kernel families: the rows of a
//! matrix addressed through a [`RowLayout`] (plain matrices and hot-neuron slabs alike), the
//! output→row index list, neuron flags read through slab ids, and buffer prefixes. Rows of the
//! repacked formats are read back into GGUF's layout for the CPU's row kernels. Whatever the
//! CUDA kernel would read out of bounds is an `Error::Shape` here.

use std::borrow::Cow;

use powerinfer_core::{DType, Error, Result};

use crate::layout::{RowLayout, NEURON_ID_BYTES};
use crate::repack::{is_repacked, unpack_row};

/// A Shape error.
pub(crate) fn shape(msg: String) -> Error {
    Error::Shape(msg)
}

/// The first `n` elements of `buf`, or a Shape error naming `what`.
pub(crate) fn prefix<'a, T>(buf: &'a [T], n: usize, what: &str) -> Result<&'a [T]> {
    let len = buf.len();
    buf.get(..n)
        .ok_or_else(|| shape(format!("{what} holds {len} elements, {n} needed")))
}

/// The first `n` elements of `buf`, mutable, or a Shape error naming `what`.
pub(crate) fn prefix_mut<'a, T>(buf: &'a mut [T], n: usize, what: &str) -> Result<&'a mut [T]> {
    let len = buf.len();
    buf.get_mut(..n)
        .ok_or_else(|| shape(format!("{what} holds {len} elements, {n} needed")))
}

/// `a · b`, or a Shape error when it overflows.
pub(crate) fn product(a: usize, b: usize, what: &str) -> Result<usize> {
    a.checked_mul(b)
        .ok_or_else(|| shape(format!("{what} = {a} × {b} overflows")))
}

/// An `i32` index or id as a position in a buffer of `len`, or a Shape error.
pub(crate) fn index(v: i32, len: usize, what: &str) -> Result<usize> {
    usize::try_from(v)
        .ok()
        .filter(|&i| i < len)
        .ok_or_else(|| shape(format!("{what} {v} out of range 0..{len}")))
}

/// The rows of one matrix inside a byte buffer: row `r` is `bytes` bytes at
/// `layout.byte_offset(r)` (`row_ptr` in common.cuh), holding `cols` weights of `dtype`.
pub(crate) struct Rows<'a> {
    buf: &'a [u8],
    l: RowLayout,
    pub(crate) dtype: DType,
    pub(crate) cols: usize,
    bytes: usize,
    what: &'static str,
}

impl<'a> Rows<'a> {
    /// The rows of a `dtype` matrix of `cols` columns laid out by `l` in `buf`.
    pub(crate) fn new(
        buf: &'a [u8],
        l: RowLayout,
        dtype: DType,
        cols: usize,
        what: &'static str,
    ) -> Result<Rows<'a>> {
        let bytes = dtype.row_bytes(cols)?;
        Rows::with_bytes(buf, l, dtype, cols, bytes, what)
    }

    /// The i32 neuron ids of a slab layout (4-byte rows).
    pub(crate) fn ids(buf: &'a [u8], l: RowLayout) -> Result<Rows<'a>> {
        Rows::with_bytes(buf, l, DType::F32, 1, NEURON_ID_BYTES, "ids")
    }

    fn with_bytes(
        buf: &'a [u8],
        l: RowLayout,
        dtype: DType,
        cols: usize,
        bytes: usize,
        what: &'static str,
    ) -> Result<Rows<'a>> {
        if l.group_rows <= 0 || l.row_bytes < 0 || l.offset < 0 || l.group_stride < 0 {
            return Err(shape(format!("{what}: invalid row layout {l:?}")));
        }
        Ok(Rows {
            buf,
            l,
            dtype,
            cols,
            bytes,
            what,
        })
    }

    /// The bytes of row `r`.
    pub(crate) fn get(&self, r: usize) -> Result<&'a [u8]> {
        let l = &self.l;
        let group_rows = l.group_rows as usize; // > 0, checked in `new`
        if l.group_stride == 0 && r >= group_rows {
            // One group (a plain matrix): rows past it would alias its first rows.
            return Err(shape(format!(
                "{} row {r} out of range 0..{group_rows}",
                self.what
            )));
        }
        let g = l.group_of(r); // as the kernels find it, without a division
        let i = r - g * group_rows;
        let start = g
            .checked_mul(l.group_stride as usize)
            .and_then(|s| s.checked_add(l.offset as usize))
            .and_then(|s| s.checked_add(i.checked_mul(l.row_bytes as usize)?));
        start
            .and_then(|s| self.buf.get(s..s.checked_add(self.bytes)?))
            .ok_or_else(|| {
                let at = start.map_or("an overflowing offset".into(), |s| format!("byte {s}"));
                shape(format!(
                    "{} row {r} ({} bytes at {at}) lies outside its buffer of {} bytes",
                    self.what,
                    self.bytes,
                    self.buf.len()
                ))
            })
    }

    /// Row `r` in GGUF's layout (rows of the repacked formats are unpacked, [`crate::repack`]).
    fn gguf_row(&self, r: usize) -> Result<Cow<'a, [u8]>> {
        let row = self.get(r)?;
        if !is_repacked(self.dtype) {
            return Ok(Cow::Borrowed(row));
        }
        let mut out = vec![0u8; row.len()];
        unpack_row(self.dtype, row, &mut out);
        Ok(Cow::Owned(out))
    }

    /// `dot(row r, x)` with `x` of `cols` values (the CPU's row kernel, f32 accumulation).
    pub(crate) fn dot(&self, r: usize, x: &[f32]) -> Result<f32> {
        debug_assert_eq!(x.len(), self.cols);
        Ok(powerinfer_cpu::dot_row(self.dtype, &self.gguf_row(r)?, x))
    }

    /// Row `r` decoded into `out` (`cols` values).
    pub(crate) fn decode(&self, r: usize, out: &mut [f32]) -> Result<()> {
        powerinfer_cpu::dequantize_row(self.dtype, &self.gguf_row(r)?, out)
    }

    /// The little-endian i32 of row `r` (a neuron id).
    pub(crate) fn id(&self, r: usize) -> Result<i32> {
        let b = self.get(r)?;
        Ok(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Which matrix row each output `k in 0..n` reads: `idx[k]`, or `k` without a list.
pub(crate) struct Picks<'a> {
    idx: Option<&'a [i32]>,
    /// Outputs.
    pub(crate) n: usize,
}

impl<'a> Picks<'a> {
    /// The rows of `n` outputs; the list must hold at least `n` indices.
    pub(crate) fn new(idx: Option<&'a [i32]>, n: usize) -> Result<Picks<'a>> {
        let idx = idx.map(|i| prefix(i, n, "idx")).transpose()?;
        Ok(Picks { idx, n })
    }

    /// The matrix row of output `k` (a negative index is a Shape error).
    pub(crate) fn row(&self, k: usize) -> Result<usize> {
        match self.idx {
            None => Ok(k),
            Some(idx) => usize::try_from(idx[k])
                .map_err(|_| shape(format!("idx[{k}] = {} is negative", idx[k]))),
        }
    }
}

/// Neuron flags (one i32 per FFN neuron, nonzero = active) read through the neuron ids of the
/// rows (`row_active` in sparse_matvec.cu).
pub(crate) struct Active<'a> {
    ids: Rows<'a>,
    flags: &'a [i32],
}

impl<'a> Active<'a> {
    /// Flags `flags`, ids at `ids_l` in `ids_buf`.
    pub(crate) fn new(ids_buf: &'a [u8], ids_l: RowLayout, flags: &'a [i32]) -> Result<Active<'a>> {
        Ok(Active {
            ids: Rows::ids(ids_buf, ids_l)?,
            flags,
        })
    }

    /// Whether matrix row `r` is to be computed: its id is not padding (< 0) and its flag is
    /// set. An id past the flags is a Shape error.
    pub(crate) fn is_active(&self, r: usize) -> Result<bool> {
        let id = self.ids.id(r)?;
        if id < 0 {
            return Ok(false);
        }
        Ok(self.flags[index(id, self.flags.len(), "neuron id")?] != 0)
    }
}

/// What the gate/up pass reads through a row's neuron id (`gate_up` in sparse_matvec.cu): the
/// flags (an inactive neuron yields 0 unread) and the gate bias (one value per FFN neuron,
/// added to the gate's dot). A padding slot (id < 0) yields 0 when either is given; with
/// neither, no id is read.
pub(crate) struct Neurons<'a> {
    ids: Rows<'a>,
    flags: Option<&'a [i32]>,
    bias: Option<&'a [f32]>,
    up_bias: Option<&'a [f32]>,
}

impl<'a> Neurons<'a> {
    /// Ids at `ids_l` in `ids_buf`, with the optional flags and gate and up biases.
    pub(crate) fn new(
        ids_buf: &'a [u8],
        ids_l: RowLayout,
        flags: Option<&'a [i32]>,
        [bias, up_bias]: [Option<&'a [f32]>; 2],
    ) -> Result<Neurons<'a>> {
        Ok(Neurons {
            ids: Rows::ids(ids_buf, ids_l)?,
            flags,
            bias,
            up_bias,
        })
    }

    /// The up bias of matrix row `r` (0 without one; a padding row's is 0). An id past the
    /// bias is a Shape error.
    pub(crate) fn up_bias(&self, r: usize) -> Result<f32> {
        let Some(b) = self.up_bias else {
            return Ok(0.0);
        };
        match self.ids.id(r)? {
            id if id < 0 => Ok(0.0),
            id => Ok(b[index(id, b.len(), "neuron id (up bias)")?]),
        }
    }

    /// The gate bias of matrix row `r` (0 without one), or None when the row yields 0 unread
    /// (padding, or an inactive neuron). An id past the flags or the bias is a Shape error.
    pub(crate) fn gate_bias(&self, r: usize) -> Result<Option<f32>> {
        if self.flags.is_none() && self.bias.is_none() {
            return Ok(Some(0.0));
        }
        let id = self.ids.id(r)?;
        if id < 0 {
            return Ok(None);
        }
        if let Some(f) = self.flags {
            if f[index(id, f.len(), "neuron id")?] == 0 {
                return Ok(None);
            }
        }
        self.bias
            .map_or(Ok(0.0), |b| Ok(b[index(id, b.len(), "neuron id (bias)")?]))
            .map(Some)
    }
}

/// `n`, or with a count buffer (written by a compaction) min(count[0], n); a negative count
/// is 0.
pub(crate) fn counted(count: Option<&[i32]>, n: usize) -> Result<usize> {
    let Some(c) = count else {
        return Ok(n);
    };
    let c = prefix(c, 1, "count")?[0];
    Ok(usize::try_from(c).unwrap_or(0).min(n))
}

/// A compaction's count into its one-int buffer.
pub(crate) fn write_count(count: &mut [i32], kept: usize) -> Result<()> {
    let c = prefix_mut(count, 1, "count")?;
    c[0] = i32::try_from(kept).map_err(|_| Error::Shape(format!("{kept} entries")))?;
    Ok(())
}
