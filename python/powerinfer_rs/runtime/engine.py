"""The :class:`Engine`: a loaded model, its tokenizer and one context, with scoring,
perplexity, sparsity modes, profiling and placement plans; generation is :mod:`.generation`."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Iterator, Sequence

import numpy as np

from .. import _core
from ..errors import (
    InternalError,
    ModelFileError,
    PlanError,
    ShapeError,
    TokenError,
    UnsupportedError,
)
from ..loading import LoadedModel, load_model, resolve_model
from .chat_template_file import with_chat_template
from .checks import check_int, check_threads
from .context import Context
from .draft import DraftModel
from .generation import Generation, GenerationStats, locked
from .modes import api_sparsity
from .neuron_store import NeuronStoreMethods
from .placement import PlanAndDevice, check_device
from .tokenizer import check_text
from .weight_memory import copy_weights, room_for_packed_experts

#: Context size used when the caller gives none (the model's own if smaller).
DEFAULT_N_CTX = 4096


def core_model_arguments(
    loaded: LoadedModel, n_ctx: int | None = None
) -> tuple[_core.ModelConfig, dict]:
    """``(config, tensors)`` as ``_core.Model`` takes them: the config (for a context of
    ``n_ctx`` positions: LongRoPE's factors chosen, ``ModelConfig.for_context``; None: the
    loaded one, its short factors) and per tensor ``(dtype, rows, cols, bytes)`` (a tied
    output head is left to the embeddings)."""
    cfg = loaded.config if n_ctx is None else loaded.config.for_context(n_ctx)
    tensors = {
        name: (t.dtype, t.rows, t.cols, t.data)
        for name, t in loaded.tensors.items()
        if not (name == "output" and loaded.config.tie_embeddings)
    }
    return cfg, tensors


def kv_spec(kv_cache: str, k: str | None, v: str | None) -> str:
    """The session's KV types ("k/v") from ``kv_cache`` (one name, or "k/v") with the keys'
    or the values' overridden by ``k``/``v`` where given (the names are checked by the core:
    UnsupportedError)."""
    if k is None and v is None:
        return kv_cache
    base_k, _, base_v = str(kv_cache).partition("/")
    return f"{k or base_k}/{v or base_v or base_k}"


class Engine(Generation, PlanAndDevice, NeuronStoreMethods):
    """A model ready to run: weights in Rust, tokenizer and chat template in Python.

    Build one with :meth:`from_pretrained`. The engine keeps one context (KV cache); a new
    prompt that starts with the tokens already in the context reuses them.

    Sharing: an engine may be used from several threads. Every call that touches the context
    (generation, scoring, sparsity, profiling, plans, ``n_past``) holds the engine's
    ``threading.RLock``, so calls are serialised, one at a time; :meth:`generate` holds it for
    the whole generation, a :meth:`stream` generator for each of its steps but never while
    suspended. Several live :meth:`stream` generators each give their own right text (see
    there). After any exception, ``KeyboardInterrupt`` included, the context and the KV cache
    agree, and the next call gives what a fresh engine would.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        threads: int = 0,
        n_ctx: int | None = None,
        sparsity: str | None = None,
        thresholds: Sequence[float] | str | os.PathLike[str] | None = None,
        predictors: object | None = None,
        plan: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        vram_budget: int | str | None = None,
        mmap: bool | None = None,
        kv_cache: str | None = None,
        draft: str | os.PathLike[str] | LoadedModel | None = None,
        kv_cache_k: str | None = None,
        kv_cache_v: str | None = None,
        chat_template: str | None = None,
    ):
        if not isinstance(loaded, LoadedModel):
            raise ShapeError(
                "loaded must be a LoadedModel (powerinfer_rs.loading.load_model); "
                f"got {type(loaded).__name__} (Engine.from_pretrained takes a path)"
            )
        if chat_template is not None:
            loaded = with_chat_template(loaded, chat_template)
        threads = check_threads(threads)
        self.device = check_device(device)
        self.loaded = loaded
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        # LongRoPE's factors are chosen by the context (llama.cpp's rule), before the weights.
        if n_ctx is not None:
            n_ctx = check_int("n_ctx", n_ctx, 1)
        rope_ctx = min(n_ctx or DEFAULT_N_CTX, loaded.config.max_context)
        cfg, tensors = core_model_arguments(loaded, rope_ctx)
        weight_bytes = sum(int(t[3].nbytes) for t in tensors.values())
        copy = copy_weights(mmap, weight_bytes)
        mode = api_sparsity(sparsity, thresholds, predictors, default="dense")
        # Where the FFN runs as whole-matrix products on the CPU (dense, and the input mode's
        # dense fallbacks) its matrices are interleaved too; a mode that reads rows by index,
        # chosen later, gathers row-major copies on first use. A mixture of experts keeps its
        # rows and gains an interleaved copy of its experts where there is room for one.
        whole_ffn = mode in ("dense", "input") and self.device == "cpu" and plan is None
        if loaded.config.n_expert:
            whole_ffn = whole_ffn and room_for_packed_experts(mmap, weight_bytes)
        self._model = _core.Model(
            cfg, tensors, copy_weights=copy, interleave_ffn=whole_ffn and vram_budget is None
        )
        #: Whether the weights were copied onto huge pages (False: read from the file's map).
        self.weights_copied = copy
        self.plan: _core.Plan | None = None
        adopted, budget = (None, None)
        if plan is not None:
            adopted, budget = self._read_plan(plan, vram_budget)
        elif self.device != "cpu":
            raise PlanError(
                f"device={self.device!r} runs a placement plan's GPU side: pass plan=... (from "
                "`python -m powerinfer_rs.plan`), or use device='cpu'"
            )
        # On a GPU device the plan's KV caches hold `context` positions: the context fits them.
        gpu_context = adopted.context if adopted is not None and self.device != "cpu" else None
        if n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, loaded.config.max_context, gpu_context or DEFAULT_N_CTX)
        n_ctx = check_int("n_ctx", n_ctx, 1)
        if gpu_context is not None and n_ctx > gpu_context:
            raise PlanError(
                f"n_ctx={n_ctx} is more than the plan's context of {gpu_context} positions (its "
                "GPU KV caches); plan again with a larger --context or pass a smaller n_ctx"
            )
        if loaded.config.for_context(min(n_ctx, cfg.max_context)) != cfg:
            raise PlanError(
                f"the plan's context of {n_ctx} positions takes the other LongRoPE factors than "
                f"the default context of {rope_ctx}: pass n_ctx={n_ctx} explicitly"
            )
        #: The context: the session (its KV cache and sparsity mode) and the tokens in it.
        self.ctx = Context(_core.Session(self._model, threads, min(n_ctx, cfg.max_context)))
        if kv_cache is None:
            kv_cache = adopted.kv_cache if adopted is not None else "f16"
        self.ctx.session.set_kv_cache(kv_spec(kv_cache, kv_cache_k, kv_cache_v))
        self._threads = self.ctx.session.threads
        self._n_ctx = self.ctx.session.n_ctx
        self.last_stats = GenerationStats()
        self.thresholds: list[float] | None = None
        self.input_thresholds = None
        self.predictors = None
        self.set_sparsity(mode, thresholds=thresholds, predictors=predictors)
        if adopted is not None:
            self._adopt(adopted, budget)
        #: The draft model speculative decoding runs (:meth:`set_draft`), or None.
        self.draft: DraftModel | None = None
        if draft is not None:
            self.set_draft(draft)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        threads: int = 0,
        n_ctx: int | None = None,
        sparsity: str | None = None,
        thresholds: Sequence[float] | str | os.PathLike[str] | None = None,
        predictors: object | None = None,
        plan: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        vram_budget: int | str | None = None,
        mmap: bool | None = None,
        kv_cache: str | None = None,
        draft: str | os.PathLike[str] | LoadedModel | None = None,
        kv_cache_k: str | None = None,
        kv_cache_v: str | None = None,
        chat_template: str | None = None,
    ) -> Engine:
        """Load a GGUF file (the first shard of a split one), a Hugging Face model directory,
        or a hub id ``"org/repo"`` / ``"org/repo:QUANT"`` (fetched into the Hugging Face cache
        through ``huggingface_hub``; a local path that exists wins; see
        :mod:`powerinfer_rs.loading.hub`). Default: SmolLM2-135M-Instruct, fetched once into
        the cache. ``threads=0`` uses one thread per core.

        ``sparsity``: "dense" (exact), "exact-relu" (ReLU models: skip neurons whose ReLU is 0,
        same function as dense), "threshold" (skip neurons with |act(gate)·up| below a per-layer
        threshold; ``thresholds`` = a file from ``python -m powerinfer_rs.calibrate`` or a list),
        "predictor" (``predictors`` = a file from ``python -m powerinfer_rs.train_predictors``
        or a PredictorSet) or "input" (SiLU/GELU models: drop the small entries of every
        projection's input and read only the other columns; ``thresholds`` = a file from
        ``python -m powerinfer_rs.calibrate --mode input``, an ``InputThresholds`` or a mapping;
        CPU only, and it holds an input-major copy of every projection beside the weights:
        ``Engine.input_copies_bytes``). Default: the mode of the file given (``thresholds``
        or ``predictors``, said once with a ``UserWarning``), else "dense", or "predictor"
        with the file's own predictors for a PowerInfer GGUF (magic "PWRI"). A file the chosen
        mode would not use is refused (PlanError), never silently ignored.

        ``plan``: a placement from ``python -m powerinfer_rs.plan``; refused (PlanError) when made
        for another model and (VramBudgetError) when its GPU bytes exceed ``vram_budget`` (bytes
        or "8GiB") or the device's free memory. ``device``: "cpu" (default; runs only plans that
        put nothing on the GPU), "gpu-sim" (the plan's GPU side run by the host backend, in host
        memory: a correctness tool for GPU plans on machines without one), "gpu-emu" (the same
        with the real CUDA kernels run on the CPU by the emulator: slow, it checks a plan's
        kernels without a GPU) or "cuda"/"cuda:N" (the hybrid CPU+GPU executor); a GPU device
        needs a plan.

        ``mmap``: True reads the weights straight from the file's memory map (no copy); False
        copies every large tensor onto huge pages (faster sparse row reads, ~3-5% faster
        decoding, resident memory the kernel cannot page back to the file); None (default)
        copies when transparent huge pages are available and the weights take at most half of
        the available memory (see :mod:`powerinfer_rs.runtime.weight_memory`).

        ``kv_cache``: the precision of the keys and values kept, "f16" (as llama.cpp's), "f32",
        or ggml's 32-value blocks along head_dim "q8_0", "q4_0", "q4_1" (quantized as each
        position is written, read by integer dots as llama.cpp's; CPU device only: the hybrid
        refuses them with UnsupportedError); one setting for the CPU and the GPU layers, so both
        attend over the same numbers. ``kv_cache_k``/``kv_cache_v`` set the keys' or the
        values' apart (llama.cpp's ``-ctk``/``-ctv``). Default: the plan's
        (``python -m powerinfer_rs.plan --kv-cache``), else f16.

        ``draft``: a smaller model with the same tokenizer (a path, or a LoadedModel) that
        drafts tokens for speculative decoding (:meth:`set_draft`); generation then runs it by
        default (``speculative="auto"``, see :meth:`stream_tokens`).

        ``chat_template``: Jinja text used instead of the model's chat template (a file's
        broken or missing one; ``--chat-template-file`` on the command line), by chat, tools
        and the reasoning split alike; checked to compile here (ModelFileError)."""
        check_int("threads", threads, 0)
        check_device(device)
        if path is None:
            from .default_model import default_model_path

            path = default_model_path()
        elif not isinstance(path, (str, os.PathLike)):
            raise ModelFileError(f"path must be a file or directory path, got {path!r}")
        else:
            path = resolve_model(path)  # a hub id that is not a local path: fetched
        from ..loading.powerinfer_gguf import is_powerinfer_gguf, load_powerinfer_gguf

        # A file argument without a mode selects its mode (said once), as on the command line.
        sparsity = api_sparsity(sparsity, thresholds, predictors, default=None)
        if os.path.isfile(path) and is_powerinfer_gguf(path):
            pwri = load_powerinfer_gguf(path)  # runs in predictor mode with its own predictors
            loaded, sparsity = pwri.model, sparsity or "predictor"
            if sparsity == "predictor" and predictors is None:
                predictors = pwri.predictors
        else:
            loaded = load_model(path)
        return cls(
            loaded,
            threads=threads,
            n_ctx=n_ctx,
            sparsity=sparsity or "dense",
            thresholds=thresholds,
            predictors=predictors,
            plan=plan,
            device=device,
            vram_budget=vram_budget,
            mmap=mmap,
            kv_cache=kv_cache,
            draft=draft,
            kv_cache_k=kv_cache_k,
            kv_cache_v=kv_cache_v,
            chat_template=chat_template,
        )

    @locked
    def set_draft(self, draft: str | os.PathLike[str] | LoadedModel | None) -> None:
        """Load (a GGUF file or HF directory) or take (a LoadedModel) the draft model of
        speculative decoding (``speculative="draft"``, and "auto"'s choice); None drops it.
        It runs dense on the CPU with the engine's threads, context size and KV precision, in a
        session of its own. A draft whose vocabulary differs from this model's (its size or any
        token string) is a :class:`~.draft.DraftMismatchError` (an UnsupportedError)."""
        from .draft import DraftModel, check_same_vocab

        if draft is None:
            self.draft = None
            return
        if isinstance(draft, LoadedModel):
            loaded = draft
        elif isinstance(draft, (str, os.PathLike)):
            loaded = load_model(draft)
        else:
            raise ModelFileError(
                f"draft must be a model path or a LoadedModel, got {type(draft).__name__}"
            )
        check_same_vocab(self.loaded, loaded)
        cfg, tensors = core_model_arguments(loaded, self._n_ctx)
        model = _core.Model(cfg, tensors, copy_weights=False, interleave_ffn=True)
        self.draft = DraftModel(loaded, model, self._threads, self._n_ctx, self.kv_cache)

    # -- properties --------------------------------------------------------------------------

    @property
    def threads(self) -> int:
        return self._threads

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    @property
    def kv_cache(self) -> str:
        """The KV cache's precision: one name where keys and values share it ("f16", "f32",
        "q8_0", "q4_0", "q4_1"), else "k/v" (e.g. "q8_0/f16")."""
        return self.ctx.session.kv_cache

    @property
    def kv_cache_k(self) -> str:
        """The keys' precision."""
        return self.ctx.session.kv_cache_k

    @property
    def kv_cache_v(self) -> str:
        """The values' precision."""
        return self.ctx.session.kv_cache_v

    @property
    @locked
    def n_past(self) -> int:
        """Tokens in the context now."""
        return self.ctx.session.n_past

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes a decoded token reads."""
        return self._model.bytes_per_token

    @property
    def core_model(self) -> _core.Model:
        """The Rust model (``_core.Model``) this engine runs, for callers of the core itself
        (e.g. a second ``_core.Session`` on the same weights)."""
        return self._model

    @property
    def can_batch(self) -> bool:
        """Whether requests can decode together in slots (:mod:`.slots`): on the CPU device.
        A hybrid engine (a GPU device with a plan) runs one context at a time."""
        return self.device == "cpu" and self.ctx.session.gpu_info() is None

    def new_session(self) -> _core.Session:
        """A fresh ``_core.Session`` over this engine's weights that computes exactly what the
        engine's own does: the same context size, KV precision, sparsity mode (with its
        thresholds or predictors) and CPU plan, on the engine's own worker threads (shared, not
        a pool more: its passes should not run at the same time as the engine's). Slots
        (:mod:`.slots`) run in these. UnsupportedError on a hybrid engine (its GPU side
        belongs to the engine's session)."""
        if not self.can_batch:
            raise UnsupportedError(
                f"device={self.device!r}: a hybrid engine runs one session (its GPU side); "
                "extra sessions run on the CPU device only"
            )
        with self.ctx.lock:
            session = _core.Session(self._model, 0, self._n_ctx, threads_of=self.ctx.session)
            session.set_kv_cache(self.kv_cache)
            mode, args = self._sparsity_args
            session.set_sparsity(mode, **args)
            if self.plan is not None:
                session.set_plan(self.plan)
            return session

    def batch_generate(self, prompts: Sequence[str | Sequence[int]], **kwargs) -> list[str]:
        """Continue every prompt of ``prompts`` at once, each in a slot of its own whose decode
        steps run as one batched pass (:class:`~.slots.SlotPool`); ``kwargs`` as for
        :meth:`generate`. Text i is ``generate(prompts[i], **kwargs)``'s under greedy
        decoding (the batched pass computes each row exactly as alone). ``parallel=`` caps
        the slots (default: one per prompt, at most 16). The engine's own context is left as
        it was, except on a hybrid engine, which runs the prompts one after the other in it."""
        from .slots import batch_generate

        return batch_generate(self, prompts, **kwargs)

    @property
    def core_session(self) -> _core.Session:
        """The Rust session (``_core.Session``: the context's KV cache and the sparsity mode)
        this engine runs, for callers of the core itself (e.g. its phase timing). Changing its
        context behind the engine's back leaves the engine's view of the context stale."""
        return self.ctx.session

    @property
    @locked
    def context_ids(self) -> tuple[int, ...]:
        """The token ids the engine holds its context to be (what the next call continues);
        as many as :attr:`n_past` says the KV cache holds."""
        return tuple(self.ctx.ids)

    def tensor_address(self, name: str) -> int:
        """Address the engine reads tensor ``name`` from (zero-copy checks); KeyError for a
        name the engine holds no matrix under."""
        if not isinstance(name, str):
            raise KeyError(name)
        return self._model.tensor_address(name)

    def tensor_layout(self, name: str) -> str:
        """How the engine keeps tensor ``name``'s rows: ``"rows"`` (the file's layout, read
        from the file's map or copied), ``"interleaved"`` (the whole-matrix products'
        matrices in Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K, the attention's and the head's, and
        the FFN's on a dense CPU engine: rows interleaved by eight at load, in place of the
        file's layout, so one 32-byte load feeds eight rows; Q6_K's row kernel is the faster)
        or ``"rows+interleaved"`` (a mixture of experts' merged expert tensors on a dense CPU
        engine with room for a copy: the file's rows for the batched and row-by-index paths and
        an interleaved copy the one-token pass reads); KeyError for a name the engine holds no
        matrix under."""
        if not isinstance(name, str):
            raise KeyError(name)
        return self._model.tensor_layout(name)

    # -- sparsity and profiling -------------------------------------------------------------

    @property
    @locked
    def sparsity(self) -> str:
        """The FFN sparsity mode."""
        return self.ctx.session.sparsity

    @property
    def input_copies_bytes(self) -> int:
        """Bytes of the input mode's input-major copies of the weights (0 until the mode is
        first used): the mode's extra memory."""
        return int(self._model.input_copies_bytes)

    @locked
    def set_sparsity(
        self,
        mode: str,
        *,
        thresholds: Sequence[float] | str | os.PathLike[str] | None = None,
        predictors: object | None = None,
    ) -> None:
        """Switch the FFN sparsity mode (see :meth:`from_pretrained`)."""
        from ..formats.predictors import predictors_for
        from ..formats.thresholds import thresholds_for

        if not isinstance(mode, str):
            raise UnsupportedError(f"sparsity mode must be a string, got {mode!r}")
        api_sparsity(mode, thresholds, predictors, default=None)
        args: dict[str, object] = {}  # the session's set_sparsity arguments beside the mode
        if mode == "threshold":
            if thresholds is None:
                raise PlanError(
                    "sparsity='threshold' needs thresholds= (python -m "
                    "powerinfer_rs.calibrate writes them)"
                )
            self.thresholds = thresholds_for(thresholds, self.loaded)
            args = {"thresholds": self.thresholds}
        elif mode == "input":
            from ..formats.input_thresholds import input_thresholds_for

            if thresholds is None:
                raise PlanError(
                    "sparsity='input' needs thresholds= (python -m powerinfer_rs.calibrate "
                    "--mode input writes them)"
                )
            self.input_thresholds = input_thresholds_for(thresholds, self.loaded)
            it = self.input_thresholds
            args = {
                "input_thresholds": [[float(t) for t in row] for row in it.thresholds],
                "input_output": float(it.output),
                "input_score": it.score,
            }
        elif mode == "predictor":
            if predictors is None:
                raise PlanError(
                    "sparsity='predictor' needs predictors= (python -m "
                    "powerinfer_rs.train_predictors writes them)"
                )
            from ..formats.predictors import stored_tensors
            from ..predictors.model import BLOCK_DTYPES

            self.predictors = predictors_for(predictors, self.loaded)
            # Predictors stored in f16 hold f16-exact values: hand them over as F16 (half the
            # bytes a token reads), anything else as F32.
            # Block-format predictors (a quantized PowerInfer file) go over as stored.
            # Block-format predictors trained here (Q8_0, Q4_0) are quantized as a file stores
            # them (the same bytes).
            dtype = str(self.predictors.dtype).upper()
            store = np.float16 if dtype == "F16" else np.float32

            def held(p, k):
                if p.stored is None and dtype in BLOCK_DTYPES:
                    p.stored = stored_tensors(p, dtype)
                if p.stored is not None:
                    t = p.stored[k]
                    return (t.dtype, t.rows, t.cols, t.data)
                return np.ascontiguousarray(p.fc1 if k == 0 else p.fc2, dtype=store)

            units = None
            if self.config.n_expert:  # a mixture of experts: a predictor per expert
                units = sorted(self.predictors.experts)
                layers = [self.predictors.experts[u] for u in units]
            else:
                layers = [self.predictors.layers[i] for i in range(self.config.n_layers)]
            typed = _core.Predictors(
                [held(p, 0) for p in layers],
                [held(p, 1) for p in layers],
                [float(p.threshold) for p in layers],
                self.predictors.input,
                experts=units,
            )
            args = {"predictors": typed}
        self.ctx.session.set_sparsity(mode, **args)
        self._sparsity_args = (mode, args)
        self.reset()

    @locked
    def start_profiling(
        self,
        thresholds: Sequence[float] | None = None,
        capture: bool = False,
        capture_sites: bool = False,
    ) -> None:
        """Count per layer and neuron the tokens in which each FFN neuron is active (ReLU
        semantics, or |act| >= threshold with ``thresholds``) during the following forward
        passes; with ``capture`` also keep (FFN input, activation) rows, see
        :meth:`take_captured`; with ``capture_sites`` the input mode's site rows, see
        :meth:`take_sites`."""
        if thresholds is not None:
            try:
                thresholds = [float(t) for t in thresholds]
            except (TypeError, ValueError):
                raise ShapeError(
                    f"thresholds must be a list of numbers (one per layer), got {thresholds!r}"
                ) from None
        self.ctx.session.start_profiling(thresholds, bool(capture), bool(capture_sites))

    @locked
    def profile_counts(self) -> tuple[np.ndarray, int]:
        """(counts int64 (n_layers, ffn), tokens counted) of the running profile; a mixture
        of experts counts its flattened neuron space (n_layers, n_expert * expert_ffn), neuron
        ``e * expert_ffn + j`` being neuron j of expert e."""
        return self.ctx.session.profile_counts(), self.ctx.session.profile_tokens

    @locked
    def profile_expert_counts(self) -> np.ndarray | None:
        """Tokens routed to each expert in the running profile, int64 (n_layers, n_expert);
        None for a dense model."""
        return self.ctx.session.profile_expert_counts()

    @locked
    def take_sites(self) -> tuple[list[list[np.ndarray]], np.ndarray]:
        """The input mode's site rows captured since the last call (``capture_sites``): per
        layer the four sites' float32 rows (``INPUT_SITES`` order: attention input, attention
        output, FFN input, ``act(gate)·up``), then the output head's input rows."""
        return self.ctx.session.take_sites()

    @locked
    def input_column_norms(self, layer: int) -> list[np.ndarray]:
        """WINA's column norms of layer ``layer``'s four sites (or, for ``layer`` =
        ``n_layers``, the output head's, as a one-element list)."""
        return self._model.input_column_norms(int(layer))

    @locked
    def take_captured(self) -> list[tuple[np.ndarray, ...]]:
        """Per layer (x (n, dim), act (n, ffn)) float32 rows captured since the last call; a
        mixture of experts: (x, act (n, n_expert_used * expert_ffn), routes int64 (n,
        n_expert_used)), each token's routed experts' values in route order and which
        experts they are."""
        return self.ctx.session.take_captured()

    @locked
    def stop_profiling(self) -> None:
        """Stop counting."""
        self.ctx.session.stop_profiling()

    # -- scoring ---------------------------------------------------------------------------

    @locked
    def reset(self) -> None:
        """Forget the context."""
        self.ctx.reset()

    @locked
    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append ``token_ids`` to the current context in one batched forward pass (a running
        profile counts them) and return the float32 logits of the last one, shape (vocab,)."""
        ids = self._check_ids(token_ids)
        if not ids:
            raise ShapeError("prefill() needs at least one token")
        return self.ctx.feed(ids)

    @locked
    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Float32 logits of shape (len(token_ids), vocab) for a fresh context."""
        ids = self._check_ids(token_ids)
        if not ids:
            raise ShapeError("logits() needs at least one token")
        self.reset()
        try:
            return self.ctx.session.feed(ids, all_logits=True)
        finally:
            self.reset()

    @locked
    def hidden_states(self, token_ids: Sequence[int]) -> np.ndarray:
        """Float32 final hidden states of shape (len(token_ids), dim) for a fresh context: each
        token's after the output norm, the rows the output head multiplies into
        :meth:`logits` (the head itself is not computed). The context is forgotten after."""
        ids = self._check_ids(token_ids)
        if not ids:
            raise ShapeError("hidden_states() needs at least one token")
        self.reset()
        try:
            return self.ctx.session.feed_hidden(ids)
        finally:
            self.reset()

    def embed(
        self,
        inputs: str | Sequence[str] | Sequence[Sequence[int]],
        *,
        pooling: str | None = None,
        normalize: bool = True,
    ) -> np.ndarray:
        """Embeddings of ``inputs`` (a string, strings, or token-id lists), float32 of shape
        (len(inputs), dim): each input's :meth:`hidden_states` on its own, pooled (``mean``,
        ``cls`` or ``last``; default: the file's ``pooling_type``, mean where it names none:
        :mod:`.embeddings`) and L2-normalized (``normalize``), as llama-server returns them.
        Uses the engine's context, which is forgotten after (as :meth:`logits`)."""
        from .embeddings import embed_ids, model_pooling, token_lists

        how = pooling if pooling is not None else model_pooling(self.loaded.pooling_type)
        return embed_ids(self.hidden_states, token_lists(self, inputs), how, normalize)

    def perplexity(self, text: str, *, window: int = 512, progress: bool = False) -> float:
        """Perplexity of ``text`` in non-overlapping windows of ``window`` tokens; every token
        after the first of each window is scored."""
        if not isinstance(text, str):
            raise ShapeError(f"text must be a string, got {type(text).__name__}")
        ids = self.tokenizer.encode(check_text("text", text), add_bos=False)
        return self.perplexity_of_ids(ids, window=window, progress=progress)

    @locked
    def perplexity_of_ids(
        self, ids: Sequence[int], *, window: int = 512, progress: bool = False
    ) -> float:
        """Perplexity of a token sequence (see :meth:`perplexity`)."""
        window = min(check_int("window", window), self.n_ctx)
        ids = self._check_ids(ids)
        if window < 2 or len(ids) < 2:
            raise ShapeError("perplexity needs a window and a text of at least 2 tokens")
        starts = range(0, len(ids) - 1, window)
        nll, count = 0.0, 0
        it: Iterator[int] = iter(starts)
        if progress:
            from tqdm import tqdm

            it = iter(tqdm(starts, desc="perplexity", unit="window"))
        for s in it:
            chunk = list(ids[s : s + window])
            if len(chunk) < 2:
                break
            logits = self.logits(chunk).astype(np.float64)
            m = logits.max(axis=1, keepdims=True)
            logz = (m[:, 0] + np.log(np.exp(logits - m).sum(axis=1)))[:-1]
            target = np.asarray(chunk[1:])
            nll += float((logz - logits[np.arange(len(chunk) - 1), target]).sum())
            count += len(chunk) - 1
        if not math.isfinite(nll):  # the core refuses non-finite logits; keep nan out anyway
            raise InternalError(f"perplexity: the negative log-likelihood is {nll}")
        return math.exp(nll / count)

    # -- internals -------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        """Token ids as ints; their range is checked in one place, by the Rust core (ids that
        do not even fit its int64 are refused here)."""
        if isinstance(ids, (str, bytes, bytearray)):
            raise TokenError(f"token ids must be a sequence of integers, got {ids!r}")
        try:
            out = [operator.index(i) for i in ids]
        except TypeError as e:
            raise TokenError(f"token ids must be integers: {e}") from None
        for i in out:
            if not -(2**63) <= i < 2**63:
                raise TokenError(f"token id {i} is outside the vocabulary")
        return out
