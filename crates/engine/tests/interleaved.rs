//! The engine on rows interleaved at load (Q4_0, Q5_0, Q8_0, Q4_K, Q5_K and Q6_K models): which
//! matrices each layout choice interleaves, the same function as the file's rows (batched
//! products bit for bit, one-token steps within the f32 roundings), verification rows and
//! parallel slots bit-identical to one-token steps on every interleaved matrix, and the sparse
//! modes reading an interleaved FFN's rows through the copy gathered on first use.

mod common;

use std::sync::Arc;

use common::{config, diff_and_norm, no_check, quantized_tensors};
use powerinfer_core::{Activation, DType, MatrixShape};
use powerinfer_engine::forward::Logits;
use powerinfer_engine::{Layouts, ModelWeights, Session, Sparsity};

/// The interleaved formats the model-level tests run on (Q4_1 and Q5_1 are Q4_0's and Q5_0's
/// kernels with mins). Q6_K has a layout but the load keeps its rows (its row kernel is the
/// faster: `Interleaved::pays`), tested below.
const FORMATS: [DType; 5] = [
    DType::Q4_0,
    DType::Q5_0,
    DType::Q8_0,
    DType::Q4_K,
    DType::Q5_K,
];

/// Q6_K matrices keep the file's rows in every layout, and the model computes the rows'
/// function bit for bit whatever the layouts say.
#[test]
fn q6_k_keeps_its_rows_in_every_layout() {
    let tokens: Vec<u32> = (0..12).map(|i| (i * 7 % 50) as u32).collect();
    let mut outs = Vec::new();
    for l in [Layouts::ROWS, Layouts::DEFAULT, Layouts::DENSE] {
        let m = model(DType::Q6_K, Activation::Silu, l);
        for n in ["blk.0.attn_q", "output", "blk.0.ffn_gate", "blk.1.ffn_down"] {
            assert!(!m.tensor(n).unwrap().is_interleaved(), "{n}");
        }
        outs.push(steps(&m, Sparsity::Dense, &tokens));
    }
    assert!(outs.windows(2).all(|w| w[0] == w[1]));
}

fn q4_model(act: Activation, layouts: Layouts) -> Arc<ModelWeights> {
    model(DType::Q4_0, act, layouts)
}

/// The test model in `dtype`: for a K-quant, its matrices 256 columns wide or more (whole
/// super-blocks).
fn model(dtype: DType, act: Activation, layouts: Layouts) -> Arc<ModelWeights> {
    let mut c = config(act);
    if dtype.block_size() == 256 {
        (c.dim, c.ffn_dim, c.head_dim) = (256, 512, 64);
    }
    let t = quantized_tensors(&c, dtype);
    Arc::new(ModelWeights::from_tensors_with(c, t, layouts).unwrap())
}

/// The largest relative difference of two logit rows (vocab wide) over all rows.
fn max_rel(a: &[f32], b: &[f32], vocab: usize) -> f32 {
    a.chunks(vocab)
        .zip(b.chunks(vocab))
        .map(|(a, b)| {
            let (d, n) = diff_and_norm(a, b);
            d / n
        })
        .fold(0.0, f32::max)
}

/// Token-by-token logits of `tokens` on a fresh session of `m` in `mode`.
fn steps(m: &Arc<ModelWeights>, mode: Sparsity, tokens: &[u32]) -> Vec<f32> {
    let mut s = Session::new(m.clone(), 2, 0).unwrap();
    s.set_sparsity(mode).unwrap();
    let mut out = Vec::new();
    for &t in tokens {
        out.extend(s.feed(&[t], Logits::Last, no_check).unwrap());
    }
    out
}

#[test]
fn each_layout_interleaves_what_it_says() {
    for dtype in FORMATS {
        each_layout_interleaves_what_it_says_in(dtype);
    }
}

fn each_layout_interleaves_what_it_says_in(dtype: DType) {
    let layered = |l: Layouts| {
        let m = model(dtype, Activation::Silu, l);
        [
            "blk.0.attn_q",
            "blk.1.attn_output",
            "output",
            "blk.0.ffn_gate",
            "blk.1.ffn_down",
        ]
        .map(|n| m.tensor(n).unwrap().is_interleaved())
    };
    assert_eq!(layered(Layouts::ROWS), [false; 5]);
    assert_eq!(layered(Layouts::DEFAULT), [true, true, true, false, false]);
    assert_eq!(layered(Layouts::DENSE), [true; 5]);
    // Tied embeddings: the table is the head, one matrix in one layout.
    let m = model(dtype, Activation::Silu, Layouts::DENSE);
    assert!(m.tensor("token_embd").unwrap().is_interleaved());
    assert_eq!(m.token_embd.as_ptr(), m.output.as_ptr());
}

#[test]
fn interleaved_rows_compute_the_file_rows_function() {
    for dtype in FORMATS {
        interleaved_rows_compute_the_file_rows_function_in(dtype);
    }
}

fn interleaved_rows_compute_the_file_rows_function_in(dtype: DType) {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 11 % 50) as u32).collect();
    let rows = model(dtype, Activation::Silu, Layouts::ROWS);
    let dense = model(dtype, Activation::Silu, Layouts::DENSE);
    let vocab = rows.config.vocab_size;
    // Batched products gather the interleaved rows back: the same bits.
    let all = |m: &Arc<ModelWeights>| {
        let mut s = Session::new(m.clone(), 2, 0).unwrap();
        s.feed(&tokens, Logits::All, no_check).unwrap()
    };
    assert_eq!(all(&rows), all(&dense), "{dtype}");
    // One-token steps: other kernels on the same int16 x, the same values up to f32 roundings
    // (Q4_0 1.7e-5, Q8_0 2.0e-5, Q4_K 1.0e-4 seen: a Q4_K min cancels much of its block's
    // scaled dot; from the batched products 1.1e-4 on rows, 1.4e-4 interleaved). Measured against the batched products (yet other kernels), the interleaved
    // steps are no further off than the row-major ones.
    let (a, b) = (
        steps(&rows, Sparsity::Dense, &tokens),
        steps(&dense, Sparsity::Dense, &tokens),
    );
    let batched = all(&rows);
    let gap = max_rel(&b, &a, vocab);
    let (to_rows, to_interleaved) = (max_rel(&a, &batched, vocab), max_rel(&b, &batched, vocab));
    assert!(
        gap > 0.0 && gap < 2e-4,
        "{dtype} interleaved against rows: {gap:e}"
    );
    // On AVX2 alone (an AMD EPYC without AVX-512: Q5_K interleaved 1.6e-4, rows 7.5e-5) the
    // interleaved kernels round more than twice the row-major ones, still within the f32
    // rounding bound of the steps themselves.
    assert!(
        to_interleaved < (2.0 * to_rows + 1e-5).max(2e-4),
        "{dtype}: interleaved steps {to_interleaved:e} from the batched products, rows {to_rows:e}"
    );
}

#[test]
fn verification_rows_and_slots_are_one_token_steps_bit_for_bit() {
    for dtype in FORMATS {
        verification_rows_and_slots_in(dtype);
    }
}

fn verification_rows_and_slots_in(dtype: DType) {
    let m = model(dtype, Activation::Silu, Layouts::DENSE);
    let prompt: Vec<u32> = (0..9).map(|i| (i * 5 % 50) as u32).collect();
    let other: Vec<u32> = (0..5).map(|i| (i * 3 % 50) as u32).collect();
    let draft = [3u32, 17, 29, 41];
    // A session after its prompt's batched prefill.
    let after = |p: &[u32]| {
        let mut s = Session::new(m.clone(), 2, 0).unwrap();
        s.feed(p, Logits::Last, no_check).unwrap();
        s
    };
    let (mut one, mut batch) = (after(&prompt), after(&prompt));
    let want: Vec<f32> = draft
        .iter()
        .flat_map(|&t| one.feed(&[t], Logits::Last, no_check).unwrap())
        .collect();
    let got = batch.feed(&draft, Logits::Steps, no_check).unwrap();
    assert_eq!(got, want, "{dtype} verification rows");
    // Two sessions in one pass, each its own step's bits.
    let (mut a, mut b, mut c) = (after(&prompt), after(&other), after(&other));
    let alone = c.feed(&[8], Logits::Last, no_check).unwrap();
    let out = Session::decode_slots(&mut [&mut a, &mut b], &[vec![draft[0]], vec![8]]).unwrap();
    assert_eq!(out[0], &want[..m.config.vocab_size]);
    assert_eq!(out[1], alone, "{dtype}");
}

#[test]
fn sparse_modes_read_an_interleaved_ffn_through_gathered_rows() {
    let tokens: Vec<u32> = (0..12).map(|i| (i * 13 % 50) as u32).collect();
    let rows = q4_model(Activation::Relu, Layouts::ROWS);
    let dense = q4_model(Activation::Relu, Layouts::DENSE);
    assert!(!dense.layers[0].w_up.has_indexed_copy());
    let a = steps(&rows, Sparsity::ExactRelu, &tokens);
    let b = steps(&dense, Sparsity::ExactRelu, &tokens);
    // Only the gate's kernel differs (the up rows read by index and the transposed down are
    // the same bytes): its f32 roundings, through the neurons' firing and the down pass's
    // re-quantized transposed rows (1.7e-4 seen; the dense pass on this model, 2.1e-5).
    let gap = max_rel(&b, &a, rows.config.vocab_size);
    assert!(
        gap < 1e-3,
        "exact-relu on interleaved against rows: {gap:e}"
    );
    // The up rows of the neurons that fire were read by index, from the gathered copy.
    assert!(dense.layers.iter().all(|l| l.w_up.has_indexed_copy()));
    assert!(!rows.layers[0].w_up.has_indexed_copy());
}

#[test]
fn the_load_says_beforehand_what_it_repacks() {
    // What `Layouts::repacks` predicts (the extension copies nothing it names) is what the
    // load does, matrix by matrix (the tied embedding table aside).
    let c = config(Activation::Silu);
    for layouts in [Layouts::ROWS, Layouts::DEFAULT, Layouts::DENSE] {
        let t = quantized_tensors(&c, DType::Q4_0);
        let shapes: Vec<(String, MatrixShape)> = t
            .iter()
            .filter(|(_, w)| w.rows > 1)
            .map(|(n, w)| (n.clone(), w.into()))
            .collect();
        let m = ModelWeights::from_tensors_with(c.clone(), t, layouts).unwrap();
        for (name, shape) in shapes.iter().filter(|(n, _)| n != "token_embd") {
            let done = m.tensor(name).unwrap().is_interleaved();
            assert_eq!(layouts.repacks(name, *shape), done, "{layouts:?} {name}");
        }
    }
    let q = |dtype: DType, rows| MatrixShape {
        dtype,
        rows,
        cols: 64.max(dtype.block_size()),
    };
    assert!(Layouts::DEFAULT.repacks("output", q(DType::Q4_1, 64)));
    assert!(!Layouts::DEFAULT.repacks("blk.2.ffn_up", q(DType::Q4_0, 64)));
    assert!(Layouts::DENSE.repacks("blk.2.attn_q", q(DType::Q8_0, 64)));
    assert!(Layouts::DENSE.repacks("blk.2.attn_q", q(DType::Q5_0, 64)));
    assert!(!Layouts::DENSE.repacks("blk.2.attn_q", q(DType::Q3_K, 64)));
    assert!(!Layouts::DENSE.repacks("blk.2.attn_q", q(DType::Q4_0, 4)));
    assert!(!Layouts::DENSE.repacks("blk.2.ffn_norm", q(DType::Q4_0, 64)));
}
