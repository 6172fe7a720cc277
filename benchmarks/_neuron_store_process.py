"""bench_neuron_store.py's engine processes: the memory cgroup they run in, the page cache dropped
before each, one engine's run as a child process (printing one JSON line), and the parent's
side that starts it inside the cgroup."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

CGROUP = "powerinfer_rs_bench"


def drop_cache(*paths: Path) -> None:
    """Drop the files' pages from the page cache (POSIX_FADV_DONTNEED)."""
    for p in paths:
        if p.exists():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


class Cgroup:
    """A memory cgroup (v2 or v1) with a limit; ``add(pid)`` places a process in it."""

    def __init__(self, limit: int) -> None:
        v2 = Path("/sys/fs/cgroup/cgroup.controllers").exists()
        base = Path("/sys/fs/cgroup") if v2 else Path("/sys/fs/cgroup/memory")
        self.path = base / CGROUP
        self.path.mkdir(exist_ok=True)
        knob = "memory.max" if v2 else "memory.limit_in_bytes"
        (self.path / knob).write_text(str(limit))

    def add(self, pid: int) -> None:
        (self.path / "cgroup.procs").write_text(str(pid))

    def close(self) -> None:
        try:
            self.path.rmdir()
        except OSError:
            pass


def child(args: argparse.Namespace) -> int:
    """One engine's run inside the cgroup: prints one JSON line."""
    prompt = [int(t) for t in np.random.default_rng(1).integers(3, args.vocab - 3, 8)]
    if args.child == "llama":
        import llama_cpp.llama_cpp as lc
        from llama_cpp import Llama

        # llama.cpp's CPU backend copies weights it repacks ("extra buffer types", on by
        # default; `--no-repack` on its command line) into anonymous memory, which a limit of a
        # third of the model does not hold (the OOM killer ended it): off, it reads every weight
        # from its memory map, as this comparison intends. llama-cpp-python has no argument for
        # it, so its default model parameters are wrapped.
        defaults = lc.llama_model_default_params

        def mmap_only():
            p = defaults()
            p.use_extra_bufts = False
            return p

        lc.llama_model_default_params = mmap_only
        llm = Llama(str(args.model), n_ctx=256, n_threads=args.threads, verbose=False)
        llm.eval(prompt)
        t0 = time.perf_counter()
        for _ in range(args.tokens):
            tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([tok])
        dt = time.perf_counter() - t0
        print(json.dumps({"kind": "llama", "tok_s": args.tokens / dt}))
        return 0
    from powerinfer_rs import Engine
    from powerinfer_rs.loading import load_model
    from powerinfer_rs.predictors import LayerPredictor, PredictorSet

    model = load_model(args.model)
    z = np.load(args.predictors)
    layers = {
        i: LayerPredictor(fc1=z[f"fc1_{i}"], fc2=z[f"fc2_{i}"], threshold=0.0)
        for i in range(model.config.n_layers)
    }
    preds = PredictorSet(layers=layers, model_fingerprint=model.fingerprint, input="ffn_inp")
    eng = Engine(model, threads=args.threads, mmap=True)
    if args.child == "mmap":
        eng.use_down_t_file(args.down_t)
    if args.child == "store-plan":
        # The planner's RAM tier: the plan's cache and resident clusters.
        eng.use_neuron_store(args.store, plan=args.plan, io_threads=args.io_threads)
    if args.child in ("store", "store-no-ahead"):
        # The hot clusters resident from the planted activation law (what a profile measures).
        from powerinfer_rs.testing.synth_model import SynthSpec, SynthWeights

        spec = SynthSpec(args.dim, args.ffn, args.layers, args.heads, args.heads, args.vocab)
        spec.active = args.active
        gen = SynthWeights(spec)
        hot = [gen.firing_probabilities(i) for i in range(args.layers)]
        eng.use_neuron_store(
            args.store,
            cache=args.cache,
            io_threads=args.io_threads,
            hot=hot if args.resident_share > 0 else None,
            resident_share=args.resident_share,
            read_ahead=args.child == "store",
        )
    eng.set_sparsity("predictor", predictors=preds)
    logits = eng.prefill(prompt)
    for _ in range(4):  # warm-up
        logits = eng.prefill([int(np.argmax(logits))])
    eng.neuron_store_stats(reset=True)
    t0 = time.perf_counter()
    for _ in range(args.tokens):
        logits = eng.prefill([int(np.argmax(logits))])
    dt = time.perf_counter() - t0
    out = {"kind": args.child, "tok_s": args.tokens / dt}
    s = eng.neuron_store_stats()
    if s:
        out.update(
            bytes_per_token=s["bytes_read"] / args.tokens,
            hit_rate=s["hit_rate"],
            ahead_per_token=s["ahead"] / args.tokens,
            ahead_used_share=s["ahead_used"] / s["ahead"] if s["ahead"] else 0.0,
            read_s_per_token=s["read_s"] / args.tokens,
            direct=s["direct"],
        )
    print(json.dumps(out))
    return 0


def child_run(args, kind: str, cg: Cgroup, paths: dict, cache: int, plan_path: Path) -> dict | None:
    """Run engine ``kind`` as a child of this script, placed in ``cg`` before it loads
    anything; its JSON result, or None (said, with its stderr) when it failed."""
    cmd = [sys.executable, str(Path(__file__).with_name("bench_neuron_store.py"))]
    cmd += ["--child", kind, "--model", str(paths["model"])]
    cmd += ["--store", str(paths["store"]), "--cache", str(cache)]
    cmd += ["--tokens", str(args.tokens), "--threads", str(args.threads)]
    cmd += ["--io-threads", str(args.io_threads), "--dim", str(args.dim)]
    cmd += ["--ffn", str(args.ffn), "--layers", str(args.layers)]
    cmd += ["--heads", str(args.heads), "--vocab", str(args.vocab)]
    cmd += ["--active", str(args.active), "--resident-share", str(args.resident_share)]
    cmd += ["--predictors", str(paths["pred"]), "--down-t", str(paths["down_t"])]
    cmd += ["--plan", str(plan_path)]
    pre = f"echo $$ > {cg.path / 'cgroup.procs'} && exec "
    proc = subprocess.run(["sh", "-c", pre + " ".join(cmd)], capture_output=True, text=True)
    line = proc.stdout.strip().splitlines()[-1:] or [""]
    try:
        res = json.loads(line[0])
    except ValueError:
        why = "killed: out of memory?" if proc.returncode == -9 else ""
        print(f"{kind}: failed (rc {proc.returncode}) {why}", flush=True)
        print(proc.stderr[-2000:], flush=True)
        return None
    print(json.dumps(res), flush=True)
    return res
