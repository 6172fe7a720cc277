//! The launches of `kernels/sparse_matvec.cu` (with its header `sparse_matvec.cuh`): one struct
//! per kernel, its fields the kernel's parameters in order, and the x they read ([`XArg`]).

use powerinfer_core::{DType, Error, Result};

use super::host::{self, XSlice};
use crate::backend::{kernel, Backend, HostMem};
use crate::host::view::{counted, prefix_mut, Active, Neurons, Picks, Rows};
use crate::kernels::{dtype_suffix, KernelSource};
use crate::launch_spec::{grid, x_smem, KernelArgs, LaunchSpec, ROW_THREADS};
use crate::layout::{to_i32, Act, FfnAct, RowLayout};

/// `kernels/sparse_matvec.cu`.
pub const SOURCE: KernelSource = KernelSource::new(
    "sparse_matvec",
    include_str!("../../../kernels/sparse_matvec.cu"),
    &["quantize_x"],
)
.per_dtype(&["sparse_matvec", "gate_up"])
.header(include_str!("../../../kernels/sparse_matvec.cuh"));

/// Output rows per block of sparse_matvec / gate_up (`ROWS_PER_BLOCK` in sparse_matvec.cu).
pub const ROWS_PER_BLOCK: usize = 16;

/// The x a row kernel reads ([`SparseMatvec`], [`GateUp`]): `cols` floats for the float
/// formats, the int16 blocks [`QuantizeX`] writes for the quantized ones
/// ([`crate::layout::xq_bytes`] of them).
pub enum XArg<'a, B: Backend> {
    /// Floats.
    F32(&'a B::Buf<f32>),
    /// Quantized blocks.
    Quant(&'a B::Buf<u8>),
}

impl<B: Backend> XArg<'_, B> {
    /// The address the kernel receives ([`Backend::addr`]).
    pub fn addr(&self, dev: &B) -> u64 {
        match self {
            XArg::F32(x) => dev.addr(*x),
            XArg::Quant(x) => dev.addr(*x),
        }
    }

    /// `Error::Unsupported` unless this is what the row kernels `<what>_<dtype>` read: floats
    /// for the float formats, quantized blocks for the others (every backend checks it).
    pub fn check(&self, what: &str, dtype: DType) -> Result<()> {
        let quant = matches!(self, XArg::Quant(_));
        powerinfer_core::ensure!(
            quant == dtype.is_quantized(),
            Unsupported,
            "{what}_{}: x must be {} for {dtype} weights",
            dtype_suffix(dtype),
            match dtype.is_quantized() {
                true => "quantized (quantize_x)",
                false => "floats",
            }
        );
        Ok(())
    }

    /// The values in host memory.
    fn slice(&self) -> XSlice<'_>
    where
        B: HostMem,
    {
        match self {
            XArg::F32(x) => XSlice::F32(B::data(*x)),
            XArg::Quant(q) => XSlice::Quant(B::data(*q)),
        }
    }
}

/// A row kernel's launch: blocks of [`ROWS_PER_BLOCK`] outputs over `n`, x staged in shared
/// memory when it fits ([`x_smem`]).
fn row_spec(
    entry: String,
    dtype: DType,
    cols: usize,
    n: usize,
    a: KernelArgs,
) -> Result<LaunchSpec> {
    let blocks = [grid(n, ROWS_PER_BLOCK)?, 1];
    let smem = x_smem(dtype, cols);
    Ok(LaunchSpec::new(
        &SOURCE,
        entry,
        blocks,
        ROW_THREADS,
        smem,
        a,
    ))
}

kernel! {
    /// `sparse_matvec_<dtype>`: `y[k] = act(dot(W[row k], x))`, k in 0..n, row k = `idx[k]` or k;
    /// with `flags`, a row whose id (read through `ids`) is inactive or padding (−1) yields 0. `x`
    /// as [`XArg`] says for the format.
    struct SparseMatvec<'a, B> {
        dtype: DType,
        w: &'a B::Buf<u8>,
        l: RowLayout,
        x: XArg<'a, B>,
        cols: usize,
        idx: Option<&'a B::Buf<i32>>,
        n: usize,
        ids: Option<(&'a B::Buf<u8>, RowLayout)>,
        flags: Option<&'a B::Buf<i32>>,
        act: Act,
        /// `y[k] += ...` instead of `y[k] = ...`.
        accumulate: bool,
        y: &'a mut B::Buf<f32>,
    }
    entry(k) = format!("sparse_matvec_{}", dtype_suffix(k.dtype));
    fused(k) k.accumulate.then_some("add (in sparse_matvec)");
    spec(k, dev, a) {
        // sparse_matvec_<dtype>(w, l, x, cols, idx, n, ids_base, ids_l, flags, act, accumulate,
        // y): x holds `cols` values (floats or quantized blocks), staged in x_smem(dtype, cols)
        // bytes; y holds n floats; rows 0..n (or the indices) lie inside w per `l`; flags come
        // with the ids they are indexed by.
        if k.flags.is_some() && k.ids.is_none() {
            return Err(Error::Unsupported(
                "sparse_matvec: flags without neuron ids".into(),
            ));
        }
        k.x.check("sparse_matvec", k.dtype)?;
        let entry = k.entry();
        let opt = |b: Option<&B::Buf<i32>>| b.map_or(0, |b| dev.addr(b));
        let ids_l = match k.ids {
            Some((_, l)) => l,
            None => RowLayout::dense(1, 4)?,
        };
        a.ptr(dev.addr(k.w)).layout(&k.l).ptr(k.x.addr(dev));
        a.i32(to_i32(k.cols, "cols")?)
            .ptr(opt(k.idx))
            .i32(to_i32(k.n, "rows")?);
        a.ptr(k.ids.map_or(0, |(b, _)| dev.addr(b))).layout(&ids_l);
        a.ptr(opt(k.flags))
            .i32(k.act as i32)
            .i32(i32::from(k.accumulate));
        a.ptr(dev.addr_mut(k.y));
        row_spec(entry, k.dtype, k.cols, k.n, a)
    }
    host(k) {
        k.x.check("sparse_matvec", k.dtype)?;
        let w = Rows::new(B::data(k.w), k.l, k.dtype, k.cols, "w")?;
        let active = match (k.ids, k.flags) {
            (_, None) => None,
            (Some((ids, ids_l)), Some(flags)) => {
                Some(Active::new(B::data(ids), ids_l, B::data(flags))?)
            }
            (None, Some(_)) => return Err(Error::Shape("flags given without neuron ids".into())),
        };
        let picks = Picks::new(k.idx.map(|i| B::data(i)), k.n)?;
        let x = host::x_values(k.x.slice(), k.cols)?;
        let y = prefix_mut(B::data_mut(k.y), k.n, "y")?;
        host::sparse_matvec(&w, &x, &picks, active.as_ref(), k.act, k.accumulate, y)
    }
}

impl<'a, B: Backend> SparseMatvec<'a, B> {
    /// `y[k] = dot(W[row k], x)` for the rows 0..n of `w` (`dtype`, laid out by `l`, `cols`
    /// columns): no index list, no flags, no activation, not accumulated; the other fields are
    /// set from there.
    pub fn rows(
        dtype: DType,
        w: &'a B::Buf<u8>,
        l: RowLayout,
        x: XArg<'a, B>,
        cols: usize,
        n: usize,
        y: &'a mut B::Buf<f32>,
    ) -> Self {
        SparseMatvec {
            dtype,
            w,
            l,
            x,
            cols,
            idx: None,
            n,
            ids: None,
            flags: None,
            act: Act::None,
            accumulate: false,
            y,
        }
    }
}

kernel! {
    /// `gate_up_<dtype>`: `h[k] = g · u'` with `g = act(dot(gate[k], x) + bias[id(k)])` and
    /// `u' = dot(up[k], x)` (`act` of it with `act.up_act`; 1 without up rows: `up_l` None), `act`
    /// with its FATReLU threshold; the up row not read when `g` is 0; ids (for `flags` and `bias`,
    /// each one entry per FFN neuron) live in `w` at `ids_l`, and a padding slot (id −1) gives 0
    /// when either is given. With `act.swiglu_limit` > 0 (gpt-oss) instead `h[k] =
    /// swiglu_oai(dot(gate[k], x) + bias[id(k)], dot(up[k], x) + up_bias[id(k)], limit)`. `x` as
    /// [`XArg`] says for the format; with `count` (written by `compact_flags`) only the first
    /// `min(count[0], n)` outputs are computed, the others left as they are.
    struct GateUp<'a, B> {
        dtype: DType,
        w: &'a B::Buf<u8>,
        gate_l: RowLayout,
        up_l: Option<RowLayout>,
        x: XArg<'a, B>,
        cols: usize,
        idx: Option<&'a B::Buf<i32>>,
        n: usize,
        ids_l: RowLayout,
        flags: Option<&'a B::Buf<i32>>,
        bias: Option<&'a B::Buf<f32>>,
        up_bias: Option<&'a B::Buf<f32>>,
        act: FfnAct,
        count: Option<&'a B::Buf<i32>>,
        h: &'a mut B::Buf<f32>,
    }
    entry(k) = format!("gate_up_{}", dtype_suffix(k.dtype));
    spec(k, dev, a) {
        // gate_up_<dtype>(w, gate_l, up_l, x, cols, idx, n, ids_l, flags, bias, up_bias, act,
        // relu_t, swiglu_limit, up_mode, count, h): the slab layouts come from pack_hot_slabs for
        // this buffer, slots 0..n hold ids < ffn or −1, flags, bias and up_bias have one entry
        // per FFN neuron; h holds n floats; count (null: none) one int. Without up rows the
        // kernel never reads up_l (UP_NONE; swiglu_limit is 0 then).
        k.x.check("gate_up", k.dtype)?;
        let entry = k.entry();
        let opt = |b: Option<&B::Buf<i32>>| b.map_or(0, |b| dev.addr(b));
        let up_mode = match (k.up_l, k.act.up_act) {
            (None, _) => 0,
            (Some(_), false) => 1,
            (Some(_), true) => 2,
        };
        let up_l = k.up_l.unwrap_or(k.gate_l);
        a.ptr(dev.addr(k.w))
            .layout(&k.gate_l)
            .layout(&up_l)
            .ptr(k.x.addr(dev));
        a.i32(to_i32(k.cols, "dim")?)
            .ptr(opt(k.idx))
            .i32(to_i32(k.n, "hot")?);
        a.layout(&k.ids_l)
            .ptr(opt(k.flags))
            .ptr(k.bias.map_or(0, |b| dev.addr(b)))
            .ptr(k.up_bias.map_or(0, |b| dev.addr(b)));
        a.i32(k.act.act as i32)
            .f32(k.act.relu_threshold)
            .f32(k.act.swiglu_limit)
            .i32(up_mode)
            .ptr(opt(k.count))
            .ptr(dev.addr_mut(k.h));
        row_spec(entry, k.dtype, k.cols, k.n, a)
    }
    host(k) {
        let (dtype, cols) = (k.dtype, k.cols);
        k.x.check("gate_up", dtype)?;
        let n = counted(k.count.map(|c| B::data(c)), k.n)?;
        let w = B::data(k.w);
        let gate = Rows::new(w, k.gate_l, dtype, cols, "gate")?;
        let up = k
            .up_l
            .map(|l| Rows::new(w, l, dtype, cols, "up"))
            .transpose()?;
        let flags = k.flags.map(|f| B::data(f));
        let bias = [k.bias, k.up_bias].map(|b| b.map(|b| B::data(b)));
        let neurons = Neurons::new(w, k.ids_l, flags, bias)?;
        let picks = Picks::new(k.idx.map(|i| B::data(i)), n)?;
        let x = host::x_values(k.x.slice(), cols)?;
        let h = prefix_mut(B::data_mut(k.h), n, "h")?;
        host::gate_up((&gate, up.as_ref()), &x, &picks, &neurons, k.act, h)
    }
}

kernel! {
    /// `quantize_x`: `x` (`cols` floats, a multiple of 32) as the int16 blocks of the quantized
    /// formats' row kernels, into `xq` ([`crate::layout::xq_bytes`] bytes).
    struct QuantizeX<'a, B> {
        x: &'a B::Buf<f32>,
        cols: usize,
        xq: &'a mut B::Buf<u8>,
    }
    entry = "quantize_x";
    spec(k, dev, a) {
        // quantize_x(x, cols, xq): a warp per 32 values, 8 per block; cols a multiple of 32 (the
        // op checks it), xq holds xq_bytes(cols).
        a.ptr(dev.addr(k.x))
            .i32(to_i32(k.cols, "cols")?)
            .ptr(dev.addr_mut(k.xq));
        let warps = (ROW_THREADS / 32) as usize;
        let blocks = [grid(k.cols / 32, warps)?, 1];
        let entry = k.entry();
        Ok(LaunchSpec::new(&SOURCE, entry, blocks, ROW_THREADS, 0, a))
    }
    host(k) {
        host::quantize_x(B::data(k.x), k.cols, B::data_mut(k.xq))
    }
}
