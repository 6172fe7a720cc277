"""Training one layer's predictor in numpy: Adam on weighted binary cross-entropy, then the
adaptive rank search and the threshold tuning.

Samples are split (seeded) into *train* (fit the weights), *tune* (early stopping and the
threshold) and *check* (held out from both; the recall / precision reported and used to decide
whether to grow). Positives are rare (a ReLU layer fires ~5-20% of its neurons), so the loss
weights them by ``pos_weight`` (default ``sqrt(negatives / positives)``); the threshold tuned
afterwards calibrates the final operating point anyway.

Rank search (:func:`train_layer`): start at :func:`~.sizing.initial_rank` (from the layer's
sparsity and skewness), fit, round the weights to the storage dtype, tune the threshold on the
tune split for slightly more than the recall target (``recall_margin``), measure on the check
split. Double the rank while the check recall misses the target or precision is below
``min_precision``, as long as the byte cap allows (the last step may stop at the cap when that
is still >= 1.5x the rank) and each doubling still lowers the layer's cost ``predictor bytes +
predicted_fraction * FFN bytes`` (bytes read per token). The best attempt meeting the recall
target (lowest cost) wins, else the one with the highest recall.

Also: ``sqrt`` positive weighting, a closed-form warm start (:func:`linear_warm_start`, its
components computed once per layer by :func:`warm_basis` and shared by every rank tried; its
ridge grows as samples get few for the width, ``TrainConfig.ridge``) and one
BLAS thread for small products (:mod:`._blas`). torch is not used (numpy only).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from ..errors import ShapeError
from ._blas import blas_threads
from .metrics import mask_stats, tune_threshold
from .model import PREDICTOR_DTYPES, LayerPredictor, param_bytes, stored_form
from .sizing import initial_rank, layer_activity, rank_cap


@dataclass
class TrainConfig:
    """Hyper-parameters of predictor training (defaults suit layers of ~100-10k neurons)."""

    epochs: int = 40
    batch_size: int = 256
    lr: float = 1e-2
    patience: int = 3
    val_fraction: float = 0.25
    pos_weight: float | None = None
    min_rank: int = 16
    min_precision: float = 0.5
    min_gain: float = 0.02
    recall_margin: float = 0.6
    dtype: str = "F16"
    max_eval_rows: int = 16384
    #: Ridge of the warm start's normal equations, in units of the Gram matrix's mean diagonal;
    #: None: ``dim / n_train`` (at least 1e-3), the scale of the Gram's sampling noise.
    ridge: float | None = None

    def validate(self) -> None:
        """Raise :class:`ShapeError` for values out of range."""
        if self.epochs < 1 or self.batch_size < 1 or self.patience < 1 or self.min_rank < 1:
            raise ShapeError("epochs, batch_size, patience and min_rank must be positive")
        if not 0.0 < self.val_fraction < 1.0:
            raise ShapeError(f"val_fraction must lie in (0, 1), got {self.val_fraction}")
        if not self.lr > 0:
            raise ShapeError(f"lr must be positive, got {self.lr}")
        if self.dtype not in PREDICTOR_DTYPES:
            raise ShapeError(f"dtype must be one of {PREDICTOR_DTYPES}, got {self.dtype}")
        if not 0.0 <= self.recall_margin <= 1.0:
            raise ShapeError(f"recall_margin must lie in [0, 1], got {self.recall_margin}")
        if self.ridge is not None and not self.ridge > 0:
            raise ShapeError(f"ridge must be positive, got {self.ridge}")

    def ridge_for(self, n: int, dim: int) -> float:
        """The warm start's ridge for ``n`` training rows of width ``dim``."""
        return self.ridge if self.ridge is not None else max(1e-3, dim / max(1, n))


# --------------------------------------------------------------------------- fitting
def _sigmoid(z: np.ndarray) -> np.ndarray:
    """Logistic function, overflow-free (``(1 + tanh(z / 2)) / 2``)."""
    out = np.tanh(z * np.float32(0.5))
    out += np.float32(1.0)
    out *= np.float32(0.5)
    return out


@dataclass
class WarmBasis:
    """The leading components of a layer's least-squares map ``x @ B ~ 2y - 1``, as
    ``B ~ p.T @ q.T`` (``p [k, dim]``, ``q [ffn, k]``, strongest first). Computed once per layer
    (:func:`warm_basis`) and shared by every rank the search tries."""

    p: np.ndarray
    q: np.ndarray


def warm_basis(
    x: np.ndarray, y: np.ndarray, k: int, seed: int = 0, ridge: float = 1e-3
) -> WarmBasis:
    """The top ``k`` components of the ridge least-squares fit of ``2y - 1`` on ``x``, the ridge
    ``ridge`` times the Gram matrix's mean diagonal.

    The ridge matters when samples are few for the width: with ``n`` rows of width ``dim`` the
    Gram's small eigenvalues are mostly sampling noise (Marchenko-Pastur: they spread over
    ``(1 +- sqrt(dim / n))^2``), and a tiny ridge lets them blow the noise up. At the 7B width
    (dim 4096) on 1,536 training rows (synthetic, planted rank-64 gate, 10% active) a ridge of
    1e-3 gave precision 0.25 at recall 0.99 on another text, 1 and 10 gave 0.32 and 0.31.

    The normal equations are formed in float32 (these products dominate) and solved in float64;
    the truncated SVD is a seeded randomized one (a range finder over ``k + 16`` columns with four
    power iterations, Halko et al. 2011), which finds the leading components of ``B [dim, ffn]``
    at a small fraction of a full SVD's cost."""
    dim, ffn = x.shape[1], y.shape[1]
    k = max(0, min(k, dim, ffn))
    if k == 0:
        return WarmBasis(np.zeros((0, dim), np.float32), np.zeros((ffn, 0), np.float32))
    xf = np.ascontiguousarray(x, dtype=np.float32)
    t = y.astype(np.float32) * np.float32(2.0) - np.float32(1.0)
    gram = (xf.T @ xf).astype(np.float64)
    gram[np.diag_indices_from(gram)] += ridge * np.trace(gram) / dim + 1e-8
    b = np.linalg.solve(gram, (xf.T @ t).astype(np.float64))  # [dim, ffn]
    width = min(k + 16, dim, ffn)
    omega = np.random.default_rng([seed, 11]).standard_normal((ffn, width))
    basis, _ = np.linalg.qr(b @ omega)
    for _ in range(4):
        basis, _ = np.linalg.qr(b.T @ basis)
        basis, _ = np.linalg.qr(b @ basis)
    u_small, s, vt = np.linalg.svd(basis.T @ b, full_matrices=False)
    u = basis @ u_small
    root = np.sqrt(s[:k])
    return WarmBasis((u[:, :k] * root).T.astype(np.float32), (vt[:k].T * root).astype(np.float32))


def linear_warm_start(
    x: np.ndarray,
    y: np.ndarray,
    rank: int,
    rng: np.random.Generator,
    basis: WarmBasis | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Closed-form start: the least-squares map ``x @ B ~ 2y - 1`` truncated to ``k = rank // 2``
    components ``B ~ P.T @ Q.T`` (:func:`warm_basis`, or ``basis`` when given), written as
    ``fc1 = [P; -P]``, ``fc2 = [Q, -Q]`` so that ``fc2 @ relu(fc1 @ x) = Q @ P @ x``
    (ReLU(a) - ReLU(-a) = a). An odd leftover row, and components the basis lacks, start
    random."""
    dim, ffn = x.shape[1], y.shape[1]
    k = rank // 2
    w1 = (rng.standard_normal((rank, dim)) * math.sqrt(2.0 / dim)).astype(np.float32)
    w2 = (rng.standard_normal((ffn, rank)) * math.sqrt(1.0 / rank) * 0.1).astype(np.float32)
    if k == 0:
        return w1, w2
    if basis is None:
        basis = warm_basis(x, y, k)
    k = min(k, basis.p.shape[0])
    p, q = basis.p[:k], basis.q[:, :k]
    w1[:k], w1[k : 2 * k] = p, -p
    w2[:, :k], w2[:, k : 2 * k] = q, -q
    return w1, w2


def _loss(z: np.ndarray, y: np.ndarray, pos_weight: float) -> float:
    """Mean weighted BCE with logits."""
    sp_neg = np.logaddexp(0.0, -z)  # -log sigmoid(z)
    sp_pos = np.logaddexp(0.0, z)  # -log(1 - sigmoid(z))
    return float(np.mean(pos_weight * y * sp_neg + (1.0 - y) * sp_pos))


def _forward(x: np.ndarray, w1: np.ndarray, w2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = x @ w1.T
    a = np.maximum(h, 0.0)
    return a, a @ w2.T


def _eval_loss(x, y, w1, w2, pos_weight, chunk=4096) -> float:
    tot, n = 0.0, 0
    for i in range(0, x.shape[0], chunk):
        _, z = _forward(x[i : i + chunk], w1, w2)
        yb = y[i : i + chunk].astype(np.float32)
        tot += _loss(z, yb, pos_weight) * yb.shape[0]
        n += yb.shape[0]
    return tot / max(1, n)


def fit_mlp(
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_val: np.ndarray,
    y_val: np.ndarray,
    rank: int,
    config: TrainConfig,
    *,
    seed: int = 0,
    progress: bool = False,
    desc: str = "",
    basis: WarmBasis | None = None,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Fit ``fc1 [rank, dim]``, ``fc2 [ffn, rank]`` with Adam on minibatches; early stopping on
    the validation loss (the best epoch's weights are returned with ``{"epochs", "val_loss",
    "pos_weight"}``). ``basis``: the layer's warm-start components, when already computed."""
    rng = np.random.default_rng(seed)
    n = x_train.shape[0]
    pos = float(np.count_nonzero(y_train))
    pw = config.pos_weight
    if pw is None:
        neg = float(y_train.size) - pos
        pw = math.sqrt(neg / pos) if pos > 0 else 1.0
        pw = float(min(max(pw, 1.0), 30.0))
    w1, w2 = linear_warm_start(x_train, y_train, rank, rng, basis)
    params = [w1, w2]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    b1, b2, eps, lr = 0.9, 0.999, 1e-8, np.float32(config.lr)
    step = 0
    best = (_eval_loss(x_val, y_val, w1, w2, pw), w1.copy(), w2.copy(), 0)
    bad = 0
    bs = config.batch_size
    bar = tqdm(range(config.epochs), desc=desc or f"rank {rank}", leave=False, disable=not progress)
    epochs_run = 0
    for epoch in bar:
        order = rng.permutation(n)
        for i in range(0, n, bs):
            idx = order[i : i + bs]
            xb = x_train[idx]
            yb = y_train[idx].astype(np.float32)
            a, z = _forward(xb, w1, w2)
            s = _sigmoid(z)
            # d(loss)/dz of pw*y*softplus(-z) + (1-y)*softplus(z), mean over all entries
            dz = (s * (pw * yb + (1.0 - yb)) - pw * yb) / np.float32(yb.size)
            g2 = dz.T @ a
            da = dz @ w2
            da[a <= 0.0] = 0.0
            g1 = da.T @ xb
            step += 1
            c1 = 1.0 - b1**step
            c2 = 1.0 - b2**step
            for p, g, mm, vv in zip(params, (g1, g2), m, v):
                mm *= b1
                mm += (1.0 - b1) * g
                vv *= b2
                vv += (1.0 - b2) * g * g
                p -= lr * (mm / c1) / (np.sqrt(vv / c2) + eps)
        epochs_run = epoch + 1
        val = _eval_loss(x_val, y_val, w1, w2, pw)
        bar.set_postfix(val_loss=f"{val:.4f}")
        if val < best[0] - 1e-6:
            best = (val, w1.copy(), w2.copy(), epochs_run)
            bad = 0
        else:
            bad += 1
            if bad >= config.patience:
                break
    bar.close()
    return (
        best[1],
        best[2],
        {"epochs": epochs_run, "best_epoch": best[3], "val_loss": best[0], "pos_weight": pw},
    )


# --------------------------------------------------------------------------- one layer
def _split(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    perm = np.random.default_rng([seed, 7]).permutation(n)
    n_val = max(2, int(round(n * val_fraction)))
    n_tune = n_val // 2
    return perm[n_val:], perm[:n_tune], perm[n_tune:n_val]


def check_samples(x: np.ndarray, recall: float) -> None:
    """:class:`ShapeError` unless ``x`` holds at least 16 finite rows and ``recall`` lies in
    (0, 1]: what every way of making a layer's predictor needs."""
    if x.shape[0] < 16:
        raise ShapeError(f"need at least 16 samples to make a predictor, got {x.shape[0]}")
    if not 0.0 < recall <= 1.0:
        raise ShapeError(f"recall target must lie in (0, 1], got {recall}")
    if not np.isfinite(x).all():
        raise ShapeError("predictor samples contain NaN or infinite inputs")


def _logits_chunked(x: np.ndarray, w1: np.ndarray, w2: np.ndarray, chunk: int = 8192):
    return np.concatenate([_forward(x[i : i + chunk], w1, w2)[1] for i in range(0, len(x), chunk)])


@dataclass
class _Splits:
    """A layer's samples split into training, threshold-tuning and check rows."""

    xtr: np.ndarray
    ytr: np.ndarray
    xtu: np.ndarray
    ytu: np.ndarray
    xck: np.ndarray
    yck: np.ndarray


def _search(
    data: _Splits,
    rank: int,
    cap: int,
    recall: float,
    tune_target: float,
    ffn_bytes: float,
    cfg: TrainConfig,
    seed: int,
    progress: bool,
    desc: str,
    basis: WarmBasis,
) -> list[dict[str, Any]]:
    """The doubling loop of :func:`train_layer`; one dict per rank tried. ``basis`` is the
    layer's warm start, extended here if a rank needs more components than it has."""
    xtr, ytr, xtu, ytu, xck, yck = data.xtr, data.ytr, data.xtu, data.ytu, data.xck, data.yck
    dim, ffn = xtr.shape[1], ytr.shape[1]
    attempts: list[dict[str, Any]] = []
    prev_cost = math.inf
    while True:
        if rank // 2 > basis.p.shape[0]:
            ridge = cfg.ridge_for(xtr.shape[0], dim)
            basis = warm_basis(xtr, ytr, min(cap, 2 * rank) // 2, seed, ridge)
        w1, w2, info = fit_mlp(
            xtr,
            ytr,
            xtu,
            ytu,
            rank,
            cfg,
            seed=seed * 1009 + rank,
            progress=progress,
            desc=f"{desc} rank {rank}".strip(),
            basis=basis,
        )
        w1, w2 = stored_form(w1, w2, cfg.dtype)
        t = tune_threshold(_logits_chunked(xtu, w1, w2), ytu, tune_target)
        st = mask_stats(_logits_chunked(xck, w1, w2) >= np.float32(t), yck)
        nbytes = param_bytes(rank, dim, ffn, cfg.dtype)
        cost = nbytes + st.predicted_fraction * ffn_bytes
        attempts.append(
            {
                "rank": rank,
                "threshold": t,
                "bytes": nbytes,
                "cost": cost,
                "predictor": LayerPredictor(w1, w2, t),
                **st.as_dict(),
                **info,
            }
        )
        good = st.recall >= recall and st.precision >= cfg.min_precision
        improving = cost < prev_cost * (1.0 - cfg.min_gain) or st.recall < recall
        # the next step doubles, or stops at the cap when that is still worth a try (>= 1.5x)
        nxt = min(rank * 2, cap)
        if good or nxt < rank * 1.5 or not improving:
            return attempts
        prev_cost = cost
        rank = nxt


def train_layer(
    x: np.ndarray,
    mask: np.ndarray,
    *,
    recall: float = 0.99,
    max_rank: int | None = None,
    max_bytes: float | None = None,
    ffn_bytes: float | None = None,
    start_rank: int | None = None,
    seed: int = 0,
    config: TrainConfig | None = None,
    progress: bool = False,
    desc: str = "",
) -> LayerPredictor:
    """Train one layer's predictor on samples ``x [n, dim]`` -> ``mask [n, ffn]``.

    ``max_rank`` and ``max_bytes`` (bytes of both matrices in ``config.dtype``) cap the rank;
    with neither, the cap is ``dim``. ``ffn_bytes`` (the layer's gate+up+down bytes, for the
    cost used to decide growth) defaults to f16 weights. Returns the chosen predictor with
    ``stats``: rank, threshold, recall/precision/predicted and active fractions on the check
    split, bytes, the layer's sparsity/skewness and every rank tried.
    """
    cfg = config or TrainConfig()
    cfg.validate()
    x = np.asarray(x, dtype=np.float32)
    mask = np.asarray(mask, dtype=bool)
    if x.ndim != 2 or mask.ndim != 2 or x.shape[0] != mask.shape[0]:
        raise ShapeError(
            f"samples must be x [n, dim] and mask [n, ffn], got {x.shape}, {mask.shape}"
        )
    n, dim = x.shape
    ffn = mask.shape[1]
    check_samples(x, recall)
    cap = dim if max_rank is None and max_bytes is None else 1 << 30
    if max_rank is not None:
        cap = min(cap, int(max_rank))
    if max_bytes is not None:
        cap = min(cap, rank_cap(max_bytes, dim, ffn, cfg.dtype))
    if cap < 1:
        raise ShapeError(f"max_rank must be positive, got {max_rank}")
    if ffn_bytes is None:
        ffn_bytes = 3.0 * dim * ffn * 2
    tr, tu, ck = _split(n, cfg.val_fraction, seed)
    if cfg.max_eval_rows:
        tu, ck = tu[: cfg.max_eval_rows], ck[: cfg.max_eval_rows]
    data = _Splits(x[tr], mask[tr], x[tu], mask[tu], x[ck], mask[ck])
    activity = layer_activity(data.ytr)
    tune_target = 1.0 - (1.0 - recall) * cfg.recall_margin
    rank = min(cap, start_rank or initial_rank(activity, cfg.min_rank))

    # small products: one BLAS thread is far faster than many (see _blas)
    small = cfg.batch_size * ffn * min(cap, 4096) < (1 << 28)
    # the warm start's large products, once for the ranks of up to two doublings, on every
    # BLAS thread
    ridge = cfg.ridge_for(data.xtr.shape[0], dim)
    basis = warm_basis(data.xtr, data.ytr, min(cap, 4 * rank) // 2, seed, ridge)
    with blas_threads(1) if small else nullcontext():
        attempts = _search(
            data, rank, cap, recall, tune_target, ffn_bytes, cfg, seed, progress, desc, basis
        )
    best = [a for a in attempts if a["recall"] >= recall]
    final = min(best, key=lambda a: a["cost"]) if best else max(attempts, key=lambda a: a["recall"])
    chosen: LayerPredictor = final["predictor"]
    chosen.stats = {
        "rank": chosen.rank,
        "threshold": chosen.threshold,
        "recall": final["recall"],
        "precision": final["precision"],
        "predicted_fraction": final["predicted_fraction"],
        "active_fraction": final["active_fraction"],
        "bytes": final["bytes"],
        "recall_target": recall,
        "met_target": final["recall"] >= recall,
        "rank_cap": cap,
        "n_train": int(len(tr)),
        "n_tune": int(len(tu)),
        "n_check": int(len(ck)),
        "activity": activity.as_dict(),
        "config": asdict(cfg),
        "attempts": [
            {
                k: a[k]
                for k in (
                    "rank",
                    "recall",
                    "precision",
                    "predicted_fraction",
                    "bytes",
                    "epochs",
                    "threshold",
                )
            }
            for a in attempts
        ],
    }
    return chosen
