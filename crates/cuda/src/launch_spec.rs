//! What every launch is made of: [`KernelArgs`] (the arguments packed as `cuLaunchKernel` takes
//! them) and [`LaunchSpec`] (module, entry name, grid, block, dynamic shared bytes and
//! arguments), with the grid arithmetic several families share. Each kernel builds its own spec
//! ([`Kernel::spec`](crate::backend::Kernel::spec), in its family's `launch.rs`);
//! [`CudaDevice`](crate::CudaDevice) launches it on the GPU and the emulator
//! (`device="gpu-emu"`) calls the kernel's compiled C++ with the very same array, checking the
//! count and byte width of every argument against the kernel's declared parameters, so argument
//! order, widths, struct layouts and the grid and shared-memory arithmetic are exercised on every
//! machine. Shapes were checked by the family's operations before a kernel struct exists; lengths
//! are converted to the kernels' `int` as they are packed.

use std::ffi::c_void;

use powerinfer_core::{DType, Result};

use crate::kernels::KernelSource;
use crate::layout::{to_i32, x_bytes, RowLayout, MAX_X_BYTES};

/// Threads per block of the row kernels (8 warps).
pub const ROW_THREADS: u32 = 256;
/// Threads per block of the thread-per-element kernels.
pub const ELEM_THREADS: u32 = 256;

/// A kernel's arguments packed as `cuLaunchKernel` takes them: each value in its own 8-byte
/// aligned slot, in the kernel's parameter order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelArgs {
    words: Vec<u64>,
    /// (first word, bytes) of each argument.
    slots: Vec<(usize, usize)>,
}

impl KernelArgs {
    /// Any value as its bytes (a struct passed by value), in a slot of its own.
    pub fn push_bytes(&mut self, bytes: &[u8]) {
        let first = self.words.len();
        for chunk in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..chunk.len()].copy_from_slice(chunk);
            self.words.push(u64::from_le_bytes(w));
        }
        self.slots.push((first, bytes.len()));
    }

    /// A device address (a kernel pointer parameter; 0 is the null pointer).
    pub fn ptr(&mut self, addr: u64) -> &mut Self {
        self.push_bytes(&addr.to_le_bytes());
        self
    }

    /// An `int`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.push_bytes(&v.to_le_bytes());
        self
    }

    /// A `float`.
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.push_bytes(&v.to_le_bytes());
        self
    }

    /// A `RowLayout` by value, laid out as common.cuh's struct (i64, i64, i32, i32, u32, u32).
    pub fn layout(&mut self, l: &RowLayout) -> &mut Self {
        let mut b = Vec::with_capacity(32);
        b.extend_from_slice(&l.group_stride.to_le_bytes());
        b.extend_from_slice(&l.offset.to_le_bytes());
        b.extend_from_slice(&l.group_rows.to_le_bytes());
        b.extend_from_slice(&l.row_bytes.to_le_bytes());
        b.extend_from_slice(&l.div_mul.to_le_bytes());
        b.extend_from_slice(&l.div_shr.to_le_bytes());
        self.push_bytes(&b);
        self
    }

    /// How many arguments.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The byte width of each argument, in order.
    pub fn sizes(&self) -> Vec<usize> {
        self.slots.iter().map(|s| s.1).collect()
    }

    /// Argument `i`'s bytes.
    pub fn bytes(&self, i: usize) -> Vec<u8> {
        let (first, n) = self.slots[i];
        let words = &self.words[first..first + n.div_ceil(8)];
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(n);
        out
    }

    /// The pointer array of `cuLaunchKernel`: entry i points at argument i's slot. Valid while
    /// `self` is neither moved nor changed.
    pub fn pointers(&mut self) -> Vec<*mut c_void> {
        let base = self.words.as_mut_ptr();
        self.slots
            .iter()
            // wrapping_add: pointer arithmetic inside the words vector, no dereference here.
            .map(|&(first, _)| base.wrapping_add(first).cast::<c_void>())
            .collect()
    }
}

/// Everything a launch needs: which kernel, its grid and block, its dynamic shared memory and
/// its arguments.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The module (`.cu` file) defining the kernel.
    pub module: &'static KernelSource,
    /// The kernel's `extern "C"` name.
    pub entry: String,
    /// Blocks in x, y, z.
    pub grid: [u32; 3],
    /// Threads per block in x, y, z.
    pub block: [u32; 3],
    /// Dynamic shared memory in bytes.
    pub shared_bytes: u32,
    /// The arguments, in the kernel's parameter order.
    pub args: KernelArgs,
}

/// Dynamic shared memory of the row kernels of `dtype`: x staged (`stage_x` in
/// sparse_matvec.cu: floats, or the quantized blocks) when it fits, none for longer rows, which
/// read x from global memory.
pub fn x_smem(dtype: DType, cols: usize) -> usize {
    match x_bytes(dtype, cols) {
        b if b <= MAX_X_BYTES => b,
        _ => 0,
    }
}

/// Values per thread of the tiled row-sum kernels (`ROW_TILE_*` in common.cuh: one 16-byte
/// unit of a float row, one 32-weight block of the quantized formats, 16 bytes of a K-quant
/// super-block's quants; the down pass and the predictor's fc2).
pub const fn row_tile(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 4,
        DType::F16 | DType::BF16 => 8,
        _ => 32,
    }
}

/// Units of a tiled kernel's block: one warp's worth, fewer for narrower rows.
const TILE_UNITS_PER_BLOCK: usize = 32;

/// `(gridDim.x, units_pb, dynamic shared bytes)` of a tiled row-sum kernel of `dtype` over
/// `cols` columns (axpy_down.cu, predictor.cu): a block holds `units_pb` units (32, or the row's
/// units rounded up to a power of two when fewer) and 256 / units_pb row lanes, whose sums meet
/// in 256 · tile floats of shared memory.
pub fn tile_geometry(dtype: DType, cols: usize) -> Result<(u32, usize, usize)> {
    let threads = ROW_THREADS as usize;
    let tile = row_tile(dtype);
    let units = cols.div_ceil(tile);
    let units_pb = units.next_power_of_two().min(TILE_UNITS_PER_BLOCK);
    let smem = if units_pb < threads {
        threads * tile * 4
    } else {
        0
    };
    Ok((grid(units, units_pb)?, units_pb, smem))
}

/// Blocks of `per` covering `n` (at least one).
pub fn grid(n: usize, per: usize) -> Result<u32> {
    Ok(to_i32(n.div_ceil(per).max(1), "grid size")? as u32)
}

impl LaunchSpec {
    /// A launch of `entry` in `module` over `blocks` (x, y) of `threads`, with `smem` bytes of
    /// dynamic shared memory.
    pub fn new(
        module: &'static KernelSource,
        entry: String,
        blocks: [u32; 2],
        threads: u32,
        smem: usize,
        args: KernelArgs,
    ) -> LaunchSpec {
        LaunchSpec {
            module,
            entry,
            grid: [blocks[0], blocks[1], 1],
            block: [threads, 1, 1],
            shared_bytes: u32::try_from(smem).unwrap_or(u32::MAX),
            args,
        }
    }

    /// A thread-per-element kernel: blocks of [`ELEM_THREADS`] covering `n` threads.
    pub fn per_element(
        module: &'static KernelSource,
        entry: String,
        n: usize,
        args: KernelArgs,
    ) -> Result<LaunchSpec> {
        let blocks = [grid(n, ELEM_THREADS as usize)?, 1];
        Ok(LaunchSpec::new(
            module,
            entry,
            blocks,
            ELEM_THREADS,
            0,
            args,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_pack_in_aligned_slots_with_their_widths() {
        let mut a = KernelArgs::default();
        let l = RowLayout::new(-2, 0x1122_3344_5566, 7, -9);
        a.ptr(0xdead_beef).i32(-3).f32(1.5).layout(&l);
        a.push_bytes(&[7u8; 13]);
        assert_eq!(a.sizes(), [8, 4, 4, 32, 13]);
        assert_eq!(a.bytes(1), (-3i32).to_le_bytes());
        assert_eq!(a.bytes(2), 1.5f32.to_le_bytes());
        let lb = a.bytes(3);
        assert_eq!(lb[..8], (-2i64).to_le_bytes());
        assert_eq!(lb[16..20], 7i32.to_le_bytes());
        assert_eq!(lb[20..24], (-9i32).to_le_bytes());
        assert_eq!(lb[24..28], l.div_mul.to_le_bytes());
        assert_eq!(a.bytes(4), [7u8; 13]);
        let p = a.pointers();
        // Every slot 8-byte aligned, one after the other.
        let d: Vec<usize> = p
            .windows(2)
            .map(|w| w[1] as usize - w[0] as usize)
            .collect();
        assert_eq!(d, [8, 8, 8, 32]);
        assert!(p.iter().all(|q| (*q as usize).is_multiple_of(8)));
    }
}
