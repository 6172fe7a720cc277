//! The GPU backend interface: what the hybrid executor needs of a GPU, implemented twice — by
//! [`CudaDevice`](crate::CudaDevice) (cudarc, the kernels of `kernels/*.cu` compiled by NVRTC)
//! and by [`HostBackend`](crate::HostBackend) (always built: buffers in host memory, every
//! kernel's contract in plain Rust), so that everything but the kernels themselves runs and is
//! tested on machines without a GPU (`device="gpu-sim"`).
//!
//! A backend provides typed buffers, copies in and out, and one entry point, [`Backend::launch`],
//! taking a [`Launch`]: one variant per `extern "C"` kernel, its fields the kernel's parameters
//! in order. Launches are made only by the checked operations of [`crate::ops`] (the
//! [`GpuOps`](crate::GpuOps) methods every backend gets), which validate shapes on the host
//! first: a [`Checked`] token, constructible only inside this crate, proves it.

use powerinfer_core::{DType, Result};

use crate::layout::{Act, FfnAct, RowLayout, SlabLayout};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i32 {}
    impl Sealed for u16 {}
    impl Sealed for u8 {}
}

/// What a CUDA buffer's element type must be (cudarc's plain-old-data traits); nothing without
/// the `cuda` feature.
#[cfg(feature = "cuda")]
pub trait CudaRepr: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits {}
#[cfg(feature = "cuda")]
impl<T: cudarc::driver::DeviceRepr + cudarc::driver::ValidAsZeroBits> CudaRepr for T {}
/// What a CUDA buffer's element type must be; nothing without the `cuda` feature.
#[cfg(not(feature = "cuda"))]
pub trait CudaRepr {}
#[cfg(not(feature = "cuda"))]
impl<T> CudaRepr for T {}

/// Element types a device buffer holds: f32 activations (and f32 KV caches), i32 indices and
/// flags, u16 (f16 bits) KV caches, u8 weight bytes.
pub trait Elem:
    sealed::Sealed + CudaRepr + Copy + Default + PartialEq + std::fmt::Debug + Send + Sync + 'static
{
}
impl Elem for f32 {}
impl Elem for i32 {}
impl Elem for u16 {}
impl Elem for u8 {}

/// An element type of the device KV cache: f16 (as `u16` bits, the default) or f32. Each has
/// its own pair of kernels (`kv_store` / `attention_decode`, `kv_store_f32` /
/// `attention_decode_f32`, see [`crate::kernels::kv_entry`]).
pub trait KvElem: Elem {
    /// "f16" or "f32".
    const NAME: &'static str;

    /// `v` as the cache stores it (f16: rounded to nearest even, as the kernel rounds).
    fn from_f32(v: f32) -> Self;

    /// The value a cache element holds.
    fn to_f32(self) -> f32;

    /// A layer's caches `k`, `v` of this type, as a launch carries them.
    fn caches<'a, B: Backend>(k: &'a B::Buf<Self>, v: &'a B::Buf<Self>) -> KvCaches<'a, B>;

    /// [`KvElem::caches`] for a launch that writes them.
    fn caches_mut<'a, B: Backend>(
        k: &'a mut B::Buf<Self>,
        v: &'a mut B::Buf<Self>,
    ) -> KvCachesMut<'a, B>;
}

impl KvElem for u16 {
    const NAME: &'static str = "f16";

    fn from_f32(v: f32) -> u16 {
        half::f16::from_f32(v).to_bits()
    }

    fn to_f32(self) -> f32 {
        half::f16::from_bits(self).to_f32()
    }

    fn caches<'a, B: Backend>(k: &'a B::Buf<u16>, v: &'a B::Buf<u16>) -> KvCaches<'a, B> {
        KvCaches::F16 { k, v }
    }

    fn caches_mut<'a, B: Backend>(
        k: &'a mut B::Buf<u16>,
        v: &'a mut B::Buf<u16>,
    ) -> KvCachesMut<'a, B> {
        KvCachesMut::F16 { k, v }
    }
}

impl KvElem for f32 {
    const NAME: &'static str = "f32";

    fn from_f32(v: f32) -> f32 {
        v
    }

    fn to_f32(self) -> f32 {
        self
    }

    fn caches<'a, B: Backend>(k: &'a B::Buf<f32>, v: &'a B::Buf<f32>) -> KvCaches<'a, B> {
        KvCaches::F32 { k, v }
    }

    fn caches_mut<'a, B: Backend>(
        k: &'a mut B::Buf<f32>,
        v: &'a mut B::Buf<f32>,
    ) -> KvCachesMut<'a, B> {
        KvCachesMut::F32 { k, v }
    }
}

/// One layer's key and value caches (`[context, kv_dim]` each), read by a launch: both of one
/// [`KvElem`] type.
pub enum KvCaches<'a, B: Backend> {
    /// f16 caches (`u16` bits).
    F16 {
        k: &'a B::Buf<u16>,
        v: &'a B::Buf<u16>,
    },
    /// f32 caches.
    F32 {
        k: &'a B::Buf<f32>,
        v: &'a B::Buf<f32>,
    },
}

/// One layer's key and value caches, written by a launch: both of one [`KvElem`] type.
pub enum KvCachesMut<'a, B: Backend> {
    /// f16 caches (`u16` bits).
    F16 {
        k: &'a mut B::Buf<u16>,
        v: &'a mut B::Buf<u16>,
    },
    /// f32 caches.
    F32 {
        k: &'a mut B::Buf<f32>,
        v: &'a mut B::Buf<f32>,
    },
}

impl<B: Backend> KvCaches<'_, B> {
    /// The element type's [`KvElem::NAME`].
    pub fn elem(&self) -> &'static str {
        match self {
            KvCaches::F16 { .. } => u16::NAME,
            KvCaches::F32 { .. } => f32::NAME,
        }
    }

    /// `dev`'s addresses of the caches ([`Backend::addr`]), k then v.
    pub fn addrs(&self, dev: &B) -> [u64; 2] {
        match self {
            KvCaches::F16 { k, v } => [dev.addr(*k), dev.addr(*v)],
            KvCaches::F32 { k, v } => [dev.addr(*k), dev.addr(*v)],
        }
    }
}

impl<B: Backend> KvCachesMut<'_, B> {
    /// The element type's [`KvElem::NAME`].
    pub fn elem(&self) -> &'static str {
        match self {
            KvCachesMut::F16 { .. } => u16::NAME,
            KvCachesMut::F32 { .. } => f32::NAME,
        }
    }

    /// `dev`'s addresses of the caches for a kernel that writes them ([`Backend::addr_mut`]),
    /// k then v.
    pub fn addrs_mut(&mut self, dev: &B) -> [u64; 2] {
        match self {
            KvCachesMut::F16 { k, v } => [dev.addr_mut(*k), dev.addr_mut(*v)],
            KvCachesMut::F32 { k, v } => [dev.addr_mut(*k), dev.addr_mut(*v)],
        }
    }
}

/// The x a row kernel reads ([`Launch::SparseMatvec`], [`Launch::GateUp`]): `cols` floats for
/// the float formats, the int16 blocks [`Launch::QuantizeX`] writes for the quantized ones
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
            crate::kernels::dtype_suffix(dtype),
            match dtype.is_quantized() {
                true => "quantized (quantize_x)",
                false => "floats",
            }
        );
        Ok(())
    }
}

/// A typed buffer of a backend: `len` elements.
pub trait DeviceSlice: Send + Sync {
    /// Elements.
    fn len(&self) -> usize;
    /// True when it holds no element.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Proof that a launch's arguments were checked by [`crate::ops`]; only this crate makes one.
#[derive(Clone, Copy, Debug)]
pub struct Checked(pub(crate) ());

/// A GPU as the executor sees it.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A buffer of `T` in this backend's memory.
    type Buf<T: Elem>: DeviceSlice;

    /// Names the device for messages and reports: "cuda:0 (NVIDIA H200, sm_90)", "gpu-sim".
    fn describe(&self) -> String;

    /// (free, total) device memory in bytes.
    fn mem_info(&self) -> Result<(usize, usize)>;

    /// Bytes this backend has allocated and not yet freed, each allocation rounded up to 256
    /// bytes as the plan counts them, when the backend keeps count (the host backend does).
    fn allocated_bytes(&self) -> Option<usize>;

    /// A zero-filled buffer of `len` elements; `Error::VramBudget` when it does not fit.
    fn zeros<T: Elem>(&self, len: usize) -> Result<Self::Buf<T>>;

    /// Copy `host` into `dst[at..at + host.len()]` (queued after earlier work; `host` may be
    /// reused as soon as this returns).
    fn write<T: Elem>(&self, host: &[T], dst: &mut Self::Buf<T>, at: usize) -> Result<()>;

    /// Copy `src[at..at + out.len()]` into `out`, after all queued work has finished.
    fn read<T: Elem>(&self, src: &Self::Buf<T>, at: usize, out: &mut [T]) -> Result<()>;

    /// Wait until all queued work has finished.
    fn synchronize(&self) -> Result<()>;

    /// Queue one kernel launch whose arguments [`crate::ops`] has checked.
    fn launch(&self, launch: Launch<'_, Self>, checked: Checked) -> Result<()>;

    /// The address a kernel receives for `buf` (a device pointer; for the backends in host
    /// memory, the host address of its first element), for a buffer the kernel only reads.
    fn addr<T: Elem>(&self, buf: &Self::Buf<T>) -> u64;

    /// [`Backend::addr`] of a buffer the kernel writes.
    fn addr_mut<T: Elem>(&self, buf: &mut Self::Buf<T>) -> u64;

    /// Launches so far by kernel entry, when the backend counts them (the emulator does).
    fn kernel_launches(&self) -> Option<std::collections::BTreeMap<String, u64>> {
        None
    }

    /// Run the launches queued since the host last interacted with the device, where the
    /// backend batches them into graphs ([`crate::graph`]; a copy, an allocation or
    /// [`Backend::synchronize`] does it too); nothing elsewhere. The executor calls it before
    /// CPU work that should overlap the queued GPU work.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// A decode step begins: what is queued runs, and batches are numbered from 0 again (graphs
    /// are kept per number).
    fn begin_step(&self) -> Result<()> {
        Ok(())
    }

    /// The counters of the launch batches run as graphs, where the backend batches and graphs
    /// are on.
    fn graph_stats(&self) -> Option<crate::graph::GraphStats> {
        None
    }
}

/// One kernel launch: a variant per `extern "C"` entry of `kernels/*.cu`, its fields the
/// kernel's parameters in order (per-format kernels take the weight format as `dtype`, the
/// KV-cache kernels one layer's two caches as `caches`, whose element type picks the entry;
/// lengths as `usize`, converted to the kernel's `int` by the launcher). The meaning of each is the
/// comment above the kernel in its `.cu` file; the host backend implements exactly that.
pub enum Launch<'a, B: Backend> {
    /// `sparse_matvec_<dtype>` (sparse_matvec.cu): `y[k] = act(dot(W[row k], x))`, k in 0..n,
    /// row k = `idx[k]` or k; with `flags`, a row whose id (read through `ids`) is inactive or
    /// padding (−1) yields 0. `x` as [`XArg`] says for the format.
    SparseMatvec {
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
    },
    /// `gate_up_<dtype>` (sparse_matvec.cu): `h[k] = g · u'` with `g = act(dot(gate[k], x) +
    /// bias[id(k)])` and `u' = dot(up[k], x)` (`act` of it with `act.up_act`; 1 without up
    /// rows: `up_l` None), `act` with its FATReLU threshold; the up row not read when `g` is 0;
    /// ids (for `flags` and `bias`, each one entry per FFN neuron) live in `w` at `ids_l`, and a
    /// padding slot (id −1) gives 0 when either is given. `x` as [`XArg`] says for the format;
    /// with `count` (written by [`Launch::CompactFlags`]) only the first `min(count[0], n)`
    /// outputs are computed, the others left as they are.
    GateUp {
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
        act: FfnAct,
        count: Option<&'a B::Buf<i32>>,
        h: &'a mut B::Buf<f32>,
    },
    /// `quantize_x` (sparse_matvec.cu): `x` (`cols` floats, a multiple of 32) as the int16 blocks
    /// of the quantized formats' row kernels, into `xq` ([`crate::layout::xq_bytes`] bytes).
    QuantizeX {
        x: &'a B::Buf<f32>,
        cols: usize,
        xq: &'a mut B::Buf<u8>,
    },
    /// `axpy_rows_<dtype>` (axpy_down.cu): `y[c] += Σ_k a[k] · W[row k][c]`, rows with a zero
    /// coefficient not read; `splits` blocks along the rows (gridDim.y). With one split the sum
    /// goes to `y`; with more, split `s` writes its partial sums to `part[s · cols ..]` (`part`
    /// holds at least splits · cols) and [`Launch::AddSplits`] adds them to `y`. With `count`
    /// (a compacted list) the rows are the first `min(count[0], n)`, in one split per 128 of them
    /// (at most `splits`: [`crate::ops::live_splits`]).
    AxpyRows {
        dtype: DType,
        w: &'a B::Buf<u8>,
        l: RowLayout,
        cols: usize,
        idx: Option<&'a B::Buf<i32>>,
        a: &'a B::Buf<f32>,
        n: usize,
        count: Option<&'a B::Buf<i32>>,
        part: Option<&'a mut B::Buf<f32>>,
        y: &'a mut B::Buf<f32>,
        splits: usize,
    },
    /// `add_splits` (axpy_down.cu): `y[c] += Σ_s part[s · cols + c]` for s in 0..splits, in
    /// that order; with `count`, over the live splits of `min(count[0], n)` rows.
    AddSplits {
        part: &'a B::Buf<f32>,
        splits: usize,
        cols: usize,
        count: Option<&'a B::Buf<i32>>,
        n: usize,
        y: &'a mut B::Buf<f32>,
    },
    /// `compact_nonzero` (compact.cu): the entries k < `min(count_in[0], n)` (n without
    /// `count_in`) with `a[k] != 0`, in order: `out_idx[j] = idx[k]` (k without `idx`),
    /// `out_a[j] = a[k]`, `count[0]` = how many.
    CompactNonzero {
        a: &'a B::Buf<f32>,
        idx: Option<&'a B::Buf<i32>>,
        count_in: Option<&'a B::Buf<i32>>,
        n: usize,
        out_idx: &'a mut B::Buf<i32>,
        out_a: &'a mut B::Buf<f32>,
        count: &'a mut B::Buf<i32>,
    },
    /// `compact_flags` (compact.cu): the hot slots s < n whose neuron (id read through `ids_l`
    /// in `slabs`) is not padding and has `flags[id] != 0`, in order, into `out_idx`; `count[0]`
    /// = how many.
    CompactFlags {
        slabs: &'a B::Buf<u8>,
        ids_l: RowLayout,
        flags: &'a B::Buf<i32>,
        n: usize,
        out_idx: &'a mut B::Buf<i32>,
        count: &'a mut B::Buf<i32>,
    },
    /// `predictor_fc2_<dtype>` (predictor.cu): `logit[j] = Σ_{hidden[h] > 0} hidden[h] ·
    /// fc2_t[h][j]`, `flags[j] = logit[j] >= threshold`.
    PredictorFc2 {
        dtype: DType,
        fc2_t: &'a B::Buf<u8>,
        l: RowLayout,
        hidden: &'a B::Buf<f32>,
        rank: usize,
        ffn: usize,
        threshold: f32,
        flags: &'a mut B::Buf<i32>,
        logits: Option<&'a mut B::Buf<f32>>,
    },
    /// `rms_norm` (norm_rope.cu) over `rows` rows of `n`: `out = x / sqrt(mean(x²) + eps) · w`;
    /// with `xq` also `out` quantized for the integer dots, the bytes [`Launch::QuantizeX`]
    /// writes for it (row r's blocks after row r − 1's; `n` a multiple of 32).
    RmsNorm {
        x: &'a B::Buf<f32>,
        w: &'a B::Buf<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        out: &'a mut B::Buf<f32>,
        xq: Option<&'a mut B::Buf<u8>>,
    },
    /// `layer_norm` (norm_rope.cu) over `rows` rows of `n`: `out = (x − mean) / sqrt(var + eps)
    /// · w + b`, the biased variance; `xq` as [`Launch::RmsNorm`]'s.
    LayerNorm {
        x: &'a B::Buf<f32>,
        w: &'a B::Buf<f32>,
        b: &'a B::Buf<f32>,
        rows: usize,
        n: usize,
        eps: f32,
        out: &'a mut B::Buf<f32>,
        xq: Option<&'a mut B::Buf<u8>>,
    },
    /// `rope` (norm_rope.cu): rotate the first `2 · inv_freqs.len()` values of every head of
    /// `x` (`n_heads` heads) and of `k` (`k_heads`, the keys: one launch for both) in place for
    /// position `pos`, pair i by `pos · inv_freqs[i]` (in f64; at most
    /// [`MAX_ROPE_PAIRS`](crate::ops::MAX_ROPE_PAIRS) pairs); `neox` pairs (i, i + n), else
    /// (2i, 2i + 1). With `x_norm` (`k_norm`) each head of `x` (`k`) is first RMS-normed over
    /// its `head_dim` values with that weight and `eps` (the per-head q/k norm).
    Rope {
        x: &'a mut B::Buf<f32>,
        n_heads: usize,
        k: Option<&'a mut B::Buf<f32>>,
        k_heads: usize,
        head_dim: usize,
        pos: usize,
        inv_freqs: &'a [f64],
        neox: bool,
        x_norm: Option<&'a B::Buf<f32>>,
        k_norm: Option<&'a B::Buf<f32>>,
        eps: f32,
    },
    /// `kv_store` (attention.cu; `kv_store_f32` for f32 caches): row `pos` of both caches =
    /// k, v as the cache's [`KvElem`] stores them (f16: rounded to nearest even).
    KvStore {
        k: &'a B::Buf<f32>,
        v: &'a B::Buf<f32>,
        kv_dim: usize,
        pos: usize,
        caches: KvCachesMut<'a, B>,
    },
    /// `attention_decode` (attention.cu; `attention_decode_f32` for f32 caches): one query over
    /// positions `first..n_pos` of the caches, grouped-query, scores `(q · scale)·k`,
    /// soft-capped by `softcap` when > 0, in chunks of `chunk` positions. One chunk: the output
    /// to `out`; more: each chunk's unnormalised output, max and normaliser to `part`
    /// (`[n_heads][n_chunks][head_dim + 2]`), for [`Launch::AttentionMerge`].
    AttentionDecode {
        q: &'a B::Buf<f32>,
        caches: KvCaches<'a, B>,
        first: usize,
        n_pos: usize,
        n_heads: usize,
        n_kv_heads: usize,
        head_dim: usize,
        scale: f32,
        softcap: f32,
        chunk: usize,
        part: &'a mut B::Buf<f32>,
        out: &'a mut B::Buf<f32>,
    },
    /// `attention_merge` (attention.cu): the chunks' partial states in `part` combined, in
    /// chunk order, into each head's output.
    AttentionMerge {
        part: &'a B::Buf<f32>,
        n_heads: usize,
        head_dim: usize,
        n_chunks: usize,
        out: &'a mut B::Buf<f32>,
    },
    /// `add` (elementwise.cu): `y[i] += x[i]`.
    Add {
        y: &'a mut B::Buf<f32>,
        x: &'a B::Buf<f32>,
        n: usize,
    },
    /// `threshold_mask` (elementwise.cu): `h[i] = 0` where `|h[i]| < t` (threshold mode).
    ThresholdMask {
        h: &'a mut B::Buf<f32>,
        n: usize,
        t: f32,
    },
    /// `softcap` (elementwise.cu): `y[i] = cap · tanh(y[i] / cap)`.
    Softcap {
        y: &'a mut B::Buf<f32>,
        n: usize,
        cap: f32,
    },
    /// `copy` (elementwise.cu): `dst[i] = src[i]`.
    Copy {
        dst: &'a mut B::Buf<f32>,
        src: &'a B::Buf<f32>,
        n: usize,
    },
    /// `fill` (elementwise.cu): `y[i] = v`.
    Fill {
        y: &'a mut B::Buf<f32>,
        n: usize,
        v: f32,
    },
    /// `expert_flags` (elementwise.cu): `flags[j] = (w[e(j)] != 0)` for j in 0..n, where
    /// `e(j) = j / expert_ffn` for `j < routed`, else `n_expert` (a mixture of experts'
    /// flattened neurons: the routed experts', then the shared expert's).
    ExpertFlags {
        w: &'a B::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        n_expert: usize,
        n: usize,
        flags: &'a mut B::Buf<i32>,
    },
    /// `expert_scale` (elementwise.cu): `h[s] *= w[e(id)]` for the slots s in 0..n of a slab
    /// buffer, `id` read through `ids_l` (padding, −1, left alone); `e` as [`Launch::ExpertFlags`].
    ExpertScale {
        slabs: &'a B::Buf<u8>,
        ids_l: RowLayout,
        w: &'a B::Buf<f32>,
        expert_ffn: usize,
        routed: usize,
        n_expert: usize,
        n: usize,
        h: &'a mut B::Buf<f32>,
    },
}

impl<B: Backend> Launch<'_, B> {
    /// What a launch does besides its own kernel's work, for the launch counts the tests read
    /// (the emulator's [`Backend::kernel_launches`]): "quantize_x (in rms_norm)" for a norm
    /// that quantizes its output in the same launch, "rms_norm (in rope)" for the per-head q/k
    /// norm inside RoPE's launch, "add (in sparse_matvec)" for a matvec added into its output.
    pub fn fused(&self) -> Option<&'static str> {
        match self {
            Launch::RmsNorm { xq: Some(_), .. } => Some("quantize_x (in rms_norm)"),
            Launch::LayerNorm { xq: Some(_), .. } => Some("quantize_x (in layer_norm)"),
            Launch::Rope {
                x_norm: Some(_), ..
            } => Some("rms_norm (in rope)"),
            Launch::SparseMatvec {
                accumulate: true, ..
            } => Some("add (in sparse_matvec)"),
            _ => None,
        }
    }

    /// The kernel's entry name, e.g. "sparse_matvec_q4_0" (for messages and the launch tests).
    pub fn entry(&self) -> String {
        use crate::kernels::{dtype_suffix, kv_entry};
        match self {
            Launch::SparseMatvec { dtype, .. } => format!("sparse_matvec_{}", dtype_suffix(*dtype)),
            Launch::GateUp { dtype, .. } => format!("gate_up_{}", dtype_suffix(*dtype)),
            Launch::QuantizeX { .. } => "quantize_x".into(),
            Launch::AxpyRows { dtype, .. } => format!("axpy_rows_{}", dtype_suffix(*dtype)),
            Launch::AddSplits { .. } => "add_splits".into(),
            Launch::CompactNonzero { .. } => "compact_nonzero".into(),
            Launch::CompactFlags { .. } => "compact_flags".into(),
            Launch::PredictorFc2 { dtype, .. } => {
                format!("predictor_fc2_{}", dtype_suffix(*dtype))
            }
            Launch::RmsNorm { .. } => "rms_norm".into(),
            Launch::LayerNorm { .. } => "layer_norm".into(),
            Launch::Rope { .. } => "rope".into(),
            Launch::KvStore { caches, .. } => kv_entry("kv_store", caches.elem()),
            Launch::AttentionDecode { caches, .. } => kv_entry("attention_decode", caches.elem()),
            Launch::AttentionMerge { .. } => "attention_merge".into(),
            Launch::Add { .. } => "add".into(),
            Launch::ThresholdMask { .. } => "threshold_mask".into(),
            Launch::Softcap { .. } => "softcap".into(),
            Launch::Copy { .. } => "copy".into(),
            Launch::Fill { .. } => "fill".into(),
            Launch::ExpertFlags { .. } => "expert_flags".into(),
            Launch::ExpertScale { .. } => "expert_scale".into(),
        }
    }
}

/// A weight matrix in a backend's memory.
pub struct DeviceWeight<B: Backend> {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub layout: RowLayout,
    pub data: B::Buf<u8>,
}

impl<B: Backend> DeviceWeight<B> {
    /// Device bytes.
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}

/// One layer's hot neurons in a backend's memory, in slabs ([`crate::pack_hot_slabs`]).
pub struct HotFfn<B: Backend> {
    pub layout: SlabLayout,
    pub data: B::Buf<u8>,
}

impl<B: Backend> HotFfn<B> {
    /// Device bytes (== `layout.total_bytes()`).
    pub fn n_bytes(&self) -> usize {
        self.data.len()
    }
}
