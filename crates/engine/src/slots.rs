//! Decode steps of several conversations in one forward pass (the server's parallel slots):
//! each slot brings its own KV cache, mode and next token(s); the products of every layer run
//! once over all their rows (the weights read once per step, not once per slot), attention runs
//! per slot over its own cache, and every row is bit-identical to the one-token decode step of
//! its own session (so a conversation's text never depends on what else runs beside it).
//!
//! The rows use the arithmetic of [`Logits::Steps`]: the products through `matvec_tokens`
//! (each token with the one-token matvec's arithmetic, the weights shared), attention one query
//! at a time, sparse FFN modes and MoE steps per row in the row's own mode.

use powerinfer_core::{ensure, Result};

use crate::forward::{
    attention_block, embed, ffn_block, forward, output_block, Angles, Kv, Logits, Rows, Scratch,
    SlotKv,
};
use crate::kv_cache::KvCache;
use crate::phases::{mark, Phase};
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

/// One conversation's part of a [`forward_slots`] pass.
pub struct Slot<'a> {
    /// Its KV cache; its tokens go at positions `cache.len()..`.
    pub cache: &'a mut KvCache,
    /// Its FFN mode.
    pub mode: &'a Sparsity,
    /// Its next tokens (one for a decode step, more for speculative verification).
    pub tokens: &'a [u32],
}

/// Run every slot's tokens after its cached context in one pass, and return each slot's
/// logits (its tokens × vocab, row-major), every row bit-identical to what a one-token decode
/// step of that slot alone gives after the tokens before it. On error no cache changes length.
///
/// Modes whose decode steps cannot share a pass (the input mode, models whose router reads the
/// residual before attention) run slot after slot, with the same arithmetic.
pub fn forward_slots(
    model: &ModelWeights,
    slots: &mut [Slot<'_>],
    scratch: &mut Scratch,
) -> Result<Vec<Vec<f32>>> {
    let c = &model.config;
    for s in slots.iter() {
        ensure!(
            !s.tokens.is_empty(),
            Shape,
            "a slot with no tokens to decode"
        );
        if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
            crate::forward::token_ids(&[i64::from(bad)], c.vocab_size)?;
        }
    }
    let early = model.program.layers.iter().any(|l| l.early_router);
    let input = slots.iter().any(|s| matches!(s.mode, Sparsity::Input(_)));
    if early || input || slots.len() == 1 {
        return one_by_one(model, slots, scratch);
    }
    for s in slots.iter_mut() {
        s.cache.reserve(s.tokens.len())?;
    }
    let tokens: Vec<u32> = slots
        .iter()
        .flat_map(|s| s.tokens.iter().copied())
        .collect();
    let n = tokens.len();
    // Each row's mode and position.
    let rows: Vec<(&Sparsity, usize)> = slots
        .iter()
        .flat_map(|s| (0..s.tokens.len()).map(|t| (s.mode, s.cache.len() + t)))
        .collect();
    let positions: Vec<usize> = rows.iter().map(|r| r.1).collect();

    let s = scratch;
    s.arith = crate::ffn::Arith::Steps;
    s.x.clear();
    let mut x = Vec::new();
    for slot in slots.iter() {
        embed(model, slot.tokens, slot.cache.len(), &mut x)?;
        s.x.extend_from_slice(&x);
    }
    let angles = Angles::at(c, &positions);
    let mut kvs: Vec<SlotKv<'_>> = slots
        .iter_mut()
        .map(|s| SlotKv {
            rows: s.tokens.len(),
            cache: &mut *s.cache,
        })
        .collect();
    mark(Phase::Other);
    for l in 0..model.layers.len() {
        if model.program.layers[l].save_residual {
            s.par_in.clone_from(&s.x);
        }
        // Attention reads no mode but the input mode's, which never comes here.
        let kv = &mut Kv::Slots(&mut kvs);
        attention_block(model, l, &Sparsity::Dense, kv, s, None, n, &angles)?;
        ffn_block(model, l, &Rows::Slots(&rows), s, None, n)?;
    }
    let logits = output_block(model, &Sparsity::Dense, s, positions[0], 0, n)?;
    let vocab = c.vocab_size;
    let mut out = Vec::with_capacity(kvs.len());
    let mut row = 0;
    for kv in kvs {
        let len = kv.cache.len();
        kv.cache.set_len(len + kv.rows);
        out.push(logits[row * vocab..(row + kv.rows) * vocab].to_vec());
        row += kv.rows;
    }
    Ok(out)
}

/// [`forward_slots`] one slot at a time (each its own `Logits::Steps` pass); on error the
/// slots already run are cut back.
fn one_by_one(
    model: &ModelWeights,
    slots: &mut [Slot<'_>],
    scratch: &mut Scratch,
) -> Result<Vec<Vec<f32>>> {
    let starts: Vec<usize> = slots.iter().map(|s| s.cache.len()).collect();
    let mut out = Vec::with_capacity(slots.len());
    for s in slots.iter_mut() {
        match forward(
            model,
            s.mode,
            s.cache,
            scratch,
            None,
            s.tokens,
            Logits::Steps,
        ) {
            Ok(logits) => out.push(logits),
            Err(e) => {
                for (s, &start) in slots.iter_mut().zip(&starts) {
                    s.cache.truncate(start);
                }
                return Err(e);
            }
        }
    }
    Ok(out)
}
