//! The neuron table: per FFN layer, which neurons are hot (placed on the GPU) and which are cold
//! (CPU), with the index maps both sides need: compact row → neuron id, and neuron id → (device,
//! compact row). Built from a plan or from lists, validated, stored in safetensors as the plan
//! file's `blk.{i}.gpu_neurons` tensors (sorted int32 hot ids per layer).

use std::collections::HashMap;

use safetensors::tensor::{Dtype, TensorView};
use safetensors::SafeTensors;

use crate::error::{Error, Result};
use crate::{bail, ensure};

/// Where a neuron's rows live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Gpu,
    Cpu,
}

/// One layer's split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerTable {
    /// Hot neuron ids, ascending: compact GPU row r holds neuron `hot[r]`.
    pub hot: Vec<u32>,
    /// Cold neuron ids, ascending: compact CPU row r holds neuron `cold[r]`.
    pub cold: Vec<u32>,
    /// Per neuron id: its side and its compact row there.
    pub place: Vec<(Side, u32)>,
}

impl LayerTable {
    /// The split of `ffn` neurons with the given hot ids (any order; validated).
    pub fn new(ffn: usize, hot_ids: &[u32]) -> Result<LayerTable> {
        let mut hot = hot_ids.to_vec();
        hot.sort_unstable();
        if let Some(&bad) = hot.iter().find(|&&i| i as usize >= ffn) {
            bail!(Plan, "hot neuron {bad} is outside 0..{ffn}");
        }
        if let Some(w) = hot.windows(2).find(|w| w[0] == w[1]) {
            bail!(Plan, "hot neuron {} is listed twice", w[0]);
        }
        let mut place = vec![(Side::Cpu, 0u32); ffn];
        for (r, &id) in hot.iter().enumerate() {
            place[id as usize] = (Side::Gpu, r as u32);
        }
        let mut cold = Vec::with_capacity(ffn - hot.len());
        for (id, p) in place.iter_mut().enumerate() {
            if p.0 == Side::Cpu {
                *p = (Side::Cpu, cold.len() as u32);
                cold.push(id as u32);
            }
        }
        Ok(LayerTable { hot, cold, place })
    }

    /// Neurons in the layer.
    pub fn ffn(&self) -> usize {
        self.place.len()
    }
}

/// Every layer's split.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeuronTable {
    pub layers: Vec<LayerTable>,
}

impl NeuronTable {
    /// Everything on the CPU.
    pub fn all_cold(n_layers: usize, ffn: usize) -> NeuronTable {
        let layer = LayerTable::new(ffn, &[]).expect("empty hot set is valid");
        NeuronTable {
            layers: vec![layer; n_layers],
        }
    }

    /// From per-layer hot id lists, every layer of `ffn` neurons.
    pub fn from_hot_lists(ffn: usize, lists: &[Vec<u32>]) -> Result<NeuronTable> {
        NeuronTable::from_layer_lists(&vec![ffn; lists.len()], lists)
    }

    /// From per-layer hot id lists, layer i of `counts[i]` neurons (a mixture of experts'
    /// leading dense layers have their own count: `ModelConfig::layer_neurons`).
    pub fn from_layer_lists(counts: &[usize], lists: &[Vec<u32>]) -> Result<NeuronTable> {
        ensure!(
            counts.len() == lists.len(),
            Plan,
            "{} hot lists for {} layers",
            lists.len(),
            counts.len()
        );
        let layers = lists
            .iter()
            .zip(counts)
            .enumerate()
            .map(|(i, (l, &ffn))| {
                LayerTable::new(ffn, l).map_err(|e| Error::Plan(format!("layer {i}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(NeuronTable { layers })
    }

    /// Check the table fits a model whose layer i has `counts[i]` neurons
    /// (`ModelConfig::neuron_counts`).
    pub fn check_model(&self, counts: &[usize]) -> Result<()> {
        ensure!(
            self.layers.len() == counts.len(),
            Plan,
            "neuron table has {} layers, the model {}",
            self.layers.len(),
            counts.len()
        );
        let mut layers = self.layers.iter().zip(counts).enumerate();
        if let Some((i, (l, ffn))) = layers.find(|(_, (l, &ffn))| l.ffn() != ffn) {
            bail!(
                Plan,
                "neuron table layer {i} has {} neurons, the model {ffn}",
                l.ffn()
            );
        }
        Ok(())
    }

    /// The safetensors bytes: `blk.{i}.gpu_neurons` int32 per layer, plus `metadata`.
    pub fn to_safetensors(&self, metadata: HashMap<String, String>) -> Result<Vec<u8>> {
        self.to_safetensors_with(metadata, Vec::new())
    }

    /// [`NeuronTable::to_safetensors`] with more int32 id lists beside the table's, `(name,
    /// ids)` each (a plan's RAM tier writes `blk.{i}.ram_neurons` so).
    pub fn to_safetensors_with(
        &self,
        metadata: HashMap<String, String>,
        extra: Vec<(String, Vec<i32>)>,
    ) -> Result<Vec<u8>> {
        let hot = self.layers.iter().enumerate().map(|(i, l)| {
            let ids = l.hot.iter().map(|&v| v as i32).collect();
            (format!("blk.{i}.gpu_neurons"), ids)
        });
        let bytes: Vec<(String, Vec<u8>, usize)> = hot
            .chain(extra)
            .map(|(name, ids): (String, Vec<i32>)| {
                let b: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
                (name, b, ids.len())
            })
            .collect();
        let views = bytes
            .iter()
            .map(|(name, b, n)| {
                TensorView::new(Dtype::I32, vec![*n], b)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| Error::Plan(format!("{name}: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize(views, Some(metadata)).map_err(|e| Error::Plan(e.to_string()))
    }

    /// Parse safetensors bytes (see [`NeuronTable::to_safetensors`]) for layers of `counts[i]`
    /// neurons each.
    pub fn from_safetensors(bytes: &[u8], counts: &[usize]) -> Result<NeuronTable> {
        let n_layers = counts.len();
        let st = SafeTensors::deserialize(bytes)
            .map_err(|e| Error::Plan(format!("not a plan file: {e}")))?;
        let mut lists = Vec::with_capacity(n_layers);
        for i in 0..n_layers {
            let name = format!("blk.{i}.gpu_neurons");
            let t = st
                .tensor(&name)
                .map_err(|_| Error::Plan(format!("lacks {name}")))?;
            let ids = int32_vector(&name, &t)?
                .into_iter()
                .map(|v| {
                    u32::try_from(v).map_err(|_| Error::Plan(format!("{name}: negative id {v}")))
                })
                .collect::<Result<Vec<u32>>>()?;
            lists.push(ids);
        }
        ensure!(
            st.names().iter().all(|n| !n.starts_with("blk.")
                || n.ends_with(".gpu_neurons")
                || n.ends_with(".ram_neurons")),
            Plan,
            "unexpected tensors in the plan file"
        );
        let table = NeuronTable::from_layer_lists(counts, &lists)?;
        table.check_model(counts)?;
        Ok(table)
    }
}

/// The values of plan-file tensor `name`, which must be a 1-D int32 tensor (`Error::Plan`
/// otherwise).
pub(crate) fn int32_vector(name: &str, t: &TensorView<'_>) -> Result<Vec<i32>> {
    ensure!(
        t.dtype() == Dtype::I32 && t.shape().len() == 1,
        Plan,
        "{name} must be a 1-D int32 tensor, got {:?} {:?}",
        t.dtype(),
        t.shape()
    );
    Ok(t.data()
        .chunks_exact(4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_are_inverse() {
        let l = LayerTable::new(10, &[7, 2, 5]).unwrap();
        assert_eq!(l.hot, vec![2, 5, 7]);
        assert_eq!(l.cold, vec![0, 1, 3, 4, 6, 8, 9]);
        for (r, &id) in l.hot.iter().enumerate() {
            assert_eq!(l.place[id as usize], (Side::Gpu, r as u32));
        }
        for (r, &id) in l.cold.iter().enumerate() {
            assert_eq!(l.place[id as usize], (Side::Cpu, r as u32));
        }
    }

    #[test]
    fn bad_lists_are_refused() {
        assert!(matches!(LayerTable::new(4, &[4]), Err(Error::Plan(_))));
        assert!(matches!(LayerTable::new(4, &[1, 1]), Err(Error::Plan(_))));
        let t = NeuronTable::from_hot_lists(8, &[vec![1], vec![]]).unwrap();
        assert!(t.check_model(&[8, 8]).is_ok());
        assert!(t.check_model(&[8, 8, 8]).is_err());
        assert!(t.check_model(&[8, 9]).is_err());
        // Layers of their own widths (GLM-4.5's dense lead, then experts).
        let t = NeuronTable::from_layer_lists(&[4, 8], &[vec![3], vec![7]]).unwrap();
        assert!(t.check_model(&[4, 8]).is_ok() && t.check_model(&[8, 8]).is_err());
        assert!(NeuronTable::from_layer_lists(&[4, 8], &[vec![5], vec![]]).is_err());
        assert!(NeuronTable::from_layer_lists(&[4], &[vec![], vec![]]).is_err());
        assert_eq!(NeuronTable::all_cold(2, 8).layers[1].cold.len(), 8);
    }

    #[test]
    fn safetensors_round_trip_and_garbage() {
        let t = NeuronTable::from_hot_lists(16, &[vec![3, 9, 15], vec![], vec![0]]).unwrap();
        let bytes = t.to_safetensors(HashMap::new()).unwrap();
        assert_eq!(NeuronTable::from_safetensors(&bytes, &[16; 3]).unwrap(), t);
        assert!(NeuronTable::from_safetensors(&bytes, &[16; 4]).is_err());
        assert!(NeuronTable::from_safetensors(&bytes, &[12; 3]).is_err());
        assert!(NeuronTable::from_safetensors(b"garbage", &[16; 3]).is_err());
        assert!(NeuronTable::from_safetensors(&bytes[..bytes.len() - 2], &[16; 3]).is_err());
        assert!(NeuronTable::from_safetensors(&bytes, &[16, 4, 1]).is_ok());
        assert!(NeuronTable::from_safetensors(&bytes, &[16, 16, 0]).is_err());
    }
}
