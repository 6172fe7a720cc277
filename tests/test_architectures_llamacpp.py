"""Every family's GGUF against llama.cpp (llama-cpp-python; skipped when it is not installed):
a tiny random-weight F32 file written by our synthetic writer with exactly the keys and tensor
names llama.cpp's converter writes for the architecture (no key of ours, so the activation and
every other default are the loader's), run by llama.cpp with an F32 KV cache. Logits within
1e-4 at every position, and 32 greedy tokens identical.

Gemma's GELU: ggml's CPU GELU reads a table over f16 inputs (f16 results), which moves
llama.cpp's logits by a few 1e-4 from the exact function. There the float64 reference with the
same rounding must match llama.cpp within 2e-5 relative (so llama.cpp computes the family as
the reference does), and the engine the exact reference within 1e-5.

llama.cpp runs Mistral as its "llama" architecture and ignores a sliding window there, so the
Mistral file's window (64) is wider than the sequences here; the window itself is checked
against the float64 reference in test_architectures.py.

The mixture-of-experts families (Qwen3-MoE, Qwen2-MoE, OLMoE, Mixtral: test_moe.py's
``MOE_ARCHS``) run here too: llama.cpp routes, weights and sums the experts as we do."""

from __future__ import annotations

import numpy as np
import pytest
from test_architectures import ARCHS as FAMILY_ARGS
from test_moe import MOE_ARCHS

from powerinfer_rs.loading import load_model
from powerinfer_rs.loading.archs import family_named
from powerinfer_rs.loading.gguf_loader import open_gguf

import reference
from _helpers import engine_greedy, llama_greedy, rel
from reference import exact_kv_engine

llama_cpp = pytest.importorskip("llama_cpp")

#: |engine - llama.cpp| on the logits (F32 weights and KV cache on both sides).
LOGITS_ATOL = 1e-4
GGML_TYPE_F32 = 0
ARCHS = {
    "llama": {},
    **FAMILY_ARGS,
    "mistral": {"sliding_window": 64},
    **MOE_ARCHS,
}
GELU_FAMILIES = ("gemma2", "gemma3", "falcon")


def reference_with_f16_gelu(model, ids) -> np.ndarray:
    """The float64 reference with GELU's input and output rounded to f16, as ggml's table."""
    exact = reference.activation

    def rounded(name, x):
        y = exact(name, x.astype(np.float16).astype(np.float64))
        return y.astype(np.float16).astype(np.float64)

    reference.activation = rounded
    try:
        return reference.reference_forward(model, ids)[0]
    finally:
        reference.activation = exact


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
    gelu = arch in GELU_FAMILIES
    act = family_named(arch).activation  # GELU for Gemma and Falcon, ReLU for SmallThinker
    path = synth_gguf(dtype="F32", activation=act, arch=arch, seed=11, **ARCHS[arch])
    # The file as llama.cpp's converter writes it: every default is the loader's own.
    assert not [k for k in open_gguf(path).metadata if k.startswith("powerinfer_rs.")]
    model = load_model(path)
    prompt = [int(t) for t in np.random.default_rng(2).integers(3, model.config.vocab_size, 12)]
    llm = open_llama(path, 64)
    llm.eval(prompt)
    want = np.asarray(llm.scores[: len(prompt)])
    eng = exact_kv_engine(model, threads=2)
    got = eng.logits(prompt)
    if gelu:
        assert rel(reference_with_f16_gelu(model, prompt), want) <= 2e-5
        assert rel(got, reference.reference_logits(model, prompt)) <= 1e-6
        assert rel(got, want) <= 1e-4
    else:
        assert np.abs(got - want).max() <= LOGITS_ATOL

    # 32 greedy tokens on both sides from the same prompt.
    assert engine_greedy(eng, prompt, 32) == llama_greedy(llm, prompt, 32)
