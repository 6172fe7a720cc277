"""Fuzz the plan file reader ``formats.plan.load_plan`` (``PLAN.safetensors``): alone, and
against a model (the fingerprint, shape and GPU byte accounting checks) and a VRAM budget."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, plan_shape, safetensors_mutator, temp_file  # noqa: E402


def load():
    from powerinfer_rs.formats.plan import load_plan

    shape = plan_shape()

    def one_input(data: bytes) -> None:
        path = temp_file("PLAN.safetensors", data)
        load_plan(path)
        load_plan(path, shape, budget_bytes=1 << 30)

    return one_input


if __name__ == "__main__":
    fuzz_main(load, mutator=safetensors_mutator)
