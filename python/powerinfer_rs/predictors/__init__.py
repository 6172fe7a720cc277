"""Activation predictors: per layer a bias-free low-rank MLP that says, before any FFN row is
read, which neurons will fire (PowerInfer §5.1).

* :class:`LayerPredictor` -- ``logits = fc2 @ relu(fc1 @ x)``, active when ``logits >=
  threshold``; :class:`PredictorSet` -- one per layer plus what they were made for.
* :func:`train_layer` -- numpy training with adaptive rank and threshold tuning.
* :func:`train_predictors` -- all layers of a profile directory, resumable; :func:`format_table`.

The file (``predictors.safetensors``) is read and written by
:mod:`powerinfer_rs.formats.predictors`.
"""

from __future__ import annotations

from .._lazy import lazy_exports

_EXPORTS = {
    "metrics": ["MaskStats", "mask_stats", "tune_threshold"],
    "model": ["PREDICTOR_INPUTS", "LayerPredictor", "PredictorSet", "param_bytes"],
    "pipeline": ["format_table", "layer_ffn_bytes", "train_predictors"],
    "sizing": ["LayerActivity", "initial_rank", "layer_activity", "rank_cap"],
    "train": ["TrainConfig", "fit_mlp", "train_layer"],
}

__all__, __getattr__ = lazy_exports(__name__, _EXPORTS)
