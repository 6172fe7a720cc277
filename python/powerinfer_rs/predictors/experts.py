"""Predictors per expert of a mixture of experts: trained where they pay, resumably.

The profiler's samples of a mixture of experts are per (layer, expert) unit ``layer * n_expert
+ expert`` (samples metadata ``moe``): the FFN input of every sampled token routed to the
expert, and the mask over that expert's ``expert_ffn`` neurons. Each unit with enough samples
is trained as one layer is (:func:`~.train.train_layer`, byte budget a fraction of the expert's
gate+up+down bytes), then kept only where it pays. What a routed expert reads per token, as a
share of its bytes (``g``, ``u``, ``d`` its gate, up and down bytes, ``P`` the predictor's, ``a``
the share of its neurons that fire, ``p`` the share predicted):

* without a predictor: exact-relu (ReLU experts) reads every gate row and the up and down rows
  of the neurons that fire, ``g + a (u + d)``; SiLU experts (threshold semantics) read all,
  ``g + u + d``;
* with one: ``P + p g + a (u + d)`` (ReLU: the predicted gate rows, then the up and down rows of
  those that fire), ``P + p (g + u + d)`` (SiLU: every predicted neuron counts).

An expert whose predictor would read more than it saves, or misses the recall target on the
held-out samples, runs without one; the report says which and why.
"""

from __future__ import annotations

import json
import shutil
import zlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..errors import ModelFileError, PlanError, ShapeError
from ..formats import samples as samples_mod
from ..formats.predictors import save_predictors
from .model import LayerPredictor, PredictorSet
from .resume import resume_units
from .train import TrainConfig, train_layer

#: Fewest samples (tokens routed to an expert) a predictor is trained from; an expert that saw
#: fewer runs without one (its held-out check would be a few dozen rows).
MIN_SAMPLES = 256
DROPPED_NAME = "dropped.json"


def expert_bytes(model: Any, layer: int, n_expert: int) -> tuple[float, float, float]:
    """One expert's gate, up and down bytes in ``layer`` (the merged tensors' bytes over
    ``n_expert``)."""
    out = []
    for kind in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
        t = model.tensors.get(f"blk.{layer}.{kind}")
        if t is None:
            raise ModelFileError(f"model has no blk.{layer}.{kind}")
        out.append(t.nbytes / n_expert)
    return out[0], out[1], out[2]


def read_cost(
    stats: dict[str, Any], nbytes: float, g: float, u: float, d: float, relu: bool
) -> tuple[float, float]:
    """(bytes a routed token reads without the predictor, with it): see the module text."""
    a = float(stats.get("active_fraction", 1.0))
    p = float(stats.get("predicted_fraction", 1.0))
    if relu:
        return g + a * (u + d), nbytes + p * g + a * (u + d)
    return g + u + d, nbytes + p * (g + u + d)


def _settings(base: dict, moe: dict, meta: dict, min_samples: int, max_rows: int | None) -> dict:
    """The pipeline's settings plus what decides each expert here: the experts' shape, the
    samples themselves (rows per unit: a new profile retrains), the minimum and the cap."""
    # The samples themselves: rows per unit and everything the profile recorded (thresholds,
    # corpus, ...): new thresholds change the masks, not the rows.
    samples = {"rows": meta.get("rows"), "metadata": meta.get("metadata", {})}
    return {
        **base,
        "experts": int(moe["n_expert"]),
        "ffn": int(moe["expert_ffn"]),
        "samples": zlib.crc32(json.dumps(samples, sort_keys=True, default=str).encode()),
        "semantics": meta.get("metadata", {}).get("semantics"),
        "min_samples": int(min_samples),
        "max_rows": max_rows,
    }


def _dropped(value: Any) -> dict[str, dict[str, Any]]:
    """A ``dropped`` record read back (from a file's metadata or the parts folder): only its
    well-formed entries (``"layer.expert"`` -> an object)."""
    if not isinstance(value, dict):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, dict)}


def train_expert_predictors(
    profile_dir: Any,
    out: Any,
    *,
    meta: dict[str, Any],
    model: Any,
    recall: float,
    max_bytes_fraction: float,
    layers: Iterable[int] | None,
    seed: int,
    cfg: TrainConfig,
    max_rows: int | None,
    progress: bool,
    say: Callable[[str], None],
    settings: Callable[[str | None, int, int], dict],
    min_samples: int = MIN_SAMPLES,
) -> PredictorSet:
    """Train the experts' predictors of the samples under ``profile_dir`` (``meta`` their
    validated metadata) and write ``out``; ``settings(fingerprint, dim, ffn)`` gives the
    pipeline's settings record. See the module text."""
    n_layers, n_expert, ef = _moe_shape(meta)
    if not 0.0 < recall <= 1.0:  # checked here: per expert, training errors only drop the expert
        raise ShapeError(f"recall target must lie in (0, 1], got {recall}")
    _check_model(model, meta, n_layers, n_expert, ef)
    # What an expert without a predictor reads is the engine's rule for the model's experts:
    # exact-relu for ReLU ones, everything for the others (whatever the profile's semantics).
    relu = model.config.activation == "relu"
    todo_layers = sorted(set(range(n_layers) if layers is None else layers))
    for i in todo_layers:
        if not 0 <= i < n_layers:
            raise ShapeError(f"layer {i} outside [0, {n_layers})")
    moe = meta["metadata"]["moe"]
    sets = _settings(settings(model.fingerprint, meta["dim"], ef), moe, meta, min_samples, max_rows)
    keys = [k for k in sets if k != "seed"]

    out = Path(out)
    parts = out.with_name(out.name + ".parts")
    done, prev_meta, kept = resume_units(
        out, sets, lambda old: all(old.get(k) == sets.get(k) for k in keys),
        "unit_*.safetensors", lambda p: p.experts, say, "experts",
    )  # fmt: skip
    dropped = _resumed_dropped(prev_meta, kept, parts)
    units = [(i, e) for i in todo_layers for e in range(n_expert)]
    pending = [u for u in units if u not in done and f"{u[0]}.{u[1]}" not in dropped]
    if len(pending) < len(units):
        say(f"resuming: {len(units) - len(pending)} of {len(units)} experts already done")
    cost = {i: expert_bytes(model, i, n_expert) for i in todo_layers}
    bar = tqdm(pending, desc="expert predictors", unit="expert", disable=not progress)
    for i, e in bar:
        bar.set_postfix(layer=i, expert=e)
        x, m = samples_mod.load_samples(profile_dir, i * n_expert + e, max_rows=max_rows)
        pred, why = _train_expert(
            x, m, cost[i], relu, recall=recall, max_bytes_fraction=max_bytes_fraction,
            seed=seed + i * n_expert + e, cfg=cfg, min_samples=min_samples,
        )  # fmt: skip
        if pred is not None:
            done[(i, e)] = pred
            one = _set({(i, e): pred}, sets, cfg, {})
            save_predictors(parts / f"unit_{i:03d}_{e:03d}.safetensors", one)
        else:
            dropped[f"{i}.{e}"] = why
        (parts / DROPPED_NAME).write_text(json.dumps(dropped, default=float))
    bar.close()
    result = _set(done, sets, cfg, dropped)
    save_predictors(out, result)
    shutil.rmtree(parts, ignore_errors=True)
    kept = sum(1 for u in done if u[0] in todo_layers)
    say(f"{kept} of {len(units)} experts have a predictor that pays")
    return result


def _moe_shape(meta: dict[str, Any]) -> tuple[int, int, int]:
    """``(layers, experts, neurons per expert)`` of the samples' ``moe`` metadata, checked
    against their units."""
    moe = meta.get("metadata", {}).get("moe")
    try:
        n_layers, n_expert, ef = (int(moe[k]) for k in ("n_layers", "n_expert", "expert_ffn"))
    except (TypeError, KeyError, ValueError):
        raise ModelFileError(f"{meta['dir']}: malformed 'moe' samples metadata: {moe!r}") from None
    if n_layers * n_expert != meta["n_layers"] or ef != meta["ffn_dim"] or n_expert <= 0:
        raise ModelFileError(
            f"{meta['dir']}: {meta['n_layers']} sample units of {meta['ffn_dim']} neurons do not "
            f"fit {n_layers} layers x {n_expert} experts of {ef}"
        )
    return n_layers, n_expert, ef


def _check_model(model: Any, meta: dict[str, Any], n_layers: int, n_expert: int, ef: int) -> None:
    """A :class:`PlanError` or :class:`ShapeError` unless ``model`` is the one the samples
    were profiled on (its shape, and its fingerprint where the samples record one)."""
    dim = meta["dim"]
    fingerprint = meta.get("metadata", {}).get("model_fingerprint") or None
    if model is None:
        raise PlanError("training predictors per expert needs the model (its expert bytes)")
    c = model.config
    if (c.n_layers, c.dim, c.n_expert, c.expert_ffn_dim or c.ffn_dim) != (
        n_layers,
        dim,
        n_expert,
        ef,
    ):
        raise ShapeError(
            f"samples are for {n_layers} layers x {n_expert} experts of {ef} neurons, dim "
            f"{dim}; the model has {c.n_layers} x {c.n_expert} of "
            f"{c.expert_ffn_dim or c.ffn_dim}, dim {c.dim}"
        )
    if fingerprint and fingerprint != model.fingerprint:
        raise PlanError(f"samples were profiled on model {fingerprint}, not on {model.fingerprint}")


def _resumed_dropped(prev_meta: Any, kept: Any, parts: Path) -> dict[str, dict[str, Any]]:
    """The experts an earlier run left without a predictor, and why: from the previous
    file's metadata and, where its parts are kept, the parts folder's record."""
    dropped: dict[str, dict[str, Any]] = {}
    if prev_meta is not None:
        dropped.update(_dropped(prev_meta.get("dropped")))
    if kept:
        try:
            dropped.update(_dropped(json.loads((parts / DROPPED_NAME).read_text())))
        except (OSError, ValueError, RecursionError):
            pass
    return dropped


def _train_expert(
    x: Any,
    m: Any,
    cost: tuple[float, float, float],
    relu: bool,
    *,
    recall: float,
    max_bytes_fraction: float,
    seed: int,
    cfg: TrainConfig,
    min_samples: int,
) -> tuple[LayerPredictor | None, dict[str, Any]]:
    """One expert's predictor from its samples ``x``, ``m`` (``cost``: its gate, up and down
    bytes), or None and why it runs without one (too few samples, untrainable, misses the
    recall target, does not pay)."""
    g, u, d = cost
    if x.shape[0] < min_samples:
        return None, {"reason": "few samples", "n_samples": int(x.shape[0])}
    try:
        pred = train_layer(
            x,
            m,
            recall=recall,
            max_bytes=max_bytes_fraction * (g + u + d),
            ffn_bytes=g + u + d,
            seed=seed,
            config=cfg,
            progress=False,
        )
    except (PlanError, ShapeError) as err:  # e.g. a budget too small for rank 1
        return None, {"reason": "untrainable", "error": str(err)}
    without, with_ = read_cost(pred.stats, pred.nbytes(cfg.dtype), g, u, d, relu)
    pred.stats.update(
        ffn_bytes=g + u + d,
        n_samples=int(x.shape[0]),
        bytes_without=without,
        bytes_with=with_,
    )
    if not pred.stats.get("met_target", False):
        return None, {"reason": "misses recall", **pred.stats}
    if with_ < without:
        return pred, {}
    return None, {"reason": "does not pay", **pred.stats}


def _set(
    experts: dict[tuple[int, int], LayerPredictor],
    settings: dict,
    cfg: TrainConfig,
    dropped: dict[str, Any],
) -> PredictorSet:
    return PredictorSet(
        layers={},
        experts=dict(sorted(experts.items())),
        model_fingerprint=settings["model_fingerprint"] or None,
        recall_target=settings["recall_target"],
        input=settings["predictor_input"],
        dtype=cfg.dtype,
        metadata={"settings": settings, "dropped": dropped},
    )


def _num(stats: dict[str, Any], key: str, default: float = float("nan")) -> float:
    """``stats[key]`` as a float (``default`` when missing or not a number)."""
    try:
        return float(stats.get(key, default))
    except (TypeError, ValueError):
        return default


def format_expert_table(predictors: PredictorSet) -> str:
    """The per-layer report of a mixture of experts' predictors: experts with a predictor,
    without one (did not pay / missed the recall target / too few samples / training failed),
    mean recall and
    precision of those kept, and the bytes a routed token reads with them against without
    (kept experts)."""
    dropped = _dropped(predictors.metadata.get("dropped"))
    by_layer: dict[int, list[dict[str, Any]]] = {}
    for (i, _e), p in predictors.experts.items():
        by_layer.setdefault(i, []).append(p.stats)
    skip: dict[int, list[str]] = {}
    for key, st in dropped.items():
        layer = key.split(".")[0]
        if layer.isascii() and layer.isdigit():
            skip.setdefault(int(layer), []).append(str(st.get("reason", "")))
    head = (
        f"{'layer':>5} {'kept':>5} {'no-pay':>6} {'miss':>5} {'few':>5} {'fail':>5} "
        f"{'recall':>7} {'precis':>7} {'read with/without':>18} {'pred bytes':>11}"
    )
    lines = [head, "-" * len(head)]
    tot_with = tot_without = 0.0
    for i in sorted(set(by_layer) | set(skip)):
        kept = by_layer.get(i, [])
        reasons = skip.get(i, [])
        with_ = sum(_num(s, "bytes_with", 0.0) for s in kept)
        without = sum(_num(s, "bytes_without", 0.0) for s in kept)
        tot_with, tot_without = tot_with + with_, tot_without + without

        def mean(k: str, kept: list = kept) -> float:
            return sum(_num(s, k) for s in kept) / len(kept) if kept else float("nan")

        ratio = with_ / without if without else float("nan")
        nbytes = int(sum(_num(s, "bytes", 0.0) for s in kept))
        lines.append(
            f"{i:>5} {len(kept):>5} {reasons.count('does not pay'):>6} "
            f"{reasons.count('misses recall'):>5} {reasons.count('few samples'):>5} "
            f"{reasons.count('untrainable'):>5} {mean('recall'):>7.4f} "
            f"{mean('precision'):>7.3f} {ratio:>18.3f} {nbytes:>11,}"
        )
    lines.append("-" * len(head))
    n = len(predictors.experts)
    ratio = f"{tot_with / tot_without:.3f}" if tot_without else "n/a"
    lines.append(
        f"{n} experts with a predictor ({predictors.nbytes():,} bytes); where kept, a routed "
        f"token reads {ratio}x the bytes it reads without"
    )
    return "\n".join(lines)
