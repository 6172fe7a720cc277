"""Fuzz PowerInfer's model file reader (``loading.powerinfer_gguf.load_powerinfer_gguf``): the
``PWRI`` GGUF with its metadata, tokenizer, tensors and per-layer predictors. A loaded model
must carry no NaN or infinity where the engine takes the values as they are (threshold,
predictor weights, config numbers)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    import math

    import numpy as np

    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf

    def one_input(data: bytes) -> None:
        pm = load_powerinfer_gguf(temp_file("in.gguf", data))
        cfg = pm.model.config
        assert math.isfinite(pm.sparse_threshold), pm.sparse_threshold
        assert math.isfinite(cfg.rms_eps) and math.isfinite(cfg.rope_theta), cfg
        for pr in pm.predictors.layers.values():
            assert np.isfinite(pr.fc1).all() and np.isfinite(pr.fc2).all()

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
