"""PowerInfer's model files: GGUF with the magic ``PWRI`` and the predictors inside.

What SJTU-IPADS/PowerInfer writes and reads (paths in that repository):

* ``convert-hf-to-powerinfer-gguf.py`` and ``convert.py`` write an ordinary GGUF, then
  overwrite its first four bytes with ``b"PWRI"``. Per layer they add the predictor tensors
  ``blk.N.fc1.weight`` (numpy ``[rank, n_embd]``, i.e. GGUF dims ``{n_embd, rank}``) and
  ``blk.N.fc2.weight`` (numpy ``[n_ff, rank]``, GGUF ``{rank, n_ff}``) -- the ``fc1``/``fc2``
  weights of each layer's ``ReluMLP`` (``nn.Linear(bias=False)``) -- and store the FFN down
  projection transposed as ``blk.N.ffn_down_t.weight`` (GGUF ``{n_embd, n_ff}``: one contiguous
  row of ``n_embd`` per neuron, for the axpy kernel). The predictor directory's
  ``config.json`` ``sparse_threshold`` goes to the float32 key ``powerinfer.sparse_threshold``.
  Rank may differ per layer.
* ``llama.cpp`` (``llm_load_hparams``) reads ``powerinfer.sparse_threshold`` only for PWRI files
  (``gguf_get_sparse_deriv``), default 0.0, and the environment variable
  ``LLAMA_SPARSE_PRED_THRESHOLD`` overrides it. ``llm_build_ffn_sparse`` computes
  ``idx = fc2 @ relu(fc1 @ ffn_inp)`` -- note the input: ``ffn_inp``, the residual stream
  *before* ``ffn_norm`` -- and the sparse kernels (``ggml.c``:
  ``ggml_compute_forward_mul_mat_sparse`` / ``..._axpy``: ``if (idx[i] < threshold) skip``;
  ``ggml-cuda.cu``: ``if (idx[row] < dev_sparse_threshold) return``) keep neuron ``i`` iff
  ``idx[i] >= threshold`` on the raw logit (no sigmoid). Sparse mode always uses ReLU.

:func:`load_powerinfer_gguf` returns the llama weights as a
:class:`~powerinfer_rs.loading.LoadedModel` (with ``blk.N.ffn_down_t`` in place of
``blk.N.ffn_down``; predictor tensors removed) and the predictors as a
:class:`~powerinfer_rs.predictors.PredictorSet` with ``input="ffn_inp"``.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, ShapeError, UnsupportedError
from ..loading.archs import GGUF_FAMILIES, split_fused
from ..loading.gguf_file import POWERINFER_MAGIC, GGUFFile, starts_with
from ..loading.gguf_loader import (
    ACTIVATION_KEY,
    _tensor_views,
    config_from_metadata,
    fit_position_table,
    loaded_model,
)
from ..loading.gguf_split import GGUFModelFiles
from ..loading.types import (
    LoadedModel,
    TensorData,
    check_layer_count,
    check_tensors,
    expected_shapes,
)
from ..predictors.model import LayerPredictor, PredictorSet
from ..runtime.tokenizer import Tokenizer

SPARSE_THRESHOLD_KEY = "powerinfer.sparse_threshold"
THRESHOLD_ENV = "LLAMA_SPARSE_PRED_THRESHOLD"
#: The architectures of PowerInfer files read here (those PowerInfer serves).
POWERINFER_ARCHS: tuple[str, ...] = ("llama", "bamboo", "opt", "falcon")


@dataclass
class PowerInferModel:
    """A PowerInfer GGUF: the model, its predictors and the file's sparse threshold."""

    model: LoadedModel
    predictors: PredictorSet
    sparse_threshold: float


def is_powerinfer_gguf(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` starts with PowerInfer's ``PWRI`` magic."""
    return starts_with(path, POWERINFER_MAGIC)


def dequantize_tensor(t: TensorData) -> np.ndarray:
    """float32 ``[rows, cols]`` values of a tensor (F32/F16/BF16 directly, quantised formats
    through ``gguf.quants``)."""
    raw = np.asarray(t.data)
    if t.dtype == "F32":
        out = raw.view(np.float32)
    elif t.dtype == "F16":
        out = raw.view(np.float16).astype(np.float32)
    elif t.dtype == "BF16":
        out = (raw.view(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
    else:
        import gguf

        try:
            qt = gguf.GGMLQuantizationType[t.dtype]
        except KeyError:
            raise UnsupportedError(f"tensor {t.name}: dtype {t.dtype}") from None
        out = gguf.quants.dequantize(raw.reshape(t.rows, t.row_bytes), qt)
    return np.asarray(out, dtype=np.float32).reshape(t.rows, t.cols)


def load_powerinfer_gguf(
    path: str | os.PathLike[str], *, threshold: float | None = None
) -> PowerInferModel:
    """Load a PowerInfer (``PWRI``) GGUF file. ``threshold`` overrides the file's
    ``powerinfer.sparse_threshold`` (as ``LLAMA_SPARSE_PRED_THRESHOLD`` does in PowerInfer;
    the environment variable itself is not read here)."""
    p = str(Path(path))
    gf = GGUFFile(p, allow_powerinfer=True)
    if gf.magic != POWERINFER_MAGIC:
        raise ModelFileError(f"{p}: a plain GGUF file, not a PowerInfer (PWRI) one")
    meta = dict(gf.metadata)
    arch = meta.get("general.architecture")
    if arch not in POWERINFER_ARCHS:
        raise UnsupportedError(f"{p}: architecture {arch!r} (supported: {POWERINFER_ARCHS})")
    # PowerInfer's sparse FFN is ReLU-only and its files carry no activation key
    meta.setdefault(ACTIVATION_KEY, "relu")
    thr_meta = meta.get(SPARSE_THRESHOLD_KEY, 0.0)
    if (
        isinstance(thr_meta, bool)
        or not isinstance(thr_meta, (int, float))
        or not math.isfinite(thr_meta)
    ):
        raise ModelFileError(
            f"{p}: {SPARSE_THRESHOLD_KEY} must be a finite number, got {thr_meta!r}"
        )
    thr = float(thr_meta if threshold is None else threshold)
    tok = Tokenizer.from_gguf(meta)
    cfg = config_from_metadata(meta, tok)
    fam = GGUF_FAMILIES[arch]
    tensors = _tensor_views(GGUFModelFiles(gf), fam, cfg)
    q_dim, kv_dim = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    split_fused(fam, tensors, q_dim, kv_dim, cfg.ffn_dim)
    fit_position_table(cfg, tensors, p)
    preds_raw: dict[int, dict[str, TensorData]] = {}
    for name in list(tensors):
        parts = name.split(".")
        if len(parts) == 3 and parts[0] == "blk" and parts[2] in ("fc1", "fc2"):
            if not (parts[1].isascii() and parts[1].isdigit()):
                raise ModelFileError(f"{p}: bad predictor tensor name {name!r}")
            preds_raw.setdefault(int(parts[1]), {})[parts[2]] = tensors.pop(name)
    if "output" not in tensors and "token_embd" in tensors:
        tensors["output"] = tensors["token_embd"]
        cfg.tie_embeddings = True
    _check_model_tensors(cfg, tensors, p)
    layers: dict[int, LayerPredictor] = {}
    for i in range(cfg.n_layers):
        pr = preds_raw.pop(i, None)
        if pr is None or "fc1" not in pr or "fc2" not in pr:
            raise ModelFileError(f"{p}: layer {i} lacks its predictor (blk.{i}.fc1/fc2.weight)")
        fc1, fc2 = pr["fc1"], pr["fc2"]
        if fc1.cols != cfg.dim or fc2.rows != cfg.ffn_dim or fc2.cols != fc1.rows:
            raise ShapeError(
                f"{p}: layer {i}: fc1 {{{fc1.cols}, {fc1.rows}}} and fc2 {{{fc2.cols}, "
                f"{fc2.rows}}} (GGUF dims) do not fit n_embd {cfg.dim}, n_ff {cfg.ffn_dim}"
            )
        w1, w2 = dequantize_tensor(fc1), dequantize_tensor(fc2)
        if not (np.isfinite(w1).all() and np.isfinite(w2).all()):
            raise ModelFileError(f"{p}: layer {i}: non-finite predictor weights (fc1/fc2)")
        block = fc1.dtype not in ("F32", "F16") and fc2.dtype not in ("F32", "F16")
        layers[i] = LayerPredictor(
            w1,
            w2,
            thr,
            {"rank": fc1.rows, "source": "powerinfer-gguf", "dtype": fc1.dtype},
            stored=(fc1, fc2) if block else None,
        )
    if preds_raw:
        raise ModelFileError(
            f"{p}: predictor tensors for layers {sorted(preds_raw)} beyond "
            f"block_count {cfg.n_layers}"
        )
    model = loaded_model(p, meta, cfg, tensors, tok)
    stored = {pr.stats["dtype"] for pr in layers.values()}
    pset = PredictorSet(
        layers=layers,
        model_fingerprint=model.fingerprint,
        recall_target=None,
        input="ffn_inp",
        dtype="F32" if stored == {"F32"} else "F16",
        metadata={"source": "powerinfer-gguf", "path": p, "sparse_threshold": thr},
    )
    return PowerInferModel(model=model, predictors=pset, sparse_threshold=thr)


def _check_model_tensors(cfg, tensors: dict[str, TensorData], source: str) -> None:
    """:func:`~.types.check_tensors` with ``ffn_down_t`` ``[ffn, dim]`` (rows = neurons)
    expected in place of ``ffn_down``."""
    check_layer_count(cfg, tensors, source)
    shapes = expected_shapes(cfg)
    for i in range(cfg.n_layers):
        del shapes[f"blk.{i}.ffn_down"]
        shapes[f"blk.{i}.ffn_down_t"] = (cfg.ffn_dim, cfg.dim)
    check_tensors(cfg, tensors, source, shapes)
