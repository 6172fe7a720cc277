"""Write PowerInfer-format files for tests: a PWRI GGUF, predictor and activation directories,
and a GPU index (which FFN neurons PowerInfer's CUDA build puts on the GPU).

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


#: Tensor formats of PowerInfer's files (its converter writes F32/F16, its quantizer Q4_0, the
#: predictors included) and their GGUF ``general.file_type``.
PWRI_DTYPES = {"F32": 0, "F16": 1, "Q4_0": 2}


def _add(w, name: str, x: np.ndarray, dtype: str) -> None:
    """Add ``x`` to the GGUF writer ``w`` as ``dtype``."""
    import gguf

    if dtype in ("F32", "F16"):
        w.add_tensor(name, x.astype(np.float32 if dtype == "F32" else np.float16))
        return
    qtype = gguf.GGMLQuantizationType[dtype]
    w.add_tensor(name, gguf.quants.quantize(x.astype(np.float32), qtype), raw_dtype=qtype)


def oracle_predictors(spec: SynthSpec, rank: int = 256) -> dict[int, LayerPredictor]:
    """Predictors that compute each neuron's gate input exactly, from the FFN input before its
    norm (PowerInfer's ``ffn_inp``): ``idx_i = sum_j gate[i, j] g_j x_j`` with ``g`` the FFN
    norm's weight. The norm only divides by a positive rms, so ``idx_i >= 0`` exactly when the
    neuron fires: with threshold 0 they mark the firing neurons (up to the rounding of the
    stored weights). Built from the synthetic model's planted low-rank gate ``a @ b``: ``fc1``
    holds ``+b g`` and ``-b g`` (so that ``relu(u) - relu(-u) = u``) and the bias channel,
    ``fc2`` the matching columns of ``a``; the rest of ``rank`` is padding (random ``fc1`` rows,
    zero ``fc2`` columns) so that the predictor reads as many bytes as a rank-``rank`` one.
    Synthetic ("oracle") predictors: a figure measured with them says so."""
    gen = SynthWeights(spec)
    out = {}
    rng = np.random.default_rng([spec.seed, 4343])
    for layer in range(spec.layers):
        factors = gen.gate_factors(layer)
        if factors is None or 2 * factors[0].shape[1] + 1 > rank:
            raise ShapeError(
                f"oracle predictors need a planted gate of rank r with 2r + 1 <= {rank} "
                f"(gate_rank is {spec.gate_rank})"
            )
        a, b, scale = factors
        r = a.shape[1]
        g = gen.tensor(f"blk.{layer}.ffn_norm").astype(np.float64)
        w0 = gen.tensor(f"blk.{layer}.ffn_gate")[:, 0].astype(np.float64)
        fc1 = rng.standard_normal((rank, spec.dim)) / np.sqrt(spec.dim)
        fc2 = np.zeros((spec.ffn, rank))
        u = b.astype(np.float64) * g[1:]
        fc1[: 2 * r + 1] = 0.0
        fc1[:r, 1:], fc1[r : 2 * r, 1:], fc1[2 * r, 0] = u, -u, 1.0  # x[0] is the bias channel
        fc2[:, :r] = a / scale
        fc2[:, r : 2 * r] = -a / scale
        fc2[:, 2 * r] = w0 * g[0]
        out[layer] = LayerPredictor(fc1.astype(np.float32), fc2.astype(np.float32), 0.0)
    return out


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
    or random of ``ranks``). ``sparse_threshold=None`` leaves the key out. ``dtype`` /
    ``predictor_dtype``: F32, F16 or Q4_0 (PowerInfer's quantizer stores its predictors in Q4_0
    too); norms and biases stay F32."""
    import gguf

    dtype, predictor_dtype = dtype.upper(), predictor_dtype.upper()
    if dtype not in PWRI_DTYPES or predictor_dtype not in PWRI_DTYPES:
        raise UnsupportedError(
            f"write_powerinfer_gguf writes {', '.join(PWRI_DTYPES)} tensors only, not "
            f"{dtype}/{predictor_dtype}"
        )
    if "Q4_0" in (dtype, predictor_dtype) and (dim % 32 or ffn % 32):
        raise ShapeError("Q4_0 needs dim and ffn to be multiples of 32")
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
    add_llama_metadata(w, spec, name, PWRI_DTYPES[dtype], tokenizer_pre="gpt2")
    if sparse_threshold is not None:
        w.add_float32(SPARSE_THRESHOLD_KEY, float(sparse_threshold))
    # PowerInfer's converter yields the predictor tensors before the model's
    for i in sorted(preds):
        p = preds[i]
        _add(w, f"blk.{i}.fc1.weight", p.fc1, predictor_dtype)
        _add(w, f"blk.{i}.fc2.weight", p.fc2, predictor_dtype)
    if spec.family.layer_norm:
        w.add_layer_norm_eps(spec.rms_eps)
    for name, shape in spec.tensor_shapes(fused=True):
        x = gen.gguf_tensor(name)
        if name.endswith("ffn_down"):
            name, x = name + "_t", np.ascontiguousarray(x.T)
        # PowerInfer names the down projection's bias after the transposed weight.
        name = name.replace("ffn_down.bias", "ffn_down_t.bias")
        full = name if name.endswith(".bias") else f"{name}.weight"
        _add(w, full, x, "F32" if len(shape) == 1 else dtype)
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


#: The key PowerInfer's ``export_split`` writes the index's VRAM capacity under.
VRAM_CAPACITY_KEY = "split.vram_capacity"


def write_powerinfer_gpu_index(
    out_path: str | os.PathLike[str],
    gpu_neurons: Sequence[np.ndarray],
    ffn: int,
    vram_capacity: int,
) -> Path:
    """Write a GPU index as PowerInfer's ``powerinfer-py`` exports it (``export_split``): a
    GGUF of architecture ``generic.gpu_index`` with ``block_count`` and ``split.vram_capacity``
    (bytes), per layer ``blk.{i}.gpu_idx`` (int32 ``[ffn]``, 1 for a neuron on the GPU) then
    ``blk.{i}.gpu_bucket`` (int32, the GPU neurons' ids, sorted), and the first eight bytes
    overwritten with ``PWRI`` and version 3. Saved beside a model as
    ``<model>.generated.gpuidx``, PowerInfer's CUDA build loads it instead of running its
    solver, so both engines can run one placement (e.g. a plan's ``gpu_neurons``)."""
    import gguf

    if ffn < 1 or vram_capacity < 0:
        raise ShapeError(f"ffn {ffn} and vram_capacity {vram_capacity} must be positive")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), "generic.gpu_index")
    w.add_block_count(len(gpu_neurons))
    w.add_uint64(VRAM_CAPACITY_KEY, int(vram_capacity))
    for i, ids in enumerate(gpu_neurons):
        ids = np.asarray(ids)
        if ids.ndim != 1 or (ids.size and (ids.min() < 0 or ids.max() >= ffn)):
            raise ShapeError(f"layer {i}: GPU neuron ids must be a list within [0, {ffn})")
        bucket = np.unique(ids).astype(np.int32)
        if bucket.size != ids.size:
            raise ShapeError(f"layer {i}: repeated GPU neuron ids")
        idx = np.zeros(ffn, dtype=np.int32)
        idx[bucket] = 1
        for name, x in ((f"blk.{i}.gpu_idx", idx), (f"blk.{i}.gpu_bucket", bucket)):
            w.add_tensor(name, x, raw_shape=x.shape[::-1], raw_dtype=gguf.GGMLQuantizationType.I32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with open(tmp, "r+b") as f:
        f.write(POWERINFER_MAGIC + (3).to_bytes(4, "little"))
    os.replace(tmp, out)
    return out
