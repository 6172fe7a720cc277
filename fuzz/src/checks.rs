//! What each Rust fuzz target does with one input, shared by the cargo-fuzz targets
//! (`fuzz/fuzz_targets/`) and the stable replay of the seed corpus
//! (`crates/engine/tests/fuzz_seeds.rs`). Each function panics on a finding: an untyped error,
//! a broken invariant, or a silent NaN.

use powerinfer_core::testing::tiny_config;
use powerinfer_core::{Activation, Buffer, DType, Error, PlanFile, Weight};
use powerinfer_cuda::alloc_plan::total_bytes;
use powerinfer_cuda::{gpu_allocations, LayerTensors, ModelTensors};
use powerinfer_engine::weights::first_non_finite_row;

fn zeros(dtype: DType, rows: usize, cols: usize) -> Weight {
    let bytes = vec![0u8; rows * dtype.row_bytes(cols).unwrap()];
    Weight::new(dtype, rows, cols, Buffer::from_bytes(&bytes)).unwrap()
}

/// The device allocation list the engine derives from a parsed plan, on a tiny model of
/// `n_layers` layers of `ffn` neurons: it must be a typed error or a list whose sizes add up
/// without overflowing.
fn allocations(plan: &PlanFile, n_layers: usize, ffn: usize) {
    let mut config = tiny_config(Activation::Relu);
    (config.n_layers, config.ffn_dim) = (n_layers, ffn);
    let (dim, kv_dim) = (config.dim, config.kv_dim());
    let (q, kv, o) = (
        zeros(DType::Q4_0, dim, dim),
        zeros(DType::Q4_0, kv_dim, dim),
        zeros(DType::Q4_0, dim, dim),
    );
    let (gate, up) = (zeros(DType::Q8_0, ffn, dim), zeros(DType::F16, ffn, dim));
    let out = zeros(DType::Q8_0, config.vocab_size, dim);
    let layer = LayerTensors {
        wq: (&q).into(),
        wk: (&kv).into(),
        wv: (&kv).into(),
        wo: (&o).into(),
        gate: (&gate).into(),
        up: (&up).into(),
        down_t: DType::Q8_0,
        shared: None,
    };
    let model = ModelTensors {
        config: &config,
        layers: vec![layer; n_layers],
        output: (&out).into(),
    };
    match gpu_allocations(&model, plan) {
        Ok(list) => {
            let sum = list
                .iter()
                .try_fold(0usize, |acc, (_, b)| acc.checked_add(*b));
            assert_eq!(sum, Some(total_bytes(&list)), "allocation sizes overflow");
        }
        Err(Error::Plan(_) | Error::Shape(_) | Error::Unsupported(_)) => {}
        Err(e) => panic!("untyped allocation error: {e:?}"),
    }
}

/// `PlanFile::from_safetensors` (and the neuron table inside it), then the GPU allocation list
/// the engine derives from it. Input: byte 0 = layer count (mod 8), byte 1 = neurons per layer,
/// then the file's bytes. Every input must end in a `Plan` error or a plan that passes its own
/// invariants and sizes its allocations without overflow.
pub fn plan_file(data: &[u8]) {
    let [l, f, bytes @ ..] = data else { return };
    let (n_layers, ffn) = (usize::from(*l % 8), usize::from(*f));
    match PlanFile::from_safetensors(bytes, &vec![ffn; n_layers]) {
        Ok(plan) => {
            assert_eq!(plan.table.layers.len(), n_layers);
            for (i, layer) in plan.table.layers.iter().enumerate() {
                assert_eq!(layer.hot.len() + layer.cold.len(), ffn);
                assert_eq!(plan.n_slabs(i), plan.ffn_buckets[i]);
            }
            let _ = plan.uses_gpu();
            allocations(&plan, n_layers, ffn);
        }
        Err(Error::Plan(_)) => {}
        Err(e) => panic!("untyped plan-file error: {e:?}"),
    }
}

/// The weight layout check (`Weight::new`: size against dtype and shape), the non-finite scan
/// the engine runs on load (`first_non_finite_row`) and `dequantize_row` (dispatched SIMD and
/// the scalar reference). Input: byte 0 = dtype, byte 1 = rows (mod 5), byte 2 = columns (in
/// blocks mod 9, plus one when >= 128: not a whole block), then the weight bytes. A weight the
/// scan passes must decode to finite values only (no silent NaN).
pub fn weight_rows(data: &[u8]) {
    let [d, r, c, bytes @ ..] = data else { return };
    let dtype = DType::BASIC[usize::from(*d) % DType::BASIC.len()];
    let rows = usize::from(*r % 5);
    let cols = usize::from(*c % 9) * dtype.block_size() + usize::from(*c >= 128);
    let w = match Weight::new(dtype, rows, cols, Buffer::from_bytes(bytes)) {
        Ok(w) => w,
        Err(Error::Shape(_)) => return,
        Err(e) => panic!("untyped weight error: {e:?}"),
    };
    let bad_row = first_non_finite_row(&w);
    let mut fast = vec![0.0f32; cols];
    let mut slow = vec![0.0f32; cols];
    for row in 0..rows {
        let decoded = powerinfer_cpu::dequantize_row(dtype, w.row(row), &mut fast)
            .and_then(|()| powerinfer_cpu::reference::dequantize_row(dtype, w.row(row), &mut slow));
        if let Err(e) = decoded {
            panic!("a checked weight's row does not decode: {e:?}");
        }
        if bad_row.is_none_or(|b| row < b) {
            assert!(
                fast.iter().chain(&slow).all(|v| v.is_finite()),
                "row {row} of a {dtype} weight passed the scan but decodes to non-finite values"
            );
        }
    }
}

/// The neuron store's header reader (`StoreLayout::parse`, run on the first bytes of every store
/// file opened). Input: byte 0 (even: the file is the rest's length; odd: far longer), then the
/// file's first bytes. Every input must end in a `ModelFile` error or a layout that fits in the
/// file, whose layers follow one another aligned, whose clusters cover its neurons, and whose
/// own header reads back as itself.
pub fn neuron_store_header(data: &[u8]) {
    use powerinfer_engine::neuron_store::{StoreLayout, ALIGN};
    let [s, bytes @ ..] = data else { return };
    let file_bytes = if s % 2 == 0 {
        bytes.len() as u64
    } else {
        u64::MAX
    };
    match StoreLayout::parse(bytes, file_bytes, "fuzz") {
        Ok(layout) => {
            assert!(layout.file_bytes() <= file_bytes);
            assert_eq!(layout.header_bytes % ALIGN, 0);
            let mut at = layout.header_bytes as u64;
            for l in &layout.layers {
                assert_eq!(l.offset, at);
                assert_eq!(l.cluster_bytes % ALIGN, 0);
                assert!(l.n_clusters * layout.cluster >= layout.ffn);
                at = l.cluster_offset(l.n_clusters);
            }
            assert_eq!(at, layout.file_bytes());
            let again = StoreLayout::parse(&layout.header(), layout.file_bytes(), "again");
            assert_eq!(again.expect("its own header"), layout);
        }
        Err(Error::ModelFile(_)) => {}
        Err(e) => panic!("untyped neuron-store error: {e:?}"),
    }
}
