"""PowerInfer's predictor and activation directories.

* Predictor directory (the ``mlp_predictors`` argument of PowerInfer's
  ``convert-hf-to-powerinfer-gguf.py``): ``config.json`` with ``sparse_threshold`` (optional;
  PowerInfer's ``PredictorParams.load``) and ``model_{i}.pt`` per layer, each a ``torch.save``d
  state dict of a bias-free ``ReluMLP``: ``fc1.weight [rank, n_embd]``, ``fc2.weight [n_ff,
  rank]`` (the converter takes ``hidden_size, input_size = fc1.weight.shape``).
* Activation directory (read by ``powerinfer-py/powerinfer/solver.py`` and
  ``export_split.py``): ``activation_{i}.pt`` per layer, a 1-D tensor of per-neuron activation
  counts.

Layer files are ordered by the number in their name. PowerInfer's
``powerinfer-py/powerinfer/export_split.py`` (``load_activation_weights``) sorts the names as
*strings*, so with more than 10 layers ``activation_10.pt`` lands before ``activation_2.pt``
and layers get mixed up; here a gap or a duplicate number is an error instead.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, ShapeError
from ..formats.profile import Profile
from ..predictors.model import LayerPredictor, PredictorSet
from .torch_pt import load_state_dict, load_tensor

_MODEL_RE = re.compile(r"^model_(\d+)\.pt$")
_ACT_RE = re.compile(r"^activation_(\d+)\.pt$")
_BIG = 1e300  # finite numbers only (NaN fails both comparisons), and no int float() overflows


def numbered_files(dir: str | os.PathLike[str], pattern: re.Pattern[str]) -> list[Path]:
    """Files of ``dir`` whose name matches ``pattern`` (one group: the layer number), ordered by
    that number as an integer; they must be numbered ``0..n-1`` exactly once."""
    d = Path(dir)
    if not d.is_dir():
        raise ModelFileError(f"{d}: not a directory")
    found: dict[int, Path] = {}
    for p in d.iterdir():
        m = pattern.match(p.name)
        if not m:
            continue
        i = int(m.group(1))
        if i in found:
            raise ModelFileError(f"{d}: layer {i} appears twice ({found[i].name}, {p.name})")
        found[i] = p
    if not found:
        raise ModelFileError(f"{d}: no files named like {pattern.pattern}")
    missing = sorted(set(range(max(found) + 1)) - set(found))
    if missing:
        raise ModelFileError(f"{d}: layer files missing for layers {missing[:10]}")
    return [found[i] for i in sorted(found)]


def read_sparse_threshold(dir: str | os.PathLike[str]) -> float:
    """``sparse_threshold`` of ``dir/config.json``; 0.0 (PowerInfer's default) when the file or
    key is absent."""
    cfg = Path(dir) / "config.json"
    if not cfg.is_file():
        return 0.0
    try:
        data = json.loads(cfg.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ModelFileError(f"{cfg}: unreadable: {e}") from e
    if not isinstance(data, dict):
        raise ModelFileError(f"{cfg}: not a JSON object")
    v = data.get("sparse_threshold", 0.0)
    if v is None:
        return 0.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not -_BIG < v < _BIG:
        raise ModelFileError(f"{cfg}: sparse_threshold must be a finite number, got {v!r:.80}")
    return float(v)


def import_powerinfer_predictors(
    dir: str | os.PathLike[str],
    *,
    threshold: float | None = None,
    model_fingerprint: str | None = None,
) -> PredictorSet:
    """Read a PowerInfer predictor directory into a :class:`PredictorSet` (``input="ffn_inp"``:
    PowerInfer feeds its predictors the residual stream before ``ffn_norm``). Every layer gets
    the directory's ``sparse_threshold`` unless ``threshold`` is given."""
    thr = read_sparse_threshold(dir) if threshold is None else float(threshold)
    layers: dict[int, LayerPredictor] = {}
    dtypes = set()
    for i, path in enumerate(numbered_files(dir, _MODEL_RE)):
        sd = load_state_dict(path)
        try:
            fc1, fc2 = sd["fc1.weight"], sd["fc2.weight"]
        except KeyError as e:
            raise ModelFileError(f"{path}: state dict lacks {e.args[0]!r}") from None
        extra = sorted(set(sd) - {"fc1.weight", "fc2.weight"})
        if extra:
            raise ModelFileError(
                f"{path}: unexpected tensors {extra} (PowerInfer's predictors "
                "are bias-free fc1/fc2)"
            )
        if fc1.ndim != 2 or fc2.ndim != 2 or fc1.shape[0] != fc2.shape[1]:
            raise ModelFileError(
                f"{path}: fc1 {fc1.shape} [rank, dim] and fc2 {fc2.shape} [ffn, rank] do not fit"
            )
        if fc1.dtype.kind != "f" or fc2.dtype.kind != "f":
            raise ModelFileError(f"{path}: predictor weights must be floating point")
        if not (np.isfinite(fc1).all() and np.isfinite(fc2).all()):
            raise ModelFileError(f"{path}: non-finite predictor weights")
        dtypes.add(fc1.dtype)
        try:
            layers[i] = LayerPredictor(
                fc1, fc2, thr, {"rank": int(fc1.shape[0]), "source": path.name}
            )
        except ShapeError as e:
            raise ModelFileError(f"{path}: {e}") from e
    dims = {p.dim for p in layers.values()}
    ffns = {p.ffn for p in layers.values()}
    if len(dims) > 1 or len(ffns) > 1:
        raise ModelFileError(f"{dir}: layers disagree on dim {sorted(dims)} / ffn {sorted(ffns)}")
    return PredictorSet(
        layers=layers,
        model_fingerprint=model_fingerprint,
        recall_target=None,
        input="ffn_inp",
        dtype="F32" if dtypes == {np.dtype(np.float32)} else "F16",
        metadata={"source": "powerinfer-dir", "path": str(dir), "sparse_threshold": thr},
    )


def import_powerinfer_activations(
    dir: str | os.PathLike[str],
    model_fingerprint: str = "",
    *,
    tokens: int | None = None,
) -> Profile:
    """Read ``activation_{i}.pt`` files into a :class:`~powerinfer_rs.formats.profile.Profile`
    (write it with ``formats.profile.write_profile(out, p.counts, p.tokens, model_fingerprint=...,
    extra_meta=p.meta)``).

    PowerInfer's files hold counts only. ``tokens`` (the number of profiled tokens) defaults to
    the largest count in any layer -- in ReLU LLMs the hottest neurons fire on almost every
    token, so this slightly overstates frequencies -- and the profile's metadata then says
    ``tokens_estimated = "true"``. Float counts are rounded; negative or non-finite ones are
    :class:`ModelFileError`.
    """
    counts = []
    files = numbered_files(dir, _ACT_RE)
    for path in files:
        a = load_tensor(path)
        if a.ndim != 1 or a.size == 0:
            raise ModelFileError(
                f"{path}: activation counts must be a non-empty 1-D tensor, got shape {a.shape}"
            )
        if a.dtype == bool or a.dtype.kind not in "fiu":
            raise ModelFileError(f"{path}: activation counts have dtype {a.dtype}")
        if a.dtype.kind == "f":
            if not np.isfinite(a).all():
                raise ModelFileError(f"{path}: non-finite activation counts")
            a = np.rint(a)
        if a.min() < 0:
            raise ModelFileError(f"{path}: negative activation counts")
        counts.append(a.astype(np.int64))
    if len({c.size for c in counts}) > 1:
        raise ModelFileError(
            f"{dir}: layers have different neuron counts {sorted({c.size for c in counts})}"
        )
    estimated = tokens is None
    n_tok = int(max(int(c.max()) for c in counts)) if estimated else int(tokens)
    if n_tok <= 0:
        raise ModelFileError(f"{dir}: all activation counts are zero; pass tokens=")
    meta = {
        "source": "powerinfer-activations",
        "source_dir": str(dir),
        "tokens_estimated": "true" if estimated else "false",
    }
    prof = Profile(counts, n_tok, {**meta, "model_fingerprint": model_fingerprint or ""})
    prof.validate(str(dir))
    return prof
