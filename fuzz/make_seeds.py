"""Regenerate the committed seed corpus ``fuzz/seeds/<target>/`` from the project's own writers.

Each seed is a small valid file (a few KB at most), so the fuzzers start from inputs that reach
deep into every parser. ``python fuzz/make_seeds.py`` rewrites the files named here and leaves
other files in the folders alone (regression inputs of past findings live beside them as
``regress-*``). The Rust targets take a few leading bytes before the file (see their sources).
"""

from __future__ import annotations

import json
import sys
import tempfile
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "python"))

from powerinfer_rs.formats.input_thresholds import (  # noqa: E402
    InputThresholds,
    save_input_thresholds,
)
from powerinfer_rs.formats.plan import Plan, save_plan  # noqa: E402
from powerinfer_rs.formats.predictors import save_predictors  # noqa: E402
from powerinfer_rs.formats.profile import write_profile  # noqa: E402
from powerinfer_rs.formats.samples import SampleWriter, shard_path  # noqa: E402
from powerinfer_rs.formats.thresholds import ThresholdFile, save_thresholds  # noqa: E402
from powerinfer_rs.loading.torch_pt import save_pt  # noqa: E402
from powerinfer_rs.predictors.model import LayerPredictor, PredictorSet  # noqa: E402
from powerinfer_rs.testing.powerinfer_files import write_powerinfer_gguf  # noqa: E402


def tiny_gguf(path: Path, powerinfer: bool) -> None:
    """A GGUF header with one key of every value type and three small tensors."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("a.u32", 7)
    w.add_int8("a.i8", -3)
    w.add_float32("a.f32", 0.5)
    w.add_float64("a.f64", 1.5)
    w.add_bool("a.bool", True)
    w.add_uint64("a.u64", 1 << 40)
    w.add_string("a.str", "héllo")
    w.add_array("a.ints", [1, 2, 3])
    w.add_array("a.strs", ["x", "yz"])
    w.add_array("a.nested", [[1, 2], [3]])
    w.add_tensor("t.f32", np.arange(8, dtype=np.float32).reshape(2, 4))
    w.add_tensor("t.f16", np.ones(4, dtype=np.float16))
    q = gguf.quants.quantize(
        np.linspace(-1, 1, 32, dtype=np.float32)[None], gguf.GGMLQuantizationType.Q8_0
    )
    w.add_tensor("t.q8", q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    if powerinfer:
        with open(path, "r+b") as f:
            f.write(b"PWRI")


def tiny_plan() -> Plan:
    """A plan for :func:`harness.plan_shape` (2 layers of 16 neurons; the Rust seeds prefix it
    with those two numbers), part of it on the GPU."""
    from harness import plan_shape

    from powerinfer_rs.formats.profile import synthetic_profile
    from powerinfer_rs.planning import load_hardware, make_plan

    profile = synthetic_profile(2, 16, 100, seed=0, model_fingerprint="fp")
    hw = load_hardware("rtx4090")
    return make_plan(
        plan_shape(), profile, hw, 22_000, bucket=4, context=32, min_neurons=0, solver="greedy"
    )


def predictor_set(dtype: str) -> PredictorSet:
    """A two-layer predictor set of ``dtype`` (seeded weights)."""
    rng = np.random.default_rng(1)
    layers = {
        i: LayerPredictor(rng.standard_normal((2, 8)), rng.standard_normal((16, 2)), 0.25 * i)
        for i in range(2)
    }
    return PredictorSet(layers, "fp", 0.99, "ffn_inp", dtype, {"note": "seed"})


def put_seed(seeds: Path, target: str, name: str, data: bytes) -> None:
    """Write seed ``name`` of ``target`` under ``seeds``."""
    d = seeds / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(data)


def gguf_seeds(put, tmp: Path) -> None:
    """gguf_file (plain and PWRI headers), powerinfer_gguf, gguf_model (a llama, a mixture of
    experts)."""
    from powerinfer_rs.testing.synth import write_gguf_model

    for pi in (False, True):
        tiny_gguf(tmp / "g.gguf", pi)
        put("gguf_file", f"{'pwri' if pi else 'gguf'}-tiny.gguf", (tmp / "g.gguf").read_bytes())
    shape = dict(dim=8, ffn=16, layers=1, heads=2, kv_heads=1, vocab=260)
    write_powerinfer_gguf(tmp / "pi.gguf", **shape, ranks=2, dtype="F16")
    put("powerinfer_gguf", "pwri-d8-f16-l1.gguf", (tmp / "pi.gguf").read_bytes())
    plain = write_gguf_model(tmp / "m.gguf", dtype="F16", **shape)
    put("gguf_model", "llama-d8-f16-l1.gguf", plain.read_bytes())
    # A mixture of experts (merged 3-D expert tensors, the router on the layer input).
    moe = dict(shape, arch="smallthinker", activation="relu", experts=4, experts_used=2)
    moe_file = write_gguf_model(tmp / "moe.gguf", dtype="F16", **moe)
    put("gguf_model", "smallthinker-d8-f16-l1-e4.gguf", moe_file.read_bytes())


def tensor_file_seeds(put, tmp: Path) -> None:
    """safetensors_mmap, torch_pt and powerinfer_dirs (a config and the .pt files)."""
    from safetensors.numpy import save_file

    save_file(
        {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float16)},
        str(tmp / "s.safetensors"),
        {"k": "v"},
    )
    put("safetensors_mmap", "two-tensors.safetensors", (tmp / "s.safetensors").read_bytes())

    rng = np.random.default_rng(0)
    sd = {"fc1.weight": rng.standard_normal((2, 8)), "fc2.weight": rng.standard_normal((16, 2))}
    sd16 = {k: v.astype(np.float16) for k, v in sd.items()}
    pt_sd = save_pt(tmp / "model_0.pt", sd16).read_bytes()
    pt_act = save_pt(tmp / "activation_0.pt", np.arange(16, dtype=np.int64)).read_bytes()
    put("torch_pt", "state-dict-f16.pt", pt_sd)
    put("torch_pt", "tensor-i64.pt", pt_act)
    put("torch_pt", "tensor-f32-2d.pt", save_pt(tmp / "x.pt", sd["fc2.weight"]).read_bytes())
    put(
        "powerinfer_dirs",
        "0-config.json",
        b"\x00" + json.dumps({"sparse_threshold": 0.5}).encode(),
    )
    put("powerinfer_dirs", "1-model_0.pt", b"\x01" + pt_sd)
    put("powerinfer_dirs", "2-activation_0.pt", b"\x02" + pt_act)


def format_seeds(put, tmp: Path) -> None:
    """Our own formats: plan, plan_file, profile, thresholds, predictors, samples."""
    plan = save_plan(tiny_plan(), tmp / "PLAN.safetensors").read_bytes()
    put("plan", "plan-l2-f16.safetensors", plan)
    put("plan_file", "plan-l2-f16", bytes([2, 16]) + plan)

    write_profile(tmp / "prof", [np.arange(16), np.arange(16)[::-1]], 20, model_fingerprint="fp")
    put(
        "profile",
        "profile-l2-f16.safetensors",
        (tmp / "prof" / "profile.safetensors").read_bytes(),
    )

    tf = ThresholdFile([0.1, 0.2], "fp", "silu", 0.5, [0.5, 0.4], ["c.txt"], 100, {"x": 1})
    put("thresholds", "thresholds-l2.json", save_thresholds(tmp / "t.json", tf).read_bytes())
    itf = InputThresholds([[0.1, 0.2, 0.3, 0.01]] * 2, 0.05, "wina", "fp", 0.4, corpus=["c"])
    itf_path = save_input_thresholds(tmp / "i.json", itf)
    put("thresholds", "input-thresholds-l2.json", itf_path.read_bytes())

    for dt in ("F16", "F32"):
        p = save_predictors(tmp / f"p{dt}.safetensors", predictor_set(dt))
        put("predictors", f"predictors-{dt.lower()}.safetensors", p.read_bytes())

    with SampleWriter(tmp / "smp", 1, 4, 8, shard_rows=2) as w:
        w.add(0, np.ones((3, 4), np.float32), np.eye(3, 8, dtype=bool))
    sdir = tmp / "smp" / "samples"
    put("samples", "0-meta.json", b"\x00" + (sdir / "meta.json").read_bytes())
    put("samples", "1-shard.npz", b"\x01" + shard_path(sdir, 0, 0).read_bytes())


def directory_seeds(put, tmp: Path) -> None:
    """prepared_dir, neuron_store (a valid store's header, and the store cut short) and
    hf_dir."""
    from harness import PREPARED_FILES, PREPARED_MODEL, prepared_dir, store_engine

    from powerinfer_rs.testing.synth import write_hf_model

    _, _, manifest = prepared_dir(tmp / "prepared")
    put("prepared_dir", "0-prepared.json", b"\x00" + json.dumps(manifest, indent=2).encode())
    put("prepared_dir", "1-thresholds.json", b"\x01" + PREPARED_FILES["thresholds.json"])
    put("prepared_dir", "2-model.gguf", b"\x02" + PREPARED_MODEL)

    # neuron_store: byte 0 even, the valid store's header fields (the clusters follow);
    # odd, a whole file (the header alone: a store cut short).
    _, store = store_engine(tmp)
    put("neuron_store", "header", b"\x00" + store[:128])
    put("neuron_store", "cut", b"\x01" + store[:4096])

    hf = tmp / "hf"
    write_hf_model(hf, dtype="f32", dim=16, ffn=32, layers=1, heads=2, kv_heads=1, vocab=260)
    for i, name in enumerate(["config.json", "tokenizer_config.json", "generation_config.json"]):
        put("hf_dir", f"{i}-{name}", bytes([i]) + (hf / name).read_bytes())
    index = {"metadata": {}, "weight_map": {"model.norm.weight": "model.safetensors"}}
    put("hf_dir", "3-model.safetensors.index.json", b"\x03" + json.dumps(index).encode())
    put("hf_dir", "4-tokenizer.json", b"\x04" + (hf / "tokenizer.json").read_bytes())


def rust_seeds(put) -> None:
    """The Rust targets' byte-built seeds: weight_rows and neuron_store_header."""
    # weight_rows: dtype, rows, column blocks, then the bytes (see fuzz_targets/weight_rows.rs)
    q8 = (np.float16(0.5).tobytes() + bytes(range(32))) * 2
    put("weight_rows", "f32-2x3", bytes([0, 2, 3]) + np.arange(6, dtype=np.float32).tobytes())
    put("weight_rows", "f16-1x4", bytes([1, 1, 4]) + np.ones(4, np.float16).tobytes())
    put("weight_rows", "q8_0-2x32", bytes([3, 2, 1]) + q8)
    put("weight_rows", "q4_1-1x32", bytes([5, 1, 1]) + np.float16(1).tobytes() * 2 + bytes(16))
    # neuron_store_header: byte 0 (odd: the file is longer than the bytes given), then a
    # store's header as crates/engine/src/neuron_store/format.rs writes it: F16 gate/up and
    # Q8_0 down_t (indices into DType::ALL), and a gate-less layer (up 255).
    fp = b"fnv1a:0123456789abcdef"
    head = b"PIRSNST1" + np.array([2, 2], "<u4").tobytes() + np.array([64, 160, 4], "<u8").tobytes()
    head += np.array([len(fp)], "<u4").tobytes() + fp + bytes([1, 1, 3, 1, 255, 3])
    h = 0xCBF29CE484222325  # then the FNV-1a hash of every byte before it
    for b in head:
        h = ((h ^ b) * 0x100000001B3) % (1 << 64)
    head += h.to_bytes(8, "little")
    put("neuron_store_header", "store-l2-d64-f160-c4", b"\x01" + head.ljust(4096, b"\0"))
    put("neuron_store_header", "store-cut", b"\x00" + head.ljust(4096, b"\0"))


def main() -> int:
    """Write every seed and print each target's seed bytes."""
    seeds = ROOT / "seeds"
    put = partial(put_seed, seeds)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        gguf_seeds(put, tmp)
        tensor_file_seeds(put, tmp)
        format_seeds(put, tmp)
        directory_seeds(put, tmp)
    rust_seeds(put)
    for d in sorted(seeds.iterdir()):
        print(f"{d.name}: {sum(f.stat().st_size for f in d.iterdir())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
