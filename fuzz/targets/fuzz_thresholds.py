"""Fuzz the threshold file reader ``formats.thresholds.load_thresholds`` (JSON)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    from powerinfer_rs.formats.thresholds import load_thresholds

    def one_input(data: bytes) -> None:
        load_thresholds(temp_file("thresholds.json", data))

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
