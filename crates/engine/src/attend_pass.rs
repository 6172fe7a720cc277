//! The attention step of a pass's rows over their KV caches: their keys and values written
//! first (rotated where a side is quantized), then one context's run in the pass's arithmetic
//! or each slot's rows over its own cache as decode steps. Shared by the ordinary attention
//! block ([`crate::attention_block`]) and the latent one ([`crate::mla`]).

use crate::attention::{attention, AttnShape};
use crate::ffn::Arith;
use crate::kv_cache::KvCache;
use crate::kv_rotation::{rotate, rotated, KvRotation};
use crate::pass_rows::Kv;
use crate::pass_scratch::Scratch;

/// The attention of the pass's `n` rows in `s.q`/`s.k`/`s.v` into `s.att`, their keys and
/// values written into their caches first: one context's run in `arith`, or each slot's rows
/// over its own cache as decode steps.
pub(crate) fn attend_pass(
    shape: &AttnShape<'_>,
    arith: Arith,
    kv: &mut Kv<'_, '_>,
    l: usize,
    s: &mut Scratch,
    n: usize,
) {
    let (qd, kd) = (shape.n_heads * shape.head_dim, cache_width(shape));
    s.att.resize(n * qd, 0.0);
    match kv {
        Kv::Run { cache, start } => {
            let (q, k, v, att) = (&s.q[..], &s.k[..], &s.v[..], &mut s.att[..]);
            attend_rows(shape, arith, cache, l, *start, q, k, v, att);
        }
        Kv::Slots(slots) => {
            let mut row = 0;
            for slot in slots.iter_mut() {
                let (a, b) = (row, row + slot.rows);
                let start = slot.cache.len();
                attend_rows(
                    shape,
                    Arith::Steps,
                    slot.cache,
                    l,
                    start,
                    &s.q[a * qd..b * qd],
                    &s.k[a * kd..b * kd],
                    &s.v[a * kd..b * kd],
                    &mut s.att[a * qd..b * qd],
                );
                row = b;
            }
        }
    }
}

/// The keys and values of rows at positions `start..` into `cache` (layer `l`; rotated where
/// a side is quantized, [`KvRotation`]), and their attention over it: one pass over all
/// queries ([`Arith::Batch`]) or one query at a time, as decode steps attend
/// ([`Arith::Steps`]).
#[allow(clippy::too_many_arguments)]
fn attend_rows(
    shape: &AttnShape<'_>,
    arith: Arith,
    cache: &mut KvCache,
    l: usize,
    start: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    att: &mut [f32],
) {
    let n = k.len() / cache_width(shape);
    // A quantized side is kept rotated (llama.cpp's attn_rot_k/v): keys and the queries that
    // meet them, values and the outputs they make.
    let rot = KvRotation::of(cache.types(), shape.head_dim);
    cache.write(l, start, &rotated(k, rot.k), &rotated(v, rot.v));
    let q = rotated(q, rot.k);
    let (keys, values) = cache.rows(l, start + n);
    match arith {
        Arith::Batch => attention(shape, &q[..], keys, values, start, att),
        Arith::Steps => {
            let qd = shape.n_heads * shape.head_dim;
            for (t, (q, o)) in q.chunks_exact(qd).zip(att.chunks_exact_mut(qd)).enumerate() {
                attention(shape, q, keys, values, start + t, o);
            }
        }
    }
    if let Some(block) = rot.v {
        rotate(att, block);
    }
}

/// Values per position of a cache row (keys or values) for `shape`.
fn cache_width(shape: &AttnShape<'_>) -> usize {
    shape.n_kv_heads * shape.head_dim
}
