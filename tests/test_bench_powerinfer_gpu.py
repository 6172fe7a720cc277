"""benchmarks/bench_powerinfer_gpu.py: PowerInfer's ``main`` run and read as the bench does, on a
stand-in binary that prints PowerInfer's log lines (its printf formats, generated text that is
not valid UTF-8 included); a refused GPU index is an error, not a silent CPU-only run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bench_powerinfer_gpu as bench  # noqa: E402

LOG = r"""
echo "llm_load_sparse_model_tensors: VRAM used: 1320.42 MB" >&2
echo "llama_new_context_with_model: VRAM kv self = 128.00 MB" >&2
echo "llm_load_gpu_split: offloaded 54.10 MiB of FFN weights to GPU" >&2
printf 'The press \xff\xfe began\n'
P="llama_print_timings:"
echo "$P prompt eval time =      10.00 ms /    12 tokens (    0.83 ms per token,  1200.00 \
tokens per second)" >&2
echo "$P        eval time =     400.00 ms /    31 runs   (   12.90 ms per token,    77.50 \
tokens per second)" >&2
echo "$*" > "$(dirname "$0")/args"
"""


def fake(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "main"
    p.write_text("#!/bin/bash\n" + body)
    p.chmod(0o755)
    return p


def test_powerinfer_main_is_run_with_the_budget_and_read(tmp_path):
    binary = fake(tmp_path, LOG)
    tps, placed = bench.run_powerinfer(str(binary), tmp_path / "m.gguf", 3 << 29, 160, 16, 32)
    assert tps == pytest.approx(31 / 0.4)  # decode only: not the prompt's line
    assert placed == {"ffn_mib": 54.1, "dense_mib": 1320.42, "kv_mib": 128.0}
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--vram-budget") + 1] == "1.500000"  # GiB, as PowerInfer reads it
    assert args[args.index("-c") + 1] == "160" and args[args.index("-t") + 1] == "16"
    assert args[args.index("-n") + 1] == "32" and "--ignore-eos" in args


def test_a_refused_index_or_a_failed_run_is_an_error(tmp_path):
    refused = LOG + (
        'echo "llm_load_gpu_split_with_budget: error: failed to apply previously generated '
        "gpu split from 'm.gguf.generated.gpuidx'\" >&2\n"
    )
    with pytest.raises(RuntimeError, match="refused the GPU index"):
        bench.run_powerinfer(str(fake(tmp_path, refused)), tmp_path / "m.gguf", 1 << 30, 64, 2, 8)
    with pytest.raises(RuntimeError, match="failed"):
        bench.run_powerinfer(str(fake(tmp_path, "exit 3\n")), tmp_path / "m.gguf", 1, 64, 2, 8)
    with pytest.raises(RuntimeError, match="no 'eval time' line"):
        bench.powerinfer_eval_tps("llama_print_timings: prompt eval time = 1.0 ms / 2 tokens")
