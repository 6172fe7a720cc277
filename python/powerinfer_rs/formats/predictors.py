"""``predictors.safetensors``: our predictor file.

Tensors per layer ``i`` (only the layers that have a predictor):

* ``blk.{i}.fc1``       ``[rank_i, dim]`` F16 or F32
* ``blk.{i}.fc2``       ``[ffn, rank_i]`` same dtype
* ``blk.{i}.threshold`` ``[1]`` F32 -- neuron ``j`` is active when ``(fc2 @ relu(fc1 @ x))[j] >=
  threshold`` (raw logit, no sigmoid)

``__metadata__`` (strings): ``format`` = ``powerinfer-rs-predictors/1``, ``model_fingerprint``,
``recall_target``, ``predictor_input`` (``ffn_norm`` or ``ffn_inp``), ``dtype``, ``layers``
(JSON: layer index -> stats: rank, recall, precision, predicted fraction, bytes, ...) and
``extra`` (JSON, free-form).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError, PlanError, UnsupportedError
from ..loading.safetensors_mmap import read_header, read_safetensors
from ..predictors.model import STORAGE_DTYPES, LayerPredictor, PredictorSet

FORMAT = "powerinfer-rs-predictors/1"


def _json_default(o: Any) -> Any:
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def save_predictors(path: str | os.PathLike[str], predictors: PredictorSet) -> Path:
    """Write ``predictors`` to ``path`` (atomically: a ``.part`` file renamed into place)."""
    from safetensors.numpy import save_file

    dt = predictors.dtype
    if dt not in STORAGE_DTYPES:
        raise UnsupportedError(f"predictor dtype {dt!r} (supported: {tuple(STORAGE_DTYPES)})")
    np_dt = STORAGE_DTYPES[dt]
    tensors: dict[str, np.ndarray] = {}
    stats: dict[str, Any] = {}
    for i in sorted(predictors.layers):
        p = predictors.layers[i]
        tensors[f"blk.{i}.fc1"] = np.ascontiguousarray(p.fc1.astype(np_dt))
        tensors[f"blk.{i}.fc2"] = np.ascontiguousarray(p.fc2.astype(np_dt))
        tensors[f"blk.{i}.threshold"] = np.array([p.threshold], dtype=np.float32)
        stats[str(i)] = p.stats
    meta = {
        "format": FORMAT,
        "model_fingerprint": predictors.model_fingerprint or "",
        "recall_target": "" if predictors.recall_target is None else repr(predictors.recall_target),
        "predictor_input": predictors.input,
        "dtype": dt,
        "layers": json.dumps(stats, default=_json_default),
        "extra": json.dumps(predictors.metadata, default=_json_default),
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, out)
    return out


def _to_f32(raw, path: str) -> np.ndarray:
    if raw.dtype == "F32":
        a = raw.data.view(np.float32)
    elif raw.dtype == "F16":
        a = raw.data.view(np.float16)
    else:
        raise UnsupportedError(f"{path}: tensor {raw.name!r} is {raw.dtype}, expected F16/F32")
    return a.astype(np.float32).reshape(raw.shape)


def load_predictors(path: str | os.PathLike[str]) -> PredictorSet:
    """Read a ``predictors.safetensors`` file; :class:`ModelFileError` if malformed."""
    p = os.fspath(path)
    header, _, _ = read_header(p)
    meta = header.get("__metadata__")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ModelFileError(f"{p}: not a {FORMAT} file (metadata 'format' missing or different)")
    if not all(isinstance(v, str) for v in meta.values()):
        raise ModelFileError(f"{p}: safetensors metadata values must be strings")
    raw = read_safetensors(p)
    try:
        stats = json.loads(meta.get("layers") or "{}")
        extra = json.loads(meta.get("extra") or "{}")
        target = meta.get("recall_target") or None
        target = float(target) if target is not None else None
    except (ValueError, TypeError, RecursionError) as e:
        raise ModelFileError(f"{p}: malformed predictor metadata: {e}") from e
    if not isinstance(stats, dict) or not isinstance(extra, dict):
        raise ModelFileError(f"{p}: malformed predictor metadata (layers/extra not objects)")
    layers: dict[int, LayerPredictor] = {}
    indices = set()
    for name in raw:
        parts = name.split(".")
        if len(parts) != 3 or parts[0] != "blk" or not (parts[1].isascii() and parts[1].isdigit()):
            raise ModelFileError(f"{p}: unexpected tensor {name!r}")
        if parts[2] not in ("fc1", "fc2", "threshold"):
            raise ModelFileError(f"{p}: unexpected tensor {name!r}")
        indices.add(int(parts[1]))
    for i in sorted(indices):
        try:
            fc1, fc2, thr = (raw[f"blk.{i}.{k}"] for k in ("fc1", "fc2", "threshold"))
        except KeyError as e:
            raise ModelFileError(f"{p}: layer {i} lacks tensor {e.args[0]!r}") from None
        if len(fc1.shape) != 2 or len(fc2.shape) != 2 or fc1.shape[0] != fc2.shape[1]:
            raise ModelFileError(
                f"{p}: layer {i}: fc1 {fc1.shape} [rank, dim] and fc2 {fc2.shape} [ffn, rank] "
                "do not fit"
            )
        if 0 in fc1.shape or 0 in fc2.shape:
            raise ModelFileError(f"{p}: layer {i}: empty predictor matrices")
        if thr.shape != (1,) or thr.dtype != "F32":
            raise ModelFileError(f"{p}: layer {i}: threshold must be F32 [1], got {thr.shape}")
        w1, w2 = _to_f32(fc1, p), _to_f32(fc2, p)
        t = float(_to_f32(thr, p)[0])
        if not (np.isfinite(w1).all() and np.isfinite(w2).all() and np.isfinite(t)):
            raise ModelFileError(f"{p}: layer {i}: non-finite predictor values")
        s = stats.get(str(i), {})
        layers[i] = LayerPredictor(w1, w2, t, s if isinstance(s, dict) else {})
    dtypes = {raw[f"blk.{i}.fc1"].dtype for i in indices}
    dims = {pr.dim for pr in layers.values()}
    if len(dims) > 1:
        raise ModelFileError(f"{p}: predictors disagree on the input width: {sorted(dims)}")
    inp = meta.get("predictor_input", "ffn_norm")
    if inp not in ("ffn_norm", "ffn_inp"):
        raise ModelFileError(f"{p}: unknown predictor_input {inp!r}")
    dtype = dtypes.pop() if len(dtypes) == 1 else meta.get("dtype", "F16")
    if dtype not in STORAGE_DTYPES:
        raise ModelFileError(f"{p}: predictor dtype {dtype!r} (expected one of F16, F32)")
    return PredictorSet(
        layers=layers,
        model_fingerprint=meta.get("model_fingerprint") or None,
        recall_target=target,
        input=inp,
        dtype=dtype,
        metadata=extra,
    )


def predictors_for(source: object, model: Any) -> PredictorSet:
    """A :class:`PredictorSet` for ``model`` (a LoadedModel) from a predictor file or as given;
    :class:`PlanError` when it was trained for another model or lacks layers."""
    pset = load_predictors(source) if isinstance(source, (str, os.PathLike)) else source
    if not isinstance(pset, PredictorSet):
        raise PlanError(f"predictors must be a path or a PredictorSet, got {type(pset).__name__}")
    fp = pset.model_fingerprint
    if fp is not None and fp != model.fingerprint:
        raise PlanError(
            f"the predictors were trained for another model (fingerprint {fp}, "
            f"this model {model.fingerprint})"
        )
    missing = [i for i in range(model.config.n_layers) if i not in pset.layers]
    if missing:
        raise PlanError(f"the predictors lack layers {missing[:8]}")
    return pset
