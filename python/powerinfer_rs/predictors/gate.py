"""A layer's gate weights as float32, and whether its neurons fire on the gate alone: what the
closed-form predictor (:mod:`.train_svd`) needs to be chosen over the trained one."""

from __future__ import annotations

from typing import Any

import numpy as np

from .svd import firing_agreement

#: The share of ``(token, neuron)`` pairs where ``gate @ x > 0`` must agree with the profiled
#: mask for the gate to be taken as the firing rule (the profile runs the quantized model, so
#: pre-activations within rounding of 0 may land either side).
MIN_AGREEMENT = 0.995
#: Sample rows the agreement is measured on.
AGREEMENT_ROWS = 2048


def tensor_f32(t: Any) -> np.ndarray:
    """A weight tensor (:class:`~powerinfer_rs.loading.TensorData`) as float32 ``[rows, cols]``,
    dequantized from its file format by the engine."""
    from .. import _core

    raw = np.asarray(t.data).reshape(t.rows, t.row_bytes)
    return np.asarray(_core.dequantize(t.dtype, raw, t.cols), dtype=np.float32)


def gate_weights(model: Any, layer: int) -> np.ndarray | None:
    """``[ffn, dim]`` float32 weights of ``layer``'s gate (its up projection in a gate-less
    family); None when the model has neither."""
    t = model.tensors.get(f"blk.{layer}.ffn_gate") or model.tensors.get(f"blk.{layer}.ffn_up")
    return None if t is None else tensor_f32(t)


def fires_on_gate(gate: np.ndarray, x: np.ndarray, mask: np.ndarray) -> tuple[bool, float]:
    """Whether the samples' masks are ``gate @ x > 0`` (ReLU), and the agreement measured on
    their first :data:`AGREEMENT_ROWS` rows."""
    n = min(AGREEMENT_ROWS, x.shape[0])
    agree = firing_agreement(gate, x[:n], mask[:n])
    return agree >= MIN_AGREEMENT, agree
