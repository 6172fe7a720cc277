"""The CUDA kernels' weight decoders, run on the host: ``crates/cuda/kernels/common.cuh`` and
``sparse_matvec.cuh`` compiled as C++ (the inline-PTX f16 conversions swapped for a portable one,
the warp shuffles left out, ``__dp4a`` written out), then every quantized format the GPU takes
decoded weight by weight (``w_<format>``, what ``axpy_rows`` and ``predictor_fc2`` read) and
dotted with x by the 32 lanes of a warp (``lane_dot_<format>`` for lanes 0..31, summed: what
``sparse_matvec`` and ``gate_up`` compute, on x quantized here by numpy to the int16 blocks of
``quantize_x``), against gguf-py's dequantizer on random blocks and the x̂ those blocks stand
for. The rows are handed to the decoders in the device layout (each row's quants first, its
blocks' headers after them: ``crates/cuda/src/repack.rs``), permuted here by numpy from the block
table below. This checks the device code's block layouts and lane split on machines without a
GPU; ``crates/cuda/tests/gpu_kernels.rs`` runs the kernels themselves where there is one.
Skipped without a C++ compiler."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

KERNELS = Path(__file__).resolve().parents[1] / "crates/cuda/kernels"
COMMON = KERNELS / "common.cuh"
#: The quantized formats' integer dots (sparse_matvec.cu's own header).
INT_DOTS = KERNELS / "sparse_matvec.cuh"

#: format -> (weights per block, bytes per block, byte offsets of the block's f16 fields)
FORMATS = {
    "Q8_0": (32, 34, [0]),
    "Q4_0": (32, 18, [0]),
    "Q4_1": (32, 20, [0, 2]),
    "Q5_0": (32, 22, [0]),
    "Q5_1": (32, 24, [0, 2]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
}

#: format -> (quant bytes, header bytes, header first in GGUF's block): the device layout.
DEVICE_SPLIT = {
    "Q8_0": (32, 2, True),
    "Q4_0": (16, 2, True),
    "Q4_1": (16, 4, True),
    "Q5_0": (16, 6, True),
    "Q5_1": (16, 8, True),
    "Q4_K": (128, 16, True),
    "Q5_K": (160, 16, True),
    "Q6_K": (192, 18, False),
}


def to_device(fmt: str, raw: np.ndarray, n_blocks: int) -> np.ndarray:
    """GGUF rows ``[rows, n_blocks * block bytes]`` in the device layout: every block's quants,
    then every block's header."""
    q, h, header_first = DEVICE_SPLIT[fmt]
    blocks = raw.reshape(raw.shape[0], n_blocks, q + h)
    head, quants = (
        (blocks[:, :, :h], blocks[:, :, h:])
        if header_first
        else (blocks[:, :, q:], blocks[:, :, :q])
    )
    rows = raw.shape[0]
    return np.concatenate([quants.reshape(rows, -1), head.reshape(rows, -1)], axis=1)


PRELUDE = r"""
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(unsigned v) { float f; std::memcpy(&f, &v, 4); return f; }
static inline void __syncthreads() {}
static inline unsigned __umulhi(unsigned a, unsigned b) {
    return (unsigned)(((unsigned long long)a * b) >> 32);
}
static inline int __dp4a(int a, int b, int c) {
    for (int k = 0; k < 4; ++k) {
        c += (int)(signed char)(a >> (8 * k)) * (int)(signed char)(b >> (8 * k));
    }
    return c;
}
static float h2f(unsigned short h) {
    const unsigned s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    const float v = e == 0 ? std::ldexp((float)m, -24)
                  : e == 31 ? (m ? NAN : INFINITY)
                  : std::ldexp((float)(m | 1024), (int)e - 25);
    return s ? -v : v;
}
"""

HARNESS = r"""
int main(int argc, char** argv) {
    // argv: format, rows, cols, row bytes; files rows.bin (bytes), xq.bin (x quantized).
    const std::string fmt = argv[1];
    const int rows = atoi(argv[2]), cols = atoi(argv[3]), rb = atoi(argv[4]);
    std::vector<u8> raw(rows * rb);
    std::vector<u8> xq(cols / 32 * XQ_BLOCK);
    FILE* f = fopen("rows.bin", "rb"); fread(raw.data(), 1, raw.size(), f); fclose(f);
    f = fopen("xq.bin", "rb"); fread(xq.data(), 1, xq.size(), f); fclose(f);
    float (*lane)(const u8*, const u8*, int, int) = nullptr;
    float (*w)(const u8*, int, int) = nullptr;
#define PICK(NAME, name) if (fmt == #NAME) { lane = lane_dot_##name; w = w_##name; }
    PICK(Q8_0, q8_0) PICK(Q4_0, q4_0) PICK(Q4_1, q4_1) PICK(Q5_0, q5_0) PICK(Q5_1, q5_1)
    PICK(Q4_K, q4_k) PICK(Q5_K, q5_k) PICK(Q6_K, q6_k)
    if (!lane) return 2;
    FILE* wo = fopen("w.bin", "wb");
    FILE* dout = fopen("dot.bin", "wb");
    for (int r = 0; r < rows; ++r) {
        const u8* row = raw.data() + (size_t)r * rb;
        for (int j = 0; j < cols; ++j) { const float v = w(row, j, cols); fwrite(&v, 4, 1, wo); }
        double s = 0.0;
        for (int l = 0; l < 32; ++l) s += lane(row, xq.data(), cols, l);
        fwrite(&s, 8, 1, dout);
    }
    fclose(wo); fclose(dout);
    return 0;
}
"""


def host_source() -> str:
    """common.cuh as host C++: the inline-PTX conversions replaced, the warp functions (shuffles)
    left out."""
    src = COMMON.read_text()
    for name, repl in (
        (r"float f16_to_f32\(u16 h\)", "float f16_to_f32(u16 h) { return h2f(h); }"),
        (r"u16 f32_to_f16\(float f\)", ""),
        (r"float warp_sum\(float v\)", ""),
        (r"float warp_max\(float v\)", ""),
        (r"void quantize_block_warp\(float v, u8\* xb\)", ""),
    ):
        pattern = r"__device__ __forceinline__ " + name + r" \{.*?\n\}\n"
        src, n = re.subn(pattern, repl + "\n", src, count=1, flags=re.S)
        assert n == 1, f"common.cuh: no definition matching {name}"
    return PRELUDE + src + INT_DOTS.read_text() + HARNESS


@pytest.fixture(scope="module")
def harness(tmp_path_factory) -> Path:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    d = tmp_path_factory.mktemp("cuda_host")
    (d / "harness.cpp").write_text(host_source())
    out = d / "harness"
    cc = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-w", "-o", str(out), str(d / "harness.cpp")],
        capture_output=True,
        text=True,
    )
    assert cc.returncode == 0, cc.stderr[-3000:]
    return out


def quantize_x(x: np.ndarray) -> tuple[bytes, np.ndarray]:
    """x as ``quantize_x`` writes it (80 bytes per 32 values: the high and low signed bytes of
    q = round(x * 32639 / max|x|), ties to even, then the f32 scale, the f32 sums of each half
    and the i32 sum of q), and the values x̂ = scale * q those blocks stand for."""
    out, hat = [], []
    for b in x.reshape(-1, 32).astype(np.float32):
        amax = np.float32(np.abs(b).max())
        inv = np.float32(32639.0) / amax if amax > 0 else np.float32(0.0)
        q = np.rint(b * inv).astype(np.int32)
        h = (q + 128) >> 8
        scale = amax / np.float32(32639.0)
        out += [h.astype(np.int8).tobytes(), (q - 256 * h).astype(np.int8).tobytes()]
        out.append(np.array([scale, b[:16].sum(), b[16:].sum()], dtype=np.float32).tobytes())
        out.append(np.array([q.sum()], dtype=np.int32).tobytes())
        hat.append(scale * q.astype(np.float32))
    return b"".join(out), np.concatenate(hat)


def random_rows(fmt: str, rows: int, n_blocks: int, rng) -> np.ndarray:
    """Random blocks: any bytes are valid quants and scales; the f16 fields get finite values."""
    _, nbytes, f16s = FORMATS[fmt]
    raw = rng.integers(0, 256, size=(rows, n_blocks, nbytes), dtype=np.uint8)
    for off in f16s:
        v = (rng.normal(size=(rows, n_blocks)) * 0.05).astype(np.float16)
        raw[:, :, off : off + 2] = v.view(np.uint8).reshape(rows, n_blocks, 2)
    return raw.reshape(rows, n_blocks * nbytes)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_device_decoders_match_gguf_py(harness, fmt, tmp_path):
    block, nbytes, _ = FORMATS[fmt]
    rng = np.random.default_rng(sum(map(ord, fmt)))
    rows, n_blocks = 5, 7 if block == 256 else 13  # odd block counts; a lane may get none
    cols = n_blocks * block
    raw = random_rows(fmt, rows, n_blocks, rng)
    x = rng.normal(size=cols).astype(np.float32)
    (tmp_path / "rows.bin").write_bytes(to_device(fmt, raw, n_blocks).tobytes())
    xq, x_hat = quantize_x(x)
    (tmp_path / "xq.bin").write_bytes(xq)
    args = [str(harness), fmt, str(rows), str(cols), str(n_blocks * nbytes)]
    subprocess.run(args, cwd=tmp_path, check=True)
    got_w = np.fromfile(tmp_path / "w.bin", dtype=np.float32).reshape(rows, cols)
    got_dot = np.fromfile(tmp_path / "dot.bin", dtype=np.float64)
    want_w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[fmt]).reshape(rows, cols)
    # Weight by weight, the same float operations as ggml: bit for bit.
    np.testing.assert_array_equal(got_w, want_w.astype(np.float32))
    # The dot of the x̂ the integer dots multiply (Q4_1/Q5_1's and the K-quants' min terms take
    # the blocks' sums of x itself: within x̂'s rounding of it).
    want_dot = want_w.astype(np.float64) @ x_hat.astype(np.float64)
    scale = np.abs(want_w.astype(np.float64) * x).sum(axis=1)
    assert np.all(np.abs(got_dot - want_dot) <= 1e-5 * scale), (got_dot, want_dot)
