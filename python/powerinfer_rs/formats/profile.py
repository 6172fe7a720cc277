"""Activation profiles on disk: ``DIR/profile.safetensors``.

Written by the profiler (``python -m powerinfer_rs.profile``) and read by the planner. Layout:

* tensors ``blk.{i}.active_count``: int64, shape ``[ffn_dim]``, the number of profiled tokens in
  which neuron ``j`` of layer ``i`` was active;
* metadata (str -> str): ``format`` = ``powerinfer-rs-profile/1``, ``tokens`` (total token
  count), ``model_fingerprint`` (``LoadedModel.fingerprint``; empty when unknown), ``n_layers``,
  ``ffn_dim``, ``corpus`` (a JSON list of corpus names). Other keys are kept as they are.

A mixture-of-experts model's profile counts each layer's flattened neuron space (``ffn_dim`` =
``n_expert * expert_ffn``; neuron ``e * expert_ffn + j`` is neuron j of expert e, counted in the
tokens routed to e) and adds tensors ``blk.{i}.expert_count`` (int64 ``[n_expert]``: tokens
routed to each expert) and metadata ``n_expert``, ``expert_ffn``. Its first ``dense_lead``
layers (metadata ``dense_lead``, GLM-4.5's first_k_dense_replace; 0 when absent) are dense FFNs
counted as a dense model's, ``[ffn_dim of the dense layer]`` each, with expert counts of zero;
``ffn_dim`` is then the widest layer's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ModelFileError, ShapeError

PROFILE_FORMAT = "powerinfer-rs-profile/1"
PROFILE_FILE = "profile.safetensors"


@dataclass
class Profile:
    """Per-layer activation counts over ``tokens`` profiled tokens, plus the file's metadata."""

    counts: list[np.ndarray]
    tokens: int
    meta: dict[str, str] = field(default_factory=dict)
    #: Mixture of experts: per layer, tokens routed to each expert (None for a dense model).
    expert_counts: list[np.ndarray] | None = None
    #: Mixture of experts: its first layers with a dense FFN (GLM-4.5's), which route nothing.
    dense_lead: int = 0

    @property
    def n_expert(self) -> int:
        """Experts per layer (0 for a dense model)."""
        return int(self.expert_counts[0].size) if self.expert_counts else 0

    @property
    def n_layers(self) -> int:
        """Number of layers profiled."""
        return len(self.counts)

    @property
    def ffn_dim(self) -> int:
        """Neurons per layer (the widest layer's where a mixture of experts' leading dense
        layers differ, see :attr:`layer_neurons`)."""
        return max((int(c.size) for c in self.counts), default=0)

    @property
    def layer_neurons(self) -> list[int]:
        """Each layer's neurons counted."""
        return [int(c.size) for c in self.counts]

    @property
    def model_fingerprint(self) -> str:
        """Fingerprint of the model the profile was made on ('' when unknown)."""
        return self.meta.get("model_fingerprint", "")

    def frequencies(self, layer: int) -> np.ndarray:
        """Activation frequency (share of tokens) of each neuron of ``layer``."""
        return self.counts[layer] / float(self.tokens)

    def validate(self, source: str = "profile") -> None:
        """Check shapes and ranges; :class:`ShapeError` / :class:`ModelFileError` otherwise."""
        if not self.counts:
            raise ShapeError(f"{source}: no layers")
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, (int, np.integer)):
            raise ModelFileError(f"{source}: tokens must be an integer, got {self.tokens!r}")
        if not 0 < self.tokens < 1 << 63:
            raise ModelFileError(f"{source}: tokens must be in [1, 2^63), got {self.tokens}")
        if not 0 <= self.dense_lead < len(self.counts) or (self.dense_lead and not self.n_expert):
            raise ShapeError(f"{source}: {self.dense_lead} leading dense layers")
        lead = self.counts[0].size
        ffn = self.counts[-1].size
        for i, c in enumerate(self.counts):
            want = lead if i < self.dense_lead else ffn
            if c.ndim != 1 or c.size != want or c.size == 0:
                raise ShapeError(
                    f"{source}: blk.{i}.active_count has shape {c.shape}, expected [{want}]"
                )
            if not np.issubdtype(c.dtype, np.integer):
                raise ModelFileError(f"{source}: blk.{i}.active_count is {c.dtype}, not integer")
            if c.min() < 0 or c.max() > self.tokens:
                raise ModelFileError(
                    f"{source}: blk.{i}.active_count outside [0, tokens={self.tokens}]"
                )
        if self.expert_counts is not None:
            self._validate_experts(source, ffn)

    def _validate_experts(self, source: str, ffn: int) -> None:
        ec = self.expert_counts or []
        n = ec[0].size if ec else 0
        if len(ec) != len(self.counts) or n == 0 or ffn % n:
            raise ShapeError(
                f"{source}: {len(ec)} expert count tensors of {n} experts for "
                f"{len(self.counts)} layers of {ffn} neurons"
            )
        for i, (e, c) in enumerate(zip(ec, self.counts)):
            if e.ndim != 1 or e.size != n or not np.issubdtype(e.dtype, np.integer):
                raise ShapeError(f"{source}: blk.{i}.expert_count has shape {e.shape} / {e.dtype}")
            if e.min() < 0 or e.max() > self.tokens:
                raise ModelFileError(
                    f"{source}: blk.{i}.expert_count outside [0, tokens={self.tokens}]"
                )
            if i < self.dense_lead:
                if e.any():
                    raise ModelFileError(f"{source}: blk.{i}: a dense layer routed tokens")
            elif (c.reshape(n, -1).max(axis=1) > e).any():
                raise ModelFileError(
                    f"{source}: blk.{i}: a neuron counted in more tokens than its expert"
                )


def _profile_path(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p / PROFILE_FILE if p.is_dir() or p.suffix != ".safetensors" else p


def write_profile(
    out_dir: str | os.PathLike[str],
    counts: list[np.ndarray],
    tokens: int,
    *,
    model_fingerprint: str = "",
    corpus: list[str] | None = None,
    extra_meta: dict[str, str] | None = None,
    expert_counts: list[np.ndarray] | None = None,
    dense_lead: int = 0,
) -> Path:
    """Write ``out_dir/profile.safetensors``; returns its path. Validates first. ``counts[i]``
    holds layer i's own neurons (``dense_lead``: a mixture of experts' leading dense layers,
    whose widths differ from its layers of experts')."""
    from safetensors.numpy import save_file

    ec = None
    if expert_counts is not None:
        ec = [np.ascontiguousarray(e, dtype=np.int64) for e in expert_counts]
    prof = Profile(
        [np.ascontiguousarray(c, dtype=np.int64) for c in counts], int(tokens), expert_counts=ec,
        dense_lead=dense_lead,
    )  # fmt: skip
    prof.validate("write_profile")
    meta = {
        **(extra_meta or {}),
        "format": PROFILE_FORMAT,
        "tokens": str(int(tokens)),
        "model_fingerprint": model_fingerprint or "",
        "n_layers": str(prof.n_layers),
        "ffn_dim": str(prof.ffn_dim),
        "corpus": json.dumps(list(corpus or [])),
    }
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / PROFILE_FILE
    tmp = path.with_name(path.name + ".part")
    tensors = {f"blk.{i}.active_count": c for i, c in enumerate(prof.counts)}
    if ec is not None:
        ef = prof.counts[-1].size // prof.n_expert
        meta.update(n_expert=str(prof.n_expert), expert_ffn=str(ef))
        if dense_lead:
            meta["dense_lead"] = str(int(dense_lead))
        tensors.update({f"blk.{i}.expert_count": e for i, e in enumerate(ec)})
    save_file(tensors, str(tmp), meta)
    os.replace(tmp, path)
    return path


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a profile directory (or the ``.safetensors`` file itself).

    Raises :class:`ModelFileError` for a missing or malformed file and :class:`ShapeError` for
    inconsistent shapes.
    """
    from safetensors import safe_open

    p = _profile_path(path)
    if not p.is_file():
        raise ModelFileError(f"{p}: no activation profile here (expected DIR/{PROFILE_FILE})")
    try:
        with safe_open(str(p), framework="numpy") as f:
            meta = dict(f.metadata() or {})
            names = set(f.keys())
            if meta.get("format") != PROFILE_FORMAT:
                raise ModelFileError(
                    f"{p}: format {meta.get('format')!r}, expected {PROFILE_FORMAT!r}"
                )
            n_layers = int(meta.get("n_layers", "0"))
            tokens = int(meta["tokens"])
            counts = []
            experts: list[np.ndarray] | None = [] if "n_expert" in meta else None
            for i in range(n_layers):
                name = f"blk.{i}.active_count"
                if name not in names:
                    raise ModelFileError(f"{p}: tensor {name} is missing")
                counts.append(np.asarray(f.get_tensor(name)))
                if experts is not None:
                    ename = f"blk.{i}.expert_count"
                    if ename not in names:
                        raise ModelFileError(f"{p}: tensor {ename} is missing")
                    experts.append(np.asarray(f.get_tensor(ename)))
    except ModelFileError:
        raise
    except Exception as e:  # safetensors raises its own error types for malformed files
        raise ModelFileError(f"{p}: cannot read activation profile: {e}") from None
    try:
        lead = int(meta.get("dense_lead", "0"))
    except ValueError:
        raise ModelFileError(f"{p}: dense_lead {meta.get('dense_lead')!r}") from None
    prof = Profile(counts, tokens, meta, expert_counts=experts, dense_lead=lead)
    prof.validate(str(p))
    if str(prof.ffn_dim) != meta.get("ffn_dim", str(prof.ffn_dim)):
        raise ShapeError(f"{p}: ffn_dim metadata {meta.get('ffn_dim')} != tensors' {prof.ffn_dim}")
    return prof


def zipf_probabilities(n: int, a: float, mean: float, cap: float = 0.98) -> np.ndarray:
    """``p_r = min(cap, s * r^-a)`` for rank ``r = 1..n``; ``s`` makes the mean ``mean``."""
    if not 0 < mean < cap:
        raise ShapeError(f"mean activation must be in (0, {cap}), got {mean}")
    base = np.arange(1, n + 1, dtype=np.float64) ** -float(a)
    lo, hi = 0.0, cap / base[-1]
    for _ in range(100):
        s = 0.5 * (lo + hi)
        if np.minimum(cap, s * base).mean() < mean:
            lo = s
        else:
            hi = s
    return np.minimum(cap, 0.5 * (lo + hi) * base)


def synthetic_profile(
    n_layers: int,
    ffn_dim: int,
    tokens: int,
    *,
    zipf_a: float = 1.0,
    mean_active: float = 0.1,
    seed: int = 0,
    model_fingerprint: str = "",
    n_expert: int = 0,
    n_expert_used: int = 0,
) -> Profile:
    """A power-law profile for tests and benchmarks ("synthetic profile").

    Neuron frequencies follow :func:`zipf_probabilities` over a random permutation per layer,
    with the exponent jittered by +-10 % between layers so layers differ; counts are binomial
    draws over ``tokens``. With ``n_expert`` (a mixture of experts, ``ffn_dim`` its flattened
    routed neurons, ``n_expert * expert_ffn``), routing is a power law too: each layer's experts
    are routed with Zipf frequencies (exponent ``zipf_a``, mean ``n_expert_used / n_expert``),
    and a neuron fires in a binomial share of its expert's tokens.
    """
    rng = np.random.default_rng(seed)
    counts = []
    experts = [] if n_expert else None
    if n_expert and (ffn_dim % n_expert or not 0 < n_expert_used < n_expert):
        raise ShapeError(
            f"{n_expert} experts with {n_expert_used} used do not divide {ffn_dim} neurons"
        )
    for _ in range(n_layers):
        a = zipf_a * rng.uniform(0.9, 1.1)
        if experts is None:
            p = zipf_probabilities(ffn_dim, a, mean_active)
            counts.append(rng.binomial(tokens, p[rng.permutation(ffn_dim)]).astype(np.int64))
            continue
        ef = ffn_dim // n_expert
        route = zipf_probabilities(n_expert, a, n_expert_used / n_expert, cap=1.0 - 1e-9)
        routed = np.round(tokens * route[rng.permutation(n_expert)]).astype(np.int64)
        experts.append(np.minimum(routed, tokens))
        inner = zipf_probabilities(ffn_dim, a, mean_active)[rng.permutation(ffn_dim)]
        counts.append(rng.binomial(np.repeat(experts[-1], ef), inner).astype(np.int64))
    meta = {
        "format": PROFILE_FORMAT,
        "tokens": str(tokens),
        "model_fingerprint": model_fingerprint,
        "n_layers": str(n_layers),
        "ffn_dim": str(ffn_dim),
        "corpus": json.dumps([f"synthetic zipf a={zipf_a} seed={seed}"]),
    }
    if experts is not None:
        meta.update(n_expert=str(n_expert), expert_ffn=str(ffn_dim // n_expert))
    return Profile(counts, int(tokens), meta, expert_counts=experts)


__all__ = [
    "PROFILE_FILE",
    "PROFILE_FORMAT",
    "Profile",
    "read_profile",
    "synthetic_profile",
    "write_profile",
    "zipf_probabilities",
]
