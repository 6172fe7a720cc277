"""Fuzz PowerInfer's predictor and activation directories (``loading.powerinfer_dirs``).

The first byte picks the file the rest of the input becomes, the other files are valid:
0 - ``config.json`` of a predictor directory; 1 - its ``model_0.pt``; 2 - ``activation_0.pt``
of an activation directory (beside a valid ``activation_1.pt``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, tmp_dir, write  # noqa: E402


def load():
    import numpy as np

    from powerinfer_rs.loading.powerinfer_dirs import (
        import_powerinfer_activations,
        import_powerinfer_predictors,
    )
    from powerinfer_rs.loading.torch_pt import save_pt

    pred, act = tmp_dir() / "pred", tmp_dir() / "act"
    pred.mkdir(exist_ok=True)
    act.mkdir(exist_ok=True)
    rng = np.random.default_rng(0)
    fc = {"fc1.weight": rng.standard_normal((4, 8)), "fc2.weight": rng.standard_normal((16, 4))}
    good_pt = save_pt(tmp_dir() / "good.pt", {k: v.astype(np.float16) for k, v in fc.items()})
    save_pt(act / "activation_1.pt", np.arange(16, dtype=np.int64))
    good_cfg = b'{"sparse_threshold": 0.5}'

    def one_input(data: bytes) -> None:
        if not data:
            return
        mode, body = data[0] % 3, data[1:]
        if mode == 2:
            write(act / "activation_0.pt", body)
            import_powerinfer_activations(act)
            return
        write(pred / "config.json", body if mode == 0 else good_cfg)
        write(pred / "model_0.pt", body if mode == 1 else good_pt.read_bytes())
        import_powerinfer_predictors(pred)

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
