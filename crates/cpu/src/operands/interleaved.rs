//! A Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or Q6_K weight with its rows interleaved by
//! [`GROUP_ROWS`] ([`Interleaved`]): the same bytes rearranged so that one 32-byte load holds
//! four quant bytes of each of eight rows, and one 16-byte load the eight rows' scales of a
//! block. A byte dot against a broadcast word of x then advances eight rows at once (rows in
//! the vector's lanes), the scales are converted once per eight rows, and no row needs a
//! horizontal sum: the layout of ik_llama.cpp's `_R8` types (ikawrakow/ik_llama.cpp PRs
//! #118–#141), written here from the GGUF block layout.
//!
//! Per group of eight rows and per block b (of 32 weights; the K-quants' of 256; eight blocks'
//! bytes): the eight rows' f16 scales d (row r at 2r), for Q4_1 and Q5_1 then their f16 mins m
//! (Q4_K's and Q5_K's: dmin), then chunks j of 32 bytes, row r's block bytes 4j..4j + 4 after
//! its f16 fields at 32j + 4r:
//! - Q4_0, Q4_1: four chunks of quants (byte i holds weight i in its low nibble and weight
//!   i + 16 in its high one);
//! - Q8_0: eight chunks, byte i weight i;
//! - Q5_0, Q5_1: one chunk of the fifth bits, then Q4_0's four chunks of nibbles. The fifth bits
//!   are transposed within their chunk ([`fifth_bits_to_lanes`]): bit c of byte 4r + i holds the
//!   fifth bit of row r's weight 4c + i, that is of byte 4r + i of quant chunk c (c < 4: the low
//!   nibbles of chunk c; else the high nibbles of chunk c − 4), so a kernel takes a chunk's
//!   fifth bits with one shift and one mask;
//! - Q4_K: three chunks of its 12 bytes of 6-bit scales and mins, then 32 chunks of quants
//!   (quant byte 32k + i holds weight 64k + i in its low nibble and 64k + 32 + i in its high);
//! - Q5_K: Q4_K's three chunks of scale bytes, then eight of its `qh` (bit s of a byte: the
//!   fifth bit of sub-block s's weight at that byte's place in chunk j's quants), then its 32
//!   chunks of quants;
//! - Q6_K: its d first like the others' fields, then 48 chunks of its six-bit quants
//!   reassembled at load ([`six_bit_lanes`]), then four of its sixteen int8 scales. For each
//!   half n of the super-block and each chunk j of a 32-weight block, three chunks s = 0, 1, 2
//!   (chunk 3(8n + j) + s): byte i of row r's four holds weight 4j + i of block 4n + s in its
//!   low six bits and two bits of the same weight of block 4n + 3 in its top two (bits 4–5,
//!   2–3, 0–1 for s = 0, 1, 2), so a kernel takes three blocks' quants with one mask each and
//!   the fourth's with three shifts, three masks and two ors.
//!
//! The group blocks are laid out for a product that reads the matrix in column tiles of
//! [`TILE_COLS`]: groups in batches of [`BATCH_GROUPS`], and within a batch tile after tile,
//! each tile's group blocks group after group. A product walking batch, tile, group, block
//! reads the store front to back. With one tile (2048 columns or fewer) that is group after
//! group, each group's blocks in order.
//!
//! Rows past the last whole group stay row-major after them.

use powerinfer_core::{ensure, Buffer, DType, MatrixShape, PageBuf, Result, Weight};

/// Rows interleaved together.
pub const GROUP_ROWS: usize = 8;
/// Groups laid out together in column tiles (see the module docs).
pub const BATCH_GROUPS: usize = 16;
/// Columns of a tile: a product reads x's tile and each group's while x's stays in the L1.
/// Whole rows at once, a group of 8 x 5504 Q4_0 weights (24.8 KB) and the int16 x (11 KB)
/// overflowed a 32 KB L1 and x was read from the L2 on every block: 13–15 GB/s, against 25–27
/// GB/s at 2048 columns (`examples/interleaved_matvec`, one thread of an AVX-512 EPYC).
pub const TILE_COLS: usize = 2048;

/// A weight's rows interleaved by eight (see the module docs).
#[derive(Clone)]
pub struct Interleaved {
    pub(crate) dtype: DType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    /// The groups, then the row-major tail rows (64-byte aligned, on huge pages when large).
    pub(crate) data: Buffer,
}

impl Interleaved {
    /// `w` with its rows interleaved (its bytes copied once, rearranged); `Unsupported` for a
    /// format without an interleaved layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K
    /// so far).
    pub fn new(w: &Weight) -> Result<Interleaved> {
        ensure!(
            has_layout(w.dtype),
            Unsupported,
            "interleaved rows: {} has no interleaved layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K only)",
            w.dtype
        );
        crate::check::weight_bytes(w)?;
        let (rb, nb, bb) = (
            w.dtype.row_bytes(w.cols)?,
            w.cols / w.dtype.block_size(),
            w.dtype.block_bytes(),
        );
        let (f16, rest) = fields(w.dtype);
        let (nf, chunks) = (f16.len(), rest.len() / 4);
        let src = w.bytes();
        let mut store = PageBuf::try_zeroed(src.len())?;
        let data = store.as_mut_slice();
        let groups = w.rows / GROUP_ROWS;
        let tile = tile_blocks(w.dtype);
        for g in 0..groups {
            for b in 0..nb {
                let o = block_offset((groups, nb, tile, GROUP_ROWS * bb), g, b);
                for r in 0..GROUP_ROWS {
                    let blk = &src[(g * GROUP_ROWS + r) * rb + bb * b..][..bb];
                    let lanes;
                    let blk = match w.dtype {
                        DType::Q6_K => {
                            lanes = six_bit_lanes(blk);
                            &lanes[..]
                        }
                        _ => blk,
                    };
                    for (f, &at) in f16.iter().enumerate() {
                        data[o + 16 * f + 2 * r..][..2].copy_from_slice(&blk[at..at + 2]);
                    }
                    for j in 0..chunks {
                        let at = o + 16 * nf + 32 * j + 4 * r;
                        data[at..at + 4].copy_from_slice(&blk[rest.start + 4 * j..][..4]);
                    }
                }
                if has_fifth_bits(w.dtype) {
                    let c = &mut data[o + 16 * nf..][..32];
                    let t = fifth_bits_to_lanes((&*c).try_into().expect("32 bytes"));
                    c.copy_from_slice(&t);
                }
            }
        }
        let tail = groups * GROUP_ROWS * rb;
        data[tail..].copy_from_slice(&src[tail..]);
        Ok(Interleaved {
            dtype: w.dtype,
            rows: w.rows,
            cols: w.cols,
            data: store.freeze(),
        })
    }

    /// Whether `w` has an interleaved layout here (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K or
    /// Q6_K, at least one whole group).
    pub fn fits(w: &Weight) -> bool {
        Interleaved::fits_shape(w.into())
    }

    /// [`Interleaved::fits`] of a format and shape.
    pub fn fits_shape(s: MatrixShape) -> bool {
        has_layout(s.dtype) && s.rows >= GROUP_ROWS && s.cols.is_multiple_of(32)
    }

    /// Whether a product of `s` reads it faster interleaved than in rows: [`Self::fits_shape`]
    /// and not Q6_K, whose six-bit quants cost more to unpack in lanes than the row kernel
    /// spends (`examples/interleaved_matvec`, 2 threads, AVX2, 2026-12-08: 2048 x 5504 rows
    /// 14.5 GB/s against 11.8 interleaved, 32000 x 1024 11.6 against 10.2; int8 x 11.8
    /// against 10.6).
    pub fn pays(s: MatrixShape) -> bool {
        Interleaved::fits_shape(s) && s.dtype != DType::Q6_K
    }

    /// Bytes of the interleaved store (the same as the row-major weight's).
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }

    /// Address of the first byte of the store.
    pub fn as_ptr(&self) -> *const u8 {
        self.data.as_ptr()
    }

    /// Rows, columns and format.
    pub fn shape(&self) -> (usize, usize, DType) {
        (self.rows, self.cols, self.dtype)
    }

    /// Blocks per row (of 32 weights; of 256 for the K-quants).
    pub(crate) fn blocks(&self) -> usize {
        self.cols / self.dtype.block_size()
    }

    /// Blocks per column tile.
    pub(crate) fn tile_blocks(&self) -> usize {
        tile_blocks(self.dtype)
    }

    /// Where block `b` of group `g` starts in the store.
    pub(crate) fn block_offset(&self, g: usize, b: usize) -> usize {
        let shape = (
            self.groups(),
            self.blocks(),
            self.tile_blocks(),
            self.group_block_bytes(),
        );
        block_offset(shape, g, b)
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
        self.blocks() * self.group_block_bytes()
    }

    /// The row-major rows after the groups and their row size.
    pub(crate) fn tail(&self) -> (&[u8], usize) {
        let rb = self.blocks() * self.dtype.block_bytes();
        (
            &self.data.as_slice()[self.groups() * self.group_bytes()..],
            rb,
        )
    }

    /// Row `r` in its GGUF bytes (gathered back from its group).
    pub fn row(&self, r: usize) -> Vec<u8> {
        let mut out = vec![0u8; self.blocks() * self.dtype.block_bytes()];
        self.rows_into(r..r + 1, &mut out);
        out
    }

    /// Rows `range` in their GGUF bytes, row after row, into `out` (range.len() rows' bytes):
    /// the row-major view that batched products and uploads read.
    pub fn rows_into(&self, range: std::ops::Range<usize>, out: &mut [u8]) {
        let (nb, bb) = (self.blocks(), self.dtype.block_bytes());
        let rb = nb * bb;
        assert!(range.end <= self.rows && out.len() == range.len() * rb);
        let (data, (f16, rest)) = (self.data.as_slice(), fields(self.dtype));
        let (nf, chunks) = (f16.len(), rest.len() / 4);
        let grouped = self.groups() * GROUP_ROWS;
        let gbb = self.group_block_bytes();
        for (r, row) in range.zip(out.chunks_exact_mut(rb)) {
            if r >= grouped {
                let (tail, _) = self.tail();
                row.copy_from_slice(&tail[(r - grouped) * rb..][..rb]);
                continue;
            }
            let (g, i) = (r / GROUP_ROWS, r % GROUP_ROWS);
            for (b, blk) in row.chunks_exact_mut(bb).enumerate() {
                let o = block_offset((self.groups(), nb, self.tile_blocks(), gbb), g, b);
                for (f, &at) in f16.iter().enumerate() {
                    blk[at..at + 2].copy_from_slice(&data[o + 16 * f + 2 * i..][..2]);
                }
                for j in 0..chunks {
                    let at = o + 16 * nf + 32 * j + 4 * i;
                    blk[rest.start + 4 * j..][..4].copy_from_slice(&data[at..at + 4]);
                }
                if has_fifth_bits(self.dtype) {
                    let c = &data[o + 16 * nf..][..32];
                    let bits = fifth_bits_from_lanes(c.try_into().expect("32 bytes"));
                    blk[rest.start..][..4].copy_from_slice(&bits[4 * i..4 * i + 4]);
                }
                if self.dtype == DType::Q6_K {
                    let natural = six_bit_lanes_back(blk);
                    blk.copy_from_slice(&natural);
                }
            }
        }
    }

    /// The whole matrix back in its GGUF layout, as a [`Weight`] of its own (a copy): for the
    /// readers that need rows by index (GPU upload, the input mode's copies).
    pub fn to_weight(&self) -> Result<Weight> {
        let mut store = PageBuf::try_zeroed(self.data.len())?;
        self.rows_into(0..self.rows, store.as_mut_slice());
        Weight::new(self.dtype, self.rows, self.cols, store.freeze())
    }
}

/// Blocks of `dtype` per column tile.
fn tile_blocks(dtype: DType) -> usize {
    (TILE_COLS / dtype.block_size()).max(1)
}

/// Where block `b` of group `g` starts, of `groups` groups of `nb` blocks in tiles of `tile`,
/// `gbb` bytes a group block (the module docs' layout).
fn block_offset(
    (groups, nb, tile, gbb): (usize, usize, usize, usize),
    g: usize,
    b: usize,
) -> usize {
    let first = g / BATCH_GROUPS * BATCH_GROUPS;
    let n = BATCH_GROUPS.min(groups - first);
    let t = b / tile;
    let len = tile.min(nb - t * tile);
    (first * nb + n * t * tile + (g - first) * len + (b - t * tile)) * gbb
}

/// Whether `dtype` has an interleaved layout.
fn has_layout(dtype: DType) -> bool {
    matches!(
        dtype,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// A Q6_K block's bytes with its `ql` and `qh` (bytes 0..192) reassembled as the layout's
/// chunks of six-bit quants (see the module docs), its scales and d where they were.
fn six_bit_lanes(blk: &[u8]) -> Vec<u8> {
    let mut quant = [0u8; 256];
    for (w, q) in quant.iter_mut().enumerate() {
        let (n, k, l) = (w / 128, w % 128 / 32, w % 32);
        let low = (blk[64 * n + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
        let high = (blk[128 + 32 * n + l] >> (2 * k)) & 3;
        *q = low | high << 4;
    }
    let mut out = blk.to_vec();
    for (c, chunk) in out[..192].chunks_exact_mut(4).enumerate() {
        let (n, j, s) = (c / 24, c % 24 / 3, c % 3);
        for (i, byte) in chunk.iter_mut().enumerate() {
            let l = 128 * n + 4 * j + i;
            let top = quant[l + 96] >> (4 - 2 * s) & 3;
            *byte = quant[l + 32 * s] | top << 6;
        }
    }
    out
}

/// The inverse of [`six_bit_lanes`]: the block's `ql` and `qh` back from its chunks.
fn six_bit_lanes_back(lanes: &[u8]) -> Vec<u8> {
    let mut out = lanes.to_vec();
    out[..192].fill(0);
    for (c, chunk) in lanes[..192].chunks_exact(4).enumerate() {
        let (n, j, s) = (c / 24, c % 24 / 3, c % 3);
        for (i, &byte) in chunk.iter().enumerate() {
            let l = 4 * j + i;
            for (k, q) in [(s, byte & 0x3F), (3, (byte >> 6) << (4 - 2 * s))] {
                out[64 * n + 32 * (k % 2) + l] |= (q & 0x0F) << (4 * (k / 2));
                out[128 + 32 * n + l] |= (q >> 4) << (2 * k);
            }
        }
    }
    out
}

/// Whether `dtype`'s first chunk is of fifth bits (Q5_0, Q5_1), stored transposed.
fn has_fifth_bits(dtype: DType) -> bool {
    matches!(dtype, DType::Q5_0 | DType::Q5_1)
}

/// A group block's chunk of fifth bits (row r's 32-bit `qh` at bytes 4r..4r + 4, bit w the
/// fifth bit of weight w), transposed: bit c of byte 4r + i the fifth bit of row r's weight
/// 4c + i.
pub(crate) fn fifth_bits_to_lanes(natural: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for r in 0..GROUP_ROWS {
        let qh = u32::from_le_bytes(natural[4 * r..4 * r + 4].try_into().expect("4 bytes"));
        for i in 0..4 {
            out[4 * r + i] = (0..8).map(|c| (((qh >> (4 * c + i)) & 1) << c) as u8).sum();
        }
    }
    out
}

/// The inverse of [`fifth_bits_to_lanes`].
pub(crate) fn fifth_bits_from_lanes(lanes: &[u8; 32]) -> [u8; 32] {
    let mut out = [0u8; 32];
    for r in 0..GROUP_ROWS {
        let mut qh = 0u32;
        for i in 0..4 {
            for c in 0..8 {
                qh |= u32::from((lanes[4 * r + i] >> c) & 1) << (4 * c + i);
            }
        }
        out[4 * r..4 * r + 4].copy_from_slice(&qh.to_le_bytes());
    }
    out
}

/// A block's f16 fields (their offsets: its scale d; Q4_1's min, Q4_K's dmin), first in a
/// group block, and the block's other bytes, in chunks of four after them (Q4_K's: three of
/// scale bytes, then 32 of quants; Q6_K's: 32 of `ql`, 16 of `qh`, 4 of scales, its d last in
/// the file's block).
fn fields(dtype: DType) -> (&'static [usize], std::ops::Range<usize>) {
    let f16 = dtype.f16_fields();
    let bb = dtype.block_bytes();
    match dtype {
        DType::Q6_K => (f16, 0..bb - 2),
        _ => (f16, 2 * f16.len()..bb),
    }
}

impl std::fmt::Debug for Interleaved {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Interleaved({} {} x {})",
            self.dtype, self.rows, self.cols
        )
    }
}
