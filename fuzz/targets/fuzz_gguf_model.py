"""Fuzz the GGUF model loader (``loading.load_model`` on a ``.gguf`` file): metadata to config
for every supported architecture family, tokenizer, tensor views and their checks. A loaded
model must carry no NaN or infinity in its config numbers."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    import math

    from powerinfer_rs.loading import load_model

    def one_input(data: bytes) -> None:
        cfg = load_model(temp_file("in.gguf", data)).config
        assert math.isfinite(cfg.rms_eps) and math.isfinite(cfg.rope_theta), cfg

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
