"""Every family's GGUF against llama.cpp (llama-cpp-python; skipped when it is not installed):
a tiny random-weight F32 file written by our synthetic writer with llama.cpp's architecture,
keys and tensor names, run by llama.cpp with an F32 KV cache. Logits within 1e-4 at every
position, and 32 greedy tokens identical.

llama.cpp runs Mistral as its "llama" architecture and ignores a sliding window there, so the
Mistral file's window (64) is wider than the sequences here; the window itself is checked
against the float64 reference in test_architectures.py."""

from __future__ import annotations

import numpy as np
import pytest

from powerinfer_rs import Engine
from powerinfer_rs.loading import load_model

llama_cpp = pytest.importorskip("llama_cpp")

#: |engine - llama.cpp| on the logits (F32 weights and KV cache on both sides).
LOGITS_ATOL = 1e-4
GGML_TYPE_F32 = 0
ARCHS = {
    "llama": {},
    "mistral": {"sliding_window": 64},
    "qwen2": {},
    "qwen3": {},
    "phi3": {},
}


def open_llama(path, n_ctx: int):
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_threads=2,
        n_threads_batch=2,
        logits_all=True,
        type_k=GGML_TYPE_F32,
        type_v=GGML_TYPE_F32,
        verbose=False,
    )


@pytest.mark.parametrize("arch", list(ARCHS))
def test_logits_and_greedy_tokens_match_llama_cpp(synth_gguf, arch):
    path = synth_gguf(dtype="F32", activation="silu", arch=arch, seed=11, **ARCHS[arch])
    model = load_model(path)
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, model.config.vocab_size, 12)]
    llm = open_llama(path, 64)
    llm.eval(prompt)
    want = np.asarray(llm.scores[: len(prompt)])
    eng = Engine(model, threads=2)
    got = eng.logits(prompt)
    assert np.abs(got - want).max() <= LOGITS_ATOL

    # 32 greedy tokens on both sides from the same prompt.
    llm.reset()
    llm.eval(prompt)
    ref_toks = []
    for _ in range(32):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        ref_toks.append(t)
        llm.eval([t])
    eng.reset()
    logits = eng.prefill(prompt)
    toks = []
    for _ in range(32):
        toks.append(int(np.argmax(logits)))
        logits = eng.prefill([toks[-1]])
    assert toks == ref_toks
