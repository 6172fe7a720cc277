"""Activation predictors: per layer a bias-free low-rank MLP that says, before any FFN row is
read, which neurons will fire (PowerInfer §5.1).

* :class:`LayerPredictor` -- ``logits = fc2 @ relu(fc1 @ x)``, active when ``logits >=
  threshold``; :class:`PredictorSet` -- one per layer plus what they were made for.
* :func:`train_layer` -- numpy training with adaptive rank and threshold tuning.
* :func:`train_predictors` -- all layers of a profile directory, resumable; :func:`format_table`.
* :func:`save_predictors` / :func:`load_predictors` -- ``predictors.safetensors``.
"""

from __future__ import annotations

from .io import FORMAT, load_predictors, save_predictors
from .metrics import MaskStats, mask_stats, tune_threshold
from .model import PREDICTOR_INPUTS, LayerPredictor, PredictorSet, param_bytes
from .pipeline import format_table, layer_ffn_bytes, train_predictors
from .sizing import LayerActivity, initial_rank, layer_activity, rank_cap
from .train import TrainConfig, fit_mlp, train_layer

__all__ = [
    "FORMAT",
    "PREDICTOR_INPUTS",
    "LayerActivity",
    "LayerPredictor",
    "MaskStats",
    "PredictorSet",
    "TrainConfig",
    "fit_mlp",
    "format_table",
    "initial_rank",
    "layer_activity",
    "layer_ffn_bytes",
    "load_predictors",
    "mask_stats",
    "param_bytes",
    "rank_cap",
    "save_predictors",
    "train_layer",
    "train_predictors",
    "tune_threshold",
]
