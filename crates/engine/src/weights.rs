//! The model's weights grouped per layer, built from canonical tensor names
//! (`token_embd`, `output`, `output_norm`, `blk.N.attn_q`, ... as the Python loaders name them)
//! and checked against the config.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use powerinfer_core::{bail, ensure, DType, ModelConfig, PageBuf, Result, TensorShape, Weight};
use powerinfer_cpu::{Matrix, MatrixRef};
use rayon::prelude::*;

use crate::env::share_from_env;
use crate::input_sparse::{InputCopies, OutputCopy};
use crate::layer::ModelProgram;
use crate::layer_weights::{take, take_norm, take_vector, LayerWeights, Layouts};
use crate::neuron_store::store::NeuronStore;

pub use crate::finite::{check_finite, first_non_finite_row};

/// Environment variable pinning [`ModelWeights::down_crossover`] (a share in 0..=1).
pub const CROSSOVER_ENV: &str = "POWERINFER_RS_DOWN_CROSSOVER";

/// All weights of a llama-style model of any supported family, plus its config.
#[derive(Clone, Debug)]
pub struct ModelWeights {
    pub config: ModelConfig,
    /// The config's layer program, compiled once (see [`crate::layer`]).
    pub program: ModelProgram,
    /// The embedding table (the file's rows, or interleaved when it is the head too).
    pub token_embd: Matrix,
    /// The output head, interleaved where its format allows ([`Matrix::for_products`]).
    pub output: Matrix,
    pub output_norm: Vec<f32>,
    /// The final LayerNorm's bias (families with `layer_norm`).
    pub output_norm_bias: Option<Vec<f32>>,
    /// Learned position embeddings, one row per position (families with `learned_pos`).
    pub pos_embd: Option<Weight>,
    pub layers: Vec<LayerWeights>,
    /// The transposed down projections of the sparse FFN, built on first use (or given by the
    /// file, as PowerInfer's `ffn_down_t`).
    down_t: OnceLock<Vec<Weight>>,
    /// The file `down_t` is memory-mapped from ([`ModelWeights::map_down_t`]), if it is.
    down_t_file: OnceLock<std::path::PathBuf>,
    /// The share pinned for every layer, None for the formats' table; fixed at the first query
    /// (see [`ModelWeights::down_crossover`]).
    down_crossover: OnceLock<Option<f32>>,
    /// The input mode's input-major copies, built on first use.
    input_copies: OnceLock<InputCopies>,
    /// The input mode's copy of the output head, built on first use.
    output_copy: OnceLock<OutputCopy>,
    /// Every expert's transposed down projection (`[layer][expert]`, expert_ffn rows of dim),
    /// for exact-relu inside experts, built on first use.
    expert_down_t: OnceLock<Vec<Vec<Weight>>>,
    /// The neuron store a decode step's sparse FFN reads its rows from, when one is in use
    /// ([`crate::neuron_store`]).
    neuron_store: StoreHandle,
}

/// The neuron store a model's sparse FFN reads from, if any (a clone shares it).
#[derive(Default)]
struct StoreHandle(RwLock<Option<Arc<NeuronStore>>>);

impl Clone for StoreHandle {
    fn clone(&self) -> Self {
        StoreHandle(RwLock::new(self.0.read().ok().and_then(|s| s.clone())))
    }
}

impl std::fmt::Debug for StoreHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let path = self
            .0
            .read()
            .ok()
            .and_then(|s| s.as_ref().map(|s| s.path().to_owned()));
        write!(f, "StoreHandle({path:?})")
    }
}

/// Every tensor the config describes ([`ModelConfig::global_tensors`],
/// [`ModelConfig::layer_tensors_at`]) present where required and of its shape. A layer's
/// `ffn_down` may come transposed instead, as PowerInfer's `ffn_down_t` (`ffn x dim`).
fn check_shapes(c: &ModelConfig, tensors: &HashMap<String, Weight>) -> Result<()> {
    // A mixture of experts' leading dense layers have their own list.
    let (lead, routed) = (c.layer_tensors_at(0), c.layer_tensors());
    let named = |prefix: String, t: TensorShape| (prefix + t.name, t);
    let global = c
        .global_tensors()
        .into_iter()
        .map(|t| named(String::new(), t));
    let layers = (0..c.n_layers).flat_map(|i| {
        let list = match i < c.moe.dense_lead {
            true => &lead,
            false => &routed,
        };
        list.iter().map(move |t| named(format!("blk.{i}."), *t))
    });
    for (name, t) in global.chain(layers) {
        let transposed = format!("{name}_t");
        let (name, rows, cols) = match tensors.contains_key(&transposed) && t.name == "ffn_down" {
            true => (transposed, t.cols, t.rows),
            false => (name, t.rows, t.cols),
        };
        match tensors.get(&name) {
            Some(w) => ensure!(
                w.rows == rows && w.cols == cols,
                Shape,
                "tensor {name} is {} x {}, the config implies {rows} x {cols}",
                w.rows,
                w.cols
            ),
            None if t.required => bail!(ModelFile, "missing tensor {name}"),
            None => {}
        }
    }
    Ok(())
}

/// The tensors outside the layers: embeddings, output head, final norm.
struct GlobalTensors {
    token_embd: Matrix,
    output: Matrix,
    output_norm: Vec<f32>,
    output_norm_bias: Option<Vec<f32>>,
    pos_embd: Option<Weight>,
}

impl GlobalTensors {
    /// Take them out of `tensors`: `output` is the embedding table when absent (tied
    /// embeddings); the norm's bias and the position embeddings where the family has them.
    fn take(
        c: &ModelConfig,
        tensors: &mut HashMap<String, Weight>,
        layouts: Layouts,
    ) -> Result<GlobalTensors> {
        let head = |w: Weight| Layouts::matrix(layouts.attention, w);
        let a = &c.arch;
        // The head is a whole-matrix product, so it is interleaved where its format allows;
        // the embedding table is read a row at a time, so it keeps the file's rows unless it
        // is the head too (tied: one matrix, its rows gathered back one token at a time).
        let (token_embd, output) = match tensors.contains_key("output") {
            true => (
                Matrix::Rows(take(tensors, "token_embd")?),
                head(take(tensors, "output")?)?,
            ),
            false => {
                let tied = head(take(tensors, "token_embd")?)?;
                (tied.clone(), tied)
            }
        };
        let output_norm = take_norm(tensors, "output_norm", a.norm_offset)?;
        let output_norm_bias = match a.layer_norm {
            true => Some(take_vector(tensors, "output_norm.bias")?),
            false => None,
        };
        let pos_embd = match a.learned_pos {
            true => Some(take(tensors, "position_embd")?),
            false => None,
        };
        Ok(GlobalTensors {
            token_embd,
            output,
            output_norm,
            output_norm_bias,
            pos_embd,
        })
    }
}

/// The share of active neurons above which threshold decoding's down product is taken dense
/// (the matvec over `ffn_down` with the inactive values zeroed) rather than as an axpy over the
/// active `down_t` rows, for a `ffn_down` in `dtype`: share · (time of the dense matvec) / (time
/// of the axpy over that share of the rows), from `cargo bench -p powerinfer-cpu --bench sparse`
/// (`dense_down` against `axpy_rows` at half the neurons active, a random set, dim 2048, ffn
/// 5504 or 5632, out of cache) on a 2-core AVX-512 machine, rounded to 0.05.
///
/// A table, not a timing: the two products round differently, so the choice must depend on the
/// inputs alone for decoding to give the same bits in every process. The price is a crossover
/// that is off on machines whose balance of streamed and scattered reads differs; near the
/// crossover the two products cost about the same, so being off costs little there.
pub fn down_crossover_share(dtype: DType) -> f32 {
    match dtype {
        // The axpy streams the rows as fast as the matvec: always cheaper over fewer rows.
        DType::F32 | DType::F16 => 1.0,
        DType::BF16 => 0.9,
        DType::Q4_0 => 0.85,
        DType::Q8_0 | DType::Q4_1 => 0.7,
        DType::Q5_0 | DType::Q5_1 => 0.45,
        // The K-quants' axpy decodes a whole super-block's scales per row: slow per byte.
        DType::Q6_K => 0.3,
        DType::Q4_K => 0.2,
        // Not measured (the bench's formats stop at Q4_K and Q6_K): as their neighbours.
        DType::Q2_K | DType::Q3_K | DType::Q5_K => 0.25,
        // Not measured: the table formats' axpy is the generic one of Q5_0 (32-blocks) and
        // the K-quants' (IQ4_XS).
        DType::IQ4_NL | DType::MXFP4 => 0.45,
        DType::IQ4_XS => 0.25,
        // Not measured: the ternary formats' axpy is the K-quants' generic one over their
        // blocks decoded to int8, as the K-quants'.
        DType::TQ1_0 | DType::TQ2_0 => 0.2,
        // Not measured: the low-bit formats' axpy decodes each chunk to f32 row by row.
        DType::NVFP4 | DType::Q1_0 | DType::Q2_0 => 0.2,
        // Not measured: the 2-bit lattice formats' axpy is the same generic one over their
        // grid points gathered and signed.
        DType::IQ2_XXS | DType::IQ2_XS | DType::IQ2_S => 0.2,
        // Not measured: the lattice formats' axpy is the same generic one over their
        // gathered codebook points.
        DType::IQ3_XXS | DType::IQ3_S | DType::IQ1_S | DType::IQ1_M => 0.2,
    }
}

impl ModelWeights {
    /// Group `tensors` (canonical names) into layers, checking every shape against `config`
    /// and every value for NaN and infinity ([`check_finite`]).
    /// `output` may be absent, in which case the embedding table is used (tied embeddings).
    pub fn from_tensors(
        config: ModelConfig,
        tensors: HashMap<String, Weight>,
    ) -> Result<ModelWeights> {
        ModelWeights::from_tensors_with(config, tensors, Layouts::default())
    }

    /// [`ModelWeights::from_tensors`] with the FFN's layout chosen by `layouts`.
    pub fn from_tensors_with(
        config: ModelConfig,
        mut tensors: HashMap<String, Weight>,
        layouts: Layouts,
    ) -> Result<ModelWeights> {
        config.validate()?;
        check_shapes(&config, &tensors)?;
        check_finite(&tensors)?;
        let c = &config;
        let global = GlobalTensors::take(c, &mut tensors, layouts)?;
        let mut layers = Vec::with_capacity(c.n_layers);
        let mut down_t_given = Vec::with_capacity(c.n_layers);
        for i in 0..c.n_layers {
            let (layer, given_t) = LayerWeights::take(c, i, &mut tensors)?;
            // A mixture of experts' layers never come with a transposed down projection.
            if !c.moe.is_moe() {
                down_t_given.push(given_t);
            }
            layers.push(layer);
        }
        if let Some(extra) = tensors.keys().next() {
            bail!(
                ModelFile,
                "unexpected tensor {extra} (not part of a {}-layer model of this config)",
                c.n_layers
            );
        }
        // The repacking, layer by layer on the pool (a 7B's 3.5 GB of Q4_0 is seconds alone).
        layers
            .par_iter_mut()
            .try_for_each(|l| l.interleave(layouts))?;
        let down_t = OnceLock::new();
        if !down_t_given.is_empty() && down_t_given.iter().all(Option::is_some) {
            let _ = down_t.set(down_t_given.into_iter().flatten().collect());
        }
        let GlobalTensors {
            token_embd,
            output,
            output_norm,
            output_norm_bias,
            pos_embd,
        } = global;
        Ok(ModelWeights {
            program: ModelProgram::compile(&config)?,
            config,
            token_embd,
            output,
            output_norm,
            output_norm_bias,
            pos_embd,
            layers,
            down_t,
            down_t_file: OnceLock::new(),
            down_crossover: OnceLock::new(),
            input_copies: OnceLock::new(),
            output_copy: OnceLock::new(),
            expert_down_t: OnceLock::new(),
            neuron_store: StoreHandle::default(),
        })
    }

    /// The neuron store in use, if any.
    pub fn neuron_store(&self) -> Option<Arc<NeuronStore>> {
        self.neuron_store.0.read().ok().and_then(|s| s.clone())
    }

    /// Use `store` for the sparse FFN's rows from now on (None: the resident weights again).
    pub fn set_neuron_store(&self, store: Option<Arc<NeuronStore>>) {
        if let Ok(mut s) = self.neuron_store.0.write() {
            *s = store;
        }
    }

    /// Take the transposed down projections from the file at `path` (written there first unless
    /// it already holds them for `fingerprint`), memory-mapped, instead of building them in
    /// memory ([`crate::down_t_file`]). Returns false when they were already built or given by
    /// the model file (nothing changes then).
    pub fn map_down_t(&self, path: &std::path::Path, fingerprint: &str) -> Result<bool> {
        if self.down_t.get().is_some() {
            return Ok(false);
        }
        let mapped = crate::down_t_file::map_down_t(&self.config, &self.layers, path, fingerprint)?;
        let set = self.down_t.set(mapped).is_ok();
        if set {
            let _ = self.down_t_file.set(path.to_path_buf());
        }
        Ok(set)
    }

    /// The transposed down projections (ffn rows of dim weights per layer), built once. A
    /// layer of experts has an empty one (0 × 0: its experts' are [`ModelWeights::expert_down_t`]).
    pub fn down_t(&self) -> Result<&[Weight]> {
        if let Some(d) = self.down_t.get() {
            return Ok(d);
        }
        // Every layer in one allocation: large enough for huge pages, so the scattered rows the
        // sparse kernels read cost few TLB misses.
        let sizes = self
            .layers
            .iter()
            .map(|l| match l.moe {
                Some(_) => Ok(0),
                None => crate::transpose::transposed_bytes(&l.w_down),
            })
            .collect::<Result<Vec<_>>>()?;
        let mut store = PageBuf::zeroed(sizes.iter().sum());
        let mut dtypes = Vec::with_capacity(sizes.len());
        let mut rest = store.as_mut_slice();
        for (l, &n) in self.layers.iter().zip(&sizes) {
            let (part, tail) = rest.split_at_mut(n);
            rest = tail;
            // The file's rows of an interleaved down, gathered for the transpose alone.
            dtypes.push(match l.moe {
                Some(_) => DType::F32,
                None => crate::transpose::transpose_into(&*l.w_down.to_rows()?, part)?,
            });
        }
        let store = store.freeze();
        let mut built = Vec::with_capacity(sizes.len());
        let mut start = 0;
        for ((l, &n), dtype) in self.layers.iter().zip(&sizes).zip(dtypes) {
            let Some(bytes) = store.slice(start..start + n) else {
                bail!(
                    Other,
                    "down_t store of {} bytes misses layer bytes {start}..{}",
                    store.len(),
                    start + n
                );
            };
            let (rows, cols) = match l.moe {
                Some(_) => (0, 0),
                None => (l.w_down.cols(), l.w_down.rows()),
            };
            built.push(Weight::new(dtype, rows, cols, bytes)?);
            start += n;
        }
        let _ = self.down_t.set(built);
        Ok(self.down_t.get().expect("set above"))
    }

    /// Every expert's transposed down projection (`[layer][expert]`, then the shared expert's
    /// where the layer has one, at index `n_expert`), built once on the calling thread pool:
    /// the rows exact-relu reads for the neurons that fire in a routed expert, and the rows
    /// the hybrid executor packs in slabs. Empty for a dense model.
    pub fn expert_down_t(&self) -> Result<&[Vec<Weight>]> {
        if let Some(d) = self.expert_down_t.get() {
            return Ok(d);
        }
        let built = self
            .layers
            .iter()
            .map(|l| match &l.moe {
                Some(m) => m
                    .down
                    .iter()
                    .chain(m.shared.as_ref().map(|s| &s.down))
                    .collect::<Vec<_>>()
                    .into_par_iter()
                    .map(crate::transpose::transpose)
                    .collect(),
                None => Ok(Vec::new()),
            })
            .collect::<Result<Vec<Vec<Weight>>>>()?;
        let _ = self.expert_down_t.set(built);
        Ok(self.expert_down_t.get().expect("set above"))
    }

    /// Bytes of the experts' transposed down projections if built (0 otherwise).
    pub fn expert_down_t_bytes(&self) -> usize {
        self.expert_down_t
            .get()
            .map_or(0, |d| d.iter().flatten().map(Weight::n_bytes).sum())
    }

    /// The input mode's input-major copies of every layer's projections, built once (on the
    /// calling thread pool).
    pub fn input_copies(&self) -> Result<&InputCopies> {
        if let Some(c) = self.input_copies.get() {
            return Ok(c);
        }
        let built = InputCopies::build(&self.layers, &self.program)?;
        let _ = self.input_copies.set(built);
        Ok(self.input_copies.get().expect("set above"))
    }

    /// The input mode's copies if built.
    pub fn built_input_copies(&self) -> Option<&InputCopies> {
        self.input_copies.get()
    }

    /// The input mode's copy of the output head, built once.
    pub fn output_copy(&self) -> Result<&OutputCopy> {
        if let Some(c) = self.output_copy.get() {
            return Ok(c);
        }
        let built = OutputCopy::build(&self.output)?;
        let _ = self.output_copy.set(built);
        Ok(self.output_copy.get().expect("set above"))
    }

    /// Bytes of the input mode's copies built so far (0 before first use).
    pub fn input_copies_bytes(&self) -> usize {
        self.input_copies.get().map_or(0, InputCopies::n_bytes)
            + self.output_copy.get().map_or(0, |o| o.w.n_bytes())
    }

    /// The share of active neurons above which one token's down product is cheaper as the dense
    /// matvec over `ffn_down` (with the inactive values zeroed) than as an axpy over the active
    /// `down_t` rows, for layer 0's down format ([`down_crossover_share`]); the environment
    /// variable [`CROSSOVER_ENV`] (a share in 0..=1) or [`ModelWeights::set_down_crossover`]
    /// pins one share for every layer instead.
    ///
    /// The two products round differently (the transposed copy is quantized again), so which
    /// one a token takes decides its bits: the choice depends on the formats and the count of
    /// active neurons only, never on a timing (it was measured per process once, and the same
    /// greedy prompt gave different texts in different processes).
    pub fn down_crossover(&self) -> Result<f32> {
        self.down_crossover_at(0)
    }

    /// [`ModelWeights::down_crossover`] for layer `layer`'s down format (models may mix formats
    /// across layers, as llama.cpp's `Q4_K_M` does).
    pub fn down_crossover_at(&self, layer: usize) -> Result<f32> {
        if let Some(c) = self.pinned_crossover()? {
            return Ok(c);
        }
        Ok(self
            .layers
            .get(layer)
            .map_or(1.0, |l| down_crossover_share(l.w_down.dtype())))
    }

    /// The pinned share: set by [`ModelWeights::set_down_crossover`] before the first query,
    /// else read from [`CROSSOVER_ENV`] at the first query; None when neither pins it.
    fn pinned_crossover(&self) -> Result<Option<f32>> {
        if let Some(&c) = self.down_crossover.get() {
            return Ok(c);
        }
        let _ = self.down_crossover.set(share_from_env(CROSSOVER_ENV)?);
        Ok(self.down_crossover.get().copied().flatten())
    }

    /// Pin [`ModelWeights::down_crossover`] to `share` (clamped to [0, 1]) for every layer
    /// instead of the formats' table: 0 always takes the dense down product, 1 always the axpy.
    /// False (nothing changed) once the crossover was queried or pinned.
    pub fn set_down_crossover(&self, share: f32) -> bool {
        let share = if share.is_nan() {
            1.0
        } else {
            share.clamp(0.0, 1.0)
        };
        self.down_crossover.set(Some(share)).is_ok()
    }

    /// Format of layer `layer`'s transposed down projection, without building it: the given or
    /// already built one's, else what [`crate::transpose::transpose`] will choose.
    pub fn down_t_dtype(&self, layer: usize) -> DType {
        let l = &self.layers[layer];
        // A mixture of experts transposes each expert's down projection (dim rows) on its own.
        if let Some(m) = &l.moe {
            return crate::transpose::transposed_dtype(&m.down[0]);
        }
        match self.down_t.get() {
            Some(d) => d[layer].dtype,
            None => crate::transpose::transposed_dtype(&l.w_down),
        }
    }

    /// Bytes of the transposed down projections (the experts' too) built in memory (0 when not
    /// built, or memory-mapped from a file: see [`ModelWeights::down_t_file`]).
    pub fn down_t_bytes(&self) -> usize {
        let dense = match self.down_t_file.get() {
            Some(_) => 0,
            None => self
                .down_t
                .get()
                .map_or(0, |d| d.iter().map(Weight::n_bytes).sum::<usize>()),
        };
        dense + self.expert_down_t_bytes()
    }

    /// The file the transposed down projections are memory-mapped from, if they are.
    pub fn down_t_file(&self) -> Option<&std::path::Path> {
        self.down_t_file.get().map(|p| p.as_path())
    }

    /// The matrix a canonical tensor name (`token_embd`, `output`, `blk.N.attn_q`, ...,
    /// `blk.N.ffn_down`) resolved to as the engine reads it; None for a name it does not hold
    /// as a matrix.
    pub fn tensor(&self, name: &str) -> Option<MatrixRef<'_>> {
        match name {
            "token_embd" => return Some(self.token_embd.view()),
            "output" => return Some(self.output.view()),
            _ => {}
        }
        let (blk, rest) = name.strip_prefix("blk.")?.split_once('.')?;
        let l = self.layers.get(blk.parse::<usize>().ok()?)?;
        Some(match rest {
            "attn_q" => l.wq.view(),
            "attn_k" => l.wk.view(),
            "attn_v" => l.wv.view(),
            "attn_output" => l.wo.view(),
            "ffn_gate" | "ffn_gate_exps" => l.w_gate.view(),
            "ffn_up" | "ffn_up_exps" => l.w_up.view(),
            "ffn_down" | "ffn_down_exps" => l.w_down.view(),
            "ffn_gate_inp" => (&l.moe.as_ref()?.router).into(),
            _ => return None,
        })
    }

    /// Whether the merged expert tensor `name` (`blk.N.ffn_{gate,up,down}_exps`) has an
    /// interleaved copy the decode pass reads beside its rows
    /// ([`crate::moe_weights::MoeWeights::pack`]).
    pub fn has_packed_copy(&self, name: &str) -> bool {
        let Some((blk, rest)) = name.strip_prefix("blk.").and_then(|n| n.split_once('.')) else {
            return false;
        };
        let which = match rest {
            "ffn_gate_exps" => 0,
            "ffn_up_exps" => 1,
            "ffn_down_exps" => 2,
            _ => return false,
        };
        let l = blk.parse::<usize>().ok().and_then(|l| self.layers.get(l));
        l.and_then(|l| l.moe.as_ref()?.packed.as_ref())
            .is_some_and(|p| p.experts[which].is_some())
    }

    /// Weight bytes a decode step reads: every matrix once (of a mixture of experts, the
    /// router, `n_expert_used` experts and the shared expert), one embedding row, the norms.
    pub fn bytes_per_token(&self) -> usize {
        let mats: usize = self
            .layers
            .iter()
            .map(|l| {
                let attn: usize = [&l.wq, &l.wk, &l.wv, &l.wo]
                    .iter()
                    .map(|w| w.n_bytes())
                    .sum();
                let ffn = match &l.moe {
                    Some(m) => m.bytes_per_token(self.config.moe.n_expert_used),
                    None => {
                        [&l.w_gate, &l.w_up, &l.w_down]
                            .iter()
                            .map(|w| w.n_bytes())
                            .sum::<usize>()
                            - usize::from(self.config.arch.no_gate) * l.w_up.n_bytes()
                    }
                };
                attn + ffn + 8 * self.config.dim
            })
            .sum();
        mats + self.output.n_bytes() + self.token_embd.row_bytes() + 4 * self.config.dim
    }
}
