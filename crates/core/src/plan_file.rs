//! The plan file as the engine reads it: the neuron table (`blk.{i}.gpu_neurons`) plus the
//! placement recorded in its metadata, everything the GPU executor needs to size its
//! allocations (`save_plan` in `python/powerinfer_rs/formats/plan.py` writes it; Python reads it
//! through [`crate::plan_record::PlanRecord`]).
//!
//! Metadata (safetensors `__metadata__`, str → str): `format` = [`PLAN_FORMAT`],
//! `model_fingerprint`, `budget_bytes`, `gpu_bytes` and `plan`, a JSON object of which this
//! reads `n_layers`, `ffn_dim`, `bucket`, `context`, `kv_cache`, `placement.{attention, predictor,
//! ffn_buckets, output}` and `predictors.{allocations, ranks}`; the rest (hardware, predicted
//! speed, solver report) is the planner's business. Layers of their own neuron counts (a mixture
//! of experts' leading dense layers: GLM-4.5) are listed in `layer_neurons` (one count per
//! layer; `ffn_dim` is then the widest); a plan without it has `ffn_dim` neurons in every layer,
//! as every plan before it.

use std::collections::HashMap;
use std::path::Path;

use safetensors::SafeTensors;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::kv_precision::KvTypes;
use crate::neuron_table::NeuronTable;
use crate::{bail, ensure};

/// The `format` metadata value of a plan file.
pub const PLAN_FORMAT: &str = "powerinfer-rs-plan/1";
/// Largest `context`, `bucket` and predictor rank a plan may record (16 Mi): far beyond any
/// model, and small enough that the allocation sizes derived from them (`context · kv_dim`,
/// `bucket · row_bytes`) cannot overflow.
pub const MAX_PLAN_COUNT: usize = 1 << 24;
/// Largest predictor allocation a plan may record, in bytes (1 TiB).
pub const MAX_PLAN_BYTES: usize = 1 << 40;

/// A plan file: the neuron table and the placement the VRAM accounting depends on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanFile {
    /// Hot (GPU) and cold (CPU) neurons per layer.
    pub table: NeuronTable,
    /// Fingerprint of the model the plan was made for (checked by the Python loader).
    pub model_fingerprint: String,
    /// Hot neurons per slab.
    pub bucket: usize,
    /// KV cache positions (and attention-score width) the GPU buffers are sized for.
    pub context: usize,
    /// The precisions of the GPU layers' KV caches (`kv_cache` in the JSON, as
    /// [`KvTypes::from_name`] reads it; f16 when absent).
    pub kv_cache: KvTypes,
    /// Per layer: attention weights, input norm and KV cache on the GPU.
    pub attention: Vec<bool>,
    /// Per layer: the activation predictor on the GPU.
    pub predictor: Vec<bool>,
    /// Per layer: slabs of hot neurons (`ceil(hot / bucket)`, checked against the table).
    pub ffn_buckets: Vec<usize>,
    /// Output head (final norm, output matrix, logits) on the GPU.
    pub output: bool,
    /// Per layer: the predictor's allocations in bytes (`[fc1, fc2]`, or one number).
    pub predictor_allocations: Vec<Vec<usize>>,
    /// Per layer: the predictor's rank (the largest sizes the `scratch.pred` buffer).
    pub predictor_ranks: Vec<usize>,
    /// The VRAM budget the plan was made for.
    pub budget_bytes: usize,
    /// The GPU bytes the planner counted (the sum of its allocation list).
    pub gpu_bytes: usize,
}

impl PlanFile {
    /// Read a plan file for a model whose layer i has `counts[i]` neurons
    /// (`ModelConfig::neuron_counts`).
    pub fn load(path: &Path, counts: &[usize]) -> Result<PlanFile> {
        let bytes = crate::files::read_regular(path)
            .map_err(|e| Error::Plan(format!("{}: cannot read: {e}", path.display())))?;
        PlanFile::from_safetensors(&bytes, counts)
            .map_err(|e| Error::Plan(format!("{}: {e}", path.display())))
    }

    /// Parse plan-file bytes for layers of `counts[i]` neurons; [`Error::Plan`] for anything
    /// malformed or not fitting the model.
    pub fn from_safetensors(bytes: &[u8], counts: &[usize]) -> Result<PlanFile> {
        let (meta, _, j) = header(bytes)?;
        let n_layers = counts.len();
        let table = NeuronTable::from_safetensors(bytes, counts)?;
        let placement = field(&j, "placement")?;
        let predictors = field(&j, "predictors")?;
        let plan = PlanFile {
            table,
            model_fingerprint: meta.get("model_fingerprint").cloned().unwrap_or_default(),
            bucket: uint(field(&j, "bucket")?, "bucket")?,
            context: uint(field(&j, "context")?, "context")?,
            kv_cache: match j.get("kv_cache") {
                None => KvTypes::default(),
                Some(v) => KvTypes::from_name(v.as_str().unwrap_or("(not a string)"))
                    .map_err(|e| Error::Plan(format!("kv_cache: {e}")))?,
            },
            attention: list(field(placement, "attention")?, "attention", Value::as_bool)?,
            predictor: list(field(placement, "predictor")?, "predictor", Value::as_bool)?,
            ffn_buckets: uints(field(placement, "ffn_buckets")?, "ffn_buckets")?,
            output: field(placement, "output")?
                .as_bool()
                .ok_or_else(|| Error::Plan("placement.output is not a boolean".into()))?,
            predictor_allocations: list(
                field(predictors, "allocations")?,
                "predictors.allocations",
                |v| uints(v, "").ok(),
            )?,
            predictor_ranks: uints(field(predictors, "ranks")?, "predictors.ranks")?,
            budget_bytes: meta_uint(&meta, "budget_bytes")?,
            gpu_bytes: meta_uint(&meta, "gpu_bytes")?,
        };
        let theirs = layer_neurons(&j)?;
        ensure!(
            theirs == counts,
            Plan,
            "plan is for {} layers x {} neurons, the model has {n_layers} x {}",
            theirs.len(),
            shown(&theirs),
            shown(counts)
        );
        plan.validate()?;
        Ok(plan)
    }

    /// Check the placement against the neuron table (as `Plan.validate` does in Python).
    fn validate(&self) -> Result<()> {
        let n = self.table.layers.len();
        ensure!(
            self.bucket > 0 && self.context > 0,
            Plan,
            "bucket and context must be positive"
        );
        ensure!(
            self.bucket <= MAX_PLAN_COUNT && self.context <= MAX_PLAN_COUNT,
            Plan,
            "bucket {} or context {} exceeds {MAX_PLAN_COUNT}",
            self.bucket,
            self.context
        );
        if let Some(r) = self.predictor_ranks.iter().find(|&&r| r > MAX_PLAN_COUNT) {
            bail!(Plan, "predictor rank {r} exceeds {MAX_PLAN_COUNT}");
        }
        let sizes = self.predictor_allocations.iter().flatten();
        if let Some(b) = sizes.copied().find(|&b| b > MAX_PLAN_BYTES) {
            bail!(
                Plan,
                "predictor allocation of {b} bytes exceeds {MAX_PLAN_BYTES}"
            );
        }
        for (what, len) in [
            ("attention", self.attention.len()),
            ("predictor", self.predictor.len()),
            ("ffn_buckets", self.ffn_buckets.len()),
            ("predictors.allocations", self.predictor_allocations.len()),
            ("predictors.ranks", self.predictor_ranks.len()),
        ] {
            ensure!(len == n, Plan, "placement {what} has {len} layers, not {n}");
        }
        for (i, a) in self.predictor_allocations.iter().enumerate() {
            ensure!(
                matches!(a.len(), 1 | 2),
                Plan,
                "layer {i}: predictor allocations {a:?}: expected [fc1, fc2] or one size"
            );
        }
        for i in 0..n {
            let slabs = self.n_slabs(i);
            ensure!(
                slabs == self.ffn_buckets[i],
                Plan,
                "layer {i} has {} hot neurons but {} buckets of {}",
                self.table.layers[i].hot.len(),
                self.ffn_buckets[i],
                self.bucket
            );
        }
        Ok(())
    }

    /// Slabs of hot neurons layer `layer` puts on the GPU: `ceil(hot / bucket)`.
    pub fn n_slabs(&self, layer: usize) -> usize {
        self.table.layers[layer].hot.len().div_ceil(self.bucket)
    }

    /// Whether layer `layer` has anything on the GPU.
    pub fn layer_uses_gpu(&self, layer: usize) -> bool {
        self.attention[layer] || self.predictor[layer] || self.n_slabs(layer) > 0
    }

    /// Whether anything is on the GPU (then the shared scratch buffers are allocated).
    pub fn uses_gpu(&self) -> bool {
        self.output || (0..self.table.layers.len()).any(|i| self.layer_uses_gpu(i))
    }
}

/// The neurons of each layer a plan's JSON records: `layer_neurons` where the layers differ,
/// else `ffn_dim` for each of its `n_layers`; each at most [`MAX_PLAN_COUNT`].
pub(crate) fn layer_neurons(j: &Value) -> Result<Vec<usize>> {
    let n_layers = uint(field(j, "n_layers")?, "n_layers")?;
    let ffn = uint(field(j, "ffn_dim")?, "ffn_dim")?;
    ensure!(
        n_layers <= MAX_PLAN_COUNT && ffn <= MAX_PLAN_COUNT,
        Plan,
        "n_layers {n_layers} or ffn_dim {ffn} exceeds {MAX_PLAN_COUNT}"
    );
    let Some(v) = j.get("layer_neurons") else {
        return Ok(vec![ffn; n_layers]);
    };
    let counts = uints(v, "layer_neurons")?;
    ensure!(
        counts.len() == n_layers && counts.iter().max() == Some(&ffn),
        Plan,
        "layer_neurons lists {} layers widest {:?}, the plan {n_layers} of ffn_dim {ffn}",
        counts.len(),
        counts.iter().max()
    );
    Ok(counts)
}

/// Layer neuron counts as an error message shows them: one number when they agree.
fn shown(counts: &[usize]) -> String {
    match counts.split_first() {
        Some((first, rest)) if rest.iter().all(|c| c == first) => first.to_string(),
        _ => format!("{counts:?}"),
    }
}

/// The metadata of plan-file bytes, its `plan` text and that parsed, the format checked.
pub(crate) fn header(bytes: &[u8]) -> Result<(HashMap<String, String>, String, Value)> {
    let (_, header) = SafeTensors::read_metadata(bytes)
        .map_err(|e| Error::Plan(format!("not a plan file: {e}")))?;
    let meta: HashMap<String, String> = header.metadata().clone().unwrap_or_default();
    let format = meta.get("format").map_or("(none)", String::as_str);
    ensure!(
        format == PLAN_FORMAT,
        Plan,
        "format {format:?}, expected {PLAN_FORMAT:?}"
    );
    let Some(text) = meta.get("plan").cloned() else {
        bail!(Plan, "no `plan` metadata");
    };
    let j: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Plan(format!("`plan` metadata is not JSON: {e}")))?;
    Ok((meta, text, j))
}

pub(crate) fn field<'a>(j: &'a Value, key: &str) -> Result<&'a Value> {
    j.get(key)
        .ok_or_else(|| Error::Plan(format!("`plan` metadata lacks {key:?}")))
}

pub(crate) fn uint(v: &Value, what: &str) -> Result<usize> {
    v.as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| Error::Plan(format!("{what} is not a non-negative integer: {v}")))
}

fn uints(v: &Value, what: &str) -> Result<Vec<usize>> {
    list(v, what, |x| uint(x, what).ok())
}

fn list<T>(v: &Value, what: &str, item: impl Fn(&Value) -> Option<T>) -> Result<Vec<T>> {
    let Some(items) = v.as_array() else {
        bail!(Plan, "{what} is not a list: {v}");
    };
    items
        .iter()
        .map(|x| item(x).ok_or_else(|| Error::Plan(format!("{what} holds a bad entry: {x}"))))
        .collect()
}

fn meta_uint(meta: &HashMap<String, String>, key: &str) -> Result<usize> {
    meta.get(key)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| Error::Plan(format!("metadata {key:?} is missing or not an integer")))
}

/// A plan file's metadata for the tests: `format`, the model fingerprint, the budget and GPU
/// bytes, and the plan's JSON.
#[cfg(test)]
pub(crate) fn test_metadata(
    format: &str,
    fingerprint: &str,
    budget_bytes: u64,
    gpu_bytes: u64,
    plan: &str,
) -> HashMap<String, String> {
    HashMap::from([
        ("format".to_string(), format.to_string()),
        ("model_fingerprint".to_string(), fingerprint.to_string()),
        ("budget_bytes".to_string(), budget_bytes.to_string()),
        ("gpu_bytes".to_string(), gpu_bytes.to_string()),
        ("plan".to_string(), plan.to_string()),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_json(buckets: &[usize]) -> String {
        serde_json::json!({
            "format": PLAN_FORMAT, "n_layers": 2, "ffn_dim": 16, "bucket": 4, "context": 32,
            "placement": {
                "attention": [true, false], "predictor": [false, true],
                "ffn_buckets": buckets, "output": true,
            },
            "predictors": {"allocations": [[10, 20], [10, 20]], "ranks": [8, 12]},
        })
        .to_string()
    }

    fn file(plan: &str, format: &str) -> Vec<u8> {
        let t = NeuronTable::from_hot_lists(16, &[vec![1, 2, 3, 4, 5], vec![]]).unwrap();
        let meta = test_metadata(format, "abc", 1000, 900, plan);
        t.to_safetensors(meta).unwrap()
    }

    #[test]
    fn reads_the_placement() {
        let p = PlanFile::from_safetensors(&file(&plan_json(&[2, 0]), PLAN_FORMAT), &[16, 16]);
        let p = p.unwrap();
        assert_eq!((p.bucket, p.context, p.gpu_bytes), (4, 32, 900));
        assert_eq!(p.attention, [true, false]);
        assert_eq!(p.predictor_allocations, [[10, 20], [10, 20]]);
        assert_eq!((p.n_slabs(0), p.n_slabs(1)), (2, 0));
        assert!(p.layer_uses_gpu(1) && p.uses_gpu() && p.output);
    }

    #[test]
    fn bad_files_are_plan_errors() {
        let bad = [
            file(&plan_json(&[1, 0]), PLAN_FORMAT), // buckets disagree with the table
            file(&plan_json(&[2, 0]), "other/1"),
            file("{not json", PLAN_FORMAT),
            file(
                &plan_json(&[2, 0]).replace("\"bucket\":4", "\"bucket\":-4"),
                PLAN_FORMAT,
            ),
            file(&plan_json(&[2, 0, 0]), PLAN_FORMAT),
            // sizes that overflowed `context · kv_dim · 2` and `align(bytes)` in the GPU
            // allocation list, and `bucket · row_bytes` in the slab geometry
            file(
                &plan_json(&[2, 0]).replace("\"context\":32", "\"context\":18446744073709551615"),
                PLAN_FORMAT,
            ),
            file(
                &plan_json(&[2, 0]).replace("[10,20],[10,20]", "[10,20],[18446744073709551615]"),
                PLAN_FORMAT,
            ),
            file(
                &plan_json(&[1, 0]).replace("\"bucket\":4", "\"bucket\":1152921504606846976"),
                PLAN_FORMAT,
            ),
            b"garbage".to_vec(),
        ];
        for b in &bad {
            let e = PlanFile::from_safetensors(b, &[16, 16]).unwrap_err();
            assert!(matches!(e, Error::Plan(_)), "{e}");
        }
        let good = file(&plan_json(&[2, 0]), PLAN_FORMAT);
        assert!(PlanFile::from_safetensors(&good, &[16; 3]).is_err());
        assert!(PlanFile::from_safetensors(&good, &[17, 17]).is_err());
        assert!(PlanFile::from_safetensors(&good, &[8, 16]).is_err());
    }

    #[test]
    fn layers_of_their_own_widths() {
        // GLM-4.5: layer 0 dense of 8 neurons, layer 1 experts of 16; `layer_neurons` says so.
        let t = NeuronTable::from_layer_lists(&[8, 16], &[vec![1, 2, 3, 4, 5], vec![]]).unwrap();
        let own =
            plan_json(&[2, 0]).replace("\"n_layers\":2", "\"n_layers\":2,\"layer_neurons\":[8,16]");
        let bytes = t.to_safetensors(test_metadata(PLAN_FORMAT, "abc", 1000, 900, &own));
        let bytes = bytes.unwrap();
        let p = PlanFile::from_safetensors(&bytes, &[8, 16]).unwrap();
        assert_eq!((p.table.layers[0].ffn(), p.table.layers[1].ffn()), (8, 16));
        let e = PlanFile::from_safetensors(&bytes, &[16, 16]).unwrap_err();
        assert!(e.to_string().contains("[8, 16]"), "{e}");
        // A list that disagrees with n_layers or ffn_dim is refused.
        for bad in ["[8,16,16]", "[8,8]"] {
            let j = own.replace("[8,16]", bad);
            let b = t.to_safetensors(test_metadata(PLAN_FORMAT, "abc", 1000, 900, &j));
            let e = PlanFile::from_safetensors(&b.unwrap(), &[8, 16]).unwrap_err();
            assert!(matches!(e, Error::Plan(_)), "{e}");
        }
    }
}
