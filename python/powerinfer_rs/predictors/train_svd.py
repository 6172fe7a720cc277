"""One layer's predictor from its gate's weights and the samples' second moment
(:mod:`.svd`): the closed form, no gradient steps.

The samples are split as :func:`~.train.train_layer` splits them (train / tune / check, seeded):
the second moment comes from the train rows, the threshold from the tune rows (for slightly
more than the recall target, ``recall_margin``), the reported recall and precision from the
check rows. Ranks are tried from the largest the byte cap allows downwards by halves (one
eigendecomposition serves them all: the leading eigenvectors are nested); the cheapest one
meeting the recall target wins, cost being ``predictor bytes + predicted share * FFN bytes``
(bytes read per token), as in the trained search.
"""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any

import numpy as np

from ..errors import ShapeError
from .metrics import mask_stats, tune_threshold
from .model import LayerPredictor, param_bytes, stored_form
from .sizing import layer_activity, rank_cap
from .svd import GateMaps, second_moment
from .train import TrainConfig, _logits_chunked, _split, check_samples

#: Smallest map rank tried (the ReLU form's rank is twice it).
MIN_MAP_RANK = 16
#: Largest map rank tried without a byte cap.
MAX_MAP_RANK = 512


def train_layer_from_gate(
    x: np.ndarray,
    mask: np.ndarray,
    gate: np.ndarray,
    *,
    recall: float = 0.99,
    max_bytes: float | None = None,
    ffn_bytes: float | None = None,
    max_rank: int | None = None,
    seed: int = 0,
    config: TrainConfig | None = None,
) -> LayerPredictor:
    """The predictor of one layer whose neurons fire when ``gate [ffn, dim] @ x > 0``, from
    samples ``x [n, dim]`` -> ``mask [n, ffn]``. ``max_bytes`` / ``max_rank`` cap the ReLU
    form's rank (``2k``); ``ffn_bytes`` prices the rows a prediction reads. ``stats`` as
    :func:`~.train.train_layer` gives them, with ``method: "gate-svd"`` and every rank tried."""
    cfg = config or TrainConfig()
    cfg.validate()
    x = np.asarray(x, dtype=np.float32)
    mask = np.asarray(mask, dtype=bool)
    gate = np.ascontiguousarray(gate, dtype=np.float32)
    if x.ndim != 2 or mask.shape != (x.shape[0], gate.shape[0]) or gate.shape[1] != x.shape[1]:
        raise ShapeError(
            f"samples x {x.shape}, mask {mask.shape} and gate {gate.shape} do not fit "
            "x [n, dim], mask [n, ffn], gate [ffn, dim]"
        )
    n, dim = x.shape
    ffn = gate.shape[0]
    check_samples(x, recall)
    t0 = time.perf_counter()
    cap = MAX_MAP_RANK * 2 if max_rank is None else int(max_rank)
    if max_bytes is not None:
        cap = min(cap, rank_cap(max_bytes, dim, ffn, cfg.dtype))
    kmax = min(cap // 2, dim, ffn)
    if kmax >= MIN_MAP_RANK:  # the ReLU form's rank a multiple of 32: block formats pad none
        kmax -= kmax % MIN_MAP_RANK
    if kmax < 1:
        raise ShapeError(f"the byte or rank cap leaves no rank (cap {cap})")
    ffn_bytes = 3.0 * dim * ffn * 2 if ffn_bytes is None else float(ffn_bytes)
    tr, tu, ck = _split(n, cfg.val_fraction, seed)
    if cfg.max_eval_rows:
        tu, ck = tu[: cfg.max_eval_rows], ck[: cfg.max_eval_rows]
    moment = second_moment([x[tr]], dim)
    maps = GateMaps(gate, moment, kmax, seed=seed)
    tune_target = 1.0 - (1.0 - recall) * cfg.recall_margin
    attempts: list[dict[str, Any]] = []
    k = kmax
    while True:
        m = maps.at(k)
        pred = LayerPredictor(*stored_form(*m.relu_form(), cfg.dtype))
        t = tune_threshold(_logits_chunked(x[tu], pred.fc1, pred.fc2), mask[tu], tune_target)
        st = mask_stats(_logits_chunked(x[ck], pred.fc1, pred.fc2) >= np.float32(t), mask[ck])
        nbytes = param_bytes(2 * k, dim, ffn, cfg.dtype)
        pred.threshold = t
        attempts.append(
            {"rank": 2 * k, "threshold": t, "bytes": nbytes, "predictor": pred,
             "cost": nbytes + st.predicted_fraction * ffn_bytes, **st.as_dict()}
        )  # fmt: skip
        if k // 2 < MIN_MAP_RANK or st.recall < recall:
            break
        k //= 2
    good = [a for a in attempts if a["recall"] >= recall]
    final = min(good, key=lambda a: a["cost"]) if good else max(attempts, key=lambda a: a["recall"])
    chosen: LayerPredictor = final["predictor"]
    keys = ("rank", "recall", "precision", "predicted_fraction", "bytes", "threshold")
    chosen.stats = {
        "method": "gate-svd",
        **{k: final[k] for k in keys},
        "active_fraction": final["active_fraction"],
        "recall_target": recall,
        "met_target": final["recall"] >= recall,
        "rank_cap": cap,
        "n_train": int(len(tr)),
        "n_tune": int(len(tu)),
        "n_check": int(len(ck)),
        "activity": layer_activity(mask[tr]).as_dict(),
        "config": asdict(cfg),
        "seconds": time.perf_counter() - t0,
        "attempts": [{k: a[k] for k in keys} for a in attempts],
    }
    return chosen
