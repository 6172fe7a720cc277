"""Fuzz the threshold file readers (JSON): ``formats.thresholds.load_thresholds`` and the input
mode's ``formats.input_thresholds.load_input_thresholds``, each on the same bytes."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness import fuzz_main, temp_file  # noqa: E402


def load():
    from powerinfer_rs.errors import PowerInferError
    from powerinfer_rs.formats.input_thresholds import load_input_thresholds
    from powerinfer_rs.formats.thresholds import load_thresholds

    def one_input(data: bytes) -> None:
        # Both readers get the bytes; the input ends in a result when either takes it, else in
        # the input reader's typed refusal.
        path = temp_file("thresholds.json", data)
        try:
            load_thresholds(path)
        except PowerInferError:
            load_input_thresholds(path)
            return
        try:
            load_input_thresholds(path)
        except PowerInferError:
            pass

    return one_input


if __name__ == "__main__":
    fuzz_main(load)
