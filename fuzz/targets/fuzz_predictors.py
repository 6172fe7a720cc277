"""Fuzz the predictor file reader ``formats.predictors.load_predictors`` (safetensors)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import file_reader, fuzz_main, safetensors_mutator  # noqa: E402

load = file_reader("powerinfer_rs.formats.predictors", "load_predictors", "predictors.safetensors")

if __name__ == "__main__":
    fuzz_main(load, mutator=safetensors_mutator)
