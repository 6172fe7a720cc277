"""``predictors.safetensors``: our predictor file.

Tensors per layer ``i`` (only the layers that have a predictor):

* ``blk.{i}.fc1``       ``[rank_i, dim]`` F16 or F32; in a block format (``dtype`` Q8_0 or
  Q4_0) U8 ``[rank_i, row bytes]``, the blocks as the engine reads them
* ``blk.{i}.fc2``       ``[ffn, rank_i]`` same dtype (a block format: ``rank_i`` a multiple
  of 32)
* ``blk.{i}.threshold`` ``[1]`` F32 -- neuron ``j`` is active when ``(fc2 @ relu(fc1 @ x))[j] >=
  threshold`` (raw logit, no sigmoid)

A mixture of experts holds, instead, per layer ``i`` and expert ``e`` (only the experts that have
a predictor): ``blk.{i}.exp.{e}.fc1`` ``[rank, dim]``, ``blk.{i}.exp.{e}.fc2`` ``[expert_ffn,
rank]`` and ``blk.{i}.exp.{e}.threshold``, with their stats under the ``experts`` metadata key
(JSON: ``"i.e"`` -> stats).

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
from ..loading.types import BLOCK_LAYOUT, TensorData
from ..predictors.model import (
    BLOCK_DTYPES,
    PREDICTOR_DTYPES,
    STORAGE_DTYPES,
    LayerPredictor,
    PredictorSet,
    dequantize_matrix,
    padded,
    quantize_matrix,
)

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
    if dt not in PREDICTOR_DTYPES:
        raise UnsupportedError(f"predictor dtype {dt!r} (supported: {PREDICTOR_DTYPES})")
    tensors: dict[str, np.ndarray] = {}
    stats: dict[str, Any] = {}
    expert_stats: dict[str, Any] = {}
    units = [(f"blk.{i}", str(i), predictors.layers[i], stats) for i in sorted(predictors.layers)]
    units += [
        (f"blk.{i}.exp.{e}", f"{i}.{e}", predictors.experts[(i, e)], expert_stats)
        for i, e in sorted(predictors.experts)
    ]
    for prefix, key, p, into in units:
        tensors[f"{prefix}.fc1"], tensors[f"{prefix}.fc2"] = stored_matrices(p, dt)
        tensors[f"{prefix}.threshold"] = np.array([p.threshold], dtype=np.float32)
        into[key] = p.stats
    meta = {
        "format": FORMAT,
        "model_fingerprint": predictors.model_fingerprint or "",
        "recall_target": "" if predictors.recall_target is None else repr(predictors.recall_target),
        "predictor_input": predictors.input,
        "dtype": dt,
        "layers": json.dumps(stats, default=_json_default),
        "experts": json.dumps(expert_stats, default=_json_default),
        "extra": json.dumps(predictors.metadata, default=_json_default),
    }
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, out)
    return out


def stored_matrices(p: LayerPredictor, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``p``'s ``(fc1, fc2)`` as a file of ``dtype`` stores them: float arrays, or a block
    format's ``uint8 [rows, row bytes]`` (the rank padded to a multiple of 32)."""
    if dtype not in BLOCK_DTYPES:
        return tuple(np.ascontiguousarray(w.astype(STORAGE_DTYPES[dtype])) for w in (p.fc1, p.fc2))
    return tuple(quantize_matrix(w, dtype) for w in padded(p.fc1, p.fc2, dtype))


def stored_tensors(p: LayerPredictor, dtype: str) -> tuple[TensorData, TensorData]:
    """``p``'s matrices in block format ``dtype`` as the engine takes them (the bytes a file
    of that format holds)."""
    q1, q2 = stored_matrices(p, dtype)
    block, size = BLOCK_LAYOUT[dtype]
    return tuple(
        TensorData(name, dtype, q.shape[0], q.shape[1] // size * block, q.reshape(-1))
        for name, q in (("fc1", q1), ("fc2", q2))
    )


def _block(raw, dtype: str, path: str) -> tuple[TensorData, np.ndarray]:
    """A block-format tensor of a predictor file: as the engine takes it, and its values."""
    block, size = BLOCK_LAYOUT[dtype]
    if raw.dtype != "U8" or len(raw.shape) != 2 or raw.shape[1] % size or not raw.shape[1]:
        raise ModelFileError(
            f"{path}: tensor {raw.name!r} is {raw.dtype} {list(raw.shape)}, expected U8 "
            f"[rows, a multiple of {size}] for {dtype}"
        )
    rows, cols = raw.shape[0], raw.shape[1] // size * block
    data = np.ascontiguousarray(raw.data.view(np.uint8).reshape(-1))
    t = TensorData(raw.name, dtype, rows, cols, data)
    return t, dequantize_matrix(data.reshape(rows, -1), dtype, cols)


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
    raw = read_safetensors(p, bytes_too=True)
    try:
        stats = json.loads(meta.get("layers") or "{}")
        expert_stats = json.loads(meta.get("experts") or "{}")
        extra = json.loads(meta.get("extra") or "{}")
        target = meta.get("recall_target") or None
        target = float(target) if target is not None else None
    except (ValueError, TypeError, RecursionError) as e:
        raise ModelFileError(f"{p}: malformed predictor metadata: {e}") from e
    if not all(isinstance(d, dict) for d in (stats, expert_stats, extra)):
        raise ModelFileError(
            f"{p}: malformed predictor metadata (layers/experts/extra not objects)"
        )
    block = meta.get("dtype") if meta.get("dtype") in BLOCK_DTYPES else None
    # unit -> tensor prefix: a layer index, or a (layer, expert) pair
    units: dict[int | tuple[int, int], str] = {}

    def index(s: str) -> bool:  # a canonical decimal index ("1", not "01")
        return s.isascii() and s.isdigit() and str(int(s)) == s

    for name in raw:
        parts = name.split(".")
        digits = all(index(s) for s in parts[1:-1:2])
        if len(parts) == 3 and parts[0] == "blk" and digits:
            unit: int | tuple[int, int] = int(parts[1])
        elif len(parts) == 5 and parts[0] == "blk" and parts[2] == "exp" and digits:
            if not index(parts[3]):
                raise ModelFileError(f"{p}: unexpected tensor {name!r}")
            unit = (int(parts[1]), int(parts[3]))
        else:
            raise ModelFileError(f"{p}: unexpected tensor {name!r}")
        if parts[-1] not in ("fc1", "fc2", "threshold"):
            raise ModelFileError(f"{p}: unexpected tensor {name!r}")
        units[unit] = ".".join(parts[:-1])
    layers: dict[int, LayerPredictor] = {}
    experts: dict[tuple[int, int], LayerPredictor] = {}
    for unit, prefix in sorted(units.items(), key=lambda kv: str(kv[0])):
        what = f"layer {unit}" if isinstance(unit, int) else f"layer {unit[0]} expert {unit[1]}"
        try:
            fc1, fc2, thr = (raw[f"{prefix}.{k}"] for k in ("fc1", "fc2", "threshold"))
        except KeyError as e:
            raise ModelFileError(f"{p}: {what} lacks tensor {e.args[0]!r}") from None
        stored = None
        if block is not None:
            (t1, w1), (t2, w2) = _block(fc1, block, p), _block(fc2, block, p)
            stored, shapes = (t1, t2), ((t1.rows, t1.cols), (t2.rows, t2.cols))
        else:
            shapes = (tuple(fc1.shape), tuple(fc2.shape))
        if len(shapes[0]) != 2 or len(shapes[1]) != 2 or shapes[0][0] != shapes[1][1]:
            raise ModelFileError(
                f"{p}: {what}: fc1 {list(shapes[0])} [rank, dim] and fc2 {list(shapes[1])} "
                "[ffn, rank] do not fit"
            )
        if 0 in shapes[0] + shapes[1]:
            raise ModelFileError(f"{p}: {what}: empty predictor matrices")
        if thr.shape != (1,) or thr.dtype != "F32":
            raise ModelFileError(f"{p}: {what}: threshold must be F32 [1], got {thr.shape}")
        if block is None:
            w1, w2 = _to_f32(fc1, p), _to_f32(fc2, p)
        t = float(_to_f32(thr, p)[0])
        if not (np.isfinite(w1).all() and np.isfinite(w2).all() and np.isfinite(t)):
            raise ModelFileError(f"{p}: {what}: non-finite predictor values")
        if isinstance(unit, int):
            s = stats.get(str(unit), {})
            layers[unit] = LayerPredictor(w1, w2, t, s if isinstance(s, dict) else {}, stored)
        else:
            s = expert_stats.get(f"{unit[0]}.{unit[1]}", {})
            experts[unit] = LayerPredictor(w1, w2, t, s if isinstance(s, dict) else {}, stored)
    if layers and experts:
        raise ModelFileError(f"{p}: holds both per-layer and per-expert predictors")
    dtypes = {block} if block else {raw[f"{prefix}.fc1"].dtype for prefix in units.values()}
    dims = {pr.dim for pr in (*layers.values(), *experts.values())}
    if len(dims) > 1:
        raise ModelFileError(f"{p}: predictors disagree on the input width: {sorted(dims)}")
    inp = meta.get("predictor_input", "ffn_norm")
    if inp not in ("ffn_norm", "ffn_inp"):
        raise ModelFileError(f"{p}: unknown predictor_input {inp!r}")
    dtype = dtypes.pop() if len(dtypes) == 1 else meta.get("dtype", "F16")
    if dtype not in PREDICTOR_DTYPES:
        raise ModelFileError(f"{p}: predictor dtype {dtype!r} (expected one of {PREDICTOR_DTYPES})")
    return PredictorSet(
        layers=layers,
        model_fingerprint=meta.get("model_fingerprint") or None,
        recall_target=target,
        input=inp,
        dtype=dtype,
        metadata=extra,
        experts=experts,
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
    c = model.config
    if c.n_expert:
        return _expert_predictors_for(pset, c)
    if pset.experts:
        raise PlanError("these are predictors per expert; the model has no experts")
    missing = [i for i in range(c.n_layers) if i not in pset.layers]
    if missing:
        raise PlanError(f"the predictors lack layers {missing[:8]}")
    return pset


def _expert_predictors_for(pset: PredictorSet, c: Any) -> PredictorSet:
    """``pset`` checked as a mixture of experts' predictors (config ``c``): per expert, over
    the expert's neurons, reading the normed FFN input. A set the trainer wrote may hold none
    (no expert's predictor paid): every expert then runs exact-relu."""
    if pset.layers or not (pset.experts or "dropped" in pset.metadata):
        raise PlanError(
            "a mixture of experts takes predictors per expert (python -m "
            "powerinfer_rs.train_predictors on its profile writes them), not per layer"
        )
    if pset.input != "ffn_norm":
        raise PlanError(f"expert predictors read the normed FFN input, not {pset.input}")
    ef = c.expert_ffn_dim or c.ffn_dim
    for (layer, e), p in pset.experts.items():
        if not (0 <= layer < c.n_layers and 0 <= e < c.n_expert):
            raise PlanError(f"a predictor for layer {layer} expert {e}: outside the model")
        if p.ffn != ef or p.dim != c.dim:
            raise PlanError(
                f"layer {layer} expert {e}: predictor for dim {p.dim}, {p.ffn} neurons; the "
                f"model's experts have dim {c.dim}, {ef} neurons"
            )
    return pset
