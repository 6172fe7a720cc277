"""Fuzz the activation profile reader ``formats.profile.read_profile`` (safetensors)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, safetensors_mutator, temp_file  # noqa: E402


def load():
    from powerinfer_rs.formats.profile import read_profile

    def one_input(data: bytes) -> None:
        read_profile(temp_file("profile.safetensors", data))

    return one_input


if __name__ == "__main__":
    fuzz_main(load, mutator=safetensors_mutator)
