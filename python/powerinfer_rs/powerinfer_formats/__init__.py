"""Files PowerInfer users already have (SJTU-IPADS/PowerInfer), read without torch.

* :func:`load_powerinfer_gguf` -- PowerInfer GGUF (``PWRI`` magic) -> model + predictors.
* :func:`import_powerinfer_predictors` -- ``config.json`` + ``model_{i}.pt`` directories.
* :func:`import_powerinfer_activations` -- ``activation_{i}.pt`` directories -> a profile.
* :func:`load_pt` / :func:`save_pt` -- a minimal, allow-listed reader and a writer for
  ``torch.save`` zip files.
* :mod:`.testgen` -- writers of all of these for tests.

PowerInfer's predictor semantics (``llama.cpp`` ``llm_build_ffn_sparse``, ``ggml.c`` sparse
kernels): ``idx = fc2 @ relu(fc1 @ ffn_inp)`` on the residual stream *before* ``ffn_norm``;
neuron ``i`` is computed iff ``idx[i] >= sparse_threshold`` (raw logit, no sigmoid; default 0).
"""

from __future__ import annotations

from .dirs import import_powerinfer_activations, import_powerinfer_predictors, numbered_files
from .pwri_gguf import (
    SPARSE_THRESHOLD_KEY,
    PowerInferModel,
    dequantize_tensor,
    is_powerinfer_gguf,
    load_powerinfer_gguf,
)
from .torch_pt import load_pt, load_state_dict, load_tensor, save_pt

__all__ = [
    "SPARSE_THRESHOLD_KEY",
    "PowerInferModel",
    "dequantize_tensor",
    "import_powerinfer_activations",
    "import_powerinfer_predictors",
    "is_powerinfer_gguf",
    "load_powerinfer_gguf",
    "load_pt",
    "load_state_dict",
    "load_tensor",
    "numbered_files",
    "save_pt",
]
