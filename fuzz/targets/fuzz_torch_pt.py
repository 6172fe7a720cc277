"""Fuzz the torch-free ``.pt`` reader (``loading.torch_pt.load_pt``): a zip archive holding an
allow-listed pickle and raw storages (PowerInfer's predictor and activation files)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    from powerinfer_rs.loading.torch_pt import load_pt

    def one_input(data: bytes) -> None:
        load_pt(temp_file("in.pt", data))

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
