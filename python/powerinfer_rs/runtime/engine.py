"""The :class:`Engine`: a loaded model, its tokenizer and one context, with generation,
streaming, scoring and perplexity."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from .. import _core
from ..errors import (
    ContextOverflowError,
    CudaError,
    ModelFileError,
    PlanError,
    ShapeError,
    TokenError,
    UnsupportedError,
    VramBudgetError,
)
from ..loading import LoadedModel, load_model
from .chat import format_chat
from .sampling import SamplingParams, sample
from .streaming import IncrementalDecoder, StopMatcher

#: Context size used when the caller gives none (the model's own if smaller).
DEFAULT_N_CTX = 4096

_CONFIG_FIELDS = (
    "n_layers",
    "dim",
    "ffn_dim",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    "vocab_size",
    "max_context",
    "rms_eps",
    "rope_theta",
    "rope_style",
    "activation",
)


@dataclass
class GenerationStats:
    """Timing of the last generate/stream call."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually computed (the rest came from the cache)
    prefill_seconds: float = 0.0
    decode_tokens: int = 0
    decode_seconds: float = 0.0
    finish_reason: str = ""

    @property
    def decode_tokens_per_second(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0


class Engine:
    """A model ready to run: weights in Rust, tokenizer and chat template in Python.

    Build one with :meth:`from_pretrained`. The engine keeps one context (KV cache); a new
    prompt that starts with the tokens already in the context reuses them.
    """

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        threads: int = 0,
        n_ctx: int | None = None,
        sparsity: str = "dense",
        thresholds: Sequence[float] | str | os.PathLike[str] | None = None,
        predictors: object | None = None,
        plan: str | os.PathLike[str] | None = None,
        device: str = "cpu",
        vram_budget: int | str | None = None,
    ):
        if threads < 0:
            raise ShapeError(f"threads must be >= 0 (0 = one per core), got {threads}")
        self.device = _check_device(device)
        self.loaded = loaded
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        cfg = {name: getattr(loaded.config, name) for name in _CONFIG_FIELDS}
        tensors = {
            name: (t.dtype, t.rows, t.cols, t.data)
            for name, t in loaded.tensors.items()
            if not (name == "output" and loaded.config.tie_embeddings)
        }
        if n_ctx is None:
            n_ctx = min(DEFAULT_N_CTX, loaded.config.max_context)
        if n_ctx <= 0:
            raise ShapeError(f"n_ctx must be > 0, got {n_ctx}")
        self._model = _core.Model(cfg, tensors)
        self._session = _core.Session(self._model, threads, min(n_ctx, loaded.config.max_context))
        self._context: list[int] = []
        self.last_stats = GenerationStats()
        self.thresholds: list[float] | None = None
        self.predictors = None
        self.set_sparsity(sparsity, thresholds=thresholds, predictors=predictors)
        self.plan = None
        self._plan_path: str | None = None
        self.hot_neurons: list[np.ndarray] | None = None
        if plan is not None:
            self.load_plan(plan, vram_budget=vram_budget)

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
    ) -> Engine:
        """Load a GGUF file or a Hugging Face model directory (default: SmolLM2-135M-Instruct,
        fetched once into the cache). ``threads=0`` uses one thread per core.

        ``sparsity``: "dense" (exact), "exact-relu" (ReLU models: skip neurons whose ReLU is 0,
        same function as dense), "threshold" (skip neurons with |act(gate)·up| below a per-layer
        threshold; ``thresholds`` = a file from ``python -m powerinfer_rs.calibrate`` or a list)
        or "predictor" (``predictors`` = a file from ``python -m powerinfer_rs.train_predictors``
        or a PredictorSet). Default: "dense", or "predictor" with the file's own predictors for a
        PowerInfer GGUF (magic "PWRI").

        ``plan``: a placement from ``python -m powerinfer_rs.plan``; refused (PlanError) when made
        for another model and (VramBudgetError) when its GPU bytes exceed ``vram_budget`` (bytes
        or "8GiB"; the CPU device has none: only CPU-only plans fit). ``device``: "cpu"
        (default) or "cuda"/"cuda:N"."""
        if threads < 0:
            raise ShapeError(f"threads must be >= 0 (0 = one per core), got {threads}")
        _check_device(device)
        if path is None:
            from .default_model import default_model_path

            path = default_model_path()
        from ..loading.powerinfer_gguf import is_powerinfer_gguf, load_powerinfer_gguf

        if os.path.isfile(path) and is_powerinfer_gguf(path):
            pwri = load_powerinfer_gguf(path)
            return cls(
                pwri.model,
                threads=threads,
                n_ctx=n_ctx,
                sparsity=sparsity or "predictor",
                thresholds=thresholds,
                predictors=predictors if predictors is not None else pwri.predictors,
                plan=plan,
                device=device,
                vram_budget=vram_budget,
            )
        return cls(
            load_model(path),
            threads=threads,
            n_ctx=n_ctx,
            sparsity=sparsity or "dense",
            thresholds=thresholds,
            predictors=predictors,
            plan=plan,
            device=device,
            vram_budget=vram_budget,
        )

    # -- properties --------------------------------------------------------------------------

    @property
    def threads(self) -> int:
        return self._session.threads

    @property
    def n_ctx(self) -> int:
        return self._session.n_ctx

    @property
    def n_past(self) -> int:
        """Tokens in the context now."""
        return self._session.n_past

    @property
    def bytes_per_token(self) -> int:
        """Weight bytes a decoded token reads."""
        return self._model.bytes_per_token

    def tensor_address(self, name: str) -> int:
        """Address the engine reads tensor ``name`` from (zero-copy checks)."""
        return self._model.tensor_address(name)

    # -- sparsity and profiling -------------------------------------------------------------

    @property
    def sparsity(self) -> str:
        """The FFN sparsity mode."""
        return self._session.sparsity

    def set_sparsity(
        self,
        mode: str,
        *,
        thresholds: Sequence[float] | str | os.PathLike[str] | None = None,
        predictors: object | None = None,
    ) -> None:
        """Switch the FFN sparsity mode (see :meth:`from_pretrained`)."""
        if mode == "threshold":
            if thresholds is None:
                raise PlanError(
                    "sparsity='threshold' needs thresholds= (python -m "
                    "powerinfer_rs.calibrate writes them)"
                )
            self.thresholds = _load_thresholds(thresholds, self.loaded)
            self._session.set_sparsity("threshold", thresholds=self.thresholds)
        elif mode == "predictor":
            if predictors is None:
                raise PlanError(
                    "sparsity='predictor' needs predictors= (python -m "
                    "powerinfer_rs.train_predictors writes them)"
                )
            self.predictors = _load_predictors(predictors, self.loaded)
            tensors: dict[str, object] = {}
            # Predictors stored in f16 hold f16-exact values: hand them over as F16 (half the
            # bytes a token reads), anything else as F32.
            store = np.float16 if str(self.predictors.dtype).upper() == "F16" else np.float32
            name_of = {np.float16: "F16", np.float32: "F32"}
            for i in range(self.config.n_layers):
                p = self.predictors.layers[i]
                for name, arr in (("fc1", p.fc1), ("fc2", p.fc2)):
                    a = np.ascontiguousarray(arr, dtype=store)
                    tensors[f"blk.{i}.{name}"] = (
                        name_of[store],
                        a.shape[0],
                        a.shape[1],
                        a.view(np.uint8).reshape(-1),
                    )
                tensors[f"blk.{i}.threshold"] = float(p.threshold)
            self._session.set_sparsity(
                "predictor", predictors=tensors, predictor_input=self.predictors.input
            )
        else:
            self._session.set_sparsity(mode)
        self.reset()

    def load_plan(
        self, plan: str | os.PathLike[str], *, vram_budget: int | str | None = None
    ) -> None:
        """Adopt a placement plan: checked against this model (PlanError) and against the VRAM
        this engine has (VramBudgetError; 0 on the CPU device); its neuron table (hot ids per
        layer) is read and validated by the Rust core, and the GPU bytes the plan counts must
        equal the engine's own allocation list (:meth:`gpu_allocation_report`; PlanError)."""
        from ..formats.plan import load_plan
        from ..planning.sizes import parse_bytes

        if self.device == "cpu":
            budget = 0 if vram_budget is None else parse_bytes(vram_budget)
            if budget:
                raise VramBudgetError(
                    f"the CPU device has no VRAM; vram_budget={vram_budget!r} needs device='cuda'"
                )
        else:
            budget = None if vram_budget is None else parse_bytes(vram_budget)
        loaded_plan = load_plan(plan, model=self.loaded, budget_bytes=budget)
        path = os.fspath(plan)
        # The engine's own allocation list must come to what the planner counted, or the plan
        # could exceed its budget at run time.
        engine_bytes = sum(b for _, b in self._model.gpu_allocation_report(path))
        if engine_bytes != loaded_plan.gpu_bytes:
            raise PlanError(
                f"{path}: the plan counts {loaded_plan.gpu_bytes} GPU bytes but this engine "
                f"would allocate {engine_bytes}; plan again with this version"
            )
        hot = _core.read_neuron_table(path, self.config.n_layers, self.config.ffn_dim)
        self.plan = loaded_plan
        self.hot_neurons = [np.asarray(h, dtype=np.int64) for h in hot]
        self._plan_path = path

    def gpu_allocation_report(
        self, plan: str | os.PathLike[str] | None = None
    ) -> list[tuple[str, int]]:
        """``[(name, bytes), ...]``: every GPU allocation this engine makes to run ``plan`` (a
        plan file; default: the one loaded), empty for a CPU-only plan. Computed by the Rust
        core from this model's weights and the plan file's neuron table and placement, apart
        from the planner; it equals ``planning.accounting.gpu_allocation(plan, model)`` and
        sums to the plan's ``gpu_bytes``. A plan passed here needs no GPU (the report is host
        arithmetic). Raises :class:`PlanError` when no plan is loaded or given, or the plan is
        unreadable or made for another model."""
        if plan is not None:
            from ..formats.plan import load_plan

            load_plan(plan, model=self.loaded)  # refuses another model's plan
            path = os.fspath(plan)
        elif self._plan_path is not None:
            path = self._plan_path
        else:
            raise PlanError("no plan loaded: pass plan=... here or to the Engine")
        return self._model.gpu_allocation_report(path)

    def start_profiling(
        self, thresholds: Sequence[float] | None = None, capture: bool = False
    ) -> None:
        """Count per layer and neuron the tokens in which each FFN neuron is active (ReLU
        semantics, or |act| >= threshold with ``thresholds``) during the following forward
        passes; with ``capture`` also keep (FFN input, activation) rows, see
        :meth:`take_captured`."""
        self._session.start_profiling(None if thresholds is None else list(thresholds), capture)

    def profile_counts(self) -> tuple[np.ndarray, int]:
        """(counts int64 (n_layers, ffn), tokens counted) of the running profile."""
        return self._session.profile_counts(), self._session.profile_tokens

    def take_captured(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per layer (x (n, dim), act (n, ffn)) float32 rows captured since the last call."""
        return self._session.take_captured()

    def stop_profiling(self) -> None:
        """Stop counting."""
        self._session.stop_profiling()

    # -- scoring ---------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the context."""
        self._session.reset()
        self._context = []

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Append ``token_ids`` to the current context in one batched forward pass (a running
        profile counts them) and return the float32 logits of the last one, shape (vocab,)."""
        ids = self._check_ids(token_ids)
        if not ids:
            raise ShapeError("prefill() needs at least one token")
        logits = self._session.feed(ids)[0]
        self._context.extend(ids)
        return logits

    def logits(self, token_ids: Sequence[int]) -> np.ndarray:
        """Float32 logits of shape (len(token_ids), vocab) for a fresh context."""
        ids = self._check_ids(token_ids)
        if not ids:
            raise ShapeError("logits() needs at least one token")
        self.reset()
        try:
            return self._session.feed(ids, all_logits=True)
        finally:
            self.reset()

    def perplexity(self, text: str, *, window: int = 512, progress: bool = False) -> float:
        """Perplexity of ``text`` in non-overlapping windows of ``window`` tokens; every token
        after the first of each window is scored."""
        ids = self.tokenizer.encode(text, add_bos=False)
        return self.perplexity_of_ids(ids, window=window, progress=progress)

    def perplexity_of_ids(
        self, ids: Sequence[int], *, window: int = 512, progress: bool = False
    ) -> float:
        """Perplexity of a token sequence (see :meth:`perplexity`)."""
        window = min(window, self.n_ctx)
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
        return math.exp(nll / count)

    # -- generation ------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], **kwargs) -> str:
        """Continue ``prompt`` and return the new text (see :meth:`stream` for arguments)."""
        return "".join(self.stream(prompt, **kwargs))

    def chat(self, messages: list[dict], **kwargs) -> str:
        """Answer a conversation formatted with the model's own chat template."""
        return self.generate(self.format_chat(messages), **kwargs)

    def format_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        """The prompt text the model's chat template makes of ``messages``."""
        tok = self.tokenizer
        bos = tok.id_to_token(tok.bos_id) if tok.bos_id is not None else ""
        eos = tok.id_to_token(tok.eos_ids[0]) if tok.eos_ids else ""
        return format_chat(
            self.loaded.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos or "",
            eos_token=eos or "",
        )

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_new_tokens: int = 128,
        temperature: float = 0.8,
        top_k: int = 40,
        top_p: float = 0.95,
        repetition_penalty: float = 1.0,
        seed: int | None = None,
        stop: Sequence[str] | str | None = None,
        ignore_eos: bool = False,
    ) -> Iterator[str]:
        """Yield the continuation of ``prompt`` piece by piece as tokens are decoded.

        ``temperature=0`` is greedy. ``stop`` strings end generation (they are not yielded).
        Generation also ends at an end-of-sequence token (unless ``ignore_eos``), after
        ``max_new_tokens``, or when the context is full.
        """
        params = SamplingParams(temperature, top_k, top_p, repetition_penalty)
        params.validate()
        if max_new_tokens < 0:
            raise ShapeError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        prompt_ids = self._encode_prompt(prompt)
        if len(prompt_ids) >= self.n_ctx:
            raise ContextOverflowError(
                f"the prompt has {len(prompt_ids)} tokens; the context holds {self.n_ctx}"
            )
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        rng = np.random.default_rng(seed)
        stats = self.last_stats = GenerationStats(prompt_tokens=len(prompt_ids))
        eos = set() if ignore_eos else set(self.tokenizer.eos_ids)

        t0 = time.perf_counter()
        logits = self._prefill(prompt_ids)
        stats.prefill_tokens = self._last_prefill_count
        stats.prefill_seconds = time.perf_counter() - t0

        decoder = IncrementalDecoder(self.tokenizer.decode)
        matcher = StopMatcher(stops)
        seen = list(prompt_ids)
        stats.finish_reason = "length"
        t_decode = time.perf_counter()
        for i in range(max_new_tokens):
            token = sample(logits, params, rng, seen)
            if token in eos:
                stats.finish_reason = "eos"
                break
            seen.append(token)
            piece = matcher.push(decoder.add(token))
            if piece:
                yield piece
            if matcher.stopped:
                stats.finish_reason = "stop"
                break
            if i + 1 == max_new_tokens:
                break
            if self.n_past >= self.n_ctx:
                stats.finish_reason = "context"
                break
            logits = self._session.feed([token])[0]
            self._context.append(token)
            stats.decode_tokens += 1
            stats.decode_seconds = time.perf_counter() - t_decode
        rest = matcher.flush()
        if rest and not matcher.stopped:
            yield rest

    def stats(self) -> dict:
        """Timing of the last generation as a dict."""
        s = self.last_stats
        return {
            "prompt_tokens": s.prompt_tokens,
            "prefill_tokens": s.prefill_tokens,
            "prefill_seconds": s.prefill_seconds,
            "decode_tokens": s.decode_tokens,
            "decode_seconds": s.decode_seconds,
            "decode_tokens_per_second": s.decode_tokens_per_second,
            "finish_reason": s.finish_reason,
        }

    # -- internals -------------------------------------------------------------------------

    def _check_ids(self, ids: Sequence[int]) -> list[int]:
        out = [int(i) for i in ids]
        vocab = self.config.vocab_size
        bad = [i for i in out if not 0 <= i < vocab]
        if bad:
            raise TokenError(f"token id {bad[0]} is outside the vocabulary 0..{vocab}")
        return out

    def _encode_prompt(self, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        else:
            ids = self._check_ids(prompt)
        if not ids:
            if self.tokenizer.bos_id is None:
                raise ShapeError("empty prompt and the model has no BOS token to start from")
            ids = [self.tokenizer.bos_id]
        return ids

    def _prefill(self, ids: list[int]) -> np.ndarray:
        """Bring the context to ``ids`` reusing the longest common prefix; return the logits of
        the last token."""
        common = 0
        for a, b in zip(self._context, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # always recompute the last token's logits
        self._session.truncate(common)
        self._context = self._context[:common]
        todo = ids[common:]
        self._last_prefill_count = len(todo)
        # The last prompt token always goes through the one-token (decode) path, so the first
        # sampled token does not depend on how much of the prompt was already cached.
        if len(todo) > 1:
            self._session.feed(todo[:-1])
            self._context.extend(todo[:-1])
        logits = self._session.feed(todo[-1:])[0]
        self._context.append(todo[-1])
        return logits


def _load_thresholds(
    source: Sequence[float] | str | os.PathLike[str], loaded: LoadedModel
) -> list[float]:
    """Per-layer thresholds from a list or a calibrate file (JSON), checked against the model."""
    if isinstance(source, (str, os.PathLike)):
        import json

        try:
            with open(source, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise ModelFileError(f"{os.fspath(source)}: cannot read thresholds: {e}") from e
        if not isinstance(doc, dict) or not isinstance(doc.get("thresholds"), list):
            raise ModelFileError(f"{os.fspath(source)}: no 'thresholds' list")
        fp = doc.get("model_fingerprint")
        if fp is not None and fp != loaded.fingerprint:
            raise PlanError(
                f"{os.fspath(source)} was calibrated for another model "
                f"(fingerprint {fp}, this model {loaded.fingerprint})"
            )
        values = doc["thresholds"]
    else:
        values = list(source)
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as e:
        raise PlanError(f"thresholds must be numbers: {e}") from e
    if len(out) != loaded.config.n_layers:
        raise PlanError(f"{len(out)} thresholds for a {loaded.config.n_layers}-layer model")
    return out


def _load_predictors(source: object, loaded: LoadedModel):
    """A PredictorSet from a file path or as given, checked against the model."""
    from ..formats.predictors import load_predictors
    from ..predictors import PredictorSet

    pset = load_predictors(source) if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(pset, PredictorSet):
        raise PlanError(f"predictors must be a path or a PredictorSet, got {type(pset).__name__}")
    fp = pset.model_fingerprint
    if fp is not None and fp != loaded.fingerprint:
        raise PlanError(
            f"the predictors were trained for another model (fingerprint {fp}, "
            f"this model {loaded.fingerprint})"
        )
    missing = [i for i in range(loaded.config.n_layers) if i not in pset.layers]
    if missing:
        raise PlanError(f"the predictors lack layers {missing[:8]}")
    return pset


def _check_device(device: str) -> str:
    """ "cpu", or "cuda"/"cuda:N" when a GPU executor can serve it."""
    if device == "cpu":
        return device
    if device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit()):
        count = getattr(_core, "cuda_device_count", lambda: 0)()
        ordinal = int(device[5:]) if ":" in device else 0
        if ordinal >= count:
            raise CudaError(
                f"{device} was asked for, but {count} CUDA device(s) were found "
                "(is the NVIDIA driver installed?)"
            )
        raise CudaError(
            f"{device}: the hybrid CPU+GPU executor is not part of this build yet; use device='cpu'"
        )
    raise UnsupportedError(f"device {device!r} (use 'cpu', 'cuda' or 'cuda:N')")
