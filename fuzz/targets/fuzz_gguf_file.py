"""Fuzz the GGUF header / metadata / tensor-info parser (``loading.gguf_file.GGUFFile``), with
PowerInfer's ``PWRI`` magic allowed."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    from powerinfer_rs.loading.gguf_file import GGUFFile

    def one_input(data: bytes) -> None:
        gf = GGUFFile(temp_file("in.gguf", data), allow_powerinfer=True)
        for t in gf.tensors:  # every reported tensor must lie inside the file
            assert t.nbytes is None or t.offset + t.nbytes <= len(data), t

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
