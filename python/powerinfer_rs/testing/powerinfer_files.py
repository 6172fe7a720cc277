"""Write PowerInfer-format files for tests: a PWRI GGUF, predictor and activation directories.

The GGUF is written the way PowerInfer's converter does it (``gguf.GGUFWriter``, predictor
tensors first, ``ffn_down`` stored transposed as ``ffn_down_t``, the float32 key
``powerinfer.sparse_threshold``, then the first four bytes overwritten with ``PWRI``), for a
synthetic ReLU llama (:mod:`powerinfer_rs.testing.synth`; "synthetic" wherever a figure comes
from it).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ..errors import ShapeError, UnsupportedError
from ..loading.gguf_file import POWERINFER_MAGIC
from ..loading.powerinfer_gguf import SPARSE_THRESHOLD_KEY
from ..loading.torch_pt import save_pt
from ..predictors.model import LayerPredictor, PredictorSet
from .synth import add_llama_metadata
from .synth_model import SynthSpec, SynthWeights


def random_predictors(
    layers: int,
    dim: int,
    ffn: int,
    ranks: int | Sequence[int],
    seed: int = 0,
    threshold: float = 0.0,
) -> dict[int, LayerPredictor]:
    """Random predictors (``fc1 ~ N(0, 1/dim)``, ``fc2 ~ N(0, 1/rank)``), rank per layer."""
    rs = [ranks] * layers if isinstance(ranks, int) else list(ranks)
    if len(rs) != layers or any(r <= 0 for r in rs):
        raise ShapeError(f"need {layers} positive ranks, got {rs}")
    rng = np.random.default_rng([seed, 4242])
    return {
        i: LayerPredictor(
            rng.standard_normal((r, dim)) / np.sqrt(dim),
            rng.standard_normal((ffn, r)) / np.sqrt(r),
            threshold,
        )
        for i, r in enumerate(rs)
    }


def write_powerinfer_gguf(
    out_path: str | os.PathLike[str],
    *,
    dim: int,
    ffn: int,
    layers: int,
    heads: int,
    kv_heads: int,
    vocab: int,
    ranks: int | Sequence[int] = 16,
    predictors: Mapping[int, LayerPredictor] | PredictorSet | None = None,
    sparse_threshold: float | None = 0.0,
    dtype: str = "F32",
    predictor_dtype: str = "F16",
    seed: int = 0,
    active: float = 0.1,
    max_context: int = 512,
    arch: str = "llama",
    tie: bool = False,
) -> Path:
    """Write a synthetic ReLU model of family ``arch`` (llama, bamboo, opt, falcon: those
    PowerInfer serves) as a PowerInfer GGUF (``PWRI`` magic) with per-layer predictors (given,
    or random of ``ranks``). ``sparse_threshold=None`` leaves the key out."""
    import gguf

    dtype, predictor_dtype = dtype.upper(), predictor_dtype.upper()
    np_dt = {"F32": np.float32, "F16": np.float16}
    if dtype not in np_dt or predictor_dtype not in np_dt:
        raise UnsupportedError("write_powerinfer_gguf writes F32 or F16 tensors only")
    spec = SynthSpec(dim, ffn, layers, heads, kv_heads, vocab, "relu", max_context, seed, active)
    spec.arch, spec.tie = arch, tie
    spec.validate()
    gen = SynthWeights(spec)
    if isinstance(predictors, PredictorSet):
        predictors = predictors.layers
    preds = (
        dict(predictors)
        if predictors is not None
        else random_predictors(layers, dim, ffn, ranks, seed)
    )
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), spec.family.gguf_arch)
    name = f"synthetic-powerinfer-relu-d{dim}-f{ffn}-l{layers}"
    add_llama_metadata(w, spec, name, 0 if dtype == "F32" else 1, tokenizer_pre="gpt2")
    if sparse_threshold is not None:
        w.add_float32(SPARSE_THRESHOLD_KEY, float(sparse_threshold))
    # PowerInfer's converter yields the predictor tensors before the model's
    for i in sorted(preds):
        p = preds[i]
        w.add_tensor(f"blk.{i}.fc1.weight", p.fc1.astype(np_dt[predictor_dtype]))
        w.add_tensor(f"blk.{i}.fc2.weight", p.fc2.astype(np_dt[predictor_dtype]))
    if spec.family.layer_norm:
        w.add_layer_norm_eps(spec.rms_eps)
    for name, shape in spec.tensor_shapes(fused=True):
        x = gen.gguf_tensor(name)
        if name.endswith("ffn_down"):
            name, x = name + "_t", np.ascontiguousarray(x.T)
        # PowerInfer names the down projection's bias after the transposed weight.
        name = name.replace("ffn_down.bias", "ffn_down_t.bias")
        x = x.astype(np.float32) if len(shape) == 1 else x.astype(np_dt[dtype])
        w.add_tensor(name if name.endswith(".bias") else f"{name}.weight", x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(tmp, "r+b") as f:
        f.write(POWERINFER_MAGIC)
    os.replace(tmp, out)
    return out


def write_powerinfer_predictor_dir(
    out_dir: str | os.PathLike[str],
    predictors: Mapping[int, LayerPredictor] | PredictorSet,
    *,
    sparse_threshold: float | None = 0.0,
    dtype: type = np.float16,
) -> Path:
    """Write ``config.json`` (with ``sparse_threshold`` unless ``None``) and one
    ``model_{i}.pt`` state dict (``fc1.weight``, ``fc2.weight``) per layer."""
    layers = predictors.layers if isinstance(predictors, PredictorSet) else predictors
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = {} if sparse_threshold is None else {"sparse_threshold": float(sparse_threshold)}
    (out / "config.json").write_text(json.dumps(cfg))
    for i, p in layers.items():
        save_pt(
            out / f"model_{i}.pt",
            {"fc1.weight": p.fc1.astype(dtype), "fc2.weight": p.fc2.astype(dtype)},
        )
    return out


def write_powerinfer_activation_dir(
    out_dir: str | os.PathLike[str], counts: Sequence[np.ndarray], dtype: type = np.int64
) -> Path:
    """Write ``activation_{i}.pt`` (a 1-D count tensor) per layer."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for i, c in enumerate(counts):
        save_pt(out / f"activation_{i}.pt", np.asarray(c).astype(dtype))
    return out
