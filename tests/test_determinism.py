"""Every sparsity mode gives the same bits in every process and at every thread count.

Each case (a model, a mode) is run by fresh processes at 1 and 2 threads: a batched prefill,
then greedy decoding one token at a time (the sparse decode kernels), hashing every step's
logits bytes and the tokens. Any choice that depends on more than the inputs (a timing, an
uninitialised buffer, a race, a sum whose order follows the thread count) shows up as a hash
that differs between runs. Threshold and input mode once chose between two products of
different rounding by a timing measured per process (issue 57): the same greedy prompt gave
four different texts in six processes.

Run as a script (``python test_determinism.py CASES_JSON THREADS``) it is the child: it prints
one JSON object, case name -> hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

#: Greedy decode steps after the prompt (each one a sparse decode step in every layer).
STEPS = 24


def _engine(case: dict, threads: int):
    from test_sparsity import random_predictors

    from powerinfer_rs import Engine
    from powerinfer_rs.loading import load_model

    model = load_model(case["model"])
    kw = dict(case.get("kwargs", {}))
    if case.get("predictors"):
        # Random predictors of a fixed seed (the same in every process), marking about half.
        kw["predictors"] = random_predictors(model, rank=16, seed=3)
    return Engine(model, threads=threads, **kw)


def _run_case(case: dict, threads: int) -> str:
    eng = _engine(case, threads)
    assert eng.sparsity == case["mode"], (eng.sparsity, case["mode"])
    h = hashlib.sha256()
    prompt = case["prompt"]
    logits = eng.prefill(eng.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt)
    h.update(np.ascontiguousarray(logits, np.float32).tobytes())
    for _ in range(STEPS):
        tok = int(np.argmax(logits))
        h.update(tok.to_bytes(4, "little"))
        logits = eng.prefill([tok])
        h.update(np.ascontiguousarray(logits, np.float32).tobytes())
    return h.hexdigest()


def _child(cases_json: str, threads: int) -> None:
    cases = json.loads(Path(cases_json).read_text())
    print(json.dumps({name: _run_case(c, threads) for name, c in cases.items()}))


@pytest.fixture(scope="module")
def cases(tmp_path_factory, synth_gguf, smol_path) -> Path:
    from powerinfer_rs.loading import load_model

    smol = str(smol_path)
    n = load_model(smol_path).config.n_layers
    relu = str(synth_gguf(dtype="Q8_0", activation="relu", ffn=256, layers=3))
    silu = str(synth_gguf(dtype="Q4_1", activation="silu", ffn=256, layers=3))
    prompt = "The capital of France is"
    small = [3, 17, 41, 99, 150, 7]
    spec = {
        "smol/dense": dict(model=smol, mode="dense", prompt=prompt),
        # Thresholds keeping about half the neurons: tokens fall on both sides of the down
        # product's crossover share, so both down products run.
        "smol/threshold": dict(
            model=smol, mode="threshold", prompt=prompt,
            kwargs=dict(sparsity="threshold", thresholds=[0.03] * n),
        ),
        "smol/input": dict(
            model=smol, mode="input", prompt=prompt,
            kwargs=dict(sparsity="input", thresholds={"thresholds": [[0.05] * 4] * n}),
        ),
        "synth-silu-q4_1/threshold": dict(
            model=silu, mode="threshold", prompt=small,
            kwargs=dict(sparsity="threshold", thresholds=[0.01] * 3),
        ),
        "synth-relu-q8_0/exact-relu": dict(
            model=relu, mode="exact-relu", prompt=small, kwargs=dict(sparsity="exact-relu"),
        ),
        "synth-relu-q8_0/predictor": dict(
            model=relu, mode="predictor", prompt=small, predictors=True,
            kwargs=dict(sparsity="predictor"),
        ),
    }  # fmt: skip
    path = tmp_path_factory.mktemp("determinism") / "cases.json"
    path.write_text(json.dumps(spec))
    return path


def _spawn(cases: Path, threads: int) -> subprocess.Popen:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    # The tables decide, not a pinned share: a pin in the caller's environment would hide them.
    for key in ("POWERINFER_RS_DOWN_CROSSOVER", "POWERINFER_RS_INPUT_CROSSOVER"):
        env.pop(key, None)
    return subprocess.Popen(
        [sys.executable, __file__, str(cases), str(threads)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=Path(__file__).parent,
    )


def test_every_sparse_mode_gives_the_same_bits_across_processes_and_thread_counts(cases):
    # Four fresh processes, two at a time: 1, 2, 1 and 2 threads.
    runs = []
    for pair in ((1, 2), (1, 2)):
        procs = [(t, _spawn(cases, t)) for t in pair]
        for t, p in procs:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            runs.append((t, json.loads(out.strip().splitlines()[-1])))
    names = set(runs[0][1])
    assert names == set(json.loads(cases.read_text()))
    differ = {}
    for name in sorted(names):
        seen = {f"threads={t} run {i}": r[name][:12] for i, (t, r) in enumerate(runs)}
        if len(set(seen.values())) > 1:
            differ[name] = seen
    assert not differ, differ


if __name__ == "__main__":
    _child(sys.argv[1], int(sys.argv[2]))
