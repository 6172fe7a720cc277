//! What the attention kernels take: one head's cache ([`HeadCache`], public) and problem
//! ([`Head`], for [`crate::ops::attend`]), and a query block's score and value products
//! ([`ScoreBlock`], [`ValueBlock`], for [`crate::ops::attend_block`]). The ops build them; the
//! kernels of every level (`crate::kernels::scalar`, `crate::kernels::avx2`) read them.

/// Where one head's keys and values sit: position p's vector is `hd` values starting at
/// `p · stride` of `keys` and `values`.
#[derive(Clone, Copy, Debug)]
pub struct HeadCache<'a> {
    pub keys: &'a [f32],
    pub values: &'a [f32],
    pub stride: usize,
}

/// What a head's softmax applies beyond the scaled dot products.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SoftmaxExtras {
    /// Scores soft-capped to `c · tanh(s / c)` before the softmax (Gemma 2).
    pub softcap: Option<f32>,
    /// A logit that joins the softmax's max and denominator with no value (gpt-oss's
    /// `attn_sinks`): `out = Σ_p e^(s_p − m) v_p / (e^(sink − m) + Σ_p e^(s_p − m))`, m the
    /// max over the scores and the sink.
    pub sink: Option<f32>,
}

/// One head's attention problem, as the kernels take it: the query (`hd = q.len()` values),
/// the cache, the number of positions, the score scale and the sink logit (if any).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Head<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) cache: HeadCache<'a>,
    pub(crate) n_pos: usize,
    pub(crate) scale: f32,
    pub(crate) sink: Option<f32>,
}

impl Head<'_> {
    /// Panic unless `n_pos >= 1`, `out` holds `hd` values and the cache `n_pos` positions.
    pub(crate) fn check(&self, out: &[f32]) {
        let hd = self.q.len();
        assert!(self.n_pos > 0 && out.len() == hd, "attend_head: bad sizes");
        let need = (self.n_pos - 1) * self.cache.stride + hd;
        assert!(
            self.cache.keys.len() >= need && self.cache.values.len() >= need,
            "attend_head: the cache holds fewer than {} positions",
            self.n_pos
        );
    }
}

/// A sub-block's scores as the kernels take them: s[b · width + p] = scale ·
/// Σ_c q[b · q_stride + c] · kt[c · kt_stride + p] for b < n_q, p < width (a multiple of 16).
pub(crate) struct ScoreBlock<'a> {
    pub(crate) kt: &'a [f32],
    pub(crate) kt_stride: usize,
    pub(crate) width: usize,
    pub(crate) hd: usize,
    pub(crate) q: &'a [f32],
    pub(crate) q_stride: usize,
    pub(crate) n_q: usize,
    pub(crate) scale: f32,
}

/// A sub-block's weighted sums as the kernels take them: out[b · out_stride + c] = inv[b] ·
/// Σ_{p < np} s[b · width + p] · values[p · stride + c] for b < inv.len(), c < hd.
pub(crate) struct ValueBlock<'a> {
    pub(crate) s: &'a [f32],
    pub(crate) width: usize,
    pub(crate) np: usize,
    pub(crate) inv: &'a [f32],
    pub(crate) values: &'a [f32],
    pub(crate) stride: usize,
    pub(crate) hd: usize,
}

/// One side (keys or values) of a head's cache: f32 values, or ggml block bytes of a 32-value
/// format (q8_0, q4_0, q4_1) with whole blocks per head.
#[derive(Clone, Copy, Debug)]
pub enum KvRows<'a> {
    /// Position p's vector is `hd` values from `p · stride`.
    F32(&'a [f32]),
    /// Position p's vector is the `hd / 32` blocks from byte `p · stride / 32 · block_bytes`.
    Blocks(powerinfer_core::DType, &'a [u8]),
}

impl<'a> KvRows<'a> {
    /// The same rows from value `at` on (a multiple of 32 for blocks).
    pub fn skip(self, at: usize) -> KvRows<'a> {
        match self {
            KvRows::F32(v) => KvRows::F32(&v[at..]),
            KvRows::Blocks(dt, b) => KvRows::Blocks(dt, &b[at / 32 * dt.block_bytes()..]),
        }
    }

    /// Values held (whole blocks for block rows).
    pub(crate) fn values(&self) -> usize {
        match self {
            KvRows::F32(v) => v.len(),
            KvRows::Blocks(dt, b) => b.len() / dt.block_bytes() * 32,
        }
    }
}

/// A head's cache whose keys or values may be block formats: position p's vectors start at
/// value `p · stride` of each side.
#[derive(Clone, Copy, Debug)]
pub struct KvHeadCache<'a> {
    pub keys: KvRows<'a>,
    pub values: KvRows<'a>,
    pub stride: usize,
}

/// One head's problem over a [`KvHeadCache`], as the kernels take it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KvHead<'a> {
    pub(crate) q: &'a [f32],
    pub(crate) cache: KvHeadCache<'a>,
    pub(crate) n_pos: usize,
    pub(crate) scale: f32,
    pub(crate) extras: SoftmaxExtras,
}

/// Scratch of [`crate::attend_head_kv`], reused across calls: the scores and the query as
/// q8_0 (its bytes, then per block its scale, integers and their sum).
#[derive(Default, Debug)]
pub struct KvScratch {
    pub(crate) scores: Vec<f32>,
    pub(crate) qbytes: Vec<u8>,
    pub(crate) qd: Vec<f32>,
    pub(crate) qs: Vec<i8>,
    pub(crate) qsum: Vec<i32>,
}
