//! A Q4_0 or Q4_1 weight with its rows interleaved by [`GROUP_ROWS`] ([`Interleaved`]): the same bytes
//! rearranged so that one 32-byte load holds four quant bytes of each of eight rows, and one
//! 16-byte load the eight rows' scales of a block. A byte dot against a broadcast word of x then
//! advances eight rows at once (rows in the vector's lanes), the scales are converted once per
//! eight rows, and no row needs a horizontal sum: the layout of ik_llama.cpp's `_R8` types
//! (ikawrakow/ik_llama.cpp PRs #118–#141), written here from the GGUF block layout.
//!
//! Per group of eight rows and per 32-weight block b (eight blocks' bytes): the eight rows' f16
//! scales d (row r at 2r), for Q4_1 then their f16 mins m, then four chunks j = 0..4 of 32
//! bytes, row r's quant bytes 4j..4j + 4 at 32j + 4r (byte i holds weight i in its low nibble and
//! weight i + 16 in its high one). Rows past the last whole group stay row-major after them.

use powerinfer_core::{ensure, DType, Result, Weight};

/// Rows interleaved together.
pub const GROUP_ROWS: usize = 8;

/// A weight's rows interleaved by eight (see the module docs).
pub struct Interleaved {
    pub(crate) dtype: DType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// The groups, then the row-major tail rows.
    pub(crate) data: Vec<u8>,
}

impl Interleaved {
    /// `w` with its rows interleaved (its bytes copied once, rearranged); `Unsupported` for a
    /// format without an interleaved layout (Q4_0 and Q4_1 so far).
    pub fn new(w: &Weight) -> Result<Interleaved> {
        ensure!(
            matches!(w.dtype, DType::Q4_0 | DType::Q4_1),
            Unsupported,
            "interleaved rows: {} has no interleaved layout (Q4_0 and Q4_1 only)",
            w.dtype
        );
        crate::check::weight_bytes(w)?;
        let (rb, nb, bb) = (
            w.dtype.row_bytes(w.cols)?,
            w.cols / 32,
            w.dtype.block_bytes(),
        );
        let head = bb - 16;
        let src = w.bytes();
        let mut data = vec![0u8; src.len()];
        let groups = w.rows / GROUP_ROWS;
        for g in 0..groups {
            for b in 0..nb {
                let o = (g * nb + b) * GROUP_ROWS * bb;
                for r in 0..GROUP_ROWS {
                    let blk = &src[(g * GROUP_ROWS + r) * rb + bb * b..][..bb];
                    for (f, field) in blk[..head].chunks_exact(2).enumerate() {
                        data[o + 16 * f + 2 * r..][..2].copy_from_slice(field);
                    }
                    for j in 0..4 {
                        let at = o + 8 * head + 32 * j + 4 * r;
                        data[at..at + 4].copy_from_slice(&blk[head + 4 * j..head + 4 * j + 4]);
                    }
                }
            }
        }
        let tail = groups * GROUP_ROWS * rb;
        data[tail..].copy_from_slice(&src[tail..]);
        Ok(Interleaved {
            dtype: w.dtype,
            rows: w.rows,
            cols: w.cols,
            data,
        })
    }

    /// Rows, columns and format.
    pub fn shape(&self) -> (usize, usize, DType) {
        (self.rows, self.cols, self.dtype)
    }

    /// Whole groups of eight rows.
    pub(crate) fn groups(&self) -> usize {
        self.rows / GROUP_ROWS
    }

    /// Bytes of one group's block (eight blocks).
    pub(crate) fn group_block_bytes(&self) -> usize {
        GROUP_ROWS * self.dtype.block_bytes()
    }

    /// Bytes of one group (all its blocks).
    pub(crate) fn group_bytes(&self) -> usize {
        self.cols / 32 * self.group_block_bytes()
    }

    /// The row-major rows after the groups and their row size.
    pub(crate) fn tail(&self) -> (&[u8], usize) {
        let rb = self.cols / 32 * self.dtype.block_bytes();
        (&self.data[self.groups() * self.group_bytes()..], rb)
    }

    /// Row `r` in its GGUF bytes (gathered back from its group), for tests and references.
    pub fn row(&self, r: usize) -> Vec<u8> {
        let (nb, g, i) = (self.cols / 32, r / GROUP_ROWS, r % GROUP_ROWS);
        if g >= self.groups() {
            let (tail, rb) = self.tail();
            return tail[(r - self.groups() * GROUP_ROWS) * rb..][..rb].to_vec();
        }
        let (bb, gbb) = (self.dtype.block_bytes(), self.group_block_bytes());
        let head = bb - 16;
        let mut out = Vec::with_capacity(nb * bb);
        for b in 0..nb {
            let o = (g * nb + b) * gbb;
            for f in 0..head / 2 {
                out.extend_from_slice(&self.data[o + 16 * f + 2 * i..][..2]);
            }
            for j in 0..4 {
                let at = o + 8 * head + 32 * j + 4 * i;
                out.extend_from_slice(&self.data[at..at + 4]);
            }
        }
        out
    }
}
