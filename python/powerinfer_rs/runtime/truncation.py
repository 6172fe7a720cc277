"""The truncation samplers after top-k: locally typical sampling (``typical_p``) and ``min_p``,
as llama.cpp's ``llama_sampler_typical`` and ``llama_sampler_min_p`` run them. Each takes the
candidates likeliest first (``ids`` and their probabilities ``p``, summing to 1) and returns
the survivors likeliest first, ``p`` renormalised; each keeps at least one token.

llama.cpp's default chain runs top-k, typical-p, top-p, min-p in that order, and
:func:`~.sampling.distribution` does too (temperature, unlike llama.cpp's chain, scales the
logits before them, as OpenAI, Hugging Face and vLLM do)."""

from __future__ import annotations

import numpy as np


def typical_filter(ids: np.ndarray, p: np.ndarray, mass: float) -> tuple[np.ndarray, np.ndarray]:
    """Locally typical sampling (Meister et al. 2022): rank the candidates by how far their
    information ``-log p`` lies from the distribution's entropy, closest first, and keep them in
    that order until their probability sums to more than ``mass`` (llama.cpp's rule: the token
    that crosses ``mass`` is kept). ``mass >= 1`` is off."""
    if mass >= 1.0 or ids.size <= 1:
        return ids, p
    with np.errstate(divide="ignore", invalid="ignore"):
        logp = np.log(p)
        entropy = -np.nansum(p * logp)
    shifted = np.abs(-logp - entropy)
    order = np.argsort(shifted, kind="stable")
    cum = np.cumsum(p[order])
    crossed = np.flatnonzero(cum > mass)
    cut = int(crossed[0]) + 1 if crossed.size else order.size
    keep = np.sort(order[:cut])  # back to likeliest first (the input's order)
    kept = p[keep]
    return ids[keep], kept / kept.sum()


def min_p_filter(ids: np.ndarray, p: np.ndarray, min_p: float) -> tuple[np.ndarray, np.ndarray]:
    """Drop the candidates less likely than ``min_p`` times the likeliest one (``p[0]``);
    ``min_p <= 0`` is off."""
    if min_p <= 0.0 or ids.size <= 1:
        return ids, p
    cut = int(np.count_nonzero(p >= min_p * p[0]))  # p is sorted: the survivors are a prefix
    kept = p[:cut]
    return ids[:cut], kept / kept.sum()
