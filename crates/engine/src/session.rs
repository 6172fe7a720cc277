//! A [`Session`]: a model shared by reference, its own KV cache and thread pool, and the
//! prefill/decode entry points.

use std::sync::Arc;

use powerinfer_core::{Device, Error, Result};

use crate::forward::{forward, Logits, Scratch};
use crate::hybrid;
use crate::hybrid::api::{refuse_cpu_only, Hybrid};
use crate::kv_cache::{KvCache, KvTypes};
use crate::phases::{self, PhaseTimes};
use crate::placement::Placement;
use crate::profiler::Profiler;
use crate::slots::{forward_slots, Slot};
use crate::sparsity::Sparsity;
use crate::weights::ModelWeights;

mod profiling;

/// Tokens per prefill chunk: bounds scratch memory while keeping matrix-matrix batches.
pub const PREFILL_CHUNK: usize = 256;

/// One conversation's state over a shared model.
pub struct Session {
    model: Arc<ModelWeights>,
    cache: KvCache,
    scratch: Scratch,
    /// Its worker threads (shared with other sessions by [`Session::sharing_threads`]).
    pool: Arc<rayon::ThreadPool>,
    mode: Sparsity,
    profiler: Option<Profiler>,
    placement: Option<Arc<Placement>>,
    /// The CPU, or the device the hybrid executor runs the plan's GPU side on.
    device: Device,
    /// The VRAM budget the device was opened with.
    capacity: Option<usize>,
    /// The hybrid executor, when the device is not the CPU and the plan uses the GPU.
    hybrid: Option<Box<dyn Hybrid>>,
    /// Time per phase of the forward passes since timing was turned on (benchmarks).
    phase_times: Option<PhaseTimes>,
    /// Wall time of the hybrid decode steps since the last reset, measured around the
    /// executor's calls (against which its phase times are checked).
    hybrid_decode_seconds: f64,
}

impl Session {
    /// A fresh session with `threads` worker threads (0 = one per core) and room for `n_ctx`
    /// positions (capped at the model's context).
    pub fn new(model: Arc<ModelWeights>, threads: usize, n_ctx: usize) -> Result<Session> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("powerinfer-{i}"))
            .build()
            .map_err(|e| Error::Other(format!("could not start {threads} threads: {e}")))?;
        Ok(Session::with_pool(model, Arc::new(pool), n_ctx))
    }

    /// A fresh session over `other`'s model that runs on `other`'s worker threads (the server's
    /// slots: their passes never run at once, and one pool keeps idle threads from spinning
    /// beside the working ones), with room for `n_ctx` positions (0: the model's context).
    pub fn sharing_threads(other: &Session, n_ctx: usize) -> Session {
        Session::with_pool(other.model.clone(), other.pool.clone(), n_ctx)
    }

    /// A fresh session on `pool`; `n_ctx` capped at the model's context (0: all of it).
    fn with_pool(model: Arc<ModelWeights>, pool: Arc<rayon::ThreadPool>, n_ctx: usize) -> Session {
        let c = &model.config;
        let n_ctx = match n_ctx {
            0 => c.max_context,
            n => n.min(c.max_context),
        };
        let cache = match c.arch.mla.is_mla() {
            true => KvCache::latent(c.n_layers, c.kv_dim(), n_ctx),
            false => KvCache::new(c.n_layers, c.kv_dim(), n_ctx),
        };
        Session {
            model,
            cache,
            scratch: Scratch::default(),
            pool,
            mode: Sparsity::Dense,
            profiler: None,
            placement: None,
            device: Device::Cpu,
            capacity: None,
            hybrid: None,
            phase_times: None,
            hybrid_decode_seconds: 0.0,
        }
    }

    /// The model.
    pub fn model(&self) -> &ModelWeights {
        &self.model
    }

    /// The model, shared.
    pub fn model_arc(&self) -> &Arc<ModelWeights> {
        &self.model
    }

    /// Positions in the KV cache.
    pub fn n_past(&self) -> usize {
        self.cache.len()
    }

    /// Context size in positions.
    pub fn n_ctx(&self) -> usize {
        self.cache.capacity()
    }

    /// Worker threads.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Switch the FFN's sparsity mode (checked against the model; sparse modes build the
    /// transposed down projections on first use, here, on the session's threads).
    pub fn set_sparsity(&mut self, mode: Sparsity) -> Result<()> {
        let c = &self.model.config;
        mode.validate(c)?;
        // Before any work (the experts' transposed copy): what the GPU side does not run.
        if self.hybrid.is_some() {
            refuse_cpu_only(&mode, c.moe.is_moe())?;
        }
        // Experts in a mode the store serves (the mode table's moe_store: exact-relu; dense
        // reads no transposed rows) read their transposed down rows from a neuron store where
        // one is attached: no copy in memory then. Predictor and threshold experts read them
        // from the transposed copy.
        let stored = self.model.neuron_store().is_some() && mode.mode().support().moe_store;
        if c.moe.is_moe()
            && !stored
            && matches!(
                mode,
                Sparsity::ExactRelu | Sparsity::Threshold(_) | Sparsity::Predictor { .. }
            )
        {
            let model = &self.model;
            self.pool.install(|| model.expert_down_t().map(|_| ()))?;
        }
        if let Some(h) = self.hybrid.as_mut() {
            h.set_mode(&mode)?;
        }
        if let Sparsity::Input(p) = &mode {
            let model = &self.model;
            self.pool.install(|| model.input_copies().map(|_| ()))?;
            if p.output > 0.0 {
                self.pool.install(|| model.output_copy().map(|_| ()))?;
            }
        } else if !matches!(mode, Sparsity::Dense) && (0..c.n_layers).any(|l| !c.is_moe_layer(l)) {
            let model = &self.model;
            // A neuron store holds the transposed rows exact-relu and predictor mode read: no
            // copy in memory (threshold mode still builds it).
            let stored = model.neuron_store().is_some() && mode.mode().support().store;
            if !stored {
                self.pool.install(|| model.down_t().map(|_| ()))?;
            }
            if matches!(mode, Sparsity::Threshold(_)) {
                // A bad pinned crossover fails here, not in the middle of a decode step.
                model.down_crossover()?;
            }
        }
        self.mode = mode;
        Ok(())
    }

    /// Hold the KV cache's keys and values at `t` (f16 by default; one setting for the CPU and
    /// the GPU layers). The context is forgotten, and a hybrid executor is opened again for it
    /// (which refuses block formats: its GPU attention reads f16 or f32).
    /// [`Unsupported`](powerinfer_core::Error::Unsupported) for a block format whose 32 values
    /// do not divide `head_dim`; the cache is unchanged then.
    pub fn set_kv_types(&mut self, t: KvTypes) -> Result<()> {
        if t == self.cache.types() {
            return Ok(());
        }
        // A latent cache refuses block formats itself (its row is keys and values at once).
        if !self.cache.is_latent() {
            t.check_head_dim(self.model.config.head_dim)?;
        }
        powerinfer_core::ensure!(
            self.hybrid.is_none() || (!t.is_quantized() && t.k == t.v),
            Unsupported,
            "a {} KV cache on the hybrid executor (device {}): its GPU attention reads f16 or f32 \
             caches, keys and values alike",
            t.name(),
            self.device
        );
        self.cache.set_types(t)?;
        self.truncate(0);
        if self.hybrid.is_some() {
            return self.open_device(self.device, self.capacity);
        }
        Ok(())
    }

    /// The KV cache's key and value precisions.
    pub fn kv_types(&self) -> KvTypes {
        self.cache.types()
    }

    /// The sparsity mode.
    pub fn sparsity(&self) -> &Sparsity {
        &self.mode
    }

    /// Adopt a placement (checked against this session's model when it was loaded), or drop
    /// it with `None`. On a GPU device (see [`Session::set_device`]) the hybrid executor is
    /// rebuilt for it; on the CPU it is only kept.
    pub fn set_placement(&mut self, placement: Option<Arc<Placement>>) -> Result<()> {
        self.placement = placement;
        let out = self.open_device(self.device, self.capacity);
        if out.is_err() {
            self.device = Device::Cpu;
            self.hybrid = None;
        }
        out
    }

    /// Run the placement's GPU side on `device`: "cpu" (no GPU: the plan's neuron table is
    /// kept but everything runs on the CPU), "gpu-sim" (the host backend, for checking a GPU
    /// plan without a GPU), "gpu-emu" (the CUDA kernels run on the CPU by the emulator) or
    /// `"cuda[:N]"`. `capacity` is the VRAM budget (and gpu-sim's memory
    /// size). A GPU device needs a placement; a placement that puts nothing on the GPU runs
    /// the CPU path on any device. Errors leave the session on the CPU.
    pub fn set_device(&mut self, device: &str, capacity: Option<usize>) -> Result<()> {
        match Device::parse(device) {
            Ok(device) => self.open_device(device, capacity),
            Err(e) => self.open_device(Device::Cpu, None).and(Err(e)),
        }
    }

    /// [`Session::set_device`] of a parsed device.
    fn open_device(&mut self, device: Device, capacity: Option<usize>) -> Result<()> {
        self.hybrid = None;
        self.device = Device::Cpu;
        self.capacity = None;
        if !device.is_gpu() {
            return Ok(());
        }
        let Some(placement) = self.placement.clone() else {
            powerinfer_core::bail!(
                Plan,
                "device \"{device}\" runs a placement plan's GPU side, and no plan is loaded: make \
                 one with `python -m powerinfer_rs.plan` and load it first"
            );
        };
        if placement.file.uses_gpu() {
            let (model, mode) = (&self.model, &self.mode);
            let kv = self.cache.types();
            let mut h = self
                .pool
                .install(|| hybrid::open(device, model, placement, mode, kv, capacity))?;
            h.after_cpu_pass(self.cache.len());
            self.hybrid = Some(h);
        }
        self.device = device;
        self.capacity = capacity;
        Ok(())
    }

    /// The device: cpu, gpu-sim, gpu-emu or cuda:N.
    pub fn device(&self) -> Device {
        self.device
    }

    /// The hybrid executor, when the plan's GPU side runs on a device.
    pub fn hybrid(&self) -> Option<&dyn Hybrid> {
        self.hybrid.as_deref()
    }

    /// The hybrid executor, mutably.
    pub fn hybrid_mut(&mut self) -> Option<&mut (dyn Hybrid + 'static)> {
        self.hybrid.as_deref_mut()
    }

    /// Wall time of the hybrid decode steps since the last [`Session::reset_hybrid_stats`],
    /// measured around the executor's calls.
    pub fn hybrid_decode_seconds(&self) -> f64 {
        self.hybrid_decode_seconds
    }

    /// Zero the hybrid executor's transfer counts and phase times, and the decode time.
    pub fn reset_hybrid_stats(&mut self) {
        self.hybrid_decode_seconds = 0.0;
        if let Some(h) = self.hybrid.as_deref_mut() {
            h.reset_transfers();
        }
    }

    /// The adopted placement.
    pub fn placement(&self) -> Option<&Placement> {
        self.placement.as_deref()
    }

    /// Forget everything (a fresh context).
    pub fn reset(&mut self) {
        self.truncate(0);
    }

    /// Keep only the first `n` positions.
    pub fn truncate(&mut self, n: usize) {
        self.cache.truncate(n);
        if let Some(h) = self.hybrid.as_mut() {
            h.truncate(n);
        }
    }

    /// Positions `0..n` of the KV cache as bytes (see [`KvCache::snapshot`]), for a prefix
    /// cache; not on the hybrid executor (its GPU layers keep their rows in VRAM).
    pub fn kv_snapshot(&self, n: usize) -> Result<Vec<u8>> {
        self.refuse_hybrid("a KV snapshot")?;
        self.cache.snapshot(n)
    }

    /// Make the context exactly the `n` positions of a [`Session::kv_snapshot`] of a session
    /// over the same model at the same KV precision (the tokens are the caller's to know).
    pub fn kv_restore(&mut self, data: &[u8], n: usize) -> Result<()> {
        self.refuse_hybrid("restoring a KV snapshot")?;
        self.cache.restore(data, n)
    }

    /// Bytes per position of a [`Session::kv_snapshot`].
    pub fn kv_snapshot_bytes_per_position(&self) -> usize {
        self.cache.snapshot_bytes_per_position()
    }

    fn refuse_hybrid(&self, what: &str) -> Result<()> {
        powerinfer_core::ensure!(
            self.hybrid.is_none(),
            Unsupported,
            "{what} is not supported on the hybrid executor (device {})",
            self.device
        );
        Ok(())
    }

    /// Turn per-phase timing of the forward passes on (from zero) or off.
    pub fn set_phase_timing(&mut self, on: bool) {
        self.phase_times = on.then(PhaseTimes::default);
    }

    /// Time per phase since timing was turned on; None when it is off.
    pub fn phase_times(&self) -> Option<&PhaseTimes> {
        self.phase_times.as_ref()
    }

    /// Bytes held by the KV cache.
    pub fn kv_cache_bytes(&self) -> usize {
        self.cache.allocated_bytes()
    }

    /// Feed `tokens` after the cached context, in chunks of [`PREFILL_CHUNK`]; returns the last
    /// token's logits, or every token's when `which` is [`Logits::All`] (or
    /// [`Logits::Steps`]: each as a one-token step computes it, for speculative verification;
    /// on the hybrid executor one of its decode steps per token), or every token's final
    /// hidden state (n × dim, the output head skipped) for [`Logits::Hidden`] (embeddings;
    /// batched CPU passes, also on the hybrid executor). The `between` callback
    /// runs between chunks and may abort (e.g. on Ctrl-C) by returning an error; on any error
    /// the cache is rolled back to where it was.
    pub fn feed(
        &mut self,
        tokens: &[u32],
        which: Logits,
        mut between: impl FnMut() -> Result<()>,
    ) -> Result<Vec<f32>> {
        let start = self.cache.len();
        let out = self.feed_inner(tokens, which, &mut between);
        if out.is_err() {
            self.truncate(start);
        }
        out
    }

    /// Decode steps of several sessions over one model in one pass (the server's parallel
    /// slots, see [`forward_slots`]): session i takes `tokens[i]` after its context, and its
    /// logits (len × vocab) come back, every row bit-identical to what [`Session::feed`] of one
    /// token gives after the tokens before it. The pass runs on the first session's threads.
    /// Sessions on the hybrid executor or profiling run one after the other (each as
    /// `feed(.., Logits::Steps)`). On any error no session's context changes.
    pub fn decode_slots(
        sessions: &mut [&mut Session],
        tokens: &[Vec<u32>],
    ) -> Result<Vec<Vec<f32>>> {
        powerinfer_core::ensure!(
            sessions.len() == tokens.len(),
            Shape,
            "{} sessions but {} token lists",
            sessions.len(),
            tokens.len()
        );
        let Some(model) = sessions.first().map(|s| s.model.clone()) else {
            return Ok(Vec::new());
        };
        for (s, t) in sessions.iter().zip(tokens) {
            powerinfer_core::ensure!(
                Arc::ptr_eq(&s.model, &model),
                Unsupported,
                "sessions over different models cannot decode in one pass"
            );
            powerinfer_core::ensure!(!t.is_empty(), Shape, "no tokens to decode for a session");
            powerinfer_core::ensure!(
                s.cache.len() + t.len() <= s.cache.capacity(),
                ContextOverflow,
                "{} cached + {} new tokens exceed the context of {} tokens",
                s.cache.len(),
                t.len(),
                s.cache.capacity()
            );
        }
        let starts: Vec<usize> = sessions.iter().map(|s| s.cache.len()).collect();
        let out = if sessions
            .iter()
            .any(|s| s.hybrid.is_some() || s.profiler.is_some())
        {
            let mut out = Vec::with_capacity(sessions.len());
            for (s, t) in sessions.iter_mut().zip(tokens) {
                match s.feed(t, Logits::Steps, || Ok(())) {
                    Ok(l) => out.push(l),
                    Err(e) => {
                        cut_back(sessions, &starts);
                        return Err(e);
                    }
                }
            }
            out
        } else {
            let (first, rest) = sessions.split_first_mut().expect("not empty");
            let Session {
                cache,
                scratch,
                pool,
                mode,
                phase_times,
                ..
            } = &mut **first;
            let mut slots = vec![Slot {
                cache,
                mode,
                tokens: &tokens[0],
            }];
            for (s, t) in rest.iter_mut().zip(&tokens[1..]) {
                let Session { cache, mode, .. } = &mut **s;
                slots.push(Slot {
                    cache,
                    mode,
                    tokens: t,
                });
            }
            let rows = tokens.iter().map(Vec::len).sum();
            pool.install(|| {
                phases::timed(phase_times.as_mut(), rows, || {
                    forward_slots(&model, &mut slots, scratch)
                })
            })?
        };
        let vocab = model.config.vocab_size.max(1);
        for (i, logits) in out.iter().enumerate() {
            if let Some(bad) = logits.iter().position(|v| !v.is_finite()) {
                cut_back(sessions, &starts);
                powerinfer_core::bail!(
                    Other,
                    "the forward pass gave non-finite logits at position {} (token id {}); \
                     the weights are finite, so the model overflows float32 on this input",
                    starts[i] + bad / vocab,
                    tokens[i][bad / vocab]
                );
            }
        }
        Ok(out)
    }

    fn feed_inner(
        &mut self,
        tokens: &[u32],
        which: Logits,
        between: &mut impl FnMut() -> Result<()>,
    ) -> Result<Vec<f32>> {
        powerinfer_core::ensure!(!tokens.is_empty(), Shape, "no tokens to feed");
        let need = self.cache.len() + tokens.len();
        powerinfer_core::ensure!(
            need <= self.cache.capacity(),
            ContextOverflow,
            "{} cached + {} new tokens exceed the context of {} tokens",
            self.cache.len(),
            tokens.len(),
            self.cache.capacity()
        );
        let mut all = Vec::new();
        let mut last = Vec::new();
        let n_chunks = tokens.len().div_ceil(PREFILL_CHUNK);
        let start = self.cache.len();
        let width = which.row_width(&self.model.config).max(1);
        for (i, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
            let (model, cache, scratch) = (&*self.model, &mut self.cache, &mut self.scratch);
            let (mode, profiler) = (&self.mode, self.profiler.as_mut());
            let hybrid = self.hybrid.as_deref_mut();
            let times = self.phase_times.as_mut();
            let decode_seconds = &mut self.hybrid_decode_seconds;
            let logits = self.pool.install(|| {
                phases::timed(times, chunk.len(), || match hybrid {
                    // Decode steps on the hybrid executor: one of its steps per token.
                    Some(h) if which == Logits::Steps && profiler.is_none() => {
                        let t0 = std::time::Instant::now();
                        let mut all = Vec::with_capacity(chunk.len() * width);
                        for &t in chunk {
                            all.extend(h.decode(model, mode, cache, t)?);
                        }
                        *decode_seconds += t0.elapsed().as_secs_f64();
                        Ok(all)
                    }
                    // One token and no profile: the hybrid decode step.
                    Some(h)
                        if chunk.len() == 1 && profiler.is_none() && which != Logits::Hidden =>
                    {
                        let t0 = std::time::Instant::now();
                        let out = h.decode(model, mode, cache, chunk[0]);
                        *decode_seconds += t0.elapsed().as_secs_f64();
                        out
                    }
                    // Batches (and profiling) run on the CPU, with the GPU layers' cache rows
                    // brought over first and noted as written after.
                    Some(h) => {
                        h.before_cpu_pass(cache)?;
                        let out = forward(model, mode, cache, scratch, profiler, chunk, which);
                        h.after_cpu_pass(cache.len());
                        out
                    }
                    None => forward(model, mode, cache, scratch, profiler, chunk, which),
                })
            })?;
            // Non-finite logits never leave the engine (sampling and perplexity would turn them
            // into numpy errors or a silent nan); the caller's `feed` rolls the cache back.
            if let Some(bad) = logits.iter().position(|v| !v.is_finite()) {
                let row = match which {
                    Logits::All | Logits::Steps | Logits::Hidden => bad / width,
                    Logits::Last => chunk.len() - 1,
                };
                let at = i * PREFILL_CHUNK + row;
                let what = if which == Logits::Hidden {
                    "hidden states"
                } else {
                    "logits"
                };
                powerinfer_core::bail!(
                    Other,
                    "the forward pass gave non-finite {what} at position {} (token id {}); \
                     the weights are finite, so the model overflows float32 on this input",
                    start + at,
                    tokens[at]
                );
            }
            match which {
                Logits::All | Logits::Steps | Logits::Hidden => all.extend_from_slice(&logits),
                Logits::Last => last = logits,
            }
            if i + 1 < n_chunks {
                between()?;
            }
        }
        Ok(match which {
            Logits::All | Logits::Steps | Logits::Hidden => all,
            Logits::Last => last,
        })
    }
}

/// Every session back to its length in `starts` (a refused [`Session::decode_slots`]).
fn cut_back(sessions: &mut [&mut Session], starts: &[usize]) {
    for (s, &n) in sessions.iter_mut().zip(starts) {
        s.truncate(n);
    }
}
