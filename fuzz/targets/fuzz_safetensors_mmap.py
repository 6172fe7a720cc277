"""Fuzz the memory-mapped safetensors reader (``loading.safetensors_mmap.read_safetensors``)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, safetensors_mutator, temp_file  # noqa: E402


def load():
    from powerinfer_rs.loading.safetensors_mmap import read_safetensors

    def one_input(data: bytes) -> None:
        for t in read_safetensors(temp_file("in.safetensors", data)).values():
            assert t.data.nbytes == len(t.data), t.name

    return one_input


if __name__ == "__main__":
    fuzz_main(load, mutator=safetensors_mutator)
