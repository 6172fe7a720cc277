"""The test-file tools of the lattice i-quants: ``testing.ggml_quantizer`` (llama.cpp's own
quantizer functions with an importance matrix, through ggml's C API) writes files llama.cpp
reads, whose tensors gguf-py decodes to ggml's own ``to_float``; and the codebooks in
``crates/core/src/lattice_grids_data.rs`` are gguf-py's (``tools/gen_lattice_grids.py``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
llama_cpp = pytest.importorskip("llama_cpp")

from powerinfer_rs.testing.ggml_quantizer import ggml_dequantize, quantize_gguf  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


def test_lattice_grids_are_gguf_pys():
    run = subprocess.run(
        [sys.executable, str(ROOT / "tools/gen_lattice_grids.py"), "--check"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr


@pytest.mark.parametrize("dtype", ["IQ2_XXS", "IQ3_S"])
def test_quantized_file_reads_back(synth_gguf, tmp_path, dtype):
    src = synth_gguf("F32", dim=256, ffn=256, heads=4, kv_heads=2, seed=3)
    dst = quantize_gguf(src, tmp_path / "q.gguf", dtype)
    f32 = {t.name: np.asarray(t.data).reshape(-1) for t in gguf.GGUFReader(src).tensors}
    quantized = [t for t in gguf.GGUFReader(dst).tensors if t.tensor_type.name == dtype]
    assert {t.name for t in quantized} >= {"blk.0.attn_q.weight", "blk.1.ffn_down.weight"}
    for t in quantized:
        raw = np.ascontiguousarray(t.data).tobytes()
        ours = ggml_dequantize(dtype, raw, int(t.n_elements))
        np.testing.assert_array_equal(ours, gguf.quants.dequantize(t.data, t.tensor_type).ravel())
        err = np.linalg.norm(ours - f32[t.name]) / np.linalg.norm(f32[t.name])
        assert 0 < err < 0.5, (t.name, err)
    model = llama_cpp.Llama(str(dst), n_ctx=32, verbose=False)
    assert model.n_vocab() == 300
