"""The bandwidth model's table for a 7B-shaped model (Llama-2-7B's shape, ReLU, Q4_0; a
synthetic power-law profile) planned at a VRAM budget on a hardware profile: bytes per token
per kernel class and the floor at the profile's memory bandwidth. The GPU issue measures each
kernel's achieved bytes/s against these.

usage: python benchmarks/gpu/bandwidth_model.py [--hardware h100-pcie] [--budget 8GiB]
       [--mode predictor] [--context 4096]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

from powerinfer_rs.formats.profile import synthetic_profile  # noqa: E402
from powerinfer_rs.planning import load_hardware, make_plan  # noqa: E402
from powerinfer_rs.planning.bandwidth import MODES, format_traffic, gpu_traffic  # noqa: E402
from powerinfer_rs.planning.model_shape import ModelShape  # noqa: E402
from powerinfer_rs.planning.sizes import parse_bytes  # noqa: E402
from powerinfer_rs.testing.synth_model import SynthSpec  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h100-pcie")
    ap.add_argument("--budget", default="8GiB")
    ap.add_argument("--mode", choices=MODES, default="predictor")
    ap.add_argument("--context", type=int, default=4096)
    a = ap.parse_args(argv)
    cfg = SynthSpec(4096, 11008, 32, 32, 32, 32000, max_context=4096).model_config()
    shape = ModelShape.from_config(cfg, "Q4_0")
    prof = synthetic_profile(cfg.n_layers, cfg.ffn_dim, 2000, seed=0)
    hw = load_hardware(a.hardware)
    plan = make_plan(shape, prof, hw, parse_bytes(a.budget), context=a.context, solver="greedy",
                     check_fingerprint=False)  # fmt: skip
    traffic = gpu_traffic(plan, shape, prof, a.mode)
    print(f"7B shape (Q4_0, ReLU), synthetic profile, {a.budget} on {hw.name} "
          f"({hw.gpu_mem_bw} GB/s, launch {hw.launch_latency_us} us), mode {a.mode}, "
          f"context {a.context}")  # fmt: skip
    print(format_traffic(traffic, hw.gpu_mem_bw, hw.launch_latency_us))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
