//! A plan file read without a model: the one reader Python's `formats.plan.load_plan` goes
//! through (`_core.read_plan`). It is the engine's reading ([`PlanFile`], with every check the
//! engine makes, for the plan's own layer and neuron counts), plus the RAM tier's resident
//! neurons (`blk.{i}.ram_neurons`, checked against the neuron table) and the metadata JSON,
//! whose planner-only sections (hardware, predicted speed, solver report, the RAM tier's
//! bytes) Python reads.

use std::path::Path;

use safetensors::SafeTensors;

use crate::error::{Error, Result};
use crate::neuron_table::int32_vector;
use crate::plan_file::PlanFile;
use crate::{bail, ensure};

/// Everything a plan file holds that a reader needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanRecord {
    /// The engine's reading: neuron table, placement, predictor sizes, budget and GPU bytes.
    pub file: PlanFile,
    /// Per layer, the CPU neurons resident in RAM (ascending), when the plan has a RAM tier.
    pub ram_neurons: Option<Vec<Vec<u32>>>,
    /// The `plan` metadata JSON, whole, as written (numbers exactly as the planner wrote them).
    pub json: String,
}

impl PlanRecord {
    /// Read the plan file at `path`; [`Error::Plan`] naming the path for anything malformed.
    pub fn read(path: &Path) -> Result<PlanRecord> {
        let bytes = crate::files::read_regular(path)
            .map_err(|e| Error::Plan(format!("{}: cannot read: {e}", path.display())))?;
        PlanRecord::from_safetensors(&bytes)
            .map_err(|e| Error::Plan(format!("{}: {e}", path.display())))
    }

    /// Parse plan-file bytes, taking the layer and neuron counts from the file itself.
    pub fn from_safetensors(bytes: &[u8]) -> Result<PlanRecord> {
        let (_, text, json) = crate::plan_file::header(bytes)?;
        let counts = crate::plan_file::layer_neurons(&json)?;
        let file = PlanFile::from_safetensors(bytes, &counts)?;
        let ram_neurons = match json.get("ram") {
            None => None,
            Some(_) => Some(ram_neurons(bytes, &file)?),
        };
        Ok(PlanRecord {
            file,
            ram_neurons,
            json: text,
        })
    }
}

/// The RAM tier's id lists: per layer a 1-D int32 tensor of ascending ids below the layer's
/// neuron count, none of them hot.
fn ram_neurons(bytes: &[u8], file: &PlanFile) -> Result<Vec<Vec<u32>>> {
    let st = SafeTensors::deserialize(bytes)
        .map_err(|e| Error::Plan(format!("not a plan file: {e}")))?;
    let mut out = Vec::with_capacity(file.table.layers.len());
    for (i, layer) in file.table.layers.iter().enumerate() {
        let name = format!("blk.{i}.ram_neurons");
        let Ok(t) = st.tensor(&name) else {
            bail!(
                Plan,
                "tensor {name} is missing (the plan has a ram section)"
            );
        };
        let ids = int32_vector(&name, &t)?;
        let ffn = layer.ffn();
        if ids.iter().any(|&v| v < 0 || v as usize >= ffn) {
            bail!(Plan, "{name} has ids outside [0, {ffn})");
        }
        ensure!(
            ids.windows(2).all(|w| w[0] < w[1]),
            Plan,
            "{name} is not sorted and unique"
        );
        let ids: Vec<u32> = ids.into_iter().map(|v| v as u32).collect();
        if let Some(id) = ids.iter().find(|&&id| layer.hot.binary_search(&id).is_ok()) {
            bail!(
                Plan,
                "blk.{i}: neuron {id} both on the GPU and resident in RAM"
            );
        }
        out.push(ids);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::neuron_table::NeuronTable;
    use crate::plan_file::{test_metadata, PLAN_FORMAT};

    fn file(ram: Option<&[Vec<i32>]>) -> Vec<u8> {
        let mut j = serde_json::json!({
            "n_layers": 2, "ffn_dim": 16, "bucket": 4, "context": 32,
            "placement": {
                "attention": [true, false], "predictor": [false, false],
                "ffn_buckets": [1, 0], "output": false,
            },
            "predictors": {"allocations": [[0], [0]], "ranks": [0, 0]},
            "hardware": {"name": "x"},
        });
        if ram.is_some() {
            j["ram"] = serde_json::json!({"cluster": 1});
        }
        let meta = test_metadata(PLAN_FORMAT, "fp", 10, 9, &j.to_string());
        let table = NeuronTable::from_hot_lists(16, &[vec![3, 1], vec![]]).unwrap();
        let ram: Vec<(String, Vec<i32>)> = ram
            .unwrap_or(&[])
            .iter()
            .enumerate()
            .map(|(i, ids)| (format!("blk.{i}.ram_neurons"), ids.clone()))
            .collect();
        table.to_safetensors_with(meta, ram).unwrap()
    }

    #[test]
    fn reads_the_plan_without_a_model() {
        let r = PlanRecord::from_safetensors(&file(None)).unwrap();
        assert_eq!(r.file.table.layers[0].hot, [1, 3]);
        assert_eq!((r.file.gpu_bytes, r.file.budget_bytes), (9, 10));
        assert_eq!(r.ram_neurons, None);
        assert!(
            r.json.contains("\"hardware\":{\"name\":\"x\"}"),
            "{}",
            r.json
        );
        let r = PlanRecord::from_safetensors(&file(Some(&[vec![0, 2], vec![5]]))).unwrap();
        assert_eq!(r.ram_neurons.unwrap(), [vec![0, 2], vec![5]]);
    }

    #[test]
    fn bad_ram_tiers_are_plan_errors() {
        for (ram, why) in [
            (vec![vec![0, 2]], "blk.1.ram_neurons is missing"),
            (vec![vec![2, 0], vec![]], "not sorted and unique"),
            (vec![vec![0, 0], vec![]], "not sorted and unique"),
            (vec![vec![0, 16], vec![]], "outside [0, 16)"),
            (vec![vec![-1], vec![]], "outside [0, 16)"),
            (vec![vec![1], vec![]], "both on the GPU and resident in RAM"),
        ] {
            let e = PlanRecord::from_safetensors(&file(Some(&ram))).unwrap_err();
            assert!(
                matches!(e, Error::Plan(_)) && e.to_string().contains(why),
                "{e}"
            );
        }
        let e = PlanRecord::from_safetensors(b"garbage").unwrap_err();
        assert!(matches!(e, Error::Plan(_)), "{e}");
    }
}
