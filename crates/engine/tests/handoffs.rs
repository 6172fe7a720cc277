//! What the bindings hand over, typed once in the engine: sparsity modes by name, predictors
//! (fc2 transposed here), token ids, tensor names, and plan files (read once, checked against
//! the model, the engine's own allocations and the VRAM budget).

mod common;

use std::collections::HashMap;

use common::{model, values};
use powerinfer_core::{Activation, Error, NeuronTable, Weight, PLAN_FORMAT};
use powerinfer_engine::{
    token_ids, InputScore, InputSparsity, LayerPredictor, Placement, PredictorInput, Predictors,
    Sparsity, SparsityMode,
};

#[test]
fn sparsity_modes_parse_by_name_and_round_trip() {
    let names: Vec<&str> = SparsityMode::ALL.iter().map(|m| m.name()).collect();
    assert_eq!(
        names,
        ["dense", "exact-relu", "threshold", "predictor", "input"]
    );
    for m in SparsityMode::ALL {
        assert_eq!(m.name().parse::<SparsityMode>().unwrap(), m);
    }
    let e = "sparse".parse::<SparsityMode>().unwrap_err();
    assert!(matches!(e, Error::Unsupported(_)) && e.to_string().contains("exact-relu"));
    assert!(matches!(
        Sparsity::new(SparsityMode::Threshold, None, None),
        Err(Error::Plan(_))
    ));
    assert!(matches!(
        Sparsity::new(SparsityMode::Predictor, Some(vec![0.0]), None),
        Err(Error::Plan(_))
    ));
    let t = Sparsity::new(SparsityMode::Threshold, Some(vec![0.5, 0.25]), None).unwrap();
    assert_eq!((t.mode(), t.name()), (SparsityMode::Threshold, "threshold"));
    // The input mode takes its own typed parameters, never a per-layer list.
    assert!(matches!(
        Sparsity::new(SparsityMode::Input, Some(vec![0.5, 0.25]), None),
        Err(Error::Plan(_))
    ));
    let input = Sparsity::Input(InputSparsity {
        thresholds: vec![[0.1, 0.2, 0.3, 0.4]; 2],
        output: 0.0,
        score: "wina".parse::<InputScore>().unwrap(),
    });
    assert_eq!(input.name(), "input");
    let mut c = model(Activation::Silu).config.clone();
    assert_eq!(c.n_layers, 2);
    assert!(input.validate(&c).is_ok());
    c.n_layers = 3;
    assert!(matches!(input.validate(&c), Err(Error::Plan(_))));
    assert!("magic".parse::<InputScore>().is_err());
    assert_eq!(
        "ffn_inp".parse::<PredictorInput>().unwrap(),
        PredictorInput::FfnInp
    );
    assert!("ffn".parse::<PredictorInput>().is_err());
}

#[test]
fn a_predictor_transposes_fc2_once() {
    let (rank, dim, ffn) = (5, 64, 96);
    let fc1 = Weight::from_f32(rank, dim, &values(rank * dim, 1, 1.0)).unwrap();
    let fc2_vals = values(ffn * rank, 2, 1.0);
    let fc2 = Weight::from_f32(ffn, rank, &fc2_vals).unwrap();
    let p = LayerPredictor::new(fc1.clone(), fc2.clone(), 0.5).unwrap();
    assert_eq!((p.fc2_t.rows, p.fc2_t.cols), (rank, ffn));
    for r in 0..rank {
        let row: Vec<f32> = p
            .fc2_t
            .row(r)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let col: Vec<f32> = (0..ffn).map(|n| fc2_vals[n * rank + r]).collect();
        assert_eq!(row, col, "row {r} of fc2_t");
    }
    let wrong_rank = Weight::from_f32(ffn, rank + 1, &values(ffn * (rank + 1), 3, 1.0)).unwrap();
    assert!(matches!(
        LayerPredictor::new(fc1.clone(), wrong_rank, 0.5),
        Err(Error::Plan(_))
    ));
    assert!(matches!(
        LayerPredictor::new(fc1.clone(), fc2.clone(), f32::NAN),
        Err(Error::Plan(_))
    ));
    // A set of the right shape is accepted by a session's mode check.
    let m = model(Activation::Relu);
    let set = Predictors {
        layers: vec![p.clone(), p],
        input: PredictorInput::FfnNorm,
        experts: Vec::new(),
    };
    let mode = Sparsity::new(SparsityMode::Predictor, None, Some(set)).unwrap();
    let c = &m.config;
    mode.validate(c).unwrap();
}

#[test]
fn token_ids_are_checked_in_one_place() {
    assert_eq!(token_ids(&[0, 49, 7], 50).unwrap(), [0, 49, 7]);
    for bad in [-1i64, 50, i64::from(u32::MAX) + 1] {
        let e = token_ids(&[3, bad], 50).unwrap_err();
        assert!(matches!(e, Error::Token(_)), "{bad}: {e}");
        assert!(e.to_string().contains(&bad.to_string()), "{e}");
    }
}

#[test]
fn tensors_resolve_by_canonical_name() {
    let m = model(Activation::Silu);
    let ptr = |name: &str| m.tensor(name).map(|w| w.as_ptr());
    assert_eq!(ptr("blk.1.ffn_up"), Some(m.layers[1].w_up.as_ptr()));
    assert_eq!(ptr("token_embd"), Some(m.token_embd.as_ptr()));
    assert_eq!(ptr("output"), Some(m.output.as_ptr()));
    for bad in [
        "blk.2.ffn_up",
        "blk.x.attn_q",
        "blk.0.attn_norm",
        "blk.0",
        "nope",
    ] {
        assert!(m.tensor(bad).is_none(), "{bad}");
    }
}

/// A plan file for the tiny model: attention of layer 0 on the GPU when `gpu`, its recorded
/// GPU bytes `gpu_bytes`, made for model `fingerprint`.
fn plan_file(
    dir: &std::path::Path,
    gpu: bool,
    gpu_bytes: usize,
    fingerprint: &str,
) -> std::path::PathBuf {
    let plan = serde_json::json!({
        "n_layers": 2, "ffn_dim": 96, "bucket": 32, "context": 64,
        "placement": {
            "attention": [gpu, false], "predictor": [false, false],
            "ffn_buckets": [0, 0], "output": false,
        },
        "predictors": {"allocations": [[0, 0], [0, 0]], "ranks": [0, 0]},
    });
    let meta = HashMap::from([
        ("format".to_string(), PLAN_FORMAT.to_string()),
        ("model_fingerprint".to_string(), fingerprint.to_string()),
        ("budget_bytes".to_string(), "0".to_string()),
        ("gpu_bytes".to_string(), gpu_bytes.to_string()),
        ("plan".to_string(), plan.to_string()),
    ]);
    let bytes = NeuronTable::all_cold(2, 96).to_safetensors(meta).unwrap();
    let path = dir.join(format!("plan-{gpu}-{gpu_bytes}-{fingerprint}.safetensors"));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn plans_are_read_once_and_checked_against_the_model() {
    let m = model(Activation::Silu);
    let dir = std::env::temp_dir().join(format!("powerinfer-handoffs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let cpu = Placement::load(&m, &plan_file(&dir, false, 0, "fp"), Some("fp"), Some(0)).unwrap();
    assert!(cpu.allocations.is_empty() && cpu.gpu_bytes() == 0);
    let e = Placement::load(&m, &plan_file(&dir, false, 0, "other"), Some("fp"), None).unwrap_err();
    assert!(
        matches!(e, Error::Plan(_)) && e.to_string().contains("not this one"),
        "{e}"
    );

    // The engine's own list decides the bytes: a plan that counts fewer is refused.
    let listed = Placement::read(&m, &plan_file(&dir, true, 0, "fp"), None).unwrap();
    let need: usize = listed.allocations.iter().map(|(_, b)| b).sum();
    assert!(listed.allocations.iter().any(|(n, _)| n == "blk.0.attn_q") && need > 0);
    let e = Placement::load(&m, &plan_file(&dir, true, need - 256, "fp"), None, None).unwrap_err();
    assert!(
        matches!(e, Error::Plan(_)) && e.to_string().contains("would allocate"),
        "{e}"
    );

    let gpu = plan_file(&dir, true, need, "fp");
    assert_eq!(
        Placement::load(&m, &gpu, Some("fp"), Some(need))
            .unwrap()
            .gpu_bytes(),
        need
    );
    let e = Placement::load(&m, &gpu, Some("fp"), Some(need - 1)).unwrap_err();
    assert!(matches!(e, Error::VramBudget(_)), "{e}");
    let junk = dir.join("junk.safetensors");
    std::fs::write(&junk, b"not a plan").unwrap();
    assert!(matches!(
        Placement::load(&m, &junk, None, None),
        Err(Error::Plan(_))
    ));
    std::fs::remove_dir_all(&dir).unwrap();
}
