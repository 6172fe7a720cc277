"""Fuzz the plan file reader ``formats.plan.load_plan`` (``PLAN.safetensors``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    from powerinfer_rs.formats.plan import load_plan

    def one_input(data: bytes) -> None:
        load_plan(temp_file("PLAN.safetensors", data))

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
