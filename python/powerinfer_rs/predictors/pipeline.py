"""Train every layer's predictor from a profile directory, resumably, and report.

``train_predictors(profile_dir, out, model=...)`` reads the samples the profiler streamed to
``profile_dir/samples`` (:mod:`powerinfer_rs.formats.samples`), trains each requested layer
(:func:`~.train.train_layer`) under a byte budget proportional to that layer's FFN bytes, and
writes ``out`` (:mod:`powerinfer_rs.formats.predictors`). Every finished layer is saved at
once to ``out.parts/`` so an interrupted run resumes where it stopped; layers already in ``out``
from an earlier run with the same settings are kept and not retrained (so ``--layers 0,1`` then
``--layers 2,3`` builds one file).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..errors import ModelFileError, PlanError, ShapeError
from ..formats import samples as samples_mod
from ..formats.predictors import save_predictors
from .gate import fires_on_gate, gate_weights
from .model import LayerPredictor, PredictorSet
from .resume import resume_units
from .train import TrainConfig, train_layer
from .train_svd import train_layer_from_gate

#: How a layer's predictor is made: ``auto`` (from the gate's weights where the layer's neurons
#: fire on the gate alone and the model is at hand, else trained), ``gate-svd`` (always from the
#: gate; an error where it cannot be) or ``trained`` (Adam on weighted BCE, :mod:`.train`).
METHODS: tuple[str, ...] = ("auto", "gate-svd", "trained")


def layer_ffn_bytes(model: Any, layer: int) -> int:
    """Bytes of ``layer``'s gate (where the family has one), up and down (or PowerInfer's
    ``ffn_down_t``) weights."""
    total = 0
    for kind in ("ffn_gate", "ffn_up"):
        t = model.tensors.get(f"blk.{layer}.{kind}")
        if t is None and kind == "ffn_up":
            raise ModelFileError(f"model has no blk.{layer}.ffn_up")
        total += t.nbytes if t is not None else 0
    down = model.tensors.get(f"blk.{layer}.ffn_down") or model.tensors.get(
        f"blk.{layer}.ffn_down_t"
    )
    if down is None:
        raise ModelFileError(f"model has no blk.{layer}.ffn_down")
    return total + down.nbytes


def _settings(fingerprint, recall, fraction, cfg: TrainConfig, dim, ffn, inp, seed, method):
    return {
        "method": method,
        "model_fingerprint": fingerprint or "",
        "recall_target": recall,
        "max_bytes_fraction": fraction,
        "dtype": cfg.dtype,
        "dim": dim,
        "ffn": ffn,
        "predictor_input": inp,
        "seed": seed,
    }


def _matches(old: dict, new: dict) -> bool:
    keys = (
        "method",
        "model_fingerprint",
        "recall_target",
        "max_bytes_fraction",
        "dtype",
        "dim",
        "ffn",
        "predictor_input",
    )
    return all(old.get(k) == new.get(k) for k in keys)


def train_predictors(
    profile_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    model: Any = None,
    recall: float = 0.99,
    max_bytes_fraction: float = 0.1,
    layers: Iterable[int] | None = None,
    seed: int = 0,
    config: TrainConfig | None = None,
    max_rows: int | None = None,
    progress: bool = True,
    log: Callable[[str], None] | None = None,
    method: str = "auto",
) -> PredictorSet:
    """Train (or resume) predictors for ``layers`` (default all) and write ``out``.

    ``model`` (a :class:`~powerinfer_rs.loading.LoadedModel`, optional) supplies the
    fingerprint checked against the samples' and the per-layer FFN bytes the budget is taken
    from (without it: f16 weights of the sampled shape), and the gate weights ``method``
    (:data:`METHODS`) builds predictors from. Returns the complete set written.
    """
    cfg = config or TrainConfig()
    cfg.validate()
    if method not in METHODS:
        raise PlanError(f"predictor method must be one of {METHODS}, got {method!r}")
    if method == "gate-svd" and model is None:
        raise PlanError("method 'gate-svd' builds predictors from the gate's weights: pass model")
    say = log or (lambda s: None)
    if not 0.0 < max_bytes_fraction:
        raise PlanError(f"max_bytes_fraction must be positive, got {max_bytes_fraction}")
    meta = samples_mod.read_meta(profile_dir)
    n_layers, dim, ffn = meta["n_layers"], meta["dim"], meta["ffn_dim"]
    smeta = meta.get("metadata", {})
    inp = smeta.get("predictor_input", "ffn_norm")
    if "moe" in smeta:  # a mixture of experts: per-expert samples, predictors where they pay
        from .experts import train_expert_predictors

        return train_expert_predictors(
            profile_dir,
            out,
            meta=meta,
            model=model,
            recall=recall,
            max_bytes_fraction=max_bytes_fraction,
            layers=layers,
            seed=seed,
            cfg=cfg,
            max_rows=max_rows,
            progress=progress,
            say=say,
            settings=lambda fp, d, f: _settings(
                fp, recall, max_bytes_fraction, cfg, d, f, inp, seed, "trained"
            ),
        )
    fingerprint = smeta.get("model_fingerprint") or None
    if model is not None:
        c = model.config
        if (c.n_layers, c.dim, c.ffn_dim) != (n_layers, dim, ffn):
            raise ShapeError(
                f"samples are for {n_layers} layers, dim {dim}, ffn {ffn}; the model has "
                f"{c.n_layers}, {c.dim}, {c.ffn_dim}"
            )
        if fingerprint and fingerprint != model.fingerprint:
            raise PlanError(
                f"samples were profiled on model {fingerprint}, not on {model.fingerprint}"
            )
        fingerprint = model.fingerprint
        ffn_bytes = {i: layer_ffn_bytes(model, i) for i in range(n_layers)}
    else:
        ffn_bytes = {i: 3 * dim * ffn * 2 for i in range(n_layers)}
    todo = sorted(set(range(n_layers) if layers is None else layers))
    for i in todo:
        if not 0 <= i < n_layers:
            raise ShapeError(f"layer {i} outside [0, {n_layers})")
    settings = _settings(fingerprint, recall, max_bytes_fraction, cfg, dim, ffn, inp, seed, method)

    out = Path(out)
    parts = out.with_name(out.name + ".parts")
    done, _, _ = resume_units(
        out, settings, lambda old: _matches(old, settings), "layer_*.safetensors",
        lambda p: p.layers, say, "layers",
    )  # fmt: skip

    pending = [i for i in todo if i not in done]
    if len(pending) < len(todo):
        say(f"resuming: {len(todo) - len(pending)} of {len(todo)} layers already trained")
    bar = tqdm(pending, desc="predictors", unit="layer", disable=not progress)
    for i in bar:
        bar.set_postfix(layer=i)
        x, m = samples_mod.load_samples(profile_dir, i, max_rows=max_rows)
        gate = gate_weights(model, i) if model is not None and method != "trained" else None
        pred = _from_gate(x, m, gate, i, method, recall, max_bytes_fraction * ffn_bytes[i],
                          ffn_bytes[i], seed + i, cfg)  # fmt: skip
        if pred is None:
            pred = train_layer(
                x,
                m,
                recall=recall,
                max_bytes=max_bytes_fraction * ffn_bytes[i],
                ffn_bytes=ffn_bytes[i],
                seed=seed + i,
                config=cfg,
                progress=progress,
                desc=f"layer {i}",
            )
        pred.stats["ffn_bytes"] = ffn_bytes[i]
        pred.stats["n_samples"] = int(x.shape[0])
        done[i] = pred
        save_predictors(parts / f"layer_{i:03d}.safetensors", _set({i: pred}, settings, cfg, inp))
        say(
            f"layer {i}: rank {pred.rank}, recall {pred.stats['recall']:.4f}, "
            f"precision {pred.stats['precision']:.3f}"
        )
    bar.close()
    result = _set(done, settings, cfg, inp)
    save_predictors(out, result)
    shutil.rmtree(parts, ignore_errors=True)
    return result


def _from_gate(x, m, gate, layer, method, recall, max_bytes, ffn_bytes, seed, cfg):
    """Layer ``layer``'s predictor from its gate, or None where ``auto`` falls back to training
    (no gate, or the masks are not the gate's sign)."""
    if gate is None:
        if method == "gate-svd":
            raise PlanError(f"layer {layer} has no gate or up projection to build a predictor from")
        return None
    ok, agree = fires_on_gate(gate, x, m)
    if not ok:
        if method == "gate-svd":
            raise PlanError(
                f"layer {layer}: its profiled masks agree with the gate's sign on only "
                f"{100 * agree:.1f}% of pairs (a SiLU/GELU model's calibrated masks, or a "
                "FATReLU threshold): use method 'trained'"
            )
        return None
    pred = train_layer_from_gate(
        x, m, gate, recall=recall, max_bytes=max_bytes, ffn_bytes=ffn_bytes, seed=seed, config=cfg
    )
    pred.stats["gate_agreement"] = agree
    return pred


def _set(layers: dict[int, LayerPredictor], settings: dict, cfg: TrainConfig, inp: str):
    return PredictorSet(
        layers=dict(sorted(layers.items())),
        model_fingerprint=settings["model_fingerprint"] or None,
        recall_target=settings["recall_target"],
        input=inp,
        dtype=cfg.dtype,
        metadata={"settings": settings},
    )


def format_table(predictors: PredictorSet) -> str:
    """The per-layer report: rank, recall, precision, predicted / actual active share, bytes
    and bytes as a share of the layer's FFN (a mixture of experts: per layer, its experts'
    predictors, see :func:`~.experts.format_expert_table`)."""
    if predictors.experts or "dropped" in predictors.metadata:
        from .experts import format_expert_table

        return format_expert_table(predictors)
    head = (
        f"{'layer':>5} {'rank':>5} {'recall':>7} {'precis':>7} {'pred%':>6} {'act%':>6} "
        f"{'bytes':>10} {'%ffn':>6}"
    )
    lines = [head, "-" * len(head)]
    tot_b = tot_f = 0
    for i, p in sorted(predictors.layers.items()):
        s = p.stats
        b = p.nbytes(predictors.dtype)
        f = s.get("ffn_bytes") or 0
        tot_b += b
        tot_f += f
        lines.append(
            f"{i:>5} {p.rank:>5} {s.get('recall', float('nan')):>7.4f} "
            f"{s.get('precision', float('nan')):>7.3f} "
            f"{100 * s.get('predicted_fraction', float('nan')):>6.1f} "
            f"{100 * s.get('active_fraction', float('nan')):>6.1f} {b:>10,} "
            f"{(100 * b / f if f else float('nan')):>6.2f}"
        )
    lines.append("-" * len(head))
    share = f"{100 * tot_b / tot_f:.2f}% of FFN bytes" if tot_f else "FFN bytes unknown"
    lines.append(f"total predictor bytes {tot_b:,} ({share})")
    return "\n".join(lines)
