//! Models bigger than RAM (PowerInfer-2's neuron store): the FFN neurons' rows read from a
//! sidecar file by cluster ([`format`](mod@format)), into a cache of fixed size ([`cache`]), by a pool of
//! reader threads with several reads in flight ([`io`]). A decoded token's sparse FFN (exact-relu
//! or predictor mode) asks for the clusters holding its active neurons: the misses are all read
//! at once, in the order of the tasks that compute them, and each task computes as soon as its
//! own clusters are in, overlapping the later reads. In predictor mode the next layer's
//! predictor, run on this layer's input, names the clusters to read ahead: their reads follow
//! this layer's in the queue and overlap its computation and the next layer's attention
//! (PowerInfer-2's pipeline across layers, Deja Vu's look-ahead). Everything else (attention, the
//! gate rows exact-relu reads for every neuron, prefill's dense products) stays on the model's
//! memory-mapped weights.
//!
//! The result is the all-resident engine's in the same mode: the same rows, the same kernels
//! (one cluster at a time instead of one layer).

pub mod cache;
pub mod format;
pub mod io;
pub mod store;

use std::io::Write;
use std::path::Path;

use powerinfer_core::{ensure, DType, Error, Result, Weight};
use rayon::prelude::*;

use crate::weights::ModelWeights;
pub use format::{StoreLayout, ALIGN};
pub use store::{Active, NeuronStore, StoreStats};

impl NeuronStore {
    /// Open the store at `path` for `model` with a cache of `cache_bytes` and `io_threads`
    /// readers. `Error::ModelFile` for a file that is not this model's neuron store (or, with
    /// `fingerprint`, not written for it); `Error::Shape` for a cache that holds no cluster.
    pub fn open(
        model: &ModelWeights,
        path: &Path,
        cache_bytes: usize,
        io_threads: usize,
        fingerprint: Option<&str>,
    ) -> Result<NeuronStore> {
        let source = path.display().to_string();
        let io_err =
            |e: std::io::Error| powerinfer_core::Error::ModelFile(format!("{source}: {e}"));
        // A regular file only (a FIFO would block the open and every read).
        let mut f = powerinfer_core::files::open_regular(path).map_err(io_err)?;
        let file_bytes = f.metadata().map_err(io_err)?.len();
        // The header is at most a few hundred KiB (MAX_FINGERPRINT and 3 bytes per layer): read
        // no more than 1 MiB of whatever file this is.
        let mut head = vec![0u8; (file_bytes as usize).min(1 << 20)];
        {
            use std::io::Read;
            f.read_exact(&mut head).map_err(io_err)?;
        }
        drop(f);
        let layout = StoreLayout::parse(&head, file_bytes, &source)?;
        layout.check_model(model, fingerprint, &source)?;
        NeuronStore::new(layout, path, cache_bytes, io_threads)
    }
}

/// The layout as it meets a model (the format alone is [`format`](mod@format)'s).
impl StoreLayout {
    /// The layout of `model`'s neurons in clusters of `cluster`: gate and up rows in their
    /// stored formats, down rows as the engine transposes them. A mixture of experts' neurons
    /// are its routed experts' flattened (neuron `e·E + j` is row `j` of expert `e`, GGUF's own
    /// order in the merged tensors); its shared expert stays with the mapped weights.
    pub fn for_model(model: &ModelWeights, cluster: usize, fingerprint: &str) -> Result<Self> {
        model.config.refuse_expert_biases("a neuron store")?;
        let c = &model.config;
        let formats: Vec<[Option<DType>; 3]> = (0..c.n_layers)
            .map(|i| {
                let l = &model.layers[i];
                let gated = model.program.layers[i].ffn_kind().gated;
                [
                    Some(l.w_gate.dtype()),
                    gated.then_some(l.w_up.dtype()),
                    Some(model.down_t_dtype(i)),
                ]
            })
            .collect();
        StoreLayout::build(c.dim, &store_neurons(model), cluster, fingerprint, &formats)
    }

    /// `Error::ModelFile` unless this layout is `model`'s (same shape and formats) and, when
    /// given, made for `fingerprint`.
    pub fn check_model(
        &self,
        model: &ModelWeights,
        fingerprint: Option<&str>,
        source: &str,
    ) -> Result<()> {
        let want = StoreLayout::for_model(model, self.cluster, &self.fingerprint)?;
        ensure!(
            want == *self,
            ModelFile,
            "{source}: the neuron store was written for another model shape or other formats \
             (write it again for this model)"
        );
        if let Some(fp) = fingerprint {
            ensure!(
                self.fingerprint == fp,
                ModelFile,
                "{source}: the neuron store was written for model {}, not this one ({fp})",
                if self.fingerprint.is_empty() {
                    "(unknown)"
                } else {
                    &self.fingerprint
                }
            );
        }
        Ok(())
    }
}

/// Each layer's neurons in `model`'s store: `ffn_dim`, or for a layer of experts its routed
/// neurons (the rows of its merged gate tensor; a mixture of experts' leading dense layers have
/// `ffn_dim`).
pub fn store_neurons(model: &ModelWeights) -> Vec<usize> {
    model.layers.iter().map(|l| l.w_gate.rows()).collect()
}

/// Write `model`'s neuron store to `path` in clusters of `cluster` neurons (the transposed down
/// projections are built first if they were not); returns the file's bytes.
pub fn write_store(
    model: &ModelWeights,
    path: &Path,
    cluster: usize,
    fingerprint: &str,
) -> Result<u64> {
    let layout = StoreLayout::for_model(model, cluster, fingerprint)?;
    // A mixture of experts' transposed down rows are made one layer at a time (and dropped):
    // the writer needs one layer's, not the model's, beside the mapped weights. Dense layers
    // (every layer of a dense model, a mixture of experts' leading ones) read the model's.
    let down_t = match model.layers.iter().all(|l| l.moe.is_some()) {
        true => &[][..],
        false => model.down_t()?,
    };
    let io = |e: std::io::Error| Error::ModelFile(format!("{}: {e}", path.display()));
    // Something at `path` that is not a regular file is never written through (opening a FIFO
    // for writing waits for a reader, forever when none comes) nor replaced.
    powerinfer_core::files::check_writable_path(path).map_err(io)?;
    let file = std::fs::File::create(path).map_err(io)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    out.write_all(&layout.header()).map_err(io)?;
    for (i, l) in layout.layers.iter().enumerate() {
        let lw = &model.layers[i];
        let moe = lw.moe.is_some();
        let experts: Vec<Weight> = match &lw.moe {
            Some(m) => m
                .down
                .par_iter()
                .map(crate::transpose::transpose)
                .collect::<Result<_>>()?,
            _ => Vec::new(),
        };
        let [g_rb, u_rb, d_rb] = l.row_bytes;
        let mut buf = vec![0u8; l.cluster_bytes];
        for k in 0..l.n_clusters {
            buf.fill(0);
            for j in 0..cluster {
                let n = k * cluster + j;
                if n >= l.neurons {
                    break;
                }
                if l.up.is_some() {
                    buf[j * u_rb..(j + 1) * u_rb].copy_from_slice(&lw.w_up.row(n));
                }
                let at = cluster * u_rb + j * d_rb;
                let down = match moe {
                    true => {
                        let ef = experts[0].rows;
                        experts[n / ef].row(n % ef)
                    }
                    false => down_t[i].row(n),
                };
                buf[at..at + d_rb].copy_from_slice(down);
                let at = l.up_down_bytes + j * g_rb;
                buf[at..at + g_rb].copy_from_slice(&lw.w_gate.row(n));
            }
            out.write_all(&buf).map_err(io)?;
        }
    }
    out.flush().map_err(io)?;
    Ok(layout.file_bytes())
}
