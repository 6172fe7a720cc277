"""Fuzz the torch-free ``.pt`` reader (``loading.torch_pt.load_pt``): a zip archive holding an
allow-listed pickle and raw storages (PowerInfer's predictor and activation files)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import file_reader, fuzz_main  # noqa: E402

load = file_reader("powerinfer_rs.loading.torch_pt", "load_pt", "in.pt")

if __name__ == "__main__":
    fuzz_main(load)
