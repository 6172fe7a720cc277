"""Fuzz PowerInfer's model file reader (``loading.powerinfer_gguf.load_powerinfer_gguf``): the
``PWRI`` GGUF with its metadata, tokenizer, tensors and per-layer predictors."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    from powerinfer_rs.loading.powerinfer_gguf import load_powerinfer_gguf

    def one_input(data: bytes) -> None:
        load_powerinfer_gguf(temp_file("in.gguf", data))

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
